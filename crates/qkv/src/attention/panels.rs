//! K and V copied into the layouts the micro-kernels read, once per attention call:
//! keys in panels of 16 (`[D][16]` each, see [`pack_panels`]) and values as contiguous
//! rows. Each (batch, key head) is packed by the first task that asks for it, inside
//! the kernel's one parallel loop, and then read by every query block and every query
//! head of its GQA group. Packing up front took two more fork-joins of the thread pool
//! per call, which at N = 128 cost more than the packing itself.

use std::sync::OnceLock;

use super::micro::PANEL;
use super::view::HeadsView;
use crate::ops::aligned::AlignedBuf;
use crate::ops::matmul::pack_panels;
use crate::ops::MatRef;

/// One packed copy per (batch, key head) of a `[B, S, G, E]` view, made on first use.
struct PerHead<'a> {
    src: HeadsView<'a>,
    packed: Vec<OnceLock<AlignedBuf>>,
}

impl<'a> PerHead<'a> {
    fn new(src: &HeadsView<'a>) -> Self {
        let [b_n, _, g_n, _] = src.shape();
        PerHead {
            src: *src,
            packed: (0..b_n * g_n).map(|_| OnceLock::new()).collect(),
        }
    }

    /// The copy of (b, g): `len` floats that `fill` writes, the first time it is asked for.
    fn get(&self, b: usize, g: usize, len: usize, fill: impl FnOnce(&mut [f32])) -> &[f32] {
        let g_n = self.src.shape()[2];
        self.packed[b * g_n + g].get_or_init(|| {
            let mut out = AlignedBuf::zeros(len);
            fill(&mut out);
            out
        })
    }
}

/// Every (batch, key head)'s keys (or values) in panels of [`PANEL`].
pub(crate) struct Panels<'a>(PerHead<'a>);

impl<'a> Panels<'a> {
    pub(crate) fn new(k: &HeadsView<'a>) -> Self {
        Panels(PerHead::new(k))
    }

    /// The panels from key j0 (a multiple of [`PANEL`]) on, of batch b and key head g.
    pub(crate) fn from(&self, b: usize, g: usize, j0: usize) -> &[f32] {
        debug_assert!(j0.is_multiple_of(PANEL));
        let src = &self.0.src;
        let [_, s, _, d] = src.shape();
        let panels = self.0.get(b, g, s.div_ceil(PANEL) * PANEL * d, |out| {
            // Kᵀ of (b, g): [D, S], key c a column a position stride from the next
            let keys_t = MatRef {
                data: &src.data[src.offset(b, 0, g)..],
                rows: d,
                cols: s,
                row_stride: 1,
                col_stride: src.pos_stride,
            };
            pack_panels(&keys_t, out);
        });
        &panels[j0 * d..]
    }
}

/// Every (batch, key head)'s values as contiguous `[S, Dv]` rows. In place, value rows
/// lie G·Dv floats apart, and at common sizes (a multiple of 1 KiB) a block's 128 rows
/// fall into a handful of L1 sets, so P·V would reload them from L2 at every column
/// chunk; packed, consecutive rows use different sets.
pub(crate) struct Rows<'a>(PerHead<'a>);

impl<'a> Rows<'a> {
    pub(crate) fn new(v: &HeadsView<'a>) -> Self {
        Rows(PerHead::new(v))
    }

    /// The rows from value j0 on, of batch b and key head g.
    pub(crate) fn from(&self, b: usize, g: usize, j0: usize) -> &[f32] {
        let src = &self.0.src;
        let [_, s, _, dv] = src.shape();
        let rows = self.0.get(b, g, s * dv, |out| {
            for (j, row) in out.chunks_exact_mut(dv).enumerate() {
                row.copy_from_slice(src.vector(b, j, g));
            }
        });
        &rows[j0 * dv..]
    }
}
