//! A reduced-precision Llama against its f32 twin, which `bench llama` checks before it
//! times a type below f32.

use anyhow::Result;
use qkv::models::generate::{generate_causal, GenerateOptions};
use qkv::models::{TokenBatch, Transformer};
use qkv::ops::argmax;
use serde_json::{json, Value};

/// A reduced-precision model against the f32 one: the largest logit difference over the
/// prefill prompt's positions and at how many of them the top token is f32's; how many
/// greedy tokens equal f32's, and where the first difference is.
pub fn low_precision_accuracy(
    reference: &Transformer,
    model: &Transformer,
    prompt: &TokenBatch,
    decode_prompt: &TokenBatch,
    opts: &GenerateOptions,
) -> Result<Value> {
    let want = reference.forward_cached(prompt, &mut reference.new_cache(1))?;
    let got = model.forward_cached(prompt, &mut model.new_cache(1))?;
    let want_tokens = &generate_causal(reference, decode_prompt, opts)?[0];
    let got_tokens = &generate_causal(model, decode_prompt, opts)?[0];
    let pairs = || want_tokens.iter().zip(got_tokens);
    // counted position by position, as the anchors count them: a random model's
    // greedy run falls into loops, so the two runs can meet again after a difference
    let equal = pairs().filter(|(w, g)| w == g).count();
    let first_difference = pairs().position(|(w, g)| w != g);
    let v = want.last_dim();
    let top1 = want
        .data()
        .chunks_exact(v)
        .zip(got.data().chunks_exact(v))
        .filter(|(w, g)| argmax(w) == argmax(g))
        .count();
    Ok(json!({
        "logits_max_abs": want.max_abs_diff(&got),
        "greedy_equal": equal,
        "greedy_first_difference": first_difference,
        "prefill_top1_equal": top1,
    }))
}
