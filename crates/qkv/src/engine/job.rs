//! What the scheduler runs: a job (one prompt of a request, decoded as its choices),
//! the events its handler hears, a job while its prompt is prefilled, and how a panic
//! inside the engine reads in the failure its handler gets.

use std::sync::Arc;
use std::time::Instant;

use crate::attention::KvCache;
use crate::models::generate::grammar::Constraint;
use crate::models::generate::{GenerateOptions, TokenLogprobs};

use super::Events;

/// One prompt of a generation request as the scheduler runs it: prefilled once, then
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

/// What a request's handler hears about its sequences, each by its choice's index.
#[derive(Debug)]
pub enum Event {
    /// A prompt's log-probabilities (the first token has none), for the choices
    /// `first_index..first_index + choices`; sent before their first piece.
    Prompt {
        first_index: usize,
        logprobs: Vec<Option<TokenLogprobs>>,
    },
    /// Text to send (stop strings already held back) and, when asked, the
    /// log-probabilities of the tokens chosen since the choice's last piece.
    Piece {
        index: usize,
        text: String,
        logprobs: Vec<TokenLogprobs>,
    },
    /// The choice's end: `"stop"` (end of sequence or a stop string) or `"length"`.
    Done {
        index: usize,
        finish: &'static str,
        /// the chosen tokens, the last stop or end-of-sequence one included
        tokens: Vec<usize>,
    },
    /// A sequence failed inside the engine (the request gets a 500).
    Failed(String),
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
