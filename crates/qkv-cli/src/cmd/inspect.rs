//! `qkv inspect`: what a checkpoint is, from its config and weights.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Result;
use qkv::ops::DType;

#[derive(clap::Args)]
pub struct InspectArgs {
    /// Hugging Face model folder
    #[arg(long)]
    model: PathBuf,
    /// Also print the weights' memory with the linear layers in this type (f32, bf16,
    /// int8, int8-row), as `--dtype` on the other commands would hold them
    #[arg(long, value_parser = super::parse_dtype)]
    dtype: Option<DType>,
}

pub fn run(args: &InspectArgs, out: &mut impl Write) -> Result<()> {
    let mut loaded = super::load_model(&args.model, DType::F32)?;
    let i = loaded.model.info();
    let dtypes: Vec<String> = loaded
        .dtypes
        .iter()
        .map(|(d, n)| format!("{d} ({n} values)"))
        .collect();
    let layers = match i.decoder_layers {
        Some(d) => format!("{} encoder + {d} decoder", i.layers),
        None => i.layers.to_string(),
    };
    let rows = [
        ("family", i.family.clone()),
        ("architecture", i.architecture.clone()),
        ("layers", layers),
        ("hidden width", i.hidden.to_string()),
        ("heads", i.heads.to_string()),
        ("key/value heads", i.kv_heads.to_string()),
        ("head width", i.head_dim.to_string()),
        ("FFN width", i.ffn_dim.to_string()),
        ("vocabulary", i.vocab.to_string()),
        (
            "max positions",
            i.max_positions
                .map_or_else(|| "unbounded".into(), |p| p.to_string()),
        ),
        ("position encoding", i.position.clone()),
        ("norm", i.norm.clone()),
        ("FFN", i.ffn.clone()),
        ("parameters", loaded.parameters.to_string()),
        ("dtype on disk", dtypes.join(", ")),
    ];
    for (k, v) in rows {
        writeln!(out, "{k:<18} {v}")?;
    }
    if let Some(dtype) = args.dtype {
        let model = &mut loaded.model;
        let (linear_f32, rest) = model.weight_bytes();
        model.set_dtype(dtype)?;
        let (linear, _) = model.weight_bytes();
        let mb = |b: usize| match b as f64 {
            b if b >= 1e9 => format!("{:.2} GB", b / 1e9),
            b if b >= 1e6 => format!("{:.1} MB", b / 1e6),
            b => format!("{:.1} kB", b / 1e3),
        };
        writeln!(
            out,
            "{:<18} {} (linear layers {} in {dtype}, {} in f32; the rest {} in f32)",
            format!("weights in {dtype}"),
            mb(linear + rest),
            mb(linear),
            mb(linear_f32),
            mb(rest)
        )?;
    }
    Ok(())
}
