//! The target `qkv attention` explains by default, and how the document names it.

use anyhow::{bail, Result};
use qkv::models::explain::{token_labels, Method, Target, TargetValue};
use qkv::models::sentence::PoolingMode;
use qkv::models::{Head, Transformer};
use qkv::text::Tokenizer;
use serde::Serialize;

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
            .map(|t| token_labels(model, tok, &[t]).map(|l| l[0].label()))
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

/// The target for `model` on `ids` ([`Target::default_for`]); None where the model has
/// none for this text, and then `method`, if it needs one, is refused with what to give.
pub fn choose(
    model: &Transformer,
    tok: Option<&Tokenizer>,
    ids: &[usize],
    token: Option<usize>,
    compare: Option<(Vec<f32>, Vec<PoolingMode>)>,
    method: Method,
) -> Result<Option<Target>> {
    let cosine = compare.is_some();
    let found = Target::default_for(model, tok, ids, token, compare);
    if found.is_none() && method.needs_target() {
        let what = match model.arch.head {
            Head::MaskedLm { .. } => {
                "a masked-LM model's target is the top token at the first [MASK]: put one in --text"
            }
            _ => "a sentence encoder's target is the cosine with --compare TEXT",
        };
        bail!("--method {} explains a target: {what}", method.name());
    }
    if cosine && token.is_some() {
        bail!("--target-token is for token targets; a --compare target is a cosine");
    }
    Ok(found)
}
