//! `qkv.attention` and `qkv.attention_backward`: the library's one attention entry
//! point over NumPy arrays, in qkv's layout `[B, T, H, D]` or PyTorch's `[B, H, T, D]`,
//! both read in place.

use numpy::PyArrayDyn;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use qkv::attention::{attention_backward_views, attention_views, HeadsView};
use qkv::{AttentionOutput, AttentionSpec, Bias, Broadcast, CausalAlign, Kernel, Tensor};

use crate::arrays::{self, In};
use crate::errors::OrPy;
use crate::ints::Int;

/// Where the heads axis sits in the arrays a caller passes and gets back.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// `[B, T, H, D]`, qkv's own: read in place.
    Bthd,
    /// `[B, H, T, D]`, `torch.nn.functional.scaled_dot_product_attention`'s: read in
    /// place too (heads-major views); the output is swapped into it on the way out.
    Bhtd,
}

impl Layout {
    fn parse(s: &str) -> PyResult<Self> {
        match s {
            "bthd" => Ok(Layout::Bthd),
            "bhtd" => Ok(Layout::Bhtd),
            _ => Err(PyValueError::new_err(format!(
                "`layout` must be \"bthd\" or \"bhtd\", got {s:?}"
            ))),
        }
    }
}

/// A Q, K, V (or output, gradient) argument, borrowed from the caller's array in
/// either layout; `shape` is qkv's `[B, L, N, E]`.
struct Heads<'py> {
    borrowed: In<'py, f32>,
    layout: Layout,
    shape: [usize; 4],
}

impl<'py> Heads<'py> {
    fn read(obj: &Bound<'py, PyAny>, name: &str, layout: Layout) -> PyResult<Self> {
        let borrowed = arrays::floats(obj, name)?;
        let given: [usize; 4] = borrowed.shape().try_into().map_err(|_| {
            let axes = match layout {
                Layout::Bthd => "[B, T, H, D]",
                Layout::Bhtd => "[B, H, T, D]",
            };
            PyValueError::new_err(format!(
                "shape mismatch for `{name}`: expected 4 axes {axes}, got {:?}",
                borrowed.shape()
            ))
        })?;
        let shape = match layout {
            Layout::Bthd => given,
            Layout::Bhtd => {
                let [b, h, t, d] = given;
                [b, t, h, d]
            }
        };
        Ok(Heads {
            borrowed,
            layout,
            shape,
        })
    }

    /// Q, K and V, named in errors.
    fn read_qkv(arrays: [&Bound<'py, PyAny>; 3], layout: Layout) -> PyResult<[Self; 3]> {
        let [q, k, v] = arrays;
        Ok([
            Heads::read(q, "q", layout)?,
            Heads::read(k, "k", layout)?,
            Heads::read(v, "v", layout)?,
        ])
    }

    /// The array read in place, in whichever layout it has.
    fn view(&self) -> HeadsView<'_> {
        let [batch, len, heads, dim] = self.shape;
        let data = self.borrowed.data();
        match self.layout {
            Layout::Bthd => HeadsView::positions_major(data, self.shape),
            Layout::Bhtd => HeadsView::heads_major(data, [batch, heads, len, dim]),
        }
    }

    /// A copy in qkv's layout, for the backward's `out` and `d_out`.
    fn tensor(&self) -> qkv::Result<Tensor> {
        let data = match self.layout {
            Layout::Bthd => self.borrowed.data().to_vec(),
            Layout::Bhtd => {
                let [b, t, h, d] = self.shape;
                arrays::swap_middle(self.borrowed.data(), [b, h, t, d])
            }
        };
        Tensor::new(&self.shape, data)
    }
}

/// A `[B, T, H, E]` result in the caller's layout.
fn heads_out<'py>(
    py: Python<'py>,
    t: Tensor,
    layout: Layout,
) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
    let shape: [usize; 4] = t.shape().try_into().expect("attention results are 4-d");
    match layout {
        Layout::Bthd => arrays::out(py, t.into_data(), &shape),
        Layout::Bhtd => {
            let [b, l, n, e] = shape;
            arrays::out(py, arrays::swap_middle(t.data(), shape), &[b, n, l, e])
        }
    }
}

/// The keyword arguments shared by the forward and the backward, read once.
struct Options<'py> {
    causal: Option<CausalAlign>,
    key_padding: Option<In<'py, bool>>,
    mask: Option<(In<'py, bool>, [usize; 4])>,
    bias: Option<(In<'py, f32>, [usize; 4])>,
    alibi_slopes: Option<In<'py, f32>>,
    window: Option<usize>,
    scale: Option<f32>,
    kernel: Kernel,
}

/// A mask or bias of 2 to 4 axes as `[Bm, Hm, T, S]`: leading axes of 1 are added, as
/// broadcasting would.
fn as_4d(shape: &[usize], name: &str) -> PyResult<[usize; 4]> {
    if !(2..=4).contains(&shape.len()) {
        return Err(PyValueError::new_err(format!(
            "shape mismatch for `{name}`: expected 2 to 4 axes [[Bm,] [Hm,] T, S], got {shape:?}"
        )));
    }
    let mut out = [1; 4];
    out[4 - shape.len()..].copy_from_slice(shape);
    Ok(out)
}

fn causal(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<CausalAlign>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(None);
    };
    if let Ok(flag) = obj.extract::<bool>() {
        return Ok(flag.then_some(CausalAlign::TopLeft));
    }
    match obj.extract::<String>().as_deref() {
        Ok("top_left") => Ok(Some(CausalAlign::TopLeft)),
        Ok("bottom_right") => Ok(Some(CausalAlign::BottomRight)),
        _ => Err(PyValueError::new_err(format!(
            "`causal` must be None, \"top_left\", \"bottom_right\" or a bool, got {obj}"
        ))),
    }
}

impl<'py> Options<'py> {
    #[allow(clippy::too_many_arguments)]
    fn read(
        causal_arg: Option<&Bound<'py, PyAny>>,
        key_padding: Option<&Bound<'py, PyAny>>,
        mask: Option<&Bound<'py, PyAny>>,
        bias: Option<&Bound<'py, PyAny>>,
        alibi_slopes: Option<&Bound<'py, PyAny>>,
        window: Option<Int>,
        scale: Option<f64>,
        kernel: &str,
    ) -> PyResult<Self> {
        let some = |o: Option<&Bound<'py, PyAny>>| o.filter(|o| !o.is_none()).cloned();
        let (bias, alibi_slopes) = (some(bias), some(alibi_slopes));
        if bias.is_some() && alibi_slopes.is_some() {
            return Err(PyValueError::new_err(
                "give `bias` or `alibi_slopes`, not both (add the ALiBi terms into the dense bias instead)",
            ));
        }
        let mask = match some(mask) {
            Some(m) => {
                if arrays::floats(&m, "mask").is_ok() {
                    return Err(PyTypeError::new_err(
                        "`mask` must be a bool array (True where a query may attend); pass an additive float mask as `bias`",
                    ));
                }
                let m = arrays::bools(&m, "mask", "True where a query may attend")?;
                let shape = as_4d(m.shape(), "mask")?;
                Some((m, shape))
            }
            None => None,
        };
        let bias = match bias {
            Some(b) => {
                let b = arrays::floats(&b, "bias")?;
                let shape = as_4d(b.shape(), "bias")?;
                Some((b, shape))
            }
            None => None,
        };
        let key_padding = match some(key_padding) {
            Some(p) => Some(arrays::bools(
                &p,
                "key_padding",
                "True for real keys, False for padding",
            )?),
            None => None,
        };
        let alibi_slopes = match alibi_slopes {
            Some(s) => Some(arrays::floats(&s, "alibi_slopes")?),
            None => None,
        };
        let window = window.map(|w| w.at_least("window", 1)).transpose()?;
        let kernel = match kernel {
            "tiled" => Kernel::Tiled,
            "reference" => Kernel::Reference,
            other => {
                return Err(PyValueError::new_err(format!(
                    "`kernel` must be \"tiled\" or \"reference\", got {other:?}"
                )))
            }
        };
        Ok(Options {
            causal: causal(causal_arg)?,
            key_padding,
            mask,
            bias,
            alibi_slopes,
            window,
            scale: scale.map(|s| s as f32),
            kernel,
        })
    }

    fn spec(&self, want_weights: bool) -> PyResult<AttentionSpec<'_>> {
        if let Some(p) = &self.key_padding {
            if p.shape().len() != 2 {
                return Err(PyValueError::new_err(format!(
                    "shape mismatch for `key_padding`: expected [B, S], got {:?}",
                    p.shape()
                )));
            }
        }
        if let Some(s) = &self.alibi_slopes {
            if s.shape().len() != 1 {
                return Err(PyValueError::new_err(format!(
                    "shape mismatch for `alibi_slopes`: expected [H], got {:?}",
                    s.shape()
                )));
            }
        }
        let bias = match (&self.bias, &self.alibi_slopes) {
            (Some((b, shape)), _) => Some(Bias::Dense(Broadcast::new(b.data(), *shape))),
            (None, Some(s)) => Some(Bias::Alibi { slopes: s.data() }),
            (None, None) => None,
        };
        Ok(AttentionSpec {
            scale: self.scale,
            causal: self.causal,
            window: self.window,
            key_padding: self.key_padding.as_ref().map(|p| p.data()),
            mask: self
                .mask
                .as_ref()
                .map(|(m, shape)| Broadcast::new(m.data(), *shape)),
            bias,
            want_weights,
            kernel: self.kernel,
            ..Default::default()
        })
    }
}

/// Refuses outputs larger than the machine's free memory: `[B, T, H, Dv]` (which a
/// wide V can make far larger than the inputs), and `[B, H, T, S]` weights when asked.
fn check_output_memory(q: [usize; 4], k: [usize; 4], v: [usize; 4], weights: bool) -> PyResult<()> {
    let [b, t, h, _] = q;
    let product = |xs: &[usize]| xs.iter().try_fold(4usize, |acc, &x| acc.checked_mul(x));
    let out = product(&[b, t, h, v[3]]);
    let weights = if weights {
        product(&[b, h, t, k[1]])
    } else {
        Some(0)
    };
    let total = out.zip(weights).and_then(|(o, w)| o.checked_add(w));
    qkv::io::memory::check(total, "the attention output").or_py()
}

/// Scaled dot-product attention, ``softmax(Q·Kᵀ·scale + bias)·V``, over NumPy arrays.
///
/// Args:
///     q: float32 ``[B, T, H, D]`` (``[B, H, T, D]`` with ``layout="bhtd"``).
///     k: float32 ``[B, S, G, D]`` (``[B, G, S, D]``). ``G`` key/value heads serve the
///         ``H`` query heads: ``G = H`` is multi-head, ``G`` dividing ``H`` is
///         grouped-query attention, ``G = 1`` multi-query.
///     v: float32 ``[B, S, G, Dv]`` (``[B, G, S, Dv]``).
///     causal: ``None``; ``"top_left"`` (or ``True``): query ``i`` sees keys ``0..=i``,
///         as PyTorch's ``is_causal``; ``"bottom_right"``: the queries are the last
///         ``T`` of the ``S`` positions, as in cached decoding.
///     key_padding: bool ``[B, S]``, ``True`` for real keys, ``False`` for padding.
///     mask: bool ``[Bm, Hm, T, S]`` (leading axes may be left out or be 1), ``True``
///         where a query may attend, as SDPA's boolean ``attn_mask``.
///     bias: float32 ``[Bm, Hm, T, S]`` added to the scaled scores (SDPA's float
///         ``attn_mask``, T5's relative bias); ``-inf`` masks a key.
///     alibi_slopes: float32 ``[H]``: head ``h`` adds ``slopes[h]·(j − i)``, computed on
///         the fly (see :func:`alibi_slopes`).
///     window: sliding window ``w``: query position ``p`` sees key ``j`` only when
///         ``p − j < w`` (and, without ``causal``, ``j − p < w``).
///     scale: multiplies ``Q·Kᵀ``; ``None`` means ``1/√D``.
///     return_weights: also return the ``[B, H, T, S]`` softmax weights.
///     layout: ``"bthd"`` (qkv's) or ``"bhtd"`` (SDPA's); both are read without a
///         copy, and the output comes back in the same layout.
///     kernel: ``"tiled"`` (online softmax, never stores ``T×S``) or ``"reference"``
///         (the formula as written); both give the same numbers.
///
/// Returns:
///     ``(out, lse)``, or ``(out, lse, weights)`` with ``return_weights``: ``out`` is
///     float32 ``[B, T, H, Dv]`` (``[B, H, T, Dv]`` with ``"bhtd"``), ``lse`` is
///     ``[B, H, T]``, the log-sum-exp of each query's scores (``-inf`` where every key
///     is masked; that query's output is zeros, never NaN).
///
/// Raises:
///     TypeError: an argument is not a NumPy array of the right dtype.
///     ValueError: shapes that do not fit, NaN or infinity in the inputs, an invalid
///         option. The message names the argument.
///
/// The GIL is released while the kernel runs; the kernel uses qkv's thread pool
/// (:func:`set_num_threads`).
#[pyfunction]
#[pyo3(signature = (q, k, v, *, causal=None, key_padding=None, mask=None, bias=None, alibi_slopes=None, window=None, scale=None, return_weights=false, layout="bthd", kernel="tiled"))]
#[allow(clippy::too_many_arguments)]
pub fn attention<'py>(
    py: Python<'py>,
    q: &Bound<'py, PyAny>,
    k: &Bound<'py, PyAny>,
    v: &Bound<'py, PyAny>,
    causal: Option<&Bound<'py, PyAny>>,
    key_padding: Option<&Bound<'py, PyAny>>,
    mask: Option<&Bound<'py, PyAny>>,
    bias: Option<&Bound<'py, PyAny>>,
    alibi_slopes: Option<&Bound<'py, PyAny>>,
    window: Option<Int>,
    scale: Option<f64>,
    return_weights: bool,
    layout: &str,
    kernel: &str,
) -> PyResult<Bound<'py, PyTuple>> {
    let layout = Layout::parse(layout)?;
    let [q, k, v] = Heads::read_qkv([q, k, v], layout)?;
    let options = Options::read(
        causal,
        key_padding,
        mask,
        bias,
        alibi_slopes,
        window,
        scale,
        kernel,
    )?;
    let spec = options.spec(return_weights)?;
    check_output_memory(q.shape, k.shape, v.shape, return_weights)?;
    let (qv, kv, vv) = (q.view(), k.view(), v.view());
    let result = py
        .detach(|| attention_views(&qv, &kv, &vv, &spec))
        .or_py()?;
    let out = heads_out(py, result.out, layout)?;
    let lse_shape = result.lse.shape().to_vec();
    let lse = arrays::out(py, result.lse.into_data(), &lse_shape)?;
    match result.weights {
        Some(w) => {
            let shape = w.shape().to_vec();
            PyTuple::new(py, [out, lse, arrays::out(py, w.into_data(), &shape)?])
        }
        None => PyTuple::new(py, [out, lse]),
    }
}

/// Gradients of :func:`attention` with respect to ``q``, ``k``, ``v`` (and a dense
/// ``bias``), given the upstream gradient of its output.
///
/// Args:
///     q, k, v: the forward's inputs, in ``layout``.
///     out: the forward's output ``[B, T, H, Dv]`` (in ``layout``).
///     lse: the forward's ``[B, H, T]`` log-sum-exp.
///     d_out: ``dL/d out``, shaped as ``out``.
///     causal, key_padding, mask, bias, alibi_slopes, window, scale, layout, kernel:
///         exactly as given to the forward.
///     return_dbias: also return ``dL/d bias``, shaped as ``bias`` (summed over the
///         axes it broadcasts along); needs a dense ``bias``.
///
/// Returns:
///     ``(dq, dk, dv)`` or ``(dq, dk, dv, dbias)``, float32, shaped as ``q``, ``k``,
///     ``v`` (and ``bias``). Under grouped-query attention, ``dk`` and ``dv`` sum the
///     query heads that share each key/value head. No gradient flows through a masked
///     score; a fully masked query gives zero gradients, never NaN.
///
/// To check against PyTorch, wrap the pair in a ``torch.autograd.Function`` (the
/// README's Python section has the recipe) and compare with ``torch.autograd.grad``.
#[pyfunction]
#[pyo3(signature = (q, k, v, out, lse, d_out, *, causal=None, key_padding=None, mask=None, bias=None, alibi_slopes=None, window=None, scale=None, return_dbias=false, layout="bthd", kernel="tiled"))]
#[allow(clippy::too_many_arguments)]
pub fn attention_backward<'py>(
    py: Python<'py>,
    q: &Bound<'py, PyAny>,
    k: &Bound<'py, PyAny>,
    v: &Bound<'py, PyAny>,
    out: &Bound<'py, PyAny>,
    lse: &Bound<'py, PyAny>,
    d_out: &Bound<'py, PyAny>,
    causal: Option<&Bound<'py, PyAny>>,
    key_padding: Option<&Bound<'py, PyAny>>,
    mask: Option<&Bound<'py, PyAny>>,
    bias: Option<&Bound<'py, PyAny>>,
    alibi_slopes: Option<&Bound<'py, PyAny>>,
    window: Option<Int>,
    scale: Option<f64>,
    return_dbias: bool,
    layout: &str,
    kernel: &str,
) -> PyResult<Bound<'py, PyTuple>> {
    let layout = Layout::parse(layout)?;
    let [q, k, v] = Heads::read_qkv([q, k, v], layout)?;
    let (out, d_out) = (
        Heads::read(out, "out", layout)?,
        Heads::read(d_out, "d_out", layout)?,
    );
    let lse_in = arrays::floats(lse, "lse")?;
    let lse = Tensor::new(lse_in.shape(), lse_in.data().to_vec()).or_py()?;
    let options = Options::read(
        causal,
        key_padding,
        mask,
        bias,
        alibi_slopes,
        window,
        scale,
        kernel,
    )?;
    let spec = options.spec(false)?;
    let fwd = AttentionOutput {
        out: out.tensor().or_py()?,
        lse,
        weights: None,
    };
    let d_out = d_out.tensor().or_py()?;
    let (qv, kv, vv) = (q.view(), k.view(), v.view());
    let grads = py
        .detach(|| attention_backward_views(&qv, &kv, &vv, &fwd, &d_out, &spec, return_dbias))
        .or_py()?;
    let mut items = vec![
        heads_out(py, grads.dq, layout)?,
        heads_out(py, grads.dk, layout)?,
        heads_out(py, grads.dv, layout)?,
    ];
    if let Some(db) = grads.dbias {
        // shaped as the caller's bias, whose leading axes of 1 may have been left out
        let shape = options
            .bias
            .as_ref()
            .map_or_else(|| db.shape().to_vec(), |(b, _)| b.shape().to_vec());
        items.push(arrays::out(py, db.into_data(), &shape)?);
    }
    PyTuple::new(py, items)
}
