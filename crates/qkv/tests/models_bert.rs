//! BERT against its Hugging Face fixture (`tests/fixtures/models/bert`, made by
//! tools/fixtures/gen_models.py): last_hidden_state with padding and two segments,
//! the `bert.`-prefixed task-model layout, and the errors a user's input can cause.

#![cfg(feature = "models")]

mod common;

use std::path::{Path, PathBuf};

use common::models::{assert_real_close, batch, load_encoder, model_dir, reference};
use qkv::models::{self, TokenBatch};
use qkv::Error;

fn usizes(v: &[i64]) -> Vec<usize> {
    v.iter().map(|&x| x as usize).collect()
}

#[test]
fn last_hidden_state_matches_hf_with_padding_and_segments() {
    let f = reference("bert");
    let m = load_encoder("bert");
    let tokens = batch(&f, "input_ids", Some("attention_mask"));
    let types = usizes(&f.ints("token_type_ids").1);
    let got = m.hidden_states(&tokens, Some(&types)).unwrap();
    let want = f.t("last_hidden_state");
    assert_real_close("bert last_hidden_state", &got, &want, &tokens.mask);

    let c = got.last_dim();
    let worst = tokens
        .mask
        .iter()
        .enumerate()
        .filter(|(_, &real)| real)
        .flat_map(|(p, _)| {
            got.data()[p * c..][..c]
                .iter()
                .zip(&want.data()[p * c..][..c])
                .map(|(a, b)| (a - b).abs())
        })
        .fold(0.0f32, f32::max);
    println!("bert: max |diff| over real positions = {worst:e}");
}

/// A row run alone (no padding, its own length) gives the states it has in the batch.
#[test]
fn padding_does_not_change_real_tokens() {
    let f = reference("bert");
    let m = load_encoder("bert");
    let tokens = batch(&f, "input_ids", Some("attention_mask"));
    let types = usizes(&f.ints("token_type_ids").1);
    let full = m.hidden_states(&tokens, Some(&types)).unwrap();
    let (t, c) = (tokens.len, full.last_dim());
    for r in 0..tokens.batch {
        let n = tokens.mask[r * t..(r + 1) * t]
            .iter()
            .filter(|&&m| m)
            .count();
        let alone = TokenBatch::single(tokens.ids[r * t..r * t + n].to_vec()).unwrap();
        let got = m
            .hidden_states(&alone, Some(&types[r * t..r * t + n]))
            .unwrap();
        common::assert_close(
            &format!("row {r} alone"),
            got.data(),
            &full.data()[r * t * c..(r * t + n) * c],
            1e-5,
            1e-4,
        );
    }
}

/// Without token types every token is segment 0, as HF's default `token_type_ids`.
#[test]
fn missing_token_types_mean_segment_zero() {
    let f = reference("bert");
    let m = load_encoder("bert");
    let tokens = batch(&f, "input_ids", Some("attention_mask"));
    let zeros = vec![0; tokens.ids.len()];
    let a = m.hidden_states(&tokens, None).unwrap();
    let b = m.hidden_states(&tokens, Some(&zeros)).unwrap();
    assert_eq!(a, b);
}

#[test]
fn info_describes_the_architecture() {
    let m = load_encoder("bert");
    let info = m.info();
    assert_eq!(info.family, "bert");
    assert_eq!(info.architecture, "BertModel");
    assert_eq!(
        (
            info.layers,
            info.hidden,
            info.heads,
            info.kv_heads,
            info.head_dim
        ),
        (2, 32, 4, 4, 8)
    );
    assert_eq!((info.ffn_dim, info.vocab), (64, 99));
    assert_eq!(info.max_positions, Some(64));
    assert_eq!(info.decoder_layers, None);
    assert!(info.norm.contains("post-norm"), "{}", info.norm);
    assert_eq!(info.ffn, "GELU (erf)");
}

/// A scratch copy of the fixture folder, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("qkv-bert-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let src = model_dir("bert");
        for name in ["config.json", "model.safetensors"] {
            std::fs::copy(src.join(name), dir.join(name)).unwrap();
        }
        Scratch(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }

    /// Rewrites config.json with `edit` applied.
    fn edit_config(&self, edit: impl FnOnce(&mut serde_json::Value)) {
        let path = self.0.join("config.json");
        let mut cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        edit(&mut cfg);
        std::fs::write(&path, serde_json::to_string_pretty(&cfg).unwrap()).unwrap();
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn load_err(dir: &Path) -> Error {
    match models::load(dir) {
        Ok(_) => panic!("{} loaded but should not", dir.display()),
        Err(e) => e,
    }
}

/// `BertForMaskedLM` checkpoints keep the encoder under `bert.`; checkpoints converted
/// from the original TensorFlow release name LayerNorm parameters gamma/beta.
#[test]
fn task_model_prefix_and_gamma_beta_names_load() {
    let s = Scratch::new("prefix");
    let path = s.path().join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let renamed: Vec<(String, safetensors::tensor::TensorView)> = st
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            let name = name
                .replace("LayerNorm.weight", "LayerNorm.gamma")
                .replace("LayerNorm.bias", "LayerNorm.beta");
            (format!("bert.{name}"), view)
        })
        .collect();
    let out = safetensors::tensor::serialize(renamed, None).unwrap();
    std::fs::write(&path, out).unwrap();
    s.edit_config(|c| c["architectures"] = serde_json::json!(["BertForMaskedLM"]));

    let m = models::load(s.path()).unwrap().model;
    assert_eq!(m.info().architecture, "BertForMaskedLM");
    let f = reference("bert");
    let tokens = batch(&f, "input_ids", Some("attention_mask"));
    let types = usizes(&f.ints("token_type_ids").1);
    let got = m.hidden_states(&tokens, Some(&types)).unwrap();
    assert_real_close(
        "bert. prefixed last_hidden_state",
        &got,
        &f.t("last_hidden_state"),
        &tokens.mask,
    );
}

#[test]
fn sequence_longer_than_positions_is_out_of_range() {
    let m = load_encoder("bert");
    let err = m
        .hidden_states(&TokenBatch::single(vec![5; 65]).unwrap(), None)
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(
            err,
            Error::OutOfRange {
                index: 64,
                size: 64,
                ..
            }
        ),
        "{msg}"
    );
    assert!(msg.contains("sequence longer"), "{msg}");
    // exactly max_position_embeddings tokens is fine
    m.hidden_states(&TokenBatch::single(vec![5; 64]).unwrap(), None)
        .unwrap();
}

#[test]
fn bad_token_ids_and_types_are_named() {
    let m = load_encoder("bert");
    let tokens = TokenBatch::single(vec![1, 99, 3]).unwrap();
    let msg = m.hidden_states(&tokens, None).unwrap_err().to_string();
    assert!(msg.contains("vocabulary") && msg.contains("99"), "{msg}");

    let tokens = TokenBatch::single(vec![1, 2, 3]).unwrap();
    let msg = m
        .hidden_states(&tokens, Some(&[0, 2, 0]))
        .unwrap_err()
        .to_string();
    assert!(msg.contains("type_vocab_size"), "{msg}");
    let msg = m
        .hidden_states(&tokens, Some(&[0, 1]))
        .unwrap_err()
        .to_string();
    assert!(msg.contains("token_type_ids"), "{msg}");
}

#[test]
fn relative_position_types_are_unsupported_by_name() {
    let s = Scratch::new("relpos");
    s.edit_config(|c| c["position_embedding_type"] = "relative_key".into());
    let err = load_err(s.path());
    let msg = err.to_string();
    assert!(matches!(err, Error::Unsupported(_)), "{msg}");
    assert!(
        msg.contains("position_embedding_type") && msg.contains("relative_key"),
        "{msg}"
    );
}

#[test]
fn config_errors_name_the_field() {
    for (field, value, named) in [
        (
            "num_attention_heads",
            serde_json::json!(5),
            "num_attention_heads",
        ),
        ("hidden_act", serde_json::json!("mish"), "hidden_act"),
        ("is_decoder", serde_json::json!(true), "is_decoder"),
        ("hidden_size", serde_json::json!("wide"), "hidden_size"),
    ] {
        let s = Scratch::new(field);
        s.edit_config(|c| c[field] = value);
        let msg = load_err(s.path()).to_string();
        assert!(msg.contains(named), "{field}: {msg}");
    }
}

#[test]
fn transformers_5_config_without_position_type_loads() {
    let s = Scratch::new("v5");
    s.edit_config(|c| {
        c.as_object_mut().unwrap().remove("position_embedding_type");
    });
    let m = models::load(s.path()).unwrap().model;
    let f = reference("bert");
    let tokens = batch(&f, "input_ids", Some("attention_mask"));
    let types = usizes(&f.ints("token_type_ids").1);
    assert_real_close(
        "bert (no position_embedding_type)",
        &m.hidden_states(&tokens, Some(&types)).unwrap(),
        &f.t("last_hidden_state"),
        &tokens.mask,
    );
}

/// Rows of different lengths packed into one row of tokens, no padding
/// (`hidden_states_varlen`, how `qkv embed` and the server run a batch of texts), give
/// the states each has alone; packing is refused where it cannot apply.
#[test]
fn varlen_sequences_equal_each_alone() {
    let m = load_encoder("bert");
    let vocab = m.arch.vocab;
    let sequences: Vec<Vec<usize>> = [5, 1, 9, 3]
        .iter()
        .enumerate()
        .map(|(s, &len)| (0..len).map(|i| (2 + 7 * s + 5 * i) % vocab).collect())
        .collect();
    let refs: Vec<&[usize]> = sequences.iter().map(Vec::as_slice).collect();
    assert!(m.runs_varlen());
    let packed = m.hidden_states_varlen(&refs).unwrap();
    let c = m.arch.d_model;
    assert_eq!(packed.shape(), &[18, c]);
    let mut rows = packed.data().chunks_exact(c);
    for (s, seq) in sequences.iter().enumerate() {
        let alone = m
            .hidden_states(&TokenBatch::single(seq.clone()).unwrap(), None)
            .unwrap();
        for (p, want) in alone.data().chunks_exact(c).enumerate() {
            let got = rows.next().unwrap();
            for (g, w) in got.iter().zip(want) {
                assert!(
                    (g - w).abs() <= 1e-5 + 1e-4 * w.abs(),
                    "sequence {s}, position {p}: {g} varlen, {w} alone"
                );
            }
        }
    }

    let err = m.hidden_states_varlen(&[&[1, 2], &[]]).unwrap_err();
    assert!(err.to_string().contains("sequence 1 is empty"), "{err}");
    let err = m.hidden_states_varlen(&[&[1, vocab]]).unwrap_err();
    assert!(
        matches!(err, Error::OutOfRange { index, .. } if index == vocab),
        "{err}"
    );
    assert_eq!(m.hidden_states_varlen(&[]).unwrap().shape(), &[0, c]);

    let decoder = common::models::load_causal("gpt2");
    assert!(!decoder.runs_varlen());
    let err = decoder.hidden_states_varlen(&[&[1, 2]]).unwrap_err();
    assert!(matches!(err, Error::Unsupported(_)), "{err}");
}

/// A sentence encoder embeds a batch of texts as it embeds each alone, both ways it
/// runs one: packed (learned positions) and padded (ALiBi, whose score bias a packed
/// row cannot take); a small native encoder with the WordPiece fixture tokenizer.
#[test]
fn sentence_batches_equal_each_text_alone_packed_and_padded() {
    use qkv::models::sentence::SentenceEncoder;
    use qkv::models::{Arch, Head, Position, Transformer};
    let texts = [
        "the cat sat",
        "a",
        "hello world, the quick brown fox jumps over the lazy dog",
        "cat dog",
    ];
    for (name, position, packed) in [
        ("learned", Position::Learned { max_len: 64 }, true),
        ("alibi", Position::Alibi, false),
    ] {
        let mut arch = Arch::gpt2(99, 16, 2, 2, 64);
        arch.encoder = arch.decoder.take();
        arch.position = position;
        arch.head = Head::None;
        let dir = std::env::temp_dir().join(format!("qkv-sentence-{name}-{}", std::process::id()));
        Transformer::new(&arch, 3).unwrap().save(&dir).unwrap();
        std::fs::copy(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures/tokenizers/wordpiece/tokenizer.json"),
            dir.join("tokenizer.json"),
        )
        .unwrap();
        let enc = SentenceEncoder::load(&dir).unwrap();
        assert_eq!(enc.encoder().runs_varlen(), packed, "{name}");
        let batched = enc.embed_batched(&texts, 3).unwrap();
        for (text, got) in texts.iter().zip(&batched) {
            let alone = enc.embed(&[text]).unwrap().remove(0);
            common::assert_close(&format!("{name}: {text:?}"), got, &alone, 1e-5, 1e-4);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
