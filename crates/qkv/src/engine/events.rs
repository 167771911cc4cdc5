//! What a request hears from the engine: a generation job's [`Event`]s through
//! [`Events`] (a std channel's [`ChannelEvents`], or a server's own), and one answer
//! through [`Reply`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;

use crate::models::generate::TokenLogprobs;

/// What a request's handler hears about its sequences, each by its choice's index.
#[derive(Debug)]
pub enum Event {
    /// A prompt's log-probabilities (the first token has none), for the choices
    /// `first_index..first_index + choices`; sent before their first piece.
    Prompt {
        first_index: usize,
        logprobs: Vec<Option<TokenLogprobs>>,
    },
    /// Text to send (stop strings already held back) and, when asked, the
    /// log-probabilities of the tokens chosen since the choice's last piece.
    Piece {
        index: usize,
        text: String,
        logprobs: Vec<TokenLogprobs>,
    },
    /// The choice's end: `"stop"` (end of sequence or a stop string) or `"length"`.
    Done {
        index: usize,
        finish: &'static str,
        /// the chosen tokens, the last stop or end-of-sequence one included
        tokens: Vec<usize>,
    },
    /// A sequence failed inside the engine (the request gets a 500).
    Failed(String),
}

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
