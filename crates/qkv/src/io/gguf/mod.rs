//! GGUF files (llama.cpp's format, which ollama and LM Studio use): typed metadata and
//! tensors stored as ggml types, quantized blocks included. [`GgufFile::open`] maps the
//! file and checks every field before anything is sized from it (see `parse.rs`);
//! tensors are then read in place.

mod dequant;
mod header;
mod parse;
mod types;
mod value;
mod write;

use std::path::Path;

pub use header::{Header, TensorInfo};
pub use types::GgmlType;
pub use value::{Array, Value, ValueType};
pub use write::{write, OutTensor};

use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// Checks GGUF `bytes` and reads everything before the data (see `parse.rs`); the
/// error is the reason, without a file name.
pub fn parse(bytes: &[u8]) -> std::result::Result<Header, String> {
    parse::parse(bytes)
}

/// Whether `path` is a GGUF file (a file named `*.gguf`), which qkv takes wherever a
/// model folder is taken.
pub fn is_gguf(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "gguf") && path.is_file()
}

/// Whether `path` is named as a GGUF file (`*.gguf`), whether or not it exists: a
/// missing one is a missing file, not a folder.
pub fn named_gguf(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "gguf") && !path.is_dir()
}

/// A GGUF file mapped into memory, its header checked.
pub struct GgufFile {
    path: String,
    bytes: memmap2::Mmap,
    pub header: Header,
}

impl GgufFile {
    pub fn open(path: &Path) -> Result<GgufFile> {
        let file = super::files::open_regular(path)?;
        // SAFETY: the map is read only; a file changed by another process while mapped
        // is outside what any reader of it can guard against (safetensors maps alike).
        let bytes = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        let path = path.display().to_string();
        let header = parse(&bytes).map_err(|reason| Error::Gguf {
            path: path.clone(),
            reason,
        })?;
        Ok(GgufFile {
            path,
            bytes,
            header,
        })
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    /// The stored bytes of `t` (whole blocks of its type), inside the file.
    pub fn data(&self, t: &TensorInfo) -> &[u8] {
        &self.bytes[self.header.data_start + t.offset..][..t.size]
    }

    fn info(&self, name: &str) -> Result<&TensorInfo> {
        self.header.tensor(name).ok_or_else(|| Error::Gguf {
            path: self.path.clone(),
            reason: format!("no tensor `{name}`"),
        })
    }

    /// Tensor `name` as f32 in its [`TensorInfo::shape`], dequantized by the reference
    /// twins of the block kernels.
    pub fn tensor(&self, name: &str) -> Result<Tensor> {
        let t = self.info(name)?;
        let rows = t.shape()[0];
        match t.dims.len() {
            // a vector's values need not be whole blocks one by one
            1 => self.whole(name),
            _ => self.rows(name, 0, rows),
        }
    }

    /// [`GgufFile::tensor`] for any shape.
    fn whole(&self, name: &str) -> Result<Tensor> {
        let t = self.info(name)?;
        self.check_readable(name, t)?;
        let n = t.numel();
        super::memory::check(
            n.checked_mul(4),
            &format!("tensor `{name}` of {} as f32", self.path),
        )?;
        let mut out = vec![0.0f32; n];
        dequant::dequantize(t.ty, self.data(t), &mut out);
        Tensor::new(&t.shape(), out)
    }

    fn check_readable(&self, name: &str, t: &TensorInfo) -> Result<()> {
        match t.ty.dequantizes() {
            true => Ok(()),
            false => Err(Error::Unsupported(format!(
                "{}: tensor `{name}` is {}; qkv reads F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K and Q6_K",
                self.path, t.ty
            ))),
        }
    }

    /// Rows `first .. first + count` of tensor `name` (along its outermost axis) as f32,
    /// dequantized as [`GgufFile::tensor`] dequantizes them: a part of a fused tensor,
    /// read without the rest.
    pub fn rows(&self, name: &str, first: usize, count: usize) -> Result<Tensor> {
        let t = self.info(name)?;
        self.check_readable(name, t)?;
        let mut shape = t.shape();
        let width = t.numel() / shape[0];
        let bad = |reason: String| Error::Gguf {
            path: self.path.clone(),
            reason: format!("tensor `{name}`: {reason}"),
        };
        let row_bytes = t.ty.bytes_of(width).ok_or_else(|| {
            bad(format!(
                "rows of {width} values are not whole {} blocks",
                t.ty
            ))
        })?;
        if first.checked_add(count).is_none_or(|end| end > shape[0]) {
            return Err(bad(format!(
                "rows {first}..{} of {}",
                first.saturating_add(count),
                shape[0]
            )));
        }
        let n = count * width;
        super::memory::check(
            n.checked_mul(4),
            &format!("tensor `{name}` of {} as f32", self.path),
        )?;
        let mut out = vec![0.0f32; n];
        let bytes = &self.data(t)[first * row_bytes..(first + count) * row_bytes];
        dequant::dequantize(t.ty, bytes, &mut out);
        shape[0] = count;
        Tensor::new(&shape, out)
    }
}
