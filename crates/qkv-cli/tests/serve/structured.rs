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

fn weather() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 10}, "unit": {"enum": ["c", "f"]}},
            "required": ["city", "unit"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "get_time",
        "parameters": {"type": "object", "properties": {"zone": {"enum": ["CET", "UTC"]}},
            "required": ["zone"], "additionalProperties": false}}}])
}

/// Checks one OpenAI `tool_calls` entry: a known function, its arguments (JSON text)
/// valid under its parameters.
fn valid_call(call: &Value) -> String {
    assert_eq!(call["type"], "function", "{call}");
    assert_eq!(call["id"].as_str().map(str::len), Some(9), "{call}");
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap())
        .unwrap_or_else(|e| panic!("{e}: {call}"));
    let name = call["function"]["name"].as_str().unwrap().to_string();
    match name.as_str() {
        "get_weather" => {
            assert!(
                args["city"].as_str().unwrap().chars().count() <= 10,
                "{args}"
            );
            assert!(args["unit"] == "c" || args["unit"] == "f", "{args}");
            assert_eq!(args.as_object().unwrap().len(), 2, "{args}");
        }
        "get_time" => assert!(args["zone"] == "CET" || args["zone"] == "UTC", "{args}"),
        other => panic!("no tool {other}"),
    }
    name
}

/// Tools through the folder's template (Qwen2.5's: Hermes `<tool_call>` blocks): a call
/// the request makes required, or names, is written under its function's schema and
/// answered as OpenAI's `tool_calls` (whole, and as a stream's delta); a history with
/// calls and tool results renders; bad tools are 400s.
#[test]
fn tool_calls_forced_answered_and_read_back_in_the_history() {
    let s = Server::start(model(), &[]);
    let ask = |extra: Value| {
        let mut b = json!({"model": "m", "max_tokens": 200, "temperature": 1.0, "tools": weather(),
                           "messages": [{"role": "user", "content": "Weather in Oslo?"}]});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        s.post("/v1/chat/completions", &b)
    };
    let mut names = Vec::new();
    for seed in 0..4 {
        let r = ask(json!({"tool_choice": "required", "seed": seed}));
        assert_eq!(r.status, 200, "{}", r.body);
        let c = &r.json()["choices"][0];
        assert_eq!(c["finish_reason"], "tool_calls", "{c}");
        assert!(c["message"]["content"].is_null(), "{c}");
        names.push(valid_call(&c["message"]["tool_calls"][0]));
    }
    let named = json!({"type": "function", "function": {"name": "get_time"}});
    let r = ask(json!({"tool_choice": named, "seed": 5})).json();
    assert_eq!(
        valid_call(&r["choices"][0]["message"]["tool_calls"][0]),
        "get_time"
    );
    // streamed: one delta with the call, then the finish
    let events = ask(json!({"tool_choice": named, "seed": 5, "stream": true})).events();
    let chunks: Vec<Value> = events
        .iter()
        .filter(|e| *e != "[DONE]")
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let calls: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].get(0))
        .collect();
    assert_eq!(calls.len(), 1, "{events:?}");
    assert_eq!(calls[0]["index"], 0);
    assert_eq!(
        calls[0]["function"],
        r["choices"][0]["message"]["tool_calls"][0]["function"]
    );
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "tool_calls"
    );
    assert!(chunks.iter().all(|c| c["choices"][0]["delta"]["content"]
        .as_str()
        .unwrap_or("")
        .is_empty()));

    // "auto": a call the model writes in its template's form is read back as a call
    // (the model made to write one here by a grammar on its text); text that is no call
    // stays content, streamed as it comes
    let written = r#"start: "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"UTC\"}}\n</tool_call>""#;
    let r = ask(json!({"guided_grammar": written})).json();
    let c = &r["choices"][0];
    assert_eq!(c["finish_reason"], "tool_calls", "{c}");
    let auto = &c["message"]["tool_calls"][0];
    assert_eq!(auto["function"]["name"], "get_time");
    assert_eq!(auto["function"]["arguments"], r#"{"zone":"UTC"}"#);
    let events = ask(json!({"guided_grammar": written, "stream": true})).events();
    let streamed: Vec<Value> = events
        .iter()
        .filter(|e| *e != "[DONE]")
        .map(|e| serde_json::from_str::<Value>(e).unwrap())
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].get(0).cloned())
        .collect();
    assert_eq!(streamed.len(), 1, "{events:?}");
    assert_eq!(streamed[0]["function"], auto["function"]);
    let prose = r#"start: "It is noon.""#;
    let r = ask(json!({"guided_grammar": prose})).json();
    assert_eq!(r["choices"][0]["message"]["content"], "It is noon.");
    assert!(r["choices"][0]["message"]["tool_calls"].is_null());
    let events = ask(json!({"guided_grammar": prose, "stream": true})).events();
    assert_eq!(joined(&events).0, "It is noon.");

    // the history: the assistant's call and the tool's answer go through the template
    let call = &r["choices"][0]["message"]["tool_calls"][0];
    let history = json!([
        {"role": "user", "content": "Time in Berlin?"},
        {"role": "assistant", "content": null, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "12:00"},
    ]);
    let r = ask(json!({"messages": history, "max_tokens": 5, "tool_choice": "none"}));
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.json()["usage"]["prompt_tokens"].as_u64().unwrap() > 20);

    let bad = |extra: Value, param: &str| {
        let r = ask(extra);
        refused(&r, param);
    };
    bad(json!({"tools": [{"type": "function"}]}), "tools[0]");
    bad(
        json!({"tool_choice": {"type": "function", "function": {"name": "nope"}}}),
        "tool_choice",
    );
    bad(json!({"tool_choice": "sometimes"}), "tool_choice");
    bad(
        json!({"tool_choice": "required", "response_format": {"type": "json_object"}}),
        "response_format",
    );
    let mut broken = history.clone();
    broken[1]["tool_calls"][0]["function"]["arguments"] = json!("{not json");
    bad(
        json!({"messages": broken}),
        "messages[1].tool_calls[0].function.arguments",
    );
}
