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

/// tanh x: its odd Taylor series to x¹⁷ where |x| < 0.55 (truncated there below 3e-9),
/// and 1 − 2 / (e^{2x} + 1) beyond, where that form keeps its absolute error below 3e-7
/// on a value of at least 0.5. Relative error below 1e-6 everywhere, so a soft cap
/// cap·tanh(s/cap) of small scores stays as exact as the scores themselves. Both forms
/// are computed and one is selected, which keeps slice loops vectorised.
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    let far = 1.0 - 2.0 / (exp(2.0 * x) + 1.0);
    let x2 = x * x;
    // coefficients of x³, x⁵, …, x¹⁷: −1/3, 2/15, −17/315, 62/2835, −1382/155925,
    // 21844/6081075, −929569/638512875, 6404582/10854718875
    let p = ((((((5.900_274e-4 * x2 - 1.455_834_4e-3) * x2 + 3.592_128e-3) * x2 - 8.863_236e-3)
        * x2
        + 2.186_949e-2)
        * x2
        - 5.396_825_4e-2)
        * x2
        + 1.333_333_4e-1)
        * x2
        - 3.333_333_4e-1;
    let near = x + x * x2 * p;
    if x.abs() < 0.55 {
        near
    } else {
        far
    }
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
    fn tanh_matches_std_in_relative_terms() {
        let worst = inputs()
            .chain((1..2000).map(|i| i as f32 * 1e-6))
            .filter(|&x| x != 0.0)
            .map(|x| {
                let want = (x as f64).tanh();
                ((tanh(x) as f64 - want) / want).abs()
            })
            .fold(0f64, f64::max);
        assert!(worst < 1e-6, "worst relative error {worst:e}");
        assert_eq!(tanh(0.0), 0.0);
        assert_eq!(tanh(f32::INFINITY), 1.0);
        assert_eq!(tanh(f32::NEG_INFINITY), -1.0);
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
