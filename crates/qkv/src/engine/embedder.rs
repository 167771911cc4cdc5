//! Embedding requests batched across clients, as TEI does: the thread takes every
//! waiting request up to a budget of tokens and embeds their texts in one call, which
//! packs them into forward passes with no padding.

use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use std::time::Instant;

use super::events::Reply;
use super::observer::Observer;
use super::queue::{spawn, Queue};
use crate::models::sentence::SentenceEncoder;

/// One request's texts, and where its vectors (or why there are none) go.
pub struct EmbedJob {
    pub texts: Vec<String>,
    /// tokens of all its texts, as the encoder cuts them
    pub tokens: usize,
    pub reply: Box<dyn Reply<Result<Vec<Vec<f32>>, String>>>,
}

/// Starts the embedding thread: `budget` tokens per call at most (one request alone may
/// exceed it), `max_queue` requests waiting.
pub fn start(
    encoder: Arc<SentenceEncoder>,
    budget: usize,
    max_queue: usize,
    observer: Arc<dyn Observer>,
) -> std::io::Result<(Queue<EmbedJob>, std::thread::JoinHandle<()>)> {
    spawn("qkv-embedder", max_queue, move |rx| {
        run(&encoder, budget, &rx, &*observer)
    })
}

fn run(encoder: &SentenceEncoder, budget: usize, rx: &Receiver<EmbedJob>, observer: &dyn Observer) {
    let mut carried: Option<EmbedJob> = None;
    loop {
        let first = match carried.take() {
            Some(j) => j,
            None => match rx.recv() {
                Ok(j) => {
                    observer.dequeued();
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
                    observer.dequeued();
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
        observer.step(texts.len(), started.elapsed());
        match r {
            Ok(Ok(vectors)) => {
                let mut it = vectors.into_iter();
                for j in jobs {
                    let mine: Vec<Vec<f32>> = it.by_ref().take(j.texts.len()).collect();
                    j.reply.send(Ok(mine));
                }
            }
            Ok(Err(e)) => jobs
                .into_iter()
                .for_each(|j| j.reply.send(Err(e.to_string()))),
            Err(_) => jobs
                .into_iter()
                .for_each(|j| j.reply.send(Err("the embedding call panicked".into()))),
        }
    }
}
