//! Position encodings: self-attention alone is blind to order (permuting the tokens
//! permutes the outputs), so every model adds position in one of these ways.
//!
//! - absolute, added to the embeddings: [`sinusoidal`] (fixed), [`learned`] (a table);
//! - rotating Q and K so scores depend on the offset m − n: [`rope`], stretched past
//!   the trained length by [`rope_scaling`];
//! - biasing the scores by distance: [`alibi`] (a fixed slope per head) and
//!   [`relative`] (T5's learned bias per distance bucket).

pub mod alibi;
pub mod learned;
pub mod relative;
pub mod rope;
pub mod rope_scaling;
pub mod sinusoidal;

pub use alibi::alibi_slopes;
pub use learned::LearnedPositions;
pub use relative::{relative_position_bucket, RelativeBias};
pub use rope::{Rope, RopeLayout};
pub use rope_scaling::{Llama3Scaling, RopeScaling, YarnScaling};
pub use sinusoidal::{sinusoidal_table, SinusoidalLayout};
