//! Continuous batching. One thread owns the running sequences: between two decoding
//! steps, finished or abandoned sequences leave (their caches dropped) and queued ones
//! join. Joining prompts are prefilled at most `--prefill-chunk` tokens between two
//! steps of the running batch (several short prompts, or one chunk of a long one), so a
//! long prompt delays the others' next token by one chunk's time at most. Each step runs every running sequence's next
//! token together ([`Transformer::step_rows`]): the weights are read once per step
//! however many sequences share it. The model runs on the rayon pool; the HTTP runtime
//! only passes messages.

mod job;
mod live;
mod seq2seq;

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TryRecvError, TrySendError};
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use qkv::models::generate::logprobs;
use qkv::models::{ModelKind, TokenBatch, Transformer};
use qkv::text::Tokenizer;

use super::api::ApiError;
use super::metrics::Metrics;
use job::{panic_text, Joining};
pub use job::{Event, Job};
use live::{step, Live};

/// The handlers' side of the queue.
/// A bounded queue of jobs for a worker thread: the scheduler's, the embedder's or the
/// classifier's.
pub struct Queue<T = Job> {
    tx: SyncSender<T>,
}

impl<T> Queue<T> {
    pub fn new(tx: SyncSender<T>) -> Self {
        Queue { tx }
    }

    /// Queues a job, or answers 503 (with `Retry-After`) when the queue is full.
    pub fn submit(&self, job: T, metrics: &Metrics) -> Result<(), ApiError> {
        match self.tx.try_send(job) {
            Ok(()) => {
                metrics.queued(1);
                Ok(())
            }
            Err(TrySendError::Full(_)) => Err(ApiError {
                retry_after: Some(1),
                ..ApiError::status(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the server's queue is full; retry later",
                )
            }),
            Err(TrySendError::Disconnected(_)) => Err(ApiError::status(
                StatusCode::SERVICE_UNAVAILABLE,
                "the server is shutting down",
            )),
        }
    }
}

/// How the scheduler batches.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Sequences decoded together at most (prefilling ones included).
    pub max_batch: usize,
    /// Jobs waiting to join at most; more are answered 503.
    pub max_queue: usize,
    /// Prompt tokens prefilled between two decoding steps.
    pub prefill_chunk: usize,
}

/// Starts the scheduler thread; it ends when every [`Queue`] is dropped and its
/// sequences are done.
pub fn start(
    model: Arc<Transformer>,
    tokenizer: Option<Arc<Tokenizer>>,
    limits: Limits,
    metrics: Arc<Metrics>,
) -> std::io::Result<(Queue, std::thread::JoinHandle<()>)> {
    let (tx, rx) = std::sync::mpsc::sync_channel(limits.max_queue);
    let handle = std::thread::Builder::new()
        .name("qkv-scheduler".into())
        .spawn(move || {
            let tok = tokenizer.as_deref();
            match model.kind() {
                ModelKind::EncoderDecoder => seq2seq::run_one_by_one(&model, tok, &rx, &metrics),
                _ => run(&model, tok, limits, &rx, &metrics),
            }
        })?;
    Ok((Queue { tx }, handle))
}

fn run(
    model: &Transformer,
    tok: Option<&Tokenizer>,
    limits: Limits,
    rx: &Receiver<Job>,
    metrics: &Metrics,
) {
    let mut live: Vec<Live> = Vec::new();
    let mut joining: VecDeque<Joining> = VecDeque::new();
    let mut open = true;
    loop {
        // take queued jobs while there is room (a job counts its choices); wait for one
        // when idle
        let taken = |live: &[Live], joining: &VecDeque<Joining>| {
            live.len() + joining.iter().map(|j| j.job.choices).sum::<usize>()
        };
        while open && taken(&live, &joining) < limits.max_batch {
            let got = if live.is_empty() && joining.is_empty() {
                match rx.recv_timeout(Duration::from_millis(200)) {
                    Ok(job) => Ok(job),
                    Err(RecvTimeoutError::Timeout) => Err(TryRecvError::Empty),
                    Err(RecvTimeoutError::Disconnected) => Err(TryRecvError::Disconnected),
                }
            } else {
                rx.try_recv()
            };
            match got {
                Ok(job) => {
                    metrics.queued(-1);
                    let cache = model.new_cache(1);
                    joining.push_back(Joining {
                        job,
                        cache,
                        done: 0,
                        scored: Vec::new(),
                    });
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => open = false,
            }
        }
        if !open && live.is_empty() && joining.is_empty() {
            return;
        }
        // a client that went away frees its sequences now
        live.retain(|l| !l.job_closed());
        joining.retain(|j| !j.job.events.is_closed());
        // up to a chunk's worth of prompt tokens between two steps, over as many
        // joining prompts as it covers
        let mut budget = limits.prefill_chunk;
        while budget > 0 {
            let Some(mut j) = joining.pop_front() else {
                break;
            };
            let before = j.done;
            let r = prefill_chunk(model, &mut j, budget);
            budget -= j.done - before;
            match r {
                Prefilled::More => joining.push_front(j),
                Prefilled::Ready(logits) => live.extend(live::join(j, &logits, tok, metrics)),
                Prefilled::Failed => break,
            }
        }
        if !live.is_empty() {
            step(model, &mut live, metrics);
        }
    }
}

/// Where a joining prompt stands after a chunk.
enum Prefilled {
    /// Chunks remain.
    More,
    /// The whole prompt is in: its last position's logits `[V]`.
    Ready(Vec<f32>),
    /// It failed; its handler has been told.
    Failed,
}

/// Prefills the next chunk of `j`'s prompt into its cache; a job that scores its prompt
/// takes every position's logits `[1, chunk, V]` (one chunk's worth at a time) and
/// keeps each next token's log-probability.
fn prefill_chunk(model: &Transformer, j: &mut Joining, chunk: usize) -> Prefilled {
    let end = (j.done + chunk).min(j.job.prompt.len());
    let ids = j.job.prompt[j.done..end].to_vec();
    let cache = &mut j.cache;
    let (fault, scoring) = (j.job.fault, j.job.prompt_logprobs);
    let r = catch_unwind(AssertUnwindSafe(|| {
        assert!(!fault, "a fault injected by QKV_FAULT_PROMPT");
        let batch = TokenBatch::single(ids)?;
        match scoring {
            true => model.forward_cached(&batch, cache),
            false => model.prefill(&batch, cache),
        }
    }));
    let logits = match r {
        Ok(Ok(logits)) => logits,
        Ok(Err(e)) => return fail(&j.job, format!("prefill: {e}")),
        Err(p) => return fail(&j.job, format!("prefill panicked: {}", panic_text(&p))),
    };
    let v = logits.shape()[2];
    if scoring {
        if j.done == 0 {
            j.scored.push(None);
        }
        let top = j.job.logprobs.unwrap_or(0);
        for (p, row) in (j.done..end).zip(logits.data().chunks_exact(v)) {
            if let Some(&next) = j.job.prompt.get(p + 1) {
                j.scored.push(Some(logprobs(row, next, top)));
            }
        }
    }
    j.done = end;
    match j.done < j.job.prompt.len() {
        true => Prefilled::More,
        false => Prefilled::Ready(logits.data()[logits.data().len() - v..].to_vec()),
    }
}

/// Answers a job's handler with an engine failure.
fn fail(job: &Job, why: String) -> Prefilled {
    let _ = job.events.send(Event::Failed(why));
    Prefilled::Failed
}
