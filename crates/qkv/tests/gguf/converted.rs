//! Gemma, Gemma 2, Gemma 3 and Phi-3 files made by llama.cpp's own converter: the fixture
//! folders of those names converted by `convert_hf_to_gguf.py` (llama-cpp-python 0.3.36's
//! llama.cpp), stored as what rebuilds them byte for byte (the file up to its data
//! section, and which folder tensor each tensor is: `fixtures/gguf/models/converted/`,
//! tools/fixtures/gen_gguf_converted.py), checked here by the whole file's SHA-256. And
//! llama.cpp's logits from those files, one token at a time.

use std::path::PathBuf;

use qkv::io::gguf::{GgmlType, GgufFile, Value};
use serde_json::Value as Json;

use super::{against, common, fixture};

/// The converted fixtures.
pub const NAMES: [&str; 4] = ["gemma", "gemma2", "gemma3", "phi3"];

fn manifest() -> Json {
    let text = std::fs::read_to_string(fixture("models/converted/manifest.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// llama.cpp's logits from the converted files (`<key>.tokens`, `<key>.logits`).
fn llama_cpp_reference() -> common::Fixture {
    common::fixture("gguf/models/converted", "reference")
}

/// The converter's file of `name` rebuilt under the temporary folder (the name tagged
/// with `tag`, so that tests running at once write their own copies); the caller
/// removes it.
pub fn rebuilt(name: &str, tag: &str) -> PathBuf {
    let entry = &manifest()[name];
    let head = fixture(&format!("models/converted/{name}.gguf.head"));
    let mut bytes = std::fs::read(head).unwrap();
    let folder = common::models::model_dir(name);
    let weights = qkv::io::TensorFile::open(folder.join("model.safetensors")).unwrap();
    for t in entry["tensors"].as_array().unwrap() {
        let mut values: Vec<f32> = match t["from"].as_str() {
            Some(hf) => weights.tensor(hf).unwrap().data().to_vec(),
            None => t["values"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap() as f32)
                .collect(),
        };
        if let Some(add) = t["add"].as_f64() {
            values.iter_mut().for_each(|v| *v += add as f32);
        }
        bytes.extend(values.iter().flat_map(|v| v.to_le_bytes()));
        bytes.resize(bytes.len().next_multiple_of(32), 0);
    }
    assert_eq!(
        bytes.len() as u64,
        entry["bytes"].as_u64().unwrap(),
        "{name}: size"
    );
    assert_eq!(
        sha256(&bytes),
        entry["sha256"].as_str().unwrap(),
        "{name}: not the converter's file"
    );
    let path = std::env::temp_dir().join(format!(
        "qkv-converted-{}-{tag}-{name}.gguf",
        std::process::id()
    ));
    std::fs::write(&path, bytes).unwrap();
    path
}

/// SHA-256 (FIPS 180-4) of `bytes`, as lowercase hex.
fn sha256(bytes: &[u8]) -> String {
    const K: [u32; 64] = [
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
        0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
        0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
        0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
        0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
        0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
        0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
        0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2,
    ];
    let mut h: [u32; 8] = [
        0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab,
        0x5be0cd19,
    ];
    let mut message = bytes.to_vec();
    message.push(0x80);
    while message.len() % 64 != 56 {
        message.push(0);
    }
    message.extend((bytes.len() as u64 * 8).to_be_bytes());
    for block in message.chunks_exact(64) {
        let mut w = [0u32; 64];
        for (i, word) in block.chunks_exact(4).enumerate() {
            w[i] = u32::from_be_bytes([word[0], word[1], word[2], word[3]]);
        }
        for i in 16..64 {
            let s0 = w[i - 15].rotate_right(7) ^ w[i - 15].rotate_right(18) ^ (w[i - 15] >> 3);
            let s1 = w[i - 2].rotate_right(17) ^ w[i - 2].rotate_right(19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16]
                .wrapping_add(s0)
                .wrapping_add(w[i - 7])
                .wrapping_add(s1);
        }
        let mut v = h;
        for i in 0..64 {
            let s1 = v[4].rotate_right(6) ^ v[4].rotate_right(11) ^ v[4].rotate_right(25);
            let ch = (v[4] & v[5]) ^ (!v[4] & v[6]);
            let t1 = v[7]
                .wrapping_add(s1)
                .wrapping_add(ch)
                .wrapping_add(K[i])
                .wrapping_add(w[i]);
            let s0 = v[0].rotate_right(2) ^ v[0].rotate_right(13) ^ v[0].rotate_right(22);
            let maj = (v[0] & v[1]) ^ (v[0] & v[2]) ^ (v[1] & v[2]);
            let t2 = s0.wrapping_add(maj);
            v = [
                t1.wrapping_add(t2),
                v[0],
                v[1],
                v[2],
                v[3].wrapping_add(t1),
                v[4],
                v[5],
                v[6],
            ];
        }
        for (a, b) in h.iter_mut().zip(v) {
            *a = a.wrapping_add(b);
        }
    }
    h.iter().map(|x| format!("{x:08x}")).collect()
}

#[test]
fn sha256_is_fips_180_4() {
    assert_eq!(
        sha256(b"abc"),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
    assert_eq!(
        sha256(&[b'a'; 1000]),
        "41edece42d63e8d9bf515a9ba6932e1c20cbc9f5a5d134645adb5db1b9737ea3"
    );
}

/// The token ids and llama.cpp's logits (a row per position) under `key`.
fn llama_cpp_case(refs: &common::Fixture, key: &str) -> (Vec<usize>, Vec<Vec<f32>>) {
    let tokens: Vec<usize> = refs
        .ints(&format!("{key}.tokens"))
        .1
        .into_iter()
        .map(|t| t as usize)
        .collect();
    let logits = refs.t(&format!("{key}.logits"));
    let rows = logits
        .data()
        .chunks_exact(logits.last_dim())
        .map(<[f32]>::to_vec)
        .collect();
    (tokens, rows)
}

/// `m`'s logits `[1, T, V]` for `tokens` one at a time through the cache (as llama.cpp
/// computed the reference), and with the prompt at once.
fn logits_both_ways(m: &qkv::models::Transformer, tokens: &[usize]) -> [qkv::Tensor; 2] {
    let mut cache = m.new_cache(1);
    let mut rows = Vec::new();
    for &t in tokens {
        let step = qkv::models::TokenBatch::single(vec![t]).unwrap();
        rows.extend_from_slice(m.forward_cached(&step, &mut cache).unwrap().data());
    }
    let vocab = rows.len() / tokens.len();
    let steps = qkv::Tensor::new(&[1, tokens.len(), vocab], rows).unwrap();
    let batch = qkv::models::TokenBatch::single(tokens.to_vec()).unwrap();
    let whole = m.forward_cached(&batch, &mut m.new_cache(1)).unwrap();
    [steps, whole]
}

/// The files read as llama.cpp reads them compute its logits. Gemma's differ by GELU
/// alone: ggml's CPU kernel computes it from a table of f16 values at the input rounded
/// to f16 (`GGML_GELU_FP16`), qkv in f32 as transformers does, and transformers with
/// ggml's GELU gives llama.cpp's logits within 1.2e-5 (tools/fixtures/gen_gguf_converted.py
/// prints it). Phi-3's are compared with the sequence at once: llama.cpp rotates with
/// the long LongRoPE factors from the first token (its context, at least 256 tokens,
/// exceeds the fixture's original 16), qkv as transformers does, with the long factors
/// for a call that reaches past 16 (22 tokens here) and the short ones before.
#[test]
fn converted_files_compute_what_llama_cpp_computes_from_them() {
    let refs = llama_cpp_reference();
    for (name, key, tolerance) in [
        ("gemma", "gemma", 4e-3),
        ("gemma2", "gemma2", 4e-3),
        ("gemma3", "gemma3", 4e-3),
        ("phi3", "phi3_long", 1e-5),
    ] {
        let path = rebuilt(name, "llama-cpp");
        let loaded = qkv::models::load(&path).unwrap();
        assert!(loaded.unused.is_empty(), "{name}: {:?}", loaded.unused);
        assert_eq!(loaded.dtypes, [("F32".to_string(), loaded.parameters)]);
        let (tokens, want) = llama_cpp_case(&refs, key);
        let ways = ["token by token", "at once"]
            .iter()
            .zip(logits_both_ways(&loaded.model, &tokens))
            .filter(|(how, _)| name != "phi3" || **how == "at once");
        for (how, logits) in ways {
            let (worst, same_top) = against(&logits, &want);
            eprintln!(
                "{name} {how}: {worst:.2e} from llama.cpp, top-1 equal at {same_top} of {}",
                tokens.len()
            );
            assert!(
                worst < tolerance && same_top == tokens.len(),
                "{name} {how}: {worst:e} from llama.cpp, top-1 equal at {same_top}"
            );
        }
        std::fs::remove_file(&path).unwrap();
    }
}

/// The files read as the folders they came from, with what the converter does not carry
/// put back: Gemma 2's and 3's `query_pre_attn_scalar` (llama.cpp scales by
/// 1/√key_length for these sizes: 12 here, where the folders say 16) and Gemma 3's
/// `layer_types` (llama.cpp's default period of 6 makes both layers local, where the
/// folder's second is global). Phi-3's LongRoPE and partial rotary come through whole.
#[test]
fn converted_files_run_as_their_folders_with_what_the_converter_loses_put_back() {
    for name in NAMES {
        let path = rebuilt(name, "folders");
        let mut m = qkv::models::load(&path).unwrap().model;
        let folder = common::models::load_causal(name);
        let a = &mut m.arch.attention;
        match name {
            "gemma2" | "gemma3" => {
                assert_eq!(a.scale, Some(12f32.powf(-0.5)), "{name}");
                a.scale = folder.arch.attention.scale;
            }
            _ => assert_eq!(a.scale, folder.arch.attention.scale, "{name}"),
        }
        if name == "gemma3" {
            assert_eq!(a.local_layers, Some(vec![true, true]));
            a.local_layers = folder.arch.attention.local_layers.clone();
        }
        assert_eq!(m.arch, folder.arch, "{name}: architecture");
        assert_eq!(m.family.name(), folder.family.name(), "{name}");
        assert_eq!(m.special_tokens().eos, folder.special_tokens().eos);
        common::models::check_causal_model(name, &m);
        if name == "phi3" {
            common::models::check_long_rope(name, &common::models::reference(name), &m, 16);
        }
        std::fs::remove_file(&path).unwrap();
    }
}

/// The folders written by qkv are the converter's files, tensor for tensor and key for
/// key (the vocabulary aside), except where the converter loses what llama.cpp would
/// need: the score scale multiplied into Gemma 2's Q (Gemma 3's Q norm), and Gemma 3's
/// layer types as a flag per layer. So they read back as the folders, with nothing put
/// back.
#[test]
fn qkv_writes_the_folders_as_llama_cpp_s_converter_does() {
    for name in NAMES {
        let theirs_path = rebuilt(name, "writer");
        let ours_path = std::env::temp_dir().join(format!(
            "qkv-converted-{}-ours-{name}.gguf",
            std::process::id()
        ));
        let m = common::models::load_causal(name);
        let notes = qkv::models::save_gguf(&m, &ours_path, GgmlType::F32, name, vec![]).unwrap();
        let theirs = GgufFile::open(&theirs_path).unwrap();
        let ours = GgufFile::open(&ours_path).unwrap();
        let names = |f: &GgufFile| {
            let mut n: Vec<String> = f.header.tensors.iter().map(|t| t.name.clone()).collect();
            n.sort();
            n
        };
        assert_eq!(names(&ours), names(&theirs), "{name}: tensors");
        // the folder's scale (16^−½) over llama.cpp's (12^−½)
        let llama_cpp_scale = 12f64.powf(-0.5) as f32;
        let fold = m
            .arch
            .attention
            .scale
            .map_or(1.0, |s| (f64::from(s) / f64::from(llama_cpp_scale)) as f32);
        let folded = match name {
            "gemma2" => "attn_q.weight",
            "gemma3" => "attn_q_norm.weight",
            _ => "none",
        };
        assert_eq!(
            notes.len(),
            usize::from(folded != "none"),
            "{name}: {notes:?}"
        );
        for t in &theirs.header.tensors {
            let o = ours.header.tensor(&t.name).unwrap();
            assert_eq!((o.shape(), o.ty), (t.shape(), t.ty), "{name}: {}", t.name);
            if t.name.ends_with(folded) {
                let want: Vec<f32> = theirs
                    .tensor(&t.name)
                    .unwrap()
                    .data()
                    .iter()
                    .map(|v| v * fold)
                    .collect();
                assert_eq!(
                    ours.tensor(&t.name).unwrap().data(),
                    &want[..],
                    "{name}: {}",
                    t.name
                );
            } else {
                assert!(ours.data(o) == theirs.data(t), "{name}: {}'s bytes", t.name);
            }
        }
        for (key, value) in &theirs.header.metadata {
            let own = key.starts_with("tokenizer.")
                || key == "general.name"
                || key == "general.size_label";
            if !own {
                assert_eq!(ours.header.get(key), Some(value), "{name}: {key}");
            }
        }
        let extra: Vec<&str> = ours
            .header
            .metadata
            .iter()
            .map(|(k, _)| k.as_str())
            .filter(|k| theirs.header.get(k).is_none() && !k.starts_with("tokenizer."))
            .collect();
        eprintln!("{name}: keys the converter does not write: {extra:?}");
        let pattern = ours.header.get("gemma3.attention.sliding_window_pattern");
        assert_eq!(
            pattern.is_some(),
            name == "gemma3",
            "{name}: a flag per layer where llama.cpp's period differs"
        );
        let back = qkv::models::load(&ours_path).unwrap().model;
        let mut want = m.arch.clone();
        want.attention.scale = back.arch.attention.scale;
        assert_eq!(back.arch, want, "{name}: architecture");
        common::models::check_causal_model(name, &back);
        std::fs::remove_file(&theirs_path).unwrap();
        std::fs::remove_file(&ours_path).unwrap();
    }
}

/// qkv's files of the folders load in llama.cpp and compute what qkv computes from them,
/// and, as llama.cpp reads them, what transformers computes from the folders: the score
/// scale and the layer types the converter loses are in them. Gemma's logits differ by
/// llama.cpp's f16 GELU (see above); Phi-3's are compared on the 22-token sequence, with
/// the long factors in both. Ignored: it needs llama-cpp-python
/// (`cargo test --release -p qkv --test gguf -- --ignored`).
#[test]
#[ignore]
fn llama_cpp_runs_the_gemma_and_phi3_files_qkv_writes() {
    for name in NAMES {
        let theirs = rebuilt(name, "llama-cpp-writes");
        let m = common::models::load_causal(name);
        let vocab = qkv::text::folder_gguf_metadata(&theirs, m.arch.vocab)
            .unwrap()
            .unwrap();
        let reference = common::models::reference(name);
        let tokens: Vec<usize> = match name {
            "phi3" => reference.ints("long_gen_output").1,
            _ => reference.ints("input_ids").1[..9].to_vec(),
        }
        .into_iter()
        .map(|t| t as usize)
        .collect();
        for ty in [GgmlType::F32, GgmlType::Q8_0] {
            let path = std::env::temp_dir().join(format!(
                "qkv-converted-{}-written-{name}.gguf",
                std::process::id()
            ));
            qkv::models::save_gguf(&m, &path, ty, name, vocab.clone()).unwrap();
            let llama_cpp = super::llama_cpp_logits(&path, &tokens);
            let ours = qkv::models::load(&path).unwrap().model;
            let batch = qkv::models::TokenBatch::single(tokens.clone()).unwrap();
            let logits = ours.forward_cached(&batch, &mut ours.new_cache(1)).unwrap();
            let (worst, same_top) = against(&logits, &llama_cpp);
            let mut line = format!(
                "{name} {ty}: qkv and llama.cpp {worst:.2e} apart, top-1 equal at {same_top} of {}",
                tokens.len()
            );
            // Gemma's GELU from f16 values; F16 weights where rows are not whole blocks
            // (all of Gemma's: C = 40, F = 56)
            let tolerance = match (name, ty) {
                ("phi3", _) => 1e-5,
                _ => 6e-3,
            };
            assert!(worst < tolerance && same_top == tokens.len(), "{line}");
            if name != "phi3" && ty == GgmlType::F32 {
                // row 0 of the folder's reference: transformers' logits
                let want = reference.t("logits");
                let rows: Vec<Vec<f32>> = want.data()[..9 * want.last_dim()]
                    .chunks_exact(want.last_dim())
                    .map(<[f32]>::to_vec)
                    .collect();
                let (hf, top) = against(&logits, &rows);
                let (hf_cpp, top_cpp) = against(
                    &qkv::Tensor::new(&[1, 9, want.last_dim()], llama_cpp.concat()).unwrap(),
                    &rows,
                );
                line += &format!(
                    "; transformers: qkv {hf:.2e} ({top}/9), llama.cpp {hf_cpp:.2e} ({top_cpp}/9)"
                );
                assert!(hf < 1e-4 && hf_cpp < 6e-3 && top_cpp == 9, "{line}");
            }
            eprintln!("{line}");
            std::fs::remove_file(&path).unwrap();
        }
        std::fs::remove_file(&theirs).unwrap();
    }
}

/// Phi-3's fused `attn_qkv` and `ffn_up` stored as Q8_0 run from their blocks, each
/// projection from its rows (llama.cpp's arithmetic: the same logits within 1e-5,
/// `llama_cpp_runs_the_gemma_and_phi3_files_qkv_writes`); the twin: widened, the
/// weights are the dequantized blocks, bit for bit, as a file of those values in F32
/// gives them.
#[test]
fn phi3_s_fused_q8_0_tensors_run_from_their_blocks() {
    use qkv::module::Module;
    let m = common::models::load_causal("phi3");
    let tmp = std::env::temp_dir();
    let q8 = tmp.join(format!("qkv-converted-{}-phi3-q8.gguf", std::process::id()));
    let twin = tmp.join(format!(
        "qkv-converted-{}-phi3-q8-f32.gguf",
        std::process::id()
    ));
    qkv::models::save_gguf(&m, &q8, GgmlType::Q8_0, "phi3", vec![]).unwrap();
    let file = GgufFile::open(&q8).unwrap();
    assert_eq!(
        file.header.tensor("blk.0.attn_qkv.weight").unwrap().ty,
        GgmlType::Q8_0
    );
    // the same file with every tensor widened by the reference dequantization
    let widened: Vec<(String, qkv::Tensor)> = file
        .header
        .tensors
        .iter()
        .map(|t| (t.name.clone(), file.tensor(&t.name).unwrap()))
        .collect();
    let infos: Vec<(String, Vec<usize>, GgmlType)> = widened
        .iter()
        .map(|(n, t)| (n.clone(), t.shape().to_vec(), GgmlType::F32))
        .collect();
    qkv::io::gguf::write(&twin, &file.header.metadata, &infos, &mut |i| {
        let (name, t) = &widened[i];
        Ok(qkv::io::gguf::OutTensor {
            name: name.clone(),
            shape: t.shape().to_vec(),
            ty: GgmlType::F32,
            bytes: t.data().iter().flat_map(|v| v.to_le_bytes()).collect(),
        })
    })
    .unwrap();
    let mut blocks = qkv::models::load(&q8).unwrap().model;
    assert_eq!(blocks.dtype(), qkv::weights::DType::Int8);
    assert!(
        !blocks.has_f32_weights(),
        "every linear layer from its blocks"
    );
    blocks.unpack_weights();
    let plain = qkv::models::load(&twin).unwrap().model;
    for ((path, got), (_, want)) in blocks
        .weights
        .params()
        .into_iter()
        .zip(plain.weights.params())
    {
        assert_eq!(got.data(), want.data(), "{path}");
    }
    std::fs::remove_file(&q8).unwrap();
    std::fs::remove_file(&twin).unwrap();
}

/// `src` written again (its data as stored) with `edit` applied to its metadata and its
/// tensors (name, shape, type, bytes); the caller removes the file.
pub fn rewritten(
    src: &std::path::Path,
    tag: &str,
    edit: impl Fn(&mut Vec<(String, Value)>, &mut Vec<(String, Vec<usize>, GgmlType, Vec<u8>)>),
) -> PathBuf {
    let file = GgufFile::open(src).unwrap();
    let mut metadata = file.header.metadata.clone();
    let mut tensors: Vec<(String, Vec<usize>, GgmlType, Vec<u8>)> = file
        .header
        .tensors
        .iter()
        .map(|t| (t.name.clone(), t.shape(), t.ty, file.data(t).to_vec()))
        .collect();
    edit(&mut metadata, &mut tensors);
    let path =
        std::env::temp_dir().join(format!("qkv-converted-{}-{tag}.gguf", std::process::id()));
    let infos: Vec<(String, Vec<usize>, GgmlType)> = tensors
        .iter()
        .map(|(n, s, t, _)| (n.clone(), s.clone(), *t))
        .collect();
    qkv::io::gguf::write(&path, &metadata, &infos, &mut |i| {
        let (name, shape, ty, bytes) = &tensors[i];
        Ok(qkv::io::gguf::OutTensor {
            name: name.clone(),
            shape: shape.clone(),
            ty: *ty,
            bytes: bytes.clone(),
        })
    })
    .unwrap();
    path
}

fn set(metadata: &mut Vec<(String, Value)>, key: &str, value: Value) {
    metadata.retain(|(k, _)| k != key);
    metadata.push((key.to_string(), value));
}

/// A Phi-3 file with Q, K and V stored apart (llama.cpp reads either form) computes as
/// the fused one.
#[test]
fn a_phi3_file_with_q_k_and_v_apart_runs_as_the_fused_one() {
    let fused = rebuilt("phi3", "apart-src");
    let apart = rewritten(&fused, "apart", |_, tensors| {
        let (q, kv, c) = (32usize, 16usize, 32usize);
        let mut out = Vec::new();
        for (name, shape, ty, bytes) in tensors.drain(..) {
            let Some(stem) = name.strip_suffix("attn_qkv.weight") else {
                out.push((name, shape, ty, bytes));
                continue;
            };
            assert_eq!(shape, [q + 2 * kv, c]);
            let row = 4 * c;
            for (part, first, rows) in [("attn_q", 0, q), ("attn_k", q, kv), ("attn_v", q + kv, kv)]
            {
                let data = bytes[first * row..(first + rows) * row].to_vec();
                out.push((format!("{stem}{part}.weight"), vec![rows, c], ty, data));
            }
        }
        *tensors = out;
    });
    let a = qkv::models::load(&fused).unwrap();
    let b = qkv::models::load(&apart).unwrap();
    assert!(b.unused.is_empty(), "{:?}", b.unused);
    let batch = qkv::models::TokenBatch::single(vec![1, 7, 42, 5, 98, 13]).unwrap();
    let run = |m: &qkv::models::Transformer| m.forward_cached(&batch, &mut m.new_cache(1)).unwrap();
    assert_eq!(run(&a.model).data(), run(&b.model).data());
    std::fs::remove_file(&fused).unwrap();
    std::fs::remove_file(&apart).unwrap();
}

/// What llama.cpp would not read, or would read otherwise than qkv can compute, is
/// refused naming the key or the tensor; nothing panics.
#[test]
fn gemma_and_phi3_metadata_qkv_cannot_follow_is_refused_naming_the_key() {
    use qkv::io::gguf::{Array, ValueType};
    let gemma2 = rebuilt("gemma2", "refused-gemma2");
    let gemma3 = rebuilt("gemma3", "refused-gemma3");
    let phi3 = rebuilt("phi3", "refused-phi3");
    let flags = |n: usize| {
        Value::Array(Array::from_values(
            ValueType::Bool,
            vec![Value::Bool(true); n],
        ))
    };
    type Edit =
        Box<dyn Fn(&mut Vec<(String, Value)>, &mut Vec<(String, Vec<usize>, GgmlType, Vec<u8>)>)>;
    let cases: Vec<(&PathBuf, Edit, &str)> = vec![
        (
            &gemma2,
            Box::new(move |m, _| set(m, "gemma2.attention.sliding_window_pattern", flags(3))),
            "`gemma2.attention.sliding_window_pattern`: 3 flags for 2 layers",
        ),
        (
            &gemma2,
            Box::new(|m, _| {
                set(
                    m,
                    "gemma2.attention.sliding_window_pattern",
                    Value::String("x".into()),
                )
            }),
            "`gemma2.attention.sliding_window_pattern`",
        ),
        (
            &gemma2,
            Box::new(|m, _| set(m, "gemma2.attention.sliding_window", Value::U32(0))),
            "`gemma2.attention.sliding_window`",
        ),
        (
            &gemma2,
            Box::new(|m, _| set(m, "gemma2.attn_logit_softcapping", Value::F32(-1.0))),
            "`gemma2.attn_logit_softcapping`",
        ),
        (
            &gemma3,
            Box::new(|m, _| set(m, "gemma3.rope.scaling.type", Value::String("yarn".into()))),
            "RoPE scaling `yarn` (`gemma3.rope.scaling.type`)",
        ),
        (
            &gemma3,
            Box::new(|m, _| set(m, "gemma3.rope.freq_base_swa", Value::F32(f32::NAN))),
            "`gemma3.rope.freq_base_swa`",
        ),
        (
            &phi3,
            Box::new(|m, _| set(m, "phi3.rope.dimension_count", Value::U32(7))),
            "`phi3.rope.dimension_count`: 7",
        ),
        (
            &phi3,
            Box::new(|_, t| t.retain(|(n, ..)| n != "rope_factors_short.weight")),
            "`rope_factors_long.weight` and `rope_factors_short.weight` go together",
        ),
        (
            &phi3,
            Box::new(|_, t| {
                let long = t
                    .iter_mut()
                    .find(|(n, ..)| n == "rope_factors_long.weight")
                    .unwrap();
                long.1 = vec![2];
                long.3.truncate(8);
            }),
            "2 long RoPE factors (`rope_factors_long.weight`) for 6 rotating dimensions",
        ),
        (
            &phi3,
            Box::new(|_, t| {
                let long = t
                    .iter_mut()
                    .find(|(n, ..)| n == "rope_factors_long.weight")
                    .unwrap();
                long.3[..4].copy_from_slice(&(-1.0f32).to_le_bytes());
            }),
            "tensor `rope_factors_long.weight`: a RoPE factor of -1",
        ),
        (
            &phi3,
            Box::new(|_, t| {
                let up = t
                    .iter_mut()
                    .find(|(n, ..)| n == "blk.1.ffn_up.weight")
                    .unwrap();
                up.1 = vec![48, 32];
                up.3.truncate(48 * 32 * 4);
            }),
            "blk.1.ffn_up.weight",
        ),
    ];
    for (i, (src, edit, want)) in cases.into_iter().enumerate() {
        let path = rewritten(src, &format!("refused-{i}"), edit);
        let err = match qkv::models::load(&path) {
            Ok(_) => panic!("case {i} ({want}) loads"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains(want), "case {i}: {err}");
        assert!(
            err.contains(path.to_str().unwrap()) || err.contains("blk.1"),
            "case {i}: {err}"
        );
        std::fs::remove_file(&path).unwrap();
    }
    for p in [gemma2, gemma3, phi3] {
        std::fs::remove_file(p).unwrap();
    }
}

/// A model read from a GGUF file saves as a Hugging Face folder (its family's
/// config.json keys) that reads back as the same model: Gemma's norms as w again, Phi-3's
/// projections fused again; the Qwens' too.
#[test]
fn gguf_models_save_as_hugging_face_folders() {
    for name in NAMES.iter().copied().chain(["qwen2", "qwen3"]) {
        let path = match name {
            "qwen2" | "qwen3" => {
                let copy = std::env::temp_dir().join(format!(
                    "qkv-converted-{}-save-{name}.gguf",
                    std::process::id()
                ));
                std::fs::copy(fixture(&format!("models/{name}.gguf")), &copy).unwrap();
                copy
            }
            _ => rebuilt(name, "save"),
        };
        let m = qkv::models::load(&path).unwrap().model;
        let dir =
            std::env::temp_dir().join(format!("qkv-converted-{}-saved-{name}", std::process::id()));
        m.save(&dir).unwrap();
        let back = qkv::models::load(&dir).unwrap().model;
        assert_eq!(back.arch, m.arch, "{name}");
        let batch = qkv::models::TokenBatch::single(vec![1, 7, 42, 5, 98, 13]).unwrap();
        let run =
            |m: &qkv::models::Transformer| m.forward_cached(&batch, &mut m.new_cache(1)).unwrap();
        assert_eq!(run(&back).data(), run(&m).data(), "{name}");
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::remove_file(&path).unwrap();
    }
}

/// Bytes changed anywhere before the data of the converted files (their metadata and
/// tensor infos: sizes, keys, value types, patterns, softcaps, factors' shapes) end in a
/// model that runs or in an error, never a panic. Deterministic: 400 changes a file (24 000
/// a file also passed once).
#[test]
fn changed_headers_end_in_a_model_or_an_error() {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let (mut loaded, mut refused) = (0, 0);
    for name in NAMES {
        let path = rebuilt(name, "changed");
        let clean = std::fs::read(&path).unwrap();
        let head = std::fs::metadata(fixture(&format!("models/converted/{name}.gguf.head")))
            .unwrap()
            .len() as usize;
        let changed = std::env::temp_dir().join(format!(
            "qkv-converted-{}-changed-{name}-x.gguf",
            std::process::id()
        ));
        for _ in 0..400 {
            let mut bytes = clean.clone();
            for _ in 0..1 + next() % 3 {
                let at = 24 + (next() as usize) % (head - 24);
                bytes[at] = match next() % 4 {
                    0 => 0,
                    1 => 0xff,
                    2 => bytes[at].wrapping_add(1),
                    _ => next() as u8,
                };
            }
            std::fs::write(&changed, &bytes).unwrap();
            match qkv::models::load(&changed) {
                Ok(l) => {
                    loaded += 1;
                    let batch = qkv::models::TokenBatch::single(vec![1, 2]).unwrap();
                    let _ = l.model.forward_cached(&batch, &mut l.model.new_cache(1));
                }
                Err(e) => {
                    refused += 1;
                    assert!(!e.to_string().is_empty());
                }
            }
        }
        std::fs::remove_file(&changed).unwrap();
        std::fs::remove_file(&path).unwrap();
    }
    eprintln!("{loaded} loaded, {refused} refused");
    assert!(refused > 0 && loaded > 0);
}
