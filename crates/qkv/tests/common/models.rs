//! The checks every model family runs against its Hugging Face fixture in
//! `tests/fixtures/models/<name>/` (tools/fixtures/gen_models.py): forward logits with
//! right and left padding, cached decoding equal to the full forward, and greedy
//! generation equal to `model.generate`. Tolerance: atol 1e-4 + rtol 1e-3.

use std::path::{Path, PathBuf};

use qkv::models::generate::{generate_causal, generate_seq2seq, GenerateOptions, Sampling};
use qkv::models::{self, ModelKind, TokenBatch, Transformer};
use qkv::Tensor;

use super::{assert_close, fixture, Fixture};

pub const ATOL: f32 = 1e-4;
pub const RTOL: f32 = 1e-3;

pub fn model_dir(name: &str) -> PathBuf {
    [
        env!("CARGO_MANIFEST_DIR"),
        "tests",
        "fixtures",
        "models",
        name,
    ]
    .iter()
    .collect()
}

pub fn reference(name: &str) -> Fixture {
    fixture(&format!("models/{name}"), "reference")
}

pub fn load(name: &str) -> Transformer {
    models::load(&model_dir(name))
        .unwrap_or_else(|e| panic!("loading {name}: {e}"))
        .model
}

fn load_kind(name: &str, kind: ModelKind) -> Transformer {
    let m = load(name);
    assert_eq!(m.kind(), kind, "{name}");
    m
}

pub fn load_causal(name: &str) -> Transformer {
    load_kind(name, ModelKind::Decoder)
}

pub fn load_seq2seq(name: &str) -> Transformer {
    load_kind(name, ModelKind::EncoderDecoder)
}

pub fn load_encoder(name: &str) -> Transformer {
    load_kind(name, ModelKind::Encoder)
}

fn usizes(v: &[i64]) -> Vec<usize> {
    v.iter().map(|&x| x as usize).collect()
}

/// A TokenBatch from an ids tensor and an optional mask tensor of the fixture.
pub fn batch(f: &Fixture, ids: &str, mask: Option<&str>) -> TokenBatch {
    let (shape, ids) = f.ints(ids);
    let mask = mask.map(|m| f.bools(m).1);
    TokenBatch::new(usizes(&ids), mask, shape[0], shape[1]).unwrap()
}

/// Compares [B, T, X] outputs at real positions only (padding outputs are unspecified).
pub fn assert_real_close(what: &str, got: &Tensor, want: &Tensor, mask: &[bool]) {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    let x = got.last_dim();
    for (pos, &real) in mask.iter().enumerate() {
        if real {
            let (g, w) = (&got.data()[pos * x..][..x], &want.data()[pos * x..][..x]);
            assert_close(&format!("{what} at flat position {pos}"), g, w, ATOL, RTOL);
        }
    }
}

/// Rows [t0, t1) of every batch row of [B, T, X] as a [B, t1 − t0, X] tensor.
fn columns(x: &Tensor, t0: usize, t1: usize) -> Tensor {
    let (b, t, d) = (x.shape()[0], x.shape()[1], x.shape()[2]);
    let mut out = Vec::with_capacity(b * (t1 - t0) * d);
    for r in 0..b {
        out.extend_from_slice(&x.data()[(r * t + t0) * d..(r * t + t1) * d]);
    }
    Tensor::new(&[b, t1 - t0, d], out).unwrap()
}

/// Columns [t0, t1) of a batch.
fn sub_batch(b: &TokenBatch, t0: usize, t1: usize) -> TokenBatch {
    let pick = |v: &[usize]| -> Vec<usize> {
        (0..b.batch)
            .flat_map(|r| v[r * b.len + t0..r * b.len + t1].to_vec())
            .collect()
    };
    let mask: Vec<bool> = (0..b.batch)
        .flat_map(|r| b.mask[r * b.len + t0..r * b.len + t1].to_vec())
        .collect();
    TokenBatch::new(pick(&b.ids), Some(mask), b.batch, t1 - t0).unwrap()
}

/// Expected new tokens per row: generate's output after the prompt, cut after the
/// first EOS (Hugging Face pads finished rows with the pad token afterwards).
fn expected_new_tokens(
    f: &Fixture,
    output: &str,
    prompt_len: usize,
    eos: &[usize],
) -> Vec<Vec<usize>> {
    let (shape, out) = f.ints(output);
    (0..shape[0])
        .map(|r| {
            let row = usizes(&out[r * shape[1] + prompt_len..(r + 1) * shape[1]]);
            match row.iter().position(|t| eos.contains(t)) {
                Some(i) => row[..=i].to_vec(),
                None => row,
            }
        })
        .collect()
}

fn greedy(f: &Fixture, eos: Vec<usize>) -> GenerateOptions {
    GenerateOptions::new(
        f.param_usize("max_new_tokens")
            .expect("max_new_tokens param"),
        Sampling::Greedy,
        eos,
    )
}

/// Forward (right and left padding), cache and greedy generation of a decoder-only
/// family against its fixture.
pub fn check_causal(name: &str) {
    check_causal_model(name, &load_causal(name));
}

/// [`check_causal`] on `m`, a model of the fixture `name` loaded some other way (a
/// GGUF file of it).
pub fn check_causal_model(name: &str, m: &Transformer) {
    let f = reference(name);
    for (ids, mask, logits) in [
        ("input_ids", "attention_mask", "logits"),
        ("left_input_ids", "left_attention_mask", "left_logits"),
    ] {
        let tokens = batch(&f, ids, Some(mask));
        let got = m
            .forward_cached(&tokens, &mut m.new_cache(tokens.batch))
            .unwrap();
        assert_real_close(
            &format!("{name} {logits}"),
            &got,
            &f.t(logits),
            &tokens.mask,
        );
    }

    // Cached decoding: a 3-token prefill, then one token per step, must reproduce the
    // full forward's logits on the left-padded batch.
    let tokens = batch(&f, "left_input_ids", Some("left_attention_mask"));
    let full = f.t("left_logits");
    // the prompt's prefill for generation: the last position's logits alone
    let last = m.prefill(&tokens, &mut m.new_cache(tokens.batch)).unwrap();
    assert_real_close(
        &format!("{name} prefill"),
        &last,
        &columns(&full, tokens.len - 1, tokens.len),
        &vec![true; tokens.batch],
    );
    let mut cache = m.new_cache(tokens.batch);
    let mut t0 = 0;
    for t1 in std::iter::once(3).chain(4..=tokens.len) {
        let step = sub_batch(&tokens, t0, t1);
        let got = m.forward_cached(&step, &mut cache).unwrap();
        assert_real_close(
            &format!("{name} cached step {t0}..{t1}"),
            &got,
            &columns(&full, t0, t1),
            &step.mask,
        );
        t0 = t1;
    }

    let eos = m.special_tokens().eos.clone();
    let prompt = batch(&f, "gen_prompt", None);
    let got = generate_causal(m, &prompt, &greedy(&f, eos.clone())).unwrap();
    assert_eq!(
        got,
        expected_new_tokens(&f, "gen_output", prompt.len, &eos),
        "{name} greedy generation"
    );

    let prompts = batch(&f, "gen_batch_prompt", Some("gen_batch_mask"));
    let got = generate_causal(m, &prompts, &greedy(&f, eos.clone())).unwrap();
    assert_eq!(
        got,
        expected_new_tokens(&f, "gen_batch_output", prompts.len, &eos),
        "{name} batched greedy generation"
    );
}

/// Forward, cache and greedy generation of an encoder-decoder against its fixture.
pub fn check_seq2seq(name: &str) {
    let f = reference(name);
    let m = load_seq2seq(name);
    let src = batch(&f, "input_ids", Some("attention_mask"));
    let tgt = batch(&f, "decoder_input_ids", None);
    let enc = m.encode(&src).unwrap();
    let full = m
        .decode_cached(&tgt, &enc, &mut m.new_cache(src.batch))
        .unwrap();
    assert_real_close(&format!("{name} logits"), &full, &f.t("logits"), &tgt.mask);

    let mut cache = m.new_cache(src.batch);
    for t in 0..tgt.len {
        let step = sub_batch(&tgt, t, t + 1);
        let got = m.decode_cached(&step, &enc, &mut cache).unwrap();
        assert_real_close(
            &format!("{name} cached step {t}"),
            &got,
            &columns(&full, t, t + 1),
            &step.mask,
        );
    }

    let eos = m.special_tokens().eos.clone();
    let src = batch(&f, "gen_prompt", None);
    let got = generate_seq2seq(&m, &src, &greedy(&f, eos.clone())).unwrap();
    // generate's output starts with the decoder start token.
    assert_eq!(
        got,
        expected_new_tokens(&f, "gen_output", 1, &eos),
        "{name} greedy generation"
    );
}

/// A copy of a fixture folder under the system temp dir, with config.json edited;
/// removed on drop.
pub struct EditedFixture(PathBuf);

impl EditedFixture {
    pub fn new(name: &str, edit: impl FnOnce(&mut serde_json::Value)) -> Self {
        static COUNTER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "qkv-test-{name}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let src = model_dir(name);
        for entry in std::fs::read_dir(&src).unwrap() {
            let path = entry.unwrap().path();
            std::fs::copy(&path, dir.join(path.file_name().unwrap())).unwrap();
        }
        let config = dir.join("config.json");
        let mut json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
        edit(&mut json);
        std::fs::write(&config, serde_json::to_string_pretty(&json).unwrap()).unwrap();
        EditedFixture(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn load_causal(&self) -> Transformer {
        qkv::models::load(self.path()).unwrap().model
    }
}

impl Drop for EditedFixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
