//! Subcommands over real checkpoints (forward, generate, attention, embed, inspect),
//! training, and benchmarks; and what they share: loading a model folder (`load`), the
//! flags several of them have (`shared_flags`), the library's errors in their flags'
//! words (`flags`), and outputs checked before the work (`writable`).

pub mod attention;
pub mod bench;
pub mod classify;
pub mod convert;
mod corpus;
pub mod embed;
pub mod experiment;
mod flags;
pub mod forward;
pub mod generate;
pub mod inspect;
pub mod load;
pub mod shared_flags;
pub mod train;
mod writable;
