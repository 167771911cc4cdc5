//! Every family trains, checked against PyTorch in the spirit of llm.c (fixtures
//! `tests/fixtures/train_model/<family>/`, tools/fixtures/gen_train_model.py): the
//! Hugging Face folder loads into the one `Transformer`; the logits, the loss and every
//! parameter's gradient of one batch equal torch.autograd's; ten AdamW steps give
//! PyTorch's losses and final parameters. The batches are read through the `--data`
//! contract (`FixedBatches`), so the same file drives `qkv train --init`.
//!
//! Tolerances: everything is float32 on both sides; gradients are O(1e-3..1e-1) and
//! sums run over at most B·T = 16 tokens and C = 32 features, so agreement to atol
//! 1e-5 + rtol 1e-3 is what float32 allows (the test prints the measured worst
//! differences, around 1e-7..1e-6). Ten AdamW steps each move a parameter by ≈ lr =
//! 1e-3; the generator measured each float32 trajectory against a float64 one (at most
//! 4e-7 apart, param `traj_f32_vs_f64_worst`), so two float32 implementations that
//! differ only in rounding agree to a few 1e-7. 1e-5 leaves a margin of ~25× over
//! that, yet is 100× below one step: a single wrong update anywhere fails the test.

#![cfg(feature = "models")]

mod common;

use std::path::PathBuf;

use common::fixture;
use common::train::{check_training, Outputs};

fn fixture_dir(name: &str) -> PathBuf {
    [
        env!("CARGO_MANIFEST_DIR"),
        "tests",
        "fixtures",
        "train_model",
        name,
    ]
    .iter()
    .collect()
}

/// The whole llm.c-style check for one fixture folder.
fn check_against_pytorch(name: &str) {
    let f = fixture(&format!("train_model/{name}"), "reference");
    let outputs = Outputs {
        grads: &f,
        finals: &f,
    };
    check_training(name, &fixture_dir(name), &f, outputs);
}

#[test]
fn gpt2_trains_as_pytorch() {
    check_against_pytorch("gpt2");
}

#[test]
fn llama_trains_as_pytorch() {
    check_against_pytorch("llama");
}

#[test]
fn mistral_trains_as_pytorch() {
    check_against_pytorch("mistral");
}

/// Q/K/V biases under RoPE, tied embeddings and YaRN-scaled RoPE (its attention factor
/// scales the rotation, in the backward pass too).
#[test]
fn qwen2_trains_as_pytorch() {
    check_against_pytorch("qwen2");
}

/// The per-head q/k RMSNorms: their weights' gradients and the gradient through them
/// to the projections, with heads narrower than C / H.
#[test]
fn qwen3_trains_as_pytorch() {
    check_against_pytorch("qwen3");
}

/// The parallel residual (d_out reaches both branches and the stream), RoPE over half
/// of each head, the fused per-head QKV.
#[test]
fn gpt_neox_trains_as_pytorch() {
    check_against_pytorch("gpt_neox");
}

/// The first Gemma: 1 + w RMSNorm, √C-scaled tied embeddings, GeGLU, pre-norm.
#[test]
fn gemma_trains_as_pytorch() {
    check_against_pytorch("gemma");
}

/// Soft caps on scores and logits, the norms after each sub-layer, 1 + w RMSNorm,
/// √C-scaled tied embeddings, GeGLU, a local and a global layer.
#[test]
fn gemma2_trains_as_pytorch() {
    check_against_pytorch("gemma2");
}

/// Fused QKV and gate/up projections, LongRoPE's long factors and attention factor
/// (every position of the batch is past the pre-training length of 4), partial rotary.
#[test]
fn phi3_trains_as_pytorch() {
    check_against_pytorch("phi3");
}

/// RoBERTa's positions from padding_idx + 1 (padding at padding_idx) and its lm_head.
#[test]
fn roberta_masked_lm_trains_as_pytorch() {
    check_against_pytorch("roberta");
}

/// DistilBERT's names, no token types, its vocab_transform / vocab_projector head.
#[test]
fn distilbert_masked_lm_trains_as_pytorch() {
    check_against_pytorch("distilbert");
}

/// ModernBERT: a local layer windowed on both sides of the query with its own RoPE
/// base, GeGLU, no biases, no attention norm in the first layer, a head whose dense
/// layer has no bias.
#[test]
fn modernbert_masked_lm_trains_as_pytorch() {
    check_against_pytorch("modernbert");
}

/// Per-head q/k norms scaling by 1 + w, a local layer rotating with its own RoPE base
/// beside a global one with linear scaling, sandwich norms.
#[test]
fn gemma3_trains_as_pytorch() {
    check_against_pytorch("gemma3");
}

#[test]
fn bloom_trains_as_pytorch() {
    check_against_pytorch("bloom");
}

#[test]
fn bert_masked_lm_trains_as_pytorch() {
    check_against_pytorch("bert");
}

#[test]
fn marian_trains_as_pytorch() {
    check_against_pytorch("marian");
}

#[test]
fn t5_trains_as_pytorch() {
    check_against_pytorch("t5");
}

#[test]
fn t5_gated_untied_trains_as_pytorch() {
    check_against_pytorch("t5_gated");
}
