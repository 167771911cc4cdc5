//! Hostile input, each case of the hardening issue: the command must fail within
//! seconds with one clear line naming the file, flag or field (or do the right thing),
//! without aborting, hanging, using more than 1 GB, or replacing what it should not.

mod common;

use std::path::Path;

use common::{fails, fixture, fixtures, patched, scratch, stderr, timed};

/// The largest resident size any child of this test process reached, in bytes.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn children_max_rss() -> u64 {
    // SAFETY: getrusage only writes into the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) };
    usage.ru_maxrss as u64 * 1024
}

/// A safetensors file of int64 tensors (name, shape, values), written by hand: the
/// library saves only floats.
fn int64_safetensors(tensors: &[(&str, &[usize], &[i64])]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, shape, values) in tensors {
        let start = data.len();
        data.extend(values.iter().flat_map(|v| v.to_le_bytes()));
        header.insert(
            name.to_string(),
            serde_json::json!({"dtype": "I64", "shape": shape, "data_offsets": [start, data.len()]}),
        );
    }
    let mut text = serde_json::Value::Object(header).to_string();
    while !text.len().is_multiple_of(8) {
        text.push(' ');
    }
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend(text.as_bytes());
    out.extend(data);
    out
}

#[test]
fn huge_sizes_are_refused_before_they_are_allocated() {
    let dir = scratch("hostile-sizes");
    let llama = patched(
        &dir,
        "llama_gqa",
        serde_json::json!({"head_dim": 1u64 << 40}),
    );
    fails(
        &["inspect", "--model", llama.to_str().unwrap()],
        "but the checkpoint stores 24928 values",
    );
    // a huge position limit costs nothing until positions are used
    let marian = patched(
        &dir,
        "marian",
        serde_json::json!({"max_position_embeddings": 1_000_000_000u64}),
    );
    let reference = fixture("marian").join("reference.safetensors");
    let out = dir.join("logits.safetensors");
    let run = timed(&[
        "forward",
        "--model",
        marian.to_str().unwrap(),
        "--input",
        reference.to_str().unwrap(),
        "--output",
        out.to_str().unwrap(),
    ]);
    assert!(run.status.success(), "{}", stderr(&run));
    let train_out = dir.join("train");
    for flag in [
        ["--d-model", "65536"],
        ["--batch-size", "1000000000"],
        ["--task-length", "1000000000"],
        ["--symbols", "1000000000"],
    ] {
        let mut args = vec!["train", "--task", "copy", "--steps", "1", "--quiet"];
        args.extend(flag);
        args.extend(["--out", train_out.to_str().unwrap()]);
        fails(&args, "GB available");
        assert!(!train_out.exists(), "{flag:?} created its --out");
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    assert!(children_max_rss() < 1 << 30, "{} bytes", children_max_rss());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_header_of_20000_tensors_is_read_once() {
    let dir = scratch("hostile-header");
    let model = dir.join("gpt2");
    std::fs::create_dir_all(&model).unwrap();
    std::fs::copy(
        fixture("gpt2").join("config.json"),
        model.join("config.json"),
    )
    .unwrap();
    let real = qkv::io::TensorFile::open(fixture("gpt2").join("model.safetensors")).unwrap();
    let mut tensors: Vec<(String, qkv::Tensor)> = real
        .names()
        .unwrap()
        .into_iter()
        .map(|n| {
            let t = real.tensor(&n).unwrap();
            (n, t)
        })
        .collect();
    let tiny = qkv::Tensor::zeros(&[1]);
    tensors.extend((0..20_000).map(|i| (format!("extra.{i}"), tiny.clone())));
    // (unused, so named in a warning that shows five of them)
    let refs: Vec<(&str, &qkv::Tensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    qkv::io::save(&model.join("model.safetensors"), &refs, None).unwrap();
    let out = timed(&["inspect", "--model", model.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("does not use 20000 tensors"),
        "{}",
        stderr(&out)
    );
    assert!(stderr(&out).contains("and 19995 more"), "{}", stderr(&out));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn generation_stays_within_positions_memory_and_streams() {
    let gpt2 = fixture("gpt2");
    let out = timed(&[
        "generate",
        "--model",
        gpt2.to_str().unwrap(),
        "--input-ids",
        "1,2,3",
        "--max-new-tokens",
        "1000000000",
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("generating at most 61"),
        "{}",
        stderr(&out)
    );
    let ids: Vec<usize> = serde_json::from_slice(&out.stdout).unwrap();
    assert!(!ids.is_empty() && ids.len() <= 61);
    // no position table: the cache is what limits, and it is refused up front
    fails(
        &[
            "generate",
            "--model",
            fixture("llama_gqa").to_str().unwrap(),
            "--input-ids",
            "1,2,3",
            "--max-new-tokens",
            "1000000000",
        ],
        "ask for fewer --max-new-tokens",
    );
    // text is printed as it comes, and equals the whole decode
    let dir = scratch("hostile-stream");
    let model = dir.join("gpt2");
    std::fs::create_dir_all(&model).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(gpt2.join(f), model.join(f)).unwrap();
    }
    // the byte-level tokenizer cut to the 99 rows of the model's table (its pieces of
    // single bytes; a tokenizer with more ids is refused at load)
    let tokenizer = fixtures().join("tokenizers/bytelevel/tokenizer.json");
    let mut tok: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(tokenizer).unwrap()).unwrap();
    tok["model"]["vocab"]
        .as_object_mut()
        .unwrap()
        .retain(|_, id| id.as_u64().unwrap() < 99);
    tok["model"]["merges"] = serde_json::json!([]);
    std::fs::write(model.join("tokenizer.json"), tok.to_string()).unwrap();
    let m = model.to_str().unwrap();
    let args = [
        "generate",
        "--model",
        m,
        "--input-ids",
        "40,41",
        "--max-new-tokens",
        "12",
    ];
    let text = timed(&args);
    assert!(text.status.success(), "{}", stderr(&text));
    let mut json_args = args.to_vec();
    json_args.push("--json");
    let ids: Vec<usize> = serde_json::from_slice(&timed(&json_args).stdout).unwrap();
    let tok = qkv::text::Tokenizer::from_dir(&model).unwrap();
    assert_eq!(
        String::from_utf8(text.stdout).unwrap(),
        format!("{}\n", tok.decode(&ids).unwrap())
    );
    // a corrupt tokenizer.json is an error even when ids are given
    std::fs::write(model.join("tokenizer.json"), "{not json").unwrap();
    fails(&args, "tokenizer.json");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[cfg(unix)]
#[test]
fn special_files_are_neither_read_forever_nor_replaced() {
    let dir = scratch("hostile-special");
    let model = dir.join("fifo-model");
    std::fs::create_dir_all(&model).unwrap();
    std::fs::copy(
        fixture("gpt2").join("model.safetensors"),
        model.join("model.safetensors"),
    )
    .unwrap();
    let fifo = model.join("config.json");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    fails(
        &["inspect", "--model", model.to_str().unwrap()],
        "is a FIFO",
    );

    // outputs through a symlink to /dev/null, or a folder
    let gpt2 = fixture("gpt2");
    let reference = gpt2.join("reference.safetensors");
    let link = dir.join("null-link");
    std::os::unix::fs::symlink("/dev/null", &link).unwrap();
    let run = |output: &Path| {
        timed(&[
            "forward",
            "--model",
            gpt2.to_str().unwrap(),
            "--input",
            reference.to_str().unwrap(),
            "--output",
            output.to_str().unwrap(),
        ])
    };
    let out = run(&link);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(!std::fs::metadata("/dev/null").unwrap().is_file());
    let out = run(&dir);
    assert!(stderr(&out).contains("is a folder"), "{}", stderr(&out));
    // the longest file name a folder may hold
    let long = dir.join(format!("{}.safetensors", "n".repeat(240)));
    let out = run(&long);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(long.is_file());
    // a folder given as --input
    fails(
        &[
            "forward",
            "--model",
            gpt2.to_str().unwrap(),
            "--input",
            dir.to_str().unwrap(),
            "--output",
            dir.join("o.safetensors").to_str().unwrap(),
        ],
        "is a folder, not a regular file",
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn training_output_is_checked_before_the_first_step() {
    let dir = scratch("hostile-train-out");
    // an existing Hugging Face folder is not overwritten without --overwrite
    let hf = dir.join("hf");
    std::fs::create_dir_all(&hf).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(fixture("gpt2").join(f), hf.join(f)).unwrap();
    }
    std::fs::write(hf.join("tokenizer.json"), "{}").unwrap();
    let h = hf.to_str().unwrap();
    let args = [
        "train", "--task", "copy", "--steps", "2", "--quiet", "--out", h,
    ];
    fails(&args, "is not empty");
    assert_eq!(
        std::fs::read(hf.join("config.json")).unwrap(),
        std::fs::read(fixture("gpt2").join("config.json")).unwrap()
    );
    let mut over = args.to_vec();
    over.push("--overwrite");
    let out = timed(&over);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        !hf.join("tokenizer.json").exists(),
        "a stale tokenizer was left"
    );
    // an --out that cannot be created fails before training
    let file = dir.join("a-file");
    std::fs::write(&file, "x").unwrap();
    let under_file = file.join("out");
    fails(
        &[
            "train",
            "--task",
            "copy",
            "--steps",
            "200",
            "--quiet",
            "--out",
            under_file.to_str().unwrap(),
        ],
        "--out",
    );
    // a folder another live run holds (this test, through the library's lock)
    let held = dir.join("held");
    let lock = qkv::train::output::Lock::claim(&held, false).unwrap();
    fails(
        &[
            "train",
            "--task",
            "copy",
            "--steps",
            "2",
            "--quiet",
            "--out",
            held.to_str().unwrap(),
        ],
        &format!("another `qkv train` (process {})", std::process::id()),
    );
    drop(lock);
    fails(
        &[
            "train",
            "--task",
            "copy",
            "--stop-after",
            "0",
            "--out",
            dir.join("z").to_str().unwrap(),
        ],
        "--stop-after 0",
    );
    fails(
        &[
            "train",
            "--task",
            "copy",
            "--threads",
            "100000",
            "--out",
            dir.join("z").to_str().unwrap(),
        ],
        "--threads 100000: at most 1024",
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn what_was_accepted_silently_is_refused() {
    let dir = scratch("hostile-silent");
    // a config with fewer layers than the checkpoint holds
    let gpt2 = patched(&dir, "gpt2", serde_json::json!({"n_layer": 0}));
    fails(
        &["inspect", "--model", gpt2.to_str().unwrap()],
        "a weight of layer 0, but config.json has 0 layers",
    );
    // a shard index that points outside the model folder
    let sharded = dir.join("sharded");
    std::fs::create_dir_all(&sharded).unwrap();
    std::fs::copy(
        fixture("gpt2").join("config.json"),
        sharded.join("config.json"),
    )
    .unwrap();
    std::fs::write(
        sharded.join("model.safetensors.index.json"),
        r#"{"weight_map": {"wte.weight": "../../etc/model.safetensors"}}"#,
    )
    .unwrap();
    fails(
        &["inspect", "--model", sharded.to_str().unwrap()],
        "a path outside the model folder",
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn messages_name_the_real_thing() {
    let dir = scratch("hostile-messages");
    let gpt2 = patched(&dir, "gpt2", serde_json::json!({"n_head": -32}));
    fails(
        &["inspect", "--model", gpt2.to_str().unwrap()],
        "field `n_head`",
    );
    let llama = patched(&dir, "llama_gqa", serde_json::json!({"hidden_size": 32.5}));
    fails(
        &["inspect", "--model", llama.to_str().unwrap()],
        "field `hidden_size`",
    );
    // `qkv forward` on `model` with an input file of `tensors` fails naming `needle`
    let forward_fails = |model: &str, tensors: &[(&str, &[usize], &[i64])], needle: &str| {
        let input = dir.join("input.safetensors");
        std::fs::write(&input, int64_safetensors(tensors)).unwrap();
        let out = timed(&[
            "forward",
            "--model",
            fixture(model).to_str().unwrap(),
            "--input",
            input.to_str().unwrap(),
            "--output",
            dir.join("o.safetensors").to_str().unwrap(),
        ]);
        assert!(stderr(&out).contains(needle), "{}", stderr(&out));
    };
    // an empty decoder input is named as such
    forward_fails(
        "t5",
        &[
            ("input_ids", &[1, 3], &[5, 6, 1]),
            ("decoder_input_ids", &[1, 0], &[]),
        ],
        "`decoder_input_ids` is empty",
    );
    // a negative mask value is a bad mask value, not a "negative id"
    forward_fails(
        "gpt2",
        &[
            ("input_ids", &[1, 3], &[5, 6, 1]),
            ("attention_mask", &[1, 3], &[1, -1, 1]),
        ],
        "`attention_mask` must hold 0 or 1, found -1 at flat index 1",
    );
    // an id past the vocabulary names the file's tensor, not "token id (vocabulary)"
    forward_fails(
        "gpt2",
        &[("input_ids", &[1, 3], &[5, 500, 1])],
        "input.safetensors: tensor `input_ids` holds token id 500, outside the model's vocabulary of 99",
    );
    forward_fails(
        "t5",
        &[
            ("input_ids", &[1, 3], &[5, 6, 1]),
            ("decoder_input_ids", &[1, 2], &[0, 99]),
        ],
        "tensor `decoder_input_ids` holds token id 99",
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A decoder of 64 positions with the Qwen2 byte-level test tokenizer and `template` as
/// its chat template, in `dir`.
fn chat_model(dir: &Path, template: &str) -> std::path::PathBuf {
    let d = tiny_llama(&dir.join("chat-model"), 64);
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    std::fs::copy(
        root.join("crates/qkv/tests/fixtures/tokenizers/qwen2_bytelevel/tokenizer.json"),
        d.join("tokenizer.json"),
    )
    .unwrap();
    std::fs::write(d.join("chat_template.jinja"), template).unwrap();
    d
}

/// A random Llama of 323 tokens and `positions` positions saved in `d`.
fn tiny_llama(d: &Path, positions: usize) -> std::path::PathBuf {
    let positions = positions.to_string();
    let out = common::qkv(&[
        "bench",
        "llama",
        "--save",
        d.to_str().unwrap(),
        "--vocab",
        "323",
        "--d-model",
        "32",
        "--layers",
        "1",
        "--heads",
        "2",
        "--kv-heads",
        "1",
        "--max-len",
        &positions,
        "--prefill",
        "4",
        "--decode",
        "1",
        "--rounds",
        "1",
        "--warmup",
        "0",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    d.to_path_buf()
}

/// Ablation runs a forward of the whole text per 16 tokens: past --max-ablation-tokens
/// (512 by default) it is refused at once with what it would cost, not run for an hour.
#[test]
fn ablation_is_refused_past_its_token_bound() {
    let dir = scratch("hostile-ablation");
    let model = tiny_llama(&dir.join("m"), 1024);
    let ids: Vec<String> = (0..600).map(|i| (i % 323).to_string()).collect();
    let ids = ids.join(",");
    let json = dir.join("a.json");
    let args = |extra: &[&'static str]| {
        let mut a = vec![
            "attention",
            "--model",
            model.to_str().unwrap(),
            "--input-ids",
            ids.as_str(),
            "--method",
            "ablation",
            "--json",
            json.to_str().unwrap(),
        ];
        a.extend(extra);
        a
    };
    let started = std::time::Instant::now();
    fails(
        &args(&[]),
        "--method ablation over 600 tokens runs 38 forwards",
    );
    fails(
        &args(&["--max-ablation-tokens", "100"]),
        "past --max-ablation-tokens 100",
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(60));
    assert!(!json.exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Hardening round 3: prompts are bounded before they are read or tokenized
/// (`--max-prompt`, the model's positions by default), conversations in messages, and
/// a chat template in steps: each a clear line within seconds.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[test]
fn prompts_conversations_and_templates_are_bounded() {
    let dir = scratch("hostile-prompts");
    let plain = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}";
    let model = chat_model(&dir, plain);
    let m = model.to_str().unwrap();
    // 100 KB on a model of 64 positions: refused before tokenizing
    let long = "the animal was tired ".repeat(5000);
    fails(
        &[
            "generate",
            "--model",
            m,
            "--user",
            &long,
            "--max-new-tokens",
            "2",
        ],
        "more than --max-prompt 64 tokens' worth",
    );
    fails(
        &[
            "generate",
            "--model",
            m,
            "--prompt",
            &long,
            "--max-new-tokens",
            "2",
        ],
        "--prompt is 105000 bytes",
    );
    // 10^6 messages: refused by the file's size, before it is read
    let chat = dir.join("many.json");
    let one = r#"{"role": "user", "content": "a"},"#;
    let text = format!("[{}{}]", one.repeat(999_999), &one[..one.len() - 1]);
    std::fs::write(&chat, text).unwrap();
    let (out, peak) =
        common::qkv_peak(&["generate", "--model", m, "--chat", chat.to_str().unwrap()]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("--chat") && err.contains("--max-prompt"),
        "{err}"
    );
    assert!(peak < 200 << 20, "peak {peak} bytes");
    // within the bytes but past the messages a conversation may have
    let few = dir.join("few.json");
    std::fs::write(
        &few,
        format!("[{}{}]", one.repeat(4999), &one[..one.len() - 1]),
    )
    .unwrap();
    fails(
        &[
            "generate",
            "--model",
            m,
            "--chat",
            few.to_str().unwrap(),
            "--max-prompt",
            "100000",
        ],
        "5000 messages, more than the 4096",
    );
    // a template that would loop 10^15 times stops at its step budget
    let loops = chat_model(
        &dir.join("loops"),
        "{% for a in range(100000) %}{% for b in range(100000) %}{% for c in range(100000) %}x{% endfor %}{% endfor %}{% endfor %}",
    );
    fails(
        &[
            "generate",
            "--model",
            loops.to_str().unwrap(),
            "--user",
            "hi",
        ],
        "steps of rendering",
    );
    // a string doubled 40 times (a terabyte) in a few hundred steps: the worker process
    // the template renders in stops at its memory limit, and the command says so
    let doubling = chat_model(
        &dir.join("doubling"),
        "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
    );
    let (out, peak) = common::qkv_peak(&[
        "generate",
        "--model",
        doubling.to_str().unwrap(),
        "--user",
        "hi",
    ]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("chat template") && err.contains("MiB of memory while rendering"),
        "{err}"
    );
    assert!(peak < 3 << 29, "peak {peak} bytes");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A text longer than a classifier takes is cut with a warning naming it (transformers'
/// pipeline would fail on it, a cross-encoder cuts it silently); `--truncate cut` cuts
/// without the warning, to the same scores, and `--truncate refuse` stops.
#[test]
fn classify_says_when_it_cuts_a_text() {
    let model =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../qkv/tests/fixtures/classify/distilbert_sst");
    let long = "the film was long and dull but the cast was good ".repeat(500);
    let args = |truncate: &'static str| {
        vec![
            "classify",
            "--model",
            model.to_str().unwrap(),
            "--text",
            "a short one",
            "--text",
            long.as_str(),
            "--json",
            "--truncate",
            truncate,
        ]
    };
    let warned = common::qkv(&args("warn"));
    let err = stderr(&warned);
    assert!(warned.status.success(), "{err}");
    assert!(
        err.starts_with("warning: --text 2 is ")
            && err.contains("tokens, more than the")
            && err.contains("(--truncate cut says nothing"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    let cut = common::qkv(&args("cut"));
    assert!(
        cut.status.success() && cut.stderr.is_empty(),
        "{}",
        stderr(&cut)
    );
    assert_eq!(cut.stdout, warned.stdout);
    fails(&args("refuse"), "--text 2 is ");
    fails(&args("refuse"), "the model takes (--truncate refuse)");
}
