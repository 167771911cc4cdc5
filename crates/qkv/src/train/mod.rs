//! Training: hand-written backward passes live beside each layer's forward; this
//! module holds what ties them together (gradient checking, losses, optimiser, tasks,
//! the trainer).

pub mod checkpoint;
pub mod gradcheck;
pub mod loss;
pub mod memory;
pub mod optim;
pub mod output;
pub mod recurrent;
pub mod run;
pub mod schedule;
pub mod tasks;
pub mod text_data;
pub mod trainable;
pub mod trainer;
