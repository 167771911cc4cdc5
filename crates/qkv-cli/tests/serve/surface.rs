//! What OpenAI clients ask beyond a prompt: log-probabilities (equal to the log-softmax
//! of `qkv forward`'s logits), `echo`, `n` choices and several prompts (each choice as
//! its own request with the seed plus its index), the sampling knobs (top-k, min-p,
//! penalties, logit biases), and nested fields a client adds.

use std::path::Path;

use serde_json::{json, Value};

use super::http::Server;
use super::{joined, model, qkv, text_of};

fn ids(v: &Value) -> Vec<usize> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as usize)
        .collect()
}

/// Log-softmax of `qkv forward`'s logits `[1, T, V]` for `ids`: row t scores token t+1.
fn forward_logprobs(dir: &Path, ids: &[usize]) -> Vec<Vec<f64>> {
    let scratch = std::env::temp_dir().join(format!("qkv-serve-lp-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    let (input, output) = (
        scratch.join("in.safetensors"),
        scratch.join("out.safetensors"),
    );
    // a safetensors file of one int64 tensor: header length, JSON header, the values
    let header = json!({"input_ids": {"dtype": "I64", "shape": [1, ids.len()],
                                      "data_offsets": [0, 8 * ids.len()]}})
    .to_string();
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend(header.as_bytes());
    bytes.extend(ids.iter().flat_map(|&i| (i as i64).to_le_bytes()));
    std::fs::write(&input, bytes).unwrap();
    qkv(&[
        "forward",
        "--model",
        dir.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
        "--output",
        output.to_str().unwrap(),
    ]);
    let logits = qkv::io::TensorFile::open(&output)
        .unwrap()
        .tensor("logits")
        .unwrap();
    std::fs::remove_dir_all(&scratch).unwrap();
    let v = logits.shape()[2];
    logits
        .data()
        .chunks_exact(v)
        .map(|row| {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
            let lse = max
                + row
                    .iter()
                    .map(|&l| (l as f64 - max).exp())
                    .sum::<f64>()
                    .ln();
            row.iter().map(|&l| l as f64 - lse).collect()
        })
        .collect()
}

fn close(a: &Value, b: f64, what: &str) {
    let a = a.as_f64().unwrap_or_else(|| panic!("{what}: {a}"));
    assert!((a - b).abs() < 1e-4, "{what}: {a} against {b}");
}

#[test]
fn logprobs_equal_the_log_softmax_of_qkv_forward() {
    let dir = model();
    let m = dir.to_str().unwrap();
    let s = Server::start(dir, &[]);
    let prompt = "Attention is";
    let prompt_ids = ids(&s.post("/tokenize", &json!({"content": prompt})).json()["tokens"]);
    let new: Vec<usize> = serde_json::from_str(&qkv(&[
        "generate",
        "--model",
        m,
        "--prompt",
        prompt,
        "--max-new-tokens",
        "6",
        "--greedy",
        "--json",
    ]))
    .unwrap();
    let all: Vec<usize> = prompt_ids.iter().chain(&new).copied().collect();
    let want = forward_logprobs(dir, &all);

    // completions: the prompt's (echo) and the new tokens', with 5 alternatives
    let ask = json!({"model": "m", "prompt": prompt, "max_tokens": 6, "temperature": 0,
                     "logprobs": 5, "echo": true});
    let r = s.post("/v1/completions", &ask);
    assert_eq!(r.status, 200, "{}", r.body);
    let c = &r.json()["choices"][0];
    assert!(c["text"].as_str().unwrap().starts_with(prompt), "{c}");
    let lp = &c["logprobs"];
    let scored = lp["token_logprobs"].as_array().unwrap();
    assert_eq!(scored.len(), all.len(), "{lp}");
    assert!(
        scored[0].is_null() && lp["top_logprobs"][0].is_null(),
        "{lp}"
    );
    for t in 1..all.len() {
        close(&scored[t], want[t - 1][all[t]], &format!("token {t}"));
        // the alternatives: the five likeliest and the chosen one, by their text (two
        // byte tokens that are parts of characters both read "�", as in OpenAI's)
        let top = lp["top_logprobs"][t].as_object().unwrap();
        assert!((1..=6).contains(&top.len()), "{top:?}");
        let mut best: Vec<f64> = want[t - 1].clone();
        best.sort_by(|a, b| b.total_cmp(a));
        let mut got: Vec<f64> = top.values().map(|v| v.as_f64().unwrap()).collect();
        got.sort_by(|a, b| b.total_cmp(a));
        close(&json!(got[0]), best[0], &format!("token {t}'s likeliest"));
    }
    let offsets = ids(&lp["text_offset"]);
    assert_eq!(offsets[0], 0);
    assert!(offsets.windows(2).all(|w| w[0] <= w[1]), "{offsets:?}");

    // streamed: the same log-probabilities, chunk by chunk
    let mut streamed = ask.clone();
    streamed["stream"] = json!(true);
    let mut got = Vec::new();
    for e in s.post("/v1/completions", &streamed).events() {
        if e != "[DONE]" {
            let v: Value = serde_json::from_str(&e).unwrap();
            if let Some(l) = v["choices"][0]["logprobs"]["token_logprobs"].as_array() {
                got.extend(l.iter().cloned());
            }
        }
    }
    assert_eq!(&got, scored);

    // chat: each token's, and the three likeliest, best first; the bytes spell the text
    let chat = json!({"model": "m", "max_tokens": 5, "temperature": 0, "logprobs": true,
                      "top_logprobs": 3, "messages": [{"role": "user", "content": "Hi"}]});
    let r = s.post("/v1/chat/completions", &chat).json();
    let c = &r["choices"][0];
    let content = c["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), 5, "{c}");
    let mut bytes = Vec::new();
    for e in content {
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3, "{e}");
        assert!(top
            .windows(2)
            .all(|w| w[0]["logprob"].as_f64() >= w[1]["logprob"].as_f64()));
        // greedy: the chosen token is the likeliest
        assert_eq!(e["logprob"], top[0]["logprob"], "{e}");
        bytes.extend(ids(&e["bytes"]).into_iter().map(|b| b as u8));
    }
    assert_eq!(
        String::from_utf8_lossy(&bytes),
        c["message"]["content"].as_str().unwrap()
    );

    // echo with no new token scores the prompt alone
    let score =
        json!({"model": "m", "prompt": prompt, "max_tokens": 0, "echo": true, "logprobs": 0});
    let r = s.post("/v1/completions", &score).json();
    assert_eq!(r["choices"][0]["text"], prompt, "{r}");
    assert_eq!(r["usage"]["completion_tokens"], 0);
    let scored = r["choices"][0]["logprobs"]["token_logprobs"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(scored.len(), prompt_ids.len());
    for t in 1..prompt_ids.len() {
        close(
            &scored[t],
            want[t - 1][all[t]],
            &format!("prompt token {t}"),
        );
    }
}

/// `n` choices: the prompt prefilled once, choice i drawn as a request of its own with
/// seed + i; several prompts number their choices prompt by prompt; streamed chunks
/// carry each choice's index.
#[test]
fn n_choices_and_several_prompts_each_equal_their_own_request() {
    let s = Server::start(model(), &[]);
    let one = |prompt: &str, seed: u64| {
        let ask = json!({"model": "m", "prompt": prompt, "max_tokens": 12, "temperature": 0.9,
                         "seed": seed});
        text_of(&s.post("/v1/completions", &ask).json())
    };
    let ask = json!({"model": "m", "prompt": ["Attention is", "Keys and"], "max_tokens": 12,
                     "temperature": 0.9, "seed": 7, "n": 3});
    let r = s.post("/v1/completions", &ask);
    assert_eq!(r.status, 200, "{}", r.body);
    let whole = r.json();
    let choices = whole["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 6);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        let prompt = ["Attention is", "Keys and"][i / 3];
        assert_eq!(c["text"], one(prompt, 7 + (i % 3) as u64), "choice {i}");
    }
    assert_ne!(choices[0]["text"], choices[1]["text"]);
    assert_eq!(whole["usage"]["completion_tokens"], 6 * 12);

    // streamed: each index's pieces join to its whole text
    let mut streamed = ask.clone();
    streamed["stream"] = json!(true);
    let events = s.post("/v1/completions", &streamed).events();
    for (i, c) in choices.iter().enumerate() {
        let mine: Vec<String> = events
            .iter()
            .filter(|e| {
                *e == "[DONE]"
                    || serde_json::from_str::<Value>(e).unwrap()["choices"][0]["index"] == i
            })
            .cloned()
            .collect();
        let (text, finish, done) = joined(&mine);
        assert_eq!(
            (text.as_str(), finish.as_str(), done),
            (c["text"].as_str().unwrap(), "length", true)
        );
    }

    // chat: n choices, the stream opening each with the assistant's role
    let chat = json!({"model": "m", "max_tokens": 6, "temperature": 0.8, "n": 2, "stream": true,
                      "messages": [{"role": "user", "content": "Hi"}]});
    let events = s.post("/v1/chat/completions", &chat).events();
    let roles: Vec<Value> = events
        .iter()
        .filter(|e| *e != "[DONE]")
        .map(|e| serde_json::from_str::<Value>(e).unwrap())
        .filter(|v| v["choices"][0]["delta"]["role"] == "assistant")
        .map(|v| v["choices"][0]["index"].clone())
        .collect();
    assert_eq!(roles, [json!(0), json!(1)]);
}

/// top-k 1 and min-p 1 leave the likeliest token alone (greedy's choice); the
/// repetition penalty is `qkv generate --repetition-penalty`'s; a logit bias of 100
/// forces its token; presence and frequency penalties change a greedy answer.
#[test]
fn sampling_knobs_act_as_their_definitions_say() {
    let dir = model();
    let s = Server::start(dir, &[]);
    let base = json!({"model": "m", "prompt": "Attention is", "max_tokens": 16});
    let with = |extra: Value| {
        let mut b = base.clone();
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        let r = s.post("/v1/completions", &b);
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()
    };
    let greedy = text_of(&with(json!({"temperature": 0})));
    assert_eq!(
        text_of(&with(json!({"temperature": 1.5, "top_k": 1, "seed": 3}))),
        greedy
    );
    assert_eq!(
        text_of(&with(json!({"temperature": 1.5, "min_p": 1.0, "seed": 3}))),
        greedy
    );
    let cli = qkv(&[
        "generate",
        "--model",
        dir.to_str().unwrap(),
        "--prompt",
        "Attention is",
        "--max-new-tokens",
        "16",
        "--greedy",
        "--repetition-penalty",
        "1.3",
    ]);
    let penalized = text_of(&with(json!({"temperature": 0, "repetition_penalty": 1.3})));
    assert_eq!(penalized.clone() + "\n", cli);
    assert_ne!(penalized, greedy);
    // a token forced at every step: its text 16 times
    let a = s
        .post("/tokenize", &json!({"content": "a", "add_special": false}))
        .json();
    let id = a["tokens"][0].to_string();
    let forced = with(json!({"temperature": 0, "logit_bias": {id: 100}}));
    assert_eq!(text_of(&forced), "a".repeat(16));
    for knob in ["presence_penalty", "frequency_penalty"] {
        let t = text_of(&with(json!({"temperature": 0, knob: 2.0})));
        assert_ne!(t, greedy, "{knob}");
    }
}

/// Fields clients nest inside what qkv reads (`stream_options`, messages) are ignored
/// and counted like top-level ones; an assistant's turn may have no content.
#[test]
fn nested_unknown_fields_are_ignored_and_counted() {
    let s = Server::start(model(), &[]);
    let chat = json!({"model": "m", "max_tokens": 3, "stream": true,
    "stream_options": {"include_usage": true, "continuous_usage_stats": false},
    "messages": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": null, "refusal": null},
        {"role": "user", "content": "Again", "cache_control": {"type": "ephemeral"}},
    ]});
    let r = s.post("/v1/chat/completions", &chat);
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(joined(&r.events()).2);
    let metrics = s.get("/metrics").body;
    assert!(
        metrics.lines().any(|l| l == "qkv_ignored_fields_total 3"),
        "{metrics}"
    );
    assert!(s
        .log_with("messages[].cache_control")
        .contains("ignoring the unknown field \"messages[].cache_control\""));
}
