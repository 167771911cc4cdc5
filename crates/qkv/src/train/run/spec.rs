//! What a checkpoint remembers of the request that started the run (`config.run` in
//! `trainer_state.json`), so that resuming rebuilds the same batches; and the
//! optimiser's settings read from a request.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::request::{DecayChoice, RunRequest};
use crate::error::{Error, Result};
use crate::train::tasks::{Task, TaskOptions};
use crate::train::text_data::TextData;
use crate::train::trainer::{
    BatchSource, DecayParams, FixedBatches, TaskBatches, TextBatches, TrainConfig,
};

const DEFAULT_BATCH: usize = 32;
const TEXT_DEFAULT_SEQ_LEN: usize = 64;
const TEXT_DEFAULT_VAL_FRACTION: f64 = 0.1;
const DEFAULT_EVAL_EVERY: u64 = 100;

/// Where the batches come from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Source {
    Init {
        init: PathBuf,
        data: PathBuf,
    },
    Task {
        name: String,
        length: Option<usize>,
        symbols: Option<usize>,
        queries: Option<usize>,
        distance: Option<usize>,
        batch_size: usize,
    },
    Text {
        path: PathBuf,
        seq_len: usize,
        val_fraction: f64,
        batch_size: usize,
    },
}

/// The caller's part of a checkpoint's configuration (`config.run`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunSpec {
    pub source: Source,
    /// Threads of the run (None: all cores).
    pub threads: Option<usize>,
    /// The JSON log, which a resumed run continues unless given another.
    pub log_json: Option<PathBuf>,
}

/// A source's batches and, for tasks and text, the (vocabulary, length) a new model needs.
pub type Opened = (Box<dyn BatchSource>, Option<(usize, usize)>);

impl Source {
    /// The source a fresh `request` (already checked) names.
    pub fn of(request: &RunRequest) -> Source {
        let r = request;
        let batch_size = r.batch_size.unwrap_or(DEFAULT_BATCH);
        if let (Some(init), Some(data)) = (&r.init, &r.data) {
            Source::Init {
                init: init.clone(),
                data: data.clone(),
            }
        } else if let Some(name) = &r.task {
            Source::Task {
                name: name.clone(),
                length: r.task_length,
                symbols: r.symbols,
                queries: r.queries,
                distance: r.distance,
                batch_size,
            }
        } else {
            Source::Text {
                path: r.text.clone().expect("checked: one source is given"),
                seq_len: r.seq_len.unwrap_or(TEXT_DEFAULT_SEQ_LEN),
                val_fraction: r.val_fraction.unwrap_or(TEXT_DEFAULT_VAL_FRACTION),
                batch_size,
            }
        }
    }

    /// The task a task source names.
    pub fn task(&self) -> Result<Option<Task>> {
        match self {
            Source::Task {
                name,
                length,
                symbols,
                queries,
                distance,
                ..
            } => {
                let options = TaskOptions {
                    length: *length,
                    symbols: *symbols,
                    queries: *queries,
                    distance: *distance,
                };
                Task::from_name(name, &options).map(Some)
            }
            _ => Ok(None),
        }
    }

    /// The batches, and for tasks and text the vocabulary and length a new model needs.
    pub fn open(&self) -> Result<Opened> {
        Ok(match self {
            Source::Init { data, .. } => {
                let batches = FixedBatches::open(data)
                    .map_err(|e| e.within(format!("reading `data` {}", data.display())))?;
                (Box::new(batches), None)
            }
            Source::Task { batch_size, .. } => {
                let task = self.task()?.expect("a task source");
                let shape = (task.vocab_size(), task.seq_len());
                let batches = TaskBatches {
                    task,
                    batch_size: *batch_size,
                };
                (Box::new(batches), Some(shape))
            }
            Source::Text {
                path,
                seq_len,
                val_fraction,
                batch_size,
            } => {
                let data = TextData::open(path, *seq_len, *val_fraction)?;
                let shape = (data.vocab_size(), data.seq_len());
                let batches = TextBatches {
                    data,
                    batch_size: *batch_size,
                };
                (Box::new(batches), Some(shape))
            }
        })
    }

    /// The batch size of a task or text source.
    pub fn batch_size(&self) -> Option<usize> {
        match self {
            Source::Task { batch_size, .. } | Source::Text { batch_size, .. } => Some(*batch_size),
            Source::Init { .. } => None,
        }
    }
}

impl RunSpec {
    /// The spec stored in a checkpoint's `config`.
    pub fn stored(config: &serde_json::Value, dir: &std::path::Path) -> Result<RunSpec> {
        serde_json::from_value(config["run"].clone()).map_err(|e| {
            Error::request(format!(
                "{}: not a checkpoint of a qkv training run ({e})",
                dir.display()
            ))
        })
    }
}

/// The optimiser, schedule, evaluation and checkpoint settings of a fresh `request`.
pub fn train_config(request: &RunRequest) -> TrainConfig {
    let r = request;
    let d = TrainConfig::default();
    TrainConfig {
        steps: r.steps.unwrap_or(d.steps),
        lr: r.lr.unwrap_or(d.lr),
        constant_lr: r.constant_lr,
        warmup: r.warmup.unwrap_or(d.warmup),
        min_lr: r.min_lr.unwrap_or(d.min_lr),
        weight_decay: r.weight_decay.unwrap_or(d.weight_decay),
        beta1: r.beta1.unwrap_or(d.beta1),
        beta2: r.beta2.unwrap_or(d.beta2),
        eps: r.eps.unwrap_or(d.eps),
        decay: match r.decay {
            Some(DecayChoice::Standard) => DecayParams::Standard,
            Some(DecayChoice::All) => DecayParams::All,
            Some(DecayChoice::None) => DecayParams::None,
            // The `data` contract reproduces torch.optim.AdamW(model.parameters()).
            None if r.init.is_some() => DecayParams::All,
            None => DecayParams::Standard,
        },
        clip: r.clip,
        eval_every: r.eval_every.unwrap_or(DEFAULT_EVAL_EVERY),
        eval_batches: r.eval_batches.unwrap_or(d.eval_batches),
        save_every: r.save_every.unwrap_or(0),
        seed: r.seed.unwrap_or(d.seed),
        dtype: r.dtype.unwrap_or(d.dtype),
    }
}
