//! The `--input` batch reader of `qkv forward`: any bytes as a safetensors file, read
//! with `TensorFile::token_batch` as `qkv forward` reads it, then run as it runs it: BERT
//! with the optional `token_type_ids`, GPT-2, and T5 with `decoder_input_ids`. A batch
//! may be refused (ids past the vocabulary, rows past the positions); nothing may panic.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use qkv::io::TensorFile;
use qkv::models::{TokenBatch, Transformer};

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
    let tokens = match input.token_batch("input_ids", Some("attention_mask")) {
        Ok(t) => t,
        Err(e) => return qkv_fuzz::note("TensorFile::token_batch", &e),
    };
    let models = models();
    // qkv forward, encoder: optional token types
    let types = if input.contains("token_type_ids") {
        input.token_batch("token_type_ids", None).ok().map(|b| b.ids)
    } else {
        None
    };
    if let Some(t) = &types {
        // token_batch gives [B', T'] types; the encoder must check them against [B, T]
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
    if let Ok(dec) = input.token_batch("decoder_input_ids", None) {
        report("t5", qkv_fuzz::forward(&models.t5, &tokens, None, Some(&dec)));
    }
});
