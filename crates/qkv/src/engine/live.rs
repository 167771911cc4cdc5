//! The sequences being decoded: a prefilled prompt joins as its choices, each step
//! chooses every sequence's next token together, and each sequence's text (stop strings
//! held back) and log-probabilities go to its request's handler.

use std::sync::Arc;

use crate::attention::KvCache;
use crate::error::{Error, Result};
use crate::models::generate::{
    logprobs, Chooser, Finish, GenerateOptions, Sampling, TokenLogprobs,
};
use crate::text::{TextStream, Tokenizer};

use super::events::Event;
use super::events::Events;
use super::job::Joining;
use super::observer::Observer;
use super::stop::StopFilter;

/// One choice being decoded.
pub(super) struct Live<'t> {
    index: usize,
    prompt: Arc<Vec<usize>>,
    events: Arc<dyn Events>,
    chooser: Chooser,
    pub(super) cache: KvCache,
    /// its last chosen token, the next step's input
    pub(super) next: usize,
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

    /// Tells the handler this sequence failed inside the engine.
    pub(super) fn fail(self, why: String) {
        self.events.send(Event::Failed(why));
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
    observer: &dyn Observer,
) -> Vec<Live<'t>> {
    let Joining {
        job, cache, scored, ..
    } = j;
    observer.first_token(job.queued.elapsed());
    if job.prompt_logprobs {
        job.events.send(Event::Prompt {
            first_index: job.first_index,
            logprobs: scored,
        });
    }
    if job.score_only {
        for index in job.first_index..job.first_index + job.choices {
            job.events.send(Event::Done {
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
    let prompt = Arc::new(job.prompt.clone());
    let mut live = Vec::with_capacity(job.choices);
    for (i, cache) in caches.into_iter().enumerate() {
        let chooser = match Chooser::new(for_choice(&job.options, i), job.prompt.clone()) {
            Ok(c) => match &job.constraint {
                Some(g) => c.constrained(g.clone()),
                None => c,
            },
            Err(e) => {
                job.events.send(Event::Failed(e.to_string()));
                return Vec::new();
            }
        };
        let mut l = Live {
            index: job.first_index + i,
            prompt: prompt.clone(),
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
            Ok(tok) => send(&mut l, tok, logits, observer),
            Err(e) => failed(&l, e),
        };
        if !ended {
            live.push(l);
        }
    }
    live
}

/// What takes an ended sequence: its prompt, its chosen tokens and its cache.
pub(super) type Ended<'a> = dyn FnMut(&[usize], &[usize], &KvCache) + 'a;

/// Chooses every live sequence's next token from its row of `logits` (`[N·V]`, row i
/// for sequence i, a step's decoding rows) and sends what it releases; the ended ones
/// leave, each handing its prompt, chosen tokens and cache to `ended` (a prefix cache
/// keeps them; the cache holds every chosen token but the last).
pub(super) fn advance(
    live: &mut Vec<Live>,
    logits: &[f32],
    v: usize,
    observer: &dyn Observer,
    ended: &mut Ended,
) {
    // each sequence's choice (a sort of the vocabulary when sampling, a grammar's mask)
    // side by side
    let chosen: Vec<Result<usize>> = {
        use rayon::prelude::*;
        live.par_iter_mut()
            .zip(logits.par_chunks_exact(v))
            .map(|(l, row)| l.chooser.choose(row))
            .collect()
    };
    let done: Vec<bool> = live
        .iter_mut()
        .zip(chosen)
        .zip(logits.chunks_exact(v))
        .map(|((l, tok), row)| match tok {
            Ok(tok) => send(l, tok, row, observer),
            Err(e) => failed(l, e),
        })
        .collect();
    let mut i = 0;
    live.retain(|l| {
        i += 1;
        if done[i - 1] {
            ended(&l.prompt, l.chooser.tokens(), &l.cache);
        }
        !done[i - 1]
    });
}

/// A sequence whose token could not be chosen (its grammar's engine failed) fails alone;
/// true (it has ended).
fn failed(l: &Live, e: Error) -> bool {
    l.events
        .send(Event::Failed(format!("choosing a token: {e}")));
    true
}

/// Sends the text that `l`'s newly chosen token `tok` (chosen from `logits`) releases,
/// with the log-probabilities waiting for it; true when the sequence has ended.
fn send(l: &mut Live, tok: usize, logits: &[f32], observer: &dyn Observer) -> bool {
    l.next = tok;
    observer.tokens(1);
    if let Some(top) = l.logprobs {
        l.pending.push(logprobs(logits, tok, top));
    }
    let piece = match l.text.as_mut().map(|s| s.push(tok)).transpose() {
        Ok(p) => p.flatten(),
        Err(e) => {
            l.events.send(Event::Failed(e.to_string()));
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
            l.events.send(Event::Failed(e.to_string()));
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
        l.events.send(Event::Piece {
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
        l.events.send(Event::Piece {
            index: l.index,
            text: String::new(),
            logprobs: std::mem::take(&mut l.pending),
        });
    }
    l.events.send(Event::Done {
        index: l.index,
        finish,
        tokens: l.chooser.tokens().to_vec(),
    });
    true
}
