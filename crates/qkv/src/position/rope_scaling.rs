//! How a checkpoint stretches RoPE beyond the context it was trained on
//! (`rope_scaling` / `rope_parameters` in a Hugging Face config). Each kind rewrites
//! the frequencies θ_i (and YaRN also scales cos and sin); the arithmetic follows
//! transformers' `rope_init_fn`s step by step in the same precision (f32 where they
//! use float32 tensors, f64 where they use Python floats), so the tables agree to
//! the last bit or two.
//!
//! - linear: θ_i / factor (position interpolation);
//! - llama3 (Llama 3.1): long wavelengths (> original/low_freq_factor) divided by
//!   factor, short ones (< original/high_freq_factor) kept, a smooth blend between;
//! - yarn: a ramp over the dimensions between θ_i (fast, kept) and θ_i / factor (slow,
//!   interpolated), and cos/sin multiplied by an attention factor 0.1·ln(factor) + 1;
//! - dynamic (NTK-aware): while a call's positions stay below `max_len` nothing changes;
//!   past it the base becomes base·(factor·L/max_len − (factor − 1))^(R/(R−2)) for the
//!   call's length L = largest position + 1;
//! - longrope (Phi-3): θ_i / s_i, with one factor s_i per frequency, `short_factor`
//!   while a call's length stays within the pre-training length and `long_factor` past
//!   it; cos/sin multiplied by √(1 + ln(max/original) / ln(original)).

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The kinds of RoPE scaling, with their parameters resolved (see the module docs).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "rope_type", rename_all = "snake_case")]
pub enum RopeScaling {
    #[default]
    None,
    Linear {
        factor: f32,
    },
    Llama3(Llama3Scaling),
    Yarn(YarnScaling),
    Dynamic {
        factor: f32,
        /// `max_position_embeddings`: no change up to this length
        max_len: usize,
    },
    LongRope(LongRopeScaling),
}

/// Phi-3's LongRoPE (module docs).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LongRopeScaling {
    /// R/2 factors each: within the pre-training length, and past it
    pub short_factor: Vec<f32>,
    pub long_factor: Vec<f32>,
    /// the pre-training length (`original_max_position_embeddings`)
    pub original_max: usize,
    /// cos and sin are multiplied by this
    pub attention_factor: f32,
}

/// Llama 3.1's scaling (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Llama3Scaling {
    pub factor: f32,
    pub low_freq_factor: f32,
    pub high_freq_factor: f32,
    /// the context length of pre-training (`original_max_position_embeddings`)
    pub original_max: usize,
}

/// YaRN's scaling (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct YarnScaling {
    pub factor: f32,
    pub original_max: usize,
    pub beta_fast: f32,
    pub beta_slow: f32,
    /// round the ramp's ends to whole dimensions (transformers' default: true)
    pub truncate: bool,
    /// cos and sin are multiplied by this
    pub attention_factor: f32,
}

/// `rope_scaling` (transformers 4.x) or `rope_parameters` (5.x) as a config writes it.
/// `type` and `rope_type` are separate fields rather than serde aliases because 4.x
/// configs often carry both, which an alias would reject as a duplicate.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct HfRopeConfig {
    pub rope_type: Option<String>,
    #[serde(default, rename = "type")]
    pub legacy_type: Option<String>,
    /// 5.x keeps the base here
    pub rope_theta: Option<f64>,
    pub factor: Option<f64>,
    pub low_freq_factor: Option<f64>,
    pub high_freq_factor: Option<f64>,
    pub original_max_position_embeddings: Option<usize>,
    pub beta_fast: Option<f64>,
    pub beta_slow: Option<f64>,
    pub attention_factor: Option<f64>,
    pub mscale: Option<f64>,
    pub mscale_all_dim: Option<f64>,
    pub truncate: Option<bool>,
    pub short_factor: Option<Vec<f64>>,
    pub long_factor: Option<Vec<f64>>,
    /// 5.x keeps Phi-3's and GPT-NeoX's rotary share here
    pub partial_rotary_factor: Option<f64>,
}

/// `rope_parameters` as transformers 5.x writes it: one entry, or one per layer type
/// (`{"full_attention": {…}, "sliding_attention": {…}}`: Gemma 3, ModernBERT).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum RopeParameters {
    /// Tried first: a flat entry's values are numbers, strings and lists, never objects.
    ByLayerType(std::collections::BTreeMap<String, HfRopeConfig>),
    One(Box<HfRopeConfig>),
}

impl RopeParameters {
    /// The entry for layers of `kind` (`full_attention`, `sliding_attention`): a flat
    /// entry serves every kind; `None` where a per-type table has no such entry.
    pub fn for_layers(&self, kind: &str) -> Option<&HfRopeConfig> {
        match self {
            RopeParameters::One(entry) => Some(entry),
            RopeParameters::ByLayerType(by_kind) => by_kind.get(kind),
        }
    }

    /// The one entry of a model whose layers all rotate alike: a flat entry, or a
    /// per-type table whose entries are all equal. An [`Error::Invalid`] names the
    /// layer type otherwise.
    pub fn single(&self) -> Result<Option<&HfRopeConfig>> {
        match self {
            RopeParameters::One(entry) => Ok(Some(entry)),
            RopeParameters::ByLayerType(by_kind) => {
                let mut entries = by_kind.iter();
                let Some((_, first)) = entries.next() else {
                    return Ok(None);
                };
                match entries.find(|(_, e)| *e != first) {
                    None => Ok(Some(first)),
                    Some((kind, _)) => Err(Error::invalid(
                        kind,
                        "this model rotates every layer alike; a RoPE entry per layer type that differ is not one transformers builds for it",
                    )),
                }
            }
        }
    }
}

impl HfRopeConfig {
    /// The scaling transformers builds from this entry for a model whose
    /// `max_position_embeddings` is `max_positions`. A missing or bad parameter is an
    /// [`Error::Invalid`] naming the entry (`factor`, …); an unknown kind (LongRoPE
    /// among them) is [`Error::Unsupported`].
    ///
    /// YaRN and LongRoPE with a pre-training length: transformers 4.x takes the factor
    /// as the ratio of the two lengths whatever `factor` says; 5.x (which writes
    /// `rope_parameters`, with that length inside) takes a given `factor` and the ratio
    /// only where none is given. `v5` picks 5.x's rule, for an entry of `rope_parameters`.
    pub fn resolve(&self, max_positions: usize, v5: bool) -> Result<RopeScaling> {
        let given = self.factor.filter(|_| v5);
        let kind = self.rope_type.as_deref().or(self.legacy_type.as_deref());
        let needs = |value: Option<f64>, name: &str| {
            value.ok_or_else(|| {
                Error::invalid(
                    name,
                    format!("{} RoPE scaling needs {name}", kind.unwrap_or("this")),
                )
            })
        };
        let scaling = match kind {
            None | Some("default") => RopeScaling::None,
            Some("linear") => RopeScaling::Linear {
                factor: needs(self.factor, "factor")? as f32,
            },
            Some("llama3") => RopeScaling::Llama3(Llama3Scaling {
                factor: needs(self.factor, "factor")? as f32,
                low_freq_factor: needs(self.low_freq_factor, "low_freq_factor")? as f32,
                high_freq_factor: needs(self.high_freq_factor, "high_freq_factor")? as f32,
                original_max: needs(
                    self.original_max_position_embeddings.map(|n| n as f64),
                    "original_max_position_embeddings",
                )? as usize,
            }),
            Some("yarn") => {
                let mut factor = needs(self.factor, "factor")?;
                // a given pre-training length makes the factor the ratio of the two
                // lengths (DeepSeek-V3 style configs)
                let original_max = match self.original_max_position_embeddings {
                    Some(n) if n > 0 => {
                        factor = given.unwrap_or(max_positions as f64 / n as f64);
                        n
                    }
                    Some(n) => n,
                    None => max_positions,
                };
                let attention_factor =
                    match (self.attention_factor, self.mscale, self.mscale_all_dim) {
                        (Some(a), ..) => a,
                        (None, Some(m), Some(all)) if m != 0.0 && all != 0.0 => {
                            RopeScaling::yarn_mscale(factor, m)
                                / RopeScaling::yarn_mscale(factor, all)
                        }
                        _ => RopeScaling::yarn_mscale(factor, 1.0),
                    };
                RopeScaling::Yarn(YarnScaling {
                    factor: factor as f32,
                    original_max,
                    // transformers reads these with `or`: 0 counts as absent too
                    beta_fast: self.beta_fast.filter(|&b| b != 0.0).unwrap_or(32.0) as f32,
                    beta_slow: self.beta_slow.filter(|&b| b != 0.0).unwrap_or(1.0) as f32,
                    truncate: self.truncate.unwrap_or(true),
                    attention_factor: attention_factor as f32,
                })
            }
            Some("dynamic") => RopeScaling::Dynamic {
                factor: needs(self.factor, "factor")? as f32,
                max_len: max_positions,
            },
            Some("longrope") => {
                let factors = |v: &Option<Vec<f64>>, name: &str| {
                    v.as_ref()
                        .map(|v| v.iter().map(|&x| x as f32).collect::<Vec<f32>>())
                        .ok_or_else(|| Error::invalid(name, format!("longrope RoPE scaling needs {name}")))
                };
                // a pre-training length makes the factor the ratio of the two lengths
                // (Phi-3 writes it beside max_position_embeddings); without one, the
                // entry's own factor
                let (original_max, factor) = match self.original_max_position_embeddings {
                    Some(n) if n > 0 => (n, given.unwrap_or(max_positions as f64 / n as f64)),
                    _ => (max_positions, self.factor.unwrap_or(1.0)),
                };
                let attention_factor = match self.attention_factor {
                    Some(a) => a,
                    None if factor <= 1.0 => 1.0,
                    None => (1.0 + factor.ln() / (original_max as f64).ln()).sqrt(),
                };
                RopeScaling::LongRope(LongRopeScaling {
                    short_factor: factors(&self.short_factor, "short_factor")?,
                    long_factor: factors(&self.long_factor, "long_factor")?,
                    original_max,
                    attention_factor: attention_factor as f32,
                })
            }
            Some(other) => {
                return Err(Error::Unsupported(format!(
                    "RoPE scaling type `{other}`; supported: default, linear, llama3, yarn, dynamic, longrope"
                )))
            }
        };
        scaling.check("")?;
        Ok(scaling)
    }
}

impl RopeScaling {
    /// YaRN's default attention factor for `factor`: 0.1·mscale·ln(factor) + 1 (1 for
    /// factor ≤ 1), as transformers' `get_mscale`.
    pub fn yarn_mscale(factor: f64, mscale: f64) -> f64 {
        if factor <= 1.0 {
            1.0
        } else {
            0.1 * mscale * factor.ln() + 1.0
        }
    }

    /// Rejects parameters no checkpoint can mean (zero or non-finite factors,
    /// `high_freq_factor` ≤ `low_freq_factor`, a zero length); errors name the entry
    /// under `field` (`field.factor`; just `factor` when `field` is empty).
    pub fn check(&self, field: &str) -> Result<()> {
        let entry = |name: &str| match field {
            "" => name.to_string(),
            _ => format!("{field}.{name}"),
        };
        let positive = |name: &str, v: f32| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(Error::invalid(
                    entry(name),
                    format!("must be finite and > 0, got {v}"),
                ))
            }
        };
        let length = |name: &str, v: usize| {
            if v > 0 {
                Ok(())
            } else {
                Err(Error::invalid(entry(name), "must be at least 1"))
            }
        };
        match self {
            RopeScaling::None => Ok(()),
            &RopeScaling::Linear { factor } => positive("factor", factor),
            RopeScaling::Llama3(l) => {
                positive("factor", l.factor)?;
                positive("low_freq_factor", l.low_freq_factor)?;
                positive("high_freq_factor", l.high_freq_factor)?;
                length("original_max_position_embeddings", l.original_max)?;
                if l.high_freq_factor <= l.low_freq_factor {
                    return Err(Error::invalid(
                        entry("high_freq_factor"),
                        format!(
                            "must exceed low_freq_factor = {}, got {}",
                            l.low_freq_factor, l.high_freq_factor
                        ),
                    ));
                }
                Ok(())
            }
            RopeScaling::Yarn(y) => {
                positive("factor", y.factor)?;
                positive("beta_fast", y.beta_fast)?;
                positive("beta_slow", y.beta_slow)?;
                // the ramp between the two would run backwards; transformers warns and
                // runs it, qkv refuses a setting no trained model uses
                if y.beta_fast < y.beta_slow {
                    return Err(Error::invalid(
                        entry("beta_fast"),
                        format!(
                            "must be at least beta_slow = {}, got {}",
                            y.beta_slow, y.beta_fast
                        ),
                    ));
                }
                positive("attention_factor", y.attention_factor)?;
                length("original_max_position_embeddings", y.original_max)
            }
            &RopeScaling::Dynamic { factor, max_len } => {
                positive("factor", factor)?;
                length("max_position_embeddings", max_len)
            }
            RopeScaling::LongRope(l) => {
                for (name, factors) in [
                    ("short_factor", &l.short_factor),
                    ("long_factor", &l.long_factor),
                ] {
                    for (i, &f) in factors.iter().enumerate() {
                        positive(&format!("{name}[{i}]"), f)?;
                    }
                }
                positive("attention_factor", l.attention_factor)?;
                length("original_max_position_embeddings", l.original_max)
            }
        }
    }

    /// Errors unless the scaling fits a rotary width of R (LongRoPE gives R/2 factors).
    pub fn check_width(&self, field: &str, rotary_dim: usize) -> Result<()> {
        if let RopeScaling::LongRope(l) = self {
            for (name, factors) in [
                ("short_factor", &l.short_factor),
                ("long_factor", &l.long_factor),
            ] {
                if factors.len() != rotary_dim / 2 {
                    return Err(Error::invalid(
                        match field {
                            "" => name.to_string(),
                            _ => format!("{field}.{name}"),
                        },
                        format!(
                            "{} factors for a rotary width of {rotary_dim}: one per pair, {}",
                            factors.len(),
                            rotary_dim / 2
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The multiplier of cos and sin (YaRN's attention factor; 1 otherwise).
    pub fn attention_factor(&self) -> f32 {
        match self {
            RopeScaling::Yarn(y) => y.attention_factor,
            RopeScaling::LongRope(l) => l.attention_factor,
            _ => 1.0,
        }
    }

    /// The length up to which a call uses the frequencies of a call within the trained
    /// length, for the kinds that depend on the call's length (dynamic, longrope).
    pub fn call_threshold(&self) -> Option<usize> {
        match self {
            RopeScaling::Dynamic { max_len, .. } => Some(*max_len),
            RopeScaling::LongRope(l) => Some(l.original_max),
            _ => None,
        }
    }

    /// The R/2 frequencies for base θ and rotary width R, for a call whose largest
    /// position is `max_pos` (only the dynamic and longrope kinds look at it).
    pub fn inv_freq(&self, base: f32, rotary_dim: usize, max_pos: usize) -> Vec<f32> {
        let plain = || default_inv_freq(base, rotary_dim);
        match self {
            RopeScaling::None => plain(),
            &RopeScaling::Linear { factor } => plain().into_iter().map(|f| f / factor).collect(),
            RopeScaling::Llama3(l) => l.inv_freq(&plain()),
            RopeScaling::Yarn(y) => y.inv_freq(base, rotary_dim),
            RopeScaling::LongRope(l) => {
                let ext = match max_pos + 1 > l.original_max {
                    true => &l.long_factor,
                    false => &l.short_factor,
                };
                // 1 / (s_i · base^(2i/R)), a float32 computation in transformers
                (0..rotary_dim / 2)
                    .map(|i| 1.0 / (ext[i] * base.powf((2 * i) as f32 / rotary_dim as f32)))
                    .collect()
            }
            &RopeScaling::Dynamic { factor, max_len } => {
                let len = max_pos + 1;
                if len <= max_len {
                    // transformers' initial table: the base rescaled in Python floats,
                    // where the ratio works out to 1
                    let f = f64::from(factor);
                    let ratio = f * max_len as f64 / max_len as f64 - (f - 1.0);
                    let exponent = rotary_dim as f64 / (rotary_dim as f64 - 2.0);
                    default_inv_freq((f64::from(base) * ratio.powf(exponent)) as f32, rotary_dim)
                } else {
                    // the update at a longer call: a float32 tensor computation
                    let ratio = factor * len as f32 / max_len as f32 - (factor - 1.0);
                    let exponent = (rotary_dim as f64 / (rotary_dim as f64 - 2.0)) as f32;
                    default_inv_freq(base * ratio.powf(exponent), rotary_dim)
                }
            }
        }
    }
}

/// θ_i = 1 / base^(2i/R) in f32, the order of transformers' default table.
pub(crate) fn default_inv_freq(base: f32, rotary_dim: usize) -> Vec<f32> {
    (0..rotary_dim / 2)
        .map(|i| 1.0 / base.powf((2 * i) as f32 / rotary_dim as f32))
        .collect()
}

impl Llama3Scaling {
    /// Llama 3.1's blend of the plain frequencies by wavelength 2π/θ_i against the
    /// pre-training length.
    fn inv_freq(&self, plain: &[f32]) -> Vec<f32> {
        let (factor, low, high) = (self.factor, self.low_freq_factor, self.high_freq_factor);
        let old = self.original_max as f64;
        let (low_wavelen, high_wavelen) = (
            (old / f64::from(low)) as f32,
            (old / f64::from(high)) as f32,
        );
        let span = (f64::from(high) - f64::from(low)) as f32;
        let two_pi = std::f64::consts::TAU as f32;
        plain
            .iter()
            .map(|&f| {
                let wavelen = two_pi / f;
                let scaled = if wavelen > low_wavelen { f / factor } else { f };
                // wavelengths are finite (θ_i > 0), so this is transformers' ¬(<) ∧ ¬(>)
                let medium = wavelen >= high_wavelen && wavelen <= low_wavelen;
                if medium {
                    let smooth = (self.original_max as f32 / wavelen - low) / span;
                    (1.0 - smooth) * scaled / factor + smooth * scaled
                } else {
                    scaled
                }
            })
            .collect()
    }
}

impl YarnScaling {
    /// The ramped frequencies for base θ and rotary width R.
    fn inv_freq(&self, base: f32, rotary_dim: usize) -> Vec<f32> {
        let (low, high) = yarn_range(
            self.beta_fast.into(),
            self.beta_slow.into(),
            rotary_dim,
            base.into(),
            self.original_max,
            self.truncate,
        );
        yarn(base, rotary_dim, self.factor, low, high)
    }
}

/// YaRN's ramp ends: the dimensions where a wavelength fits `beta_fast` and
/// `beta_slow` turns in the pre-training length, in Python floats as transformers.
fn yarn_range(
    beta_fast: f64,
    beta_slow: f64,
    dim: usize,
    base: f64,
    original_max: usize,
    truncate: bool,
) -> (f64, f64) {
    let at = |turns: f64| {
        dim as f64 * (original_max as f64 / (turns * 2.0 * std::f64::consts::PI)).ln()
            / (2.0 * base.ln())
    };
    let (mut low, mut high) = (at(beta_fast), at(beta_slow));
    if truncate {
        low = low.floor();
        high = high.ceil();
    }
    (low.max(0.0), high.min(dim as f64 - 1.0))
}

/// θ_i·e_i + θ_i/factor·(1 − e_i), e_i = 1 − clamp((i − low)/(high − low), 0, 1).
fn yarn(base: f32, rotary_dim: usize, factor: f32, low: f64, high: f64) -> Vec<f32> {
    let high = if low == high { high + 0.001 } else { high };
    let (low32, span) = (low as f32, (high - low) as f32);
    (0..rotary_dim / 2)
        .map(|i| {
            // 1/(factor·base^(2i/R)) as transformers writes it, not θ_i/factor
            let pos_freq = base.powf((2 * i) as f32 / rotary_dim as f32);
            let extrapolated = 1.0 / pos_freq;
            let interpolated = 1.0 / (factor * pos_freq);
            let ramp = ((i as f32 - low32) / span).clamp(0.0, 1.0);
            let keep = 1.0 - ramp;
            interpolated * (1.0 - keep) + extrapolated * keep
        })
        .collect()
}
