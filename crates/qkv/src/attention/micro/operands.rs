//! The operands of the micro-kernels, one struct per kernel (slices, their strides and
//! sizes), and the width of a packed key panel.

/// Keys per panel (one AVX-512 vector, two AVX2 ones), packed by
/// [`pack_panels`](crate::ops::matmul::pack_panels).
pub(crate) const PANEL: usize = crate::ops::matmul::PANEL;

/// A strided matrix operand: element (x, y) at `data[x·row + y·col]`.
#[derive(Clone, Copy)]
pub(crate) struct Strided<'a> {
    pub data: &'a [f32],
    pub row: usize,
    pub col: usize,
}

/// The operands of [`Kernels::scores`].
///
/// [`Kernels::scores`]: super::kernels::Kernels::scores
pub(crate) struct Scores<'a> {
    /// `rows` query rows, `q_stride` apart, `d` wide
    pub q: &'a [f32],
    pub q_stride: usize,
    pub rows: usize,
    pub d: usize,
    /// `panels` packed key panels, `[D][PANEL]` each
    pub kp: &'a [f32],
    pub panels: usize,
    pub scale: f32,
    /// `rows` rows of `panels·PANEL` scores, `out_stride` apart
    pub out: &'a mut [f32],
    pub out_stride: usize,
}

/// The operands of [`Kernels::mul_acc`]: A `[m, k]` (strided), B `[k, n]` (rows
/// `b_stride` apart), acc `[m, n]` (rows `acc_stride` apart) and the rows' factors.
///
/// [`Kernels::mul_acc`]: super::kernels::Kernels::mul_acc
pub(crate) struct MulAcc<'a> {
    pub a: Strided<'a>,
    pub m: usize,
    pub k: usize,
    pub b: &'a [f32],
    pub b_stride: usize,
    pub n: usize,
    pub corr: Option<&'a [f32]>,
    pub acc: &'a mut [f32],
    pub acc_stride: usize,
}

/// The operands of [`Kernels::softmax_rows`]: `rows` rows of `cols` scores, `stride`
/// apart, and each row's running max `m`, sum `l` and new factor `corr`.
///
/// [`Kernels::softmax_rows`]: super::kernels::Kernels::softmax_rows
pub(crate) struct SoftmaxRows<'a> {
    pub tile: &'a mut [f32],
    pub stride: usize,
    pub rows: usize,
    pub cols: usize,
    pub m: &'a mut [f32],
    pub l: &'a mut [f32],
    pub corr: &'a mut [f32],
}
