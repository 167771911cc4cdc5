//! y (+)= x·Wᵀ for a weight in blocks: the form by the row count and the CPU (module
//! docs of [`super`]).

use super::activations::QuantizedX;
use super::panels::{self, Parts};
use super::tile::{self, Kernel as Loops, Tile};
use super::weight::BlockWeight;
use crate::error::Result;
use crate::ops::Par;
use crate::weights::stored::{
    sweep_panels, widened_product, At, Form, Kernel, Operands, StoredWeight, Sums, TileKernel,
    PANEL,
};

/// Most rows that take the plain tiles: beyond them, the f32 product's tiles reuse
/// each dequantized slab over many rows.
const FEW_ROWS: usize = 4;

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

    fn run(&self, form: Form, ops: Operands, par: Par) -> Result<()> {
        let parallel = par == Par::Auto && rayon::current_num_threads() > 1;
        let xq = QuantizedX::new(ops.x, ops.rows, self.k(), self.ty(), parallel);
        match form {
            // one task a thread: a decoding step's products are too short to pay for more
            Form::Tiles(kernel) => {
                let (kernel, w) = (loops(kernel), self);
                sweep_panels(&Tiles { kernel, xq: &xq, w }, ops, 1, parallel)
            }
            _ => widened_product(
                self,
                Operands {
                    x: &xq.dequantized(),
                    ..ops
                },
                par,
            )?,
        }
        Ok(())
    }
}

/// The tiles of one product: x's rows quantized, the weight's panels, by one kernel.
struct Tiles<'a> {
    kernel: Loops,
    xq: &'a QuantizedX,
    w: &'a BlockWeight,
}

impl TileKernel for Tiles<'_> {
    fn sums<const R: usize, const NP: usize>(&self, at: At<NP>, out: &mut Sums<R, NP>) {
        let At { r0, panels } = at;
        let t = Tile::<R, NP> {
            ty: self.w.ty(),
            x: std::array::from_fn(|i| self.xq.row(r0 + i)),
            panels: panels.map(|j| self.w.panel(j)),
        };
        tile::tile_on(self.kernel, &t, out);
    }
}

#[cfg(test)]
mod tests {
    use super::super::reference;
    use super::super::weight::tests::random;
    use super::super::BlockType;
    use super::*;
    use crate::rng::Rng;
    use crate::weights::stored::{checks, product, Start};

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
                let bias = checks::bias(n);
                for start in [Start::Zero, Start::Accumulate, Start::Bias(&bias)] {
                    let want = checks::twin(&y0, n, start, |y, acc| {
                        reference::product(y, &x, rows, &w, acc)
                    });
                    for f in w.forms_here() {
                        for par in [Par::Auto, Par::Single] {
                            let got = checks::run_form(&w, f, (&x, &y0), rows, start, par);
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
                let y = checks::run_form(&w, f, (&x, &[0.0; 3]), 1, Start::Zero, Par::Auto);
                assert!(y.iter().all(|v| v.is_nan()), "{ty:?} {f:?}: {y:?}");
            }
        }
    }

    #[test]
    fn mismatched_lengths_are_errors() {
        let w = random(BlockType::Q4K, 2, QK, 1);
        let mut y = vec![0.0; 2];
        assert!(product(&w, &mut y, &[1.0; 4], 1, Start::Zero, Par::Auto).is_err());
        let err = product(&w, &mut y, &[1.0; QK], 1, Start::Bias(&[0.0; 3]), Par::Auto);
        assert!(err.unwrap_err().to_string().contains("bias"));
    }
}
