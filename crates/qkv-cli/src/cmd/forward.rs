//! `qkv forward`: one batch through a checkpoint, logits (or hidden states) to a file.

use std::path::PathBuf;

use anyhow::{Context, Result};
use qkv::io::TensorFile;
use qkv::models::Model;

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
    let loaded = super::load_model(&args.model)?;
    let input = TensorFile::open(&args.input)?;
    let tokens = super::read_batch(&input, "input_ids", Some("attention_mask"))?;
    let (name, out) = match &loaded.model {
        Model::Encoder(m) => {
            let types = if input.contains("token_type_ids") {
                let b = super::read_batch(&input, "token_type_ids", None)?;
                Some(b.ids)
            } else {
                None
            };
            ("last_hidden_state", m.forward(&tokens, types.as_deref())?)
        }
        Model::Causal(m) => (
            "logits",
            m.forward_cached(&tokens, &mut m.new_cache(tokens.batch))?,
        ),
        Model::Seq2Seq(m) => {
            let dec = super::read_batch(&input, "decoder_input_ids", None).with_context(|| {
                format!(
                    "{} is an encoder-decoder: it needs `decoder_input_ids`",
                    args.model.display()
                )
            })?;
            let enc = m.encode(&tokens)?;
            (
                "logits",
                m.decode_cached(&dec, &enc, &mut m.new_cache(tokens.batch))?,
            )
        }
    };
    qkv::io::save(&args.output, &[(name, &out)], None)?;
    Ok(())
}
