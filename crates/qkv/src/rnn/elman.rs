//! The Elman RNN that attention replaced: `h_t = tanh(W_ih·x_t + b_ih + W_hh·h_{t−1} +
//! b_hh)`, stacked in layers (each layer reads the one below's states), batch-first,
//! equal to `torch.nn.RNN(nonlinearity="tanh", batch_first=True)`.
//!
//! The article's point is visible in the code: the input projection W_ih·x_t of every
//! step is one matrix product over all B·T rows, done in parallel, but the recurrence
//! is a chain of T small products, each waiting for the last. And what step t learns
//! about step 1 passes through t−1 tanh layers: the backward pass below multiplies the
//! gradient by `W_hhᵀ·diag(1 − h²)` once per step, which is why it vanishes.
//!
//! Padding by lengths follows `pack_padded_sequence` / `pad_packed_sequence`: row b has
//! `lengths[b]` real steps (1 ≤ length ≤ T); its outputs after them are zero and its
//! final state is the state after its last real step.

use crate::error::{Error, Result};
use crate::layers::linear::{product_backward, product_into, product_weight_grad};
use crate::module::{Module, Path};
use crate::ops::{gemm, MatMut, MatRef, Par};
use crate::tensor::Tensor;

crate::module! {
    /// One layer's parameters, as `torch.nn.RNN` holds them for layer k (`weight_ih_lk`,
    /// `weight_hh_lk`, `bias_ih_lk`, `bias_hh_lk`).
    #[derive(Clone, Debug, PartialEq)]
    pub struct ElmanLayer {
        /// `[Hd, In]`: In is the input width for layer 0, Hd above it
        pub weight_ih: Tensor,
        /// `[Hd, Hd]`
        pub weight_hh: Tensor,
        /// `[Hd]`
        pub bias_ih: Tensor,
        /// `[Hd]`
        pub bias_hh: Tensor,
    }
}

/// A stack of Elman layers. Its parameters are named as in a `torch.nn.RNN` state dict:
/// `weight_ih_l0`, `weight_hh_l0`, `bias_ih_l0`, `bias_hh_l0`, `weight_ih_l1`, …
#[derive(Clone, Debug, PartialEq)]
pub struct Elman {
    pub layers: Vec<ElmanLayer>,
}

/// The forward's results: every step's top-layer state and each layer's final state.
#[derive(Clone, Debug)]
pub struct ElmanOutput {
    /// `[B, T, Hd]`: the top layer's h_t; zero after a row's length
    pub out: Tensor,
    /// `[L, B, Hd]`: each layer's state after the row's last real step
    pub h_n: Tensor,
}

/// What the backward pass needs from the forward.
#[derive(Clone, Debug)]
pub struct ElmanCache {
    /// per layer: its input `[B, T, In]` (x for layer 0, the states below otherwise)
    inputs: Vec<Tensor>,
    /// per layer: its states h_t `[B, T, Hd]` (zero after a row's length)
    states: Vec<Tensor>,
    /// `[L, B, Hd]`
    h0: Tensor,
    lengths: Vec<usize>,
}

impl Elman {
    /// Checks that the layers chain: layer 0 reads `In`, every layer has one width Hd,
    /// layer k > 0 reads Hd, and the biases are `[Hd]`.
    pub fn new(layers: Vec<ElmanLayer>) -> Result<Self> {
        let first = layers
            .first()
            .ok_or_else(|| Error::invalid("rnn layers", "at least one layer is needed"))?;
        let hd = first.weight_hh.shape().first().copied().unwrap_or(0);
        let input = first.weight_ih.shape().get(1).copied().unwrap_or(0);
        for (k, l) in layers.iter().enumerate() {
            let fan_in = if k == 0 { input } else { hd };
            l.weight_ih
                .expect_shape(&format!("weight_ih_l{k}"), &[Some(hd), Some(fan_in)])?;
            l.weight_hh
                .expect_shape(&format!("weight_hh_l{k}"), &[Some(hd), Some(hd)])?;
            l.bias_ih
                .expect_shape(&format!("bias_ih_l{k}"), &[Some(hd)])?;
            l.bias_hh
                .expect_shape(&format!("bias_hh_l{k}"), &[Some(hd)])?;
        }
        if hd == 0 || input == 0 {
            return Err(Error::invalid("rnn layers", "widths must be at least 1"));
        }
        Ok(Elman { layers })
    }

    /// Input width In.
    pub fn input_size(&self) -> usize {
        self.layers[0].weight_ih.shape()[1]
    }

    /// State width Hd.
    pub fn hidden_size(&self) -> usize {
        self.layers[0].weight_hh.shape()[0]
    }

    /// Runs the stack on x `[B, T, In]` from states h0 `[L, B, Hd]` (zeros when `None`),
    /// row b for `lengths[b]` steps (all T when `None`).
    pub fn forward(
        &self,
        x: &Tensor,
        lengths: Option<&[usize]>,
        h0: Option<&Tensor>,
    ) -> Result<(ElmanOutput, ElmanCache)> {
        let (l_n, hd) = (self.layers.len(), self.hidden_size());
        x.expect_shape("rnn input", &[None, None, Some(self.input_size())])?;
        x.check_finite("rnn input")?;
        let (b_n, t_n) = (x.shape()[0], x.shape()[1]);
        let lengths = check_lengths(lengths, b_n, t_n)?;
        let h0 = match h0 {
            Some(h) => {
                h.expect_shape("rnn h0", &[Some(l_n), Some(b_n), Some(hd)])?;
                h.check_finite("rnn h0")?;
                h.clone()
            }
            None => Tensor::zeros(&[l_n, b_n, hd]),
        };
        let mut h_n = Tensor::zeros(&[l_n, b_n, hd]);
        let (mut inputs, mut states) = (Vec::with_capacity(l_n), Vec::with_capacity(l_n));
        let mut input = x.clone();
        for (k, layer) in self.layers.iter().enumerate() {
            let start = &h0.data()[k * b_n * hd..(k + 1) * b_n * hd];
            let (h, last) = layer.run(&input, &lengths, start)?;
            h_n.data_mut()[k * b_n * hd..(k + 1) * b_n * hd].copy_from_slice(&last);
            inputs.push(std::mem::replace(&mut input, h.clone()));
            states.push(h);
        }
        let out = ElmanOutput { out: input, h_n };
        let cache = ElmanCache {
            inputs,
            states,
            h0,
            lengths,
        };
        Ok((out, cache))
    }

    /// Backpropagation through time. d_out `[B, T, Hd]` is the loss gradient of
    /// `out`, d_hn `[L, B, Hd]` that of `h_n` (zero when `None`). **Accumulates** the
    /// parameter gradients into `grads` (a tree shaped as this stack); returns
    /// (dx `[B, T, In]`, dh0 `[L, B, Hd]`).
    pub fn backward(
        &self,
        cache: &ElmanCache,
        d_out: &Tensor,
        d_hn: Option<&Tensor>,
        grads: &mut Elman,
    ) -> Result<(Tensor, Tensor)> {
        let (l_n, hd) = (self.layers.len(), self.hidden_size());
        let top = &cache.states[l_n - 1];
        let (b_n, t_n) = (top.shape()[0], top.shape()[1]);
        d_out.expect_shape("rnn d_out", &[Some(b_n), Some(t_n), Some(hd)])?;
        if let Some(d) = d_hn {
            d.expect_shape("rnn d_hn", &[Some(l_n), Some(b_n), Some(hd)])?;
        }
        self.expect_grads(grads, "rnn grads")?;
        let mut dh0 = Tensor::zeros(&[l_n, b_n, hd]);
        let mut d_above = d_out.clone();
        for k in (0..l_n).rev() {
            let span = k * b_n * hd..(k + 1) * b_n * hd;
            let d_last = d_hn.map(|d| &d.data()[span.clone()]);
            let (dx, dh) = self.layers[k].backprop(
                &cache.inputs[k],
                &cache.states[k],
                &cache.h0.data()[span.clone()],
                &cache.lengths,
                (&d_above, d_last),
                &mut grads.layers[k],
            )?;
            dh0.data_mut()[span].copy_from_slice(&dh);
            d_above = dx;
        }
        Ok((d_above, dh0))
    }
}

impl ElmanLayer {
    /// A tensor of `shape` (last axis Hd) whose every row is b_ih + b_hh: the
    /// pre-activation before the products are added.
    fn biases(&self, shape: &[usize]) -> Tensor {
        let mut pre = Tensor::zeros(shape);
        for row in pre.data_mut().chunks_exact_mut(self.bias_ih.numel()) {
            for ((p, &a), &b) in row
                .iter_mut()
                .zip(self.bias_ih.data())
                .zip(self.bias_hh.data())
            {
                *p = a + b;
            }
        }
        pre
    }

    /// Adds the gradient of both biases, the sum of the rows of d pre (`[…, Hd]`), to
    /// this gradient tree.
    /// The input side of a backward, from d pre `[..., Hd]` for inputs x `[..., In]`:
    /// **accumulates** W_ih's and both biases' gradients into `grads`; returns d x.
    fn input_backward(&self, x: &Tensor, d_pre: &Tensor, grads: &mut ElmanLayer) -> Result<Tensor> {
        let mut dx = Tensor::zeros(x.shape());
        product_backward(
            x,
            &self.weight_ih,
            1.0,
            d_pre,
            &mut grads.weight_ih,
            (&mut dx, false),
        )?;
        grads.add_bias_grads(d_pre);
        Ok(dx)
    }

    fn add_bias_grads(&mut self, d_pre: &Tensor) {
        for row in d_pre.data().chunks_exact(self.bias_ih.numel()) {
            for ((gi, gh), &d) in self
                .bias_ih
                .data_mut()
                .iter_mut()
                .zip(self.bias_hh.data_mut().iter_mut())
                .zip(row)
            {
                *gi += d;
                *gh += d;
            }
        }
    }

    /// One step of the cell alone, as the encoder-decoder's decoder takes it: x
    /// `[B, In]`, s `[B, Hd]` → `tanh(W_ih·x + b_ih + W_hh·s + b_hh)` `[B, Hd]`.
    pub(crate) fn step(&self, x: &Tensor, s: &Tensor) -> Result<Tensor> {
        let (b_n, hd) = (s.shape()[0], self.weight_hh.shape()[0]);
        let mut pre = self.biases(&[b_n, hd]);
        product_into(&mut pre, x, &self.weight_ih, 1.0, true)?;
        product_into(&mut pre, s, &self.weight_hh, 1.0, true)?;
        pre.data_mut().iter_mut().for_each(|v| *v = v.tanh());
        Ok(pre)
    }

    /// Backward of [`Self::step`]: `next` is its output and `d_next` `[B, Hd]` the
    /// gradient reaching it. **Accumulates** the parameters' gradients into `grads`;
    /// returns (d x `[B, In]`, d s `[B, Hd]`).
    pub(crate) fn step_backward(
        &self,
        (x, s, next): (&Tensor, &Tensor, &Tensor),
        d_next: &Tensor,
        grads: &mut ElmanLayer,
    ) -> Result<(Tensor, Tensor)> {
        // next = tanh(pre)  →  d pre = d next · (1 − next²)
        let mut d_pre = d_next.clone();
        for (d, &h) in d_pre.data_mut().iter_mut().zip(next.data()) {
            *d *= 1.0 - h * h;
        }
        let mut ds = Tensor::zeros(s.shape());
        product_backward(
            s,
            &self.weight_hh,
            1.0,
            &d_pre,
            &mut grads.weight_hh,
            (&mut ds, false),
        )?;
        Ok((self.input_backward(x, &d_pre, grads)?, ds))
    }

    /// One layer over input `[B, T, In]` from h0 `[B, Hd]`: returns its states
    /// `[B, T, Hd]` and its final states `[B·Hd]`.
    fn run(&self, input: &Tensor, lengths: &[usize], h0: &[f32]) -> Result<(Tensor, Vec<f32>)> {
        let (b_n, t_n, hd) = (
            input.shape()[0],
            input.shape()[1],
            self.weight_hh.shape()[0],
        );
        // every step's input projection at once, with both biases: [B, T, Hd]
        let mut pre = self.biases(&[b_n, t_n, hd]);
        product_into(&mut pre, input, &self.weight_ih, 1.0, true)?;
        // the recurrence, one step at a time: state [B, Hd], its product with W_hhᵀ
        let mut state = Tensor::new(&[b_n, hd], h0.to_vec()).expect("h0 is [B, Hd]");
        let mut recur = Tensor::zeros(&[b_n, hd]);
        let mut h = Tensor::zeros(&[b_n, t_n, hd]);
        for t in 0..t_n {
            product_into(&mut recur, &state, &self.weight_hh, 1.0, false)?;
            for b in (0..b_n).filter(|&b| t < lengths[b]) {
                let at = (b * t_n + t) * hd;
                let s = &mut state.data_mut()[b * hd..(b + 1) * hd];
                for (j, s_j) in s.iter_mut().enumerate() {
                    *s_j = (pre.data()[at + j] + recur.data()[b * hd + j]).tanh();
                }
                h.data_mut()[at..at + hd].copy_from_slice(s);
            }
        }
        Ok((h, state.into_data()))
    }

    /// Backward of [`Self::run`]. `d_out` is the gradient of the states `[B, T, Hd]`,
    /// `d_last` that of the final states `[B·Hd]`. Accumulates into `grads`; returns
    /// (d input `[B, T, In]`, dh0 `[B·Hd]`).
    fn backprop(
        &self,
        input: &Tensor,
        h: &Tensor,
        h0: &[f32],
        lengths: &[usize],
        (d_out, d_last): (&Tensor, Option<&[f32]>),
        grads: &mut ElmanLayer,
    ) -> Result<(Tensor, Vec<f32>)> {
        let (b_n, t_n, hd) = (h.shape()[0], h.shape()[1], self.weight_hh.shape()[0]);
        // dh: the gradient reaching the state of each row, carried back step by step.
        // A row's final state is its state after its last real step, and past its
        // length the state is carried unchanged, so d_last enters there untouched.
        let mut dh = Tensor::new(
            &[b_n, hd],
            d_last.map_or_else(|| vec![0.0; b_n * hd], <[f32]>::to_vec),
        )
        .expect("d_last is [B, Hd]");
        // d pre-activation of every real step [B, T, Hd] (zero past a row's length)
        let mut d_pre = Tensor::zeros(&[b_n, t_n, hd]);
        let mut step = Tensor::zeros(&[b_n, hd]);
        let mut d_prev = vec![0.0; b_n * hd];
        for t in (0..t_n).rev() {
            step.data_mut().fill(0.0);
            for b in (0..b_n).filter(|&b| t < lengths[b]) {
                let at = (b * t_n + t) * hd;
                for j in 0..hd {
                    let g = dh.data()[b * hd + j] + d_out.data()[at + j];
                    // h = tanh(pre)  →  d pre = d h · (1 − h²)
                    let hj = h.data()[at + j];
                    step.data_mut()[b * hd + j] = g * (1.0 - hj * hj);
                }
                d_pre.data_mut()[at..at + hd].copy_from_slice(&step.data()[b * hd..][..hd]);
            }
            // pre_t = … + h_{t−1}·W_hhᵀ  →  d h_{t−1} = d pre_t · W_hh ([B, Hd]·[Hd, Hd])
            // for real steps; rows past their length pass dh through unchanged. W_hh's
            // gradient is summed over all steps at once, below.
            gemm(
                MatMut::row_major(&mut d_prev, b_n, hd),
                MatRef::row_major(step.data(), b_n, hd),
                MatRef::row_major(self.weight_hh.data(), hd, hd),
                1.0,
                false,
                Par::Auto,
            )?;
            for b in (0..b_n).filter(|&b| t < lengths[b]) {
                dh.data_mut()[b * hd..(b + 1) * hd].copy_from_slice(&d_prev[b * hd..][..hd]);
            }
        }
        // h_{t−1} for every step: h0 at t = 0, the previous state after
        let mut prev = Tensor::zeros(&[b_n, t_n, hd]);
        for b in 0..b_n {
            for t in 0..t_n {
                let src = if t == 0 {
                    &h0[b * hd..(b + 1) * hd]
                } else {
                    &h.data()[(b * t_n + t - 1) * hd..][..hd]
                };
                prev.data_mut()[(b * t_n + t) * hd..][..hd].copy_from_slice(src);
            }
        }
        // dW_hh += Σ d preᵀ·h_{t−1} ([Hd, B·T]·[B·T, Hd]); dW_ih += Σ d preᵀ·x_t with
        // d input = d pre · W_ih; db_ih = db_hh += Σ d pre
        product_weight_grad(&prev, 1.0, &d_pre, &mut grads.weight_hh)?;
        Ok((self.input_backward(input, &d_pre, grads)?, dh.into_data()))
    }
}

/// Lengths of the B rows: each in 1..=T; all T when `None`.
fn check_lengths(lengths: Option<&[usize]>, b_n: usize, t_n: usize) -> Result<Vec<usize>> {
    let Some(lengths) = lengths else {
        return Ok(vec![t_n; b_n]);
    };
    if lengths.len() != b_n {
        return Err(Error::invalid(
            "rnn lengths",
            format!("{} lengths for a batch of {b_n}", lengths.len()),
        ));
    }
    if let Some((b, &l)) = lengths
        .iter()
        .enumerate()
        .find(|&(_, &l)| l == 0 || l > t_n)
    {
        return Err(Error::invalid(
            "rnn lengths",
            format!("row {b} has length {l}; lengths must lie in 1..={t_n}"),
        ));
    }
    Ok(lengths.to_vec())
}

impl Module for Elman {
    fn visit<'a>(&'a self, path: &mut Path, f: &mut dyn FnMut(&str, &'a Tensor)) {
        for (k, l) in self.layers.iter().enumerate() {
            for (name, t) in [
                ("weight_ih", &l.weight_ih),
                ("weight_hh", &l.weight_hh),
                ("bias_ih", &l.bias_ih),
                ("bias_hh", &l.bias_hh),
            ] {
                let len = path.push(&format!("{name}_l{k}"));
                f(path.as_str(), t);
                path.truncate(len);
            }
        }
    }

    fn visit_mut<'a>(&'a mut self, path: &mut Path, f: &mut dyn FnMut(&str, &'a mut Tensor)) {
        for (k, l) in self.layers.iter_mut().enumerate() {
            for (name, t) in [
                ("weight_ih", &mut l.weight_ih),
                ("weight_hh", &mut l.weight_hh),
                ("bias_ih", &mut l.bias_ih),
                ("bias_hh", &mut l.bias_hh),
            ] {
                let len = path.push(&format!("{name}_l{k}"));
                f(path.as_str(), t);
                path.truncate(len);
            }
        }
    }
}
