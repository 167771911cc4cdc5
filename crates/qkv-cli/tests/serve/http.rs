//! A small HTTP/1.1 client over `TcpStream` for the server tests, and the server process
//! they start on 127.0.0.1 at a free port and always stop by its PID.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

pub struct Server {
    pub child: Child,
    pub addr: SocketAddr,
    /// the routes the start line lists
    pub endpoints: String,
    /// what the server has written to stderr so far
    log: Arc<Mutex<String>>,
}

impl Server {
    /// `qkv serve --model dir --port 0 ARGS`, once it listens (it prints its address).
    pub fn start(dir: &Path, args: &[&str]) -> Server {
        Self::start_with(dir, args, &[])
    }

    /// [`Server::start`] with environment variables.
    pub fn start_with(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_qkv"))
            .envs(env.iter().copied())
            .args([
                "serve",
                "--model",
                dir.to_str().unwrap(),
                "--port",
                "0",
                "--threads",
                "2",
            ])
            .args(args)
            // the weights as `qkv generate` reads them, whatever `auto` picks on this CPU
            .args(match args.contains(&"--dtype") {
                true => &[][..],
                false => &["--dtype", "f32"][..],
            })
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("qkv serve starts");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        let log = Arc::new(Mutex::new(String::new()));
        let kept = log.clone();
        // read the log to its end, so that the server never blocks writing it
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut kept = kept.lock().unwrap();
                kept.push_str(&line);
                kept.push('\n');
                drop(kept);
                if let Some(addr) = line.split("on http://").nth(1) {
                    let _ = tx.send(addr.trim().to_string());
                }
                if line.starts_with("qkv serve: POST ") {
                    let _ = tx.send(line);
                }
            }
        });
        let (addr, endpoints) = match (
            rx.recv_timeout(Duration::from_secs(120)),
            rx.recv_timeout(Duration::from_secs(10)),
        ) {
            (Ok(a), Ok(e)) => (a.parse().unwrap(), e),
            _ => {
                let _ = child.kill();
                panic!("qkv serve did not start listening: {:?}", child.wait());
            }
        };
        Server {
            child,
            addr,
            endpoints,
            log,
        }
    }

    /// The server's stderr once it holds `needle` (or after 10 s without it).
    pub fn log_with(&self, needle: &str) -> String {
        let start = std::time::Instant::now();
        loop {
            let log = self.log.lock().unwrap().clone();
            if log.contains(needle) || start.elapsed() > Duration::from_secs(10) {
                return log;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The model's name in the API, as `/v1/models` lists it.
    pub fn name(&self) -> String {
        let models = self.get("/v1/models").json();
        models["data"][0]["id"].as_str().unwrap().to_string()
    }

    pub fn get(&self, path: &str) -> Reply {
        self.send("GET", path, None)
    }

    pub fn post(&self, path: &str, body: &Value) -> Reply {
        self.send("POST", path, Some(body.to_string().as_bytes()))
    }

    pub fn send(&self, method: &str, path: &str, body: Option<&[u8]>) -> Reply {
        self.send_with(method, path, &[], body)
    }

    /// [`Server::send`] with more headers.
    pub fn send_with(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
    ) -> Reply {
        request(self.addr, method, path, headers, body)
    }

    pub fn connect(&self) -> TcpStream {
        connect(self.addr)
    }

    /// Sends SIGTERM.
    pub fn terminate(&self) {
        let ok = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("{e}: not JSON: {:?} ({})", self.body, self.status))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The `data:` payloads of a server-sent event stream.
    pub fn events(&self) -> Vec<String> {
        self.body
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(str::to_string)
            .collect()
    }
}

/// A connection to `addr` (a server, or a router in front of servers).
pub fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).expect("the server accepts");
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    s
}

/// One request to `addr` on a connection of its own, and its whole reply.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
) -> Reply {
    let mut s = connect(addr);
    let body = body.unwrap_or_default();
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: qkv\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{extra}Connection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    read_reply(&mut s)
}

/// Reads a whole reply (the connection is closed after it), de-chunking the body.
pub fn read_reply(s: &mut TcpStream) -> Reply {
    read_reply_after(Vec::new(), s)
}

/// [`read_reply`] for a reply whose first bytes, `raw`, were read already.
pub fn read_reply_after(mut raw: Vec<u8>, s: &mut TcpStream) -> Reply {
    s.read_to_end(&mut raw).expect("the reply");
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no header end in {:?}", String::from_utf8_lossy(&raw)));
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.lines();
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    if chunked {
        body = dechunk(&body);
    }
    Reply {
        status,
        headers,
        body: String::from_utf8(body).expect("a UTF-8 body"),
    }
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let eol = b
            .windows(2)
            .position(|w| w == b"\r\n")
            .expect("a chunk size");
        let size =
            usize::from_str_radix(std::str::from_utf8(&b[..eol]).unwrap().trim(), 16).unwrap();
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + size]);
        b = &b[eol + 2 + size + 2..];
    }
}
