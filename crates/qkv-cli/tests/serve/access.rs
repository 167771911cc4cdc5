//! Who may call: API keys (flag and file) as OpenAI's clients send them, `/health` and
//! `/metrics` open to probes unless protected, browser origins allowed by CORS (the
//! preflight answered without a key); and `/detokenize`.

use serde_json::json;

use super::http::Server;
use super::{model, refused};

#[test]
fn api_keys_and_cors_origins_guard_the_api() {
    let dir = std::env::temp_dir().join(format!("qkv-serve-keys-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("keys");
    std::fs::write(&file, "# the second team\n\nsk-two\n").unwrap();
    let s = Server::start(
        model(),
        &[
            "--api-key",
            "sk-one",
            "--api-key-file",
            file.to_str().unwrap(),
            "--cors-origin",
            "https://app.example",
        ],
    );
    let body = json!({"model": "m", "prompt": "hi", "max_tokens": 2}).to_string();
    let post = |headers: &[(&str, &str)]| {
        s.send_with("POST", "/v1/completions", headers, Some(body.as_bytes()))
    };
    for (headers, says) in [
        (&[][..], "no API key"),
        (
            &[("Authorization", "Bearer sk-three")][..],
            "incorrect API key",
        ),
        (&[("Authorization", "sk-one")][..], "no API key"),
    ] {
        let r = post(headers);
        assert_eq!(r.status, 401, "{headers:?}: {}", r.body);
        assert_eq!(r.json()["error"]["code"], "invalid_api_key");
        assert!(r.body.contains(says), "{}", r.body);
        assert_eq!(r.header("www-authenticate"), Some("Bearer"));
    }
    for key in ["Bearer sk-one", "Bearer sk-two"] {
        assert_eq!(post(&[("Authorization", key)]).status, 200, "{key}");
    }
    assert_eq!(s.get("/health").status, 200);
    assert_eq!(s.get("/metrics").status, 200);
    assert_eq!(s.get("/v1/models").status, 401);

    // a browser's preflight needs no key, and the allowed origin is named back
    let pre = s.send_with(
        "OPTIONS",
        "/v1/chat/completions",
        &[
            ("Origin", "https://app.example"),
            ("Access-Control-Request-Method", "POST"),
            (
                "Access-Control-Request-Headers",
                "authorization,content-type",
            ),
        ],
        None,
    );
    assert!((200..300).contains(&pre.status), "{}", pre.status);
    assert_eq!(
        pre.header("access-control-allow-origin"),
        Some("https://app.example")
    );
    let allowed = pre
        .header("access-control-allow-headers")
        .unwrap_or_default();
    assert!(allowed.contains("authorization"), "{allowed}");
    let r = post(&[
        ("Authorization", "Bearer sk-one"),
        ("Origin", "https://app.example"),
    ]);
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://app.example")
    );
    let elsewhere = post(&[
        ("Authorization", "Bearer sk-one"),
        ("Origin", "https://other.example"),
    ]);
    assert_eq!(elsewhere.header("access-control-allow-origin"), None);
    // a 401 carries the header too, so that the page can read why
    let r = post(&[("Origin", "https://app.example")]);
    assert_eq!(r.status, 401);
    assert!(r.header("access-control-allow-origin").is_some());
    drop(s);

    let s = Server::start(model(), &["--api-key", "k", "--protect-health-metrics"]);
    assert_eq!(s.get("/health").status, 401);
    assert_eq!(s.get("/metrics").status, 401);
    let r = s.send_with("GET", "/health", &[("Authorization", "Bearer k")], None);
    assert_eq!(r.status, 200);
    drop(s);
    std::fs::write(&file, "# nothing\n").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_qkv"))
        .args(["serve", "--model", model().to_str().unwrap(), "--port", "0"])
        .args(["--api-key-file", file.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--api-key-file") && err.contains("no key"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn detokenize_gives_back_the_text_of_tokenize() {
    let s = Server::start(model(), &[]);
    let text = "Attention, 注意力!";
    let ids = s
        .post("/tokenize", &json!({"content": text, "add_special": false}))
        .json()["tokens"]
        .clone();
    let r = s.post("/detokenize", &json!({"tokens": ids}));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["content"], text);
    refused(&s.post("/detokenize", &json!({"tokens": [5000]})), "tokens");
    refused(&s.post("/detokenize", &json!({"tokens": "x"})), "tokens");
}
