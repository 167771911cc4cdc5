//! A Hugging Face model folder's weights: `model.safetensors`, or the shards listed by
//! `model.safetensors.index.json`. Tensors are looked up by their checkpoint names.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::config::read_json;
use super::safetensors::TensorFile;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// Where a model's tensors are read from, by their checkpoint names: a folder's
/// safetensors ([`Checkpoint`]), or a GGUF file seen under Hugging Face's names.
pub trait TensorSource {
    fn has(&self, name: &str) -> bool;

    /// A tensor as f32, whatever it is stored as.
    fn tensor(&self, name: &str) -> Result<Tensor>;

    /// A tensor that must have exactly `shape`; the error names both shapes.
    fn tensor_shaped(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        let t = self.tensor(name)?;
        if t.shape() != shape {
            return Err(Error::shape(name, format!("{shape:?}"), t.shape()));
        }
        Ok(t)
    }
}

pub struct Checkpoint {
    files: Vec<TensorFile>,
    /// tensor name → index into `files`
    index: HashMap<String, usize>,
}

#[derive(serde::Deserialize)]
struct ShardIndex {
    weight_map: HashMap<String, String>,
}

impl Checkpoint {
    /// Opens the weights of the model folder `dir`.
    pub fn open(dir: &Path) -> Result<Self> {
        let single = dir.join("model.safetensors");
        let index_path = dir.join("model.safetensors.index.json");
        let paths: Vec<PathBuf> = if single.is_file() {
            vec![single]
        } else if index_path.is_file() {
            let index: ShardIndex = read_json(&index_path)?;
            let mut shards: Vec<&String> = index.weight_map.values().collect();
            shards.sort();
            shards.dedup();
            shards
                .into_iter()
                .map(|s| super::files::inside(dir, s, &index_path))
                .collect::<Result<_>>()?
        } else {
            // a missing file, as the OS would report it (Python's FileNotFoundError)
            return Err(Error::io(
                &single,
                std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "not found, nor model.safetensors.index.json: this folder has no weights",
                ),
            ));
        };
        let mut files = Vec::with_capacity(paths.len());
        let mut index = HashMap::new();
        for path in paths {
            let file = TensorFile::open(&path)?;
            for name in file.names()? {
                index.insert(name, files.len());
            }
            files.push(file);
        }
        Ok(Checkpoint { files, index })
    }

    pub fn has(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    /// A tensor as f32, whatever its dtype on disk.
    pub fn tensor(&self, name: &str) -> Result<Tensor> {
        let t = self.file(name)?.tensor(name)?;
        t.check_finite(name)?;
        Ok(t)
    }

    /// A tensor that must have exactly `shape`; the error names both shapes.
    pub fn tensor_shaped(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        TensorSource::tensor_shaped(self, name, shape)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.index.keys().map(String::as_str)
    }

    fn file(&self, name: &str) -> Result<&TensorFile> {
        let i = self.index.get(name).ok_or_else(|| Error::Safetensors {
            path: self
                .files
                .first()
                .map_or_else(String::new, |f| f.path().display().to_string()),
            reason: format!("missing tensor `{name}`"),
        })?;
        Ok(&self.files[*i])
    }

    /// Dtype names on disk with their element counts, e.g. `[("BF16", 1_100_000)]`.
    pub fn dtypes(&self) -> Result<Vec<(String, usize)>> {
        let mut counts: HashMap<String, usize> = HashMap::new();
        for (name, &i) in &self.index {
            let (shape, dtype) = self.files[i].info(name)?;
            *counts.entry(dtype).or_default() += shape.iter().product::<usize>();
        }
        let mut out: Vec<_> = counts.into_iter().collect();
        out.sort();
        Ok(out)
    }
}

impl TensorSource for Checkpoint {
    fn has(&self, name: &str) -> bool {
        Checkpoint::has(self, name)
    }

    fn tensor(&self, name: &str) -> Result<Tensor> {
        Checkpoint::tensor(self, name)
    }
}
