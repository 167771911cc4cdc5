//! Where each parameter lives in a checkpoint. A family's name table maps qkv's path of a
//! parameter (`decoder.layers.0.attn.q.weight`) to a [`Loc`]: a tensor stored as it is,
//! stored transposed (GPT-2's `Conv1D`), or one of several row blocks of a fused tensor
//! (GPT-2's `c_attn`, BLOOM's per-head `query_key_value`, Phi-3's `qkv_proj` with its
//! unequal Q, K and V blocks). Reading and writing both go
//! through the table, so a folder is saved exactly as it was read.

use std::collections::{HashMap, HashSet};

use crate::error::{Error, Result};
use crate::io::TensorSource;
use crate::models::net::weights::Weights;
use crate::module::Module;
use crate::tensor::Tensor;

/// A parameter's place in a checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Loc {
    /// The tensor `name`, as it is.
    Same(String),
    /// The tensor `name` holds the transpose (`Conv1D` stores `[in, out]`).
    Transposed(String),
    /// Part `part` of the row sets of the tensor `name` (after transposing it when
    /// `transposed`), part k holding `shares[k]` of every Σ shares rows: contiguous
    /// blocks when `group` is `None`, else (equal shares) interleaved groups of `group`
    /// rows (BLOOM: per head, rows `[H, 3, D]`).
    Part {
        name: String,
        shares: Vec<usize>,
        part: usize,
        group: Option<usize>,
        transposed: bool,
    },
}

impl Loc {
    pub fn name(&self) -> &str {
        match self {
            Loc::Same(n) | Loc::Transposed(n) | Loc::Part { name: n, .. } => n,
        }
    }
}

/// Where [`read`] puts what it reads.
pub(crate) trait Place {
    /// Puts `value`, read for `param` and shaped as it, in place (or takes it elsewhere).
    fn value(&mut self, param: &mut Tensor, value: Tensor) -> Result<()>;

    /// Takes `param` from the checkpoint's tensor `name` by its own means, when that
    /// tensor is stored in a form the model runs as it is (a GGUF file's 8-bit blocks):
    /// true when it did, false to have the tensor read as f32.
    fn stored(&mut self, param: &mut Tensor, name: &str) -> Result<bool>;
}

/// The first axis of a tensor of `rows` rows is split into parts by `shares`: the row
/// of the whole that is row r of part `part`. Blocks: the part's rows follow the
/// earlier parts' (unit = rows / Σ shares rows a share). Groups of g (equal shares):
/// row `(r / g)·parts·g + part·g + r % g`.
fn part_row(r: usize, rows: usize, shares: &[usize], part: usize, group: Option<usize>) -> usize {
    match group {
        Some(g) => (r / g) * shares.len() * g + part * g + r % g,
        None => {
            let unit = rows / shares.iter().sum::<usize>();
            shares[..part].iter().sum::<usize>() * unit + r
        }
    }
}

/// Rows of part `part` of a tensor of `rows` rows split by `shares`, when they divide it.
fn part_rows(rows: usize, shares: &[usize], part: usize) -> Option<usize> {
    let total: usize = shares.iter().sum();
    (total > 0 && rows.is_multiple_of(total)).then(|| rows / total * shares[part])
}

/// `[r, c]` → `[c, r]`.
pub(crate) fn transpose(t: &Tensor) -> Tensor {
    let (r, c) = (t.shape()[0], t.shape()[1]);
    Tensor::from_fn(&[c, r], |k| t.data()[(k % r) * c + k / r])
}

/// Rows per first-axis index (1 for a vector).
fn row_width(t: &Tensor) -> usize {
    t.shape()[1..].iter().product()
}

/// Fills every parameter of `weights` from `ckpt`, finding each through `locate` and
/// trying `aliases` of a name the checkpoint lacks (a base model's names without the
/// task prefix, old spellings). Each parameter must have exactly its shape; `place`
/// puts the value read into it (or takes it elsewhere).
pub(crate) fn read(
    ckpt: &dyn TensorSource,
    weights: &mut Weights,
    locate: &dyn Fn(&str) -> Result<Loc>,
    aliases: &dyn Fn(&str) -> Vec<String>,
    place: &mut dyn Place,
) -> Result<HashSet<String>> {
    let mut used = HashSet::new();
    let mut last: Option<(String, Tensor)> = None;
    for (path, param) in weights.params_mut() {
        let loc = locate(&path)?;
        let want = loc.name().to_string();
        let name = std::iter::once(want.clone())
            .chain(aliases(&want))
            .find(|n| ckpt.has(n))
            .unwrap_or(want);
        if matches!(loc, Loc::Same(_)) && place.stored(param, &name)? {
            used.insert(name);
            continue;
        }
        let whole = match &last {
            Some((n, t)) if *n == name => t.clone(),
            _ => {
                let t = ckpt.tensor(&name)?;
                last = Some((name.clone(), t.clone()));
                t
            }
        };
        let value = match &loc {
            Loc::Same(_) => whole,
            Loc::Transposed(_) if whole.rank() == 2 => transpose(&whole),
            Loc::Part {
                shares,
                part,
                group,
                transposed,
                ..
            } if whole.rank() > usize::from(*transposed)
                && part_rows(whole.shape()[usize::from(*transposed)], shares, *part).is_some() =>
            {
                let whole = if *transposed && whole.rank() == 2 {
                    transpose(&whole)
                } else {
                    whole
                };
                let rows = whole.shape()[0];
                let n = part_rows(rows, shares, *part).expect("checked above");
                let w = row_width(&whole);
                let mut shape = whole.shape().to_vec();
                shape[0] = n;
                let mut data = Vec::with_capacity(n * w);
                for r in 0..n {
                    let src = part_row(r, rows, shares, *part, *group);
                    data.extend_from_slice(&whole.data()[src * w..(src + 1) * w]);
                }
                Tensor::new(&shape, data)?
            }
            _ => {
                return Err(Error::shape(
                    name,
                    format!("a tensor holding {path} ({:?})", param.shape()),
                    whole.shape(),
                ))
            }
        };
        if value.shape() != param.shape() {
            let expected = match &loc {
                Loc::Same(_) => format!("{:?}", param.shape()),
                _ => format!("a tensor holding {path} {:?}", param.shape()),
            };
            return Err(Error::shape(name, expected, value.shape()));
        }
        place.value(param, value)?;
        used.insert(name);
    }
    Ok(used)
}

/// Every parameter of `weights` as the checkpoint stores it, under its name, in the
/// order of the tree (fused tensors where their first part comes).
pub(crate) fn export(
    weights: &Weights,
    locate: &dyn Fn(&str) -> Result<Loc>,
) -> Result<Vec<(String, Tensor)>> {
    let mut out: Vec<(String, Tensor)> = Vec::new();
    // fused tensors being assembled: name → (index in out, parts seen)
    let mut fused: HashMap<String, (usize, Vec<Option<Tensor>>)> = HashMap::new();
    for (path, t) in weights.params() {
        let loc = locate(&path)?;
        match loc {
            Loc::Same(name) => out.push((name, t.clone())),
            Loc::Transposed(name) => out.push((name, transpose(t))),
            Loc::Part {
                name, shares, part, ..
            } => {
                let entry = fused.entry(name.clone()).or_insert_with(|| {
                    out.push((name.clone(), Tensor::zeros(&[0])));
                    (out.len() - 1, vec![None; shares.len()])
                });
                entry.1[part] = Some(t.clone());
                if entry.1.iter().all(Option::is_some) {
                    let pieces: Vec<Tensor> = entry.1.iter().flatten().cloned().collect();
                    let Loc::Part {
                        shares,
                        group,
                        transposed,
                        ..
                    } = locate(&path)?
                    else {
                        unreachable!("the same path locates the same way")
                    };
                    out[entry.0].1 = join_parts(&pieces, &shares, group, transposed)?;
                }
            }
        }
    }
    if let Some((name, _)) = fused
        .iter()
        .find(|(_, (_, p))| p.iter().any(Option::is_none))
    {
        return Err(Error::invalid(
            name,
            "a fused tensor is missing one of its parts",
        ));
    }
    Ok(out)
}

/// The inverse of reading [`Loc::Part`]s: the whole tensor from its parts.
fn join_parts(
    parts: &[Tensor],
    shares: &[usize],
    group: Option<usize>,
    transposed: bool,
) -> Result<Tensor> {
    let rows: usize = parts.iter().map(|p| p.shape()[0]).sum();
    let w = row_width(&parts[0]);
    let mut shape = parts[0].shape().to_vec();
    shape[0] = rows;
    let mut data = vec![0.0; rows * w];
    for (k, p) in parts.iter().enumerate() {
        for r in 0..p.shape()[0] {
            let dst = part_row(r, rows, shares, k, group);
            data[dst * w..(dst + 1) * w].copy_from_slice(&p.data()[r * w..(r + 1) * w]);
        }
    }
    let whole = Tensor::new(&shape, data)?;
    Ok(if transposed { transpose(&whole) } else { whole })
}

/// How one module's tensors are stored: as they are, `Conv1D`-transposed (the weight;
/// the bias as it is), or as part `k` of fused row sets: of 3 equal blocks (GPT-2's
/// `c_attn`, also Conv1D), of 3 interleaved per head of `D` rows (BLOOM), or of up to
/// 3 blocks in the proportions given, a zero share being no part (Phi-3's `qkv_proj`:
/// H, G and G heads; `gate_up_proj`: 1, 1, 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum How {
    Same,
    Conv1d,
    Conv1dPart(usize),
    HeadPart(usize, usize),
    Blocks(usize, [usize; 3]),
}

/// One row of a family's name table: a module path of qkv's tree (`{l}` for a layer's
/// index) → the checkpoint's, and how its tensors are stored.
pub(crate) struct Name {
    pub qkv: String,
    pub hf: String,
    pub how: How,
}

/// A table row for a module stored as it is.
pub(crate) fn same(qkv: &str, hf: &str) -> Name {
    stored(qkv, hf, How::Same)
}

/// Rows for every layer: qkv's module `decoder.layers.{l}.<qkv>` (or the `stack`'s) →
/// `<hf_layer><hf>`, each stored as it is; `hf_layer` ends with `{l}.`.
pub(crate) fn layer_rows(stack: &str, hf_layer: &str, rows: &[(&str, &str)]) -> Vec<Name> {
    rows.iter()
        .map(|(qkv, hf)| {
            same(
                &format!("{stack}.layers.{{l}}.{qkv}"),
                &format!("{hf_layer}{hf}"),
            )
        })
        .collect()
}

/// Rows of the Q, K and V projections stored as one tensor (`hf`, after its layer
/// prefix with `{l}`), one block after another: `heads`, then `kv_heads`, then
/// `kv_heads` heads of rows (Phi-3's `qkv_proj`, ModernBERT's `Wqkv`).
pub(crate) fn fused_qkv_rows(stack: &str, hf: &str, heads: usize, kv_heads: usize) -> Vec<Name> {
    ["q", "k", "v"]
        .iter()
        .enumerate()
        .map(|(k, p)| {
            stored(
                &format!("{stack}.layers.{{l}}.attn.{p}"),
                hf,
                How::Blocks(k, [heads, kv_heads, kv_heads]),
            )
        })
        .collect()
}

/// Rows of a gated FFN's two input projections stored as one tensor (`hf`): the
/// activated half (FeedForward's `up`) first, then the gate (Phi-3's `gate_up_proj`,
/// ModernBERT's `Wi`).
pub(crate) fn fused_gated_rows(stack: &str, hf: &str) -> Vec<Name> {
    ["up", "gate_up"]
        .iter()
        .enumerate()
        .map(|(k, p)| {
            stored(
                &format!("{stack}.layers.{{l}}.ffn.{p}"),
                hf,
                How::Blocks(k, [1, 1, 0]),
            )
        })
        .collect()
}

/// A table row with a storage quirk.
pub(crate) fn stored(qkv: &str, hf: &str, how: How) -> Name {
    Name {
        qkv: qkv.to_string(),
        hf: hf.to_string(),
        how,
    }
}

/// Where `path` lives according to `table`: its module (the path less the last
/// segment, with a layer index written `{l}`) is looked up, and the last segment
/// (`weight`, `bias`) appended to the checkpoint's module path.
pub(crate) fn locate(table: &[Name], family: &str, path: &str) -> Result<Loc> {
    let (module, param) = path.rsplit_once('.').unwrap_or(("", path));
    let mut layer = None;
    let pattern: Vec<String> = module
        .split('.')
        .map(|seg| match seg.parse::<usize>() {
            Ok(l) => {
                layer = Some(l);
                "{l}".to_string()
            }
            Err(_) => seg.to_string(),
        })
        .collect();
    let pattern = pattern.join(".");
    let row = table.iter().find(|r| r.qkv == pattern).ok_or_else(|| {
        Error::Unsupported(format!(
            "the {family} checkpoint layout has no place for parameter `{path}`"
        ))
    })?;
    let hf = row
        .hf
        .replace("{l}", &layer.map_or(String::new(), |l| l.to_string()));
    let name = if param.is_empty() {
        hf
    } else {
        format!("{hf}.{param}")
    };
    let weight = param == "weight";
    Ok(match row.how {
        How::Same => Loc::Same(name),
        How::Conv1d if weight => Loc::Transposed(name),
        How::Conv1d => Loc::Same(name),
        How::Conv1dPart(part) => Loc::Part {
            name,
            shares: vec![1; 3],
            part,
            group: None,
            transposed: weight,
        },
        How::HeadPart(part, d) => Loc::Part {
            name,
            shares: vec![1; 3],
            part,
            group: Some(d),
            transposed: false,
        },
        How::Blocks(part, shares) => Loc::Part {
            name,
            shares: shares.into_iter().filter(|&s| s > 0).collect(),
            part,
            group: None,
            transposed: false,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_round_trip_in_both_layouts() {
        let whole = Tensor::from_fn(&[8, 2], |i| i as f32);
        for (shares, group) in [(&[1, 1][..], None), (&[1, 1], Some(1)), (&[2, 1, 1], None)] {
            let parts: Vec<Tensor> = (0..shares.len())
                .map(|p| {
                    let n = part_rows(8, shares, p).unwrap();
                    let rows: Vec<f32> = (0..n)
                        .flat_map(|r| {
                            let s = part_row(r, 8, shares, p, group);
                            whole.data()[s * 2..s * 2 + 2].to_vec()
                        })
                        .collect();
                    Tensor::new(&[n, 2], rows).unwrap()
                })
                .collect();
            assert_eq!(join_parts(&parts, shares, group, false).unwrap(), whole);
        }
        // equal blocks of 6 rows: part 1 is rows 2..4; groups of 1: part 1 is rows 1, 4;
        // shares 2, 1, 1 of 8 rows: part 1 is rows 4..6
        assert_eq!(part_row(0, 6, &[1, 1, 1], 1, None), 2);
        assert_eq!(part_row(1, 6, &[1, 1, 1], 1, Some(1)), 4);
        assert_eq!(part_row(0, 8, &[2, 1, 1], 1, None), 4);
        assert_eq!(part_rows(8, &[2, 1, 1], 0), Some(4));
        assert_eq!(part_rows(7, &[2, 1, 1], 0), None);
    }

    #[test]
    fn paths_find_their_module_with_the_layer_as_a_pattern() {
        let table = [
            same("decoder.layers.{l}.attn_norm", "h.{l}.ln_1"),
            stored(
                "decoder.layers.{l}.attn.k",
                "h.{l}.c_attn",
                How::Conv1dPart(1),
            ),
            same("head", "cls.predictions"),
        ];
        let loc = |p| locate(&table, "test", p).unwrap();
        assert_eq!(
            loc("decoder.layers.3.attn_norm.bias"),
            Loc::Same("h.3.ln_1.bias".into())
        );
        assert_eq!(
            loc("decoder.layers.0.attn.k.weight"),
            Loc::Part {
                name: "h.0.c_attn.weight".into(),
                shares: vec![1; 3],
                part: 1,
                group: None,
                transposed: true
            }
        );
        assert_eq!(loc("head.bias"), Loc::Same("cls.predictions.bias".into()));
        assert!(locate(&table, "test", "decoder.layers.0.ffn.up.weight").is_err());
    }
}
