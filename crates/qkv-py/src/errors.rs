//! qkv's errors as Python exceptions, with the library's message unchanged (the CLI
//! prints the same text): bad values and shapes are `ValueError`, files `OSError`
//! (`FileNotFoundError` for a missing one), work larger than memory `MemoryError`.

use pyo3::exceptions::{PyFileNotFoundError, PyMemoryError, PyOSError, PyValueError};
use pyo3::PyErr;

pub fn to_py(e: qkv::Error) -> PyErr {
    let message = e.to_string();
    match e {
        qkv::Error::Io { error, .. } if error.kind() == std::io::ErrorKind::NotFound => {
            PyFileNotFoundError::new_err(message)
        }
        qkv::Error::Io { .. } => PyOSError::new_err(message),
        qkv::Error::Memory { .. } => PyMemoryError::new_err(message),
        _ => PyValueError::new_err(message),
    }
}

/// `?` on a library result inside a `#[pyfunction]`.
pub trait OrPy<T> {
    fn or_py(self) -> pyo3::PyResult<T>;
}

impl<T> OrPy<T> for qkv::Result<T> {
    fn or_py(self) -> pyo3::PyResult<T> {
        self.map_err(to_py)
    }
}
