//! The terminal's view of a `qkv train` run: a progress bar and evaluation lines as it
//! goes, then a summary line, and with `--bench-warmup` a JSON row of tokens/s.

use std::io::IsTerminal;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use qkv::train::run::{RunInfo, Summary, Watch};
use qkv::train::trainer::StepLog;

/// The terminal's view of a run: a progress bar, evaluation lines, and the step times
/// the summary and `--bench-warmup` need.
pub struct Progress {
    quiet: bool,
    bar: ProgressBar,
    info: Option<RunInfo>,
    /// When the first step began, when the last ended (the final checkpoint's write is
    /// not training time), and when the steps after `--bench-warmup` began.
    t0: Instant,
    t_end: Instant,
    bench: (u64, Option<Instant>),
    /// `--bench-warmup` was given: the run ends with its JSON row of tokens/s.
    bench_row: bool,
}

/// "eval loss …, token accuracy …%" of a step that evaluated.
fn eval_words(s: &StepLog) -> Option<String> {
    let (loss, acc) = (s.eval_loss?, s.eval_accuracy?);
    Some(format!(
        "eval loss {loss:.4}, token accuracy {:.2}%",
        acc * 100.0
    ))
}

impl Progress {
    /// `quiet`: no bar, no evaluation lines, no summary; `bench_warmup`: the steps
    /// `--bench-warmup` leaves out of its timing.
    pub fn new(quiet: bool, bench_warmup: Option<u64>) -> Self {
        let now = Instant::now();
        Progress {
            quiet,
            bar: ProgressBar::hidden(),
            info: None,
            t0: now,
            t_end: now,
            bench: (bench_warmup.unwrap_or(0), None),
            bench_row: bench_warmup.is_some(),
        }
    }

    /// Clears the bar, then prints the `--bench-warmup` row on stdout and the summary
    /// line on stderr.
    pub fn finish(self, summary: &Summary) {
        self.bar.finish_and_clear();
        let (start, tokens) = (summary.info.start, summary.info.tokens_per_step as f64);
        if let (Some(t), true) = (self.bench.1, self.bench_row) {
            let timed = (summary.step - start).saturating_sub(self.bench.0);
            let secs = (self.t_end - t).as_secs_f64();
            let row = serde_json::json!({
                "impl": "qkv", "threads": rayon::current_num_threads(), "timed_steps": timed,
                "seconds": secs, "tokens_per_sec": timed as f64 * tokens / secs,
                "last_loss": summary.last.as_ref().map(|l| l.loss),
            });
            println!("{row}");
        }
        if !self.quiet {
            let elapsed = (self.t_end - self.t0).as_secs_f64();
            let rate = self.rate(summary.step, elapsed);
            let mut line = format!(
                "trained steps {}..{} in {elapsed:.1}s ({rate:.0} tokens/s)",
                start + 1,
                summary.step
            );
            if let Some(l) = &summary.last {
                line += &format!(", last loss {:.4}", l.loss);
                line.extend(eval_words(l).map(|w| format!(", {w}")));
            }
            eprintln!("{line}; checkpoint in {}", summary.info.out.display());
        }
    }

    /// Tokens per second from the run's first step to step `done`, in `seconds`.
    fn rate(&self, done: u64, seconds: f64) -> f64 {
        let i = self.info.as_ref().expect("started");
        (done - i.start) as f64 * i.tokens_per_step as f64 / seconds
    }
}

impl Watch for Progress {
    fn start(&mut self, info: &RunInfo) {
        if !self.quiet {
            info.notes.iter().for_each(|n| eprintln!("note: {n}"));
        }
        if !self.quiet && std::io::stderr().is_terminal() {
            let bar = ProgressBar::with_draw_target(Some(info.end), ProgressDrawTarget::stderr());
            let style =
                ProgressStyle::with_template("{bar:20.cyan/blue} step {pos}/{len} {msg} ETA {eta}");
            bar.set_style(style.expect("valid template").progress_chars("█▉▊▋▌▍▎▏ "));
            bar.set_position(info.start);
            bar.reset_eta();
            self.bar = bar;
        }
        self.info = Some(info.clone());
        self.t0 = Instant::now();
        self.bench.1 = (self.bench.0 == 0).then_some(self.t0);
    }

    fn step(&mut self, s: &StepLog) {
        self.t_end = Instant::now();
        let done = s.step + 1;
        if self.bench.0 > 0 && done - self.info.as_ref().expect("started").start == self.bench.0 {
            self.bench.1 = Some(self.t_end);
        }
        let rate = self.rate(done, self.t0.elapsed().as_secs_f64());
        self.bar
            .set_message(format!("loss {:.4} · {rate:.0} tok/s", s.loss));
        self.bar.set_position(done);
        if let (Some(words), false) = (eval_words(s), self.quiet) {
            self.bar
                .suspend(|| eprintln!("after {done} steps: {words}"));
        }
    }
}
