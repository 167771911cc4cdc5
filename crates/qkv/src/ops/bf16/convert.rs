//! f32 ↔ bf16. A bf16 is an f32's top 16 bits, so widening is a shift; narrowing
//! rounds the dropped 16 bits to nearest, ties to even, as PyTorch does (its
//! `round_to_nearest_even`), and keeps a NaN a (quiet) NaN.

/// The bf16 nearest to `x` (ties to the even one); NaN stays NaN.
pub fn f32_to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        // the sign and a quiet-NaN payload, as PyTorch writes it
        return ((bits >> 16) as u16) | 0x0040;
    }
    let rounding = 0x7fff + ((bits >> 16) & 1);
    (bits.wrapping_add(rounding) >> 16) as u16
}

/// The f32 that `b` is the top half of.
pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

/// `x` rounded to the nearest bf16 and widened back: what a bf16 copy of it holds.
pub fn round_to_bf16(x: f32) -> f32 {
    bf16_to_f32(f32_to_bf16(x))
}

/// Two bf16 in one 32-bit word, `low` in the low half: the pair layout of
/// [`super::Bf16Weight`] and of `vdpbf16ps`'s operands.
pub(crate) fn pair(low: f32, high: f32) -> u32 {
    u32::from(f32_to_bf16(low)) | (u32::from(f32_to_bf16(high)) << 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_to_nearest_even_and_keeps_specials() {
        // 1 + 2⁻⁸ lies halfway between 1 and 1 + 2⁻⁷: ties go to the even one (1)
        assert_eq!(f32_to_bf16(1.0 + 2f32.powi(-8)), 0x3f80);
        // 1 + 3·2⁻⁸ lies halfway between 1 + 2⁻⁷ and 1 + 2⁻⁶: even is 1 + 2⁻⁶
        assert_eq!(f32_to_bf16(1.0 + 3.0 * 2f32.powi(-8)), 0x3f82);
        // just above halfway rounds up
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8001)), 0x3f81);
        assert_eq!(f32_to_bf16(-2.0), 0xc000);
        assert_eq!(f32_to_bf16(f32::INFINITY), 0x7f80);
        assert_eq!(f32_to_bf16(f32::NEG_INFINITY), 0xff80);
        assert!(bf16_to_f32(f32_to_bf16(f32::NAN)).is_nan());
        // the largest f32 rounds to infinity, as in PyTorch
        assert_eq!(f32_to_bf16(f32::MAX), 0x7f80);
        assert_eq!(round_to_bf16(3.140625), 3.140625);
        assert_eq!(pair(1.0, -2.0), 0xc000_3f80);
    }
}
