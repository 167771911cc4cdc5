//! Structured output: whatever the model would say, the text is in the grammar asked
//! for: JSON valid under a schema (OpenAI's `response_format`, vLLM's `guided_json`),
//! any JSON object, a GBNF grammar (llama-server's `grammar`), a Lark grammar, a regular
//! expression; streamed pieces join to the same text; a grammar that does not compile is
//! a 400 naming its field.

use serde_json::{json, Value};

use super::http::Server;
use super::{joined, model, refused, text_of};

/// The test's schema: a name of at most 8 characters, an age in [0, 150], up to three
/// tags from an enum, nothing else.
fn person() -> Value {
    json!({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}},
        "required": ["name", "age", "tags"], "additionalProperties": false})
}

/// Checks `text` against [`person`], rule by rule.
fn is_person(text: &str) {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
    let o = v
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {text}"));
    let mut keys: Vec<&str> = o.keys().map(String::as_str).collect();
    keys.sort();
    assert_eq!(keys, ["age", "name", "tags"], "{text}");
    assert!(o["name"].as_str().unwrap().chars().count() <= 8, "{text}");
    assert!((0..=150).contains(&o["age"].as_i64().unwrap()), "{text}");
    let tags = o["tags"].as_array().unwrap();
    assert!(
        tags.len() <= 3 && tags.iter().all(|t| *t == "a" || *t == "b"),
        "{text}"
    );
}

#[test]
fn outputs_follow_the_schema_or_grammar_asked_for() {
    let s = Server::start(model(), &[]);
    let chat = |extra: Value| {
        let mut b = json!({"model": "m", "max_tokens": 120, "temperature": 1.0,
                           "messages": [{"role": "user", "content": "A person, please"}]});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        let r = s.post("/v1/chat/completions", &b);
        assert_eq!(r.status, 200, "{}", r.body);
        r
    };
    let schema = json!({"type": "json_schema",
                        "json_schema": {"name": "person", "schema": person(), "strict": true}});
    for seed in 0..6 {
        let r = chat(json!({"response_format": schema, "seed": seed})).json();
        assert_eq!(r["choices"][0]["finish_reason"], "stop", "{r}");
        is_person(&text_of(&r));
    }
    // n choices, each valid; streamed, the same text as whole
    let r = chat(json!({"response_format": schema, "seed": 9, "n": 3})).json();
    for c in r["choices"].as_array().unwrap() {
        is_person(c["message"]["content"].as_str().unwrap());
    }
    let whole = text_of(&chat(json!({"response_format": schema, "seed": 4})).json());
    let events = chat(json!({"response_format": schema, "seed": 4, "stream": true})).events();
    assert_eq!(joined(&events).0, whole);
    // vLLM's field for the same
    is_person(&text_of(
        &chat(json!({"guided_json": person(), "seed": 2})).json(),
    ));

    let completion = |extra: Value| {
        let mut b = json!({"model": "m", "prompt": "x", "max_tokens": 60, "temperature": 1.0});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        let r = s.post("/v1/completions", &b);
        assert_eq!(r.status, 200, "{}", r.body);
        text_of(&r.json())
    };
    // any object: a random model may write a key without end, so an answer cut by the
    // length is only checked to be one; those that end parse as objects
    let mut ended = 0;
    for seed in 0..8 {
        let mut b = json!({"model": "m", "prompt": "x", "max_tokens": 60, "temperature": 1.0,
                           "seed": seed, "response_format": {"type": "json_object"}});
        let r = s.post("/v1/completions", &b).json();
        let t = text_of(&r);
        assert!(t.starts_with('{'), "{t:?}");
        if r["choices"][0]["finish_reason"] == "stop" {
            let v: Value = serde_json::from_str(&t).unwrap_or_else(|e| panic!("{e}: {t:?}"));
            assert!(v.is_object(), "{t}");
            ended += 1;
        }
        b["stream"] = json!(true);
        assert_eq!(joined(&s.post("/v1/completions", &b).events()).0, t);
    }
    assert!(ended >= 2, "{ended} of 8 objects ended");
    for seed in 0..4 {
        // GBNF, as llama-server takes it; the same language in Lark; a regex
        let gbnf = r#"root ::= answer ("," answer){0,2}
answer ::= "yes" | "no" | [0-9]{2}"#;
        let lark = r#"start: answer ("," answer){0,2}
answer: "yes" | "no" | /[0-9]/{2}"#;
        for (field, g) in [("grammar", gbnf), ("guided_grammar", lark)] {
            let t = completion(json!({field: g, "seed": seed}));
            let answers: Vec<&str> = t.split(',').collect();
            assert!((1..=3).contains(&answers.len()), "{field}: {t:?}");
            for a in answers {
                let digits = a.len() == 2 && a.bytes().all(|b| b.is_ascii_digit());
                assert!(a == "yes" || a == "no" || digits, "{field}: {t:?}");
            }
        }
        let t = completion(json!({"guided_regex": "[a-c]{3}-[0-9]{1,2}", "seed": seed}));
        let (letters, digits) = t.split_once('-').unwrap_or_else(|| panic!("{t:?}"));
        assert!(
            letters.len() == 3 && letters.bytes().all(|b| (b'a'..=b'c').contains(&b)),
            "{t:?}"
        );
        assert!(
            (1..=2).contains(&digits.len()) && digits.bytes().all(|b| b.is_ascii_digit()),
            "{t:?}"
        );
    }

    // what does not compile is a 400 naming the field
    let bad = |body: Value, param: &str, says: &str| {
        let r = s.post("/v1/completions", &body);
        refused(&r, param);
        assert!(r.body.contains(says), "{}", r.body);
    };
    let ask = |extra: Value| {
        let mut b = json!({"model": "m", "prompt": "x", "max_tokens": 5});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    bad(
        ask(
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frob"}}}}),
        ),
        "response_format",
        "frob",
    );
    bad(
        ask(json!({"grammar": "root ::= [a-z"})),
        "grammar",
        "line 1",
    );
    bad(
        ask(json!({"guided_grammar": "start: ("})),
        "guided_grammar",
        "",
    );
    bad(
        ask(json!({"response_format": {"type": "json_object"}, "guided_regex": "a"})),
        "guided_regex",
        "one structured output",
    );
    bad(
        ask(json!({"response_format": {"type": "yaml"}})),
        "response_format.type",
        "yaml",
    );
    assert_eq!(s.get("/health").status, 200);
}
