//! `qkv inspect`: what a checkpoint is, from its config and weights.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Result;

#[derive(clap::Args)]
pub struct InspectArgs {
    /// Hugging Face model folder
    #[arg(long)]
    model: PathBuf,
}

pub fn run(args: &InspectArgs, out: &mut impl Write) -> Result<()> {
    let loaded = super::load_model(&args.model)?;
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
    Ok(())
}
