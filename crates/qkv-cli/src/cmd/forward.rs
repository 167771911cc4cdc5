//! `qkv forward`: one batch through a checkpoint, logits (or hidden states) to a file.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use qkv::io::TensorFile;
use qkv::models::{Head, Input, ModelKind, TokenBatch};
use qkv::Tensor;

#[derive(clap::Args)]
pub struct ForwardArgs {
    /// Hugging Face model folder (config.json + safetensors)
    #[arg(long)]
    model: PathBuf,
    /// safetensors with int64 `input_ids` [B,T], optional `attention_mask` [B,T] and,
    /// for encoder-decoders, `decoder_input_ids` [B,T2]
    #[arg(long)]
    input: PathBuf,
    /// Output safetensors: float32 `logits` [B,T,V]; for encoders `last_hidden_state` [B,T,C], and `logits` too where the folder has a masked-LM head
    #[arg(long)]
    output: PathBuf,
    #[command(flatten)]
    dtype: super::shared_flags::DTypeFlag,
}

pub fn run(args: &ForwardArgs) -> Result<()> {
    super::writable::check_writable("--output", &args.output)?;
    let model = super::load::load_model(&args.model, args.dtype.dtype)?.model;
    let input = TensorFile::open(&args.input)?;
    let tokens = input.token_batch("input_ids", Some("attention_mask"))?;
    // the encoder's own table where it has one (Marian may), else the one table
    let rows = match model.kind() {
        ModelKind::Decoder => model.arch.vocab,
        _ => model.arch.src_vocab.unwrap_or(model.arch.vocab),
    };
    in_vocab(&args.input, "input_ids", &tokens, rows)?;
    let mut outputs = Vec::new();
    let (name, out) = match model.kind() {
        ModelKind::Encoder => {
            let types = if input.contains("token_type_ids") {
                Some(input.token_batch("token_type_ids", None)?.ids)
            } else {
                None
            };
            if model.arch.head != Head::None {
                let input = Input {
                    source: Some(&tokens),
                    token_types: types.as_deref(),
                    target: None,
                };
                outputs.push(("logits", model.forward(&input, false)?.logits));
            }
            let hidden = model.hidden_states(&tokens, types.as_deref())?;
            ("last_hidden_state", hidden)
        }
        ModelKind::Decoder => {
            let input = Input {
                target: Some(&tokens),
                ..Default::default()
            };
            ("logits", model.forward(&input, false)?.logits)
        }
        ModelKind::EncoderDecoder => {
            let dec = input
                .token_batch("decoder_input_ids", None)
                .with_context(|| {
                    format!(
                        "{} is an encoder-decoder: it needs `decoder_input_ids`",
                        args.model.display()
                    )
                })?;
            in_vocab(&args.input, "decoder_input_ids", &dec, model.arch.vocab)?;
            let input = Input {
                source: Some(&tokens),
                target: Some(&dec),
                token_types: None,
            };
            ("logits", model.forward(&input, false)?.logits)
        }
    };
    outputs.push((name, out));
    let refs: Vec<(&str, &Tensor)> = outputs.iter().map(|(n, t)| (*n, t)).collect();
    qkv::io::save(&args.output, &refs, None)?;
    Ok(())
}

/// Fails naming the file and tensor when `tokens` holds an id past a table of `rows`.
fn in_vocab(file: &Path, tensor: &str, tokens: &TokenBatch, rows: usize) -> Result<()> {
    match tokens.ids.iter().find(|&&id| id >= rows) {
        Some(id) => bail!(
            "{}: tensor `{tensor}` holds token id {id}, outside the model's vocabulary of {rows}",
            file.display()
        ),
        None => Ok(()),
    }
}
