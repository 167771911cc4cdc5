//! The rows of `qkv bench` as they are measured: a table, or one JSON object per line.

use std::io::Write;

use anyhow::Result;
use serde_json::{json, Map, Value};

use super::timing::{Common, Timing};

/// A rate derived from a timing: `amount` per call, e.g. GFLOP, GB, sentences, tokens.
pub struct Rate {
    /// JSON key prefix: `<key>_best`, `<key>_median`.
    key: &'static str,
    unit: &'static str,
    amount: f64,
}

impl Rate {
    pub fn new(key: &'static str, unit: &'static str, amount: f64) -> Self {
        Rate { key, unit, amount }
    }
}

/// One measured workload.
pub struct Row {
    pub label: String,
    pub timing: Timing,
    pub rate: Option<Rate>,
    /// What was measured (sizes, options); printed with --json.
    pub fields: Value,
}

/// `base`'s fields with `extra`'s added (an `extra` field replaces `base`'s of the same
/// name); `extra` not an object adds nothing.
pub fn merge(base: &Value, extra: Value) -> Value {
    let mut m = base.as_object().cloned().unwrap_or_default();
    if let Value::Object(e) = extra {
        m.extend(e);
    }
    Value::Object(m)
}

/// Prints rows as they are measured: JSON lines, or a table.
pub struct Printer<'w, W: Write> {
    out: &'w mut W,
    json: bool,
    threads: usize,
    rounds: usize,
    warmup: usize,
    header: bool,
}

impl<'w, W: Write> Printer<'w, W> {
    pub fn new(c: &Common, out: &'w mut W) -> Self {
        Printer {
            out,
            json: c.json,
            threads: rayon::current_num_threads(),
            rounds: c.rounds,
            warmup: c.warmup,
            header: false,
        }
    }

    /// `text` on a line of its own, outside the rows (what a workload prints instead
    /// of timing).
    pub fn line(&mut self, text: &str) -> Result<()> {
        writeln!(self.out, "{text}")?;
        Ok(())
    }

    /// Whether rows are printed as JSON lines.
    pub fn is_json(&self) -> bool {
        self.json
    }

    pub fn row(&mut self, row: Row) -> Result<()> {
        let t = &row.timing;
        if self.json {
            let mut m: Map<String, Value> = row.fields.as_object().cloned().unwrap_or_default();
            m.insert("threads".into(), json!(self.threads));
            m.insert("rounds".into(), json!(self.rounds));
            m.insert("warmup".into(), json!(self.warmup));
            m.insert("iters".into(), json!(t.iters));
            m.insert("best_s".into(), json!(t.best_s));
            m.insert("median_s".into(), json!(t.median_s));
            if let Some(r) = &row.rate {
                m.insert(format!("{}_best", r.key), json!(r.amount / t.best_s));
                m.insert(format!("{}_median", r.key), json!(r.amount / t.median_s));
            }
            writeln!(self.out, "{}", Value::Object(m))?;
        } else {
            if !self.header {
                writeln!(
                    self.out,
                    "{} threads, {} warm-up calls, {} timed samples; seconds per call",
                    self.threads, self.warmup, self.rounds
                )?;
                writeln!(
                    self.out,
                    "{:<44} {:>11} {:>11}   rate (best / median)",
                    "workload", "best", "median"
                )?;
                self.header = true;
            }
            let rate = match &row.rate {
                Some(r) => format!(
                    "{:.1} / {:.1} {}",
                    r.amount / t.best_s,
                    r.amount / t.median_s,
                    r.unit
                ),
                None => String::new(),
            };
            writeln!(
                self.out,
                "{:<44} {:>11} {:>11}   {rate}",
                row.label,
                seconds(t.best_s),
                seconds(t.median_s)
            )?;
        }
        self.out.flush()?;
        Ok(())
    }
}

/// `s` seconds in µs, ms or s.
fn seconds(s: f64) -> String {
    if s < 1e-3 {
        format!("{:.1} µs", s * 1e6)
    } else if s < 1.0 {
        format!("{:.3} ms", s * 1e3)
    } else {
        format!("{s:.3} s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_in_their_unit() {
        assert_eq!(seconds(0.000_012_34), "12.3 µs");
        assert_eq!(seconds(0.001), "1.000 ms");
        assert_eq!(seconds(0.25), "250.000 ms");
        assert_eq!(seconds(1.0), "1.000 s");
        assert_eq!(seconds(12.5), "12.500 s");
    }

    #[test]
    fn merge_adds_and_replaces_fields() {
        let base = json!({"bench": "matmul", "m": 5});
        assert_eq!(
            merge(&base, json!({"m": 6, "dtype": "bf16"})),
            json!({"bench": "matmul", "m": 6, "dtype": "bf16"})
        );
        assert_eq!(merge(&base, json!({})), base);
        assert_eq!(merge(&json!(null), json!({"a": 1})), json!({"a": 1}));
    }

    fn printed(json: bool, rows: Vec<Row>) -> String {
        let mut out = Vec::new();
        let mut p = Printer {
            out: &mut out,
            json,
            threads: 4,
            rounds: 5,
            warmup: 1,
            header: false,
        };
        for row in rows {
            p.row(row).unwrap();
        }
        String::from_utf8(out).unwrap()
    }

    fn row(label: &str, rate: Option<Rate>) -> Row {
        Row {
            label: label.into(),
            timing: Timing {
                best_s: 0.25,
                median_s: 0.5,
                iters: 25,
            },
            rate,
            fields: json!({"bench": "decode", "cache": 32}),
        }
    }

    #[test]
    fn a_table_with_one_header_and_the_rates() {
        let text = printed(
            false,
            vec![
                row("decode T=1 S=32", Some(Rate::new("gbs", "GB/s", 1.0))),
                row("minilm one sentence (9 tokens)", None),
            ],
        );
        let want = [
            "4 threads, 1 warm-up calls, 5 timed samples; seconds per call",
            &format!(
                "{:<44}        best      median   rate (best / median)",
                "workload"
            ),
            &format!(
                "{:<44}  250.000 ms  500.000 ms   4.0 / 2.0 GB/s",
                "decode T=1 S=32"
            ),
            &format!(
                "{:<44}  250.000 ms  500.000 ms   ",
                "minilm one sentence (9 tokens)"
            ),
        ];
        assert_eq!(text.lines().collect::<Vec<_>>(), want);
    }

    #[test]
    fn json_lines_with_the_timing_and_rates() {
        let text = printed(
            true,
            vec![row("decode", Some(Rate::new("gbs", "GB/s", 1.0)))],
        );
        let got: Value = serde_json::from_str(text.trim_end()).unwrap();
        assert_eq!(
            got,
            json!({
                "bench": "decode", "cache": 32, "threads": 4, "rounds": 5, "warmup": 1,
                "iters": 25, "best_s": 0.25, "median_s": 0.5,
                "gbs_best": 4.0, "gbs_median": 2.0,
            })
        );
        assert_eq!(text.lines().count(), 1);
    }
}
