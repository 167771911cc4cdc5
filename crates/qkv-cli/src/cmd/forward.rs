//! `qkv forward`: one batch through a checkpoint, logits (or hidden states) to a file.

use std::path::PathBuf;

use anyhow::{Context, Result};
use qkv::io::TensorFile;
use qkv::models::{Input, ModelKind, TokenBatch};

#[derive(clap::Args)]
pub struct ForwardArgs {
    /// Hugging Face model folder (config.json + safetensors)
    #[arg(long)]
    model: PathBuf,
    /// safetensors with int64 `input_ids` [B,T], optional `attention_mask` [B,T] and,
    /// for encoder-decoders, `decoder_input_ids` [B,T2]
    #[arg(long)]
    input: PathBuf,
    /// Output safetensors: float32 `logits` [B,T,V] (`last_hidden_state` [B,T,C] for encoders)
    #[arg(long)]
    output: PathBuf,
}

pub fn run(args: &ForwardArgs) -> Result<()> {
    let model = super::load_model(&args.model)?.model;
    let input = TensorFile::open(&args.input)?;
    let tokens = TokenBatch::from_file(&input, "input_ids", Some("attention_mask"))?;
    let (name, out) = match model.kind() {
        ModelKind::Encoder => {
            let types = if input.contains("token_type_ids") {
                Some(TokenBatch::from_file(&input, "token_type_ids", None)?.ids)
            } else {
                None
            };
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
            let dec =
                TokenBatch::from_file(&input, "decoder_input_ids", None).with_context(|| {
                    format!(
                        "{} is an encoder-decoder: it needs `decoder_input_ids`",
                        args.model.display()
                    )
                })?;
            let input = Input {
                source: Some(&tokens),
                target: Some(&dec),
                token_types: None,
            };
            ("logits", model.forward(&input, false)?.logits)
        }
    };
    qkv::io::save(&args.output, &[(name, &out)], None)?;
    Ok(())
}
