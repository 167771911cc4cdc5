//! Completions and chat completions: a request becomes the generator's jobs (one a prompt,
//! each decoded as `n` choices), answered whole or as server-sent events, with
//! log-probabilities and the attention maps when asked.

mod answer;
mod format;
mod job;
mod kind;
mod logprobs;
mod tools;

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use serde_json::Value;

use super::shared::{body, off_thread, Reply, Shared, MAX_MESSAGES};
use crate::serve::api::{
    parse, ApiError, ChatRequest, CompletionRequest, Content, Prompt, Settings, CHAT, COMPLETION,
    MESSAGE, SETTINGS, STREAM_OPTIONS,
};
use crate::serve::state::AppState;
use kind::Kind;

pub async fn completions(State(s): Shared, b: Result<Bytes, BytesRejection>) -> Reply {
    let b = body(b)?;
    let v = s.request_json(
        "/v1/completions",
        &b,
        &[COMPLETION, SETTINGS],
        &[STREAM_OPTIONS],
    )?;
    let req: CompletionRequest = parse(&v)?;
    let mut settings: Settings = parse(&v)?;
    let g = s.generator()?;
    s.check_model(&req.model)?;
    let fault = matches!(&req.prompt, Prompt::Text(t) if std::env::var("QKV_FAULT_PROMPT").is_ok_and(|f| f == *t));
    let count = match &req.prompt {
        Prompt::Text(_) | Prompt::Ids(_) => 1,
        Prompt::Texts(v) => v.len(),
        Prompt::IdLists(v) => v.len(),
    };
    if count == 0 || count > job::MAX_CHOICES {
        return Err(ApiError::invalid(
            "prompt",
            format!(
                "{count} prompts: from 1 to {} in a request",
                job::MAX_CHOICES
            ),
        ));
    }
    // each prompt as ids, and as text for `echo` (ids given are decoded)
    let tok = g.tokenizer.clone();
    let decoded = move |ids: &[usize]| match &tok {
        Some(t) => t.decode(ids).unwrap_or_default(),
        None => String::new(),
    };
    let (prompts, echoed): (Vec<Vec<usize>>, Vec<String>) = match req.prompt {
        Prompt::Text(t) => encoded(&s, vec![t]).await?,
        Prompt::Texts(v) => encoded(&s, v).await?,
        Prompt::Ids(ids) => {
            let ids: Vec<usize> = ids.into_iter().map(|i| i as usize).collect();
            let text = decoded(&ids);
            (vec![ids], vec![text])
        }
        Prompt::IdLists(lists) => lists
            .into_iter()
            .map(|ids| {
                let ids: Vec<usize> = ids.into_iter().map(|i| i as usize).collect();
                let text = decoded(&ids);
                (ids, text)
            })
            .unzip(),
    };
    let constraint = s.constraint(&settings).await?;
    let (mut jobs, rx, shape) = s.jobs(prompts, &mut settings, Kind::Completion, 16, constraint)?;
    jobs[0].fault = fault;
    let maps = maps_asked(&settings);
    answer::answer(s, jobs, rx, shape, echoed, maps).await
}

/// Whether the attention maps were asked for, and the viewer with them.
fn maps_asked(st: &Settings) -> Option<bool> {
    st.qkv.as_ref().filter(|o| o.attentions).map(|o| o.viewer)
}

/// Prompts' texts as tokens (with the texts kept for `echo`), tokenized off the HTTP
/// thread.
async fn encoded(
    s: &Arc<AppState>,
    texts: Vec<String>,
) -> Result<(Vec<Vec<usize>>, Vec<String>), ApiError> {
    let s = s.clone();
    off_thread(move || {
        let ids = texts
            .iter()
            .map(|t| s.encode(t, true))
            .collect::<Result<_, _>>()?;
        Ok((ids, texts))
    })
    .await
}

pub async fn chat(State(s): Shared, b: Result<Bytes, BytesRejection>) -> Reply {
    let b = body(b)?;
    let v = s.request_json(
        "/v1/chat/completions",
        &b,
        &[CHAT, SETTINGS],
        &[STREAM_OPTIONS, MESSAGE],
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
            Content::Absent if m.role == "assistant" => String::new(),
            Content::Absent => {
                return Err(ApiError::invalid(
                    format!("messages[{i}].content"),
                    "null is neither a string nor a list of content parts (only an assistant's turn may have no content)",
                ))
            }
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
        messages.push(tools::history(m, i, content)?);
    }
    let control = g
        .tokenizer
        .as_ref()
        .and_then(|t| t.token_id("[TOOL_CALLS]"));
    let template = g.template.as_ref().expect("checked above");
    let calls = tools::asked(
        settings.tools.as_deref(),
        settings.tool_choice.as_ref(),
        template.source(),
        control,
    )?;
    let context = calls.context.clone();
    // the template renders (in a worker process, bounded in steps, output, memory and
    // time) and the prompt is tokenized (bounded in bytes) off the HTTP thread
    let st = s.clone();
    let ids = off_thread(move || {
        let g = st.generator()?;
        let template = g.template.as_ref().expect("checked above");
        let text = g
            .renderer
            .render(template, &messages, true, &context)
            .map_err(|e| ApiError::invalid("messages", e.to_string()))?;
        // the template writes the special tokens itself, as transformers tokenizes it
        st.encode(&text, false)
    })
    .await?;
    let constraint = match calls.forced {
        Some(lark) => s.forced_call(&settings, lark).await?,
        None => s.constraint(&settings).await?,
    };
    let (jobs, rx, mut shape) =
        s.jobs(vec![ids], &mut settings, Kind::Chat, usize::MAX, constraint)?;
    shape.tools = calls.parser;
    let maps = maps_asked(&settings);
    answer::answer(s, jobs, rx, shape, Vec::new(), maps).await
}
