//! The options every workload takes, and the timing: one place for every workload,
//! [`measure`]. `--warmup` untimed calls, then `--rounds` timed samples. A sample
//! repeats the call until it lasts at least `--min-time` seconds (the count is sized
//! from the last warm-up call), so short calls are not lost in the clock's resolution;
//! its figure is the sample's time divided by its calls. Benchmarks are never timed
//! tests: the tests only run them on tiny sizes.

use std::time::Instant;

use anyhow::{bail, Result};
use clap::Args;

/// Options every workload takes.
#[derive(Args)]
pub struct Common {
    /// Threads of the rayon pool [default: all cores]
    #[arg(long)]
    pub threads: Option<usize>,
    /// Timed samples; the best and the median are over these
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// Untimed calls before timing
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// A sample repeats the call until it lasts this many seconds (sized from the last
    /// warm-up call; every sample times one call when there is no warm-up)
    #[arg(long, default_value_t = 0.05)]
    pub min_time: f64,
    /// Seed of the random inputs and weights
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// One JSON object per line instead of a table
    #[arg(long)]
    pub json: bool,
}

impl Common {
    /// Refuses options no timing can be made with.
    pub fn check(&self) -> Result<()> {
        if self.rounds == 0 {
            bail!("--rounds must be at least 1");
        }
        if !(self.min_time >= 0.0 && self.min_time.is_finite()) {
            bail!("--min-time must be a finite number ≥ 0");
        }
        Ok(())
    }
}

/// Seconds per call over the timed samples.
pub struct Timing {
    pub best_s: f64,
    pub median_s: f64,
    /// Calls per sample.
    pub iters: usize,
}

/// Times `call` as the module docs describe.
pub fn measure(c: &Common, mut call: impl FnMut() -> Result<()>) -> Result<Timing> {
    let mut last = None;
    for _ in 0..c.warmup {
        let start = Instant::now();
        call()?;
        last = Some(start.elapsed().as_secs_f64());
    }
    let iters = calls_per_sample(last, c.min_time);
    let mut samples = Vec::with_capacity(c.rounds);
    for _ in 0..c.rounds {
        let start = Instant::now();
        for _ in 0..iters {
            call()?;
        }
        samples.push(start.elapsed().as_secs_f64() / iters as f64);
    }
    samples.sort_by(f64::total_cmp);
    Ok(Timing {
        best_s: samples[0],
        median_s: median(&samples),
        iters,
    })
}

/// Calls a sample makes so that it lasts `min_time` seconds, from the last warm-up
/// call's `last_s` seconds: 1 to a million, and 1 with no warm-up or no minimum.
fn calls_per_sample(last_s: Option<f64>, min_time: f64) -> usize {
    match last_s {
        Some(s) if min_time > 0.0 => (min_time / s.max(1e-9)).ceil().clamp(1.0, 1e6) as usize,
        _ => 1,
    }
}

/// The median of `sorted` (ascending, not empty): the middle value, or the mean of the
/// two middle ones.
fn median(sorted: &[f64]) -> f64 {
    let m = sorted.len() / 2;
    if sorted.len() % 2 == 1 {
        sorted[m]
    } else {
        (sorted[m - 1] + sorted[m]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        common: Common,
    }

    fn common(args: &[&str]) -> Common {
        Flags::try_parse_from(std::iter::once("bench").chain(args.iter().copied()))
            .expect("valid flags")
            .common
    }

    #[test]
    fn flags_default_and_given() {
        let c = common(&[]);
        assert_eq!(
            (c.threads, c.rounds, c.warmup, c.min_time, c.seed, c.json),
            (None, 5, 1, 0.05, 0, false)
        );
        let c = common(&[
            "--threads",
            "2",
            "--rounds",
            "3",
            "--min-time",
            "0.5",
            "--json",
        ]);
        assert_eq!(
            (c.threads, c.rounds, c.min_time, c.json),
            (Some(2), 3, 0.5, true)
        );
    }

    #[test]
    fn check_refuses_no_rounds_and_a_bad_minimum_time() {
        assert!(common(&[]).check().is_ok());
        assert!(common(&["--min-time", "0"]).check().is_ok());
        let why = |args: &[&str]| common(args).check().unwrap_err().to_string();
        assert_eq!(why(&["--rounds", "0"]), "--rounds must be at least 1");
        for bad in ["--min-time=-1", "--min-time=inf", "--min-time=NaN"] {
            assert_eq!(why(&[bad]), "--min-time must be a finite number ≥ 0");
        }
    }

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[4.0]), 4.0);
        assert_eq!(median(&[1.0, 2.0, 9.0]), 2.0);
        assert_eq!(median(&[1.0, 2.0, 4.0, 9.0]), 3.0);
    }

    #[test]
    fn calls_per_sample_fill_the_minimum_time() {
        assert_eq!(calls_per_sample(None, 0.05), 1);
        assert_eq!(calls_per_sample(Some(0.001), 0.0), 1);
        assert_eq!(calls_per_sample(Some(0.0625), 0.5), 8);
        assert_eq!(calls_per_sample(Some(0.003), 0.01), 4);
        // a call longer than the minimum is timed once; an instant one a million times
        assert_eq!(calls_per_sample(Some(2.0), 0.05), 1);
        assert_eq!(calls_per_sample(Some(0.0), 0.05), 1_000_000);
    }

    #[test]
    fn measure_makes_the_asked_samples() {
        let mut calls = 0;
        let c = common(&["--rounds", "3", "--warmup", "2", "--min-time", "0"]);
        let t = measure(&c, || {
            calls += 1;
            Ok(())
        })
        .unwrap();
        assert_eq!((calls, t.iters), (5, 1));
        assert!(t.best_s <= t.median_s);
        let failing = measure(&c, || anyhow::bail!("no"));
        assert_eq!(failing.err().unwrap().to_string(), "no");
    }
}
