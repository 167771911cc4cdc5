//! y (+)= x·Wᵀ for a weight in blocks: the form by the row count and the CPU (module
//! docs of [`super`]).

use super::activations::QuantizedX;
use super::panels::{self, Parts};
use super::tile::{self, Kernel as Loops, Tile};
use super::weight::BlockWeight;
use crate::error::Result;
use crate::ops::Par;
use crate::weights::stored::{
    self, sweep_panels, widened_product, Form, Kernel, Start, StoredWeight, TileAt, TileSums, PANEL,
};

/// Most rows that take the plain tiles: beyond them, the f32 product's tiles reuse
/// each dequantized slab over many rows.
const FEW_ROWS: usize = 4;

/// y `[rows, N]` ← start + deq(q(x))·deq(W)ᵀ, row-major: x `[rows, K]` quantized as
/// llama.cpp quantizes it for the weight's type ([`super::activations`]). Errors when
/// the lengths do not match the weight's shape.
pub fn product(
    y: &mut [f32],
    x: &[f32],
    rows: usize,
    w: &BlockWeight,
    start: Start,
    par: Par,
) -> Result<()> {
    stored::product(w, y, x, rows, start, par)
}

/// The kernel of the tiles' loops a form names.
fn loops(kernel: Kernel) -> Loops {
    match kernel {
        Kernel::Vnni => Loops::Vnni,
        Kernel::Avx2 => Loops::Avx2,
        _ => Loops::Plain,
    }
}

/// The forms: tiles of integer dot products by each kernel this CPU runs, and both
/// operands dequantized into the f32 product slab by slab (more rows where only the
/// plain loops run).
impl StoredWeight for BlockWeight {
    fn shape(&self) -> (usize, usize) {
        (self.n(), self.k())
    }

    fn element(&self, r: usize, c: usize) -> f32 {
        let (per, bytes) = (self.ty().weights(), Parts::of(self.ty()).bytes);
        let pb = &self.panel(r / PANEL)[(c / per) * bytes..][..bytes];
        panels::weight(self.ty(), pb, r % PANEL, c % per)
    }

    fn bytes(&self) -> usize {
        BlockWeight::bytes(self)
    }

    fn type_name(&self) -> &'static str {
        self.ty().name()
    }

    fn forms_here(&self) -> Vec<Form> {
        let mut forms: Vec<Form> = Loops::available()
            .iter()
            .map(|&k| Form::Tiles(k.kernel()))
            .collect();
        forms.push(Form::Widened);
        forms
    }

    fn form(&self, rows: usize) -> Form {
        match Loops::best() {
            Loops::Plain if rows > FEW_ROWS => Form::Widened,
            best => Form::Tiles(best.kernel()),
        }
    }

    fn run(
        &self,
        form: Form,
        y: &mut [f32],
        x: &[f32],
        rows: usize,
        start: Start,
        par: Par,
    ) -> Result<()> {
        let parallel = par == Par::Auto && rayon::current_num_threads() > 1;
        let xq = QuantizedX::new(x, rows, self.k(), self.ty(), parallel);
        match form {
            // one task a thread: a decoding step's products are too short to pay for more
            Form::Tiles(kernel) => {
                sweep_panels(y, rows, self.n(), start, 1, parallel, |at, sums| {
                    tile(loops(kernel), &xq, at, self, sums)
                })
            }
            _ => widened_product(y, &xq.dequantized(), rows, self, start, par)?,
        }
        Ok(())
    }
}

/// The sums of one tile of the sweep into `sums[r][c]`, the panels' columns c.
fn tile(kernel: Loops, xq: &QuantizedX, at: TileAt, w: &BlockWeight, sums: &mut TileSums) {
    // missing panels repeat the last live one; their sums are dropped
    let panel = |i: usize| at.j + i.min(at.panels - 1);
    macro_rules! call {
        ($r:literal, $np:literal) => {{
            let t = Tile::<$r, $np> {
                ty: w.ty(),
                x: std::array::from_fn(|i| xq.row(at.r0 + i)),
                panels: std::array::from_fn(|i| w.panel(panel(i))),
            };
            let mut out = [[[0.0f32; PANEL]; $np]; $r];
            tile::tile_on(kernel, &t, &mut out);
            for (dst, src) in sums.iter_mut().zip(&out) {
                for (np, cols) in src.iter().enumerate() {
                    dst[np * PANEL..][..PANEL].copy_from_slice(cols);
                }
            }
        }};
    }
    match (at.rows, at.width) {
        (1, 4) => call!(1, 4),
        (1, _) => call!(1, 2),
        (2, _) => call!(2, 2),
        (3, _) => call!(3, 2),
        _ => call!(4, 2),
    }
}

#[cfg(test)]
mod tests {
    use super::super::reference;
    use super::super::weight::tests::random;
    use super::super::BlockType;
    use super::*;
    use crate::rng::Rng;
    use crate::weights::stored::{checks, product_as};

    /// Every form equals the twin within f32 rounding of the sums over K, for every
    /// type: one row and a few (the dot products), more (widened), an odd count of
    /// Q4_0 blocks, a last task of fewer rows, each start.
    #[test]
    fn every_form_equals_the_twin() {
        let mut rng = Rng::new(7);
        for ty in BlockType::ALL {
            for (rows, blocks, n) in [(1, 3, 37), (2, 2, 20), (4, 1, 70), (9, 2, 33)] {
                let k = blocks * ty.weights() * if ty == BlockType::Q4_0 { 3 } else { 1 };
                let w = random(ty, n, k, rows as u64);
                let x = rng.normals(rows * k, 1.0);
                let y0 = rng.normals(rows * n, 1.0);
                let bias: Vec<f32> = (0..n).map(|c| c as f32 * 0.25 - 3.0).collect();
                for start in [Start::Zero, Start::Accumulate, Start::Bias(&bias)] {
                    let mut want = y0.clone();
                    if let Start::Bias(b) = start {
                        want.chunks_exact_mut(n)
                            .for_each(|row| row.copy_from_slice(b));
                    }
                    reference::product(&mut want, &x, rows, &w, !matches!(start, Start::Zero));
                    for f in w.forms_here() {
                        for par in [Par::Auto, Par::Single] {
                            let mut got = y0.clone();
                            product_as(f, &w, &mut got, &x, rows, start, par).unwrap();
                            let what = format!("{ty:?} {f:?} {rows}x{k}x{n} {start:?} {par:?}");
                            checks::assert_near(&what, &got, &want, k);
                        }
                    }
                }
            }
        }
    }

    /// The vector kernels give the plain loops' bits, for every type and every shape
    /// of tile the products take.
    #[test]
    fn vector_kernels_equal_the_plain_loops_to_the_bit() {
        fn check<const R: usize, const NP: usize>(ty: BlockType, w: &BlockWeight, xq: &QuantizedX) {
            let t = Tile::<R, NP> {
                ty,
                x: std::array::from_fn(|r| xq.row(r)),
                panels: std::array::from_fn(|j| w.panel(j + 1)),
            };
            let mut want = [[[0.0; PANEL]; NP]; R];
            tile::tile_on(Loops::Plain, &t, &mut want);
            assert!(want.iter().flatten().flatten().any(|&v| v != 0.0));
            for &kernel in Loops::available() {
                let mut got = [[[1.0; PANEL]; NP]; R];
                tile::tile_on(kernel, &t, &mut got);
                assert_eq!(got, want, "{ty:?} {kernel:?} {R}x{NP}");
            }
        }
        let mut rng = Rng::new(11);
        for ty in BlockType::ALL {
            let k = 2 * QK;
            let w = random(ty, 80, k, 2);
            let x = rng.normals(4 * k, 2.0);
            let xq = QuantizedX::new(&x, 4, k, ty, false);
            check::<1, 4>(ty, &w, &xq);
            check::<3, 2>(ty, &w, &xq);
            check::<4, 2>(ty, &w, &xq);
        }
    }

    const QK: usize = super::super::layout::QK_K;

    /// A NaN in x reaches y in every form.
    #[test]
    fn a_nan_in_x_reaches_y() {
        for ty in BlockType::ALL {
            let k = QK;
            let w = random(ty, 3, k, 1);
            let mut x = vec![0.5; k];
            x[40] = f32::NAN;
            for f in w.forms_here() {
                let mut y = vec![0.0; 3];
                product_as(f, &w, &mut y, &x, 1, Start::Zero, Par::Auto).unwrap();
                assert!(y.iter().all(|v| v.is_nan()), "{ty:?} {f:?}: {y:?}");
            }
        }
    }

    #[test]
    fn mismatched_lengths_are_errors() {
        let w = random(BlockType::Q4K, 2, QK, 1);
        let mut y = vec![0.0; 2];
        assert!(product(&mut y, &[1.0; 4], 1, &w, Start::Zero, Par::Auto).is_err());
        let err = product(&mut y, &[1.0; QK], 1, &w, Start::Bias(&[0.0; 3]), Par::Auto);
        assert!(err.unwrap_err().to_string().contains("bias"));
    }
}
