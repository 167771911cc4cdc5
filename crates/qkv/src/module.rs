//! Parameter trees. A layer or model is a struct of tensors that is walked by name, in
//! one fixed order (its fields' order). Its gradients are a second value of the same
//! type (llm.c's `ParameterTensors grads`): the walk that names a parameter names its
//! gradient, so nothing mirrors the parameters by hand.
//!
//! ```
//! use qkv::layers::Linear;
//! use qkv::module::Module;
//! use qkv::Tensor;
//! let lin = Linear::new(Tensor::zeros(&[3, 2]), Some(Tensor::zeros(&[3]))).unwrap();
//! let names: Vec<String> = lin.params().into_iter().map(|(n, _)| n).collect();
//! assert_eq!(names, ["weight", "bias"]);
//! assert_eq!(lin.zeros_like().num_params(), 9);
//! ```

use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// A dotted path into a parameter tree, e.g. `decoder.layers.3.attn.q.weight`.
#[derive(Clone, Debug, Default)]
pub struct Path(String);

impl Path {
    /// Appends a segment; returns the length to [`Path::truncate`] back to.
    pub fn push(&mut self, segment: &str) -> usize {
        let len = self.0.len();
        if !self.0.is_empty() {
            self.0.push('.');
        }
        self.0.push_str(segment);
        len
    }

    pub fn truncate(&mut self, len: usize) {
        self.0.truncate(len);
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A tree of named parameter tensors.
pub trait Module {
    /// Calls `f(path, tensor)` for every parameter, in the tree's fixed order.
    fn visit<'a>(&'a self, path: &mut Path, f: &mut dyn FnMut(&str, &'a Tensor));

    /// [`Module::visit`] with mutable access, in the same order.
    fn visit_mut<'a>(&'a mut self, path: &mut Path, f: &mut dyn FnMut(&str, &'a mut Tensor));

    /// Every parameter with its path.
    fn params(&self) -> Vec<(String, &Tensor)> {
        let mut out = Vec::new();
        self.visit(&mut Path::default(), &mut |n, t| {
            out.push((n.to_string(), t))
        });
        out
    }

    /// Every parameter with its path, mutably.
    fn params_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        let mut out = Vec::new();
        self.visit_mut(&mut Path::default(), &mut |n, t| {
            out.push((n.to_string(), t))
        });
        out
    }

    /// Number of parameter elements.
    fn num_params(&self) -> usize {
        let mut n = 0;
        self.visit(&mut Path::default(), &mut |_, t| n += t.numel());
        n
    }

    /// The same tree with every tensor zero: a gradient buffer for these parameters.
    fn zeros_like(&self) -> Self
    where
        Self: Clone,
    {
        let mut g = self.clone();
        g.fill_zero();
        g
    }

    /// Whether `other` has the same tree: the same paths with the same shapes.
    fn shaped_like(&self, other: &Self) -> bool {
        let shapes = |m: &Self| -> Vec<(String, Vec<usize>)> {
            m.params()
                .into_iter()
                .map(|(n, t)| (n, t.shape().to_vec()))
                .collect()
        };
        shapes(self) == shapes(other)
    }

    /// Errors unless `grads` is [`Module::shaped_like`] this tree: an [`Error::Invalid`]
    /// naming `name`, the gradient tree.
    fn expect_grads(&self, grads: &Self, name: &str) -> Result<()> {
        if self.shaped_like(grads) {
            Ok(())
        } else {
            let rule = "must have the module's parameter paths and shapes";
            Err(Error::invalid(name, rule))
        }
    }

    /// Sets every tensor to zero.
    fn fill_zero(&mut self) {
        self.visit_mut(&mut Path::default(), &mut |_, t| t.data_mut().fill(0.0));
    }

    /// Zeroes a gradient buffer for these parameters, making it the first time.
    fn zero_grads_in(&self, grads: &mut Option<Self>)
    where
        Self: Clone,
    {
        match grads {
            Some(g) => g.fill_zero(),
            None => *grads = Some(self.zeros_like()),
        }
    }
}

impl Module for Tensor {
    fn visit<'a>(&'a self, path: &mut Path, f: &mut dyn FnMut(&str, &'a Tensor)) {
        f(path.as_str(), self)
    }

    fn visit_mut<'a>(&'a mut self, path: &mut Path, f: &mut dyn FnMut(&str, &'a mut Tensor)) {
        f(path.as_str(), self)
    }
}

impl<M: Module> Module for Option<M> {
    fn visit<'a>(&'a self, path: &mut Path, f: &mut dyn FnMut(&str, &'a Tensor)) {
        if let Some(m) = self {
            m.visit(path, f)
        }
    }

    fn visit_mut<'a>(&'a mut self, path: &mut Path, f: &mut dyn FnMut(&str, &'a mut Tensor)) {
        if let Some(m) = self {
            m.visit_mut(path, f)
        }
    }
}

/// Elements are named by their index: `layers.0`, `layers.1`, ….
impl<M: Module> Module for Vec<M> {
    fn visit<'a>(&'a self, path: &mut Path, f: &mut dyn FnMut(&str, &'a Tensor)) {
        for (i, m) in self.iter().enumerate() {
            let len = path.push(&i.to_string());
            m.visit(path, f);
            path.truncate(len);
        }
    }

    fn visit_mut<'a>(&'a mut self, path: &mut Path, f: &mut dyn FnMut(&str, &'a mut Tensor)) {
        for (i, m) in self.iter_mut().enumerate() {
            let len = path.push(&i.to_string());
            m.visit_mut(path, f);
            path.truncate(len);
        }
    }
}

/// Implements [`Module`] for a struct by walking the listed fields in order, each
/// under its field name: `module!(Linear { weight, bias });` for a struct that also
/// holds settings, or the whole definition of a struct whose every field is a
/// parameter (a sub-module, an `Option` or a `Vec` of them), so that a field added
/// later cannot be left out of the walk (and so out of training and saving):
///
/// ```
/// qkv::module! {
///     /// Two tables.
///     #[derive(Clone, Debug)]
///     pub struct Pair {
///         pub first: qkv::Tensor,
///         pub second: Option<qkv::Tensor>,
///     }
/// }
/// use qkv::module::Module;
/// let pair = Pair { first: qkv::Tensor::zeros(&[2, 3]), second: None };
/// assert_eq!(pair.num_params(), 6);
/// ```
#[macro_export]
macro_rules! module {
    (
        $(#[$meta:meta])*
        $vis:vis struct $ty:ident {
            $($(#[$field_meta:meta])* $field_vis:vis $field:ident: $field_ty:ty),* $(,)?
        }
    ) => {
        $(#[$meta])*
        $vis struct $ty {
            $($(#[$field_meta])* $field_vis $field: $field_ty),*
        }
        $crate::module!($ty { $($field),* });
    };
    ($ty:ident { $($field:ident),* $(,)? }) => {
        impl $crate::module::Module for $ty {
            fn visit<'a>(
                &'a self,
                path: &mut $crate::module::Path,
                f: &mut dyn FnMut(&str, &'a $crate::Tensor),
            ) {
                $(
                    let len = path.push(stringify!($field));
                    $crate::module::Module::visit(&self.$field, path, f);
                    path.truncate(len);
                )*
            }

            fn visit_mut<'a>(
                &'a mut self,
                path: &mut $crate::module::Path,
                f: &mut dyn FnMut(&str, &'a mut $crate::Tensor),
            ) {
                $(
                    let len = path.push(stringify!($field));
                    $crate::module::Module::visit_mut(&mut self.$field, path, f);
                    path.truncate(len);
                )*
            }
        }
    };
}
