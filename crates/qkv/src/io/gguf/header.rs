//! What precedes a GGUF file's data: the metadata values and the tensor infos, as
//! `parse.rs` reads them.

use super::array::{put_string, Array};
use super::types::GgmlType;

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

    /// GGUF's code for the type.
    pub fn code(self) -> u32 {
        (0..=12)
            .find(|&c| ValueType::from_code(c) == Some(self))
            .expect("every type has a code")
    }

    /// The fewest bytes a value of this type takes (a string or array: its header).
    pub(super) fn least_bytes(self) -> usize {
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
    /// the elements as stored (see `array.rs`)
    Array(Array),
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

    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(..) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// The value as a file stores it (an array: element type, count, elements).
    pub(super) fn put(&self, out: &mut Vec<u8>) {
        match self {
            Value::U8(x) => out.push(*x),
            Value::I8(x) => out.extend(x.to_le_bytes()),
            Value::U16(x) => out.extend(x.to_le_bytes()),
            Value::I16(x) => out.extend(x.to_le_bytes()),
            Value::U32(x) => out.extend(x.to_le_bytes()),
            Value::I32(x) => out.extend(x.to_le_bytes()),
            Value::F32(x) => out.extend(x.to_le_bytes()),
            Value::Bool(x) => out.push(u8::from(*x)),
            Value::String(s) => put_string(out, s),
            Value::Array(a) => {
                out.extend(a.elem().code().to_le_bytes());
                out.extend((a.len() as u64).to_le_bytes());
                out.extend_from_slice(a.bytes());
            }
            Value::U64(x) => out.extend(x.to_le_bytes()),
            Value::I64(x) => out.extend(x.to_le_bytes()),
            Value::F64(x) => out.extend(x.to_le_bytes()),
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
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }
}
