//! The two products of a linear layer's backward in bf16, for mixed-precision training
//! (`y = α·x·Wᵀ`, x `[N, in]`, W `[out, in]`, dy `[N, out]`):
//!
//! - dx = α·dy·W: the product of dy's rows with the weight Wᵀ `[in, out]`;
//! - dW += α·dyᵀ·x: the product of dyᵀ's rows `[out, N]` with the weight xᵀ `[in, N]`.
//!
//! Both run through [`product`], so every form the forward takes (AMX, `vdpbf16ps`, the
//! widened f32 product) serves the backward too, and its twin holds both: each operand
//! rounded to bf16, products and sums in f32. α is applied to dy before it is rounded.
//! The transposed copies cost O(N·(in + out)) and O(in·out) moves against the product's
//! O(N·in·out) multiply-adds.

use super::weight::{Bf16Weight, PANEL};
use crate::error::{Error, Result};
use crate::ops::Par;
use crate::weights::stored::product;
use crate::weights::stored::Start;
use rayon::prelude::*;

/// dx `[rows, in]` ← (accumulate ? dx : 0) + bf16(α·dy)·W for dy `[rows, out]`, where
/// `wt` is Wᵀ in bf16 ([`Bf16Weight::transposed`] of W `[out, in]`): `[in, out]`.
pub fn input_grad(
    dx: &mut [f32],
    dy: &[f32],
    rows: usize,
    wt: &Bf16Weight,
    alpha: f32,
    accumulate: bool,
    par: Par,
) -> Result<()> {
    if alpha == 1.0 {
        return product(wt, dx, dy, rows, Start::adding(accumulate), par);
    }
    let scaled: Vec<f32> = dy.iter().map(|&v| alpha * v).collect();
    product(wt, dx, &scaled, rows, Start::adding(accumulate), par)
}

/// dW `[out, in]` += bf16(α·dy)ᵀ·bf16(x) for x `[rows, in]` and dy `[rows, out]`, sums
/// in f32. No rows add nothing.
pub fn weight_grad(
    dw: &mut [f32],
    dy: &[f32],
    x: &[f32],
    (rows, n_out, n_in): (usize, usize, usize),
    alpha: f32,
    par: Par,
) -> Result<()> {
    let sizes = [
        ("dW", dw.len(), n_out.checked_mul(n_in)),
        ("dy", dy.len(), rows.checked_mul(n_out)),
        ("x", x.len(), rows.checked_mul(n_in)),
    ];
    for (what, len, want) in sizes {
        if want != Some(len) {
            return Err(Error::shape(
                format!("bf16 weight gradient {what}"),
                format!("{rows} rows, {n_out} outputs and {n_in} inputs"),
                &[len],
            ));
        }
    }
    if rows == 0 || n_out == 0 || n_in == 0 {
        return Ok(());
    }
    let dyt = transposed_scaled(dy, rows, n_out, alpha);
    let xt = Bf16Weight::transposed(x, rows, n_in)?;
    product(&xt, dw, &dyt, n_out, Start::Accumulate, par)
}

/// α·aᵀ `[cols, rows]` for a row-major `[rows, cols]` a. Each task writes a block of
/// [`PANEL`] output rows, in tiles of [`PANEL`] × [`PANEL`], so that reads and writes
/// are both 64-byte runs: a plain loop over a's rows wrote each value to another page
/// (a stride of `rows` floats) and took a sixth of a mixed-precision training step.
/// On AVX-512 a whole tile is transposed in registers; a tile cut by a's edges (and
/// every tile elsewhere) goes through a local copy.
fn transposed_scaled(a: &[f32], rows: usize, cols: usize, alpha: f32) -> Vec<f32> {
    let mut t = vec![0.0f32; cols * rows];
    let wide = crate::ops::isa::Isa::detect() == crate::ops::isa::Isa::Avx512;
    t.par_chunks_mut(PANEL * rows)
        .enumerate()
        .for_each(|(block, out)| {
            let (c0, width) = (block * PANEL, out.len() / rows);
            let mut tile = [[0.0f32; PANEL]; PANEL];
            for r0 in (0..rows).step_by(PANEL) {
                let height = PANEL.min(rows - r0);
                #[cfg(target_arch = "x86_64")]
                if wide && width == PANEL && height == PANEL {
                    // SAFETY: AVX-512 (Isa::detect); 16 rows of a from (r0, c0) and 16
                    // output rows from r0 lie inside `a` and `out`.
                    unsafe {
                        x86::transpose_tile(
                            a[r0 * cols + c0..].as_ptr(),
                            cols,
                            out[r0..].as_mut_ptr(),
                            rows,
                            alpha,
                        )
                    };
                    continue;
                }
                for (i, line) in tile.iter_mut().enumerate().take(height) {
                    let src = &a[(r0 + i) * cols + c0..][..width];
                    line.iter_mut().zip(src).for_each(|(t, &v)| *t = alpha * v);
                }
                for (c, run) in out.chunks_exact_mut(rows).enumerate() {
                    for (i, v) in run[r0..][..height].iter_mut().enumerate() {
                        *v = tile[i][c];
                    }
                }
            }
        });
    t
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Writes α·(a 16×16 tile)ᵀ: row j of `dst` (at `dst + j·dst_stride`) gets column
    /// j of the 16 rows at `src + i·src_stride`. Rows of pairs are interleaved
    /// (`unpack`), then groups of four (`shuffle_ps`), then the 128-bit lanes are
    /// transposed as a 4×4 matrix (`shuffle_f32x4`, twice).
    ///
    /// # Safety
    /// AVX-512 F; 16 rows of 16 floats readable at `src` and writable at `dst` with
    /// those strides.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn transpose_tile(
        src: *const f32,
        src_stride: usize,
        dst: *mut f32,
        dst_stride: usize,
        alpha: f32,
    ) {
        let alpha = _mm512_set1_ps(alpha);
        let r: [__m512; 16] =
            std::array::from_fn(|i| _mm512_mul_ps(alpha, _mm512_loadu_ps(src.add(i * src_stride))));
        // t[2k], t[2k+1], lane L: rows 2k, 2k+1 at columns 4L, 4L+1 / 4L+2, 4L+3
        let t: [__m512; 16] = std::array::from_fn(|i| {
            let (a, b) = (r[i & !1], r[i | 1]);
            match i % 2 {
                0 => _mm512_unpacklo_ps(a, b),
                _ => _mm512_unpackhi_ps(a, b),
            }
        });
        // u[4m + c], lane L: rows 4m..4m+3 of column 4L + c
        let u: [__m512; 16] = std::array::from_fn(|i| {
            let (m, c) = (i / 4, i % 4);
            let (a, b) = (t[4 * m + c / 2], t[4 * m + 2 + c / 2]);
            match c % 2 {
                0 => _mm512_shuffle_ps::<0x44>(a, b),
                _ => _mm512_shuffle_ps::<0xEE>(a, b),
            }
        });
        // column 4L + c is lane L of u[c], u[4 + c], u[8 + c] and u[12 + c]
        for c in 0..4 {
            let v0 = _mm512_shuffle_f32x4::<0x88>(u[c], u[4 + c]);
            let v1 = _mm512_shuffle_f32x4::<0xDD>(u[c], u[4 + c]);
            let v2 = _mm512_shuffle_f32x4::<0x88>(u[8 + c], u[12 + c]);
            let v3 = _mm512_shuffle_f32x4::<0xDD>(u[8 + c], u[12 + c]);
            let row = |j: usize| dst.add(j * dst_stride);
            _mm512_storeu_ps(row(c), _mm512_shuffle_f32x4::<0x88>(v0, v2));
            _mm512_storeu_ps(row(4 + c), _mm512_shuffle_f32x4::<0x88>(v1, v3));
            _mm512_storeu_ps(row(8 + c), _mm512_shuffle_f32x4::<0xDD>(v0, v2));
            _mm512_storeu_ps(row(12 + c), _mm512_shuffle_f32x4::<0xDD>(v1, v3));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::convert::round_to_bf16;
    use super::*;
    use crate::rng::Rng;

    /// The sum of products of rounded operands, in f64: what both functions compute up
    /// to the order of their f32 sums.
    fn dot(a: impl Iterator<Item = f32>, b: impl Iterator<Item = f32>) -> f64 {
        a.zip(b)
            .map(|(p, q)| round_to_bf16(p) as f64 * round_to_bf16(q) as f64)
            .sum()
    }

    fn assert_close(what: &str, got: &[f32], want: &[f64], k: usize) {
        let scale = want.iter().fold(1.0f64, |m, v| m.max(v.abs()));
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            // f32 sums of k terms, in any order
            let tol = 4.0 * k as f64 * f32::EPSILON as f64 * scale;
            assert!((g as f64 - w).abs() <= tol, "{what}[{i}]: {g} against {w}");
        }
    }

    /// Both gradients equal the products of the rounded operands, for row counts on
    /// both sides of the few-rows form, odd sizes and a scale α.
    #[test]
    fn gradients_are_the_rounded_operands_products() {
        let mut rng = Rng::new(11);
        for (rows, n_out, n_in) in [(1, 5, 3), (3, 17, 9), (37, 33, 20), (70, 16, 41)] {
            let alpha = 0.5f32;
            let x = rng.normals(rows * n_in, 1.0);
            let w = rng.normals(n_out * n_in, 1.0);
            let dy = rng.normals(rows * n_out, 1.0);
            let what = format!("{rows}x{n_out}x{n_in}");

            let wt = Bf16Weight::transposed(&w, n_out, n_in).unwrap();
            let start = rng.normals(rows * n_in, 1.0);
            let mut dx = start.clone();
            input_grad(&mut dx, &dy, rows, &wt, alpha, true, Par::Auto).unwrap();
            let want: Vec<f64> = (0..rows * n_in)
                .map(|i| {
                    let (r, c) = (i / n_in, i % n_in);
                    let col = (0..n_out).map(|o| w[o * n_in + c]);
                    let row = dy[r * n_out..][..n_out].iter().map(|&v| alpha * v);
                    start[i] as f64 + dot(row, col)
                })
                .collect();
            assert_close(&format!("dx {what}"), &dx, &want, n_out);

            let start = rng.normals(n_out * n_in, 1.0);
            let mut dw = start.clone();
            weight_grad(&mut dw, &dy, &x, (rows, n_out, n_in), alpha, Par::Auto).unwrap();
            let want: Vec<f64> = (0..n_out * n_in)
                .map(|i| {
                    let (o, c) = (i / n_in, i % n_in);
                    let dys = (0..rows).map(|r| alpha * dy[r * n_out + o]);
                    let xs = (0..rows).map(|r| x[r * n_in + c]);
                    start[i] as f64 + dot(dys, xs)
                })
                .collect();
            assert_close(&format!("dW {what}"), &dw, &want, rows);
        }
    }

    #[test]
    fn transposed_scaled_is_the_scaled_transpose_for_whole_and_ragged_tiles() {
        // 37 rows and 21 columns: two whole tiles (in registers on AVX-512) and partial
        // ones on both sides
        let (rows, cols) = (37, 21);
        let a: Vec<f32> = (0..rows * cols).map(|i| i as f32).collect();
        let t = transposed_scaled(&a, rows, cols, -2.0);
        for (i, &v) in t.iter().enumerate() {
            let (c, r) = (i / rows, i % rows);
            assert_eq!(v, -2.0 * a[r * cols + c], "({c}, {r})");
        }
    }

    #[test]
    fn mismatched_lengths_are_errors_naming_the_operand() {
        let mut dw = vec![0.0; 5];
        let err = weight_grad(&mut dw, &[0.0; 4], &[0.0; 6], (2, 2, 3), 1.0, Par::Auto)
            .unwrap_err()
            .to_string();
        assert!(err.contains("dW"), "{err}");
        let mut dw = vec![0.0; 6];
        let err = weight_grad(&mut dw, &[0.0; 6], &[0.0; 5], (2, 3, 2), 1.0, Par::Auto)
            .unwrap_err()
            .to_string();
        assert!(err.contains(" x"), "{err}");
    }
}
