//! What the attention maps say a model used, beyond one layer's raw weights.
//!
//! A raw map shows where one head of one layer looks. Information also mixes across
//! layers through the residual stream, so Abnar & Zuidema (2020) follow it through the
//! stack, treating each layer's heads-averaged map plus the identity (the residual) as
//! one step:
//!
//! - [`rollout`]: the product of those steps, Â_l · … · Â_1;
//! - [`flow`]: the maximum flow through the layered graph whose capacities they are.
//!
//! Both take one sequence's self-attention maps, `[H, T, T]` per layer from the first,
//! and give one `[T, T]` per layer: row t, how much each input token reaches token t of
//! that layer. Each row sums to 1.
//!
//! [`gradient_rollout`] (Chefer, Gur & Wolf 2021) weighs each head by the gradient of a
//! target with respect to its map, which
//! [`Transformer::attention_grads`](crate::models::Transformer::attention_grads)
//! computes through the training backward.
//!
//! Encoder-decoders carry both through the cross-attention: [`cross_rollout`] and
//! [`cross_gradient_rollout`] give each source token's share in each decoder token.

mod cross;
mod flow;
mod gradient;
mod residual;
mod rollout;

pub use cross::{cross_gradient_rollout, cross_rollout};
pub use flow::{flow, MAX_FLOW_TOKENS};
pub use gradient::gradient_rollout;
pub use rollout::rollout;
