//! GGUF files (llama.cpp's format, which ollama and LM Studio use): typed metadata and
//! tensors stored as ggml types, quantized blocks included. [`GgufFile::open`] maps the
//! file and checks every field before anything is sized from it (see `parse.rs`);
//! tensors are then read in place.

mod dequant;
mod parse;
mod types;

use std::path::Path;

pub use types::GgmlType;

use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// A metadata value's type: GGUF's `gguf_metadata_value_type` codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueType {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    F32,
    Bool,
    String,
    Array,
    U64,
    I64,
    F64,
}

impl ValueType {
    pub fn from_code(code: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match code {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// The fewest bytes a value of this type takes (a string or array: its header).
    fn least_bytes(self) -> usize {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }
}

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    /// the elements' type (kept for an empty array) and the elements
    Array(ValueType, Vec<Value>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    /// An integer of any width that is ≥ 0.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// A number of any type (integers widened).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            Value::I8(v) => Some(v.into()),
            Value::I16(v) => Some(v.into()),
            Value::I32(v) => Some(v.into()),
            Value::I64(v) => Some(v as f64),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(_, items) => Some(items),
            _ => None,
        }
    }
}

/// One tensor's description.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// as stored: innermost (contiguous) first, so a `[rows, cols]` matrix is `[cols, rows]`
    pub dims: Vec<usize>,
    pub ty: GgmlType,
    /// bytes from the start of the data section
    pub offset: usize,
    /// bytes of its data
    pub size: usize,
}

impl TensorInfo {
    /// The shape in qkv's (and numpy's) order, outermost first: the dims reversed.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().copied().collect()
    }

    pub fn numel(&self) -> usize {
        self.dims.iter().product()
    }
}

/// What precedes a GGUF file's data.
#[derive(Clone, Debug)]
pub struct Header {
    pub version: u32,
    pub alignment: usize,
    /// in file order
    pub metadata: Vec<(String, Value)>,
    /// in file order
    pub tensors: Vec<TensorInfo>,
    /// where the data section starts in the file
    pub data_start: usize,
}

impl Header {
    /// Checks GGUF `bytes` and reads everything before the data (see `parse.rs`); the
    /// error is the reason, without a file name.
    pub fn parse(bytes: &[u8]) -> std::result::Result<Header, String> {
        parse::parse(bytes)
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

/// A GGUF file mapped into memory, its header checked.
pub struct GgufFile {
    path: String,
    bytes: memmap2::Mmap,
    pub header: Header,
}

impl GgufFile {
    pub fn open(path: &Path) -> Result<GgufFile> {
        let file = super::open_regular(path)?;
        // SAFETY: the map is read only; a file changed by another process while mapped
        // is outside what any reader of it can guard against (safetensors maps alike).
        let bytes = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        let path = path.display().to_string();
        let header = Header::parse(&bytes).map_err(|reason| Error::Gguf {
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
        if !t.ty.dequantizes() {
            return Err(Error::Unsupported(format!(
                "{}: tensor `{name}` is {}; qkv reads F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K and Q6_K",
                self.path, t.ty
            )));
        }
        let n = t.numel();
        super::memory::check(
            n.checked_mul(4),
            &format!("tensor `{name}` of {} as f32", self.path),
        )?;
        let mut out = vec![0.0f32; n];
        dequant::dequantize(t.ty, self.data(t), &mut out);
        Tensor::new(&t.shape(), out)
    }
}
