//! What one tile multiplies: R rows of quantized x and NP panels of an int8 weight.

/// One row of x in a weight's groups (see [`super::super::rows::QuantizedRows`]).
#[derive(Clone, Copy)]
pub(crate) struct XRow<'a> {
    /// `[width]`
    pub codes: &'a [i8],
    /// `[groups]`
    pub scales: &'a [f32],
    /// `[groups]`: 128 · Σ codes of the group
    pub offsets: &'a [i32],
}

/// One tile's operands: R rows of x, and NP panels (codes, scales) of the weight.
pub(crate) struct Tile<'a, const R: usize, const NP: usize> {
    pub x: [XRow<'a>; R],
    pub codes: [&'a [u32]; NP],
    pub scales: [&'a [f32]; NP],
    /// K steps per scale, a multiple of 4
    pub group: usize,
}
