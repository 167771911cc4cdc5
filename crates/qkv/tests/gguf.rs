//! GGUF reading against llama.cpp's own `gguf` package: `fixtures/gguf/tensors.gguf`
//! written by its GGUFWriter, and what its GGUFReader and `gguf.quants.dequantize` read
//! back (`reference.json`, tools/fixtures/gen_gguf.py); and the checks that refuse a
//! malformed file with the field at fault, on files built byte by byte here. And models
//! from GGUF files converted as llama.cpp's converter does (Q and K permuted for
//! `llama`): the same logits, cache and generation as the Hugging Face folders they
//! came from, against those folders' transformers references.

#![cfg(feature = "models")]

mod common;
#[path = "gguf/converted.rs"]
mod converted;
#[path = "gguf/peak.rs"]
mod peak;

#[global_allocator]
static COUNTING: peak::Counting = peak::Counting;

use std::path::{Path, PathBuf};

use qkv::io::gguf::{self, GgufFile, Value};
use qkv::Error;
use serde_json::Value as Json;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/gguf")
        .join(name)
}

fn reference() -> Json {
    serde_json::from_str(&std::fs::read_to_string(fixture("reference.json")).unwrap()).unwrap()
}

/// A metadata value as GGUFReader's `contents()` gives it.
fn as_json(v: &Value) -> Json {
    match v {
        Value::U8(x) => (*x).into(),
        Value::I8(x) => (*x).into(),
        Value::U16(x) => (*x).into(),
        Value::I16(x) => (*x).into(),
        Value::U32(x) => (*x).into(),
        Value::I32(x) => (*x).into(),
        Value::U64(x) => (*x).into(),
        Value::I64(x) => (*x).into(),
        Value::F32(x) => f64::from(*x).into(),
        Value::F64(x) => (*x).into(),
        Value::Bool(x) => (*x).into(),
        Value::String(s) => s.as_str().into(),
        Value::Array(a) => a.iter().map(|v| as_json(&v)).collect(),
    }
}

fn type_names(v: &Value) -> Vec<String> {
    let name = |v: &Value| -> String {
        match v {
            Value::U8(_) => "UINT8",
            Value::I8(_) => "INT8",
            Value::U16(_) => "UINT16",
            Value::I16(_) => "INT16",
            Value::U32(_) => "UINT32",
            Value::I32(_) => "INT32",
            Value::U64(_) => "UINT64",
            Value::I64(_) => "INT64",
            Value::F32(_) => "FLOAT32",
            Value::F64(_) => "FLOAT64",
            Value::Bool(_) => "BOOL",
            Value::String(_) => "STRING",
            Value::Array(..) => "ARRAY",
        }
        .into()
    };
    match v {
        Value::Array(a) => {
            let mut names = vec!["ARRAY".to_string()];
            names.extend(a.get(0).map(|v| type_names(&v)).unwrap_or_default());
            names
        }
        _ => vec![name(v)],
    }
}

#[test]
fn metadata_and_tensors_read_as_the_gguf_package_reads_them() {
    let r = reference();
    let f = GgufFile::open(&fixture("tensors.gguf")).unwrap();
    let h = &f.header;
    assert_eq!(h.version as u64, r["version"].as_u64().unwrap());
    assert_eq!(h.alignment as u64, r["alignment"].as_u64().unwrap());

    let want = r["metadata"].as_object().unwrap();
    assert_eq!(h.metadata.len(), want.len());
    for (key, value) in &h.metadata {
        let w = &want[key.as_str()];
        assert_eq!(as_json(value), w["value"], "metadata `{key}`");
        let types: Vec<String> = serde_json::from_value(w["type"].clone()).unwrap();
        assert_eq!(type_names(value), types, "metadata `{key}`: type");
    }
    assert_eq!(
        h.get("general.architecture").and_then(Value::as_str),
        Some("llama")
    );
    assert_eq!(h.get("llama.block_count").and_then(Value::as_u64), Some(2));

    let tensors = r["tensors"].as_array().unwrap();
    assert_eq!(h.tensors.len(), tensors.len());
    for (t, w) in h.tensors.iter().zip(tensors) {
        let name = &t.name;
        assert_eq!(name, w["name"].as_str().unwrap());
        assert_eq!(t.ty.name, w["type"].as_str().unwrap(), "`{name}`: type");
        let dims: Vec<usize> = serde_json::from_value(w["dims"].clone()).unwrap();
        assert_eq!(t.dims, dims, "`{name}`: dims");
        assert_eq!(
            t.offset as u64,
            w["offset"].as_u64().unwrap(),
            "`{name}`: offset"
        );

        let got = f.tensor(name).unwrap();
        assert_eq!(
            got.shape(),
            &dims.iter().rev().copied().collect::<Vec<_>>()[..]
        );
        let want: Vec<f32> = w["values"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect();
        assert_eq!(got.numel(), want.len(), "`{name}`");
        // the same f32 arithmetic in the same order as gguf's numpy: equal bit for bit
        for (i, (g, w)) in got.data().iter().zip(&want).enumerate() {
            assert_eq!(
                g.to_bits(),
                w.to_bits(),
                "`{name}`[{i}]: {g} against gguf's {w}"
            );
        }
    }
    let err = f.tensor("missing").unwrap_err().to_string();
    assert!(
        err.contains("tensors.gguf") && err.contains("no tensor `missing`"),
        "{err}"
    );
}

/// GGUF bytes built field by field: metadata pairs (key, type code, value bytes) and
/// tensor infos (name, dims, type code, offset), then `data` bytes from the aligned start.
struct Builder {
    version: u32,
    kv: Vec<(String, u32, Vec<u8>)>,
    tensors: Vec<(String, Vec<u64>, u32, u64)>,
    data: usize,
}

fn string(s: &str) -> Vec<u8> {
    let mut b = (s.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(s.as_bytes());
    b
}

impl Builder {
    fn new() -> Self {
        Builder {
            version: 3,
            kv: vec![("general.architecture".into(), 8, string("llama"))],
            tensors: vec![("w".into(), vec![32, 2], 8, 0)],
            data: 68,
        }
    }

    fn bytes(&self) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(self.version.to_le_bytes());
        b.extend((self.tensors.len() as u64).to_le_bytes());
        b.extend((self.kv.len() as u64).to_le_bytes());
        for (k, ty, v) in &self.kv {
            b.extend(string(k));
            b.extend(ty.to_le_bytes());
            b.extend(v);
        }
        for (name, dims, ty, offset) in &self.tensors {
            b.extend(string(name));
            b.extend((dims.len() as u32).to_le_bytes());
            dims.iter().for_each(|d| b.extend(d.to_le_bytes()));
            b.extend(ty.to_le_bytes());
            b.extend(offset.to_le_bytes());
        }
        b.resize(b.len().next_multiple_of(32) + self.data, 0);
        b
    }

    fn error(&self) -> String {
        gguf::parse(&self.bytes())
            .expect_err("a malformed file")
            .to_string()
    }
}

fn array(elem: u32, count: u64, items: &[u8]) -> Vec<u8> {
    let mut b = elem.to_le_bytes().to_vec();
    b.extend(count.to_le_bytes());
    b.extend_from_slice(items);
    b
}

/// A run of a tensor's rows (a part of a fused tensor) reads as those rows of the whole,
/// in every type; rows past the end are refused naming the tensor.
#[test]
fn rows_of_a_tensor_read_as_the_whole_s_rows() {
    let file = GgufFile::open(&fixture("tensors.gguf")).unwrap();
    for t in file.header.tensors.iter().filter(|t| t.dims.len() == 2) {
        let whole = file.tensor(&t.name).unwrap();
        let (rows, width) = (whole.shape()[0], whole.shape()[1]);
        for (first, count) in [(0, rows), (1, rows - 1), (rows - 1, 1), (0, 0)] {
            let part = file.rows(&t.name, first, count).unwrap();
            assert_eq!(part.shape(), [count, width], "{}", t.name);
            assert_eq!(
                part.data(),
                &whole.data()[first * width..(first + count) * width],
                "{} rows {first}..",
                t.name
            );
        }
        let err = file.rows(&t.name, 1, rows).unwrap_err().to_string();
        assert!(
            err.contains(&format!("tensor `{}`: rows 1..", t.name)),
            "{err}"
        );
    }
}

/// A metadata array costs what the file stores, whatever its count: 4 M one-byte
/// elements and 500 000 empty strings (4 MB each in the file) are held as those bytes,
/// not as a 32-byte value an element (which made `qkv inspect` take 1.2 GB for a 36 MB
/// file).
#[test]
fn metadata_arrays_are_held_in_the_bytes_the_file_stores() {
    let mut b = Builder::new();
    let n = 4_000_000;
    b.kv.push(("bytes".into(), 9, array(0, n as u64, &vec![7; n])));
    let empty = vec![0u8; 8 * (n / 8)];
    b.kv.push(("strings".into(), 9, array(8, (n / 8) as u64, &empty)));
    let file = b.bytes();
    let (h, most) = peak::peak(|| gguf::parse(&file).unwrap());
    assert!(
        most < 2 * n + (1 << 20),
        "{most} bytes held for {} in the file",
        file.len()
    );
    let bytes = h.get("bytes").and_then(Value::as_array).unwrap();
    assert_eq!((bytes.len(), bytes.get(n - 1)), (n, Some(Value::U8(7))));
    let strings = h.get("strings").and_then(Value::as_array).unwrap();
    assert_eq!(
        strings.strs().unwrap().filter(|s| s.is_empty()).count(),
        n / 8
    );
}

/// llama.cpp refuses arrays of arrays; so does qkv, naming the key.
#[test]
fn an_array_of_arrays_is_refused() {
    let mut b = Builder::new();
    // [[1, 2], [3]] as arrays of u8 inside an array
    let inner = [array(0, 2, &[1, 2]), array(0, 1, &[3])].concat();
    b.kv.push(("nested".into(), 9, array(9, 2, &inner)));
    let err = b.error();
    assert!(
        err.contains("metadata `nested` is an array of arrays"),
        "{err}"
    );
}

#[test]
fn malformed_files_are_refused_naming_the_field() {
    let good = Builder::new();
    let bytes = good.bytes();
    // cut anywhere before the end of the tensor's data: an error, never a panic
    for end in 0..bytes.len() {
        let err = gguf::parse(&bytes[..end]).expect_err("a truncated file");
        assert!(!err.is_empty());
    }
    let check = |b: Builder, needle: &str| {
        let err = b.error();
        assert!(err.contains(needle), "wanted `{needle}` in: {err}");
    };
    let mut b = Builder::new();
    b.version = 1;
    check(b, "version 1");
    let mut b = Builder::new();
    b.version = 3u32.swap_bytes();
    check(b, "big-endian");

    let mut raw = good.bytes();
    raw[..4].copy_from_slice(b"GGML");
    assert!(gguf::parse(&raw).unwrap_err().contains("not a GGUF file"));
    // a tensor count no file could hold, before anything is sized from it
    let mut raw = good.bytes();
    raw[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(gguf::parse(&raw).unwrap_err().contains("the tensor count"));
    let mut raw = good.bytes();
    raw[16..24].copy_from_slice(&(1u64 << 40).to_le_bytes());
    assert!(gguf::parse(&raw)
        .unwrap_err()
        .contains("the metadata count"));

    let mut b = Builder::new();
    b.kv.push(("general.architecture".into(), 8, string("gpt2")));
    check(b, "`general.architecture` appears twice");
    let mut b = Builder::new();
    b.kv.push(("flag".into(), 7, vec![7]));
    check(b, "metadata `flag` is a bool stored as 7");
    let mut b = Builder::new();
    b.kv.push(("odd".into(), 13, vec![0; 8]));
    check(b, "metadata `odd` has unknown value type 13");
    let mut b = Builder::new();
    b.kv.push(("long".into(), 8, (u64::MAX - 3).to_le_bytes().to_vec()));
    check(b, "metadata `long` is 18446744073709551612 bytes long");
    let mut b = Builder::new();
    b.kv.push((
        "latin1".into(),
        8,
        [1u64.to_le_bytes().to_vec(), vec![0xe9]].concat(),
    ));
    check(b, "metadata `latin1` is not UTF-8");
    let mut b = Builder::new();
    b.kv.push(("huge".into(), 9, array(4, 1 << 61, &[])));
    check(b, "the element count of metadata `huge`");
    let mut b = Builder::new();
    let mut deep = array(0, 0, &[]);
    for _ in 0..5 {
        deep = array(9, 1, &deep);
    }
    b.kv.push(("deep".into(), 9, deep));
    check(b, "metadata `deep` is an array of arrays");
    let mut b = Builder::new();
    b.kv.push(("general.alignment".into(), 4, 24u32.to_le_bytes().to_vec()));
    check(b, "`general.alignment`");

    let mut b = Builder::new();
    b.tensors[0].2 = 99;
    check(b, "tensor `w` has type 99, which is no ggml type");
    let mut b = Builder::new();
    b.tensors[0].1 = vec![30, 2];
    check(
        b,
        "tensor `w`: its rows of 30 weights are not whole Q8_0 blocks of 32",
    );
    let mut b = Builder::new();
    b.tensors[0].1 = vec![32, 0];
    check(b, "tensor `w`: dimension 1 is 0");
    let mut b = Builder::new();
    b.tensors[0].1 = vec![32, 1, 1, 1, 1];
    check(b, "tensor `w` has 5 dimensions");
    let mut b = Builder::new();
    b.tensors[0].1 = vec![1 << 40, 1 << 30];
    check(b, "tensor `w`: dims");
    let mut b = Builder::new();
    b.tensors[0].3 = 16;
    check(
        b,
        "tensor `w`: offset 16 is not a multiple of the alignment 32",
    );
    let mut b = Builder::new();
    b.data = 67;
    check(
        b,
        "tensor `w`: its 68 bytes at offset 0 run past the end of the data",
    );
    let mut b = Builder::new();
    b.tensors.push(("v".into(), vec![32], 8, 32));
    b.data = 200;
    check(b, "tensors `w` and `v` overlap");
    let mut b = Builder::new();
    b.tensors.push(("w".into(), vec![32], 8, 96));
    b.data = 200;
    check(b, "tensor `w` appears twice");
    let mut b = Builder::new();
    b.tensors[0].0 = "x".repeat(65);
    check(b, "a name over 64 bytes");
}

#[test]
fn a_file_error_names_the_file_and_unread_types_are_refused() {
    let dir = std::env::temp_dir().join(format!("qkv-gguf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.gguf");
    std::fs::write(&path, b"GGUF\x03\x00\x00\x00").unwrap();
    let err = GgufFile::open(&path).err().expect("a truncated file");
    assert!(matches!(err, Error::Gguf { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("bad.gguf") && text.contains("the tensor count"),
        "{text}"
    );

    // Q2_K is a type qkv bounds-checks but does not compute with
    let mut b = Builder::new();
    b.tensors[0] = ("q2".into(), vec![256], 10, 0);
    b.data = 84;
    std::fs::write(&path, b.bytes()).unwrap();
    let f = GgufFile::open(&path).unwrap();
    let err = f.tensor("q2").unwrap_err().to_string();
    assert!(err.contains("tensor `q2` is Q2_K"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

fn gguf_model(name: &str) -> PathBuf {
    fixture("models").join(format!("{name}.gguf"))
}

#[test]
fn llama_and_qwen2_gguf_files_run_as_their_hugging_face_folders() {
    for name in ["llama_gqa", "qwen2"] {
        let loaded = qkv::models::load(&gguf_model(name)).unwrap();
        assert_eq!(loaded.dtypes, [("F32".to_string(), loaded.parameters)]);
        assert!(loaded.unused.is_empty(), "{name}: {:?}", loaded.unused);
        let folder = common::models::load_causal(name);
        assert_eq!(loaded.model.arch, folder.arch, "{name}: architecture");
        assert_eq!(
            loaded.model.special_tokens().eos,
            folder.special_tokens().eos,
            "{name}: eos"
        );
        common::models::check_causal_model(name, &loaded.model);
    }
}

/// Qwen3's per-head q/k norms read from `attn_q_norm` / `attn_k_norm`. llama.cpp's
/// `qwen3` has no sliding window and the converter writes none, so the folder's
/// window (its upper layer) is put back before comparing with transformers.
#[test]
fn a_qwen3_gguf_file_runs_as_its_hugging_face_folder() {
    let loaded = qkv::models::load(&gguf_model("qwen3")).unwrap();
    assert!(loaded.unused.is_empty(), "{:?}", loaded.unused);
    let mut m = loaded.model;
    assert_eq!(m.family.name(), "qwen3");
    let folder = common::models::load_causal("qwen3");
    assert!(m.arch.attention.qk_norm);
    assert_eq!(m.arch.attention.window, None);
    m.arch.attention.window = folder.arch.attention.window;
    m.arch.attention.window_from_layer = folder.arch.attention.window_from_layer;
    assert_eq!(m.arch, folder.arch, "architecture");
    common::models::check_causal_model("qwen3", &m);

    // and it writes back as `qwen3`, the norms included
    let path = std::env::temp_dir().join(format!("qkv-qwen3-{}.gguf", std::process::id()));
    let plain = qkv::models::load(&gguf_model("qwen3")).unwrap().model;
    qkv::models::save_gguf(&plain, &path, qkv::io::gguf::GgmlType::F32, "qwen3", vec![]).unwrap();
    let file = qkv::io::gguf::GgufFile::open(&path).unwrap();
    let arch = file
        .header
        .get("general.architecture")
        .and_then(|v| v.as_str());
    assert_eq!(arch, Some("qwen3"));
    assert!(file.header.tensor("blk.1.attn_k_norm.weight").is_some());
    let back = qkv::models::load(&path).unwrap().model;
    assert_eq!(back.arch, plain.arch);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn a_gguf_model_saves_as_a_hugging_face_folder_and_refuses_what_it_cannot_run() {
    let dir = std::env::temp_dir().join(format!("qkv-gguf-save-{}", std::process::id()));
    let m = qkv::models::load(&gguf_model("llama_gqa")).unwrap().model;
    m.save(&dir).unwrap();
    let back = qkv::models::load(&dir).unwrap().model;
    assert_eq!(back.arch, m.arch);
    common::models::check_causal_model("llama_gqa", &back);
    std::fs::remove_dir_all(&dir).unwrap();

    // the reader's fixture is a `llama` file without a model's tensors
    let err = qkv::models::load(&fixture("tensors.gguf"))
        .err()
        .expect("no model");
    assert!(err.to_string().contains("tensors.gguf"), "{err}");

    // sizes far beyond the stored values are refused before anything is allocated
    let mut b = Builder::new();
    let u32_kv = |key: &str, v: u32| (key.to_string(), 4, v.to_le_bytes().to_vec());
    b.kv.extend([
        u32_kv("llama.embedding_length", 32),
        u32_kv("llama.block_count", 1 << 30),
        u32_kv("llama.attention.head_count", 4),
        u32_kv("llama.context_length", 64),
        u32_kv("llama.feed_forward_length", 64),
    ]);
    b.tensors[0] = ("token_embd.weight".into(), vec![32, 2], 0, 0);
    b.data = 256;
    let path = std::env::temp_dir().join(format!("qkv-gguf-huge-{}.gguf", std::process::id()));
    std::fs::write(&path, b.bytes()).unwrap();
    let err = qkv::models::load(&path)
        .err()
        .expect("sizes beyond the file")
        .to_string();
    assert!(err.contains("its metadata: the sizes describe"), "{err}");
    std::fs::remove_file(&path).unwrap();
}

/// llama.cpp's logits for the quantized fixtures (tools/fixtures/gen_gguf_quant.py).
fn quant_reference() -> Json {
    let text = std::fs::read_to_string(fixture("models/quant_reference.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// A JSON list of token ids.
fn ids(v: &Json) -> Vec<usize> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_u64().unwrap() as usize)
        .collect()
}

/// The token ids and llama.cpp's logits (a row per position) of one quantized fixture.
fn quant_case(refs: &Json, name: &str) -> (Vec<usize>, Vec<Vec<f32>>) {
    let rows = refs[name]["logits"].as_array().unwrap().iter();
    let rows = rows.map(|r| {
        let r = r.as_array().unwrap().iter();
        r.map(|v| v.as_f64().unwrap() as f32).collect()
    });
    (ids(&refs[name]["tokens"]), rows.collect())
}

/// `logits` `[1, T, V]` against `rows` (T rows of V): the largest difference, and at how
/// many positions the top token is the same.
fn against(logits: &qkv::Tensor, rows: &[Vec<f32>]) -> (f32, usize) {
    let vocab = logits.last_dim();
    let top = |r: &[f32]| (0..r.len()).max_by(|&a, &b| r[a].total_cmp(&r[b])).unwrap();
    let (mut worst, mut same_top) = (0.0f32, 0);
    for (mine, row) in logits.data().chunks_exact(vocab).zip(rows) {
        same_top += usize::from(top(mine) == top(row));
        for (a, b) in mine.iter().zip(row) {
            worst = worst.max((a - b).abs());
        }
    }
    (worst, same_top)
}

#[test]
fn q8_0_files_run_from_their_blocks_as_llama_cpp_runs_them() {
    use qkv::module::Module;
    use qkv::weights::DType;
    let refs = quant_reference();
    for name in ["llama_gqa", "qwen2"] {
        let q8 = format!("{name}_q8_0");
        let mut m = qkv::models::load(&gguf_model(&q8)).unwrap().model;
        // every linear layer computes from its blocks, and none holds an f32 weight
        assert_eq!(m.dtype(), DType::Int8, "{q8}");
        assert!(!m.has_f32_weights(), "{q8}");
        // so does the token table: its lookups widen the rows they read; Qwen2's head
        // is tied, and reads the same blocks
        let table = m
            .weights
            .embed_tokens
            .stored()
            .expect("the token table as stored");
        let head = m.weights.head.lm_head.as_ref().expect("a head");
        assert_eq!(
            head.shares_copy_with(table),
            name == "qwen2",
            "{q8}: head and table"
        );

        // llama.cpp also quantizes the activations of a Q8_0 product to Q8_0 blocks:
        // the two differ only in the order of f32 sums
        let (tokens, want) = quant_case(&refs, &q8);
        let batch = qkv::models::TokenBatch::single(tokens).unwrap();
        let logits = m.forward_cached(&batch, &mut m.new_cache(1)).unwrap();
        let (worst, _) = against(&logits, &want);
        assert!(worst < 1e-5, "{q8}: logits {worst:e} from llama.cpp's");

        // the twin: widened, the weights are gguf's dequantization of the same blocks,
        // and the model computes in f32 as the dequantized file does
        m.unpack_weights();
        let twin = format!("{q8}.dequantized");
        let deq = qkv::models::load(&gguf_model(&twin)).unwrap().model;
        for ((path, got), (_, want)) in m.weights.params().into_iter().zip(deq.weights.params()) {
            assert_eq!(got.data(), want.data(), "{q8}: {path}");
        }
        let widened = m.forward_cached(&batch, &mut m.new_cache(1)).unwrap();
        let reference = deq.forward_cached(&batch, &mut deq.new_cache(1)).unwrap();
        assert_eq!(widened.data(), reference.data(), "{q8}: widened logits");
    }
}

#[test]
fn the_metadata_s_tokenizer_is_the_hugging_face_one_it_was_made_from() {
    use qkv::text::Tokenizer;
    let dir = fixture("tokenizers");
    let text = std::fs::read_to_string(dir.join("reference.json")).unwrap();
    let refs: Json = serde_json::from_str(&text).unwrap();
    for name in ["llama_spm", "qwen2_bpe", "llama3_bpe"] {
        let tok = Tokenizer::from_gguf(&dir.join(format!("{name}.gguf")))
            .unwrap()
            .expect("a vocabulary");
        for case in refs[name]["cases"].as_array().unwrap() {
            let text = case["text"].as_str().unwrap();
            let want = ids(&case["ids"]);
            assert_eq!(tok.encode(text, true).unwrap(), want, "{name}: {text:?}");
            assert_eq!(
                tok.decode(&want).unwrap(),
                case["decoded"].as_str().unwrap(),
                "{name}: decoding {text:?}"
            );
        }
    }
    // a model file without a vocabulary has no tokenizer
    assert!(Tokenizer::from_gguf(&fixture("tensors.gguf"))
        .unwrap()
        .is_none());
}

/// A metadata entry as [`Builder`] writes it: key, value type, value bytes.
type Kv = (String, u32, Vec<u8>);

#[test]
fn a_malformed_vocabulary_is_refused_naming_the_key() {
    use qkv::text::Tokenizer;
    let strings = |items: &[&str]| {
        let bytes: Vec<u8> = items.iter().flat_map(|s| string(s)).collect();
        array(8, items.len() as u64, &bytes)
    };
    let u32_kv = |key: &str, v: u32| (key.to_string(), 4u32, v.to_le_bytes().to_vec());
    let path = std::env::temp_dir().join(format!("qkv-gguf-vocab-{}.gguf", std::process::id()));
    let vocab = |extra: Vec<Kv>| {
        let mut b = Builder::new();
        b.kv.push(("tokenizer.ggml.model".into(), 8, string("gpt2")));
        b.kv.push((
            "tokenizer.ggml.tokens".into(),
            9,
            strings(&["a", "b", "ab"]),
        ));
        for kv in extra {
            match b.kv.iter_mut().find(|(k, _, _)| *k == kv.0) {
                Some(old) => *old = kv,
                None => b.kv.push(kv),
            }
        }
        std::fs::write(&path, b.bytes()).unwrap();
        Tokenizer::from_gguf(&path).map(|t| t.is_some())
    };
    let merges = |m: &[&str]| ("tokenizer.ggml.merges".to_string(), 9, strings(m));
    // a well-formed one first: "ab" is one token
    assert!(vocab(vec![merges(&["a b"])]).unwrap());
    let cases: Vec<(Vec<Kv>, &str)> = vec![
        (vec![], "`tokenizer.ggml.merges`: missing"),
        (
            vec![merges(&["ab"])],
            "is not two tokens separated by a space",
        ),
        (
            vec![merges(&["a b"]), u32_kv("tokenizer.ggml.bos_token_id", 3)],
            "`tokenizer.ggml.bos_token_id`: U32(3) is not a token id",
        ),
        (
            vec![
                merges(&["a b"]),
                ("tokenizer.ggml.tokens".into(), 9, strings(&["a", "b", "a"])),
            ],
            "token \"a\" is given twice",
        ),
        (
            vec![
                merges(&["a b"]),
                ("tokenizer.ggml.pre".into(), 8, string("tekken")),
            ],
            "`tokenizer.ggml.pre`: `tekken`",
        ),
        (
            vec![("tokenizer.ggml.model".into(), 8, string("bert"))],
            "`tokenizer.ggml.model`: `bert`",
        ),
        (
            vec![("tokenizer.ggml.model".into(), 8, string("llama"))],
            "`tokenizer.ggml.scores`: missing",
        ),
        (
            vec![
                merges(&["a b"]),
                (
                    "tokenizer.ggml.token_type".into(),
                    9,
                    array(5, 1, &1i32.to_le_bytes()),
                ),
            ],
            "`tokenizer.ggml.token_type`: 1 entries for 3 tokens",
        ),
        (
            vec![("tokenizer.ggml.tokens".into(), 9, strings(&[]))],
            "`tokenizer.ggml.tokens`: empty",
        ),
        (
            vec![(
                "tokenizer.ggml.tokens".into(),
                9,
                strings(&["a", &"b".repeat(1025)]),
            )],
            "token 1 is 1025 bytes long (at most 1024)",
        ),
    ];
    for (extra, want) in cases {
        let err = vocab(extra).expect_err(want).to_string();
        assert!(err.contains(want), "{want}: {err}");
        assert!(err.contains("qkv-gguf-vocab"), "the file is named: {err}");
    }
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn the_metadata_s_chat_template_renders_as_transformers_renders_it() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat/templates.json");
    let families: Json = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let qwen = families
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["family"] == "qwen2.5")
        .expect("Qwen2.5's cases");
    let t = qkv::text::ChatTemplate::from_dir(&fixture("tokenizers/qwen2_bpe.gguf"))
        .unwrap()
        .expect("qwen2_bpe.gguf carries Qwen2.5's template");
    let mut rendered = 0;
    for case in qwen["cases"].as_array().unwrap() {
        let Some(want) = case["expected"].as_str() else {
            continue;
        };
        let messages = case["messages"].as_array().unwrap();
        let add = case["add_generation_prompt"].as_bool().unwrap();
        let extra = case["extra"].as_object().cloned().unwrap_or_default();
        assert_eq!(t.render_with(messages, add, &extra).unwrap(), want);
        rendered += 1;
    }
    assert!(rendered >= 3, "{rendered} cases");
    // a file without one has none
    assert!(
        qkv::text::ChatTemplate::from_dir(&fixture("tokenizers/llama3_bpe.gguf"))
            .unwrap()
            .is_none()
    );
}

#[test]
fn a_folder_written_as_gguf_is_what_llama_cpp_s_converter_and_quantizers_write() {
    use qkv::io::gguf::GgmlType;
    let tmp = std::env::temp_dir().join(format!("qkv-gguf-written-{}.gguf", std::process::id()));
    let cases = [
        ("llama_gqa", GgmlType::F32, "llama_gqa"),
        ("qwen2", GgmlType::F32, "qwen2"),
        ("llama_gqa", GgmlType::Q8_0, "llama_gqa.gguf_q8_0"),
        ("llama_gqa", GgmlType::Q4_0, "llama_gqa.gguf_q4_0"),
    ];
    for (name, ty, reference) in cases {
        let m = qkv::models::load(&common::models::model_dir(name))
            .unwrap()
            .model;
        qkv::models::save_gguf(&m, &tmp, ty, name, Vec::new()).unwrap();
        let ours = GgufFile::open(&tmp).unwrap();
        let theirs = GgufFile::open(&gguf_model(reference)).unwrap();
        let what = format!("{name} in {ty}");
        let mut names: Vec<&str> = ours
            .header
            .tensors
            .iter()
            .map(|t| t.name.as_str())
            .collect();
        let mut want: Vec<&str> = theirs
            .header
            .tensors
            .iter()
            .map(|t| t.name.as_str())
            .collect();
        names.sort();
        want.sort();
        assert_eq!(names, want, "{what}: tensors");
        for t in &theirs.header.tensors {
            let o = ours.header.tensor(&t.name).unwrap();
            assert_eq!((o.shape(), o.ty), (t.shape(), t.ty), "{what}: {}", t.name);
            assert!(ours.data(o) == theirs.data(t), "{what}: {}'s bytes", t.name);
        }
        if ty == GgmlType::F32 {
            // the converter's metadata, key for key (the fixture's vocabulary aside)
            for (key, value) in &theirs.header.metadata {
                let id = ["bos", "eos", "padding"]
                    .iter()
                    .any(|k| *key == format!("tokenizer.ggml.{k}_token_id"));
                if !key.starts_with("tokenizer.") || id {
                    assert_eq!(ours.header.get(key), Some(value), "{what}: {key}");
                }
            }
            let back = qkv::models::load(&tmp).unwrap().model;
            common::models::check_causal_model(name, &back);
        }
    }
    std::fs::remove_file(&tmp).unwrap();

    // what GGUF cannot hold is refused before anything is written
    let gpt2 = qkv::models::load(&common::models::model_dir("gpt2"))
        .unwrap()
        .model;
    let err = qkv::models::save_gguf(&gpt2, &tmp, GgmlType::F32, "gpt2", Vec::new())
        .unwrap_err()
        .to_string();
    assert!(err.contains("Llama-layout decoders"), "{err}");
    assert!(!tmp.exists());
}

#[test]
fn a_folder_s_tokenizer_written_as_metadata_reads_back_as_transformers_tokenizes() {
    use qkv::io::gguf::Value as V;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizers");
    let path = std::env::temp_dir().join(format!("qkv-gguf-vocab-out-{}.gguf", std::process::id()));
    for (name, tokens) in [("qwen2_bytelevel", 320), ("sentencepiece_bpe", 456)] {
        let mut metadata = vec![(
            "general.architecture".to_string(),
            V::String("llama".into()),
        )];
        // three rows more than the tokenizer's tokens: named [PADn], as llama.cpp's
        // converter names them
        let vocab = qkv::text::folder_gguf_metadata(&root.join(name), tokens + 3)
            .unwrap()
            .unwrap();
        metadata.extend(vocab);
        gguf::write(&path, &metadata, &[], &mut |_| unreachable!("no tensors")).unwrap();
        let tok = qkv::text::Tokenizer::from_gguf(&path).unwrap().unwrap();
        let pad = format!("[PAD{}]", tokens + 2);
        assert_eq!(tok.token_id(&pad), Some(tokens + 2), "{name}");
        let refs: Json =
            serde_json::from_slice(&std::fs::read(root.join(name).join("reference.json")).unwrap())
                .unwrap();
        for case in refs["cases"].as_array().unwrap() {
            let text = case["text"].as_str().unwrap();
            let want: Vec<usize> = case["input_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i.as_u64().unwrap() as usize)
                .collect();
            assert_eq!(tok.encode(text, true).unwrap(), want, "{name}: {text:?}");
            assert_eq!(
                tok.decode(&want).unwrap(),
                case["decoded"].as_str().unwrap()
            );
        }
    }
    let err = qkv::text::folder_gguf_metadata(&root.join("qwen2_bytelevel"), 100)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("320 tokens, more than the model's 100"),
        "{err}"
    );
    // Llama 3's regex read back applies no normalizer; this fixture's NFC would be lost
    let err = qkv::text::folder_gguf_metadata(&root.join("llama3_bytelevel"), 320)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("normalizer") && err.contains("tokenizer.json"),
        "{err}"
    );
    std::fs::remove_file(&path).unwrap();
}

/// The byte tokenizer `qkv train --text` saves (a ByteLevel pre-tokenizer that splits no
/// words, no merges) is written as `gpt-2`: llama.cpp has no pre-tokenizer that splits no
/// words, but without merges every split gives each byte its token, so the file tokenizes
/// as the folder does (llama.cpp too: `llama_cpp_runs_the_files_qkv_writes`). With merges
/// the split would matter, and it is refused.
#[test]
fn a_byte_tokenizer_without_a_split_regex_is_written_as_gpt_2() {
    use qkv::io::gguf::Value as V;
    let dir = std::env::temp_dir().join(format!("qkv-gguf-bytes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = qkv::text::bytes::byte_tokenizer_json();
    std::fs::write(dir.join("tokenizer.json"), &json).unwrap();
    let vocab = qkv::text::folder_gguf_metadata(&dir, 256).unwrap().unwrap();
    let get = |key: &str| vocab.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());
    assert_eq!(get("tokenizer.ggml.pre"), Some(V::String("gpt-2".into())));
    assert_eq!(
        get("tokenizer.ggml.merges")
            .unwrap()
            .as_array()
            .unwrap()
            .len(),
        0
    );
    let path = dir.join("bytes.gguf");
    let mut metadata = vec![(
        "general.architecture".to_string(),
        V::String("llama".into()),
    )];
    metadata.extend(vocab);
    gguf::write(&path, &metadata, &[], &mut |_| unreachable!("no tensors")).unwrap();
    let folder = qkv::text::Tokenizer::from_dir(&dir).unwrap();
    let file = qkv::text::Tokenizer::from_gguf(&path).unwrap().unwrap();
    for text in [
        "attention is all you need.",
        "héllo, 你好 🙂\n\t\u{0}~",
        "  two  spaces ",
        "",
    ] {
        let ids = file.encode(text, true).unwrap();
        assert_eq!(ids, folder.encode(text, true).unwrap(), "{text:?}");
        assert_eq!(ids, text.bytes().map(usize::from).collect::<Vec<_>>());
        assert_eq!(file.decode(&ids).unwrap(), text);
    }
    // merges would join bytes across the words llama.cpp's split would cut
    let mut merged: Json = serde_json::from_str(&json).unwrap();
    merged["model"]["merges"] = serde_json::json!(["a t"]);
    merged["model"]["vocab"]["at"] = serde_json::json!(256);
    std::fs::write(dir.join("tokenizer.json"), merged.to_string()).unwrap();
    let err = qkv::text::folder_gguf_metadata(&dir, 257)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("tokenizer.json") && err.contains("splits no words, with merges"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A GGUF file converted to GGUF keeps its vocabulary and chat template: every
/// `tokenizer.*` key, as it is.
#[test]
fn a_gguf_file_s_tokenizer_carries_over_to_the_file_written_from_it() {
    let theirs = converted::rebuilt("gemma2", "carry");
    let vocab = qkv::text::folder_gguf_metadata(&theirs, 99)
        .unwrap()
        .unwrap();
    let file = GgufFile::open(&theirs).unwrap();
    let want: Vec<&(String, Value)> = file
        .header
        .metadata
        .iter()
        .filter(|(k, _)| k.starts_with("tokenizer."))
        .collect();
    assert!(want.len() > 5, "{want:?}");
    assert_eq!(vocab.iter().collect::<Vec<_>>(), want);
    // with a chat template, written and read back
    let m = qkv::models::load(&theirs).unwrap().model;
    let mut with_template = vocab.clone();
    with_template.push((
        "tokenizer.chat_template".into(),
        Value::String("{% for m in messages %}{{ m.content }}{% endfor %}".into()),
    ));
    let once =
        std::env::temp_dir().join(format!("qkv-gguf-carry-once-{}.gguf", std::process::id()));
    let twice =
        std::env::temp_dir().join(format!("qkv-gguf-carry-twice-{}.gguf", std::process::id()));
    qkv::models::save_gguf(&m, &once, gguf::GgmlType::F32, "gemma2", with_template).unwrap();
    let again = qkv::text::folder_gguf_metadata(&once, 99).unwrap().unwrap();
    qkv::models::save_gguf(&m, &twice, gguf::GgmlType::Q8_0, "gemma2", again).unwrap();
    let (a, b) = (
        GgufFile::open(&once).unwrap(),
        GgufFile::open(&twice).unwrap(),
    );
    let tokenizer = |f: &GgufFile| -> Vec<(String, Value)> {
        f.header
            .metadata
            .iter()
            .filter(|(k, _)| k.starts_with("tokenizer."))
            .cloned()
            .collect()
    };
    assert_eq!(tokenizer(&a), tokenizer(&b));
    assert!(b.header.get("tokenizer.chat_template").is_some());
    let template = qkv::text::ChatTemplate::from_dir(&twice).unwrap().unwrap();
    assert_eq!(
        template.source(),
        "{% for m in messages %}{{ m.content }}{% endfor %}"
    );
    // a vocabulary that does not fit the model is refused, naming the key
    let err = qkv::text::folder_gguf_metadata(&theirs, 100)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("tokenizer.ggml.tokens") && err.contains("99 tokens for the model's 100"),
        "{err}"
    );
    for p in [theirs, once, twice] {
        std::fs::remove_file(p).unwrap();
    }
}

/// llama.cpp's logits at every position of `tokens` from the GGUF file `path`, through
/// llama-cpp-python (`$QKV_LLAMA_CPP_PYTHON`, else the repository's `.venv-lcp`; see
/// tools/fixtures/requirements-lcp.txt), on the CPU with an f32 KV cache and the plain
/// ggml kernels (as tools/fixtures/gen_gguf_quant.py runs it).
fn llama_cpp_logits(path: &Path, tokens: &[usize]) -> Vec<Vec<f32>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let python = std::env::var_os("QKV_LLAMA_CPP_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join(".venv-lcp/bin/python"));
    assert!(
        python.exists(),
        "{}: no Python with llama-cpp-python (set QKV_LLAMA_CPP_PYTHON)",
        python.display()
    );
    let script = r#"
import json, sys
import llama_cpp
from llama_cpp import llama_cpp as lib
default = lib.llama_model_default_params
def plain():
    p = default(); p.use_extra_bufts = False; return p
lib.llama_model_default_params = plain
llm = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=64, n_threads=2, logits_all=True,
                      type_k=0, type_v=0, verbose=False)
tokens = json.loads(sys.argv[2])
llm.eval(tokens)
print(json.dumps([[float(x) for x in row] for row in llm.scores[:len(tokens)]]))
"#;
    let out = std::process::Command::new(&python)
        .args(["-c", script, path.to_str().unwrap()])
        .arg(serde_json::to_string(tokens).unwrap())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A written file loads in llama.cpp and computes what qkv computes from it. Ignored: it
/// needs llama-cpp-python (`cargo test --release -p qkv --test gguf -- --ignored`).
#[test]
#[ignore]
fn llama_cpp_runs_the_files_qkv_writes() {
    use qkv::io::gguf::{GgmlType, Value as V, ValueType};
    let tmp = std::env::temp_dir().join(format!("qkv-gguf-llama-cpp-{}.gguf", std::process::id()));
    let m = qkv::models::load(&common::models::model_dir("llama_gqa"))
        .unwrap()
        .model;
    // the folder has no tokenizer, and llama.cpp loads no model without a vocabulary:
    // placeholder pieces, as tools/fixtures/gen_gguf.py gives its model files
    let vocab = m.arch.vocab;
    let pieces = ["<unk>", "<s>", "</s>"]
        .map(str::to_string)
        .into_iter()
        .chain((3..vocab).map(|i| format!("\u{2581}t{i}")));
    let array = |t, items: Vec<V>| V::Array(qkv::io::gguf::Array::from_values(t, items));
    let metadata = vec![
        (
            "tokenizer.ggml.model".to_string(),
            V::String("llama".into()),
        ),
        (
            "tokenizer.ggml.tokens".into(),
            array(ValueType::String, pieces.map(V::String).collect()),
        ),
        (
            "tokenizer.ggml.scores".into(),
            array(
                ValueType::F32,
                (0..vocab).map(|i| V::F32(-(i as f32))).collect(),
            ),
        ),
        (
            "tokenizer.ggml.token_type".into(),
            array(
                ValueType::I32,
                (0..vocab)
                    .map(|i| V::I32([2, 3, 3].get(i).copied().unwrap_or(1)))
                    .collect(),
            ),
        ),
    ];
    let tokens = [1usize, 7, 42, 5, 98, 13, 64, 2, 31, 9];
    let batch = qkv::models::TokenBatch::single(tokens.to_vec()).unwrap();
    for ty in [GgmlType::F32, GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_0] {
        qkv::models::save_gguf(&m, &tmp, ty, "llama_gqa", metadata.clone()).unwrap();
        let theirs = llama_cpp_logits(&tmp, &tokens);
        let ours = qkv::models::load(&tmp).unwrap().model;
        let logits = ours.forward_cached(&batch, &mut ours.new_cache(1)).unwrap();
        let (worst, same_top) = against(&logits, &theirs);
        eprintln!(
            "{ty}: largest logit difference {worst:.2e}, top-1 equal at {same_top} of {}",
            tokens.len()
        );
        // F16: 8.7e-4 with the activations rounded to f16 as llama.cpp rounds them
        // (1.2e-3 with f32 activations); the rest is not yet found: the F32 file agrees
        // within 7e-7, so it lies in what llama.cpp does otherwise for F16 tensors
        let tolerance = if ty == GgmlType::F16 { 2e-3 } else { 1e-5 };
        assert!(
            worst < tolerance && same_top == tokens.len(),
            "{ty}: {worst:e}, {same_top}"
        );
    }
    std::fs::remove_file(&tmp).unwrap();
}

/// llama.cpp's ids for each of `texts` from the GGUF file `path`'s vocabulary (special
/// tokens parsed, none added), through llama-cpp-python as [`llama_cpp_logits`].
fn llama_cpp_tokens(path: &Path, texts: &[&str]) -> Vec<Vec<usize>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let python = std::env::var_os("QKV_LLAMA_CPP_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join(".venv-lcp/bin/python"));
    let script = r#"
import json, sys
import llama_cpp
llm = llama_cpp.Llama(model_path=sys.argv[1], vocab_only=True, verbose=False)
texts = json.loads(sys.argv[2])
print(json.dumps([llm.tokenize(t.encode(), add_bos=False, special=True) for t in texts]))
"#;
    let out = std::process::Command::new(&python)
        .args(["-c", script, path.to_str().unwrap()])
        .arg(serde_json::to_string(texts).unwrap())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A `llama` file's `rope_freqs` (Llama 3's scaling as llama.cpp's converter stores it:
/// one divisor per rotating pair) is read as llama.cpp applies it; qkv's byte tokenizer
/// written as `gpt-2` tokenizes in llama.cpp byte for byte. Ignored: it needs
/// llama-cpp-python (`cargo test --release -p qkv --test gguf -- --ignored`).
#[test]
#[ignore]
fn llama_cpp_reads_rope_freqs_and_the_byte_tokenizer_as_qkv_does() {
    use qkv::position::RopeScaling;
    // the fixture's heads are 8 wide: 4 pairs, the slow ones stretched as Llama 3's are
    let factors = [1.0f32, 1.0, 2.5, 8.0];
    let path = converted::rewritten(&gguf_model("llama_gqa"), "rope-freqs", |_, tensors| {
        let bytes = factors.iter().flat_map(|f| f.to_le_bytes()).collect();
        tensors.push((
            "rope_freqs.weight".into(),
            vec![4],
            gguf::GgmlType::F32,
            bytes,
        ));
    });
    let loaded = qkv::models::load(&path).unwrap();
    assert!(loaded.unused.is_empty(), "{:?}", loaded.unused);
    let m = loaded.model;
    match &m.arch.position {
        qkv::models::Position::Rope {
            scaling: RopeScaling::LongRope(l),
            ..
        } => assert!(l.short_factor == factors && l.long_factor == factors),
        other => panic!("{other:?}"),
    }
    let tokens = [1usize, 7, 42, 5, 98, 13, 64, 2, 31, 9, 77, 3, 50, 60];
    let batch = qkv::models::TokenBatch::single(tokens.to_vec()).unwrap();
    let logits = m.forward_cached(&batch, &mut m.new_cache(1)).unwrap();
    let plain = qkv::models::load(&gguf_model("llama_gqa")).unwrap().model;
    let unscaled = plain
        .forward_cached(&batch, &mut plain.new_cache(1))
        .unwrap();
    let (worst, same_top) = against(&logits, &llama_cpp_logits(&path, &tokens));
    let (plain_gap, _) = against(&unscaled, &llama_cpp_logits(&path, &tokens));
    eprintln!("rope_freqs: {worst:.2e} from llama.cpp ({plain_gap:.2e} without the factors)");
    assert!(
        worst < 1e-5 && same_top == tokens.len() && plain_gap > 1e-3,
        "{worst:e}, {plain_gap:e}"
    );
    std::fs::remove_file(&path).unwrap();

    // the byte tokenizer `qkv train --text` saves
    use qkv::io::gguf::Value as V;
    let dir = std::env::temp_dir().join(format!("qkv-gguf-bytes-lcp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("tokenizer.json"),
        qkv::text::bytes::byte_tokenizer_json(),
    )
    .unwrap();
    let mut metadata = vec![(
        "general.architecture".to_string(),
        V::String("llama".into()),
    )];
    for (k, v) in [
        ("llama.block_count", 1),
        ("llama.context_length", 64),
        ("llama.embedding_length", 32),
        ("llama.feed_forward_length", 64),
        ("llama.attention.head_count", 4),
    ] {
        metadata.push((k.into(), V::U32(v)));
    }
    metadata.extend(qkv::text::folder_gguf_metadata(&dir, 256).unwrap().unwrap());
    let path = dir.join("bytes.gguf");
    gguf::write(&path, &metadata, &[], &mut |_| unreachable!("no tensors")).unwrap();
    let texts = [
        "attention is all you need.",
        "héllo, 你好 🙂\n\t~",
        "  two  spaces ",
    ];
    let theirs = llama_cpp_tokens(&path, &texts);
    for (text, ids) in texts.iter().zip(theirs) {
        assert_eq!(
            ids,
            text.bytes().map(usize::from).collect::<Vec<_>>(),
            "{text:?}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An F16 file's linear layers compute from their f16 values (in a load in f32), with
/// the activations rounded to f16 as llama.cpp rounds them (against llama.cpp itself:
/// `llama_cpp_runs_the_files_qkv_writes`): token by token (the dot products) as the
/// prompt at once (the slabs), and near the same weights widened to f32 with f32
/// activations. A load in another type packs them in it.
#[test]
fn f16_layers_compute_from_their_stored_values() {
    use qkv::io::gguf::GgmlType;
    use qkv::weights::DType;
    let tmp = std::env::temp_dir().join(format!("qkv-gguf-f16-{}.gguf", std::process::id()));
    let m = qkv::models::load(&common::models::model_dir("llama_gqa"))
        .unwrap()
        .model;
    qkv::models::save_gguf(&m, &tmp, GgmlType::F16, "llama_gqa", Vec::new()).unwrap();
    let stored = qkv::models::load(&tmp).unwrap().model;
    assert_eq!(stored.dtype(), DType::F16);
    assert!(!stored.has_f32_weights());
    let mut widened = stored.clone();
    widened.unpack_weights();
    assert_eq!(widened.dtype(), DType::F32);
    let tokens = [1, 5, 9, 2, 7, 3];
    let run = |m: &qkv::models::Transformer, rows: usize| {
        let mut cache = m.new_cache(1);
        let mut out = Vec::new();
        for part in tokens.chunks(rows) {
            let batch = qkv::models::TokenBatch::single(part.to_vec()).unwrap();
            out.extend_from_slice(m.forward_cached(&batch, &mut cache).unwrap().data());
        }
        out
    };
    let (steps, prompt, f32_run) = (
        run(&stored, 1),
        run(&stored, tokens.len()),
        run(&widened, 6),
    );
    let largest = |a: &[f32], b: &[f32]| {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max)
    };
    assert!(
        largest(&steps, &prompt) < 1e-5,
        "{:e}",
        largest(&steps, &prompt)
    );
    // f16 activations: a relative 2⁻¹¹ per input of each product, far inside 1e-2 on
    // these logits (of about 0.1)
    let apart = largest(&prompt, &f32_run);
    assert!(apart > 0.0 && apart < 1e-2, "{apart:e}");
    let int8 = qkv::models::load_in(&tmp, DType::Int8).unwrap().model;
    assert_eq!(int8.dtype(), DType::Int8);
    std::fs::remove_file(&tmp).unwrap();
}

#[test]
fn k_quant_files_from_llama_cpp_s_quantizer_read_as_llama_cpp_reads_them() {
    use qkv::weights::ggml::BlockType;
    use qkv::weights::DType;
    let refs = quant_reference();
    let types = [
        ("q4_k_m", BlockType::Q4K),
        ("q5_k_m", BlockType::Q5K),
        ("q6_k", BlockType::Q6K),
        ("q4_0", BlockType::Q4_0),
    ];
    for (name, main) in types {
        let file = format!("kquant_{name}");
        let loaded = qkv::models::load(&gguf_model(&file)).unwrap();
        assert!(loaded.unused.is_empty(), "{file}: {:?}", loaded.unused);
        let mut m = loaded.model;
        // the linear layers compute from their blocks; the model's type is the one
        // most of their weights are stored in
        assert_eq!(m.dtype(), DType::Blocks(main), "{file}");
        assert!(!m.has_f32_weights(), "{file}");
        // the token table too is held as its blocks, never as f32
        let table = &m.weights.embed_tokens;
        assert!(table.stored().is_some(), "{file}: token table");
        let f32_table = 4 * table.vocab_size() * table.dim();
        let (_, rest) = m.weight_bytes();
        assert!(
            rest < f32_table,
            "{file}: {rest} bytes besides the linear layers"
        );
        let stored: Vec<&str> = loaded.dtypes.iter().map(|(t, _)| t.as_str()).collect();
        assert!(stored.contains(&"Q6_K"), "{file}: {stored:?}");
        let (tokens, want) = quant_case(&refs, &file);
        // the whole prompt at once (the blocks dequantized into the f32 product), and
        // token by token (integer dot products per block), each with the activations
        // quantized as llama.cpp quantizes them (Q8_K, Q8_0 for Q4_0)
        let batch = qkv::models::TokenBatch::single(tokens.clone()).unwrap();
        let logits = m.forward_cached(&batch, &mut m.new_cache(1)).unwrap();
        let mut cache = m.new_cache(1);
        let mut steps = Vec::new();
        for &t in &tokens {
            let step = qkv::models::TokenBatch::single(vec![t]).unwrap();
            steps.extend_from_slice(m.forward_cached(&step, &mut cache).unwrap().data());
        }
        let stepped = qkv::Tensor::new(logits.shape(), steps).unwrap();
        for (how, logits) in [("prompt", &logits), ("steps", &stepped)] {
            let (worst, same_top) = against(logits, &want);
            assert!(
                worst < 1e-5,
                "{file} {how}: logits {worst:e} from llama.cpp's"
            );
            assert_eq!(same_top, tokens.len(), "{file} {how}: top-1");
        }
    }
}
