//! Central finite differences, the independent check of every hand-written backward.
//!
//! The kernels compute in f32, so the check perturbs one f32 input at a time, runs
//! the real forward, and accumulates the probe loss L = Σ y ∘ r in f64. The step
//! actually taken is read back from the rounded f32 values, so the quotient
//! (L(x+h) − L(x−h)) / (x₊ − x₋) has truncation error O(h²) and rounding error of
//! about ε_f32·|L|/h; h ≈ 1e-2 balances the two for the O(1) values tests use.

/// The probe loss Σ y ∘ r in f64: its gradient with respect to y is exactly r, so the
/// upstream gradient of a backward under test is `r`.
pub fn probe_loss(y: &[f32], r: &[f32]) -> f64 {
    y.iter().zip(r).map(|(&a, &b)| a as f64 * b as f64).sum()
}

/// ∂f/∂x by central differences, one element at a time. `f` evaluates the scalar
/// loss for the current contents of `x`; `x` is restored afterwards.
pub fn numeric_grad(x: &mut [f32], h: f32, mut f: impl FnMut(&[f32]) -> f64) -> Vec<f64> {
    let mut g = Vec::with_capacity(x.len());
    for i in 0..x.len() {
        let orig = x[i];
        x[i] = orig + h;
        let (up, x_up) = (f(x), x[i]);
        x[i] = orig - h;
        let (down, x_down) = (f(x), x[i]);
        x[i] = orig;
        g.push((up - down) / (x_up as f64 - x_down as f64));
    }
    g
}

/// Checks |analytic − numeric| ≤ atol + rtol·|numeric| everywhere; the error names
/// the worst element.
pub fn compare(
    what: &str,
    analytic: &[f32],
    numeric: &[f64],
    atol: f64,
    rtol: f64,
) -> Result<(), String> {
    if analytic.len() != numeric.len() {
        return Err(format!(
            "{what}: {} analytic vs {} numeric values",
            analytic.len(),
            numeric.len()
        ));
    }
    let worst = analytic
        .iter()
        .zip(numeric)
        .enumerate()
        .map(|(i, (&a, &n))| (i, (a as f64 - n).abs() - (atol + rtol * n.abs())))
        .fold(None, |w: Option<(usize, f64)>, (i, e)| match w {
            Some((_, we)) if we >= e => w,
            _ => Some((i, e)),
        });
    match worst {
        Some((i, excess)) if excess > 0.0 || excess.is_nan() => Err(format!(
            "{what}: element {i}: analytic {} vs numeric {} (atol {atol:e}, rtol {rtol:e})",
            analytic[i], numeric[i]
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gradient_of_a_known_function() {
        // f(x) = Σ x³ → f' = 3x²
        let mut x = vec![0.5f32, -1.25, 2.0];
        let g = numeric_grad(&mut x, 1e-2, |x| {
            x.iter().map(|&v| (v as f64).powi(3)).sum()
        });
        let exact: Vec<f32> = x.iter().map(|v| 3.0 * v * v).collect();
        compare("x³", &exact, &g, 1e-3, 1e-3).unwrap();
        assert!(compare("wrong", &[0.0, 0.0, 0.0], &g, 1e-3, 1e-3).is_err());
    }
}
