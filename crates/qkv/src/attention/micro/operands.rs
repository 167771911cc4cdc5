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

/// What B's elements are stored as: f32, or bf16 bit patterns (a KV cache in bf16),
/// whose f32 value is the pattern shifted up 16 bits.
pub(crate) trait Element: Copy {
    fn value(self) -> f32;
}

impl Element for f32 {
    fn value(self) -> f32 {
        self
    }
}

impl Element for u16 {
    fn value(self) -> f32 {
        crate::weights::bf16::bf16_to_f32(self)
    }
}

/// The operands of [`Kernels::mul_acc`]: A `[m, k]` (strided), B `[k, n]` (rows
/// `b_stride` apart; f32, or bf16 for [`Kernels::mul_acc_bf16`]), acc `[m, n]` (rows
/// `acc_stride` apart) and the rows' factors.
///
/// [`Kernels::mul_acc`]: super::kernels::Kernels::mul_acc
/// [`Kernels::mul_acc_bf16`]: super::kernels::Kernels::mul_acc_bf16
pub(crate) struct MulAcc<'a, B = f32> {
    pub a: Strided<'a>,
    pub m: usize,
    pub k: usize,
    pub b: &'a [B],
    pub b_stride: usize,
    pub n: usize,
    pub corr: Option<&'a [f32]>,
    pub acc: &'a mut [f32],
    pub acc_stride: usize,
}

impl<B> MulAcc<'_, B> {
    /// Whether there is nothing to add (the rows still take their correction).
    pub fn adds_nothing(&self) -> bool {
        self.m == 0 || self.k == 0 || self.n == 0
    }

    /// Panics unless every operand holds the rows and columns the sizes name (the
    /// kernels read them through raw pointers); for operands that add something.
    pub fn check_lengths(&self) {
        assert!(self.a.data.len() > (self.m - 1) * self.a.row + (self.k - 1) * self.a.col);
        assert!(self.b.len() >= (self.k - 1) * self.b_stride + self.n);
        assert!(self.acc.len() >= (self.m - 1) * self.acc_stride + self.n);
        assert!(self.corr.is_none_or(|c| c.len() >= self.m));
    }
}

/// The operands of [`Kernels::dots`]: `rows` query rows (`q_stride` apart, `d` wide)
/// against `n` keys in f32 or bf16 (`k_stride` apart, read in place): out `[rows, n]`
/// (rows `out_stride` apart) = scale · q · kᵀ.
///
/// [`Kernels::dots`]: super::kernels::Kernels::dots
pub(crate) struct Dots<'a, K = f32> {
    pub q: &'a [f32],
    pub q_stride: usize,
    pub rows: usize,
    pub d: usize,
    pub k: &'a [K],
    pub k_stride: usize,
    pub n: usize,
    pub scale: f32,
    pub out: &'a mut [f32],
    pub out_stride: usize,
}

impl<K> Dots<'_, K> {
    /// Whether there is no dot product to take.
    pub fn takes_nothing(&self) -> bool {
        self.rows == 0 || self.n == 0
    }

    /// Panics unless every operand holds the rows the sizes name (the kernels read them
    /// through raw pointers); for operands with a dot product to take.
    pub fn check_lengths(&self) {
        assert!(self.q.len() >= (self.rows - 1) * self.q_stride + self.d);
        assert!(self.k.len() >= (self.n - 1) * self.k_stride + self.d);
        assert!(self.out.len() >= (self.rows - 1) * self.out_stride + self.n);
    }
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
