//! Chat templates of real families (Qwen2.5, Llama 3.1 and 3.2, SmolLM2, Mistral Nemo,
//! verbatim from their folders) rendered as transformers' `apply_chat_template` renders
//! them: `tests/fixtures/chat/templates.json`, made by tools/fixtures/gen_chat_templates.py
//! with transformers 4.57.1. Cases cover system prompts, several turns, Chinese and
//! whitespace, no generation prompt, tools written with `tojson`, and the templates'
//! own refusals (`raise_exception`).

#![cfg(feature = "text")]

use std::path::PathBuf;

use qkv::text::ChatTemplate;
use serde_json::{Map, Value};

fn fixture() -> Vec<Value> {
    let path: PathBuf = [
        env!("CARGO_MANIFEST_DIR"),
        "tests/fixtures/chat/templates.json",
    ]
    .iter()
    .collect();
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_slice(&bytes).expect("templates.json")
}

/// A fixture family's name and its template, with its special tokens.
fn template_of(f: &Value) -> (&str, ChatTemplate) {
    let family = f["family"].as_str().unwrap();
    let mut special = Map::new();
    for name in ["bos_token", "eos_token"] {
        if let Some(t) = f[name].as_str() {
            special.insert(name.into(), Value::String(t.into()));
        }
    }
    let template = f["template"].as_str().unwrap().to_string();
    let t = ChatTemplate::with_tokens(template, special, family.into())
        .unwrap_or_else(|e| panic!("{family}: {e}"));
    (family, t)
}

/// The bounds on a render (`TEMPLATE_FUEL` steps, `MAX_RENDERED_BYTES`) leave room for
/// any real conversation: 4096 turns render with every published template here.
#[test]
fn long_conversations_fit_the_render_bounds() {
    for f in &fixture() {
        let (family, t) = template_of(f);
        let messages: Vec<Value> = (0..4096)
            .map(|i| {
                let role = if i % 2 == 0 { "user" } else { "assistant" };
                serde_json::json!({"role": role, "content": format!("turn {i}: where does it point?")})
            })
            .collect();
        let text = t
            .render(&messages, true)
            .unwrap_or_else(|e| panic!("{family}: {e}"));
        assert!(text.contains("turn 4095: where does it point?"), "{family}");
    }
}

#[test]
fn templates_render_as_transformers_renders_them() {
    let families = fixture();
    assert_eq!(families.len(), 5);
    let mut checked = 0;
    for f in &families {
        let (family, t) = template_of(f);
        for case in f["cases"].as_array().unwrap() {
            let name = case["name"].as_str().unwrap();
            let messages = case["messages"].as_array().unwrap();
            let add = case["add_generation_prompt"].as_bool().unwrap();
            let extra = case["extra"].as_object().cloned().unwrap_or_default();
            let got = t.render_with(messages, add, &extra);
            match case.get("expected").and_then(Value::as_str) {
                Some(want) => {
                    let got = got.unwrap_or_else(|e| panic!("{family} {name}: {e}"));
                    assert_eq!(got, want, "{family} {name}");
                }
                None => {
                    let err = got.expect_err(&format!("{family} {name}: transformers raised"));
                    let why = case["message"].as_str().unwrap();
                    assert!(err.to_string().contains(why), "{family} {name}: {err}");
                }
            }
            checked += 1;
        }
    }
    assert_eq!(checked, 45);
}

#[test]
fn a_folder_template_comes_from_chat_template_jinja_or_the_tokenizer_config() {
    let dir = std::env::temp_dir().join(format!("qkv-chat-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    assert!(ChatTemplate::from_dir(&dir).unwrap().is_none());
    let config = serde_json::json!({
        "chat_template": "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }}{% endfor %}",
        "bos_token": {"content": "<s>", "lstrip": false},
        "eos_token": "</s>",
    });
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
    let user = [serde_json::json!({"role": "user", "content": "hi"})];
    let t = ChatTemplate::from_dir(&dir).unwrap().unwrap();
    assert_eq!(t.render(&user, true).unwrap(), "<s>[user] hi");
    // the .jinja file wins, as in transformers
    std::fs::write(
        dir.join("chat_template.jinja"),
        "{{ eos_token }}{{ messages | length }}",
    )
    .unwrap();
    let t = ChatTemplate::from_dir(&dir).unwrap().unwrap();
    assert_eq!(t.render(&user, true).unwrap(), "</s>1");
    // a broken template is refused naming its file
    std::fs::write(dir.join("chat_template.jinja"), "{% for %}").unwrap();
    let err = ChatTemplate::from_dir(&dir).unwrap_err().to_string();
    assert!(err.contains("chat_template.jinja"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}
