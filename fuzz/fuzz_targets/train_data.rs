//! The training `--data` reader (`qkv train --init MODEL --data FILE`): any bytes as a
//! safetensors file, opened with `FixedBatches::open`. Data that opens is checked
//! against three tiny training fixtures as the CLI checks it (`BatchSource::check`
//! with the model's vocabulary and positions, for as many steps as the file has
//! batches): decoder-only GPT-2 and masked-LM BERT for data without
//! `decoder_input_ids`, T5 for data with them. Data that passes the check must train:
//! a loss and backward on its first and last batch must succeed.
#![no_main]

use std::sync::{Mutex, OnceLock};

use libfuzzer_sys::fuzz_target;
use qkv::models::Transformer;
use qkv::rng::Rng;
use qkv::train::trainable::TrainableModel;
use qkv::train::trainer::{BatchSource, FixedBatches};

struct Models {
    /// decoder-only and encoder-only models: data without a source
    plain: Vec<(&'static str, Transformer)>,
    /// the encoder-decoder: data with `decoder_input_ids`
    seq2seq: (&'static str, Transformer),
}

fn models() -> &'static Mutex<Models> {
    static MODELS: OnceLock<Mutex<Models>> = OnceLock::new();
    MODELS.get_or_init(|| {
        let load = |name: &'static str| {
            (
                name,
                qkv_fuzz::fixture_model(&format!("train_model/{name}")),
            )
        };
        Mutex::new(Models {
            plain: vec![load("gpt2"), load("bert")],
            seq2seq: load("t5"),
        })
    })
}

fn train(name: &str, model: &mut Transformer, data: &mut FixedBatches) {
    let (count, _, _) = data.shape();
    let (vocab, max_positions) = (model.arch.vocab, model.arch.max_positions());
    if let Err(e) = data.check(vocab, max_positions, count as u64) {
        return qkv_fuzz::note(name, &e);
    }
    let mut rng = Rng::new(0);
    for step in [0, count - 1] {
        let batch = data
            .train_batch(step as u64, &mut rng)
            .unwrap_or_else(|e| panic!("batch {step} of {count} after the check passed: {e}"));
        model.zero_grads();
        if let Err(e) = model.loss_and_backward(&batch) {
            panic!("{name}: data that passed the check does not train (batch {step}): {e}");
        }
        qkv_fuzz::note(name, &format!("trained on batch {step}"));
    }
}

fuzz_target!(init: qkv_fuzz::init(), |data: &[u8]| {
    let path = qkv_fuzz::scratch("train_data").join("data.safetensors");
    qkv_fuzz::write(&path, data);
    let mut batches = match FixedBatches::open(&path) {
        Ok(b) => b,
        Err(e) => return qkv_fuzz::note("open", &e),
    };
    let (count, b, t) = batches.shape();
    assert!(count >= 1 && b >= 1 && t >= 1, "an empty shape opened: {:?}", batches.shape());
    assert_eq!(batches.tokens_per_batch(), b * t);
    assert!(batches.get(count).is_err(), "batch past the end");
    let mut models = models().lock().unwrap_or_else(|e| e.into_inner());
    let Models { plain, seq2seq } = &mut *models;
    let has_source = batches.get(0).expect("batch 0").source.is_some();
    if has_source {
        train(seq2seq.0, &mut seq2seq.1, &mut batches);
    } else {
        for (name, model) in plain.iter_mut() {
            train(name, model, &mut batches);
        }
    }
});
