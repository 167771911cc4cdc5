//! Which maps to take from a forward's attentions: the kinds (encoder, decoder, cross),
//! a layer or all, a head, all or their mean; the shapes they have, known from the
//! model's sizes before it runs, and the weights they hold.

use anyhow::{bail, Result};
use qkv::models::explain::Method;
use qkv::models::{Attentions, ModelKind, Transformer};
use qkv::Tensor;
use serde::Serialize;

/// Most weights one output may hold: about 160 MB of JSON, a page a browser still opens.
pub const MAX_WEIGHTS: usize = 16 << 20;

/// The maps `method` makes of a forward over `s` source and `t` target tokens, by kind
/// (known from the model's sizes before it runs).
pub fn expected_shapes(
    model: &Transformer,
    s: usize,
    t: usize,
    method: Method,
) -> Vec<(Kind, Shape)> {
    let info = model.info();
    let shape = |layers, queries, keys| Shape {
        layers,
        heads: match method.per_head() {
            true => info.heads,
            false => 1,
        },
        queries,
        keys,
    };
    match model.kind() {
        ModelKind::Encoder => vec![(Kind::Encoder, shape(info.layers, s, s))],
        ModelKind::Decoder => vec![(Kind::Decoder, shape(info.layers, t, t))],
        ModelKind::EncoderDecoder => {
            let dec = info.decoder_layers.unwrap_or(info.layers);
            let mut kinds = vec![
                (Kind::Encoder, shape(info.layers, s, s)),
                (Kind::Decoder, shape(dec, t, t)),
                (Kind::Cross, shape(dec, t, s)),
            ];
            // flow is a graph of one stack's self-attention
            if method == Method::Flow {
                kinds.pop();
            }
            kinds
        }
    }
}

/// Refuses a selection whose output would hold more than [`MAX_WEIGHTS`] weights.
pub fn check_count(sel: &Selection, shapes: &[(Kind, Shape)]) -> Result<()> {
    let count = sel.count(shapes)?;
    if count > MAX_WEIGHTS {
        bail!(
            "the output would hold {count} weights (at most {MAX_WEIGHTS}); pick --kind, --layer or --head, or a shorter text"
        );
    }
    Ok(())
}

/// Which attention of the model a map shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// The encoder's self-attention (encoders, encoder-decoders).
    Encoder,
    /// The decoder's causal self-attention.
    Decoder,
    /// The decoder's attention over the encoder's output.
    Cross,
}

impl Kind {
    pub fn describe(self) -> &'static str {
        match self {
            Kind::Encoder => "encoder self-attention",
            Kind::Decoder => "decoder self-attention",
            Kind::Cross => "cross-attention",
        }
    }

    /// This kind's maps among `att`, one per layer.
    pub fn of(self, att: &Attentions) -> &[Tensor] {
        match self {
            Kind::Encoder => &att.encoder,
            Kind::Decoder => &att.decoder,
            Kind::Cross => &att.cross,
        }
    }

    /// The kinds `att` has, in model order.
    pub fn present(att: &Attentions) -> Vec<Kind> {
        [Kind::Encoder, Kind::Decoder, Kind::Cross]
            .into_iter()
            .filter(|k| !k.of(att).is_empty())
            .collect()
    }
}

/// Which heads a map holds: all, one, or their average.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Heads {
    All,
    One(usize),
    Mean,
}

/// The sizes of one kind's maps: `layers` maps of `[heads, queries, keys]` weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub layers: usize,
    pub heads: usize,
    pub queries: usize,
    pub keys: usize,
}

impl Shape {
    /// The shapes of the maps in `att` (a batch of one), by kind.
    pub fn of(att: &Attentions) -> Vec<(Kind, Shape)> {
        Kind::present(att)
            .into_iter()
            .map(|k| {
                let all = k.of(att);
                let s = all[0].shape();
                let shape = Shape {
                    layers: all.len(),
                    heads: s[1],
                    queries: s[2],
                    keys: s[3],
                };
                (k, shape)
            })
            .collect()
    }
}

/// What to take from a forward's attentions.
#[derive(Clone, Debug)]
pub struct Selection {
    pub kinds: Vec<Kind>,
    /// One layer, or every layer.
    pub layer: Option<usize>,
    pub heads: Heads,
}

/// One layer's weights for the chosen heads.
#[derive(Clone, Debug)]
pub struct Map {
    pub kind: Kind,
    pub layer: usize,
    /// "0", "1", … or "mean".
    pub heads: Vec<String>,
    /// Query tokens T (rows).
    pub queries: usize,
    /// Key tokens S (columns).
    pub keys: usize,
    /// `[heads, T, S]`: attention weights sum to 1 over the keys a row may see.
    pub weights: Vec<f32>,
    /// The heads are combined (rollout, flow, grad): one `[T, S]`, serialised without
    /// a head level.
    pub combined: bool,
}

impl Map {
    /// Head `h`'s `[T, S]` rows.
    pub fn head(&self, h: usize) -> &[f32] {
        let size = self.queries * self.keys;
        &self.weights[h * size..(h + 1) * size]
    }
}

/// `[1, H, T, S]` weights of one layer → the chosen heads' `[h, T, S]`, with names.
fn pick(att: &Tensor, heads: Heads) -> (Vec<String>, Vec<f32>) {
    let shape = att.shape();
    let (h, size) = (shape[1], shape[2] * shape[3]);
    let data = &att.data()[..h * size];
    match heads {
        Heads::All => ((0..h).map(|i| i.to_string()).collect(), data.to_vec()),
        Heads::One(i) => (vec![i.to_string()], data[i * size..(i + 1) * size].to_vec()),
        Heads::Mean => {
            let mut mean = vec![0f32; size];
            for head in data.chunks_exact(size) {
                mean.iter_mut().zip(head).for_each(|(m, &w)| *m += w);
            }
            mean.iter_mut().for_each(|m| *m /= h as f32);
            (vec!["mean".into()], mean)
        }
    }
}

impl Selection {
    /// Checks that the layer and head exist in every chosen kind of `shapes` (the kinds
    /// a model has), and counts the weights the selection holds: known before the
    /// forward runs, from the model's sizes and the token counts.
    pub fn count(&self, shapes: &[(Kind, Shape)]) -> Result<usize> {
        let mut total = 0usize;
        for &kind in &self.kinds {
            let Some(&(_, s)) = shapes.iter().find(|(k, _)| *k == kind) else {
                bail!("this model has no {}", kind.describe());
            };
            if let Some(l) = self.layer.filter(|&l| l >= s.layers) {
                bail!(
                    "--layer {l} is out of range: the {} has {} layers (0 to {})",
                    kind.describe(),
                    s.layers,
                    s.layers - 1
                );
            }
            if let Heads::One(h) = self.heads {
                if h >= s.heads {
                    bail!(
                        "--head {h} is out of range: the {} has {} heads (0 to {}, or mean)",
                        kind.describe(),
                        s.heads,
                        s.heads - 1
                    );
                }
            }
            let layers = if self.layer.is_some() { 1 } else { s.layers };
            let heads = if self.heads == Heads::All { s.heads } else { 1 };
            let weights = [layers, heads, s.queries, s.keys]
                .iter()
                .fold(1usize, |acc, &x| acc.saturating_mul(x));
            total = total.saturating_add(weights);
        }
        Ok(total)
    }

    /// Takes the selection from `att` (a batch of one), checked as [`Selection::count`];
    /// `combined` maps hold one `[T, S]` per layer.
    pub fn take(&self, att: &Attentions, combined: bool) -> Result<Vec<Map>> {
        self.count(&Shape::of(att))?;
        let mut layers = Vec::new();
        for &kind in &self.kinds {
            for (l, w) in kind.of(att).iter().enumerate() {
                if self.layer.is_some_and(|only| only != l) {
                    continue;
                }
                let (names, weights) = pick(w, self.heads);
                layers.push(Map {
                    kind,
                    layer: l,
                    heads: names,
                    queries: w.shape()[2],
                    keys: w.shape()[3],
                    weights,
                    combined,
                });
            }
        }
        Ok(layers)
    }
}
