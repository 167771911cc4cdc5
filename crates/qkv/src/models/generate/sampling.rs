//! Choosing a token from a row of logits: the most likely one, or a seeded sample after
//! temperature, top-k, top-p and min-p, in Hugging Face's order.

use super::options::Sampling;
use crate::rng::Rng;

/// Picks one token from a row of logits.
pub(super) fn choose(logits: &[f32], sampling: Sampling, rng: &mut Rng) -> usize {
    if sampling == Sampling::Greedy {
        return crate::ops::argmax(logits);
    }
    let candidates = candidates(logits, sampling);
    let mut u = rng.uniform();
    for &(i, q) in &candidates {
        if u < q {
            return i;
        }
        u -= q;
    }
    candidates.last().expect("at least one candidate").0
}

/// The tokens sampling may pick from a row of logits, with their probabilities, best
/// first: softmax after temperature, then the top k, then the smallest prefix whose
/// mass reaches top-p, then those at least min-p times the likeliest one's
/// probability, renormalised after each cut (transformers' warpers, in its order).
/// Greedy leaves the likeliest token alone.
pub fn candidates(logits: &[f32], sampling: Sampling) -> Vec<(usize, f64)> {
    let Sampling::Sample {
        temperature,
        top_k,
        top_p,
        min_p,
        ..
    } = sampling
    else {
        return vec![(crate::ops::argmax(logits), 1.0)];
    };
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    order.truncate(top_k.unwrap_or(order.len()).max(1));
    let max = logits[order[0]] / temperature;
    let mut probs: Vec<f64> = order
        .iter()
        .map(|&i| ((logits[i] / temperature - max) as f64).exp())
        .collect();
    let mut keep = |probs: &mut Vec<f64>, n: usize| {
        order.truncate(n);
        probs.truncate(n);
        let total: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|q| *q /= total);
    };
    let all = probs.len();
    keep(&mut probs, all);
    if let Some(p) = top_p {
        // the smallest prefix whose mass reaches p (at least one token)
        let mut mass = 0.0;
        let n = probs
            .iter()
            .position(|&q| {
                mass += q;
                mass >= p as f64
            })
            .map_or(probs.len(), |i| i + 1);
        keep(&mut probs, n);
    }
    if let Some(m) = min_p {
        let floor = m as f64 * probs[0];
        let n = probs.iter().take_while(|&&q| q >= floor).count().max(1);
        keep(&mut probs, n);
    }
    order.into_iter().zip(probs).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_argmax_and_top_k_one_is_greedy() {
        let logits = [0.1, 2.0, -1.0, 1.9];
        let mut rng = Rng::new(1);
        assert_eq!(choose(&logits, Sampling::Greedy, &mut rng), 1);
        let k1 = Sampling::Sample {
            temperature: 5.0,
            top_k: Some(1),
            top_p: None,
            min_p: None,
            seed: 0,
        };
        assert!((0..50).all(|_| choose(&logits, k1, &mut rng) == 1));
    }

    #[test]
    fn top_p_keeps_only_the_nucleus() {
        // softmax ≈ [0.64, 0.24, 0.09, 0.03]: p = 0.7 keeps the first two.
        let logits = [3.0, 2.0, 1.0, 0.0];
        let s = Sampling::Sample {
            temperature: 1.0,
            top_k: None,
            top_p: Some(0.7),
            min_p: None,
            seed: 0,
        };
        let mut rng = Rng::new(3);
        let picks: Vec<usize> = (0..400).map(|_| choose(&logits, s, &mut rng)).collect();
        assert!(picks.iter().all(|&i| i < 2));
        assert!(picks.contains(&0) && picks.contains(&1));
    }
}
