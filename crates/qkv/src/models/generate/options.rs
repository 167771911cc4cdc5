//! What a generation run is asked for: how each token is chosen (greedy or sampled),
//! how many, when a row stops, and the search settings (beams, banned and forced
//! tokens), with the checks that refuse settings no run can use.

use super::config::{GenerationConfig, Search};
use crate::error::{Error, Result};

/// How the next token is chosen from the logits.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Sampling {
    Greedy,
    /// Applied in Hugging Face's order: temperature, then top-k, then top-p (nucleus),
    /// then min-p.
    Sample {
        temperature: f32,
        top_k: Option<usize>,
        top_p: Option<f32>,
        min_p: Option<f32>,
        seed: u64,
    },
}

#[derive(Clone, Debug)]
pub struct GenerateOptions {
    pub max_new_tokens: usize,
    pub sampling: Sampling,
    /// Stop a row when it emits one of these (the model's EOS ids by default).
    pub eos: Vec<usize>,
    /// Beams (greedy scoring only), banned and forced tokens.
    pub search: Search,
}

impl GenerateOptions {
    /// `max_new_tokens` tokens chosen by `sampling`, stopping at `eos`: one beam,
    /// nothing banned or forced.
    pub fn new(max_new_tokens: usize, sampling: Sampling, eos: Vec<usize>) -> Self {
        GenerateOptions {
            max_new_tokens,
            sampling,
            eos,
            search: Search::default(),
        }
    }

    /// These options with a folder's beams, their scoring, and its banned and forced
    /// tokens.
    pub fn with_config(mut self, c: &GenerationConfig) -> Self {
        self.search = c.search.clone();
        self
    }

    /// Whether [`GenerateOptions::process`] can change anything: penalties, banned or
    /// forced tokens.
    pub(super) fn constrained(&self) -> bool {
        !self.search.bad_words.is_empty()
            || !self.search.forced_eos.is_empty()
            || !self.search.penalties.is_off()
    }

    /// Applies the penalties, then the banned and forced tokens (transformers' order of
    /// its processors) to one row of scores (logits or log-probabilities), for a row
    /// that has read `prefix` (prompt or decoder start) and then generated `tokens`.
    pub(crate) fn process(&self, scores: &mut [f32], prefix: &[usize], tokens: &[usize]) {
        self.search.penalties.apply(scores, prefix, tokens);
        for bad in &self.search.bad_words {
            if bad.len() == 1 && self.eos.contains(&bad[0]) {
                continue;
            }
            let (last, before) = bad.split_last().expect("bad words are non-empty");
            // does prefix ++ tokens end with `before`? (read backwards, not copied)
            let read = prefix.iter().chain(tokens);
            let ends = prefix.len() + tokens.len() >= before.len()
                && read.rev().zip(before.iter().rev()).all(|(a, b)| a == b);
            if ends {
                if let Some(s) = scores.get_mut(*last) {
                    *s = f32::NEG_INFINITY;
                }
            }
        }
        if !self.search.forced_eos.is_empty() && tokens.len() + 1 == self.max_new_tokens {
            scores.fill(f32::NEG_INFINITY);
            for &id in &self.search.forced_eos {
                if let Some(s) = scores.get_mut(id) {
                    *s = 0.0;
                }
            }
        }
    }
}

impl Sampling {
    fn validate(&self) -> Result<()> {
        if let Sampling::Sample {
            temperature,
            top_k,
            top_p,
            min_p,
            ..
        } = *self
        {
            if !(temperature.is_finite() && temperature > 0.0) {
                return Err(Error::invalid(
                    "temperature",
                    format!("must be > 0, got {temperature}"),
                ));
            }
            if top_k == Some(0) {
                return Err(Error::invalid("top_k", "must be at least 1"));
            }
            if let Some(p) = top_p {
                if !(p > 0.0 && p <= 1.0) {
                    return Err(Error::invalid(
                        "top_p",
                        format!("must be in (0, 1], got {p}"),
                    ));
                }
            }
            if let Some(p) = min_p.filter(|p| !(0.0..=1.0).contains(p)) {
                return Err(Error::invalid(
                    "min_p",
                    format!("must be in [0, 1], got {p}"),
                ));
            }
        }
        Ok(())
    }
}

/// Settings no run can use: bad sampling values, or beams with sampling.
pub(super) fn check(opts: &GenerateOptions) -> Result<()> {
    opts.sampling.validate()?;
    opts.search.penalties.check()?;
    if opts.search.num_beams == 0 {
        return Err(Error::invalid("num_beams", "must be at least 1"));
    }
    if opts.search.num_beams > 1 && opts.sampling != Sampling::Greedy {
        return Err(Error::invalid(
            "num_beams",
            "beam search scores greedily here; it cannot be combined with sampling",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn banned_sequences_and_forced_eos_follow_the_tokens_read() {
        let mut opts = GenerateOptions::new(3, Sampling::Greedy, vec![0]);
        // [4] always; [1, 2] bans 2 after 1; a lone EOS is never banned
        opts.search.bad_words = vec![vec![4], vec![1, 2], vec![0]];
        let run = |opts: &GenerateOptions, prefix: &[usize], tokens: &[usize]| {
            let mut s = vec![1.0; 6];
            opts.process(&mut s, prefix, tokens);
            s.iter().map(|x| x.is_finite()).collect::<Vec<_>>()
        };
        assert_eq!(run(&opts, &[5], &[]), [true, true, true, true, false, true]);
        // the banned pair spans the prompt and the generated tokens
        assert_eq!(
            run(&opts, &[1], &[]),
            [true, true, false, true, false, true]
        );
        assert_eq!(
            run(&opts, &[3], &[5, 1]),
            [true, true, false, true, false, true]
        );
        opts.search.forced_eos = vec![0];
        // the last of 3 new tokens: only EOS is left
        assert_eq!(
            run(&opts, &[3], &[5, 5]),
            [true, false, false, false, false, false]
        );
    }

    #[test]
    fn bad_sampling_settings_are_named() {
        let s = Sampling::Sample {
            temperature: 0.0,
            top_k: None,
            top_p: None,
            min_p: None,
            seed: 0,
        };
        assert!(s
            .validate()
            .unwrap_err()
            .to_string()
            .contains("temperature"));
    }
}
