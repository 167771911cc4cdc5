//! `Tensor`: a shape and a contiguous row-major `Vec<f32>`. Nothing more: no strides,
//! no autograd, no device. Kernels that need strided views take slices plus strides.

use crate::error::{Error, Result};
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Clone)]
pub struct Tensor {
    shape: Vec<usize>,
    data: Vec<f32>,
    /// Stamp of the contents: new on creation and on every mutable access, so a copy
    /// derived from the data (a packed weight) can tell whether it is still current.
    generation: u64,
}

/// Shape and values: the generation stamp is bookkeeping.
impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tensor")
            .field("shape", &self.shape)
            .field("data", &self.data)
            .finish()
    }
}

/// Tensors compare by shape and values; the generation stamp is bookkeeping.
impl PartialEq for Tensor {
    fn eq(&self, other: &Self) -> bool {
        self.shape == other.shape && self.data == other.data
    }
}

/// A stamp no tensor has had before.
fn fresh_generation() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

impl Tensor {
    /// Wraps `data` as a tensor of `shape`; the element count must match.
    pub fn new(shape: &[usize], data: Vec<f32>) -> Result<Self> {
        let n = shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
        if n != Some(data.len()) {
            return Err(Error::invalid(
                "tensor data",
                match n {
                    Some(n) => format!("shape {shape:?} needs {n} elements, got {}", data.len()),
                    None => format!("shape {shape:?} has more elements than memory can address"),
                },
            ));
        }
        Ok(Tensor {
            shape: shape.to_vec(),
            data,
            generation: fresh_generation(),
        })
    }

    pub fn zeros(shape: &[usize]) -> Self {
        Tensor {
            shape: shape.to_vec(),
            data: vec![0.0; shape.iter().product()],
            generation: fresh_generation(),
        }
    }

    /// Fills each element from its flat row-major index.
    pub fn from_fn(shape: &[usize], f: impl FnMut(usize) -> f32) -> Self {
        let n: usize = shape.iter().product();
        Tensor {
            shape: shape.to_vec(),
            data: (0..n).map(f).collect(),
            generation: fresh_generation(),
        }
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    pub fn numel(&self) -> usize {
        self.data.len()
    }

    pub fn data(&self) -> &[f32] {
        &self.data
    }

    pub fn data_mut(&mut self) -> &mut [f32] {
        self.generation = fresh_generation();
        &mut self.data
    }

    /// The stamp of the current contents: it changes whenever they may have (every
    /// [`Tensor::data_mut`]), and no two tensors' contents share one unless one is a
    /// clone of the other, made since the last change.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn into_data(self) -> Vec<f32> {
        self.data
    }

    /// Size of the last axis (1 for a scalar).
    pub fn last_dim(&self) -> usize {
        self.shape.last().copied().unwrap_or(1)
    }

    /// Same data, new shape with the same element count.
    pub fn reshape(self, shape: &[usize]) -> Result<Self> {
        Tensor::new(shape, self.data)
    }

    /// Checks the shape against `expected`, where `None` accepts any size on that axis.
    pub fn expect_shape(&self, name: &str, expected: &[Option<usize>]) -> Result<()> {
        let ok = self.shape.len() == expected.len()
            && self
                .shape
                .iter()
                .zip(expected)
                .all(|(&got, want)| want.is_none_or(|w| w == got));
        if ok {
            return Ok(());
        }
        let want: Vec<String> = expected
            .iter()
            .map(|w| w.map_or_else(|| "_".to_string(), |v| v.to_string()))
            .collect();
        Err(Error::shape(
            name,
            format!("[{}]", want.join(", ")),
            &self.shape,
        ))
    }

    /// Checks a weight table: two dimensions, neither empty. `rows` and `cols` name them
    /// in the error (`"[out ≥ 1, in ≥ 1]"`).
    pub fn expect_matrix(&self, name: &str, [rows, cols]: [&str; 2]) -> Result<()> {
        self.expect_shape(name, &[None, None])?;
        if self.numel() == 0 {
            return Err(Error::shape(
                name,
                format!("[{rows} ≥ 1, {cols} ≥ 1]"),
                &self.shape,
            ));
        }
        Ok(())
    }

    /// Errors on the first NaN or infinity, naming the tensor.
    pub fn check_finite(&self, name: &str) -> Result<()> {
        check_finite(name, &self.data)
    }

    /// self += other, elementwise: a residual connection. Errors unless both have the
    /// same shape.
    pub fn add_assign(&mut self, other: &Tensor) -> Result<()> {
        if self.shape != other.shape {
            return Err(Error::shape(
                "add_assign operand",
                format!("{:?}, the shape it is added to", self.shape),
                &other.shape,
            ));
        }
        for (a, &b) in self.data_mut().iter_mut().zip(&other.data) {
            *a += b;
        }
        Ok(())
    }

    /// Largest absolute elementwise difference to `other` (same shape assumed).
    pub fn max_abs_diff(&self, other: &Tensor) -> f32 {
        self.data
            .iter()
            .zip(&other.data)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max)
    }
}

/// Errors on the first NaN or infinity in `data`, naming it `name`.
pub fn check_finite(name: &str, data: &[f32]) -> Result<()> {
    match first_non_finite(data) {
        None => Ok(()),
        Some(index) => Err(Error::NonFinite {
            tensor: name.to_string(),
            index,
            value: data[index],
        }),
    }
}

/// Index of the first NaN or infinity in `data`. Each chunk is scanned without an
/// early exit, a loop the compiler vectorises (an element-by-element search with an
/// exit runs at one element per cycle and was 9% of a short attention call); only a
/// chunk that holds one is searched element by element.
pub fn first_non_finite(data: &[f32]) -> Option<usize> {
    const CHUNK: usize = 512;
    // all exponent bits set: an infinity or a NaN
    const EXPONENT: u32 = 0x7f80_0000;
    data.chunks(CHUNK).enumerate().find_map(|(c, chunk)| {
        let any = chunk.iter().fold(0u32, |any, x| {
            any | u32::from(x.to_bits() & EXPONENT == EXPONENT)
        });
        if any == 0 {
            return None;
        }
        chunk
            .iter()
            .position(|x| !x.is_finite())
            .map(|i| c * CHUNK + i)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_rejects_wrong_count() {
        assert!(Tensor::new(&[2, 3], vec![0.0; 5]).is_err());
        assert_eq!(Tensor::new(&[2, 3], vec![0.0; 6]).unwrap().numel(), 6);
    }

    #[test]
    fn expect_shape_names_tensor() {
        let t = Tensor::zeros(&[2, 3]);
        assert!(t.expect_shape("x", &[Some(2), None]).is_ok());
        let err = t
            .expect_shape("x", &[Some(3), None])
            .unwrap_err()
            .to_string();
        assert!(err.contains("`x`") && err.contains("[3, _]"), "{err}");
    }

    #[test]
    fn add_assign_adds_elementwise() {
        let mut a = Tensor::new(&[2, 2], vec![1.0, 2.0, 3.0, 4.0]).unwrap();
        a.add_assign(&Tensor::new(&[2, 2], vec![0.5, -2.0, 0.0, 1.0]).unwrap())
            .unwrap();
        assert_eq!(a.data(), &[1.5, 0.0, 3.0, 5.0]);
    }

    #[test]
    fn add_assign_rejects_other_shapes() {
        let err = Tensor::zeros(&[2, 3])
            .add_assign(&Tensor::zeros(&[3, 2]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("add_assign operand") && err.contains("[2, 3]"),
            "{err}"
        );
    }

    #[test]
    fn first_non_finite_finds_the_first_in_any_chunk() {
        let mut data = vec![1.5f32; 3000];
        assert_eq!(first_non_finite(&data), None);
        for (at, bad) in [
            (0, f32::NAN),
            (511, f32::INFINITY),
            (512, f32::NEG_INFINITY),
            (2999, f32::NAN),
        ] {
            data[at] = bad;
            assert_eq!(first_non_finite(&data), Some(at), "{bad} at {at}");
            data[2000] = f32::NAN;
            assert_eq!(
                first_non_finite(&data),
                Some(at.min(2000)),
                "the first of two"
            );
            data[2000] = 1.5;
            data[at] = f32::MAX;
        }
        assert_eq!(first_non_finite(&data), None, "f32::MAX is finite");
    }

    #[test]
    fn check_finite_reports_index() {
        let t = Tensor::new(&[3], vec![1.0, f32::NAN, 2.0]).unwrap();
        let err = t.check_finite("q").unwrap_err().to_string();
        assert!(err.contains("`q`") && err.contains("index 1"), "{err}");
    }
}
