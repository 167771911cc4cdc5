//! `qkv convert` end to end: a folder `qkv train --text` wrote (its byte tokenizer, whose
//! ByteLevel pre-tokenizer splits no words) becomes a GGUF file that generates the same
//! text; a GGUF file converted again keeps its vocabulary and chat template; a missing
//! `.gguf` path is a missing file.

mod common;

use std::path::Path;

use common::{fails, qkv, scratch, stderr};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn ok(args: &[&str]) -> std::process::Output {
    let out = qkv(args);
    assert!(out.status.success(), "qkv {args:?}: {}", stderr(&out));
    out
}

/// `qkv generate --model m --prompt PROMPT` greedily: the new ids, and the printed text.
fn generate(model: &Path, prompt: &str) -> (Vec<usize>, String) {
    let args = |json: bool| {
        let mut a = vec!["generate", "--model", s(model), "--prompt", prompt];
        a.extend(["--max-new-tokens", "6", "--greedy"]);
        if json {
            a.push("--json");
        }
        a
    };
    let ids = serde_json::from_slice(&ok(&args(true)).stdout).unwrap();
    let text = String::from_utf8(ok(&args(false)).stdout).unwrap();
    (ids, text)
}

#[test]
fn a_folder_qkv_train_wrote_converts_and_generates_the_same_text() {
    let dir = scratch("convert-trained");
    let (text, out) = (dir.join("corpus.txt"), dir.join("out"));
    std::fs::write(
        &text,
        "attention is all you need. 注意力就是你所需要的。\n".repeat(40),
    )
    .unwrap();
    ok(&[
        "train",
        "--text",
        s(&text),
        "--style",
        "llama",
        "--seq-len",
        "16",
        "--d-model",
        "32",
        "--layers",
        "1",
        "--heads",
        "2",
        "--batch-size",
        "2",
        "--steps",
        "3",
        "--threads",
        "1",
        "--quiet",
        "--out",
        s(&out),
    ]);
    let template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}";
    std::fs::write(out.join("chat_template.jinja"), template).unwrap();

    // the folder as F32, then that file again as F32 and as Q8_0 (32 columns: blocks)
    let (once, twice, q8) = (
        dir.join("once.gguf"),
        dir.join("twice.gguf"),
        dir.join("q8.gguf"),
    );
    for (from, to, ty) in [
        (&out, &once, "f32"),
        (&once, &twice, "f32"),
        (&once, &q8, "q8_0"),
    ] {
        let done = ok(&["convert", s(from), "--to", s(to), "--dtype", ty]);
        assert!(
            !stderr(&done).contains("no tokenizer.json"),
            "{}: {}",
            from.display(),
            stderr(&done)
        );
    }
    for prompt in ["attention", "注意"] {
        let want = generate(&out, prompt);
        assert!(want.0.iter().all(|&id| id < 256), "{want:?}");
        assert_eq!(
            generate(&once, prompt),
            want,
            "{prompt:?}: the folder's file"
        );
        assert_eq!(
            generate(&twice, prompt),
            want,
            "{prompt:?}: that file again"
        );
        // Q8_0's logits differ a little: the text is still read and written
        assert_eq!(generate(&q8, prompt).0.len(), 6, "{prompt:?}: Q8_0");
    }
    // the byte tokenizer as llama.cpp's `gpt-2`, the chat template carried twice over
    for file in [&once, &twice, &q8] {
        let listed = String::from_utf8(ok(&["inspect", "--model", s(file)]).stdout).unwrap();
        for line in [
            "tokenizer.ggml.pre \"gpt-2\"",
            "tokenizer.ggml.tokens [256 × String]",
            "tokenizer.chat_template \"{% for m in messages %}",
        ] {
            assert!(
                listed.contains(line),
                "{}: {line}\n{listed}",
                file.display()
            );
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_missing_gguf_file_is_no_such_file() {
    let dir = scratch("convert-missing");
    let missing = dir.join("missing.gguf");
    let want = format!("{}: no such file", missing.display());
    fails(
        &["generate", "--model", s(&missing), "--prompt", "hi"],
        &want,
    );
    fails(
        &[
            "attention",
            "--model",
            s(&missing),
            "--input-ids",
            "1,2",
            "--out",
            s(&dir.join("maps.svg")),
        ],
        &want,
    );
    fails(
        &["convert", s(&missing), "--to", s(&dir.join("x.gguf"))],
        &want,
    );
    let out = qkv(&["generate", "--model", s(&missing), "--prompt", "hi"]);
    assert!(
        !stderr(&out).contains("not a local model folder"),
        "{}",
        stderr(&out)
    );
    // `inspect` reads a GGUF file's header alone, and says so in the system's words
    let out = qkv(&["inspect", "--model", s(&missing)]);
    let err = stderr(&out).to_lowercase();
    assert!(
        !out.status.success() && err.contains(&want.to_lowercase()),
        "{err}"
    );
    assert!(!dir.join("x.gguf").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}
