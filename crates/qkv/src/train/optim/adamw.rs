//! [`AdamW`]: the moments and the update (the formula is in [the module docs](super)).

use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::tensor::Tensor;

use super::chunks::PAR_CHUNK;
use super::clip::{clip_coefficient, grad_norm};
use super::config::AdamWConfig;
use super::params::Params;

/// The moments of one parameter, kept in visiting order.
#[derive(Clone, Debug)]
pub(super) struct Slot {
    pub(super) name: String,
    pub(super) decay: bool,
    pub(super) m: Tensor,
    pub(super) v: Tensor,
}

/// AdamW matching `torch.optim.AdamW` (no amsgrad, no maximize). See [the module
/// docs](super) for the exact update.
#[derive(Clone, Debug)]
pub struct AdamW {
    pub config: AdamWConfig,
    pub(super) slots: Vec<Slot>,
    pub(super) step: u64,
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

/// Errors unless `t` (a gradient or a moment, called `name`) has the parameter's shape.
pub(super) fn like_parameter(t: &Tensor, p: &Tensor, name: &str) -> Result<()> {
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
    use crate::train::optim::clip::clip_grad_norm;
    use crate::train::optim::params::{two_params, NamedParam};

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
