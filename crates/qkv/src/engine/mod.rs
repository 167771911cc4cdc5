//! The engine a server runs between its requests and the model, as TEI's core and
//! mistral.rs's engine are: bounded queues, worker threads that batch what waits in
//! them, and what each request hears back. The HTTP server (`qkv serve`) and the Python
//! package are thin layers over it.
//!
//! - [`generator`]: continuous batching of decoder-only generation: sequences join and
//!   leave between steps, joining prompts' chunks packed into the decoding rows' step
//!   under a token budget, a [`PrefixCache`] shared between sequences;
//! - `seq2seq`: encoder-decoders, one job at a time;
//! - [`embedder`]: sentence embeddings batched across requests under a token budget;
//! - [`classifier`]: classification and reranking, one request at a time.
//!
//! Every worker runs the model on the rayon pool and answers through [`Events`] or
//! [`Reply`], whatever sits on the other side (an async handler, a Python iterator).

pub mod classifier;
pub mod embedder;
mod events;
pub mod generator;
mod job;
mod live;
mod observer;
pub mod prefix;
mod queue;
mod seq2seq;
pub mod stop;

pub use events::{ChannelEvents, Event, Events, Reply};
pub use job::Job;
pub use observer::{Observer, Quiet};
pub use prefix::{reusable_positions, PrefixCache, PrefixStats};
pub use queue::{Queue, Refused};
pub use stop::StopFilter;
