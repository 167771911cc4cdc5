//! Text generation: greedy decoding, seeded sampling and beam search (with penalties
//! on repeats and log-probabilities of the choices), for decoder-only
//! and encoder-decoder models, under the settings a folder's `generation_config.json`
//! gives and a caller's request overrides.

mod beam;
mod chooser;
pub mod config;
mod decode;
pub mod gbnf;
pub mod grammar;
mod logprobs;
mod options;
mod penalties;
pub mod request;
mod sampling;

pub use chooser::{Chooser, Finish};
pub use decode::{
    generate_causal, generate_causal_each, generate_constrained, generate_each, generate_seq2seq,
    generate_seq2seq_each, OnToken,
};
pub use logprobs::{logprobs, TokenLogprobs, MAX_TOP_LOGPROBS};
pub use options::{GenerateOptions, Sampling};
pub use penalties::Penalties;
pub use sampling::candidates;
