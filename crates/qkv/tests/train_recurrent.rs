//! The recurrent models train through the Transformers' trainer and tasks
//! (`qkv::train::recurrent`): the language model's backward by finite differences, each
//! kind learning a task, save and load, and the errors of a model given data it cannot
//! read.

#![cfg(feature = "models")]

use std::path::PathBuf;

use qkv::layers::{Embedding, Linear};
use qkv::module::Module;
use qkv::rng::Rng;
use qkv::rnn::{Elman, ElmanLayer, RnnLm};
use qkv::train::gradcheck::{compare, numeric_grad, probe_loss};
use qkv::train::recurrent::{RecurrentKind, RecurrentModel, RecurrentSpec};
use qkv::train::tasks::{Task, TaskOptions};
use qkv::train::trainable::TrainableModel;
use qkv::train::trainer::{evaluate, BatchSource, RunOptions, TaskBatches, TrainConfig, Trainer};

fn scratch(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("qkv-train-recurrent-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn language_model_backward_equals_finite_differences() {
    let mut rng = Rng::new(3);
    let (v, e, hd) = (6, 3, 4);
    let lm = RnnLm::new(
        Embedding::new(rng.tensor(&[v, e], 1.0)).unwrap(),
        Elman::new(vec![ElmanLayer {
            weight_ih: rng.tensor(&[hd, e], 0.5),
            weight_hh: rng.tensor(&[hd, hd], 0.5),
            bias_ih: rng.tensor(&[hd], 0.5),
            bias_hh: rng.tensor(&[hd], 0.5),
        }])
        .unwrap(),
        Linear::new(rng.tensor(&[v, hd], 0.5), Some(rng.tensor(&[v], 0.5))).unwrap(),
    )
    .unwrap();
    let ids = [1, 5, 0, 2, 3, 3, 4, 1];
    let lengths = [4, 3];
    let r = rng.tensor(&[2, 4, v], 1.0);
    let (_, cache) = lm.forward(&ids, 2, Some(&lengths)).unwrap();
    let mut grads = lm.zeros_like();
    lm.backward(&cache, &r, &mut grads).unwrap();
    let analytic = grads.params();
    for (i, (name, p)) in lm.params().iter().enumerate() {
        let mut data = p.data().to_vec();
        let num = numeric_grad(&mut data, 1e-2, |d| {
            let mut moved = lm.clone();
            moved.params_mut()[i].1.data_mut().copy_from_slice(d);
            probe_loss(
                moved.forward(&ids, 2, Some(&lengths)).unwrap().0.data(),
                r.data(),
            )
        });
        compare(&format!("d{name}"), analytic[i].1.data(), &num, 5e-4, 1e-3)
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

fn spec(kind: RecurrentKind, task: &Task) -> RecurrentSpec {
    RecurrentSpec {
        kind,
        vocab: task.vocab_size(),
        embedding: 16,
        hidden: 48,
        layers: 1,
        attention_width: 32,
        separator: task.separator(),
    }
}

/// Trains `kind` on reversing 5 symbols of 6 and returns its held-out token accuracy.
fn reverse_accuracy(kind: RecurrentKind, steps: u64) -> f64 {
    let options = TaskOptions {
        length: Some(5),
        symbols: Some(6),
        ..Default::default()
    };
    let task = Task::from_name("reverse", &options).unwrap();
    let mut model = RecurrentModel::new(&spec(kind, &task), 11).unwrap();
    let mut data = TaskBatches {
        task,
        batch_size: 32,
    };
    let config = TrainConfig {
        steps,
        lr: 1e-2,
        warmup: 20,
        min_lr: 1e-3,
        clip: Some(1.0),
        eval_every: 0,
        eval_batches: 4,
        seed: 5,
        ..TrainConfig::default()
    };
    let eval = data.eval_batches(config.seed, config.eval_batches).unwrap();
    let mut trainer = Trainer::new(&mut model, config, serde_json::Value::Null).unwrap();
    trainer
        .run(&mut data, &eval, RunOptions::default(), &mut |_| {})
        .unwrap();
    evaluate(&model, &eval).unwrap().accuracy
}

#[test]
fn every_recurrent_kind_learns_to_reverse() {
    // chance is 1/6; each kind was measured well above its bound here (see below)
    let plain = reverse_accuracy(RecurrentKind::Seq2Seq, 300);
    let attention = reverse_accuracy(RecurrentKind::Seq2SeqAttention, 300);
    let lm = reverse_accuracy(RecurrentKind::Lm, 300);
    eprintln!("reverse 5 of 6 symbols, 300 steps: seq2seq {plain:.3}, with attention {attention:.3}, lm {lm:.3}");
    assert!(attention > 0.95, "with attention: {attention}");
    assert!(plain > 0.5 && lm > 0.5, "seq2seq {plain}, lm {lm}");
}

#[test]
fn a_saved_model_loads_with_the_same_logits() {
    let task = Task::from_name("copy", &TaskOptions::default()).unwrap();
    let batch = task.batch(3, &mut Rng::new(1));
    for kind in [
        RecurrentKind::Lm,
        RecurrentKind::Seq2Seq,
        RecurrentKind::Seq2SeqAttention,
    ] {
        let model = RecurrentModel::new(&spec(kind, &task), 2).unwrap();
        let dir = scratch(&format!("{kind:?}"));
        model.save(&dir).unwrap();
        assert!(RecurrentModel::is_saved_in(&dir));
        let loaded = RecurrentModel::load(&dir).unwrap();
        assert_eq!(loaded.spec(), model.spec());
        assert_eq!(
            loaded.logits(&batch).unwrap().data(),
            model.logits(&batch).unwrap().data()
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn an_encoder_decoder_needs_a_separator() {
    let task = Task::from_name("long_range", &TaskOptions::default()).unwrap();
    let e = RecurrentModel::new(&spec(RecurrentKind::Seq2SeqAttention, &task), 0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("separator"), "{e}");
    // a batch without the separator token, given to a model that expects one
    let copy = Task::from_name("copy", &TaskOptions::default()).unwrap();
    let mut model = RecurrentModel::new(&spec(RecurrentKind::Seq2Seq, &copy), 0).unwrap();
    let mut batch = copy.batch(2, &mut Rng::new(3));
    let sep = copy.separator().unwrap();
    batch
        .inputs
        .iter_mut()
        .filter(|x| **x == sep)
        .for_each(|x| *x = 0);
    let e = model.loss_and_backward(&batch).unwrap_err().to_string();
    assert!(e.contains("separator"), "{e}");
}
