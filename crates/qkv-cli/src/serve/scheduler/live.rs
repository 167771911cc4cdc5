//! The sequences being decoded: a prefilled prompt joins as its choices, each step
//! chooses every sequence's next token together, and each sequence's text (stop strings
//! held back) and log-probabilities go to its request's handler.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use qkv::attention::KvCache;
use qkv::models::generate::{logprobs, Chooser, Finish, GenerateOptions, Sampling, TokenLogprobs};
use qkv::models::Transformer;
use qkv::text::{TextStream, Tokenizer};
use tokio::sync::mpsc::UnboundedSender;

use super::job::{panic_text, Event, Joining};
use crate::serve::metrics::Metrics;
use crate::serve::stop::StopFilter;

/// One choice being decoded.
pub(super) struct Live<'t> {
    index: usize,
    events: UnboundedSender<Event>,
    chooser: Chooser,
    cache: KvCache,
    /// its last chosen token, the next step's input
    next: usize,
    text: Option<TextStream<'t>>,
    stop: StopFilter,
    /// alternatives to report with each token's log-probability, when asked
    logprobs: Option<usize>,
    /// log-probabilities of tokens whose text has not been sent yet
    pending: Vec<TokenLogprobs>,
}

impl Live<'_> {
    pub(super) fn job_closed(&self) -> bool {
        self.events.is_closed()
    }
}

/// `options` for choice `i` of a request: its own draws, from the seed plus `i`.
fn for_choice(options: &GenerateOptions, i: usize) -> GenerateOptions {
    let mut o = options.clone();
    if let Sampling::Sample { seed, .. } = &mut o.sampling {
        *seed = seed.wrapping_add(i as u64);
    }
    o
}

/// A prefilled job as its live choices, each one's first token chosen from the prompt's
/// last `logits` and sent; choices that have already ended are left out.
pub(super) fn join<'t>(
    j: Joining,
    logits: &[f32],
    tok: Option<&'t Tokenizer>,
    metrics: &Metrics,
) -> Vec<Live<'t>> {
    let Joining {
        job, cache, scored, ..
    } = j;
    metrics.first_token(job.queued.elapsed());
    if job.prompt_logprobs {
        let _ = job.events.send(Event::Prompt {
            first_index: job.first_index,
            logprobs: scored,
        });
    }
    if job.score_only {
        for index in job.first_index..job.first_index + job.choices {
            let _ = job.events.send(Event::Done {
                index,
                finish: "length",
                tokens: Vec::new(),
            });
        }
        return Vec::new();
    }
    // the last choice takes the prompt's cache, the others a copy
    let mut caches: Vec<KvCache> = (1..job.choices).map(|_| cache.clone()).collect();
    caches.push(cache);
    let mut live = Vec::with_capacity(job.choices);
    for (i, cache) in caches.into_iter().enumerate() {
        let chooser = match Chooser::new(for_choice(&job.options, i), job.prompt.clone()) {
            Ok(c) => match &job.constraint {
                Some(g) => c.constrained(g.clone()),
                None => c,
            },
            Err(e) => {
                let _ = job.events.send(Event::Failed(e.to_string()));
                return Vec::new();
            }
        };
        let mut l = Live {
            index: job.first_index + i,
            events: job.events.clone(),
            chooser,
            cache,
            next: 0,
            text: tok.map(Tokenizer::stream),
            stop: StopFilter::new(job.stops.clone()),
            logprobs: job.logprobs,
            pending: Vec::new(),
        };
        let ended = match l.chooser.choose(logits) {
            Ok(tok) => send(&mut l, tok, logits, metrics),
            Err(e) => failed(&l, e),
        };
        if !ended {
            live.push(l);
        }
    }
    live
}

/// One decoding step of every live sequence; the ended ones leave.
pub(super) fn step(model: &Transformer, live: &mut Vec<Live>, metrics: &Metrics) {
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
    // each sequence's choice (a sort of the vocabulary when sampling, a grammar's mask)
    // side by side
    let chosen: Vec<qkv::Result<usize>> = {
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
        .zip(logits.data().chunks_exact(v))
        .map(|((l, tok), row)| match tok {
            Ok(tok) => send(l, tok, row, metrics),
            Err(e) => failed(l, e),
        })
        .collect();
    let mut i = 0;
    live.retain(|_| {
        i += 1;
        !ended[i - 1]
    });
}

/// A sequence whose token could not be chosen (its grammar's engine failed) fails alone;
/// true (it has ended).
fn failed(l: &Live, e: qkv::Error) -> bool {
    let _ = l
        .events
        .send(Event::Failed(format!("choosing a token: {e}")));
    true
}

fn fail_all(live: &mut Vec<Live>, why: String) {
    for l in live.drain(..) {
        let _ = l.events.send(Event::Failed(why.clone()));
    }
}

/// Sends the text that `l`'s newly chosen token `tok` (chosen from `logits`) releases,
/// with the log-probabilities waiting for it; true when the sequence has ended.
fn send(l: &mut Live, tok: usize, logits: &[f32], metrics: &Metrics) -> bool {
    l.next = tok;
    metrics.tokens(1);
    if let Some(top) = l.logprobs {
        l.pending.push(logprobs(logits, tok, top));
    }
    let piece = match l.text.as_mut().map(|s| s.push(tok)).transpose() {
        Ok(p) => p.flatten(),
        Err(e) => {
            let _ = l.events.send(Event::Failed(e.to_string()));
            return true;
        }
    };
    if let Some(p) = piece {
        let r = l.stop.push(&p);
        piece_out(l, r.text);
        if r.stopped {
            return done(l, "stop");
        }
    }
    let Some(finish) = l.chooser.finished() else {
        return false;
    };
    let rest = match l.text.take().map(TextStream::finish).transpose() {
        Ok(r) => r.flatten().unwrap_or_default(),
        Err(e) => {
            let _ = l.events.send(Event::Failed(e.to_string()));
            return true;
        }
    };
    let r = l.stop.last(&rest);
    piece_out(l, r.text);
    match (r.stopped, finish) {
        (true, _) | (false, Finish::Eos | Finish::Complete) => done(l, "stop"),
        (false, Finish::Length) => done(l, "length"),
    }
}

/// Sends released text with the log-probabilities waiting for it (none without text).
fn piece_out(l: &mut Live, text: String) {
    if !text.is_empty() {
        let _ = l.events.send(Event::Piece {
            index: l.index,
            text,
            logprobs: std::mem::take(&mut l.pending),
        });
    }
}

/// Tells the handler the sequence has ended, after the log-probabilities of tokens whose
/// text was held back or cut by a stop string (or of a model without a tokenizer); true.
fn done(l: &mut Live, finish: &'static str) -> bool {
    if !l.pending.is_empty() {
        let _ = l.events.send(Event::Piece {
            index: l.index,
            text: String::new(),
            logprobs: std::mem::take(&mut l.pending),
        });
    }
    let _ = l.events.send(Event::Done {
        index: l.index,
        finish,
        tokens: l.chooser.tokens().to_vec(),
    });
    true
}
