//! bf16 and int8 linear layers against PyTorch computing the same thing
//! (`tests/fixtures/dtype/<type>/`, tools/fixtures/gen_dtype.py: each linear layer's
//! input and weight rounded to bf16, or quantized to int8 codes and scales and
//! dequantized, products in f32). Logits with padding, the cached decoding steps (one
//! row at a time: the few-rows product) against the same fixture's full forward (many
//! rows), and greedy generation.
//!
//! Tolerance: the f32 model tests' (atol 1e-4 + rtol 1e-3). Rounding an input can turn
//! a one-ulp f32 difference upstream (another order of sums) into a one-step difference
//! in an element that sits at a rounding boundary; over these fixtures the largest
//! difference is 8e-5 (GPT-2 bf16), most are 1e-7. Every case also checks that the
//! fixture is not the f32 one: each type moves the outputs by several times the
//! tolerance.

#![cfg(feature = "models")]

mod common;

use common::fixture;
use common::models::{batch, load, model_dir, reference};
use qkv::models::generate::{generate_causal, GenerateOptions, Sampling};
use qkv::models::KvDType;
use qkv::module::Module;
use qkv::weights::DType;
use qkv::Tensor;

use common::models::{ATOL, RTOL};

/// The reduced types and their fixtures' folders.
const TYPES: [(DType, &str); 3] = [
    (DType::Bf16, "dtype/bf16"),
    (DType::Int8, "dtype/int8"),
    (DType::Int8Row, "dtype/int8_row"),
];

/// The largest |got − want| over real positions, and whether each is within tolerance.
fn check_real(what: &str, got: &Tensor, want: &Tensor, mask: &[bool]) -> f32 {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    let x = got.last_dim();
    let mut worst = 0.0f32;
    for (pos, _) in mask.iter().enumerate().filter(|(_, &real)| real) {
        for (i, (g, w)) in got.data()[pos * x..][..x]
            .iter()
            .zip(&want.data()[pos * x..][..x])
            .enumerate()
        {
            let d = (g - w).abs();
            assert!(
                d <= ATOL + RTOL * w.abs(),
                "{what} at position {pos}, {i}: {g} vs {w}"
            );
            worst = worst.max(d);
        }
    }
    worst
}

/// The largest |a − b| over real positions.
fn max_real_diff(a: &Tensor, b: &Tensor, mask: &[bool]) -> f32 {
    let x = a.last_dim();
    mask.iter()
        .enumerate()
        .filter(|(_, &real)| real)
        .flat_map(|(pos, _)| (0..x).map(move |i| pos * x + i))
        .map(|i| (a.data()[i] - b.data()[i]).abs())
        .fold(0.0, f32::max)
}

#[test]
fn decoders_match_pytorch_with_reduced_linear_layers() {
    for ((dtype, dir), name) in TYPES.iter().flat_map(|t| [(t, "llama_gqa"), (t, "gpt2")]) {
        let (dtype, name) = (*dtype, format!("{name} {dtype}"));
        let model = name.split(' ').next().unwrap();
        let want = fixture(dir, model);
        let f32_ref = reference(model);
        let mut m = load(model);
        m.set_dtype(dtype).unwrap();
        assert_eq!(m.dtype(), dtype);
        let tokens = batch(&f32_ref, "input_ids", Some("attention_mask"));
        let logits = want.t("logits");
        let moved = max_real_diff(&logits, &f32_ref.t("logits"), &tokens.mask);
        assert!(
            moved > 3.0 * ATOL,
            "{name}: the fixture is within {moved} of f32"
        );
        let got = m
            .forward_cached(&tokens, &mut m.new_cache(tokens.batch))
            .unwrap();
        let worst = check_real(&format!("{name} logits"), &got, &logits, &tokens.mask);
        println!("{name}: moves the logits by up to {moved:.4}; qkv within {worst:.2e}");

        // one token a step through the cache: the few-rows product on every layer
        let mut cache = m.new_cache(tokens.batch);
        let (v, len) = (logits.last_dim(), tokens.len);
        for t in 0..len {
            let pick = |x: &[usize]| {
                (0..tokens.batch)
                    .map(|r| x[r * len + t])
                    .collect::<Vec<_>>()
            };
            let mask: Vec<bool> = (0..tokens.batch)
                .map(|r| tokens.mask[r * len + t])
                .collect();
            let step = qkv::models::TokenBatch::new(
                pick(&tokens.ids),
                Some(mask.clone()),
                tokens.batch,
                1,
            )
            .unwrap();
            let got = m.forward_cached(&step, &mut cache).unwrap();
            let rows: Vec<f32> = (0..tokens.batch)
                .flat_map(|r| logits.data()[(r * len + t) * v..][..v].to_vec())
                .collect();
            let want_step = Tensor::new(&[tokens.batch, 1, v], rows).unwrap();
            check_real(&format!("{name} cached step {t}"), &got, &want_step, &mask);
        }

        let (shape, out) = want.ints("gen_output");
        let prompt = batch(&f32_ref, "gen_prompt", None);
        let new = generate_causal(
            &m,
            &prompt,
            &GenerateOptions::new(shape[1] - prompt.len, Sampling::Greedy, Vec::new()),
        )
        .unwrap();
        let expected: Vec<usize> = out[prompt.len..].iter().map(|&t| t as usize).collect();
        assert_eq!(new, vec![expected], "{name} greedy generation");
    }
}

/// Loaded in a reduced type, a model keeps no f32 copy of its linear layers (a folder
/// stored in bf16 included, a fused GPT-2 `c_attn` split as it is read) and computes
/// exactly what the f32 load packed afterwards computes. It refuses to train or save
/// until it holds f32 weights again.
#[test]
fn loaded_in_a_reduced_type_a_model_holds_no_f32_weights() {
    for (dtype, _) in TYPES {
        for name in ["llama_bf16", "gpt2", "llama_gqa"] {
            let what = format!("{name} loaded in {dtype}");
            let dir = model_dir(name);
            let mut lean = qkv::models::load_in(&dir, dtype).unwrap().model;
            let mut full = load(name);
            full.set_dtype(dtype).unwrap();
            assert!(!lean.has_f32_weights() && full.has_f32_weights(), "{what}");
            assert_eq!(lean.dtype(), dtype, "{what}");
            assert_eq!(lean.num_params(), full.num_params(), "{what}: parameters");
            assert_eq!(lean.weight_bytes(), full.weight_bytes(), "{what}: bytes");
            // the tree's f32 tensors: embeddings, norms, biases
            let held = lean.weights.num_params();
            let dropped = full.num_params() - held;
            assert!(
                dropped > held / 2,
                "{what}: {dropped} linear weights dropped"
            );

            let tokens = batch(&reference(name), "input_ids", Some("attention_mask"));
            let input = qkv::models::Input {
                target: Some(&tokens),
                ..Default::default()
            };
            let got = lean.forward(&input, false).unwrap().logits;
            let want = full.forward(&input, false).unwrap().logits;
            assert_eq!(got.data(), want.data(), "{what}: logits");

            let out = std::env::temp_dir().join(format!("qkv-lean-{}", std::process::id()));
            let refused = lean.save(&out).unwrap_err().to_string();
            assert!(
                refused.contains(&format!("only in {dtype}")),
                "{what}: {refused}"
            );
            assert!(
                !out.exists(),
                "{what}: a refused save wrote {}",
                out.display()
            );
            let refused = match lean.forward_train(&input) {
                Ok(_) => panic!("{what}: trains without f32 weights"),
                Err(e) => e.to_string(),
            };
            assert!(refused.contains("load it in f32"), "{what}: {refused}");

            // widened back: f32 weights again (the rounded values), trainable
            lean.set_dtype(DType::F32).unwrap();
            assert!(lean.has_f32_weights(), "{what}");
            assert_eq!(lean.num_params(), full.num_params(), "{what}: parameters");
            lean.forward_train(&input).unwrap();
        }
    }
}

#[test]
fn encoders_and_encoder_decoders_match_pytorch_with_reduced_linear_layers() {
    for (dtype, dir) in TYPES {
        let want = fixture(dir, "bert");
        let f32_ref = reference("bert");
        let mut m = load("bert");
        m.set_dtype(dtype).unwrap();
        let tokens = batch(&f32_ref, "input_ids", Some("attention_mask"));
        let types = batch(&f32_ref, "token_type_ids", None).ids;
        let got = m.hidden_states(&tokens, Some(&types)).unwrap();
        let hidden = want.t("last_hidden_state");
        let moved = max_real_diff(&hidden, &f32_ref.t("last_hidden_state"), &tokens.mask);
        assert!(
            moved > 3.0 * ATOL,
            "bert {dtype}: the fixture is within {moved} of f32"
        );
        let what = format!("bert {dtype} hidden states");
        let worst = check_real(&what, &got, &hidden, &tokens.mask);
        println!("{what}: moved by up to {moved:.4}; qkv within {worst:.2e}");

        let want = fixture(dir, "t5");
        let f32_ref = reference("t5");
        let mut m = load("t5");
        m.set_dtype(dtype).unwrap();
        let src = batch(&f32_ref, "input_ids", Some("attention_mask"));
        let tgt = batch(&f32_ref, "decoder_input_ids", None);
        let enc = m.encode(&src).unwrap();
        let got = m
            .decode_cached(&tgt, &enc, &mut m.new_cache(src.batch))
            .unwrap();
        let logits = want.t("logits");
        let moved = max_real_diff(&logits, &f32_ref.t("logits"), &tgt.mask);
        assert!(
            moved > 3.0 * ATOL,
            "t5 {dtype}: the fixture is within {moved} of f32"
        );
        let what = format!("t5 {dtype} logits");
        let worst = check_real(&what, &got, &logits, &tgt.mask);
        println!("{what}: moved by up to {moved:.4}; qkv within {worst:.2e}");
    }
}

/// Issue 26's accuracy contract on a trained model (a random one's logits are too flat
/// to judge by): a byte-level Llama trained by `qkv::train::run` (as `qkv train --text`)
/// on a fixed text, `tests/fixtures/text/corpus.md` (four of the docs, frozen), then
/// scored in each type on the held-out tail of that text:
/// - perplexity within 1% of f32's for bf16 and 3% for int8;
/// - the top byte equal to f32's at ≥ 99% of the held-out positions for bf16 and ≥ 97%
///   for int8 (given the same text: teacher-forced).
///
/// Free-running greedy agreement is printed, not held: one near-tie that flips sends the
/// rest of the text elsewhere, so its count moves with the CPU's form of the f32 kernels
/// (on this model 128, 121 and 100 of 128 for bf16, int8 and int8-row with AVX-512, 109,
/// 109 and 98 with AVX2), while the positions' agreement does not.
#[test]
fn a_trained_model_keeps_its_perplexity_and_its_predictions() {
    use qkv::rng::Rng;
    use qkv::train::run::{run, RunRequest, Style};
    use qkv::train::text_data::{Split, TextData};
    use qkv::train::trainable::TrainableModel;
    use qkv::train::trainer::evaluate;

    let corpus: std::path::PathBuf = [
        env!("CARGO_MANIFEST_DIR"),
        "tests",
        "fixtures",
        "text",
        "corpus.md",
    ]
    .iter()
    .collect();
    let out = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dtype-trained");
    let _ = std::fs::remove_dir_all(&out);
    let (seq_len, val_fraction) = (64, 0.1);
    let request = RunRequest {
        text: Some(corpus.clone()),
        style: Some(Style::Llama),
        d_model: Some(64),
        layers: Some(2),
        heads: Some(4),
        kv_heads: Some(2),
        seq_len: Some(seq_len),
        val_fraction: Some(val_fraction),
        batch_size: Some(16),
        steps: Some(400),
        lr: Some(6e-3),
        warmup: Some(30),
        seed: Some(0),
        out: Some(out.clone()),
        ..Default::default()
    };
    run(&request, &mut ()).unwrap();
    let mut model = qkv::models::load(&out).unwrap().model;

    let data = TextData::open(&corpus, seq_len, val_fraction).unwrap();
    let mut rng = Rng::new(7);
    let batches: Vec<_> = (0..8)
        .map(|_| data.batch(Split::Validation, 16, &mut rng).unwrap())
        .collect();
    let top = |model: &dyn TrainableModel| -> Vec<usize> {
        batches
            .iter()
            .flat_map(|b| {
                let logits = model.logits(b).unwrap();
                let v = logits.last_dim();
                logits
                    .data()
                    .chunks_exact(v)
                    .map(qkv::ops::argmax)
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let held_out = data.bytes(Split::Validation);
    let prompt_ids: Vec<usize> = held_out[..32].iter().map(|&b| usize::from(b)).collect();
    let prompt = qkv::models::TokenBatch::single(prompt_ids).unwrap();
    let opts = GenerateOptions::new(128, Sampling::Greedy, Vec::new());

    let f32_ppl = (evaluate(&model, &batches).unwrap().loss as f64).exp();
    let f32_top = top(&model);
    let f32_text = generate_causal(&model, &prompt, &opts).unwrap().remove(0);
    assert!(
        f32_ppl < 16.0,
        "the model did not learn the text: perplexity {f32_ppl}"
    );
    // the KV cache in bf16 (`--kv-dtype bf16`), the weights f32: every held-out row
    // through a cache, one forward on an empty cache each, held to bf16's contract
    let (mut nll, mut same, mut positions) = (0.0f64, 0, 0);
    model.kv_dtype = KvDType::Bf16;
    for b in &batches {
        let tokens = qkv::models::TokenBatch::new(b.inputs.clone(), None, b.batch, b.len).unwrap();
        let logits = model
            .forward_cached(&tokens, &mut model.new_cache(b.batch))
            .unwrap();
        let v = logits.last_dim();
        for (row, &target) in logits.data().chunks_exact(v).zip(&b.targets) {
            let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
            let sum: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
            nll += max + sum.ln() - row[target as usize] as f64;
            same += usize::from(qkv::ops::argmax(row) == f32_top[positions]);
            positions += 1;
        }
    }
    model.kv_dtype = KvDType::F32;
    let ppl = (nll / positions as f64).exp();
    println!("KV cache bf16: perplexity {ppl:.4} against f32's {f32_ppl:.4}; top byte as f32's at {same} of {positions}");
    assert!(
        (ppl / f32_ppl - 1.0).abs() <= 0.01,
        "KV cache bf16: perplexity {ppl} against {f32_ppl}"
    );
    assert!(
        same as f64 >= 0.99 * positions as f64,
        "KV cache bf16: top byte as f32's at {same}"
    );

    for (dtype, most_ppl, least_top) in [
        (DType::Bf16, 0.01, 0.99),
        (DType::Int8, 0.03, 0.97),
        (DType::Int8Row, 0.03, 0.97),
    ] {
        model.set_dtype(dtype).unwrap();
        let ppl = (evaluate(&model, &batches).unwrap().loss as f64).exp();
        let same = top(&model)
            .iter()
            .zip(&f32_top)
            .filter(|(a, b)| a == b)
            .count();
        let share = same as f64 / f32_top.len() as f64;
        let text = generate_causal(&model, &prompt, &opts).unwrap().remove(0);
        let equal = text.iter().zip(&f32_text).filter(|(a, b)| a == b).count();
        println!(
            "{dtype}: perplexity {ppl:.4} against f32's {f32_ppl:.4} ({:+.3}%); top byte as f32's \
             at {same} of {} positions; greedy {equal} of 128 as f32",
            100.0 * (ppl / f32_ppl - 1.0),
            f32_top.len()
        );
        assert!(
            (ppl / f32_ppl - 1.0).abs() <= most_ppl,
            "{dtype}: perplexity {ppl} against {f32_ppl}"
        );
        assert!(share >= least_top, "{dtype}: top byte as f32's at {share}");
    }
}

/// Records each step's loss.
#[derive(Default)]
struct Losses(Vec<f32>);

impl qkv::train::run::Watch for Losses {
    fn step(&mut self, log: &qkv::train::trainer::StepLog) {
        self.0.push(log.loss);
    }
}

/// `qkv train --dtype bf16`, mixed precision, against f32 from the same start, for both
/// styles (GPT-2: LayerNorm, biases, a tied head; Llama: RMSNorm, SwiGLU, GQA):
/// - each of the first 10 steps' losses is within 1% of f32's, and they are not f32's
///   (the bf16 products ran);
/// - a bf16 run stopped after 4 steps and resumed is the uninterrupted bf16 run bit for
///   bit: the checkpoint keeps the type;
/// - int8, and bf16 for a recurrent model, are refused naming `dtype`, before the
///   output folder is made.
#[test]
fn bf16_training_follows_f32_and_resumes_in_bf16() {
    use qkv::train::run::{run, Network, RunRequest, Style};

    let corpus: std::path::PathBuf = [env!("CARGO_MANIFEST_DIR"), "tests", "fixtures", "text"]
        .iter()
        .collect::<std::path::PathBuf>()
        .join("corpus.md");
    let scratch = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dtype-train");
    let _ = std::fs::remove_dir_all(&scratch);
    let request = |style, dtype, name: &str| RunRequest {
        text: Some(corpus.clone()),
        style: Some(style),
        d_model: Some(64),
        layers: Some(2),
        heads: Some(4),
        kv_heads: Some(2),
        seq_len: Some(64),
        batch_size: Some(16),
        steps: Some(10),
        lr: Some(6e-3),
        warmup: Some(3),
        threads: Some(2),
        dtype: Some(dtype),
        out: Some(scratch.join(name)),
        ..Default::default()
    };
    let losses = |r: &RunRequest| {
        let mut watch = Losses::default();
        run(r, &mut watch).unwrap();
        watch.0
    };
    for style in [Style::Gpt2, Style::Llama] {
        let f32_losses = losses(&request(style, DType::F32, &format!("{style:?}-f32")));
        let bf16 = request(style, DType::Bf16, &format!("{style:?}-bf16"));
        let bf16_losses = losses(&bf16);
        println!("{style:?}: f32 {f32_losses:?}\n       bf16 {bf16_losses:?}");
        assert_eq!(bf16_losses.len(), 10);
        for (step, (b, f)) in bf16_losses.iter().zip(&f32_losses).enumerate() {
            assert!(
                (b / f - 1.0).abs() <= 0.01,
                "{style:?} step {step}: bf16 loss {b} against f32's {f}"
            );
        }
        assert_ne!(bf16_losses, f32_losses, "{style:?}: bf16 computed as f32");

        let dir = scratch.join(format!("{style:?}-resumed"));
        let first = losses(&RunRequest {
            stop_after: Some(4),
            out: Some(dir.clone()),
            ..bf16.clone()
        });
        let rest = losses(&RunRequest {
            resume: Some(dir),
            threads: Some(2),
            ..Default::default()
        });
        assert_eq!([first, rest].concat(), bf16_losses, "{style:?} resumed");
    }

    let int8 = request(Style::Llama, DType::Int8, "int8");
    let rnn = RunRequest {
        arch: Some(Network::Rnn),
        style: None,
        heads: None,
        kv_heads: None,
        ..request(Style::Llama, DType::Bf16, "rnn")
    };
    for refused in [int8, rnn] {
        let err = run(&refused, &mut ()).unwrap_err().to_string();
        assert!(err.contains("dtype"), "{err}");
        assert!(!refused.out.unwrap().exists(), "{err}");
    }
}
