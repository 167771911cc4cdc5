//! A generation request as a caller states it (the CLI's flags, the Python keywords),
//! resolved against a model and its folder's [`GenerationConfig`] into
//! [`GenerateOptions`]. What the request leaves open comes from the folder, as
//! transformers' `generate()` takes it; the length is bounded by the model's positions
//! and the key/value cache by the machine's memory.

use super::config::{EarlyStopping, GenerationConfig};
use super::decode::no_head;
use super::options::{GenerateOptions, Sampling};
use crate::error::{Error, Result};
use crate::models::net::arch::ModelKind;
use crate::models::net::footprint;
use crate::models::transformer::Transformer;

/// What the caller asked for; `None` leaves a setting to the folder.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Request {
    pub max_new_tokens: Option<usize>,
    /// Always take the most likely token, whatever the folder says about sampling.
    pub greedy: bool,
    pub num_beams: Option<usize>,
    pub length_penalty: Option<f32>,
    pub early_stopping: Option<EarlyStopping>,
    /// Any of these four asks for sampling (temperature 1 when only top-k, top-p or
    /// min-p is set).
    pub temperature: Option<f32>,
    pub top_k: Option<usize>,
    pub top_p: Option<f32>,
    pub min_p: Option<f32>,
    /// Seed of the sampler.
    pub seed: u64,
    /// Over the folder's `repetition_penalty`.
    pub repetition_penalty: Option<f32>,
    /// OpenAI's penalties and biases (see [`super::Penalties`]).
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub logit_bias: Vec<(usize, f32)>,
}

/// A request made concrete for one model and one prompt.
#[derive(Clone, Debug)]
pub struct Plan {
    pub options: GenerateOptions,
    /// Set when the asked length went past the model's positions and was cut to what
    /// they allow (for the caller to warn about).
    pub clamped: Option<Clamp>,
}

/// A length cut to the model's positions.
#[derive(Clone, Debug, PartialEq)]
pub struct Clamp {
    pub asked: usize,
    pub allowed: usize,
    /// The setting that asked: `` `max_new_tokens` 50 `` for a keyword of the request,
    /// `max_length 1000 in DIR/generation_config.json` for a field of the folder.
    pub setting: String,
}

/// How an error or warning names a setting: a keyword of the request in backquotes
/// (the CLI writes it as its flag, `--max-new-tokens`), or the field of the folder's
/// file that set it, or transformers' default.
fn setting(
    field: &str,
    value: impl std::fmt::Display,
    asked: bool,
    c: &GenerationConfig,
) -> String {
    match (asked, c.file_of(field)) {
        (true, _) => format!("`{field}` {value}"),
        (false, Some(path)) => format!("{field} {value} in {}", path.display()),
        (false, None) => format!("the default {field} {value}"),
    }
}

impl Request {
    /// Sampling keywords win, then `greedy`, then the folder's `do_sample`.
    fn sampling(&self, config: &GenerationConfig) -> Result<Sampling> {
        let keywords = self.temperature.is_some()
            || self.top_k.is_some()
            || self.top_p.is_some()
            || self.min_p.is_some();
        if keywords && self.greedy {
            return Err(Error::invalid(
                "greedy",
                "cannot be combined with `temperature`, `top_k`, `top_p` or `min_p`",
            ));
        }
        Ok(match (keywords, self.greedy, config.sample) {
            (true, _, _) => Sampling::Sample {
                temperature: self.temperature.unwrap_or(1.0),
                top_k: self.top_k,
                top_p: self.top_p,
                min_p: self.min_p,
                seed: self.seed,
            },
            (false, false, Some(s)) => Sampling::Sample {
                temperature: s.temperature,
                top_k: s.top_k,
                top_p: s.top_p,
                min_p: s.min_p,
                seed: self.seed,
            },
            _ => Sampling::Greedy,
        })
    }

    /// The folder's config with this request's overrides.
    fn overrides(&self, mut c: GenerationConfig) -> Result<GenerationConfig> {
        if let Some(n) = self.num_beams {
            if n == 0 {
                return Err(Error::invalid("num_beams", "must be at least 1"));
            }
            c.search.num_beams = n;
        }
        if let Some(p) = self.length_penalty {
            if !p.is_finite() {
                return Err(Error::invalid(
                    "length_penalty",
                    format!("must be finite, got {p}"),
                ));
            }
            c.search.length_penalty = p;
        }
        if let Some(e) = self.early_stopping {
            c.search.early_stopping = e;
        }
        let p = &mut c.search.penalties;
        p.repetition = self.repetition_penalty.unwrap_or(p.repetition);
        p.presence = self.presence_penalty.unwrap_or(p.presence);
        p.frequency = self.frequency_penalty.unwrap_or(p.frequency);
        p.bias.clone_from(&self.logit_bias);
        p.check()?;
        Ok(c)
    }

    /// Resolves the request for `model` (whose folder gave `config`) and a prompt of
    /// `prompt_len` tokens: the source sentence of an encoder-decoder, the text to
    /// continue of a decoder-only model.
    pub fn plan(
        &self,
        model: &Transformer,
        config: GenerationConfig,
        prompt_len: usize,
    ) -> Result<Plan> {
        if model.kind() == ModelKind::Encoder {
            return Err(no_head(model));
        }
        let config = self.overrides(config)?;
        let sampling = self.sampling(&config)?;
        if config.search.num_beams > 1 && sampling != Sampling::Greedy {
            return Err(Error::invalid(
                "num_beams",
                format!(
                    "beam search ({} beams) with sampling is not supported: ask for `greedy`, or for `num_beams` 1 to sample",
                    config.search.num_beams
                ),
            ));
        }
        // what the decoder has read before its first new token: the prompt, or the
        // decoder's start token
        let (read, src) = match model.kind() {
            ModelKind::Decoder => (prompt_len, 0),
            _ => (1, prompt_len),
        };
        config.check_vocab(model.arch.vocab)?;
        if let Some(id) = config
            .search
            .penalties
            .largest_id()
            .filter(|&id| id >= model.arch.vocab)
        {
            return Err(Error::invalid(
                "logit_bias",
                format!(
                    "token {id} is outside the vocabulary of {}",
                    model.arch.vocab
                ),
            ));
        }
        let (asked, length) = match (self.max_new_tokens, config.max_new_tokens) {
            (Some(n), _) => (n, setting("max_new_tokens", n, true, &config)),
            (None, Some(n)) => (n, setting("max_new_tokens", n, false, &config)),
            (None, None) => {
                let from = setting("max_length", config.max_length, false, &config);
                let n = config
                    .max_length
                    .checked_sub(read)
                    .filter(|&n| n > 0)
                    .ok_or_else(|| {
                        Error::invalid(
                            "max_new_tokens",
                            format!("the prompt fills {from} already: give `max_new_tokens`"),
                        )
                    })?;
                (n, from)
            }
        };
        let (max_new, clamped) = clamp_to_positions(asked, read, model.arch.max_positions())?;
        let beams = config.search.num_beams;
        // per beam (the prompt's row is repeated once per beam): the prefill's
        // activations through the stack, and the key/value cache at the full length
        let prefill = footprint::forward_bytes(
            &model.arch,
            footprint::Shapes {
                batch: 1,
                source: src,
                target: read,
                head: false,
                attentions: false,
            },
        );
        let cache = cache_bytes(model, prompt_len.saturating_add(max_new), src);
        let per_beam = prefill.zip(cache).and_then(|(p, c)| p.checked_add(c));
        // the setting to lower: the beams when one beam would fit, else the prompt when
        // its prefill alone would not, else the length
        let fits = |bytes: Option<usize>| crate::io::memory::check(bytes, "").is_ok();
        let what = if beams > 1 && fits(per_beam) {
            format!(
                "the key/value cache of {max_new} new tokens for each of {beams} beams ({}; ask for fewer `num_beams`)",
                setting("num_beams", beams, self.num_beams.is_some(), &config)
            )
        } else if !fits(prefill) {
            format!("the prefill of a prompt of {prompt_len} tokens (give a shorter prompt)")
        } else {
            format!(
                "the key/value cache of {max_new} new tokens ({length}; ask for fewer `max_new_tokens`)"
            )
        };
        crate::io::memory::check(per_beam.and_then(|b| b.checked_mul(beams)), &what)?;
        let options = GenerateOptions::new(max_new, sampling, model.special_tokens().eos.clone())
            .with_config(&config);
        Ok(Plan {
            options,
            clamped: clamped.map(|(asked, allowed)| Clamp {
                asked,
                allowed,
                setting: length,
            }),
        })
    }
}

/// `asked` new tokens, fewer where the model's position table ends first: a model with
/// learned or sinusoidal positions cannot go past its last row, and `used` positions
/// are taken. Returns the count and, when cut, `(asked, allowed)`.
fn clamp_to_positions(
    asked: usize,
    used: usize,
    max: Option<usize>,
) -> Result<(usize, Option<(usize, usize)>)> {
    let Some(max) = max else {
        return Ok((asked, None));
    };
    let room = max.saturating_sub(used);
    if room == 0 {
        return Err(Error::invalid(
            "prompt",
            format!("it takes all {max} positions of the model: nothing can be generated"),
        ));
    }
    Ok(match asked > room {
        true => (room, Some((asked, room))),
        false => (asked, None),
    })
}

/// Bytes of the key/value cache after `tokens` positions (self-attention of every
/// decoder layer; an encoder-decoder also caches the source's `src` positions per layer).
fn cache_bytes(m: &Transformer, tokens: usize, src: usize) -> Option<usize> {
    let s = m.arch.decoder?;
    let per_position = s
        .layers
        .checked_mul(2)?
        .checked_mul(s.kv_heads)?
        .checked_mul(s.head_dim)?
        .checked_mul(4)?;
    per_position.checked_mul(tokens.checked_add(src)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_are_cut_to_the_positions_and_a_full_prompt_is_refused() {
        assert_eq!(clamp_to_positions(10, 5, None).unwrap(), (10, None));
        assert_eq!(clamp_to_positions(10, 5, Some(20)).unwrap(), (10, None));
        assert_eq!(
            clamp_to_positions(10, 15, Some(20)).unwrap(),
            (5, Some((10, 5)))
        );
        let e = clamp_to_positions(1, 20, Some(20)).unwrap_err().to_string();
        assert!(e.contains("all 20 positions"), "{e}");
    }

    #[test]
    fn keywords_choose_sampling_over_the_folder_and_greedy_excludes_them() {
        let folder = GenerationConfig::default();
        let r = Request {
            top_k: Some(5),
            seed: 7,
            ..Default::default()
        };
        assert_eq!(
            r.sampling(&folder).unwrap(),
            Sampling::Sample {
                temperature: 1.0,
                top_k: Some(5),
                top_p: None,
                min_p: None,
                seed: 7
            }
        );
        let both = Request {
            greedy: true,
            temperature: Some(0.5),
            ..Default::default()
        };
        assert!(both.sampling(&folder).is_err());
        let zero = Request {
            num_beams: Some(0),
            ..Default::default()
        };
        assert!(zero.overrides(folder).is_err());
    }
}
