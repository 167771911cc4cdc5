//! Replicas behind a router: three `qkv serve` processes behind nginx running
//! `deploy/nginx/qkv.conf` as shipped (only its addresses replaced), 32 streams through
//! it, and one replica stopped by SIGTERM while it streams. No request may be lost:
//! every stream, those the stopped replica was streaming and those sent after the stop,
//! ends with its full text, the text a replica gives that prompt alone.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::http::{request, Reply, Server};
use super::{joined, model, text_of};

const STREAMS: usize = 32;
/// Streams sent after the stop (of the 32), which must all find the two replicas left.
const AFTER_STOP: usize = 8;
const TOKENS: usize = 400;

/// nginx as one foreground process (no master: killing it leaves no worker behind),
/// killed when dropped.
struct Nginx {
    child: Child,
    addr: SocketAddr,
    dir: PathBuf,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The shipped config with the replicas' addresses and a free port of 127.0.0.1.
fn config(replicas: &[SocketAddr], port: u16) -> String {
    let shipped = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/nginx/qkv.conf"),
    )
    .unwrap();
    let mut servers = replicas.iter();
    let lines: Vec<String> = shipped
        .lines()
        .map(|line| {
            let t = line.trim_start();
            if t.starts_with("server 127.0.0.1:") {
                let addr = servers.next().expect("three replicas");
                format!("    server {addr} max_fails=0;")
            } else if t.starts_with("listen ") {
                format!("    listen 127.0.0.1:{port};")
            } else {
                line.to_string()
            }
        })
        .collect();
    assert!(servers.next().is_none(), "the config lists three replicas");
    lines.join("\n")
}

fn start_nginx(replicas: &[SocketAddr]) -> Nginx {
    let bin = std::env::var("QKV_NGINX")
        .expect("QKV_NGINX is not set (.ci/run installs nginx by tools/nginx.sh and sets it)");
    let dir = std::env::temp_dir().join(format!("qkv-nginx-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    std::fs::write(dir.join("qkv.conf"), config(replicas, port)).unwrap();
    let d = dir.display();
    let temp: String = ["client_body", "proxy", "fastcgi", "uwsgi", "scgi"]
        .iter()
        .map(|t| format!("{t}_temp_path {d}/{t};\n"))
        .collect();
    let main = format!(
        "daemon off;\nmaster_process off;\npid {d}/nginx.pid;\nerror_log {d}/error.log;\n\
         events {{ worker_connections 512; }}\n\
         http {{\naccess_log off;\n{temp}include {d}/qkv.conf;\n}}\n"
    );
    std::fs::write(dir.join("nginx.conf"), main).unwrap();
    let child = Command::new(bin)
        .arg("-p")
        .arg(&dir)
        .arg("-c")
        .arg(dir.join("nginx.conf"))
        .stderr(Stdio::null())
        .spawn()
        .expect("nginx starts");
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let started = Instant::now();
    while TcpStream::connect(addr).is_err() {
        let log = std::fs::read_to_string(dir.join("error.log")).unwrap_or_default();
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "nginx does not listen: {log}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Nginx { child, addr, dir }
}

fn post(addr: SocketAddr, body: &Value) -> Reply {
    let body = body.to_string();
    request(addr, "POST", "/v1/completions", &[], Some(body.as_bytes()))
}

fn ask(prompt: &str, stream: bool) -> Value {
    json!({"model": "m", "prompt": prompt, "max_tokens": TOKENS, "temperature": 0, "stream": stream})
}

#[test]
#[ignore = "needs nginx: set QKV_NGINX (tools/nginx.sh installs it), as .ci/run does"]
fn replicas_behind_nginx_lose_no_request_when_one_stops() {
    let mut replicas: Vec<Server> = (0..3)
        .map(|_| Server::start(model(), &["--grace", "60", "--max-tokens", "1000"]))
        .collect();
    let addrs: Vec<SocketAddr> = replicas.iter().map(|s| s.addr).collect();
    let nginx = start_nginx(&addrs);
    let prompts: Vec<String> = (0..STREAMS)
        .map(|i| format!("stream {i} of attention"))
        .collect();
    // each prompt's text, asked of one replica directly
    let want: Vec<String> = prompts
        .iter()
        .map(|p| text_of(&replicas[2].post("/v1/completions", &ask(p, false)).json()))
        .collect();

    let stop_after = STREAMS - AFTER_STOP;
    let got: Vec<Reply> = std::thread::scope(|scope| {
        let mut running = Vec::new();
        for p in &prompts[..stop_after] {
            let addr = nginx.addr;
            running.push(scope.spawn(move || post(addr, &ask(p, true))));
        }
        // stop replica 0 once it streams some of them
        let started = Instant::now();
        loop {
            let m = replicas[0].get("/metrics").body;
            let stepping = m
                .lines()
                .find(|l| l.starts_with("qkv_batch_size_count"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .unwrap_or(0);
            if stepping > 0 {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "replica 0 never stepped"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        replicas[0].terminate();
        for p in &prompts[stop_after..] {
            let addr = nginx.addr;
            running.push(scope.spawn(move || post(addr, &ask(p, true))));
        }
        running.into_iter().map(|t| t.join().unwrap()).collect()
    });

    for ((r, p), want) in got.iter().zip(&prompts).zip(&want) {
        assert_eq!(r.status, 200, "{p}: {}", r.body);
        let (text, finish, done) = joined(&r.events());
        assert_eq!((finish.as_str(), done), ("length", true), "{p}: {}", r.body);
        assert_eq!(&text, want, "{p}");
    }
    // the stopped replica drained its streams and exited 0
    let status = replicas[0].child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    let log = replicas[0].log_with("stopping");
    let in_flight: usize = log
        .lines()
        .find_map(|l| l.strip_prefix("qkv serve: stopping; "))
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .expect("the stop is logged");
    assert!(in_flight > 0, "the stop came mid-stream: {log}");
}
