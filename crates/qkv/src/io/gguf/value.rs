//! Metadata values as `parse.rs` reads them: numbers, bools and strings, and arrays kept
//! as the file stores them — the elements' little-endian bytes, each string as its u64
//! length and UTF-8. A 36 MB array costs 36 MB here, as in llama.cpp (which keeps raw
//! bytes too), not a 32-byte `Value` an element; elements are decoded when read. Arrays
//! of arrays are refused when read, as llama.cpp refuses them.

use std::fmt;

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

#[derive(Clone, PartialEq)]
pub struct Array {
    elem: ValueType,
    len: usize,
    /// the elements as stored, checked when read (bools are 0 or 1, strings UTF-8)
    bytes: Vec<u8>,
}

impl fmt::Debug for Array {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{} × {:?}]", self.len, self.elem)
    }
}

impl Array {
    /// An array of `elem`s from their values; every value must be an `elem` (a
    /// programming error otherwise), and `elem` must not be an array.
    pub fn from_values(elem: ValueType, items: impl IntoIterator<Item = Value>) -> Array {
        assert!(elem != ValueType::Array, "GGUF arrays do not nest");
        let mut bytes = Vec::new();
        let mut len = 0;
        for v in items {
            assert_eq!(v.value_type(), elem, "an array of {elem:?} given {v:?}");
            v.put(&mut bytes);
            len += 1;
        }
        Array { elem, len, bytes }
    }

    /// An array of strings.
    pub fn strings<S: AsRef<str>>(items: impl IntoIterator<Item = S>) -> Array {
        let mut bytes = Vec::new();
        let mut len = 0;
        for s in items {
            put_string(&mut bytes, s.as_ref());
            len += 1;
        }
        Array {
            elem: ValueType::String,
            len,
            bytes,
        }
    }

    /// `len` elements of `elem` as a file stores them, already checked by the reader.
    pub(super) fn stored(elem: ValueType, len: usize, bytes: Vec<u8>) -> Array {
        Array { elem, len, bytes }
    }

    pub fn elem(&self) -> ValueType {
        self.elem
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The elements' bytes as a file stores them.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The strings of an array of strings (`None` for any other element type), in place.
    pub fn strs(&self) -> Option<impl Iterator<Item = &str> + '_> {
        (self.elem == ValueType::String).then(|| {
            let mut at = 0;
            (0..self.len).map(move |_| {
                let (s, next) = string_at(&self.bytes, at);
                at = next;
                s
            })
        })
    }

    /// Each element decoded (strings copied).
    pub fn iter(&self) -> impl Iterator<Item = Value> + '_ {
        let width = self.elem.least_bytes();
        let mut strings = self.strs();
        (0..self.len).map(move |i| match strings.as_mut() {
            Some(s) => Value::String(s.next().expect("len strings").to_string()),
            None => scalar(self.elem, &self.bytes[i * width..(i + 1) * width]),
        })
    }

    /// Element `i`: numbers at once, a string by walking the ones before it.
    pub fn get(&self, i: usize) -> Option<Value> {
        if i >= self.len {
            return None;
        }
        match self.strs() {
            Some(mut s) => s.nth(i).map(|s| Value::String(s.to_string())),
            None => {
                let width = self.elem.least_bytes();
                Some(scalar(self.elem, &self.bytes[i * width..(i + 1) * width]))
            }
        }
    }
}

/// A string stored at `at` (u64 length, then its bytes, checked UTF-8 when read) and where
/// the next element starts.
fn string_at(bytes: &[u8], at: usize) -> (&str, usize) {
    let len = u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes")) as usize;
    let text = &bytes[at + 8..at + 8 + len];
    let s = std::str::from_utf8(text).expect("checked UTF-8 when read");
    (s, at + 8 + len)
}

pub(super) fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// A number or bool of type `ty` from its `ty.least_bytes()` little-endian bytes.
pub(super) fn scalar(ty: ValueType, b: &[u8]) -> Value {
    let a = |n: usize| -> [u8; 8] {
        let mut w = [0; 8];
        w[..n].copy_from_slice(&b[..n]);
        w
    };
    match ty {
        ValueType::U8 => Value::U8(b[0]),
        ValueType::I8 => Value::I8(b[0] as i8),
        ValueType::U16 => Value::U16(u16::from_le_bytes([b[0], b[1]])),
        ValueType::I16 => Value::I16(i16::from_le_bytes([b[0], b[1]])),
        ValueType::U32 => Value::U32(u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        ValueType::I32 => Value::I32(i32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        ValueType::F32 => Value::F32(f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        ValueType::Bool => Value::Bool(b[0] != 0),
        ValueType::U64 => Value::U64(u64::from_le_bytes(a(8))),
        ValueType::I64 => Value::I64(i64::from_le_bytes(a(8))),
        ValueType::F64 => Value::F64(f64::from_le_bytes(a(8))),
        ValueType::String | ValueType::Array => unreachable!("not a scalar type: {ty:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_go_in_and_come_out_as_stored() {
        let a = Array::from_values(ValueType::I32, [-1, 7].map(Value::I32));
        assert_eq!(a.bytes(), [255, 255, 255, 255, 7, 0, 0, 0]);
        assert_eq!(
            a.iter().collect::<Vec<_>>(),
            [Value::I32(-1), Value::I32(7)]
        );
        assert_eq!(a.get(1), Some(Value::I32(7)));
        assert_eq!(a.get(2), None);
        assert!(a.strs().is_none());
        let s = Array::strings(["ab", "", "ü"]);
        assert_eq!(s.strs().unwrap().collect::<Vec<_>>(), ["ab", "", "ü"]);
        assert_eq!(s.get(2), Some(Value::String("ü".into())));
        assert_eq!(s.bytes().len(), 3 * 8 + 4);
        assert_eq!(format!("{s:?}"), "[3 × String]");
    }
}
