//! `GET /metrics`: counters, gauges and histograms in Prometheus' text format, kept in
//! atomics so that recording never waits on a lock held by a scrape.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use qkv::engine::PrefixStats;

/// Cumulative buckets over fixed upper bounds, and the sum and count of the values.
struct Histogram {
    bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    /// the sum in millionths, so that it stays an atomic integer
    sum_micros: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            sum_micros: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    fn observe(&self, v: f64) {
        if let Some(i) = self.bounds.iter().position(|&b| v <= b) {
            self.counts[i].fetch_add(1, Ordering::Relaxed);
        }
        self.sum_micros
            .fetch_add((v * 1e6) as u64, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, help: &str, labels: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let sep = if labels.is_empty() { "" } else { "," };
        let mut total = 0;
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            total += c.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{b}\"}} {total}");
        }
        let count = self.count.load(Ordering::Relaxed);
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let braces = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {count}");
        let _ = writeln!(out, "{name}_sum{braces} {sum}");
        let _ = writeln!(out, "{name}_count{braces} {count}");
    }
}

const SECONDS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
const SIZES: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0];

/// Everything the server counts.
pub struct Metrics {
    /// (endpoint, status) → requests answered
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    prompt_tokens: AtomicU64,
    generated_tokens: AtomicU64,
    ignored_fields: AtomicU64,
    queue_depth: AtomicI64,
    /// the prefix cache's latest statistics
    prefix: Mutex<PrefixStats>,
    batch_size: Histogram,
    step_seconds: Histogram,
    first_token_seconds: Histogram,
    request_seconds: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            requests: Mutex::new(BTreeMap::new()),
            prompt_tokens: AtomicU64::new(0),
            generated_tokens: AtomicU64::new(0),
            ignored_fields: AtomicU64::new(0),
            queue_depth: AtomicI64::new(0),
            prefix: Mutex::new(PrefixStats::default()),
            batch_size: Histogram::new(SIZES),
            step_seconds: Histogram::new(SECONDS),
            first_token_seconds: Histogram::new(SECONDS),
            request_seconds: Histogram::new(SECONDS),
        }
    }
}

/// The `endpoint` label of a request to `path`: the path of a route the server has,
/// `other` for the rest (so a scan of random paths cannot grow the table without end).
pub fn endpoint(path: &str) -> &str {
    match path {
        "/health"
        | "/v1/models"
        | "/v1/completions"
        | "/v1/chat/completions"
        | "/v1/embeddings"
        | "/v1/rerank"
        | "/v1/classify"
        | "/tokenize"
        | "/detokenize"
        | "/metrics" => path,
        _ => "other",
    }
}

impl Metrics {
    pub fn request(&self, endpoint: &str, status: u16, took: Duration) {
        let mut r = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        *r.entry((endpoint.to_string(), status)).or_default() += 1;
        drop(r);
        self.request_seconds.observe(took.as_secs_f64());
    }

    pub fn prompt(&self, tokens: usize) {
        self.prompt_tokens
            .fetch_add(tokens as u64, Ordering::Relaxed);
    }

    pub fn tokens(&self, n: usize) {
        self.generated_tokens.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Unknown request fields ignored (not refused: the server is not `--strict`).
    pub fn ignored_fields(&self, n: usize) {
        self.ignored_fields.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// A job entered (+1) or left (−1) the queue.
    pub fn queued(&self, delta: i64) {
        self.queue_depth.fetch_add(delta, Ordering::Relaxed);
    }

    /// One decoding step (or one embedding batch) of `batch` sequences.
    pub fn step(&self, batch: usize, took: Duration) {
        self.batch_size.observe(batch as f64);
        self.step_seconds.observe(took.as_secs_f64());
    }

    /// The prefix cache's statistics after a change.
    pub fn prefix_cache(&self, stats: PrefixStats) {
        *self.prefix.lock().unwrap_or_else(|e| e.into_inner()) = stats;
    }

    /// Time from a request's arrival in the queue to its first token.
    pub fn first_token(&self, took: Duration) {
        self.first_token_seconds.observe(took.as_secs_f64());
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        out.push_str("# HELP qkv_requests_total Requests answered, by endpoint and status.\n");
        out.push_str("# TYPE qkv_requests_total counter\n");
        for ((endpoint, status), n) in self
            .requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            let _ = writeln!(
                out,
                "qkv_requests_total{{endpoint=\"{endpoint}\",status=\"{status}\"}} {n}"
            );
        }
        let counters = [
            (
                "qkv_prompt_tokens_total",
                "Prompt tokens read.",
                &self.prompt_tokens,
            ),
            (
                "qkv_generated_tokens_total",
                "Tokens generated.",
                &self.generated_tokens,
            ),
            (
                "qkv_ignored_fields_total",
                "Unknown request fields ignored.",
                &self.ignored_fields,
            ),
        ];
        for (name, help, v) in counters {
            let v = v.load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
            );
        }
        let p = *self.prefix.lock().unwrap_or_else(|e| e.into_inner());
        let prefix = [
            (
                "qkv_prefix_cache_lookup_tokens_total",
                "Prompt tokens looked up in the prefix cache.",
                "counter",
                p.looked_up as usize,
            ),
            (
                "qkv_prefix_cache_hit_tokens_total",
                "Prompt tokens restored from the prefix cache instead of computed.",
                "counter",
                p.hit as usize,
            ),
            (
                "qkv_prefix_cache_evicted_blocks_total",
                "Blocks evicted from the prefix cache to stay within --cache-bytes.",
                "counter",
                p.evicted as usize,
            ),
            (
                "qkv_prefix_cache_blocks",
                "Blocks of 16 positions held in the prefix cache.",
                "gauge",
                p.blocks,
            ),
            (
                "qkv_prefix_cache_bytes",
                "Bytes held in the prefix cache.",
                "gauge",
                p.bytes,
            ),
        ];
        for (name, help, kind, v) in prefix {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
            );
        }
        let q = self.queue_depth.load(Ordering::Relaxed).max(0);
        let _ = writeln!(
            out,
            "# HELP qkv_queue_depth Requests waiting to join the batch.\n# TYPE qkv_queue_depth gauge\nqkv_queue_depth {q}"
        );
        self.batch_size.render(
            &mut out,
            "qkv_batch_size",
            "Sequences per step (decoding ones and joining prompts).",
            "",
        );
        self.step_seconds.render(
            &mut out,
            "qkv_step_seconds",
            "Time of one step (decoding rows and the prompt chunks packed with them).",
            "",
        );
        self.first_token_seconds.render(
            &mut out,
            "qkv_time_to_first_token_seconds",
            "From arrival to the first token.",
            "",
        );
        self.request_seconds.render(
            &mut out,
            "qkv_request_seconds",
            "From arrival to the last byte of the answer.",
            "",
        );
        out
    }
}
