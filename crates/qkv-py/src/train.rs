//! `qkv.train`: the library's training run (`qkv::train::run`) with the keywords of
//! `qkv train`'s flags, returning the steps' log lines as dicts.

use std::path::PathBuf;
use std::str::FromStr;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use qkv::train::run::{RunInfo, RunRequest, Watch};
use qkv::train::trainer::StepLog;
use qkv::weights::DType;

use crate::errors::OrPy;
use crate::ints::Int;

/// A keyword's value as the request's field: `None` leaves the field unset.
trait Setting: Sized {
    fn read(value: &Bound<'_, PyAny>, name: &str) -> PyResult<Self>;
}

impl Setting for PathBuf {
    fn read(value: &Bound<'_, PyAny>, name: &str) -> PyResult<Self> {
        value.extract().map_err(|_| {
            PyTypeError::new_err(format!("`{name}` must be a path (str or os.PathLike)"))
        })
    }
}

impl Setting for String {
    fn read(value: &Bound<'_, PyAny>, name: &str) -> PyResult<Self> {
        value
            .extract()
            .map_err(|_| PyTypeError::new_err(format!("`{name}` must be a str")))
    }
}

impl Setting for usize {
    fn read(value: &Bound<'_, PyAny>, name: &str) -> PyResult<Self> {
        value.extract::<Int>()?.count(name)
    }
}

impl Setting for u64 {
    fn read(value: &Bound<'_, PyAny>, name: &str) -> PyResult<Self> {
        value.extract::<Int>()?.seed(name)
    }
}

impl Setting for f64 {
    fn read(value: &Bound<'_, PyAny>, name: &str) -> PyResult<Self> {
        value
            .extract()
            .map_err(|_| PyTypeError::new_err(format!("`{name}` must be a number")))
    }
}

impl Setting for bool {
    fn read(value: &Bound<'_, PyAny>, name: &str) -> PyResult<Self> {
        value
            .extract()
            .map_err(|_| PyTypeError::new_err(format!("`{name}` must be True or False")))
    }
}

impl Setting for DType {
    fn read(value: &Bound<'_, PyAny>, name: &str) -> PyResult<Self> {
        let s = String::read(value, name)?;
        s.parse()
            .map_err(|e: qkv::Error| PyValueError::new_err(format!("invalid `{name}`: {e}")))
    }
}

/// A choice by its name (`arch="rnn"`, `style="llama"`).
fn choice<T: FromStr<Err = String>>(value: &Bound<'_, PyAny>, name: &str) -> PyResult<T> {
    let s: String = value
        .extract()
        .map_err(|_| PyTypeError::new_err(format!("`{name}` must be a str")))?;
    s.parse()
        .map_err(|e: String| PyValueError::new_err(format!("invalid `{name}`: {e}")))
}

/// The request the keywords `settings` state; `progress` is the caller's, not the run's.
fn request(settings: Option<&Bound<'_, PyDict>>) -> PyResult<(RunRequest, bool)> {
    let mut r = RunRequest::default();
    let mut progress = false;
    let Some(settings) = settings else {
        return Ok((r, progress));
    };
    for (key, value) in settings.iter() {
        let name: String = key.extract()?;
        if value.is_none() {
            continue;
        }
        let v = &value;
        macro_rules! read {
            ($($field:ident),+ ; $($choice:ident),+ ; $($flag:ident),+) => {
                match name.as_str() {
                    $(stringify!($field) => r.$field = Some(Setting::read(v, &name)?),)+
                    $(stringify!($choice) => r.$choice = Some(choice(v, &name)?),)+
                    $(stringify!($flag) => r.$flag = Setting::read(v, &name)?,)+
                    "progress" => progress = Setting::read(v, &name)?,
                    other => {
                        return Err(PyTypeError::new_err(format!(
                            "train() got an unexpected keyword argument '{other}'"
                        )))
                    }
                }
            };
        }
        read!(
            init, data, task, text, resume, task_length, symbols, queries, distance, seq_len,
            val_fraction, batch_size, d_model, layers, heads, kv_heads, ffn, steps, lr,
            warmup, min_lr, weight_decay, beta1, beta2, eps, clip, dtype, seed, threads, eval_every,
            eval_batches, save_every, stop_after, out, log_json;
            arch, style, position, norm, ffn_kind, decay;
            post_norm, constant_lr, overwrite
        );
    }
    Ok((r, progress))
}

/// Every step's log line, and with `progress` the CLI's evaluation lines on stderr.
struct Lines {
    progress: bool,
    steps: Vec<StepLog>,
}

impl Watch for Lines {
    fn start(&mut self, info: &RunInfo) {
        if self.progress {
            info.notes.iter().for_each(|n| eprintln!("note: {n}"));
        }
    }

    fn step(&mut self, log: &StepLog) {
        if let (true, Some(loss), Some(acc)) = (self.progress, log.eval_loss, log.eval_accuracy) {
            eprintln!(
                "after {} steps: eval loss {loss:.4}, token accuracy {:.2}%",
                log.step + 1,
                acc * 100.0
            );
        }
        self.steps.push(log.clone());
    }
}

/// Trains a model as ``qkv train`` does, with its flags as keywords (``d_model=64`` for
/// ``--d-model 64``): start from a folder (``init`` with ``data``), a built-in
/// ``task``, a ``text`` file, or ``resume`` a checkpoint; ``out`` is the checkpoint
/// folder. Choices are strings as on the command line (``arch="rnn-attention"``,
/// ``style="llama"``, ``position="rope"``).
///
/// Args:
///     progress: print the evaluation lines to stderr as the CLI does.
///
/// Returns:
///     One dict per step done, the lines ``--log-json`` writes: ``step``, ``loss``
///     (before the update), ``lr``, ``grad_norm``, and ``eval_loss`` /
///     ``eval_accuracy`` on evaluation steps.
///
/// Raises:
///     ValueError: settings that cannot go together, or a failed run (naming the last
///         good checkpoint). MemoryError: a model larger than the machine's memory.
#[pyfunction]
#[pyo3(signature = (**settings))]
#[pyo3(
    text_signature = "(*, init=None, data=None, task=None, text=None, resume=None, task_length=None, symbols=None, queries=None, distance=None, seq_len=None, val_fraction=None, batch_size=None, arch=None, style=None, d_model=None, layers=None, heads=None, kv_heads=None, ffn=None, position=None, norm=None, post_norm=False, ffn_kind=None, steps=None, lr=None, constant_lr=False, warmup=None, min_lr=None, weight_decay=None, beta1=None, beta2=None, eps=None, decay=None, clip=None, dtype=None, seed=None, threads=None, eval_every=None, eval_batches=None, save_every=None, stop_after=None, out=None, overwrite=False, log_json=None, progress=False)"
)]
pub fn train<'py>(
    py: Python<'py>,
    settings: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyList>> {
    let (request, progress) = request(settings)?;
    let mut lines = Lines {
        progress,
        steps: Vec::new(),
    };
    py.detach(|| qkv::train::run::run(&request, &mut lines))
        .or_py()?;
    let json = py.import("json")?;
    let dicts = lines
        .steps
        .iter()
        .map(|s| {
            let text = serde_json::to_string(s).expect("a StepLog serialises");
            json.call_method1("loads", (text,))
        })
        .collect::<PyResult<Vec<_>>>()?;
    PyList::new(py, dicts)
}
