//! Generation as transformers' `generate()` runs it under generation configs
//! (tools/fixtures/gen_generate.py): beam search with its length penalty and each
//! early-stopping rule, banned words and forced EOS, on an OPUS-MT style Marian folder
//! (its own generation_config.json, then overrides) and on a Llama with a prompt and a
//! left-padded batch, greedy and beams under a repetition penalty. Frequent tokens stand
//! in for EOS in some runs so that hypotheses finish before the length limit. The
//! sampling warpers (temperature, top-k, top-p, min-p) and the repetition penalty are
//! held to transformers' own processors on fixed rows of logits.

#![cfg(feature = "models")]

mod common;

use std::path::{Path, PathBuf};

use qkv::models::generate::{
    candidates, generate_causal, generate_seq2seq, GenerateOptions, Penalties, Sampling,
};
use qkv::models::generation_config::{EarlyStopping, GenerationConfig};
use qkv::models::request::Request;
use qkv::models::{self, TokenBatch};
use qkv::text::Tokenizer;
use serde_json::Value;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn read(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn usizes(v: &Value) -> Vec<usize> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as usize)
        .collect()
}

/// `config` with generate()'s keyword arguments applied; the EOS ids they name, if any.
fn apply(config: &mut GenerationConfig, kwargs: &Value) -> Option<Vec<usize>> {
    let kw = kwargs.as_object().unwrap();
    if let Some(n) = kw.get("num_beams") {
        config.search.num_beams = n.as_u64().unwrap() as usize;
    }
    if let Some(p) = kw.get("length_penalty") {
        config.search.length_penalty = p.as_f64().unwrap() as f32;
    }
    if let Some(e) = kw.get("early_stopping") {
        config.search.early_stopping = match e {
            Value::Bool(true) => EarlyStopping::Done,
            Value::Bool(false) => EarlyStopping::Heuristic,
            _ => EarlyStopping::Never,
        };
    }
    if let Some(n) = kw.get("max_new_tokens") {
        config.max_new_tokens = Some(n.as_u64().unwrap() as usize);
    }
    if let Some(r) = kw.get("repetition_penalty") {
        config.search.penalties.repetition = r.as_f64().unwrap() as f32;
    }
    if let Some(id) = kw.get("forced_eos_token_id") {
        config.search.forced_eos = vec![id.as_u64().unwrap() as usize];
    }
    kw.get("eos_token_id")
        .map(|id| vec![id.as_u64().unwrap() as usize])
}

/// The new tokens of one output row: after `skip` tokens, up to and including the
/// first EOS (transformers pads what follows).
fn new_tokens(output: &[usize], skip: usize, eos: &[usize]) -> Vec<usize> {
    let rest = &output[skip..];
    match rest.iter().position(|t| eos.contains(t)) {
        Some(i) => rest[..=i].to_vec(),
        None => rest.to_vec(),
    }
}

/// An OPUS-MT style folder, as gen_generate.py assembles it: models/marian's config and
/// weights, tokenizers/marian's files, generate/marian_opus's generation config.
fn opus_folder() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("qkv-opus-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (from, file) in [
        ("models/marian", "config.json"),
        ("models/marian", "model.safetensors"),
        ("tokenizers/marian", "source.spm"),
        ("tokenizers/marian", "target.spm"),
        ("tokenizers/marian", "vocab.json"),
        ("tokenizers/marian", "tokenizer_config.json"),
        ("generate/marian_opus", "generation_config.json"),
    ] {
        std::fs::copy(fixtures().join(from).join(file), dir.join(file)).unwrap();
    }
    dir
}

#[test]
fn marian_folder_generates_as_transformers_under_its_config_and_overrides() {
    let dir = opus_folder();
    let model = models::load(&dir).unwrap().model;
    let tok = Tokenizer::from_dir(&dir).unwrap();
    let folder = GenerationConfig::read(&dir).unwrap();
    assert_eq!(
        (
            folder.search.num_beams,
            &folder.search.bad_words,
            &folder.search.forced_eos
        ),
        (4, &vec![vec![98]], &vec![0])
    );
    assert!(folder.search.renormalize_logits && folder.max_length == 12);
    let r = read(&fixtures().join("generate/marian_opus/reference.json"));
    let mut checked = 0;
    for case in r["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let ids = tok.encode(text, true).unwrap();
        assert_eq!(ids, usizes(&case["input_ids"]), "{text:?}");
        let src = TokenBatch::single(ids).unwrap();
        for run in case["runs"].as_array().unwrap() {
            let mut config = folder.clone();
            let eos =
                apply(&mut config, &run["kwargs"]).unwrap_or(model.special_tokens().eos.clone());
            let max_new = config.max_new_tokens.unwrap_or(config.max_length - 1);
            let opts =
                GenerateOptions::new(max_new, Sampling::Greedy, eos.clone()).with_config(&config);
            let got = generate_seq2seq(&model, &src, &opts).unwrap().remove(0);
            let output = usizes(&run["output_ids"][0]);
            let want = new_tokens(&output, 1, &eos);
            assert_eq!(got, want, "{text:?} with {}", run["kwargs"]);
            assert_eq!(tok.decode(&got).unwrap(), run["text"].as_str().unwrap());
            checked += 1;
        }
    }
    assert!(checked >= 33);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn llama_beam_search_matches_transformers_on_a_prompt_and_a_padded_batch() {
    let model = models::load(&fixtures().join("models/llama_gqa"))
        .unwrap()
        .model;
    let r = read(&fixtures().join("generate/llama_gqa_beams.json"));
    let runs = r["runs"].as_array().unwrap();
    assert!(runs.len() >= 10);
    for run in runs {
        let kwargs = &run["kwargs"];
        let mut config = GenerationConfig::default();
        let eos = apply(&mut config, kwargs).unwrap();
        let rows = run["input_ids"].as_array().unwrap();
        let len = rows[0].as_array().unwrap().len();
        let ids: Vec<usize> = rows.iter().flat_map(usizes).collect();
        let mask: Vec<bool> = run["attention_mask"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(usizes)
            .map(|m| m == 1)
            .collect();
        let prompt = TokenBatch::new(ids, Some(mask), rows.len(), len).unwrap();
        let max_new = config.max_new_tokens.unwrap();
        let opts =
            GenerateOptions::new(max_new, Sampling::Greedy, eos.clone()).with_config(&config);
        let got = generate_causal(&model, &prompt, &opts).unwrap();
        for (row, output) in run["output_ids"].as_array().unwrap().iter().enumerate() {
            let want = new_tokens(&usizes(output), len, &eos);
            assert_eq!(got[row], want, "row {row} with {kwargs}");
        }
    }
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().map_or(f32::NEG_INFINITY, |x| x as f32))
        .collect()
}

/// The distribution sampling draws from equals transformers' warpers' softmax: the same
/// tokens kept, the same probabilities.
#[test]
fn sampling_candidates_equal_transformers_warpers() {
    let r = read(&fixtures().join("generate/warpers.json"));
    let rows: Vec<Vec<f32>> = r["rows"].as_array().unwrap().iter().map(floats).collect();
    let cases = r["cases"].as_array().unwrap();
    assert!(cases.len() >= 20);
    for case in cases {
        let s = &case["settings"];
        let sampling = Sampling::Sample {
            temperature: s["temperature"].as_f64().unwrap() as f32,
            top_k: s["top_k"].as_u64().map(|k| k as usize),
            top_p: s["top_p"].as_f64().map(|p| p as f32),
            min_p: s["min_p"].as_f64().map(|p| p as f32),
            seed: 0,
        };
        let row = &rows[case["row"].as_u64().unwrap() as usize];
        let want: Vec<f64> = case["probs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_f64().unwrap())
            .collect();
        let mut got = vec![0.0; row.len()];
        for (id, p) in candidates(row, sampling) {
            got[id] = p;
        }
        for (id, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(*g > 0.0, *w > 0.0, "token {id} kept differently under {s}");
            assert!(
                (g - w).abs() < 1e-6,
                "token {id}: {g} against {w} under {s}"
            );
        }
    }
}

#[test]
fn the_repetition_penalty_equals_transformers() {
    let r = read(&fixtures().join("generate/warpers.json"));
    let rows: Vec<Vec<f32>> = r["rows"].as_array().unwrap().iter().map(floats).collect();
    for case in r["penalties"].as_array().unwrap() {
        let p = Penalties {
            repetition: case["penalty"].as_f64().unwrap() as f32,
            ..Penalties::default()
        };
        let mut row = rows[case["row"].as_u64().unwrap() as usize].clone();
        p.apply(&mut row, &usizes(&case["input_ids"]), &[]);
        assert_eq!(row, floats(&case["scores"]), "{}", case["penalty"]);
    }
}

#[test]
fn bad_generation_configs_name_the_field() {
    let dir = std::env::temp_dir().join(format!("qkv-genconfig-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (json, field) in [
        (r#"{"num_beams": 0}"#, "num_beams"),
        (r#"{"early_stopping": "sometimes"}"#, "early_stopping"),
        (r#"{"bad_words_ids": [[]]}"#, "bad_words_ids"),
        (r#"{"bad_words_ids": [[-3]]}"#, "bad_words_ids"),
        (r#"{"do_sample": true, "temperature": 0}"#, "temperature"),
        (r#"{"num_beams": "four"}"#, "num_beams"),
        (r#"{"do_sample": true, "top_p": 2}"#, "top_p"),
        (r#"{"repetition_penalty": 0}"#, "repetition_penalty"),
        (r#"{"do_sample": true, "min_p": 1.5}"#, "min_p"),
        (r#"{"do_sample": true, "top_p": 0}"#, "top_p"),
    ] {
        std::fs::write(dir.join("generation_config.json"), json).unwrap();
        let msg = GenerationConfig::read(&dir).unwrap_err().to_string();
        assert!(
            msg.contains(field) && msg.contains("generation_config.json"),
            "{json}: {msg}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn beams_with_sampling_are_refused() {
    let model = models::load(&fixtures().join("models/llama_gqa"))
        .unwrap()
        .model;
    let prompt = TokenBatch::single(vec![5, 6, 7]).unwrap();
    let mut opts = GenerateOptions::new(
        4,
        Sampling::Sample {
            temperature: 1.0,
            top_k: None,
            top_p: None,
            min_p: None,
            seed: 0,
        },
        vec![2],
    );
    opts.search.num_beams = 3;
    let msg = generate_causal(&model, &prompt, &opts)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("num_beams"), "{msg}");
}

#[test]
fn a_prompt_too_long_for_memory_is_refused_before_its_prefill() {
    let model = models::load(&fixtures().join("models/llama_gqa"))
        .unwrap()
        .model;
    let request = Request {
        max_new_tokens: Some(1),
        ..Default::default()
    };
    // only the prompt's length is needed to size it: nothing of it is made
    let err = request
        .plan(&model, GenerationConfig::default(), 1 << 40)
        .unwrap_err();
    assert!(matches!(err, qkv::Error::Memory { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("the prefill of a prompt of 1099511627776 tokens (give a shorter prompt)"),
        "{err}"
    );
}
