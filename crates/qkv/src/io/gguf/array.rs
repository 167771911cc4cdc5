//! A metadata array kept as the file stores it: the elements' little-endian bytes, each
//! string as its u64 length and UTF-8. A 36 MB array costs 36 MB here, as in llama.cpp
//! (which keeps raw bytes too), not a 32-byte `Value` an element; elements are decoded
//! when read. Arrays of arrays are refused when read, as llama.cpp refuses them.

use std::fmt;

use super::header::{Value, ValueType};

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
