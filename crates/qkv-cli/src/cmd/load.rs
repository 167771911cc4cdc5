//! A model folder as the commands load it: the model (its warnings shown), its
//! tokenizer, and the renderer of its chat template.

use std::path::Path;

use anyhow::{Context, Result};
use qkv::models::{self, Loaded, Transformer};
use qkv::text::Tokenizer;
use qkv::weights::DType;

/// A chat-template renderer whose workers are this binary's hidden `render-templates`
/// (qkv::text::chat_process: a template's memory and time bounded apart from the model).
pub fn template_renderer() -> Result<qkv::text::Renderer> {
    let exe = std::env::current_exe().context("the path of the qkv binary")?;
    Ok(qkv::text::Renderer::new(
        exe,
        vec!["render-templates".into()],
    ))
}

/// Prints the model's load warnings (`config.json` keys qkv does not know, special ids
/// outside the vocabulary), one line each on stderr.
pub fn show_load_warnings(model: &Transformer) {
    for w in &model.load_warnings {
        eprintln!("warning: {w}");
    }
}

/// The tokenizer of the folder `dir` for `model`: required when text is to be read,
/// else the folder's if it has one; refused when it does not fit the model's vocabulary.
pub fn tokenizer(dir: &Path, model: &Transformer, required: bool) -> Result<Option<Tokenizer>> {
    let tok = match required {
        true => Some(Tokenizer::from_dir(dir)?),
        false => Tokenizer::optional(dir)?,
    };
    Ok(tok
        .map(|t| t.fitting(model.arch.token_rows()))
        .transpose()?)
}

/// Loads a model folder with its linear layers in `dtype` (in bf16 or int8 with no f32
/// copy of them: [`models::load_in`]), with the folder named in any error.
/// Tensors the model does not read are named in a warning (the first few of them), and
/// so is what the folder says that qkv reads differently ([`show_load_warnings`]).
pub fn load_model(dir: &Path, dtype: DType) -> Result<Loaded> {
    let loaded =
        models::load_in(dir, dtype).with_context(|| format!("loading model {}", dir.display()))?;
    show_load_warnings(&loaded.model);
    if !loaded.unused.is_empty() {
        let shown: Vec<&str> = loaded.unused.iter().take(5).map(String::as_str).collect();
        let more = match loaded.unused.len() - shown.len() {
            0 => String::new(),
            n => format!(" and {n} more"),
        };
        eprintln!(
            "warning: {}: the model does not use {} tensors of the checkpoint: {}{more}",
            dir.display(),
            loaded.unused.len(),
            shown.join(", ")
        );
    }
    Ok(loaded)
}
