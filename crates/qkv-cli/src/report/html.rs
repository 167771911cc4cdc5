//! The demo's report: one self-contained HTML page (inline CSS and SVG, no script, no
//! network) with a section per claim: the article's sentence, the verdict and the rule
//! that gave it, the numbers, and the figures.

use serde_json::Value;

/// One claim's section.
pub struct Section {
    /// The anchor and the experiment's name.
    pub name: String,
    pub heading: String,
    /// The article's sentence, and its English gloss.
    pub zh: String,
    pub en: String,
    /// `supported` / `not supported` / `inconclusive`, for the measured experiments.
    pub verdict: Option<String>,
    pub rule: Option<String>,
    /// A text table, shown as it prints in the terminal.
    pub table: Option<String>,
    /// The experiment's metrics, shown flattened.
    pub metrics: Option<Value>,
    pub svgs: Vec<String>,
}

const STYLE: &str = "body{font-family:sans-serif;max-width:1500px;margin:2em auto;padding:0 1em;color:#222}\
blockquote{border-left:4px solid #0072b2;margin:0.8em 0;padding:0.2em 1em;background:#f4f8fb}\
blockquote p{margin:0.3em 0}.en{color:#555;font-style:italic}\
.verdict{display:inline-block;padding:0.15em 0.6em;border-radius:0.3em;font-weight:bold;color:#fff}\
.supported{background:#009e73}.not-supported{background:#d55e00}.inconclusive{background:#999}\
pre{background:#f6f6f6;padding:0.8em;overflow-x:auto}\
table{border-collapse:collapse;font-size:0.9em}td,th{border:1px solid #ddd;padding:0.2em 0.6em;text-align:left}\
figure{margin:1em 0}figure svg{max-width:100%;height:auto;border:1px solid #eee}\
section{border-top:1px solid #ccc;margin-top:2em}";

/// Escapes text for HTML content and attribute values.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            _ => out.push(c),
        }
    }
    out
}

fn badge(verdict: &str) -> String {
    format!(
        "<span class=\"verdict {}\">{}</span>",
        verdict.replace(' ', "-"),
        escape(verdict)
    )
}

/// A number to four significant digits; anything else as JSON.
fn scalar(v: &Value) -> String {
    match v.as_f64() {
        Some(x) if v.is_f64() => {
            if x != 0.0 && (x.abs() < 1e-3 || x.abs() >= 1e6) {
                format!("{x:.3e}")
            } else {
                let digits = (3 - x.abs().log10().floor().max(-1.0) as i32).max(0) as usize;
                format!("{x:.digits$}")
            }
        }
        _ => match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        },
    }
}

/// `metrics` as (path, value) rows; an array of scalars stays one row.
fn flatten(prefix: &str, v: &Value, rows: &mut Vec<(String, String)>) {
    let join = |key: &str| {
        if prefix.is_empty() {
            key.to_string()
        } else {
            format!("{prefix}.{key}")
        }
    };
    match v {
        Value::Object(map) => {
            for (k, x) in map {
                flatten(&join(k), x, rows);
            }
        }
        Value::Array(items) if items.iter().any(|x| x.is_object() || x.is_array()) => {
            for (i, x) in items.iter().enumerate() {
                flatten(&format!("{prefix}[{i}]"), x, rows);
            }
        }
        Value::Array(items) => {
            let list: Vec<String> = items.iter().map(scalar).collect();
            rows.push((prefix.to_string(), format!("[{}]", list.join(", "))));
        }
        _ => rows.push((prefix.to_string(), scalar(v))),
    }
}

fn section_html(s: &Section, out: &mut String) {
    out.push_str(&format!(
        "<section id=\"{}\"><h2>{}</h2>\n<blockquote><p>{}</p><p class=\"en\">{}</p></blockquote>\n",
        escape(&s.name),
        escape(&s.heading),
        escape(&s.zh),
        escape(&s.en)
    ));
    if let Some(v) = &s.verdict {
        out.push_str(&format!("<p>Verdict: {}</p>\n", badge(v)));
    }
    if let Some(rule) = &s.rule {
        out.push_str(&format!("<p>Rule: {}</p>\n", escape(rule)));
    }
    if let Some(table) = &s.table {
        out.push_str(&format!("<pre>{}</pre>\n", escape(table)));
    }
    for svg in &s.svgs {
        out.push_str("<figure>");
        out.push_str(svg);
        out.push_str("</figure>\n");
    }
    if let Some(metrics) = &s.metrics {
        let mut rows = Vec::new();
        flatten("", metrics, &mut rows);
        out.push_str("<details><summary>All numbers</summary><table>\n");
        for (k, v) in rows {
            out.push_str(&format!(
                "<tr><th>{}</th><td>{}</td></tr>\n",
                escape(&k),
                escape(&v)
            ));
        }
        out.push_str("</table></details>\n");
    }
    out.push_str("</section>\n");
}

/// The whole page; `footer` says how it was made.
pub fn page(sections: &[Section], footer: &str) -> String {
    let mut out = format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
<title>qkv demo: the articles' claims, measured</title><style>{STYLE}</style></head><body>\n\
<h1>The articles' claims, measured</h1>\n\
<p>Each section quotes a sentence of the articles, then what qkv measured on this machine. \
A verdict is computed from the numbers by the rule shown with it.</p>\n<table><tr><th>claim</th><th>verdict</th></tr>\n"
    );
    for s in sections {
        out.push_str(&format!(
            "<tr><td><a href=\"#{}\">{}</a></td><td>{}</td></tr>\n",
            escape(&s.name),
            escape(&s.heading),
            s.verdict.as_deref().map_or("table".to_string(), badge)
        ));
    }
    out.push_str("</table>\n");
    for s in sections {
        section_html(s, &mut out);
    }
    out.push_str(&format!(
        "<footer><p>{}</p></footer>\n</body></html>\n",
        escape(footer)
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn text_is_escaped_and_numbers_are_short() {
        assert_eq!(escape("a<b & \"c\">"), "a&lt;b &amp; &quot;c&quot;&gt;");
        let mut rows = Vec::new();
        flatten(
            "",
            &json!({"a": {"b": 0.123456789, "c": [1, 2.5]}, "d": [{"e": 1e-7}], "f": "x"}),
            &mut rows,
        );
        let want = [
            ("a.b", "0.1235"),
            ("a.c", "[1, 2.500]"),
            ("d[0].e", "1.000e-7"),
            ("f", "x"),
        ];
        assert_eq!(
            rows,
            want.map(|(k, v)| (k.to_string(), v.to_string())).to_vec()
        );
    }
}
