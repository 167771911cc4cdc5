//! A GGUF file's tensors seen under Hugging Face's names, Q and K put back in Hugging
//! Face's row order, Gemma's norms as 1 + w less 1, and the linear layers that run from
//! their stored blocks.

use super::meta::Kind;
use crate::error::{Error, Result};
use crate::io::gguf::{GgmlType, GgufFile};
use crate::io::TensorSource;
use crate::layers::Linear;
use crate::models::net::arch::Arch;
use crate::tensor::Tensor;
use crate::weights::ggml::f16::F16Weight;
use crate::weights::ggml::BlockWeight;
use crate::weights::int8::q8_0;
use crate::weights::int8::Int8Weight;
use crate::weights::DType;

/// A GGUF file's tensors under the Hugging Face names of its kind's family (Phi-3's
/// under Llama's, each projection the rows of the fused tensor that holds it).
pub(super) struct HfView<'f> {
    file: &'f GgufFile,
    kind: Kind,
    /// Q's and K's heads when llama.cpp permuted their rows (weights and biases)
    permuted: Option<(usize, usize)>,
    /// the rows of Phi-3's fused tensors: Q's, K's (and V's), and the FFN's width
    fused: Option<Fused>,
    /// whether the LM head is the token table (a tied head run from its blocks)
    head_from_table: bool,
    /// the type the load packs its other weights in
    dtype: DType,
    /// the token table as stored, once read: the embedding and a head over the table
    /// share its blocks
    table: std::cell::OnceCell<Linear>,
}

/// Rows of Phi-3's fused `attn_qkv` (Q's `q`, then K's and V's `kv` each) and `ffn_up`
/// (the gate's `ffn`, then the up projection's `ffn`).
#[derive(Clone, Copy, Debug)]
struct Fused {
    q: usize,
    kv: usize,
    ffn: usize,
}

/// Where a Hugging Face tensor lives in the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Located {
    /// the GGUF tensor
    pub name: String,
    /// Q's or K's heads, when llama.cpp permuted their rows
    pub heads: Option<usize>,
    /// the rows that hold it, when it is part of a fused tensor: the first, how many,
    /// and the fused tensor's
    pub rows: Option<(usize, usize, usize)>,
}

/// Whether the linear layers stored in `ty` compute from its blocks as they are, in a
/// load whose other weights are packed in `dtype`: the quantized types always, F16
/// when the load is in f32 (asked for bf16 or int8, F16 weights are packed so).
pub(super) fn runs_as_stored(ty: GgmlType, dtype: DType) -> bool {
    ty == GgmlType::Q8_0
        || ty.block_type().is_some()
        || (ty == GgmlType::F16 && dtype == DType::F32)
}

/// llama.cpp's name of the token table.
const TABLE: &str = "token_embd.weight";

/// Hugging Face's name of a layer's tensor (after `model.layers.{l}.`) → llama.cpp's
/// (after `blk.{l}.`), where the kinds agree (see [`kind_names`]).
const LAYER_NAMES: [(&str, &str); 11] = [
    ("input_layernorm", "attn_norm"),
    ("post_attention_layernorm", "ffn_norm"),
    ("self_attn.q_proj", "attn_q"),
    ("self_attn.k_proj", "attn_k"),
    ("self_attn.v_proj", "attn_v"),
    ("self_attn.o_proj", "attn_output"),
    ("self_attn.q_norm", "attn_q_norm"),
    ("self_attn.k_norm", "attn_k_norm"),
    ("mlp.gate_proj", "ffn_gate"),
    ("mlp.up_proj", "ffn_up"),
    ("mlp.down_proj", "ffn_down"),
];

/// The layer names of `kind` that differ from [`LAYER_NAMES`]: Gemma 2's and 3's norms
/// around each sub-layer, Phi-3's fused projections (`ffn_up` holds the gate and the
/// up projection).
fn kind_names(kind: Kind) -> &'static [(&'static str, &'static str)] {
    match kind {
        Kind::Gemma2 | Kind::Gemma3 => &[
            ("post_attention_layernorm", "post_attention_norm"),
            ("pre_feedforward_layernorm", "ffn_norm"),
            ("post_feedforward_layernorm", "post_ffw_norm"),
        ],
        Kind::Phi3 => &[
            ("self_attn.qkv_proj", "attn_qkv"),
            ("mlp.gate_up_proj", "ffn_up"),
        ],
        _ => &[],
    }
}

/// Whether the tensor `gguf` of a `kind` file is a norm's weight stored as 1 + w
/// (Gemma's, which scale by 1 + w).
pub(super) fn offset_norm(kind: Kind, gguf: &str) -> bool {
    kind.unit_offset() && gguf.ends_with("norm.weight")
}

impl<'f> HfView<'f> {
    pub fn new(
        file: &'f GgufFile,
        arch: &Arch,
        kind: Kind,
        head_from_table: bool,
        dtype: DType,
    ) -> Self {
        let stack = arch.stack();
        let fused = (kind == Kind::Phi3).then_some(Fused {
            q: stack.heads * stack.head_dim,
            kv: stack.kv_heads * stack.head_dim,
            ffn: stack.ffn_dim,
        });
        HfView {
            file,
            kind,
            permuted: kind.permuted().then_some((stack.heads, stack.kv_heads)),
            fused,
            head_from_table,
            dtype,
            table: std::cell::OnceCell::new(),
        }
    }

    /// Where the Hugging Face tensor `hf` lives in the file: its GGUF name, the heads
    /// whose rows to put back when llama.cpp permuted them, and its rows of a fused
    /// tensor (Phi-3's `attn_qkv`, unless the file stores Q, K and V apart as llama.cpp
    /// also reads them, and `ffn_up`, the gate's rows first).
    pub fn locate(&self, hf: &str) -> Option<Located> {
        if hf == "lm_head.weight" && self.head_from_table {
            return Some(Located {
                name: TABLE.into(),
                heads: None,
                rows: None,
            });
        }
        let (name, rotated) = gguf_name(self.kind, hf)?;
        let heads = match (rotated, self.permuted) {
            (Some(Rotated::Q), Some((q, _))) => Some(q),
            (Some(Rotated::K), Some((_, k))) => Some(k),
            _ => None,
        };
        let (name, rows) = self.fused_rows(name);
        Some(Located { name, heads, rows })
    }

    /// The fused tensor and rows that hold the tensor `name` of a Phi-3 file (see
    /// [`HfView::locate`]); other tensors as they are.
    fn fused_rows(&self, name: String) -> (String, Option<(usize, usize, usize)>) {
        let Some(f) = self.fused else {
            return (name, None);
        };
        let Some((stem, part)) = name.rsplit_once('.') else {
            return (name, None);
        };
        let Some((prefix, module)) = stem.rsplit_once('.') else {
            return (name, None);
        };
        let qkv = f.q + 2 * f.kv;
        let (whole, first, count, total) = match module {
            "attn_q" => ("attn_qkv", 0, f.q, qkv),
            "attn_k" => ("attn_qkv", f.q, f.kv, qkv),
            "attn_v" => ("attn_qkv", f.q + f.kv, f.kv, qkv),
            "ffn_gate" => ("ffn_up", 0, f.ffn, 2 * f.ffn),
            "ffn_up" => ("ffn_up", f.ffn, f.ffn, 2 * f.ffn),
            _ => return (name, None),
        };
        let whole = format!("{prefix}.{whole}.{part}");
        if whole.contains("attn_qkv") && self.file.header.tensor(&whole).is_none() {
            return (name, None);
        }
        (whole, Some((first, count, total)))
    }

    /// The linear layer whose weight is the Hugging Face tensor `hf` (`shape`, `[out,
    /// in]`), computing from the file's blocks as they are stored; `None` for a tensor
    /// in a type the products do not run as stored, which is then read as f32.
    ///
    /// Q8_0 runs through the int8 kernels, whose blocks are Q8_0's: its codes and
    /// scales are laid out for them. Q4_0, Q4_K, Q5_K and Q6_K keep their bytes as
    /// stored ([`crate::weights::ggml`]), and F16 its values in a load in f32. Either way
    /// the rows are put back in Hugging Face's order where llama.cpp permuted them, and
    /// a part of a fused tensor takes its rows (a block lies within a row).
    pub fn stored_linear(&self, hf: &str, shape: &[usize]) -> Result<Option<Linear>> {
        let Some(at) = self.locate(hf) else {
            return Ok(None);
        };
        let Some(info) = self.file.header.tensor(&at.name) else {
            return Ok(None);
        };
        if !runs_as_stored(info.ty, self.dtype) {
            return Ok(None);
        }
        let first = match at.rows {
            None if info.shape() == shape => 0,
            Some((first, count, total))
                if shape.len() == 2 && shape[0] == count && info.shape() == [total, shape[1]] =>
            {
                first
            }
            _ => return Err(self.misshapen(&at, shape, &info.shape())),
        };
        if at.name != TABLE {
            return self.read_stored(&at.name, at.heads, shape, first).map(Some);
        }
        if self.table.get().is_none() {
            let table = self.read_stored(&at.name, at.heads, shape, 0)?;
            self.table.set(table).expect("set once");
        }
        Ok(self.table.get().cloned())
    }

    /// The error of a tensor of `stored` shape where `at` wants one holding `shape`.
    fn misshapen(&self, at: &Located, shape: &[usize], stored: &[usize]) -> Error {
        let expected = match at.rows {
            None => format!("{shape:?}"),
            Some((_, _, total)) => format!(
                "[{total}, {}] (holding {shape:?})",
                shape.get(1).map_or("…".into(), |c| c.to_string())
            ),
        };
        Error::shape(at.name.clone(), expected, stored)
    }

    /// The linear layer of the tensor `gguf`'s rows from `first` on (`shape`, `[out,
    /// in]`, in a type that runs as stored), its rows put back in order for `heads` when
    /// permuted.
    fn read_stored(
        &self,
        gguf: &str,
        heads: Option<usize>,
        shape: &[usize],
        first: usize,
    ) -> Result<Linear> {
        let info = self
            .file
            .header
            .tensor(gguf)
            .expect("looked up by the caller");
        let (rows, cols) = (shape[0], shape[1]);
        let head = match heads {
            Some(heads) => Some(head_rows(rows, heads, gguf, shape)?),
            None => None,
        };
        let bytes = self.file.data(info);
        let source_row = |r: usize| first + head.map_or(r, |d| permuted_row(r, d));
        let err = |e: Error| Error::Gguf {
            path: self.file.path().to_string(),
            reason: format!("tensor `{gguf}`: {e}"),
        };
        if info.ty == GgmlType::F16 {
            let w = F16Weight::from_rows(rows, cols, |r, dst| {
                let src = &bytes[source_row(r) * 2 * cols..][..2 * cols];
                for (d, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
                    *d = u16::from_le_bytes([b[0], b[1]]);
                }
            })
            .map_err(err)?;
            return Linear::from_f16(w, None);
        }
        if let Some(ty) = info.ty.block_type() {
            let row_bytes = cols / ty.weights() * ty.bytes();
            let w = BlockWeight::from_rows(ty, rows, cols, |r, dst| {
                dst.copy_from_slice(&bytes[source_row(r) * row_bytes..][..row_bytes])
            })
            .map_err(err)?;
            return Linear::from_blocks(w, None);
        }
        let ty = GgmlType::Q8_0;
        let row_bytes = cols / ty.block * ty.block_bytes;
        let w = Int8Weight::from_blocks(rows, cols, |r, g, q| {
            let src = source_row(r);
            let (d, codes) = q8_0::parts(&bytes[src * row_bytes + g * ty.block_bytes..]);
            if !d.is_finite() {
                return Err(Error::Gguf {
                    path: self.file.path().to_string(),
                    reason: format!("tensor `{gguf}`: block {g} of row {src} has the scale {d}"),
                });
            }
            q.iter_mut().zip(codes).for_each(|(q, c)| *q = c);
            Ok(d)
        })?;
        Linear::from_int8(w, None)
    }
}

/// Which of the tensors llama.cpp permutes for its interleaved RoPE a tensor is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Rotated {
    Q,
    K,
}

/// llama.cpp's name of the Hugging Face tensor `hf` of a `kind` model, and whether it is
/// Q's or K's (whose rows llama.cpp permutes in `llama` files).
pub(super) fn gguf_name(kind: Kind, hf: &str) -> Option<(String, Option<Rotated>)> {
    let whole = match hf {
        "model.embed_tokens.weight" => Some(TABLE),
        "model.norm.weight" => Some("output_norm.weight"),
        "lm_head.weight" => Some("output.weight"),
        _ => None,
    };
    if let Some(name) = whole {
        return Some((name.to_string(), None));
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let (module, part) = rest.rsplit_once('.')?;
    if !matches!(part, "weight" | "bias") || layer.parse::<usize>().is_err() {
        return None;
    }
    let (_, gguf) = kind_names(kind)
        .iter()
        .chain(LAYER_NAMES.iter())
        .find(|(h, _)| *h == module)?;
    let rotated = match *gguf {
        "attn_q" if kind.permuted() => Some(Rotated::Q),
        "attn_k" if kind.permuted() => Some(Rotated::K),
        _ => None,
    };
    Some((format!("blk.{layer}.{gguf}.{part}"), rotated))
}

impl TensorSource for HfView<'_> {
    fn has(&self, name: &str) -> bool {
        self.locate(name)
            .is_some_and(|at| self.file.header.tensor(&at.name).is_some())
    }

    /// The tensor as f32: quantized blocks dequantized by the reference twins; a Gemma
    /// norm's 1 + w less 1 (a norm then scales by the stored value again, exactly when
    /// it is at least ½); a fused tensor's rows.
    fn tensor(&self, name: &str) -> Result<Tensor> {
        let at = self.locate(name).ok_or_else(|| Error::Gguf {
            path: self.file.path().to_string(),
            reason: format!("no tensor stands for `{name}`"),
        })?;
        let gguf = &at.name;
        let mut t = match at.rows {
            None => self.file.tensor(gguf)?,
            Some((first, count, total)) => {
                // a missing tensor: the file's error names it
                let Some(info) = self.file.header.tensor(gguf) else {
                    return self.file.tensor(gguf);
                };
                let stored = info.shape();
                if stored[0] != total {
                    let mut want = stored.clone();
                    want[0] = total;
                    return Err(Error::shape(gguf.clone(), format!("{want:?}"), &stored));
                }
                self.file.rows(gguf, first, count)?
            }
        };
        t.check_finite(gguf)?;
        if offset_norm(self.kind, gguf) {
            t.data_mut().iter_mut().for_each(|w| *w -= 1.0);
        }
        match at.heads {
            Some(heads) => unpermute_rows(t, heads, gguf),
            None => Ok(t),
        }
    }
}

/// Rows per head of a permuted Q or K `name` of `shape` (`rows` of `heads` heads of an
/// even width), or an error naming it.
fn head_rows(rows: usize, heads: usize, name: &str, shape: &[usize]) -> Result<usize> {
    if shape.len() > 2 || !rows.is_multiple_of(heads) || !(rows / heads).is_multiple_of(2) {
        return Err(Error::shape(
            name,
            format!("[{heads} heads × an even width, columns]"),
            shape,
        ));
    }
    Ok(rows / heads)
}

/// The stored row of Hugging Face's row `r` of a Q or K that llama.cpp permuted (heads
/// of `d` rows): within each head, llama.cpp's row 2i + j holds Hugging Face's row
/// j·d/2 + i.
pub(super) fn permuted_row(r: usize, d: usize) -> usize {
    let (head, t) = (r / d, r % d);
    let (j, i) = (t / (d / 2), t % (d / 2));
    head * d + 2 * i + j
}

/// Undoes llama.cpp's permutation of a Q or K weight `[heads·D, C]` (or bias
/// `[heads·D]`), row by row (see [`permuted_row`]).
fn unpermute_rows(t: Tensor, heads: usize, name: &str) -> Result<Tensor> {
    let rows = t.shape()[0];
    let d = head_rows(rows, heads, name, t.shape())?;
    let c = t.numel() / rows;
    let mut out = vec![0.0; t.numel()];
    for (r, row) in out.chunks_exact_mut(c).enumerate() {
        row.copy_from_slice(&t.data()[permuted_row(r, d) * c..][..c]);
    }
    Tensor::new(t.shape(), out)
}
