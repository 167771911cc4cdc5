//! Every layer's attention weights `[B,H,T,S]`, asked of any model's forward with one
//! option, equal transformers' `output_attentions=True` (eager) on the fixtures'
//! right-padded batch: BERT, GPT-2, Llama (GQA), Mistral (sliding window), BLOOM
//! (ALiBi), and T5 and Marian (encoder, decoder and cross-attention). Rows of padded
//! queries are unspecified and skipped; every key of a real query row is compared.
//! Attention rollout and flow over those maps equal their PyTorch and networkx references.

#![cfg(feature = "models")]

mod common;

// every layer's `{prefix}.{l}` at query rows whose token is real
use common::models::check_maps as check;
use common::models::{batch, load, reference};
use qkv::models::explain::{attribute, Method, Target};
use qkv::models::{Input, ModelKind};
use qkv::Tensor;

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

/// The fixture's model and target: the tiny decoders' next token, and the masked-LM
/// BERT's token at `mask_position` (`train_model/bert`).
fn target_case(name: &str) -> (qkv::models::Transformer, common::Fixture, Target) {
    let f = common::fixture("attribution", name);
    match name {
        "bert_mlm" => {
            let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures/train_model/bert");
            let m = qkv::models::load(&dir).unwrap().model;
            let position = f.param_usize("mask_position").unwrap();
            (
                m,
                f,
                Target::Masked {
                    position,
                    token: None,
                },
            )
        }
        _ => (load(name), f, Target::NextToken(None)),
    }
}

/// The gradient of the target (the next token's log-probability, a masked token's)
/// with respect to every map, through the training backward, equals PyTorch's autograd
/// through the eager attention; gradient × attention (Chefer et al. 2021) over them
/// equals its reference; and so does ablation, each key hidden through the mask.
#[test]
fn map_gradients_gradient_rollout_and_ablation_equal_autograd() {
    for name in ["gpt2", "llama_gqa", "bert_mlm"] {
        let (m, f, target) = target_case(name);
        let tokens = fixture_tokens(&f);
        let input = own_input(&m, &tokens);
        let (_, grads) = m
            .attention_grads(&input, |logits| {
                let fixed = target.resolve(logits, &vec![true; tokens.len])?;
                fixed.target.gradient(logits)
            })
            .unwrap();
        let grads = own_maps(&m, &grads);
        for (l, g) in grads.iter().enumerate() {
            let want = f.t(&format!("grad_maps.{l}"));
            common::assert_tensor_close(&format!("{name} grad_maps.{l}"), g, &want, 1e-5, 1e-4);
        }
        let r = attribute(&m, &input, Method::Grad, Some(&target)).unwrap();
        let fixed = r.target.as_ref().unwrap();
        assert_eq!(fixed.token, f.param_usize("target_token"), "{name}");
        let r = own_maps(&m, &r.maps);
        assert_eq!(r.len(), grads.len(), "{name}");
        for (l, g) in r.iter().enumerate() {
            let want = f.t(&format!("grad.{l}"));
            let g = g.clone().reshape(want.shape()).unwrap();
            common::assert_tensor_close(&format!("{name} grad.{l}"), &g, &want, 1e-5, 1e-4);
        }
        let a = attribute(&m, &input, Method::Ablation, Some(&target)).unwrap();
        let scores = Tensor::new(&[tokens.len], a.scores.unwrap()).unwrap();
        common::assert_tensor_close(
            &format!("{name} ablation"),
            &scores,
            &f.t("ablation"),
            1e-4,
            1e-3,
        );
        assert!(a.maps.decoder.is_empty() && a.maps.encoder.is_empty());
    }
}

/// The library's driver runs every method on every fixture, and its maps are those of
/// the functions it combines (rollout and flow checked above, value norms below).
#[test]
fn every_method_runs_with_and_without_a_target() {
    for name in ["gpt2", "bert_mlm"] {
        let (m, f, target) = target_case(name);
        let tokens = fixture_tokens(&f);
        let input = own_input(&m, &tokens);
        let t = tokens.len;
        for method in Method::ALL {
            assert_eq!(Method::from_name(method.name()).unwrap(), method);
            let with = attribute(&m, &input, method, Some(&target)).unwrap();
            let scores = with.scores.unwrap();
            assert_eq!(scores.len(), t, "{name} {}", method.name());
            assert!(scores.iter().all(|x| x.is_finite()));
            if method == Method::Ablation {
                continue;
            }
            let maps = own_maps(&m, &with.maps);
            let heads = if method.per_head() { m.info().heads } else { 1 };
            assert_eq!(maps[0].shape(), &[heads, t, t], "{name} {}", method.name());
            match method.needs_target() {
                true => assert!(attribute(&m, &input, method, None).is_err()),
                false => {
                    let without = attribute(&m, &input, method, None).unwrap();
                    assert!(without.scores.is_none() && without.target.is_none());
                    assert_eq!(
                        own_maps(&m, &without.maps),
                        maps,
                        "{name} {}",
                        method.name()
                    );
                }
            }
        }
    }
    let err = Method::from_name("saliency").unwrap_err().to_string();
    assert!(err.contains("value-norm"), "{err}");
}

/// Rollout and flow through the driver are the library's functions over the maps.
#[test]
fn driver_rollout_is_the_library_rollout() {
    let m = load("llama_gqa");
    let f = common::fixture("attribution", "llama_gqa");
    let tokens = fixture_tokens(&f);
    let input = own_input(&m, &tokens);
    let r = attribute(&m, &input, Method::Rollout, None).unwrap();
    for (l, g) in own_maps(&m, &r.maps).iter().enumerate() {
        let want = f.t(&format!("rollout.{l}"));
        let g = g.clone().reshape(want.shape()).unwrap();
        common::assert_tensor_close(&format!("rollout.{l}"), &g, &want, 1e-5, 1e-4);
    }
}

/// A batch of two rows, a padded row and a token out of the vocabulary are refused by
/// name.
#[test]
fn the_driver_refuses_inputs_it_cannot_explain() {
    let m = load("gpt2");
    let two = qkv::models::TokenBatch::new(vec![1, 2, 3, 4], None, 2, 2).unwrap();
    let input = own_input(&m, &two);
    let err = attribute(&m, &input, Method::Weights, None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("one unpadded sequence"), "{err}");
    let one = qkv::models::TokenBatch::single(vec![1, 2, 3]).unwrap();
    let input = own_input(&m, &one);
    let err = attribute(
        &m,
        &input,
        Method::Grad,
        Some(&Target::NextToken(Some(1 << 20))),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("target token"), "{err}");
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

/// Every method over T5's encoder, decoder and cross-attention equals the references of
/// `tools/fixtures/gen_attribution.py`: the maps' gradients (autograd), rollout and
/// gradient × attention through the cross-attention, flow of each stack, value norms of
/// the three attentions, and ablation of each source token for the next token.
#[test]
fn every_method_over_an_encoder_decoder_equals_the_references() {
    let m = load("t5");
    let f = common::fixture("attribution", "t5");
    let ids = |name: &str| -> Vec<usize> { f.ints(name).1.iter().map(|&i| i as usize).collect() };
    let source = qkv::models::TokenBatch::single(ids("input_ids")).unwrap();
    let target = qkv::models::TokenBatch::single(ids("decoder_input_ids")).unwrap();
    let input = Input {
        source: Some(&source),
        target: Some(&target),
        token_types: None,
    };
    let goal = Target::NextToken(None);
    let check = |method: &str, maps: &qkv::models::Attentions| {
        for (kind, got) in [
            ("encoder", &maps.encoder),
            ("decoder", &maps.decoder),
            ("cross", &maps.cross),
        ] {
            let names: Vec<String> = (0..2).map(|l| format!("{method}.{kind}.{l}")).collect();
            if !f.has(&names[0]) {
                assert!(got.is_empty(), "{method} {kind}: no reference, so no maps");
                continue;
            }
            assert_eq!(got.len(), 2, "{method} {kind}");
            for (g, name) in got.iter().zip(&names) {
                let want = f.t(name);
                let g = g.clone().reshape(want.shape()).unwrap();
                common::assert_tensor_close(&format!("t5 {name}"), &g, &want, 1e-5, 1e-4);
            }
        }
    };
    let (_, grads) = m
        .attention_grads(&input, |logits| {
            let fixed = goal.resolve(logits, &vec![true; target.len])?;
            fixed.target.gradient(logits)
        })
        .unwrap();
    check("grad_maps", &grads);
    for method in [
        Method::Rollout,
        Method::Flow,
        Method::Grad,
        Method::ValueNorm,
    ] {
        let a = attribute(&m, &input, method, Some(&goal)).unwrap();
        assert_eq!(a.target.unwrap().token, f.param_usize("target_token"));
        let name = match method {
            Method::ValueNorm => "value_norm",
            m => m.name(),
        };
        check(name, &a.maps);
    }
    let a = attribute(&m, &input, Method::Ablation, Some(&goal)).unwrap();
    let scores = Tensor::new(&[source.len], a.scores.unwrap()).unwrap();
    common::assert_tensor_close("t5 ablation", &scores, &f.t("ablation"), 1e-4, 1e-3);
}

/// Every method runs on every family's fixture, with the target each kind of model
/// has (a decoder's next token, an encoder-decoder's through its cross-attention, a
/// headless encoder's cosine with a fixed vector), and gives finite maps of the shapes
/// its kind promises and one score per input token. The references above pin the
/// values on the families they cover; this pins that nothing family-specific breaks.
#[test]
fn every_method_runs_on_every_family() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert!(names.len() >= 25, "{names:?}");
    for name in &names {
        let m = load(name);
        let (s, t) = (5usize, 4usize);
        let source = qkv::models::TokenBatch::single((3..3 + s).collect()).unwrap();
        let target = qkv::models::TokenBatch::single((3..3 + t).collect()).unwrap();
        let (input, goal, keys) = match m.kind() {
            ModelKind::Decoder => (own_input(&m, &target), Target::NextToken(None), t),
            ModelKind::Encoder => {
                let c = m.info().hidden;
                let goal = match m.arch.head {
                    qkv::models::Head::None => Target::Cosine {
                        with: (0..c).map(|i| (i as f32).sin()).collect(),
                        pooling: vec![qkv::models::sentence::PoolingMode::Mean],
                    },
                    _ => Target::Masked {
                        position: 2,
                        token: None,
                    },
                };
                (own_input(&m, &source), goal, s)
            }
            ModelKind::EncoderDecoder => (
                Input {
                    source: Some(&source),
                    target: Some(&target),
                    token_types: None,
                },
                Target::NextToken(None),
                s,
            ),
        };
        for method in Method::ALL {
            let a = attribute(&m, &input, method, Some(&goal))
                .unwrap_or_else(|e| panic!("{name} {}: {e}", method.name()));
            let scores = a.scores.as_ref();
            if method != Method::Flow || m.kind() != ModelKind::EncoderDecoder {
                let scores =
                    scores.unwrap_or_else(|| panic!("{name} {}: no scores", method.name()));
                assert_eq!(scores.len(), keys, "{name} {}", method.name());
                assert!(
                    scores.iter().all(|x| x.is_finite()),
                    "{name} {}",
                    method.name()
                );
            }
            let heads = if method.per_head() { m.info().heads } else { 1 };
            for map in a
                .maps
                .encoder
                .iter()
                .chain(&a.maps.decoder)
                .chain(&a.maps.cross)
            {
                assert_eq!(map.shape()[1], heads, "{name} {}", method.name());
                map.check_finite(name).unwrap();
            }
        }
    }
}
