//! Sentence embeddings as sentence-transformers computes them: a BERT-family encoder,
//! then pooling over each text's real tokens, then (optionally) L2 normalisation.
//!
//! A sentence-transformers folder says which steps it runs in `modules.json`:
//!
//! | module | files | what qkv does |
//! |---|---|---|
//! | `Transformer` | `sentence_bert_config.json` (`max_seq_length`, `do_lower_case`) + the HF model folder | tokenise (strip, optional lower-case, truncate keeping `[CLS]`/`[SEP]`), [`Transformer::hidden_states`] |
//! | `Pooling` | `<path>/config.json` | cls / max / mean / mean_sqrt_len_tokens / weightedmean / lasttoken, concatenated when several are set |
//! | `Normalize` | — | x / max(‖x‖₂, 1e-12) |
//!
//! A folder without `modules.json` (a plain Hugging Face model) gets what
//! sentence-transformers itself builds for one, as its documentation describes: the
//! Transformer followed by mean pooling, no normalisation.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{ModelKind, TokenBatch, Transformer};
use crate::error::{Error, Result};
use crate::io::{field_error, read_config, read_json, read_json_or_default};
use crate::tensor::Tensor;
use crate::text::Tokenizer;

/// Texts per forward pass, sentence-transformers' default `batch_size`.
const BATCH: usize = 32;

/// One pooled representation of a text's token states; several are concatenated in the
/// order the pooling config lists them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolingMode {
    /// The first real token (`[CLS]`).
    Cls,
    /// Per-dimension maximum over real tokens.
    Max,
    /// Mean over real tokens.
    Mean,
    /// Sum over real tokens divided by √(number of real tokens).
    MeanSqrtLen,
    /// Mean weighted by 1-based position (later tokens weigh more).
    WeightedMean,
    /// The last real token.
    LastToken,
}

impl PoolingMode {
    /// The legacy `pooling_mode_*` flags in sentence-transformers' concatenation order.
    const FLAG_ORDER: [PoolingMode; 6] = [
        PoolingMode::Cls,
        PoolingMode::Max,
        PoolingMode::Mean,
        PoolingMode::MeanSqrtLen,
        PoolingMode::WeightedMean,
        PoolingMode::LastToken,
    ];

    fn from_name(name: &str) -> Option<Self> {
        match name {
            "cls" => Some(PoolingMode::Cls),
            "max" => Some(PoolingMode::Max),
            "mean" => Some(PoolingMode::Mean),
            "mean_sqrt_len_tokens" => Some(PoolingMode::MeanSqrtLen),
            "weightedmean" => Some(PoolingMode::WeightedMean),
            "lasttoken" => Some(PoolingMode::LastToken),
            _ => None,
        }
    }
}

/// An entry of `modules.json`.
#[derive(Deserialize)]
struct ModuleEntry {
    #[serde(default)]
    path: String,
    #[serde(rename = "type")]
    kind: String,
}

/// `sentence_bert_config.json`.
#[derive(Deserialize, Default)]
#[serde(default)]
struct TransformerConfig {
    max_seq_length: Option<usize>,
    do_lower_case: bool,
}

/// `pooling_mode` in current sentence-transformers configs: one name or a list.
#[derive(Deserialize)]
#[serde(untagged)]
enum ModeNames {
    One(String),
    Many(Vec<String>),
}

/// The Pooling module's `config.json`, in the current layout (`embedding_dimension`,
/// `pooling_mode`) or the legacy one (`word_embedding_dimension`, `pooling_mode_*`
/// flags); `pooling_mode`, when present, wins over the flags, as in sentence-transformers.
#[derive(Deserialize, Default)]
#[serde(default)]
struct PoolingConfig {
    #[serde(alias = "word_embedding_dimension")]
    embedding_dimension: Option<usize>,
    pooling_mode: Option<ModeNames>,
    pooling_mode_cls_token: bool,
    pooling_mode_max_tokens: bool,
    pooling_mode_mean_tokens: bool,
    pooling_mode_mean_sqrt_len_tokens: bool,
    pooling_mode_weightedmean_tokens: bool,
    pooling_mode_lasttoken: bool,
}

/// The pad token as `tokenizer_config.json` names it: a string or an AddedToken object.
#[derive(Deserialize)]
#[serde(untagged)]
enum TokenName {
    Plain(String),
    Added { content: String },
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct TokenizerConfig {
    pad_token: Option<TokenName>,
    model_max_length: Option<f64>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct PadOnly {
    pad_token_id: Option<usize>,
}

/// Tokenizer + encoder + pooling (+ normalisation): texts → one vector each.
pub struct SentenceEncoder {
    model: Transformer,
    tokenizer: Tokenizer,
    pad_id: usize,
    max_seq_length: usize,
    lower_case: bool,
    pooling: Vec<PoolingMode>,
    normalize: bool,
}

impl SentenceEncoder {
    /// Loads the sentence-transformers folder `dir` (see the module docs).
    pub fn load(dir: &Path) -> Result<Self> {
        let modules_path = dir.join("modules.json");
        let (transformer_dir, pooling_dir, normalize) = if modules_path.is_file() {
            read_modules(dir, &modules_path)?
        } else {
            (dir.to_path_buf(), None, false)
        };

        let mut model = super::load(&transformer_dir)?.model;
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
        model.pack_weights();
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
        })
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

    pub fn encoder(&self) -> &Transformer {
        &self.model
    }

    /// The batch the encoder sees for `texts`: each text stripped of surrounding
    /// whitespace, lower-cased if `do_lower_case`, tokenised with special tokens, cut to
    /// `max_seq_length` and right-padded: [B, T].
    pub fn tokenize(&self, texts: &[&str]) -> Result<TokenBatch> {
        let prepared: Vec<String> = texts
            .iter()
            .map(|t| {
                let t = t.trim();
                if self.lower_case {
                    t.to_lowercase()
                } else {
                    t.to_string()
                }
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

    /// As [`SentenceEncoder::embed`], with `batch_size` texts per forward pass (as
    /// sentence-transformers' `encode(batch_size=...)`). Texts are grouped by token
    /// count, longest first, so a batch pads only to its own longest text;
    /// sentence-transformers groups by characters, which pads about half as much
    /// again on mixed text. Padding never changes a result.
    pub fn embed_batched(&self, texts: &[&str], batch_size: usize) -> Result<Vec<Vec<f32>>> {
        if batch_size == 0 {
            return Err(Error::invalid("batch_size", "must be at least 1"));
        }
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let all = self.tokenize(texts)?;
        let t = all.len;
        let real = |i: usize| all.mask[i * t..(i + 1) * t].iter().filter(|&&m| m).count();
        let lens: Vec<usize> = (0..texts.len()).map(real).collect();
        let mut order: Vec<usize> = (0..texts.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(lens[i]));
        let mut out = vec![Vec::new(); texts.len()];
        for chunk in order.chunks(batch_size) {
            // rows are right-padded, so the first `len` columns hold every real token
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

/// The Transformer folder, the Pooling folder and whether a Normalize module follows,
/// from `modules.json`, which must list Transformer, then Pooling, then optionally
/// Normalize: the pipelines qkv can run.
fn read_modules(dir: &Path, modules_path: &Path) -> Result<(PathBuf, Option<PathBuf>, bool)> {
    let modules: Vec<ModuleEntry> = read_json(modules_path)?;
    let kinds: Vec<&str> = modules
        .iter()
        .map(|m| m.kind.rsplit('.').next().unwrap_or(&m.kind))
        .collect();
    let (normalize, expected) = match kinds.as_slice() {
        ["Transformer", "Pooling"] => (false, true),
        ["Transformer", "Pooling", "Normalize"] => (true, true),
        _ => (false, false),
    };
    if !expected {
        let listed: Vec<&str> = modules.iter().map(|m| m.kind.as_str()).collect();
        return Err(Error::Unsupported(format!(
            "{}: modules [{}]; qkv runs Transformer → Pooling (→ Normalize) only",
            modules_path.display(),
            listed.join(", ")
        )));
    }
    Ok((
        crate::io::inside(dir, &modules[0].path, modules_path)?,
        Some(crate::io::inside(dir, &modules[1].path, modules_path)?),
        normalize,
    ))
}

/// The Pooling module's modes from its `config.json`; `hidden` is the encoder's width,
/// which the config's embedding dimension must equal.
fn read_pooling(path: &Path, hidden: usize) -> Result<Vec<PoolingMode>> {
    let cfg: PoolingConfig = read_json(path)?;
    if let Some(d) = cfg.embedding_dimension {
        if d != hidden {
            return Err(field_error(
                path,
                "word_embedding_dimension",
                format!("{d} but the encoder's hidden size is {hidden}"),
            ));
        }
    }
    let modes = match cfg.pooling_mode {
        Some(names) => {
            let names = match names {
                ModeNames::One(n) => vec![n],
                ModeNames::Many(ns) => ns,
            };
            if names.is_empty() {
                // sentence-transformers accepts it, then fails concatenating no vectors
                return Err(field_error(
                    path,
                    "pooling_mode",
                    "an empty list: name at least one mode".to_string(),
                ));
            }
            names
                .iter()
                .map(|n| {
                    PoolingMode::from_name(n).ok_or_else(|| {
                        field_error(
                            path,
                            "pooling_mode",
                            format!("unknown mode `{n}` (known: cls, max, mean, mean_sqrt_len_tokens, weightedmean, lasttoken)"),
                        )
                    })
                })
                .collect::<Result<Vec<_>>>()?
        }
        None => {
            let flags = [
                cfg.pooling_mode_cls_token,
                cfg.pooling_mode_max_tokens,
                cfg.pooling_mode_mean_tokens,
                cfg.pooling_mode_mean_sqrt_len_tokens,
                cfg.pooling_mode_weightedmean_tokens,
                cfg.pooling_mode_lasttoken,
            ];
            let on: Vec<PoolingMode> = PoolingMode::FLAG_ORDER
                .iter()
                .zip(flags)
                .filter(|(_, on)| *on)
                .map(|(&m, _)| m)
                .collect();
            // with no flag set, sentence-transformers (5.7, `_convert_legacy_pooling_kwargs`)
            // pools by mean, so the same folder gives the same vectors here
            match on.is_empty() {
                true => vec![PoolingMode::Mean],
                false => on,
            }
        }
    };
    Ok(modes)
}

/// Pools token states over each row's real tokens.
/// hidden: [B, T, C]; mask: [B·T] → B vectors of length C·(number of modes).
pub fn pool(hidden: &Tensor, mask: &[bool], modes: &[PoolingMode]) -> Result<Vec<Vec<f32>>> {
    hidden.expect_shape("token states", &[None, None, None])?;
    let (b, t, c) = (hidden.shape()[0], hidden.shape()[1], hidden.shape()[2]);
    if mask.len() != b * t {
        return Err(Error::shape(
            "attention_mask",
            format!("[{b}, {t}] like the token states"),
            &[mask.len()],
        ));
    }
    let mut out = Vec::with_capacity(b);
    for r in 0..b {
        let rows = &hidden.data()[r * t * c..(r + 1) * t * c];
        let real = &mask[r * t..(r + 1) * t];
        let tokens = || {
            rows.chunks_exact(c)
                .zip(real)
                .enumerate()
                .filter(|(_, (_, &m))| m)
                .map(|(p, (x, _))| (p, x))
        };
        let count = real.iter().filter(|&&m| m).count();
        let mut v = Vec::with_capacity(c * modes.len());
        for mode in modes {
            match mode {
                PoolingMode::Cls | PoolingMode::LastToken => {
                    let pick = if *mode == PoolingMode::Cls {
                        tokens().next()
                    } else {
                        tokens().next_back()
                    };
                    match pick {
                        Some((_, x)) => v.extend_from_slice(x),
                        None => v.extend(std::iter::repeat_n(0.0, c)),
                    }
                }
                PoolingMode::Max => {
                    let mut m = vec![f32::NEG_INFINITY; c];
                    for (_, x) in tokens() {
                        for (a, &y) in m.iter_mut().zip(x) {
                            *a = a.max(y);
                        }
                    }
                    v.extend(m);
                }
                PoolingMode::Mean | PoolingMode::MeanSqrtLen | PoolingMode::WeightedMean => {
                    let weighted = *mode == PoolingMode::WeightedMean;
                    // f64 sums: a mean over hundreds of tokens stays exact to f32 rounding
                    let mut sum = vec![0.0f64; c];
                    let mut total = 0.0f64;
                    for (p, x) in tokens() {
                        let w = if weighted { (p + 1) as f64 } else { 1.0 };
                        total += w;
                        for (s, &y) in sum.iter_mut().zip(x) {
                            *s += w * y as f64;
                        }
                    }
                    let div = match mode {
                        PoolingMode::MeanSqrtLen => (count as f64).max(1e-9).sqrt(),
                        _ => total.max(1e-9),
                    };
                    v.extend(sum.iter().map(|s| (s / div) as f32));
                }
            }
        }
        out.push(v);
    }
    Ok(out)
}

/// x ← x / max(‖x‖₂, 1e-12), as `torch.nn.functional.normalize`.
pub fn l2_normalize(x: &mut [f32]) {
    let norm = x.iter().map(|&v| (v as f64).powi(2)).sum::<f64>().sqrt();
    let r = 1.0 / norm.max(1e-12);
    for v in x {
        *v = (*v as f64 * r) as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// hidden [2, 3, 2]: row 0 has 3 real tokens, row 1 has 2 (then padding).
    fn sample() -> (Tensor, Vec<bool>) {
        let data = vec![
            1.0, -1.0, 3.0, 0.0, 2.0, 5.0, //
            4.0, 2.0, -2.0, 6.0, 100.0, 100.0,
        ];
        let mask = vec![true, true, true, true, true, false];
        (Tensor::new(&[2, 3, 2], data).unwrap(), mask)
    }

    fn close(a: &[f32], b: &[f32]) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() < 1e-6, "{a:?} vs {b:?}");
        }
    }

    #[test]
    fn each_mode_over_real_tokens_only() {
        let (h, mask) = sample();
        let run = |m| pool(&h, &mask, &[m]).unwrap();
        let r = run(PoolingMode::Cls);
        close(&r[0], &[1.0, -1.0]);
        close(&r[1], &[4.0, 2.0]);
        let r = run(PoolingMode::LastToken);
        close(&r[0], &[2.0, 5.0]);
        close(&r[1], &[-2.0, 6.0]);
        let r = run(PoolingMode::Max);
        close(&r[0], &[3.0, 5.0]);
        close(&r[1], &[4.0, 6.0]);
        let r = run(PoolingMode::Mean);
        close(&r[0], &[2.0, 4.0 / 3.0]);
        close(&r[1], &[1.0, 4.0]);
        let r = run(PoolingMode::MeanSqrtLen);
        close(&r[0], &[6.0 / 3f32.sqrt(), 4.0 / 3f32.sqrt()]);
        close(&r[1], &[2.0 / 2f32.sqrt(), 8.0 / 2f32.sqrt()]);
        // weights 1, 2, 3 by position
        let r = run(PoolingMode::WeightedMean);
        close(&r[0], &[(1.0 + 6.0 + 6.0) / 6.0, (-1.0 + 0.0 + 15.0) / 6.0]);
        close(&r[1], &[(4.0 - 4.0) / 3.0, (2.0 + 12.0) / 3.0]);
    }

    #[test]
    fn several_modes_concatenate_in_order() {
        let (h, mask) = sample();
        let r = pool(&h, &mask, &[PoolingMode::Cls, PoolingMode::Mean]).unwrap();
        close(&r[1], &[4.0, 2.0, 1.0, 4.0]);
    }

    #[test]
    fn mask_of_wrong_length_is_named() {
        let (h, _) = sample();
        let err = pool(&h, &[true; 5], &[PoolingMode::Mean]).unwrap_err();
        assert!(err.to_string().contains("attention_mask"), "{err}");
    }

    #[test]
    fn normalize_gives_unit_length_and_keeps_zero() {
        let mut v = vec![3.0, 4.0];
        l2_normalize(&mut v);
        close(&v, &[0.6, 0.8]);
        let mut z = vec![0.0, 0.0];
        l2_normalize(&mut z);
        close(&z, &[0.0, 0.0]);
    }

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn pooling_config_layouts() {
        let dir = std::env::temp_dir().join(format!("qkv-pooling-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let legacy = write(
            &dir,
            "legacy.json",
            r#"{"word_embedding_dimension": 4, "pooling_mode_mean_tokens": true, "pooling_mode_cls_token": true}"#,
        );
        assert_eq!(
            read_pooling(&legacy, 4).unwrap(),
            [PoolingMode::Cls, PoolingMode::Mean]
        );
        let current = write(
            &dir,
            "current.json",
            r#"{"embedding_dimension": 4, "pooling_mode": ["mean", "cls"], "include_prompt": true}"#,
        );
        assert_eq!(
            read_pooling(&current, 4).unwrap(),
            [PoolingMode::Mean, PoolingMode::Cls]
        );
        let one = write(&dir, "one.json", r#"{"pooling_mode": "lasttoken"}"#);
        assert_eq!(read_pooling(&one, 4).unwrap(), [PoolingMode::LastToken]);
        let none = write(&dir, "none.json", r#"{"word_embedding_dimension": 4}"#);
        assert_eq!(read_pooling(&none, 4).unwrap(), [PoolingMode::Mean]);
        // every legacy flag false: mean, as sentence-transformers 5.7 gives
        // (`Pooling(4, pooling_mode_mean_tokens=False, …).get_config_dict()` → "mean")
        let all_false = write(
            &dir,
            "all_false.json",
            r#"{"word_embedding_dimension": 4, "pooling_mode_cls_token": false, "pooling_mode_mean_tokens": false, "pooling_mode_max_tokens": false, "pooling_mode_mean_sqrt_len_tokens": false}"#,
        );
        assert_eq!(read_pooling(&all_false, 4).unwrap(), [PoolingMode::Mean]);
        let empty = write(&dir, "empty.json", r#"{"pooling_mode": []}"#);
        let msg = read_pooling(&empty, 4).unwrap_err().to_string();
        assert!(
            msg.contains("pooling_mode") && msg.contains("empty"),
            "{msg}"
        );

        let msg = read_pooling(&legacy, 8).unwrap_err().to_string();
        assert!(msg.contains("word_embedding_dimension"), "{msg}");
        let bad = write(&dir, "bad.json", r#"{"pooling_mode": "median"}"#);
        let msg = read_pooling(&bad, 4).unwrap_err().to_string();
        assert!(
            msg.contains("pooling_mode") && msg.contains("median"),
            "{msg}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn modules_must_be_a_pipeline_qkv_runs() {
        let dir = std::env::temp_dir().join(format!("qkv-modules-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let entry = |kind: &str, path: &str| {
            format!(
                r#"{{"idx": 0, "name": "x", "path": "{path}", "type": "sentence_transformers.models.{kind}"}}"#
            )
        };
        let ok = write(
            &dir,
            "ok.json",
            &format!(
                "[{}, {}, {}]",
                entry("Transformer", ""),
                entry("Pooling", "1_Pooling"),
                entry("Normalize", "2_Normalize")
            ),
        );
        let (t, p, n) = read_modules(&dir, &ok).unwrap();
        assert_eq!((t, p, n), (dir.join(""), Some(dir.join("1_Pooling")), true));
        let dense = write(
            &dir,
            "dense.json",
            &format!(
                "[{}, {}, {}]",
                entry("Transformer", ""),
                entry("Pooling", "1_Pooling"),
                entry("Dense", "2_Dense")
            ),
        );
        let msg = read_modules(&dir, &dense).unwrap_err().to_string();
        assert!(msg.contains("sentence_transformers.models.Dense"), "{msg}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
