//! The maps of one input as a document: [`Maps`] serialises as what `qkv attention
//! --json` writes and the viewer embeds:
//!
//! ```text
//! {"model", "architecture", "family", "method",
//!  "tokens": [label], "token_details": [{id, piece, text, special, part}],
//!  "target_tokens", "target_token_details"        (encoder-decoders only)
//!  "target": {kind, position, token, token_label, compare, value, description}   (when one is set)
//!  "scores": [S]                                   (with a target: the credit of each input token)
//!  "layers": [{"kind": "encoder" | "decoder" | "cross", "layer", "heads": ["0", …] | ["mean"],
//!              "queries": "tokens" | "target_tokens", "keys": …, "weights": [H][T][S]}]}
//! ```
//!
//! `method` is `weights` (the attention weights), `value-norm` (per head, shaped as
//! the weights) or `rollout`, `flow`, `grad`, whose layers combine the heads: no
//! `heads`, and `weights` `[T][S]`. `ablation` has no layers, only `scores`.
//!
//! Encoders and encoder-decoders' encoders attend over `tokens`; a decoder-only model's
//! causal self-attention too; an encoder-decoder's decoder attends over
//! `target_tokens` (its input: the start token, then the target), and its
//! cross-attention from `target_tokens` to `tokens`.

use anyhow::Result;
use qkv::experiments::{Heatmaps, Panel};
use qkv::models::explain::{token_labels, Method};
use qkv::models::Transformer;
use qkv::text::{TokenLabel, Tokenizer};
use serde::ser::{SerializeSeq, SerializeStruct};
use serde::{Serialize, Serializer};

use super::select::{Kind, Map};
use super::target::TargetDoc;

/// Labels of `ids`, from the tokenizer when there is one.
pub fn labels(
    tok: Option<&Tokenizer>,
    ids: &[usize],
    model: &Transformer,
) -> Result<Vec<TokenLabel>> {
    Ok(token_labels(model, tok, ids)?)
}

/// The document described in the module's comment.
#[derive(Clone, Debug)]
pub struct Maps {
    pub model: String,
    pub architecture: String,
    pub family: String,
    pub tokens: Vec<TokenLabel>,
    pub target_tokens: Option<Vec<TokenLabel>>,
    pub method: Method,
    pub target: Option<TargetDoc>,
    /// One score per input token (see the module's comment).
    pub scores: Option<Vec<f32>>,
    pub layers: Vec<Map>,
}

impl Maps {
    /// The query and key tokens of `kind`.
    pub fn sequences(&self, kind: Kind) -> (&[TokenLabel], &[TokenLabel]) {
        let target = self.target_tokens.as_deref().unwrap_or(&self.tokens);
        match kind {
            Kind::Encoder => (&self.tokens, &self.tokens),
            Kind::Decoder => (target, target),
            Kind::Cross => (target, &self.tokens),
        }
    }

    /// Map `i`, head `h` as one heatmap. With `hide_special`, special tokens' rows and
    /// columns are dropped and each row is renormalised over the keys left.
    pub fn heatmap(&self, i: usize, h: usize, hide_special: bool) -> Heatmaps {
        let map = &self.layers[i];
        let (queries, keys) = self.sequences(map.kind);
        let shown = |seq: &[TokenLabel]| -> Vec<usize> {
            (0..seq.len())
                .filter(|&j| !(hide_special && seq[j].special))
                .collect()
        };
        let (rows, cols) = (shown(queries), shown(keys));
        let w = map.head(h);
        let values = rows
            .iter()
            .map(|&r| {
                let row: Vec<f64> = cols.iter().map(|&c| w[r * map.keys + c] as f64).collect();
                let sum: f64 = row.iter().sum();
                match hide_special && sum > 0.0 {
                    true => row.iter().map(|v| v / sum).collect(),
                    false => row,
                }
            })
            .collect();
        let head = match (map.combined, map.heads.get(h).map(String::as_str)) {
            (true, _) => format!("{}, heads combined", self.method.name()),
            (false, Some("mean")) => "mean of heads".to_string(),
            (false, n) => format!("head {}", n.unwrap_or("?")),
        };
        let names =
            |seq: &[TokenLabel], idx: &[usize]| idx.iter().map(|&j| seq[j].label()).collect();
        Heatmaps {
            title: format!(
                "{}: {}, layer {}, {head}",
                self.model,
                map.kind.describe(),
                map.layer
            ),
            x_label: "key (attended to)".into(),
            y_label: "query (attending)".into(),
            columns: names(keys, &cols),
            rows: names(queries, &rows),
            panels: vec![Panel {
                label: match hide_special {
                    true => "special tokens hidden, rows renormalised".into(),
                    false => String::new(),
                },
                values,
            }],
        }
    }
}

/// `[H][T][S]` nested lists of a map's flat weights.
struct Nested<'a>(&'a Map);

impl Serialize for Nested<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        let m = self.0;
        let mut heads = s.serialize_seq(Some(m.heads.len()))?;
        for h in 0..m.heads.len() {
            let rows: Vec<&[f32]> = m.head(h).chunks_exact(m.keys.max(1)).collect();
            heads.serialize_element(&rows)?;
        }
        heads.end()
    }
}

impl Serialize for Map {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        let (queries, keys) = match self.kind {
            Kind::Encoder => ("tokens", "tokens"),
            Kind::Decoder => ("target_tokens", "target_tokens"),
            Kind::Cross => ("target_tokens", "tokens"),
        };
        let mut st = s.serialize_struct("Map", 6)?;
        st.serialize_field("kind", &self.kind)?;
        st.serialize_field("layer", &self.layer)?;
        if !self.combined {
            st.serialize_field("heads", &self.heads)?;
        }
        st.serialize_field("queries", queries)?;
        st.serialize_field("keys", keys)?;
        match self.combined {
            true => {
                let rows: Vec<&[f32]> = self.head(0).chunks_exact(self.keys.max(1)).collect();
                st.serialize_field("weights", &rows)?;
            }
            false => st.serialize_field("weights", &Nested(self))?,
        }
        st.end()
    }
}

impl Serialize for Maps {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        let labels = |seq: &[TokenLabel]| seq.iter().map(TokenLabel::label).collect::<Vec<_>>();
        let mut st = s.serialize_struct("Maps", 11)?;
        st.serialize_field("model", &self.model)?;
        st.serialize_field("architecture", &self.architecture)?;
        st.serialize_field("family", &self.family)?;
        st.serialize_field("method", self.method.name())?;
        st.serialize_field("tokens", &labels(&self.tokens))?;
        st.serialize_field("token_details", &self.tokens)?;
        if let Some(t) = &self.target_tokens {
            st.serialize_field("target_tokens", &labels(t))?;
            st.serialize_field("target_token_details", t)?;
        }
        if let Some(t) = &self.target {
            st.serialize_field("target", t)?;
        }
        if let Some(scores) = &self.scores {
            st.serialize_field("scores", scores)?;
        }
        if self.method != Method::Ablation {
            st.serialize_field("layers", &self.layers)?;
        }
        st.end()
    }
}
