//! AdamW (decoupled weight decay) matching `torch.optim.AdamW`, global-norm gradient
//! clipping matching `torch.nn.utils.clip_grad_norm_`, and the [`Params`] visitor through
//! which a model hands its parameters and gradients to both without copying them.
//!
//! ## The update (one call of [`AdamW::step`], step count `t` after incrementing)
//!
//! For every parameter `p` with gradient `g`, exactly as torch's single-tensor path
//! (the one it uses on CPU) orders the operations:
//!
//! ```text
//! p ← p · (1 − lr·wd)                      only if p decays (see DecayRule) and wd ≠ 0
//! m ← m + (1 − β₁)·(g − m)                 torch: exp_avg.lerp_(g, 1 − β₁)
//! v ← v·β₂ + (1 − β₂)·g·g                  torch: exp_avg_sq.mul_(β₂).addcmul_(g, g, 1 − β₂)
//! denom = √v / √(1 − β₂ᵗ) + eps            eps is added *after* the bias correction
//! p ← p + (−lr / (1 − β₁ᵗ))·m / denom
//! ```
//!
//! Hyperparameters and the scalars derived from them are `f64`, like the Python floats
//! torch computes them in; each is rounded to `f32` where torch hands it to an `f32`
//! kernel. Tensors are `f32`.
//!
//! ## Feeding parameters
//!
//! The optimiser visits parameters through [`Params::visit`], the same callback as
//! [`TrainableModel::visit_params`] (every trainable model is a [`Params`]): `f(name,
//! param, grad)` for every trainable tensor, always in the same order. The optimiser
//! keeps its moments in that order and checks the names on every step, so a model whose
//! visiting order changed is an error, not silent corruption. [`NamedParam`] lists,
//! borrowed triples and [`VisitFn`] closures implement the trait too.
//!
//! ## Clipping
//!
//! Gradients are visited read-only, so clipping does not rewrite them: [`grad_norm`]
//! gives the total norm, [`clip_coefficient`] torch's factor `min(max_norm / (norm +
//! 1e-6), 1)`, and [`AdamW::step_scaled`] multiplies each gradient element by it as it
//! reads it — the same f32 product torch's in-place `grad.mul_(coef)` stores, so the
//! update is bit-for-bit the one after `clip_grad_norm_`. [`AdamW::step_clipped`] does
//! all three. [`clip_grad_norm`] clips gradients in place where the caller holds them
//! mutably.
//!
//! ```
//! use qkv::train::optim::{AdamW, AdamWConfig, NamedParam};
//! use qkv::Tensor;
//! let mut params = vec![NamedParam::new("layer.weight", Tensor::from_fn(&[2, 3], |i| i as f32))];
//! params[0].grad.data_mut().fill(0.5);
//! let mut opt = AdamW::new(AdamWConfig::default());
//! opt.step(1e-3, &mut params[..])?;
//! assert_eq!(opt.step_count(), 1);
//! // first step: m̂/√v̂ = g/|g| = 1, so each weight moves by lr (after decay by lr·wd)
//! let w1 = params[0].value.data()[1];
//! assert!((w1 - (1.0 * (1.0 - 1e-3 * 0.01) - 1e-3)).abs() < 1e-6);
//! # Ok::<(), qkv::Error>(())
//! ```

use rayon::prelude::*;

use crate::error::{Error, Result};
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

/// Substrings that exempt a parameter from weight decay under [`DecayRule::Standard`]:
/// norms (`norm`, `ln_`), biases (`bias`, which also covers T5's
/// `relative_attention_bias`), and embeddings (`embed`, GPT-2's `wte`/`wpe`, T5's
/// `shared`).
pub const NO_DECAY_SUBSTRINGS: [&str; 8] = [
    "norm",
    "ln_",
    "bias",
    "embed",
    "wte",
    "wpe",
    "shared",
    "relative_attention_bias",
];

/// Which parameters weight decay applies to. Decided once per parameter, on the first
/// step (or on [`AdamW::load_state`]).
#[derive(Clone, Debug, Default)]
pub enum DecayRule {
    /// The default: decay a parameter iff it has rank ≥ 2 and its name contains none of
    /// [`NO_DECAY_SUBSTRINGS`]. Matrices (projections, FFN weights, an untied LM head)
    /// decay; norms, biases, embeddings and any other vector do not — the convention of
    /// GPT-2 reproductions (minGPT, nanoGPT: "all params with dim < 2 don't decay") and
    /// of Hugging Face's Trainer (biases and norm weights excluded), with embeddings
    /// excluded as well, as the issue asks. A tied LM head shares the embedding and is
    /// therefore not decayed.
    #[default]
    Standard,
    /// Every parameter decays (a plain `torch.optim.AdamW(model.parameters())`).
    All,
    /// No parameter decays.
    None,
    /// Decay iff the name contains none of these substrings (rank is not considered).
    ExcludeNames(Vec<String>),
    /// Decay iff `f(name, shape)`.
    Custom(fn(&str, &[usize]) -> bool),
}

impl DecayRule {
    /// Whether weight decay applies to the parameter `name` of `shape`.
    pub fn decays(&self, name: &str, shape: &[usize]) -> bool {
        match self {
            DecayRule::Standard => {
                shape.len() >= 2 && !NO_DECAY_SUBSTRINGS.iter().any(|s| name.contains(s))
            }
            DecayRule::All => true,
            DecayRule::None => false,
            DecayRule::ExcludeNames(subs) => !subs.iter().any(|s| name.contains(s.as_str())),
            DecayRule::Custom(f) => f(name, shape),
        }
    }
}

/// AdamW hyperparameters (the learning rate comes with each step, from a schedule).
/// Defaults are torch's: β = (0.9, 0.999), eps = 1e-8, weight_decay = 0.01.
#[derive(Clone, Debug)]
pub struct AdamWConfig {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    pub decay: DecayRule,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        AdamWConfig {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
            decay: DecayRule::Standard,
        }
    }
}

impl AdamWConfig {
    /// Errors on a hyperparameter outside torch's accepted range.
    pub fn validate(&self) -> Result<()> {
        let check = |field: &str, v: f64, ok: bool, range: &str| {
            if ok && v.is_finite() {
                Ok(())
            } else {
                Err(Error::invalid(field, format!("{v} is outside {range}")))
            }
        };
        check(
            "beta1",
            self.beta1,
            (0.0..1.0).contains(&self.beta1),
            "[0, 1)",
        )?;
        check(
            "beta2",
            self.beta2,
            (0.0..1.0).contains(&self.beta2),
            "[0, 1)",
        )?;
        check("eps", self.eps, self.eps >= 0.0, "[0, ∞)")?;
        check(
            "weight_decay",
            self.weight_decay,
            self.weight_decay >= 0.0,
            "[0, ∞)",
        )
    }
}

/// The moments of one parameter, kept in visiting order.
#[derive(Clone, Debug)]
struct Slot {
    name: String,
    decay: bool,
    m: Tensor,
    v: Tensor,
}

/// Suffixes of the state tensors, as torch names them in `optimizer.state[p]`.
const EXP_AVG: &str = ".exp_avg";
const EXP_AVG_SQ: &str = ".exp_avg_sq";

/// Elements per rayon task in the elementwise update; small tensors run inline.
const PAR_CHUNK: usize = 1 << 15;

/// AdamW matching `torch.optim.AdamW` (no amsgrad, no maximize). See the module docs
/// for the exact update.
#[derive(Clone, Debug)]
pub struct AdamW {
    pub config: AdamWConfig,
    slots: Vec<Slot>,
    step: u64,
}

impl AdamW {
    pub fn new(config: AdamWConfig) -> Self {
        AdamW {
            config,
            slots: Vec::new(),
            step: 0,
        }
    }

    /// Number of updates applied so far (torch's `state[p]["step"]`).
    pub fn step_count(&self) -> u64 {
        self.step
    }

    /// Names of the parameters the optimiser holds moments for, with whether each decays,
    /// in visiting order (empty before the first step).
    pub fn param_groups(&self) -> Vec<(&str, bool)> {
        self.slots
            .iter()
            .map(|s| (s.name.as_str(), s.decay))
            .collect()
    }

    /// One update with learning rate `lr`. Every gradient is checked first (shape, finite
    /// values, visiting order against earlier steps); on any error nothing — neither a
    /// parameter nor the optimiser state — has changed. Gradients are read, not zeroed.
    pub fn step<P: Params + ?Sized>(&mut self, lr: f64, params: &mut P) -> Result<()> {
        self.step_scaled(lr, 1.0, params)
    }

    /// The total gradient norm ([`grad_norm`]), then [`AdamW::step`] — on the clipped
    /// gradients when `max_norm` is given, i.e. `clip_grad_norm_(params, max_norm)`
    /// followed by `optimizer.step()`. Returns the norm before clipping (for logging
    /// either way). On any error nothing has changed.
    pub fn step_clipped<P: Params + ?Sized>(
        &mut self,
        lr: f64,
        max_norm: Option<f64>,
        params: &mut P,
    ) -> Result<f32> {
        let norm = grad_norm(params)?;
        let scale = match max_norm {
            Some(max) => clip_coefficient(norm, max)?,
            None => 1.0,
        };
        self.step_scaled(lr, scale, params)?;
        Ok(norm)
    }

    /// [`AdamW::step`] on the gradients multiplied by `grad_scale` (each element's
    /// product rounded to f32 before use, as an in-place `grad.mul_(grad_scale)` would
    /// store it; a scale of 1 is exact).
    pub fn step_scaled<P: Params + ?Sized>(
        &mut self,
        lr: f64,
        grad_scale: f32,
        params: &mut P,
    ) -> Result<()> {
        self.config.validate()?;
        if !(lr.is_finite() && lr >= 0.0) {
            return Err(Error::invalid(
                "lr",
                format!("{lr} is not a finite value ≥ 0"),
            ));
        }
        if !(grad_scale.is_finite() && grad_scale >= 0.0) {
            return Err(Error::invalid(
                "grad_scale",
                format!("{grad_scale} is not a finite value ≥ 0"),
            ));
        }
        // Pass 1: validate everything, creating moments on the first step.
        let fresh = self.slots.is_empty();
        let mut new_slots = Vec::new();
        let mut index = 0usize;
        let mut err: Option<Error> = None;
        {
            let slots = &self.slots;
            let rule = &self.config.decay;
            params.visit(&mut |name, p, g| {
                if err.is_some() {
                    return;
                }
                let i = index;
                index += 1;
                if let Err(e) = like_parameter(g, p, &format!("{name} (gradient)")) {
                    err = Some(e);
                    return;
                }
                if let Err(e) = g.check_finite(&format!("{name} (gradient)")) {
                    err = Some(e);
                    return;
                }
                if fresh {
                    new_slots.push(Slot {
                        name: name.to_string(),
                        decay: rule.decays(name, p.shape()),
                        m: Tensor::zeros(p.shape()),
                        v: Tensor::zeros(p.shape()),
                    });
                } else {
                    err = check_slot(slots, i, name, p.shape()).err();
                }
            });
        }
        if let Some(e) = err {
            return Err(e);
        }
        if !fresh && index != self.slots.len() {
            return Err(Error::invalid(
                "parameters",
                format!(
                    "the model visited {index} parameters but the optimiser state holds {}",
                    self.slots.len()
                ),
            ));
        }
        if fresh {
            self.slots = new_slots;
        }

        // Pass 2: the update, in torch's order of operations.
        self.step += 1;
        let c = &self.config;
        let t = self.step as f64;
        let bias_correction1 = 1.0 - c.beta1.powf(t);
        let bias_correction2 = 1.0 - c.beta2.powf(t);
        let k = Scalars {
            grad_scale,
            decay_factor: (1.0 - lr * c.weight_decay) as f32,
            one_minus_beta1: (1.0 - c.beta1) as f32,
            beta2: c.beta2 as f32,
            one_minus_beta2: (1.0 - c.beta2) as f32,
            bias_correction2_sqrt: bias_correction2.sqrt() as f32,
            eps: c.eps as f32,
            neg_step_size: (-(lr / bias_correction1)) as f32,
        };
        let apply_decay = c.weight_decay != 0.0;
        let slots = &mut self.slots;
        let mut index = 0usize;
        params.visit(&mut |_, p, g| {
            let slot = &mut slots[index];
            index += 1;
            let decay = apply_decay && slot.decay;
            let (p, g) = (p.data_mut(), g.data());
            let (m, v) = (slot.m.data_mut(), slot.v.data_mut());
            if p.len() <= PAR_CHUNK {
                update(&k, decay, p, g, m, v);
            } else {
                p.par_chunks_mut(PAR_CHUNK)
                    .zip(g.par_chunks(PAR_CHUNK))
                    .zip(m.par_chunks_mut(PAR_CHUNK))
                    .zip(v.par_chunks_mut(PAR_CHUNK))
                    .for_each(|(((p, g), m), v)| update(&k, decay, p, g, m, v));
            }
        });
        Ok(())
    }

    /// The optimiser state as named tensors: `{param}.exp_avg` and `{param}.exp_avg_sq`
    /// for every parameter in visiting order (torch's names), to save beside
    /// [`AdamW::step_count`]. Empty before the first step.
    pub fn state_tensors(&self) -> Vec<(String, &Tensor)> {
        let mut out = Vec::with_capacity(2 * self.slots.len());
        for s in &self.slots {
            out.push((format!("{}{EXP_AVG}", s.name), &s.m));
            out.push((format!("{}{EXP_AVG_SQ}", s.name), &s.v));
        }
        out
    }

    /// Restores a state saved with [`AdamW::state_tensors`] and [`AdamW::step_count`].
    /// `params` is visited once (nothing is changed) to order the moments and check that
    /// every parameter has both moments of its shape and that the state names no
    /// parameter the model lacks. `step == 0` with no tensors resets to a fresh state.
    pub fn load_state<P: Params + ?Sized>(
        &mut self,
        step: u64,
        tensors: impl IntoIterator<Item = (String, Tensor)>,
        params: &mut P,
    ) -> Result<()> {
        let mut moments: std::collections::HashMap<String, (Option<Tensor>, Option<Tensor>)> =
            std::collections::HashMap::new();
        for (name, t) in tensors {
            // ".exp_avg_sq" ends with neither ".exp_avg", so test the longer suffix first.
            if let Some(p) = name.strip_suffix(EXP_AVG_SQ) {
                moments.entry(p.to_string()).or_default().1 = Some(t);
            } else if let Some(p) = name.strip_suffix(EXP_AVG) {
                moments.entry(p.to_string()).or_default().0 = Some(t);
            } else {
                return Err(Error::invalid(
                    "optimizer state",
                    format!(
                        "tensor `{name}` is neither `<param>{EXP_AVG}` nor `<param>{EXP_AVG_SQ}`"
                    ),
                ));
            }
        }
        if step == 0 && moments.is_empty() {
            self.slots.clear();
            self.step = 0;
            return Ok(());
        }
        if step == 0 {
            return Err(Error::invalid(
                "optimizer state",
                "step 0 but moments are present",
            ));
        }
        let mut slots = Vec::new();
        let mut err: Option<Error> = None;
        let rule = &self.config.decay;
        params.visit(&mut |name, p, _| {
            if err.is_some() {
                return;
            }
            let pair = moments.remove(name);
            let (m, v) = match pair {
                Some((Some(m), Some(v))) => (m, v),
                Some((m, _)) => {
                    let which = if m.is_none() { EXP_AVG } else { EXP_AVG_SQ };
                    err = Some(Error::invalid(
                        "optimizer state",
                        format!("missing `{name}{which}`"),
                    ));
                    return;
                }
                None => {
                    err = Some(Error::invalid(
                        "optimizer state",
                        format!("no moments for parameter `{name}`"),
                    ));
                    return;
                }
            };
            for (t, suffix) in [(&m, EXP_AVG), (&v, EXP_AVG_SQ)] {
                if let Err(e) = like_parameter(t, p, &format!("{name}{suffix}")) {
                    err = Some(e);
                    return;
                }
            }
            slots.push(Slot {
                name: name.to_string(),
                decay: rule.decays(name, p.shape()),
                m,
                v,
            });
        });
        if let Some(e) = err {
            return Err(e);
        }
        if let Some(extra) = moments.keys().min() {
            return Err(Error::invalid(
                "optimizer state",
                format!("holds moments for `{extra}`, which the model does not have"),
            ));
        }
        self.slots = slots;
        self.step = step;
        Ok(())
    }
}

fn check_slot(slots: &[Slot], i: usize, name: &str, shape: &[usize]) -> Result<()> {
    let Some(slot) = slots.get(i) else {
        return Err(Error::invalid(
            "parameters",
            format!(
                "parameter #{i} `{name}` is new: the optimiser state holds {} parameters",
                slots.len()
            ),
        ));
    };
    if slot.name != name {
        return Err(Error::invalid(
            "parameters",
            format!(
                "parameter #{i} is `{name}` but was `{}` on earlier steps (visiting order changed)",
                slot.name
            ),
        ));
    }
    if slot.m.shape() != shape {
        return Err(Error::shape(
            name,
            format!("{:?} as on earlier steps", slot.m.shape()),
            shape,
        ));
    }
    Ok(())
}

/// The per-step scalars, already rounded to f32 as torch passes them to its kernels.
struct Scalars {
    grad_scale: f32,
    decay_factor: f32,
    one_minus_beta1: f32,
    beta2: f32,
    one_minus_beta2: f32,
    bias_correction2_sqrt: f32,
    eps: f32,
    neg_step_size: f32,
}

/// The elementwise AdamW update on one contiguous chunk.
#[inline]
fn update(k: &Scalars, decay: bool, p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32]) {
    let n = p.len();
    let (g, m, v) = (&g[..n], &mut m[..n], &mut v[..n]);
    if decay {
        // param.mul_(1 - lr * weight_decay)
        for x in p.iter_mut() {
            *x *= k.decay_factor;
        }
    }
    for i in 0..n {
        let gi = g[i] * k.grad_scale;
        // exp_avg.lerp_(grad, 1 - beta1): weight < 0.5 → self + w·(end − self)
        let mi = if k.one_minus_beta1 < 0.5 {
            m[i] + k.one_minus_beta1 * (gi - m[i])
        } else {
            gi - (gi - m[i]) * (1.0 - k.one_minus_beta1)
        };
        // exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        let vi = v[i] * k.beta2 + k.one_minus_beta2 * gi * gi;
        // denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
        let denom = vi.sqrt() / k.bias_correction2_sqrt + k.eps;
        // param.addcdiv_(exp_avg, denom, value=-step_size)
        p[i] += k.neg_step_size * mi / denom;
        m[i] = mi;
        v[i] = vi;
    }
}

/// The global 2-norm of all gradients, √(Σ‖g‖²), as `torch.nn.utils.get_total_norm`
/// computes it: each gradient's norm (accumulated in f64, rounded to f32), then the norm
/// of those norms. Errors on a non-finite gradient, naming the parameter.
pub fn grad_norm<P: Params + ?Sized>(params: &mut P) -> Result<f32> {
    let mut sum_sq = 0.0f64;
    let mut err: Option<Error> = None;
    params.visit(&mut |name, _, g| {
        if err.is_none() {
            match tensor_norm(name, g) {
                Ok(n) => sum_sq += n as f64 * n as f64,
                Err(e) => err = Some(e),
            }
        }
    });
    match err {
        Some(e) => Err(e),
        None => total_from(sum_sq),
    }
}

/// ‖g‖₂ in f32 (torch: `vector_norm` of each gradient), accumulated in f64: over the
/// pool in chunks of [`PAR_CHUNK`], whose sums are added in order, so that the result
/// does not depend on how the threads took them.
fn tensor_norm(name: &str, g: &Tensor) -> Result<f32> {
    let sum_sq = |c: &[f32]| c.iter().map(|&x| x as f64 * x as f64).sum::<f64>();
    let chunks: Vec<f64> = g.data().par_chunks(PAR_CHUNK).map(sum_sq).collect();
    let s: f64 = chunks.iter().sum();
    if !s.is_finite() {
        g.check_finite(&format!("{name} (gradient)"))?;
    }
    let n = s.sqrt() as f32;
    if !n.is_finite() {
        return Err(Error::NonFinite {
            tensor: format!("{name} (gradient norm)"),
            index: 0,
            value: n,
        });
    }
    Ok(n)
}

fn total_from(sum_sq: f64) -> Result<f32> {
    let total = sum_sq.sqrt() as f32;
    if !total.is_finite() {
        return Err(Error::NonFinite {
            tensor: "total gradient norm".into(),
            index: 0,
            value: total,
        });
    }
    Ok(total)
}

/// torch's clipping factor `min(max_norm / (total_norm + 1e-6), 1)`, evaluated as torch
/// does in f32 (`float / Tensor` is `reciprocal(total_norm + 1e-6) * max_norm`).
pub fn clip_coefficient(total_norm: f32, max_norm: f64) -> Result<f32> {
    if !(max_norm.is_finite() && max_norm > 0.0) {
        return Err(Error::invalid(
            "max_norm",
            format!("{max_norm} is not a finite value > 0"),
        ));
    }
    Ok(((1.0f32 / (total_norm + 1e-6f32)) * max_norm as f32).min(1.0))
}

/// Global-norm clipping in place, `torch.nn.utils.clip_grad_norm_(grads, max_norm)`:
/// computes the total norm (as [`grad_norm`]), then multiplies every gradient by
/// [`clip_coefficient`] — always, as torch does, so a coefficient of exactly 1 leaves
/// them unchanged. Returns the total norm *before* clipping. On a non-finite gradient
/// nothing is changed and the error names the parameter.
pub fn clip_grad_norm(grads: &mut [(&str, &mut Tensor)], max_norm: f64) -> Result<f32> {
    let mut sum_sq = 0.0f64;
    for (name, g) in grads.iter() {
        let n = tensor_norm(name, g)? as f64;
        sum_sq += n * n;
    }
    let total = total_from(sum_sq)?;
    let coef = clip_coefficient(total, max_norm)?;
    for (_, g) in grads.iter_mut() {
        for x in g.data_mut() {
            *x *= coef;
        }
    }
    Ok(total)
}

/// Errors unless `t` (a gradient or a moment, called `name`) has the parameter's shape.
fn like_parameter(t: &Tensor, p: &Tensor, name: &str) -> Result<()> {
    if t.shape() == p.shape() {
        return Ok(());
    }
    Err(Error::shape(
        name,
        format!("{:?} like the parameter", p.shape()),
        t.shape(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_params() -> Vec<NamedParam> {
        let mut a = NamedParam::new("h.0.mlp.weight", Tensor::from_fn(&[3, 2], |i| i as f32));
        let mut b = NamedParam::new("h.0.mlp.bias", Tensor::from_fn(&[3], |i| -(i as f32)));
        a.grad.data_mut().fill(0.25);
        b.grad.data_mut().fill(-1.0);
        vec![a, b]
    }

    #[test]
    fn standard_rule_excludes_vectors_norms_biases_embeddings() {
        let r = DecayRule::Standard;
        assert!(r.decays("h.0.attn.c_attn.weight", &[8, 24]));
        assert!(r.decays("lm_head.weight", &[50, 8]));
        assert!(!r.decays("h.0.attn.c_attn.bias", &[24]));
        assert!(!r.decays("h.0.ln_1.weight", &[8]));
        assert!(!r.decays("model.layers.0.input_layernorm.weight", &[8]));
        assert!(!r.decays("wte.weight", &[50, 8]));
        assert!(!r.decays("wpe.weight", &[16, 8]));
        assert!(!r.decays("model.embed_tokens.weight", &[50, 8]));
        assert!(!r.decays("shared.weight", &[50, 8]));
        assert!(!r.decays(
            "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
            &[32, 4]
        ));
        assert!(!r.decays("some.vector", &[8]), "rank 1 never decays");
        assert!(DecayRule::All.decays("wte.weight", &[5]));
        assert!(!DecayRule::None.decays("w", &[5, 5]));
        let ex = DecayRule::ExcludeNames(vec!["foo".into()]);
        assert!(ex.decays("bar", &[1]) && !ex.decays("a.foo.b", &[2, 2]));
    }

    #[test]
    fn error_leaves_parameters_and_state_untouched() {
        let mut ps = two_params();
        let mut opt = AdamW::new(AdamWConfig::default());
        opt.step(0.1, &mut ps[..]).unwrap();
        let before = ps.clone();
        let state: Vec<Tensor> = opt
            .state_tensors()
            .into_iter()
            .map(|(_, t)| t.clone())
            .collect();
        ps[1].grad.data_mut()[2] = f32::NAN;
        let err = opt.step(0.1, &mut ps[..]).unwrap_err().to_string();
        assert!(
            err.contains("h.0.mlp.bias (gradient)") && err.contains("index 2"),
            "{err}"
        );
        for (a, b) in ps.iter().zip(&before) {
            assert_eq!(a.value, b.value);
        }
        let after: Vec<Tensor> = opt
            .state_tensors()
            .into_iter()
            .map(|(_, t)| t.clone())
            .collect();
        assert_eq!(state, after);
        assert_eq!(opt.step_count(), 1);
    }

    #[test]
    fn changed_visiting_order_is_an_error() {
        let mut ps = two_params();
        let mut opt = AdamW::new(AdamWConfig::default());
        opt.step(0.1, &mut ps[..]).unwrap();
        ps.swap(0, 1);
        let err = opt.step(0.1, &mut ps[..]).unwrap_err().to_string();
        assert!(err.contains("visiting order"), "{err}");
        ps.swap(0, 1);
        ps.pop();
        let err = opt.step(0.1, &mut ps[..]).unwrap_err().to_string();
        assert!(err.contains("visited 1 parameters"), "{err}");
    }

    #[test]
    fn grad_shape_mismatch_is_named() {
        let mut ps = two_params();
        ps[0].grad = Tensor::zeros(&[2, 3]);
        let err = AdamW::new(AdamWConfig::default())
            .step(0.1, &mut ps[..])
            .unwrap_err()
            .to_string();
        assert!(err.contains("h.0.mlp.weight (gradient)"), "{err}");
    }

    #[test]
    fn large_tensors_take_the_parallel_path_with_identical_results() {
        let n = PAR_CHUNK * 2 + 17;
        let value = Tensor::from_fn(&[n, 1], |i| (i as f32 * 0.01).sin());
        let grad = Tensor::from_fn(&[n, 1], |i| (i as f32 * 0.07).cos());
        let mut big = [NamedParam {
            name: "w".into(),
            value: value.clone(),
            grad: grad.clone(),
        }];
        let mut opt = AdamW::new(AdamWConfig::default());
        for _ in 0..3 {
            opt.step(0.01, &mut big[..]).unwrap();
        }
        // the same update chunk by chunk, serially, through small "parameters"
        let mut pieces: Vec<NamedParam> = (0..n)
            .step_by(1000)
            .map(|s| {
                let e = (s + 1000).min(n);
                NamedParam {
                    name: format!("w{s}.weight"),
                    value: Tensor::new(&[e - s, 1], value.data()[s..e].to_vec()).unwrap(),
                    grad: Tensor::new(&[e - s, 1], grad.data()[s..e].to_vec()).unwrap(),
                }
            })
            .collect();
        let mut opt2 = AdamW::new(AdamWConfig::default());
        for _ in 0..3 {
            opt2.step(0.01, &mut pieces[..]).unwrap();
        }
        let joined: Vec<f32> = pieces
            .iter()
            .flat_map(|p| p.value.data().to_vec())
            .collect();
        assert_eq!(big[0].value.data(), &joined[..]);
    }

    #[test]
    fn clip_rejects_non_finite_and_bad_max_norm() {
        let mut ps = two_params();
        let (a, b) = ps.split_at_mut(1);
        let mut grads = [("a", &mut a[0].grad), ("b", &mut b[0].grad)];
        assert!(clip_grad_norm(&mut grads, 0.0).is_err());
        assert!(clip_grad_norm(&mut grads, f64::NAN).is_err());
        grads[0].1.data_mut()[1] = f32::INFINITY;
        let before = grads[1].1.clone();
        let err = clip_grad_norm(&mut grads, 1.0).unwrap_err().to_string();
        assert!(
            err.contains("a (gradient)") && err.contains("index 1"),
            "{err}"
        );
        assert_eq!(*grads[1].1, before);
        let err = grad_norm(&mut ps[..]).unwrap_err().to_string();
        assert!(err.contains("h.0.mlp.weight (gradient)"), "{err}");
    }

    #[test]
    fn step_clipped_equals_clip_then_step() {
        let mut a = two_params();
        let mut b = a.clone();
        let mut opt_a = AdamW::new(AdamWConfig::default());
        let mut opt_b = opt_a.clone();
        let norm = opt_a.step_clipped(0.1, Some(0.3), &mut a[..]).unwrap();
        let (x, y) = b.split_at_mut(1);
        let norm_b =
            clip_grad_norm(&mut [("x", &mut x[0].grad), ("y", &mut y[0].grad)], 0.3).unwrap();
        opt_b.step(0.1, &mut b[..]).unwrap();
        assert_eq!(norm, norm_b);
        for (p, q) in a.iter().zip(&b) {
            assert_eq!(p.value, q.value);
        }
    }
}
