//! The experiments that measure the articles' claims (`qkv experiment NAME`), with
//! their results as the JSON document the CLI writes, parsed into Python objects.

use pyo3::prelude::*;

use crate::errors::OrPy;
use crate::ints::Int;

/// Runs one experiment and returns its report: ``name``, ``claim`` (``zh`` and ``en``),
/// ``verdict`` (``"supported"``, …), the ``rule`` that turned the numbers into the
/// verdict, ``metrics``, and each figure's data under ``figures``.
///
/// Args:
///     name: one of :data:`EXPERIMENTS`.
///     quick: the small version (at most about two minutes on two cores).
///     seed: seed of the data and of every model's initial weights.
///     progress: print a line to stderr per finished unit of work.
///     models: model folders the ``precision`` experiment compares as well (as
///         ``qkv experiment precision --model DIR``); other experiments refuse them.
///
/// Experiments that measure memory leave that metric out here: only the ``qkv``
/// command counts its allocations.
#[pyfunction]
#[pyo3(signature = (name, *, quick=false, seed=Int::of(0), progress=false, models=Vec::new()))]
#[pyo3(text_signature = "(name, *, quick=False, seed=0, progress=False, models=())")]
pub fn experiment<'py>(
    py: Python<'py>,
    name: &str,
    quick: bool,
    seed: Int,
    progress: bool,
    models: Vec<std::path::PathBuf>,
) -> PyResult<Bound<'py, PyAny>> {
    if !models.is_empty() && !["precision", "attribution"].contains(&name) {
        return Err(pyo3::exceptions::PyValueError::new_err(format!(
            "models: read by the precision and attribution experiments only, not by `{name}`"
        )));
    }
    let options = qkv::experiments::Options {
        quick,
        seed: seed.seed("seed")?,
        memory: None,
        checkpoints: &models,
    };
    let report = py
        .detach(|| {
            qkv::experiments::run(name, &options, &mut |line| {
                if progress {
                    eprintln!("{name}: {line}");
                }
            })
        })
        .or_py()?;
    let json = serde_json::to_string(&report).expect("a report serialises");
    py.import("json")?.call_method1("loads", (json,))
}
