//! Loading a vector of f32 from B's or the keys' elements in either type: f32 as it is,
//! bf16 widened in the register it is loaded into.

use crate::ops::vector::Vector;

use super::super::operands::Element;

/// An [`Element`] as a vector loads it.
pub(super) trait Load: Element {
    /// `LANES` elements from `p` as f32.
    unsafe fn load<V: Vector>(p: *const Self) -> V;
}

impl Load for f32 {
    #[inline(always)]
    unsafe fn load<V: Vector>(p: *const f32) -> V {
        V::load(p)
    }
}

impl Load for u16 {
    #[inline(always)]
    unsafe fn load<V: Vector>(p: *const u16) -> V {
        V::load_bf16(p)
    }
}
