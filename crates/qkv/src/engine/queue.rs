//! A worker's bounded queue: the submitting side, and the thread that drains it.

use std::sync::mpsc::{Receiver, SyncSender, TrySendError};

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
pub(super) fn spawn<T: Send + 'static>(
    name: &str,
    depth: usize,
    work: impl FnOnce(Receiver<T>) + Send + 'static,
) -> std::io::Result<(Queue<T>, std::thread::JoinHandle<()>)> {
    let (tx, rx) = std::sync::mpsc::sync_channel(depth);
    let handle = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || work(rx))?;
    Ok((Queue { tx }, handle))
}
