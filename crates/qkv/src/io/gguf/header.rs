//! What precedes a GGUF file's data: the metadata (`value.rs`) and the tensor infos, as
//! `parse.rs` reads them.

use super::types::GgmlType;
use super::value::Value;

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
