//! The checkpoint commands end to end, on the tiny Hugging Face fixtures of the library:
//! `forward` output equals the reference logits, `generate --json` equals HF's greedy
//! tokens, `inspect` describes the model, and bad input fails with one clear line and
//! leaves no output file behind.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use qkv::io::TensorFile;

fn qkv(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_qkv"))
        .args(args)
        .output()
        .expect("the qkv binary runs")
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../qkv/tests/fixtures/models")
        .join(name)
}

/// The sentence-transformers fixture the `embed` tests run.
fn sentence_fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../qkv/tests/fixtures/sentence/xlm_roberta_mean")
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("qkv-cli-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `qkv forward` with the fixture's own reference file as input (it holds `input_ids`,
/// `attention_mask` and, for encoder-decoders, `decoder_input_ids`); the output must
/// equal the reference at real positions.
fn forward_matches(name: &str, output_name: &str, mask_name: &str) {
    let dir = fixture(name);
    let reference = dir.join("reference.safetensors");
    let out_path = scratch(name).join("out.safetensors");
    let out = qkv(&[
        "forward",
        "--model",
        dir.to_str().unwrap(),
        "--input",
        reference.to_str().unwrap(),
        "--output",
        out_path.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{name}: {}", stderr(&out));
    let got = TensorFile::open(&out_path)
        .unwrap()
        .tensor(output_name)
        .unwrap();
    let reference = TensorFile::open(&reference).unwrap();
    let want = reference.tensor(output_name).unwrap();
    assert_eq!(got.shape(), want.shape(), "{name}");
    let (_, mask) = reference.ints(mask_name).unwrap();
    let width = want.last_dim();
    for (pos, &real) in mask.iter().enumerate() {
        if real == 1 {
            for c in 0..width {
                let (g, w) = (got.data()[pos * width + c], want.data()[pos * width + c]);
                assert!(
                    (g - w).abs() <= 1e-4 + 1e-3 * w.abs(),
                    "{name} position {pos}: {g} vs {w}"
                );
            }
        }
    }
}

#[test]
fn forward_writes_reference_logits_for_each_kind_of_model() {
    forward_matches("gpt2", "logits", "attention_mask");
    forward_matches("llama_gqa", "logits", "attention_mask");
    forward_matches("bert", "last_hidden_state", "attention_mask");
    // a masked-LM folder writes its head's logits beside the hidden states
    forward_matches("roberta_mlm", "logits", "attention_mask");
    forward_matches("roberta_mlm", "last_hidden_state", "attention_mask");
    // Every decoder row of the encoder-decoder fixtures is real: the decoder ids act as
    // an all-ones mask of the right shape.
    forward_matches("t5", "logits", "decoder_input_ids");
}

#[test]
fn generate_json_prints_hf_greedy_tokens() {
    let dir = fixture("llama_gqa");
    let reference = TensorFile::open(dir.join("reference.safetensors")).unwrap();
    let (_, prompt) = reference.ints("gen_prompt").unwrap();
    let (shape, output) = reference.ints("gen_output").unwrap();
    let ids: Vec<String> = prompt.iter().map(|i| i.to_string()).collect();
    // the folder, and the GGUF file llama.cpp's converter makes of it
    let gguf = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../qkv/tests/fixtures/gguf/models/llama_gqa.gguf");
    for model in [&dir, &gguf] {
        let out = qkv(&[
            "generate",
            "--model",
            model.to_str().unwrap(),
            "--input-ids",
            &ids.join(","),
            "--max-new-tokens",
            "8",
            "--greedy",
            "--json",
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        let got: Vec<i64> = serde_json::from_slice(&out.stdout).expect("a JSON list of ids");
        assert_eq!(
            got,
            output[prompt.len()..shape[1]].to_vec(),
            "{}",
            model.display()
        );
    }
    // text goes through the vocabulary in the file's metadata (the fixture's placeholder
    // one, `▁t3` … `▁t98`, which spells no text: it prints those pieces)
    let out = qkv(&[
        "generate",
        "--model",
        gguf.to_str().unwrap(),
        "--prompt",
        "hi",
        "--max-new-tokens",
        "3",
        "--greedy",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains(" t"), "{text:?}");
}

/// `--dtype bf16` and `int8` generate what PyTorch with such linear layers generates
/// (tools/fixtures/gen_dtype.py); an unknown type is refused naming the flag.
#[test]
fn generate_dtype_prints_the_reduced_reference_tokens() {
    let dir = fixture("llama_gqa");
    let reference = TensorFile::open(dir.join("reference.safetensors")).unwrap();
    let (_, prompt) = reference.ints("gen_prompt").unwrap();
    let ids: Vec<String> = prompt.iter().map(|i| i.to_string()).collect();
    let joined = ids.join(",");
    let model = dir.to_str().unwrap();
    let args = |dtype: &'static str| {
        let mut a = vec!["generate", "--model", model, "--max-new-tokens", "8"];
        a.extend([
            "--greedy",
            "--json",
            "--dtype",
            dtype,
            "--input-ids",
            &joined,
        ]);
        a
    };
    for dtype in ["bf16", "int8"] {
        let path = dir.join(format!("../../dtype/{dtype}/llama_gqa.safetensors"));
        let (shape, output) = TensorFile::open(path).unwrap().ints("gen_output").unwrap();
        let out = qkv(&args(dtype));
        assert!(out.status.success(), "{}", stderr(&out));
        let got: Vec<i64> = serde_json::from_slice(&out.stdout).expect("a JSON list of ids");
        assert_eq!(got, output[prompt.len()..shape[1]].to_vec(), "{dtype}");
    }

    let out = qkv(&args("int4"));
    assert!(!out.status.success() && out.stdout.is_empty());
    let err = stderr(&out);
    assert!(
        err.contains("--dtype") && err.contains("`int4` is not one of f32, bf16, int8, int8-row"),
        "{err}"
    );
}

/// `--kv-dtype bf16` decodes through a bf16 cache (its accuracy is held in the library's
/// tests: `attention::cache`, `tests/dtype.rs`); a type the cache has not is refused
/// naming the flag.
#[test]
fn generate_kv_dtype_bf16_decodes_and_others_are_refused() {
    let dir = fixture("llama_gqa");
    let model = dir.to_str().unwrap();
    let run = |kv: &str| {
        qkv(&[
            "generate",
            "--model",
            model,
            "--max-new-tokens",
            "8",
            "--greedy",
            "--json",
            "--input-ids",
            "1,2,3,4",
            "--kv-dtype",
            kv,
        ])
    };
    let out = run("bf16");
    assert!(out.status.success(), "{}", stderr(&out));
    let got: Vec<i64> = serde_json::from_slice(&out.stdout).expect("a JSON list of ids");
    assert_eq!(got.len(), 8);
    let out = run("int8");
    let err = stderr(&out);
    assert!(!out.status.success() && out.stdout.is_empty());
    assert!(
        err.contains("--kv-dtype") && err.contains("f32 or bf16"),
        "{err}"
    );
}

#[test]
fn sampling_is_reproducible_for_a_seed() {
    let dir = fixture("gpt2");
    let run = |seed: &str| {
        let out = qkv(&[
            "generate",
            "--model",
            dir.to_str().unwrap(),
            "--input-ids",
            "5,6,7",
            "--max-new-tokens",
            "6",
            "--temperature",
            "0.8",
            "--top-k",
            "20",
            "--top-p",
            "0.9",
            "--seed",
            seed,
            "--json",
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        out.stdout
    };
    assert_eq!(run("3"), run("3"));
}

#[test]
fn inspect_describes_the_architecture() {
    let out = qkv(&["inspect", "--model", fixture("llama_gqa").to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "llama",
        "key/value heads",
        "RoPE",
        "RMSNorm",
        "parameters",
        "F32",
    ] {
        assert!(
            text.contains(needle),
            "inspect output lacks {needle}:\n{text}"
        );
    }
}

/// `inspect --dtype` adds the weights' memory in that type: llama_gqa's linear layers
/// are 2 × (q 32·32 + k, v 16·32 + o 32·32 + gate, up, down 64·32) + the head 99·32 =
/// 21600 weights, 86.4 kB in f32.
#[test]
fn inspect_dtype_prints_the_weights_memory() {
    let model = fixture("llama_gqa");
    let run = |dtype: &str| {
        let out = qkv(&[
            "inspect",
            "--model",
            model.to_str().unwrap(),
            "--dtype",
            dtype,
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let f32_text = run("f32");
    assert!(
        f32_text.contains("linear layers 86.4 kB in f32, 86.4 kB in f32"),
        "{f32_text}"
    );
    let int8 = run("int8");
    let line = int8
        .lines()
        .find(|l| l.starts_with("weights in int8"))
        .unwrap_or_else(|| panic!("{int8}"));
    assert!(line.contains("in int8, 86.4 kB in f32"), "{line}");
    let out = qkv(&[
        "inspect",
        "--model",
        model.to_str().unwrap(),
        "--dtype",
        "fp8",
    ]);
    assert!(
        !out.status.success() && stderr(&out).contains("--dtype"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn bad_input_fails_with_one_line_and_no_output_file() {
    let dir = scratch("bad");
    let out_path = dir.join("never.safetensors");
    let model = fixture("gpt2");
    // A corrupt input file.
    let corrupt = dir.join("corrupt.safetensors");
    std::fs::write(&corrupt, b"not a safetensors file").unwrap();
    // A folder whose config names an unknown architecture.
    let unknown = dir.join("unknown");
    std::fs::create_dir_all(&unknown).unwrap();
    std::fs::write(
        unknown.join("config.json"),
        r#"{"architectures": ["FooForBar"]}"#,
    )
    .unwrap();
    std::fs::copy(
        model.join("model.safetensors"),
        unknown.join("model.safetensors"),
    )
    .unwrap();
    // Invalid JSON.
    let broken = dir.join("broken");
    std::fs::create_dir_all(&broken).unwrap();
    std::fs::write(broken.join("config.json"), "{ not json").unwrap();
    let reference = model.join("reference.safetensors");

    let cases: [(Vec<&str>, &str); 4] = [
        (
            vec![
                "--model",
                model.to_str().unwrap(),
                "--input",
                corrupt.to_str().unwrap(),
            ],
            "corrupt.safetensors",
        ),
        (
            vec![
                "--model",
                unknown.to_str().unwrap(),
                "--input",
                reference.to_str().unwrap(),
            ],
            "GPT2LMHeadModel",
        ),
        (
            vec![
                "--model",
                broken.to_str().unwrap(),
                "--input",
                reference.to_str().unwrap(),
            ],
            "config.json",
        ),
        (
            vec![
                "--model",
                "/no/such/folder",
                "--input",
                reference.to_str().unwrap(),
            ],
            "/no/such/folder",
        ),
    ];
    for (args, needle) in cases {
        let mut full = vec!["forward"];
        full.extend(args);
        full.extend(["--output", out_path.to_str().unwrap()]);
        let out = qkv(&full);
        let err = stderr(&out);
        assert!(!out.status.success(), "{full:?} should fail");
        assert_eq!(err.trim().lines().count(), 1, "one line expected: {err}");
        assert!(err.contains(needle), "{err} should mention {needle}");
        assert!(!out_path.exists(), "a failed run left {out_path:?}");
    }
}

/// An OPUS-MT style folder: the tiny Marian's config and weights, the SentencePiece
/// tokenizer files and vocab.json (as MarianTokenizer reads them), and the
/// generation_config.json found in `generation`.
fn opus_folder(name: &str, generation: PathBuf) -> PathBuf {
    let dir = scratch(name);
    let tokenizer =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../qkv/tests/fixtures/tokenizers/marian");
    for (from, file) in [
        (fixture("marian"), "config.json"),
        (fixture("marian"), "model.safetensors"),
        (generation, "generation_config.json"),
        (tokenizer.clone(), "source.spm"),
        (tokenizer.clone(), "target.spm"),
        (tokenizer, "vocab.json"),
    ] {
        std::fs::copy(from.join(file), dir.join(file)).unwrap();
    }
    dir
}

/// An OPUS-MT style folder (the tiny Marian's weights with SentencePiece tokenizer files
/// and vocab.json, which MarianTokenizer reads): `--prompt` is the source text, and the
/// translation prints as text, the decoded `--json` ids of the same run.
#[test]
fn marian_folder_translates_text_to_text() {
    let dir = opus_folder("opus-tiny", fixture("marian"));
    let run = |json: bool| {
        let mut args = vec![
            "generate",
            "--model",
            dir.to_str().unwrap(),
            "--prompt",
            "The cat sat on the mat.",
            "--max-new-tokens",
            "6",
            "--greedy",
        ];
        if json {
            args.push("--json");
        }
        let out = qkv(&args);
        assert!(out.status.success(), "{}", stderr(&out));
        String::from_utf8(out.stdout).unwrap()
    };
    let ids: Vec<usize> = serde_json::from_str(&run(true)).expect("a JSON list of ids");
    assert_eq!(ids.len(), 6);
    let tok = qkv::text::Tokenizer::from_dir(&dir).unwrap();
    let text = tok.decode(&ids).unwrap();
    assert!(!text.is_empty(), "{ids:?} decode to nothing");
    assert_eq!(run(false).trim_end(), text);
    // the prompt went in as MarianTokenizer's ids (tests/tokenizer_spm.rs checks those)
    let source = tok.encode("The cat sat on the mat.", true).unwrap();
    let as_ids: Vec<String> = source.iter().map(|i| i.to_string()).collect();
    let out = qkv(&[
        "generate",
        "--model",
        dir.to_str().unwrap(),
        "--input-ids",
        &as_ids.join(","),
        "--max-new-tokens",
        "6",
        "--greedy",
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let again: Vec<usize> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(again, ids);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The folder's generation_config.json decides (4 beams, max_length 12, the pad id
/// banned, EOS forced), and flags override it; both equal transformers' generate().
#[test]
fn generate_follows_the_folder_generation_config_and_its_overrides() {
    let fixture_dir =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../qkv/tests/fixtures/generate/marian_opus");
    let dir = opus_folder("opus-config", fixture_dir.clone());
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture_dir.join("reference.json")).unwrap())
            .unwrap();
    let case = &reference["cases"][0];
    let text = case["text"].as_str().unwrap();
    let model = dir.to_str().unwrap();
    let out = qkv(&["generate", "--model", model, "--prompt", text]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim_end(),
        case["runs"][0]["text"].as_str().unwrap()
    );
    let run = &case["runs"][1];
    assert_eq!(run["kwargs"]["num_beams"], 3);
    let out = qkv(&[
        "generate",
        "--model",
        model,
        "--prompt",
        text,
        "--num-beams",
        "3",
        "--length-penalty",
        "0.6",
        "--early-stopping",
        "true",
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let got: Vec<u64> = serde_json::from_slice(&out.stdout).unwrap();
    let want: Vec<u64> = run["output_ids"][0].as_array().unwrap()[1..]
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(got, want);
    let out = qkv(&[
        "generate", "--model", model, "--prompt", text, "--top-k", "5",
    ]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--greedy"), "{}", stderr(&out));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn text_prompt_without_tokenizer_says_what_is_missing() {
    let out = qkv(&[
        "generate",
        "--model",
        fixture("marian").to_str().unwrap(),
        "--prompt",
        "hello",
        "--max-new-tokens",
        "2",
    ]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--input-ids"), "{}", stderr(&out));
}

#[test]
#[ignore = "needs all-MiniLM-L6-v2: set QKV_MINILM_DIR (tools/fetch_minilm.sh DIR), as .ci/run does"]
fn embed_json_is_unit_vectors_for_minilm() {
    let dir = std::env::var_os("QKV_MINILM_DIR")
        .expect("QKV_MINILM_DIR is not set (.ci/run fetches all-MiniLM-L6-v2 and sets it)");
    let out = qkv(&[
        "embed",
        "--model",
        dir.to_str().unwrap(),
        "--json",
        "attention is all you need",
        "注意力",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let vectors: Vec<Vec<f32>> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(vectors.len(), 2);
    for v in vectors {
        assert_eq!(v.len(), 384);
        let norm: f32 = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5);
    }
}

/// `qkv inspect` on a GGUF file lists its format, its tensors by type and its metadata;
/// a malformed one fails with one line naming the file and the field.
#[test]
fn inspect_lists_a_gguf_file_and_names_what_is_wrong_with_a_bad_one() {
    let gguf =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../qkv/tests/fixtures/gguf/tensors.gguf");
    let out = qkv(&["inspect", "--model", gguf.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "GGUF version 3, alignment 32",
        "tensors            8: F32 1",
        "Q4_K 1",
        "general.architecture \"llama\"",
        "test.strings       [5 × String]",
        "test.f64           -2.5e-300",
    ] {
        assert!(text.contains(needle), "`{needle}` in:\n{text}");
    }
    let out = qkv(&[
        "inspect",
        "--model",
        gguf.to_str().unwrap(),
        "--dtype",
        "bf16",
    ]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--dtype"), "{}", stderr(&out));

    let dir = scratch("gguf-inspect");
    let bad = dir.join("cut.gguf");
    let bytes = std::fs::read(&gguf).unwrap();
    std::fs::write(&bad, &bytes[..100]).unwrap();
    let out = qkv(&["inspect", "--model", bad.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("cut.gguf") && err.contains("the tensor count is 8"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `qkv convert` writes a folder as GGUF that reads back as the folder, and refuses a
/// name without `.gguf`, an unknown type and a model GGUF cannot hold, naming each.
#[test]
fn convert_writes_a_gguf_file_that_generates_as_the_folder() {
    let dir = scratch("convert");
    let out = dir.join("llama.gguf");
    let model = fixture("llama_gqa");
    let run = |args: &[&str]| qkv(&[&["convert", model.to_str().unwrap()], args].concat());
    let done = run(&["--to", out.to_str().unwrap(), "--dtype", "f32"]);
    assert!(done.status.success(), "{}", stderr(&done));
    assert!(String::from_utf8_lossy(&done.stdout).contains("weights in F32"));
    assert!(
        stderr(&done).contains("no tokenizer.json"),
        "{}",
        stderr(&done)
    );
    let generated = |m: &Path| {
        let o = qkv(&[
            "generate",
            "--model",
            m.to_str().unwrap(),
            "--input-ids",
            "1,5,9",
            "--max-new-tokens",
            "6",
            "--greedy",
            "--json",
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        o.stdout
    };
    assert_eq!(generated(&out), generated(&model));
    // a GGUF file converts too, its blocks widened: Q8_0 back to F32
    let q8 = dir.join("q8.gguf");
    let again = dir.join("again.gguf");
    for (from, to, ty) in [(&model, &q8, "q8_0"), (&q8, &again, "f32")] {
        let o = qkv(&[
            "convert",
            from.to_str().unwrap(),
            "--to",
            to.to_str().unwrap(),
            "--dtype",
            ty,
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let listed = qkv(&["inspect", "--model", again.to_str().unwrap()]);
    let listed = String::from_utf8_lossy(&listed.stdout).into_owned();
    assert!(
        listed.contains("F32") && !listed.contains("Q8_0"),
        "{listed}"
    );
    assert!(!generated(&again).is_empty());
    for (args, want) in [
        (vec!["--to", "x.bin"], "ending in .gguf"),
        (
            vec!["--to", "x.gguf", "--dtype", "q4_k"],
            "one of f32, f16, bf16, q8_0, q4_0",
        ),
    ] {
        let o = run(&args);
        assert!(!o.status.success());
        assert!(stderr(&o).contains(want), "{}", stderr(&o));
    }
    let o = qkv(&[
        "convert",
        fixture("gpt2").to_str().unwrap(),
        "--to",
        dir.join("gpt2.gguf").to_str().unwrap(),
    ]);
    assert!(
        stderr(&o).contains("Llama-layout decoders"),
        "{}",
        stderr(&o)
    );
    assert!(!dir.join("gpt2.gguf").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `qkv embed` reads its sentences from a file or standard input, one a line, to the
/// same vectors as given on the command line.
#[test]
fn embed_reads_sentences_from_a_file_or_stdin() {
    let dir = scratch("embed-input");
    let model = sentence_fixture();
    let m = model.to_str().unwrap();
    let given = qkv(&[
        "embed",
        "--model",
        m,
        "--json",
        "the cat sat",
        "猫坐在垫子上",
    ]);
    assert!(given.status.success(), "{}", stderr(&given));
    let file = dir.join("texts.txt");
    std::fs::write(&file, "the cat sat\n猫坐在垫子上\n").unwrap();
    let read = qkv(&[
        "embed",
        "--model",
        m,
        "--json",
        "--input",
        file.to_str().unwrap(),
    ]);
    assert!(read.status.success(), "{}", stderr(&read));
    assert_eq!(read.stdout, given.stdout);
    let mut child = Command::new(env!("CARGO_BIN_EXE_qkv"))
        .args(["embed", "--model", m, "--json", "--input", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all("the cat sat\n猫坐在垫子上".as_bytes())
        .unwrap();
    let piped = child.wait_with_output().unwrap();
    assert!(piped.status.success());
    assert_eq!(piped.stdout, given.stdout);
    std::fs::write(&file, "").unwrap();
    let empty = qkv(&["embed", "--model", m, "--input", file.to_str().unwrap()]);
    assert!(
        stderr(&empty).contains("no lines to embed"),
        "{}",
        stderr(&empty)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A corpus job's parts, read back by the parquet crate's own reader: the (id, vector)
/// rows of part-000000.parquet, part-000001.parquet, … in order.
fn read_parts(dir: &Path) -> Vec<(i64, Vec<f32>)> {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    use parquet::record::{ListAccessor, RowAccessor};
    let mut rows = Vec::new();
    for index in 0.. {
        let Ok(file) = std::fs::File::open(dir.join(format!("part-{index:06}.parquet"))) else {
            break;
        };
        let reader = SerializedFileReader::new(file).unwrap();
        for row in reader.get_row_iter(None).unwrap() {
            let row = row.unwrap();
            let list = row.get_list(1).unwrap();
            let v = (0..list.len())
                .map(|i| list.get_float(i).unwrap())
                .collect();
            rows.push((row.get_long(0).unwrap(), v));
        }
    }
    rows
}

/// Every part's bytes, in order.
fn part_bytes(dir: &Path) -> Vec<Vec<u8>> {
    (0..)
        .map_while(|i| std::fs::read(dir.join(format!("part-{i:06}.parquet"))).ok())
        .collect()
}

/// `qkv embed --input FILE --output DIR`: the texts of a .txt, .jsonl or .parquet file
/// (pyarrow's, snappy and zstd) embedded into Parquet parts of `--chunk` rows, their
/// vectors those `qkv embed --json` gives in memory, and the same bytes from every
/// input form; a run that lost its last parts (and left a part half written) goes on
/// with `--resume` to the same bytes; what cannot be done is refused by name.
#[test]
fn embed_corpus_job_writes_parquet_parts_and_resumes_to_the_same_bytes() {
    let dir = scratch("corpus");
    let model = sentence_fixture();
    let m = model.to_str().unwrap();
    let inputs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../qkv/tests/fixtures/corpus");
    let texts = [
        "the cat sat",
        "猫坐在垫子上",
        "attention is all you need",
        "",
        "last line no newline",
    ];
    let txt = dir.join("texts.txt");
    std::fs::write(&txt, texts.join("\n")).unwrap();
    let jsonl = dir.join("texts.jsonl");
    let lines: Vec<String> = texts
        .iter()
        .map(|t| serde_json::json!({"id": 7, "body": t}).to_string() + "\n")
        .collect();
    std::fs::write(&jsonl, lines.concat()).unwrap();
    let job = |input: &Path, out: &Path, extra: &[&str]| {
        let (i, o) = (input.to_str().unwrap(), out.to_str().unwrap());
        let mut args = vec!["embed", "--model", m, "--input", i, "--output", o];
        args.extend_from_slice(extra);
        qkv(&args)
    };

    let in_memory = qkv(&[
        "embed",
        "--model",
        m,
        "--json",
        "--input",
        txt.to_str().unwrap(),
    ]);
    assert!(in_memory.status.success(), "{}", stderr(&in_memory));
    let expected: Vec<Vec<f32>> = serde_json::from_slice(&in_memory.stdout).unwrap();
    let out = dir.join("from-txt");
    let run = job(&txt, &out, &["--chunk", "2"]);
    assert!(run.status.success(), "{}", stderr(&run));
    assert!(
        stderr(&run).contains("5 texts in 3 parts"),
        "{}",
        stderr(&run)
    );
    let rows = read_parts(&out);
    assert_eq!(
        rows.iter().map(|r| r.0).collect::<Vec<_>>(),
        [0, 1, 2, 3, 4]
    );
    for ((_, got), want) in rows.iter().zip(&expected) {
        assert_eq!(got.len(), want.len());
        // chunks of 2 texts pack other neighbours than one batch of 5: last-bit sums
        let worst = got
            .iter()
            .zip(want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(worst < 1e-6, "{worst}");
    }
    let bytes = part_bytes(&out);
    assert_eq!(bytes.len(), 3);
    for (input, field) in [
        (jsonl.clone(), "body"),
        (inputs.join("texts_snappy.parquet"), "body"),
        (inputs.join("texts_zstd.parquet"), "body"),
    ] {
        let other = dir.join(format!(
            "from-{}",
            input.file_name().unwrap().to_str().unwrap()
        ));
        let run = job(&input, &other, &["--chunk", "2", "--text-field", field]);
        assert!(
            run.status.success(),
            "{}: {}",
            input.display(),
            stderr(&run)
        );
        assert_eq!(part_bytes(&other), bytes, "{}", input.display());
    }

    // a run that lost its last two parts, the first of them half written
    std::fs::remove_file(out.join("part-000001.parquet")).unwrap();
    std::fs::remove_file(out.join("part-000002.parquet")).unwrap();
    std::fs::write(out.join(".part-000001.parquet.tmp"), b"PAR1 half").unwrap();
    let resumed = job(&txt, &out, &["--chunk", "2", "--resume"]);
    assert!(resumed.status.success(), "{}", stderr(&resumed));
    assert!(
        stderr(&resumed).contains("(3 this run"),
        "{}",
        stderr(&resumed)
    );
    assert_eq!(part_bytes(&out), bytes);
    assert!(!out.join(".part-000001.parquet.tmp").exists());

    let refused = |run: Output, words: &str| {
        assert!(!run.status.success());
        assert!(
            stderr(&run).contains(words),
            "`{words}` not in: {}",
            stderr(&run)
        );
    };
    refused(job(&txt, &out, &["--chunk", "2"]), "is not empty: --resume");
    refused(
        job(&txt, &out, &["--chunk", "3", "--resume"]),
        "its chunk was 2, this one's is 3",
    );
    refused(job(&jsonl, &dir.join("j"), &[]), "line 1: no field `text`");
    refused(
        job(
            &inputs.join("texts_snappy.parquet"),
            &dir.join("p"),
            &["--text-field", "n"],
        ),
        "column `n` is not a string column",
    );
    refused(
        job(&dir.join("texts.csv"), &dir.join("c"), &[]),
        ".parquet (a string column",
    );
    refused(
        job(&txt, &dir.join("t"), &["--text-field", "body"]),
        "it has no fields",
    );
    refused(
        job(&txt, &dir.join("z"), &["--chunk", "0"]),
        "--chunk must be at least 1",
    );
    std::fs::write(dir.join("empty.txt"), "").unwrap();
    refused(
        job(&dir.join("empty.txt"), &dir.join("e"), &[]),
        "empty.txt: no texts",
    );
    assert!(!dir.join("e").exists());
    refused(
        qkv(&[
            "embed",
            "--model",
            m,
            "--output",
            dir.join("n").to_str().unwrap(),
            "x",
        ]),
        "embeds the texts of --input FILE",
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `qkv classify --input FILE --output DIR`: each text's top label, its score and every
/// label's score in Parquet parts, as `qkv classify --json` ranks them; an overlong
/// text named by its row under `--truncate refuse`.
#[test]
fn classify_corpus_job_writes_labels_and_scores() {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    use parquet::record::{ListAccessor, RowAccessor};
    let dir = scratch("corpus-classify");
    let model =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../qkv/tests/fixtures/classify/distilbert_sst");
    let m = model.to_str().unwrap();
    let texts = ["the cat sat", "a wonderful, moving film", "", "dull"];
    let input = dir.join("texts.txt");
    std::fs::write(&input, texts.join("\n")).unwrap();
    let out = dir.join("out");
    let (i, o) = (input.to_str().unwrap(), out.to_str().unwrap());
    let run = qkv(&[
        "classify", "--model", m, "--input", i, "--output", o, "--chunk", "3",
    ]);
    assert!(run.status.success(), "{}", stderr(&run));
    let mut args = vec!["classify", "--model", m, "--json"];
    for t in texts {
        args.extend(["--text", t]);
    }
    let given = qkv(&args);
    assert!(given.status.success(), "{}", stderr(&given));
    let ranked: serde_json::Value = serde_json::from_slice(&given.stdout).unwrap();
    let mut rows = 0;
    for index in 0..2 {
        let file = std::fs::File::open(out.join(format!("part-{index:06}.parquet"))).unwrap();
        for row in SerializedFileReader::new(file)
            .unwrap()
            .get_row_iter(None)
            .unwrap()
        {
            let row = row.unwrap();
            let id = row.get_long(0).unwrap();
            assert_eq!(id, rows);
            let top = &ranked[id as usize][0];
            assert_eq!(row.get_string(1).unwrap(), top["label"].as_str().unwrap());
            let score = row.get_float(2).unwrap();
            assert!((score as f64 - top["score"].as_f64().unwrap()).abs() < 1e-6);
            let scores = row.get_list(3).unwrap();
            assert_eq!(scores.len(), 2);
            let sum: f32 = (0..2).map(|j| scores.get_float(j).unwrap()).sum();
            assert!((sum - 1.0).abs() < 1e-5, "softmax scores sum to {sum}");
            rows += 1;
        }
    }
    assert_eq!(rows, 4);
    std::fs::write(
        &input,
        "a very long text that goes on and on past the sixteen tokens of this model\n",
    )
    .unwrap();
    let refused = qkv(&[
        "classify",
        "--model",
        m,
        "--input",
        i,
        "--output",
        dir.join("r").to_str().unwrap(),
        "--truncate",
        "refuse",
    ]);
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("--input row 0 is"),
        "{}",
        stderr(&refused)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A corpus job killed (SIGKILL) after its first parts, then run again with
/// `--resume`, leaves the bytes an uninterrupted run writes.
#[test]
fn a_killed_corpus_job_resumes_to_an_uninterrupted_runs_bytes() {
    let dir = scratch("corpus-kill");
    let model = sentence_fixture();
    let m = model.to_str().unwrap();
    let input = dir.join("texts.txt");
    let lines: Vec<String> = (0..4000)
        .map(|i| format!("sentence number {i} of the corpus"))
        .collect();
    std::fs::write(&input, lines.join("\n")).unwrap();
    let args = |out: &Path| -> Vec<String> {
        ["embed", "--model", m, "--input", input.to_str().unwrap()]
            .into_iter()
            .map(String::from)
            .chain([
                "--output".into(),
                out.to_str().unwrap().into(),
                "--chunk".into(),
                "20".into(),
            ])
            .collect()
    };
    let whole = dir.join("whole");
    let run = qkv(&args(&whole).iter().map(String::as_str).collect::<Vec<_>>());
    assert!(run.status.success(), "{}", stderr(&run));
    let expected = part_bytes(&whole);
    assert_eq!(expected.len(), 200);

    let killed = dir.join("killed");
    let mut child = Command::new(env!("CARGO_BIN_EXE_qkv"))
        .args(args(&killed))
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while !killed.join("part-000002.parquet").exists() {
        assert!(started.elapsed().as_secs() < 60, "no third part in 60 s");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let left = part_bytes(&killed).len();
    assert!(
        (3..200).contains(&left),
        "{left} parts when killed: the job should have been stopped part-way"
    );
    let mut again = args(&killed);
    again.push("--resume".into());
    let run = qkv(&again.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(run.status.success(), "{}", stderr(&run));
    assert_eq!(part_bytes(&killed), expected);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The README's tour on `examples/tiny-chat`, as the README writes it: every `qkv`
/// line of its code block that runs and ends by itself (not `serve`, `train`,
/// `experiment`, `bench`, which tests of their own cover) runs as written from a folder
/// holding `examples/`, and the answers are the sentences the model was trained on
/// (tools/examples/tiny_chat_corpus.py), through its chat template, from the folder and
/// from the Q8_0 GGUF file `qkv convert` writes of it. The README stays within 200 lines.
#[test]
fn the_readme_tour_runs_as_written() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    assert!(
        readme.lines().count() <= 200,
        "the README is over 200 lines"
    );
    let tour = readme
        .split("## A short tour")
        .nth(1)
        .and_then(|t| t.split("```sh\n").nth(1))
        .and_then(|t| t.split("```").next())
        .expect("the tour's code block");
    let dir = scratch("tour");
    std::os::unix::fs::symlink(root.join("examples"), dir.join("examples")).unwrap();
    let mut outputs = Vec::new();
    for line in tour.lines().filter(|l| l.starts_with("qkv ")) {
        let args = words(line.split(" # ").next().unwrap());
        if ["serve", "train", "experiment", "bench"].contains(&args[1].as_str()) {
            continue;
        }
        let out = Command::new(env!("CARGO_BIN_EXE_qkv"))
            .args(&args[1..])
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "{line}: {}", stderr(&out));
        outputs.push((args[1].clone(), String::from_utf8(out.stdout).unwrap()));
    }
    let ran: Vec<&str> = outputs.iter().map(|(c, _)| c.as_str()).collect();
    assert_eq!(
        ran,
        ["inspect", "generate", "attention", "convert", "generate"]
    );
    assert!(outputs[0].1.contains("LlamaForCausalLM"));
    assert!(outputs[1].1.starts_with(
        "attention mixes the values, weighted by how well each key matches the query.\n"
    ));
    assert!(outputs[4]
        .1
        .starts_with("it hides the later tokens, so each token only sees the ones before it.\n"));
    assert!(std::fs::read_to_string(dir.join("maps.html"))
        .unwrap()
        .contains("causal mask"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A shell line's words: split at spaces, a double-quoted run kept whole.
fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut quoted = false;
    for c in line.trim().chars() {
        match c {
            '"' => quoted = !quoted,
            ' ' if !quoted => {
                if !word.is_empty() {
                    out.push(std::mem::take(&mut word));
                }
            }
            c => word.push(c),
        }
    }
    if !word.is_empty() {
        out.push(word);
    }
    out
}

/// `--json-schema` and `--grammar` hold the output of `examples/tiny-chat` to what they
/// say (a JSON object of the schema's keys and ranges; one of a GBNF grammar's words),
/// sampled or greedy; a schema or grammar that does not compile fails naming its flag
/// and file.
#[test]
fn generate_follows_a_json_schema_or_a_grammar() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let model = root.join("examples/tiny-chat");
    let m = model.to_str().unwrap();
    let dir = scratch("structured");
    let schema = dir.join("person.json");
    std::fs::write(
        &schema,
        r#"{"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
            "age": {"type": "integer", "minimum": 0, "maximum": 99}},
            "required": ["name", "age"], "additionalProperties": false}"#,
    )
    .unwrap();
    for seed in ["1", "2", "3"] {
        let out = qkv(&[
            "generate",
            "--model",
            m,
            "--user",
            "Who are you?",
            "--json-schema",
            schema.to_str().unwrap(),
            "--temperature",
            "1",
            "--seed",
            seed,
            "--max-new-tokens",
            "60",
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).unwrap();
        let v: serde_json::Value = serde_json::from_str(text.trim_end()).unwrap();
        let o = v.as_object().unwrap_or_else(|| panic!("{text}"));
        assert_eq!(o.len(), 2, "{text}");
        assert!(o["name"].as_str().unwrap().chars().count() <= 6, "{text}");
        assert!((0..=99).contains(&o["age"].as_i64().unwrap()), "{text}");
    }
    let grammar = dir.join("answer.gbnf");
    std::fs::write(
        &grammar,
        "# one word\nroot ::= \"yes\" | \"no\" | \"maybe\"\n",
    )
    .unwrap();
    let out = qkv(&[
        "generate",
        "--model",
        m,
        "--prompt",
        "So",
        "--grammar",
        grammar.to_str().unwrap(),
    ]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        ["yes\n", "no\n", "maybe\n"].contains(&text.as_str()),
        "{text:?}"
    );
    // what does not compile fails naming the flag and why
    let refused = |flag: &str, file: &Path, says: &str| {
        let args = ["generate", "--model", m, "--prompt", "So", flag];
        let out = qkv(&[&args[..], &[file.to_str().unwrap()]].concat());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(flag) && err.contains(says),
            "{err}"
        );
    };
    std::fs::write(&grammar, "root ::= [a-z\n").unwrap();
    refused("--grammar", &grammar, "closing `]`");
    std::fs::write(&schema, r#"{"type": "frob"}"#).unwrap();
    refused("--json-schema", &schema, "frob");
    std::fs::remove_dir_all(&dir).unwrap();
}
