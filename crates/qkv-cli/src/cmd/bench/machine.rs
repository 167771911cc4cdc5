//! The machine's own limits as a workload: the FMA peak, the memory read bandwidth and
//! the cost of handing a parallel operation to the threads (the probes themselves are
//! in probes.rs).

use std::hint::black_box;
use std::io::Write;

use anyhow::{bail, Result};
use clap::Args;
use serde_json::json;

use super::printer::{Printer, Rate, Row};
use super::probes::{fma_probe, handoffs, Handoff, MemoryProbe};
use super::timing::{measure, Common};

#[derive(Args)]
pub struct MachineArgs {
    /// Size of the buffer the memory probe reads: far above the last-level cache
    #[arg(long, default_value_t = 1 << 30)]
    bytes: usize,
    #[command(flatten)]
    pub common: Common,
}

pub fn bench_machine(a: &MachineArgs, p: &mut Printer<impl Write>) -> Result<()> {
    if a.bytes < 8 {
        bail!("--bytes must be at least 8 (one word)");
    }
    // a million steps: about 2 ms a call at 100 GFLOP/s a thread
    const STEPS: u64 = 1 << 20;
    let mut flop = 0.0;
    let timing = measure(&a.common, || {
        flop = fma_probe(STEPS);
        Ok(())
    })?;
    p.row(Row {
        label: "machine f32 FMA peak".into(),
        timing,
        rate: Some(Rate::new("gflops", "GFLOP/s", flop / 1e9)),
        fields: json!({"bench": "machine", "probe": "fma", "gflop": flop / 1e9}),
    })?;
    let probe = MemoryProbe::new(a.bytes);
    let timing = measure(&a.common, || {
        black_box(probe.read());
        Ok(())
    })?;
    let gb = probe.bytes() as f64 / 1e9;
    p.row(Row {
        label: format!("machine memory read {:.2} GB", gb),
        timing,
        rate: Some(Rate::new("gbs", "GB/s", gb)),
        fields: json!({"bench": "machine", "probe": "memory", "bytes": probe.bytes()}),
    })?;
    // a thousand jobs a call: a few ms at the µs or so each takes
    const JOBS: usize = 1000;
    let ways = [
        (Handoff::Team, "team"),
        (Handoff::Rayon, "rayon"),
        (Handoff::Alone, "one thread"),
    ];
    for (how, name) in ways {
        let timing = measure(&a.common, || {
            handoffs(JOBS, how);
            Ok(())
        })?;
        p.row(Row {
            label: format!("machine hand-offs, {name}"),
            timing,
            rate: Some(Rate::new("kjobs", "k jobs/s", JOBS as f64 / 1e3)),
            fields: json!({"bench": "machine", "probe": "handoff", "via": name, "jobs": JOBS}),
        })?;
    }
    Ok(())
}
