//! The backward of [`Net`]'s forward, walking it in reverse: the head, the decoder's
//! layers (each cross-attention returning the gradient of its keys and values), the
//! cross keys and values back into the memory, then the encoder; the embeddings last.
//! Every step **accumulates** into a gradient tree of the parameters' own type.

use crate::block::CrossKv;
use crate::error::Result;
use crate::layers::linear::product_backward;
use crate::layers::Embedding;
use crate::models::net::arch::{Head, Position};
use crate::models::net::forward::{Encoded, HeadTape, Net, Side, StackTape};
use crate::models::net::weights::Weights;
use crate::position::RelativeBias;
use crate::tensor::Tensor;

/// What a training forward keeps for [`Transformer::backward`](crate::models::Transformer::backward).
pub struct Tape {
    pub(crate) encoder: Option<StackTape>,
    /// the encoder's output and cross keys and values, for an encoder-decoder
    pub(crate) memory: Option<Encoded>,
    pub(crate) decoder: Option<StackTape>,
    pub(crate) head: HeadTape,
}

/// Backward of [`project`](crate::models::net::forward::project), `y = s·h·Wᵀ`: dy → dh `[.., C]`;
/// **accumulates** into `dw` `[V, C]`.
fn project_backward(
    h: &Tensor,
    w: &Tensor,
    s: f32,
    dy: &Tensor,
    dw: &mut Tensor,
) -> Result<Tensor> {
    let mut dh = Tensor::zeros(h.shape());
    product_backward(h, w, s, dy, dw, (&mut dh, false))?;
    Ok(dh)
}

/// Σ over rows of dy `[.., V]`, added into `db` `[V]`.
fn sum_rows_into(dy: &Tensor, db: &mut Tensor) {
    let v = db.numel();
    for row in dy.data().chunks_exact(v) {
        db.data_mut().iter_mut().zip(row).for_each(|(a, b)| *a += b);
    }
}

/// Every layer's attention-map gradients `[B,H,T,S]`, when the net asks for them: the
/// encoder's self-attention, the decoder's, its cross-attention.
#[derive(Default)]
pub(crate) struct MapGrads {
    pub encoder: Vec<Tensor>,
    pub decoder: Vec<Tensor>,
    pub cross: Vec<Tensor>,
}

/// What one stack's backward gives back: each layer's cross keys' and values'
/// gradients, and its maps' gradients (self, cross) when asked.
struct StackGrads {
    d_cross: Vec<Option<CrossKv>>,
    maps: Vec<Tensor>,
    cross_maps: Vec<Tensor>,
}

impl Net<'_> {
    /// The whole backward from d loss / d logits `[B,T,V]`; the maps' gradients when
    /// the net asks for them (empty otherwise).
    pub fn backward(&self, tape: Tape, dlogits: &Tensor, g: &mut Weights) -> Result<MapGrads> {
        let Tape {
            encoder,
            memory,
            decoder,
            head,
        } = tape;
        let dh = self.head_backward(head, dlogits, g)?;
        let mut maps = MapGrads::default();
        let d_memory = match (decoder, &memory) {
            (Some(dec), mem) => {
                let sg = self.stack_backward(Side::Decoder, dec, mem.as_ref(), dh, g)?;
                (maps.decoder, maps.cross) = (sg.maps, sg.cross_maps);
                let d_cross = sg.d_cross;
                match mem {
                    // m feeds every decoder layer's cross keys and values: their
                    // gradients add up before the encoder's backward
                    Some(m) => {
                        let layers = &self.stack_weights(Side::Decoder).layers;
                        let grads = &mut g.decoder.as_mut().expect("decoder grads").layers;
                        let mut dm = Tensor::zeros(m.hidden.shape());
                        for ((layer, lg), d) in layers.iter().zip(grads).zip(d_cross) {
                            if let (Some(cross), Some(gc), Some(d)) =
                                (&layer.cross, lg.cross.as_mut(), d)
                            {
                                dm.add_assign(&cross.cross_kv_backward(&m.hidden, d, gc)?)?;
                            }
                        }
                        Some(dm)
                    }
                    None => None,
                }
            }
            (None, _) => Some(dh),
        };
        if let (Some(enc), Some(dm)) = (encoder, d_memory) {
            maps.encoder = self.stack_backward(Side::Encoder, enc, None, dm, g)?.maps;
        }
        Ok(maps)
    }

    /// Backward of [`Net::head`]: dlogits `[B,T,V]` → dh `[B,T,C]`.
    fn head_backward(&self, tape: HeadTape, dl: &Tensor, g: &mut Weights) -> Result<Tensor> {
        let hw = &self.w.head;
        // logits = cap·tanh(z/cap): dz = dl·(1 − (logits/cap)²)
        let uncapped;
        let dl = match (self.arch.logit_softcap, &tape.capped) {
            (Some(cap), Some(capped)) => {
                let mut dz = dl.clone();
                for (g, &y) in dz.data_mut().iter_mut().zip(capped.data()) {
                    let t = y / cap;
                    *g *= 1.0 - t * t;
                }
                uncapped = dz;
                &uncapped
            }
            _ => dl,
        };
        let table = &self.w.embed_tokens.weight;
        match (self.arch.head, tape.mlm) {
            (Head::None, _) => Ok(dl.clone()),
            (Head::Lm { tied, rescale, .. }, _) => {
                let s = if rescale {
                    (self.arch.d_model as f32).powf(-0.5)
                } else {
                    1.0
                };
                // logits = s·h·Wᵀ (+ a fixed bias)
                match (&hw.lm_head, g.head.lm_head.as_mut(), tied) {
                    (Some(lin), Some(gl), false) => {
                        lin.project_backward(&tape.h, s, dl, &mut gl.weight)
                    }
                    _ => project_backward(&tape.h, table, s, dl, &mut g.embed_tokens.weight),
                }
            }
            (Head::MaskedLm { activation, .. }, Some((z, a, stats, n))) => {
                let (dense, norm) = (hw.dense.as_ref(), hw.norm.as_ref());
                let (dense, norm) = dense.zip(norm).expect("a masked-LM arch builds its head");
                // logits = n·Eᵀ + bias
                sum_rows_into(dl, g.head.bias.as_mut().expect("masked-LM bias grad"));
                let dn = project_backward(&n, table, 1.0, dl, &mut g.embed_tokens.weight)?;
                // n = norm(a), a = act(z), z = dense(h)
                let gn = g.head.norm.as_mut().expect("masked-LM norm grad");
                let da = norm.backward(&dn, &a, &stats, gn)?;
                let mut dz = Tensor::zeros(z.shape());
                activation.backward_slice(z.data(), da.data(), dz.data_mut())?;
                let gd = g.head.dense.as_mut().expect("masked-LM dense grad");
                dense.backward(&tape.h, &dz, gd)
            }
            (Head::MaskedLm { .. }, None) => unreachable!("the masked-LM forward keeps its tape"),
        }
    }

    /// Backward of [`Net::run_stack`] from dh `[B,T,C]`; returns each layer's cross
    /// key/value gradients (decoder layers that read an encoder), and its maps'.
    fn stack_backward(
        &self,
        side: Side,
        tape: StackTape,
        enc: Option<&Encoded>,
        dh: Tensor,
        g: &mut Weights,
    ) -> Result<StackGrads> {
        let StackTape {
            input,
            embed_norm,
            layers,
            final_norm,
        } = tape;
        let stack = self.stack_weights(side);
        let Weights {
            embed_tokens,
            src_embed_tokens,
            encoder,
            decoder,
            ..
        } = g;
        let gs = match side {
            Side::Encoder => encoder,
            Side::Decoder => decoder,
        }
        .as_mut()
        .expect("gradients shaped as the model");
        // h = final_norm(x)
        let mut dx = match (final_norm, &stack.final_norm, gs.final_norm.as_mut()) {
            (Some((x, stats)), Some(norm), Some(gn)) => norm.backward(&dh, &x, &stats, gn)?,
            _ => dh,
        };
        let env = self.env(side, &input)?;
        let cross_padding = enc.map(|e| e.key_padding.as_slice());
        let mut d_cross = Vec::with_capacity(layers.len());
        let (mut maps, mut cross_maps) = (Vec::new(), Vec::new());
        let mut dbias: Option<Tensor> = None;
        for (l, layer_tape) in layers.into_iter().enumerate().rev() {
            let rule = self.rule(side, &env, &input, cross_padding, l, false)?;
            let cross = enc.map(|e| &e.cross[l]);
            let r = stack.layers[l].backward(&rule, layer_tape, cross, dx, &mut gs.layers[l])?;
            dx = r.dx;
            d_cross.push(r.d_cross);
            maps.extend(r.d_weights);
            cross_maps.extend(r.d_cross_weights);
            match (&mut dbias, r.dbias) {
                (Some(sum), Some(d)) => sum.add_assign(&d)?,
                (sum, d) if sum.is_none() => *sum = d,
                _ => {}
            }
        }
        d_cross.reverse();
        maps.reverse();
        cross_maps.reverse();
        // every layer's dense bias came from one relative-position table
        if let (Some(db), Some(table), Some(gt), Position::Relative { max_distance, .. }) = (
            dbias,
            &stack.rel_bias,
            gs.rel_bias.as_mut(),
            &self.arch.position,
        ) {
            let rel =
                RelativeBias::new(table.weight.clone(), side == Side::Encoder, *max_distance)?;
            rel.backward(&db, input.past, &mut gt.weight)?;
        }
        let c = self.arch.d_model;
        let mut dx = dx.reshape(&[input.b * input.t, c])?;
        // x₀ = norm(e)
        if let (Some((e, stats)), Some(norm), Some(gn)) =
            (embed_norm, &stack.embed_norm, gs.embed_norm.as_mut())
        {
            dx = norm.backward(&dx, &e, &stats, gn)?;
        }
        // e = k·table[ids] + positions[pos] + types[type ids]
        if let (Some(types), Some(gt)) = (&stack.embed_types, gs.embed_types.as_mut()) {
            let zeros;
            let ids = match &input.types {
                Some(ids) => ids,
                None => {
                    zeros = vec![0; input.ids.len()];
                    &zeros
                }
            };
            types.backward(ids, &dx, gt)?;
        }
        if let (Some(table), Some(gp)) = (&stack.embed_positions, gs.embed_positions.as_mut()) {
            table.backward(&input.positions, &dx, gp)?;
        }
        let k = self.embed_scale();
        if k != 1.0 {
            dx.data_mut().iter_mut().for_each(|v| *v *= k);
        }
        if let Some(pad) = self.arch.embed.padding_idx {
            let rows = dx.data_mut().chunks_exact_mut(c);
            for (row, _) in rows.zip(&input.ids).filter(|(_, &id)| id == pad) {
                row.fill(0.0);
            }
        }
        let g_table: &mut Embedding = match (side, src_embed_tokens) {
            (Side::Encoder, Some(own)) => own,
            _ => embed_tokens,
        };
        self.table(side).backward(&input.ids, &dx, g_table)?;
        Ok(StackGrads {
            d_cross,
            maps,
            cross_maps,
        })
    }
}
