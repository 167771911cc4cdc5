//! The network: one typed description of an architecture ([`arch::Arch`]), its
//! parameter tree ([`weights::Weights`]), the forward of a stack with its embeddings
//! and head, the backward, and what a forward will hold in memory. Nothing here knows
//! a checkpoint family.

pub mod arch;
pub(crate) mod backward;
pub(crate) mod footprint;
pub(crate) mod forward;
pub mod weights;
