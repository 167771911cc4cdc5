//! The one model's backward, checked by central finite differences on tiny models of
//! every kind (decoder-only, encoder with a masked-LM head, encoder-decoder) and every
//! choice an [`Arch`] offers: each position kind (none, learned, sinusoidal, RoPE,
//! ALiBi, T5's relative buckets), norm kind and place (pre-norm, post-norm, BLOOM's
//! residual after the norm, embedding norm), FFN kind, biases, tied, rescaled and
//! untied heads, GQA and MQA, scaled embeddings, separate source vocabularies, sliding
//! windows and per-layer score scales; and the newer families' options (sandwich and
//! 1 + w norms, soft caps, local layers with their own RoPE base, q/k norms, a
//! parallel residual, partial rotary). Also: the reference and tiled kernels agree
//! through the whole model, GPT-2's initialisation, and clear errors for bad batches.

#![cfg(feature = "models")]

mod common;

use common::assert_close;
use qkv::attention::Kernel;
use qkv::block::Residual;
use qkv::layers::NormKind;
use qkv::models::arch::NormSpec;
use qkv::models::{Arch, Head, Input, Position, StackDims, TokenBatch, Transformer};
use qkv::module::Module;
use qkv::ops::Activation;
use qkv::position::SinusoidalLayout;
use qkv::rng::Rng;
use qkv::train::gradcheck::{compare, probe_loss};
use qkv::train::loss::IGNORE_INDEX;
use qkv::train::trainable::{Batch, Source, TrainableModel};
use qkv::Tensor;

/// B = 2 rows of T = 5 target tokens and S = 4 source tokens (row 1's last padded).
const B: usize = 2;
const T: usize = 5;
const S: usize = 4;
const V: usize = 11;

fn dims(layers: usize, heads: usize, kv_heads: usize) -> StackDims {
    StackDims {
        layers,
        heads,
        kv_heads,
        head_dim: 8 / heads,
        ffn_dim: 12,
    }
}

/// Tiny shapes: V = 11, C = 8, H = 2, F = 12, 2 layers, 6 positions.
fn tiny_gpt2() -> Arch {
    let mut a = Arch::gpt2(V, 8, 2, 2, 6);
    a.decoder = Some(dims(2, 2, 2));
    a
}

fn set_norm(a: &mut Arch, kind: NormKind, bias: bool) {
    a.norm = NormSpec {
        kind,
        eps: if kind == NormKind::LayerNorm {
            1e-5
        } else {
            1e-6
        },
        bias,
        unit_offset: false,
    };
}

/// Every variant, with a label.
fn variants() -> Vec<(&'static str, Arch)> {
    let mut out = vec![("gpt2_style", tiny_gpt2())];

    let mut llama = Arch::llama(V, 8, 2, 4, 2, 6);
    llama.decoder = Some(StackDims {
        ffn_dim: 12,
        ..dims(2, 4, 2)
    });
    out.push(("llama_style_gqa", llama.clone()));

    let mut a = tiny_gpt2();
    a.position = Position::None;
    a.residual = Residual::PostNorm;
    a.ffn.activation = Activation::Relu;
    out.push(("none_postnorm_relu_tied", a));

    let mut a = tiny_gpt2();
    a.position = Position::Sinusoidal {
        max_len: 6,
        layout: SinusoidalLayout::Interleaved,
    };
    set_norm(&mut a, NormKind::RmsNorm, false);
    a.attention.qkv_bias = false;
    a.attention.out_bias = false;
    a.ffn.bias = false;
    a.ffn.activation = Activation::Gelu;
    a.head = Head::Lm {
        tied: false,
        rescale: false,
        logits_bias: false,
    };
    out.push(("sinusoidal_rmsnorm_gelu_nobias_untied", a));

    let mut a = llama.clone();
    a.position = Position::Alibi;
    a.decoder = Some(StackDims {
        ffn_dim: 12,
        ..dims(2, 4, 1)
    });
    a.residual = Residual::PostNorm;
    set_norm(&mut a, NormKind::LayerNorm, false);
    out.push(("alibi_postnorm_swiglu_mqa", a));

    let mut a = tiny_gpt2();
    a.position = Position::Alibi;
    a.residual = Residual::PreNormFromNormed;
    a.embed.norm = true;
    out.push(("bloom_style_residual_after_norm", a));

    let mut a = tiny_gpt2();
    a.position = Position::Rope {
        theta: 100.0,
        scaling: qkv::position::RopeScaling::Linear { factor: 2.0 },
        max_len: None,
        rotary_dim: None,
    };
    a.attention.window = Some(3);
    a.attention.scale_by_layer = true;
    a.ffn.activation = Activation::Gelu;
    out.push(("rope_scaled_window_layer_scale", a));

    // Gemma: sandwich norms scaling by 1 + w, soft caps on scores and logits, a local
    // layer with its own RoPE base and window beside a global one
    let mut a = llama.clone();
    a.decoder = Some(StackDims {
        ffn_dim: 12,
        ..dims(2, 2, 1)
    });
    a.residual = Residual::Sandwich;
    a.norm.unit_offset = true;
    a.attention.softcap = Some(3.0);
    a.logit_softcap = Some(5.0);
    a.attention.window = Some(2);
    a.attention.local_layers = Some(vec![true, false]);
    a.attention.local_rope_theta = Some(50.0);
    a.ffn.activation = Activation::GeluTanh;
    out.push(("gemma_style_sandwich_softcaps_local_layers", a));

    // Qwen3: q/k norms over heads of 4
    let mut a = llama.clone();
    a.decoder = Some(StackDims {
        ffn_dim: 12,
        ..dims(2, 2, 1)
    });
    a.attention.qk_norm = true;
    out.push(("qwen3_style_qk_norm", a));

    // GPT-NeoX: parallel residual, RoPE on half of each head
    let mut a = tiny_gpt2();
    a.residual = Residual::Parallel;
    a.position = Position::Rope {
        theta: 100.0,
        scaling: qkv::position::RopeScaling::None,
        max_len: None,
        rotary_dim: Some(2),
    };
    out.push(("neox_style_parallel_partial_rotary", a));

    // BERT: slot positions, token types, embedding norm, post-norm, masked-LM head
    let mut a = tiny_gpt2();
    a.encoder = a.decoder.take();
    a.residual = Residual::PostNorm;
    a.embed.norm = true;
    a.embed.token_types = 2;
    a.embed.slot_positions = true;
    a.ffn.activation = Activation::Gelu;
    a.head = Head::MaskedLm {
        activation: Activation::Gelu,
        dense_bias: true,
    };
    out.push(("bert_masked_lm", a));

    // ModernBERT: a pre-norm encoder without biases whose first layer has no attention
    // norm, RoPE with a local base, a window on both sides of the query in the local
    // layer, GeGLU, a masked-LM head without a dense bias
    let mut a = tiny_gpt2();
    a.encoder = a.decoder.take();
    set_norm(&mut a, NormKind::LayerNorm, false);
    a.attention.qkv_bias = false;
    a.attention.out_bias = false;
    a.embed.norm = true;
    a.embed.slot_positions = true;
    a.embed.first_attn_unnormed = true;
    a.position = Position::Rope {
        theta: 160.0,
        scaling: qkv::position::RopeScaling::None,
        max_len: None,
        rotary_dim: None,
    };
    a.attention.window = Some(2);
    a.attention.local_layers = Some(vec![false, true]);
    a.attention.local_rope_theta = Some(10.0);
    a.ffn = qkv::models::arch::FfnArch {
        activation: Activation::Gelu,
        gated: true,
        bias: false,
    };
    a.head = Head::MaskedLm {
        activation: Activation::Gelu,
        dense_bias: false,
    };
    out.push(("modernbert_style_local_encoder", a));

    // the original Transformer: shared scaled embeddings, sinusoids, post-norm
    let mut a = Arch::vaswani(V, 8, 2, 2, 6);
    a.encoder = Some(dims(2, 2, 2));
    a.decoder = Some(dims(2, 2, 2));
    a.ffn.activation = Activation::Gelu;
    out.push(("vaswani_encoder_decoder", a));

    // T5: relative buckets, RMSNorm, unscaled scores, gated FFN, rescaled tied head
    let mut a = Arch::vaswani(V, 8, 2, 2, 6);
    a.encoder = Some(StackDims {
        head_dim: 3,
        ..dims(2, 2, 2)
    });
    a.decoder = Some(StackDims {
        head_dim: 3,
        ..dims(1, 2, 2)
    });
    a.position = Position::Relative {
        buckets: 4,
        max_distance: 6,
    };
    set_norm(&mut a, NormKind::RmsNorm, false);
    a.residual = Residual::PreNorm;
    a.attention.qkv_bias = false;
    a.attention.out_bias = false;
    a.attention.scale = Some(1.0);
    a.ffn = qkv::models::arch::FfnArch {
        activation: Activation::GeluTanh,
        gated: true,
        bias: false,
    };
    a.embed.scale = false;
    a.head = Head::Lm {
        tied: true,
        rescale: true,
        logits_bias: false,
    };
    out.push(("t5_relative_gated_rescaled", a));

    // separate vocabularies, learned positions, GQA, untied head with a fixed bias
    let mut a = Arch::vaswani(V, 8, 1, 2, 6);
    a.src_vocab = Some(7);
    a.encoder = Some(dims(1, 4, 2));
    a.decoder = Some(dims(2, 4, 2));
    a.position = Position::Learned { max_len: 6 };
    a.residual = Residual::PreNorm;
    a.ffn.activation = Activation::Silu;
    a.head = Head::Lm {
        tied: false,
        rescale: false,
        logits_bias: true,
    };
    out.push(("separate_vocab_learned_gqa_logits_bias", a));

    // ALiBi in both stacks (symmetric in the encoder), RoPE-free, pre-norm
    let mut a = Arch::vaswani(V, 8, 1, 2, 6);
    a.encoder = Some(dims(1, 2, 2));
    a.decoder = Some(dims(1, 2, 2));
    a.position = Position::Alibi;
    a.residual = Residual::PreNorm;
    a.ffn.activation = Activation::GeluTanh;
    out.push(("alibi_encoder_decoder", a));
    out
}

fn ids(seed: u64, vocab: usize, n: usize) -> Vec<usize> {
    let mut rng = Rng::new(seed);
    (0..n).map(|_| rng.below(vocab)).collect()
}

/// The batch a variant reads: target tokens (decoder), source tokens with row 1's
/// last position padded (encoder), or both.
struct Tokens {
    source: Option<TokenBatch>,
    types: Option<Vec<usize>>,
    target: Option<TokenBatch>,
}

impl Tokens {
    fn new(arch: &Arch, seed: u64) -> Self {
        let mut mask = vec![true; B * S];
        mask[B * S - 1] = false;
        let src_vocab = arch.src_vocab.unwrap_or(arch.vocab);
        let source = arch
            .encoder
            .map(|_| TokenBatch::new(ids(seed, src_vocab, B * S), Some(mask), B, S).unwrap());
        let target = arch
            .decoder
            .map(|_| TokenBatch::new(ids(seed + 1, arch.vocab, B * T), None, B, T).unwrap());
        let types = (arch.embed.token_types > 0).then(|| ids(seed + 2, 2, B * S));
        Tokens {
            source,
            types,
            target,
        }
    }

    fn input(&self) -> Input<'_> {
        Input {
            source: self.source.as_ref(),
            token_types: self.types.as_deref(),
            target: self.target.as_ref(),
        }
    }
}

/// A tiny model with weights far from the initialisation: matrices σ ≈ 0.3, norm
/// weights 1 ± 0.2, biases ± 0.2, tables σ ≈ 1 (1/√C for tables scaled by √C), so the
/// stream is O(1), the norms' curvature moderate, and every path carries a gradient.
fn fd_model(arch: &Arch, seed: u64) -> Transformer {
    let mut m = Transformer::new(arch, seed).unwrap();
    let mut rng = Rng::new(seed + 1000);
    let token_std = if arch.embed.scale {
        1.0 / (arch.d_model as f32).sqrt()
    } else {
        1.0
    };
    for (name, p) in m.weights.params_mut() {
        let std = if name.contains("embed_tokens") {
            token_std
        } else if name.contains("embed_") || name.contains("rel_bias") {
            1.0
        } else if p.rank() >= 2 {
            0.3
        } else {
            0.2
        };
        for x in p.data_mut() {
            *x += rng.normal() as f32 * std;
        }
    }
    if let Some(b) = &mut m.logits_bias {
        *b = rng.tensor(b.shape(), 0.5);
    }
    m
}

fn set(m: &mut Transformer, name: &str, values: &[f32]) {
    let (_, p) = m
        .weights
        .params_mut()
        .into_iter()
        .find(|(n, _)| n == name)
        .unwrap();
    p.data_mut().copy_from_slice(values);
}

/// Central differences of `f` for every element of parameter `name`, compared with
/// `analytic`. An element that fails at step `h` is retried at h/10 and h/100 with a
/// tolerance grown as the rounding noise does (∝ 1/h): a ReLU pre-activation within h
/// of its kink makes the central difference average two slopes. Returns (retried
/// elements, the worst first-step error as a fraction of the tolerance).
fn check_param(
    what: &str,
    m: &Transformer,
    name: &str,
    analytic: &[f32],
    h: f32,
    (atol, rtol): (f64, f64),
    mut f: impl FnMut(&Transformer) -> f64,
) -> (usize, f64) {
    let values: Vec<f32> = m
        .weights
        .params()
        .into_iter()
        .find(|(n, _)| n == name)
        .unwrap()
        .1
        .data()
        .to_vec();
    let mut probe = m.clone();
    let mut x = values.clone();
    let (mut retried, mut worst) = (0, 0.0f64);
    for i in 0..x.len() {
        let mut last = String::new();
        let ok = [1.0f32, 0.1, 0.01].iter().enumerate().any(|(k, &s)| {
            let step = h * s;
            let mut eval = |v: f32, x: &mut Vec<f32>| {
                x[i] = v;
                set(&mut probe, name, x);
                (f(&probe), x[i])
            };
            let (up, x_up) = eval(values[i] + step, &mut x);
            let (down, x_down) = eval(values[i] - step, &mut x);
            x[i] = values[i];
            let numeric = (up - down) / (x_up as f64 - x_down as f64);
            let result = compare(what, &analytic[i..i + 1], &[numeric], atol / s as f64, rtol);
            if k == 0 && result.is_err() && std::env::var_os("QKV_FD_VERBOSE").is_some() {
                eprintln!(
                    "{what} {name}[{i}] failed at h = {step}: analytic {} numeric {numeric}",
                    analytic[i]
                );
            }
            if k == 0 && result.is_ok() {
                let err = (analytic[i] as f64 - numeric).abs();
                worst = worst.max(err / (atol + rtol * numeric.abs()));
            }
            if k > 0 && result.is_ok() {
                retried += 1;
                if std::env::var_os("QKV_FD_VERBOSE").is_some() {
                    eprintln!(
                        "{what} {name}[{i}] passed at h = {step}: analytic {} numeric {numeric}",
                        analytic[i]
                    );
                }
            }
            last = format!(
                "{} (element {i}, h = {step})",
                result.err().unwrap_or_default()
            );
            last.len() <= 30
        });
        set(&mut probe, name, &values);
        assert!(ok, "{what}: {name}: {last}");
    }
    (retried, worst)
}

/// d(Σ logits ∘ r)/dθ for every parameter, through `forward_train` and `backward`.
fn analytic(m: &mut Transformer, tokens: &Tokens, r: &Tensor) -> Vec<(String, Vec<f32>)> {
    m.grads = None;
    let (_, tape) = m.forward_train(&tokens.input()).unwrap();
    m.backward(tape, r).unwrap();
    let g = m.grads.as_ref().unwrap();
    g.params()
        .into_iter()
        .map(|(n, t)| (n, t.data().to_vec()))
        .collect()
}

/// Every element of every parameter of every variant: d(Σ logits ∘ R)/dθ by central
/// differences (f32 forward, f64 probe sum) against the backward.
///
/// Tolerance: the probe sum of B·T·V = 110 logits of O(1..10) is known to a few 1e-6
/// in f32, so at h = 1e-2 rounding adds ≲ 5e-4 to the quotient; truncation h²/6·f‴
/// stays within rtol on the large gradients. atol 2e-3 + rtol 1e-2 is far below any
/// missing or wrong term (O(0.1) or more on gradients of O(0.01..20)). An element that
/// fails at the first step must pass at a smaller one (see `check_param`): a ReLU kink
/// within h may excuse at most 1% of a ReLU model's elements; in a smooth model only a
/// large third derivative can (truncation h²·f‴/6; measured: one element of the BERT
/// variant, off by 2% at h = 1e-2 and by 0.08% at h = 1e-3), at most 0.1% of them.
#[test]
fn finite_differences_every_parameter_of_every_variant() {
    let mut report = Vec::new();
    for (vi, (label, arch)) in variants().into_iter().enumerate() {
        let vi = vi as u64 + 10;
        let mut m = fd_model(&arch, 100 + vi);
        let tokens = Tokens::new(&arch, 300 + vi);
        let rows = if arch.decoder.is_some() { T } else { S };
        let r = Rng::new(400 + vi).tensor(&[B, rows, arch.vocab], 1.0);
        let grads = analytic(&mut m, &tokens, &r);
        // A sandwich block divides each branch's output by its RMS, so the loss's third
        // derivative grows as 1/rms³ where a branch's output is small: measured, 7 of
        // 1208 elements off by up to 0.24 at h = 1e-2, converging as h² (3e-4 at
        // h = 1e-3). A step of 5e-3 keeps truncation within the tolerance there.
        let h = match arch.residual {
            Residual::Sandwich => 5e-3,
            _ => 1e-2,
        };
        let (mut count, mut retried, mut worst) = (0, 0, 0.0f64);
        for (name, g) in &grads {
            let (k, w) = check_param(label, &m, name, g, h, (2e-3, 1e-2), |p| {
                probe_loss(
                    p.forward(&tokens.input(), false).unwrap().logits.data(),
                    r.data(),
                )
            });
            retried += k;
            worst = worst.max(w);
            count += g.len();
        }
        assert_eq!(count, m.num_params(), "{label}");
        let per_mille = if arch.ffn.activation == Activation::Relu {
            10
        } else {
            1
        };
        assert!(
            retried * 1000 <= per_mille * count,
            "{label}: {retried} of {count} elements needed smaller steps"
        );
        report.push(format!(
            "{label}: {count} elements, worst {:.0}% of tolerance ({retried} retried)",
            worst * 100.0
        ));
    }
    eprintln!("{}", report.join("\n"));
}

/// The composed path through the real loss of every kind: cross-entropy with ignored
/// targets, a padded source, shared tables and tied heads. The loss is an f32 mean (≈ 3,
/// rounding ~3e-7), so with h = 5e-3 the quotient carries ≤ 1e-4 of rounding and ~1e-4
/// of truncation: atol 5e-4, rtol 1e-2.
#[test]
fn finite_differences_through_cross_entropy() {
    for label in ["gpt2_style", "bert_masked_lm", "vaswani_encoder_decoder"] {
        let (_, arch) = variants().into_iter().find(|(l, _)| *l == label).unwrap();
        let mut m = fd_model(&arch, 7);
        let tokens = Tokens::new(&arch, 8);
        let inputs = tokens.target.as_ref().or(tokens.source.as_ref()).unwrap();
        let mut targets: Vec<i64> = ids(10, arch.vocab, inputs.ids.len())
            .iter()
            .map(|&x| x as i64)
            .collect();
        targets[1] = IGNORE_INDEX;
        targets[6] = IGNORE_INDEX;
        let batch = Batch {
            inputs: inputs.ids.clone(),
            targets,
            batch: B,
            len: inputs.len,
            mask: tokens.target.is_none().then(|| inputs.mask.clone()),
            source: tokens
                .target
                .as_ref()
                .and(tokens.source.as_ref())
                .map(|s| Source {
                    ids: s.ids.clone(),
                    mask: s.mask.clone(),
                    len: S,
                }),
        };
        m.zero_grads();
        m.loss_and_backward(&batch).unwrap();
        let grads: Vec<(String, Vec<f32>)> = m
            .grads
            .as_ref()
            .unwrap()
            .params()
            .into_iter()
            .map(|(n, t)| (n, t.data().to_vec()))
            .collect();
        for (name, g) in &grads {
            let (retried, _) = check_param(label, &m, name, g, 5e-3, (5e-4, 1e-2), |p| {
                let mut logits = p.logits(&batch).unwrap();
                qkv::train::loss::cross_entropy_in_place(&mut logits, &batch.targets).unwrap()
                    as f64
            });
            assert_eq!(retried, 0, "{label}: {name}");
        }
    }
}

/// The reference and tiled attention kernels give the same gradients through every
/// variant (ALiBi, MQA, windows, relative biases, cross-attention included).
#[test]
fn reference_and_tiled_kernels_agree() {
    for (vi, (label, arch)) in variants().into_iter().enumerate() {
        let mut m = fd_model(&arch, 11 + vi as u64);
        let tokens = Tokens::new(&arch, 13);
        let rows = if arch.decoder.is_some() { T } else { S };
        let r = Rng::new(14).tensor(&[B, rows, arch.vocab], 1.0);
        let mut grads = Vec::new();
        for kernel in [Kernel::Reference, Kernel::Tiled] {
            m.kernel = kernel;
            grads.push(analytic(&mut m, &tokens, &r));
        }
        for ((n, a), (_, b)) in grads[0].iter().zip(&grads[1]) {
            assert_close(&format!("{label}: {n}"), a, b, 1e-5, 1e-4);
        }
    }
}

/// `padding_idx` (PyTorch's, set by BERT, Llama and Marian) keeps lookups of the pad
/// id out of the token table's gradient, and changes nothing else: it is not the true
/// derivative (the finite differences above run without it), so it is checked here
/// against the same model without it.
#[test]
fn padding_idx_drops_only_the_pad_rows_lookup_gradient() {
    for label in ["gpt2_style", "separate_vocab_learned_gqa_logits_bias"] {
        let (_, arch) = variants().into_iter().find(|(l, _)| *l == label).unwrap();
        let tokens = Tokens::new(&arch, 21);
        let r = Rng::new(22).tensor(&[B, T, arch.vocab], 1.0);
        let mut m = fd_model(&arch, 23);
        let without = analytic(&mut m, &tokens, &r);
        let pad = tokens.target.as_ref().unwrap().ids[0];
        m.arch.embed.padding_idx = Some(pad);
        let with = analytic(&mut m, &tokens, &r);
        let c = arch.d_model;
        for ((name, a), (_, b)) in without.iter().zip(&with) {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                let pad_row = name == "embed_tokens.weight" && i / c == pad;
                assert!(pad_row || x == y, "{label}: {name}[{i}] changed");
            }
        }
        // the pad row lost exactly its lookups' share; the tied head's share (if any) stays
        let row = |g: &[(String, Vec<f32>)]| {
            g.iter()
                .find(|(n, _)| n == "embed_tokens.weight")
                .unwrap()
                .1[pad * c..(pad + 1) * c]
                .to_vec()
        };
        assert_ne!(row(&without), row(&with), "{label}");
    }
}

#[test]
fn init_is_gpt2s_and_seeded() {
    let arch = Arch::gpt2(50, 64, 4, 4, 32);
    let params = |m: &Transformer| -> Vec<(String, Vec<f32>)> {
        m.weights
            .params()
            .into_iter()
            .map(|(n, t)| (n, t.data().to_vec()))
            .collect()
    };
    let m = Transformer::new(&arch, 1).unwrap();
    assert_eq!(params(&m), params(&Transformer::new(&arch, 1).unwrap()));
    assert_ne!(params(&m), params(&Transformer::new(&arch, 2).unwrap()));
    let std = |v: &[f32]| (v.iter().map(|x| x * x).sum::<f32>() / v.len() as f32).sqrt();
    for (name, v) in params(&m) {
        let s = std(&v);
        if name.contains("norm") && name.ends_with(".weight") {
            assert!(v.iter().all(|&x| x == 1.0), "{name}");
        } else if name.ends_with(".bias") {
            assert!(v.iter().all(|&x| x == 0.0), "{name}");
        } else if name.ends_with("attn.o.weight") || name.ends_with("ffn.down.weight") {
            // residual projections: 0.02 / √(2·4)
            assert!(
                (s / (0.02 / 8f32.sqrt()) - 1.0).abs() < 0.05,
                "{name}: std {s}"
            );
        } else {
            assert!((s / 0.02 - 1.0).abs() < 0.05, "{name}: std {s}");
        }
    }
    // 50·64 wte + 32·64 wpe + 4·(12·64² + 13·64) + 2·64 ln_f
    assert_eq!(
        m.num_params(),
        50 * 64 + 32 * 64 + 4 * (12 * 64 * 64 + 13 * 64) + 2 * 64
    );
}

#[test]
fn bad_batches_are_clear_errors() {
    let mut m = Transformer::new(&Arch::gpt2(11, 8, 1, 2, 4), 0).unwrap();
    let batch = |inputs: Vec<usize>, targets: Vec<i64>, b, t| Batch {
        inputs,
        targets,
        batch: b,
        len: t,
        mask: None,
        source: None,
    };
    let err = |m: &mut Transformer, b: Batch| m.loss_and_backward(&b).unwrap_err().to_string();
    let e = err(&mut m, batch(vec![1; 5], vec![1; 6], 2, 3));
    assert!(e.contains("input_ids"), "{e}");
    let e = err(&mut m, batch(vec![1; 6], vec![1; 5], 2, 3));
    assert!(e.contains("targets"), "{e}");
    let e = err(&mut m, batch(vec![1; 10], vec![1; 10], 2, 5));
    assert!(e.contains("sequence longer"), "{e}");
    let e = err(&mut m, batch(vec![11, 1], vec![1, 1], 1, 2));
    assert!(e.contains("11"), "{e}");
    let e = err(&mut m, batch(vec![1, 1], vec![1, 11], 1, 2));
    assert!(e.contains("target"), "{e}");
    let e = err(&mut m, batch(vec![], vec![], 0, 3));
    assert!(e.contains("empty"), "{e}");
    let mut with_source = batch(vec![1; 3], vec![1; 3], 1, 3);
    with_source.source = Some(Source {
        ids: vec![1],
        mask: vec![true],
        len: 1,
    });
    let e = err(&mut m, with_source);
    assert!(e.contains("source"), "{e}");
    // RoPE has no table: any length runs
    let mut l = Transformer::new(&Arch::llama(11, 8, 1, 2, 1, 4), 0).unwrap();
    l.loss_and_backward(&batch(vec![1; 9], vec![2; 9], 1, 9))
        .unwrap();
    // an encoder-decoder needs its source
    let mut ed = Transformer::new(&Arch::vaswani(11, 8, 1, 2, 4), 0).unwrap();
    let e = err(&mut ed, batch(vec![1; 3], vec![1; 3], 1, 3));
    assert!(e.contains("needs a source"), "{e}");
}
