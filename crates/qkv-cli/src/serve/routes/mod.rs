//! The HTTP side: each endpoint validates its request, turns it into a job for the
//! scheduler (or the embedder) and answers in OpenAI's shapes, streamed as server-sent
//! events when asked. No model math runs here.

mod embed;
mod generate;

pub use embed::{embeddings, tokenize};
pub use generate::{chat, completions};

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::api::ApiError;
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

fn engine_failed(why: String) -> ApiError {
    ApiError::status(
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("the engine failed on this request: {why}"),
    )
}
