//! The training loop and its checkpoints, on a model small enough to reason about: a
//! bigram table (logits of the next token = one row per input token), which implements
//! `TrainableModel` like the real decoders. Checked here: the loss falls and held-out
//! accuracy reaches 1 on a deterministic text; a run interrupted and resumed equals the
//! uninterrupted run bit for bit (losses, parameters); a NaN stops the run and keeps the
//! last good checkpoint; a save interrupted by a crash is completed or discarded, never
//! half-applied; files mixed up by hand are refused; bad batch files are named.

#![cfg(feature = "models")]

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use qkv::io::{self, TensorFile};
use qkv::rng::Rng;
use qkv::train::checkpoint::{self, STAGING_DIR, STATE_FILE};
use qkv::train::loss::cross_entropy;
use qkv::train::text_data::TextData;
use qkv::train::trainable::{Batch, TrainableModel};
use qkv::train::trainer::{
    BatchSource, FixedBatches, RunOptions, StepLog, TextBatches, TrainConfig, Trainer,
};
use qkv::Tensor;

/// logits[b, t, :] = table[inputs[b, t], :]; optionally a NaN loss at one step.
struct Bigram {
    table: Tensor,
    grad: Tensor,
    calls: u64,
    nan_at_call: Option<u64>,
}

impl Bigram {
    fn new(vocab: usize, seed: u64) -> Self {
        Bigram {
            table: Rng::new(seed).tensor(&[vocab, vocab], 0.1),
            grad: Tensor::zeros(&[vocab, vocab]),
            calls: 0,
            nan_at_call: None,
        }
    }

    fn load(dir: &Path) -> Self {
        let table = TensorFile::open(dir.join("model.safetensors"))
            .unwrap()
            .tensor("table.weight")
            .unwrap();
        let grad = Tensor::zeros(table.shape());
        Bigram {
            table,
            grad,
            calls: 0,
            nan_at_call: None,
        }
    }

    fn vocab(&self) -> usize {
        self.table.shape()[0]
    }
}

impl TrainableModel for Bigram {
    fn zero_grads(&mut self) {
        self.grad.data_mut().fill(0.0);
    }

    fn loss_and_backward(&mut self, batch: &Batch) -> qkv::Result<f32> {
        let call = self.calls;
        self.calls += 1;
        let logits = self.logits(batch)?;
        let (loss, dlogits) = cross_entropy(&logits, &batch.targets)?;
        let v = self.vocab();
        for (row, &id) in batch.inputs.iter().enumerate() {
            let g = &mut self.grad.data_mut()[id * v..(id + 1) * v];
            for (a, &d) in g.iter_mut().zip(&dlogits.data()[row * v..(row + 1) * v]) {
                *a += d;
            }
        }
        Ok(if self.nan_at_call == Some(call) {
            f32::NAN
        } else {
            loss
        })
    }

    fn logits(&self, batch: &Batch) -> qkv::Result<Tensor> {
        let v = self.vocab();
        let mut out = Vec::with_capacity(batch.inputs.len() * v);
        for &id in &batch.inputs {
            out.extend_from_slice(&self.table.data()[id * v..(id + 1) * v]);
        }
        Tensor::new(&[batch.batch, batch.len, v], out)
    }

    fn visit_params(&mut self, f: &mut dyn FnMut(&str, &mut Tensor, &Tensor)) {
        f("table.weight", &mut self.table, &self.grad);
    }

    fn save(&self, dir: &Path) -> qkv::Result<()> {
        io::write_atomic(
            &dir.join("config.json"),
            format!(
                "{{\"model_type\": \"bigram\", \"vocab_size\": {}}}",
                self.vocab()
            )
            .as_bytes(),
        )?;
        io::save(
            &dir.join("model.safetensors"),
            &[("table.weight", &self.table)],
            None,
        )
    }
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("qkv-train-loop-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A text whose next byte is a function of the current one, so a bigram model can
/// reach 100% accuracy, with a validation tail of the same pattern.
fn text_source() -> TextBatches {
    // every byte has a single successor
    let text: Vec<u8> = b"qwertyuiop".iter().copied().cycle().take(4000).collect();
    TextBatches {
        data: TextData::from_bytes("cycle", text, 16, 0.1).unwrap(),
        batch_size: 4,
    }
}

fn config(steps: u64) -> TrainConfig {
    TrainConfig {
        steps,
        lr: 0.1,
        warmup: 2,
        min_lr: 0.01,
        clip: Some(1.0),
        eval_every: 2,
        eval_batches: 2,
        seed: 7,
        ..TrainConfig::default()
    }
}

fn run_to_end(trainer: &mut Trainer, data: &mut dyn BatchSource, opts: RunOptions) -> Vec<StepLog> {
    let eval = data
        .eval_batches(trainer.config().seed, trainer.config().eval_batches)
        .unwrap();
    let mut logs = Vec::new();
    trainer
        .run(data, &eval, opts, &mut |log| logs.push(log.clone()))
        .unwrap();
    logs
}

#[test]
fn loss_falls_and_accuracy_reaches_one() {
    let mut model = Bigram::new(256, 1);
    let mut data = text_source();
    let mut trainer = Trainer::new(&mut model, config(60), serde_json::Value::Null).unwrap();
    let logs = run_to_end(&mut trainer, &mut data, RunOptions::default());
    assert_eq!(logs.len(), 60);
    assert_eq!(
        logs.iter().map(|l| l.step).collect::<Vec<_>>(),
        (0..60).collect::<Vec<_>>()
    );
    let (first, last) = (logs[0].loss, logs[59].loss);
    assert!(last < first / 4.0, "loss {first} → {last}");
    // evaluation on every 2nd step, and the last
    assert!(logs[0].eval_loss.is_none() && logs[1].eval_loss.is_some());
    assert_eq!(logs[59].eval_accuracy, Some(1.0));
    // warm-up: the first update has lr 0
    assert_eq!(logs[0].lr, 0.0);
}

#[test]
fn resumed_run_equals_uninterrupted_run_bit_for_bit() {
    let dir = scratch("resume");
    let (straight, split) = (dir.join("straight"), dir.join("split"));

    let mut model = Bigram::new(256, 3);
    let mut trainer = Trainer::new(&mut model, config(6), serde_json::json!({"k": 1})).unwrap();
    let straight_logs = run_to_end(
        &mut trainer,
        &mut text_source(),
        RunOptions {
            out: Some(&straight),
            stop_after: None,
        },
    );

    let mut model = Bigram::new(256, 3);
    let mut trainer = Trainer::new(&mut model, config(6), serde_json::json!({"k": 1})).unwrap();
    let mut logs = run_to_end(
        &mut trainer,
        &mut text_source(),
        RunOptions {
            out: Some(&split),
            stop_after: Some(3),
        },
    );
    assert_eq!(logs.len(), 3);

    let state = checkpoint::open(&split).unwrap();
    assert_eq!((state.step, state.losses.len()), (3, 3));
    let mut model = Bigram::load(&split);
    let mut trainer = Trainer::resume(&mut model, &split, state).unwrap();
    assert_eq!(trainer.run_config()["k"], 1);
    logs.extend(run_to_end(
        &mut trainer,
        &mut text_source(),
        RunOptions {
            out: Some(&split),
            stop_after: None,
        },
    ));

    let bits = |logs: &[StepLog]| -> Vec<String> {
        logs.iter()
            .map(|l| serde_json::to_string(l).unwrap())
            .collect()
    };
    assert_eq!(bits(&logs), bits(&straight_logs));
    let (a, b) = (
        checkpoint::open(&straight).unwrap(),
        checkpoint::open(&split).unwrap(),
    );
    let as_bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(as_bits(&a.losses), as_bits(&b.losses));
    assert_eq!(a.rng_state, b.rng_state);
    for file in ["model.safetensors", "optimizer.safetensors"] {
        assert_eq!(
            std::fs::read(straight.join(file)).unwrap(),
            std::fs::read(split.join(file)).unwrap(),
            "{file}"
        );
    }
    // a cosine run cannot be stretched on resume
    let state = checkpoint::open(&split).unwrap();
    let mut model = Bigram::load(&split);
    let mut trainer = Trainer::resume(&mut model, &split, state).unwrap();
    assert!(trainer
        .set_steps(10)
        .unwrap_err()
        .to_string()
        .contains("cosine"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn nan_loss_stops_the_run_and_keeps_the_last_good_checkpoint() {
    let dir = scratch("nan");
    let mut model = Bigram::new(256, 5);
    model.nan_at_call = Some(5);
    let cfg = TrainConfig {
        save_every: 2,
        ..config(10)
    };
    let mut trainer = Trainer::new(&mut model, cfg, serde_json::Value::Null).unwrap();
    let mut data = text_source();
    let mut seen = 0;
    let err = trainer
        .run(
            &mut data,
            &[],
            RunOptions {
                out: Some(&dir),
                stop_after: None,
            },
            &mut |_| seen += 1,
        )
        .unwrap_err()
        .to_string();
    assert!(err.contains("step 5") && err.contains("NaN"), "{err}");
    assert_eq!(seen, 5);
    assert_eq!(trainer.step(), 5, "the bad step changed nothing");
    let state = checkpoint::open(&dir).unwrap();
    assert_eq!(state.step, 4);
    assert!(state.losses.iter().all(|l| l.is_finite()));
    assert!(checkpoint::staged(&dir).is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn non_finite_gradient_names_the_parameter() {
    struct Poisoned(Bigram);
    impl TrainableModel for Poisoned {
        fn zero_grads(&mut self) {
            self.0.zero_grads()
        }
        fn loss_and_backward(&mut self, batch: &Batch) -> qkv::Result<f32> {
            let loss = self.0.loss_and_backward(batch)?;
            self.0.grad.data_mut()[3] = f32::INFINITY;
            Ok(loss)
        }
        fn logits(&self, batch: &Batch) -> qkv::Result<Tensor> {
            self.0.logits(batch)
        }
        fn visit_params(&mut self, f: &mut dyn FnMut(&str, &mut Tensor, &Tensor)) {
            self.0.visit_params(f)
        }
        fn save(&self, dir: &Path) -> qkv::Result<()> {
            self.0.save(dir)
        }
    }
    let mut model = Poisoned(Bigram::new(256, 5));
    let before = model.0.table.clone();
    let mut trainer = Trainer::new(&mut model, config(3), serde_json::Value::Null).unwrap();
    let err = trainer
        .train_step(&mut text_source())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("step 0") && err.contains("table.weight"),
        "{err}"
    );
    assert_eq!(model.0.table, before);
}

/// Copies the regular files of `from` into `to`.
fn copy_files(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.path().is_file() {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

#[test]
fn a_crash_during_a_save_leaves_one_complete_checkpoint() {
    let dir = scratch("crash");
    let (old, new) = (dir.join("old"), dir.join("new"));
    let mut model = Bigram::new(64, 9);
    let mut trainer = Trainer::new(&mut model, config(4), serde_json::Value::Null).unwrap();
    let mut data = TextBatches {
        data: TextData::from_bytes("t", b"0123456789".repeat(50), 8, 0.1).unwrap(),
        batch_size: 2,
    };
    for _ in 0..2 {
        trainer.train_step(&mut data).unwrap();
    }
    trainer.save(&old).unwrap();
    for _ in 0..2 {
        trainer.train_step(&mut data).unwrap();
    }
    trainer.save(&new).unwrap();

    // 1. Crash while staging: the staged set lacks its state file → discarded.
    let case = dir.join("staging");
    copy_files(&old, &case);
    copy_files(&new, &case.join(STAGING_DIR));
    std::fs::remove_file(case.join(STAGING_DIR).join(STATE_FILE)).unwrap();
    std::fs::write(case.join(STAGING_DIR).join("model.safetensors"), b"torn").unwrap();
    assert_eq!(checkpoint::open(&case).unwrap().step, 2);
    assert!(checkpoint::staged(&case).is_empty());

    // 2. Crash while moving files in: the model already moved, the rest staged → the
    //    move is completed.
    let case = dir.join("moving");
    copy_files(&old, &case);
    copy_files(&new, &case.join(STAGING_DIR));
    std::fs::rename(
        case.join(STAGING_DIR).join("model.safetensors"),
        case.join("model.safetensors"),
    )
    .unwrap();
    let state = checkpoint::open(&case).unwrap();
    assert_eq!(state.step, 4);
    for file in ["model.safetensors", "optimizer.safetensors", STATE_FILE] {
        assert_eq!(
            std::fs::read(case.join(file)).unwrap(),
            std::fs::read(new.join(file)).unwrap(),
            "{file}"
        );
    }

    // 2b. Two complete staged sets (each save stages in a folder of its own): the
    //     latest step's is moved in, the other discarded.
    let case = dir.join("two");
    copy_files(&old, &case.join(format!("{STAGING_DIR}-1-0")));
    copy_files(&new, &case.join(format!("{STAGING_DIR}-2-0")));
    assert!(checkpoint::exists(&case));
    assert_eq!(checkpoint::open(&case).unwrap().step, 4);
    assert!(checkpoint::staged(&case).is_empty());

    // 3. Files mixed up by hand: refused, naming the file.
    let case = dir.join("mixed");
    copy_files(&old, &case);
    std::fs::copy(
        new.join("optimizer.safetensors"),
        case.join("optimizer.safetensors"),
    )
    .unwrap();
    let err = checkpoint::open(&case).unwrap_err().to_string();
    assert!(
        err.contains("optimizer.safetensors") && err.contains("does not belong"),
        "{err}"
    );

    // 4. Not a checkpoint at all.
    let err = checkpoint::open(&dir.join("nothing"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("no training checkpoint"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

fn write_batches(path: &Path, ids: (&[usize], Vec<i64>), targets: (&[usize], Vec<i64>)) {
    write_ints(
        path,
        &[
            ("input_ids", ids.0, &ids.1),
            ("targets", targets.0, &targets.1),
        ],
    );
}

/// Int64 tensors (name, shape, values) into a safetensors file.
fn write_ints(path: &Path, tensors: &[(&str, &[usize], &[i64])]) {
    use safetensors::tensor::TensorView;
    use safetensors::Dtype;
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, _, v)| v.iter().flat_map(|x| x.to_le_bytes()).collect())
        .collect();
    let views: Vec<(&str, TensorView)> = tensors
        .iter()
        .zip(&bytes)
        .map(|((name, shape, _), b)| {
            (
                *name,
                TensorView::new(Dtype::I64, shape.to_vec(), b).unwrap(),
            )
        })
        .collect();
    std::fs::write(
        path,
        safetensors::tensor::serialize(views, None::<HashMap<String, String>>).unwrap(),
    )
    .unwrap();
}

#[test]
fn batch_files_are_checked_against_the_model() {
    let dir = scratch("batches");
    let path = dir.join("b.safetensors");
    let ids: Vec<i64> = (0..2 * 3 * 4).map(|i| i % 5).collect();
    let mut targets = ids.clone();
    targets[0] = -100;
    write_batches(
        &path,
        (&[2, 3, 4], ids.clone()),
        (&[2, 3, 4], targets.clone()),
    );
    let b = FixedBatches::open(&path).unwrap();
    assert_eq!(b.shape(), (2, 3, 4));
    b.check(5, Some(4), 2).unwrap();
    let first = b.get(1).unwrap();
    assert_eq!(
        (first.batch, first.len, first.inputs[0]),
        (3, 4, (12 % 5) as usize)
    );
    let msg = |r: qkv::Result<()>| r.unwrap_err().to_string();
    assert!(msg(b.check(4, None, 2)).contains("vocabulary of 4"));
    assert!(msg(b.check(5, Some(3), 2)).contains("longer than the model's 3 positions"));
    assert!(msg(b.check(5, None, 3)).contains("2 batches but the run has 3 steps"));

    write_batches(
        &path,
        (&[2, 3, 4], ids.clone()),
        (&[2, 12], targets.clone()),
    );
    assert!(FixedBatches::open(&path)
        .unwrap_err()
        .to_string()
        .contains("`targets` has shape [2, 12]"));
    write_batches(&path, (&[6, 4], ids.clone()), (&[6, 4], targets.clone()));
    assert!(FixedBatches::open(&path)
        .unwrap_err()
        .to_string()
        .contains("[steps, B, T]"));
    let mut bad = ids.clone();
    bad[5] = -1;
    write_batches(&path, (&[2, 3, 4], bad), (&[2, 3, 4], targets.clone()));
    assert!(FixedBatches::open(&path)
        .unwrap_err()
        .to_string()
        .contains("negative id -1"));
    // a mask value that is not 0 or 1, negative included, is named as a mask value
    let mut mask = vec![1i64; 24];
    mask[5] = -1;
    write_ints(
        &path,
        &[
            ("input_ids", &[2, 3, 4], &ids),
            ("attention_mask", &[2, 3, 4], &mask),
            ("targets", &[2, 3, 4], &targets),
        ],
    );
    let err = FixedBatches::open(&path).unwrap_err().to_string();
    assert!(
        err.contains("`attention_mask` must hold 0 or 1, found -1 at flat index 5"),
        "{err}"
    );
    let mut bad = targets;
    bad[5] = -7;
    write_batches(&path, (&[2, 3, 4], ids), (&[2, 3, 4], bad));
    assert!(FixedBatches::open(&path)
        .unwrap_err()
        .to_string()
        .contains("holds -7"));
    std::fs::remove_dir_all(&dir).unwrap();
}
