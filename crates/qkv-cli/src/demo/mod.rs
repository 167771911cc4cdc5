//! `qkv demo`: three small, deterministic experiments that put numbers on claims of
//! the articles in `shared/seeds/`: attention as a soft lookup (the food-delivery
//! example), self-attention's blindness to word order (狗咬人 / 人咬狗), and why
//! scores are scaled by 1/√d_k. No files, no downloads, fixed seeds.

mod food;
mod order;
mod scaling;
mod table;

use std::io::Write;

use anyhow::{Context, Result};
use serde::Serialize;

#[derive(clap::Args)]
pub struct DemoArgs {
    /// Print one JSON object with every number instead of tables
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct Report {
    food: food::Food,
    order: order::Order,
    scaling: Vec<scaling::Scaling>,
}

pub fn run(args: &DemoArgs, out: &mut dyn Write) -> Result<()> {
    let report = Report {
        food: food::run().context("food-delivery example")?,
        order: order::run().context("word-order example")?,
        scaling: scaling::run().context("scaling experiment")?,
    };
    if args.json {
        serde_json::to_writer_pretty(&mut *out, &report)?;
        writeln!(out)?;
    } else {
        report.food.write_text(out)?;
        writeln!(out)?;
        report.order.write_text(out)?;
        writeln!(out)?;
        scaling::write_text(&report.scaling, out)?;
    }
    Ok(())
}
