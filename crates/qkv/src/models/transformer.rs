//! [`Transformer`]: one model for every family and for both uses. It runs checkpoints
//! (with a KV cache when generating), trains (a forward that keeps what the backward
//! needs, and the backward), returns attention weights when asked, and saves itself in
//! its family's layout.

use serde_json::{Map, Value};

use super::families::special::SpecialTokens;
use super::families::Family;
use super::info::ModelInfo;
use super::net::arch::{Arch, Head, ModelKind};
use super::net::backward::Tape;
use super::net::footprint;
use super::net::forward::{Caches, Encoded, Net, Side, StackInput, StackTape};
use super::net::weights::Weights;
use crate::attention::{Kernel, KvCache, KvDType};
use crate::batch::TokenBatch;
use crate::error::{Error, Result};
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
    dtype: DType,
    /// Weights the linear layers hold only in `dtype`, not in f32
    /// ([`Transformer::keep_packed_only`]); 0 when they hold their f32 weights.
    packed_only: usize,
    /// What [`Transformer::new_cache`]'s caches store their rows in.
    pub kv_dtype: KvDType,
    info: ModelInfo,
    /// The `config.json` the model was read from (Hugging Face families), written back
    /// on save so the folder stays what transformers expects.
    pub(super) source_config: Option<Map<String, Value>>,
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

    /// An empty KV cache for `batch` rows of the decoder, storing its rows in
    /// [`Transformer::kv_dtype`].
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

    /// Packs every linear layer for inference ([`crate::layers::Linear::pack`]): faster
    /// products for a sentence or a prompt, at the cost of a second copy of the
    /// projection weights. Training afterwards stays correct (a changed weight is
    /// used as it is), but the copies are then dead weight.
    pub fn pack_weights(&mut self) {
        self.weights.pack_weights(DType::F32);
    }

    /// Computes with the weights of every linear layer in `dtype` from now on
    /// ([`crate::layers::Linear::pack_as`]); [`DType::F32`] packs them as
    /// [`Transformer::pack_weights`] does. Norms, embeddings, attention and a tied head
    /// stay f32. [`Transformer::dtype`] says which type the layers compute in. The copy
    /// sits beside the f32 weights: one the machine's free memory cannot hold is refused
    /// before it is made.
    ///
    /// A model kept as [`Transformer::keep_packed_only`] packs again from its widened
    /// copies; in f32 it then holds f32 weights (the rounded values) again.
    pub fn set_dtype(&mut self, dtype: DType) -> Result<()> {
        let weights: usize = self
            .weights
            .linears_mut()
            .map(|l| l.out_features() * l.in_features())
            .sum();
        let bytes = (weights as f64 * dtype.bytes_per_weight()).ceil() as usize;
        let what = format!("a {dtype} copy of the linear layers' weights");
        crate::io::memory::check(Some(bytes), &what)?;
        self.weights.pack_weights(dtype);
        self.dtype = dtype;
        if dtype == DType::F32 {
            self.weights.embed_tokens.unpack();
            self.packed_only = 0;
        }
        Ok(())
    }

    /// Drops the f32 weights of the linear layers, which then hold only their copies in
    /// the model's reduced type ([`crate::layers::Linear::keep_packed_only`]): an
    /// inference model in bf16 holds its projections in half the bytes, in int8 in a
    /// quarter. It still runs every forward, and refuses [`Transformer::forward_train`]
    /// and [`Transformer::save`]. [`crate::models::load_in`] loads a folder this way.
    pub fn keep_packed_only(&mut self) -> Result<()> {
        if self.dtype == DType::F32 {
            return Err(Error::invalid(
                "dtype",
                "a model keeps its linear layers packed only in bf16 or int8, not f32",
            ));
        }
        let mut packed_only = 0;
        for l in self.weights.linears_mut() {
            // an empty layer (no inputs or outputs) has no copy and nothing to drop
            if l.out_features() * l.in_features() > 0 {
                l.keep_packed_only()?;
                packed_only += l.out_features() * l.in_features();
            }
        }
        self.packed_only = packed_only;
        Ok(())
    }

    /// Takes the model's type and what it holds only packed from its linear layers,
    /// each packed as it was read (a GGUF file's Q8_0 blocks as stored, its other
    /// weights in the load's type): the model's type is the one most of their weights
    /// compute in.
    pub(super) fn adopt_layer_types(&mut self) {
        let mut counts: Vec<(DType, usize)> = Vec::new();
        let mut packed_only = 0;
        for l in self.weights.linears_mut() {
            let size = l.out_features() * l.in_features();
            if !l.has_f32_weight() {
                packed_only += size;
            }
            match counts.iter_mut().find(|(t, _)| *t == l.dtype()) {
                Some((_, n)) => *n += size,
                None => counts.push((l.dtype(), size)),
            }
        }
        self.dtype = counts
            .into_iter()
            .max_by_key(|&(_, n)| n)
            .map_or(DType::F32, |(t, _)| t);
        // a token table held as stored has no f32 weight either
        if let Some(table) = self.weights.embed_tokens.stored() {
            packed_only += table.out_features() * table.in_features();
        }
        self.packed_only = packed_only;
    }

    /// Whether the linear layers hold their f32 weights (see
    /// [`Transformer::keep_packed_only`]).
    pub fn has_f32_weights(&self) -> bool {
        self.packed_only == 0
    }

    /// Errors when the model holds no f32 weights to `what` (train, save) with.
    pub(crate) fn expect_f32_weights(&self, what: &str) -> Result<()> {
        match self.packed_only {
            0 => Ok(()),
            _ => Err(Error::Unsupported(format!(
                "cannot {what}: the model keeps its linear layers only in {} (loaded for inference); load it in f32",
                self.dtype
            ))),
        }
    }

    /// Drops the linear layers' packed copies: they compute with their f32 weights
    /// again, unpacked (as a model trains in f32); a model kept packed only holds its
    /// copies widened, and a token table held as stored is widened too.
    pub fn unpack_weights(&mut self) {
        self.weights.linears_mut().for_each(|l| l.unpack());
        self.weights.embed_tokens.unpack();
        self.dtype = DType::F32;
        self.packed_only = 0;
    }

    /// Packs again, in the model's type, each linear layer's copy that its weight's
    /// update left stale: a training step in bf16 computes with copies of the weights
    /// the last update left (the f32 weights are the master copies).
    pub fn repack_weights(&mut self) {
        let dtype = self.dtype;
        self.weights.linears_mut().for_each(|l| l.repack(dtype));
    }

    /// Bytes the weights take as the forward reads them: `(linear, rest)`, the linear
    /// layers' weights in their type ([`Transformer::set_dtype`]) and everything else
    /// (embeddings, norms, biases, a tied head) in f32.
    pub fn weight_bytes(&mut self) -> (usize, usize) {
        let (mut linear, mut linear_params) = (0, 0);
        for l in self.weights.linears_mut() {
            linear += l.weight_bytes();
            linear_params += l.out_features() * l.in_features();
        }
        let table = &self.weights.embed_tokens;
        match table.stored() {
            // the table counts at its stored size, not as f32
            Some(_) => {
                let table_params = table.vocab_size() * table.dim();
                let rest = 4 * (self.num_params() - linear_params - table_params);
                (linear, rest + table.bytes())
            }
            None => (linear, 4 * (self.num_params() - linear_params)),
        }
    }

    /// The number type the linear layers compute in ([`Transformer::set_dtype`]).
    pub fn dtype(&self) -> DType {
        self.dtype
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
    fn check_forward(&self, input: &Input, attentions: bool) -> Result<()> {
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
    pub(super) fn check_memory(&self, shapes: footprint::Shapes) -> Result<()> {
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

    fn run(
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
