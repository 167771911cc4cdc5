//! The OpenAI API's JSON shapes as the server reads and writes them, and its error
//! object. Requests name every field they read: an unknown one is ignored (and counted),
//! or refused with 400 and its name under `--strict`, as OpenAI's API does.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

/// An error as OpenAI's API sends it: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// The request field at fault.
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// Seconds, for a 503 from a full queue.
    pub retry_after: Option<u32>,
}

impl ApiError {
    /// 400 naming `param`, in the message too.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        let (param, message) = (param.into(), message.into());
        let message = match param.is_empty() || message.contains(&param) {
            true => message,
            false => format!("invalid `{param}`: {message}"),
        };
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message,
            param: Some(param),
            code: None,
            retry_after: None,
        }
    }

    pub fn status(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            param: None,
            code: None,
            retry_after: None,
        }
    }

    fn kind(&self) -> &'static str {
        match self.status.as_u16() {
            400 | 404 | 405 | 413 | 415 => "invalid_request_error",
            503 => "overloaded_error",
            _ => "server_error",
        }
    }

    pub fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind(),
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }
}

/// The keys a nested object may have: `("stream_options", keys)` for an object field,
/// `("messages[]", keys)` for each object of a list.
pub type Nested = (&'static str, &'static [&'static str]);

/// What `stream_options` holds that qkv reads.
pub const STREAM_OPTIONS: Nested = ("stream_options", &["include_usage"]);

/// What a chat message holds that qkv reads.
pub const MESSAGE: Nested = (
    "messages[]",
    &["role", "content", "name", "tool_calls", "tool_call_id"],
);

/// A request body as JSON: an object, with the keys outside `fields` (and, inside the
/// `nested` objects, outside theirs) taken out and returned by name (`top_k`,
/// `stream_options.continuous_usage_stats`, `messages[].refusal`), as llama-server and
/// vLLM ignore them, or refused with a 400 naming the first when `strict`.
pub fn body_json(
    body: &[u8],
    fields: &[&[&str]],
    nested: &[Nested],
    strict: bool,
) -> Result<(Value, Vec<String>), ApiError> {
    let whole = |message: String| ApiError {
        param: None,
        ..ApiError::invalid("", message)
    };
    let mut value: Value =
        serde_json::from_slice(body).map_err(|e| whole(format!("invalid request body: {e}")))?;
    let Value::Object(map) = &mut value else {
        return Err(whole("the request body must be a JSON object".into()));
    };
    let mut unknown = Vec::new();
    let mut take = |map: &mut Map<String, Value>, known: &dyn Fn(&str) -> bool, at: &str| {
        let out: Vec<String> = map.keys().filter(|k| !known(k)).cloned().collect();
        for k in out {
            map.remove(&k);
            unknown.push(format!("{at}{k}"));
        }
    };
    take(map, &|k| fields.iter().any(|f| f.contains(&k)), "");
    for &(field, keys) in nested {
        let known = |k: &str| keys.contains(&k);
        match field.strip_suffix("[]") {
            Some(list) => {
                let objects = map.get_mut(list).and_then(Value::as_array_mut);
                for o in objects
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_object_mut)
                {
                    take(o, &known, &format!("{field}."));
                }
            }
            None => {
                if let Some(o) = map.get_mut(field).and_then(Value::as_object_mut) {
                    take(o, &known, &format!("{field}."));
                }
            }
        }
    }
    unknown.dedup();
    if let (true, Some(k)) = (strict, unknown.first()) {
        return Err(ApiError::invalid(
            k.clone(),
            format!("unrecognized request argument supplied: {k} (the server runs with --strict)"),
        ));
    }
    Ok((value, unknown))
}

/// Reads a request (or the part of it that `T` takes) from its JSON, naming the field
/// that fails (`messages[1].content`) in a 400.
pub fn parse<T: serde::de::DeserializeOwned>(value: &Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let message = format!("invalid request body: {}", e.inner());
        match path.as_str() {
            "." | "" => ApiError {
                param: None,
                ..ApiError::invalid("", message)
            },
            _ => ApiError::invalid(path, message),
        }
    })
}

/// A prompt: a text or a sequence of token ids, or a list of several (each answered
/// with its own `n` choices, numbered prompt by prompt).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<u32>),
    IdLists(Vec<Vec<u32>>),
}

/// `stop`: one string or up to four.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

impl Stop {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            Stop::One(s) => vec![s],
            Stop::Many(v) => v,
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// The fields of [`Settings`]: with the endpoint's own, the keys a body may have.
pub const SETTINGS: &[&str] = &[
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "frequency_penalty",
    "presence_penalty",
    "logit_bias",
    "seed",
    "stop",
    "n",
    "stream",
    "stream_options",
    "logprobs",
    "response_format",
    "grammar",
    "guided_json",
    "guided_regex",
    "guided_grammar",
    // who asked, for the caller's own logs: accepted and not used
    "user",
    "qkv",
];

/// A completion request's own fields.
pub const COMPLETION: &[&str] = &["model", "prompt", "echo"];

/// A chat request's own fields.
pub const CHAT: &[&str] = &[
    "model",
    "messages",
    "top_logprobs",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
];

/// The sampling settings both completion endpoints take.
#[derive(Debug, Default, Deserialize)]
pub struct Settings {
    pub max_tokens: Option<usize>,
    /// Chat's newer name for `max_tokens`.
    pub max_completion_tokens: Option<usize>,
    /// 0: greedy. Absent: the folder's generation config decides.
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// vLLM's and llama-server's: the k likeliest tokens; 0 or −1 for all.
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    /// transformers' (vLLM's too), over the folder's.
    pub repetition_penalty: Option<f32>,
    /// OpenAI's, in [−2, 2], over the tokens generated so far.
    pub frequency_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    /// Token id (as a string) → a bias in [−100, 100] added to its logit.
    pub logit_bias: Option<std::collections::BTreeMap<String, f32>>,
    /// The sampler's seed; choice i of `n` draws from seed + i.
    pub seed: Option<u64>,
    pub stop: Option<Stop>,
    pub n: Option<usize>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    /// Completions: how many alternatives to report with each token's log-probability
    /// (an integer); chat: whether to report them (a bool; see `top_logprobs`).
    pub logprobs: Option<Value>,
    /// Chat: alternatives with each token's log-probability, 0 to 20.
    pub top_logprobs: Option<usize>,
    /// Chat: the functions the model may call (`{"type": "function", "function":
    /// {"name", "description", "parameters"}}`), rendered by the chat template.
    pub tools: Option<Vec<Value>>,
    /// Chat: `"auto"` (the default with tools), `"none"`, `"required"`, or
    /// `{"type": "function", "function": {"name"}}`.
    pub tool_choice: Option<Value>,
    /// Chat: accepted; the model may write several calls where its template allows.
    #[allow(dead_code)]
    pub parallel_tool_calls: Option<bool>,
    /// Completions: the prompt comes back before the completion (with its
    /// log-probabilities when `logprobs` is given).
    #[serde(default)]
    pub echo: bool,
    /// OpenAI's structured output: `{"type": "text" | "json_object" | "json_schema",
    /// "json_schema": {"name", "schema", "strict"}}`.
    pub response_format: Option<ResponseFormat>,
    /// llama-server's: a grammar in GBNF (or llguidance's Lark dialect).
    pub grammar: Option<String>,
    /// vLLM's: a JSON schema, a regular expression, a grammar (GBNF or Lark).
    pub guided_json: Option<Value>,
    pub guided_regex: Option<String>,
    pub guided_grammar: Option<String>,
    /// qkv's own: attention maps on request.
    pub qkv: Option<QkvOptions>,
    /// Who asked, for the caller's own logs: read to check it is a string, not used.
    #[allow(dead_code)]
    pub user: Option<String>,
}

/// `response_format`.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ResponseFormat {
    Text,
    JsonObject,
    JsonSchema { json_schema: JsonSchemaFormat },
}

/// `response_format.json_schema`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonSchemaFormat {
    /// The schema's name, for the caller's own use.
    #[allow(dead_code)]
    pub name: Option<String>,
    #[allow(dead_code)]
    pub description: Option<String>,
    /// Absent: any JSON object.
    pub schema: Option<Value>,
    /// Accepted either way: qkv always holds the output to the schema.
    #[allow(dead_code)]
    pub strict: Option<bool>,
}

/// The `qkv` field of a completion request.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QkvOptions {
    /// The maps of the prompt and the generated text, every layer and head.
    #[serde(default)]
    pub attentions: bool,
    /// Also the viewer page (HTML, offline) that shows them.
    #[serde(default)]
    pub viewer: bool,
}

/// A completion request's own fields; its [`Settings`] are read from the same body.
#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    pub model: String,
    pub prompt: Prompt,
}

/// A chat message; content is text, or a list of text parts.
#[derive(Debug, Deserialize, Serialize, Clone)]
#[serde(deny_unknown_fields)]
pub struct Message {
    pub role: String,
    #[serde(default = "absent")]
    pub content: Content,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// An assistant's calls, as OpenAI's answers give them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<Value>>,
    /// A `tool` message: the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

fn absent() -> Content {
    Content::Absent
}

/// A message's content: a string, or content parts. Read through a JSON value so that a
/// wrong shape is named in words, not as an untagged enum's variants.
#[derive(Debug, Deserialize, Serialize, Clone)]
#[serde(try_from = "Value")]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<Part>),
    /// `null`: an assistant's turn that only called tools (no other role's may be).
    Absent,
}

/// A content part as OpenAI's clients send it: its `type`, and `text` for a text part;
/// the fields of the other types (`image_url`, `input_audio`, …) are kept for the route
/// to refuse by type.
#[derive(Debug, Deserialize, Serialize, Clone)]
pub struct Part {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

impl TryFrom<Value> for Content {
    type Error = String;

    fn try_from(v: Value) -> Result<Content, String> {
        match v {
            Value::String(s) => Ok(Content::Text(s)),
            Value::Null => Ok(Content::Absent),
            Value::Array(parts) => parts
                .into_iter()
                .enumerate()
                .map(|(j, p)| {
                    serde_json::from_value(p).map_err(|e| {
                        format!("part {j} is not a content part ({{\"type\": \"text\", \"text\": ...}}): {e}")
                    })
                })
                .collect::<Result<_, _>>()
                .map(Content::Parts),
            other => Err(format!(
                "{} is neither a string nor a list of content parts",
                kind_of(&other)
            )),
        }
    }
}

/// A JSON value's kind, in words.
fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a bool",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// A chat request's own fields; its [`Settings`] are read from the same body.
#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    pub model: String,
    pub messages: Vec<Message>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum EmbeddingInput {
    Text(String),
    Texts(Vec<String>),
}

/// The fields of [`EmbeddingRequest`], and `user` (accepted and not used).
pub const EMBEDDING: &[&str] = &["model", "input", "encoding_format", "dimensions", "user"];

#[derive(Debug, Deserialize)]
pub struct EmbeddingRequest {
    pub model: String,
    pub input: EmbeddingInput,
    /// "float" (the default) or "base64" (little-endian f32s; what OpenAI's Python
    /// client asks for unless told otherwise)
    pub encoding_format: Option<String>,
    pub dimensions: Option<usize>,
    /// Who asked, for the caller's own logs: read to check it is a string, not used.
    #[allow(dead_code)]
    pub user: Option<String>,
}

/// The fields of [`TokenizeRequest`].
pub const TOKENIZE: &[&str] = &["content", "add_special"];

#[derive(Debug, Deserialize)]
pub struct TokenizeRequest {
    pub content: String,
    #[serde(default = "yes")]
    pub add_special: bool,
}

/// The fields of [`DetokenizeRequest`] (llama-server's shape, and `model` as vLLM's).
pub const DETOKENIZE: &[&str] = &["tokens", "model"];

#[derive(Debug, Deserialize)]
pub struct DetokenizeRequest {
    pub tokens: Vec<u32>,
    /// Read to check it is a string; any name is answered (unless `--strict-model`).
    pub model: Option<String>,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
}

impl Usage {
    pub fn new(prompt: usize, completion: usize) -> Self {
        Usage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            total_tokens: prompt + completion,
        }
    }
}

/// The fields of [`RerankRequest`] (Cohere's and Jina's `/v1/rerank`).
pub const RERANK: &[&str] = &["model", "query", "documents", "top_n", "return_documents"];

#[derive(Debug, Deserialize)]
pub struct RerankRequest {
    pub model: String,
    pub query: String,
    pub documents: Vec<String>,
    /// The best this many, all when absent.
    pub top_n: Option<usize>,
    #[serde(default)]
    pub return_documents: bool,
}

/// The fields of [`ClassifyRequest`].
pub const CLASSIFY: &[&str] = &["model", "input"];

#[derive(Debug, Deserialize)]
pub struct ClassifyRequest {
    pub model: String,
    pub input: ClassifyInput,
}

/// A text, texts, or pairs of texts read together (`[["query", "document"], …]`).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum ClassifyInput {
    Text(String),
    Texts(Vec<String>),
    Pairs(Vec<(String, String)>),
}
