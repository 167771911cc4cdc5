//! One sequence's tokens chosen step by step, for callers that run the decoding loop
//! themselves (a server decoding many sequences side by side, each joining and
//! leaving at its own time). A sequence's choices equal those of [`super::generate_each`]
//! run on it alone: the same banned and forced tokens, and the same seeded draws. A
//! sequence may also follow a grammar ([`super::grammar`]): its mask is applied last,
//! after the penalties, before the choice.

use super::grammar::Constraint;
use super::options::{check, GenerateOptions, Sampling};
use super::sampling::choose;
use crate::error::{Error, Result};
use crate::rng::Rng;

/// Why a sequence ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// It chose one of the end-of-sequence tokens (which it keeps as its last).
    Eos,
    /// It reached `max_new_tokens`.
    Length,
    /// Its grammar is complete: nothing may follow.
    Complete,
}

/// The choosing state of one sequence: its options, its own random generator, what it
/// read before its first new token and what it has chosen since.
#[derive(Clone, Debug)]
pub struct Chooser {
    opts: GenerateOptions,
    rng: Rng,
    prefix: Vec<usize>,
    tokens: Vec<usize>,
    constraint: Option<Constraint>,
}

impl Chooser {
    /// `prefix`: the prompt (decoder-only) or the decoder's start token. Beam search
    /// keeps many hypotheses per sequence and is refused here.
    pub fn new(opts: GenerateOptions, prefix: Vec<usize>) -> Result<Self> {
        check(&opts)?;
        if opts.search.num_beams > 1 {
            return Err(Error::invalid(
                "num_beams",
                "a sequence decoded step by step takes one beam",
            ));
        }
        let seed = match opts.sampling {
            Sampling::Sample { seed, .. } => seed,
            Sampling::Greedy => 0,
        };
        Ok(Chooser {
            opts,
            rng: Rng::new(seed),
            prefix,
            tokens: Vec::new(),
            constraint: None,
        })
    }

    /// This chooser, its tokens held to `constraint`'s grammar.
    pub fn constrained(mut self, constraint: Constraint) -> Self {
        self.constraint = Some(constraint);
        self
    }

    /// Chooses the next token from its logits `[V]` and records it. Call it only while
    /// [`Chooser::finished`] is `None`. An error only from the grammar's engine (a
    /// limit of its work reached): the sequence cannot go on.
    pub fn choose(&mut self, logits: &[f32]) -> Result<usize> {
        let tok = if self.opts.constrained() || self.constraint.is_some() {
            let mut row = logits.to_vec();
            self.opts.process(&mut row, &self.prefix, &self.tokens);
            if let Some(c) = &mut self.constraint {
                c.mask(&mut row)?;
                if row.iter().all(|s| *s == f32::NEG_INFINITY) {
                    return Err(Error::invalid(
                        "grammar",
                        "no token of the vocabulary can continue the grammar here",
                    ));
                }
            }
            choose(&row, self.opts.sampling, &mut self.rng)
        } else {
            choose(logits, self.opts.sampling, &mut self.rng)
        };
        if let Some(c) = &mut self.constraint {
            c.commit(tok)?;
        }
        self.tokens.push(tok);
        Ok(tok)
    }

    /// The tokens chosen so far.
    pub fn tokens(&self) -> &[usize] {
        &self.tokens
    }

    /// Whether the sequence has ended, and why.
    pub fn finished(&self) -> Option<Finish> {
        match self.tokens.last() {
            Some(t) if self.opts.eos.contains(t) => Some(Finish::Eos),
            _ if self
                .constraint
                .as_ref()
                .is_some_and(Constraint::is_complete) =>
            {
                Some(Finish::Complete)
            }
            _ if self.tokens.len() >= self.opts.max_new_tokens => Some(Finish::Length),
            _ => None,
        }
    }
}
