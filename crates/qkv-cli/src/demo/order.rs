//! 狗咬人 ("dog bites man") against 人咬狗 ("man bites dog"): the same three tokens in
//! another order, through one self-attention layer with random (seeded) weights.
//!
//! Without positions the layer sees a set, not a sequence: permuting the tokens only
//! permutes the outputs (permutation equivariance), so 狗 comes out identical whether
//! it bites or is bitten. Adding sinusoidal encodings to the embeddings, or rotating
//! queries and keys with RoPE, makes each token's output depend on where it and the
//! others stand. Both claims are measured here, not assumed.

use std::io::{self, Write};

use anyhow::Result;
use qkv::layers::Linear;
use qkv::position::{sinusoidal_table, Rope, RopeLayout, SinusoidalLayout};
use qkv::{AttentionSpec, MultiHeadAttention, Tensor};
use serde::Serialize;

use super::table::Table;
use qkv::rng::Rng;

/// C: model width, split into H heads of D = C / H.
const D_MODEL: usize = 8;
const N_HEADS: usize = 2;
const LAYER_SEED: u64 = 0x5EED_0001;
/// Each token's embedding comes from its own generator, seeded with this and the
/// token's code point: the vector depends on the token alone, never on its position.
const EMBEDDING_SEED: u64 = 0x5EED_0002;
/// Outputs of the same token closer than this count as equal (f32 rounding of sums
/// taken in a different order stays far below it).
const TOLERANCE: f32 = 1e-5;
const SENTENCES: [[char; 3]; 2] = [['狗', '咬', '人'], ['人', '咬', '狗']];

#[derive(Clone, Copy, Serialize)]
#[serde(rename_all = "lowercase")]
enum Positions {
    None,
    /// Sinusoidal table added to the embeddings before the layer.
    Sinusoidal,
    /// Queries and keys rotated by position inside the layer.
    Rope,
}

impl Positions {
    fn describe(self) -> &'static str {
        match self {
            Positions::None => "No positions",
            Positions::Sinusoidal => "Sinusoidal encodings added to the embeddings",
            Positions::Rope => "RoPE on queries and keys",
        }
    }
}

/// One token's outputs in the two sentences.
#[derive(Serialize)]
struct TokenOutputs {
    token: char,
    position_1: usize,
    position_2: usize,
    /// [C]
    output_1: Vec<f32>,
    /// [C]
    output_2: Vec<f32>,
    norm_1: f32,
    norm_2: f32,
    max_abs_diff: f32,
}

#[derive(Serialize)]
struct Run {
    positions: Positions,
    /// Every token's two outputs agree within the tolerance.
    equivariant: bool,
    max_abs_diff: f32,
    tokens: Vec<TokenOutputs>,
}

#[derive(Serialize)]
pub struct Order {
    sentences: [String; 2],
    d_model: usize,
    n_heads: usize,
    head_dim: usize,
    tolerance: f32,
    equivariant_without_pe: bool,
    /// True if any position scheme tried (sinusoidal, RoPE) left the layer equivariant;
    /// false means every one of them made word order matter.
    equivariant_with_pe: bool,
    runs: Vec<Run>,
}

pub fn run() -> Result<Order> {
    let layer = random_layer()?;
    let runs = [Positions::None, Positions::Sinusoidal, Positions::Rope]
        .into_iter()
        .map(|p| forward(&layer, p).map(|out| compare(&out, p)))
        .collect::<Result<Vec<_>>>()?;
    let unpositioned = |r: &&Run| matches!(r.positions, Positions::None);
    let equivariant_without_pe = runs.iter().filter(unpositioned).all(|r| r.equivariant);
    let equivariant_with_pe = runs
        .iter()
        .filter(|r| !unpositioned(r))
        .any(|r| r.equivariant);
    Ok(Order {
        sentences: SENTENCES.map(|s| s.iter().collect()),
        d_model: D_MODEL,
        n_heads: N_HEADS,
        head_dim: layer.head_dim(),
        tolerance: TOLERANCE,
        equivariant_without_pe,
        equivariant_with_pe,
        runs,
    })
}

/// W_Q, W_K, W_V, W_O: [C, C] each, N(0, 1/C) so activations stay of order 1; no biases.
fn random_layer() -> Result<MultiHeadAttention> {
    let mut rng = Rng::new(LAYER_SEED);
    let std = 1.0 / (D_MODEL as f32).sqrt();
    let mut linear = || Linear::new(rng.tensor(&[D_MODEL, D_MODEL], std), None);
    let (wq, wk, wv, wo) = (linear()?, linear()?, linear()?, linear()?);
    Ok(MultiHeadAttention::new(wq, wk, wv, wo, N_HEADS, N_HEADS)?)
}

/// Both sentences as one batch: embeddings [2, 3, C], optionally plus positions.
fn embed(add_sinusoidal: bool) -> Result<Tensor> {
    let t = SENTENCES[0].len();
    let pe = sinusoidal_table(t, D_MODEL, SinusoidalLayout::Interleaved);
    let mut data = Vec::with_capacity(SENTENCES.len() * t * D_MODEL);
    for sentence in SENTENCES {
        for (pos, &token) in sentence.iter().enumerate() {
            let mut x = Rng::new(EMBEDDING_SEED ^ u64::from(token)).normals(D_MODEL, 1.0);
            if add_sinusoidal {
                let row = &pe.data()[pos * D_MODEL..(pos + 1) * D_MODEL];
                x.iter_mut().zip(row).for_each(|(a, b)| *a += b);
            }
            data.extend(x);
        }
    }
    Ok(Tensor::new(&[SENTENCES.len(), t, D_MODEL], data)?)
}

/// Self-attention over both sentences at once: [2, 3, C] → [2, 3, C].
fn forward(layer: &MultiHeadAttention, positions: Positions) -> Result<Tensor> {
    let spec = AttentionSpec::default();
    let x = embed(matches!(positions, Positions::Sinusoidal))?;
    let a = match positions {
        Positions::None | Positions::Sinusoidal => layer.forward(&x, None, &spec)?,
        Positions::Rope => {
            let rope = Rope::new(layer.head_dim(), 10_000.0, RopeLayout::HalfSplit)?;
            let t = SENTENCES[0].len();
            let pos: Vec<usize> = (0..SENTENCES.len() * t).map(|i| i % t).collect();
            layer.forward_rope(&x, &spec, &rope, &pos)?
        }
    };
    Ok(a.out)
}

/// Pairs each token of sentence 1 with the same token in sentence 2; out: [2, 3, C].
fn compare(out: &Tensor, positions: Positions) -> Run {
    let row = |s: usize, p: usize| {
        let start = (s * SENTENCES[0].len() + p) * D_MODEL;
        out.data()[start..start + D_MODEL].to_vec()
    };
    let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
    let tokens: Vec<TokenOutputs> = SENTENCES[0]
        .iter()
        .enumerate()
        .map(|(position_1, &token)| {
            let position_2 = SENTENCES[1]
                .iter()
                .position(|&t| t == token)
                .expect("both sentences hold the same tokens");
            let (output_1, output_2) = (row(0, position_1), row(1, position_2));
            let max_abs_diff = output_1
                .iter()
                .zip(&output_2)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            TokenOutputs {
                token,
                position_1,
                position_2,
                norm_1: norm(&output_1),
                norm_2: norm(&output_2),
                output_1,
                output_2,
                max_abs_diff,
            }
        })
        .collect();
    let max_abs_diff = tokens.iter().map(|t| t.max_abs_diff).fold(0.0, f32::max);
    Run {
        positions,
        equivariant: max_abs_diff < TOLERANCE,
        max_abs_diff,
        tokens,
    }
}

impl Order {
    pub fn write_text(&self, out: &mut dyn Write) -> io::Result<()> {
        let [s1, s2] = &self.sentences;
        writeln!(
            out,
            "2. Word order: {s1} vs {s2} through one self-attention layer (C={}, H={}, D={}, random seeded weights)",
            self.d_model, self.n_heads, self.head_dim
        )?;
        writeln!(
            out,
            "  Each token's output in {s1} is compared with the same token's output in {s2}."
        )?;
        for run in &self.runs {
            let verdict = if run.equivariant {
                "same outputs, merely reordered (the layer cannot tell the sentences apart)"
            } else {
                "outputs change (word order now matters)"
            };
            writeln!(out, "  {}: {verdict}", run.positions.describe())?;
            let mut t = Table::new(&[
                "token",
                &format!("pos in {s1}"),
                &format!("pos in {s2}"),
                "|out| 1",
                "|out| 2",
                "max |diff|",
            ]);
            for tok in &run.tokens {
                t.row(vec![
                    tok.token.to_string(),
                    tok.position_1.to_string(),
                    tok.position_2.to_string(),
                    format!("{:.4}", tok.norm_1),
                    format!("{:.4}", tok.norm_2),
                    format!("{:.2e}", tok.max_abs_diff),
                ]);
            }
            t.write(out)?;
        }
        writeln!(
            out,
            "  Permutation equivariant without positions: {}; with positions: {} (equal means max |diff| < {:e}).",
            self.equivariant_without_pe, self.equivariant_with_pe, self.tolerance
        )?;
        for tok in self.moved_context() {
            writeln!(
                out,
                "  {tok} stands at the same place in both sentences, yet with positions its output changes: what it attends to has moved."
            )?;
        }
        Ok(())
    }

    /// Tokens at the same position in both sentences whose output still changed once
    /// positions were added.
    fn moved_context(&self) -> Vec<char> {
        let with = self
            .runs
            .iter()
            .filter(|r| !matches!(r.positions, Positions::None));
        let changed =
            |t: &TokenOutputs| t.position_1 == t.position_2 && t.max_abs_diff >= self.tolerance;
        let mut tokens: Vec<char> = with
            .flat_map(|r| r.tokens.iter().filter(|t| changed(t)).map(|t| t.token))
            .collect();
        tokens.dedup();
        tokens
    }
}
