//! A training run as its caller asks for it: `qkv train`'s flags and `qkv.train`'s
//! keywords are this one flat request, each field named as the keyword (the flag is
//! the same name in kebab case). Settings left unset take their defaults. Requests
//! that cannot mean anything are refused by [`RunRequest::check`], naming the settings.

use std::path::PathBuf;
use std::str::FromStr;

use crate::error::{Error, Result};
use crate::weights::DType;

/// A new Transformer's preset; the model settings override parts of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Style {
    /// Learned positions, pre-norm LayerNorm, GELU MLP, tied head (saved as GPT-2).
    Gpt2,
    /// RoPE, pre-norm RMSNorm, SwiGLU, untied head (saved as Llama).
    Llama,
}

/// The network of a new model: a Transformer decoder, or one of the recurrent models it
/// replaced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Network {
    Transformer,
    /// An Elman RNN language model.
    Rnn,
    /// The 2014 RNN encoder-decoder without attention.
    RnnSeq2seq,
    /// The RNN encoder-decoder with additive (Bahdanau) attention.
    RnnAttention,
}

/// A new Transformer's position encoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PositionChoice {
    None,
    Sinusoidal,
    Learned,
    Rope,
    Alibi,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormChoice {
    LayerNorm,
    RmsNorm,
}

/// A new Transformer's FFN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FfnChoice {
    Relu,
    /// Exact (erf) GELU.
    Gelu,
    /// GPT-2's tanh approximation.
    GeluTanh,
    Swiglu,
}

/// Which parameters AdamW decays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecayChoice {
    /// Matrices only: not norms, biases or embeddings.
    Standard,
    /// Every parameter, as `torch.optim.AdamW(model.parameters())`.
    All,
    None,
}

/// `FromStr` for the choices above: each value by its lower-case name, and an error
/// that lists them.
macro_rules! named {
    ($ty:ident, $what:literal, $($name:literal => $value:expr),+ $(,)?) => {
        impl FromStr for $ty {
            type Err = String;
            fn from_str(s: &str) -> std::result::Result<Self, String> {
                match s {
                    $($name => Ok($value),)+
                    _ => Err(format!(
                        concat!("unknown ", $what, " `{}`: give one of ", $($name, ", "),+),
                        s
                    )
                    .trim_end_matches(", ")
                    .to_string()),
                }
            }
        }
    };
}

named!(Style, "style", "gpt2" => Style::Gpt2, "llama" => Style::Llama);
named!(Network, "network",
    "transformer" => Network::Transformer,
    "rnn" => Network::Rnn,
    "rnn-seq2seq" => Network::RnnSeq2seq,
    "rnn-attention" => Network::RnnAttention,
);
named!(PositionChoice, "position encoding",
    "none" => PositionChoice::None,
    "sinusoidal" => PositionChoice::Sinusoidal,
    "learned" => PositionChoice::Learned,
    "rope" => PositionChoice::Rope,
    "alibi" => PositionChoice::Alibi,
);
named!(NormChoice, "norm", "layernorm" => NormChoice::LayerNorm, "rmsnorm" => NormChoice::RmsNorm);
named!(FfnChoice, "FFN",
    "relu" => FfnChoice::Relu,
    "gelu" => FfnChoice::Gelu,
    "gelu-tanh" => FfnChoice::GeluTanh,
    "swiglu" => FfnChoice::Swiglu,
);
named!(DecayChoice, "decay",
    "standard" => DecayChoice::Standard,
    "all" => DecayChoice::All,
    "none" => DecayChoice::None,
);

/// Everything a caller can say about a run (see the module docs).
#[derive(Clone, Debug, Default)]
pub struct RunRequest {
    // ---- what to train on (exactly one of init + data, task, text, resume) --------
    /// Start from this model folder (any supported family, or one qkv saved).
    pub init: Option<PathBuf>,
    /// Batches for `init`: int64 `input_ids` and `targets` `[steps, B, T]`, optional
    /// `attention_mask`; encoder-decoders: `input_ids` the source `[steps, B, S]` and
    /// `decoder_input_ids` `[steps, B, T]`. Step s uses batch s. With `resume`: the
    /// batches file of an `init` run, moved.
    pub data: Option<PathBuf>,
    /// A built-in task: copy, reverse, sort, recall, long_range, first.
    pub task: Option<String>,
    /// Byte-level language modelling on this file (the last `val_fraction` held out).
    pub text: Option<PathBuf>,
    /// Continue the run checkpointed in this folder exactly where it stopped.
    pub resume: Option<PathBuf>,
    /// Task: source length (pairs for recall, T for long_range).
    pub task_length: Option<usize>,
    /// Task: number of symbols.
    pub symbols: Option<usize>,
    /// Task recall: queries per example.
    pub queries: Option<usize>,
    /// Task long_range: distance between a token and its repeat.
    pub distance: Option<usize>,
    /// Text: model input length T [default: 64].
    pub seq_len: Option<usize>,
    /// Text: fraction of the file held out for evaluation [default: 0.1].
    pub val_fraction: Option<f64>,
    /// Sequences per batch [default: 32].
    pub batch_size: Option<usize>,

    // ---- a new model (task, text) -------------------------------------------------
    /// [default: transformer]
    pub arch: Option<Network>,
    /// A Transformer's preset [default: gpt2].
    pub style: Option<Style>,
    /// Model width C [default: 64].
    pub d_model: Option<usize>,
    /// Layers [default: 2; a recurrent model 1].
    pub layers: Option<usize>,
    /// Attention heads H [default: 4].
    pub heads: Option<usize>,
    /// Key/value heads G, dividing H [default: H].
    pub kv_heads: Option<usize>,
    /// FFN width F [default: the style's].
    pub ffn: Option<usize>,
    pub position: Option<PositionChoice>,
    pub norm: Option<NormChoice>,
    /// Normalise after each residual addition (the original Transformer).
    pub post_norm: bool,
    pub ffn_kind: Option<FfnChoice>,

    // ---- optimisation -------------------------------------------------------------
    /// Updates [default: 1000].
    pub steps: Option<u64>,
    /// Peak learning rate [default: 1e-3].
    pub lr: Option<f64>,
    /// A constant learning rate (no warm-up, no cosine decay).
    pub constant_lr: bool,
    pub warmup: Option<u64>,
    pub min_lr: Option<f64>,
    pub weight_decay: Option<f64>,
    pub beta1: Option<f64>,
    pub beta2: Option<f64>,
    pub eps: Option<f64>,
    /// [default: all with `init` (as `torch.optim.AdamW`), else standard]
    pub decay: Option<DecayChoice>,
    /// Clip the global gradient norm to this value.
    pub clip: Option<f64>,
    /// What the products compute in: f32, or bf16 with f32 master weights (mixed
    /// precision) [default: f32].
    pub dtype: Option<DType>,
    /// Seed of the initial weights and of the data [default: 0].
    pub seed: Option<u64>,
    /// Threads; results repeat for a given seed and thread count [default: all cores].
    pub threads: Option<usize>,

    // ---- evaluation and output ----------------------------------------------------
    /// Evaluate every this many steps and after the last [default: 100].
    pub eval_every: Option<u64>,
    /// Held-out batches per evaluation [default: 8].
    pub eval_batches: Option<u64>,
    /// Checkpoint every this many steps [default: only at the end].
    pub save_every: Option<u64>,
    /// Stop after this many steps, with a checkpoint, as if interrupted.
    pub stop_after: Option<u64>,
    /// The checkpoint folder [default with `resume`: the resumed folder].
    pub out: Option<PathBuf>,
    /// Write into a non-empty `out` that is not a checkpoint, replacing its model files.
    pub overwrite: bool,
    /// One JSON line per step [default with `resume`: the resumed run's, continued].
    pub log_json: Option<PathBuf>,
}

/// The settings of `options` that are given, by name.
fn given(options: &[(&'static str, bool)]) -> Vec<&'static str> {
    options
        .iter()
        .filter(|(_, g)| *g)
        .map(|(n, _)| *n)
        .collect()
}

impl RunRequest {
    /// The model settings given (a new model's).
    pub(super) fn model_settings(&self) -> Vec<&'static str> {
        given(&[
            ("arch", self.arch.is_some()),
            ("style", self.style.is_some()),
            ("d_model", self.d_model.is_some()),
            ("layers", self.layers.is_some()),
            ("heads", self.heads.is_some()),
            ("kv_heads", self.kv_heads.is_some()),
            ("ffn", self.ffn.is_some()),
            ("position", self.position.is_some()),
            ("norm", self.norm.is_some()),
            ("post_norm", self.post_norm),
            ("ffn_kind", self.ffn_kind.is_some()),
            ("seed", self.seed.is_some()),
        ])
    }

    fn data_settings(&self) -> Vec<&'static str> {
        given(&[
            ("task_length", self.task_length.is_some()),
            ("symbols", self.symbols.is_some()),
            ("queries", self.queries.is_some()),
            ("distance", self.distance.is_some()),
            ("seq_len", self.seq_len.is_some()),
            ("val_fraction", self.val_fraction.is_some()),
            ("batch_size", self.batch_size.is_some()),
        ])
    }

    fn optimiser_settings(&self) -> Vec<&'static str> {
        given(&[
            ("lr", self.lr.is_some()),
            ("constant_lr", self.constant_lr),
            ("warmup", self.warmup.is_some()),
            ("min_lr", self.min_lr.is_some()),
            ("weight_decay", self.weight_decay.is_some()),
            ("beta1", self.beta1.is_some()),
            ("beta2", self.beta2.is_some()),
            ("eps", self.eps.is_some()),
            ("decay", self.decay.is_some()),
            ("clip", self.clip.is_some()),
            ("dtype", self.dtype.is_some()),
            ("eval_every", self.eval_every.is_some()),
            ("eval_batches", self.eval_batches.is_some()),
            ("save_every", self.save_every.is_some()),
        ])
    }

    /// Refuses settings that cannot go together, naming them.
    pub fn check(&self) -> Result<()> {
        let refuse = |m: String| Err(Error::request(m));
        let starts = given(&[
            ("init", self.init.is_some()),
            ("task", self.task.is_some()),
            ("text", self.text.is_some()),
            ("resume", self.resume.is_some()),
        ]);
        match starts.as_slice() {
            [] => return refuse("say what to train on: `init` DIR `data` BATCHES, `task` NAME, `text` FILE, or `resume` DIR".into()),
            [_] => {}
            [a, b, ..] => return refuse(format!("`{a}` and `{b}` cannot be used together: give one of `init`, `task`, `text`, `resume`")),
        }
        if self.stop_after == Some(0) {
            return refuse("`stop_after` 0 would train no step: give at least 1".into());
        }
        if self.data.is_some() && self.init.is_none() && self.resume.is_none() {
            return refuse("`data` holds batches for `init` (a Hugging Face model folder to start from); give `init` DIR too".into());
        }
        if self.init.is_some() {
            if self.data.is_none() {
                return refuse("`init` needs `data` BATCHES.safetensors (int64 input_ids and targets [steps, B, T])".into());
            }
            if let [s, ..] = self.model_settings().as_slice() {
                return refuse(format!(
                    "`{s}` cannot be used with `init`: the model is the one in the `init` folder"
                ));
            }
            if let [s, ..] = self.data_settings().as_slice() {
                return refuse(format!(
                    "`{s}` cannot be used with `init`: the batches come from `data`"
                ));
            }
        }
        if self.resume.is_some() {
            let mut fixed = self.model_settings();
            fixed.extend(self.data_settings());
            fixed.extend(self.optimiser_settings());
            if let [s, ..] = fixed.as_slice() {
                return refuse(format!(
                    "`{s}` cannot be used with `resume`: a resumed run keeps the model, data and \
                     optimiser options of its checkpoint (only `steps`, `data`, `out`, `log_json`, \
                     `threads`, `stop_after` and `quiet` may be given)"
                ));
            }
        } else if self.out.is_none() {
            return refuse("give `out` DIR: the folder the checkpoints are written to".into());
        }
        let only = |all: Vec<&'static str>, of: &[&str]| -> Vec<&'static str> {
            all.into_iter().filter(|s| of.contains(s)).collect()
        };
        if self.task.is_none() && self.resume.is_none() {
            let task_only = only(
                self.data_settings(),
                &["task_length", "symbols", "queries", "distance"],
            );
            if let [s, ..] = task_only.as_slice() {
                return refuse(format!("`{s}` is an option of `task`"));
            }
        }
        if self.text.is_none() && self.resume.is_none() {
            let text_only = only(self.data_settings(), &["seq_len", "val_fraction"]);
            if let [s, ..] = text_only.as_slice() {
                let why = match self.task.is_some() {
                    true => " (a task fixes its own length: see `task_length`)",
                    false => "",
                };
                return refuse(format!("`{s}` is an option of `text`{why}"));
            }
        }
        if self.threads == Some(0) {
            return refuse("`threads` must be at least 1".into());
        }
        if self.arch.is_some_and(|a| a != Network::Transformer) {
            // every model setting but those a recurrent model reads
            let transformer_only: Vec<_> = self
                .model_settings()
                .into_iter()
                .filter(|s| !["arch", "d_model", "layers", "seed"].contains(s))
                .collect();
            if let [s, ..] = transformer_only.as_slice() {
                return refuse(format!("`{s}` is an option of `arch` transformer; a recurrent model takes `d_model` (its embedding and state width) and `layers`"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_read_their_names_and_list_them_otherwise() {
        assert_eq!(
            "rnn-attention".parse::<Network>(),
            Ok(Network::RnnAttention)
        );
        assert_eq!("gelu-tanh".parse::<FfnChoice>(), Ok(FfnChoice::GeluTanh));
        let e = "gpt3".parse::<Style>().unwrap_err();
        assert_eq!(e, "unknown style `gpt3`: give one of gpt2, llama");
    }

    #[test]
    fn conflicting_settings_are_named() {
        let none = RunRequest::default().check().unwrap_err().to_string();
        assert!(none.contains("say what to train on"), "{none}");
        let both = RunRequest {
            task: Some("copy".into()),
            text: Some("t.txt".into()),
            out: Some("o".into()),
            ..Default::default()
        };
        let e = both.check().unwrap_err().to_string();
        assert!(
            e.contains("`task` and `text` cannot be used together"),
            "{e}"
        );
        let resumed = RunRequest {
            resume: Some("r".into()),
            lr: Some(0.1),
            ..Default::default()
        };
        let e = resumed.check().unwrap_err().to_string();
        assert!(e.starts_with("`lr` cannot be used with `resume`"), "{e}");
    }
}
