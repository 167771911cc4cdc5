//! What one tile multiplies: R rows of quantized x and NP panels of a block weight.

use crate::weights::ggml::activations::XRow;
use crate::weights::ggml::layout::BlockType;

/// One tile's operands: R rows of x, NP panels (each all its panel blocks, in order).
pub(crate) struct Tile<'a, const R: usize, const NP: usize> {
    pub ty: BlockType,
    pub x: [XRow<'a>; R],
    pub panels: [&'a [u8]; NP],
}
