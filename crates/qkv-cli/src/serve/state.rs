//! What the handlers share: the model's engine (a generator, an embedder or a
//! classifier, each with its queue), the request limits, and the server's own name,
//! metrics and ids.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use qkv::models::generate::config::GenerationConfig;
use qkv::models::generate::grammar::Vocabulary;
use qkv::models::sentence::SentenceEncoder;
use qkv::models::{SequenceClassifier, Transformer};
use qkv::text::{ChatTemplate, Tokenizer};

use qkv::engine::classifier::ClassifyJob;
use qkv::engine::embedder::EmbedJob;
use qkv::engine::{Job, Queue};

use super::metrics::Metrics;

/// A text generator: the model, its folder's tokenizer, generation defaults and chat
/// template, and the generator's queue.
pub struct Generator {
    pub(super) model: Arc<Transformer>,
    pub(super) tokenizer: Option<Arc<Tokenizer>>,
    /// the bytes of each token, for log-probabilities (with a tokenizer)
    pub(super) token_bytes: Option<Arc<Vec<Vec<u8>>>>,
    /// the vocabulary as the grammar engine reads it, built at the first request for
    /// structured output
    pub(super) vocabulary: Arc<OnceLock<Result<Vocabulary, String>>>,
    pub(super) config: GenerationConfig,
    pub(super) template: Option<ChatTemplate>,
    /// renders `template` in worker processes, bounded in memory and time
    pub(super) renderer: qkv::text::Renderer,
    pub(super) queue: Queue<Job>,
}

pub struct Embedder {
    pub(super) encoder: Arc<SentenceEncoder>,
    pub(super) queue: Queue<EmbedJob>,
}

pub struct Classifier {
    pub(super) model: Arc<SequenceClassifier>,
    pub(super) queue: Queue<ClassifyJob>,
}

/// Bounds on what one request may ask.
#[derive(Clone, Copy)]
pub struct RequestLimits {
    pub(super) max_tokens: usize,
    pub(super) max_prompt: usize,
    /// texts in one embeddings request
    pub(super) max_inputs: usize,
    /// sequences decoded together (`--max-batch`): the most choices one prompt may ask
    pub(super) max_batch: usize,
}

/// How strictly requests are read: what OpenAI clients and agents send beyond what
/// qkv reads (unknown fields, another model's name) is accepted unless asked otherwise.
#[derive(Clone, Debug, Default)]
pub struct Leniency {
    /// Unknown fields are a 400 (`--strict`), not ignored.
    pub(super) strict_fields: bool,
    /// A model name other than the server's and its aliases is a 404 (`--strict-model`).
    pub(super) strict_model: bool,
    /// Other names the model answers to (`--alias`), listed by `/v1/models`.
    pub(super) aliases: Vec<String>,
}

/// Distinct unknown field names logged at most: a client cannot fill the log (or this
/// set) by sending new names.
const LOGGED_FIELDS: usize = 64;

pub struct AppState {
    pub(super) name: String,
    pub(super) leniency: Leniency,
    /// unknown field names already logged (once each), their first 64 characters
    pub(super) logged_fields: Mutex<BTreeSet<String>>,
    pub(super) created: u64,
    pub(super) metrics: Arc<Metrics>,
    pub(super) limits: RequestLimits,
    pub(super) generator: Option<Generator>,
    pub(super) embedder: Option<Embedder>,
    pub(super) classifier: Option<Classifier>,
    pub(super) ids: AtomicU64,
}

impl AppState {
    /// The names the model answers to: the server's, then the aliases.
    pub(super) fn model_names(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.name.as_str()).chain(self.leniency.aliases.iter().map(String::as_str))
    }

    /// Counts the unknown fields a request brought (ignored unless `--strict`), and logs
    /// each name the first time it is seen.
    pub(super) fn ignored_fields(&self, endpoint: &str, fields: &[String]) {
        if fields.is_empty() {
            return;
        }
        self.metrics.ignored_fields(fields.len());
        let mut logged = self.logged_fields.lock().unwrap_or_else(|e| e.into_inner());
        for f in fields {
            // the name as logged and kept: a key may be megabytes long
            let shown: String = f.chars().take(64).collect();
            if logged.len() < LOGGED_FIELDS && logged.insert(shown.clone()) {
                eprintln!("qkv serve: {endpoint}: ignoring the unknown field {shown:?} (logged once; --strict refuses them)");
            }
        }
    }

    pub(super) fn next_id(&self) -> u64 {
        self.ids.fetch_add(1, Ordering::Relaxed)
    }

    /// The routes this model answers, as the start line lists them.
    pub(super) fn endpoints(&self) -> Vec<&'static str> {
        let mut e = Vec::new();
        if let Some(g) = &self.generator {
            e.push("POST /v1/completions");
            if g.template.is_some() {
                e.push("POST /v1/chat/completions");
            }
        }
        if self.embedder.is_some() {
            e.push("POST /v1/embeddings");
        }
        if let Some(c) = &self.classifier {
            e.push("POST /v1/classify");
            if c.model.check_reranker().is_ok() {
                e.push("POST /v1/rerank");
            }
        }
        e.extend([
            "POST /tokenize",
            "POST /detokenize",
            "GET /v1/models",
            "GET /health",
            "GET /metrics",
        ]);
        e
    }
}
