//! One training run from a request to its last checkpoint, in the order that keeps the
//! output folder safe: every setting, input and size is checked first; then the
//! output folder is claimed (locked, then checked under the lock); only then is
//! anything written.

use std::path::PathBuf;

use super::files::{copy_tokenizer_files, open_log, write_byte_tokenizer};
use super::model::{arch, recurrent, Model};
use super::request::{Network, RunRequest};
use super::spec::{train_config, RunSpec, Source};
use crate::error::{Error, Result};
use crate::io::memory;
use crate::models::Transformer;
use crate::train::output::Lock;
use crate::train::trainer::{RunOptions, StepLog, Trainer};
use crate::train::{checkpoint, memory as estimate};

/// Where a run starts and stops, known before its first step.
#[derive(Clone, Debug)]
pub struct RunInfo {
    /// Steps already done (a resumed run's).
    pub start: u64,
    /// The step the run stops after (`stop_after`, or its total).
    pub end: u64,
    /// The run's total number of steps.
    pub steps: u64,
    /// Input tokens per step (B·T), for throughput.
    pub tokens_per_step: usize,
    /// The checkpoint folder.
    pub out: PathBuf,
    /// Things worth telling the user (a resumed run on another thread count).
    pub notes: Vec<String>,
}

/// How a run reports as it goes.
pub trait Watch {
    /// Once, before the first step.
    fn start(&mut self, _info: &RunInfo) {}
    /// After each step, with its log line.
    fn step(&mut self, _log: &StepLog) {}
}

/// A [`Watch`] that keeps nothing.
impl Watch for () {}

/// A finished run: where it started, where it stopped, its last step.
#[derive(Clone, Debug)]
pub struct Summary {
    pub info: RunInfo,
    /// Steps done when the run stopped.
    pub step: u64,
    pub last: Option<StepLog>,
}

/// What a fresh or resumed run starts from.
struct Start {
    spec: RunSpec,
    state: Option<checkpoint::TrainerState>,
    out: PathBuf,
    notes: Vec<String>,
}

/// The spec, the checkpoint's state and the output folder of `request`; a resumed
/// folder is locked (into `locks`) before it is read.
fn start(request: &RunRequest, locks: &mut Vec<Lock>) -> Result<Start> {
    let Some(dir) = &request.resume else {
        return Ok(Start {
            spec: RunSpec {
                source: Source::of(request),
                threads: request.threads,
                log_json: request.log_json.clone(),
            },
            state: None,
            out: request.out.clone().expect("checked: `out` is given"),
            notes: Vec::new(),
        });
    };
    // opening it may complete a save a crash interrupted: it is locked first
    if checkpoint::exists(dir) {
        let lock =
            Lock::acquire(dir).map_err(|e| e.within(format!("`resume` {}", dir.display())))?;
        locks.push(lock);
    }
    let within = |e: Error| e.within(format!("resuming from {}", dir.display()));
    let state = checkpoint::open(dir).map_err(within)?;
    let mut spec = RunSpec::stored(&state.config, dir)?;
    if let Some(data) = &request.data {
        match &mut spec.source {
            Source::Init { data: d, .. } => *d = data.clone(),
            _ => {
                return Err(Error::request(format!(
                "`data` with `resume` replaces the batches file of an `init` run; {} is not one",
                dir.display()
            )))
            }
        }
    }
    let mut notes = Vec::new();
    if let Some(t) = request.threads {
        if spec.threads != Some(t) {
            notes.push(format!(
                "{} ran with {} threads; with {t} the rest of the run is deterministic but not bit-identical to an uninterrupted one",
                dir.display(),
                spec.threads.map_or("all".to_string(), |n| n.to_string())
            ));
        }
        spec.threads = Some(t);
    }
    if request.log_json.is_some() {
        spec.log_json = request.log_json.clone();
    }
    let out = request.out.clone().unwrap_or_else(|| dir.clone());
    if out != *dir && checkpoint::exists(&out) {
        return Err(Error::request(format!(
            "{} already holds a training checkpoint; `out` of a resumed run must be its own folder or a new one",
            out.display()
        )));
    }
    Ok(Start {
        spec,
        state: Some(state),
        out,
        notes,
    })
}

/// A new model for a task or text run, sized against memory before it is made.
fn new_model(request: &RunRequest, source: &Source, (vocab, len): (usize, usize)) -> Result<Model> {
    let seed = request.seed.unwrap_or(0);
    let batch = source
        .batch_size()
        .expect("tasks and text have a batch size");
    let network = request.arch.unwrap_or(Network::Transformer);
    let need = match network {
        Network::Transformer => {
            estimate::transformer_bytes(&arch(request, vocab, len)?, batch, len)
        }
        _ => estimate::recurrent_bytes(
            vocab,
            request.d_model.unwrap_or(64),
            request.layers.unwrap_or(1),
            batch,
            len,
        ),
    };
    memory::check(
        need,
        &format!("training a model over {vocab} symbols on batches of {batch} × {len} tokens (make `d_model`, `layers`, `batch_size`, `seq_len`, `task_length` or `symbols` smaller)"),
    )?;
    match network {
        Network::Transformer => Ok(Model::Transformer(Box::new(Transformer::new(
            &arch(request, vocab, len)?,
            seed,
        )?))),
        _ => {
            let separator = source.task()?.and_then(|t| t.separator());
            recurrent(request, network, vocab, separator, seed)
        }
    }
}

/// Runs `request` to its end (or `stop_after`), telling `watch` as it goes.
pub fn run(request: &RunRequest, watch: &mut dyn Watch) -> Result<Summary> {
    request.check()?;
    // dropped last: the folders stay locked until the run has returned
    let mut locks = Vec::new();
    let Start {
        spec,
        state,
        out,
        mut notes,
    } = start(request, &mut locks)?;
    crate::ops::pool::use_threads(spec.threads)?;
    let (mut data, shape) = spec.source.open()?;
    let (mut model, config) = match (&state, &spec.source) {
        (Some(_), _) => (
            Model::load(request.resume.as_ref().expect("resuming"))?,
            None,
        ),
        (None, Source::Init { init, .. }) => (Model::init(init)?, Some(train_config(request))),
        (None, source) => {
            let shape = shape.expect("tasks and text give a shape");
            (
                new_model(request, source, shape)?,
                Some(train_config(request)),
            )
        }
    };
    // what the loaded folder says that qkv reads differently from transformers
    if let Model::Transformer(t) = &model {
        notes.extend(t.load_warnings.iter().cloned());
    }
    let (vocab, max_len) = model.limits();
    // a new task or text model was sized before it was made; a loaded one is sized
    // here, against the batches it will see
    if let (Model::Transformer(t), true) = (
        &model,
        config.is_none() || matches!(spec.source, Source::Init { .. }),
    ) {
        let tokens = data.tokens_per_batch();
        memory::check(
            estimate::transformer_bytes(&t.arch, 1, tokens),
            &format!("training this model on batches of {tokens} tokens"),
        )?;
    }
    let run_json = serde_json::to_value(&spec).expect("a RunSpec serialises");
    let mut trainer = match (state, config) {
        (Some(state), _) => {
            let dir = request.resume.as_ref().expect("resuming");
            let mut t = Trainer::resume(model.trainable(), dir, state)
                .map_err(|e| e.within(format!("resuming from {}", dir.display())))?;
            t.set_run_config(run_json);
            if let Some(steps) = request.steps {
                t.set_steps(steps)?;
            }
            t
        }
        (None, Some(cfg)) => Trainer::new(model.trainable(), cfg, run_json)?,
        (None, None) => unreachable!("a fresh run has a configuration"),
    };
    let steps = trainer.config().steps;
    data.check(vocab, max_len, steps)
        .map_err(|e| match &spec.source {
            Source::Init { init, data } => e.within(format!(
                "`data` {} does not fit the model of `init` {} (vocabulary {vocab}, {} positions)",
                data.display(),
                init.display(),
                max_len.map_or("unlimited".into(), |n| n.to_string())
            )),
            _ => e.within("the data does not fit the model"),
        })?;
    let start = trainer.step();
    if start >= steps {
        return Err(Error::request(format!(
            "{} has already run all {steps} steps; give `steps` to extend a constant-lr run",
            request.resume.as_ref().unwrap_or(&out).display()
        )));
    }
    let cfg = trainer.config().clone();
    let eval = data.eval_batches(cfg.seed, cfg.eval_batches)?;
    if let Some(log) = &spec.log_json {
        crate::io::files::check_output(log).map_err(|e| e.within("`log_json`"))?;
    }

    // ---- everything is checked: the output folder is claimed, then written ----------
    if request.resume.as_ref() != Some(&out) {
        let lock = Lock::claim(&out, request.overwrite)
            .map_err(|e| e.within(format!("`out` {}", out.display())))?;
        locks.push(lock);
    }
    let mut log = match &spec.log_json {
        Some(p) => Some(open_log(p, start)?),
        None => None,
    };
    match &spec.source {
        Source::Init { init, .. } => copy_tokenizer_files(init, &out)?,
        Source::Text { .. } => write_byte_tokenizer(&out, max_len)?,
        Source::Task { .. } => {}
    }

    let info = RunInfo {
        start,
        end: request.stop_after.map_or(steps, |s| s.min(steps)),
        steps,
        tokens_per_step: data.tokens_per_batch(),
        out: out.clone(),
        notes,
    };
    watch.start(&info);
    let mut last: Option<StepLog> = None;
    let mut log_err: Option<std::io::Error> = None;
    let result = trainer.run(
        data.as_mut(),
        &eval,
        RunOptions {
            out: Some(&out),
            stop_after: request.stop_after,
        },
        &mut |s: &StepLog| {
            if let Some(f) = log.as_mut() {
                use std::io::Write;
                let line = serde_json::to_string(s).expect("a StepLog serialises");
                if let Err(e) = writeln!(f, "{line}").and_then(|_| f.flush()) {
                    log_err.get_or_insert(e);
                }
            }
            watch.step(s);
            last = Some(s.clone());
        },
    );
    if let (Some(e), Some(p)) = (log_err, &spec.log_json) {
        return Err(Error::io(p, e));
    }
    if let Err(e) = result {
        let kept = match checkpoint::open(&out) {
            Ok(s) => format!(
                "the last good checkpoint (after step {}) is in {}",
                s.step,
                out.display()
            ),
            Err(_) => "no checkpoint was written".to_string(),
        };
        return Err(e.within(kept));
    }
    Ok(Summary {
        step: trainer.step(),
        info,
        last,
    })
}
