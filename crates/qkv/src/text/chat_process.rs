//! Chat templates rendered in a child process, bounded in memory and time.
//!
//! Fuel bounds a template's steps and a cap its output, but not the values it builds on
//! the way: `{% set ns.s = ns.s ~ ns.s %}` thirty times in a loop is a 10 GB string in
//! a few hundred steps, and no Jinja engine can stop it from inside. A server renders
//! the folder's template over what any client sends, so it renders in a worker process
//! whose address space is limited ([`MEMORY_LIMIT`] above its size at start): a
//! template that builds too much ends the worker, not the server, and the request gets
//! one clear error naming the template. The parent gives each render [`TIME_LIMIT`]
//! and ends a worker that takes longer.
//!
//! A worker is the program given to [`Renderer::new`] (the `qkv` binary runs
//! [`serve_renders`] under a hidden subcommand) and answers one JSON line a request;
//! idle workers are kept for the next render.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::Mutex;
use std::time::Duration;

use serde_json::{json, Map, Value as Json};

use super::chat::ChatTemplate;
use crate::error::{Error, Result};

/// The bytes a worker may map beyond what it had mapped at start: room for the
/// largest prompt ([`super::chat::MAX_RENDERED_BYTES`]) many times over.
pub const MEMORY_LIMIT: u64 = 1 << 30;

/// The longest one render may take; fuel stops a loop well before this, so it ends a
/// template spending its time inside one filter call (a sort of millions of items).
pub const TIME_LIMIT: Duration = Duration::from_secs(20);

/// Idle workers kept for later renders; more may run at once while requests overlap.
const IDLE_KEPT: usize = 4;

/// Renders chat templates in worker processes started as `program args…`.
pub struct Renderer {
    program: PathBuf,
    args: Vec<String>,
    idle: Mutex<Vec<Worker>>,
}

struct Worker {
    child: Child,
    stdin: ChildStdin,
    /// the worker's answer lines, read by a thread of their own so that a wait can
    /// time out
    lines: Receiver<std::io::Result<String>>,
}

impl Renderer {
    /// A renderer whose workers run `program args…`, a program that calls
    /// [`serve_renders`] on its stdin and stdout. Nothing starts until the first render.
    pub fn new(program: PathBuf, args: Vec<String>) -> Renderer {
        Renderer {
            program,
            args,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// [`ChatTemplate::render_with`] in a worker: the same text, or the same error, or
    /// an error naming the template when the render passes [`MEMORY_LIMIT`] or
    /// [`TIME_LIMIT`].
    pub fn render(
        &self,
        template: &ChatTemplate,
        messages: &[Json],
        add_generation_prompt: bool,
        extra: &Map<String, Json>,
    ) -> Result<String> {
        let request = json!({
            "source": template.source(),
            "special": template.special(),
            "path": template.path(),
            "messages": messages,
            "add_generation_prompt": add_generation_prompt,
            "extra": extra,
        });
        let mut line = serde_json::to_string(&request).expect("JSON values serialize");
        line.push('\n');
        let failed = |why: String| Error::invalid(template.field(), why);
        let taken = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let mut worker = match taken {
            // an idle worker may have been ended meanwhile: a fresh one takes the request
            Some(mut w) => match w.stdin.write_all(line.as_bytes()) {
                Ok(()) => w,
                Err(_) => self.start_with(template, &line)?,
            },
            None => self.start_with(template, &line)?,
        };
        let answer = match worker.lines.recv_timeout(TIME_LIMIT) {
            Ok(Ok(answer)) => answer,
            Err(RecvTimeoutError::Timeout) => {
                let _ = worker.child.kill();
                let _ = worker.child.wait();
                return Err(failed(format!(
                    "the template took more than {} s to render",
                    TIME_LIMIT.as_secs()
                )));
            }
            Ok(Err(_)) | Err(RecvTimeoutError::Disconnected) => {
                return Err(failed(worker.ended("stopped before answering")))
            }
        };
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < IDLE_KEPT {
            idle.push(worker);
        }
        drop(idle);
        let answer: Json = serde_json::from_str(&answer)
            .map_err(|e| failed(format!("the renderer answered badly: {e}")))?;
        match (&answer["text"], &answer["error"]) {
            (Json::String(text), _) => Ok(text.clone()),
            (_, Json::String(why)) => Err(failed(why.clone())),
            _ => Err(failed(format!("the renderer answered badly: {answer}"))),
        }
    }

    /// A new worker, sent `line`.
    fn start_with(&self, template: &ChatTemplate, line: &str) -> Result<Worker> {
        let mut worker = self.start(template)?;
        if let Err(e) = worker.stdin.write_all(line.as_bytes()) {
            let why = worker.ended(&format!("could not be sent the request: {e}"));
            return Err(Error::invalid(template.field(), why));
        }
        Ok(worker)
    }

    fn start(&self, template: &ChatTemplate) -> Result<Worker> {
        let mut child = Command::new(&self.program)
            .args(&self.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                Error::invalid(
                    template.field(),
                    format!(
                        "could not start the renderer `{}`: {e}",
                        self.program.display()
                    ),
                )
            })?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = child.stdout.take().expect("piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Worker {
            child,
            stdin,
            lines,
        })
    }
}

impl Worker {
    /// Why a worker that stopped answering stopped, waiting for it to end.
    fn ended(mut self, what: &str) -> String {
        let _ = self.child.kill();
        let status = self.child.wait();
        let mut stderr = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut stderr);
        }
        if stderr.contains("memory allocation") {
            return format!(
                "the template used more than {} MiB of memory while rendering",
                MEMORY_LIMIT >> 20
            );
        }
        match status {
            Ok(s) => format!("the renderer {what} ({s})"),
            Err(e) => format!("the renderer {what} ({e})"),
        }
    }
}

impl Drop for Renderer {
    fn drop(&mut self) {
        for mut w in self
            .idle
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            let _ = w.child.kill();
            let _ = w.child.wait();
        }
    }
}

/// A worker's loop: limits this process's memory to [`MEMORY_LIMIT`] above what it
/// holds now, then answers each request line of `input` with one line on `output`:
/// `{"text": ...}` or `{"error": ...}`. Returns at the end of `input`.
pub fn serve_renders(input: impl BufRead, mut output: impl Write) -> std::io::Result<()> {
    limit_memory(MEMORY_LIMIT)?;
    // a conversation renders many times with the same template: compiled once
    let mut last: Option<ChatTemplate> = None;
    for line in input.lines() {
        let answer = match render_request(&line?, &mut last) {
            Ok(text) => json!({ "text": text }),
            Err(why) => json!({ "error": why }),
        };
        writeln!(output, "{answer}")?;
        output.flush()?;
    }
    Ok(())
}

/// One request's render; the error is the reason alone (the parent names the template).
fn render_request(
    line: &str,
    last: &mut Option<ChatTemplate>,
) -> std::result::Result<String, String> {
    let r: Json = serde_json::from_str(line).map_err(|e| format!("a bad request: {e}"))?;
    let (Some(source), Some(special), Some(path), Some(messages), Some(extra)) = (
        r["source"].as_str(),
        r["special"].as_object(),
        r["path"].as_str(),
        r["messages"].as_array(),
        r["extra"].as_object(),
    ) else {
        return Err("a bad request: a field is missing".into());
    };
    let same = last
        .as_ref()
        .is_some_and(|t| t.source() == source && t.special() == special);
    if !same {
        let t = ChatTemplate::with_tokens(source.into(), special.clone(), path.into())
            .map_err(reason)?;
        *last = Some(t);
    }
    let agp = r["add_generation_prompt"].as_bool().unwrap_or(false);
    let template = last.as_ref().expect("set above");
    // a panic inside the engine is this request's error, not the worker's end
    std::panic::catch_unwind(|| template.render_with(messages, agp, extra))
        .map_err(|_| "the template engine failed on this template".to_string())?
        .map_err(reason)
}

fn reason(e: Error) -> String {
    match e {
        Error::Invalid { reason, .. } => reason,
        e => e.to_string(),
    }
}

/// Limits this process's address space to `extra` bytes beyond its size now.
#[cfg(target_os = "linux")]
fn limit_memory(extra: u64) -> std::io::Result<()> {
    // the first field of statm: the address space's size in pages
    let statm = std::fs::read_to_string("/proc/self/statm")?;
    let pages: u64 = statm
        .split_whitespace()
        .next()
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| std::io::Error::other("/proc/self/statm: no size"))?;
    // SAFETY: sysconf and setrlimit read and write plain values; no pointers kept
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
    let bytes = pages * page + extra;
    let limit = libc::rlimit {
        rlim_cur: bytes,
        rlim_max: bytes,
    };
    // SAFETY: `limit` is a valid rlimit for the duration of the call
    if unsafe { libc::setrlimit(libc::RLIMIT_AS, &limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(not(target_os = "linux"))]
fn limit_memory(_extra: u64) -> std::io::Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A worker's answer to a request is the in-process render, or its error's reason.
    #[test]
    fn a_request_renders_as_in_process() {
        let special = json!({"bos_token": "<s>"}).as_object().unwrap().clone();
        let source = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}";
        let t =
            ChatTemplate::with_tokens(source.into(), special.clone(), "t.jinja".into()).unwrap();
        let messages = vec![json!({"role": "user", "content": "hi"})];
        let line = |source: &str| {
            json!({"source": source, "special": special, "path": "t.jinja",
                "messages": messages, "add_generation_prompt": true, "extra": {}})
            .to_string()
        };
        let mut last = None;
        let want = t.render(&messages, true).unwrap();
        assert_eq!(render_request(&line(source), &mut last), Ok(want));
        let err = render_request(&line("{{ raise_exception('no') }}"), &mut last).unwrap_err();
        assert_eq!(err, "invalid operation: no (in <string>:1)");
        let err = render_request("{}", &mut last).unwrap_err();
        assert!(err.contains("a field is missing"), "{err}");
    }
}
