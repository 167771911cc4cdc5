//! Outputs are claimed, checked and written whole (the second hardening round): two
//! training runs started at once cannot share a folder, and a command checks every
//! option, output and size before it writes anything or runs the model.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};

use common::{fails, fixture, patched, scratch, stderr, timed};
use qkv::train::checkpoint;

/// The files a finished `qkv train --task` run leaves, and nothing else.
const CHECKPOINT_FILES: [&str; 4] = [
    "config.json",
    "model.safetensors",
    "optimizer.safetensors",
    "trainer_state.json",
];

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn of_two_trains_started_together_exactly_one_runs_and_the_folder_is_a_checkpoint() {
    let dir = scratch("outputs-race");
    let steps = 100;
    let mut by_lock = 0;
    for round in 0..20 {
        let out = dir.join(format!("run-{round}"));
        let o = out.to_str().unwrap();
        let args = [
            "train",
            "--quiet",
            "--task",
            "copy",
            "--d-model",
            "32",
            "--layers",
            "1",
            "--heads",
            "2",
            "--steps",
            "100",
            "--threads",
            "1",
            "--out",
            o,
        ];
        // both started before either is waited for
        let children: Vec<_> = (0..2)
            .map(|_| {
                Command::new(env!("CARGO_BIN_EXE_qkv"))
                    .args(args)
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let outputs: Vec<_> = children
            .into_iter()
            .map(|c| c.wait_with_output().unwrap())
            .collect();
        let (won, lost): (Vec<_>, Vec<_>) = outputs.iter().partition(|o| o.status.success());
        assert_eq!(
            won.len(),
            1,
            "round {round}: {:?}",
            outputs.iter().map(stderr).collect::<Vec<_>>()
        );
        let refused = stderr(lost[0]);
        assert_eq!(lost[0].status.code(), Some(1), "round {round}: {refused}");
        assert_eq!(
            refused.trim_end().lines().count(),
            1,
            "round {round}: {refused}"
        );
        // refused by the lock, or (when the winner finished first) by its checkpoint
        let locked = refused.contains("another `qkv train`");
        assert!(
            locked || refused.contains("already holds a training checkpoint"),
            "round {round}: {refused}"
        );
        by_lock += usize::from(locked);
        let state = checkpoint::open(&out).unwrap();
        assert_eq!(state.step, steps, "round {round}");
        assert_eq!(entries(&out), CHECKPOINT_FILES, "round {round}");
    }
    eprintln!("20 rounds: {by_lock} refused by the lock, the rest by the finished checkpoint");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_training_run_checks_its_log_before_it_makes_its_folder() {
    let dir = scratch("outputs-train-log");
    let out = dir.join("out");
    let log = dir.join("missing").join("log.jsonl");
    fails(
        &[
            "train",
            "--quiet",
            "--task",
            "copy",
            "--steps",
            "2",
            "--out",
            out.to_str().unwrap(),
            "--log-json",
            log.to_str().unwrap(),
        ],
        "--log-json",
    );
    assert!(
        !out.exists(),
        "the --out folder was made for a run that never started"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A Llama whose positions reach 10⁶, and 12 000 input ids: the attention maps of one
/// head and layer alone are 144 million weights.
fn long_llama(dir: &Path) -> (std::path::PathBuf, String) {
    let patch = serde_json::json!({"max_position_embeddings": 1_000_000});
    let model = patched(dir, "llama_gqa", patch);
    let ids: Vec<String> = (0..12_000).map(|i| (5 + i % 90).to_string()).collect();
    (model, ids.join(","))
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[test]
fn attention_refuses_an_output_too_large_before_the_forward() {
    let dir = scratch("outputs-attention-size");
    let (model, ids) = long_llama(&dir);
    let m = model.to_str().unwrap();
    let html = dir.join("maps.html");
    let json = dir.join("maps.json");
    let png = dir.join("map.png");
    let cases: [(Vec<&str>, &str); 3] = [
        (
            vec!["--out", html.to_str().unwrap()],
            "the output would hold 1152000000 weights",
        ),
        (
            vec![
                "--layer",
                "0",
                "--head",
                "0",
                "--json",
                json.to_str().unwrap(),
            ],
            "the output would hold 144000000 weights",
        ),
        (
            vec!["--out", png.to_str().unwrap()],
            "a heatmap shows at most 512 tokens a side, and this one has 12000",
        ),
    ];
    for (extra, expected) in cases {
        let mut args = vec!["attention", "--model", m, "--input-ids", &ids];
        args.extend(extra);
        let (out, peak) = common::qkv_peak(&args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(err.contains(expected), "{err}");
        // the model and the ids, not the forward's maps (which took 5 GB before)
        assert!(peak < 200 << 20, "{expected}: peak {peak} bytes");
    }
    assert!(!html.exists() && !json.exists() && !png.exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn attention_writes_no_output_until_every_option_is_good() {
    let dir = scratch("outputs-attention-options");
    let llama = fixture("llama_gqa");
    let m = llama.to_str().unwrap();
    let json = dir.join("a.json");
    let (j, png, svg) = (json.to_str().unwrap(), dir.join("b.png"), dir.join("b.svg"));
    let not_a_font = dir.join("font.ttf");
    std::fs::write(&not_a_font, "not a font").unwrap();
    let base = [
        "attention",
        "--model",
        m,
        "--input-ids",
        "5,6,7",
        "--json",
        j,
    ];
    let cases: [(&[&str], &str); 5] = [
        (
            &["--out", png.to_str().unwrap(), "--font", "/missing.ttf"],
            "--font /missing.ttf",
        ),
        (
            &[
                "--out",
                png.to_str().unwrap(),
                "--font",
                not_a_font.to_str().unwrap(),
            ],
            "not a TrueType or OpenType font",
        ),
        (
            &[
                "--out",
                svg.to_str().unwrap(),
                "--font",
                not_a_font.to_str().unwrap(),
            ],
            "fonts are for a .png --out only",
        ),
        (
            &["--out", png.to_str().unwrap(), "--head", "9"],
            "--head 9 is out of range",
        ),
        (&["--layer", "5"], "--layer 5 is out of range"),
    ];
    for (extra, expected) in cases {
        let args: Vec<&str> = base.iter().chain(extra).copied().collect();
        fails(&args, expected);
        assert_eq!(entries(&dir), ["font.ttf"], "{args:?} wrote an output");
    }
    // and with good options both are written
    let args: Vec<&str> = base
        .iter()
        .copied()
        .chain(["--out", png.to_str().unwrap()])
        .collect();
    let out = timed(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(json.is_file() && png.is_file());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn forward_checks_its_output_before_it_runs() {
    let dir = scratch("outputs-forward");
    let gpt2 = fixture("gpt2");
    let output = dir.join("missing").join("logits.safetensors");
    fails(
        &[
            "forward",
            "--model",
            gpt2.to_str().unwrap(),
            "--input",
            gpt2.join("reference.safetensors").to_str().unwrap(),
            "--output",
            output.to_str().unwrap(),
        ],
        "does not exist",
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
