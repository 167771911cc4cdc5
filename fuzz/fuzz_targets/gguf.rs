//! The GGUF reader: any bytes as a file, opened with `GgufFile::open`. A file that opens
//! must keep every tensor's bytes inside it, and every tensor of a type qkv reads must
//! dequantize to its shape's count of values (a type it does not read is refused). The
//! tokenizer, chat template and model read from the file's metadata end in a value or an
//! error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use qkv::io::gguf::GgufFile;

/// Tensors larger than this many values are not dequantized (libFuzzer's memory limit).
const MAX_VALUES: usize = 1 << 20;

fuzz_target!(init: qkv_fuzz::init(), |data: &[u8]| {
    let dir = qkv_fuzz::scratch("gguf");
    let path = dir.join("input.gguf");
    qkv_fuzz::write(&path, data);
    let Ok(file) = GgufFile::open(&path) else {
        return;
    };
    let h = &file.header;
    assert!(h.alignment.is_power_of_two(), "alignment {}", h.alignment);
    for t in &h.tensors {
        let end = h.data_start + t.offset + t.size;
        assert!(end <= data.len(), "`{}` ends at {end} of {}", t.name, data.len());
        assert_eq!(t.offset % h.alignment, 0, "`{}`: offset", t.name);
        assert_eq!(file.data(t).len(), t.size);
        if t.numel() > MAX_VALUES {
            continue;
        }
        match file.tensor(&t.name) {
            Ok(x) => {
                assert!(t.ty.dequantizes(), "`{}` ({}) was read", t.name, t.ty);
                assert_eq!(x.shape(), &t.shape()[..], "`{}`: shape", t.name);
            }
            Err(e) => assert!(!t.ty.dequantizes(), "`{}` ({}): {e}", t.name, t.ty),
        }
    }
    let _ = qkv::text::Tokenizer::from_gguf(&path);
    let _ = qkv::text::ChatTemplate::from_dir(&path);
    if h.tensors.iter().all(|t| t.numel() <= MAX_VALUES) {
        let _ = qkv::models::load_gguf(&path, qkv::weights::DType::F32);
    }
});
