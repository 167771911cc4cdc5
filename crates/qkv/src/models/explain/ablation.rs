//! Ablation: the target with every key of the input text, minus the target with one
//! key hidden from every attention ([`Transformer::forward_hiding`]).

use super::target::TargetValue;
use crate::batch::TokenBatch;
use crate::error::Result;
use crate::models::net::arch::ModelKind;
use crate::models::transformer::{Input, Transformer};

/// Hidden keys per forward: rows of one batch, each with another key hidden.
const ROWS: usize = 16;

/// `n` copies of the one row of `batch`.
fn repeat(batch: &TokenBatch, n: usize) -> Result<TokenBatch> {
    TokenBatch::new(
        batch.ids.repeat(n),
        Some(batch.mask.repeat(n)),
        n,
        batch.len,
    )
}

/// One score per key s of the input text (one sequence): the target's value minus its
/// value with s hidden, so a positive score means the key helped. A cosine target also
/// pools without s, as sentence-transformers pools over the attention mask.
/// `progress(done, len)` follows each forward (16 keys hidden, one a row).
pub fn ablation(
    model: &Transformer,
    input: &Input,
    target: &TargetValue,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Vec<f32>> {
    let decoder = model.kind() == ModelKind::Decoder;
    let text = match decoder {
        true => input.target,
        false => input.source,
    }
    .expect("the input text is checked before");
    let len = text.len;
    let mut scores = Vec::with_capacity(len);
    let keys: Vec<usize> = (0..len).collect();
    for chunk in keys.chunks(ROWS) {
        let n = chunk.len();
        let text_rows = repeat(text, n)?;
        let target_rows = match (decoder, input.target) {
            (false, Some(t)) => Some(repeat(t, n)?),
            _ => None,
        };
        let types = input.token_types.map(|t| t.repeat(n));
        let rows = match decoder {
            true => Input {
                target: Some(&text_rows),
                ..Default::default()
            },
            false => Input {
                source: Some(&text_rows),
                token_types: types.as_deref(),
                target: target_rows.as_ref(),
            },
        };
        let logits = model.forward_hiding(&rows, chunk)?;
        for (b, &s) in chunk.iter().enumerate() {
            let mut mask = text.mask.clone();
            mask[s] = false;
            let without = target.target.value(&logits, b, &mask)?;
            scores.push((target.value as f64 - without) as f32);
        }
        progress(scores.len(), len);
    }
    Ok(scores)
}
