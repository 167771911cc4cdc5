//! Where an int8 product's rows of y start from: shared by every form.

/// What a row of y starts from, before the product is added to it.
#[derive(Clone, Copy, Debug)]
pub enum Start<'a> {
    /// Zero: y is overwritten.
    Zero,
    /// y's own values.
    Accumulate,
    /// A bias `[N]` (y's values are not read): a linear layer's, added as each tile is
    /// written rather than copied into y first and read back.
    Bias(&'a [f32]),
}
