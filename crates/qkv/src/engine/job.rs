//! What the generator runs: a job (one prompt of a request, decoded as its choices), a
//! job while its prompt is prefilled, and how a panic inside the engine reads in the
//! failure its handler gets.

use std::sync::Arc;
use std::time::Instant;

use crate::attention::KvCache;
use crate::models::generate::grammar::Constraint;
use crate::models::generate::{GenerateOptions, TokenLogprobs};

use super::events::Events;

/// One prompt of a generation request as the generator runs it: prefilled once, then
/// decoded as `choices` sequences.
pub struct Job {
    pub prompt: Vec<usize>,
    pub options: GenerateOptions,
    pub stops: Vec<String>,
    /// Sequences decoded from the prompt (OpenAI's `n`): each starts from a copy of the
    /// prompt's cache, and choice i samples with the request's seed plus i.
    pub choices: usize,
    /// The answer's index of this job's first choice (a request of several prompts
    /// numbers its choices prompt by prompt).
    pub first_index: usize,
    /// Log-probabilities with every chosen token, and this many alternatives.
    pub logprobs: Option<usize>,
    /// Also the prompt's log-probabilities (each token's given the ones before it).
    pub prompt_logprobs: bool,
    /// No new token: the prompt is scored and the job ends (`echo` with `max_tokens` 0).
    pub score_only: bool,
    /// The grammar each choice's tokens follow (structured output), compiled.
    pub constraint: Option<Constraint>,
    /// Every job of a request sends to its one handler.
    pub events: Arc<dyn Events>,
    pub queued: Instant,
    /// Panic while prefilling it: the fault the tests inject (a prompt equal to
    /// `$QKV_FAULT_PROMPT`) to check that a panic fails its request alone.
    pub fault: bool,
}

impl Job {
    /// A job of one choice, numbered `index`, with no stop strings, log-probabilities or
    /// grammar: what a batch of prompts run through the engine asks.
    pub fn new(
        prompt: Vec<usize>,
        options: GenerateOptions,
        index: usize,
        events: Arc<dyn Events>,
    ) -> Job {
        Job {
            prompt,
            options,
            stops: Vec::new(),
            choices: 1,
            first_index: index,
            logprobs: None,
            prompt_logprobs: false,
            score_only: false,
            constraint: None,
            events,
            queued: Instant::now(),
            fault: false,
        }
    }
}

/// A prompt being prefilled, `done` of its tokens so far.
pub(super) struct Joining {
    pub(super) job: Job,
    pub(super) cache: KvCache,
    pub(super) done: usize,
    /// its log-probabilities so far, when the job asks for them
    pub(super) scored: Vec<Option<TokenLogprobs>>,
}

/// The message of a panic's payload.
pub(super) fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into())
}
