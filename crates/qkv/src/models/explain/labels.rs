//! Readable labels of the tokens an attribution credits.

use crate::error::Result;
use crate::models::transformer::Transformer;
use crate::text::{TokenLabel, Tokenizer};

/// Labels of `ids`, from the tokenizer when there is one, with the model's own special
/// tokens (BOS, EOS, pad, decoder start) marked special as well as the tokenizer's.
pub fn token_labels(
    model: &Transformer,
    tok: Option<&Tokenizer>,
    ids: &[usize],
) -> Result<Vec<TokenLabel>> {
    let sp = model.special_tokens();
    let special: Vec<usize> = sp
        .eos
        .iter()
        .copied()
        .chain(sp.bos)
        .chain(sp.pad)
        .chain(sp.decoder_start)
        .collect();
    match tok {
        Some(t) => t.labels(ids, &special),
        None => Ok(TokenLabel::from_ids(ids, |id| special.contains(&id))),
    }
}
