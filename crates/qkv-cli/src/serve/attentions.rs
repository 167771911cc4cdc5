//! Attention on request, what no other server shows: a completion with
//! `"qkv": {"attentions": true}` also returns the attention maps of its prompt and the
//! text it generated, in the document `qkv attention --json` writes (every layer and
//! head), and with `"viewer": true` the offline viewer page holding them.

use anyhow::Result;
use qkv::models::explain::Method;
use qkv::models::{Input, ModelKind, TokenBatch, Transformer};
use qkv::text::Tokenizer;
use serde_json::Value;

use super::api::{ApiError, QkvOptions};
use crate::maps::document::{labels, Maps};
use crate::maps::select::{expected_shapes, Heads, Kind, Selection, MAX_WEIGHTS};
use crate::maps::viewer;

fn every_map() -> Selection {
    Selection {
        kinds: vec![Kind::Decoder],
        layer: None,
        heads: Heads::All,
    }
}

/// Refuses, before anything runs, maps over `tokens` tokens that the model cannot give
/// or that would be too large to send.
pub fn check(model: &Transformer, o: &QkvOptions, tokens: usize) -> Result<(), ApiError> {
    if o.viewer && !o.attentions {
        return Err(ApiError::invalid("qkv.viewer", "needs `qkv.attentions`"));
    }
    if !o.attentions {
        return Ok(());
    }
    if model.kind() != ModelKind::Decoder {
        return Err(ApiError::invalid(
            "qkv.attentions",
            "maps on request are served for decoder-only models; `qkv attention` draws the others",
        ));
    }
    let count = every_map()
        .count(&expected_shapes(model, tokens, tokens, Method::Weights))
        .map_err(|e| ApiError::invalid("qkv.attentions", e.to_string()))?;
    if count > MAX_WEIGHTS {
        return Err(ApiError::invalid(
            "qkv.attentions",
            format!(
                "the maps of {tokens} tokens (the prompt and max_tokens) would hold {count} weights, at most {MAX_WEIGHTS}: ask for fewer tokens"
            ),
        ));
    }
    Ok(())
}

/// The maps of `ids` (the prompt, then the generated tokens) as the `qkv` field of the
/// answer: `{"attentions": document, "viewer": page?}`. Runs a forward: call it off
/// the HTTP runtime's threads.
pub fn answer(
    model: &Transformer,
    tok: Option<&Tokenizer>,
    name: &str,
    ids: &[usize],
    with_viewer: bool,
) -> Result<Value> {
    let batch = TokenBatch::single(ids.to_vec())?;
    let input = Input {
        target: Some(&batch),
        ..Default::default()
    };
    let att = model.forward(&input, true)?.attentions;
    let maps = Maps {
        model: name.to_string(),
        architecture: model.info().architecture.clone(),
        family: model.info().family.clone(),
        tokens: labels(tok, ids, model)?,
        target_tokens: None,
        method: Method::Weights,
        target: None,
        scores: None,
        layers: every_map().take(&att, false)?,
    };
    let mut out = serde_json::json!({"attentions": serde_json::to_value(&maps)?});
    if with_viewer {
        out["viewer"] = Value::String(viewer::html(std::slice::from_ref(&maps), &[], false, None)?);
    }
    Ok(out)
}
