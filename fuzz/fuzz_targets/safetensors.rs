//! The safetensors reader: any bytes as a file, opened with `TensorFile::open`; every
//! tensor it lists must then be readable as what its dtype says (floats with
//! `tensor`, integers and booleans with `ints`) in the shape `info` gives, and the
//! float tensors must survive `qkv::io::save` and a second open bit for bit.
#![no_main]

use std::collections::HashMap;

use libfuzzer_sys::fuzz_target;
use qkv::io::TensorFile;

const FLOATS: &[&str] = &["F32", "F16", "BF16", "F64"];
const INTS: &[&str] = &["I64", "I32", "U8", "BOOL"];

fuzz_target!(init: qkv_fuzz::init(), |data: &[u8]| {
    let dir = qkv_fuzz::scratch("safetensors");
    let path = dir.join("input.safetensors");
    qkv_fuzz::write(&path, data);
    let Ok(file) = TensorFile::open(&path) else {
        return;
    };
    let metadata = file.metadata().expect("metadata of a file that opened");
    let names = file.names().expect("names of a file that opened");
    let mut floats = Vec::new();
    for name in &names {
        assert!(file.contains(name), "`{name}` is listed but not contained");
        let (shape, dtype) = file.info(name).expect("info of a listed tensor");
        let numel = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
        let tensor = file.tensor(name);
        let ints = file.ints(name);
        if FLOATS.contains(&dtype.as_str()) {
            assert!(ints.is_err(), "`{name}` ({dtype}) read as integers");
            // Tensor::new may refuse a shape; it must not disagree with `info`
            if let Ok(t) = tensor {
                assert_eq!(t.shape(), &shape[..], "`{name}`: tensor shape vs info");
                assert_eq!(Some(t.numel()), numel, "`{name}`: element count");
                floats.push((name.clone(), t));
            }
        } else if INTS.contains(&dtype.as_str()) {
            assert!(tensor.is_err(), "`{name}` ({dtype}) read as floats");
            let (ishape, values) = ints.expect("an integer tensor reads as integers");
            assert_eq!(ishape, shape, "`{name}`: ints shape vs info");
            assert_eq!(Some(values.len()), numel, "`{name}`: element count");
        } else {
            assert!(tensor.is_err() && ints.is_err(), "`{name}` ({dtype}) was read");
        }
    }
    drop(file);

    // what was read as f32 is written back and read again unchanged
    let out = dir.join("roundtrip.safetensors");
    let refs: Vec<(&str, &qkv::Tensor)> = floats.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let meta = (!metadata.is_empty()).then(|| metadata.clone());
    qkv::io::save(&out, &refs, meta).expect("saving tensors that were just read");
    let again = TensorFile::open(&out).expect("opening a file qkv just saved");
    let read_back: HashMap<String, String> = again.metadata().expect("metadata");
    assert_eq!(read_back, metadata, "metadata round trip");
    assert_eq!(
        again.names().expect("names").len(),
        floats.len(),
        "tensor count round trip"
    );
    for (name, t) in &floats {
        let back = again.tensor(name).expect("a tensor qkv just saved");
        assert_eq!(back.shape(), t.shape(), "`{name}`: shape round trip");
        let same = back
            .data()
            .iter()
            .zip(t.data())
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "`{name}`: values round trip");
    }
});
