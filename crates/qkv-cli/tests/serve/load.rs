//! `qkv bench load`, the load generator the serving benchmark drives: streamed answers'
//! text events are timed and their text kept (equal to the answer alone), whole answers
//! count once, and a request the server refuses stops it with the status and the field.

use std::process::Command;

use serde_json::{json, Value};

use super::http::Server;
use super::{model, text_of};

fn load(s: &Server, asks: &[Value], clients: &str) -> std::process::Output {
    let file =
        std::env::temp_dir().join(format!("qkv-load-{}-{clients}.jsonl", std::process::id()));
    let lines: Vec<String> = asks.iter().map(Value::to_string).collect();
    std::fs::write(&file, lines.join("\n")).unwrap();
    let url = format!("http://{}", s.addr);
    let out = Command::new(env!("CARGO_BIN_EXE_qkv"))
        .args(["bench", "load", "--url", &url, "--requests"])
        .arg(&file)
        .args(["--clients", clients, "--each"])
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&file);
    out
}

#[test]
fn the_load_generator_times_streams_and_keeps_their_text() {
    let s = Server::start(model(), &[]);
    let body = |p: &str, stream: bool| json!({"model": "m", "prompt": p, "max_tokens": 10, "temperature": 0, "stream": stream});
    let asks = vec![
        json!({"path": "/v1/completions", "body": body("Attention is", true)}),
        json!({"path": "/v1/completions", "body": body("Queries and keys", true)}),
        json!({"path": "/v1/completions", "body": body("Values", false)}),
    ];
    let out = load(&s, &asks, "2");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["requests"], 3);
    let each = r["each"].as_array().unwrap();
    for (i, p) in ["Attention is", "Queries and keys"].iter().enumerate() {
        let alone = text_of(&s.post("/v1/completions", &body(p, false)).json());
        assert_eq!(each[i]["text"], alone.as_str());
        assert!(each[i]["events"].as_u64().unwrap() >= 1);
    }
    assert_eq!(each[2]["events"], 1);
    let events: u64 = each.iter().map(|e| e["events"].as_u64().unwrap()).sum();
    assert_eq!(r["events"], events);
    assert!(r["itl_ms_p99"].as_f64().unwrap() >= r["itl_ms_p50"].as_f64().unwrap());

    let bad = vec![
        json!({"path": "/v1/completions", "body": {"model": "m", "prompt": "x", "max_tokens": -1}}),
    ];
    let out = load(&s, &bad, "1");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("status 400") && err.contains("max_tokens"),
        "{err}"
    );
}
