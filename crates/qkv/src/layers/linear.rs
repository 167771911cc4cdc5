//! y = x·Wᵀ + b, with W stored `[out, in]` as PyTorch and checkpoints store it.
//!
//! Backward (x: `[N, in]` with the leading axes flattened into N rows):
//! dW += dyᵀ·x, db += Σ_rows dy, dx = dy·W. The forward saves nothing: its input `x`
//! is all the backward needs, and the caller holds it anyway. A layer that computes in
//! bf16 ([`Linear::pack_as`]) runs both backward products in bf16 too
//! ([`crate::weights::bf16::grad`]): mixed-precision training, the f32 weight its master
//! copy.

use crate::error::{Error, Result};
use crate::ops::{gemm, gemm_packed, MatMut, MatRef, PackedWeight, Par};
use crate::tensor::Tensor;
use crate::weights::bf16::{self, Bf16Weight};
use crate::weights::ggml::f16::F16Weight;
use crate::weights::ggml::BlockWeight;
use crate::weights::int8::{self, Int8Weight, ScaleLayout};
use crate::weights::stored::{self, Start, StoredWeight};
use crate::weights::DType;
use std::sync::{Arc, OnceLock};

#[derive(Clone, Debug)]
pub struct Linear {
    /// `[out, in]`
    pub weight: Tensor,
    /// `[out]`
    pub bias: Option<Tensor>,
    /// `weight` packed for the products by [`Linear::pack`] or [`Linear::pack_as`], with
    /// the [`Tensor::generation`] it was packed from: once the weight changes, the copy
    /// no longer matches and is not used.
    packed: Option<(u64, Arc<Packed>)>,
    /// `Some((out, in))` when the layer keeps its weight only as its bf16 or int8 copy
    /// ([`Linear::keep_packed_only`]): `weight` is then an empty `[0, 0]` placeholder,
    /// and the copy is used whatever the placeholder's generation.
    packed_only: Option<(usize, usize)>,
}

/// A weight's copy in the layout (and number type) its products read.
#[derive(Debug)]
enum Packed {
    /// f32 in the matrix-product kernel's panels.
    F32(PackedWeight),
    /// bf16, which every product of the layer then reads instead of the f32 weight.
    Bf16(Bf16Copy),
    /// int8 codes and scales, likewise.
    Int8(Int8Weight),
    /// A GGUF file's 4- to 6-bit blocks as stored (never made from the f32 weight).
    Blocks(BlockWeight),
    /// A GGUF file's f16 values as stored, likewise.
    F16(F16Weight),
}

impl Packed {
    /// The copy in a stored number type, which every product of the layer reads
    /// through one interface; `None` for f32 panels.
    fn stored(&self) -> Option<&dyn StoredWeight> {
        match self {
            Packed::F32(_) => None,
            Packed::Bf16(c) => Some(&c.w),
            Packed::Int8(w) => Some(w),
            Packed::Blocks(w) => Some(w),
            Packed::F16(w) => Some(w),
        }
    }
}

/// A weight's bf16 copy `[out, in]`, and its transpose `[in, out]` for the backward's
/// dx = dy·W, made the first time a backward runs (inference never needs it).
#[derive(Debug)]
struct Bf16Copy {
    w: Bf16Weight,
    t: OnceLock<Bf16Weight>,
}

impl Linear {
    /// Checks that weight is `[out, in]` and bias, if any, is `[out]`.
    pub fn new(weight: Tensor, bias: Option<Tensor>) -> Result<Self> {
        weight.expect_matrix("linear.weight", ["out", "in"])?;
        if let Some(b) = &bias {
            b.expect_shape("linear.bias", &[Some(weight.shape()[0])])?;
        }
        Ok(Linear {
            weight,
            bias,
            packed: None,
            packed_only: None,
        })
    }

    /// A layer whose weight is `w` alone, kept as [`Linear::keep_packed_only`] keeps
    /// one: a checkpoint stored in 8-bit blocks (GGUF's Q8_0) runs from them with no
    /// f32 weight ever made.
    pub fn from_int8(w: Int8Weight, bias: Option<Tensor>) -> Result<Self> {
        let shape = (w.n(), w.k());
        Self::packed_only_from(Packed::Int8(w), shape, bias)
    }

    /// A layer whose weight is `w`, a GGUF file's 4- to 6-bit blocks as stored, kept
    /// as [`Linear::from_int8`] keeps its codes.
    pub fn from_blocks(w: BlockWeight, bias: Option<Tensor>) -> Result<Self> {
        let shape = (w.n(), w.k());
        Self::packed_only_from(Packed::Blocks(w), shape, bias)
    }

    /// A layer whose weight is `w`, a GGUF file's f16 values as stored, kept as
    /// [`Linear::from_int8`] keeps its codes.
    pub fn from_f16(w: F16Weight, bias: Option<Tensor>) -> Result<Self> {
        let shape = (w.n(), w.k());
        Self::packed_only_from(Packed::F16(w), shape, bias)
    }

    /// A layer that holds `packed` (`[out, in]` = `shape`) and no f32 weight.
    fn packed_only_from(
        packed: Packed,
        (n_out, n_in): (usize, usize),
        bias: Option<Tensor>,
    ) -> Result<Self> {
        if let Some(b) = &bias {
            b.expect_shape("linear.bias", &[Some(n_out)])?;
        }
        let weight = Tensor::zeros(&[0, 0]);
        Ok(Linear {
            packed: Some((weight.generation(), Arc::new(packed))),
            weight,
            bias,
            packed_only: Some((n_out, n_in)),
        })
    }

    pub fn in_features(&self) -> usize {
        self.packed_only
            .map_or_else(|| self.weight.shape()[1], |(_, i)| i)
    }

    pub fn out_features(&self) -> usize {
        self.packed_only
            .map_or_else(|| self.weight.shape()[0], |(o, _)| o)
    }

    /// Whether the layer holds its f32 weight (see [`Linear::keep_packed_only`]).
    pub fn has_f32_weight(&self) -> bool {
        self.packed_only.is_none()
    }

    /// Drops the f32 weight and keeps only the bf16 or int8 copy [`Linear::pack_as`]
    /// made, which every forward reads anyway: an inference model then holds its
    /// weights once, in their reduced type. The layer can no longer be trained (its
    /// backward is refused); [`Linear::unpack`] or packing in another type widens the
    /// copy back into an f32 weight (the rounded values, not the original ones).
    pub fn keep_packed_only(&mut self) -> Result<()> {
        if self.packed_only.is_some() {
            return Ok(());
        }
        if !matches!(
            self.current_packed(),
            Some(Packed::Bf16(_) | Packed::Int8(_))
        ) {
            return Err(Error::invalid(
                "linear weight",
                "only a current bf16 or int8 copy can stand in for the f32 weight",
            ));
        }
        self.packed_only = Some((self.out_features(), self.in_features()));
        self.weight = Tensor::zeros(&[0, 0]);
        Ok(())
    }

    /// Takes the weight of `other` (a layer of the same shape, its bias ignored) with
    /// its packed copy: a loader packs each weight as it reads it, so that a whole
    /// model's f32 weights are never held at once.
    #[cfg(feature = "models")]
    pub(crate) fn adopt_weight(&mut self, other: Linear) -> Result<()> {
        let (want, got) = (
            (self.out_features(), self.in_features()),
            (other.out_features(), other.in_features()),
        );
        if want != got {
            return Err(Error::shape(
                "linear.weight",
                format!("{:?}", [want.0, want.1]),
                &[got.0, got.1],
            ));
        }
        self.weight = other.weight;
        self.packed = other.packed;
        self.packed_only = other.packed_only;
        Ok(())
    }

    /// Makes a layer kept as [`Linear::keep_packed_only`] hold an f32 weight again: its
    /// copy widened, the copy still current.
    fn restore_f32_weight(&mut self) {
        let Some((n_out, n_in)) = self.packed_only.take() else {
            return;
        };
        let widened = match self.packed.as_ref().map(|(_, p)| &**p) {
            Some(Packed::Bf16(c)) => c.w.widened(),
            Some(Packed::Int8(w)) => w.widened(),
            Some(Packed::Blocks(w)) => w.widened(),
            Some(Packed::F16(w)) => w.widened(),
            _ => unreachable!("a layer kept packed only has a bf16, int8 or block copy"),
        };
        self.weight = Tensor::new(&[n_out, n_in], widened).expect("the copy's shape");
        if let Some((generation, _)) = &mut self.packed {
            *generation = self.weight.generation();
        }
    }

    /// Whether the two layers hold one packed copy between them (a tied head and the
    /// token table it reads, both from a file's blocks).
    pub fn shares_copy_with(&self, other: &Linear) -> bool {
        match (&self.packed, &other.packed) {
            (Some((_, a)), Some((_, b))) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }

    /// Row r of the weight (`[in]`) into `out`: from the f32 weight, or widened from
    /// the copy a layer kept packed only holds (the values its products read).
    pub fn weight_row(&self, r: usize, out: &mut [f32]) {
        let n_in = self.in_features();
        assert!(r < self.out_features() && out.len() == n_in);
        let packed = self.packed_only.and(self.current_packed());
        let Some(stored) = packed.and_then(Packed::stored) else {
            out.copy_from_slice(&self.weight.data()[r * n_in..][..n_in]);
            return;
        };
        for (c, v) in out.iter_mut().enumerate() {
            *v = stored.element(r, c);
        }
    }

    /// Errors when the layer has no f32 weight to train: `what` names the pass.
    fn expect_f32_weight(&self, what: &str) -> Result<()> {
        match self.packed_only {
            None => Ok(()),
            Some(_) => Err(Error::Unsupported(format!(
                "{what}: the linear layer keeps its weight only in {} (loaded for inference); load the model in f32 to train it",
                self.dtype()
            ))),
        }
    }

    /// Checks that `x` is `[.., in]`.
    fn check_input(&self, x: &Tensor) -> Result<()> {
        let n_in = self.in_features();
        if x.rank() == 0 || x.last_dim() != n_in {
            return Err(Error::shape(
                "linear input",
                format!("[.., {n_in}]"),
                x.shape(),
            ));
        }
        Ok(())
    }

    /// Keeps a copy of the weight packed for the matrix-product kernel, for inference:
    /// products of a few to a few hundred rows (a sentence, a prompt) then skip packing
    /// the weight at every call, which costs about as much as their arithmetic. It
    /// doubles the weight's memory. A weight changed afterwards (by training) is used
    /// as it is; its stale copy is ignored.
    pub fn pack(&mut self) {
        self.pack_as(DType::F32);
    }

    /// [`Linear::pack`] in a number type: with [`DType::Bf16`], a bf16 copy (half the
    /// f32 weight's bytes) that every forward then reads: the layer computes
    /// bf16(x)·bf16(W)ᵀ, products and sums in f32, plus the f32 bias
    /// ([`crate::weights::bf16`]). With [`DType::Int8`] or [`DType::Int8Row`], 8-bit codes
    /// and scales, and x quantized on the fly ([`crate::weights::int8`]). As with `pack`, a
    /// weight changed afterwards is used as it is, in f32.
    /// A layer kept as [`Linear::keep_packed_only`] is packed from its widened copy and
    /// stays so in bf16 and int8; packed in f32 it holds an f32 weight again. The
    /// block types and f16 ([`DType::Blocks`], [`DType::F16`]) are loaded, never made:
    /// a layer holding other weights is packed in f32 for them.
    pub fn pack_as(&mut self, dtype: DType) {
        if self.packed_only.is_some() && dtype == self.dtype() {
            return;
        }
        let dtype = match dtype {
            DType::Blocks(_) | DType::F16 => DType::F32,
            d => d,
        };
        if self.packed_only.is_some() {
            self.restore_f32_weight();
            self.pack_as(dtype);
            if dtype != DType::F32 {
                self.keep_packed_only()
                    .expect("just packed in a reduced type");
            }
            return;
        }
        let (n_out, n_in) = (self.out_features(), self.in_features());
        let w = self.weight.data();
        // an empty weight (no inputs or outputs) has no product to speed up: left unpacked
        let packed = match dtype {
            DType::F32 | DType::Blocks(_) | DType::F16 => {
                PackedWeight::new(w, n_out, n_in).ok().map(Packed::F32)
            }
            DType::Bf16 => Bf16Weight::new(w, n_out, n_in).ok().map(|w| {
                Packed::Bf16(Bf16Copy {
                    w,
                    t: OnceLock::new(),
                })
            }),
            DType::Int8 | DType::Int8Row => {
                let layout = match dtype {
                    DType::Int8 => ScaleLayout::Blocks,
                    _ => ScaleLayout::Rows,
                };
                Int8Weight::new(w, n_out, n_in, layout)
                    .ok()
                    .map(Packed::Int8)
            }
        };
        self.packed = packed.map(|p| (self.weight.generation(), Arc::new(p)));
    }

    /// The number type the forward computes with: that of a current packed copy, else f32.
    pub fn dtype(&self) -> DType {
        match self.current_packed() {
            Some(Packed::Bf16(_)) => DType::Bf16,
            Some(Packed::Int8(w)) => match w.layout() {
                ScaleLayout::Blocks => DType::Int8,
                ScaleLayout::Rows => DType::Int8Row,
            },
            Some(Packed::Blocks(w)) => DType::Blocks(w.ty()),
            Some(Packed::F16(_)) => DType::F16,
            _ => DType::F32,
        }
    }

    /// Packs the weight in `dtype` again when its copy is missing or stale: a training
    /// step in bf16 computes with a copy of the weights the last update left.
    pub fn repack(&mut self, dtype: DType) {
        if self.current_packed().is_none() {
            self.pack_as(dtype);
        }
    }

    /// Drops the packed copy: the layer computes with its f32 weight (a layer kept as
    /// [`Linear::keep_packed_only`] with its copy widened).
    pub fn unpack(&mut self) {
        self.restore_f32_weight();
        self.packed = None;
    }

    /// Bytes of the weight as the forward reads it: its copy in bf16 or int8 (scales
    /// included), else the f32 weight's.
    pub fn weight_bytes(&self) -> usize {
        match self.current_packed().and_then(Packed::stored) {
            Some(w) => w.bytes(),
            None => 4 * self.weight.numel(),
        }
    }

    /// The packed copy, when one was made from the current weight (or stands in for it).
    fn current_packed(&self) -> Option<&Packed> {
        match &self.packed {
            Some((_, w)) if self.packed_only.is_some() => Some(w),
            Some((generation, w)) if *generation == self.weight.generation() => Some(w),
            _ => None,
        }
    }

    /// s·x·Wᵀ without the bias, x: `[..., in]` → `[..., out]`, through the packed copy
    /// when there is one (an LM head's logits).
    pub fn project(&self, x: &Tensor, s: f32) -> Result<Tensor> {
        let mut y = self.forward_with_bias(x, false)?;
        if s != 1.0 {
            y.data_mut().iter_mut().for_each(|v| *v *= s);
        }
        Ok(y)
    }

    /// x: `[..., in]` → `[..., out]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_with_bias(x, true)
    }

    /// x `[..., in]` through layers that read the same input (an attention's Q, K and
    /// V; a gated FFN's up and gate), each output as its own [`Linear::forward`] gives
    /// it. Where every layer computes in int8 of one grouping, x is quantized once and
    /// all the weights' panels are swept in one job
    /// ([`crate::weights::int8::product::fused_products`]); else layer by layer.
    pub fn forward_each<const N: usize>(layers: [&Linear; N], x: &Tensor) -> Result<[Tensor; N]> {
        let int8: Option<Vec<&Int8Weight>> = layers
            .iter()
            .map(|l| match l.current_packed() {
                Some(Packed::Int8(w)) => Some(w),
                _ => None,
            })
            .collect();
        let rows = x.numel() / layers[0].in_features().max(1);
        let fusable = |w: &Vec<&Int8Weight>| N > 1 && int8::product::fusable(w, rows);
        if let Some(weights) = int8.filter(fusable) {
            for l in layers {
                l.check_input(x)?;
            }
            let mut ys = layers.map(|l| l.output_for(x));
            let parts = ys
                .iter_mut()
                .zip(layers)
                .zip(weights)
                .map(|((y, l), w)| (w, y.data_mut(), l.start(true)))
                .collect();
            if int8::product::fused_products(parts, x.data(), rows, Par::Auto)? {
                return Ok(ys);
            }
        }
        let ys: Vec<Tensor> = layers.iter().map(|l| l.forward(x)).collect::<Result<_>>()?;
        Ok(ys
            .try_into()
            .unwrap_or_else(|_| unreachable!("one output a layer")))
    }

    /// The zeroed output for an input `x` `[.., in]` already checked: `[.., out]`.
    fn output_for(&self, x: &Tensor) -> Tensor {
        let mut shape = x.shape().to_vec();
        *shape.last_mut().expect("rank checked") = self.out_features();
        Tensor::zeros(&shape)
    }

    /// How a product's output starts: from the bias, when `with_bias` and the layer has
    /// one (added as each tile of y is written: no pass over y before), else from zero.
    fn start(&self, with_bias: bool) -> Start<'_> {
        match self.bias.as_ref().filter(|_| with_bias) {
            Some(b) => Start::Bias(b.data()),
            None => Start::Zero,
        }
    }

    /// x·Wᵀ, plus the bias when `with_bias` and the layer has one.
    fn forward_with_bias(&self, x: &Tensor, with_bias: bool) -> Result<Tensor> {
        let n_out = self.out_features();
        self.check_input(x)?;
        let mut y = self.output_for(x);
        let rows = x.numel() / self.in_features();
        let start = self.start(with_bias);
        if let Some(w) = self.current_packed().and_then(Packed::stored) {
            stored::product(w, y.data_mut(), x.data(), rows, start, Par::Auto)?;
            return Ok(y);
        }
        start.prepare(y.data_mut(), n_out);
        let accumulate = start.accumulates();
        match self.current_packed() {
            // one row (a decoding step) reads the weight once in place, at memory speed,
            // whichever copy it reads: the unpacked path's dot products suit it best
            Some(Packed::F32(packed)) if rows > 1 => gemm_packed(
                MatMut::row_major(y.data_mut(), rows, n_out),
                MatRef::row_major(x.data(), rows, self.in_features()),
                packed,
                1.0,
                accumulate,
                Par::Auto,
            )?,
            _ => product_into(&mut y, x, &self.weight, 1.0, accumulate)?,
        }
        Ok(y)
    }
}

/// y (+)= α·x·Wᵀ for x `[rows, in]`, W `[out, in]` read in place, y `[rows, out]`
/// (any leading axes): overwritten, or added to when `accumulate`. A tied LM head reads
/// the embedding table as its W this way.
pub fn product_into(
    y: &mut Tensor,
    x: &Tensor,
    w: &Tensor,
    alpha: f32,
    accumulate: bool,
) -> Result<()> {
    let (n_out, n_in, rows) = product_dims(x, w)?;
    gemm(
        MatMut::row_major(y.data_mut(), rows, n_out),
        MatRef::row_major(x.data(), rows, n_in),
        MatRef::row_major(w.data(), n_out, n_in).t(),
        alpha,
        accumulate,
        Par::Auto,
    )
}

/// (out, in, rows) of `x·Wᵀ`, for W `[out, in]` and x `[..., in]`.
fn product_dims(x: &Tensor, w: &Tensor) -> Result<(usize, usize, usize)> {
    let &[n_out, n_in] = w.shape() else {
        return Err(Error::shape("product weight", "[out, in]", w.shape()));
    };
    if x.rank() == 0 || x.last_dim() != n_in {
        return Err(Error::shape(
            "product input",
            format!("[..., {n_in}] (the weight's in)"),
            x.shape(),
        ));
    }
    Ok((n_out, n_in, x.numel() / n_in.max(1)))
}

/// The weight's half of [`product_backward`]: **accumulates** α·dyᵀ·x into `dw`
/// `[out, in]`, for x `[rows, in]` and dy `[rows, out]` (any leading shape).
pub fn product_weight_grad(x: &Tensor, alpha: f32, dy: &Tensor, dw: &mut Tensor) -> Result<()> {
    let (n_out, n_in, rows) = product_dims(x, dw)?;
    // forward: y = α·x·Wᵀ  →  dW += α·dyᵀ·x   ([out, N]·[N, in])
    gemm(
        MatMut::row_major(dw.data_mut(), n_out, n_in),
        MatRef::row_major(dy.data(), rows, n_out).t(),
        MatRef::row_major(x.data(), rows, n_in),
        alpha,
        true,
        Par::Auto,
    )
}

/// Backward of [`product_into`] (`y = α·x·Wᵀ`): dy `[rows, out]` → dx `[rows, in]`
/// (shaped as x), written into `dx`, or added to it when `accumulate`; **accumulates**
/// α·dyᵀ·x into `dw` `[out, in]`.
pub fn product_backward(
    x: &Tensor,
    w: &Tensor,
    alpha: f32,
    dy: &Tensor,
    dw: &mut Tensor,
    (dx, accumulate): (&mut Tensor, bool),
) -> Result<()> {
    let (n_out, n_in, rows) = product_dims(x, w)?;
    product_weight_grad(x, alpha, dy, dw)?;
    // forward: y = α·x·Wᵀ  →  dx = α·dy·W   ([N, out]·[out, in])
    gemm(
        MatMut::row_major(dx.data_mut(), rows, n_in),
        MatRef::row_major(dy.data(), rows, n_out),
        MatRef::row_major(w.data(), n_out, n_in),
        alpha,
        accumulate,
        Par::Auto,
    )
}

crate::module!(Linear { weight, bias });

impl Linear {
    /// Errors unless `grads` is shaped as this layer (a bias exactly when it has one).
    fn check_grads(&self, grads: &Linear) -> Result<()> {
        let same = grads.weight.shape() == self.weight.shape()
            && grads.bias.as_ref().map(Tensor::shape) == self.bias.as_ref().map(Tensor::shape);
        if !same {
            return Err(Error::shape(
                "linear grads",
                format!(
                    "{:?}{} like the layer",
                    self.weight.shape(),
                    if self.bias.is_some() {
                        " with a bias"
                    } else {
                        ""
                    }
                ),
                grads.weight.shape(),
            ));
        }
        Ok(())
    }
}

impl Linear {
    /// Backward of [`Linear::forward`]. x: `[.., in]` as given to the forward;
    /// dy: `[.., out]` with the same leading axes. **Accumulates** into `grads.weight`
    /// (`[out, in]`) and `grads.bias` (`[out]`), a gradient tree shaped as this layer;
    /// returns dx: `[.., in]`.
    pub fn backward(&self, x: &Tensor, dy: &Tensor, grads: &mut Linear) -> Result<Tensor> {
        let mut dx = Tensor::zeros(x.shape());
        self.backward_impl(x, dy, grads, (&mut dx, false))?;
        Ok(dx)
    }

    /// [`Linear::backward`] that adds dx into `dx` `[.., in]`: the input gradient of an
    /// x that feeds several layers (W_Q, W_K and W_V) is the sum of theirs.
    pub fn backward_add(
        &self,
        x: &Tensor,
        dy: &Tensor,
        grads: &mut Linear,
        dx: &mut Tensor,
    ) -> Result<()> {
        if dx.shape() != x.shape() {
            return Err(Error::shape(
                "linear dx",
                format!("{:?}", x.shape()),
                dx.shape(),
            ));
        }
        self.backward_impl(x, dy, grads, (dx, true))
    }

    fn backward_impl(
        &self,
        x: &Tensor,
        dy: &Tensor,
        grads: &mut Linear,
        dx: (&mut Tensor, bool),
    ) -> Result<()> {
        self.expect_f32_weight("linear backward")?;
        let n_out = self.out_features();
        self.check_input(x)?;
        let mut dy_shape = x.shape().to_vec();
        *dy_shape.last_mut().expect("rank checked") = n_out;
        if dy.shape() != dy_shape.as_slice() {
            return Err(Error::shape(
                "linear dy",
                format!("{dy_shape:?}"),
                dy.shape(),
            ));
        }
        self.check_grads(grads)?;
        if let Some(db) = &mut grads.bias {
            // forward: y = … + b on every row  →  db += Σ_rows dy
            let db = db.data_mut();
            for row in dy.data().chunks_exact(n_out) {
                for (g, &d) in db.iter_mut().zip(row) {
                    *g += d;
                }
            }
        }
        self.products_backward(x, 1.0, dy, &mut grads.weight, dx)
    }

    /// Backward of [`Linear::project`] (`y = s·x·Wᵀ`, no bias): dy `[.., out]` → dx
    /// `[.., in]`; **accumulates** s·dyᵀ·x into `dw` `[out, in]`. An untied LM head's.
    pub fn project_backward(
        &self,
        x: &Tensor,
        s: f32,
        dy: &Tensor,
        dw: &mut Tensor,
    ) -> Result<Tensor> {
        self.expect_f32_weight("LM head backward")?;
        self.check_input(x)?;
        if dw.shape() != self.weight.shape() {
            return Err(Error::shape(
                "linear weight gradient",
                format!("{:?} like the weight", self.weight.shape()),
                dw.shape(),
            ));
        }
        let mut dx = Tensor::zeros(x.shape());
        self.products_backward(x, s, dy, dw, (&mut dx, false))?;
        Ok(dx)
    }

    /// [`product_backward`] with this layer's weight, in bf16 when the layer computes in
    /// bf16 (its transposed copy made on first use). dy's length is checked by either.
    fn products_backward(
        &self,
        x: &Tensor,
        alpha: f32,
        dy: &Tensor,
        dw: &mut Tensor,
        (dx, accumulate): (&mut Tensor, bool),
    ) -> Result<()> {
        let Some(Packed::Bf16(copy)) = self.current_packed() else {
            return product_backward(x, &self.weight, alpha, dy, dw, (dx, accumulate));
        };
        let (n_out, n_in, rows) = product_dims(x, &self.weight)?;
        let wt = match copy.t.get() {
            Some(t) => t,
            None => {
                let t = Bf16Weight::transposed(self.weight.data(), n_out, n_in)?;
                copy.t.get_or_init(|| t)
            }
        };
        let sizes = (rows, n_out, n_in);
        bf16::grad::weight_grad(dw.data_mut(), dy.data(), x.data(), sizes, alpha, Par::Auto)?;
        bf16::grad::input_grad(
            dx.data_mut(),
            dy.data(),
            rows,
            wt,
            alpha,
            accumulate,
            Par::Auto,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    fn random(rng: &mut Rng, shape: &[usize]) -> Tensor {
        Tensor::new(shape, rng.normals(shape.iter().product(), 1.0)).unwrap()
    }

    /// Layers read together give each layer's own forward, bit for bit: int8 layers
    /// (fused into one job where the CPU's form is the tiles), a mix, f32 and bf16
    /// (layer by layer), with and without biases, one row and several.
    #[test]
    fn forward_each_equals_each_forward() {
        let mut rng = Rng::new(7);
        let layer = |rng: &mut Rng, n_out: usize, dtype: DType, bias: bool| {
            let b = bias.then(|| random(rng, &[n_out]));
            let mut l = Linear::new(random(rng, &[n_out, 64]), b).unwrap();
            l.pack_as(dtype);
            l
        };
        for rows in [1, 2, 9] {
            let x = random(&mut rng, &[1, rows, 64]);
            for (first, second) in [
                (DType::Int8, DType::Int8),
                (DType::Int8, DType::F32),
                (DType::F32, DType::F32),
                (DType::Bf16, DType::Bf16),
            ] {
                let [a, b, c] = [
                    layer(&mut rng, 48, first, true),
                    layer(&mut rng, 16, second, false),
                    layer(&mut rng, 20, first, true),
                ];
                let got = Linear::forward_each([&a, &b, &c], &x).unwrap();
                for (l, y) in [&a, &b, &c].into_iter().zip(&got) {
                    let want = l.forward(&x).unwrap();
                    assert_eq!(y.shape(), want.shape());
                    assert_eq!(y.data(), want.data(), "rows {rows}, {first:?} {second:?}");
                }
            }
        }
        let bad = random(&mut rng, &[1, 2, 63]);
        let l = layer(&mut rng, 16, DType::Int8, false);
        assert!(Linear::forward_each([&l, &l], &bad).is_err());
    }

    /// A packed layer gives the unpacked layer's outputs for every row count, and once
    /// its weight changes it computes with the new weight, never the stale copy.
    #[test]
    fn packed_forward_equals_unpacked_and_follows_weight_changes() {
        let mut rng = Rng::new(5);
        let (n_in, n_out) = (300, 70);
        let plain = Linear::new(
            random(&mut rng, &[n_out, n_in]),
            Some(random(&mut rng, &[n_out])),
        )
        .unwrap();
        let mut packed = plain.clone();
        packed.pack();
        assert!(packed.current_packed().is_some());
        for rows in [1, 2, 13, 40] {
            let x = random(&mut rng, &[rows, n_in]);
            let (want, got) = (plain.forward(&x).unwrap(), packed.forward(&x).unwrap());
            let scale = want.data().iter().fold(1.0f32, |m, v| m.max(v.abs()));
            assert!(
                got.max_abs_diff(&want) <= 1e-5 * scale,
                "{rows} rows: {}",
                got.max_abs_diff(&want)
            );
        }
        packed.weight.data_mut()[0] += 1.0;
        assert!(
            packed.current_packed().is_none(),
            "a stale copy is not used"
        );
        let mut changed = plain.clone();
        changed.weight.data_mut()[0] += 1.0;
        let x = random(&mut rng, &[13, n_in]);
        assert_eq!(packed.forward(&x).unwrap(), changed.forward(&x).unwrap());
    }

    /// ‖a − b‖ / ‖b‖.
    fn relative(a: &Tensor, b: &Tensor) -> f32 {
        let d: f32 = a
            .data()
            .iter()
            .zip(b.data())
            .map(|(x, y)| (x - y).powi(2))
            .sum();
        let n: f32 = b.data().iter().map(|y| y * y).sum();
        (d / n).sqrt()
    }

    /// Kept packed only, a layer computes what it computed with its f32 weight beside
    /// the copy, in every type and for every row count; its backward is refused, and
    /// unpacked it holds the copy widened. Packing it in f32 gives the weight back too.
    #[test]
    fn a_layer_kept_packed_only_computes_as_before_and_refuses_to_train() {
        let mut rng = Rng::new(11);
        let (n_in, n_out) = (96, 40);
        let plain = Linear::new(
            random(&mut rng, &[n_out, n_in]),
            Some(random(&mut rng, &[n_out])),
        )
        .unwrap();
        for dtype in [DType::Bf16, DType::Int8, DType::Int8Row] {
            let mut full = plain.clone();
            full.pack_as(dtype);
            let mut lean = full.clone();
            lean.keep_packed_only().unwrap();
            assert!(
                !lean.has_f32_weight() && lean.weight.numel() == 0,
                "{dtype}"
            );
            assert_eq!((lean.out_features(), lean.in_features()), (n_out, n_in));
            assert_eq!(
                (lean.dtype(), lean.weight_bytes()),
                (dtype, full.weight_bytes())
            );
            for rows in [1, 3, 17] {
                let x = random(&mut rng, &[rows, n_in]);
                let (want, got) = (full.forward(&x).unwrap(), lean.forward(&x).unwrap());
                assert_eq!(got.data(), want.data(), "{dtype}, {rows} rows");
            }
            let x = random(&mut rng, &[2, n_in]);
            let dy = random(&mut rng, &[2, n_out]);
            let mut grads = crate::module::Module::zeros_like(&plain);
            let refused = lean.backward(&x, &dy, &mut grads).unwrap_err().to_string();
            assert!(refused.contains(&format!("only in {dtype}")), "{refused}");

            let mut widened = lean.clone();
            widened.unpack();
            let want = match full.current_packed() {
                Some(Packed::Bf16(c)) => c.w.widened(),
                Some(Packed::Int8(w)) => w.widened(),
                _ => unreachable!(),
            };
            assert!(widened.has_f32_weight() && widened.dtype() == DType::F32);
            assert_eq!(widened.weight.data(), want.as_slice(), "{dtype}");
            widened.backward(&x, &dy, &mut grads).unwrap();

            lean.pack_as(DType::F32);
            assert!(lean.has_f32_weight(), "{dtype}");
            assert_eq!(lean.weight.data(), want.as_slice(), "{dtype}");
        }
    }

    /// A layer that computes in bf16 runs its backward (and an LM head's) in bf16 too:
    /// dx, dW and db within bf16's rounding of f32's, dx and dW not equal to them. Once
    /// the weight changes the stale copy is not used: the backward is f32's exactly.
    #[test]
    fn a_bf16_layer_backward_is_bf16_until_its_weight_changes() {
        let mut rng = Rng::new(9);
        let (rows, n_in, n_out) = (24, 40, 30);
        let plain = Linear::new(
            random(&mut rng, &[n_out, n_in]),
            Some(random(&mut rng, &[n_out])),
        )
        .unwrap();
        let (x, dy) = (
            random(&mut rng, &[rows, n_in]),
            random(&mut rng, &[rows, n_out]),
        );
        let backward = |layer: &Linear| {
            let mut g =
                Linear::new(Tensor::zeros(&[n_out, n_in]), Some(Tensor::zeros(&[n_out]))).unwrap();
            let dx = layer.backward(&x, &dy, &mut g).unwrap();
            let mut dw = Tensor::zeros(&[n_out, n_in]);
            let dh = layer.project_backward(&x, 0.5, &dy, &mut dw).unwrap();
            (dx, g, dh, dw)
        };
        let (dx, g, dh, dw) = backward(&plain);
        let mut bf16 = plain.clone();
        bf16.pack_as(DType::Bf16);
        let (dx16, g16, dh16, dw16) = backward(&bf16);
        for (what, got, want) in [
            ("dx", &dx16, &dx),
            ("dW", &g16.weight, &g.weight),
            ("head dx", &dh16, &dh),
            ("head dW", &dw16, &dw),
        ] {
            let r = relative(got, want);
            assert!(r > 0.0 && r < 1e-2, "{what}: relative difference {r}");
        }
        assert_eq!(g16.bias, g.bias, "db is an f32 sum either way");

        let mut changed = plain.clone();
        changed.weight.data_mut()[0] += 1.0;
        bf16.weight.data_mut()[0] += 1.0;
        let (dx, g, ..) = backward(&changed);
        let (dx16, g16, ..) = backward(&bf16);
        assert_eq!((dx16, g16.weight), (dx, g.weight));
    }
}
