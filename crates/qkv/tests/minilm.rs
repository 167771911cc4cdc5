//! The real all-MiniLM-L6-v2 (BERT, 6 layers, 384 wide) against sentence-transformers:
//! tokenisation and embeddings from `tests/fixtures/minilm/reference.json`
//! (tools/fixtures/gen_minilm.py). The model is too large to commit; `.ci/run` fetches it
//! with `tools/fetch_minilm.sh DIR`, points `QKV_MINILM_DIR` at the folder and runs these
//! tests, which `cargo test` ignores, with `-- --ignored`; without the variable they fail
//! and say why.

#![cfg(feature = "models")]

mod common;

use std::path::{Path, PathBuf};

use qkv::models::sentence::{PoolingMode, SentenceEncoder};
use qkv::models::{Input, TokenBatch};
use qkv::text::Tokenizer;

/// Every embedding must point the same way as sentence-transformers' (float32 noise
/// alone stays above 0.999999).
const MIN_COSINE: f64 = 0.99999;

fn model_dir() -> PathBuf {
    match std::env::var_os("QKV_MINILM_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => panic!(
            "QKV_MINILM_DIR is not set: run `tools/fetch_minilm.sh DIR` and set QKV_MINILM_DIR=DIR, as .ci/run does"
        ),
    }
}

#[derive(serde::Deserialize)]
struct Reference {
    sentences: Vec<String>,
    input_ids: Vec<Vec<usize>>,
    embeddings: Vec<Vec<f32>>,
    max_seq_length: usize,
    normalize: bool,
}

fn reference() -> Reference {
    let path: PathBuf = [
        env!("CARGO_MANIFEST_DIR"),
        "tests",
        "fixtures",
        "minilm",
        "reference.json",
    ]
    .iter()
    .collect();
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn load(dir: &Path) -> SentenceEncoder {
    SentenceEncoder::load(dir).unwrap_or_else(|e| panic!("loading {}: {e}", dir.display()))
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum();
    let na: f64 = a.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

/// The lowest cosine between `got` and the reference, asserting each is ≥ MIN_COSINE.
fn check_embeddings(what: &str, r: &Reference, got: &[Vec<f32>]) -> f64 {
    assert_eq!(got.len(), r.embeddings.len(), "{what}: count");
    let mut min = f64::INFINITY;
    for ((s, g), want) in r.sentences.iter().zip(got).zip(&r.embeddings) {
        assert_eq!(g.len(), want.len(), "{what}: dimension of {s:?}");
        let c = cosine(g, want);
        assert!(
            c >= MIN_COSINE,
            "{what}: cosine {c} < {MIN_COSINE} for {s:?}"
        );
        min = min.min(c);
    }
    min
}

fn texts(r: &Reference) -> Vec<&str> {
    r.sentences.iter().map(String::as_str).collect()
}

#[test]
#[ignore = "needs all-MiniLM-L6-v2: set QKV_MINILM_DIR (tools/fetch_minilm.sh DIR), as .ci/run does"]
fn configuration_is_read_from_the_folder() {
    let dir = model_dir();
    let r = reference();
    let enc = load(&dir);
    assert_eq!(enc.max_seq_length(), r.max_seq_length);
    assert_eq!(enc.pooling(), [PoolingMode::Mean]);
    assert_eq!(enc.normalizes(), r.normalize);
    assert_eq!(enc.dim(), 384);
    let info = enc.encoder().info();
    assert_eq!(
        (info.family.as_str(), info.layers, info.hidden),
        ("bert", 6, 384)
    );
}

#[test]
#[ignore = "needs all-MiniLM-L6-v2: set QKV_MINILM_DIR (tools/fetch_minilm.sh DIR), as .ci/run does"]
fn tokenization_matches_sentence_transformers() {
    let dir = model_dir();
    let r = reference();
    let enc = load(&dir);
    for (s, want) in r.sentences.iter().zip(&r.input_ids) {
        let got = enc.tokenize(&[s]).unwrap();
        assert_eq!(&got.ids, want, "input_ids of {s:?}");
        assert!(
            got.mask.iter().all(|&m| m),
            "{s:?}: unpadded row has padding"
        );
    }
    // In one batch each row is its ids followed by masked padding.
    let batch = enc.tokenize(&texts(&r)).unwrap();
    for (row, want) in r.input_ids.iter().enumerate() {
        let ids = &batch.ids[row * batch.len..(row + 1) * batch.len];
        let mask = &batch.mask[row * batch.len..(row + 1) * batch.len];
        assert_eq!(&ids[..want.len()], want.as_slice(), "batched row {row}");
        assert!(mask[..want.len()].iter().all(|&m| m) && mask[want.len()..].iter().all(|&m| !m));
    }
}

/// Truncation to max_seq_length keeps [SEP] last, as the HF tokenizer does.
#[test]
#[ignore = "needs all-MiniLM-L6-v2: set QKV_MINILM_DIR (tools/fetch_minilm.sh DIR), as .ci/run does"]
fn long_text_is_cut_to_max_seq_length_keeping_sep() {
    let dir = model_dir();
    let enc = load(&dir);
    let long = "attention is all you need ".repeat(100);
    let cut = enc.tokenize(&[&long]).unwrap();
    assert_eq!(cut.len, enc.max_seq_length());
    let (cls, sep) = (101, 102);
    assert_eq!(cut.ids[0], cls);
    assert_eq!(*cut.ids.last().unwrap(), sep);
    // the kept text tokens are the first ones of the untruncated text
    let short = enc.tokenize(&["attention is all you need"]).unwrap();
    assert_eq!(cut.ids[1..6], short.ids[1..6]);
    let v = enc.embed(&[&long]).unwrap();
    assert_eq!(v[0].len(), 384);
}

#[test]
#[ignore = "needs all-MiniLM-L6-v2: set QKV_MINILM_DIR (tools/fetch_minilm.sh DIR), as .ci/run does"]
fn embeddings_match_sentence_transformers() {
    let dir = model_dir();
    let r = reference();
    let enc = load(&dir);
    let got = enc.embed(&texts(&r)).unwrap();
    let min = check_embeddings("batched", &r, &got);
    let worst = got
        .iter()
        .flatten()
        .zip(r.embeddings.iter().flatten())
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    println!(
        "minilm: {} sentences, min cosine {min:.12} (1 - cos = {:.1e}), max |diff| {worst:e}",
        got.len(),
        1.0 - min
    );
    for (s, v) in r.sentences.iter().zip(&got) {
        let norm = v.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "{s:?}: norm {norm}");
    }
}

/// Each text alone gives the embedding it gets in a padded batch.
#[test]
#[ignore = "needs all-MiniLM-L6-v2: set QKV_MINILM_DIR (tools/fetch_minilm.sh DIR), as .ci/run does"]
fn batching_does_not_change_embeddings() {
    let dir = model_dir();
    let r = reference();
    let enc = load(&dir);
    let alone: Vec<Vec<f32>> = r
        .sentences
        .iter()
        .map(|s| enc.embed(&[s]).unwrap().remove(0))
        .collect();
    check_embeddings("one at a time", &r, &alone);
    // batches of 32 (all at once here) and of 3 (grouped by token count across calls)
    for batch in [32, 3] {
        let batched = enc.embed_batched(&texts(&r), batch).unwrap();
        for ((s, a), b) in r.sentences.iter().zip(&alone).zip(&batched) {
            for (x, y) in a.iter().zip(b) {
                assert!(
                    (x - y).abs() < 1e-5,
                    "{s:?}: {x} alone vs {y} in batches of {batch}"
                );
            }
        }
    }
    assert!(enc.embed(&[]).unwrap().is_empty());
    let err = enc.embed_batched(&texts(&r), 0).unwrap_err().to_string();
    assert!(err.contains("batch_size"), "{err}");
}

/// Without modules.json the folder is a plain BERT model; sentence-transformers then
/// builds Transformer + mean pooling without Normalize, and so does qkv.
#[cfg(unix)]
#[test]
#[ignore = "needs all-MiniLM-L6-v2: set QKV_MINILM_DIR (tools/fetch_minilm.sh DIR), as .ci/run does"]
fn folder_without_modules_json_is_mean_pooled_unnormalized() {
    let dir = model_dir();
    let plain = std::env::temp_dir().join(format!("qkv-minilm-plain-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&plain);
    std::fs::create_dir_all(&plain).unwrap();
    for name in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        std::os::unix::fs::symlink(dir.join(name), plain.join(name)).unwrap();
    }
    let enc = load(&plain);
    assert_eq!(enc.pooling(), [PoolingMode::Mean]);
    assert!(!enc.normalizes());
    // min(max_position_embeddings, tokenizer model_max_length) = min(512, 512)
    assert_eq!(enc.max_seq_length(), 512);
    let r = reference();
    let got = enc.embed(&texts(&r)).unwrap();
    std::fs::remove_dir_all(&plain).unwrap();
    for v in &got {
        let norm = v.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
        assert!(
            (norm - 1.0).abs() > 1e-2,
            "mean pooling alone is not unit length"
        );
    }
    // normalising the plain mean gives the sentence-transformers embedding back
    check_embeddings("plain mean, direction", &r, &got);
}

/// Where `it` attends most to `animal` in "The animal didn't cross the street because it
/// was too tired.": layer 3, head 1 (from 0), as docs/attention-maps.md says; transformers agrees
/// (`strongest_layer` / `strongest_head` in the fixture).
const IT_TO_ANIMAL: (usize, usize) = (3, 1);

#[test]
#[ignore = "needs all-MiniLM-L6-v2: set QKV_MINILM_DIR (tools/fetch_minilm.sh DIR), as .ci/run does"]
fn attention_weights_on_the_animal_sentence_match_transformers() {
    let dir = model_dir();
    let f = common::fixture("minilm", "animal");
    let text = f.params["text"].as_str().unwrap();
    let tok = Tokenizer::from_dir(&dir).unwrap();
    let ids = tok.encode(text, true).unwrap();
    let want_ids: Vec<usize> = f.ints("input_ids").1.iter().map(|&i| i as usize).collect();
    assert_eq!(ids, want_ids);
    let labels: Vec<String> = tok
        .labels(&ids, &[])
        .unwrap()
        .iter()
        .map(|l| l.label())
        .collect();
    let tokens: Vec<&str> = f.params["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(labels, tokens);

    let model = qkv::models::load(&dir).unwrap().model;
    let batch = TokenBatch::single(ids).unwrap();
    let input = Input {
        source: Some(&batch),
        ..Default::default()
    };
    let maps = model.forward(&input, true).unwrap().attentions.encoder;
    assert_eq!(maps.len(), 6);
    for (l, got) in maps.iter().enumerate() {
        let want = f.t(&format!("attentions.{l}"));
        common::assert_tensor_close(&format!("layer {l}"), got, &want, 1e-5, 0.0);
    }

    // the measurement docs/attention-maps.md quotes
    let (it, animal) = (labels.iter().position(|t| t == "it").unwrap(), 2);
    assert_eq!(labels[animal], "animal");
    let t = labels.len();
    let mut best = (0.0f32, 0, 0);
    for (l, m) in maps.iter().enumerate() {
        for h in 0..12 {
            let w = m.data()[(h * t + it) * t + animal];
            if w > best.0 {
                best = (w, l, h);
            }
        }
    }
    let reference = (
        f.params["strongest_layer"].as_u64().unwrap() as usize,
        f.params["strongest_head"].as_u64().unwrap() as usize,
    );
    assert_eq!((best.1, best.2), reference);
    assert_eq!((best.1, best.2), IT_TO_ANIMAL);
    let weight = f.params["strongest_weight"].as_f64().unwrap() as f32;
    assert!((best.0 - weight).abs() < 1e-5, "{} vs {weight}", best.0);
}

/// Rollout, attention flow and norm-based attention of the articles' sentence equal the
/// PyTorch and networkx references (`tools/fixtures/gen_attribution.py`), to 1e-4.
#[test]
#[ignore = "needs all-MiniLM-L6-v2: set QKV_MINILM_DIR (tools/fetch_minilm.sh DIR), as .ci/run does"]
fn rollout_flow_and_value_norms_of_the_animal_sentence_equal_the_references() {
    let f = common::fixture("attribution", "minilm");
    let ids: Vec<usize> = f.ints("input_ids").1.iter().map(|&i| i as usize).collect();
    let model = qkv::models::load(&model_dir()).unwrap().model;
    let batch = TokenBatch::single(ids).unwrap();
    let input = Input {
        source: Some(&batch),
        ..Default::default()
    };
    let maps: Vec<qkv::Tensor> = model
        .forward(&input, true)
        .unwrap()
        .attentions
        .encoder
        .into_iter()
        .map(|m| m.clone().reshape(&m.shape()[1..]).unwrap())
        .collect();
    for (method, got) in [
        ("rollout", qkv::attribution::rollout(&maps).unwrap()),
        ("flow", qkv::attribution::flow(&maps).unwrap()),
    ] {
        for (l, g) in got.iter().enumerate() {
            let want = f.t(&format!("{method}.{l}"));
            common::assert_tensor_close(&format!("minilm {method}.{l}"), g, &want, 1e-4, 0.0);
        }
    }
    let norms = model.value_norms(&input).unwrap().encoder;
    for (l, n) in norms.iter().enumerate() {
        let got = n.clone().reshape(&n.shape()[1..]).unwrap();
        let want = f.t(&format!("value_norm.{l}"));
        common::assert_tensor_close(&format!("minilm value_norm.{l}"), &got, &want, 1e-4, 0.0);
    }
}

/// Gradient × attention and ablation of the animal sentence for the cosine between its
/// embedding and another sentence's (mean pooling, as sentence-transformers pools; the
/// hidden key also left out of the mean) equal autograd and Hugging Face forwards with a
/// hole in `attention_mask` (`tools/fixtures/gen_attribution.py`), to 1e-4.
#[test]
#[ignore = "needs all-MiniLM-L6-v2: set QKV_MINILM_DIR (tools/fetch_minilm.sh DIR), as .ci/run does"]
fn gradient_and_ablation_of_a_sentence_cosine_equal_the_references() {
    use qkv::models::explain::{attribute, Method, Target};
    let f = common::fixture("attribution", "minilm");
    let ids: Vec<usize> = f.ints("input_ids").1.iter().map(|&i| i as usize).collect();
    let encoder = load(&model_dir());
    let compare = f.params["compare"].as_str().unwrap();
    let target = Target::Cosine {
        with: encoder.embed(&[compare]).unwrap().remove(0),
        pooling: encoder.pooling().to_vec(),
    };
    let model = qkv::models::load(&model_dir()).unwrap().model;
    let batch = TokenBatch::single(ids).unwrap();
    let input = Input {
        source: Some(&batch),
        ..Default::default()
    };
    let (_, grads) = model
        .attention_grads(&input, |h| {
            let fixed = target.resolve(h, &vec![true; batch.len])?;
            fixed.target.gradient(h)
        })
        .unwrap();
    for (l, g) in grads.encoder.iter().enumerate() {
        let got = g.clone().reshape(&g.shape()[1..]).unwrap();
        let want = f.t(&format!("grad_maps.{l}"));
        common::assert_tensor_close(&format!("minilm grad_maps.{l}"), &got, &want, 1e-4, 1e-3);
    }
    let r = attribute(&model, &input, Method::Grad, Some(&target)).unwrap();
    for (l, g) in r.maps.encoder.iter().enumerate() {
        let want = f.t(&format!("grad.{l}"));
        let got = g.clone().reshape(want.shape()).unwrap();
        common::assert_tensor_close(&format!("minilm grad.{l}"), &got, &want, 1e-4, 1e-3);
    }
    let a = attribute(&model, &input, Method::Ablation, Some(&target)).unwrap();
    let scores = qkv::Tensor::new(&[batch.len], a.scores.unwrap()).unwrap();
    common::assert_tensor_close("minilm ablation", &scores, &f.t("ablation"), 1e-4, 0.0);
}
