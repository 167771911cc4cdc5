//! The parameter tree of a Transformer, built from its [`Arch`]. Gradients are a
//! second [`Weights`]. The tree's paths are qkv's own names
//! (`decoder.layers.0.attn.q.weight`); each family maps them to its checkpoint names.

use crate::block::{Block, MultiHeadAttention};
use crate::error::Result;
use crate::layers::{Embedding, FeedForward, Linear, Norm};
use crate::models::net::arch::{Arch, Head, Position, StackDims};
use crate::module::Module;
use crate::rng::Rng;
use crate::tensor::Tensor;
use crate::weights::DType;

crate::module! {
    /// Every parameter of a model.
    #[derive(Clone, Debug)]
    pub struct Weights {
        /// `[V, C]` the decoder's token table (an encoder-only model's), which the encoder
        /// reads too unless it has its own
        pub embed_tokens: Embedding,
        /// `[V_src, C]` the encoder's own table
        pub src_embed_tokens: Option<Embedding>,
        pub encoder: Option<Stack>,
        pub decoder: Option<Stack>,
        pub head: HeadWeights,
    }
}

crate::module! {
    /// One stack: what it adds to the token embeddings, its layers, its final norm.
    #[derive(Clone, Debug)]
    pub struct Stack {
        /// `[max_len, C]` learned positions
        pub embed_positions: Option<Embedding>,
        /// `[token_types, C]`
        pub embed_types: Option<Embedding>,
        pub embed_norm: Option<Norm>,
        /// `[buckets, H]` T5's relative position bias, shared by the stack's layers
        pub rel_bias: Option<Embedding>,
        pub layers: Vec<Block>,
        /// pre-norm stacks end with a norm
        pub final_norm: Option<Norm>,
    }
}

crate::module! {
    /// The head's parameters, as [`Head`] asks.
    #[derive(Clone, Debug)]
    pub struct HeadWeights {
        /// `[V, C]` an untied LM head
        pub lm_head: Option<Linear>,
        /// masked-LM transform: dense C → C
        pub dense: Option<Linear>,
        /// masked-LM transform: norm
        pub norm: Option<Norm>,
        /// `[V]` masked-LM output bias
        pub bias: Option<Tensor>,
    }
}

impl Weights {
    /// Packs every linear layer for inference, in `dtype`
    /// ([`crate::layers::Linear::pack_as`]): the attention and FFN projections of both
    /// stacks and the head's own layers. A tied head reads the token table in place,
    /// in f32.
    pub fn pack_weights(&mut self, dtype: DType) {
        self.linears_mut().for_each(|l| l.pack_as(dtype));
    }

    /// Every linear layer: the attention and FFN projections of both stacks and the
    /// head's own layers (a tied head is the token table, not a linear layer).
    pub fn linears_mut(&mut self) -> impl Iterator<Item = &mut crate::layers::Linear> {
        let stacks = [&mut self.encoder, &mut self.decoder].into_iter().flatten();
        let layers = stacks.flat_map(|s| s.layers.iter_mut().flat_map(|l| l.linears_mut()));
        let head = [&mut self.head.lm_head, &mut self.head.dense]
            .into_iter()
            .flatten();
        layers.chain(head)
    }
}

/// Standard deviation of GPT-2's initialisation.
const INIT_STD: f32 = 0.02;

impl Weights {
    /// The tree `arch` describes: matrices and tables zero, norms weight 1 and bias 0.
    /// ([`Weights::init`] draws the matrices; a loader overwrites every tensor.)
    pub fn new(arch: &Arch) -> Result<Self> {
        let c = arch.d_model;
        let table = |rows: usize| Embedding::new(Tensor::zeros(&[rows, c]));
        let norm_of = |width: usize| {
            let n = Norm::identity(arch.norm.kind, width, arch.norm.bias, arch.norm.eps)?;
            Ok::<_, crate::error::Error>(match arch.norm.unit_offset {
                true => n.with_unit_offset(),
                false => n,
            })
        };
        let norm = || norm_of(c);
        let linear = |out: usize, inp: usize, bias: bool| {
            Linear::new(
                Tensor::zeros(&[out, inp]),
                bias.then(|| Tensor::zeros(&[out])),
            )
        };
        let stack = |dims: Option<StackDims>, cross: bool| -> Result<Option<Stack>> {
            let Some(s) = dims else { return Ok(None) };
            let (h, g, d) = (s.heads, s.kv_heads, s.head_dim);
            let a = &arch.attention;
            let head_norm = || norm_of(d);
            let attention = || {
                let mha = MultiHeadAttention::new(
                    linear(h * d, c, a.qkv_bias)?,
                    linear(g * d, c, a.qkv_bias)?,
                    linear(g * d, c, a.qkv_bias)?,
                    linear(c, h * d, a.out_bias)?,
                    h,
                    g,
                )?;
                match a.qk_norm {
                    true => mha.with_head_norms(head_norm()?, head_norm()?),
                    false => Ok(mha),
                }
            };
            let f = &arch.ffn;
            let sandwich = arch.residual == crate::block::Residual::Sandwich;
            let layers = (0..s.layers)
                .map(|l| {
                    Ok(Block {
                        attn_norm: (l > 0 || !arch.embed.first_attn_unnormed)
                            .then(norm)
                            .transpose()?,
                        attn: attention()?,
                        cross_norm: cross.then(norm).transpose()?,
                        cross: cross.then(attention).transpose()?,
                        ffn_norm: norm()?,
                        attn_post_norm: sandwich.then(norm).transpose()?,
                        ffn_post_norm: sandwich.then(norm).transpose()?,
                        ffn: FeedForward::new(
                            linear(s.ffn_dim, c, f.bias)?,
                            f.gated.then(|| linear(s.ffn_dim, c, f.bias)).transpose()?,
                            linear(c, s.ffn_dim, f.bias)?,
                            f.activation,
                        )?,
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            let learned = match arch.position {
                Position::Learned { max_len } => Some(table(max_len)?),
                _ => None,
            };
            let rel_bias = match arch.position {
                Position::Relative { buckets, .. } => {
                    Some(Embedding::new(Tensor::zeros(&[buckets, h]))?)
                }
                _ => None,
            };
            Ok(Some(Stack {
                embed_positions: learned,
                embed_types: (arch.embed.token_types > 0)
                    .then(|| table(arch.embed.token_types))
                    .transpose()?,
                embed_norm: arch.embed.norm.then(norm).transpose()?,
                rel_bias,
                layers,
                final_norm: (arch.residual != crate::block::Residual::PostNorm)
                    .then(norm)
                    .transpose()?,
            }))
        };
        let (masked, dense_bias) = match arch.head {
            Head::MaskedLm { dense_bias, .. } => (true, dense_bias),
            _ => (false, false),
        };
        Ok(Weights {
            embed_tokens: table(arch.vocab)?,
            src_embed_tokens: arch.src_vocab.map(table).transpose()?,
            encoder: stack(arch.encoder, false)?,
            decoder: stack(arch.decoder, arch.encoder.is_some())?,
            head: HeadWeights {
                lm_head: match arch.head {
                    Head::Lm { tied: false, .. } => Some(linear(arch.vocab, c, false)?),
                    _ => None,
                },
                dense: masked.then(|| linear(c, c, dense_bias)).transpose()?,
                norm: masked.then(norm).transpose()?,
                bias: masked.then(|| Tensor::zeros(&[arch.vocab])),
            },
        })
    }

    /// Elements [`Weights::new`] would allocate for `arch`, counted without allocating;
    /// `None` when a size overflows. It mirrors `new` term by term (a test holds the two
    /// equal), so that a config's sizes can be checked before anything is allocated.
    pub fn count(arch: &Arch) -> Option<usize> {
        let c = arch.d_model;
        let sum = |terms: &[Option<usize>]| {
            terms
                .iter()
                .try_fold(0usize, |acc, t| acc.checked_add((*t)?))
        };
        let table = |rows: usize| rows.checked_mul(c);
        let norm = c.checked_mul(1 + usize::from(arch.norm.bias));
        let linear = |out: usize, inp: usize, bias: bool| {
            out.checked_mul(inp)?
                .checked_add(if bias { out } else { 0 })
        };
        let stack = |dims: Option<StackDims>, cross: bool| -> Option<usize> {
            let Some(s) = dims else { return Some(0) };
            let (hd, gd) = (
                s.heads.checked_mul(s.head_dim)?,
                s.kv_heads.checked_mul(s.head_dim)?,
            );
            let a = &arch.attention;
            let head_norm = s.head_dim.checked_mul(1 + usize::from(arch.norm.bias));
            let attention = sum(&[
                linear(hd, c, a.qkv_bias),
                linear(gd, c, a.qkv_bias),
                linear(gd, c, a.qkv_bias),
                linear(c, hd, a.out_bias),
                if a.qk_norm {
                    head_norm?.checked_mul(2)
                } else {
                    Some(0)
                },
            ]);
            let f = &arch.ffn;
            let up = linear(s.ffn_dim, c, f.bias);
            let layer = sum(&[
                norm,
                attention,
                if cross { norm } else { Some(0) },
                if cross { attention } else { Some(0) },
                norm,
                if arch.residual == crate::block::Residual::Sandwich {
                    norm?.checked_mul(2)
                } else {
                    Some(0)
                },
                up,
                if f.gated { up } else { Some(0) },
                linear(c, s.ffn_dim, f.bias),
            ]);
            sum(&[
                // ModernBERT's first layer has no attention norm
                layer?.checked_mul(s.layers)?.checked_sub(
                    match arch.embed.first_attn_unnormed && s.layers > 0 {
                        true => norm?,
                        false => 0,
                    },
                ),
                match arch.position {
                    Position::Learned { max_len } => table(max_len),
                    _ => Some(0),
                },
                match arch.position {
                    Position::Relative { buckets, .. } => buckets.checked_mul(s.heads),
                    _ => Some(0),
                },
                table(arch.embed.token_types),
                if arch.embed.norm { norm } else { Some(0) },
                if arch.residual != crate::block::Residual::PostNorm {
                    norm
                } else {
                    Some(0)
                },
            ])
        };
        let (masked, dense_bias) = match arch.head {
            Head::MaskedLm { dense_bias, .. } => (true, dense_bias),
            _ => (false, false),
        };
        sum(&[
            table(arch.vocab),
            arch.src_vocab.map_or(Some(0), table),
            stack(arch.encoder, false),
            stack(arch.decoder, arch.encoder.is_some()),
            match arch.head {
                Head::Lm { tied: false, .. } => linear(arch.vocab, c, false),
                _ => Some(0),
            },
            if masked {
                sum(&[linear(c, c, dense_bias), norm, Some(arch.vocab)])
            } else {
                Some(0)
            },
        ])
    }

    /// GPT-2's initialisation, drawn in visiting order from one seeded [`Rng`]: every
    /// matrix and table ~ N(0, 0.02²), except the projections that end a residual branch
    /// (`attn.o`, `cross.o`, `ffn.down`), ~ N(0, (0.02/√n)²) with n the residual
    /// branches of their stack; biases 0, norms 1 (as [`Weights::new`] left them).
    pub fn init(&mut self, arch: &Arch, seed: u64) {
        let mut rng = Rng::new(seed);
        let branches = |stack: &str| match stack {
            "encoder" => arch.encoder.map_or(1, |e| 2 * e.layers),
            _ => arch
                .decoder
                .map_or(1, |d| (2 + arch.encoder.is_some() as usize) * d.layers),
        };
        self.visit_mut(&mut crate::module::Path::default(), &mut |name, t| {
            if t.rank() < 2 {
                return;
            }
            let ends_branch = [".attn.o.", ".cross.o.", ".ffn.down."]
                .iter()
                .any(|s| name.contains(s));
            let std = if ends_branch {
                let stack = name.split('.').next().unwrap_or("");
                INIT_STD / (branches(stack).max(1) as f32).sqrt()
            } else {
                INIT_STD
            };
            *t = rng.tensor(t.shape(), std);
        });
    }
}
