//! `qkv attention` end to end on the tiny fixtures: the JSON's weights equal
//! transformers' `output_attentions=True` for every family (encoder, decoder-only with
//! GQA and ALiBi, encoder-decoders with cross-attention), text is labelled through the
//! folder's tokenizer, the greedy target of an encoder-decoder is `qkv generate`'s,
//! each output format is written, and bad input fails with one clear line and no file.

mod common;

use std::path::{Path, PathBuf};

use common::{fixture, fixtures, qkv, scratch, stderr};
use qkv::io::TensorFile;
use serde_json::Value;

fn ids_arg(ids: &[i64]) -> String {
    ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
}

/// Row 0 of a `[B, T]` ids tensor of the fixture's reference file (all real tokens).
fn first_row(reference: &TensorFile, name: &str) -> Vec<i64> {
    let (shape, ids) = reference.ints(name).unwrap();
    ids[..shape[1]].to_vec()
}

fn run_json(args: &[&str], json: &Path) -> Value {
    let mut all = args.to_vec();
    all.extend(["--json", json.to_str().unwrap()]);
    let out = qkv(&all);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap()
}

/// The document's `kind` layers equal `{prefix}.{l}` of the reference, row 0.
fn check_kind(name: &str, doc: &Value, kind: &str, reference: &TensorFile, prefix: &str) {
    let layers: Vec<&Value> = doc["layers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["kind"] == kind)
        .collect();
    assert_eq!(layers.len(), 2, "{name} {kind}");
    for (l, m) in layers.iter().enumerate() {
        assert_eq!(m["layer"], l);
        let want = reference.tensor(&format!("{prefix}.{l}")).unwrap();
        let (h, t, s) = (want.shape()[1], want.shape()[2], want.shape()[3]);
        let heads = m["weights"].as_array().unwrap();
        assert_eq!(heads.len(), h, "{name} {kind} {l}");
        for (head, rows) in heads.iter().enumerate() {
            let rows = rows.as_array().unwrap();
            assert_eq!(rows.len(), t);
            for (i, row) in rows.iter().enumerate() {
                let row = row.as_array().unwrap();
                assert_eq!(row.len(), s);
                for (j, w) in row.iter().enumerate() {
                    let want = want.data()[((head * t) + i) * s + j];
                    let got = w.as_f64().unwrap() as f32;
                    assert!(
                        (got - want).abs() <= 1e-5,
                        "{name} {kind} layer {l} head {head} [{i}, {j}]: {got} vs {want}"
                    );
                }
            }
        }
    }
}

#[test]
fn weights_equal_transformers_for_every_family() {
    let dir = scratch("attention-families");
    for (name, prefix) in [
        ("bert", "attentions"),
        ("gpt2", "attentions"),
        ("llama_gqa", "attentions"),
        ("mistral", "attentions"),
        ("bloom", "attentions"),
    ] {
        let model = fixture(name);
        let reference = TensorFile::open(model.join("reference.safetensors")).unwrap();
        let ids = ids_arg(&first_row(&reference, "input_ids"));
        let mut args = vec![
            "attention",
            "--model",
            model.to_str().unwrap(),
            "--input-ids",
            &ids,
        ];
        // BERT's fixture gives its first row two segments
        let types = match name {
            "bert" => ids_arg(&first_row(&reference, "token_type_ids")),
            _ => String::new(),
        };
        if name == "bert" {
            args.extend(["--token-type-ids", &types]);
        }
        let doc = run_json(&args, &dir.join(format!("{name}.json")));
        let kind = if name == "bert" { "encoder" } else { "decoder" };
        check_kind(name, &doc, kind, &reference, prefix);
        assert!(doc.get("target_tokens").is_none());
        assert_eq!(
            doc["tokens"][0],
            format!("#{}", first_row(&reference, "input_ids")[0])
        );
    }
    for name in ["t5", "marian"] {
        let model = fixture(name);
        let reference = TensorFile::open(model.join("reference.safetensors")).unwrap();
        let ids = ids_arg(&first_row(&reference, "input_ids"));
        let target = ids_arg(&first_row(&reference, "decoder_input_ids"));
        let args = [
            "attention",
            "--model",
            model.to_str().unwrap(),
            "--input-ids",
            &ids,
            "--target-ids",
            &target,
        ];
        let doc = run_json(&args, &dir.join(format!("{name}.json")));
        check_kind(name, &doc, "encoder", &reference, "encoder_attentions");
        check_kind(name, &doc, "decoder", &reference, "decoder_attentions");
        check_kind(name, &doc, "cross", &reference, "cross_attentions");
        let cross = doc["layers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["kind"] == "cross")
            .unwrap();
        assert_eq!(
            (cross["queries"].as_str(), cross["keys"].as_str()),
            (Some("target_tokens"), Some("tokens"))
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The tiny BERT with a 99-entry WordPiece tokenizer (tools/fixtures/gen_tokenizers.py),
/// so that it takes text.
fn bert_with_tokenizer(dir: &Path) -> PathBuf {
    let model = dir.join("bert");
    std::fs::create_dir_all(&model).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(fixture("bert").join(f), model.join(f)).unwrap();
    }
    std::fs::copy(
        fixtures().join("tokenizers/wordpiece/tokenizer.json"),
        model.join("tokenizer.json"),
    )
    .unwrap();
    model
}

#[test]
fn text_is_labelled_and_every_format_is_written() {
    let dir = scratch("attention-formats");
    let model = bert_with_tokenizer(&dir);
    let m = model.to_str().unwrap();
    let text = "the animal was too tired 猫坐在垫子上";
    let html = dir.join("map.html");
    let doc = run_json(
        &[
            "attention",
            "--model",
            m,
            "--text",
            text,
            "--out",
            html.to_str().unwrap(),
        ],
        &dir.join("map.json"),
    );
    let tokens: Vec<&str> = doc["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(tokens[..3], ["[CLS]", "the", "animal"]);
    assert_eq!(
        tokens[tokens.len() - 7..],
        ["猫", "坐", "在", "垫", "子", "上", "[SEP]"]
    );
    assert_eq!(doc["token_details"][0]["special"], true);
    assert_eq!(doc["token_details"][1]["special"], false);
    // every row of every head sums to 1
    for m in doc["layers"].as_array().unwrap() {
        for head in m["weights"].as_array().unwrap() {
            for row in head.as_array().unwrap() {
                let sum: f64 = row
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|w| w.as_f64().unwrap())
                    .sum();
                assert!((sum - 1.0).abs() < 1e-5, "{sum}");
            }
        }
    }
    // the viewer embeds the same document and fetches nothing
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains(r#"<script type="application/json" id="qkv-data">"#));
    assert!(page.contains("垫"));
    // the page shows the text it was given, and says how to give grad a target
    assert!(page.contains(&format!("\"text\":\"{text}\"")));
    assert!(page.contains("give --compare TEXT"));
    // (the one address is the SVG namespace, a name that is never fetched)
    let page = page.replace("\"http://www.w3.org/2000/svg\"", "");
    for remote in [
        "http:", "https:", "src=", "href=", "<link", "url(", "@import",
    ] {
        assert!(!page.contains(remote), "the viewer references {remote}");
    }
    let svg = dir.join("map.svg");
    let out = qkv(&[
        "attention",
        "--model",
        m,
        "--text",
        text,
        "--layer",
        "0",
        "--head",
        "mean",
        "--out",
        svg.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    // without --progress, one line: where the output went
    assert_eq!(
        stderr(&out),
        format!("qkv attention: wrote {}\n", svg.display())
    );
    let svg_text = std::fs::read_to_string(&svg).unwrap();
    assert!(svg_text.starts_with("<svg") && svg_text.contains("layer 0, mean of heads"));
    assert!(svg_text.contains("垫") && svg_text.contains("animal"));
    let png = dir.join("map.png");
    let out = qkv(&[
        "attention",
        "--model",
        m,
        "--text",
        text,
        "--head",
        "2",
        "--hide-special",
        "--progress",
        "--out",
        png.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    // one line per step, as big checkpoints print by themselves
    let steps: Vec<String> = stderr(&out).lines().map(String::from).collect();
    assert_eq!(steps.len(), 4, "{steps:?}");
    assert!(
        steps[0].starts_with("qkv attention: loading ") && steps[3].contains("wrote "),
        "{steps:?}"
    );
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(bytes[..8], *b"\x89PNG\r\n\x1a\n");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_encoder_decoder_without_target_attends_over_its_greedy_output() {
    let dir = scratch("attention-greedy");
    let model = fixture("t5");
    let m = model.to_str().unwrap();
    let reference = TensorFile::open(model.join("reference.safetensors")).unwrap();
    let ids = ids_arg(&first_row(&reference, "input_ids"));
    let out = qkv(&[
        "generate",
        "--model",
        m,
        "--input-ids",
        &ids,
        "--max-new-tokens",
        "5",
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let generated: Vec<i64> = serde_json::from_slice(&out.stdout).unwrap();
    let doc = run_json(
        &[
            "attention",
            "--model",
            m,
            "--input-ids",
            &ids,
            "--max-new-tokens",
            "5",
            "--kind",
            "cross",
            "--layer",
            "1",
        ],
        &dir.join("t5.json"),
    );
    let target: Vec<i64> = doc["target_token_details"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_i64().unwrap())
        .collect();
    // the decoder's start token, then what generate made
    assert_eq!(target[0], 0);
    assert_eq!(target[1..], generated[..]);
    let layers = doc["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 1);
    assert_eq!(
        (layers[0]["kind"].as_str(), layers[0]["layer"].as_u64()),
        (Some("cross"), Some(1))
    );
    let rows = layers[0]["weights"][0].as_array().unwrap();
    assert_eq!(rows.len(), target.len());
    assert_eq!(rows[0].as_array().unwrap().len(), 9);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An output that is a device is written through: `--json /dev/stdout` prints the JSON,
/// and nothing is created beside the model or the device.
#[test]
fn json_to_a_device_is_written_through() {
    let dir = scratch("attention-device");
    let model = bert_with_tokenizer(&dir);
    let out = qkv(&[
        "attention",
        "--model",
        model.to_str().unwrap(),
        "--text",
        "the animal",
        "--json",
        "/dev/stdout",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["tokens"][1], "the");
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["bert"], "nothing written beside the model");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_input_fails_with_one_clear_line_and_no_file() {
    let dir = scratch("attention-errors");
    let model = bert_with_tokenizer(&dir);
    let m = model.to_str().unwrap();
    let out_html = dir.join("out.html");
    let o = out_html.to_str().unwrap();
    let long = "word ".repeat(80);
    let missing = dir.join("no/such/folder/out.html");
    let pdf = dir.join("out.pdf");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["--text", "hi", "--layer", "2", "--out", o],
            "--layer 2 is out of range: the encoder self-attention has 2 layers",
        ),
        (
            vec!["--text", "hi", "--head", "4", "--out", o],
            "--head 4 is out of range",
        ),
        (
            vec!["--text", "hi", "--head", "first", "--out", o],
            "neither a head number nor `mean`",
        ),
        (
            vec!["--text", "hi", "--out", pdf.to_str().unwrap()],
            "unknown extension `pdf`",
        ),
        (
            vec!["--text", "hi", "--out", missing.to_str().unwrap()],
            "does not exist",
        ),
        (
            vec!["--text", &long, "--out", o],
            "this model takes at most 64",
        ),
        (
            vec!["--text", "hi", "--target", "x", "--out", o],
            "--target and --target-ids are for encoder-decoders",
        ),
        (
            vec!["--text", "hi", "--kind", "cross", "--out", o],
            "has no cross-attention",
        ),
        (
            vec!["--input-ids", "5,99", "--out", o],
            "token id 99 is outside the vocabulary of 99",
        ),
        (
            vec!["--input-ids", "5,6", "--token-type-ids", "0", "--out", o],
            "--token-type-ids has 1 ids for 2 input tokens",
        ),
        (vec!["--text", "hi"], "--out"),
    ];
    for (args, expected) in cases {
        let mut all = vec!["attention", "--model", m];
        all.extend(&args);
        let out = qkv(&all);
        let err = stderr(&out);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(err.contains(expected), "{args:?}: {err}");
        assert!(err.lines().count() <= 6, "{args:?}: {err}");
        assert!(!out_html.exists(), "{args:?} left {o}");
    }
    // a folder without tokenizer.json takes ids, not text
    let out = qkv(&[
        "attention",
        "--model",
        fixture("gpt2").to_str().unwrap(),
        "--text",
        "hi",
        "--out",
        o,
    ]);
    assert!(stderr(&out).contains("--input-ids"), "{}", stderr(&out));
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n != "bert")
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `[T][S]` rows of a document's combined map.
fn rows(m: &Value) -> Vec<Vec<f32>> {
    m["weights"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            r.as_array()
                .unwrap()
                .iter()
                .map(|w| w.as_f64().unwrap() as f32)
                .collect()
        })
        .collect()
}

fn assert_all_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "{what}[{i}]: {got:?} vs {want:?}"
        );
    }
}

/// `--method rollout|flow|grad|ablation --json` on the tiny GPT-2 and Llama equal the
/// PyTorch references of `tools/fixtures/gen_attribution.py` (rollout, flow, Chefer et
/// al.'s relevance, and ablation for the most likely next token), in the issue's shapes:
/// one `[T][S]` per layer without heads, and `scores` `[S]` for ablation.
#[test]
fn methods_in_json_equal_the_references() {
    let dir = scratch("attention-methods");
    for name in ["gpt2", "llama_gqa"] {
        let reference =
            TensorFile::open(fixtures().join(format!("attribution/{name}.safetensors"))).unwrap();
        let (_, ids) = reference.ints("input_ids").unwrap();
        let ids = ids_arg(&ids);
        let model = fixture(name);
        let base = [
            "attention",
            "--model",
            model.to_str().unwrap(),
            "--input-ids",
            &ids,
        ];
        let json = dir.join(format!("{name}.json"));
        for method in ["rollout", "flow", "grad"] {
            let mut args = base.to_vec();
            args.extend(["--method", method]);
            let doc = run_json(&args, &json);
            assert_eq!(doc["method"], method);
            assert_eq!(doc["target"]["kind"], "next_token");
            let layers = doc["layers"].as_array().unwrap();
            assert_eq!(layers.len(), 2, "{name} {method}");
            for (l, m) in layers.iter().enumerate() {
                assert!(
                    m.get("heads").is_none(),
                    "{name} {method}: heads are combined"
                );
                let want = reference.tensor(&format!("{method}.{l}")).unwrap();
                let got: Vec<f32> = rows(m).concat();
                assert_all_close(&format!("{name} {method}.{l}"), &got, want.data(), 1e-4);
            }
        }
        let mut args = base.to_vec();
        args.extend(["--method", "ablation"]);
        let doc = run_json(&args, &json);
        assert!(doc.get("layers").is_none());
        let scores: Vec<f32> = doc["scores"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect();
        let want = reference.tensor("ablation").unwrap();
        assert_all_close(&format!("{name} ablation"), &scores, want.data(), 1e-3);
        let params: Value = serde_json::from_str(&reference.metadata().unwrap()["params"]).unwrap();
        let token = params["target_token"].as_u64().unwrap();
        assert_eq!(doc["target"]["token"], token);
        // another token is explained when named
        let other = (token + 1).to_string();
        args.extend(["--target-token", &other]);
        let doc = run_json(&args, &json);
        assert_eq!(doc["target"]["token"].as_u64(), Some(token + 1));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Methods and targets that cannot go together fail with one clear line and no file.
#[test]
fn methods_refuse_what_they_cannot_explain() {
    let dir = scratch("attention-method-errors");
    let out_svg = dir.join("out.svg");
    let o = out_svg.to_str().unwrap();
    let bert = fixture("bert");
    let gpt2 = fixture("gpt2");
    let t5 = fixture("t5");
    let cases: Vec<(&Path, Vec<&str>, &str)> = vec![
        (&gpt2, vec!["--method", "ablation", "--out", o], "not a map"),
        (
            &gpt2,
            vec!["--method", "rollout", "--head", "1", "--out", o],
            "combines the heads",
        ),
        (
            &gpt2,
            vec!["--method", "saliency", "--out", o],
            "none of weights",
        ),
        (
            &gpt2,
            vec!["--method", "grad", "--target-token", "100000", "--out", o],
            "outside the vocabulary",
        ),
        (
            &bert,
            vec!["--method", "grad", "--out", o],
            "cosine with --compare",
        ),
        (&gpt2, vec!["--compare", "x", "--out", o], "need an encoder"),
        (
            &t5,
            vec![
                "--method",
                "flow",
                "--kind",
                "cross",
                "--target-ids",
                "0,5",
                "--out",
                o,
            ],
            "flow runs over one stack's self-attention",
        ),
    ];
    for (model, args, expected) in cases {
        let mut all = vec![
            "attention",
            "--model",
            model.to_str().unwrap(),
            "--input-ids",
            "5,6,7",
        ];
        all.extend(&args);
        let out = qkv(&all);
        let err = stderr(&out);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(err.contains(expected), "{args:?}: {err}");
        assert!(err.lines().count() <= 6, "{args:?}: {err}");
        assert!(!out_svg.exists(), "{args:?} left {o}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
