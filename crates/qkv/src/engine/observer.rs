//! What the engine reports as it runs, for a server's metrics.

use std::time::Duration;

use super::prefix::PrefixStats;

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
