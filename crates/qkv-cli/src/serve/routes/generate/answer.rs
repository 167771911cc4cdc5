//! A request's jobs queued and answered: whole (every choice collected), or as
//! server-sent events (each choice's pieces as they come, by index).

use std::convert::Infallible;
use std::sync::Arc;

use axum::response::sse::{Event as Sse, KeepAlive};
use axum::response::IntoResponse;
use axum::Json;
use qkv::models::generate::TokenLogprobs;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::job::Shape;
use super::kind::Kind;
use super::logprobs::TokenText;
use super::tools::openai_calls;
use crate::serve::api::{ApiError, Usage};
use crate::serve::routes::shared::{engine_failed, now, Reply};
use crate::serve::state::AppState;
use qkv::engine::{Event, Job};

/// One choice as it is collected.
#[derive(Default)]
struct Choice {
    text: String,
    finish: Option<&'static str>,
    tokens: Vec<usize>,
    logprobs: Vec<TokenLogprobs>,
    /// its prompt's log-probabilities (`echo` with `logprobs`)
    prompt: Option<Vec<Option<TokenLogprobs>>>,
    /// characters of its text so far, for completions' `text_offset`
    offset: usize,
    /// bytes of `text` a stream has sent (the rest held while it may be a tool call)
    sent: usize,
}

/// What one answer needs to read its events.
struct Reader<'a> {
    shape: &'a Shape,
    /// fresh numbers for tool calls' ids
    next_id: &'a (dyn Fn() -> u64 + Sync),
    /// each prompt's text, for `echo`
    echoed: &'a [String],
    text: TokenText<'a>,
}

impl Reader<'_> {
    /// The prompt of choice `index`.
    fn prompt_of(&self, index: usize) -> usize {
        index / self.shape.n
    }

    /// The `logprobs` of `tokens` (and, first, of the echoed prompt) for choice `c`.
    fn logprobs(
        &self,
        c: &mut Choice,
        index: usize,
        tokens: &[TokenLogprobs],
        prompt: bool,
    ) -> Value {
        if self.shape.logprobs.is_none() {
            return Value::Null;
        }
        match self.shape.kind {
            Kind::Chat => self.text.chat(tokens),
            Kind::Completion => {
                let mut rows: Vec<(usize, Option<&TokenLogprobs>)> = Vec::new();
                if let (true, Some(scored)) = (prompt, &c.prompt) {
                    let ids = &self.shape.prompts[self.prompt_of(index)];
                    rows.extend(ids.iter().zip(scored).map(|(&id, lp)| (id, lp.as_ref())));
                }
                rows.extend(tokens.iter().map(|t| (t.token, Some(t))));
                self.text.completion(&rows, &mut c.offset)
            }
        }
    }

    /// A whole answer's choice.
    fn whole(&self, index: usize, mut c: Choice) -> Value {
        let echo = self.shape.echo && self.shape.kind == Kind::Completion;
        let logprobs = std::mem::take(&mut c.logprobs);
        let lp = self.logprobs(&mut c, index, &logprobs, echo);
        let finish = json!(c.finish);
        match self.shape.kind {
            Kind::Completion => {
                let text = match echo {
                    true => self.echoed[self.prompt_of(index)].clone() + &c.text,
                    false => c.text,
                };
                json!({"index": index, "text": text, "finish_reason": finish, "logprobs": lp})
            }
            Kind::Chat => {
                let read = self.shape.tools.map(|p| p.read(&c.text));
                match read.filter(|r| !r.calls.is_empty()) {
                    Some(r) => {
                        json!({"index": index, "finish_reason": "tool_calls", "logprobs": lp,
                        "message": {"role": "assistant", "content": r.content,
                                    "tool_calls": openai_calls(&r.calls, &mut || (self.next_id)())}})
                    }
                    None => json!({"index": index, "finish_reason": finish, "logprobs": lp,
                        "message": {"role": "assistant", "content": c.text}}),
                }
            }
        }
    }

    /// A stream's chunk choices for a piece of choice `index`'s text: the text, unless
    /// the answer may still be a tool call (then held until it is known).
    fn piece(&self, c: &mut Choice, index: usize, text: &str, lp: Value) -> Option<Value> {
        c.text.push_str(text);
        if self.shape.tools.is_some_and(|p| p.may_call(&c.text)) {
            return None;
        }
        let out = c.text[c.sent..].to_string();
        c.sent = c.text.len();
        Some(self.delta(index, Some(out), lp, Value::Null))
    }

    /// A stream's closing choices for choice `index`: its calls (one delta each, with
    /// the whole arguments, as OpenAI's may come) or the text held back, then the
    /// finish.
    fn closing(&self, c: &mut Choice, index: usize, finish: &'static str) -> Vec<Value> {
        let held = c.text[c.sent..].to_string();
        c.sent = c.text.len();
        let read = self.shape.tools.map(|p| p.read(&c.text));
        let mut out = Vec::new();
        match read.filter(|r| !r.calls.is_empty()) {
            Some(r) => {
                let calls = openai_calls(&r.calls, &mut || (self.next_id)());
                for (j, mut call) in calls.into_iter().enumerate() {
                    call["index"] = json!(j);
                    out.push(json!({"index": index, "delta": {"tool_calls": [call]},
                                    "finish_reason": null, "logprobs": null}));
                }
                out.push(self.delta(index, None, Value::Null, json!("tool_calls")));
            }
            None => {
                if !held.is_empty() {
                    out.push(self.delta(index, Some(held), Value::Null, Value::Null));
                }
                out.push(self.delta(index, None, Value::Null, json!(finish)));
            }
        }
        out
    }

    /// A streamed chunk's choice: `text` (none in a closing chunk) and its tokens'
    /// log-probabilities.
    fn delta(&self, index: usize, text: Option<String>, logprobs: Value, finish: Value) -> Value {
        let mut c = json!({"index": index, "finish_reason": finish, "logprobs": logprobs});
        match self.shape.kind {
            Kind::Completion => c["text"] = json!(text.unwrap_or_default()),
            Kind::Chat => c["delta"] = text.map_or(json!({}), |t| json!({"content": t})),
        }
        c
    }
}

/// Queues the jobs and answers: whole, or as server-sent events. `maps`: the attention
/// maps of the one choice, with the viewer when asked.
pub async fn answer(
    s: Arc<AppState>,
    jobs: Vec<Job>,
    mut rx: mpsc::UnboundedReceiver<Event>,
    shape: Shape,
    echoed: Vec<String>,
    maps: Option<bool>,
) -> Reply {
    let g = s.generator()?;
    for job in jobs {
        crate::serve::engine::submit(&g.queue, job, &s.metrics)?;
    }
    let kind = shape.kind;
    let id = format!("{}-{:x}", kind.id_prefix(), s.next_id());
    let created = now();
    let prompt_tokens: usize = shape.prompts.iter().map(Vec::len).sum();
    let total = shape.choices();
    if !shape.stream {
        let mut choices: Vec<Choice> = (0..total).map(|_| Choice::default()).collect();
        let mut done = 0;
        while done < total {
            match rx.recv().await {
                Some(Event::Prompt {
                    first_index,
                    logprobs,
                }) => {
                    for c in &mut choices[first_index..first_index + shape.n] {
                        c.prompt = Some(logprobs.clone());
                    }
                }
                Some(Event::Piece {
                    index,
                    text,
                    logprobs,
                }) => {
                    choices[index].text.push_str(&text);
                    choices[index].logprobs.extend(logprobs);
                }
                Some(Event::Done {
                    index,
                    finish,
                    tokens,
                }) => {
                    choices[index].finish = Some(finish);
                    choices[index].tokens = tokens;
                    done += 1;
                }
                Some(Event::Failed(why)) => return Err(engine_failed(why)),
                None => return Err(engine_failed("the generator stopped".into())),
            }
        }
        let completion_tokens = choices.iter().map(|c| c.tokens.len()).sum();
        let tokens = choices
            .first()
            .map(|c| c.tokens.clone())
            .unwrap_or_default();
        let next = || s.next_id();
        let reader = Reader {
            shape: &shape,
            next_id: &next,
            echoed: &echoed,
            text: TokenText(g.token_bytes.as_deref().map(Vec::as_slice)),
        };
        let choices: Vec<Value> = choices
            .into_iter()
            .enumerate()
            .map(|(i, c)| reader.whole(i, c))
            .collect();
        let mut whole = json!({
            "id": id, "object": kind.object(false), "created": created,
            "model": s.name, "choices": choices,
            "usage": Usage::new(prompt_tokens, completion_tokens),
        });
        if let Some(viewer) = maps {
            let mut ids = shape.prompts[0].clone();
            ids.extend(tokens);
            whole["qkv"] = maps_of(&s, ids, viewer).await?;
        }
        return Ok(Json(whole).into_response());
    }
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
    let table = g.token_bytes.clone();
    let st = s.clone();
    tokio::spawn(async move {
        let next = move || st.next_id();
        let reader = Reader {
            shape: &shape,
            next_id: &next,
            echoed: &echoed,
            text: TokenText(table.as_deref().map(Vec::as_slice)),
        };
        let send = |e: Sse| out.send(Ok(e)).is_ok();
        let mut choices: Vec<Choice> = (0..total).map(|_| Choice::default()).collect();
        // a chat stream opens each choice with the assistant's role; completions with
        // `echo` open it with the prompt (whose log-probabilities come with the first
        // piece when asked)
        for index in 0..total {
            let opening = match kind {
                Kind::Chat => {
                    json!([{"index": index, "delta": {"role": "assistant", "content": ""},
                                      "finish_reason": null, "logprobs": null}])
                }
                Kind::Completion if shape.echo && shape.logprobs.is_none() => {
                    let text = reader.echoed[reader.prompt_of(index)].clone();
                    json!([reader.delta(index, Some(text), Value::Null, Value::Null)])
                }
                Kind::Completion => continue,
            };
            if !send(chunk(opening, None)) {
                return;
            }
        }
        let mut done = 0;
        let mut completion_tokens = 0;
        loop {
            let ok = match rx.recv().await {
                Some(Event::Prompt {
                    first_index,
                    logprobs,
                }) => {
                    let mut ok = true;
                    let these = choices.iter_mut().enumerate().skip(first_index);
                    for (index, c) in these.take(shape.n) {
                        c.prompt = Some(logprobs.clone());
                        let lp = reader.logprobs(c, index, &[], true);
                        let text = reader.echoed[reader.prompt_of(index)].clone();
                        ok &= send(chunk(
                            json!([reader.delta(index, Some(text), lp, Value::Null)]),
                            None,
                        ));
                    }
                    ok
                }
                Some(Event::Piece {
                    index,
                    text,
                    logprobs,
                }) => {
                    let c = &mut choices[index];
                    let lp = reader.logprobs(c, index, &logprobs, false);
                    match reader.piece(c, index, &text, lp) {
                        Some(delta) => send(chunk(json!([delta]), None)),
                        None => true,
                    }
                }
                Some(Event::Done {
                    index,
                    finish,
                    tokens,
                }) => {
                    done += 1;
                    completion_tokens += tokens.len();
                    let mut ok = true;
                    for delta in reader.closing(&mut choices[index], index, finish) {
                        ok &= send(chunk(json!([delta]), None));
                    }
                    if done == total {
                        if shape.include_usage {
                            let usage = Usage::new(prompt_tokens, completion_tokens);
                            send(chunk(json!([]), Some(usage)));
                        }
                        send(Sse::default().data("[DONE]"));
                        return;
                    }
                    ok
                }
                Some(Event::Failed(why)) => {
                    send(Sse::default().data(engine_failed(why).body().to_string()));
                    return;
                }
                None => return,
            };
            // the client went away: dropping `rx` frees the sequences at the next step
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
