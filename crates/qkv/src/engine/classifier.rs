//! Classification and reranking requests, one at a time on a thread of their own: each
//! request already batches its inputs (32 per forward pass), and the bounded queue
//! refuses more as the other workers' do.

use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::Instant;

use super::events::Reply;
use super::observer::Observer;
use super::queue::{spawn, Queue};
use crate::models::SequenceClassifier;

/// One request's inputs (texts, or pairs read together), and where its logits go.
pub struct ClassifyJob {
    pub inputs: Vec<(String, Option<String>)>,
    pub reply: Box<dyn Reply<Result<Vec<Vec<f32>>, String>>>,
}

/// Starts the classifier's thread, `max_queue` requests waiting at most.
pub fn start(
    model: Arc<SequenceClassifier>,
    max_queue: usize,
    observer: Arc<dyn Observer>,
) -> std::io::Result<(Queue<ClassifyJob>, std::thread::JoinHandle<()>)> {
    spawn("qkv-classifier", max_queue, move |rx| {
        run(&model, &rx, &*observer)
    })
}

fn run(model: &SequenceClassifier, rx: &Receiver<ClassifyJob>, observer: &dyn Observer) {
    while let Ok(job) = rx.recv() {
        observer.dequeued();
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
        observer.step(inputs.len(), started.elapsed());
        job.reply.send(match r {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(_) => Err("the classification call panicked".into()),
        });
    }
}
