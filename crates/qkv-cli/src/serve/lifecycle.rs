//! The server's life: *loading* (the port is open, the model not yet in memory),
//! *ready*, and *draining* (a stop was asked: requests in flight finish, new ones are
//! turned away). `/health` answers 200 only when ready and 503 otherwise, so that a
//! router or Kubernetes' readiness probe sends work only to replicas that take it, and
//! a turned-away request (503, `Retry-After`, the connection closed) can be retried on
//! another replica without loss.
//!
//! The routes exist only once the model is loaded, so the listener serves a gate from
//! the start: it answers for the server while loading and draining, and hands each
//! request to the routes while ready, counting it in flight until its response body
//! (a stream, for server-sent events) is done or dropped. What it turns away is counted
//! in `/metrics` as the routes' answers are (`qkv_requests_total`, status 503), so an
//! operator sees the requests a rollout or a slow load refused.

use std::pin::Pin;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use serde_json::json;
use tokio::sync::Notify;
use tower::ServiceExt;

use super::api::ApiError;
use super::metrics::{self, Metrics};

const LOADING: u8 = 0;
const READY: u8 = 1;
const DRAINING: u8 = 2;

/// Seconds a turned-away client is asked to wait.
const RETRY_AFTER: u32 = 1;

/// See the module documentation.
pub struct Lifecycle {
    phase: AtomicU8,
    routes: OnceLock<Router>,
    in_flight: AtomicUsize,
    /// signalled whenever `in_flight` drops to 0
    idle: Notify,
    /// the server's counters, which the routes share
    metrics: Arc<Metrics>,
}

impl Lifecycle {
    pub fn new(metrics: Arc<Metrics>) -> Arc<Self> {
        Arc::new(Lifecycle {
            phase: AtomicU8::new(LOADING),
            routes: OnceLock::new(),
            in_flight: AtomicUsize::new(0),
            idle: Notify::new(),
            metrics,
        })
    }

    /// The routes, once the model is loaded: requests go to them from now on (unless
    /// a stop was asked meanwhile).
    pub fn ready(&self, routes: Router) {
        let _ = self.routes.set(routes);
        let _ = self
            .phase
            .compare_exchange(LOADING, READY, Ordering::SeqCst, Ordering::SeqCst);
    }

    /// Turns new requests away from now on; whether the model was still loading.
    pub fn drain(&self) -> bool {
        self.phase.swap(DRAINING, Ordering::SeqCst) == LOADING
    }

    /// Requests in flight: handed to the routes, their responses not yet finished.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// Returns once no request is in flight.
    pub async fn idle(&self) {
        loop {
            let notified = self.idle.notified();
            tokio::pin!(notified);
            // registered before the count is read, so a drop to 0 in between is not missed
            notified.as_mut().enable();
            if self.in_flight() == 0 {
                return;
            }
            notified.await;
        }
    }

    /// The listener's service: the gate in front of the routes.
    pub fn gate(self: &Arc<Self>) -> Router {
        Router::new().fallback(gate).with_state(self.clone())
    }
}

/// One request through the gate (module documentation).
async fn gate(State(life): State<Arc<Lifecycle>>, req: Request) -> Response {
    let started = std::time::Instant::now();
    let path = req.uri().path();
    let (status, message) = match life.phase.load(Ordering::SeqCst) {
        READY => return forward(&life, req).await,
        // a draining replica still reports on itself
        DRAINING if path == "/metrics" => return forward(&life, req).await,
        LOADING => ("loading", "the model is still loading; retry shortly"),
        _ => ("draining", "this server is stopping; retry on another"),
    };
    let mut response = match path {
        "/health" => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": status})),
        )
            .into_response(),
        _ => ApiError {
            retry_after: Some(RETRY_AFTER),
            ..ApiError::status(StatusCode::SERVICE_UNAVAILABLE, message)
        }
        .into_response(),
    };
    if status == "draining" {
        // the client's next request should find another replica
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    let status = response.status().as_u16();
    life.metrics
        .request(metrics::endpoint(path), status, started.elapsed());
    response
}

/// The request to the routes, counted in flight until its response body ends.
async fn forward(life: &Arc<Lifecycle>, req: Request) -> Response {
    let Some(routes) = life.routes.get().cloned() else {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    };
    life.in_flight.fetch_add(1, Ordering::SeqCst);
    let guard = InFlight(life.clone());
    let response = match routes.oneshot(req).await {
        Ok(r) => r,
        Err(never) => match never {},
    };
    response.map(|inner| {
        Body::new(Counted {
            inner,
            _guard: guard,
        })
    })
}

/// One request in flight; its drop counts it out.
struct InFlight(Arc<Lifecycle>);

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// A response body that holds its request in flight until it is done or dropped.
struct Counted {
    inner: Body,
    _guard: InFlight,
}

impl HttpBody for Counted {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::to_bytes;
    use axum::routing::get;

    async fn ask(gate: &Router, path: &str) -> Response {
        let req = Request::builder().uri(path).body(Body::empty()).unwrap();
        match gate.clone().oneshot(req).await {
            Ok(r) => r,
            Err(never) => match never {},
        }
    }

    async fn text(r: Response) -> String {
        String::from_utf8(to_bytes(r.into_body(), 1 << 20).await.unwrap().to_vec()).unwrap()
    }

    /// Routes of a loaded server: /health, /metrics, and /stream, whose body is held open
    /// until the test sends its end.
    fn routes(end: Arc<Notify>) -> Router {
        Router::new()
            .route("/health", get(|| async { Json(json!({"status": "ok"})) }))
            .route("/metrics", get(|| async { "metrics" }))
            .route(
                "/stream",
                get(move || {
                    let end = end.clone();
                    async move {
                        let chunks = async_stream(end);
                        Body::from_stream(chunks)
                    }
                }),
            )
    }

    /// One chunk now and another once `end` is signalled.
    fn async_stream(
        end: Arc<Notify>,
    ) -> impl tokio_stream::Stream<Item = Result<Bytes, std::io::Error>> {
        let (tx, rx) = tokio::sync::mpsc::channel(2);
        tokio::spawn(async move {
            let _ = tx.send(Ok(Bytes::from("first "))).await;
            end.notified().await;
            let _ = tx.send(Ok(Bytes::from("last"))).await;
        });
        tokio_stream::wrappers::ReceiverStream::new(rx)
    }

    fn lifecycle() -> Arc<Lifecycle> {
        Lifecycle::new(Arc::new(Metrics::default()))
    }

    /// `qkv_requests_total`'s count for (endpoint, status), 0 where it has none.
    fn answered(life: &Lifecycle, endpoint: &str, status: u16) -> u64 {
        let line = format!("qkv_requests_total{{endpoint=\"{endpoint}\",status=\"{status}\"}} ");
        let rendered = life.metrics.render();
        rendered
            .lines()
            .find_map(|l| l.strip_prefix(line.as_str()))
            .map_or(0, |n| n.parse().unwrap())
    }

    #[tokio::test]
    async fn loading_then_ready_then_draining() {
        let life = lifecycle();
        let gate = life.gate();
        // loading: /health and every route answer 503, the API's with its error shape
        let r = ask(&gate, "/health").await;
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(text(r).await, r#"{"status":"loading"}"#);
        let r = ask(&gate, "/v1/models").await;
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
        assert!(text(r).await.contains("still loading"));
        // what the gate turns away is counted, as the routes count their answers
        assert_eq!(answered(&life, "/health", 503), 1);
        assert_eq!(answered(&life, "/v1/models", 503), 1);
        ask(&gate, "/no/such/path").await;
        assert_eq!(answered(&life, "other", 503), 1);

        let end = Arc::new(Notify::new());
        life.ready(routes(end.clone()));
        let r = ask(&gate, "/health").await;
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(text(r).await, r#"{"status":"ok"}"#);
        assert_eq!(life.in_flight(), 0, "a finished body counts out");

        // a stream holds its request in flight until its body ends
        let stream = ask(&gate, "/stream").await;
        assert_eq!(stream.status(), StatusCode::OK);
        assert_eq!(life.in_flight(), 1);
        assert!(!life.drain(), "it was ready, not loading");
        let r = ask(&gate, "/health").await;
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[header::CONNECTION], "close");
        assert_eq!(text(r).await, r#"{"status":"draining"}"#);
        let r = ask(&gate, "/v1/completions").await;
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(text(r).await.contains("stopping"));
        assert_eq!(answered(&life, "/v1/completions", 503), 1);
        assert_eq!(answered(&life, "/health", 503), 2);
        assert_eq!(ask(&gate, "/metrics").await.status(), StatusCode::OK);
        assert_eq!(life.in_flight(), 1, "turned-away requests are not counted");

        let idle = tokio::spawn({
            let life = life.clone();
            async move { life.idle().await }
        });
        tokio::task::yield_now().await;
        assert!(!idle.is_finished(), "the stream is still in flight");
        end.notify_one();
        assert_eq!(text(stream).await, "first last");
        tokio::time::timeout(std::time::Duration::from_secs(5), idle)
            .await
            .expect("idle once the stream ended")
            .unwrap();
        assert_eq!(life.in_flight(), 0);
    }

    #[tokio::test]
    async fn a_dropped_response_counts_out() {
        let life = lifecycle();
        let end = Arc::new(Notify::new());
        life.ready(routes(end));
        let stream = ask(&life.gate(), "/stream").await;
        assert_eq!(life.in_flight(), 1);
        // a client that went away: its body is dropped unfinished
        drop(stream);
        assert_eq!(life.in_flight(), 0);
        life.idle().await;
    }

    #[test]
    fn a_stop_while_loading_is_told() {
        let life = lifecycle();
        assert!(life.drain());
        life.ready(Router::new());
        assert_eq!(life.phase.load(Ordering::SeqCst), DRAINING);
    }
}
