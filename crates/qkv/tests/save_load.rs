//! Every folder qkv writes runs again, and Hugging Face folders stay Hugging Face
//! folders: each family's fixture, after a change of weights (as training makes),
//! saves in its own checkpoint layout (the same tensor names and shapes, GPT-2's
//! Conv1D and fused `c_attn`, BLOOM's per-head fused QKV) and loads back with the
//! same parameters and logits; architectures no Hugging Face class has save as qkv's
//! own folder and run with a KV cache. An ignored test has transformers load the
//! saved folders (it needs the fixture venv).

#![cfg(feature = "models")]

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use qkv::io::{Checkpoint, TensorFile};
use qkv::models::generate::{generate_causal, GenerateOptions, Sampling};
use qkv::models::{self, Arch, Input, ModelKind, Position, TokenBatch, Transformer};
use qkv::module::Module;
use qkv::rng::Rng;
use qkv::Tensor;

fn fixture(group: &str, name: &str) -> PathBuf {
    [env!("CARGO_MANIFEST_DIR"), "tests", "fixtures", group, name]
        .iter()
        .collect()
}

/// A fresh, empty folder under the target directory.
fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("save_load-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Moves every parameter a little, as training would.
fn perturb(m: &mut Transformer, seed: u64) {
    let mut rng = Rng::new(seed);
    for (_, p) in m.weights.params_mut() {
        for x in p.data_mut() {
            *x += rng.normal() as f32 * 0.05;
        }
    }
}

/// Token batches every kind can read: B = 2 rows of 5 tokens.
fn inputs(m: &Transformer, seed: u64) -> (TokenBatch, TokenBatch) {
    let mut rng = Rng::new(seed);
    let v = m.arch.src_vocab.unwrap_or(m.arch.vocab).min(m.arch.vocab);
    let mut row =
        || TokenBatch::new((0..10).map(|_| 3 + rng.below(v - 3)).collect(), None, 2, 5).unwrap();
    (row(), row())
}

fn logits(m: &Transformer, (a, b): &(TokenBatch, TokenBatch)) -> Tensor {
    let input = match m.kind() {
        ModelKind::Decoder => Input {
            target: Some(a),
            ..Default::default()
        },
        ModelKind::Encoder => Input {
            source: Some(a),
            ..Default::default()
        },
        ModelKind::EncoderDecoder => Input {
            source: Some(a),
            target: Some(b),
            token_types: None,
        },
    };
    m.forward(&input, false).unwrap().logits
}

/// Tensor names and shapes of a checkpoint.
fn layout(dir: &Path) -> BTreeMap<String, Vec<usize>> {
    let ckpt = Checkpoint::open(dir).unwrap();
    ckpt.names()
        .map(|n| (n.to_string(), ckpt.tensor(n).unwrap().shape().to_vec()))
        .collect()
}

const HF_FOLDERS: [(&str, &str); 40] = [
    ("models", "bert"),
    ("models", "gpt2"),
    ("models", "gpt2_sharded"),
    ("models", "llama_gqa"),
    ("models", "llama_mqa_tied"),
    ("models", "llama_bf16"),
    ("models", "llama_v5"),
    ("models", "mistral"),
    ("models", "llama3_rope"),
    ("models", "llama_yarn"),
    ("models", "qwen2"),
    ("models", "qwen2_window"),
    ("models", "qwen3"),
    ("models", "gpt_neox"),
    ("models", "gpt_neox_seq"),
    ("models", "gemma2"),
    ("models", "gemma3"),
    ("models", "phi3"),
    ("models", "roberta"),
    ("models", "xlm_roberta"),
    ("models", "distilbert"),
    ("models", "modernbert"),
    ("models", "bloom"),
    ("models", "marian"),
    ("models", "t5"),
    ("models", "t5_gated"),
    ("models", "t5_v5_untied"),
    ("train_model", "bert"),
    ("train_model", "bloom"),
    ("train_model", "qwen3"),
    ("train_model", "gpt_neox"),
    ("train_model", "gemma2"),
    ("train_model", "gemma3"),
    ("train_model", "phi3"),
    ("train_model", "roberta"),
    ("train_model", "distilbert"),
    ("train_model", "modernbert"),
    ("train_model", "marian"),
    ("train_model", "t5"),
    ("train_model", "t5_gated"),
];

/// Saves every Hugging Face fixture after moving its weights; the folder has the
/// source's tensor layout (less what qkv does not model: BERT's pooler) and loads back
/// to the same family, parameters and logits.
#[test]
fn hugging_face_folders_save_in_their_own_layout() {
    for (i, (group, name)) in HF_FOLDERS.iter().enumerate() {
        let src = fixture(group, name);
        let mut m = Transformer::load(&src).unwrap();
        perturb(&mut m, i as u64);
        let dir = scratch(&format!("{group}-{name}"));
        m.save(&dir).unwrap();
        let want: BTreeMap<String, Vec<usize>> = layout(&src)
            .into_iter()
            .filter(|(n, _)| !n.contains("pooler"))
            .collect();
        assert_eq!(layout(&dir), want, "{group}/{name}: saved layout");
        let back = models::load(&dir).unwrap().model;
        assert_eq!(back.family, m.family, "{name}");
        assert_eq!(back.arch, m.arch, "{name}");
        assert_eq!(back.info(), m.info(), "{name}");
        for ((n, a), (_, b)) in m.weights.params().into_iter().zip(back.weights.params()) {
            assert_eq!(a, b, "{group}/{name}: {n}");
        }
        let x = inputs(&m, 7);
        assert_eq!(logits(&m, &x), logits(&back, &x), "{group}/{name}: logits");
        let config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap())
                .unwrap();
        let stored = TensorFile::open(dir.join("model.safetensors")).unwrap();
        assert!(stored
            .metadata()
            .unwrap()
            .get("format")
            .is_some_and(|f| f == "pt"));
        assert_ne!(
            config["architectures"][0],
            models::NATIVE_ARCHITECTURE,
            "{name}"
        );
    }
}

/// Architectures no Hugging Face class has (ALiBi with post-norm, a sinusoidal
/// encoder-decoder with separate vocabularies) save as qkv's own folder, which loads
/// to the same model and generates with its KV cache as the full forward predicts.
#[test]
fn native_folders_round_trip_and_generate_with_a_cache() {
    let mut alibi_post = Arch::gpt2(23, 16, 2, 4, 16);
    alibi_post.position = Position::Alibi;
    alibi_post.residual = qkv::block::Residual::PostNorm;
    let mut seq2seq = Arch::vaswani(23, 16, 2, 4, 16);
    seq2seq.src_vocab = Some(19);
    for (label, arch) in [
        ("alibi_postnorm", alibi_post),
        ("vaswani_two_vocabs", seq2seq),
    ] {
        let mut m = Transformer::new(&arch, 3).unwrap();
        perturb(&mut m, 4);
        m.special.eos = vec![2];
        m.special.decoder_start = Some(1);
        let dir = scratch(label);
        m.save(&dir).unwrap();
        let config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap())
                .unwrap();
        assert_eq!(config["architectures"][0], models::NATIVE_ARCHITECTURE);
        let back = models::load(&dir).unwrap().model;
        assert_eq!(back.arch, m.arch, "{label}");
        assert_eq!(back.special, m.special, "{label}");
        let x = inputs(&m, 5);
        assert_eq!(logits(&m, &x), logits(&back, &x), "{label}");
    }
    // greedy decoding with the cache continues as the full forward's arg-max does
    let m = models::load(&scratch_keep("alibi_postnorm")).unwrap().model;
    let prompt = TokenBatch::single(vec![5, 6, 7]).unwrap();
    let opts = GenerateOptions::new(6, Sampling::Greedy, Vec::new());
    let new = generate_causal(&m, &prompt, &opts).unwrap().remove(0);
    let mut ids = prompt.ids.clone();
    for &next in &new {
        let l = logits(
            &m,
            &(
                TokenBatch::single(ids.clone()).unwrap(),
                TokenBatch::single(vec![0]).unwrap(),
            ),
        );
        let last = &l.data()[(ids.len() - 1) * 23..ids.len() * 23];
        let best = (0..23).fold(0, |b, i| if last[i] > last[b] { i } else { b });
        assert_eq!(next, best);
        ids.push(next);
    }
}

/// The folder `scratch(name)` wrote, without clearing it.
fn scratch_keep(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("save_load-{name}"))
}

/// A checkpoint that lacks a tensor is refused, naming the tensor.
#[test]
fn a_missing_tensor_is_named() {
    let m = Transformer::new(&Arch::gpt2(11, 8, 1, 2, 4), 0).unwrap();
    let dir = scratch("missing");
    m.save(&dir).unwrap();
    let kept: Vec<(String, Tensor)> = m
        .export(&m.weights)
        .unwrap()
        .into_iter()
        .filter(|(n, _)| !n.contains("mlp.c_fc.weight"))
        .collect();
    let refs: Vec<(&str, &Tensor)> = kept.iter().map(|(n, t)| (n.as_str(), t)).collect();
    qkv::io::save(&dir.join("model.safetensors"), &refs, None).unwrap();
    let e = models::load(&dir).err().unwrap().to_string();
    assert!(e.contains("mlp.c_fc.weight"), "{e}");
}

/// transformers loads every saved Hugging Face folder (no missing or unexpected
/// weights) and computes qkv's logits: `cargo test -p qkv --test save_load --
/// --ignored transformers` (needs `.venv-ref`, see tools/fixtures/README.md).
#[test]
#[ignore = "needs the Python fixture environment (.venv-ref with torch and transformers)"]
fn transformers_loads_saved_folders() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let python = std::env::var_os("QKV_REF_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join(".venv-ref/bin/python"));
    assert!(
        python.exists(),
        "no Python at {} (set QKV_REF_PYTHON)",
        python.display()
    );
    let mut dirs = Vec::new();
    let mut fresh = vec![
        (
            "fresh-gpt2",
            Transformer::new(&Arch::gpt2(40, 16, 2, 2, 12), 1).unwrap(),
        ),
        (
            "fresh-llama",
            Transformer::new(&Arch::llama(40, 16, 2, 4, 2, 12), 2).unwrap(),
        ),
        // a byte-level model, saved with the byte tokenizer below
        (
            "bytes-gpt2",
            Transformer::new(&Arch::gpt2(256, 16, 2, 2, 12), 3).unwrap(),
        ),
    ];
    for (i, (group, name)) in HF_FOLDERS.iter().enumerate() {
        // transformers 4.57 reads neither `rope_parameters` nor `scale_decoder_outputs`
        if name.ends_with("v5") || name.ends_with("v5_untied") {
            continue;
        }
        let mut m = Transformer::load(&fixture(group, name)).unwrap();
        perturb(&mut m, 50 + i as u64);
        fresh.push((Box::leak(format!("{group}-{name}").into_boxed_str()), m));
    }
    for (label, m) in fresh {
        let dir = scratch(&format!("transformers-{label}"));
        m.save(&dir).unwrap();
        if label.starts_with("bytes") {
            use qkv::text::bytes::{byte_tokenizer_config, byte_tokenizer_json};
            std::fs::write(dir.join("tokenizer.json"), byte_tokenizer_json()).unwrap();
            std::fs::write(
                dir.join("tokenizer_config.json"),
                byte_tokenizer_config(Some(12)),
            )
            .unwrap();
        }
        let (a, b) = inputs(&m, 9);
        let float = |t: &TokenBatch| {
            Tensor::new(&[t.batch, t.len], t.ids.iter().map(|&x| x as f32).collect()).unwrap()
        };
        let out = logits(&m, &(a.clone(), b.clone()));
        let mut tensors = vec![("input_ids", float(&a)), ("logits", out)];
        if m.kind() == ModelKind::EncoderDecoder {
            tensors.push(("decoder_input_ids", float(&b)));
        }
        let refs: Vec<(&str, &Tensor)> = tensors.iter().map(|(n, t)| (*n, t)).collect();
        qkv::io::save(&dir.join("qkv_check.safetensors"), &refs, None).unwrap();
        dirs.push(dir);
    }
    let out = std::process::Command::new(&python)
        .arg(root.join("tools/fixtures/check_saved.py"))
        .args(&dirs)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    eprintln!("{text}");
    assert!(out.status.success(), "check_saved.py failed:\n{text}");
}
