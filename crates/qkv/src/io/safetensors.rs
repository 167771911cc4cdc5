//! safetensors files through Hugging Face's own `safetensors` crate. Floats of any
//! width (f32, f16, bf16, f64) are read as f32; integers and booleans as i64. Files are
//! memory-mapped: a checkpoint's bytes are paged in once, straight into the f32 copy.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors};

use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// A memory-mapped safetensors file, with tensors converted on request.
pub struct TensorFile {
    path: PathBuf,
    bytes: memmap2::Mmap,
}

impl TensorFile {
    /// Reads and parses the header; a truncated or corrupt file is an error naming it.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let io_err = |e| Error::io(&path, e);
        let file = std::fs::File::open(&path).map_err(io_err)?;
        // SAFETY: the map is read-only; a file truncated or rewritten by another process
        // while mapped is outside what this library can defend against, as for any mmap.
        let bytes = unsafe { memmap2::Mmap::map(&file) }.map_err(io_err)?;
        let file = TensorFile { path, bytes };
        file.parsed()?;
        Ok(file)
    }

    fn err(&self, reason: impl Into<String>) -> Error {
        Error::Safetensors {
            path: self.path.display().to_string(),
            reason: reason.into(),
        }
    }

    fn parsed(&self) -> Result<SafeTensors<'_>> {
        SafeTensors::deserialize(&self.bytes)
            .map_err(|e| self.err(format!("not a valid safetensors file: {e}")))
    }

    /// Names of all tensors, sorted.
    pub fn names(&self) -> Result<Vec<String>> {
        let mut names: Vec<String> = self
            .parsed()?
            .names()
            .into_iter()
            .map(String::from)
            .collect();
        names.sort();
        Ok(names)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.parsed()
            .map(|st| st.tensor(name).is_ok())
            .unwrap_or(false)
    }

    /// The `__metadata__` string map (empty when the file has none).
    pub fn metadata(&self) -> Result<HashMap<String, String>> {
        let (_, meta) = SafeTensors::read_metadata(&self.bytes)
            .map_err(|e| self.err(format!("bad header: {e}")))?;
        Ok(meta.metadata().clone().unwrap_or_default())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Shape and dtype name (`F32`, `BF16`, …) of a tensor without converting it.
    pub fn info(&self, name: &str) -> Result<(Vec<usize>, String)> {
        let (dtype, shape, _) = self.view(name)?;
        Ok((shape, format!("{dtype:?}")))
    }

    fn view(&self, name: &str) -> Result<(Dtype, Vec<usize>, &[u8])> {
        let st = self.parsed()?;
        let view = st
            .tensor(name)
            .map_err(|_| self.err(format!("missing tensor `{name}`")))?;
        let (dtype, shape) = (view.dtype(), view.shape().to_vec());
        // Re-slice from our own buffer so the bytes outlive the parsed header.
        let data = view.data();
        let start = data.as_ptr() as usize - self.bytes.as_ptr() as usize;
        Ok((dtype, shape, &self.bytes[start..start + data.len()]))
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
        Tensor::new(&shape, data)
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
        Ok((shape, data))
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
    super::write_atomic(path, &data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn save_then_open_round_trips_and_truncation_is_named() {
        let dir = std::env::temp_dir().join(format!("qkv-st-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.safetensors");
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
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
