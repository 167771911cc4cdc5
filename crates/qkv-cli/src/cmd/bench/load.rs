//! `qkv bench load`: a load generator for an OpenAI-style server (`qkv serve` or any
//! other). Client threads take requests from a file one after another, `--clients` in
//! flight at once, each over its own connection; a streamed answer's events are timed
//! as they arrive. It reports the rate of text events (tokens, with a stand-in
//! tokenizer that streams every token as its own piece), the time to the first and
//! between events (p50, p99), and stops on any request that fails or ends early.
//!
//! A thread blocks on its socket and does a clock read and a small JSON parse per
//! event, so the generator takes little of the cores it shares with the server:
//! `bench/serve_load.py` drives it.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::{json, Value};

#[derive(Args)]
pub struct LoadArgs {
    /// The server: `http://HOST:PORT`
    #[arg(long)]
    url: String,
    /// The requests, one JSON object a line: `{"path": "/v1/completions", "body":
    /// {...}}`; a body with `"stream": true` is read as server-sent events
    #[arg(long, value_name = "FILE.jsonl")]
    requests: PathBuf,
    /// Requests in flight at once
    #[arg(long, default_value_t = 1)]
    clients: usize,
    /// Also each request's time to its first event, its events and its text
    #[arg(long)]
    each: bool,
}

/// One request to send.
struct Ask {
    path: String,
    body: Vec<u8>,
    stream: bool,
}

/// One answered request: when it was sent, when each text event came, its text.
struct Timed {
    sent: Instant,
    events: Vec<Instant>,
    text: String,
}

pub fn run(a: &LoadArgs, out: &mut impl Write) -> Result<()> {
    if a.clients == 0 {
        bail!("--clients must be at least 1");
    }
    let addr = a
        .url
        .strip_prefix("http://")
        .with_context(|| format!("--url {}: an http://HOST:PORT address", a.url))?
        .trim_end_matches('/')
        .to_string();
    let asks = read_asks(&a.requests)?;
    let next = AtomicUsize::new(0);
    let start = Instant::now();
    let results: Vec<Result<(usize, Timed)>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..a.clients.min(asks.len()))
            .map(|_| {
                scope.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(ask) = asks.get(i) else {
                            return done;
                        };
                        let r = send(&addr, ask)
                            .with_context(|| format!("request {} ({})", i + 1, ask.path));
                        done.push(r.map(|t| (i, t)));
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("a client thread panicked"))
            .collect()
    });
    let wall = start.elapsed().as_secs_f64();
    let mut timed: Vec<Option<Timed>> = (0..asks.len()).map(|_| None).collect();
    for r in results {
        let (i, t) = r?;
        timed[i] = Some(t);
    }
    let timed: Vec<Timed> = timed.into_iter().flatten().collect();
    let (mut first, mut gaps, mut events) = (Vec::new(), Vec::new(), 0);
    for t in &timed {
        first.push(ms(t.events[0] - t.sent));
        gaps.extend(t.events.windows(2).map(|w| ms(w[1] - w[0])));
        events += t.events.len();
    }
    let mut report = json!({
        "requests": timed.len(),
        "clients": a.clients,
        "wall_s": wall,
        "events": events,
        "events_per_s": events as f64 / wall,
        "ttft_ms_p50": percentile(&first, 50.0),
        "ttft_ms_p99": percentile(&first, 99.0),
        "itl_ms_p50": percentile(&gaps, 50.0),
        "itl_ms_p99": percentile(&gaps, 99.0),
    });
    if a.each {
        report["each"] = timed
            .iter()
            .map(|t| json!({"ttft_ms": ms(t.events[0] - t.sent), "events": t.events.len(), "text": t.text}))
            .collect();
    }
    writeln!(out, "{report}")?;
    Ok(())
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The value at percentile `q` (the nearest rank), or null without values.
fn percentile(xs: &[f64], q: f64) -> Value {
    if xs.is_empty() {
        return Value::Null;
    }
    let mut s = xs.to_vec();
    s.sort_by(f64::total_cmp);
    let i = ((q / 100.0) * (s.len() - 1) as f64).round() as usize;
    json!(s[i.min(s.len() - 1)])
}

fn read_asks(path: &PathBuf) -> Result<Vec<Ask>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("--requests {}", path.display()))?;
    let mut asks = Vec::new();
    for (n, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let at = || format!("--requests {} line {}", path.display(), n + 1);
        let v: Value = serde_json::from_str(line).with_context(at)?;
        let (Some(p), Some(body)) = (v["path"].as_str(), v.get("body")) else {
            bail!("{}: needs a \"path\" string and a \"body\"", at());
        };
        asks.push(Ask {
            path: p.to_string(),
            body: body.to_string().into_bytes(),
            stream: body["stream"] == true,
        });
    }
    if asks.is_empty() {
        bail!("--requests {}: no requests in it", path.display());
    }
    Ok(asks)
}

/// Sends one request on a connection of its own and times its answer; an answer that
/// is not a 200 or a stream that does not end in `[DONE]` is an error.
fn send(addr: &str, ask: &Ask) -> Result<Timed> {
    let mut s = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
    s.set_nodelay(true)?;
    let head = format!(
        "POST {} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        ask.path,
        ask.body.len()
    );
    let sent = Instant::now();
    s.write_all(head.as_bytes())?;
    s.write_all(&ask.body)?;
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line)?;
    let status: u16 = line
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .with_context(|| format!("not an HTTP status line: {line:?}"))?;
    let (mut chunked, mut length) = (false, None);
    loop {
        line.clear();
        r.read_line(&mut line)?;
        let h = line.trim_end().to_ascii_lowercase();
        if h.is_empty() {
            break;
        }
        if h == "transfer-encoding: chunked" {
            chunked = true;
        } else if let Some(n) = h.strip_prefix("content-length: ") {
            length = n.parse::<usize>().ok();
        }
    }
    let mut t = Timed {
        sent,
        events: Vec::new(),
        text: String::new(),
    };
    let mut body = Body {
        pending: Vec::new(),
        whole: Vec::new(),
        done: false,
        stream: ask.stream,
    };
    if chunked {
        loop {
            line.clear();
            r.read_line(&mut line)?;
            let size = usize::from_str_radix(line.trim_end(), 16)
                .with_context(|| format!("not a chunk size: {line:?}"))?;
            if size == 0 {
                break;
            }
            let mut chunk = vec![0; size + 2];
            r.read_exact(&mut chunk)?;
            chunk.truncate(size);
            body.feed(&chunk, &mut t)?;
        }
    } else {
        let mut all = Vec::new();
        match length {
            Some(n) => {
                all.resize(n, 0);
                r.read_exact(&mut all)?;
            }
            None => {
                r.read_to_end(&mut all)?;
            }
        }
        body.feed(&all, &mut t)?;
    }
    if status != 200 {
        bail!(
            "status {status}: {}",
            String::from_utf8_lossy(&body.whole)
                .chars()
                .take(300)
                .collect::<String>()
        );
    }
    match ask.stream {
        true if !body.done => bail!("the stream ended without [DONE]"),
        true if t.events.is_empty() => bail!("the stream carried no text"),
        true => {}
        false => t.events.push(Instant::now()),
    }
    Ok(t)
}

/// An answer's body as it arrives: whole, or as server-sent events whose text-carrying
/// ones are timed.
struct Body {
    pending: Vec<u8>,
    whole: Vec<u8>,
    done: bool,
    stream: bool,
}

impl Body {
    fn feed(&mut self, bytes: &[u8], t: &mut Timed) -> Result<()> {
        if !self.stream {
            self.whole.extend_from_slice(bytes);
            return Ok(());
        }
        self.pending.extend_from_slice(bytes);
        while let Some(end) = self.pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=end).collect();
            let Some(data) = line.strip_prefix(b"data: ") else {
                self.whole.extend_from_slice(&line);
                continue;
            };
            let data = data.trim_ascii_end();
            if data == b"[DONE]" {
                self.done = true;
                continue;
            }
            let v: Value = serde_json::from_slice(data).context("an event that is not JSON")?;
            let c = &v["choices"][0];
            let text = c["text"]
                .as_str()
                .or_else(|| c["delta"]["content"].as_str());
            if let Some(text) = text.filter(|s| !s.is_empty()) {
                t.events.push(Instant::now());
                t.text.push_str(text);
            }
        }
        Ok(())
    }
}
