//! The one error type of the library: everything a user's input can cause.

/// Errors name the tensor, field or file at fault so the message alone says what to fix.
/// New kinds may be added, so a `match` on it needs a `_` arm.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A tensor's shape does not fit what an operation needs.
    #[error("shape mismatch for `{tensor}`: expected {expected}, got {got:?}")]
    Shape {
        tensor: String,
        expected: String,
        got: Vec<usize>,
    },
    /// A tensor holds NaN or an infinity where finite numbers are required.
    #[error("`{tensor}` holds a non-finite value ({value}) at flat index {index}")]
    NonFinite {
        tensor: String,
        index: usize,
        value: f32,
    },
    /// A parameter or option is out of its valid range.
    #[error("invalid `{field}`: {reason}")]
    Invalid { field: String, reason: String },
    /// An index (token id, position) lies outside its table.
    #[error("`{what}` index {index} is out of range (size {size})")]
    OutOfRange {
        what: String,
        index: usize,
        size: usize,
    },
    /// Reading or writing a file failed. The OS message is part of the Display text
    /// and deliberately not also the `source()`, so a chain printer (anyhow's `{:#}`)
    /// says it once.
    #[error("{path}: {error}")]
    Io { path: String, error: std::io::Error },
    /// A config file is invalid JSON, lacks a field or holds a value qkv cannot use.
    #[error("{path}: field `{field}`: {reason}")]
    Config {
        path: String,
        field: String,
        reason: String,
    },
    /// The input asks for something qkv does not implement (architecture, option).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A tokenizer could not be loaded or failed on the input.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// Work estimated to need more memory than the machine has available.
    #[error("{what} needs {need}; this machine has {available_gb:.1} GB available")]
    Memory {
        what: String,
        /// "about 12.3 GB", or "more memory than can be counted"
        need: String,
        available_gb: f64,
    },
    /// A safetensors file is malformed or lacks what was asked for.
    #[error("{path}: {reason}")]
    Safetensors { path: String, reason: String },
    /// A GGUF file is malformed or lacks what was asked for.
    #[error("{path}: {reason}")]
    Gguf { path: String, reason: String },
    /// A request's settings that cannot go together, or a step of a request that
    /// failed. `message` names the request's settings in backquotes (`init`,
    /// `stop_after`), which a program writes as its own options (`--init`, `init=`);
    /// `cause` is the failure underneath, shown after it as it is.
    #[error("{message}{}", cause.as_ref().map_or(String::new(), |c| format!(": {c}")))]
    Request {
        message: String,
        cause: Option<Box<Error>>,
    },
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub(crate) fn shape(
        tensor: impl Into<String>,
        expected: impl Into<String>,
        got: &[usize],
    ) -> Self {
        Error::Shape {
            tensor: tensor.into(),
            expected: expected.into(),
            got: got.to_vec(),
        }
    }

    /// A failed read or write of `path`.
    #[cfg_attr(not(feature = "io"), allow(dead_code))]
    pub(crate) fn io(path: &std::path::Path, error: std::io::Error) -> Self {
        Error::Io {
            path: path.display().to_string(),
            error,
        }
    }

    /// A [`Error::Request`] without a cause.
    pub(crate) fn request(message: impl Into<String>) -> Self {
        Error::Request {
            message: message.into(),
            cause: None,
        }
    }

    /// This error as the cause of the request step `message` (see [`Error::Request`]).
    #[cfg_attr(not(feature = "models"), allow(dead_code))]
    pub(crate) fn within(self, message: impl Into<String>) -> Self {
        Error::Request {
            message: message.into(),
            cause: Some(Box::new(self)),
        }
    }

    pub(crate) fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }
}
