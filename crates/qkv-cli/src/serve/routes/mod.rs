//! The HTTP side: each endpoint validates its request, turns it into a job for the
//! engine's generator (or its embedder, or its classifier) and answers in OpenAI's
//! shapes, streamed as server-sent events when asked. No model math runs here.

mod classify;
mod embed;
mod generate;
mod shared;

pub use classify::{classify, rerank};
pub use embed::{detokenize, embeddings, tokenize};
pub use generate::{chat, completions};

use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::api::ApiError;

use shared::Shared;

/// Reached only when ready: while loading and draining the gate answers (`super::lifecycle`).
pub async fn health() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

pub async fn models(State(s): Shared) -> Json<Value> {
    Json(json!({
        "object": "list",
        "data": s.model_names()
            .map(|id| json!({"id": id, "object": "model", "created": s.created, "owned_by": "qkv"}))
            .collect::<Vec<_>>(),
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
    s.metrics
        .request(super::metrics::endpoint(&path), status, took);
    r
}
