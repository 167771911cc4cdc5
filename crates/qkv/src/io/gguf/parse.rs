//! The GGUF layout, read and checked before anything is allocated from it:
//!
//! - header: `GGUF`, version u32 (2 or 3; little-endian), tensor count u64, metadata
//!   count u64;
//! - metadata: key (u64 length + UTF-8), value type u32, value (arrays: element type
//!   u32, count u64, elements);
//! - tensor infos: name, dimension count u32, dims u64 (innermost first), ggml type u32,
//!   offset u64 from the data section;
//! - the data section, at the next multiple of `general.alignment` (32 when absent).
//!
//! Every count is checked against the bytes left before a vector is sized from it, every
//! length before it is read, and every tensor's bytes must lie inside the file, aligned
//! and apart from the others: llama.cpp's own reader has had several CVEs in exactly
//! these fields.

use std::collections::HashSet;

use super::header::{Header, TensorInfo};
use super::types::GgmlType;
use super::value::{Array, Value, ValueType};

/// ggml's limits: dimensions of a tensor, bytes of a tensor's name.
const MAX_DIMS: usize = 4;
const MAX_NAME: usize = 64;

/// The bytes of a file and a read position; errors are the reason, in words.
struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

type Parse<T> = std::result::Result<T, String>;

impl<'a> Cursor<'a> {
    fn left(&self) -> usize {
        self.b.len() - self.at
    }

    fn take(&mut self, n: usize, what: &dyn Fn() -> String) -> Parse<&'a [u8]> {
        if n > self.left() {
            return Err(format!(
                "{} needs {n} bytes at offset {}, past the end of the file ({} bytes)",
                what(),
                self.at,
                self.b.len()
            ));
        }
        let s = &self.b[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Parse<[u8; N]> {
        Ok(self.take(N, what)?.try_into().expect("N bytes"))
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Parse<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Parse<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A count that sizes something of at least `least` bytes per item: at most what
    /// the rest of the file could hold.
    fn count(&mut self, least: usize, what: &dyn Fn() -> String) -> Parse<usize> {
        let n = self.u64(what)?;
        let fits = (self.left() / least.max(1)) as u64;
        if n > fits {
            return Err(format!(
                "{} is {n}, more than the {} bytes left in the file can hold",
                what(),
                self.left()
            ));
        }
        Ok(n as usize)
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Parse<String> {
        self.string_in_place(what).map(str::to_string)
    }

    /// A string (u64 length, UTF-8) where it lies in the file.
    fn string_in_place(&mut self, what: &dyn Fn() -> String) -> Parse<&'a str> {
        let len = self.u64(&|| format!("the length of {}", what()))?;
        if len > self.left() as u64 {
            return Err(format!(
                "{} is {len} bytes long, past the end of the file ({} bytes left)",
                what(),
                self.left()
            ));
        }
        let bytes = self.take(len as usize, what)?;
        std::str::from_utf8(bytes).map_err(|_| format!("{} is not UTF-8", what()))
    }

    /// An array's element type, count and elements, kept as stored and checked here: its
    /// size is the file's bytes, whatever the count.
    fn packed_array(&mut self, what: &dyn Fn() -> String) -> Parse<Array> {
        let code = self.u32(&|| format!("the element type of {}", what()))?;
        let elem = ValueType::from_code(code)
            .ok_or_else(|| format!("{} has elements of unknown type {code}", what()))?;
        if elem == ValueType::Array {
            return Err(format!(
                "{} is an array of arrays, which GGUF readers (llama.cpp's among them) refuse",
                what()
            ));
        }
        let n = self.count(elem.least_bytes(), &|| {
            format!("the element count of {}", what())
        })?;
        let start = self.at;
        if elem == ValueType::String {
            for i in 0..n {
                self.string_in_place(&|| format!("{}[{i}]", what()))?;
            }
        } else {
            let stored = self.take(n * elem.least_bytes(), what)?;
            if elem == ValueType::Bool {
                if let Some(i) = stored.iter().position(|&b| b > 1) {
                    return Err(format!(
                        "{}[{i}] is a bool stored as {}, not 0 or 1",
                        what(),
                        stored[i]
                    ));
                }
            }
        }
        Ok(Array::stored(elem, n, self.b[start..self.at].to_vec()))
    }

    fn value(&mut self, ty: ValueType, what: &dyn Fn() -> String) -> Parse<Value> {
        Ok(match ty {
            ValueType::U8 => Value::U8(self.array::<1>(what)?[0]),
            ValueType::I8 => Value::I8(self.array::<1>(what)?[0] as i8),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(what)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(what)?)),
            ValueType::U32 => Value::U32(self.u32(what)?),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(what)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(what)?)),
            ValueType::U64 => Value::U64(self.u64(what)?),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(what)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(what)?)),
            ValueType::Bool => match self.array::<1>(what)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(format!("{} is a bool stored as {b}, not 0 or 1", what())),
            },
            ValueType::String => Value::String(self.string(what)?),
            ValueType::Array => Value::Array(self.packed_array(what)?),
        })
    }
}

/// The header, metadata and tensor infos of GGUF `bytes`, each checked (see the module
/// docs); the tensor data is left where it is.
pub(super) fn parse(bytes: &[u8]) -> Parse<Header> {
    let mut c = Cursor { b: bytes, at: 0 };
    let magic = c.take(4, &|| "the magic `GGUF`".into())?;
    if magic != b"GGUF" {
        return Err(format!(
            "not a GGUF file: it starts with {magic:02x?}, not `GGUF`"
        ));
    }
    let version = c.u32(&|| "the version".into())?;
    match version {
        2 | 3 => {}
        1 => {
            return Err(
                "GGUF version 1 (before August 2023) is not supported: convert the model again with llama.cpp".into(),
            )
        }
        v if v.swap_bytes() <= 3 => {
            return Err(format!(
                "a big-endian GGUF file (version {}) is not supported",
                v.swap_bytes()
            ))
        }
        v => return Err(format!("GGUF version {v} is not supported (2 and 3 are)")),
    }
    // a tensor info takes at least 32 bytes, a metadata pair 13
    let tensor_count = c.count(32, &|| "the tensor count".into())?;
    let kv_count = c.count(13, &|| "the metadata count".into())?;

    // names seen (where they lie in the file: a file of millions of keys is not held
    // twice), so that a file of many keys or tensors is checked in linear time
    let mut seen: HashSet<&str> = HashSet::new();
    let mut metadata: Vec<(String, Value)> = Vec::with_capacity(kv_count);
    for i in 0..kv_count {
        let key = c.string_in_place(&|| format!("metadata key {i}"))?;
        if !seen.insert(key) {
            return Err(format!("metadata key `{key}` appears twice"));
        }
        let code = c.u32(&|| format!("the value type of `{key}`"))?;
        let ty = ValueType::from_code(code)
            .ok_or_else(|| format!("metadata `{key}` has unknown value type {code}"))?;
        let value = c.value(ty, &|| format!("metadata `{key}`"))?;
        metadata.push((key.to_string(), value));
    }
    let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
        None => 32,
        Some((_, Value::U32(a))) if a.is_power_of_two() => *a as usize,
        Some((_, v)) => {
            return Err(format!(
                "metadata `general.alignment` is {v:?}; it must be a u32 power of two"
            ))
        }
    };

    seen.clear();
    let mut tensors: Vec<TensorInfo> = Vec::with_capacity(tensor_count);
    for i in 0..tensor_count {
        let name = c.string_in_place(&|| format!("the name of tensor {i}"))?;
        let what = format!("tensor `{name}`");
        if name.len() > MAX_NAME {
            return Err(format!("{what}: a name over {MAX_NAME} bytes"));
        }
        if !seen.insert(name) {
            return Err(format!("{what} appears twice"));
        }
        let n_dims = c.u32(&|| format!("the dimension count of {what}"))? as usize;
        if !(1..=MAX_DIMS).contains(&n_dims) {
            return Err(format!("{what} has {n_dims} dimensions (1 to {MAX_DIMS})"));
        }
        let mut dims = Vec::with_capacity(n_dims);
        for d in 0..n_dims {
            let n = c.u64(&|| format!("dimension {d} of {what}"))?;
            if n == 0 || n > i64::MAX as u64 {
                return Err(format!("{what}: dimension {d} is {n}"));
            }
            dims.push(n as usize);
        }
        let code = c.u32(&|| format!("the type of {what}"))?;
        let ty = GgmlType::from_code(code)
            .ok_or_else(|| format!("{what} has type {code}, which is no ggml type"))?;
        let offset = c.u64(&|| format!("the offset of {what}"))?;
        let numel = dims
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .filter(|&n| n <= i64::MAX as usize)
            .ok_or_else(|| format!("{what}: dims {dims:?} overflow"))?;
        if dims[0] % ty.block != 0 {
            return Err(format!(
                "{what}: its rows of {} weights are not whole {ty} blocks of {}",
                dims[0], ty.block
            ));
        }
        let size = ty
            .bytes_of(numel)
            .ok_or_else(|| format!("{what}: dims {dims:?} overflow"))?;
        if offset % alignment as u64 != 0 {
            return Err(format!(
                "{what}: offset {offset} is not a multiple of the alignment {alignment}"
            ));
        }
        tensors.push(TensorInfo {
            name: name.to_string(),
            dims,
            ty,
            offset: offset.try_into().unwrap_or(usize::MAX),
            size,
        });
    }

    let data_start = c.at.next_multiple_of(alignment);
    let data_len = bytes.len().saturating_sub(data_start);
    let mut by_offset: Vec<&TensorInfo> = tensors.iter().collect();
    by_offset.sort_by_key(|t| t.offset);
    for (i, t) in by_offset.iter().enumerate() {
        if t.offset
            .checked_add(t.size)
            .is_none_or(|end| end > data_len)
        {
            return Err(format!(
                "tensor `{}`: its {} bytes at offset {} run past the end of the data ({data_len} bytes from {data_start})",
                t.name, t.size, t.offset
            ));
        }
        if let Some(next) = by_offset.get(i + 1) {
            if t.offset + t.size > next.offset {
                return Err(format!(
                    "tensors `{}` and `{}` overlap (offsets {} and {})",
                    t.name, next.name, t.offset, next.offset
                ));
            }
        }
    }
    Ok(Header {
        version,
        alignment,
        metadata,
        tensors,
        data_start,
    })
}
