//! Test-only draws on top of the library's seeded [`Rng`]: permutations and layers.

use qkv::layers::Linear;
use qkv::rng::Rng;

pub trait RngExt {
    fn bernoulli(&mut self, p: f64) -> bool;
    /// A random permutation of 0..n (Fisher–Yates).
    fn permutation(&mut self, n: usize) -> Vec<usize>;
    /// A random permutation of 0..n that moves at least one element (n ≥ 2).
    fn nontrivial_permutation(&mut self, n: usize) -> Vec<usize>;
    /// A linear layer `in → out` with N(0, 1/in) weights, so outputs keep unit scale,
    /// and a small random bias.
    fn linear(&mut self, n_in: usize, n_out: usize) -> Linear;
}

impl RngExt for Rng {
    fn bernoulli(&mut self, p: f64) -> bool {
        self.uniform() < p
    }

    fn permutation(&mut self, n: usize) -> Vec<usize> {
        let mut p: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            p.swap(i, self.below(i + 1));
        }
        p
    }

    fn nontrivial_permutation(&mut self, n: usize) -> Vec<usize> {
        assert!(n >= 2, "no non-identity permutation of {n} elements");
        loop {
            let p = self.permutation(n);
            if p.iter().enumerate().any(|(i, &j)| i != j) {
                return p;
            }
        }
    }

    fn linear(&mut self, n_in: usize, n_out: usize) -> Linear {
        let w = self.tensor(&[n_out, n_in], 1.0 / (n_in as f32).sqrt());
        let b = self.tensor(&[n_out], 0.1);
        Linear::new(w, Some(b)).expect("valid linear shapes")
    }
}
