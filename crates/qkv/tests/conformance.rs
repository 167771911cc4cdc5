//! What transformers loads and runs, qkv loads and runs with the same numbers; what it
//! cannot compute exactly it refuses naming the field, and what it does not know it
//! names in a warning (issue 47). Fixtures: `tools/fixtures/gen_conformance.py`
//! (transformers 4.57.1), and edited copies of the family fixtures for config quirks
//! of the published checkpoints and of transformers 5.x.

#![cfg(feature = "models")]

mod common;

use common::models::{
    assert_real_close, batch, check_causal, check_causal_model, check_encoder_against, load,
    load_causal, reference, EditedFixture,
};
use qkv::models::generate::{generate_causal, GenerateOptions, Sampling};
use qkv::models::{Input, TokenBatch};
use serde_json::json;

#[test]
fn a_probe_gpt2_with_special_ids_outside_its_vocabulary_loads_runs_and_generates_as_hf() {
    let m = load_causal("gpt2_probe");
    let f = reference("gpt2_probe");
    // bos = eos = 50256 in a vocabulary of 99: named in warnings, left unset
    assert!(m.special_tokens().eos.is_empty() && m.special_tokens().bos.is_none());
    let outside: Vec<&String> = m
        .load_warnings
        .iter()
        .filter(|w| w.contains("token id 50256 is outside the vocabulary of 99"))
        .collect();
    assert_eq!(outside.len(), 2, "{:?}", m.load_warnings);
    assert!(
        outside
            .iter()
            .any(|w| w.contains("`eos_token_id`") && w.contains("never stops at it")),
        "{outside:?}"
    );
    let tokens = batch(&f, "input_ids", Some("attention_mask"));
    let input = Input {
        target: Some(&tokens),
        ..Default::default()
    };
    let logits = m.forward(&input, false).unwrap().logits;
    assert_real_close("gpt2_probe logits", &logits, &f.t("logits"), &tokens.mask);
    // generate() with the folder's own settings never meets its EOS
    let prompt: Vec<usize> = f.ints("gen_prompt").1.iter().map(|&i| i as usize).collect();
    let want: Vec<usize> = f.ints("gen_output").1.iter().map(|&i| i as usize).collect();
    let max_new = want.len() - prompt.len();
    assert_eq!(prompt.len(), 5);
    let opts = GenerateOptions::new(max_new, Sampling::Greedy, m.special_tokens().eos.clone());
    let got = generate_causal(&m, &TokenBatch::single(prompt).unwrap(), &opts).unwrap();
    assert_eq!(got, vec![want[5..].to_vec()]);
    // saved again (after training, say), the folder keeps the ids it came with
    let out = std::env::temp_dir().join(format!("qkv-probe-save-{}", std::process::id()));
    m.save(&out).unwrap();
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(
        (&config["bos_token_id"], &config["eos_token_id"]),
        (&json!(50256), &json!(50256))
    );
    std::fs::remove_dir_all(&out).unwrap();
}

#[test]
fn the_first_gemma_matches_hf() {
    check_causal("gemma");
    let m = load_causal("gemma");
    assert_eq!(m.family.name(), "gemma");
    assert_eq!(m.arch.residual, qkv::block::Residual::PreNorm);
    assert!(m.arch.norm.unit_offset && m.arch.embed.scale && m.arch.head.tied());
    assert!(m.load_warnings.is_empty(), "{:?}", m.load_warnings);
}

#[test]
fn qwen2_windows_on_layers_that_are_not_one_top_run_match_hf() {
    check_causal("qwen2_layer_types");
    let m = load_causal("qwen2_layer_types");
    assert_eq!(m.arch.attention.window, Some(3));
    assert_eq!(m.arch.attention.local_layers, Some(vec![true, false, true]));
}

#[test]
fn distilbert_with_sinusoidal_positions_matches_hf() {
    let m = load("distilbert_sinusoidal");
    check_encoder_against(
        "distilbert_sinusoidal",
        &reference("distilbert_sinusoidal"),
        &m,
    );
}

#[test]
fn roberta_for_masked_lm_gives_its_logits_and_hidden_states() {
    let m = load("roberta_mlm");
    let f = reference("roberta_mlm");
    let tokens = batch(&f, "input_ids", Some("attention_mask"));
    let input = Input {
        source: Some(&tokens),
        ..Default::default()
    };
    let logits = m.forward(&input, false).unwrap().logits;
    assert_real_close("roberta_mlm logits", &logits, &f.t("logits"), &tokens.mask);
    let hidden = m.hidden_states(&tokens, None).unwrap();
    assert_real_close(
        "roberta_mlm last_hidden_state",
        &hidden,
        &f.t("last_hidden_state"),
        &tokens.mask,
    );
}

#[test]
fn gemma2_published_configs_carry_hidden_act_beside_hidden_activation() {
    // google/gemma-2-*: both keys; Gemma2MLP reads hidden_activation only
    let dir = EditedFixture::new("gemma2", |c| {
        c["hidden_act"] = json!("gelu");
        c["hidden_activation"] = json!("gelu_pytorch_tanh");
        c["cache_implementation"] = json!("hybrid");
    });
    let m = dir.load_causal();
    assert!(m.load_warnings.is_empty(), "{:?}", m.load_warnings);
    check_causal_model("gemma2", &m);
}

#[test]
fn null_means_absent() {
    // transformers 5.x writes `use_bidirectional_attention: null` and nulls for unset sizes
    let dir = EditedFixture::new("gemma3", |c| {
        c["use_bidirectional_attention"] = json!(null);
        c["attn_logit_softcapping"] = json!(null);
        c["sliding_window_pattern"] = json!(null);
    });
    check_causal_model("gemma3", &dir.load_causal());
    let dir = EditedFixture::new("bert", |c| c["is_decoder"] = json!(null));
    assert!(qkv::models::load(dir.path()).is_ok());
}

#[test]
fn unknown_keys_are_named_in_a_warning_and_values_qkv_cannot_compute_are_refused() {
    let dir = EditedFixture::new("llama_gqa", |c| c["frobnicate_heads"] = json!(2));
    let m = dir.load_causal();
    assert_eq!(m.load_warnings.len(), 1, "{:?}", m.load_warnings);
    assert!(
        m.load_warnings[0].contains("field `frobnicate_heads`")
            && m.load_warnings[0].contains("config.json"),
        "{:?}",
        m.load_warnings
    );
    check_causal_model("llama_gqa", &m);
    for (name, key, value) in [
        ("bert", "is_decoder", json!(true)),
        ("llama_gqa", "pruned_heads", json!({"0": [1]})),
        ("gpt2", "add_cross_attention", json!(true)),
        ("roberta", "tie_word_embeddings", json!(false)),
    ] {
        let dir = EditedFixture::new(name, |c| c[key] = value.clone());
        let err = qkv::models::load(dir.path())
            .err()
            .expect("refused")
            .to_string();
        assert!(
            err.contains(&format!("field `{key}`")) && err.contains("config.json"),
            "{name} {key}: {err}"
        );
    }
    // an unknown RoPE setting is named too (transformers warns and ignores it)
    let dir = EditedFixture::new("llama3_rope", |c| {
        c["rope_scaling"]["mrope_section"] = json!([1])
    });
    let m = dir.load_causal();
    assert!(
        m.load_warnings
            .iter()
            .any(|w| w.contains("rope_scaling.mrope_section")),
        "{:?}",
        m.load_warnings
    );
}

#[test]
fn gemma3_rope_parameters_nested_by_layer_type_set_both_bases() {
    // transformers 5.x's layout of the gemma3 fixture's RoPE: the global entry scaled,
    // the local one plain; read flat, the global base would silently be 10 000
    let dir = EditedFixture::new("gemma3", |c| {
        let global = json!({"rope_type": "linear", "factor": 2.0, "rope_theta": c["rope_theta"]});
        let local = json!({"rope_type": "default", "rope_theta": c["rope_local_base_freq"]});
        let o = c.as_object_mut().unwrap();
        for k in ["rope_theta", "rope_scaling", "rope_local_base_freq"] {
            o.remove(k);
        }
        o.insert(
            "rope_parameters".into(),
            json!({"full_attention": global, "sliding_attention": local}),
        );
    });
    let m = dir.load_causal();
    assert!(m.load_warnings.is_empty(), "{:?}", m.load_warnings);
    check_causal_model("gemma3", &m);
    // a scaled local entry is not one transformers builds for Gemma 3's local layers
    let dir = EditedFixture::new("gemma3", |c| {
        c["rope_parameters"] = json!({
            "full_attention": {"rope_type": "default", "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4},
        });
    });
    let err = qkv::models::load(dir.path())
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains("rope_parameters.sliding_attention"), "{err}");
}

#[test]
fn phi3_with_its_rotary_share_inside_rope_parameters_matches_hf() {
    // transformers 5.x moves partial_rotary_factor (0.75 here, Phi-4-mini's) into
    // rope_parameters, beside the LongRoPE factors of the 3 rotating pairs of 4
    let dir = EditedFixture::new("phi3", |c| {
        let mut p = c["rope_scaling"].clone();
        p["rope_type"] = p["type"].take();
        p["rope_theta"] = c["rope_theta"].clone();
        p["partial_rotary_factor"] = c["partial_rotary_factor"].clone();
        let o = p.as_object_mut().unwrap();
        o.remove("type");
        let p = serde_json::Value::Object(o.clone());
        let o = c.as_object_mut().unwrap();
        for k in ["rope_theta", "rope_scaling", "partial_rotary_factor"] {
            o.remove(k);
        }
        o.insert("rope_parameters".into(), p);
    });
    check_causal_model("phi3", &dir.load_causal());
}

#[test]
fn modernbert_sequence_classifiers_pool_by_cls_and_by_mean_as_hf() {
    for name in ["modernbert_cls", "modernbert_mean"] {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/classify")
            .join(name);
        let m = qkv::models::SequenceClassifier::load(&dir, qkv::weights::DType::F32)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let f = common::fixture("classify", &format!("{name}/reference"));
        assert_eq!(m.labels(), ["no", "yes"]);
        let tokens = batch(&f, "input_ids", Some("attention_mask"));
        let logits = m.logits(&tokens, None).unwrap();
        common::assert_close(
            &format!("{name} logits"),
            logits.data(),
            f.t("logits").data(),
            1e-5,
            1e-4,
        );
    }
}

#[test]
fn a_classifier_folder_reads_every_tensor_it_holds() {
    // the encoder leaves the head to SequenceClassifier: nothing is named unused
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/classify");
    for name in [
        "bert_reranker",
        "distilbert_sst",
        "xlm_roberta_nli",
        "modernbert_cls",
    ] {
        let loaded = qkv::models::load(&root.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(loaded.unused.is_empty(), "{name}: {:?}", loaded.unused);
    }
}
