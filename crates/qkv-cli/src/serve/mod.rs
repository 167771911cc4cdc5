//! `qkv serve`: an OpenAI-compatible HTTP server over one model folder. A decoder (or
//! an encoder-decoder, which translates) answers `/v1/completions` and, with a chat
//! template, `/v1/chat/completions`; a sentence encoder answers `/v1/embeddings`; a
//! `…ForSequenceClassification` encoder answers `/v1/classify`, and `/v1/rerank` when
//! it is a cross-encoder of one output.
//!
//! The routes (HTTP, validation, OpenAI's JSON, server-sent events) run on a one-thread
//! tokio runtime, thin over the library's engine (`qkv::engine`): its generator
//! (continuous batching, the prefix cache), embedder (batches across clients) or
//! classifier on a thread of its own, the model's math on the rayon pool.

mod access;
mod api;
mod attentions;
mod engine;
mod lifecycle;
mod metrics;
mod routes;
mod state;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;
use qkv::engine::{classifier, embedder, generator};
use qkv::models::generate::config::GenerationConfig;
use qkv::models::sentence::SentenceEncoder;
use qkv::models::{ModelKind, SequenceClassifier};
use qkv::text::ChatTemplate;

use lifecycle::Lifecycle;
use metrics::Metrics;
use state::{AppState, Classifier, Embedder, Generator, Leniency, RequestLimits};

#[derive(clap::Args)]
pub struct ServeArgs {
    /// Hugging Face model folder: a decoder or encoder-decoder (text generation), a
    /// sentence-transformers / encoder folder (embeddings, mean pooling by default), or
    /// a `…ForSequenceClassification` encoder (classification; reranking for a
    /// cross-encoder)
    #[arg(long)]
    model: PathBuf,
    /// Address to listen on (loopback by default: give 0.0.0.0 to serve the network)
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0: any free port, printed at start)
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// The model's name in the API [default: the folder's name]
    #[arg(long)]
    name: Option<String>,
    /// Another name the model answers to and `/v1/models` lists (repeat for more); any
    /// name is answered unless --strict-model
    #[arg(long = "alias", value_name = "NAME")]
    aliases: Vec<String>,
    /// Answer 404 to a request naming a model other than --name and the aliases (by
    /// default any name is answered: there is one model)
    #[arg(long)]
    strict_model: bool,
    /// Refuse request fields qkv does not read with a 400 naming the field (by default
    /// they are ignored, logged once each and counted in /metrics)
    #[arg(long)]
    strict: bool,
    /// A key requests must bring as `Authorization: Bearer KEY` (repeat for more); 401
    /// without it. /health and /metrics stay open unless --protect-health-metrics
    #[arg(long = "api-key", value_name = "KEY")]
    api_keys: Vec<String>,
    /// A file of keys, one a line (blank lines and lines starting with # skipped): keeps
    /// them out of the process list
    #[arg(long, value_name = "FILE")]
    api_key_file: Option<PathBuf>,
    /// /health and /metrics need a key too
    #[arg(long)]
    protect_health_metrics: bool,
    /// A browser origin allowed to call the API across sites (`https://app.example`, or
    /// `*` for any; repeat for more); no CORS headers are sent without one
    #[arg(long = "cors-origin", value_name = "ORIGIN")]
    cors_origins: Vec<String>,
    /// Sequences decoded together at most
    #[arg(long, default_value_t = 32)]
    max_batch: usize,
    /// Requests waiting to join at most; more are answered 503 with Retry-After
    #[arg(long, default_value_t = 256)]
    max_queue: usize,
    /// New tokens a request may ask for at most (also a chat request's length when it
    /// gives none)
    #[arg(long, default_value_t = 1024)]
    max_tokens: usize,
    /// Prompt tokens a request may have at most
    #[arg(long, default_value_t = 8192)]
    max_prompt: usize,
    /// Request body bytes at most (413 beyond)
    #[arg(long, default_value_t = 4 << 20)]
    max_body: usize,
    /// Prompt tokens packed into one decoding step of the running batch at most
    #[arg(long, default_value_t = 256)]
    prefill_chunk: usize,
    /// Bytes of keys and values kept for prompts that start the same way (a chat's
    /// earlier turns, a shared system prompt): 0 keeps none
    #[arg(long, default_value_t = 1 << 30)]
    cache_bytes: usize,
    /// Embeddings: tokens per batched call across clients
    #[arg(long, default_value_t = 8192)]
    embed_budget: usize,
    /// Seconds in-flight requests get to finish after SIGTERM or Ctrl-C
    #[arg(long, default_value_t = 30)]
    grace: u64,
    /// Worker threads of the model's products (default: all cores); the HTTP
    /// connections run on one thread of their own
    #[arg(long)]
    threads: Option<usize>,
    /// Number type of the linear layers' weights: auto (bf16 where the CPU multiplies
    /// bf16 natively, with AVX512-BF16 or AMX; f32 elsewhere), or one of f32, bf16, int8,
    /// int8-row as `qkv generate --dtype` takes them
    #[arg(long, default_value = "auto", value_parser = parse_dtype)]
    dtype: WeightsDType,
    #[command(flatten)]
    kv_dtype: crate::cmd::shared_flags::KvDTypeFlag,
}

/// `--dtype`: a type, or `auto` (None).
#[derive(Clone, Copy)]
struct WeightsDType(Option<qkv::weights::DType>);

fn parse_dtype(s: &str) -> std::result::Result<WeightsDType, String> {
    match s {
        "auto" => Ok(WeightsDType(None)),
        _ => crate::cmd::shared_flags::parse_dtype(s).map(|d| WeightsDType(Some(d))),
    }
}

impl WeightsDType {
    /// The type, `auto` resolved on this CPU.
    fn resolve(self) -> qkv::weights::DType {
        use qkv::weights::DType;
        self.0.unwrap_or(match qkv::weights::bf16::native() {
            true => DType::Bf16,
            false => DType::F32,
        })
    }
}

fn check_args(a: &ServeArgs) -> Result<()> {
    for (flag, v) in [
        ("--max-batch", a.max_batch),
        ("--max-queue", a.max_queue),
        ("--max-tokens", a.max_tokens),
        ("--max-prompt", a.max_prompt),
        ("--max-body", a.max_body),
        ("--prefill-chunk", a.prefill_chunk),
        ("--embed-budget", a.embed_budget),
    ] {
        if v == 0 {
            anyhow::bail!("{flag} must be at least 1");
        }
    }
    if a.aliases.iter().any(|n| n.trim().is_empty()) {
        anyhow::bail!("--alias: a name must not be empty");
    }
    Ok(())
}

pub fn run(args: &ServeArgs) -> Result<()> {
    check_args(args)?;
    let keys = Arc::new(access::Keys::new(
        &args.api_keys,
        args.api_key_file.as_deref(),
        args.protect_health_metrics,
    )?);
    let cors = access::cors(&args.cors_origins)?;
    crate::cmd::shared_flags::set_threads(args.threads)?;
    let addr: SocketAddr = format!("{}:{}", args.host, args.port)
        .parse()
        .with_context(|| format!("--host {} --port {}: not an address", args.host, args.port))?;
    let name = match &args.name {
        Some(n) => n.clone(),
        None => args
            .model
            .canonicalize()
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_else(|| args.model.display().to_string()),
    };
    let metrics = Arc::new(Metrics::default());
    let limits = RequestLimits {
        max_tokens: args.max_tokens,
        max_prompt: args.max_prompt,
        max_inputs: 2048,
        max_batch: args.max_batch,
    };
    let dtype = args.dtype.resolve();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    // the port opens before the model loads: /health says "loading" meanwhile
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind(addr))
        .with_context(|| format!("listening on {addr}"))?;
    let local = listener.local_addr()?;
    eprintln!(
        "qkv serve: loading {} ({dtype} weights); {local} answers 503 until it is ready",
        args.model.display()
    );
    let life = Lifecycle::new(metrics.clone());
    let grace = Duration::from_secs(args.grace);
    let server = runtime.spawn(serve(listener, life.clone(), grace));
    let Served {
        state,
        app,
        _engine,
    } = load(
        args,
        Unloaded {
            name,
            metrics,
            limits,
            dtype,
        },
        keys.clone(),
        cors,
    )?;
    life.ready(app);
    eprintln!("qkv serve: `{}` on http://{local}", state.name);
    eprintln!("qkv serve: {dtype} weights");
    eprintln!("qkv serve: {}", state.endpoints().join(", "));
    if !keys.is_empty() {
        eprintln!("qkv serve: requests need one of the API keys given");
    }
    runtime.block_on(server)?
}

/// What the server knows before the model is loaded.
struct Unloaded {
    name: String,
    metrics: Arc<Metrics>,
    limits: RequestLimits,
    dtype: qkv::weights::DType,
}

/// The loaded server: its state, its routes, and the engine's threads.
struct Served {
    state: Arc<AppState>,
    app: Router,
    _engine: Vec<std::thread::JoinHandle<()>>,
}

/// Loads the model and starts its engine: the routes over them.
fn load(
    args: &ServeArgs,
    Unloaded {
        name,
        metrics,
        limits,
        dtype,
    }: Unloaded,
    keys: Arc<access::Keys>,
    cors: Option<tower_http::cors::CorsLayer>,
) -> Result<Served> {
    let mut loaded = crate::cmd::load::load_model(&args.model, dtype)?;
    let mut threads = Vec::new();
    let classifies = loaded.model.kind() == ModelKind::Encoder
        && loaded
            .model
            .info()
            .architecture
            .ends_with("ForSequenceClassification");
    let (generator, embedder, classifier) = match loaded.model.kind() {
        ModelKind::Encoder if classifies => {
            drop(loaded);
            let model = Arc::new(
                SequenceClassifier::load(&args.model, dtype)
                    .with_context(|| format!("loading {}", args.model.display()))?,
            );
            let (queue, t) = classifier::start(model.clone(), args.max_queue, metrics.clone())?;
            threads.push(t);
            (None, None, Some(Classifier { model, queue }))
        }
        ModelKind::Encoder => {
            drop(loaded);
            let encoder = Arc::new(
                SentenceEncoder::load_in(&args.model, dtype)
                    .with_context(|| format!("loading {}", args.model.display()))?,
            );
            let (queue, t) = embedder::start(
                encoder.clone(),
                args.embed_budget,
                args.max_queue,
                metrics.clone(),
            )?;
            threads.push(t);
            (None, Some(Embedder { encoder, queue }), None)
        }
        _ => {
            loaded.model.kv_dtype = args.kv_dtype.kv_dtype;
            if dtype == qkv::weights::DType::F32 {
                // a step of many sequences is a matrix product: packed once here, not at
                // every step (a one-sequence step still reads the weights in place)
                loaded.model.pack_weights();
            }
            let model = Arc::new(loaded.model);
            let tokenizer = crate::cmd::load::tokenizer(&args.model, &model, false)?.map(Arc::new);
            let template = ChatTemplate::from_dir(&args.model)?;
            let config = GenerationConfig::read(&args.model)?;
            for w in &config.unapplied {
                eprintln!("warning: {w}");
            }
            let (queue, t) = generator::start(
                model.clone(),
                tokenizer.clone(),
                generator::Limits {
                    max_batch: args.max_batch,
                    max_queue: args.max_queue,
                    prefill_chunk: args.prefill_chunk,
                    cache_bytes: args.cache_bytes,
                },
                metrics.clone(),
            )?;
            threads.push(t);
            let token_bytes = tokenizer
                .as_ref()
                .map(|t| Arc::new(t.token_bytes(model.arch.vocab)));
            let g = Generator {
                model,
                tokenizer,
                token_bytes,
                vocabulary: Default::default(),
                config,
                template,
                renderer: crate::cmd::load::template_renderer()?,
                queue,
            };
            (Some(g), None, None)
        }
    };
    let state = Arc::new(AppState {
        name,
        leniency: Leniency {
            strict_fields: args.strict,
            strict_model: args.strict_model,
            aliases: args.aliases.clone(),
        },
        logged_fields: Default::default(),
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        metrics,
        limits,
        generator,
        embedder,
        classifier,
        ids: AtomicU64::new(0),
    });
    let app = Router::new()
        .route("/health", get(routes::health))
        .route("/v1/models", get(routes::models))
        .route("/metrics", get(routes::metrics))
        .route("/v1/completions", post(routes::completions))
        .route("/v1/chat/completions", post(routes::chat))
        .route("/v1/embeddings", post(routes::embeddings))
        .route("/v1/rerank", post(routes::rerank))
        .route("/v1/classify", post(routes::classify))
        .route("/tokenize", post(routes::tokenize))
        .route("/detokenize", post(routes::detokenize))
        .fallback(routes::not_found)
        .method_not_allowed_fallback(routes::method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(
            keys.clone(),
            access::require_key,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            routes::log,
        ))
        .layer(DefaultBodyLimit::max(args.max_body));
    // outside the key check, so that a browser's preflight is answered and a 401 carries
    // the CORS headers the browser needs to read it
    let app = match cors {
        Some(cors) => app.layer(cors),
        None => app,
    };
    let app = app
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(panicked))
        .with_state(state.clone());
    Ok(Served {
        state,
        app,
        _engine: threads,
    })
}

/// Serves the gate on `listener` until SIGTERM or Ctrl-C, then drains: new requests are
/// turned away while those in flight get `grace` to finish.
async fn serve(
    listener: tokio::net::TcpListener,
    life: Arc<Lifecycle>,
    grace: Duration,
) -> Result<()> {
    let stop = Arc::new(tokio::sync::Notify::new());
    let stopping = stop.clone();
    let draining = life.clone();
    let server = axum::serve(listener, life.gate()).with_graceful_shutdown(async move {
        signal().await;
        if draining.drain() {
            eprintln!("qkv serve: stopped while loading");
            std::process::exit(0);
        }
        eprintln!(
            "qkv serve: stopping; {} requests in flight have {}s",
            draining.in_flight(),
            grace.as_secs()
        );
        stopping.notify_one();
        // the listener closes once they are done
        draining.idle().await;
    });
    tokio::select! {
        r = server => r.context("serving")?,
        _ = async { stop.notified().await; tokio::time::sleep(grace).await } => {
            eprintln!("qkv serve: the grace period is over; exiting");
        }
    }
    Ok(())
}

/// SIGTERM or Ctrl-C.
async fn signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

/// A handler that panicked answers 500 alone; the server goes on.
fn panicked(err: Box<dyn std::any::Any + Send + 'static>) -> axum::response::Response {
    let why = err
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| err.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into());
    use axum::response::IntoResponse;
    api::ApiError::status(
        axum::http::StatusCode::INTERNAL_SERVER_ERROR,
        format!("the server failed on this request: {why}"),
    )
    .into_response()
}
