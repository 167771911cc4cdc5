//! Sentence embeddings as sentence-transformers computes them: a BERT-family encoder,
//! then pooling over each text's real tokens, then (optionally) L2 normalisation.
//!
//! A sentence-transformers folder says which steps it runs in `modules.json`:
//!
//! | module | files | what qkv does |
//! |---|---|---|
//! | `Transformer` | `sentence_bert_config.json` (`max_seq_length`, `do_lower_case`) + the HF model folder | tokenise (optional lower-case, truncate keeping `[CLS]`/`[SEP]`), [`Transformer::hidden_states`] |
//! | `Pooling` | `<path>/config.json` | cls / max / mean / mean_sqrt_len_tokens / weightedmean / lasttoken, concatenated when several are set |
//! | `Normalize` | — | x / max(‖x‖₂, 1e-12) |
//!
//! A folder without `modules.json` (a plain Hugging Face model) gets what
//! sentence-transformers itself builds for one, as its documentation describes: the
//! Transformer followed by mean pooling, no normalisation.

use std::path::Path;

use super::files::{
    read_modules, read_pooling, PadOnly, TokenName, TokenizerConfig, TransformerConfig,
};
use super::pooling::{l2_normalize, pool, PoolingMode};
use crate::batch::TokenBatch;
use crate::error::{Error, Result};
use crate::io::{field_error, read_config, read_json_or_default};
use crate::models::folder::load_in;
use crate::models::net::arch::ModelKind;
use crate::models::transformer::Transformer;
use crate::tensor::Tensor;
use crate::text::Tokenizer;

/// Texts per forward pass, sentence-transformers' default `batch_size`.
const BATCH: usize = 32;

/// Tokenizer + encoder + pooling (+ normalisation): texts → one vector each.
pub struct SentenceEncoder {
    model: Transformer,
    tokenizer: Tokenizer,
    pad_id: usize,
    max_seq_length: usize,
    lower_case: bool,
    pooling: Vec<PoolingMode>,
    normalize: bool,
    /// what the checkpoint stores: its elements (a tied matrix once) and each dtype's
    /// count, as [`crate::models::Loaded`] gives them
    stored: (usize, Vec<(String, usize)>),
}

impl SentenceEncoder {
    /// Computes with the transformer's linear layers in `dtype` from now on
    /// ([`Transformer::set_dtype`]).
    pub fn set_dtype(&mut self, dtype: crate::weights::DType) -> Result<()> {
        if self.model.dtype() != dtype {
            self.model.set_dtype(dtype)?;
        }
        Ok(())
    }

    /// Loads the sentence-transformers folder `dir` (see the module docs).
    pub fn load(dir: &Path) -> Result<Self> {
        Self::load_in(dir, crate::weights::DType::F32)
    }

    /// [`SentenceEncoder::load`] with the linear layers in `dtype`, holding in bf16 or
    /// int8 no f32 copy of them ([`crate::models::load_in`]).
    pub fn load_in(dir: &Path, dtype: crate::weights::DType) -> Result<Self> {
        let modules_path = dir.join("modules.json");
        let (transformer_dir, pooling_dir, normalize) = if modules_path.is_file() {
            read_modules(dir, &modules_path)?
        } else {
            (dir.to_path_buf(), None, false)
        };

        let loaded = load_in(&transformer_dir, dtype)?;
        let stored = (loaded.parameters, loaded.dtypes);
        let mut model = loaded.model;
        if model.kind() != ModelKind::Encoder {
            return Err(Error::Unsupported(format!(
                "{}: sentence embeddings need an encoder (BERT family), not `{}`",
                transformer_dir.display(),
                model.info().architecture
            )));
        }
        let tokenizer = Tokenizer::from_dir(&transformer_dir)?.fitting(model.arch.token_rows())?;
        let st_path = transformer_dir.join("sentence_bert_config.json");
        let st: TransformerConfig = read_json_or_default(&st_path)?;
        let tok_cfg: TokenizerConfig =
            read_json_or_default(&transformer_dir.join("tokenizer_config.json"))?;

        let model_max = model.info().max_positions.unwrap_or(usize::MAX);
        // sentence-transformers' default when the config gives none: the shorter of the
        // model's positions and the tokenizer's `model_max_length`.
        let max_seq_length = match st.max_seq_length {
            Some(n) => n,
            None => tok_cfg
                .model_max_length
                .filter(|&n| n >= 1.0 && n < model_max as f64)
                .map_or(model_max, |n| n as usize),
        };
        if max_seq_length < 2 {
            return Err(field_error(
                &st_path,
                "max_seq_length",
                format!("{max_seq_length} leaves no room for a token between [CLS] and [SEP]"),
            ));
        }

        // an encoder of embeddings only ever runs forward: its weights are packed once
        if dtype == crate::weights::DType::F32 {
            model.pack_weights();
        }
        let hidden = model.info().hidden;
        let pooling = match &pooling_dir {
            Some(p) => read_pooling(&p.join("config.json"), hidden)?,
            None => vec![PoolingMode::Mean],
        };

        // Padding is masked out of attention and pooling, so the pad id only has to be
        // a valid token; take the tokenizer's own, as sentence-transformers does.
        let pad_from_tokenizer = tok_cfg.pad_token.and_then(|t| {
            let name = match t {
                TokenName::Plain(s) => s,
                TokenName::Added { content } => content,
            };
            tokenizer.token_id(&name)
        });
        let pad_id = match pad_from_tokenizer {
            Some(id) => id,
            None => read_config::<PadOnly>(&transformer_dir)?
                .pad_token_id
                .unwrap_or(0),
        };

        Ok(SentenceEncoder {
            model,
            tokenizer,
            pad_id,
            max_seq_length,
            lower_case: st.do_lower_case,
            pooling,
            normalize,
            stored,
        })
    }

    /// The elements the checkpoint stores (a tied matrix once), as `qkv inspect` counts
    /// them.
    pub fn stored_parameters(&self) -> usize {
        self.stored.0
    }

    /// Each dtype on disk with its element count.
    pub fn stored_dtypes(&self) -> &[(String, usize)] {
        &self.stored.1
    }

    /// Length of each embedding: the hidden size times the number of pooling modes.
    pub fn dim(&self) -> usize {
        self.model.info().hidden * self.pooling.len()
    }

    /// Texts are cut to this many tokens, `[CLS]` and `[SEP]` included.
    pub fn max_seq_length(&self) -> usize {
        self.max_seq_length
    }

    pub fn pooling(&self) -> &[PoolingMode] {
        &self.pooling
    }

    /// Whether embeddings are scaled to unit length (a `Normalize` module is listed).
    pub fn normalizes(&self) -> bool {
        self.normalize
    }

    /// The folder's tokenizer, as [`SentenceEncoder::tokenize`] uses it.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    pub fn encoder(&self) -> &Transformer {
        &self.model
    }

    /// The batch the encoder sees for `texts`: each text lower-cased if
    /// `do_lower_case`, tokenised with special tokens, cut to `max_seq_length` and
    /// right-padded: [B, T]. Surrounding whitespace is kept, as sentence-transformers 5.7
    /// keeps it (earlier versions stripped it; only tokenizers that encode spaces, such
    /// as byte-level BPE, tell the two apart).
    pub fn tokenize(&self, texts: &[&str]) -> Result<TokenBatch> {
        let prepared: Vec<String> = texts
            .iter()
            .map(|t| match self.lower_case {
                true => t.to_lowercase(),
                false => t.to_string(),
            })
            .collect();
        let refs: Vec<&str> = prepared.iter().map(String::as_str).collect();
        self.tokenizer
            .encode_batch(&refs, true, self.pad_id, Some(self.max_seq_length))
    }

    /// One embedding of length [`SentenceEncoder::dim`] per text, in the order given,
    /// 32 texts per forward pass (see [`SentenceEncoder::embed_batched`]).
    pub fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        self.embed_batched(texts, BATCH)
    }

    /// As [`SentenceEncoder::embed`], with `batch_size` texts per forward pass at most
    /// (as sentence-transformers' `encode(batch_size=...)`). A pass packs its texts into
    /// one row of tokens without padding ([`Transformer::hidden_states_varlen`]), so a
    /// mix of lengths (a server's batch of requests) costs what its tokens cost. An
    /// encoder that cannot run packed (a dense score bias: T5, ALiBi) runs padded
    /// batches instead (see `embed_padded`). Padding never changes a result.
    pub fn embed_batched(&self, texts: &[&str], batch_size: usize) -> Result<Vec<Vec<f32>>> {
        if batch_size == 0 {
            return Err(Error::invalid("batch_size", "must be at least 1"));
        }
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let all = self.tokenize(texts)?;
        let t = all.len;
        let lens: Vec<usize> = (0..texts.len())
            .map(|i| all.mask[i * t..(i + 1) * t].iter().filter(|&&m| m).count())
            .collect();
        if !self.model.runs_varlen() {
            return self.embed_padded(&all, &lens, batch_size);
        }
        let c = self.model.info().hidden;
        let mut out = Vec::with_capacity(texts.len());
        for (first, pass) in lens.chunks(batch_size).enumerate() {
            let first = first * batch_size;
            // rows are right-padded, so the first `len` columns hold every real token
            let sequences: Vec<&[usize]> = (first..first + pass.len())
                .map(|i| &all.ids[i * t..i * t + lens[i]])
                .collect();
            let hidden = self.model.hidden_states_varlen(&sequences)?;
            let mut rows = hidden.data().chunks_exact(c);
            for &len in pass {
                let states: Vec<f32> = rows.by_ref().take(len).flatten().copied().collect();
                let mut v = pool(
                    &Tensor::new(&[1, len, c], states)?,
                    &vec![true; len],
                    &self.pooling,
                )?
                .pop()
                .expect("one row pooled");
                if self.normalize {
                    l2_normalize(&mut v);
                }
                out.push(v);
            }
        }
        Ok(out)
    }

    /// Padded passes of `all` (texts with `lens` real tokens): grouped by token count,
    /// longest first, so a batch pads only to its own longest text; a batch also ends
    /// before a text shorter than ¾ of its longest.
    fn embed_padded(
        &self,
        all: &TokenBatch,
        lens: &[usize],
        batch_size: usize,
    ) -> Result<Vec<Vec<f32>>> {
        let t = all.len;
        let mut order: Vec<usize> = (0..lens.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(lens[i]));
        let mut out = vec![Vec::new(); lens.len()];
        for chunk in padded_at_most_a_quarter(&order, lens, batch_size) {
            let len = lens[chunk[0]];
            let mut ids = Vec::with_capacity(chunk.len() * len);
            let mut mask = Vec::with_capacity(chunk.len() * len);
            for &i in chunk {
                ids.extend_from_slice(&all.ids[i * t..i * t + len]);
                mask.extend_from_slice(&all.mask[i * t..i * t + len]);
            }
            let tokens = TokenBatch::new(ids, Some(mask), chunk.len(), len)?;
            let hidden = self.model.hidden_states(&tokens, None)?;
            let mut pooled = pool(&hidden, &tokens.mask, &self.pooling)?;
            if self.normalize {
                for v in &mut pooled {
                    l2_normalize(v);
                }
            }
            for (&i, v) in chunk.iter().zip(pooled) {
                out[i] = v;
            }
        }
        Ok(out)
    }
}

/// `order` (text indices, longest first by `lens`) cut into batches of at most `size`,
/// each ending before a text shorter than ¾ of the batch's first (longest) one.
fn padded_at_most_a_quarter<'a>(
    order: &'a [usize],
    lens: &'a [usize],
    size: usize,
) -> impl Iterator<Item = &'a [usize]> {
    let mut rest = order;
    std::iter::from_fn(move || {
        let first = *rest.first()?;
        let n = rest
            .iter()
            .take(size)
            .position(|&i| 4 * lens[i] < 3 * lens[first])
            .unwrap_or(size.min(rest.len()));
        let (batch, tail) = rest.split_at(n);
        rest = tail;
        Some(batch)
    })
}

#[cfg(test)]
mod tests {
    use super::padded_at_most_a_quarter;

    #[test]
    fn batches_end_at_the_size_or_before_a_text_under_three_quarters_of_the_longest() {
        // lengths of texts 0..7, ordered longest first
        let lens = [40, 39, 31, 30, 29, 12, 9, 9];
        let order: Vec<usize> = (0..lens.len()).collect();
        let batches: Vec<&[usize]> = padded_at_most_a_quarter(&order, &lens, 3).collect();
        assert_eq!(batches, [&[0, 1, 2][..], &[3, 4][..], &[5, 6, 7][..]]);
        let batches: Vec<&[usize]> = padded_at_most_a_quarter(&order, &lens, 32).collect();
        assert_eq!(batches, [&[0, 1, 2, 3][..], &[4][..], &[5, 6, 7][..]]);
        assert_eq!(padded_at_most_a_quarter(&[], &lens, 4).count(), 0);
    }
}
