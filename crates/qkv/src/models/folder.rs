//! A model folder on disk, in and out: [`load`] reads a Hugging Face folder (or one qkv
//! wrote) through its family's definition, checking the config's sizes against the
//! checkpoint before anything is allocated, and [`Transformer::save`] writes one back in
//! the family's layout.

use std::path::Path;

use serde_json::{json, Map, Value};

use super::families::special::special_tokens;
use super::families::{keys, names};
use super::families::{supported, Family};
use super::net::arch::Arch;
use super::net::weights::Weights;
use super::reading::{for_inference_in, read_weights, sizes_unlike, Loaded};
use super::transformer::Transformer;
use crate::error::{Error, Result};
use crate::io::{read_config, write_atomic, Checkpoint};
use crate::tensor::Tensor;
use crate::weights::DType;

/// Loads the model in folder `dir` (a Hugging Face folder or one qkv saved),
/// dispatching on `architectures` (or `model_type`).
pub fn load(dir: &Path) -> Result<Loaded> {
    load_in(dir, DType::F32)
}

/// [`load`] for inference with the linear layers in `dtype`: each weight is packed in
/// that type as it is read, and in bf16 or int8 only that copy is kept
/// ([`Transformer::keep_packed_only`]), so that a folder stored in bf16 loads as bf16
/// with no f32 copy of its projections at any time. Such a model runs every forward and
/// refuses to train or save. In f32 this is [`load`].
pub fn load_in(dir: &Path, dtype: DType) -> Result<Loaded> {
    if crate::io::gguf::is_gguf(dir) {
        return super::gguf::load_gguf(dir, dtype);
    }
    if crate::io::gguf::named_gguf(dir) {
        if !dir.exists() {
            let missing = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
            return Err(Error::io(dir, missing));
        }
        // not a regular file (a FIFO, a device): opening it says what it is
        return super::gguf::load_gguf(dir, dtype);
    }
    if !dir.is_dir() {
        return Err(Error::io(
            dir,
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "not a local model folder (qkv reads Hugging Face folders from disk; it does not download from the hub)",
            ),
        ));
    }
    let only: ArchitectureOnly = read_config(dir)?;
    let name = only
        .architectures
        .first()
        .cloned()
        .or_else(|| only.model_type.clone())
        .unwrap_or_default();
    let ckpt = Checkpoint::open(dir)?;
    let family = Family::reading(&name).ok_or_else(|| {
        Error::Unsupported(format!(
            "architecture `{name}` in {}; supported: {}",
            dir.join("config.json").display(),
            supported().join(", ")
        ))
    })?;
    // a Hugging Face family's config, checked key by key and written back on save
    let source_config = match family.def().native {
        true => None,
        false => Some(read_config::<Map<String, Value>>(dir)?),
    };
    let mut warnings = match &source_config {
        None => Vec::new(),
        Some(config) => keys::check(dir, family.name(), family.def().keys, config)?,
    };
    let (arch, tokens) = (family.def().read)(dir, &name, &ckpt)?;
    arch.validate()
        .map_err(|e| crate::io::bad_field(dir, "(architecture)", e.to_string()))?;
    let dtypes = ckpt.dtypes()?;
    if let Some(reason) = sizes_unlike(&arch, dtypes.iter().map(|(_, n)| n).sum()) {
        return Err(crate::io::bad_field(dir, "(sizes)", reason));
    }
    let (weights, logits_bias, used) = read_weights(&ckpt, &arch, family, dtype, &|_, _| Ok(None))?;
    let mut unused = unused_tensors(dir, &arch, &ckpt, &used)?;
    // a classifier's head is read by `SequenceClassifier`, not by the encoder
    if let Some(head) = family
        .def()
        .classifier
        .filter(|_| name.ends_with("ForSequenceClassification"))
    {
        let parts = [Some(head.dense), Some(head.out), head.norm];
        unused.retain(|t| {
            !parts
                .iter()
                .flatten()
                .any(|p| t.strip_prefix(p).is_some_and(|rest| rest.starts_with('.')))
        });
    }
    let (special, outside) = special_tokens(dir, tokens, arch.vocab)?;
    warnings.extend(outside);
    let special = (family.def().special)(special);
    let native = family.def().native;
    let architecture = match native || only.architectures.is_empty() {
        true => family.architecture().to_string(),
        false => name,
    };
    let mut model = Transformer::from_parts(
        arch,
        family,
        special,
        weights,
        logits_bias,
        source_config,
        architecture,
    )?;
    model.load_warnings = warnings;
    Ok(Loaded {
        model: for_inference_in(model, dtype)?,
        parameters: dtypes.iter().map(|(_, n)| n).sum(),
        dtypes,
        unused,
    })
}

#[derive(serde::Deserialize)]
struct ArchitectureOnly {
    #[serde(default)]
    architectures: Vec<String>,
    model_type: Option<String>,
}

impl Transformer {
    /// Writes `dir/config.json` and `dir/model.safetensors` (each atomically), creating
    /// `dir`: in the family's own layout (so transformers loads it), or qkv's.
    pub fn save(&self, dir: &Path) -> Result<()> {
        self.expect_f32_weights(&format!("save {}", dir.display()))?;
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let mut tensors = self.export(&self.weights)?;
        if let Some(b) = &self.logits_bias {
            tensors.push((
                "final_logits_bias".into(),
                b.clone().reshape(&[1, b.numel()])?,
            ));
        }
        let refs: Vec<(&str, &Tensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
        // transformers refuses safetensors files whose metadata lacks format = pt
        let meta = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
        crate::io::save(&dir.join("model.safetensors"), &refs, Some(meta))?;
        let mut config = match (&self.source_config, self.family) {
            (Some(c), _) => c.clone(),
            (None, f) => match f.config_json(&self.arch) {
                Value::Object(m) => m,
                _ => unreachable!("a config is an object"),
            },
        };
        // the weights are saved as float32 whatever the source's dtype
        for key in ["torch_dtype", "dtype"] {
            if let Some(v) = config.get_mut(key) {
                *v = json!("float32");
            }
        }
        self.special.write_into(&mut config);
        let text = serde_json::to_string_pretty(&config).expect("a JSON value serialises");
        write_atomic(&dir.join("config.json"), format!("{text}\n").as_bytes())
    }

    /// Every tensor of `w` (the parameters, their gradients, or any tree of their
    /// shape) as this model's checkpoint stores it, under its checkpoint names: a
    /// Hugging Face family's layout (GPT-2's Conv1D transposes and fused `c_attn`, …),
    /// or qkv's own names.
    pub fn export(&self, w: &Weights) -> Result<Vec<(String, Tensor)>> {
        names::export(w, &self.family.locator(&self.arch))
    }

    /// Reads the folder `dir` written by a Hugging Face tool or by
    /// [`Transformer::save`]; see [`load`].
    pub fn load(dir: &Path) -> Result<Self> {
        load(dir).map(|l| l.model)
    }
}

/// Tensors checkpoints carry that no qkv output reads: causal-mask and RoPE buffers
/// saved by older transformers, position-id buffers, and BERT's pooler and
/// next-sentence head (they feed only `pooler_output` and pre-training losses).
fn needless(name: &str) -> bool {
    const ENDINGS: [&str; 4] = [
        ".attn.bias",
        ".attn.masked_bias",
        "rotary_emb.inv_freq",
        "position_ids",
    ];
    ENDINGS.iter().any(|e| name.ends_with(e))
        || name.contains("pooler.")
        || name.starts_with("cls.seq_relationship")
}

/// The checkpoint's tensors `used` leaves out, apart from [`needless`] ones. A tensor
/// of a layer beyond the config's layer count is an error: the config describes fewer
/// layers than were trained (`n_layer: 0`, say), and the model would run without them.
fn unused_tensors(
    dir: &Path,
    arch: &Arch,
    ckpt: &Checkpoint,
    used: &std::collections::HashSet<String>,
) -> Result<Vec<String>> {
    let mut unused: Vec<String> = ckpt
        .names()
        .filter(|n| !used.contains(*n) && !needless(n))
        .map(String::from)
        .collect();
    unused.sort();
    let layers = [arch.encoder, arch.decoder]
        .iter()
        .flatten()
        .map(|s| s.layers)
        .max()
        .unwrap_or(0);
    // the index after the families' layer list names: `h.3`, `layers.3`, `layer.3`,
    // `block.3` (T5's `block.3.layer.1` is block 3)
    let layer_of = |name: &str| {
        let parts: Vec<&str> = name.split('.').collect();
        parts.windows(2).find_map(|w| match w[0] {
            "h" | "layers" | "layer" | "block" | "blocks" => w[1].parse::<usize>().ok(),
            _ => None,
        })
    };
    if let Some(name) = unused
        .iter()
        .find(|n| layer_of(n).is_some_and(|l| l >= layers))
    {
        return Err(crate::io::bad_field(
            dir,
            "(layers)",
            format!(
                "the checkpoint holds `{name}`, a weight of layer {}, but config.json has {layers} layers",
                layer_of(name).unwrap_or(0)
            ),
        ));
    }
    Ok(unused)
}
