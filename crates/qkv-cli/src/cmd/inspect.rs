//! `qkv inspect`: what a checkpoint is, from its config and weights.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Result;
use qkv::weights::DType;

#[derive(clap::Args)]
pub struct InspectArgs {
    /// Hugging Face model folder, or a GGUF file (its metadata and tensors listed)
    #[arg(long)]
    model: PathBuf,
    /// Also print the weights' memory with the linear layers in this type (f32, bf16,
    /// int8, int8-row), as `--dtype` on the other commands would hold them
    #[arg(long, value_parser = super::shared_flags::parse_dtype)]
    dtype: Option<DType>,
}

pub fn run(args: &InspectArgs, out: &mut impl Write) -> Result<()> {
    if args.model.extension().is_some_and(|e| e == "gguf") {
        if args.dtype.is_some() {
            anyhow::bail!("--dtype: a GGUF file's weights keep the types they are stored in");
        }
        return gguf(&args.model, out);
    }
    let mut loaded = super::load::load_model(&args.model, DType::F32)?;
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
        let mb = size;
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

/// A GGUF file: its version, its tensors by type, and every metadata key (arrays by
/// their length, long strings cut).
fn gguf(path: &std::path::Path, out: &mut impl Write) -> Result<()> {
    use qkv::io::gguf::{GgufFile, Value};
    let f = GgufFile::open(path)?;
    let h = &f.header;
    let mut by_type: Vec<(String, usize, usize)> = Vec::new();
    for t in &h.tensors {
        match by_type.iter_mut().find(|(name, ..)| *name == t.ty.name) {
            Some((_, n, bytes)) => (*n, *bytes) = (*n + 1, *bytes + t.size),
            None => by_type.push((t.ty.name.to_string(), 1, t.size)),
        }
    }
    let types: Vec<String> = by_type
        .iter()
        .map(|(ty, n, bytes)| format!("{ty} {n} ({})", size(*bytes)))
        .collect();
    writeln!(
        out,
        "{:<18} GGUF version {}, alignment {}",
        "format", h.version, h.alignment
    )?;
    writeln!(
        out,
        "{:<18} {}: {}",
        "tensors",
        h.tensors.len(),
        types.join(", ")
    )?;
    fn show(v: &Value) -> String {
        match v {
            Value::String(s) if s.chars().count() > 60 => {
                format!(
                    "{:?}… ({} bytes)",
                    s.chars().take(60).collect::<String>(),
                    s.len()
                )
            }
            Value::String(s) => format!("{s:?}"),
            Value::Array(a) => format!("{a:?}"),
            Value::Bool(b) => b.to_string(),
            Value::F32(x) => format!("{x:?}"),
            Value::F64(x) => format!("{x:?}"),
            Value::I8(x) => x.to_string(),
            Value::I16(x) => x.to_string(),
            Value::I32(x) => x.to_string(),
            Value::I64(x) => x.to_string(),
            v => v.as_u64().map_or_else(String::new, |x| x.to_string()),
        }
    }
    for (key, value) in &h.metadata {
        writeln!(out, "{key:<18} {}", show(value))?;
    }
    Ok(())
}

fn size(b: usize) -> String {
    match b as f64 {
        b if b >= 1e9 => format!("{:.2} GB", b / 1e9),
        b if b >= 1e6 => format!("{:.1} MB", b / 1e6),
        b => format!("{:.1} kB", b / 1e3),
    }
}
