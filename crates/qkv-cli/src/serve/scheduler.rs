//! Continuous batching. One thread owns the running sequences: between two decoding
//! steps, finished or abandoned sequences leave (their caches dropped) and queued ones
//! join. Joining prompts are prefilled at most `--prefill-chunk` tokens between two
//! steps of the running batch (several short prompts, or one chunk of a long one), so a
//! long prompt delays the others' next token by one chunk's time at most. Each step runs every running sequence's next
//! token together ([`Transformer::step_rows`]): the weights are read once per step
//! however many sequences share it. The model runs on the rayon pool; the HTTP runtime
//! only passes messages.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TryRecvError, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use qkv::attention::KvCache;
use qkv::models::generate::{generate_seq2seq_each, Chooser, Finish, GenerateOptions};
use qkv::models::{ModelKind, TokenBatch, Transformer};
use qkv::text::{TextStream, Tokenizer};
use tokio::sync::mpsc::UnboundedSender;

use super::api::ApiError;
use super::metrics::Metrics;
use super::stop::StopFilter;

/// One generation request as the scheduler runs it.
pub struct Job {
    pub prompt: Vec<usize>,
    pub options: GenerateOptions,
    pub stops: Vec<String>,
    pub events: UnboundedSender<Event>,
    pub queued: Instant,
    /// Panic while prefilling it: the fault the tests inject (a prompt equal to
    /// `$QKV_FAULT_PROMPT`) to check that a panic fails its request alone.
    pub fault: bool,
}

/// What a request's handler hears about its sequence.
#[derive(Debug)]
pub enum Event {
    /// Text to send, stop strings already held back.
    Text(String),
    /// The end: `"stop"` (end of sequence or a stop string) or `"length"`.
    Done {
        finish: &'static str,
        /// the chosen tokens, the last stop or end-of-sequence one included
        tokens: Vec<usize>,
    },
    /// The sequence failed inside the engine (the request gets a 500).
    Failed(String),
}

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
                ModelKind::EncoderDecoder => run_one_by_one(&model, tok, &rx, &metrics),
                _ => run(&model, tok, limits, &rx, &metrics),
            }
        })?;
    Ok((Queue { tx }, handle))
}

/// A sequence being decoded.
struct Live<'t> {
    job: Job,
    chooser: Chooser,
    cache: KvCache,
    /// its last chosen token, the next step's input
    next: usize,
    text: Option<TextStream<'t>>,
    stop: StopFilter,
}

/// A prompt being prefilled, `done` of its tokens so far.
struct Joining {
    job: Job,
    cache: KvCache,
    done: usize,
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
        // take queued jobs while there is room; wait for one when idle
        while open && live.len() + joining.len() < limits.max_batch {
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
                    });
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => open = false,
            }
        }
        if !open && live.is_empty() && joining.is_empty() {
            return;
        }
        // a client that went away frees its sequence now
        live.retain(|l| !l.job.events.is_closed());
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
                Prefilled::Ready(logits) => live.extend(join(j, logits.data(), tok, metrics)),
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
    /// The whole prompt is in: its last position's logits `[1, 1, V]`.
    Ready(qkv::Tensor),
    /// It failed; its handler has been told.
    Failed,
}

/// Prefills the next chunk of `j`'s prompt into its cache.
fn prefill_chunk(model: &Transformer, j: &mut Joining, chunk: usize) -> Prefilled {
    let end = (j.done + chunk).min(j.job.prompt.len());
    let ids = j.job.prompt[j.done..end].to_vec();
    let cache = &mut j.cache;
    let fault = j.job.fault;
    let r = catch_unwind(AssertUnwindSafe(|| {
        assert!(!fault, "a fault injected by QKV_FAULT_PROMPT");
        model.prefill(&TokenBatch::single(ids)?, cache)
    }));
    match r {
        Ok(Ok(logits)) => {
            j.done = end;
            match j.done < j.job.prompt.len() {
                true => Prefilled::More,
                false => Prefilled::Ready(logits),
            }
        }
        Ok(Err(e)) => fail(&j.job, format!("prefill: {e}")),
        Err(p) => fail(&j.job, format!("prefill panicked: {}", panic_text(&p))),
    }
}

/// A prefilled job as a live sequence, its first token chosen and sent; `None` when it
/// has already ended.
fn join<'t>(
    mut j: Joining,
    logits: &[f32],
    tok: Option<&'t Tokenizer>,
    metrics: &Metrics,
) -> Option<Live<'t>> {
    metrics.first_token(j.job.queued.elapsed());
    let prompt = std::mem::take(&mut j.job.prompt);
    let chooser = match Chooser::new(j.job.options.clone(), prompt) {
        Ok(c) => c,
        Err(e) => {
            let _ = j.job.events.send(Event::Failed(e.to_string()));
            return None;
        }
    };
    let stop = StopFilter::new(std::mem::take(&mut j.job.stops));
    let mut l = Live {
        job: j.job,
        chooser,
        cache: j.cache,
        next: 0,
        text: tok.map(Tokenizer::stream),
        stop,
    };
    (!choose_and_send(&mut l, logits, metrics)).then_some(l)
}

/// Answers a job's handler with an engine failure.
fn fail(job: &Job, why: String) -> Prefilled {
    let _ = job.events.send(Event::Failed(why));
    Prefilled::Failed
}

fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into())
}

/// One decoding step of every live sequence; the ended ones leave.
fn step(model: &Transformer, live: &mut Vec<Live>, metrics: &Metrics) {
    let started = Instant::now();
    let tokens: Vec<usize> = live.iter().map(|l| l.next).collect();
    let r = {
        let mut caches: Vec<&mut KvCache> = live.iter_mut().map(|l| &mut l.cache).collect();
        catch_unwind(AssertUnwindSafe(|| model.step_rows(&tokens, &mut caches)))
    };
    let logits = match r {
        Ok(Ok(l)) => l,
        // the step's caches are in an unknown state: its sequences fail, the server goes on
        Ok(Err(e)) => return fail_all(live, format!("decoding step: {e}")),
        Err(p) => return fail_all(live, format!("decoding step panicked: {}", panic_text(&p))),
    };
    let v = logits.shape()[2];
    // each sequence's choice (a sort of the vocabulary when sampling) side by side
    let chosen: Vec<usize> = {
        use rayon::prelude::*;
        live.par_iter_mut()
            .zip(logits.data().par_chunks_exact(v))
            .map(|(l, row)| l.chooser.choose(row))
            .collect()
    };
    metrics.step(live.len(), started.elapsed());
    let ended: Vec<bool> = live
        .iter_mut()
        .zip(chosen)
        .map(|(l, tok)| send(l, tok, metrics))
        .collect();
    let mut i = 0;
    live.retain(|_| {
        i += 1;
        !ended[i - 1]
    });
}

fn fail_all(live: &mut Vec<Live>, why: String) {
    for l in live.drain(..) {
        let _ = l.job.events.send(Event::Failed(why.clone()));
    }
}

/// Chooses `l`'s next token from its logits and sends the text it releases; true when
/// the sequence has ended (its handler has been told).
fn choose_and_send(l: &mut Live, logits: &[f32], metrics: &Metrics) -> bool {
    let tok = l.chooser.choose(logits);
    send(l, tok, metrics)
}

/// Sends the text that `l`'s newly chosen token `tok` releases; true when the sequence
/// has ended.
fn send(l: &mut Live, tok: usize, metrics: &Metrics) -> bool {
    l.next = tok;
    metrics.tokens(1);
    let piece = match l.text.as_mut().map(|s| s.push(tok)).transpose() {
        Ok(p) => p.flatten(),
        Err(e) => {
            let _ = l.job.events.send(Event::Failed(e.to_string()));
            return true;
        }
    };
    if let Some(p) = piece {
        let r = l.stop.push(&p);
        if !r.text.is_empty() {
            let _ = l.job.events.send(Event::Text(r.text));
        }
        if r.stopped {
            let _ = l.job.events.send(Event::Done {
                finish: "stop",
                tokens: l.chooser.tokens().to_vec(),
            });
            return true;
        }
    }
    let Some(finish) = l.chooser.finished() else {
        return false;
    };
    let rest = match l.text.take().map(TextStream::finish).transpose() {
        Ok(r) => r.flatten().unwrap_or_default(),
        Err(e) => {
            let _ = l.job.events.send(Event::Failed(e.to_string()));
            return true;
        }
    };
    let r = l.stop.last(&rest);
    if !r.text.is_empty() {
        let _ = l.job.events.send(Event::Text(r.text));
    }
    let finish = match (r.stopped, finish) {
        (true, _) | (false, Finish::Eos) => "stop",
        (false, Finish::Length) => "length",
    };
    let _ = l.job.events.send(Event::Done {
        finish,
        tokens: l.chooser.tokens().to_vec(),
    });
    true
}

/// Encoder-decoders (translation): each job decoded alone, streaming its tokens.
fn run_one_by_one(
    model: &Transformer,
    tok: Option<&Tokenizer>,
    rx: &Receiver<Job>,
    metrics: &Metrics,
) {
    while let Ok(job) = rx.recv() {
        metrics.queued(-1);
        if job.events.is_closed() {
            continue;
        }
        let mut text = tok.map(Tokenizer::stream);
        let mut stop = StopFilter::new(job.stops.clone());
        let mut count = 0;
        let mut stopped = false;
        let mut failed = None;
        let started = Instant::now();
        let mut first = true;
        let r = catch_unwind(AssertUnwindSafe(|| {
            let src = TokenBatch::single(job.prompt.clone())?;
            generate_seq2seq_each(model, &src, &job.options, &mut |_, id| {
                if first {
                    metrics.first_token(job.queued.elapsed());
                    first = false;
                }
                metrics.tokens(1);
                if stopped || failed.is_some() {
                    return;
                }
                count += 1;
                match text.as_mut().map(|s| s.push(id)).transpose() {
                    Ok(Some(Some(p))) => {
                        let r = stop.push(&p);
                        if !r.text.is_empty() {
                            let _ = job.events.send(Event::Text(r.text));
                        }
                        stopped = r.stopped;
                    }
                    Ok(_) => {}
                    Err(e) => failed = Some(e.to_string()),
                }
            })
        }));
        metrics.step(1, started.elapsed());
        let out = match r {
            Ok(Ok(out)) => out.into_iter().next().unwrap_or_default(),
            Ok(Err(e)) => {
                let _ = job.events.send(Event::Failed(e.to_string()));
                continue;
            }
            Err(p) => {
                let _ = job.events.send(Event::Failed(panic_text(&p)));
                continue;
            }
        };
        if let Some(e) = failed {
            let _ = job.events.send(Event::Failed(e));
            continue;
        }
        if !stopped {
            let rest = match text.map(TextStream::finish).transpose() {
                Ok(r) => r.flatten().unwrap_or_default(),
                Err(e) => {
                    let _ = job.events.send(Event::Failed(e.to_string()));
                    continue;
                }
            };
            let r = stop.last(&rest);
            stopped = r.stopped;
            if !r.text.is_empty() {
                let _ = job.events.send(Event::Text(r.text));
            }
        }
        let eos = out.last().is_some_and(|t| job.options.eos.contains(t));
        let _ = job.events.send(Event::Done {
            finish: if stopped || eos { "stop" } else { "length" },
            tokens: out[..count.min(out.len())].to_vec(),
        });
    }
}
