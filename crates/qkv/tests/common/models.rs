//! The checks every model family runs against its Hugging Face fixture in
//! `tests/fixtures/models/<name>/` (tools/fixtures/gen_models.py): forward logits with
//! right and left padding, cached decoding equal to the full forward, and greedy
//! generation equal to `model.generate`. Tolerance: atol 1e-4 + rtol 1e-3.

use std::path::{Path, PathBuf};

use qkv::models::generate::{generate_causal, generate_seq2seq, GenerateOptions, Sampling};
use qkv::models::{self, Input, ModelKind, TokenBatch, Transformer};
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
    check_causal_against(name, &reference(name), m);
}

/// [`check_causal`]'s checks of `m` against the reference `f` (a `models/<name>` one or
/// its transformers-5 twin's); `name` labels the failures.
pub fn check_causal_against(name: &str, f: &Fixture, m: &Transformer) {
    for (ids, mask, logits) in [
        ("input_ids", "attention_mask", "logits"),
        ("left_input_ids", "left_attention_mask", "left_logits"),
    ] {
        let tokens = batch(f, ids, Some(mask));
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
    let tokens = batch(f, "left_input_ids", Some("left_attention_mask"));
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

    check_causal_generation(name, f, m);

    let eos = m.special_tokens().eos.clone();
    let prompts = batch(f, "gen_batch_prompt", Some("gen_batch_mask"));
    let got = generate_causal(m, &prompts, &greedy(f, eos.clone())).unwrap();
    assert_eq!(
        got,
        expected_new_tokens(f, "gen_batch_output", prompts.len, &eos),
        "{name} batched greedy generation"
    );
}

/// Greedy generation from `gen_prompt` equal to `gen_output`'s new tokens (cut after
/// the first EOS).
pub fn check_causal_generation(name: &str, f: &Fixture, m: &Transformer) {
    let eos = m.special_tokens().eos.clone();
    let prompt = batch(f, "gen_prompt", None);
    let got = generate_causal(m, &prompt, &greedy(f, eos.clone())).unwrap();
    assert_eq!(
        got,
        expected_new_tokens(f, "gen_output", prompt.len, &eos),
        "{name} greedy generation"
    );
}

/// Forward, cache and greedy generation of an encoder-decoder against its fixture.
pub fn check_seq2seq(name: &str) {
    check_seq2seq_against(name, &reference(name), &load_seq2seq(name));
}

/// [`check_seq2seq`]'s checks of `m` against the reference `f`.
pub fn check_seq2seq_against(name: &str, f: &Fixture, m: &Transformer) {
    assert_eq!(m.kind(), ModelKind::EncoderDecoder, "{name}");
    let src = batch(f, "input_ids", Some("attention_mask"));
    let tgt = batch(f, "decoder_input_ids", None);
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
    let src = batch(f, "gen_prompt", None);
    let got = generate_seq2seq(m, &src, &greedy(f, eos.clone())).unwrap();
    // generate's output starts with the decoder start token.
    assert_eq!(
        got,
        expected_new_tokens(f, "gen_output", 1, &eos),
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

/// Encoders: `last_hidden_state` at real positions (with the fixture's `token_type_ids`
/// when it has them), and every row run alone (unpadded) giving its states in the batch.
pub fn check_encoder_against(name: &str, f: &Fixture, m: &Transformer) {
    assert_eq!(m.kind(), ModelKind::Encoder, "{name}");
    let tokens = batch(f, "input_ids", Some("attention_mask"));
    let types: Option<Vec<usize>> = f
        .has("token_type_ids")
        .then(|| usizes(&f.ints("token_type_ids").1));
    let got = m.hidden_states(&tokens, types.as_deref()).unwrap();
    assert_real_close(
        &format!("{name} last_hidden_state"),
        &got,
        &f.t("last_hidden_state"),
        &tokens.mask,
    );
    let (t, c) = (tokens.len, got.last_dim());
    for r in 0..tokens.batch {
        let n = tokens.mask[r * t..(r + 1) * t]
            .iter()
            .filter(|&&x| x)
            .count();
        let alone = TokenBatch::single(tokens.ids[r * t..r * t + n].to_vec()).unwrap();
        let one = m
            .hidden_states(&alone, types.as_ref().map(|v| &v[r * t..r * t + n]))
            .unwrap();
        assert_close(
            &format!("{name} row {r} alone"),
            one.data(),
            &got.data()[r * t * c..(r * t + n) * c],
            1e-5,
            1e-4,
        );
    }
}

/// Compares `got` with the fixture's `{prefix}.{l}` for each layer (as many as the
/// fixture has), at query rows whose token is real (`query_mask`: `[B·T]`); every key
/// of such a row. Tolerance atol 1e-5 + rtol 1e-4 (attention_maps.rs).
pub fn check_maps(name: &str, prefix: &str, got: &[Tensor], f: &Fixture, query_mask: &[bool]) {
    let layers = (0..)
        .take_while(|l| f.has(&format!("{prefix}.{l}")))
        .count();
    assert!(layers > 0, "{name}: the fixture has no {prefix}.0");
    assert_eq!(got.len(), layers, "{name}: {prefix} layers");
    for (l, g) in got.iter().enumerate() {
        let w = f.t(&format!("{prefix}.{l}"));
        assert_eq!(g.shape(), w.shape(), "{name} {prefix}.{l}");
        let (b, h, t, s) = (w.shape()[0], w.shape()[1], w.shape()[2], w.shape()[3]);
        for r in 0..b {
            for i in (0..t).filter(|&i| query_mask[r * t + i]) {
                for head in 0..h {
                    let at = ((r * h + head) * t + i) * s;
                    assert_close(
                        &format!("{name} {prefix}.{l} row {r} head {head} query {i}"),
                        &g.data()[at..at + s],
                        &w.data()[at..at + s],
                        1e-5,
                        1e-4,
                    );
                }
            }
        }
    }
}

/// Whether the reference holds attention weights (`attentions.0`, or
/// `encoder_attentions.0` for an encoder-decoder).
pub fn has_attentions(f: &Fixture) -> bool {
    f.has("attentions.0") || f.has("encoder_attentions.0")
}

/// Every layer's attention weights of the batch forward (`Transformer::forward` with
/// attentions) against transformers' `output_attentions=True`: self-attention of a
/// decoder or an encoder, or an encoder-decoder's three kinds.
pub fn check_attentions_against(name: &str, f: &Fixture, m: &Transformer) {
    assert!(has_attentions(f), "{name}: the reference has no attentions");
    match m.kind() {
        ModelKind::EncoderDecoder => {
            let src = batch(f, "input_ids", Some("attention_mask"));
            let tgt = batch(f, "decoder_input_ids", None);
            let input = Input {
                source: Some(&src),
                target: Some(&tgt),
                token_types: None,
            };
            let a = m.forward(&input, true).unwrap().attentions;
            check_maps(name, "encoder_attentions", &a.encoder, f, &src.mask);
            check_maps(name, "decoder_attentions", &a.decoder, f, &tgt.mask);
            check_maps(name, "cross_attentions", &a.cross, f, &tgt.mask);
        }
        kind => {
            let tokens = batch(f, "input_ids", Some("attention_mask"));
            let types: Option<Vec<usize>> = f
                .has("token_type_ids")
                .then(|| usizes(&f.ints("token_type_ids").1));
            let input = match kind {
                ModelKind::Encoder => Input {
                    source: Some(&tokens),
                    token_types: types.as_deref(),
                    target: None,
                },
                _ => Input {
                    target: Some(&tokens),
                    ..Default::default()
                },
            };
            let out = m.forward(&input, true).unwrap();
            let maps = match kind {
                ModelKind::Encoder => &out.attentions.encoder,
                _ => &out.attentions.decoder,
            };
            check_maps(name, "attentions", maps, f, &tokens.mask);
        }
    }
}

/// Each step of greedy generation from `gen_prompt`, decoded with the cache one token at
/// a time, against `gen_logits` (transformers' cached `generate`): for dynamic RoPE
/// scaling, whose cached keys keep the table of their own step.
pub fn check_generation_steps(name: &str, f: &Fixture, m: &Transformer) {
    let prompt = batch(f, "gen_prompt", None);
    let output = f.ints("gen_output").1;
    let want = f.t("gen_logits");
    let (steps, vocab) = (want.shape()[1], want.shape()[2]);
    let mut cache = m.new_cache(1);
    let mut input = prompt.clone();
    for step in 0..steps {
        let got = m.forward_cached(&input, &mut cache).unwrap();
        let last = &got.data()[(input.len - 1) * vocab..][..vocab];
        assert_close(
            &format!(
                "{name} generation step {step} (position {})",
                prompt.len + step - 1
            ),
            last,
            &want.data()[step * vocab..][..vocab],
            1e-4,
            1e-4,
        );
        let next = output[prompt.len + step] as usize;
        input = TokenBatch::new(vec![next], None, 1, 1).unwrap();
    }
}

/// LongRoPE past the pre-training length (`switch` positions): greedy decoding from
/// `long_prompt` equals `long_gen_output`, and each step's logits equal transformers'
/// full no-cache forward (`long_gen_logits`) when decoding as generation does: the cache
/// is recomputed once, when the new token is the first past the switch (without that,
/// keys rotated with the short factors stay, and the logits differ).
pub fn check_long_rope(name: &str, f: &Fixture, m: &Transformer, switch: usize) {
    assert_eq!(m.long_rope_switch(), Some(switch), "{name}");
    let prompt = batch(f, "long_prompt", None);
    let output = f.ints("long_gen_output").1;
    let want = f.t("long_gen_logits");
    let (steps, vocab) = (want.shape()[1], want.shape()[2]);
    let eos = m.special_tokens().eos.clone();
    let opts = GenerateOptions::new(steps, Sampling::Greedy, eos);
    let got = generate_causal(m, &prompt, &opts).unwrap();
    let new: Vec<usize> = output[prompt.len..].iter().map(|&t| t as usize).collect();
    assert_eq!(got, vec![new], "{name} greedy generation across the switch");

    let mut cache = m.new_cache(1);
    let mut seen = prompt.clone();
    let mut input = prompt.clone();
    let mut switched = false;
    for step in 0..steps {
        if step > 0 {
            seen = seen.append(&input).unwrap();
        }
        if cache.len() == switch {
            let kept = m.forward_cached(&input, &mut cache.clone()).unwrap();
            let worst = kept.data()[..vocab]
                .iter()
                .zip(&want.data()[step * vocab..][..vocab])
                .fold(0.0f32, |w, (a, b)| w.max((a - b).abs()));
            assert!(
                worst > 1e-2,
                "{name}: the recompute changes nothing ({worst})"
            );
            cache = m.new_cache(1);
            input = seen.clone();
            switched = true;
        }
        let got = m.forward_cached(&input, &mut cache).unwrap();
        let last = &got.data()[(input.len - 1) * vocab..][..vocab];
        assert_close(
            &format!("{name} step {step} (position {})", prompt.len + step - 1),
            last,
            &want.data()[step * vocab..][..vocab],
            1e-4,
            1e-4,
        );
        let next = output[prompt.len + step] as usize;
        input = TokenBatch::new(vec![next], None, 1, 1).unwrap();
    }
    assert!(switched, "{name}: the steps cross the switch");
}

/// `tests/fixtures/<rel>`.
pub fn fixtures_dir(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("fixtures")
        .join(rel)
}

/// A transformers-5.x twin of a 4.57 fixture folder (`tests/fixtures/<group>_v5/<name>/`,
/// written by `tools/fixtures/gen_v5.py`) assembled as the folder 5.x saved: its
/// `config.json` and `generation_config.json` (when 5.x wrote one) copied into a fresh
/// folder under the system temp dir, with the weights of the 4.57 folder its params'
/// `weights_from` names (5.x saved them bit for bit), or its own `model.safetensors`
/// when 5.x's differ. Removed on drop.
pub struct Twin {
    dir: PathBuf,
    /// `<group>_v5/<name>`, for failure messages.
    pub label: String,
    /// The twin's `reference.safetensors`: the 4.57 inputs and transformers 5.x's outputs.
    pub reference: Fixture,
}

impl Twin {
    /// The twin of `models/<name>`.
    pub fn model(name: &str) -> Twin {
        Twin::new("models", name)
    }

    /// The twin of `train_model/<name>`.
    pub fn train(name: &str) -> Twin {
        Twin::new("train_model", name)
    }

    /// The twin of `classify/<name>`.
    pub fn classifier(name: &str) -> Twin {
        Twin::new("classify", name)
    }

    fn new(group: &str, name: &str) -> Twin {
        static COUNTER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let label = format!("{group}_v5/{name}");
        let src = fixtures_dir(&label);
        let regen = format!("run `.venv-ref5/bin/python tools/fixtures/gen_v5.py {group}/{name}`");
        assert!(
            src.join("reference.safetensors").is_file() && src.join("config.json").is_file(),
            "missing transformers-5 twin {}: no reference.safetensors or config.json ({regen})",
            src.display()
        );
        let reference = fixture(&label, "reference");
        assert_eq!(
            reference.param_str("twin_of"),
            Some(format!("{group}/{name}").as_str()),
            "{label}: params twin_of"
        );
        let version = reference
            .param_str("config_transformers_version")
            .unwrap_or_default();
        assert!(
            version.starts_with("5."),
            "{label}: written by transformers {version:?}, not 5.x ({regen})"
        );
        let config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap())
                .unwrap();
        assert_eq!(
            config["transformers_version"].as_str(),
            Some(version),
            "{label}: config.json's transformers_version"
        );

        let dir = std::env::temp_dir().join(format!(
            "qkv-v5-{group}-{name}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let twin = Twin {
            dir,
            label,
            reference,
        };
        for file in ["config.json", "generation_config.json"] {
            if src.join(file).is_file() {
                std::fs::copy(src.join(file), twin.dir.join(file)).unwrap();
            }
        }
        let own = src.join("model.safetensors");
        match twin.reference.param_str("weights_from") {
            Some(from) => {
                assert!(
                    !own.exists(),
                    "{}: both its own weights and weights_from {from}",
                    twin.label
                );
                let weights = fixtures_dir(from);
                let mut copied = 0;
                for entry in std::fs::read_dir(&weights)
                    .unwrap_or_else(|e| panic!("{}: weights_from {from}: {e}", twin.label))
                {
                    let path = entry.unwrap().path();
                    let file = path.file_name().unwrap().to_str().unwrap().to_string();
                    let is_weights = file == "model.safetensors.index.json"
                        || (file.ends_with(".safetensors") && file != "reference.safetensors");
                    if is_weights {
                        std::fs::copy(&path, twin.dir.join(&file)).unwrap();
                        copied += 1;
                    }
                }
                assert!(copied > 0, "{}: no weights in {from}", twin.label);
            }
            None => {
                assert!(
                    own.is_file(),
                    "{}: neither weights_from nor its own model.safetensors ({regen})",
                    twin.label
                );
                std::fs::copy(&own, twin.dir.join("model.safetensors")).unwrap();
            }
        }
        twin
    }

    /// The assembled folder.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The folder loaded by qkv, as `models::load` reads any model folder.
    pub fn load(&self) -> Transformer {
        models::load(&self.dir)
            .unwrap_or_else(|e| panic!("loading {} (transformers 5.x config): {e}", self.label))
            .model
    }

    /// The 4.57 reference a twin's params name in `key` (`final_from`), when it takes
    /// those tensors from there instead of storing them.
    pub fn borrowed(&self, key: &str) -> Option<Fixture> {
        self.reference
            .param_str(key)
            .map(|from| fixture(from, "reference"))
    }
}

impl Drop for Twin {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
