//! `qkv demo`: the main job. Three small tables that put numbers on claims of the
//! articles in `shared/seeds/` — attention as a soft lookup (the food-delivery
//! example), self-attention's blindness to word order (狗咬人 / 人咬狗), and why scores
//! are scaled by 1/√d_k — then every quick experiment of `qkv::experiments`, and an
//! offline HTML report of all of it (`qkv-report/index.html`). No downloads; fixed
//! seeds, so the numbers repeat for a given thread count (timings aside).

mod food;
mod order;
mod scaling;
mod table;

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use qkv::experiments::{self, Options};
use qkv::io::write_atomic;
use serde::Serialize;
use serde_json::{Map, Value};

use crate::report::files;
use crate::report::html::{self, Section};

#[derive(clap::Args)]
pub struct DemoArgs {
    /// Print one JSON object with every number instead of tables
    #[arg(long)]
    json: bool,
    /// Folder of the HTML report (index.html, with each experiment's SVG and JSON)
    #[arg(long, default_value = "qkv-report")]
    out: PathBuf,
    /// Write no report
    #[arg(long)]
    no_report: bool,
    /// No progress on stderr
    #[arg(long)]
    quiet: bool,
}

#[derive(Serialize)]
struct Tables {
    food: food::Food,
    order: order::Order,
    scaling: Vec<scaling::Scaling>,
}

impl Tables {
    fn run() -> Result<Self> {
        Ok(Tables {
            food: food::run().context("food-delivery example")?,
            order: order::run().context("word-order example")?,
            scaling: scaling::run().context("scaling experiment")?,
        })
    }

    /// The three tables as the terminal shows them.
    fn texts(&self) -> Result<[String; 3]> {
        let text = |write: &dyn Fn(&mut Vec<u8>) -> std::io::Result<()>| -> Result<String> {
            let mut buf = Vec::new();
            write(&mut buf)?;
            Ok(String::from_utf8(buf).expect("tables are UTF-8"))
        };
        Ok([
            text(&|b| self.food.write_text(b))?,
            text(&|b| self.order.write_text(b))?,
            text(&|b| scaling::write_text(&self.scaling, b))?,
        ])
    }
}

/// The sentences of the articles the three tables measure, with English glosses.
const TABLE_CLAIMS: [(&str, &str, &str, &str); 3] = [
    (
        "food",
        "Attention as a soft lookup: the food-delivery example",
        "最终推荐结果不会完全等于某一道菜，而是所有菜的 Value 按权重加权融合，但整体会明显更接近菜 B。",
        "The recommendation is not exactly any one dish: it blends every dish's value by weight, but lands clearly closest to dish B.",
    ),
    (
        "word_order",
        "狗咬人 / 人咬狗: self-attention without positions",
        "如果仅仅计算 Self-Attention，那么模型主要看到的是“狗”“咬”“人”这些词之间的相似度关系，而无法自然区分谁在前、谁在后。",
        "Self-attention alone sees only how similar 狗, 咬 and 人 are to each other; it cannot tell which comes first.",
    ),
    (
        "sqrt_dk",
        "Why scores are divided by √d_k",
        "除以 √d_k 是为了控制点积尺度，避免 Softmax 进入梯度极小的饱和区域。",
        "Dividing by √d_k controls the scale of the dot products, keeping softmax out of its saturated region where gradients are tiny.",
    ),
];

/// A bar on a terminal; elsewhere a line per finished experiment.
struct Progress {
    bar: Option<ProgressBar>,
    quiet: bool,
}

impl Progress {
    fn new(quiet: bool) -> Self {
        let bar = (!quiet && std::io::stderr().is_terminal()).then(|| {
            let bar = ProgressBar::with_draw_target(
                Some(experiments::NAMES.len() as u64),
                ProgressDrawTarget::stderr(),
            );
            bar.set_style(
                ProgressStyle::with_template("{bar:20.cyan/blue} experiment {pos}/{len} {msg}")
                    .expect("valid template")
                    .progress_chars("█▉▊▋▌▍▎▏ "),
            );
            bar
        });
        Progress { bar, quiet }
    }

    fn message(&self, name: &str, line: &str) {
        if let Some(bar) = &self.bar {
            // one terminal line: the experiment and the start of its latest news
            let short: String = line.chars().take(90).collect();
            bar.set_message(format!("{name}: {short}"));
        }
    }

    fn finished(&self, name: &str, verdict: &str, seconds: f64) {
        match &self.bar {
            Some(bar) => bar.inc(1),
            None if !self.quiet => eprintln!("demo: {name}: {verdict} ({seconds:.1} s)"),
            None => {}
        }
    }
}

pub fn run(args: &DemoArgs, out: &mut dyn Write) -> Result<()> {
    let started = Instant::now();
    let tables = Tables::run()?;
    let dir = (!args.no_report).then_some(args.out.as_path());
    if let Some(dir) = dir {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating --out {}", dir.display()))?;
    }
    let options = Options {
        quick: true,
        seed: 0,
        memory: Some(crate::counting::probe()),
        checkpoints: &[],
    };
    let progress = Progress::new(args.quiet);
    let mut docs = Map::new();
    let mut sections = Vec::new();
    for name in experiments::NAMES {
        let t = Instant::now();
        let report = experiments::run(name, &options, &mut |line| progress.message(name, line))
            .with_context(|| format!("experiment {name}"))?;
        let drawn = files::draw(&report, dir)?;
        let verdict = drawn.doc["verdict"].as_str().unwrap_or("?").to_string();
        progress.finished(name, &verdict, t.elapsed().as_secs_f64());
        sections.push(Section {
            name: name.to_string(),
            heading: name.replace('_', " "),
            zh: report.claim.zh.to_string(),
            en: report.claim.en.to_string(),
            verdict: Some(verdict),
            rule: Some(report.rule.clone()),
            table: None,
            metrics: Some(report.metrics.clone()),
            svgs: drawn.svgs,
        });
        docs.insert(name.to_string(), drawn.doc);
    }
    if let Some(bar) = &progress.bar {
        bar.finish_and_clear();
    }
    let index = match dir {
        Some(dir) => Some(write_page(dir, &tables, sections, started)?),
        None => None,
    };
    if args.json {
        let mut doc = serde_json::to_value(&tables).expect("tables serialise");
        doc["experiments"] = Value::Object(docs);
        doc["report"] = serde_json::to_value(index.map(|p| p.display().to_string()))?;
        serde_json::to_writer_pretty(&mut *out, &doc)?;
        writeln!(out)?;
    } else {
        for text in tables.texts()? {
            write!(out, "{text}")?;
            writeln!(out)?;
        }
        writeln!(out, "4. The articles' claims, measured (quick experiments)")?;
        let mut t = table::Table::new(&["experiment", "verdict"]);
        for name in experiments::NAMES {
            let verdict = docs[name]["verdict"].as_str().unwrap_or("?");
            t.row(vec![name.to_string(), verdict.to_string()]);
        }
        t.write(out)?;
        if let Some(index) = index {
            writeln!(out, "  Report: {}", index.display())?;
        }
    }
    Ok(())
}

/// Writes `DIR/index.html` (atomically) with the tables first; returns its path.
fn write_page(
    dir: &Path,
    tables: &Tables,
    experiments: Vec<Section>,
    started: Instant,
) -> Result<PathBuf> {
    let mut sections: Vec<Section> = TABLE_CLAIMS
        .iter()
        .zip(tables.texts()?)
        .map(|(&(name, heading, zh, en), text)| Section {
            name: name.into(),
            heading: heading.into(),
            zh: zh.into(),
            en: en.into(),
            verdict: None,
            rule: None,
            table: Some(text),
            metrics: None,
            svgs: Vec::new(),
        })
        .collect();
    sections.extend(experiments);
    let footer = format!(
        "Made by qkv {} (`qkv demo`), seed 0, {} threads, in {:.0} s. Each experiment alone: `qkv experiment NAME --quick`; without --quick, the longer runs.",
        env!("CARGO_PKG_VERSION"),
        rayon::current_num_threads(),
        started.elapsed().as_secs_f64()
    );
    let path = dir.join("index.html");
    write_atomic(&path, html::page(&sections, &footer).as_bytes())?;
    Ok(path)
}
