//! [`Transformer`], its inputs and outputs, and its entry points: inference with or
//! without a KV cache, the encoder alone, and the training forward and backward.

use serde_json::{Map, Value};

use crate::attention::{Kernel, KvCache, KvDType};
use crate::batch::TokenBatch;
use crate::error::{Error, Result};
use crate::models::families::special::SpecialTokens;
use crate::models::families::Family;
use crate::models::info::ModelInfo;
use crate::models::net::arch::{Arch, Head, ModelKind};
use crate::models::net::backward::Tape;
use crate::models::net::footprint;
use crate::models::net::forward::{Caches, Encoded, Net, Side, StackInput};
use crate::models::net::weights::Weights;
use crate::module::Module;
use crate::ops::on_pool;
use crate::tensor::Tensor;
use crate::weights::DType;

/// A model: its architecture, parameters and (once a backward has run) gradients.
#[derive(Clone, Debug)]
pub struct Transformer {
    pub arch: Arch,
    pub family: Family,
    pub special: SpecialTokens,
    pub weights: Weights,
    /// Gradient buffers shaped as `weights`, allocated by the first backward.
    pub grads: Option<Weights>,
    /// Which attention kernel runs (both give the same numbers; the tiled one never
    /// materialises T×S).
    pub kernel: Kernel,
    /// `[V]` a fixed bias on the logits (Marian's `final_logits_bias`)
    pub logits_bias: Option<Tensor>,
    /// What the linear layers compute in ([`Transformer::set_dtype`]).
    pub(super) dtype: DType,
    /// Weights the linear layers hold only in `dtype`, not in f32
    /// ([`Transformer::keep_packed_only`]); 0 when they hold their f32 weights.
    pub(super) packed_only: usize,
    /// What [`Transformer::new_cache`]'s caches store their rows in.
    pub kv_dtype: KvDType,
    info: ModelInfo,
    /// The `config.json` the model was read from (Hugging Face families), written back
    /// on save so the folder stays what transformers expects.
    pub(crate) source_config: Option<Map<String, Value>>,
    /// What the folder says that qkv reads differently from transformers or not at
    /// all, each naming its file and field (`config.json` keys no table knows, special
    /// ids outside the vocabulary): for the CLI and Python to show at load.
    pub load_warnings: Vec<String>,
}

/// A forward's inputs. Decoder-only models read `target`, encoders `source`,
/// encoder-decoders both.
#[derive(Clone, Copy, Debug, Default)]
pub struct Input<'a> {
    /// The encoder's tokens `[B, S]`.
    pub source: Option<&'a TokenBatch>,
    /// `[B·S]` BERT segment ids for `source` (all 0 when absent).
    pub token_types: Option<&'a [usize]>,
    /// The decoder's tokens `[B, T]`.
    pub target: Option<&'a TokenBatch>,
}

/// Attention weights of every layer, each `[B, H, T, S]`.
#[derive(Clone, Debug, Default)]
pub struct Attentions {
    /// The encoder's self-attention (encoders and encoder-decoders).
    pub encoder: Vec<Tensor>,
    /// The decoder's causal self-attention.
    pub decoder: Vec<Tensor>,
    /// The decoder's cross-attention over the source.
    pub cross: Vec<Tensor>,
}

/// What [`Transformer::forward`] returns.
#[derive(Clone, Debug)]
pub struct Output {
    /// `[B, T, V]` logits, or `[B, S, C]` hidden states for a model without a head.
    pub logits: Tensor,
    /// Filled when asked for.
    pub attentions: Attentions,
}

impl Transformer {
    /// Assembles a model from its parts, checking them against each other.
    pub(crate) fn from_parts(
        arch: Arch,
        family: Family,
        special: SpecialTokens,
        weights: Weights,
        logits_bias: Option<Tensor>,
        source_config: Option<Map<String, Value>>,
        architecture: String,
    ) -> Result<Self> {
        arch.validate()?;
        let info = ModelInfo::describe(&arch, family, architecture);
        Ok(Transformer {
            arch,
            family,
            special,
            weights,
            grads: None,
            kernel: Kernel::Tiled,
            logits_bias,
            dtype: DType::F32,
            packed_only: 0,
            kv_dtype: KvDType::F32,
            info,
            source_config,
            load_warnings: Vec::new(),
        })
    }

    /// A freshly initialised model (GPT-2's initialisation, see [`Weights::init`]),
    /// every random draw from `seed`. It saves as GPT-2 or Llama when `arch` is exactly
    /// one, else as qkv's own folder.
    pub fn new(arch: &Arch, seed: u64) -> Result<Self> {
        arch.validate()?;
        let mut weights = Weights::new(arch)?;
        weights.init(arch, seed);
        let family = Family::of_fresh(arch);
        let logits_bias = matches!(
            arch.head,
            Head::Lm {
                logits_bias: true,
                ..
            }
        )
        .then(|| Tensor::zeros(&[arch.vocab]));
        Transformer::from_parts(
            arch.clone(),
            family,
            SpecialTokens::default(),
            weights,
            logits_bias,
            None,
            family.architecture().into(),
        )
    }

    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    pub fn special_tokens(&self) -> &SpecialTokens {
        &self.special
    }

    pub fn kind(&self) -> ModelKind {
        self.arch.kind()
    }

    /// Number of parameters (a tied or shared table counts once), those held only in a
    /// reduced type included.
    pub fn num_params(&self) -> usize {
        self.weights.num_params() + self.packed_only
    }

    pub(crate) fn net(&self) -> Net<'_> {
        Net {
            arch: &self.arch,
            w: &self.weights,
            kernel: self.kernel,
            logits_bias: self.logits_bias.as_ref(),
            map_grads: false,
        }
    }

    pub(crate) fn needs(&self, kind: ModelKind, what: &str) -> Result<()> {
        if self.kind() != kind {
            return Err(Error::invalid(
                what,
                format!("{} is a {:?} model", self.info.architecture, self.kind()),
            ));
        }
        Ok(())
    }

    /// The inputs of a whole-sequence run of `side` over `tokens`.
    fn stack_input(
        &self,
        side: Side,
        tokens: &TokenBatch,
        types: Option<&[usize]>,
    ) -> Result<StackInput> {
        let net = self.net();
        tokens.check_vocab(net.table(side).vocab_size())?;
        if let Some(types) = types {
            let n = self.arch.embed.token_types;
            if types.len() != tokens.ids.len() {
                return Err(Error::shape(
                    "token_type_ids",
                    format!("[{}, {}] like input_ids", tokens.batch, tokens.len),
                    &[types.len()],
                ));
            }
            if let Some(&bad) = types.iter().find(|&&ty| ty >= n) {
                return Err(Error::OutOfRange {
                    what: "token type id (type_vocab_size)".into(),
                    index: bad,
                    size: n,
                });
            }
        }
        Ok(StackInput {
            ids: tokens.ids.clone(),
            types: types.map(<[usize]>::to_vec),
            b: tokens.batch,
            t: tokens.len,
            positions: net.positions(&tokens.mask, tokens.len, &vec![0; tokens.batch])?,
            key_padding: tokens.mask.clone(),
            past: 0,
        })
    }

    /// A LongRoPE model's pre-training length, at which its generation recomputes the
    /// sequence with the long factors (see `generate`).
    pub fn long_rope_switch(&self) -> Option<usize> {
        match &self.arch.position {
            crate::models::net::arch::Position::Rope {
                scaling: crate::position::RopeScaling::LongRope(l),
                ..
            } => Some(l.original_max),
            _ => None,
        }
    }

    /// An empty KV cache for `batch` rows of the decoder, storing its rows in
    /// [`Transformer::kv_dtype`].
    pub fn new_cache(&self, batch: usize) -> KvCache {
        let d = self.arch.stack();
        KvCache::new_as(
            self.kv_dtype,
            d.layers,
            batch,
            d.kv_heads,
            d.head_dim,
            d.head_dim,
        )
    }

    /// Decoder-only: tokens `[B, T]` placed after everything in `cache` (which grows by
    /// T) → logits `[B, T, V]`. A whole sequence is one call on an empty cache.
    pub fn forward_cached(&self, tokens: &TokenBatch, cache: &mut KvCache) -> Result<Tensor> {
        self.needs(ModelKind::Decoder, "forward_cached")?;
        on_pool(|| self.step(tokens, None, cache, false))
    }

    /// [`Transformer::forward_cached`] for a prompt that only its next token is wanted
    /// of: the logits of the last position alone, `[B, 1, V]`. The head then costs one
    /// row per sequence instead of T, and a long prompt's `[B, T, V]` logits (gigabytes
    /// at a vocabulary of 32 000) are never made. Rows are left-padded, so every row's
    /// last position is real.
    pub fn prefill(&self, tokens: &TokenBatch, cache: &mut KvCache) -> Result<Tensor> {
        self.needs(ModelKind::Decoder, "prefill")?;
        on_pool(|| self.step(tokens, None, cache, true))
    }

    /// Encoder-decoder: tgt `[B, T]` decoder tokens after those in `cache` → logits
    /// `[B, T, V]`, reading the encoder output `enc`.
    pub fn decode_cached(
        &self,
        tgt: &TokenBatch,
        enc: &Encoded,
        cache: &mut KvCache,
    ) -> Result<Tensor> {
        self.needs(ModelKind::EncoderDecoder, "decode_cached")?;
        let layers = self.arch.stack().layers;
        if enc.hidden.shape().first() != Some(&tgt.batch) || enc.cross.len() != layers {
            return Err(Error::invalid(
                "encoder output",
                format!(
                    "holds {:?} states and {} cross K/V; the decoder needs batch {} and {layers} layers",
                    enc.hidden.shape(),
                    enc.cross.len(),
                    tgt.batch
                ),
            ));
        }
        on_pool(|| self.step(tgt, Some(enc), cache, false))
    }

    /// One decoding step of the decoder stack through the cache; with `last_only`, the
    /// logits of each row's last position alone.
    fn step(
        &self,
        tokens: &TokenBatch,
        enc: Option<&Encoded>,
        cache: &mut KvCache,
        last_only: bool,
    ) -> Result<Tensor> {
        let net = self.net();
        tokens.check_vocab(self.arch.vocab)?;
        cache.check_layers(self.arch.stack().layers)?;
        let step = cache.begin_step(&tokens.mask, tokens.len, self.arch.max_positions())?;
        let input = StackInput {
            ids: tokens.ids.clone(),
            types: None,
            b: tokens.batch,
            t: tokens.len,
            positions: step.positions,
            key_padding: step.key_padding,
            past: step.past,
        };
        let out = net.run_stack(
            Side::Decoder,
            input,
            Caches::Batch(&mut cache.layers),
            enc,
            false,
            false,
        )?;
        let (b, t, c) = (tokens.batch, tokens.len, self.arch.d_model);
        let h = match last_only && t > 1 {
            // h [B, T, C] → its last position [B, 1, C]
            true => {
                let rows = out
                    .h
                    .data()
                    .chunks_exact(t * c)
                    .map(|row| &row[(t - 1) * c..]);
                Tensor::new(&[b, 1, c], rows.flatten().copied().collect())?
            }
            false => out.h,
        };
        Ok(net.head(h, false)?.0)
    }

    /// Encoders and encoder-decoders: src `[B, S]` → the encoder's states and each
    /// decoder layer's cross keys and values.
    pub fn encode(&self, src: &TokenBatch) -> Result<Encoded> {
        let h = self.hidden_states(src, None)?;
        self.net().encoded(h, src.mask.clone())
    }

    /// The encoder's last hidden states `[B, S, C]` (BERT's `last_hidden_state`) for
    /// tokens `[B, S]` and optional segment ids `[B·S]`. Outputs at padding positions
    /// are unspecified.
    pub fn hidden_states(
        &self,
        tokens: &TokenBatch,
        token_types: Option<&[usize]>,
    ) -> Result<Tensor> {
        if self.arch.encoder.is_none() {
            return Err(Error::invalid(
                "encode",
                "a decoder-only model has no encoder",
            ));
        }
        self.check_memory(footprint::Shapes {
            batch: tokens.batch,
            source: tokens.len,
            target: 0,
            head: false,
            attentions: false,
        })?;
        let input = self.stack_input(Side::Encoder, tokens, token_types)?;
        let out = on_pool(|| {
            self.net()
                .run_stack(Side::Encoder, input, Caches::None, None, false, false)
        })?;
        Ok(out.h)
    }

    /// A whole forward without a cache: logits (or an encoder's hidden states), and
    /// every layer's attention weights when `attentions` is set.
    /// A request larger than the machine's free memory is refused before it runs.
    pub fn forward(&self, input: &Input, attentions: bool) -> Result<Output> {
        self.check_forward(input, attentions)?;
        on_pool(|| self.run(input, false, attentions, None)).map(|(logits, _, a)| Output {
            logits,
            attentions: a,
        })
    }

    /// Refuses a whole forward of `input` (with every map when `attentions`) that would
    /// not fit in the machine's free memory.
    pub(super) fn check_forward(&self, input: &Input, attentions: bool) -> Result<()> {
        let rows = |b: Option<&TokenBatch>| b.map_or((0, 0), |b| (b.batch, b.len));
        let ((bs, source), (bt, target)) = (rows(input.source), rows(input.target));
        self.check_memory(footprint::Shapes {
            batch: bs.max(bt),
            source,
            target,
            head: true,
            attentions,
        })
    }

    /// Refuses a forward of `shapes` that would not fit in the machine's free memory.
    pub(crate) fn check_memory(&self, shapes: footprint::Shapes) -> Result<()> {
        let maps = match shapes.attentions {
            true => " with every attention map",
            false => "",
        };
        let tokens = match (shapes.source, shapes.target) {
            (s, 0) | (0, s) => format!("{s}"),
            (s, t) => format!("{s} source and {t} target"),
        };
        crate::io::memory::check(
            footprint::forward_bytes(&self.arch, shapes),
            &format!("a forward over {} × {tokens} tokens{maps}", shapes.batch),
        )
    }

    /// The training forward: logits and what [`Transformer::backward`] needs.
    pub fn forward_train(&self, input: &Input) -> Result<(Tensor, Tape)> {
        self.expect_f32_weights("train")?;
        if self.arch.head == Head::None {
            return Err(Error::Unsupported(format!(
                "{} has no head to train (a masked-LM BERT is BertForMaskedLM with its `cls.predictions` weights)",
                self.info.architecture
            )));
        }
        let (logits, tape, _) = on_pool(|| self.run(input, true, false, None))?;
        Ok((logits, tape.expect("a model with a head keeps its tape")))
    }

    /// Backward from d loss / d logits `[B,T,V]` of a [`Transformer::forward_train`]:
    /// **accumulates** into the gradients (allocated, zero, on first use).
    pub fn backward(&mut self, tape: Tape, dlogits: &Tensor) -> Result<()> {
        dlogits.check_finite("dlogits")?;
        let mut grads = self
            .grads
            .take()
            .unwrap_or_else(|| self.weights.zeros_like());
        let net = self.net();
        let result = on_pool(|| net.backward(tape, dlogits, &mut grads));
        self.grads = Some(grads);
        result.map(|_| ())
    }

    pub(super) fn run(
        &self,
        input: &Input,
        keep: bool,
        weights: bool,
        hidden: Option<&[usize]>,
    ) -> Result<(Tensor, Option<Tape>, Attentions)> {
        let net = self.net();
        // the input text's key padding with row b's key hidden[b] hidden
        let hide = |si: &mut StackInput| {
            for (b, &k) in hidden.into_iter().flatten().enumerate() {
                si.key_padding[b * si.t + k] = false;
            }
        };
        let mut attn = Attentions::default();
        let (source, target) = match self.kind() {
            ModelKind::Decoder => (None, input.target),
            ModelKind::Encoder => (input.source, None),
            ModelKind::EncoderDecoder => (input.source, input.target),
        };
        let missing = |what| Error::invalid(what, format!("{} needs it", self.info.architecture));
        let (enc_tape, memory) = match (self.arch.encoder.is_some(), source) {
            (true, Some(src)) => {
                let mut si = self.stack_input(Side::Encoder, src, input.token_types)?;
                hide(&mut si);
                let mask = si.key_padding.clone();
                let out = net.run_stack(Side::Encoder, si, Caches::None, None, keep, weights)?;
                attn.encoder = out.weights;
                (out.tape, Some((out.h, mask)))
            }
            (true, None) => return Err(missing("source")),
            (false, _) => (None, None),
        };
        let (h, dec_tape, memory) = match (self.arch.decoder.is_some(), target, memory) {
            (true, Some(tgt), memory) => {
                let enc = memory.map(|(h, mask)| net.encoded(h, mask)).transpose()?;
                let mut si = self.stack_input(Side::Decoder, tgt, None)?;
                if self.kind() == ModelKind::Decoder {
                    hide(&mut si);
                }
                let out =
                    net.run_stack(Side::Decoder, si, Caches::None, enc.as_ref(), keep, weights)?;
                attn.decoder = out.weights;
                attn.cross = out.cross_weights;
                (out.h, out.tape, enc)
            }
            (true, None, _) => return Err(missing("target")),
            (false, _, Some((h, _))) => (h, None, None),
            (false, _, None) => unreachable!("an arch has a stack"),
        };
        let (logits, head) = net.head(h, keep)?;
        let tape = head.map(|head| Tape {
            encoder: enc_tape,
            memory,
            decoder: dec_tape,
            head,
        });
        Ok((logits, tape, attn))
    }
}
