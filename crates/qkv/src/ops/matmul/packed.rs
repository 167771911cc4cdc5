//! A weight packed once, in the order the micro-kernel reads B, so products against
//! it skip packing B at every call.
//!
//! A linear layer computes y = x·Wᵀ. The blocked path packs Wᵀ's panels at every call:
//! reading W and writing its packed copy costs about as much as the arithmetic when x
//! has a dozen rows (one sentence), and the packing work is repeated for every
//! sentence. Packed once at load, the panels are read straight from memory by the
//! kernel, and a dozen rows run at the kernel's speed rather than at packing speed.
//!
//! Layout: W `[N, K]` as B = Wᵀ `[K, N]`, cut into the same K slabs as
//! [`super::blocked`] uses (sizes depend on K alone) and, inside each slab, into
//! micro-panels of [`NR`] columns, each `[kc][NR]`; the last panel's missing columns
//! are zeros. Slab s starts at float `k0(s)·panels·NR`, its panel j at `j·kc·NR` after
//! that.

use super::pack;
use super::tile::{slabs, NR};
use super::view::MatRef;
use crate::error::{Error, Result};
use crate::ops::aligned::AlignedBuf;

/// Errors unless `len` values make a `[n, k]` weight with n, k ≥ 1 (`what` names it).
pub(crate) fn check_weight(what: &str, len: usize, n: usize, k: usize) -> Result<()> {
    if n == 0 || k == 0 || n.checked_mul(k) != Some(len) {
        return Err(Error::shape(
            what,
            format!("[{n}, {k}] with n, k ≥ 1, as its {len} values"),
            &[n, k],
        ));
    }
    Ok(())
}

/// Wᵀ of a `[N, K]` weight, in micro-panels (see the module documentation).
#[derive(Clone)]
pub struct PackedWeight {
    n: usize,
    k: usize,
    /// The panels, starting on a 64-byte line.
    data: AlignedBuf,
}

impl std::fmt::Debug for PackedWeight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PackedWeight {{ n: {}, k: {} }}", self.n, self.k)
    }
}

impl PackedWeight {
    /// Packs `w`, a row-major `[n, k]` weight (n, k ≥ 1) as a linear layer stores it.
    pub fn new(w: &[f32], n: usize, k: usize) -> Result<Self> {
        check_weight("packed weight", w.len(), n, k)?;
        let (count, kc_max) = slabs(k);
        let panels = n.div_ceil(NR);
        let mut data = AlignedBuf::zeros(k * panels * NR);
        let wt = MatRef::row_major(w, n, k).t();
        for s in 0..count {
            let k0 = s * kc_max;
            let kc = kc_max.min(k - k0);
            let slab = &mut data[k0 * panels * NR..][..kc * panels * NR];
            pack::pack_b(&wt, k0, kc, 0, n, slab);
        }
        Ok(PackedWeight { n, k, data })
    }

    /// Rows of the weight: columns of the product.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Columns of the weight: the product's inner dimension.
    pub fn k(&self) -> usize {
        self.k
    }

    /// The micro-panels `first..first + count` of the slab starting at step `k0` with
    /// `kc` steps: `count · kc · NR` floats.
    pub(super) fn panels(&self, k0: usize, kc: usize, first: usize, count: usize) -> &[f32] {
        let slab = k0 * self.n.div_ceil(NR) * NR;
        &self.data[slab + first * kc * NR..][..count * kc * NR]
    }
}
