//! safetensors files through Hugging Face's own `safetensors` crate. Floats of any
//! width (f32, f16, bf16, f64) are read as f32; integers and booleans as i64. Files are
//! memory-mapped: a checkpoint's bytes are paged in once, straight into the f32 copy.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors};

use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// Where one tensor lies in the file.
struct Entry {
    dtype: Dtype,
    shape: Vec<usize>,
    /// Byte range in the whole file.
    bytes: std::ops::Range<usize>,
}

/// A memory-mapped safetensors file, with tensors converted on request. The header is
/// parsed once, at open, into a name → (dtype, shape, bytes) map: a lookup costs one
/// hash, however many tensors the file holds.
pub struct TensorFile {
    path: PathBuf,
    bytes: memmap2::Mmap,
    entries: HashMap<String, Entry>,
    metadata: HashMap<String, String>,
}

impl TensorFile {
    /// Reads and parses the header; a truncated or corrupt file is an error naming it.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let file = super::files::open_regular(&path)?;
        // SAFETY: the map is read-only; a file truncated or rewritten by another process
        // while mapped is outside what this library can defend against, as for any mmap.
        let bytes = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io(&path, e))?;
        let bad = |reason: String| Error::Safetensors {
            path: path.display().to_string(),
            reason,
        };
        // deserialize checks every tensor's offsets against its shape and the file size
        let parsed = SafeTensors::deserialize(&bytes)
            .map_err(|e| bad(format!("not a valid safetensors file: {e}")))?;
        let base = bytes.as_ptr() as usize;
        let entries = parsed
            .iter()
            .map(|(name, view)| {
                let start = view.data().as_ptr() as usize - base;
                let entry = Entry {
                    dtype: view.dtype(),
                    shape: view.shape().to_vec(),
                    bytes: start..start + view.data().len(),
                };
                (name.to_string(), entry)
            })
            .collect();
        let (_, meta) =
            SafeTensors::read_metadata(&bytes).map_err(|e| bad(format!("bad header: {e}")))?;
        let metadata = meta.metadata().clone().unwrap_or_default();
        drop(parsed);
        Ok(TensorFile {
            path,
            bytes,
            entries,
            metadata,
        })
    }

    fn err(&self, reason: impl Into<String>) -> Error {
        Error::Safetensors {
            path: self.path.display().to_string(),
            reason: reason.into(),
        }
    }

    /// Names of all tensors, sorted.
    pub fn names(&self) -> Result<Vec<String>> {
        let mut names: Vec<String> = self.entries.keys().cloned().collect();
        names.sort();
        Ok(names)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// The `__metadata__` string map (empty when the file has none).
    pub fn metadata(&self) -> Result<HashMap<String, String>> {
        Ok(self.metadata.clone())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Shape and dtype name (`F32`, `BF16`, …) of a tensor without converting it.
    pub fn info(&self, name: &str) -> Result<(Vec<usize>, String)> {
        let (dtype, shape, _) = self.view(name)?;
        Ok((shape.to_vec(), format!("{dtype:?}")))
    }

    fn view(&self, name: &str) -> Result<(Dtype, &[usize], &[u8])> {
        let e = self
            .entries
            .get(name)
            .ok_or_else(|| self.err(format!("missing tensor `{name}`")))?;
        Ok((e.dtype, &e.shape, &self.bytes[e.bytes.clone()]))
    }

    /// A floating-point tensor as f32 (f16, bf16 and f64 are converted).
    pub fn tensor(&self, name: &str) -> Result<Tensor> {
        let (dtype, shape, bytes) = self.view(name)?;
        let data: Vec<f32> = match dtype {
            Dtype::F32 => bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            Dtype::F16 => bytes
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            Dtype::BF16 => bytes
                .chunks_exact(2)
                .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            Dtype::F64 => bytes
                .chunks_exact(8)
                .map(|b| f64::from_le_bytes(b.try_into().expect("8-byte chunk")) as f32)
                .collect(),
            other => {
                return Err(self.err(format!(
                    "tensor `{name}` has dtype {other:?}, expected a float type"
                )))
            }
        };
        Tensor::new(shape, data)
    }

    /// An integer or boolean tensor as (shape, i64 values).
    pub fn ints(&self, name: &str) -> Result<(Vec<usize>, Vec<i64>)> {
        let (dtype, shape, bytes) = self.view(name)?;
        let data: Vec<i64> = match dtype {
            Dtype::I64 => bytes
                .chunks_exact(8)
                .map(|b| i64::from_le_bytes(b.try_into().expect("8-byte chunk")))
                .collect(),
            Dtype::I32 => bytes
                .chunks_exact(4)
                .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64)
                .collect(),
            Dtype::U8 | Dtype::BOOL => bytes.iter().map(|&b| b as i64).collect(),
            other => {
                return Err(self.err(format!(
                    "tensor `{name}` has dtype {other:?}, expected an integer type"
                )))
            }
        };
        Ok((shape.to_vec(), data))
    }
}

/// Writes f32 tensors (and optional `__metadata__`) to `path` atomically: the file
/// appears complete or not at all.
pub fn save(
    path: &Path,
    tensors: &[(&str, &Tensor)],
    metadata: Option<HashMap<String, String>>,
) -> Result<()> {
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, t)| t.data().iter().flat_map(|x| x.to_le_bytes()).collect())
        .collect();
    let views = tensors
        .iter()
        .zip(&bytes)
        .map(|((name, t), b)| {
            safetensors::tensor::TensorView::new(Dtype::F32, t.shape().to_vec(), b)
                .map(|v| (name.to_string(), v))
                .map_err(|e| Error::invalid(*name, e.to_string()))
        })
        .collect::<Result<Vec<_>>>()?;
    let data = safetensors::tensor::serialize(views, metadata).map_err(|e| Error::Safetensors {
        path: path.display().to_string(),
        reason: e.to_string(),
    })?;
    super::atomic::write_atomic(path, &data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn save_then_open_round_trips_and_truncation_is_named() {
        let path = crate::io::scratch_dir("st").join("t.safetensors");
        let t = Tensor::from_fn(&[2, 3], |i| i as f32 - 1.5);
        let meta = HashMap::from([("k".to_string(), "v".to_string())]);
        save(&path, &[("x", &t)], Some(meta.clone())).unwrap();
        let f = TensorFile::open(&path).unwrap();
        assert_eq!(f.tensor("x").unwrap(), t);
        assert_eq!(f.metadata().unwrap(), meta);
        assert!(f
            .tensor("y")
            .unwrap_err()
            .to_string()
            .contains("missing tensor `y`"));
        drop(f);

        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 4]).unwrap();
        let err = TensorFile::open(&path)
            .err()
            .expect("truncated file must fail")
            .to_string();
        assert!(err.contains("t.safetensors"), "{err}");
        std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
    }
}
