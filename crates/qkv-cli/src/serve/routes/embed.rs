//! Embeddings (batched across clients by the embedder thread) and tokenization.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::IntoResponse;
use axum::Json;
use base64::Engine as _;
use serde_json::{json, Value};

use super::shared::{body, engine_failed, off_thread, Reply, Shared};
use crate::serve::api::{
    parse, ApiError, DetokenizeRequest, EmbeddingInput, EmbeddingRequest, TokenizeRequest,
    DETOKENIZE, EMBEDDING, TOKENIZE,
};
use crate::serve::engine::{submit, OneShot};
use crate::serve::state::AppState;
use qkv::engine::embedder::EmbedJob;

pub async fn embeddings(State(s): Shared, b: Result<Bytes, BytesRejection>) -> Reply {
    let b = body(b)?;
    let req: EmbeddingRequest = parse(&s.request_json("/v1/embeddings", &b, &[EMBEDDING], &[])?)?;
    let e = s.embedder.as_ref().ok_or_else(|| s.elsewhere())?;
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
    let job = EmbedJob {
        texts,
        tokens,
        reply: Box::new(OneShot(tx)),
    };
    submit(&e.queue, job, &s.metrics)?;
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
    let req: TokenizeRequest = parse(&s.request_json("/tokenize", &b, &[TOKENIZE], &[])?)?;
    s.check_text("content", &req.content)?;
    let st = s.clone();
    let tokens = off_thread(move || st.tokens(&req)).await?;
    Ok(Json(json!({"tokens": tokens})).into_response())
}

/// Token ids back to text, as `qkv generate` prints them (special tokens left out).
pub async fn detokenize(State(s): Shared, b: Result<Bytes, BytesRejection>) -> Reply {
    let b = body(b)?;
    let req: DetokenizeRequest = parse(&s.request_json("/detokenize", &b, &[DETOKENIZE], &[])?)?;
    if let Some(m) = &req.model {
        s.check_model(m)?;
    }
    let ids: Vec<usize> = req.tokens.iter().map(|&t| t as usize).collect();
    let st = s.clone();
    let content = off_thread(move || st.text_of(&ids)).await?;
    Ok(Json(json!({"content": content})).into_response())
}

impl AppState {
    /// `/detokenize`'s text: the generator's tokenizer, or the embedder's.
    fn text_of(&self, ids: &[usize]) -> Result<String, ApiError> {
        let (tok, vocab) = match (&self.generator, &self.embedder) {
            (Some(g), _) => (g.tokenizer.as_deref(), g.model.arch.vocab),
            (None, Some(e)) => (Some(e.encoder.tokenizer()), usize::MAX),
            (None, None) => (None, 0),
        };
        let tok = tok.ok_or_else(|| {
            ApiError::invalid(
                "tokens",
                "this server's model has no tokenizer to decode with",
            )
        })?;
        if let Some(bad) = ids.iter().find(|&&t| t >= vocab) {
            return Err(ApiError::invalid(
                "tokens",
                format!("token {bad} is outside the vocabulary of {vocab}"),
            ));
        }
        tok.decode(ids)
            .map_err(|e| ApiError::invalid("tokens", e.to_string()))
    }

    /// `/tokenize`'s tokens: the generator's tokenizer, or the encoder's with its
    /// special tokens.
    fn tokens(&self, req: &TokenizeRequest) -> Result<Vec<usize>, ApiError> {
        let s = self;
        Ok(match (&s.generator, &s.embedder, &s.classifier) {
            (Some(g), _, _) => {
                let tok = g.tokenizer.as_ref().ok_or_else(|| {
                    ApiError::invalid("content", "the model folder has no tokenizer")
                })?;
                tok.encode(&req.content, req.add_special)
                    .map_err(|e| ApiError::invalid("content", e.to_string()))?
            }
            (None, Some(e), _) => {
                let b = e
                    .encoder
                    .tokenize(&[req.content.as_str()])
                    .map_err(|err| ApiError::invalid("content", err.to_string()))?;
                real_ids(&b)
            }
            (None, None, Some(c)) => {
                let (b, _) = c
                    .model
                    .tokenize(&[(req.content.as_str(), None)])
                    .map_err(|err| ApiError::invalid("content", err.to_string()))?;
                real_ids(&b)
            }
            (None, None, None) => {
                unreachable!("a server serves a generator, an embedder or a classifier")
            }
        })
    }
}

/// The ids of a batch's real tokens, row after row.
fn real_ids(b: &qkv::models::TokenBatch) -> Vec<usize> {
    b.ids
        .iter()
        .zip(&b.mask)
        .filter(|(_, &m)| m)
        .map(|(&i, _)| i)
        .collect()
}
