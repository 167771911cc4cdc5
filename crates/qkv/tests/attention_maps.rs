//! Every layer's attention weights `[B,H,T,S]`, asked of any model's forward with one
//! option, equal transformers' `output_attentions=True` (eager) on the fixtures'
//! right-padded batch: BERT, GPT-2, Llama (GQA), Mistral (sliding window), BLOOM
//! (ALiBi), and T5 and Marian (encoder, decoder and cross-attention). Rows of padded
//! queries are unspecified and skipped; every key of a real query row is compared.
//! Attention rollout and flow over those maps equal their PyTorch and networkx references.

#![cfg(feature = "models")]

mod common;

use common::assert_close;
use common::models::{batch, load, reference};
use qkv::models::{Input, ModelKind};
use qkv::Tensor;

/// Compares `got` with the fixture's `{prefix}.{l}` for each layer, at query rows
/// whose token is real (`query_mask`: `[B·T]`).
fn check(name: &str, prefix: &str, got: &[Tensor], want: &common::Fixture, query_mask: &[bool]) {
    assert!(!got.is_empty(), "{name}: no {prefix}");
    for (l, g) in got.iter().enumerate() {
        let w = want.t(&format!("{prefix}.{l}"));
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

#[test]
fn self_attention_weights_match_transformers() {
    for name in [
        "bert",
        "gpt2",
        "llama_gqa",
        "mistral",
        "qwen3",
        "gpt_neox",
        "gemma2",
        "gemma3",
        "phi3",
        "roberta",
        "xlm_roberta",
        "distilbert",
        "modernbert",
        "bloom",
    ] {
        let m = load(name);
        let f = reference(name);
        let tokens = batch(&f, "input_ids", Some("attention_mask"));
        let types: Option<Vec<usize>> = f.has("token_type_ids").then(|| {
            f.ints("token_type_ids")
                .1
                .iter()
                .map(|&x| x as usize)
                .collect()
        });
        let input = match m.kind() {
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
        let maps = match m.kind() {
            ModelKind::Encoder => &out.attentions.encoder,
            _ => &out.attentions.decoder,
        };
        let layers = (0..)
            .take_while(|l| f.has(&format!("attentions.{l}")))
            .count();
        assert_eq!(maps.len(), layers, "{name}");
        check(name, "attentions", maps, &f, &tokens.mask);
    }
}

#[test]
fn encoder_decoder_and_cross_attention_weights_match_transformers() {
    for name in ["t5", "marian"] {
        let m = load(name);
        let f = reference(name);
        let src = batch(&f, "input_ids", Some("attention_mask"));
        let tgt = batch(&f, "decoder_input_ids", None);
        let input = Input {
            source: Some(&src),
            target: Some(&tgt),
            token_types: None,
        };
        let a = m.forward(&input, true).unwrap().attentions;
        check(name, "encoder_attentions", &a.encoder, &f, &src.mask);
        check(name, "decoder_attentions", &a.decoder, &f, &tgt.mask);
        check(name, "cross_attentions", &a.cross, &f, &tgt.mask);
    }
}

/// Asking for the weights changes no output.
#[test]
fn weights_do_not_change_the_logits() {
    let m = load("llama_gqa");
    let f = reference("llama_gqa");
    let tokens = batch(&f, "input_ids", Some("attention_mask"));
    let input = Input {
        target: Some(&tokens),
        ..Default::default()
    };
    let with = m.forward(&input, true).unwrap();
    let without = m.forward(&input, false).unwrap();
    assert_eq!(with.logits, without.logits);
    assert!(without.attentions.decoder.is_empty());
}

/// One sequence's maps `[B=1,H,T,T]` per layer as [`qkv::attribution`] takes them.
fn one_sequence(maps: &[Tensor]) -> Vec<Tensor> {
    maps.iter()
        .map(|m| m.clone().reshape(&m.shape()[1..]).unwrap())
        .collect()
}

/// The fixture's `input_ids` `[T]` as one row.
fn fixture_tokens(f: &common::Fixture) -> qkv::models::TokenBatch {
    let ids: Vec<usize> = f.ints("input_ids").1.iter().map(|&i| i as usize).collect();
    qkv::models::TokenBatch::single(ids).unwrap()
}

/// `tokens` as the input of the model's own self-attention stack (an encoder's source,
/// a decoder's target).
fn own_input<'a>(m: &qkv::models::Transformer, tokens: &'a qkv::models::TokenBatch) -> Input<'a> {
    match m.kind() {
        ModelKind::Encoder => Input {
            source: Some(tokens),
            ..Default::default()
        },
        _ => Input {
            target: Some(tokens),
            ..Default::default()
        },
    }
}

/// The self-attention stack's maps (or anything shaped as them) of one sequence.
fn own_maps(m: &qkv::models::Transformer, maps: &qkv::models::Attentions) -> Vec<Tensor> {
    one_sequence(match m.kind() {
        ModelKind::Encoder => &maps.encoder,
        _ => &maps.decoder,
    })
}

/// Rollout and attention flow over the maps of the tiny fixtures equal the PyTorch and
/// networkx references (`tools/fixtures/gen_attribution.py`).
#[test]
fn rollout_and_flow_equal_the_references() {
    for name in ["bert", "gpt2", "llama_gqa"] {
        let m = load(name);
        let f = common::fixture("attribution", name);
        let tokens = fixture_tokens(&f);
        let input = own_input(&m, &tokens);
        let maps = own_maps(&m, &m.forward(&input, true).unwrap().attentions);
        for (method, got) in [
            ("rollout", qkv::attribution::rollout(&maps).unwrap()),
            ("flow", qkv::attribution::flow(&maps).unwrap()),
        ] {
            assert_eq!(got.len(), maps.len(), "{name} {method}");
            for (l, g) in got.iter().enumerate() {
                let want = f.t(&format!("{method}.{l}"));
                common::assert_tensor_close(&format!("{name} {method}.{l}"), g, &want, 1e-5, 1e-4);
            }
        }
    }
}

/// Maps that are not one sequence's self-attention, and flow past its length limit, are
/// refused by name.
#[test]
fn attribution_refuses_maps_it_cannot_read() {
    use qkv::attribution::{flow, rollout, MAX_FLOW_TOKENS};
    let cross = Tensor::zeros(&[2, 3, 4]);
    let err = rollout(&[cross]).unwrap_err().to_string();
    assert!(err.contains("maps[0]"), "{err}");
    let a = Tensor::from_fn(&[1, 3, 3], |_| 1.0 / 3.0);
    let b = Tensor::from_fn(&[1, 4, 4], |_| 0.25);
    let err = flow(&[a, b]).unwrap_err().to_string();
    assert!(err.contains("maps[1]"), "{err}");
    assert!(rollout(&[]).is_err());
    let t = MAX_FLOW_TOKENS + 1;
    let long = Tensor::from_fn(&[1, t, t], |_| 1.0 / t as f32);
    let err = flow(&[long]).unwrap_err().to_string();
    assert!(err.contains("rollout"), "{err}");
    let mut nan = Tensor::from_fn(&[1, 2, 2], |_| 0.5);
    nan.data_mut()[1] = f32::NAN;
    assert!(rollout(&[nan]).is_err());
}

/// d log p(next token) / d logits `[1,T,V]`: one-hot minus softmax at the last position,
/// zero elsewhere; the token is the most likely one, as the fixture chose it.
fn next_token_target(logits: &Tensor, token: usize) -> qkv::Result<Tensor> {
    let (t, v) = (logits.shape()[1], logits.shape()[2]);
    let last = &logits.data()[(t - 1) * v..];
    let max = last.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = last.iter().map(|z| (z - max).exp()).sum();
    let mut d = Tensor::zeros(logits.shape());
    for (j, x) in d.data_mut()[(t - 1) * v..].iter_mut().enumerate() {
        *x = f32::from(u8::from(j == token)) - (last[j] - max).exp() / sum;
    }
    Ok(d)
}

/// The gradient of the next token's log-probability with respect to every map, through
/// the training backward, equals PyTorch's autograd through the eager attention; and
/// gradient × attention (Chefer et al. 2021) over them equals its reference.
#[test]
fn map_gradients_and_gradient_rollout_equal_autograd() {
    for name in ["gpt2", "llama_gqa"] {
        let m = load(name);
        let f = common::fixture("attribution", name);
        let ids: Vec<usize> = f.ints("input_ids").1.iter().map(|&i| i as usize).collect();
        let token = f.param_usize("target_token").unwrap();
        let tokens = qkv::models::TokenBatch::single(ids).unwrap();
        let input = Input {
            target: Some(&tokens),
            ..Default::default()
        };
        let (maps, grads) = m
            .attention_grads(&input, |logits| next_token_target(logits, token))
            .unwrap();
        let (maps, grads) = (one_sequence(&maps.decoder), one_sequence(&grads.decoder));
        assert_eq!(grads.len(), maps.len(), "{name}");
        for (l, g) in grads.iter().enumerate() {
            let want = f.t(&format!("grad_maps.{l}"));
            common::assert_tensor_close(&format!("{name} grad_maps.{l}"), g, &want, 1e-5, 1e-4);
        }
        let r = qkv::attribution::gradient_rollout(&maps, &grads).unwrap();
        for (l, g) in r.iter().enumerate() {
            let want = f.t(&format!("grad.{l}"));
            common::assert_tensor_close(&format!("{name} grad.{l}"), g, &want, 1e-5, 1e-4);
        }
    }
}

/// Norm-based attention (Kobayashi et al. 2020): each weight times the size of what its
/// key's value adds through the head, equal to the PyTorch reference read from forward
/// hooks on BERT, GPT-2 (fused QKV) and Llama (GQA).
#[test]
fn value_norms_equal_the_reference() {
    for name in ["bert", "gpt2", "llama_gqa"] {
        let m = load(name);
        let f = common::fixture("attribution", name);
        let tokens = fixture_tokens(&f);
        let input = own_input(&m, &tokens);
        let got = own_maps(&m, &m.value_norms(&input).unwrap());
        for (l, g) in got.iter().enumerate() {
            let want = f.t(&format!("value_norm.{l}"));
            common::assert_tensor_close(&format!("{name} value_norm.{l}"), g, &want, 1e-5, 1e-4);
        }
    }
}
