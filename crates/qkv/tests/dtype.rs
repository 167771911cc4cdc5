//! bf16 linear layers against PyTorch computing the same thing
//! (`tests/fixtures/dtype/`, tools/fixtures/gen_dtype.py: each linear layer's input and
//! weight rounded to bf16, products in f32). Logits with padding, the cached decoding
//! steps (one row at a time: the few-rows product) against the same fixture's full
//! forward (many rows: the `vdpbf16ps` product where the CPU has it), and greedy
//! generation.
//!
//! Tolerance: the f32 model tests' (atol 1e-4 + rtol 1e-3). Rounding an input to bf16
//! can turn a one-ulp f32 difference upstream (another order of sums) into a one-bf16-ulp
//! one in an element that sits at a rounding boundary; over these fixtures the largest
//! difference is 8e-5 (GPT-2), most are 1e-7. Every case also checks that the fixture is
//! not the f32 one: bf16 moves the outputs by several times the tolerance.

#![cfg(feature = "models")]

mod common;

use common::fixture;
use common::models::{batch, load, reference};
use qkv::models::generate::{generate_causal, GenerateOptions, Sampling};
use qkv::ops::DType;
use qkv::Tensor;

use common::models::{ATOL, RTOL};

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
fn bf16_decoders_match_pytorch_with_bf16_linear_layers() {
    for name in ["llama_gqa", "gpt2"] {
        let want = fixture("dtype", name);
        let f32_ref = reference(name);
        let mut m = load(name);
        m.set_dtype(DType::Bf16);
        assert_eq!(m.dtype(), DType::Bf16);
        let tokens = batch(&f32_ref, "input_ids", Some("attention_mask"));
        let logits = want.t("logits");
        let moved = max_real_diff(&logits, &f32_ref.t("logits"), &tokens.mask);
        assert!(
            moved > 3.0 * ATOL,
            "{name}: the bf16 fixture is within {moved} of f32"
        );
        let got = m
            .forward_cached(&tokens, &mut m.new_cache(tokens.batch))
            .unwrap();
        let worst = check_real(&format!("{name} bf16 logits"), &got, &logits, &tokens.mask);
        println!("{name}: bf16 moves the logits by up to {moved:.4}; qkv within {worst:.2e}");

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
            check_real(
                &format!("{name} bf16 cached step {t}"),
                &got,
                &want_step,
                &mask,
            );
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
        assert_eq!(new, vec![expected], "{name} bf16 greedy generation");
    }
}

#[test]
fn bf16_encoder_and_encoder_decoder_match_pytorch() {
    let want = fixture("dtype", "bert");
    let f32_ref = reference("bert");
    let mut m = load("bert");
    m.set_dtype(DType::Bf16);
    let tokens = batch(&f32_ref, "input_ids", Some("attention_mask"));
    let types = batch(&f32_ref, "token_type_ids", None).ids;
    let got = m.hidden_states(&tokens, Some(&types)).unwrap();
    let hidden = want.t("last_hidden_state");
    let moved = max_real_diff(&hidden, &f32_ref.t("last_hidden_state"), &tokens.mask);
    assert!(
        moved > 3.0 * ATOL,
        "bert: the bf16 fixture is within {moved} of f32"
    );
    let worst = check_real("bert bf16 hidden states", &got, &hidden, &tokens.mask);
    println!("bert: bf16 moves the hidden states by up to {moved:.4}; qkv within {worst:.2e}");

    let want = fixture("dtype", "t5");
    let f32_ref = reference("t5");
    let mut m = load("t5");
    m.set_dtype(DType::Bf16);
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
        "t5: the bf16 fixture is within {moved} of f32"
    );
    let worst = check_real("t5 bf16 logits", &got, &logits, &tgt.mask);
    println!("t5: bf16 moves the logits by up to {moved:.4}; qkv within {worst:.2e}");
}
