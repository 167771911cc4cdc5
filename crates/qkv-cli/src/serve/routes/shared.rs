//! What the handlers share: reading a body, the server's checks of a request's model
//! and prompt, and the error of an engine failure.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;

use serde_json::Value;

use crate::serve::api::{body_json, ApiError, Nested};
use crate::serve::state::AppState;

pub type Shared = State<Arc<AppState>>;
pub type Reply = Result<Response, ApiError>;

/// The body, or 413 when it is over the limit (with a Content-Length or chunked alike).
pub fn body(b: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
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

pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The messages a chat request may hold: past any real conversation (the published
/// templates render 4096 turns well within their bounds), and a bound on the work a
/// request starts before its prompt is measured.
pub const MAX_MESSAGES: usize = 4096;

/// Bytes of text per prompt token allowed before tokenizing: a text longer than
/// `--max-prompt` × this cannot fit the prompt limit in any vocabulary's usual tokens,
/// and tokenizing it would take memory (some 400 bytes a byte) for nothing.
pub const BYTES_PER_TOKEN: usize = 32;

/// Runs `work` (a template's render, a tokenization: CPU work under its own bounds) on
/// tokio's blocking threads, so that the HTTP thread keeps answering (`/health` too).
pub async fn off_thread<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(work).await.map_err(|e| {
        ApiError::status(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the request's preparation failed: {e}"),
        )
    })?
}

impl AppState {
    /// Refuses a text of more bytes than `--max-prompt` tokens' worth
    /// ([`BYTES_PER_TOKEN`]), naming `field`, before it is tokenized.
    pub fn check_text(&self, field: &str, text: &str) -> Result<(), ApiError> {
        let most = self.limits.max_prompt.saturating_mul(BYTES_PER_TOKEN);
        if text.len() > most {
            return Err(ApiError::invalid(
                field,
                format!(
                    "{} bytes of text, more than the server takes ({most}: {BYTES_PER_TOKEN} a token of --max-prompt {})",
                    text.len(),
                    self.limits.max_prompt
                ),
            ));
        }
        Ok(())
    }

    /// The request body of `endpoint` as JSON, its unknown fields (top-level, and in
    /// the `nested` objects) ignored and counted, or refused with `--strict`.
    pub fn request_json(
        &self,
        endpoint: &str,
        body: &[u8],
        fields: &[&[&str]],
        nested: &[Nested],
    ) -> Result<Value, ApiError> {
        let (value, unknown) = body_json(body, fields, nested, self.leniency.strict_fields)?;
        self.ignored_fields(endpoint, &unknown);
        Ok(value)
    }

    /// Any model name is answered, as there is one model, unless `--strict-model`: then
    /// only the server's name and its aliases, else a 404 naming them.
    pub fn check_model(&self, model: &str) -> Result<(), ApiError> {
        if !self.leniency.strict_model || self.model_names().any(|n| n == model) {
            return Ok(());
        }
        let names: Vec<&str> = self.model_names().collect();
        Err(ApiError {
            code: Some("model_not_found"),
            param: Some("model".into()),
            ..ApiError::status(
                StatusCode::NOT_FOUND,
                format!(
                    "the model `{model}` does not exist; this server serves `{}` (--strict-model)",
                    names.join("`, `")
                ),
            )
        })
    }

    pub fn generator(&self) -> Result<&crate::serve::state::Generator, ApiError> {
        self.generator.as_ref().ok_or_else(|| self.elsewhere())
    }

    /// 404 for an endpoint this server's model does not answer, naming the one it does.
    pub fn elsewhere(&self) -> ApiError {
        let serves = match (&self.generator, &self.embedder) {
            (Some(_), _) => "generates text: POST /v1/completions",
            (None, Some(_)) => "is an embedding model: POST /v1/embeddings",
            (None, None) => "is a classifier: POST /v1/classify (or /v1/rerank)",
        };
        ApiError::status(StatusCode::NOT_FOUND, format!("`{}` {serves}", self.name))
    }

    /// A job for `ids` under `settings`; `default_max`: the length when the request
    /// gives none.
    pub fn encode(&self, text: &str, special: bool) -> Result<Vec<usize>, ApiError> {
        let g = self.generator()?;
        let tok = g.tokenizer.as_ref().ok_or_else(|| {
            ApiError::invalid(
                "prompt",
                "the model folder has no tokenizer: give token ids",
            )
        })?;
        self.check_text("prompt", text)?;
        tok.encode(text, special)
            .map_err(|e| ApiError::invalid("prompt", e.to_string()))
    }
}

pub fn engine_failed(why: String) -> ApiError {
    ApiError::status(
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("the engine failed on this request: {why}"),
    )
}
