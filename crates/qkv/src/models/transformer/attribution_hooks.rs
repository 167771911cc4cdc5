//! What attribution (`models::explain`, the `attribution` module) asks of a
//! [`Transformer`]'s forward: every map's gradient, the maps weighed by value norms,
//! and logits with one key hidden.

use crate::error::{Error, Result};
use crate::models::net::arch::ModelKind;
use crate::models::net::forward::{Net, Side, StackTape};
use crate::module::Module;
use crate::ops::on_pool;
use crate::tensor::Tensor;

use super::model::{Attentions, Input, Transformer};

impl Transformer {
    /// Every attention map of `input` and the gradient of a scalar target with respect
    /// to each (attribution by gradients): the training forward keeping the maps, then
    /// `target` turns its logits (a headless encoder's hidden states) into d target /
    /// d logits, and the training backward carries that down, returning each layer's
    /// d target / d A `[B,H,T,S]` on the way. The parameters' gradients go into a
    /// scratch tree and are dropped: the model's own are untouched.
    pub fn attention_grads(
        &self,
        input: &Input,
        target: impl FnOnce(&Tensor) -> Result<Tensor>,
    ) -> Result<(Attentions, Attentions)> {
        self.expect_f32_weights("attention gradients")?;
        let (logits, tape, maps) = on_pool(|| self.run(input, true, true, None))?;
        let tape = tape.expect("a training forward keeps its tape");
        let dlogits = target(&logits)?;
        dlogits.expect_shape(
            "d target / d logits",
            &logits.shape().iter().map(|&n| Some(n)).collect::<Vec<_>>(),
        )?;
        dlogits.check_finite("d target / d logits")?;
        let mut scratch = self.weights.zeros_like();
        let net = Net {
            map_grads: true,
            ..self.net()
        };
        let grads = on_pool(|| net.backward(tape, &dlogits, &mut scratch))?;
        Ok((
            maps,
            Attentions {
                encoder: grads.encoder,
                decoder: grads.decoder,
                cross: grads.cross,
            },
        ))
    }

    /// Every attention map of `input` weighed by the size of what each key adds through
    /// its head (Kobayashi et al. 2020, "Attention is not only a weight"): α_{h,t,s} ·
    /// ‖W_O^h · v_{h,s}‖, `[B,H,T,S]` per layer of each kind, as the maps.
    pub fn value_norms(&self, input: &Input) -> Result<Attentions> {
        self.expect_f32_weights("value norms")?;
        let (_, tape, maps) = on_pool(|| self.run(input, true, true, None))?;
        let tape = tape.expect("a training forward keeps its tape");
        let weigh = |map: &Tensor, norms: Tensor| -> Result<Tensor> {
            // map [B,H,T,S] times norms [B,H,S] along the keys
            let (t, s) = (map.shape()[2], map.shape()[3]);
            let mut out = map.clone();
            for (rows, n) in out
                .data_mut()
                .chunks_exact_mut(t * s)
                .zip(norms.data().chunks_exact(s))
            {
                for row in rows.chunks_exact_mut(s) {
                    row.iter_mut().zip(n).for_each(|(a, &w)| *a *= w);
                }
            }
            Ok(out)
        };
        let stack =
            |side: Side, tapes: &Option<StackTape>, maps: &[Tensor]| -> Result<Vec<Tensor>> {
                let weights = match side {
                    Side::Encoder => self.weights.encoder.as_ref(),
                    Side::Decoder => self.weights.decoder.as_ref(),
                };
                let (Some(tapes), Some(stack)) = (tapes, weights) else {
                    return Ok(Vec::new());
                };
                tapes
                    .layers
                    .iter()
                    .zip(&stack.layers)
                    .zip(maps)
                    .map(|((lt, layer), map)| {
                        let v = lt.self_values().expect("self-attention keeps its values");
                        weigh(map, layer.attn.value_norms(v)?)
                    })
                    .collect()
            };
        let cross = match (&tape.memory, self.weights.decoder.as_ref()) {
            (Some(memory), Some(dec)) => dec
                .layers
                .iter()
                .zip(&memory.cross)
                .zip(&maps.cross)
                .filter_map(|((layer, kv), map)| layer.cross.as_ref().map(|c| (c, kv, map)))
                .map(|(c, kv, map)| weigh(map, c.value_norms(&kv.v)?))
                .collect::<Result<Vec<_>>>()?,
            _ => Vec::new(),
        };
        Ok(Attentions {
            encoder: stack(Side::Encoder, &tape.encoder, &maps.encoder)?,
            decoder: stack(Side::Decoder, &tape.decoder, &maps.decoder)?,
            cross,
        })
    }

    /// Logits (a headless encoder's hidden states) `[B, T, V]` with key `hidden[b]` of
    /// row b's input text hidden from every attention that reads it: the self-attention
    /// of its stack and, in an encoder-decoder, the cross-attention over the source.
    /// Positions stay those of the whole text (as a Hugging Face forward with a hole in
    /// `attention_mask` keeps them), so the one change is that no query sees the key:
    /// the ablation that attribution compares its methods with. The input text is the
    /// source of an encoder or encoder-decoder and the tokens of a decoder-only model.
    pub fn forward_hiding(&self, input: &Input, hidden: &[usize]) -> Result<Tensor> {
        let text = match self.kind() {
            ModelKind::Decoder => input.target,
            _ => input.source,
        };
        let rows = text.map_or(0, |t| t.batch);
        let len = text.map_or(0, |t| t.len);
        if hidden.len() != rows {
            return Err(Error::invalid(
                "hidden",
                format!("{} keys for {rows} rows: one per row", hidden.len()),
            ));
        }
        if let Some(&bad) = hidden.iter().find(|&&k| k >= len) {
            return Err(Error::OutOfRange {
                what: "hidden key".into(),
                index: bad,
                size: len,
            });
        }
        self.check_forward(input, false)?;
        on_pool(|| self.run(input, false, false, Some(hidden))).map(|(logits, _, _)| logits)
    }
}
