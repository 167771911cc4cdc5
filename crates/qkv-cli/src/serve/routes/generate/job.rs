//! A completion request's settings checked (each refusal a 400 naming the field) and
//! made into the generator's jobs: one a prompt, each decoded as `n` choices.

use std::sync::Arc;
use std::time::Instant;

use qkv::models::generate::grammar::Constraint;
use qkv::models::generate::request::Request as GenRequest;
use qkv::models::generate::MAX_TOP_LOGPROBS;
use qkv::models::ModelKind;
use serde_json::Value;
use tokio::sync::mpsc;

use super::kind::Kind;
use crate::serve::api::{ApiError, Settings};
use qkv::engine::{Event, Events, Job};

use crate::serve::engine::Handler;
use crate::serve::state::AppState;

/// Choices one request may ask for, over all its prompts (OpenAI's limit for `n`).
pub const MAX_CHOICES: usize = 128;

/// What the answer is made of, besides the choices' text.
pub struct Shape {
    pub kind: Kind,
    /// choices per prompt
    pub n: usize,
    pub prompts: Vec<Vec<usize>>,
    /// alternatives reported with each token's log-probability, when asked
    pub logprobs: Option<usize>,
    /// completions: the prompt's text (and log-probabilities) before each choice's
    pub echo: bool,
    pub stream: bool,
    pub include_usage: bool,
    /// chat: how the answer's tool calls are read, when the model may call
    pub tools: Option<super::tools::Parser>,
}

impl Shape {
    pub fn choices(&self) -> usize {
        self.prompts.len() * self.n
    }
}

/// `logprobs` as the endpoint reads it: completions an integer (alternatives), chat a
/// bool with `top_logprobs` beside it.
fn logprobs_asked(kind: Kind, st: &Settings) -> Result<Option<usize>, ApiError> {
    let top = |field: &str, n: Option<u64>| match n {
        Some(n) if n as usize <= MAX_TOP_LOGPROBS => Ok(n as usize),
        _ => Err(ApiError::invalid(
            field,
            format!("an integer from 0 to {MAX_TOP_LOGPROBS}"),
        )),
    };
    let asked = st.logprobs.as_ref().filter(|v| !v.is_null());
    match kind {
        Kind::Completion => match asked {
            None | Some(Value::Bool(false)) => Ok(None),
            Some(v) => top("logprobs", v.as_u64()).map(Some),
        },
        Kind::Chat => {
            let on = match asked {
                None => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => {
                    return Err(ApiError::invalid(
                        "logprobs",
                        "true or false (give the alternatives' count as top_logprobs)",
                    ))
                }
            };
            match (on, st.top_logprobs) {
                (false, Some(_)) => Err(ApiError::invalid(
                    "top_logprobs",
                    "needs `logprobs` set to true",
                )),
                (false, None) => Ok(None),
                (true, n) => top("top_logprobs", Some(n.unwrap_or(0) as u64)).map(Some),
            }
        }
    }
}

/// The sampling keywords of `st` as a library request of at most `max` new tokens.
fn sampling(st: &Settings, max: usize, vocab: usize) -> Result<GenRequest, ApiError> {
    let temperature = st.temperature;
    if let Some(t) = temperature.filter(|t| !(0.0..=2.0).contains(t)) {
        return Err(ApiError::invalid(
            "temperature",
            format!("{t} is outside [0, 2]"),
        ));
    }
    if let Some(p) = st.top_p.filter(|p| !(*p > 0.0 && *p <= 1.0)) {
        return Err(ApiError::invalid("top_p", format!("{p} is outside (0, 1]")));
    }
    if let Some(p) = st.min_p.filter(|p| !(0.0..=1.0).contains(p)) {
        return Err(ApiError::invalid("min_p", format!("{p} is outside [0, 1]")));
    }
    let top_k = match st.top_k {
        None | Some(0) | Some(-1) => None,
        Some(k) if k > 0 => Some(k as usize),
        Some(k) => {
            return Err(ApiError::invalid(
                "top_k",
                format!("{k}: give at least 1, or 0 or -1 for every token"),
            ))
        }
    };
    for (name, v) in [
        ("frequency_penalty", st.frequency_penalty),
        ("presence_penalty", st.presence_penalty),
    ] {
        if let Some(v) = v.filter(|v| !(-2.0..=2.0).contains(v)) {
            return Err(ApiError::invalid(name, format!("{v} is outside [-2, 2]")));
        }
    }
    if let Some(r) = st
        .repetition_penalty
        .filter(|r| !(r.is_finite() && *r > 0.0))
    {
        return Err(ApiError::invalid(
            "repetition_penalty",
            format!("{r}: must be above 0 (1 for none)"),
        ));
    }
    let mut logit_bias = Vec::new();
    for (key, &bias) in st.logit_bias.iter().flatten() {
        let id = key
            .parse::<usize>()
            .ok()
            .filter(|&id| id < vocab)
            .ok_or_else(|| {
                ApiError::invalid(
                    "logit_bias",
                    format!("{key:?} is not a token id of the vocabulary of {vocab}"),
                )
            })?;
        if !(-100.0..=100.0).contains(&bias) {
            return Err(ApiError::invalid(
                "logit_bias",
                format!("token {id}'s bias {bias} is outside [-100, 100]"),
            ));
        }
        logit_bias.push((id, bias));
    }
    // temperature 0 is greedy, whatever else narrows the sampling
    let sample = temperature != Some(0.0);
    Ok(GenRequest {
        max_new_tokens: Some(max),
        greedy: !sample,
        temperature: temperature.filter(|&t| t > 0.0),
        top_p: st.top_p.filter(|_| sample),
        top_k: top_k.filter(|_| sample),
        min_p: st.min_p.filter(|_| sample),
        seed: st.seed.unwrap_or(0),
        repetition_penalty: st.repetition_penalty,
        presence_penalty: st.presence_penalty,
        frequency_penalty: st.frequency_penalty,
        logit_bias,
        ..Default::default()
    })
}

impl AppState {
    /// The jobs of a request: one per prompt, `default_max` new tokens when it asks no
    /// length. Every check runs before any job is queued.
    pub fn jobs(
        &self,
        prompts: Vec<Vec<usize>>,
        st: &mut Settings,
        kind: Kind,
        default_max: usize,
        constraint: Option<Constraint>,
    ) -> Result<(Vec<Job>, mpsc::UnboundedReceiver<Event>, Shape), ApiError> {
        let g = self.generator()?;
        if st.stream_options.is_some() && !st.stream {
            return Err(ApiError::invalid(
                "stream_options",
                "only for a streamed answer: set stream to true, or leave stream_options out",
            ));
        }
        let n = st.n.unwrap_or(1);
        if n == 0 || n * prompts.len() > MAX_CHOICES {
            return Err(ApiError::invalid(
                "n",
                format!(
                    "{n} choices for each of {} prompts: from 1 to {MAX_CHOICES} in all",
                    prompts.len()
                ),
            ));
        }
        // a prompt's choices decode together, each with its own cache
        if n > self.limits.max_batch {
            return Err(ApiError::invalid(
                "n",
                format!(
                    "{n} choices, more than the {} sequences the server decodes together (--max-batch)",
                    self.limits.max_batch
                ),
            ));
        }
        let logprobs = logprobs_asked(kind, st)?;
        let seq2seq = g.model.kind() == ModelKind::EncoderDecoder;
        if seq2seq && (n > 1 || logprobs.is_some() || constraint.is_some()) {
            let field = match (n > 1, logprobs.is_some()) {
                (true, _) => "n",
                (false, true) => "logprobs",
                (false, false) => "response_format",
            };
            return Err(ApiError::invalid(
                field,
                "an encoder-decoder model is served one choice at a time, without log-probabilities or structured output",
            ));
        }
        let (field, asked) = match (st.max_completion_tokens, st.max_tokens) {
            (Some(n), _) => ("max_completion_tokens", Some(n)),
            (None, n) => ("max_tokens", n),
        };
        // `echo` with no new token scores the prompt alone
        let score_only = st.echo && asked == Some(0);
        if asked == Some(0) && !score_only {
            return Err(ApiError::invalid(
                field,
                "must be at least 1 (0 only with `echo`)",
            ));
        }
        if score_only && seq2seq {
            return Err(ApiError::invalid(
                field,
                "an encoder-decoder model cannot score its source",
            ));
        }
        let max = asked
            .filter(|_| !score_only)
            .unwrap_or(default_max.min(self.limits.max_tokens));
        if max > self.limits.max_tokens {
            return Err(ApiError::invalid(
                field,
                format!(
                    "{max} is over the server's limit of {} (--max-tokens)",
                    self.limits.max_tokens
                ),
            ));
        }
        let vocab = g.model.arch.vocab;
        let request = sampling(st, max.max(1), vocab)?;
        let maps = st.qkv.take().unwrap_or_default();
        if maps.attentions && (st.stream || prompts.len() * n > 1) {
            return Err(ApiError::invalid(
                "qkv.attentions",
                "the maps come with a whole answer of one choice: give `stream` false, one prompt and `n` 1",
            ));
        }
        let stops = st.stop.take().map(|s| s.into_vec()).unwrap_or_default();
        if stops.len() > 4 {
            return Err(ApiError::invalid("stop", "at most 4 stop strings"));
        }
        if !stops.is_empty() && g.tokenizer.is_none() {
            return Err(ApiError::invalid(
                "stop",
                "the model folder has no tokenizer to match text with",
            ));
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let events: Arc<dyn Events> = Arc::new(Handler(tx));
        let mut jobs = Vec::with_capacity(prompts.len());
        for (p, ids) in prompts.iter().enumerate() {
            let prompt = |why: String| match prompts.len() {
                1 => ApiError::invalid("prompt", why),
                _ => ApiError::invalid(format!("prompt[{p}]"), why),
            };
            if ids.is_empty() {
                return Err(prompt("the prompt has no tokens".into()));
            }
            if ids.len() > self.limits.max_prompt {
                return Err(prompt(format!(
                    "{} tokens is over the server's limit of {} (--max-prompt)",
                    ids.len(),
                    self.limits.max_prompt
                )));
            }
            if let Some(bad) = ids.iter().find(|&&i| i >= vocab) {
                return Err(prompt(format!(
                    "token {bad} is outside the vocabulary of {vocab}"
                )));
            }
            let plan = request
                .plan(&g.model, g.config.clone(), ids.len())
                .map_err(|e| ApiError::invalid(field, e.to_string()))?;
            // a length the request asked for is refused when it does not fit; the
            // default is cut to what fits
            if let Some(c) = plan.clamped.filter(|_| asked.is_some() && !score_only) {
                return Err(ApiError::invalid(
                    field,
                    format!(
                        "the prompt of {} tokens and {} new ones go past the model's positions: at most {} new tokens",
                        ids.len(),
                        c.asked,
                        c.allowed
                    ),
                ));
            }
            crate::serve::attentions::check(&g.model, &maps, ids.len() + max)?;
            jobs.push(Job {
                prompt: ids.clone(),
                options: plan.options,
                stops: stops.clone(),
                choices: n,
                first_index: p * n,
                logprobs,
                prompt_logprobs: st.echo && logprobs.is_some(),
                score_only,
                constraint: constraint.clone(),
                events: events.clone(),
                queued: Instant::now(),
                fault: false,
            });
        }
        st.qkv = Some(maps);
        for j in &jobs {
            self.metrics.prompt(j.prompt.len());
        }
        let shape = Shape {
            kind,
            n,
            prompts,
            logprobs,
            echo: st.echo,
            stream: st.stream,
            include_usage: st.stream_options.as_ref().is_some_and(|o| o.include_usage),
            tools: None,
        };
        Ok((jobs, rx, shape))
    }
}
