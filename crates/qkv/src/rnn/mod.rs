//! The recurrent models attention replaced, kept to measure the articles' claims
//! against: the Elman RNN (serial memory, gradients that fade with distance), additive
//! attention, the 2014 RNN encoder-decoder with and without it, and a recurrent
//! language model.

pub mod additive;
pub mod elman;
pub mod lm;
pub mod seq2seq;

pub use additive::{Additive, AdditiveStep};
pub use elman::{Elman, ElmanCache, ElmanLayer, ElmanOutput};
pub use lm::{RnnLm, RnnLmCache};
pub use seq2seq::{RnnSeq2Seq, Seq2SeqCache, Seq2SeqInput};
