//! The `--input` batch reader of `qkv forward`: any bytes as a safetensors file, read
//! as `read_batch` in crates/qkv-cli/src/cmd/mod.rs reads it (that function lives in
//! the binary crate, so its checks are repeated here over the same library calls,
//! `TensorFile::ints` and `TokenBatch::new`), then run as `qkv forward` runs it: BERT
//! with the optional `token_type_ids`, GPT-2, and T5 with `decoder_input_ids`. A batch
//! may be refused (ids past the vocabulary, rows past the positions); nothing may panic.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use qkv::io::TensorFile;
use qkv::models::{TokenBatch, Transformer};

/// `read_batch` of crates/qkv-cli/src/cmd/mod.rs, with its checks and messages.
fn read_batch(
    file: &TensorFile,
    ids_name: &str,
    mask_name: Option<&str>,
) -> Result<TokenBatch, String> {
    let (shape, ids) = file.ints(ids_name).map_err(|e| e.to_string())?;
    if shape.len() != 2 {
        return Err(format!("`{ids_name}` must be [B, T], got shape {shape:?}"));
    }
    let ids = ids
        .into_iter()
        .map(|id| usize::try_from(id).map_err(|_| format!("`{ids_name}` holds a negative id {id}")))
        .collect::<Result<Vec<_>, _>>()?;
    let mask = match mask_name.filter(|m| file.contains(m)) {
        Some(m) => {
            let (mshape, mask) = file.ints(m).map_err(|e| e.to_string())?;
            if mshape != shape {
                return Err(format!(
                    "`{m}` has shape {mshape:?} but `{ids_name}` has {shape:?}"
                ));
            }
            if let Some(v) = mask.iter().find(|&&v| v != 0 && v != 1) {
                return Err(format!("`{m}` must hold 0 or 1, found {v}"));
            }
            Some(mask.into_iter().map(|v| v == 1).collect())
        }
        None => None,
    };
    TokenBatch::new(ids, mask, shape[0], shape[1]).map_err(|e| e.to_string())
}

struct Models {
    bert: Transformer,
    gpt2: Transformer,
    t5: Transformer,
}

fn models() -> &'static Models {
    static MODELS: OnceLock<Models> = OnceLock::new();
    MODELS.get_or_init(|| Models {
        bert: qkv_fuzz::fixture_model("models/bert"),
        gpt2: qkv_fuzz::fixture_model("models/gpt2"),
        t5: qkv_fuzz::fixture_model("models/t5"),
    })
}

fuzz_target!(init: qkv_fuzz::init(), |data: &[u8]| {
    let path = qkv_fuzz::scratch("batch").join("input.safetensors");
    qkv_fuzz::write(&path, data);
    let Ok(input) = TensorFile::open(&path) else {
        return;
    };
    let tokens = match read_batch(&input, "input_ids", Some("attention_mask")) {
        Ok(t) => t,
        Err(e) => return qkv_fuzz::note("read_batch", &e),
    };
    let models = models();
    // qkv forward, encoder: optional token types
    let types = if input.contains("token_type_ids") {
        read_batch(&input, "token_type_ids", None).ok().map(|b| b.ids)
    } else {
        None
    };
    if let Some(t) = &types {
        // read_batch gives [B', T'] types; the encoder must check them against [B, T]
        let _ = qkv_fuzz::forward(&models.bert, &tokens, Some(t), None);
    }
    let report = |what: &str, r: qkv::Result<qkv::Tensor>| match r {
        Ok(t) => qkv_fuzz::note(what, &format!("ran, {:?}", t.shape())),
        Err(e) => qkv_fuzz::note(what, &e),
    };
    report("bert", qkv_fuzz::forward(&models.bert, &tokens, None, None));
    // decoder-only
    report("gpt2", qkv_fuzz::forward(&models.gpt2, &tokens, None, None));
    // encoder-decoder: needs decoder_input_ids
    if let Ok(dec) = read_batch(&input, "decoder_input_ids", None) {
        report("t5", qkv_fuzz::forward(&models.t5, &tokens, None, Some(&dec)));
    }
});
