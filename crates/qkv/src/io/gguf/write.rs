//! Writing a GGUF file (version 3, little-endian, alignment 32): the header, the
//! metadata, the tensor infos (dims innermost first, offsets from the data section),
//! then each tensor's bytes at the next multiple of the alignment, as llama.cpp's
//! `GGUFWriter` lays them out. The file appears whole or not at all
//! ([`crate::io::atomic::write_atomic_with`]).

use std::io::Write;
use std::path::Path;

use super::value::{put_string, Value};

use super::types::GgmlType;
use crate::error::{Error, Result};

/// Where every tensor's bytes start: a multiple of this from the data section's start,
/// which is itself aligned.
const ALIGNMENT: usize = 32;

/// A tensor to write: its name, its shape outermost first (as [`Tensor`] has it), its
/// type, and its bytes: whole blocks of the type, row after row.
///
/// [`Tensor`]: crate::tensor::Tensor
pub struct OutTensor {
    pub name: String,
    pub shape: Vec<usize>,
    pub ty: GgmlType,
    pub bytes: Vec<u8>,
}

/// Writes `metadata` (in order) and `tensors` as the GGUF file `path`. `tensor(i)` gives
/// tensor i when it is its turn, so that a model is written one tensor at a time.
/// `infos` are the tensors' names, shapes and types, known before any is made.
pub fn write(
    path: &Path,
    metadata: &[(String, Value)],
    infos: &[(String, Vec<usize>, GgmlType)],
    tensor: &mut dyn FnMut(usize) -> Result<OutTensor>,
) -> Result<()> {
    let mut head = Vec::new();
    head.extend_from_slice(b"GGUF");
    head.extend(3u32.to_le_bytes());
    head.extend((infos.len() as u64).to_le_bytes());
    head.extend((metadata.len() as u64).to_le_bytes());
    for (key, value) in metadata {
        put_string(&mut head, key);
        head.extend(value.value_type().code().to_le_bytes());
        value.put(&mut head);
    }
    let mut sizes = Vec::with_capacity(infos.len());
    let mut offset = 0usize;
    for (name, shape, ty) in infos {
        let numel: usize = shape.iter().product();
        let size = ty.bytes_of(numel).ok_or_else(|| Error::Gguf {
            path: path.display().to_string(),
            reason: format!("tensor `{name}`: {numel} values are not whole {ty} blocks"),
        })?;
        put_string(&mut head, name);
        head.extend((shape.len() as u32).to_le_bytes());
        shape
            .iter()
            .rev()
            .for_each(|&d| head.extend((d as u64).to_le_bytes()));
        head.extend(ty.code.to_le_bytes());
        head.extend((offset as u64).to_le_bytes());
        sizes.push(size);
        offset += size.next_multiple_of(ALIGNMENT);
    }
    head.resize(head.len().next_multiple_of(ALIGNMENT), 0);
    // every tensor is made (and checked) before its turn to be written; a failure
    // leaves no file behind
    let mut failed: Option<Error> = None;
    crate::io::atomic::write_atomic_with(path, &mut |w: &mut dyn Write| {
        w.write_all(&head)?;
        for (i, (name, shape, ty)) in infos.iter().enumerate() {
            let t = tensor(i).map_err(|e| {
                let err = std::io::Error::other(e.to_string());
                failed = Some(e);
                err
            })?;
            assert!(
                t.name == *name && t.shape == *shape && t.ty == *ty && t.bytes.len() == sizes[i],
                "tensor {i} is `{name}` {shape:?} {ty} of {} bytes",
                sizes[i]
            );
            w.write_all(&t.bytes)?;
            let pad = sizes[i].next_multiple_of(ALIGNMENT) - sizes[i];
            w.write_all(&[0u8; ALIGNMENT][..pad])?;
        }
        Ok(())
    })
    .map_err(|e| failed.take().unwrap_or(e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::gguf::Array;

    #[test]
    fn a_written_file_parses_back_with_its_metadata_and_tensors() {
        let dir = crate::io::scratch_dir("gguf-write");
        let path = dir.join("w.gguf");
        let metadata = vec![
            (
                "general.architecture".to_string(),
                Value::String("llama".into()),
            ),
            ("n".to_string(), Value::U32(7)),
            ("list".to_string(), Value::Array(Array::strings(["a"]))),
        ];
        let infos = vec![
            ("a".to_string(), vec![2, 3], GgmlType::F32),
            ("b".to_string(), vec![1, 32], GgmlType::Q8_0),
        ];
        let mut make = |i: usize| {
            let (name, shape, ty) = infos[i].clone();
            let n = ty.bytes_of(shape.iter().product()).unwrap();
            Ok(OutTensor {
                name,
                shape,
                ty,
                bytes: (0..n).map(|b| b as u8).collect(),
            })
        };
        write(&path, &metadata, &infos, &mut make).unwrap();
        let file = super::super::GgufFile::open(&path).unwrap();
        assert_eq!(file.header.get("n"), Some(&Value::U32(7)));
        assert_eq!(file.header.get("list"), Some(&metadata[2].1));
        let b = file.header.tensor("b").unwrap();
        assert_eq!(
            (b.shape(), b.ty, b.offset),
            (vec![1, 32], GgmlType::Q8_0, 32)
        );
        assert_eq!(file.data(b), (0..34).map(|b| b as u8).collect::<Vec<_>>());

        // a tensor that fails leaves no file
        let other = dir.join("x.gguf");
        let mut fail = |_: usize| Err(Error::invalid("tensor", "no values"));
        let err = write(&other, &metadata, &infos, &mut fail).unwrap_err();
        assert!(err.to_string().contains("no values"), "{err}");
        assert!(!other.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
