//! Fixed sinusoidal encodings ("Attention Is All You Need"):
//! PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)).
//! Each frequency pair rotates with pos, so PE(pos + k) is a fixed linear map of
//! PE(pos) (see [`shift_matrix`]): relative offsets are linearly reachable.
//!
//! Training: the table is fixed, so there is no parameter and no backward: the forward
//! adds a constant, and the gradient of the embeddings flows through the addition
//! unchanged.

use crate::tensor::Tensor;

/// Where the sines and cosines go within the d-wide vector.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SinusoidalLayout {
    /// sin, cos, sin, cos, …: the paper's formula.
    Interleaved,
    /// all sines, then all cosines: Marian / fairseq (first ⌈d/2⌉ columns are sines).
    Split,
}

fn angle(pos: usize, pair: usize, dim: usize) -> f64 {
    pos as f64 / 10000f64.powf(2.0 * pair as f64 / dim as f64)
}

/// Column `c` of the `dim`-wide encoding of position `pos`, computed in f64 and
/// rounded once to f32.
pub fn sinusoidal_value(pos: usize, c: usize, dim: usize, layout: SinusoidalLayout) -> f32 {
    let n_sin = dim.div_ceil(2);
    let v = match layout {
        SinusoidalLayout::Interleaved if c.is_multiple_of(2) => angle(pos, c / 2, dim).sin(),
        SinusoidalLayout::Interleaved => angle(pos, c / 2, dim).cos(),
        SinusoidalLayout::Split if c < n_sin => angle(pos, c, dim).sin(),
        SinusoidalLayout::Split => angle(pos, c - n_sin, dim).cos(),
    };
    v as f32
}

/// Table `[n_positions, dim]` of [`sinusoidal_value`]s.
pub fn sinusoidal_table(n_positions: usize, dim: usize, layout: SinusoidalLayout) -> Tensor {
    Tensor::from_fn(&[n_positions, dim], |idx| {
        sinusoidal_value(idx / dim, idx % dim, dim, layout)
    })
}

/// The `[dim, dim]` matrix M_k with PE(pos + k) = M_k · PE(pos) for every pos, in the
/// interleaved layout (dim even): a block-diagonal of 2×2 rotations by k·ω_i.
pub fn shift_matrix(k: usize, dim: usize) -> Tensor {
    let mut m = Tensor::zeros(&[dim, dim]);
    for i in 0..dim / 2 {
        let (s, c) = angle(k, i, dim).sin_cos();
        let (a, b) = (2 * i, 2 * i + 1);
        // sin(x + y) = sin x cos y + cos x sin y;  cos(x + y) = cos x cos y − sin x sin y
        let data = m.data_mut();
        data[a * dim + a] = c as f32;
        data[a * dim + b] = s as f32;
        data[b * dim + a] = -s as f32;
        data[b * dim + b] = c as f32;
    }
    m
}
