//! qkv for Python: attention, its backward, position encodings, checkpoints and the
//! experiments, over NumPy arrays. This is the native module `qkv._qkv`; the package
//! `qkv` (python/qkv) re-exports it with type stubs.
//!
//! Every error the library can raise arrives as a Python exception (`errors.rs`);
//! inputs are checked before any kernel runs, so no Rust panic is reachable from bad
//! arguments.

mod arrays;
mod attention;
mod attribute;
mod classify;
mod errors;
mod experiment;
mod generate;
mod ints;
mod methods;
mod model;
mod position;
mod train;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// Sets the number of threads qkv's kernels use (default: one per core). Call it before
/// the first computation; the pool cannot be resized once it has started.
#[pyfunction]
fn set_num_threads(n: ints::Int) -> PyResult<()> {
    let n = n.at_least("n", 1)?;
    // qkv's kernels run on rayon's global pool (the same rayon-core as the library's)
    rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build_global()
        .map_err(|e| {
            PyValueError::new_err(format!(
                "cannot set {n} threads: {e} (call set_num_threads before the first computation)"
            ))
        })
}

/// The number of threads qkv's kernels use.
#[pyfunction]
fn get_num_threads() -> usize {
    rayon::current_num_threads()
}

/// A chat-template worker's loop on this process's stdin and stdout, which a model's
/// ``apply_chat_template`` starts as ``python -c "import qkv._qkv as q;
/// q._serve_renders()"``: a template renders there, its memory and time bounded apart
/// from the caller's process (``qkv::text::chat_process``).
#[pyfunction]
fn _serve_renders(py: Python<'_>) -> PyResult<()> {
    py.detach(|| {
        qkv::text::chat_process::serve_renders(std::io::stdin().lock(), std::io::stdout().lock())
    })
    .map_err(|e| pyo3::exceptions::PyOSError::new_err(e.to_string()))
}

#[pymodule]
fn _qkv(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("EXPERIMENTS", qkv::experiments::NAMES.to_vec())?;
    m.add_function(wrap_pyfunction!(attention::attention, m)?)?;
    m.add_function(wrap_pyfunction!(attention::attention_backward, m)?)?;
    m.add_function(wrap_pyfunction!(model::load, m)?)?;
    m.add_class::<model::Model>()?;
    m.add_class::<generate::Stream>()?;
    m.add_function(wrap_pyfunction!(position::sinusoidal_table, m)?)?;
    m.add_function(wrap_pyfunction!(position::alibi_slopes, m)?)?;
    m.add_function(wrap_pyfunction!(position::relative_position_bucket, m)?)?;
    m.add_class::<position::Rope>()?;
    m.add_function(wrap_pyfunction!(experiment::experiment, m)?)?;
    m.add_function(wrap_pyfunction!(train::train, m)?)?;
    m.add_function(wrap_pyfunction!(set_num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(get_num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(_serve_renders, m)?)?;
    Ok(())
}
