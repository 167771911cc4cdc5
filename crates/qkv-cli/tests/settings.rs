//! Settings from files are checked as strictly as the flags that set the same thing,
//! and an error names the setting the user wrote (the file and field, or the flag), not
//! a quantity derived from it (the second hardening round).

mod common;

use std::path::{Path, PathBuf};

use common::{fails, fixture, fixtures, patched, scratch, stderr, timed};

/// A copy of the model fixture `name` with `generation_config.json` set to `generation`.
fn with_generation_config(dir: &Path, name: &str, generation: &serde_json::Value) -> PathBuf {
    let model = patched(dir, name, serde_json::json!({}));
    std::fs::write(model.join("generation_config.json"), generation.to_string()).unwrap();
    model
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[test]
fn generation_settings_from_the_folder_are_named_with_their_file() {
    use serde_json::json;
    let dir = scratch("settings-generation");
    let file = "generation_config.json";
    // (the folder's settings, extra flags, what the one error line holds)
    let cases: Vec<(serde_json::Value, Vec<&str>, Vec<&str>)> = vec![
        (
            json!({"num_beams": 1_000_000_000u64}),
            vec!["--max-new-tokens", "3"],
            vec!["num_beams 1000000000 in", file, "ask for fewer --num-beams"],
        ),
        (
            json!({}),
            vec!["--max-new-tokens", "3", "--num-beams", "1000000000"],
            vec!["--num-beams 1000000000;", "ask for fewer --num-beams"],
        ),
        (
            json!({"max_length": 1_000_000_000_000u64}),
            vec![],
            vec![
                "max_length 1000000000000 in",
                file,
                "ask for fewer --max-new-tokens",
            ],
        ),
        (
            json!({"bad_words_ids": [[500]]}),
            vec![],
            vec![
                file,
                "field `bad_words_ids`",
                "token id 500 is outside the vocabulary of 99",
            ],
        ),
        (
            json!({"forced_eos_token_id": 5000}),
            vec![],
            vec![file, "field `forced_eos_token_id`", "token id 5000"],
        ),
        (
            json!({"do_sample": true, "top_p": 2}),
            vec![],
            vec![file, "field `top_p`", "must be in (0, 1], got 2"],
        ),
    ];
    for (i, (generation, extra, expected)) in cases.into_iter().enumerate() {
        let model = with_generation_config(&dir.join(i.to_string()), "llama_gqa", &generation);
        let mut args = vec![
            "generate",
            "--model",
            model.to_str().unwrap(),
            "--input-ids",
            "1,2,3",
        ];
        args.extend(extra);
        let (out, peak) = common::qkv_peak(&args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{generation}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{generation}: {err}");
        for e in expected {
            assert!(err.contains(e), "{generation}: {e:?} not in {err}");
        }
        assert!(peak < 200 << 20, "{generation}: peak {peak} bytes");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A special id outside the vocabulary (a probe model's 50256, say) is what transformers
/// runs with: a warning naming the file and field, and generation goes on.
#[test]
fn special_ids_outside_the_vocabulary_are_named_in_a_warning_and_generation_runs() {
    let dir = scratch("settings-special");
    let generation = serde_json::json!({"eos_token_id": 5000, "decoder_start_token_id": 99});
    let model = with_generation_config(&dir, "llama_gqa", &generation);
    let out = timed(&[
        "generate",
        "--model",
        model.to_str().unwrap(),
        "--input-ids",
        "3,4,5",
        "--max-new-tokens",
        "2",
        "--json",
    ]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    let file = model.join("generation_config.json").display().to_string();
    for (field, id, effect) in [
        ("eos_token_id", 5000, "never stops at it"),
        ("decoder_start_token_id", 99, "left unset"),
    ] {
        assert!(
            err.lines().any(|l| l.starts_with("warning: ")
                && l.contains(&file)
                && l.contains(&format!("field `{field}`"))
                && l.contains(&format!("token id {id} is outside the vocabulary of 99"))
                && l.contains(effect)),
            "{field}: {err}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_length_cut_to_the_positions_is_blamed_on_the_field_that_asked() {
    let dir = scratch("settings-clamp");
    let model = with_generation_config(&dir, "gpt2", &serde_json::json!({"max_length": 1000}));
    let out = timed(&[
        "generate",
        "--model",
        model.to_str().unwrap(),
        "--input-ids",
        "1,2,3",
        "--json",
    ]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    let file = model.join("generation_config.json");
    assert!(
        err.contains(&format!(
            "warning: max_length 1000 in {} goes past the model's positions; generating at most 61",
            file.display()
        )),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_backwards_yarn_ramp_is_refused_naming_both_ends() {
    let dir = scratch("settings-yarn");
    let config = fixture("llama_yarn").join("config.json");
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(config).unwrap()).unwrap();
    let mut scaling = config["rope_scaling"].clone();
    scaling["beta_fast"] = 1.0.into();
    scaling["beta_slow"] = 32.0.into();
    let model = patched(
        &dir,
        "llama_yarn",
        serde_json::json!({ "rope_scaling": scaling }),
    );
    fails(
        &["inspect", "--model", model.to_str().unwrap()],
        "rope_scaling.beta_fast`: must be at least beta_slow = 32, got 1",
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_tokenizer_with_ids_past_the_model_is_refused_at_load_naming_its_file() {
    let dir = scratch("settings-tokenizer");
    // Marian: vocab.json numbers the pieces
    let marian = patched(&dir, "marian", serde_json::json!({}));
    for f in [
        "source.spm",
        "target.spm",
        "vocab.json",
        "tokenizer_config.json",
    ] {
        std::fs::copy(fixtures().join("tokenizers/marian").join(f), marian.join(f)).unwrap();
    }
    let m = marian.to_str().unwrap();
    let prompt = [
        "generate",
        "--model",
        m,
        "--prompt",
        "a b",
        "--max-new-tokens",
        "2",
    ];
    let out = timed(&prompt);
    assert!(
        out.status.success(),
        "the folder as it is works: {}",
        stderr(&out)
    );
    let vocab_path = marian.join("vocab.json");
    let mut vocab: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&vocab_path).unwrap()).unwrap();
    vocab["▁far"] = 5002.into();
    std::fs::write(&vocab_path, vocab.to_string()).unwrap();
    let expected = format!(
        "{}: token \"▁far\" has id 5002, outside the model's vocabulary of 99",
        vocab_path.display()
    );
    fails(&prompt, &expected);
    // refused even when ids are given: the folder's files do not belong together
    fails(&["generate", "--model", m, "--input-ids", "3,4"], &expected);

    // tokenizer.json: a 300-token byte-level BPE beside GPT-2's 99 rows
    let gpt2 = patched(&dir, "gpt2", serde_json::json!({}));
    std::fs::copy(
        fixtures().join("tokenizers/bytelevel/tokenizer.json"),
        gpt2.join("tokenizer.json"),
    )
    .unwrap();
    fails(
        &[
            "attention",
            "--model",
            gpt2.to_str().unwrap(),
            "--text",
            "hi",
            "--out",
            "x.svg",
        ],
        "tokenizer.json: token",
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
