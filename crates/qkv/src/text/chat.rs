//! Chat templates: the Jinja template an instruct model's folder ships
//! (`chat_template.jinja`, or `chat_template` in `tokenizer_config.json`) rendered over
//! a list of messages as transformers' `apply_chat_template` renders it: blocks trimmed
//! and left-stripped, Python's string and dict methods (`strip`, `startswith`, `items`,
//! …), `raise_exception`, `strftime_now`, a `tojson` that writes what Python's
//! `json.dumps` writes, and the tokenizer's special tokens (`bos_token`, `eos_token`,
//! …) as variables. The rendered text already holds the special tokens, so it is
//! tokenized without adding any.
//!
//! A template is a program, and the folder's is run on what clients send: each render
//! is bounded in steps ([`TEMPLATE_FUEL`] of minijinja's instructions, so three nested
//! `range(100000)` loops stop at once) and in output ([`MAX_RENDERED_BYTES`]), and either
//! bound is one clear error naming the template.

use std::path::{Path, PathBuf};

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Environment, ErrorKind, Value};
use serde_json::{Map, Value as Json};

use crate::error::{Error, Result};
use crate::io::gguf::Value as GgufValue;

/// A folder's chat template and the special tokens it may read.
#[derive(Clone, Debug)]
pub struct ChatTemplate {
    source: String,
    /// `bos_token`, `eos_token`, … as the tokenizer's config names them
    special: Map<String, Json>,
    /// where the template came from, for errors
    path: PathBuf,
}

/// The instructions one render may run: 10⁷, room for a conversation of thousands of
/// turns through the published templates (`tests/chat_templates.rs` renders 4096 with
/// each), and a few seconds at most for a template that loops without end.
pub const TEMPLATE_FUEL: u64 = 10_000_000;

/// The longest prompt text one render may write: 16 MiB, past any context window's
/// worth of text.
pub const MAX_RENDERED_BYTES: usize = 16 << 20;

/// The special-token fields of `tokenizer_config.json` that transformers passes to the
/// template.
const SPECIAL: &[&str] = &[
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

impl ChatTemplate {
    /// The template of the folder `dir`, if it has one: `chat_template.jinja`, else the
    /// `chat_template` of `tokenizer_config.json` (a string, or a list of named
    /// templates, of which `default` is taken); for a GGUF file, its metadata's.
    pub fn from_dir(dir: &Path) -> Result<Option<Self>> {
        if crate::io::gguf::is_gguf(dir) {
            return Self::from_gguf(dir);
        }
        let config_path = dir.join("tokenizer_config.json");
        let config: Map<String, Json> = match std::fs::read(&config_path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| Error::invalid(config_path.display().to_string(), e.to_string()))?,
            // no such file, or a path that is a file rather than a folder: no settings
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                ) =>
            {
                Map::new()
            }
            Err(e) => return Err(Error::io(&config_path, e)),
        };
        let jinja = dir.join("chat_template.jinja");
        let (source, path) = if jinja.is_file() {
            let s = std::fs::read_to_string(&jinja).map_err(|e| Error::io(&jinja, e))?;
            (s, jinja)
        } else {
            let field = format!("{}: chat_template", config_path.display());
            match config.get("chat_template") {
                None | Some(Json::Null) => return Ok(None),
                Some(Json::String(s)) => (s.clone(), config_path.clone()),
                Some(Json::Array(named)) => {
                    let default = named.iter().find(|t| t["name"] == "default");
                    match default.map(|t| &t["template"]) {
                        Some(Json::String(s)) => (s.to_string(), config_path.clone()),
                        Some(other) => {
                            return Err(Error::invalid(
                                field,
                                format!("the template named `default` is not a string but {other}"),
                            ))
                        }
                        None => {
                            return Err(Error::invalid(
                                field,
                                "a list of templates without one named `default`",
                            ))
                        }
                    }
                }
                Some(_) => return Err(Error::invalid(field, "neither a string nor a list")),
            }
        };
        let mut special = Map::new();
        for &name in SPECIAL {
            // a plain string, or an added token `{"content": ...}`
            let token = match config.get(name) {
                Some(Json::String(s)) => Some(s.clone()),
                Some(Json::Object(o)) => {
                    o.get("content").and_then(Json::as_str).map(str::to_string)
                }
                _ => None,
            };
            if let Some(t) = token {
                special.insert(name.to_string(), Json::String(t));
            }
        }
        Self::with_tokens(source, special, path).map(Some)
    }

    /// A GGUF file's `tokenizer.chat_template`, with the special tokens its ids name.
    fn from_gguf(path: &Path) -> Result<Option<Self>> {
        let file = crate::io::gguf::GgufFile::open(path)?;
        let h = &file.header;
        let Some(v) = h.get("tokenizer.chat_template") else {
            return Ok(None);
        };
        let field = format!("{}: tokenizer.chat_template", path.display());
        let source = v
            .as_str()
            .ok_or_else(|| Error::invalid(field, "not a string"))?;
        let tokens = h.get("tokenizer.ggml.tokens").and_then(GgufValue::as_array);
        let mut special = Map::new();
        for (name, key) in [
            ("bos_token", "tokenizer.ggml.bos_token_id"),
            ("eos_token", "tokenizer.ggml.eos_token_id"),
            ("unk_token", "tokenizer.ggml.unknown_token_id"),
            ("pad_token", "tokenizer.ggml.padding_token_id"),
        ] {
            let token = h
                .get(key)
                .and_then(GgufValue::as_u64)
                .and_then(|i| tokens?.strs()?.nth(usize::try_from(i).ok()?));
            if let Some(t) = token {
                special.insert(name.to_string(), Json::String(t.to_string()));
            }
        }
        Self::with_tokens(source.to_string(), special, path.to_path_buf()).map(Some)
    }

    /// A template from its source, with `special` (`{"bos_token": "<s>", ...}`) as
    /// variables; `path` names it in errors. It is compiled once here to check it.
    pub fn with_tokens(source: String, special: Map<String, Json>, path: PathBuf) -> Result<Self> {
        let t = ChatTemplate {
            source,
            special,
            path,
        };
        environment()
            .template_from_str(&t.source)
            .map_err(|e| t.error(e))?;
        Ok(t)
    }

    /// The template's Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The special tokens it reads as variables.
    pub fn special(&self) -> &Map<String, Json> {
        &self.special
    }

    /// Where it came from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The name its errors carry: `DIR/chat_template.jinja (chat template)`.
    pub(crate) fn field(&self) -> String {
        format!("{} (chat template)", self.path.display())
    }

    /// The prompt for `messages` (`[{"role": ..., "content": ...}, ...]`), ending with
    /// the assistant's turn opened when `add_generation_prompt`.
    pub fn render(&self, messages: &[Json], add_generation_prompt: bool) -> Result<String> {
        self.render_with(messages, add_generation_prompt, &Map::new())
    }

    /// [`ChatTemplate::render`] with more variables (`tools`, `date_string`, …), which
    /// win over the special tokens.
    pub fn render_with(
        &self,
        messages: &[Json],
        add_generation_prompt: bool,
        extra: &Map<String, Json>,
    ) -> Result<String> {
        let env = environment();
        let template = env
            .template_from_str(&self.source)
            .map_err(|e| self.error(e))?;
        let mut vars = self.special.clone();
        // transformers always passes these two, `None` unless given
        vars.insert("tools".into(), Json::Null);
        vars.insert("documents".into(), Json::Null);
        vars.insert("messages".into(), Json::Array(messages.to_vec()));
        vars.insert(
            "add_generation_prompt".into(),
            Json::Bool(add_generation_prompt),
        );
        for (k, v) in extra {
            vars.insert(k.clone(), v.clone());
        }
        let mut out = Capped(Vec::new());
        template
            .render_captured_to(Value::from_serialize(&vars), &mut out)
            .map_err(|e| self.error(e))?;
        String::from_utf8(out.0).map_err(|e| {
            Error::invalid(
                self.field(),
                format!("the rendered prompt is not UTF-8: {e}"),
            )
        })
    }

    fn error(&self, e: minijinja::Error) -> Error {
        let mut why = match e.kind() {
            ErrorKind::OutOfFuel => format!(
                "the template ran past {TEMPLATE_FUEL} steps of rendering (a loop too long for a prompt)"
            ),
            ErrorKind::WriteFailure => format!(
                "the rendered prompt passed {} MiB",
                MAX_RENDERED_BYTES >> 20
            ),
            _ => e.to_string(),
        };
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            why.push_str(&format!(": {s}"));
            source = s.source();
        }
        Error::invalid(self.field(), why)
    }
}

/// A render's output, refused past [`MAX_RENDERED_BYTES`].
struct Capped(Vec<u8>);

impl std::io::Write for Capped {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.0.len() + buf.len() > MAX_RENDERED_BYTES {
            return Err(std::io::Error::other("the rendered prompt is too long"));
        }
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The Jinja environment transformers renders chat templates in, bounded in steps.
fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_fuel(Some(TEMPLATE_FUEL));
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_filter("tojson", tojson);
    env.add_function(
        "raise_exception",
        |message: String| -> std::result::Result<Value, minijinja::Error> {
            Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
        },
    );
    env.add_function("strftime_now", |format: String| strftime_now(&format));
    env
}

/// Python's `json.dumps(value, ensure_ascii=False, indent=indent)`: `", "` and `": "`
/// between items without an indent, `","` and newlines with one.
fn tojson(value: Value, kwargs: Kwargs) -> std::result::Result<Value, minijinja::Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let _: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_json(&value, indent, 0, &mut out)?;
    Ok(Value::from_safe_string(out))
}

fn write_json(
    v: &Value,
    indent: Option<usize>,
    level: usize,
    out: &mut String,
) -> std::result::Result<(), minijinja::Error> {
    let newline = |out: &mut String, level: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * level));
        }
    };
    let comma = if indent.is_some() { "," } else { ", " };
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if v.is_integer() {
                out.push_str(&v.to_string());
            } else {
                let f = f64::try_from(v.clone())?;
                match f.is_finite() && f.fract() == 0.0 && f.abs() < 1e16 {
                    true => out.push_str(&format!("{f:.1}")),
                    false => out.push_str(&f.to_string()),
                }
            }
        }
        ValueKind::String => write_str(v.as_str().unwrap_or_default(), out),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(comma);
                }
                newline(out, level + 1);
                write_json(item, indent, level + 1, out)?;
            }
            newline(out, level);
            out.push(']');
        }
        ValueKind::Map => {
            let keys: Vec<Value> = v.try_iter()?.collect();
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(comma);
                }
                newline(out, level + 1);
                write_str(&k.to_string(), out);
                out.push_str(": ");
                write_json(&v.get_item(k)?, indent, level + 1, out)?;
            }
            newline(out, level);
            out.push('}');
        }
        _ => {
            return Err(minijinja::Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: cannot write a {} as JSON", v.kind()),
            ))
        }
    }
    Ok(())
}

/// A JSON string as Python writes it with `ensure_ascii=False`.
fn write_str(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Today's date (UTC) in a `strftime` format: `%d %m %Y %y %b %B %a %A %H %M %S %%`.
fn strftime_now(format: &str) -> std::result::Result<String, minijinja::Error> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
    Ok(strftime(secs, format))
}

fn strftime(secs: i64, format: &str) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil(days);
    // 1970-01-01 was a Thursday (index 3 from Monday)
    let weekday = (days + 3).rem_euclid(7) as usize;
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y.rem_euclid(100))),
            Some('b') => out.push_str(&MONTHS[m as usize - 1][..3]),
            Some('B') => out.push_str(MONTHS[m as usize - 1]),
            Some('a') => out.push_str(&DAYS[weekday][..3]),
            Some('A') => out.push_str(DAYS[weekday]),
            Some('H') => out.push_str(&format!("{:02}", rem / 3600)),
            Some('M') => out.push_str(&format!("{:02}", rem / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", rem % 60)),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// (year, month 1–12, day 1–31) of a count of days since 1970-01-01 (proleptic
/// Gregorian calendar; Howard Hinnant's days-to-civil algorithm).
fn civil(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn dates_are_formatted_as_python_formats_them() {
        // 2024-07-26 13:05:09 UTC, a Friday
        let t = 1_722_000_000 - 1_722_000_000 % 86_400 + 13 * 3600 + 5 * 60 + 9;
        assert_eq!(strftime(t, "%d %b %Y"), "26 Jul 2024");
        assert_eq!(
            strftime(t, "%A %B %d, %y %H:%M:%S %%"),
            "Friday July 26, 24 13:05:09 %"
        );
        assert_eq!(civil(0), (1970, 1, 1));
        assert_eq!(civil(-1), (1969, 12, 31));
        assert_eq!(civil(11_016), (2000, 2, 29));
    }

    #[test]
    fn tojson_writes_what_python_json_dumps_writes() {
        let t = ChatTemplate::with_tokens(
            "{{ x | tojson }}|{{ x | tojson(indent=2) }}".into(),
            Map::new(),
            "t".into(),
        )
        .unwrap();
        let x = json!({"b": [1, 2.0, "é\n\"q\""], "a": {"t": true, "n": null}, "e": []});
        let got = t
            .render_with(&[], false, json!({"x": x}).as_object().unwrap())
            .unwrap();
        // Python's json.dumps(x, ensure_ascii=False) and with indent=2, x's keys in the
        // order given (serde_json keeps insertion order, as Python's dicts do)
        let want = "{\"b\": [1, 2.0, \"é\\n\\\"q\\\"\"], \"a\": {\"t\": true, \"n\": null}, \"e\": []}|{\n  \"b\": [\n    1,\n    2.0,\n    \"é\\n\\\"q\\\"\"\n  ],\n  \"a\": {\n    \"t\": true,\n    \"n\": null\n  },\n  \"e\": []\n}";
        assert_eq!(got, want);
    }

    #[test]
    fn a_template_that_raises_or_does_not_parse_is_an_error_naming_it() {
        let err = ChatTemplate::with_tokens(
            "{% if %}".into(),
            Map::new(),
            "dir/tokenizer_config.json".into(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("dir/tokenizer_config.json (chat template)"),
            "{err}"
        );
        let t = ChatTemplate::with_tokens(
            "{% if messages[0]['role'] != 'user' %}{{ raise_exception('roles must alternate') }}{% endif %}".into(),
            Map::new(),
            "x.jinja".into(),
        )
        .unwrap();
        let err = t
            .render(&[json!({"role": "assistant", "content": "hi"})], true)
            .unwrap_err()
            .to_string();
        assert!(err.contains("roles must alternate"), "{err}");
    }

    #[test]
    fn a_render_is_bounded_in_steps_and_in_output() {
        let t = |src: &str| ChatTemplate::with_tokens(src.into(), Map::new(), "evil.jinja".into());
        let hi = [json!({"role": "user", "content": "hi"})];
        // 10^15 iterations: stops at once, naming the template
        let loops = t("{% for a in range(100000) %}{% for b in range(100000) %}{% for c in range(100000) %}x{% endfor %}{% endfor %}{% endfor %}").unwrap();
        let started = std::time::Instant::now();
        let err = loops.render(&hi, true).unwrap_err().to_string();
        assert!(
            err.contains("evil.jinja (chat template)") && err.contains("steps of rendering"),
            "{err}"
        );
        assert!(started.elapsed().as_secs() < 30);
        // 100 MB a step, 10 GB in all: refused at the cap, not after
        let big = t("{% for i in range(100) %}{{ 'x' * 100000000 }}{% endfor %}").unwrap();
        let err = big.render(&hi, true).unwrap_err().to_string();
        assert!(
            err.contains("evil.jinja (chat template)") && err.contains("passed 16 MiB"),
            "{err}"
        );
        // a prompt of a little under the cap renders
        let fits = t("{{ 'x' * 16000000 }}").unwrap();
        assert_eq!(fits.render(&hi, true).unwrap().len(), 16_000_000);
    }
}
