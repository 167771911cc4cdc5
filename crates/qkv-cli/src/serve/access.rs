//! Who may call: API keys (`--api-key`, `--api-key-file`) checked as OpenAI's clients
//! send them (`Authorization: Bearer KEY`), and the browser origins allowed to call
//! across sites (`--cors-origin`). `/health` and `/metrics` stay open to probes and
//! scrapers unless `--protect-health-metrics`.

use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tower_http::cors::{AllowOrigin, CorsLayer};

use super::api::ApiError;

/// The keys a request may bring; empty: every request is let in.
#[derive(Default)]
pub struct Keys {
    keys: Vec<Vec<u8>>,
    /// `/health` and `/metrics` need a key too.
    everywhere: bool,
}

impl Keys {
    /// The keys of `--api-key` and of `--api-key-file` (one a line; blank lines and
    /// lines starting with `#` skipped). A file that cannot be read, or holds no key, is
    /// an error naming it.
    pub fn new(given: &[String], file: Option<&Path>, everywhere: bool) -> Result<Self> {
        let mut keys: Vec<Vec<u8>> = given.iter().map(|k| k.as_bytes().to_vec()).collect();
        if let Some(path) = file {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("--api-key-file {}", path.display()))?;
            let before = keys.len();
            keys.extend(
                text.lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty() && !l.starts_with('#'))
                    .map(|l| l.as_bytes().to_vec()),
            );
            if keys.len() == before {
                bail!(
                    "--api-key-file {}: no key in it (one a line)",
                    path.display()
                );
            }
        }
        if keys.iter().any(Vec::is_empty) {
            bail!("--api-key: a key must not be empty");
        }
        if everywhere && keys.is_empty() {
            bail!("--protect-health-metrics needs --api-key or --api-key-file");
        }
        Ok(Keys { keys, everywhere })
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Whether `path` needs a key.
    fn guards(&self, method: &Method, path: &str) -> bool {
        let open = matches!(path, "/health" | "/metrics") && !self.everywhere;
        // a browser's preflight carries no credentials
        !self.keys.is_empty() && !open && method != Method::OPTIONS
    }

    /// Whether `given` is one of the keys, compared in time independent of where they
    /// differ.
    fn accepts(&self, given: &[u8]) -> bool {
        self.keys.iter().fold(false, |ok, k| ok | same(k, given))
    }
}

/// `a == b` in time that depends on their lengths only.
fn same(a: &[u8], b: &[u8]) -> bool {
    let diff = a
        .iter()
        .zip(b)
        .fold(a.len() ^ b.len(), |d, (x, y)| d | usize::from(x ^ y));
    diff == 0
}

/// Lets a request through when its route is open or it brings a key; otherwise 401 in
/// OpenAI's shape (`invalid_api_key`).
pub async fn require_key(State(keys): State<Arc<Keys>>, req: Request, next: Next) -> Response {
    if !keys.guards(req.method(), req.uri().path()) {
        return next.run(req).await;
    }
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let message = match given {
        Some(k) if keys.accepts(k.as_bytes()) => return next.run(req).await,
        Some(_) => "incorrect API key provided",
        None => "no API key: send `Authorization: Bearer KEY` (the server runs with --api-key)",
    };
    let mut r = ApiError {
        code: Some("invalid_api_key"),
        ..ApiError::status(StatusCode::UNAUTHORIZED, message)
    }
    .into_response();
    r.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    r
}

/// The CORS layer for `--cors-origin` (each an origin such as `https://app.example`, or
/// `*` for any); `None` when none is given: no CORS headers are sent.
pub fn cors(origins: &[String]) -> Result<Option<CorsLayer>> {
    if origins.is_empty() {
        return Ok(None);
    }
    let allow = match origins.iter().any(|o| o == "*") {
        true => AllowOrigin::any(),
        false => AllowOrigin::list(
            origins
                .iter()
                .map(|o| {
                    HeaderValue::from_str(o.trim_end_matches('/'))
                        .with_context(|| format!("--cors-origin {o:?}: not a header value"))
                })
                .collect::<Result<Vec<_>>>()?,
        ),
    };
    Ok(Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST, Method::OPTIONS])
            .allow_headers([header::AUTHORIZATION, header::CONTENT_TYPE])
            .max_age(std::time::Duration::from_secs(600)),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_compared_whole_and_open_routes_stay_open() {
        let keys = Keys::new(&["sk-one".into()], None, false).unwrap();
        assert!(keys.accepts(b"sk-one"));
        assert!(!keys.accepts(b"sk-on") && !keys.accepts(b"sk-one1") && !keys.accepts(b""));
        assert!(keys.guards(&Method::POST, "/v1/completions"));
        assert!(!keys.guards(&Method::GET, "/health") && !keys.guards(&Method::GET, "/metrics"));
        assert!(!keys.guards(&Method::OPTIONS, "/v1/completions"));
        let all = Keys::new(&["k".into()], None, true).unwrap();
        assert!(all.guards(&Method::GET, "/metrics"));
        assert!(!Keys::default().guards(&Method::POST, "/v1/completions"));
        assert!(Keys::new(&[], None, true).is_err());
        assert!(Keys::new(&[String::new()], None, false).is_err());
    }
}
