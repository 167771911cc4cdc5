//! `exp` and `tanh` in plain f32 arithmetic, without a libm call, so the loops that
//! apply them over slices (softmax tiles, GELU, SiLU) vectorise. Each has a readable
//! twin, the standard library's function, and the tests hold them together.

/// e^x (Cephes' `expf` scheme): x = n·ln 2 + r with |r| ≤ ln2/2, e^r by a degree-6
/// polynomial, 2ⁿ by writing the exponent bits. Relative error below 3e-7 over the
/// normal range; e^−∞ (and anything below −87.3) is exactly 0, so masked scores give
/// exactly zero weight; inputs above 88 saturate at e^88 ≈ 1.65e38.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split in two so n·LN2_HI is exact for the n that occur.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding 1.5·2²³ rounds to the nearest integer, which then sits in the low bits.
    const ROUND: f32 = 12_582_912.0;
    let xc = x.clamp(-87.3, 88.0);
    let t = xc * LOG2E + ROUND;
    let n = t - ROUND;
    let r = xc - n * LN2_HI - n * LN2_LO;
    let p = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
        + 1.666_666_5e-1)
        * r
        + 0.5;
    let e_r = p * (r * r) + r + 1.0;
    let n_int = t.to_bits() as i32 - ROUND.to_bits() as i32;
    let two_n = f32::from_bits(((n_int + 127) << 23) as u32);
    if x < -87.3 {
        0.0
    } else {
        e_r * two_n
    }
}

/// tanh x = 1 − 2 / (e^{2x} + 1). Absolute error below 3e-7 (relative accuracy is lost
/// only for |x| < 1e-3, where the result is tiny; callers such as GELU add it to 1).
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    1.0 - 2.0 / (exp(2.0 * x) + 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs() -> impl Iterator<Item = f32> {
        (-200_000..=200_000).map(|i| i as f32 * 4.4e-4)
    }

    #[test]
    fn exp_matches_std_to_a_few_ulp() {
        let mut worst = 0f64;
        // Below −87.3 the result is defined as 0 (checked below); above 88 it saturates.
        for x in inputs().filter(|x| (-87.0..=88.0).contains(x)) {
            let want = (x as f64).exp();
            let rel = ((exp(x) as f64 - want) / want).abs();
            worst = worst.max(rel);
        }
        assert!(worst < 3e-7, "worst relative error {worst:e}");
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(-100.0), 0.0);
        assert_eq!(exp(0.0), 1.0);
        assert!(exp(100.0).is_finite());
    }

    #[test]
    fn tanh_matches_std_in_absolute_terms() {
        let worst = inputs()
            .map(|x| (tanh(x) as f64 - (x as f64).tanh()).abs())
            .fold(0f64, f64::max);
        assert!(worst < 3e-7, "worst absolute error {worst:e}");
        assert_eq!(tanh(50.0), 1.0);
        assert_eq!(tanh(-50.0), -1.0);
    }
}
