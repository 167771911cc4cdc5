//! Position encodings: the sinusoidal table, RoPE (with the checkpoints' scalings),
//! ALiBi's slopes and T5's relative buckets, as NumPy arrays.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use qkv::position::rope_scaling::HfRopeConfig;
use qkv::position::{RopeLayout, SinusoidalLayout};
use qkv::Tensor;

use crate::arrays;
use crate::errors::OrPy;
use crate::ints::{self, Int};

/// Refuses an output of `elements` float32 values larger than free memory.
fn check_size(elements: Option<usize>, what: &str) -> PyResult<()> {
    qkv::io::memory::check(elements.and_then(|n| n.checked_mul(4)), what).or_py()
}

/// The fixed sinusoidal encodings of "Attention Is All You Need":
/// ``PE[pos, 2i] = sin(pos / 10000^(2i/dim))``, ``PE[pos, 2i+1] = cos(…)``.
///
/// Args:
///     n_positions: rows of the table.
///     dim: width of each encoding.
///     layout: ``"interleaved"`` (sin, cos, sin, cos, …: the paper) or ``"split"``
///         (all sines, then all cosines: Marian, fairseq).
///
/// Returns:
///     float32 ``[n_positions, dim]``, computed in float64 and rounded once.
#[pyfunction]
#[pyo3(signature = (n_positions, dim, *, layout="interleaved"))]
pub fn sinusoidal_table<'py>(
    py: Python<'py>,
    n_positions: Int,
    dim: Int,
    layout: &str,
) -> PyResult<Bound<'py, PyAny>> {
    let (n_positions, dim) = (n_positions.count("n_positions")?, dim.count("dim")?);
    let layout = match layout {
        "interleaved" => SinusoidalLayout::Interleaved,
        "split" => SinusoidalLayout::Split,
        other => {
            return Err(PyValueError::new_err(format!(
                "`layout` must be \"interleaved\" or \"split\", got {other:?}"
            )))
        }
    };
    check_size(n_positions.checked_mul(dim), "the sinusoidal table")?;
    let table = py.detach(|| qkv::position::sinusoidal_table(n_positions, dim, layout));
    Ok(arrays::out(py, table.into_data(), &[n_positions, dim])?.into_any())
}

/// ALiBi's slope per head, as BLOOM computes them: for ``n_heads`` a power of two the
/// geometric sequence ``2^(-8/n), 2^(-16/n), …``; otherwise those of the largest power
/// of two below, then every other slope of twice as many heads.
///
/// Returns:
///     float32 ``[n_heads]``, for :func:`attention`'s ``alibi_slopes``.
#[pyfunction]
pub fn alibi_slopes(py: Python<'_>, n_heads: Int) -> PyResult<Bound<'_, PyAny>> {
    let n_heads = n_heads.count("n_heads")?;
    check_size(Some(n_heads), "the ALiBi slopes")?;
    let slopes = qkv::position::alibi_slopes(n_heads);
    Ok(arrays::out(py, slopes, &[n_heads])?.into_any())
}

/// T5's bucket of each relative position ``key − query``, as transformers'
/// ``T5Attention._relative_position_bucket``: exact for small distances, logarithmic up
/// to ``max_distance``, one bucket beyond. Bidirectional buckets keep the sign; causal
/// ones only look back.
///
/// Args:
///     relative_position: an integer or an integer array of any shape.
///     bidirectional: ``True`` for the encoder, ``False`` for the decoder.
///     num_buckets: buckets in all (T5: 32).
///     max_distance: where the last bucket starts (T5: 128).
///
/// Returns:
///     int64 array shaped as ``relative_position``.
#[pyfunction]
#[pyo3(signature = (relative_position, *, bidirectional=true, num_buckets=Int::of(32), max_distance=Int::of(128)))]
#[pyo3(
    text_signature = "(relative_position, *, bidirectional=True, num_buckets=32, max_distance=128)"
)]
pub fn relative_position_bucket<'py>(
    py: Python<'py>,
    relative_position: &Bound<'py, PyAny>,
    bidirectional: bool,
    num_buckets: Int,
    max_distance: Int,
) -> PyResult<Bound<'py, PyAny>> {
    let num_buckets = num_buckets.count("num_buckets")?;
    let max_distance = max_distance.count("max_distance")?;
    // the exact range must be at least one bucket, and the logarithmic range must grow
    let exact = if bidirectional {
        num_buckets / 4
    } else {
        num_buckets / 2
    };
    if exact == 0 {
        return Err(PyValueError::new_err(format!(
            "invalid `num_buckets`: at least {} for {} buckets, got {num_buckets}",
            if bidirectional { 4 } else { 2 },
            if bidirectional {
                "bidirectional"
            } else {
                "causal"
            }
        )));
    }
    if max_distance <= exact {
        return Err(PyValueError::new_err(format!(
            "invalid `max_distance`: must exceed the {exact} exact buckets, got {max_distance}"
        )));
    }
    let (shape, values) = arrays::signed_ints(relative_position, "relative_position")?;
    let buckets: Vec<i64> = values
        .iter()
        .map(|&r| {
            qkv::position::relative_position_bucket(r, bidirectional, num_buckets, max_distance)
                as i64
        })
        .collect();
    let numpy = py.import("numpy")?;
    numpy
        .call_method1("array", (buckets,))?
        .call_method1("reshape", (shape,))
}

/// Rotary position embedding (RoPE): each pair of a query's or key's dimensions is
/// rotated by ``position · θ_i``, so that ``q·k`` depends only on the offset between
/// the two positions.
///
/// Args:
///     head_dim: width of one head.
///     base: θ (``rope_theta``; 10000 in most models).
///     layout: ``"half"`` (pairs ``(i, i + R/2)``: Llama, GPT-NeoX) or
///         ``"interleaved"`` (pairs ``(2i, 2i+1)``: GPT-J, RoFormer).
///     rotary_dim: rotate only the first ``rotary_dim`` dimensions (default: all).
///     scaling: a config's ``rope_scaling`` dict (``linear``, ``llama3``, ``yarn``,
///         ``dynamic``), resolved as transformers' ``rope_init_fn``.
///     max_positions: the config's ``max_position_embeddings``, which ``yarn`` and
///         ``dynamic`` need.
#[pyclass(module = "qkv", frozen)]
pub struct Rope {
    inner: qkv::position::Rope,
}

#[pymethods]
impl Rope {
    #[new]
    #[pyo3(signature = (head_dim, *, base=10000.0, layout="half", rotary_dim=None, scaling=None, max_positions=None))]
    fn new(
        py: Python<'_>,
        head_dim: Int,
        base: f64,
        layout: &str,
        rotary_dim: Option<Int>,
        scaling: Option<&Bound<'_, PyAny>>,
        max_positions: Option<Int>,
    ) -> PyResult<Self> {
        let head_dim = head_dim.count("head_dim")?;
        let rotary_dim = ints::count(rotary_dim, "rotary_dim")?;
        let max_positions = ints::count(max_positions, "max_positions")?;
        let layout = match layout {
            "half" => RopeLayout::HalfSplit,
            "interleaved" => RopeLayout::Interleaved,
            other => {
                return Err(PyValueError::new_err(format!(
                    "`layout` must be \"half\" or \"interleaved\", got {other:?}"
                )))
            }
        };
        let rotary_dim = rotary_dim.unwrap_or(head_dim);
        check_size(Some(rotary_dim / 2), "the RoPE frequencies")?;
        let mut inner =
            qkv::position::Rope::partial(head_dim, rotary_dim, base as f32, layout).or_py()?;
        if let Some(scaling) = scaling.filter(|s| !s.is_none()) {
            let json: String = py
                .import("json")?
                .call_method1("dumps", (scaling,))?
                .extract()?;
            let config: HfRopeConfig = serde_json::from_str(&json)
                .map_err(|e| PyValueError::new_err(format!("invalid `scaling`: {e}")))?;
            // a `rope_scaling` entry as transformers 4.x reads it
            let resolved = config.resolve(max_positions.unwrap_or(0), false).or_py()?;
            inner = inner.with_scaling(resolved).or_py()?;
        }
        Ok(Rope { inner })
    }

    /// float32 ``[rotary_dim / 2]``: θ_i after scaling.
    #[getter]
    fn inv_freq<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let f = self.inner.inv_freq().to_vec();
        let n = f.len();
        Ok(arrays::out(py, f, &[n])?.into_any())
    }

    /// ``(cos, sin)``, each float32 ``[N, rotary_dim / 2]``: the angles of each pair at
    /// each of the ``N`` positions (times YaRN's attention factor, where it applies).
    fn cos_sin<'py>(
        &self,
        py: Python<'py>,
        positions: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let (_, positions) = arrays::ints(positions, "positions")?;
        let half = self.inner.inv_freq().len();
        check_size(positions.len().checked_mul(2 * half), "the RoPE angles")?;
        let (mut cos, mut sin) = (Vec::new(), Vec::new());
        for &p in &positions {
            let (c, s) = self.inner.cos_sin(p);
            cos.extend(c);
            sin.extend(s);
        }
        let shape = [positions.len(), half];
        PyTuple::new(
            py,
            [arrays::out(py, cos, &shape)?, arrays::out(py, sin, &shape)?],
        )
    }

    /// ``x`` float32 ``[B, T, H, head_dim]`` rotated to its positions (a new array).
    ///
    /// Args:
    ///     positions: integers ``[B, T]`` or ``[T]`` (the same for every row);
    ///         default ``offset, offset + 1, …``.
    ///     offset: the first position when ``positions`` is not given.
    #[pyo3(signature = (x, positions=None, *, offset=Int::of(0)))]
    #[pyo3(text_signature = "($self, x, positions=None, *, offset=0)")]
    fn apply<'py>(
        &self,
        py: Python<'py>,
        x: &Bound<'py, PyAny>,
        positions: Option<&Bound<'py, PyAny>>,
        offset: Int,
    ) -> PyResult<Bound<'py, PyAny>> {
        let offset = offset.count("offset")?;
        let input = arrays::floats(x, "x")?;
        let mut t = Tensor::new(input.shape(), input.data().to_vec()).or_py()?;
        t.expect_shape("x", &[None, None, None, Some(self.inner.head_dim)])
            .or_py()?;
        let (b, len) = (t.shape()[0], t.shape()[1]);
        let positions = match positions.filter(|p| !p.is_none()) {
            None => (0..b * len)
                .map(|i| offset.checked_add(i % len.max(1)))
                .collect::<Option<Vec<usize>>>()
                .ok_or_else(|| PyValueError::new_err("invalid `offset`: positions overflow"))?,
            Some(p) => {
                let (shape, values) = arrays::ints(p, "positions")?;
                match shape.as_slice() {
                    [n] if *n == len => values.repeat(b),
                    [rows, n] if *rows == b && *n == len => values,
                    _ => {
                        return Err(PyValueError::new_err(format!(
                            "shape mismatch for `positions`: expected [{b}, {len}] or [{len}], got {shape:?}"
                        )))
                    }
                }
            }
        };
        let rope = &self.inner;
        py.detach(|| rope.apply(&mut t, &positions)).or_py()?;
        let shape = t.shape().to_vec();
        Ok(arrays::out(py, t.into_data(), &shape)?.into_any())
    }
}
