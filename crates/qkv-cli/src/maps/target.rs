//! The target `qkv attention` explains by default, and how the document names it.

use anyhow::{bail, Result};
use qkv::models::attribute::{Method, Target, TargetValue};
use qkv::models::sentence::PoolingMode;
use qkv::models::{Head, ModelKind, Transformer};
use qkv::text::Tokenizer;
use serde::Serialize;

use super::labels;

/// A fixed target as the document shows it.
#[derive(Clone, Debug, Serialize)]
pub struct TargetDoc {
    /// `next_token`, `masked_token` or `cosine`.
    pub kind: &'static str,
    /// The position whose output it reads (in the decoder's input for an
    /// encoder-decoder).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub position: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_label: Option<String>,
    /// The text a cosine compares with.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compare: Option<String>,
    pub value: f32,
    /// What it is, in words: `log p("tired" next)`.
    pub description: String,
}

impl TargetDoc {
    pub fn new(
        v: &TargetValue,
        model: &Transformer,
        tok: Option<&Tokenizer>,
        compare: Option<&str>,
    ) -> Result<TargetDoc> {
        let label = v
            .token
            .map(|t| labels(tok, &[t], model).map(|l| l[0].label()))
            .transpose()?;
        let quoted = label.as_deref().unwrap_or("?");
        let (kind, description) = match &v.target {
            Target::NextToken(_) => ("next_token", format!("log p(\"{quoted}\" next)")),
            Target::Masked { position, .. } => (
                "masked_token",
                format!("log p(\"{quoted}\" at position {position})"),
            ),
            Target::Cosine { .. } => (
                "cosine",
                format!("cosine with \"{}\"", compare.unwrap_or("")),
            ),
        };
        Ok(TargetDoc {
            kind,
            position: v.position,
            token: v.token,
            token_label: label,
            compare: compare.map(str::to_string),
            value: v.value,
            description,
        })
    }
}

/// The mask token's id, under the names BERT and RoBERTa give it.
fn mask_id(tok: Option<&Tokenizer>) -> Option<usize> {
    let tok = tok?;
    ["[MASK]", "<mask>"].iter().find_map(|m| tok.token_id(m))
}

/// The target for `model` on `ids`: a decoder's (an encoder-decoder's) next token, a
/// masked-LM encoder's token at the first mask of the text, a sentence encoder's cosine
/// with the `compare` embedding; `token` names the token instead of the most likely
/// one. None where the model has none for this text; then `method`, if it needs one,
/// is refused with what to give.
pub fn choose(
    model: &Transformer,
    tok: Option<&Tokenizer>,
    ids: &[usize],
    token: Option<usize>,
    compare: Option<(Vec<f32>, Vec<PoolingMode>)>,
    method: Method,
) -> Result<Option<Target>> {
    let found = match (model.kind(), model.arch.head, compare) {
        (_, _, Some((with, pooling))) => Some(Target::Cosine { with, pooling }),
        (ModelKind::Decoder | ModelKind::EncoderDecoder, _, None) => Some(Target::NextToken(token)),
        (ModelKind::Encoder, Head::MaskedLm { .. }, None) => mask_id(tok)
            .and_then(|m| ids.iter().position(|&id| id == m))
            .map(|position| Target::Masked { position, token }),
        (ModelKind::Encoder, _, None) => None,
    };
    if found.is_none() && method.needs_target() {
        let what = match model.arch.head {
            Head::MaskedLm { .. } => {
                "a masked-LM model's target is the top token at the first [MASK]: put one in --text"
            }
            _ => "a sentence encoder's target is the cosine with --compare TEXT",
        };
        bail!("--method {} explains a target: {what}", method.name());
    }
    if found
        .as_ref()
        .is_some_and(|t| matches!(t, Target::Cosine { .. }))
        && token.is_some()
    {
        bail!("--target-token is for token targets; a --compare target is a cosine");
    }
    Ok(found)
}
