//! AdamW's hyperparameters ([`AdamWConfig`]) and which parameters weight decay
//! applies to ([`DecayRule`]).

use crate::error::{Error, Result};

/// Substrings that exempt a parameter from weight decay under [`DecayRule::Standard`]:
/// norms (`norm`, `ln_`), biases (`bias`, which also covers T5's
/// `relative_attention_bias`), and embeddings (`embed`, GPT-2's `wte`/`wpe`, T5's
/// `shared`).
pub const NO_DECAY_SUBSTRINGS: [&str; 8] = [
    "norm",
    "ln_",
    "bias",
    "embed",
    "wte",
    "wpe",
    "shared",
    "relative_attention_bias",
];

/// Which parameters weight decay applies to. Decided once per parameter, on the first
/// step (or on [`AdamW::load_state`]).
///
/// [`AdamW::load_state`]: super::adamw::AdamW::load_state
#[derive(Clone, Debug, Default)]
pub enum DecayRule {
    /// The default: decay a parameter iff it has rank ≥ 2 and its name contains none of
    /// [`NO_DECAY_SUBSTRINGS`]. Matrices (projections, FFN weights, an untied LM head)
    /// decay; norms, biases, embeddings and any other vector do not — the convention of
    /// GPT-2 reproductions (minGPT, nanoGPT: "all params with dim < 2 don't decay") and
    /// of Hugging Face's Trainer (biases and norm weights excluded), with embeddings
    /// excluded as well, as the issue asks. A tied LM head shares the embedding and is
    /// therefore not decayed.
    #[default]
    Standard,
    /// Every parameter decays (a plain `torch.optim.AdamW(model.parameters())`).
    All,
    /// No parameter decays.
    None,
    /// Decay iff the name contains none of these substrings (rank is not considered).
    ExcludeNames(Vec<String>),
    /// Decay iff `f(name, shape)`.
    Custom(fn(&str, &[usize]) -> bool),
}

impl DecayRule {
    /// Whether weight decay applies to the parameter `name` of `shape`.
    pub fn decays(&self, name: &str, shape: &[usize]) -> bool {
        match self {
            DecayRule::Standard => {
                shape.len() >= 2 && !NO_DECAY_SUBSTRINGS.iter().any(|s| name.contains(s))
            }
            DecayRule::All => true,
            DecayRule::None => false,
            DecayRule::ExcludeNames(subs) => !subs.iter().any(|s| name.contains(s.as_str())),
            DecayRule::Custom(f) => f(name, shape),
        }
    }
}

/// AdamW hyperparameters (the learning rate comes with each step, from a schedule).
/// Defaults are torch's: β = (0.9, 0.999), eps = 1e-8, weight_decay = 0.01.
#[derive(Clone, Debug)]
pub struct AdamWConfig {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    pub decay: DecayRule,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        AdamWConfig {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
            decay: DecayRule::Standard,
        }
    }
}

impl AdamWConfig {
    /// Errors on a hyperparameter outside torch's accepted range.
    pub fn validate(&self) -> Result<()> {
        let check = |field: &str, v: f64, ok: bool, range: &str| {
            if ok && v.is_finite() {
                Ok(())
            } else {
                Err(Error::invalid(field, format!("{v} is outside {range}")))
            }
        };
        check(
            "beta1",
            self.beta1,
            (0.0..1.0).contains(&self.beta1),
            "[0, 1)",
        )?;
        check(
            "beta2",
            self.beta2,
            (0.0..1.0).contains(&self.beta2),
            "[0, 1)",
        )?;
        check("eps", self.eps, self.eps >= 0.0, "[0, ∞)")?;
        check(
            "weight_decay",
            self.weight_decay,
            self.weight_decay >= 0.0,
            "[0, ∞)",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standard_rule_excludes_vectors_norms_biases_embeddings() {
        let r = DecayRule::Standard;
        assert!(r.decays("h.0.attn.c_attn.weight", &[8, 24]));
        assert!(r.decays("lm_head.weight", &[50, 8]));
        assert!(!r.decays("h.0.attn.c_attn.bias", &[24]));
        assert!(!r.decays("h.0.ln_1.weight", &[8]));
        assert!(!r.decays("model.layers.0.input_layernorm.weight", &[8]));
        assert!(!r.decays("wte.weight", &[50, 8]));
        assert!(!r.decays("wpe.weight", &[16, 8]));
        assert!(!r.decays("model.embed_tokens.weight", &[50, 8]));
        assert!(!r.decays("shared.weight", &[50, 8]));
        assert!(!r.decays(
            "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
            &[32, 4]
        ));
        assert!(!r.decays("some.vector", &[8]), "rank 1 never decays");
        assert!(DecayRule::All.decays("wte.weight", &[5]));
        assert!(!DecayRule::None.decays("w", &[5, 5]));
        let ex = DecayRule::ExcludeNames(vec!["foo".into()]);
        assert!(ex.decays("bar", &[1]) && !ex.decays("a.foo.b", &[2, 2]));
    }
}
