//! Scores pushed down for what a sequence has already said, and a caller's fixed biases:
//! transformers' repetition penalty, OpenAI's presence and frequency penalties and its
//! `logit_bias`. They change a row of scores (logits, or log-probabilities in beam
//! search) before any token is chosen, as transformers' logits processors do.

use std::collections::HashMap;

use crate::error::{Error, Result};

/// The penalties and biases of one request; the default changes nothing.
#[derive(Clone, Debug, PartialEq)]
pub struct Penalties {
    /// transformers' `repetition_penalty` (CTRL's): the score of every token the
    /// sequence has read or written (prompt and new tokens, each once) is divided by it
    /// when positive and multiplied by it when negative. 1: off.
    pub repetition: f32,
    /// OpenAI's `presence_penalty`: subtracted once from the score of each token the
    /// sequence has generated (the prompt does not count, as in vLLM).
    pub presence: f32,
    /// OpenAI's `frequency_penalty`: subtracted for each time a token has been generated.
    pub frequency: f32,
    /// OpenAI's `logit_bias`: added to a token's score (−100 all but bans it, 100 all
    /// but forces it), in token order.
    pub bias: Vec<(usize, f32)>,
}

impl Default for Penalties {
    fn default() -> Self {
        Penalties {
            repetition: 1.0,
            presence: 0.0,
            frequency: 0.0,
            bias: Vec::new(),
        }
    }
}

impl Penalties {
    /// Whether [`Penalties::apply`] changes nothing.
    pub fn is_off(&self) -> bool {
        self.repetition == 1.0
            && self.presence == 0.0
            && self.frequency == 0.0
            && self.bias.is_empty()
    }

    /// Refuses values no run can use, naming the setting: a repetition penalty must be
    /// positive (transformers' rule), every value finite.
    pub fn check(&self) -> Result<()> {
        if !(self.repetition.is_finite() && self.repetition > 0.0) {
            return Err(Error::invalid(
                "repetition_penalty",
                format!("must be a positive number, got {}", self.repetition),
            ));
        }
        for (name, v) in [
            ("presence_penalty", self.presence),
            ("frequency_penalty", self.frequency),
        ] {
            if !v.is_finite() {
                return Err(Error::invalid(name, format!("must be finite, got {v}")));
            }
        }
        if let Some((id, b)) = self.bias.iter().find(|(_, b)| !b.is_finite()) {
            return Err(Error::invalid(
                "logit_bias",
                format!("token {id}'s bias must be finite, got {b}"),
            ));
        }
        Ok(())
    }

    /// The largest token id a bias names, for the caller's check against the vocabulary.
    pub fn largest_id(&self) -> Option<usize> {
        self.bias.iter().map(|&(id, _)| id).max()
    }

    /// Applies the penalties to one row of `scores` `[V]` for a sequence that has read
    /// `prefix` and generated `tokens`.
    pub fn apply(&self, scores: &mut [f32], prefix: &[usize], tokens: &[usize]) {
        if self.repetition != 1.0 {
            let mut seen = vec![false; scores.len()];
            for &t in prefix.iter().chain(tokens) {
                if let Some(s) = scores.get_mut(t).filter(|_| !seen[t]) {
                    seen[t] = true;
                    *s = match *s < 0.0 {
                        true => *s * self.repetition,
                        false => *s / self.repetition,
                    };
                }
            }
        }
        if self.presence != 0.0 || self.frequency != 0.0 {
            let mut counts: HashMap<usize, usize> = HashMap::new();
            for &t in tokens {
                *counts.entry(t).or_default() += 1;
            }
            for (t, c) in counts {
                if let Some(s) = scores.get_mut(t) {
                    *s -= self.presence + self.frequency * c as f32;
                }
            }
        }
        for &(t, b) in &self.bias {
            if let Some(s) = scores.get_mut(t) {
                *s += b;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presence_and_frequency_follow_openais_formula_over_the_new_tokens() {
        // OpenAI's documented rule: mu[j] − c[j]·frequency − [c[j] > 0]·presence, with
        // c[j] the times token j was generated; the prompt's tokens are not counted
        let p = Penalties {
            presence: 0.5,
            frequency: 0.25,
            ..Penalties::default()
        };
        let mut s = vec![1.0; 5];
        p.apply(&mut s, &[4, 4], &[1, 2, 1, 1]);
        assert_eq!(s, [1.0, 1.0 - 0.5 - 0.75, 1.0 - 0.5 - 0.25, 1.0, 1.0]);
    }

    #[test]
    fn bad_values_are_named() {
        let zero = Penalties {
            repetition: 0.0,
            ..Penalties::default()
        };
        assert!(zero
            .check()
            .unwrap_err()
            .to_string()
            .contains("repetition_penalty"));
        let nan = Penalties {
            bias: vec![(3, f32::NAN)],
            ..Penalties::default()
        };
        assert!(nan.check().unwrap_err().to_string().contains("token 3"));
    }
}
