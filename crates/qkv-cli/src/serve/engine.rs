//! The server's side of the library's engine (`qkv::engine`): its queues answer 503
//! when full, its events and replies cross into the async handlers through tokio's
//! channels, and what it reports lands in the server's metrics.

use std::time::Duration;

use axum::http::StatusCode;
use qkv::engine::{Event, Events, Observer, PrefixStats, Queue, Refused, Reply};
use tokio::sync::{mpsc, oneshot};

use super::api::ApiError;
use super::metrics::Metrics;

/// Queues a job, or answers 503 (with `Retry-After`) when the queue is full.
pub fn submit<T>(queue: &Queue<T>, job: T, metrics: &Metrics) -> Result<(), ApiError> {
    match queue.submit(job) {
        Ok(()) => {
            metrics.queued(1);
            Ok(())
        }
        Err(Refused::Full) => Err(ApiError {
            retry_after: Some(1),
            ..ApiError::status(
                StatusCode::SERVICE_UNAVAILABLE,
                "the server's queue is full; retry later",
            )
        }),
        Err(Refused::Closed) => Err(ApiError::status(
            StatusCode::SERVICE_UNAVAILABLE,
            "the server is shutting down",
        )),
    }
}

/// A generation request's handler, as the engine sends to it.
pub struct Handler(pub mpsc::UnboundedSender<Event>);

impl Events for Handler {
    fn send(&self, event: Event) {
        let _ = self.0.send(event);
    }

    fn is_closed(&self) -> bool {
        self.0.is_closed()
    }
}

/// An embedding or classification request's handler.
pub struct OneShot<T>(pub oneshot::Sender<T>);

impl<T: Send> Reply<T> for OneShot<T> {
    fn send(self: Box<Self>, value: T) {
        let _ = self.0.send(value);
    }

    fn is_closed(&self) -> bool {
        self.0.is_closed()
    }
}

impl Observer for Metrics {
    fn dequeued(&self) {
        self.queued(-1);
    }

    fn first_token(&self, waited: Duration) {
        Metrics::first_token(self, waited);
    }

    fn tokens(&self, n: usize) {
        Metrics::tokens(self, n);
    }

    fn step(&self, rows: usize, took: Duration) {
        Metrics::step(self, rows, took);
    }

    fn prefix(&self, stats: PrefixStats) {
        self.prefix_cache(stats);
    }
}
