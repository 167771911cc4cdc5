//! Attribution on one sequence through a model, by every method of
//! [`crate::attribution`] and by ablation, for a target the model's output is asked
//! about ([`Target`]): the log-probability of a next or masked token, or a sentence
//! embedding's cosine with another.
//!
//! Conventions, so that methods compare: flow rows sum to 1 (as the authors' code
//! normalises them); an ablation score is the target with the key minus the target
//! without it (positive: the key helped); a key is hidden through the attention mask,
//! which for a cosine also drops it from pooling, as sentence-transformers pools.

mod ablation;
mod labels;
mod method;
mod target;

pub use ablation::ablation;
pub use labels::token_labels;
pub use method::{attribute, attribute_with_progress, target_rows, Attribution, Method};
pub use target::{Target, TargetValue};
