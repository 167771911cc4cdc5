//! Training: hand-written backward passes live beside each layer's forward; this
//! module holds what ties them together (gradient checking, losses, optimiser, tasks,
//! the trainer).

pub mod gradcheck;
pub mod trainable;
