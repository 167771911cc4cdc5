//! The shape of the product's work: a micro-tile of [`MR`] rows × one or two [`NR`]
//! -column panels (by the CPU's vector width), and the slabs of K steps a product is
//! cut into. The kernel, the packing, the blocked loop and the packed weight all read
//! these; they depend on nothing but the instruction set.

use crate::ops::isa::Isa;

/// Rows of a micro-tile.
pub(super) const MR: usize = 6;
/// Columns of a micro-tile (two AVX2 vectors).
pub(super) const NR: usize = 16;
/// Most steps along K per slab, by the width of a tile. On AVX2 a model width of 384
/// (MiniLM, the training benchmark) fits one slab, so C is written once rather than
/// read back per slab; against 256, products ran 3–7% faster (ABBA-alternated `qkv
/// bench matmul`, Zen 3), and MiniLM batches 6%. An AVX-512 tile reads two B panels,
/// 48 KiB at 384 steps, which is all of L1 (48 KiB on the Xeon measured): 256 steps
/// ran 3–6% faster there.
fn kc_max() -> usize {
    if panels_per_tile() == 2 {
        256
    } else {
        384
    }
}
/// Most B panels one tile covers.
pub(super) const MAX_PANELS: usize = 2;

/// B panels a tile covers on this CPU: two 16-lane vectors on AVX-512, one panel (two
/// 8-lane vectors) otherwise.
pub(super) fn panels_per_tile() -> usize {
    panels_per_tile_on(Isa::detect())
}

pub(super) fn panels_per_tile_on(isa: Isa) -> usize {
    if isa == Isa::Avx512 {
        2
    } else {
        1
    }
}

/// How a product's K steps are cut into slabs: (count, steps of every slab but the
/// last). Slabs are made equal so none is tiny; the cut depends on K alone, so a weight
/// packed once ([`PackedWeight`]) has the slabs every product against it uses.
pub(super) fn slabs(k: usize) -> (usize, usize) {
    let count = k.div_ceil(kc_max());
    (count, k.div_ceil(count))
}
