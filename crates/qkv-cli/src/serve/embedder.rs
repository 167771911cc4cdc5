//! Embedding requests batched across clients, as TEI does: the thread takes every
//! waiting request up to a budget of tokens and embeds their texts in one call, which
//! sorts them by length into forward passes of 32.

use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use std::time::Instant;

use qkv::models::sentence::SentenceEncoder;
use tokio::sync::oneshot;

use super::metrics::Metrics;

/// One request's texts, and where its vectors go.
pub struct EmbedJob {
    pub texts: Vec<String>,
    /// tokens of all its texts, as the encoder cuts them
    pub tokens: usize,
    pub reply: oneshot::Sender<Result<Vec<Vec<f32>>, String>>,
}

pub type EmbedQueue = super::scheduler::Queue<EmbedJob>;

/// Starts the embedding thread: `budget` tokens per call at most (one request alone may
/// exceed it), `max_queue` requests waiting.
pub fn start(
    encoder: Arc<SentenceEncoder>,
    budget: usize,
    max_queue: usize,
    metrics: Arc<Metrics>,
) -> std::io::Result<(EmbedQueue, std::thread::JoinHandle<()>)> {
    let (tx, rx) = std::sync::mpsc::sync_channel(max_queue);
    let handle = std::thread::Builder::new()
        .name("qkv-embedder".into())
        .spawn(move || run(&encoder, budget, &rx, &metrics))?;
    Ok((EmbedQueue::new(tx), handle))
}

fn run(encoder: &SentenceEncoder, budget: usize, rx: &Receiver<EmbedJob>, metrics: &Metrics) {
    let mut carried: Option<EmbedJob> = None;
    loop {
        let first = match carried.take() {
            Some(j) => j,
            None => match rx.recv() {
                Ok(j) => {
                    metrics.queued(-1);
                    j
                }
                Err(_) => return,
            },
        };
        let mut tokens = first.tokens;
        let mut jobs = vec![first];
        while tokens < budget {
            match rx.try_recv() {
                Ok(j) => {
                    metrics.queued(-1);
                    if tokens + j.tokens > budget {
                        carried = Some(j);
                        break;
                    }
                    tokens += j.tokens;
                    jobs.push(j);
                }
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
            }
        }
        jobs.retain(|j| !j.reply.is_closed());
        let texts: Vec<&str> = jobs
            .iter()
            .flat_map(|j| j.texts.iter().map(String::as_str))
            .collect();
        if texts.is_empty() {
            continue;
        }
        let started = Instant::now();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            encoder.embed_batched(&texts, 32)
        }));
        metrics.step(texts.len(), started.elapsed());
        match r {
            Ok(Ok(vectors)) => {
                let mut it = vectors.into_iter();
                for j in jobs {
                    let mine: Vec<Vec<f32>> = it.by_ref().take(j.texts.len()).collect();
                    let _ = j.reply.send(Ok(mine));
                }
            }
            Ok(Err(e)) => jobs.into_iter().for_each(|j| {
                let _ = j.reply.send(Err(e.to_string()));
            }),
            Err(_) => jobs.into_iter().for_each(|j| {
                let _ = j.reply.send(Err("the embedding call panicked".into()));
            }),
        }
    }
}
