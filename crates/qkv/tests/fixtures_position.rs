//! Position encodings against PyTorch and Hugging Face transformers
//! (tools/fixtures/gen_position.py): Llama's and GPT-J's RoPE, BLOOM's ALiBi, T5's
//! buckets and bias, the sinusoidal tables of the paper and of Marian.

#![cfg(feature = "models")]

mod common;

use common::{assert_close, assert_tensor_close, fixture};
use qkv::position::alibi::bloom_alibi_tensor;
use qkv::position::rope_scaling::HfRopeConfig;
use qkv::position::{
    relative_position_bucket, sinusoidal_table, RelativeBias, Rope, RopeLayout, RopeScaling,
    SinusoidalLayout,
};

fn check_rope(case: &str, layout: RopeLayout) {
    let f = fixture("position", case);
    let d = f.param_usize("head_dim").unwrap();
    let rotary = f.param_usize("rotary_dim").unwrap_or(d);
    let mut rope = Rope::partial(d, rotary, f.param_f32("base").unwrap(), layout).unwrap();
    if let Some(factor) = f.param_f32("linear_factor") {
        rope = rope.with_scaling(RopeScaling::Linear { factor }).unwrap();
    }
    assert_rotates(case, &f, &rope);
}

/// The fixture's positions; q and k rotated by `rope` equal its `q_out` and `k_out`.
fn assert_rotates(case: &str, f: &common::Fixture, rope: &Rope) {
    let positions = positions(f);
    for name in ["q", "k"] {
        let mut x = f.t(name);
        rope.apply(&mut x, &positions).unwrap();
        assert_tensor_close(
            &format!("{case} {name}"),
            &x,
            &f.t(&format!("{name}_out")),
            1e-5,
            0.0,
        );
    }
}

fn positions(f: &common::Fixture) -> Vec<usize> {
    f.ints("position_ids")
        .1
        .into_iter()
        .map(|p| p as usize)
        .collect()
}

#[test]
fn rope_half_split_matches_llama() {
    check_rope("rope_half", RopeLayout::HalfSplit);
}

#[test]
fn rope_linear_scaling_and_large_theta_match_llama() {
    check_rope("rope_half_theta500k_linear", RopeLayout::HalfSplit);
}

/// A scaled RoPE (llama3, yarn, dynamic) built from the fixture's `rope_scaling` entry
/// as a config reader resolves it: the frequencies of the call (for dynamic scaling,
/// those of the call's length), the attention factor, and q, k rotated, against
/// transformers' LlamaRotaryEmbedding.
fn check_rope_scaled(case: &str) {
    let f = fixture("position", case);
    let d = f.param_usize("head_dim").unwrap();
    let base = f.param_f32("base").unwrap();
    let max_positions = f.param_usize("max_position_embeddings").unwrap();
    let config: HfRopeConfig = serde_json::from_value(f.params["rope_scaling"].clone()).unwrap();
    let scaling = config.resolve(max_positions, false).unwrap();
    let rope = Rope::new(d, base, RopeLayout::HalfSplit)
        .unwrap()
        .with_scaling(scaling.clone())
        .unwrap();
    let max_pos = *positions(&f).iter().max().unwrap();
    assert_close(
        &format!("{case} inv_freq"),
        &scaling.inv_freq(base, d, max_pos),
        f.t("inv_freq").data(),
        0.0,
        2e-7,
    );
    if max_pos < max_positions {
        assert_eq!(rope.inv_freq(), &scaling.inv_freq(base, d, max_pos)[..]);
    }
    assert_close(
        &format!("{case} attention factor"),
        &[scaling.attention_factor()],
        &[f.param_f32("attention_scaling").unwrap()],
        0.0,
        1e-7,
    );
    assert_rotates(case, &f, &rope);
}

#[test]
fn rope_llama3_scaling_matches_transformers() {
    check_rope_scaled("rope_llama3");
}

#[test]
fn rope_yarn_scaling_matches_transformers() {
    check_rope_scaled("rope_yarn");
    // a pre-training length given (the factor becomes the ratio of the lengths),
    // mscale / mscale_all_dim, other betas, no truncation
    check_rope_scaled("rope_yarn_mscale");
}

#[test]
fn rope_dynamic_ntk_scaling_matches_transformers_past_the_trained_length() {
    check_rope_scaled("rope_dynamic");
}

#[test]
fn rope_interleaved_matches_gptj() {
    check_rope("rope_interleaved", RopeLayout::Interleaved);
}

#[test]
fn partial_rope_matches_gptj() {
    check_rope("rope_interleaved_partial", RopeLayout::Interleaved);
}

#[test]
fn alibi_matches_bloom_for_any_head_count() {
    let f = fixture("position", "alibi");
    let (shape, mask) = f.ints("attention_mask");
    for h in [1, 2, 4, 6, 8, 12, 16, 20, 32] {
        let got = bloom_alibi_tensor(&mask, shape[0], h);
        assert_tensor_close(
            &format!("alibi h={h}"),
            &got,
            &f.t(&format!("alibi_h{h}")),
            1e-6,
            1e-6,
        );
    }
}

#[test]
fn t5_buckets_match_transformers() {
    let f = fixture("position", "t5_buckets");
    let rel = f.ints("relative_position").1;
    for (name, bidirectional, nb, md) in [
        ("buckets_bidirectional_32_128", true, 32, 128),
        ("buckets_causal_32_128", false, 32, 128),
        ("buckets_bidirectional_8_20", true, 8, 20),
    ] {
        let want = f.ints(name).1;
        for (r, w) in rel.iter().zip(&want) {
            assert_eq!(
                relative_position_bucket(*r, bidirectional, nb, md) as i64,
                *w,
                "{name} at relative position {r}"
            );
        }
    }
}

#[test]
fn t5_relative_bias_matches_transformers() {
    let f = fixture("position", "t5_bias");
    let md = f.param_usize("max_distance").unwrap();
    let enc = RelativeBias::new(f.t("table"), true, md).unwrap();
    assert_tensor_close(
        "encoder bias",
        &enc.compute(7, 7, 0),
        &f.t("bias"),
        0.0,
        0.0,
    );
    let dec = RelativeBias::new(f.t("table_causal"), false, md).unwrap();
    assert_tensor_close(
        "decoder bias",
        &dec.compute(7, 7, 0),
        &f.t("bias_causal"),
        0.0,
        0.0,
    );
    assert_tensor_close(
        "decoder step bias",
        &dec.compute(1, 7, 6),
        &f.t("bias_causal_decode"),
        0.0,
        0.0,
    );
}

#[test]
fn sinusoidal_tables_match_paper_and_marian() {
    let f = fixture("position", "sinusoidal");
    for (name, n, d, layout) in [
        ("interleaved", 50, 16, SinusoidalLayout::Interleaved),
        ("marian_split", 50, 16, SinusoidalLayout::Split),
        ("marian_split_odd", 20, 15, SinusoidalLayout::Split),
    ] {
        let got = sinusoidal_table(n, d, layout);
        assert_close(name, got.data(), f.t(name).data(), 1e-6, 0.0);
    }
}
