//! Completions and chat completions: a request becomes a scheduler job, answered whole
//! or as server-sent events, with the attention maps when asked.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::sse::{Event as Sse, KeepAlive};
use axum::response::IntoResponse;
use axum::Json;
use qkv::models::generate::request::Request as GenRequest;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::shared::{body, engine_failed, now, off_thread, Reply, Shared, MAX_MESSAGES};
use crate::serve::api::{
    parse, ApiError, ChatRequest, CompletionRequest, Content, Prompt, Settings, Usage, SETTINGS,
};
use crate::serve::scheduler::{Event, Job};
use crate::serve::state::AppState;

impl AppState {
    fn job(
        &self,
        ids: Vec<usize>,
        st: &mut Settings,
        default_max: usize,
    ) -> Result<(Job, mpsc::UnboundedReceiver<Event>), ApiError> {
        let g = self.generator()?;
        if st.stream_options.is_some() && !st.stream {
            return Err(ApiError::invalid(
                "stream_options",
                "only for a streamed answer: set stream to true, or leave stream_options out",
            ));
        }
        if st.n.is_some_and(|n| n != 1) {
            return Err(ApiError::invalid("n", "only n = 1 is supported"));
        }
        for (name, v) in [
            ("frequency_penalty", st.frequency_penalty),
            ("presence_penalty", st.presence_penalty),
        ] {
            if v.is_some_and(|v| v != 0.0) {
                return Err(ApiError::invalid(
                    name,
                    format!("qkv applies no {name}; give 0"),
                ));
            }
        }
        if st
            .logprobs
            .as_ref()
            .is_some_and(|v| !(v.is_null() || *v == json!(false)))
        {
            return Err(ApiError::invalid(
                "logprobs",
                "log-probabilities are not returned; give false",
            ));
        }
        if let Some(t) = st.temperature.filter(|t| !(0.0..=2.0).contains(t)) {
            return Err(ApiError::invalid(
                "temperature",
                format!("{t} is outside [0, 2]"),
            ));
        }
        if let Some(p) = st.top_p.filter(|p| !(*p > 0.0 && *p <= 1.0)) {
            return Err(ApiError::invalid("top_p", format!("{p} is outside (0, 1]")));
        }
        let (field, asked) = match (st.max_completion_tokens, st.max_tokens) {
            (Some(n), _) => ("max_completion_tokens", Some(n)),
            (None, n) => ("max_tokens", n),
        };
        if asked == Some(0) {
            return Err(ApiError::invalid(field, "must be at least 1"));
        }
        let max = asked.unwrap_or(default_max.min(self.limits.max_tokens));
        if max > self.limits.max_tokens {
            return Err(ApiError::invalid(
                field,
                format!(
                    "{max} is over the server's limit of {} (--max-tokens)",
                    self.limits.max_tokens
                ),
            ));
        }
        if ids.is_empty() {
            return Err(ApiError::invalid("prompt", "the prompt has no tokens"));
        }
        if ids.len() > self.limits.max_prompt {
            return Err(ApiError::invalid(
                "prompt",
                format!(
                    "{} tokens is over the server's limit of {} (--max-prompt)",
                    ids.len(),
                    self.limits.max_prompt
                ),
            ));
        }
        let vocab = g.model.arch.vocab;
        if let Some(bad) = ids.iter().find(|&&i| i >= vocab) {
            return Err(ApiError::invalid(
                "prompt",
                format!("token {bad} is outside the vocabulary of {vocab}"),
            ));
        }
        let temperature = st.temperature;
        let request = GenRequest {
            max_new_tokens: Some(max),
            greedy: temperature == Some(0.0),
            temperature: temperature.filter(|&t| t > 0.0),
            top_p: st.top_p.filter(|_| temperature != Some(0.0)),
            seed: st.seed.unwrap_or(0),
            ..Default::default()
        };
        let plan = request
            .plan(&g.model, g.config.clone(), ids.len())
            .map_err(|e| ApiError::invalid(field, e.to_string()))?;
        // a length the request asked for is refused when it does not fit; the default
        // is cut to what fits
        if let Some(c) = plan.clamped.filter(|_| asked.is_some()) {
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
        let maps = st.qkv.take().unwrap_or_default();
        crate::serve::attentions::check(&g.model, &maps, ids.len() + max)?;
        if maps.attentions && st.stream {
            return Err(ApiError::invalid(
                "qkv.attentions",
                "the maps come with a whole answer: give `stream` false",
            ));
        }
        st.qkv = Some(maps);
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
        self.metrics.prompt(ids.len());
        let (tx, rx) = mpsc::unbounded_channel();
        let job = Job {
            prompt: ids,
            options: plan.options,
            stops,
            events: tx,
            queued: Instant::now(),
            fault: false,
        };
        Ok((job, rx))
    }
}

/// Which endpoint a generation answers.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Completion,
    Chat,
}

impl Kind {
    fn id_prefix(self) -> &'static str {
        match self {
            Kind::Completion => "cmpl",
            Kind::Chat => "chatcmpl",
        }
    }

    /// The `object` of a whole answer, or of a streamed chunk.
    fn object(self, chunk: bool) -> &'static str {
        match (self, chunk) {
            (Kind::Completion, _) => "text_completion",
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
        }
    }

    /// A whole answer's one choice.
    fn choice(self, text: String, finish: Value) -> Value {
        let mut c = json!({"index": 0, "finish_reason": finish, "logprobs": null});
        match self {
            Kind::Completion => c["text"] = json!(text),
            Kind::Chat => c["message"] = json!({"role": "assistant", "content": text}),
        }
        c
    }

    /// A streamed chunk's one choice: a piece of text, or none in the closing chunk.
    fn delta(self, text: Option<String>, finish: Value) -> Value {
        let mut c = json!({"index": 0, "finish_reason": finish, "logprobs": null});
        match self {
            Kind::Completion => c["text"] = json!(text.unwrap_or_default()),
            Kind::Chat => c["delta"] = text.map_or(json!({}), |t| json!({"content": t})),
        }
        c
    }
}

pub async fn completions(State(s): Shared, b: Result<Bytes, BytesRejection>) -> Reply {
    let b = body(b)?;
    let v = s.request_json("/v1/completions", &b, &[&["model", "prompt"], SETTINGS])?;
    let req: CompletionRequest = parse(&v)?;
    let mut settings: Settings = parse(&v)?;
    s.generator()?;
    s.check_model(&req.model)?;
    let fault = matches!(&req.prompt, Prompt::Text(t) if std::env::var("QKV_FAULT_PROMPT").is_ok_and(|f| f == *t));
    let ids = match req.prompt {
        Prompt::Text(t) => encoded(&s, t).await?,
        Prompt::Texts(mut v) if v.len() == 1 => encoded(&s, v.pop().unwrap_or_default()).await?,
        Prompt::Texts(v) => {
            return Err(ApiError::invalid(
                "prompt",
                format!("{} prompts: one per request", v.len()),
            ))
        }
        Prompt::Ids(ids) => ids.into_iter().map(|i| i as usize).collect(),
    };
    let prompt_tokens = ids.len();
    let (mut job, rx) = s.job(ids, &mut settings, 16)?;
    job.fault = fault;
    answer(s, job, rx, Kind::Completion, &settings, prompt_tokens).await
}

/// A prompt's text as tokens, tokenized off the HTTP thread.
async fn encoded(s: &Arc<AppState>, text: String) -> Result<Vec<usize>, ApiError> {
    let s = s.clone();
    off_thread(move || s.encode(&text, true)).await
}

pub async fn chat(State(s): Shared, b: Result<Bytes, BytesRejection>) -> Reply {
    let b = body(b)?;
    let v = s.request_json(
        "/v1/chat/completions",
        &b,
        &[&["model", "messages"], SETTINGS],
    )?;
    if let Some(n) = v["messages"]
        .as_array()
        .map(Vec::len)
        .filter(|&n| n > MAX_MESSAGES)
    {
        return Err(ApiError::invalid(
            "messages",
            format!("{n} messages, more than the {MAX_MESSAGES} a conversation may have"),
        ));
    }
    let req: ChatRequest = parse(&v)?;
    let mut settings: Settings = parse(&v)?;
    let g = s.generator()?;
    s.check_model(&req.model)?;
    g.template.as_ref().ok_or_else(|| {
        ApiError::invalid(
            "messages",
            format!("`{}` has no chat template (tokenizer_config.json's chat_template, chat_template.jinja, or a GGUF file's tokenizer.chat_template): use /v1/completions", s.name),
        )
    })?;
    if req.messages.is_empty() {
        return Err(ApiError::invalid("messages", "at least one message"));
    }
    let mut messages: Vec<Value> = Vec::with_capacity(req.messages.len());
    for (i, m) in req.messages.iter().enumerate() {
        let content = match &m.content {
            Content::Text(t) => t.clone(),
            Content::Parts(parts) => {
                if let Some((j, p)) = parts.iter().enumerate().find(|(_, p)| p.kind != "text") {
                    return Err(ApiError::invalid(
                        format!("messages[{i}].content[{j}].type"),
                        format!("`{}`: qkv reads text parts only", p.kind),
                    ));
                }
                let mut text = String::new();
                for (j, p) in parts.iter().enumerate() {
                    let t = p.text.as_deref().ok_or_else(|| {
                        ApiError::invalid(
                            format!("messages[{i}].content[{j}].text"),
                            "a text part needs its `text`",
                        )
                    })?;
                    text.push_str(t);
                }
                text
            }
        };
        messages.push(json!({"role": m.role, "content": content}));
    }
    // the template renders (in a worker process, bounded in steps, output, memory and
    // time) and the prompt is tokenized (bounded in bytes) off the HTTP thread
    let st = s.clone();
    let ids = off_thread(move || {
        let g = st.generator()?;
        let template = g.template.as_ref().expect("checked above");
        let text = g
            .renderer
            .render(template, &messages, true, &serde_json::Map::new())
            .map_err(|e| ApiError::invalid("messages", e.to_string()))?;
        // the template writes the special tokens itself, as transformers tokenizes it
        st.encode(&text, false)
    })
    .await?;
    let prompt_tokens = ids.len();
    let (job, rx) = s.job(ids, &mut settings, usize::MAX)?;
    answer(s, job, rx, Kind::Chat, &settings, prompt_tokens).await
}

/// Queues the job and answers: whole, or as server-sent events.
async fn answer(
    s: Arc<AppState>,
    job: Job,
    mut rx: mpsc::UnboundedReceiver<Event>,
    kind: Kind,
    st: &Settings,
    prompt_tokens: usize,
) -> Reply {
    let g = s.generator()?;
    let maps = st.qkv.as_ref().filter(|o| o.attentions);
    let (prompt, viewer) = (
        maps.map(|_| job.prompt.clone()),
        maps.is_some_and(|o| o.viewer),
    );
    g.queue.submit(job, &s.metrics)?;
    let id = format!("{}-{:x}", kind.id_prefix(), s.next_id());
    let created = now();
    if !st.stream {
        let mut text = String::new();
        loop {
            match rx.recv().await {
                Some(Event::Text(t)) => text.push_str(&t),
                Some(Event::Done { finish, tokens }) => {
                    let mut whole = json!({
                        "id": id, "object": kind.object(false), "created": created,
                        "model": s.name, "choices": [kind.choice(text, json!(finish))],
                        "usage": Usage::new(prompt_tokens, tokens.len()),
                    });
                    if let Some(mut ids) = prompt {
                        ids.extend(tokens);
                        whole["qkv"] = maps_of(&s, ids, viewer).await?;
                    }
                    return Ok(Json(whole).into_response());
                }
                Some(Event::Failed(why)) => return Err(engine_failed(why)),
                None => return Err(engine_failed("the scheduler stopped".into())),
            }
        }
    }
    let include_usage = st.stream_options.as_ref().is_some_and(|o| o.include_usage);
    let name = s.name.clone();
    let (out, out_rx) = mpsc::unbounded_channel::<Result<Sse, Infallible>>();
    let chunk = move |choices: Value, usage: Option<Usage>| -> Sse {
        let mut c = json!({
            "id": id, "object": kind.object(true), "created": created, "model": name,
            "choices": choices,
        });
        if let Some(u) = usage {
            c["usage"] = json!(u);
        }
        Sse::default().data(c.to_string())
    };
    tokio::spawn(async move {
        let send = |e: Sse| out.send(Ok(e)).is_ok();
        // a chat stream opens with the assistant's role
        let opening = json!([{"index": 0, "delta": {"role": "assistant", "content": ""},
                              "finish_reason": null, "logprobs": null}]);
        if kind == Kind::Chat && !send(chunk(opening, None)) {
            return;
        }
        loop {
            let ok = match rx.recv().await {
                Some(Event::Text(t)) => {
                    send(chunk(json!([kind.delta(Some(t), Value::Null)]), None))
                }
                Some(Event::Done { finish, tokens }) => {
                    send(chunk(json!([kind.delta(None, json!(finish))]), None));
                    if include_usage {
                        let usage = Usage::new(prompt_tokens, tokens.len());
                        send(chunk(json!([]), Some(usage)));
                    }
                    send(Sse::default().data("[DONE]"));
                    return;
                }
                Some(Event::Failed(why)) => {
                    send(Sse::default().data(engine_failed(why).body().to_string()));
                    return;
                }
                None => return,
            };
            // the client went away: dropping `rx` frees the sequence at the next step
            if !ok {
                return;
            }
        }
    });
    Ok(
        axum::response::Sse::new(UnboundedReceiverStream::new(out_rx))
            .keep_alive(KeepAlive::default())
            .into_response(),
    )
}

/// The `qkv` field of an answer: the maps of `ids`, computed on the blocking pool (a
/// forward is model math, which the HTTP thread never runs).
async fn maps_of(s: &Arc<AppState>, ids: Vec<usize>, viewer: bool) -> Result<Value, ApiError> {
    let g = s.generator()?;
    let (model, tok, name) = (g.model.clone(), g.tokenizer.clone(), s.name.clone());
    tokio::task::spawn_blocking(move || {
        crate::serve::attentions::answer(&model, tok.as_deref(), &name, &ids, viewer)
    })
    .await
    .map_err(|e| engine_failed(format!("the attention maps: {e}")))?
    .map_err(|e| engine_failed(format!("the attention maps: {e:#}")))
}
