//! `qkv serve` end to end, over HTTP on 127.0.0.1: completions and chat equal `qkv
//! generate`, streamed chunks join to the whole, concurrent requests are batched and
//! each still equals its own run, every bad request gets OpenAI's error shape with the
//! right status while the server keeps serving, a client that goes away frees its
//! sequence, a full queue answers 503, SIGTERM drains (a stream finishes while /health
//! and new work answer 503) and exits 0, embeddings equal `qkv embed`, reranking and
//! classification equal `qkv classify`, and the folder written as GGUF serves as well.
//!
//! The model: a tiny random Llama (`qkv bench llama --save`) with the Qwen2 byte-level
//! test tokenizer and Qwen2.5's chat template.

mod access;
mod deploy;
mod http;
mod load;
mod prefix;
mod replicas;
mod structured;
mod surface;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use http::{read_reply, read_reply_after, Server};
use serde_json::{json, Value};

fn qkv(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_qkv"))
        .args(args)
        .output()
        .expect("the qkv binary runs");
    assert!(
        out.status.success(),
        "qkv {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The served folder, made once per test run.
fn model() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("qkv-serve-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let d = dir.to_str().unwrap();
        qkv(&[
            "bench",
            "llama",
            "--save",
            d,
            "--vocab",
            "323",
            "--d-model",
            "64",
            "--layers",
            "2",
            "--heads",
            "4",
            "--kv-heads",
            "2",
            "--max-len",
            "4096",
            "--prefill",
            "4",
            "--decode",
            "1",
            "--rounds",
            "1",
            "--warmup",
            "0",
        ]);
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        std::fs::copy(
            fixtures.join("crates/qkv/tests/fixtures/tokenizers/qwen2_bytelevel/tokenizer.json"),
            dir.join("tokenizer.json"),
        )
        .unwrap();
        std::fs::copy(
            fixtures.join("tools/fixtures/chat_templates/Qwen-Qwen2.5-7B-Instruct.jinja"),
            dir.join("chat_template.jinja"),
        )
        .unwrap();
        let config = json!({"eos_token": "<|im_end|>", "bos_token": null});
        std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
        dir
    })
}

/// Asserts a 400 that names `param`.
fn refused(e: &http::Reply, param: &str) {
    assert_eq!(e.status, 400, "{}", e.body);
    assert_eq!(e.json()["error"]["param"], param, "{}", e.body);
}

fn text_of(r: &Value) -> String {
    let c = &r["choices"][0];
    c["text"]
        .as_str()
        .or_else(|| c["message"]["content"].as_str())
        .unwrap_or_else(|| panic!("no text in {r}"))
        .to_string()
}

/// The text of a stream, its finish reason, and whether it ended with `[DONE]`.
fn joined(events: &[String]) -> (String, String, bool) {
    let mut text = String::new();
    let mut finish = String::new();
    for e in events.iter().filter(|e| *e != "[DONE]") {
        let v: Value = serde_json::from_str(e).unwrap();
        let c = &v["choices"][0];
        if let Some(t) = c["text"]
            .as_str()
            .or_else(|| c["delta"]["content"].as_str())
        {
            text.push_str(t);
        }
        if let Some(f) = c["finish_reason"].as_str() {
            finish = f.to_string();
        }
    }
    (text, finish, events.last().is_some_and(|e| e == "[DONE]"))
}

#[test]
fn completions_and_chat_equal_generate_and_streams_join_to_the_whole() {
    let dir = model();
    let m = dir.to_str().unwrap();
    let s = Server::start(dir, &["--name", "tiny"]);
    assert_eq!(s.get("/health").status, 200);
    assert_eq!(s.get("/v1/models").json()["data"][0]["id"], "tiny");

    let cli = qkv(&[
        "generate",
        "--model",
        m,
        "--prompt",
        "Attention is",
        "--max-new-tokens",
        "24",
        "--greedy",
    ]);
    let ask =
        json!({"model": "tiny", "prompt": "Attention is", "max_tokens": 24, "temperature": 0});
    let r = s.post("/v1/completions", &ask);
    assert_eq!(r.status, 200, "{}", r.body);
    let whole = r.json();
    assert_eq!(text_of(&whole) + "\n", cli);
    assert_eq!(whole["choices"][0]["finish_reason"], "length");
    assert_eq!(whole["usage"]["completion_tokens"], 24);
    assert_eq!(whole["object"], "text_completion");

    let mut streamed = ask.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let r = s.post("/v1/completions", &streamed);
    assert_eq!(r.status, 200);
    assert!(r
        .header("content-type")
        .unwrap()
        .starts_with("text/event-stream"));
    let events = r.events();
    let (text, finish, done) = joined(&events);
    assert_eq!(
        (text, finish.as_str(), done),
        (text_of(&whole), "length", true)
    );
    let usage: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(usage["usage"], whole["usage"]);

    // a seeded sample equals the CLI's with the same seed
    let cli = qkv(&[
        "generate",
        "--model",
        m,
        "--prompt",
        "Attention is",
        "--max-new-tokens",
        "16",
        "--temperature",
        "0.8",
        "--top-p",
        "0.9",
        "--seed",
        "7",
    ]);
    let sampled = json!({"model": "tiny", "prompt": "Attention is", "max_tokens": 16,
        "temperature": 0.8, "top_p": 0.9, "seed": 7});
    assert_eq!(
        text_of(&s.post("/v1/completions", &sampled).json()) + "\n",
        cli
    );

    // chat: the folder's template, as `qkv generate --system --user`
    let cli = qkv(&[
        "generate",
        "--model",
        m,
        "--system",
        "Be brief.",
        "--user",
        "What is attention?",
        "--max-new-tokens",
        "20",
        "--greedy",
    ]);
    let chat = json!({"model": "tiny", "max_tokens": 20, "temperature": 0, "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "What is attention?"}]},
    ]});
    let r = s.post("/v1/chat/completions", &chat).json();
    assert_eq!(r["object"], "chat.completion");
    assert_eq!(r["choices"][0]["message"]["role"], "assistant");
    assert_eq!(text_of(&r) + "\n", cli);
    let mut streamed = chat.clone();
    streamed["stream"] = json!(true);
    let events = s.post("/v1/chat/completions", &streamed).events();
    let first: Value = serde_json::from_str(&events[0]).unwrap();
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(joined(&events).0, text_of(&r));

    // a stop string ends the text before it, streamed or not
    let full = text_of(&whole);
    let cut = full.char_indices().nth(6).map_or(full.len(), |(i, _)| i);
    let stop: String = full[cut..].chars().take(2).collect();
    let want = &full[..full.find(&stop).unwrap()];
    let mut stopped = ask.clone();
    stopped["stop"] = json!([stop]);
    let r = s.post("/v1/completions", &stopped).json();
    assert_eq!(
        (
            text_of(&r).as_str(),
            r["choices"][0]["finish_reason"].as_str()
        ),
        (want, Some("stop"))
    );
    stopped["stream"] = json!(true);
    let (text, finish, _) = joined(&s.post("/v1/completions", &stopped).events());
    assert_eq!((text.as_str(), finish.as_str()), (want, "stop"));

    // token ids as the prompt, and /tokenize
    let ids = s
        .post("/tokenize", &json!({"content": "Attention is"}))
        .json()["tokens"]
        .clone();
    let mut by_ids = ask.clone();
    by_ids["prompt"] = ids;
    assert_eq!(text_of(&s.post("/v1/completions", &by_ids).json()), full);

    let metrics = s.get("/metrics").body;
    assert!(
        metrics.contains("qkv_requests_total{endpoint=\"/v1/completions\",status=\"200\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("qkv_time_to_first_token_seconds_count"),
        "{metrics}"
    );
}

/// The served folder written as a GGUF file by `qkv convert` (Q8_0 weights, the
/// tokenizer and chat template in its metadata) serves as `qkv generate` runs it.
#[test]
fn a_gguf_file_serves_completions_and_chat_as_generate_runs_them() {
    let file = std::env::temp_dir().join(format!("qkv-serve-{}.gguf", std::process::id()));
    let f = file.to_str().unwrap();
    qkv(&[
        "convert",
        model().to_str().unwrap(),
        "--to",
        f,
        "--dtype",
        "q8_0",
    ]);
    let s = Server::start(&file, &["--name", "tiny"]);
    let cli = qkv(&[
        "generate",
        "--model",
        f,
        "--prompt",
        "Attention is",
        "--max-new-tokens",
        "12",
        "--greedy",
    ]);
    let ask =
        json!({"model": "tiny", "prompt": "Attention is", "max_tokens": 12, "temperature": 0});
    assert_eq!(text_of(&s.post("/v1/completions", &ask).json()) + "\n", cli);
    let cli = qkv(&[
        "generate",
        "--model",
        f,
        "--user",
        "What is attention?",
        "--max-new-tokens",
        "10",
        "--greedy",
    ]);
    let chat = json!({"model": "tiny", "max_tokens": 10, "temperature": 0, "messages": [
        {"role": "user", "content": "What is attention?"},
    ]});
    assert_eq!(
        text_of(&s.post("/v1/chat/completions", &chat).json()) + "\n",
        cli
    );
    drop(s);
    std::fs::remove_file(&file).unwrap();
}

#[test]
fn attention_maps_on_request_equal_qkv_attention() {
    let dir = model();
    let s = Server::start(dir, &[]);
    let name = s.name();
    let ask = json!({"model": name, "prompt": "Attention is", "max_tokens": 5, "temperature": 0,
                     "qkv": {"attentions": true, "viewer": true}});
    let r = s.post("/v1/completions", &ask).json();
    let maps = &r["qkv"]["attentions"];
    // the prompt's tokens and the generated ones, as `qkv attention` labels them
    let prompt = s
        .post("/tokenize", &json!({"content": "Attention is"}))
        .json()["tokens"]
        .clone();
    let n = prompt.as_array().unwrap().len() + 5;
    assert_eq!(
        maps["tokens"].as_array().unwrap().len(),
        n,
        "{}",
        maps["tokens"]
    );
    let ids: Vec<String> = maps["token_details"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].to_string())
        .collect();
    let out = std::env::temp_dir().join(format!("qkv-serve-maps-{}.json", std::process::id()));
    qkv(&[
        "attention",
        "--model",
        dir.to_str().unwrap(),
        "--input-ids",
        &ids.join(","),
        "--json",
        out.to_str().unwrap(),
    ]);
    let want: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    std::fs::remove_file(&out).unwrap();
    assert_eq!(maps["tokens"], want["tokens"]);
    assert_eq!(maps["layers"].as_array().unwrap().len(), 2);
    for (got, want) in maps["layers"]
        .as_array()
        .unwrap()
        .iter()
        .zip(want["layers"].as_array().unwrap())
    {
        assert_eq!(
            (&got["kind"], &got["layer"], &got["heads"]),
            (&want["kind"], &want["layer"], &want["heads"])
        );
        let flat = |v: &Value| -> Vec<f64> {
            v.as_array()
                .unwrap()
                .iter()
                .flat_map(|h| h.as_array().unwrap())
                .flat_map(|r| r.as_array().unwrap())
                .map(|x| x.as_f64().unwrap())
                .collect()
        };
        let (g, w) = (flat(&got["weights"]), flat(&want["weights"]));
        assert_eq!(g.len(), w.len());
        assert!(g.iter().zip(&w).all(|(a, b)| (a - b).abs() < 1e-6));
    }
    assert!(r["qkv"]["viewer"]
        .as_str()
        .unwrap()
        .starts_with("<!DOCTYPE html>"));
    // streamed, or too many tokens to map: refused, naming the field
    let mut streamed = ask.clone();
    streamed["stream"] = json!(true);
    let e = s.post("/v1/completions", &streamed);
    refused(&e, "qkv.attentions");
    let mut long = ask.clone();
    long["max_tokens"] = json!(1000);
    long["prompt"] = json!("x ".repeat(3000));
    let e = s.post("/v1/completions", &long);
    refused(&e, "qkv.attentions");
    let mut unknown = ask.clone();
    unknown["qkv"] = json!({"rollout": true});
    assert_eq!(s.post("/v1/completions", &unknown).status, 400);
}

#[test]
fn a_default_length_is_cut_to_the_positions_and_an_asked_one_is_refused() {
    // GPT-2's learned positions (the fixture has 64): no tokenizer, so ids in, no text out
    let gpt2 = Path::new(env!("CARGO_MANIFEST_DIR")).join("../qkv/tests/fixtures/models/gpt2");
    let s = Server::start(&gpt2, &["--name", "gpt2"]);
    let near_the_end = json!({"model": "gpt2", "prompt": vec![7; 58], "temperature": 0});
    let r = s.post("/v1/completions", &near_the_end).json();
    let (prompt, made) = (
        &r["usage"]["prompt_tokens"],
        r["usage"]["completion_tokens"].as_u64().unwrap(),
    );
    assert_eq!(prompt, 58);
    // 6 fit, fewer when it ends first
    let finish = r["choices"][0]["finish_reason"].as_str().unwrap();
    assert!(made <= 6 && (finish == "length") == (made == 6), "{r}");
    let mut asked = near_the_end.clone();
    asked["max_tokens"] = json!(16);
    let e = s.post("/v1/completions", &asked);
    refused(&e, "max_tokens");
    let mut text = near_the_end.clone();
    text["prompt"] = json!("words");
    let e = s.post("/v1/completions", &text);
    refused(&e, "prompt");
}

#[test]
fn concurrent_requests_are_batched_and_each_equals_its_own_run() {
    let s = Server::start(model(), &["--max-batch", "8"]);
    let name = s.name();
    let asks: Vec<Value> = (0..8)
        .map(|i| {
            json!({"model": name, "prompt": format!("prompt number {i} {}", "x".repeat(i * 7)),
                   "max_tokens": 20 + 9 * i, "temperature": 0})
        })
        .collect();
    let alone: Vec<String> = asks
        .iter()
        .map(|a| text_of(&s.post("/v1/completions", a).json()))
        .collect();
    let together: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = asks
            .iter()
            .map(|a| scope.spawn(|| text_of(&s.post("/v1/completions", a).json())))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(together, alone);
    // some step ran more than one sequence
    let metrics = s.get("/metrics").body;
    let value = |name: &str| -> f64 {
        let line = metrics.lines().find(|l| l.starts_with(name)).unwrap();
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    let (sum, count) = (value("qkv_batch_size_sum"), value("qkv_batch_size_count"));
    assert!(sum > count, "batch sizes: sum {sum} over {count} steps");
}

/// By default the server answers what OpenAI clients and agents send beyond what it
/// reads: fields it does not know are ignored (each name logged once, all counted in
/// /metrics), and any model name is answered; `--alias` names are listed.
#[test]
fn unknown_fields_and_other_model_names_are_answered_by_default() {
    let s = Server::start(model(), &["--alias", "gpt-4o-mini"]);
    let body = json!({
        "model": "some-hard-coded-name",
        "prompt": "hi",
        "max_tokens": 2,
        "parallel_tool_calls": true,
        "service_tier": "auto",
    });
    let r = s.post("/v1/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.json()["choices"][0]["text"]
            .as_str()
            .map(|t| !t.is_empty()),
        Some(true)
    );
    let r = s.post("/v1/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let metrics = s.get("/metrics").body;
    assert!(
        metrics.lines().any(|l| l == "qkv_ignored_fields_total 4"),
        "{metrics}"
    );
    let ids: Vec<Value> = s.get("/v1/models").json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].clone())
        .collect();
    assert_eq!(ids, [json!(s.name()), json!("gpt-4o-mini")]);
    let said = "ignoring the unknown field \"service_tier\"";
    let logged = s.log_with(said);
    assert_eq!(logged.matches(said).count(), 1, "{logged}");
}

#[test]
fn bad_requests_get_openai_errors_naming_the_field_and_the_server_keeps_serving() {
    let strict = ["--strict", "--strict-model", "--alias", "tiny-alias"];
    let s = Server::start(
        model(),
        &[&["--max-body", "4000", "--max-tokens", "100"][..], &strict].concat(),
    );
    let name = s.name();
    let check = |r: http::Reply, status: u16, param: Option<&str>, says: &str| {
        assert_eq!(r.status, status, "{}", r.body);
        let e = r.json();
        let message = e["error"]["message"]
            .as_str()
            .unwrap_or_else(|| panic!("{e}"));
        assert!(message.contains(says), "{message}");
        assert!(e["error"]["type"].is_string(), "{e}");
        if let Some(p) = param {
            assert_eq!(e["error"]["param"], p, "{e}");
        }
    };
    let raw = |body: &str| s.send("POST", "/v1/completions", Some(body.as_bytes()));
    check(raw("{bad json"), 400, None, "invalid request body");
    check(raw("[1, 2]"), 400, None, "JSON object");
    let ok = json!({"model": name, "prompt": "hi", "max_tokens": 3});
    let with = |k: &str, v: Value| {
        let mut b = ok.clone();
        b[k] = v;
        s.post("/v1/completions", &b)
    };
    check(
        with("model", json!("gpt-4")),
        404,
        Some("model"),
        "does not exist",
    );
    assert_eq!(with("model", json!("tiny-alias")).status, 200);
    check(
        with("max_tokens", json!(1_000_000)),
        400,
        Some("max_tokens"),
        "--max-tokens",
    );
    check(
        with("max_tokens", json!("many")),
        400,
        Some("max_tokens"),
        "invalid type",
    );
    check(
        with("max_tokens", json!(0)),
        400,
        Some("max_tokens"),
        "at least 1",
    );
    check(
        with("temperature", json!(-1)),
        400,
        Some("temperature"),
        "outside",
    );
    check(with("n", json!(0)), 400, Some("n"), "from 1 to 128");
    check(with("n", json!(129)), 400, Some("n"), "from 1 to 128");
    check(with("n", json!(33)), 400, Some("n"), "--max-batch");
    check(
        with("logprobs", json!(21)),
        400,
        Some("logprobs"),
        "0 to 20",
    );
    check(
        with("logprobs", json!("yes")),
        400,
        Some("logprobs"),
        "0 to 20",
    );
    check(with("top_k", json!(-5)), 400, Some("top_k"), "at least 1");
    check(with("min_p", json!(1.5)), 400, Some("min_p"), "outside");
    check(
        with("presence_penalty", json!(3)),
        400,
        Some("presence_penalty"),
        "[-2, 2]",
    );
    check(
        with("repetition_penalty", json!(0)),
        400,
        Some("repetition_penalty"),
        "above 0",
    );
    check(
        with("logit_bias", json!({"5000": 1})),
        400,
        Some("logit_bias"),
        "not a token id",
    );
    check(
        with("logit_bias", json!({"5": 101})),
        400,
        Some("logit_bias"),
        "[-100, 100]",
    );
    check(with("prompt", json!([])), 400, Some("prompt"), "0 prompts");
    check(
        with("prompt", json!(["a", ""])),
        400,
        Some("prompt[1]"),
        "no tokens",
    );
    check(
        with("stream_options", json!({"include_usage": true, "x": 1})),
        400,
        Some("stream_options.x"),
        "unrecognized",
    );
    check(
        with("frobnicate", json!(true)),
        400,
        Some("frobnicate"),
        "unrecognized",
    );
    check(
        with("prompt", json!([5000])),
        400,
        Some("prompt"),
        "outside the vocabulary",
    );
    check(with("prompt", json!("")), 400, Some("prompt"), "no tokens");
    check(
        with("stop", json!(["a", "b", "c", "d", "e"])),
        400,
        Some("stop"),
        "at most 4",
    );
    let chat = json!({"model": name, "messages": [{"role": "user"}]});
    check(s.post("/v1/chat/completions", &chat), 400, None, "content");
    check(
        s.post("/v1/embeddings", &json!({"model": name, "input": "x"})),
        404,
        None,
        "/v1/completions",
    );
    // bodies over --max-body: with a Content-Length, and chunked without one
    check(
        with("prompt", json!("x".repeat(5000))),
        413,
        None,
        "--max-body",
    );
    let mut c = s.connect();
    write!(c, "POST /v1/completions HTTP/1.1\r\nHost: q\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n").unwrap();
    for _ in 0..6 {
        let chunk = "y".repeat(1000);
        let _ = write!(c, "{:x}\r\n{chunk}\r\n", chunk.len());
    }
    let _ = write!(c, "0\r\n\r\n");
    check(read_reply(&mut c), 413, None, "--max-body");
    // other methods and routes: never a 5xx
    for (method, path) in [
        ("HEAD", "/v1/completions"),
        ("OPTIONS", "/v1/completions"),
        ("GET", "/v1/completions"),
        ("DELETE", "/health"),
        ("GET", "/nowhere"),
    ] {
        let r = s.send(method, path, None);
        assert!(
            (200..500).contains(&r.status),
            "{method} {path}: {}",
            r.status
        );
    }
    check(s.get("/nowhere"), 404, None, "no route");
    assert_eq!(s.post("/v1/completions", &ok).status, 200);
    assert_eq!(s.get("/health").status, 200);
}

/// Reads a stream's first event, then hangs up.
fn hang_up_after_first_event(s: &Server, body: &Value) {
    let mut c = s.connect();
    let b = body.to_string();
    write!(c, "POST /v1/completions HTTP/1.1\r\nHost: q\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}", b.len()).unwrap();
    let mut r = BufReader::new(c);
    let mut line = String::new();
    while !line.starts_with("data: ") {
        line.clear();
        r.read_line(&mut line).unwrap();
    }
}

fn generated(s: &Server) -> f64 {
    let m = s.get("/metrics").body;
    let line = m
        .lines()
        .find(|l| l.starts_with("qkv_generated_tokens_total "))
        .unwrap();
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

#[test]
fn a_client_that_hangs_up_frees_its_sequence_and_a_full_queue_answers_503() {
    let s = Server::start(
        model(),
        &[
            "--max-batch",
            "1",
            "--max-queue",
            "1",
            "--max-tokens",
            "4000",
        ],
    );
    let name = s.name();
    let long = json!({"model": name, "prompt": "go", "max_tokens": 4000, "temperature": 0, "stream": true});
    hang_up_after_first_event(&s, &long);
    // the sequence stops within a few steps of the hang-up
    std::thread::sleep(Duration::from_millis(500));
    let a = generated(&s);
    std::thread::sleep(Duration::from_millis(500));
    let b = generated(&s);
    assert!(
        a == b && b < 4000.0,
        "still decoding after the client left: {a} then {b} tokens"
    );

    // one long request runs, one waits, the third is refused with Retry-After
    std::thread::scope(|scope| {
        let running = scope.spawn(|| s.post("/v1/completions", &long));
        let started = Instant::now();
        while generated(&s) <= b {
            assert!(started.elapsed() < Duration::from_secs(60));
            std::thread::sleep(Duration::from_millis(5));
        }
        let queued = scope.spawn(|| {
            s.post(
                "/v1/completions",
                &json!({"model": name, "prompt": "wait", "max_tokens": 2}),
            )
        });
        std::thread::sleep(Duration::from_millis(200));
        let r = s.post(
            "/v1/completions",
            &json!({"model": name, "prompt": "no room", "max_tokens": 2}),
        );
        assert_eq!(r.status, 503, "{}", r.body);
        assert_eq!(r.header("retry-after"), Some("1"));
        assert_eq!(r.json()["error"]["type"], "overloaded_error");
        assert_eq!(running.join().unwrap().status, 200);
        assert_eq!(queued.join().unwrap().status, 200);
    });
    assert_eq!(s.get("/health").status, 200);
}

#[test]
fn sigterm_drains_a_stream_turns_new_work_away_then_exits_0() {
    let mut s = Server::start(model(), &["--grace", "60", "--max-tokens", "3000"]);
    let name = s.name();
    let body = json!({"model": name, "prompt": "go on", "max_tokens": 3000, "temperature": 0, "stream": true}).to_string();
    let mut c = s.connect();
    write!(c, "POST /v1/completions HTTP/1.1\r\nHost: q\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()).unwrap();
    let mut first = [0u8; 1];
    std::io::Read::read_exact(&mut c, &mut first).unwrap();
    s.terminate();
    // draining: the port still answers while the stream goes on, /health says 503 (a
    // router's cue) and new work is turned away to be retried elsewhere
    let started = Instant::now();
    let health = loop {
        let h = s.get("/health");
        if h.status != 200 {
            break h;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "/health still 200 after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(health.status, 503, "{}", health.body);
    assert_eq!(health.json()["status"], "draining");
    let turned = s.post(
        "/v1/completions",
        &json!({"model": name, "prompt": "late", "max_tokens": 2}),
    );
    assert_eq!(turned.status, 503, "{}", turned.body);
    assert_eq!(turned.header("retry-after"), Some("1"));
    assert_eq!(turned.header("connection"), Some("close"));
    assert_eq!(
        s.get("/metrics").status,
        200,
        "a draining replica still reports"
    );
    let r = read_reply_after(first.to_vec(), &mut c);
    let (_, finish, done) = joined(&r.events());
    assert_eq!((finish.as_str(), done), ("length", true), "{}", r.body);
    // with nothing in flight the listener closes and the process ends
    let status = s.child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    assert!(std::net::TcpStream::connect(s.addr).is_err());
}

#[test]
fn a_panic_fails_its_request_alone() {
    let s = Server::start_with(model(), &[], &[("QKV_FAULT_PROMPT", "boom")]);
    let name = s.name();
    let ok = json!({"model": name, "prompt": "fine", "max_tokens": 200, "temperature": 0});
    let want = text_of(&s.post("/v1/completions", &ok).json());
    std::thread::scope(|scope| {
        let running = scope.spawn(|| s.post("/v1/completions", &ok));
        let r = s.post(
            "/v1/completions",
            &json!({"model": name, "prompt": "boom", "max_tokens": 5}),
        );
        assert_eq!(r.status, 500, "{}", r.body);
        assert!(r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("QKV_FAULT_PROMPT"));
        assert_eq!(text_of(&running.join().unwrap().json()), want);
    });
    assert_eq!(text_of(&s.post("/v1/completions", &ok).json()), want);
}

#[test]
#[ignore = "needs all-MiniLM-L6-v2: set QKV_MINILM_DIR (tools/fetch_minilm.sh DIR), as .ci/run does"]
fn embeddings_equal_qkv_embed_for_many_clients_at_once() {
    let dir = std::env::var_os("QKV_MINILM_DIR")
        .expect("QKV_MINILM_DIR is not set (.ci/run fetches all-MiniLM-L6-v2 and sets it)");
    let dir = PathBuf::from(dir);
    let texts = [
        "attention is all you need",
        "注意力机制",
        "The animal didn't cross the street because it was too tired.",
    ];
    let cli: Vec<Vec<f32>> = serde_json::from_str(&qkv(&[
        "embed",
        "--model",
        dir.to_str().unwrap(),
        "--json",
        texts[0],
        texts[1],
        texts[2],
    ]))
    .unwrap();
    let s = Server::start(&dir, &["--name", "minilm"]);
    let close = |got: &Value, want: &[f32]| {
        let got: Vec<f32> = serde_json::from_value(got.clone()).unwrap();
        assert_eq!(got.len(), want.len());
        let diff = got
            .iter()
            .zip(want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(diff < 1e-5, "max difference {diff}");
    };
    let r = s
        .post(
            "/v1/embeddings",
            &json!({"model": "minilm", "input": texts}),
        )
        .json();
    assert_eq!(r["object"], "list");
    for (i, want) in cli.iter().enumerate() {
        assert_eq!(r["data"][i]["index"], i);
        close(&r["data"][i]["embedding"], want);
    }
    // base64: little-endian f32s, as OpenAI's Python client asks for them
    let b = s
        .post(
            "/v1/embeddings",
            &json!({"model": "minilm", "input": texts[1], "encoding_format": "base64"}),
        )
        .json();
    let bytes = base64_decode(b["data"][0]["embedding"].as_str().unwrap());
    let floats: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    close(&json!(floats), &cli[1]);
    // 24 clients with one sentence each, batched across clients
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..24)
            .map(|i| {
                let s = &s;
                scope.spawn(move || {
                    s.post(
                        "/v1/embeddings",
                        &json!({"model": "minilm", "input": texts[i % 3]}),
                    )
                    .json()
                })
            })
            .collect();
        for (i, h) in handles.into_iter().enumerate() {
            close(&h.join().unwrap()["data"][0]["embedding"], &cli[i % 3]);
        }
    });
    assert_eq!(
        s.post(
            "/v1/completions",
            &json!({"model": "minilm", "prompt": "x"})
        )
        .status,
        404
    );
    let t = s.post("/tokenize", &json!({"content": "attention"})).json();
    assert_eq!(t["tokens"], json!([101, 3086, 102]));
}

fn base64_decode(s: &str) -> Vec<u8> {
    let table = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u32, 0);
    for c in s.bytes().filter(|&c| c != b'=') {
        acc = (acc << 6) | table.iter().position(|&t| t == c).unwrap() as u32;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}

/// A classification fixture folder (`tools/fixtures/gen_classify.py`).
fn classify_fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../qkv/tests/fixtures/classify")
        .join(name)
}

#[test]
fn rerank_and_classify_equal_qkv_classify_and_bad_requests_get_4xx() {
    let dir = classify_fixture("bert_reranker");
    let query = "the animal was too tired";
    let docs = [
        "a cat sat on the mat",
        "The animal didn't cross the street because it was too tired.",
        "queries, keys and values",
    ];
    // qkv classify on each (query, document) pair: one logit, its sigmoid the score
    let mut args = vec!["classify", "--model", dir.to_str().unwrap(), "--json"];
    for d in docs {
        args.extend(["--text", query, "--pair", d]);
    }
    let cli: Value = serde_json::from_str(&qkv(&args)).unwrap();
    let cli_score = |i: usize| cli[i][0]["score"].as_f64().unwrap();
    // strict, so that an unknown field and another model's name are refused
    let s = Server::start(&dir, &["--name", "ce", "--strict", "--strict-model"]);
    // the start line lists what this model answers
    assert!(
        s.endpoints
            .contains("POST /v1/classify, POST /v1/rerank, POST /tokenize")
            && !s.endpoints.contains("completions"),
        "{}",
        s.endpoints
    );
    let r = s
        .post(
            "/v1/rerank",
            &json!({"model": "ce", "query": query, "documents": docs, "return_documents": true}),
        )
        .json();
    let results = r["results"].as_array().unwrap();
    assert_eq!(results.len(), 3);
    let mut seen = Vec::new();
    for (k, res) in results.iter().enumerate() {
        let i = res["index"].as_u64().unwrap() as usize;
        let got = res["relevance_score"].as_f64().unwrap();
        assert!(
            (got - cli_score(i)).abs() < 1e-6,
            "document {i}: {got} vs {}",
            cli_score(i)
        );
        assert_eq!(res["document"]["text"], docs[i]);
        if k > 0 {
            let before = results[k - 1]["relevance_score"].as_f64().unwrap();
            assert!(before >= got, "results are sorted best first");
        }
        seen.push(i);
    }
    seen.sort();
    assert_eq!(seen, [0, 1, 2]);
    assert!(r["usage"]["total_tokens"].as_u64().unwrap() > 0);
    let top = s
        .post(
            "/v1/rerank",
            &json!({"model": "ce", "query": query, "documents": docs, "top_n": 1}),
        )
        .json();
    assert_eq!(top["results"].as_array().unwrap().len(), 1);
    assert_eq!(top["results"][0]["index"], results[0]["index"]);
    assert!(top["results"][0].get("document").is_none());
    let c = s
        .post(
            "/v1/classify",
            &json!({"model": "ce", "input": [[query, docs[1]]]}),
        )
        .json();
    assert_eq!(c["data"][0]["labels"][0]["label"], "LABEL_0");
    let got = c["data"][0]["labels"][0]["score"].as_f64().unwrap();
    assert!((got - cli_score(1)).abs() < 1e-6);
    // bad requests: 4xx naming the field, and the server goes on
    for (body, status, param) in [
        (
            json!({"model": "ce", "query": query, "documents": []}),
            400,
            "documents",
        ),
        (
            json!({"model": "ce", "query": query, "documents": docs, "top_n": 0}),
            400,
            "top_n",
        ),
        (
            json!({"model": "ce", "query": query, "documents": docs, "rank": 1}),
            400,
            "",
        ),
        (
            json!({"model": "ce", "query": 3, "documents": docs}),
            400,
            "query",
        ),
        (
            json!({"model": "other", "query": query, "documents": docs}),
            404,
            "model",
        ),
    ] {
        let e = s.post("/v1/rerank", &body);
        assert_eq!(e.status, status, "{body}: {}", e.json());
        if !param.is_empty() {
            assert_eq!(e.json()["error"]["param"], param, "{body}");
        }
    }
    assert_eq!(
        s.post("/v1/embeddings", &json!({"model": "ce", "input": "x"}))
            .status,
        404
    );
    let again = s
        .post(
            "/v1/rerank",
            &json!({"model": "ce", "query": query, "documents": [docs[1]]}),
        )
        .json();
    let got = again["results"][0]["relevance_score"].as_f64().unwrap();
    assert!((got - cli_score(1)).abs() < 1e-6);
    // a classifier of two labels classifies, and is no reranker
    let two = Server::start(&classify_fixture("distilbert_sst"), &["--name", "sst"]);
    let r = two.post(
        "/v1/rerank",
        &json!({"model": "sst", "query": query, "documents": docs}),
    );
    assert_eq!(r.status, 404, "{}", r.json());
    let c = two
        .post(
            "/v1/classify",
            &json!({"model": "sst", "input": "a cat sat"}),
        )
        .json();
    let labels = c["data"][0]["labels"].as_array().unwrap();
    let total: f64 = labels.iter().map(|l| l["score"].as_f64().unwrap()).sum();
    assert!((total - 1.0).abs() < 1e-5, "softmax scores sum to 1");
}

/// The served folder with `template` as its `chat_template.jinja`, for one test.
fn with_template(tag: &str, template: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("qkv-serve-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for entry in std::fs::read_dir(model()).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.join(path.file_name().unwrap())).unwrap();
    }
    std::fs::write(dir.join("chat_template.jinja"), template).unwrap();
    dir
}

/// Hardening round 3: a template that loops without end or writes gigabytes is one 400
/// naming the template while `/health` keeps answering; texts, message lists, content
/// parts and fields of the wrong kind are refused before any work, naming the field.
#[test]
fn hostile_templates_and_sizes_get_400s_naming_the_field_and_the_server_keeps_answering() {
    let chat = |s: &Server, messages: Value| {
        s.post(
            "/v1/chat/completions",
            &json!({"model": s.name(), "messages": messages, "max_tokens": 2}),
        )
    };
    let hi = json!([{"role": "user", "content": "hi"}]);
    for (tag, template, says) in [
        (
            "loops",
            "{% for a in range(100000) %}{% for b in range(100000) %}{% for c in range(100000) %}x{% endfor %}{% endfor %}{% endfor %}",
            "steps of rendering",
        ),
        (
            "huge",
            "{% for i in range(100) %}{{ 'x' * 100000000 }}{% endfor %}",
            "passed 16 MiB",
        ),
        (
            // a string doubled 40 times (a terabyte) in a few hundred steps: only the
            // worker's memory limit stops it
            "doubling",
            "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
            "MiB of memory while rendering",
        ),
    ] {
        let dir = with_template(tag, template);
        let s = Server::start(&dir, &[]);
        assert!(
            s.endpoints
                .starts_with("qkv serve: POST /v1/completions, POST /v1/chat/completions,"),
            "{}",
            s.endpoints
        );
        let addr = s.addr;
        let name = s.name();
        let started = Instant::now();
        let request = std::thread::spawn(move || {
            let mut c = std::net::TcpStream::connect(addr).unwrap();
            let body = json!({"model": name, "messages": [{"role": "user", "content": "hi"}]});
            let body = body.to_string();
            write!(
                c,
                "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
            .unwrap();
            read_reply(&mut c)
        });
        // the render runs off the HTTP thread: the server answers meanwhile
        assert_eq!(s.get("/health").status, 200, "{tag}");
        let r = request.join().unwrap();
        refused(&r, "messages");
        let message = r.json()["error"]["message"].as_str().unwrap().to_string();
        assert!(
            message.contains("chat_template.jinja (chat template)") && message.contains(says),
            "{tag}: {message}"
        );
        assert!(started.elapsed() < Duration::from_secs(60), "{tag}");
        assert_eq!(s.get("/health").status, 200, "{tag}");
        drop(s);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    let s = Server::start(model(), &["--max-prompt", "1000"]);
    // 32 bytes a token of --max-prompt: 32 000 bytes at most, refused before tokenizing
    let long = "the animal was tired ".repeat(2000);
    let r = s.post("/tokenize", &json!({"content": long}));
    refused(&r, "content");
    assert!(r.body.contains("--max-prompt 1000"), "{}", r.body);
    let r = s.post(
        "/v1/completions",
        &json!({"model": s.name(), "prompt": long, "max_tokens": 2}),
    );
    refused(&r, "prompt");
    let many: Vec<Value> = (0..5000)
        .map(|_| json!({"role": "user", "content": "a"}))
        .collect();
    let r = chat(&s, json!(many));
    refused(&r, "messages");
    assert!(r.body.contains("5000 messages"), "{}", r.body);
    let r = chat(
        &s,
        json!([{"role": "user", "content": [{"type": "image_url", "text": "x"}]}]),
    );
    refused(&r, "messages[0].content[0].type");
    // the other types' own fields (`image_url`) are no reason to hide what is wrong
    let r = chat(
        &s,
        json!([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
    );
    refused(&r, "messages[0].content[0].type");
    assert!(
        r.body.contains("`image_url`: qkv reads text parts only"),
        "{}",
        r.body
    );
    let r = chat(&s, json!([{"role": "user", "content": [{"type": "text"}]}]));
    refused(&r, "messages[0].content[0].text");
    let r = chat(&s, json!([{"role": "user", "content": null}]));
    refused(&r, "messages[0].content");
    assert!(
        r.body
            .contains("null is neither a string nor a list of content parts"),
        "{}",
        r.body
    );
    let ok = json!({"model": s.name(), "messages": hi, "max_tokens": 2});
    let with = |k: &str, v: Value| {
        let mut b = ok.clone();
        b[k] = v;
        s.post("/v1/chat/completions", &b)
    };
    refused(
        &with("stream_options", json!({"include_usage": true})),
        "stream_options",
    );
    refused(&with("user", json!(5)), "user");
    // and it keeps serving
    let r = with("user", json!("someone"));
    assert_eq!(r.status, 200, "{}", r.body);
}

/// The README's tour: `qkv serve --model examples/tiny-chat` answers a chat request as
/// `qkv generate --user` does.
#[test]
fn the_example_model_answers_chat_as_generate_does() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/tiny-chat");
    let question = "why scale the scores?";
    let cli = qkv(&[
        "generate",
        "--model",
        dir.to_str().unwrap(),
        "--user",
        question,
    ]);
    let s = Server::start(&dir, &[]);
    assert_eq!(s.name(), "tiny-chat");
    let body = json!({"model": "tiny-chat", "messages": [{"role": "user", "content": question}]});
    let r = s.post("/v1/chat/completions", &body).json();
    let content = r["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(
        content.starts_with("it keeps the scores small"),
        "{content}"
    );
    assert_eq!(format!("{content}\n"), cli);
    assert_eq!(r["choices"][0]["finish_reason"], "stop");
}

/// Every `qkv serve` option says what it is, `--port` and `--threads` too.
#[test]
fn serve_help_describes_every_option() {
    let help = qkv(&["serve", "--help"]);
    for flag in ["--port", "--threads", "--host", "--max-prompt", "--grace"] {
        let at = help
            .find(&format!("      {flag} "))
            .unwrap_or_else(|| panic!("{flag}"));
        // the description follows on the flag's line or on the next one
        let rest: Vec<&str> = help[at..].lines().take(2).collect();
        let described = rest[0].split_whitespace().count() > 2
            || rest
                .get(1)
                .is_some_and(|l| !l.trim_start().starts_with('-'));
        assert!(described, "{flag}: {rest:?}");
    }
    assert!(help.contains("Port to listen on") && help.contains("Worker threads"));
}
