//! The OpenAI API's JSON shapes as the server reads and writes them, and its error
//! object. Requests name every field they accept: an unknown one is refused with 400 and
//! its name, as OpenAI's API does, rather than ignored.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

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

/// A request body as JSON: an object, with the keys outside `fields` taken out and
/// returned (llama-server and vLLM ignore them too), or refused with a 400 naming the
/// first when `strict`.
pub fn body_json(
    body: &[u8],
    fields: &[&[&str]],
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
    let unknown: Vec<String> = map
        .keys()
        .filter(|k| !fields.iter().any(|f| f.contains(&k.as_str())))
        .cloned()
        .collect();
    if let (true, Some(k)) = (strict, unknown.first()) {
        return Err(ApiError::invalid(
            k.clone(),
            format!("unrecognized request argument supplied: {k} (the server runs with --strict)"),
        ));
    }
    for k in &unknown {
        map.remove(k);
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

/// A prompt: one text, or one sequence of token ids. (A list of several prompts, which
/// OpenAI answers with one choice each, is refused: `n` and batching are per request.)
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<u32>),
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
    "seed",
    "stop",
    "n",
    "stream",
    "stream_options",
    "frequency_penalty",
    "presence_penalty",
    "logprobs",
    // who asked, for the caller's own logs: accepted and not used
    "user",
    "qkv",
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
    pub seed: Option<u64>,
    pub stop: Option<Stop>,
    pub n: Option<usize>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    /// Accepted at 0 only: qkv applies no frequency or presence penalty.
    pub frequency_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    /// Accepted as false or null only.
    pub logprobs: Option<Value>,
    /// qkv's own: attention maps on request.
    pub qkv: Option<QkvOptions>,
    /// Who asked, for the caller's own logs: read to check it is a string, not used.
    #[allow(dead_code)]
    pub user: Option<String>,
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
    pub content: Content,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// A message's content: a string, or content parts. Read through a JSON value so that a
/// wrong shape is named in words, not as an untagged enum's variants.
#[derive(Debug, Deserialize, Serialize, Clone)]
#[serde(try_from = "Value")]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<Part>),
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
