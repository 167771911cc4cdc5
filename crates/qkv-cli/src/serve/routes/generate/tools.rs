//! Tool calls: how a model's text spells a call, read back into OpenAI's `tool_calls`,
//! and the grammar that makes it call one when the request says it must. Three ways
//! chat templates teach a model to call, each a `Parser`:
//!
//! - Hermes (Qwen 2/2.5/3, Hermes, many others): `<tool_call>\n{"name": …, "arguments":
//!   {…}}\n</tool_call>`, one block a call;
//! - Llama 3.1/3.2 JSON: the whole answer `{"name": …, "parameters": {…}}`;
//! - Mistral: `[TOOL_CALLS][{"name": …, "arguments": {…}}, …]` (`[TOOL_CALLS]` a control
//!   token, which decoded text leaves out: the list alone reads as the calls too).
//!
//! Which one a folder uses is read from its chat template (what it renders a call as).

use serde_json::{json, Value};

use crate::serve::api::{ApiError, Message};

/// How the served model's template spells a tool call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Parser {
    Hermes,
    Llama3Json,
    Mistral,
}

/// One call read from the text: the function's name and its arguments (a JSON object).
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    pub name: String,
    pub arguments: Value,
}

/// What an answer says: text (before any call), and the calls.
#[derive(Clone, Debug, PartialEq)]
pub struct Read {
    pub content: Option<String>,
    pub calls: Vec<Call>,
}

impl Parser {
    /// The parser of a chat template, from what it writes for an assistant's call.
    pub fn of_template(source: &str) -> Option<Parser> {
        if source.contains("<tool_call>") {
            Some(Parser::Hermes)
        } else if source.contains("[TOOL_CALLS]") {
            Some(Parser::Mistral)
        } else if source.contains("\"parameters\": ") && source.contains("tool_calls") {
            Some(Parser::Llama3Json)
        } else {
            None
        }
    }

    /// The text a call starts with: while an answer could still be a call, a stream
    /// holds its text back.
    pub fn marker(self) -> &'static str {
        match self {
            Parser::Hermes => "<tool_call>",
            Parser::Llama3Json => "{\"name\"",
            Parser::Mistral => "[TOOL_CALLS]",
        }
    }

    /// Whether `text` (an answer so far) may still turn out to be a call.
    pub fn may_call(self, text: &str) -> bool {
        let t = text.trim_start();
        let m = self.marker();
        match self {
            // a Hermes call may follow some text
            Parser::Hermes => t.contains(m) || ends_with_start_of(t, m),
            // `[TOOL_CALLS]` is a control token, left out of the text it decodes to
            Parser::Mistral => {
                let bare = "[{\"name\"";
                t.starts_with(m) || m.starts_with(t) || t.starts_with(bare) || bare.starts_with(t)
            }
            Parser::Llama3Json => t.starts_with(m) || m.starts_with(t),
        }
    }

    /// The calls in `text`, and the text outside them. Text that only looks like a
    /// call (JSON that does not parse, a name missing) stays text.
    pub fn read(self, text: &str) -> Read {
        let none = || Read {
            content: Some(text.to_string()),
            calls: Vec::new(),
        };
        let call = |v: &Value, args: &str| -> Option<Call> {
            let name = v["name"].as_str()?.to_string();
            let arguments = match &v[args] {
                Value::Null => json!({}),
                Value::String(s) => serde_json::from_str(s).ok()?,
                a => a.clone(),
            };
            arguments.is_object().then_some(Call { name, arguments })
        };
        match self {
            Parser::Hermes => {
                let Some(first) = text.find("<tool_call>") else {
                    return none();
                };
                let mut calls = Vec::new();
                for block in text[first..].split("<tool_call>").skip(1) {
                    let body = block.split("</tool_call>").next().unwrap_or("");
                    let Some(c) = serde_json::from_str::<Value>(body.trim())
                        .ok()
                        .and_then(|v| call(&v, "arguments"))
                    else {
                        return none();
                    };
                    calls.push(c);
                }
                let before = text[..first].trim();
                Read {
                    content: (!before.is_empty()).then(|| before.to_string()),
                    calls,
                }
            }
            Parser::Llama3Json => {
                let body = text.trim().trim_start_matches("<|python_tag|>");
                match serde_json::from_str::<Value>(body)
                    .ok()
                    .and_then(|v| call(&v, "parameters").or_else(|| call(&v, "arguments")))
                {
                    Some(c) => Read {
                        content: None,
                        calls: vec![c],
                    },
                    None => none(),
                }
            }
            Parser::Mistral => {
                // the control token is there when the text keeps special tokens
                let t = text.trim_start();
                let rest = t.strip_prefix("[TOOL_CALLS]").unwrap_or(t);
                let calls: Option<Vec<Call>> = serde_json::from_str::<Value>(rest.trim())
                    .ok()
                    .and_then(|v| v.as_array().cloned())
                    .and_then(|a| a.iter().map(|v| call(v, "arguments")).collect());
                match calls {
                    Some(calls) if !calls.is_empty() => Read {
                        content: None,
                        calls,
                    },
                    _ => none(),
                }
            }
        }
    }

    /// A Lark grammar for an answer that is exactly one call of one of `tools` (their
    /// OpenAI definitions), its arguments valid under the function's `parameters`.
    /// `control`: the id of Mistral's `[TOOL_CALLS]` token.
    pub fn forced(self, tools: &[&Value], control: Option<usize>) -> Result<String, String> {
        let args = match self {
            Parser::Llama3Json => "parameters",
            _ => "arguments",
        };
        let one = |t: &&Value| {
            let f = &t["function"];
            json!({"type": "object",
                   "properties": {"name": {"const": f["name"]},
                                  args: f.get("parameters").cloned().unwrap_or(json!({"type": "object"}))},
                   "required": ["name", args], "additionalProperties": false})
        };
        let schema = json!({"anyOf": tools.iter().map(one).collect::<Vec<_>>(),
            "x-guidance": {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": false}});
        let call = format!("%json {schema}");
        Ok(match self {
            Parser::Hermes => {
                format!("start: \"<tool_call>\\n\" call \"\\n</tool_call>\"\ncall: {call}\n")
            }
            Parser::Llama3Json => format!("start: call\ncall: {call}\n"),
            Parser::Mistral => {
                let id = control.ok_or("the tokenizer has no [TOOL_CALLS] token")?;
                format!("start: <[{id}]> \"[\" call \"]\"\ncall: {call}\n")
            }
        })
    }
}

/// Whether `text` ends with the first characters of `marker` (a call may be starting).
fn ends_with_start_of(text: &str, marker: &str) -> bool {
    (1..marker.len()).any(|n| text.ends_with(&marker[..n]))
}

/// Calls as OpenAI's `tool_calls`, each with a fresh id of 9 letters and digits (what
/// Mistral's templates require when the call comes back in the history).
pub fn openai_calls(calls: &[Call], id: &mut impl FnMut() -> u64) -> Vec<Value> {
    calls
        .iter()
        .map(|c| {
            json!({"id": format!("c{:08x}", id() & 0xffff_ffff), "type": "function",
                   "function": {"name": c.name, "arguments": c.arguments.to_string()}})
        })
        .collect()
}

/// What a chat request's `tools` and `tool_choice` ask of the answer.
#[derive(Default)]
pub struct Asked {
    /// The template's context: `tools`, as transformers' `apply_chat_template(tools=)`.
    pub context: serde_json::Map<String, Value>,
    /// How the answer's calls are read: set when the model may call.
    pub parser: Option<Parser>,
    /// The grammar of a call the model must make (`required`, or a named function).
    pub forced: Option<String>,
}

/// Reads `tools` and `tool_choice` for a model whose chat template is `template` and
/// whose tokenizer finds `[TOOL_CALLS]` by `control`.
pub fn asked(
    tools: Option<&[Value]>,
    choice: Option<&Value>,
    template: &str,
    control: Option<usize>,
) -> Result<Asked, ApiError> {
    let Some(tools) = tools.filter(|t| !t.is_empty()) else {
        return match choice {
            Some(c) if *c != json!("none") && *c != json!("auto") => Err(ApiError::invalid(
                "tool_choice",
                "there are no `tools` to choose from",
            )),
            _ => Ok(Asked::default()),
        };
    };
    for (i, t) in tools.iter().enumerate() {
        if t["type"] != "function" || !t["function"]["name"].is_string() {
            return Err(ApiError::invalid(
                format!("tools[{i}]"),
                "a tool is {\"type\": \"function\", \"function\": {\"name\", \"description\", \"parameters\"}}",
            ));
        }
        if let Some(p) = t["function"].get("parameters").filter(|p| !p.is_object()) {
            return Err(ApiError::invalid(
                format!("tools[{i}].function.parameters"),
                format!("a JSON schema object, not {p}"),
            ));
        }
    }
    let parser = Parser::of_template(template).ok_or_else(|| {
        ApiError::invalid(
            "tools",
            "the model's chat template does not say how it calls tools (no <tool_call>, [TOOL_CALLS] or Llama 3.1's JSON)",
        )
    })?;
    let named = |name: &str| {
        tools
            .iter()
            .filter(|t| t["function"]["name"] == name)
            .collect::<Vec<_>>()
    };
    let forced: Option<Vec<&Value>> = match choice {
        None => None,
        Some(Value::String(c)) if c == "auto" => None,
        Some(Value::String(c)) if c == "none" => {
            return Ok(Asked::default());
        }
        Some(Value::String(c)) if c == "required" => Some(tools.iter().collect()),
        Some(c) if c["type"] == "function" && c["function"]["name"].is_string() => {
            let name = c["function"]["name"].as_str().unwrap_or_default();
            let found = named(name);
            if found.is_empty() {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!("no tool is named {name:?}"),
                ));
            }
            Some(found)
        }
        Some(c) => {
            return Err(ApiError::invalid(
                "tool_choice",
                format!("\"auto\", \"none\", \"required\" or {{\"type\": \"function\", \"function\": {{\"name\"}}}}, not {c}"),
            ))
        }
    };
    let forced = forced
        .map(|t| parser.forced(&t, control))
        .transpose()
        .map_err(|e| ApiError::invalid("tool_choice", e))?;
    let mut context = serde_json::Map::new();
    context.insert("tools".into(), json!(tools));
    Ok(Asked {
        context,
        parser: Some(parser),
        forced,
    })
}

/// A history message as the template reads it: an assistant's `tool_calls` with their
/// arguments as objects (OpenAI sends them as JSON text; templates write them with
/// `tojson`, as vLLM hands them over), a tool's answer with its `tool_call_id`.
pub fn history(m: &Message, i: usize, content: String) -> Result<Value, ApiError> {
    let mut out = json!({"role": m.role, "content": content});
    if let Some(calls) = &m.tool_calls {
        let calls: Vec<Value> = calls
            .iter()
            .enumerate()
            .map(|(j, c)| {
                let mut c = c.clone();
                if let Some(Value::String(a)) = c.pointer("/function/arguments").cloned() {
                    let parsed: Value = serde_json::from_str(&a).map_err(|e| {
                        ApiError::invalid(
                            format!("messages[{i}].tool_calls[{j}].function.arguments"),
                            format!("not JSON: {e}"),
                        )
                    })?;
                    c["function"]["arguments"] = parsed;
                }
                Ok(c)
            })
            .collect::<Result<_, ApiError>>()?;
        out["tool_calls"] = json!(calls);
    }
    if let Some(id) = &m.tool_call_id {
        out["tool_call_id"] = json!(id);
    }
    if let Some(name) = &m.name {
        out["name"] = json!(name);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use qkv::text::ChatTemplate;

    /// The published chat templates of three families (tools/fixtures/chat_templates).
    fn template(name: &str, eos: &str) -> ChatTemplate {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tools/fixtures/chat_templates")
            .join(name);
        let source = std::fs::read_to_string(&path).unwrap();
        let special = json!({"bos_token": "<s>", "eos_token": eos});
        ChatTemplate::with_tokens(source, special.as_object().unwrap().clone(), path).unwrap()
    }

    /// Each family's template writes an assistant's calls as its models are taught to;
    /// the parser its template is detected with reads them back to the same calls.
    #[test]
    fn calls_written_by_each_familys_template_read_back() {
        let calls = json!([
            {"id": "abc123XYZ", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Oslo", "unit": "c"}}},
            {"id": "def456UVW", "type": "function",
             "function": {"name": "get_time", "arguments": {"zone": "CET"}}},
        ]);
        let tools = json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]);
        for (name, eos, parser, several) in [
            (
                "Qwen-Qwen2.5-7B-Instruct.jinja",
                "<|im_end|>",
                Parser::Hermes,
                true,
            ),
            (
                "meta-llama-Llama-3.1-8B-Instruct.jinja",
                "<|eot_id|>",
                Parser::Llama3Json,
                false,
            ),
            (
                "mistralai-Mistral-Nemo-Instruct-2407.jinja",
                "</s>",
                Parser::Mistral,
                true,
            ),
        ] {
            let t = template(name, eos);
            assert_eq!(Parser::of_template(t.source()), Some(parser), "{name}");
            let n = if several { 2 } else { 1 };
            let user = json!({"role": "user", "content": "weather and time?"});
            let asked = json!({"role": "assistant", "content": null,
                               "tool_calls": calls.as_array().unwrap()[..n]});
            let mut extra = serde_json::Map::new();
            extra.insert("tools".into(), tools.clone());
            let before = t
                .render_with(std::slice::from_ref(&user), true, &extra)
                .unwrap();
            let after = t.render_with(&[user, asked], false, &extra).unwrap();
            // the assistant's turn: what follows the prompt, up to its end-of-turn token
            let turn = after
                .strip_prefix(before.as_str())
                .unwrap_or_else(|| panic!("{name}: {after:?} does not extend {before:?}"));
            let said = turn.split(eos).next().unwrap();
            let read = parser.read(said);
            let want: Vec<Call> = calls.as_array().unwrap()[..n]
                .iter()
                .map(|c| Call {
                    name: c["function"]["name"].as_str().unwrap().into(),
                    arguments: c["function"]["arguments"].clone(),
                })
                .collect();
            assert_eq!(read.calls, want, "{name}: {said:?}");
            assert!(read.content.is_none(), "{name}: {read:?}");
            // as a stream meets it: a call from its first characters on
            for cut in 1..said.len() {
                if said.is_char_boundary(cut) && !said[..cut].trim().is_empty() {
                    assert!(parser.may_call(&said[..cut]), "{name}: {:?}", &said[..cut]);
                }
            }
        }
    }

    /// Each parser's forced grammar takes the call its template writes (Mistral's after
    /// its control token) and nothing else: a walk over a byte vocabulary.
    #[test]
    fn forced_grammars_take_one_call_in_each_familys_form() {
        use qkv::models::generate::grammar::{Grammar, Vocabulary};
        // the 256 bytes, `[TOOL_CALLS]` as a control token (256), EOS (257)
        let mut bytes: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        bytes.push(b"[TOOL_CALLS]".to_vec());
        bytes.push(b"</s>".to_vec());
        let v = Vocabulary::new(&bytes, |id| id == 256, &[257]).unwrap();
        let tool = json!({"type": "function", "function": {"name": "f", "parameters":
            {"type": "object", "properties": {"x": {"enum": [1, 2]}}, "required": ["x"],
             "additionalProperties": false}}});
        let walk = |parser: Parser, tokens: &[usize]| -> bool {
            let lark = parser.forced(&[&tool], Some(256)).unwrap();
            let mut c = v.constraint(&Grammar::Lark(lark)).unwrap();
            for &t in tokens {
                let mut scores = vec![0.0; bytes.len()];
                c.mask(&mut scores).unwrap();
                if !scores[t].is_finite() {
                    return false;
                }
                c.commit(t).unwrap();
            }
            let mut scores = vec![0.0; bytes.len()];
            c.mask(&mut scores).unwrap();
            scores[257].is_finite()
        };
        let text = |s: &str| s.bytes().map(usize::from).collect::<Vec<_>>();
        let hermes = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 2}}\n</tool_call>";
        assert!(walk(Parser::Hermes, &text(hermes)));
        assert!(!walk(Parser::Hermes, &text(&hermes.replace("2}", "3}"))));
        let llama = "{\"name\": \"f\", \"parameters\": {\"x\": 1}}";
        assert!(walk(Parser::Llama3Json, &text(llama)));
        assert!(!walk(
            Parser::Llama3Json,
            &text(&llama.replace("\"f\"", "\"g\""))
        ));
        let mistral = [
            vec![256],
            text("[{\"name\": \"f\", \"arguments\": {\"x\": 1}}]"),
        ]
        .concat();
        assert!(walk(Parser::Mistral, &mistral));
        // the control token, not its spelling in text
        assert!(!walk(
            Parser::Mistral,
            &text("[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"x\": 1}}]")
        ));
    }

    #[test]
    fn text_that_is_not_a_call_stays_text() {
        let p = Parser::Hermes;
        let r = p.read("Hello <tool_call>\n{broken}\n</tool_call>");
        assert!(r.calls.is_empty() && r.content.is_some());
        assert!(!p.may_call("Hello there"));
        assert!(p.may_call("Hello <tool_"));
        let r = Parser::Llama3Json.read("{\"name\": \"f\"}");
        assert_eq!(r.calls[0].arguments, json!({}));
        assert!(!Parser::Llama3Json.may_call("The answer"));
        assert!(Parser::Mistral
            .read("[TOOL_CALLS]not json")
            .calls
            .is_empty());
        let bare = Parser::Mistral.read("[{\"name\": \"f\", \"arguments\": {\"x\": 1}}]");
        assert_eq!(bare.calls[0].arguments, json!({"x": 1}));
        assert!(Parser::Mistral.may_call("[{\"na") && !Parser::Mistral.may_call("[1, 2]"));
    }
}
