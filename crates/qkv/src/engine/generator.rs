//! Continuous batching of decoder-only generation. One thread owns the running
//! sequences: between two steps finished or abandoned sequences leave and queued jobs
//! join. Each step is one model call ([`Transformer::step_packed`]) over every decoding
//! sequence's next token and up to `prefill_chunk` tokens of joining prompts (several
//! short prompts, or one chunk of a long one: Sarathi-Serve's and vLLM's chunked
//! prefill), so the weights are read once a step whatever joins, and a long prompt
//! delays the others' next token by its chunk's share of one step.
//!
//! A joining prompt first restores whatever the [`PrefixCache`] holds of it (a chat's
//! earlier turns, a shared system prompt); each prompt's positions are kept there once
//! prefilled, and each sequence's once it ends.
//!
//! A step that fails (an error or a panic inside the engine) is undone (every cache cut
//! back to its length before it) and its sequences run again one by one, so only the
//! ones that fail alone fail.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::events::Event;
use super::job::{panic_text, Job, Joining};
use super::live::{advance, join, Live};
use super::observer::Observer;
use super::prefix::{reusable_positions, PrefixCache};
use super::queue::{spawn, Queue};
use super::seq2seq;
use crate::attention::KvCache;
use crate::models::generate::logprobs;
use crate::models::{Chunk, ModelKind, Transformer};
use crate::text::Tokenizer;

/// How the generator batches.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Sequences decoded together at most (prefilling ones included).
    pub max_batch: usize,
    /// Jobs waiting to join at most; more are refused.
    pub max_queue: usize,
    /// Prompt tokens packed into one step at most.
    pub prefill_chunk: usize,
    /// Bytes of the prefix cache (0: none).
    pub cache_bytes: usize,
}

/// Starts the generator thread; it ends when every [`Queue`] is dropped and its
/// sequences are done.
pub fn start(
    model: Arc<Transformer>,
    tokenizer: Option<Arc<Tokenizer>>,
    limits: Limits,
    observer: Arc<dyn Observer>,
) -> std::io::Result<(Queue<Job>, std::thread::JoinHandle<()>)> {
    spawn("qkv-generator", limits.max_queue, move |rx| {
        let tok = tokenizer.as_deref();
        match model.kind() {
            ModelKind::EncoderDecoder => seq2seq::run_one_by_one(&model, tok, &rx, &*observer),
            _ => Generator::new(&model, tok, limits, &*observer).run(&rx),
        }
    })
}

/// Runs `jobs` to their ends on this thread, batched as the generator thread batches
/// (joining prompts packed with the decoding rows), and returns once each has ended: a
/// batch of prompts (Python's list of prompts) through the server's engine. Their
/// events go where each job's [`Job::events`] say.
pub fn run_jobs(
    model: &Transformer,
    tokenizer: Option<&Tokenizer>,
    limits: Limits,
    jobs: Vec<Job>,
    observer: &dyn Observer,
) {
    let (tx, rx) = std::sync::mpsc::sync_channel(jobs.len());
    for job in jobs {
        tx.send(job).expect("the receiver is here");
    }
    drop(tx);
    match model.kind() {
        ModelKind::EncoderDecoder => seq2seq::run_one_by_one(model, tokenizer, &rx, observer),
        _ => Generator::new(model, tokenizer, limits, observer).run(&rx),
    }
}

/// The running state of the loop.
struct Generator<'a> {
    model: &'a Transformer,
    tok: Option<&'a Tokenizer>,
    limits: Limits,
    observer: &'a dyn Observer,
    prefix: Option<PrefixCache>,
    live: Vec<Live<'a>>,
    joining: VecDeque<Joining>,
}

/// One joining prompt's part of a step: which job, how many of its tokens.
struct Part {
    job: usize,
    len: usize,
}

impl<'a> Generator<'a> {
    fn new(
        model: &'a Transformer,
        tok: Option<&'a Tokenizer>,
        limits: Limits,
        observer: &'a dyn Observer,
    ) -> Self {
        Generator {
            model,
            tok,
            limits,
            observer,
            prefix: (limits.cache_bytes > 0).then(|| PrefixCache::new(limits.cache_bytes)),
            live: Vec::new(),
            joining: VecDeque::new(),
        }
    }

    fn run(mut self, rx: &Receiver<Job>) {
        let mut open = true;
        loop {
            open = open && self.take(rx);
            if !open && self.live.is_empty() && self.joining.is_empty() {
                return;
            }
            // a client that went away frees its sequences now
            self.live.retain(|l| !l.job_closed());
            self.joining.retain(|j| !j.job.events.is_closed());
            if !self.live.is_empty() || !self.joining.is_empty() {
                self.step();
            }
        }
    }

    /// Takes queued jobs while there is room (a job counts its choices), waiting for
    /// one when idle; false once every queue handle is gone.
    fn take(&mut self, rx: &Receiver<Job>) -> bool {
        let taken =
            |g: &Self| g.live.len() + g.joining.iter().map(|j| j.job.choices).sum::<usize>();
        while taken(self) < self.limits.max_batch {
            let got = if self.live.is_empty() && self.joining.is_empty() {
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
                    self.observer.dequeued();
                    let j = self.admit(job);
                    self.joining.push_back(j);
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => return false,
            }
        }
        true
    }

    /// A job as a joining prompt, with what the prefix cache holds of it restored (not
    /// for a job that scores its prompt: restored positions have no logits).
    fn admit(&mut self, job: Job) -> Joining {
        let mut cache = self.model.new_cache(1);
        let mut done = 0;
        if let (Some(prefix), false) = (&mut self.prefix, job.prompt_logprobs) {
            let n = job.prompt.len();
            // the last prompt token is always computed: its logits choose the first
            let usable = reusable_positions(self.model, n, n.saturating_sub(1));
            match prefix.restore(&job.prompt, usable, &mut cache) {
                Ok(r) => done = r,
                // a block that does not fit this cache: compute the prompt instead
                Err(_) => cache = self.model.new_cache(1),
            }
            self.observer.prefix(prefix.stats());
        }
        Joining {
            job,
            cache,
            done,
            scored: Vec::new(),
        }
    }

    /// One model call: every live sequence's next token and the joining prompts' next
    /// chunks within the budget; then each sequence's token is chosen and sent, and
    /// prompts whose last chunk ran join the live ones.
    fn step(&mut self) {
        let started = Instant::now();
        let mut budget = self.limits.prefill_chunk;
        let mut parts = Vec::new();
        for (i, j) in self.joining.iter().enumerate() {
            if budget == 0 {
                break;
            }
            let len = (j.job.prompt.len() - j.done).min(budget);
            budget -= len;
            parts.push(Part { job: i, len });
        }
        let decoding = self.live.len();
        // logits rows of each chunk: one, or a scoring prompt's every position
        let rows: Vec<usize> = (0..decoding)
            .map(|_| 1)
            .chain(
                parts
                    .iter()
                    .map(|p| match self.joining[p.job].job.prompt_logprobs {
                        true => p.len,
                        false => 1,
                    }),
            )
            .collect();
        let ran = self.call(&parts, &rows);
        let v = self.model.arch.vocab;
        self.observer
            .step(decoding + parts.len(), started.elapsed());
        let failed = |i: usize| ran.failed.iter().find(|f| f.0 == i).map(|f| f.1.clone());
        // the decoding rows' logits: in place, or without the rows of sequences that failed
        let mut kept_rows = Vec::new();
        if ran.failed.iter().any(|f| f.0 < decoding) {
            let mut kept = Vec::with_capacity(decoding);
            for (i, (l, row)) in self
                .live
                .drain(..)
                .zip(ran.logits.chunks_exact(v))
                .enumerate()
            {
                match failed(i) {
                    Some(why) => l.fail(format!("decoding step: {why}")),
                    None => {
                        kept_rows.extend_from_slice(row);
                        kept.push(l);
                    }
                }
            }
            self.live = kept;
        }
        let decoded = match kept_rows.is_empty() {
            true => &ran.logits[..self.live.len() * v],
            false => &kept_rows[..],
        };
        let mut at = decoding * v;
        // prompts that leave the queue: joined (their last position's logits) or failed
        let mut leaving = Vec::new();
        for (n, part) in parts.iter().enumerate() {
            let mine = &ran.logits[at..at + rows[decoding + n] * v];
            at += mine.len();
            let j = &mut self.joining[part.job];
            if let Some(why) = failed(decoding + n) {
                j.job.events.send(Event::Failed(format!("prefill: {why}")));
                leaving.push((part.job, None));
                continue;
            }
            score(j, part.len, mine, v);
            j.done += part.len;
            if j.done == j.job.prompt.len() {
                leaving.push((part.job, Some(mine[mine.len() - v..].to_vec())));
            }
        }
        let prefix = &mut self.prefix;
        let (model, observer) = (self.model, self.observer);
        // a sequence's prompt and chosen tokens, and its cache, into the prefix cache
        let mut keep = |prompt: &[usize], chosen: &[usize], cache: &KvCache| {
            if let Some(p) = prefix.as_mut() {
                let seq: Vec<usize> = prompt.iter().chain(chosen).copied().collect();
                let usable = reusable_positions(model, prompt.len(), seq.len().min(cache.len()));
                // a block that cannot be cut is simply not kept
                let _ = p.insert(&seq, usable, cache);
                observer.prefix(p.stats());
            }
        };
        advance(&mut self.live, decoded, v, observer, &mut keep);
        // back to front, so that the indices stay valid
        for (i, last) in leaving.into_iter().rev() {
            let j = self.joining.remove(i).expect("a leaving prompt is queued");
            if let Some(last) = last {
                keep(&j.job.prompt, &[], &j.cache);
                let new = join(j, &last, self.tok, observer);
                self.live.extend(new);
            }
        }
    }

    /// Runs the step's chunks (the live rows, then each part) in one call. A call that
    /// fails is undone (each cache cut back) and each chunk runs alone, so that only
    /// the ones that fail alone fail.
    fn call(&mut self, parts: &[Part], rows: &[usize]) -> Ran {
        let next: Vec<[usize; 1]> = self.live.iter().map(|l| [l.next]).collect();
        let mut chunks: Vec<Chunk> = next
            .iter()
            .map(|t| Chunk {
                tokens: t,
                all_logits: false,
                prompt_len: None,
            })
            .collect();
        let mut faults = vec![false; self.live.len()];
        let mut caches: Vec<&mut KvCache> = self.live.iter_mut().map(|l| &mut l.cache).collect();
        // each queued prompt's job and cache, borrowed side by side
        let mut queued: Vec<Option<(&Job, &mut KvCache, usize)>> = self
            .joining
            .iter_mut()
            .map(|j| Some((&j.job, &mut j.cache, j.done)))
            .collect();
        for p in parts {
            let (job, cache, done) = queued[p.job].take().expect("one part a prompt");
            chunks.push(Chunk {
                tokens: &job.prompt[done..done + p.len],
                all_logits: job.prompt_logprobs,
                prompt_len: Some(job.prompt.len()),
            });
            faults.push(job.fault);
            caches.push(cache);
        }
        let model = self.model;
        let run = |chunks: &[Chunk], caches: &mut [&mut KvCache], faults: &[bool]| {
            catch_unwind(AssertUnwindSafe(|| {
                assert!(
                    !faults.contains(&true),
                    "a fault injected by QKV_FAULT_PROMPT"
                );
                model.step_packed(chunks, caches)
            }))
            .map_err(|p| format!("panicked: {}", panic_text(&p)))
            .and_then(|r| r.map_err(|e| e.to_string()))
        };
        let lens: Vec<usize> = caches.iter().map(|c| c.len()).collect();
        if let Ok(logits) = run(&chunks, &mut caches, &faults) {
            return Ran {
                logits: logits.into_data(),
                failed: Vec::new(),
            };
        }
        let v = model.arch.vocab;
        let mut ran = Ran {
            logits: Vec::with_capacity(rows.iter().sum::<usize>() * v),
            failed: Vec::new(),
        };
        for (i, cache) in caches.iter_mut().enumerate() {
            cache.truncate(lens[i]);
            let alone = run(&chunks[i..=i], std::slice::from_mut(cache), &faults[i..=i]);
            match alone {
                Ok(logits) => ran.logits.extend_from_slice(logits.data()),
                Err(why) => {
                    cache.truncate(lens[i]);
                    ran.logits.resize(ran.logits.len() + rows[i] * v, 0.0);
                    ran.failed.push((i, why));
                }
            }
        }
        ran
    }
}

/// What a step's call gave: logits `[R·V]` (each chunk's rows in order; zeros for a
/// chunk that failed) and the chunks that failed, with why.
struct Ran {
    logits: Vec<f32>,
    failed: Vec<(usize, String)>,
}

/// Keeps a scoring job's log-probabilities of the `len` prompt tokens just run (their
/// logits `[len·V]`): each position's score of the token after it.
fn score(j: &mut Joining, len: usize, logits: &[f32], v: usize) {
    if !j.job.prompt_logprobs {
        return;
    }
    if j.done == 0 {
        j.scored.push(None);
    }
    let top = j.job.logprobs.unwrap_or(0);
    for (p, row) in (j.done..j.done + len).zip(logits.chunks_exact(v)) {
        if let Some(&next) = j.job.prompt.get(p + 1) {
            j.scored.push(Some(logprobs(row, next, top)));
        }
    }
}
