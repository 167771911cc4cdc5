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
use common::models::{batch, load, reference};
use qkv::models::generate::{generate_causal, GenerateOptions, Sampling};
use qkv::ops::DType;
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
        m.set_dtype(dtype);
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

#[test]
fn encoders_and_encoder_decoders_match_pytorch_with_reduced_linear_layers() {
    for (dtype, dir) in TYPES {
        let want = fixture(dir, "bert");
        let f32_ref = reference("bert");
        let mut m = load("bert");
        m.set_dtype(dtype);
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
        m.set_dtype(dtype);
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
