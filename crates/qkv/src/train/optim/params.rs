//! [`Params`]: how a model hands its parameters and gradients to the optimiser and to
//! clipping without copying them, and the simple holders that implement it.

use crate::tensor::Tensor;
use crate::train::trainable::TrainableModel;

/// Something whose trainable parameters can be visited together with their gradients.
pub trait Params {
    /// Calls `f(name, param, grad)` once per trainable parameter, in the same order on
    /// every call; `grad` has `param`'s shape. Names are unique (checkpoint names, e.g.
    /// `h.0.attn.c_attn.weight`).
    fn visit(&mut self, f: &mut dyn FnMut(&str, &mut Tensor, &Tensor));
}

impl<M: TrainableModel + ?Sized> Params for M {
    fn visit(&mut self, f: &mut dyn FnMut(&str, &mut Tensor, &Tensor)) {
        self.visit_params(f)
    }
}

/// A parameter that owns its value and gradient: the simplest [`Params`] (tests, small
/// experiments); a `Vec` or slice of them is a [`Params`].
#[derive(Clone, Debug)]
pub struct NamedParam {
    pub name: String,
    pub value: Tensor,
    pub grad: Tensor,
}

impl NamedParam {
    /// `value` with a zero gradient of the same shape.
    pub fn new(name: impl Into<String>, value: Tensor) -> Self {
        let grad = Tensor::zeros(value.shape());
        NamedParam {
            name: name.into(),
            value,
            grad,
        }
    }
}

impl Params for [NamedParam] {
    fn visit(&mut self, f: &mut dyn FnMut(&str, &mut Tensor, &Tensor)) {
        for p in self.iter_mut() {
            f(&p.name, &mut p.value, &p.grad);
        }
    }
}

impl Params for Vec<NamedParam> {
    fn visit(&mut self, f: &mut dyn FnMut(&str, &mut Tensor, &Tensor)) {
        self[..].visit(f)
    }
}

/// Borrowed `(name, param, grad)` triples, for a caller that already holds references.
impl Params for [(&str, &mut Tensor, &Tensor)] {
    fn visit(&mut self, f: &mut dyn FnMut(&str, &mut Tensor, &Tensor)) {
        for (name, p, g) in self.iter_mut() {
            f(name, p, g);
        }
    }
}

/// A closure as [`Params`]: `VisitFn(|f| layer.visit_with(&grads, f))` for a module
/// whose gradients live in a separate `*Grads` struct.
pub struct VisitFn<F>(pub F);

impl<F> Params for VisitFn<F>
where
    F: FnMut(&mut dyn FnMut(&str, &mut Tensor, &Tensor)),
{
    fn visit(&mut self, f: &mut dyn FnMut(&str, &mut Tensor, &Tensor)) {
        (self.0)(f)
    }
}

/// Two parameters with gradients, a matrix that decays and a bias that does not: the
/// optimiser's and clipping's unit tests start from them.
#[cfg(test)]
pub(super) fn two_params() -> Vec<NamedParam> {
    let mut a = NamedParam::new("h.0.mlp.weight", Tensor::from_fn(&[3, 2], |i| i as f32));
    let mut b = NamedParam::new("h.0.mlp.bias", Tensor::from_fn(&[3], |i| -(i as f32)));
    a.grad.data_mut().fill(0.25);
    b.grad.data_mut().fill(-1.0);
    vec![a, b]
}
