//! The prefix cache over HTTP: a chat's second turn restores its first turn's keys and
//! values (counted in `/metrics`) and answers what a server without the cache answers,
//! requests sharing a long system prompt each answer as they would alone, and `--dtype
//! auto` serves the type it names.

use serde_json::{json, Value};

use super::http::Server;
use super::{model, text_of};

fn metric(s: &Server, name: &str) -> f64 {
    let body = s.get("/metrics").body;
    let line = body
        .lines()
        .find(|l| l.starts_with(&format!("{name} ")))
        .unwrap_or_else(|| panic!("no {name} in {body}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

fn chat(s: &Server, messages: &Value) -> String {
    let body = json!({"model": s.name(), "messages": messages, "max_tokens": 24, "temperature": 0});
    let r = s.post("/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    text_of(&r.json())
}

#[test]
fn a_second_chat_turn_restores_the_first_and_answers_as_without_the_cache() {
    let cached = Server::start(model(), &[]);
    let plain = Server::start(model(), &["--cache-bytes", "0"]);
    let system = format!(
        "You are a careful assistant. {}",
        "Answer briefly. ".repeat(12)
    );
    let mut messages = json!([{"role": "system", "content": system},
                              {"role": "user", "content": "Name three colours."}]);
    let first = chat(&cached, &messages);
    assert_eq!(first, chat(&plain, &messages));
    assert_eq!(metric(&cached, "qkv_prefix_cache_hit_tokens_total"), 0.0);
    assert!(metric(&cached, "qkv_prefix_cache_blocks") > 0.0);
    let turns = messages.as_array_mut().unwrap();
    turns.push(json!({"role": "assistant", "content": first}));
    turns.push(json!({"role": "user", "content": "And three more?"}));
    let second = chat(&cached, &messages);
    assert_eq!(second, chat(&plain, &messages));
    let (hit, looked) = (
        metric(&cached, "qkv_prefix_cache_hit_tokens_total"),
        metric(&cached, "qkv_prefix_cache_lookup_tokens_total"),
    );
    // the system prompt and the first turn: whole blocks of 16 of them
    assert!(
        hit >= 48.0 && hit.rem_euclid(16.0) == 0.0,
        "{hit} of {looked}"
    );
    assert_eq!(metric(&plain, "qkv_prefix_cache_lookup_tokens_total"), 0.0);
}

#[test]
fn requests_sharing_a_system_prompt_answer_as_each_alone() {
    let s = Server::start(model(), &["--max-batch", "4"]);
    let plain = Server::start(model(), &["--cache-bytes", "0"]);
    let system = "Shared instructions for every request. ".repeat(8);
    let asks: Vec<Value> = (0..4)
        .map(|i| {
            json!([{"role": "system", "content": system},
                   {"role": "user", "content": format!("question {i}")}])
        })
        .collect();
    let want: Vec<String> = asks.iter().map(|m| chat(&plain, m)).collect();
    // one first, so that the others find its prompt's blocks; then three at once
    assert_eq!(chat(&s, &asks[0]), want[0]);
    let got: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = asks[1..]
            .iter()
            .map(|m| scope.spawn(|| chat(&s, m)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(got, want[1..]);
    assert!(metric(&s, "qkv_prefix_cache_hit_tokens_total") >= 3.0 * 16.0);
}

/// `--dtype auto` (the default) picks bf16 where the CPU multiplies it natively and f32
/// elsewhere, says which at start, and answers as `qkv generate --dtype` of that type.
#[test]
fn dtype_auto_names_its_choice_and_answers_as_generate_with_it() {
    let s = Server::start(model(), &["--dtype", "auto"]);
    let log = s.log_with(" weights");
    let picked = if log.contains("qkv serve: bf16 weights") {
        "bf16"
    } else {
        assert!(log.contains("qkv serve: f32 weights"), "{log}");
        "f32"
    };
    let m = model().to_str().unwrap();
    let cli = super::qkv(&[
        "generate",
        "--model",
        m,
        "--prompt",
        "Attention is",
        "--max-new-tokens",
        "12",
        "--greedy",
        "--dtype",
        picked,
    ]);
    let ask =
        json!({"model": s.name(), "prompt": "Attention is", "max_tokens": 12, "temperature": 0});
    assert_eq!(text_of(&s.post("/v1/completions", &ask).json()) + "\n", cli);
}
