//! NumPy arrays in and out. An input that is already an aligned, C-contiguous array of
//! the right dtype is read in place (no copy); any other view of the right dtype is
//! copied once by `numpy.require`. A wrong dtype is a `TypeError` naming the argument;
//! shapes are checked by the library, whose `ValueError` names the tensor.

use numpy::{
    PyArray, PyArrayDescrMethods, PyArrayDyn, PyArrayMethods, PyReadonlyArrayDyn, PyUntypedArray,
    PyUntypedArrayMethods,
};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use rayon::prelude::*;

/// A read-only array of `T` borrowed from Python, C-contiguous and aligned.
pub struct In<'py, T: numpy::Element> {
    array: PyReadonlyArrayDyn<'py, T>,
}

impl<'py, T: numpy::Element> In<'py, T> {
    pub fn shape(&self) -> &[usize] {
        self.array.shape()
    }

    pub fn data(&self) -> &[T] {
        self.array
            .as_slice()
            .expect("numpy.require made the array C-contiguous")
    }
}

/// `obj` as an ndarray, or a `TypeError` saying what `name` must be.
fn ndarray<'py>(
    obj: &Bound<'py, PyAny>,
    name: &str,
    what: &str,
) -> PyResult<Bound<'py, PyUntypedArray>> {
    obj.cast::<PyUntypedArray>().cloned().map_err(|_| {
        PyTypeError::new_err(format!(
            "`{name}` must be a numpy.ndarray of {what}, got {}",
            type_name(obj)
        ))
    })
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map_or_else(|_| "an object".to_string(), |n| n.to_string())
}

/// `array` aligned and C-contiguous: itself when it is, else numpy's copy.
fn contiguous<'py, T: numpy::Element>(array: Bound<'py, PyUntypedArray>) -> PyResult<In<'py, T>> {
    let py = array.py();
    let ready = array.is_c_contiguous() && array.getattr("flags")?.getattr("aligned")?.extract()?;
    let array = match ready {
        true => array,
        false => py
            .import("numpy")?
            .call_method1("require", (array, py.None(), "CA"))?
            .cast_into::<PyUntypedArray>()?,
    };
    let typed = array.cast_into::<PyArrayDyn<T>>()?;
    let array = typed
        .try_readonly()
        .map_err(|e| PyValueError::new_err(format!("array is being written elsewhere: {e}")))?;
    Ok(In { array })
}

/// A float32 array argument.
pub fn floats<'py>(obj: &Bound<'py, PyAny>, name: &str) -> PyResult<In<'py, f32>> {
    let array = ndarray(obj, name, "float32")?;
    let dtype = array.dtype();
    if !dtype.is_equiv_to(&numpy::dtype::<f32>(obj.py())) {
        return Err(PyTypeError::new_err(format!(
            "`{name}` must be a float32 array, got dtype {dtype}; convert it with .astype(numpy.float32)"
        )));
    }
    contiguous(array)
}

/// A bool array argument; `meaning` says what `True` means.
pub fn bools<'py>(obj: &Bound<'py, PyAny>, name: &str, meaning: &str) -> PyResult<In<'py, bool>> {
    let array = ndarray(obj, name, "bool")?;
    let dtype = array.dtype();
    if !dtype.is_equiv_to(&numpy::dtype::<bool>(obj.py())) {
        return Err(PyTypeError::new_err(format!(
            "`{name}` must be a bool array ({meaning}), got dtype {dtype}"
        )));
    }
    contiguous(array)
}

/// Any integer (or bool) array, or nested lists of ints, as int64 with its shape.
pub fn signed_ints(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<(Vec<usize>, Vec<i64>)> {
    let py = obj.py();
    let array = py
        .import("numpy")?
        .call_method1("asarray", (obj,))
        .map_err(|e| PyTypeError::new_err(format!("`{name}` must be an integer array: {e}")))?;
    let array = ndarray(&array, name, "integers")?;
    let kind = array.dtype().kind();
    if !matches!(kind, b'i' | b'u' | b'b') {
        return Err(PyTypeError::new_err(format!(
            "`{name}` must be an integer array, got dtype {}",
            array.dtype()
        )));
    }
    let shape = array.shape().to_vec();
    let as_i64 = array
        .call_method1("astype", ("int64",))?
        .cast_into::<PyUntypedArray>()?;
    let read: In<'_, i64> = contiguous(as_i64)?;
    Ok((shape, read.data().to_vec()))
}

/// Token ids, positions or a 0/1 mask: [`signed_ints`] that must not be negative.
pub fn ints(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<(Vec<usize>, Vec<usize>)> {
    let (shape, values) = signed_ints(obj, name)?;
    let values = values
        .iter()
        .enumerate()
        .map(|(i, &x)| {
            usize::try_from(x).map_err(|_| {
                PyValueError::new_err(format!(
                    "`{name}` holds a negative value ({x}) at flat index {i}"
                ))
            })
        })
        .collect::<PyResult<Vec<usize>>>()?;
    Ok((shape, values))
}

/// A float32 ndarray of `shape` that takes over `data` without copying it.
pub fn out<'py>(
    py: Python<'py>,
    data: Vec<f32>,
    shape: &[usize],
) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
    PyArray::from_vec(py, data).reshape(shape.to_vec())
}

/// `[A, B, C, D]` → `[A, C, B, D]`: the SDPA layout `[B, H, T, D]` to qkv's
/// `[B, T, H, D]` and back (the same swap both ways). Each output row `[B, D]` of one
/// (a, c) is gathered on the thread pool: the copy's page faults and reads are
/// shared among its threads.
pub fn swap_middle(data: &[f32], [a, b, c, d]: [usize; 4]) -> Vec<f32> {
    let mut out = vec![0.0; data.len()];
    if d == 0 || b == 0 {
        return out;
    }
    out.par_chunks_mut(b * d).enumerate().for_each(|(ac, row)| {
        let (ai, ci) = (ac / c, ac % c);
        for (bi, dst) in row.chunks_exact_mut(d).enumerate() {
            let from = ((ai * b + bi) * c + ci) * d;
            dst.copy_from_slice(&data[from..from + d]);
        }
    });
    debug_assert_eq!(out.len(), a * b * c * d);
    out
}
