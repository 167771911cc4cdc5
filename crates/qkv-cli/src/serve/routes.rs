//! The HTTP side: each endpoint validates its request, turns it into a job for the
//! scheduler (or the embedder) and answers in OpenAI's shapes, streamed as server-sent
//! events when asked. No model math runs here.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::sse::{Event as Sse, KeepAlive};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine as _;
use qkv::models::generate::request::Request as GenRequest;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::api::{
    body_json, parse, ApiError, ChatRequest, CompletionRequest, Content, EmbeddingInput,
    EmbeddingRequest, Prompt, Settings, TokenizeRequest, Usage, EMBEDDING, SETTINGS, TOKENIZE,
};
use super::embedder::EmbedJob;
use super::scheduler::{Event, Job};
use super::AppState;

type Shared = State<Arc<AppState>>;
type Reply = Result<Response, ApiError>;

/// The body, or 413 when it is over the limit (with a Content-Length or chunked alike).
fn body(b: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    b.map_err(|e| {
        let status = e.status();
        let message = match status {
            StatusCode::PAYLOAD_TOO_LARGE => {
                "the request body is over the server's limit (--max-body)".to_string()
            }
            _ => format!("could not read the request body: {e}"),
        };
        ApiError::status(status, message)
    })
}

pub async fn health() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

pub async fn models(State(s): Shared) -> Json<Value> {
    Json(json!({
        "object": "list",
        "data": [{"id": s.name, "object": "model", "created": s.created, "owned_by": "qkv"}],
    }))
}

pub async fn metrics(State(s): Shared) -> Response {
    (
        [("content-type", "text/plain; version=0.0.4")],
        s.metrics.render(),
    )
        .into_response()
}

pub async fn not_found(req: Request) -> ApiError {
    ApiError::status(
        StatusCode::NOT_FOUND,
        format!("no route {} {}", req.method(), req.uri().path()),
    )
}

pub async fn method_not_allowed(req: Request) -> Response {
    if req.method() == Method::OPTIONS {
        return StatusCode::NO_CONTENT.into_response();
    }
    ApiError::status(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{} is not allowed on {}", req.method(), req.uri().path()),
    )
    .into_response()
}

/// Logs one line per request and counts it.
pub async fn log(State(s): Shared, req: Request, next: Next) -> Response {
    let started = Instant::now();
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let r = next.run(req).await;
    let took = started.elapsed();
    let status = r.status().as_u16();
    eprintln!(
        "{method} {path} {status} {:.1} ms",
        took.as_secs_f64() * 1e3
    );
    let endpoint = match path.as_str() {
        "/health"
        | "/v1/models"
        | "/v1/completions"
        | "/v1/chat/completions"
        | "/v1/embeddings"
        | "/tokenize"
        | "/metrics" => path.as_str(),
        _ => "other",
    };
    s.metrics.request(endpoint, status, took);
    r
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl AppState {
    fn check_model(&self, model: &str) -> Result<(), ApiError> {
        if model != self.name {
            return Err(ApiError {
                code: Some("model_not_found"),
                param: Some("model".into()),
                ..ApiError::status(
                    StatusCode::NOT_FOUND,
                    format!(
                        "the model `{model}` does not exist; this server serves `{}`",
                        self.name
                    ),
                )
            });
        }
        Ok(())
    }

    fn generator(&self) -> Result<&super::Generator, ApiError> {
        self.generator.as_ref().ok_or_else(|| {
            ApiError::status(
                StatusCode::NOT_FOUND,
                format!("`{}` is an embedding model: POST /v1/embeddings", self.name),
            )
        })
    }

    /// A job for `ids` under `settings`; `default_max`: the length when the request
    /// gives none.
    fn job(
        &self,
        ids: Vec<usize>,
        st: &mut Settings,
        default_max: usize,
    ) -> Result<(Job, mpsc::UnboundedReceiver<Event>), ApiError> {
        let g = self.generator()?;
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
        super::attentions::check(&g.model, &maps, ids.len() + max)?;
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

    fn encode(&self, text: &str, special: bool) -> Result<Vec<usize>, ApiError> {
        let g = self.generator()?;
        let tok = g.tokenizer.as_ref().ok_or_else(|| {
            ApiError::invalid(
                "prompt",
                "the model folder has no tokenizer: give token ids",
            )
        })?;
        tok.encode(text, special)
            .map_err(|e| ApiError::invalid("prompt", e.to_string()))
    }
}

/// Which endpoint a generation answers.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Completion,
    Chat,
}

pub async fn completions(State(s): Shared, b: Result<Bytes, BytesRejection>) -> Reply {
    let b = body(b)?;
    let v = body_json(&b, &[&["model", "prompt"], SETTINGS])?;
    let req: CompletionRequest = parse(&v)?;
    let mut settings: Settings = parse(&v)?;
    s.generator()?;
    s.check_model(&req.model)?;
    let fault = matches!(&req.prompt, Prompt::Text(t) if std::env::var("QKV_FAULT_PROMPT").is_ok_and(|f| f == *t));
    let ids = match req.prompt {
        Prompt::Text(t) => s.encode(&t, true)?,
        Prompt::Texts(v) if v.len() == 1 => s.encode(&v[0], true)?,
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

pub async fn chat(State(s): Shared, b: Result<Bytes, BytesRejection>) -> Reply {
    let b = body(b)?;
    let v = body_json(&b, &[&["model", "messages"], SETTINGS])?;
    let req: ChatRequest = parse(&v)?;
    let mut settings: Settings = parse(&v)?;
    let g = s.generator()?;
    s.check_model(&req.model)?;
    let template = g.template.as_ref().ok_or_else(|| {
        ApiError::invalid(
            "messages",
            format!("`{}` has no chat template (tokenizer_config.json's chat_template or chat_template.jinja): use /v1/completions", s.name),
        )
    })?;
    if req.messages.is_empty() {
        return Err(ApiError::invalid("messages", "at least one message"));
    }
    let messages: Vec<Value> = req
        .messages
        .iter()
        .map(|m| {
            let content = match &m.content {
                Content::Text(t) => t.clone(),
                Content::Parts(parts) => parts.iter().map(|p| p.text.as_str()).collect(),
            };
            json!({"role": m.role, "content": content})
        })
        .collect();
    let text = template
        .render(&messages, true)
        .map_err(|e| ApiError::invalid("messages", e.to_string()))?;
    // the template writes the special tokens itself, as transformers tokenizes it
    let ids = s.encode(&text, false)?;
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
    let id = format!(
        "{}-{:x}",
        if kind == Kind::Chat {
            "chatcmpl"
        } else {
            "cmpl"
        },
        s.next_id()
    );
    let created = now();
    if !st.stream {
        let mut text = String::new();
        loop {
            match rx.recv().await {
                Some(Event::Text(t)) => text.push_str(&t),
                Some(Event::Done { finish, tokens }) => {
                    let completion_tokens = tokens.len();
                    let choice = match kind {
                        Kind::Completion => {
                            json!({"index": 0, "text": text, "finish_reason": finish, "logprobs": null})
                        }
                        Kind::Chat => {
                            json!({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish, "logprobs": null})
                        }
                    };
                    let object = if kind == Kind::Chat {
                        "chat.completion"
                    } else {
                        "text_completion"
                    };
                    let mut whole = json!({
                        "id": id, "object": object, "created": created, "model": s.name,
                        "choices": [choice],
                        "usage": Usage::new(prompt_tokens, completion_tokens),
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
    let chunk = move |delta: Value, finish: Value| -> Sse {
        let (object, choice) = match kind {
            Kind::Completion => (
                "text_completion",
                json!({"index": 0, "text": delta, "finish_reason": finish, "logprobs": null}),
            ),
            Kind::Chat => (
                "chat.completion.chunk",
                json!({"index": 0, "delta": delta, "finish_reason": finish, "logprobs": null}),
            ),
        };
        Sse::default().data(
            json!({"id": id, "object": object, "created": created, "model": name, "choices": [choice]})
                .to_string(),
        )
    };
    tokio::spawn(async move {
        let send = |e: Sse| out.send(Ok(e)).is_ok();
        if kind == Kind::Chat
            && !send(chunk(
                json!({"role": "assistant", "content": ""}),
                Value::Null,
            ))
        {
            return;
        }
        loop {
            let ok = match rx.recv().await {
                Some(Event::Text(t)) => {
                    let delta = match kind {
                        Kind::Completion => json!(t),
                        Kind::Chat => json!({"content": t}),
                    };
                    send(chunk(delta, Value::Null))
                }
                Some(Event::Done { finish, tokens }) => {
                    let completion_tokens = tokens.len();
                    let empty = match kind {
                        Kind::Completion => json!(""),
                        Kind::Chat => json!({}),
                    };
                    send(chunk(empty, json!(finish)));
                    if include_usage {
                        let mut last: Value = json!({"choices": [], "usage": Usage::new(prompt_tokens, completion_tokens)});
                        last["object"] = json!(if kind == Kind::Chat {
                            "chat.completion.chunk"
                        } else {
                            "text_completion"
                        });
                        send(Sse::default().data(last.to_string()));
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
        super::attentions::answer(&model, tok.as_deref(), &name, &ids, viewer)
    })
    .await
    .map_err(|e| engine_failed(format!("the attention maps: {e}")))?
    .map_err(|e| engine_failed(format!("the attention maps: {e:#}")))
}

fn engine_failed(why: String) -> ApiError {
    ApiError::status(
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("the engine failed on this request: {why}"),
    )
}

pub async fn embeddings(State(s): Shared, b: Result<Bytes, BytesRejection>) -> Reply {
    let b = body(b)?;
    let req: EmbeddingRequest = parse(&body_json(&b, &[EMBEDDING])?)?;
    let e = s.embedder.as_ref().ok_or_else(|| {
        ApiError::status(
            StatusCode::NOT_FOUND,
            format!("`{}` generates text: POST /v1/completions", s.name),
        )
    })?;
    s.check_model(&req.model)?;
    let base64 = match req.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::invalid(
                "encoding_format",
                format!("`{other}`: float or base64"),
            ))
        }
    };
    let dim = e.encoder.dim();
    if let Some(d) = req.dimensions.filter(|&d| d != dim) {
        return Err(ApiError::invalid(
            "dimensions",
            format!("{d}: this model's embeddings have {dim}"),
        ));
    }
    let texts = match req.input {
        EmbeddingInput::Text(t) => vec![t],
        EmbeddingInput::Texts(v) => v,
    };
    if texts.is_empty() || texts.len() > s.limits.max_inputs {
        return Err(ApiError::invalid(
            "input",
            format!("{} texts: give 1 to {}", texts.len(), s.limits.max_inputs),
        ));
    }
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let batch = e
        .encoder
        .tokenize(&refs)
        .map_err(|err| ApiError::invalid("input", err.to_string()))?;
    let tokens = batch.mask.iter().filter(|&&m| m).count();
    s.metrics.prompt(tokens);
    let (tx, rx) = tokio::sync::oneshot::channel();
    e.queue.submit(
        EmbedJob {
            texts,
            tokens,
            reply: tx,
        },
        &s.metrics,
    )?;
    let vectors = rx
        .await
        .map_err(|_| engine_failed("the embedder stopped".into()))?
        .map_err(engine_failed)?;
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let embedding = match base64 {
                false => json!(v),
                true => {
                    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                    json!(base64::engine::general_purpose::STANDARD.encode(bytes))
                }
            };
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    Ok(Json(json!({
        "object": "list", "data": data, "model": s.name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }))
    .into_response())
}

pub async fn tokenize(State(s): Shared, b: Result<Bytes, BytesRejection>) -> Reply {
    let b = body(b)?;
    let req: TokenizeRequest = parse(&body_json(&b, &[TOKENIZE])?)?;
    let tokens = match (&s.generator, &s.embedder) {
        (Some(g), _) => {
            let tok = g
                .tokenizer
                .as_ref()
                .ok_or_else(|| ApiError::invalid("content", "the model folder has no tokenizer"))?;
            tok.encode(&req.content, req.add_special)
                .map_err(|e| ApiError::invalid("content", e.to_string()))?
        }
        (None, Some(e)) => {
            let b = e
                .encoder
                .tokenize(&[req.content.as_str()])
                .map_err(|err| ApiError::invalid("content", err.to_string()))?;
            b.ids
                .iter()
                .zip(&b.mask)
                .filter(|(_, &m)| m)
                .map(|(&i, _)| i)
                .collect()
        }
        (None, None) => unreachable!("a server serves a generator or an embedder"),
    };
    Ok(Json(json!({"tokens": tokens})).into_response())
}
