//! Classification and reranking requests, one at a time on a thread of their own: each
//! request already batches its inputs (32 per forward pass), and a bounded queue
//! answers 503 past `--max-queue` as the other endpoints do.

use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::Instant;

use qkv::models::SequenceClassifier;
use tokio::sync::oneshot;

use super::metrics::Metrics;

/// One request's inputs (texts, or pairs read together), and where its logits go.
pub struct ClassifyJob {
    pub inputs: Vec<(String, Option<String>)>,
    pub reply: oneshot::Sender<Result<Vec<Vec<f32>>, String>>,
}

pub type ClassifyQueue = super::scheduler::Queue<ClassifyJob>;

/// Starts the classifier's thread, `max_queue` requests waiting at most.
pub fn start(
    model: Arc<SequenceClassifier>,
    max_queue: usize,
    metrics: Arc<Metrics>,
) -> std::io::Result<(ClassifyQueue, std::thread::JoinHandle<()>)> {
    let (tx, rx) = std::sync::mpsc::sync_channel(max_queue);
    let handle = std::thread::Builder::new()
        .name("qkv-classifier".into())
        .spawn(move || run(&model, &rx, &metrics))?;
    Ok((ClassifyQueue::new(tx), handle))
}

fn run(model: &SequenceClassifier, rx: &Receiver<ClassifyJob>, metrics: &Metrics) {
    while let Ok(job) = rx.recv() {
        metrics.queued(-1);
        if job.reply.is_closed() {
            continue;
        }
        let inputs: Vec<(&str, Option<&str>)> = job
            .inputs
            .iter()
            .map(|(a, b)| (a.as_str(), b.as_deref()))
            .collect();
        let started = Instant::now();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| model.classify(&inputs)));
        metrics.step(inputs.len(), started.elapsed());
        let _ = job.reply.send(match r {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(_) => Err("the classification call panicked".into()),
        });
    }
}
