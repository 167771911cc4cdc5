//! The optimiser's state as named tensors, torch's names, to save in a checkpoint and
//! restore from it.

use crate::error::{Error, Result};
use crate::tensor::Tensor;

use super::adamw::{like_parameter, AdamW, Slot};
use super::params::Params;

/// Suffixes of the state tensors, as torch names them in `optimizer.state[p]`.
const EXP_AVG: &str = ".exp_avg";
const EXP_AVG_SQ: &str = ".exp_avg_sq";

impl AdamW {
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
