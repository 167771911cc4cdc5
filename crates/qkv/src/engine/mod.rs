//! The engine a server runs between its requests and the model, as TEI's core and
//! mistral.rs's engine are: bounded queues, worker threads that batch what waits in
//! them, and what each request hears back. The HTTP server (`qkv serve`) and the Python
//! package are thin layers over it.
//!
//! - [`generator`]: continuous batching of decoder-only generation: sequences join and
//!   leave between steps, joining prompts' chunks packed into the decoding rows' step
//!   under a token budget, a [`PrefixCache`] shared between sequences;
//! - [`seq2seq`]: encoder-decoders, one job at a time;
//! - [`embedder`]: sentence embeddings batched across requests under a token budget;
//! - [`classifier`]: classification and reranking, one request at a time.
//!
//! Every worker runs the model on the rayon pool and answers through [`Events`] or
//! [`Reply`], whatever sits on the other side (an async handler, a Python iterator).

pub mod classifier;
pub mod embedder;
pub mod generator;
mod job;
mod live;
pub mod prefix;
mod seq2seq;
pub mod stop;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Sender, SyncSender, TrySendError};
use std::time::Duration;

pub use job::{Event, Job};
pub use prefix::{reusable_positions, PrefixCache, PrefixStats};
pub use stop::StopFilter;

/// Where a generation job's [`Event`]s go.
pub trait Events: Send + Sync {
    /// Delivers an event to the request's handler (lost when it has gone).
    fn send(&self, event: Event);
    /// Whether the handler has gone: its sequences then leave at the next step.
    fn is_closed(&self) -> bool;
}

/// [`Events`] into a std channel; the handler has gone once a send fails.
pub struct ChannelEvents {
    tx: Sender<Event>,
    closed: AtomicBool,
}

impl ChannelEvents {
    pub fn new(tx: Sender<Event>) -> Self {
        ChannelEvents {
            tx,
            closed: AtomicBool::new(false),
        }
    }
}

impl Events for ChannelEvents {
    fn send(&self, event: Event) {
        if self.tx.send(event).is_err() {
            self.closed.store(true, Ordering::Relaxed);
        }
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }
}

/// Where one request's answer goes (embeddings, classification).
pub trait Reply<T>: Send {
    fn send(self: Box<Self>, value: T);
    /// Whether the handler has gone: the request is skipped.
    fn is_closed(&self) -> bool;
}

impl<T: Send> Reply<T> for Sender<T> {
    fn send(self: Box<Self>, value: T) {
        let _ = Sender::send(&self, value);
    }

    fn is_closed(&self) -> bool {
        false
    }
}

/// What an engine reports as it runs (a server's metrics); every method does nothing
/// unless implemented.
pub trait Observer: Send + Sync {
    /// A job left its queue.
    fn dequeued(&self) {}
    /// A job's first token was chosen, `waited` after it was queued.
    fn first_token(&self, _waited: Duration) {}
    /// Tokens were generated.
    fn tokens(&self, _n: usize) {}
    /// One model call over `rows` sequences (or texts) took `took`.
    fn step(&self, _rows: usize, _took: Duration) {}
    /// The prefix cache after a change.
    fn prefix(&self, _stats: PrefixStats) {}
}

/// An [`Observer`] that records nothing.
pub struct Quiet;

impl Observer for Quiet {}

/// The submitting side of a worker's bounded queue.
pub struct Queue<T> {
    tx: SyncSender<T>,
}

/// Why a job was not queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// The queue holds its most jobs.
    Full,
    /// The worker has stopped.
    Closed,
}

impl<T> Clone for Queue<T> {
    fn clone(&self) -> Self {
        Queue {
            tx: self.tx.clone(),
        }
    }
}

impl<T> Queue<T> {
    /// Queues a job without waiting.
    pub fn submit(&self, job: T) -> Result<(), Refused> {
        self.tx.try_send(job).map_err(|e| match e {
            TrySendError::Full(_) => Refused::Full,
            TrySendError::Disconnected(_) => Refused::Closed,
        })
    }
}

/// A queue of `depth` jobs at most and the worker thread `name` running `work` over
/// its receiving side; the thread ends when `work` returns.
fn spawn<T: Send + 'static>(
    name: &str,
    depth: usize,
    work: impl FnOnce(std::sync::mpsc::Receiver<T>) + Send + 'static,
) -> std::io::Result<(Queue<T>, std::thread::JoinHandle<()>)> {
    let (tx, rx) = std::sync::mpsc::sync_channel(depth);
    let handle = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || work(rx))?;
    Ok((Queue { tx }, handle))
}
