//! The recurrent models attention replaced, kept to measure the articles' claims
//! against: the Elman RNN (serial memory, gradients that fade with distance).

pub mod elman;

pub use elman::{Elman, ElmanCache, ElmanLayer, ElmanOutput};
