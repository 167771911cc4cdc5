//! Integer arguments of any size. PyO3's own conversion to `usize` or `i64` raises
//! `OverflowError` for `2**70` or `-1`, naming no argument; an [`Int`] takes any Python
//! int, and the function converts it with the argument's name, so that an integer out
//! of range is a `ValueError` that says which argument and what it must be.

use pyo3::exceptions::{PyOverflowError, PyValueError};
use pyo3::prelude::*;

/// A Python int as given: its value when it fits 128 bits, else its digits.
pub struct Int(Result<i128, String>);

impl<'a, 'py> FromPyObject<'a, 'py> for Int {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        match obj.extract::<i128>() {
            Ok(v) => Ok(Int(Ok(v))),
            Err(e) if e.is_instance_of::<PyOverflowError>(obj.py()) => {
                Ok(Int(Err(obj.str()?.to_string())))
            }
            // not an int at all: PyO3's TypeError, which names the argument
            Err(e) => Err(e),
        }
    }
}

impl Int {
    /// A default value of a signature.
    pub const fn of(v: i128) -> Int {
        Int(Ok(v))
    }

    /// The value as a `usize` of at least `min`; else a ValueError naming `name`.
    pub fn at_least(&self, name: &str, min: usize) -> PyResult<usize> {
        let bad = |got: &dyn std::fmt::Display| {
            PyValueError::new_err(format!(
                "invalid `{name}`: must be an integer from {min} to {}, got {got}",
                usize::MAX
            ))
        };
        match &self.0 {
            Ok(v) => usize::try_from(*v)
                .ok()
                .filter(|&n| n >= min)
                .ok_or_else(|| bad(v)),
            Err(digits) => Err(bad(digits)),
        }
    }

    /// A count: the value as a `usize` of at least 0.
    pub fn count(&self, name: &str) -> PyResult<usize> {
        self.at_least(name, 0)
    }

    /// The value as a `u64` (a seed); else a ValueError naming `name`.
    pub fn seed(&self, name: &str) -> PyResult<u64> {
        let bad = |got: &dyn std::fmt::Display| {
            PyValueError::new_err(format!(
                "invalid `{name}`: must be an integer from 0 to {}, got {got}",
                u64::MAX
            ))
        };
        match &self.0 {
            Ok(v) => u64::try_from(*v).map_err(|_| bad(v)),
            Err(digits) => Err(bad(digits)),
        }
    }
}

/// [`Int::count`] of an optional argument.
pub fn count(value: Option<Int>, name: &str) -> PyResult<Option<usize>> {
    value.map(|v| v.count(name)).transpose()
}

/// Each element of a list of ints as a count, the list named `name` in the error.
pub fn counts(values: Vec<Int>, name: &str) -> PyResult<Vec<usize>> {
    values.iter().map(|v| v.count(name)).collect()
}
