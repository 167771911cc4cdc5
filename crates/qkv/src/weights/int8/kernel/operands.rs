//! What one tile multiplies: R rows of quantized x and NP panels of an int8 weight.

/// One tile's operands: R rows of x (codes, scales, offsets: see
/// [`super::super::rows::QuantizedRows`]), and NP panels (codes, scales) of the weight.
pub(crate) struct Tile<'a, const R: usize, const NP: usize> {
    pub x: [(&'a [i8], &'a [f32], &'a [i32]); R],
    pub codes: [&'a [u32]; NP],
    pub scales: [&'a [f32]; NP],
    /// K steps per scale, a multiple of 4
    pub group: usize,
}
