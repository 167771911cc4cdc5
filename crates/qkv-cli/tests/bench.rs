//! `qkv bench` runs every workload end to end on tiny sizes and prints the fields
//! `bench/compare_torch.py` reads. No timing is asserted beyond being positive: a
//! benchmark is never a timed test.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn qkv(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_qkv"))
        .args(args)
        .output()
        .expect("the qkv binary runs")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `qkv bench ARGS EXTRA… --json --rounds 1 --warmup 0 --threads 1` (ARGS split at
/// spaces, EXTRA taken whole): one JSON object per line.
fn bench(args: &str, extra: &[&str]) -> Vec<Value> {
    let mut all = vec!["bench"];
    all.extend(args.split_whitespace());
    all.extend_from_slice(extra);
    all.extend("--json --rounds 1 --warmup 0 --threads 1".split_whitespace());
    let out = qkv(&all);
    assert!(out.status.success(), "qkv {all:?}: {}", stderr(&out));
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

fn positive(row: &Value, keys: &[&str]) {
    for key in keys {
        let x = row[key]
            .as_f64()
            .unwrap_or_else(|| panic!("no number `{key}` in {row}"));
        assert!(x > 0.0 && x.is_finite(), "`{key}` = {x} in {row}");
    }
}

const TIMING: &[&str] = &["best_s", "median_s", "iters", "rounds", "threads"];

#[test]
fn attention_rows_per_length_with_flops() {
    let rows = bench("attention --n 16,24 --heads 4 --kv-heads 2 --dim 8", &[]);
    assert_eq!(rows.len(), 2);
    for (row, n) in rows.iter().zip([16, 24]) {
        assert_eq!(row["bench"], "attention");
        assert_eq!(row["n"], n);
        assert_eq!(row["causal"], false);
        assert_eq!(row["kernel"], "tiled");
        assert!(row["flop_convention"].is_string());
        positive(row, TIMING);
        positive(row, &["gflop", "gflops_best", "gflops_median"]);
        // 4·B·H·N²·D
        let want = 4.0 * 4.0 * (n * n) as f64 * 8.0 / 1e9;
        assert!((row["gflop"].as_f64().unwrap() - want).abs() < 1e-12 * want.max(1.0));
    }
}

#[test]
fn attention_backward_causal_counts_two_and_a_half_halves() {
    for kernel in ["tiled", "reference"] {
        let rows = bench(
            "attention --n 16 --heads 2 --kv-heads 2 --dim 8 --causal --backward --kernel",
            &[kernel],
        );
        assert_eq!(rows.len(), 1);
        let row = &rows[0];
        assert_eq!(row["backward"], true);
        assert_eq!(row["kernel"], kernel);
        positive(row, TIMING);
        positive(row, &["gflops_best", "gflops_median"]);
        let want = 4.0 * 2.0 * 256.0 * 8.0 / 2.0 * 2.5 / 1e9;
        assert!((row["gflop"].as_f64().unwrap() - want).abs() < 1e-15);
    }
}

#[test]
fn decode_reports_bandwidth_of_the_cache() {
    let rows = bench("decode --cache 32,64 --heads 4 --kv-heads 2 --dim 8", &[]);
    assert_eq!(rows.len(), 2);
    for (row, s) in rows.iter().zip([32, 64]) {
        assert_eq!(row["bench"], "decode");
        assert_eq!(row["cache"], s);
        assert_eq!(
            row["kv_bytes"].as_f64().unwrap(),
            (2 * s * 2 * 8 * 4) as f64
        );
        positive(row, TIMING);
        positive(row, &["gbs_best", "gbs_median"]);
    }
}

#[test]
fn machine_rows_give_the_fma_peak_the_memory_bandwidth_and_the_hand_offs() {
    let rows = bench("machine --bytes 4096", &[]);
    assert_eq!(rows.len(), 5);
    assert_eq!(
        (&rows[0]["bench"], &rows[0]["probe"]),
        (&"machine".into(), &"fma".into())
    );
    positive(&rows[0], TIMING);
    positive(&rows[0], &["gflop", "gflops_best", "gflops_median"]);
    assert_eq!(rows[1]["probe"], "memory");
    assert_eq!(rows[1]["bytes"], 4096);
    positive(&rows[1], TIMING);
    positive(&rows[1], &["gbs_best", "gbs_median"]);
    for (row, via) in rows[2..].iter().zip(["team", "rayon", "one thread"]) {
        assert_eq!(
            (&row["probe"], &row["via"]),
            (&"handoff".into(), &via.into())
        );
        assert_eq!(row["jobs"], 1000);
        positive(row, TIMING);
        positive(row, &["kjobs_best", "kjobs_median"]);
    }
    let out = qkv(&["bench", "machine", "--bytes", "4"]);
    assert!(!out.status.success() && stderr(&out).contains("--bytes"));
}

#[test]
fn matmul_rows_per_shape_and_bad_shapes_named() {
    let rows = bench("matmul --shapes 5x7x3,1x16x40", &[]);
    assert_eq!(rows.len(), 2);
    for (row, (m, k, n)) in rows.iter().zip([(5, 7, 3), (1, 16, 40)]) {
        assert_eq!(row["bench"], "matmul");
        assert_eq!(
            (row["m"].as_u64(), row["k"].as_u64(), row["n"].as_u64()),
            (Some(m), Some(k), Some(n))
        );
        assert_eq!(
            row["gflop"].as_f64().unwrap(),
            2.0 * (m * k * n) as f64 / 1e9
        );
        positive(row, TIMING);
        positive(row, &["gflops_best", "gflops_median"]);
    }
    for bad in ["4x0x3", "4x3", "axbxc"] {
        let out = qkv(&["bench", "matmul", "--shapes", bad]);
        assert!(!out.status.success(), "--shapes {bad} accepted");
        assert!(
            stderr(&out).contains(&format!("--shapes: `{bad}`")),
            "{}",
            stderr(&out)
        );
    }
}

#[test]
fn llama_prefill_and_decode_and_the_saved_folder_loads() {
    let dir = std::env::temp_dir().join(format!("qkv-cli-bench-{}-llama", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let rows = bench(
        "llama --d-model 32 --layers 2 --heads 4 --kv-heads 2 --vocab 64 --max-len 64 \
         --prefill 8 --decode 4 --decode-prompt 2 --save",
        &[dir.to_str().unwrap()],
    );
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["mode"], "prefill");
    assert_eq!(rows[0]["tokens"], 8);
    assert_eq!(rows[1]["mode"], "decode");
    assert_eq!(rows[1]["new_tokens"], 4);
    for row in &rows {
        positive(row, TIMING);
        positive(row, &["tokens_per_s_best", "tokens_per_s_median", "params"]);
    }
    positive(&rows[1], &["weight_bytes_per_token", "weight_gbs_best"]);

    assert_eq!(rows[0]["last_logits"], false);

    let out = qkv(&["inspect", "--model", dir.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("LlamaForCausalLM"));
    std::fs::remove_dir_all(&dir).unwrap();

    // generation's prefill: the last position's logits only; and sequences decoded
    // side by side, as the server batches them
    let rows = bench(
        "llama --d-model 32 --layers 2 --heads 4 --kv-heads 2 --vocab 64 --max-len 64 \
         --prefill 8 --decode 3 --decode-prompt 1 --last-logits --rows 1,5",
        &[],
    );
    assert_eq!(
        (&rows[0]["mode"], &rows[0]["last_logits"]),
        (&"prefill".into(), &true.into())
    );
    positive(&rows[0], TIMING);
    assert_eq!(rows.len(), 4);
    for (row, n) in rows[2..].iter().zip([1, 5]) {
        assert_eq!(
            (&row["mode"], &row["rows"]),
            (&"decode_rows".into(), &n.into())
        );
        positive(row, TIMING);
        positive(row, &["step_s_median", "tokens_per_s_median"]);
    }

    // a given model: a GGUF file's Q8_0 blocks, checked against its weights in f32
    let q8 = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../qkv/tests/fixtures/gguf/models/llama_gqa_q8_0.gguf");
    let rows = bench(
        "llama --prefill 8 --decode 3 --decode-prompt 2 --model",
        &[q8.to_str().unwrap()],
    );
    assert_eq!(rows.len(), 2);
    for row in &rows {
        assert_eq!((&row["dtype"], &row["vocab"]), (&"int8".into(), &99.into()));
        assert!(row["model"]
            .as_str()
            .unwrap()
            .ends_with("llama_gqa_q8_0.gguf"));
        positive(row, TIMING);
        assert!(row["logits_max_abs"].as_f64().unwrap() < 0.1, "{row}");
    }
}

#[test]
fn minilm_sentences_are_fixed_mixed_and_of_the_asked_number() {
    let print = |seed: u64| {
        let args = format!("bench minilm --print-sentences --sentences 12 --seed {seed}");
        let out = qkv(&args.split_whitespace().collect::<Vec<_>>());
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_slice::<Vec<String>>(&out.stdout).unwrap()
    };
    let sentences = print(0);
    assert_eq!(sentences.len(), 12);
    assert_eq!(sentences, print(0));
    assert_ne!(sentences, print(1));
    let chinese = |s: &String| s.chars().any(|c| ('\u{4e00}'..='\u{9fff}').contains(&c));
    assert_eq!(sentences.iter().filter(|s| chinese(s)).count(), 3);
    for s in sentences.iter().filter(|s| !chinese(s)) {
        let words = s.split_whitespace().count();
        assert!((5..=30).contains(&words), "{words} words: {s}");
    }
}

#[test]
#[ignore = "needs all-MiniLM-L6-v2: set QKV_MINILM_DIR (tools/fetch_minilm.sh DIR), as .ci/run does"]
fn minilm_batch_and_single_sentence() {
    let dir = std::env::var_os("QKV_MINILM_DIR")
        .expect("QKV_MINILM_DIR is not set (.ci/run fetches all-MiniLM-L6-v2 and sets it)");
    let dir = PathBuf::from(dir);
    let rows = bench(
        "minilm --sentences 6 --batch 4 --model",
        &[dir.to_str().unwrap()],
    );
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["mode"], "batch");
    assert_eq!(rows[0]["sentences"], 6);
    positive(
        &rows[0],
        &["sentences_per_s_best", "sentences_per_s_median"],
    );
    assert_eq!(rows[1]["mode"], "single");
    positive(&rows[1], &["tokens"]);
    for row in &rows {
        positive(row, TIMING);
    }
}

/// Issue 26's accuracy contract on the benchmark's 256 sentences: each reduced type's
/// embeddings point where f32's do, cosine at least 0.999 for bf16 and 0.99 for int8
/// (sentence-transformers' own int8 guidance accepts a loss of about 0.4%).
#[test]
#[ignore = "needs all-MiniLM-L6-v2: set QKV_MINILM_DIR (tools/fetch_minilm.sh DIR), as .ci/run does"]
fn minilm_reduced_types_keep_the_embeddings() {
    let dir = std::env::var_os("QKV_MINILM_DIR")
        .expect("QKV_MINILM_DIR is not set (.ci/run fetches all-MiniLM-L6-v2 and sets it)");
    let dir = PathBuf::from(dir);
    for (dtype, least) in [("bf16", 0.999), ("int8", 0.99), ("int8-row", 0.99)] {
        let args = format!("minilm --sentences 256 --batch 32 --dtype {dtype} --model");
        let rows = bench(&args, &[dir.to_str().unwrap()]);
        assert_eq!(rows[0]["dtype"], dtype);
        let cosine = rows[0]["min_cosine_to_f32"].as_f64().expect("a cosine");
        assert!(cosine >= least, "{dtype}: least cosine {cosine} < {least}");
        println!("{dtype}: least cosine to f32 over 256 sentences {cosine:.6}");
    }
}

#[test]
fn bad_options_fail_with_one_clear_line() {
    for (args, needle) in [
        ("bench attention --rounds 0", "--rounds"),
        ("bench decode --threads 0", "--threads"),
        ("bench llama --prefill 100 --max-len 64", "--max-len"),
        ("bench llama --prefill 4 --decode 2 --rows 0", "--rows"),
        ("bench minilm", "--model"),
    ] {
        let out = qkv(&args.split_whitespace().collect::<Vec<_>>());
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(stderr(&out).contains(needle), "{args:?}: {}", stderr(&out));
    }
}

/// The grammar workload: the vocabulary, the schema's compile, the mask walk over a
/// document valid under the schema, a decoding step, and the mask's share of the step; a
/// document outside the schema is refused before anything is timed.
#[test]
fn grammar_rows_give_the_mask_share_of_a_decoding_step() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let tok = root.join("examples/tiny-chat");
    let tok = tok.to_str().unwrap();
    let small = "--d-model 32 --layers 1 --heads 2 --kv-heads 1";
    let rows = bench(&format!("grammar {small}"), &["--tokenizer", tok]);
    let modes: Vec<&str> = rows.iter().map(|r| r["mode"].as_str().unwrap()).collect();
    assert_eq!(modes, ["vocabulary", "compile", "mask", "decode", "share"]);
    assert_eq!(rows[2]["vocab"], 256);
    positive(&rows[2], &["tokens_per_s_best", "median_s"]);
    positive(
        &rows[4],
        &["mask_per_token_s", "decode_step_s", "mask_share_of_step"],
    );
    let dir = std::env::temp_dir().join(format!("qkv-bench-grammar-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("s.json"), r#"{"type": "integer"}"#).unwrap();
    std::fs::write(dir.join("d.json"), r#""not a number""#).unwrap();
    let out = qkv(&[
        "bench",
        "grammar",
        "--tokenizer",
        tok,
        "--schema",
        dir.join("s.json").to_str().unwrap(),
        "--document",
        dir.join("d.json").to_str().unwrap(),
        "--rounds",
        "1",
        "--warmup",
        "0",
    ]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("not allowed by the schema"),
        "{}",
        stderr(&out)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
