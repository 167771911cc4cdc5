//! What the handlers share: reading a body, the server's checks of a request's model
//! and prompt, and the error of an engine failure.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;

use crate::serve::api::ApiError;
use crate::serve::AppState;

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

impl AppState {
    pub fn check_model(&self, model: &str) -> Result<(), ApiError> {
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

    pub fn generator(&self) -> Result<&crate::serve::Generator, ApiError> {
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
