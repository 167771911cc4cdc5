//! Matrix products as a linear layer runs them, with the weight in each number type.

use std::hint::black_box;
use std::io::Write;

use anyhow::{bail, Context, Result};
use clap::Args;
use qkv::layers::linear::product_into;
use qkv::ops::Par;
use qkv::rng::Rng;
use qkv::weights::bf16::Bf16Weight;
use qkv::weights::int8::{Int8Weight, ScaleLayout};
use qkv::weights::stored::{self, Start};
use qkv::weights::DType;
use qkv::Tensor;
use serde_json::json;

use super::printer::{merge, Printer, Rate, Row};
use super::timing::{measure, Common};
use crate::cmd::shared_flags::DTypeFlag;

#[derive(Args)]
pub struct MatmulArgs {
    /// Shapes MxKxN: training (2048 tokens of a d=384 model), a batch of sentences,
    /// one sentence of 13 tokens, one decode step of a d=512 Llama
    #[arg(
        long,
        value_delimiter = ',',
        default_values_t = [
            "2048x384x384".to_string(), "2048x384x1536".into(), "2048x1536x384".into(),
            "13x384x384".into(), "13x384x1536".into(), "13x1536x384".into(),
            "1x512x1536".into(), "1x512x32000".into(),
        ]
    )]
    shapes: Vec<String>,
    /// The weight's number type: f32 (the product read in place), or another (its copy,
    /// made before timing; its error against f32 printed to stderr)
    #[command(flatten)]
    dtype: DTypeFlag,
    #[command(flatten)]
    pub common: Common,
}

pub fn bench_matmul(a: &MatmulArgs, p: &mut Printer<impl Write>) -> Result<()> {
    for shape in &a.shapes {
        let (m, k, n) = parse_shape(shape)?;
        let mut rng = Rng::new(a.common.seed);
        let x = rng.tensor(&[m, k], 1.0);
        let w = rng.tensor(&[n, k], 1.0);
        let mut y = Tensor::zeros(&[m, n]);
        let dtype = a.dtype.dtype;
        let weight = MatmulWeight::new(dtype, &w)?;
        let run = |y: &mut Tensor| -> Result<()> {
            match &weight {
                MatmulWeight::F32 => product_into(y, &x, &w, 1.0, false)?,
                MatmulWeight::Bf16(w) => {
                    stored::product(w, y.data_mut(), x.data(), m, Start::Zero, Par::Auto)?
                }
                MatmulWeight::Int8(w) => {
                    stored::product(w, y.data_mut(), x.data(), m, Start::Zero, Par::Auto)?
                }
            }
            Ok(())
        };
        // how far the type moves the product: the largest error over the largest |y|
        let accuracy = if dtype == DType::F32 {
            json!({})
        } else {
            let mut want = Tensor::zeros(&[m, n]);
            product_into(&mut want, &x, &w, 1.0, false)?;
            run(&mut y)?;
            let top = want.data().iter().fold(0.0f32, |t, v| t.max(v.abs()));
            let err = y
                .data()
                .iter()
                .zip(want.data())
                .fold(0.0f32, |e, (g, t)| e.max((g - t).abs()));
            eprintln!(
                "{dtype} {m}x{k}x{n}: largest error {:.3e} of the largest |y|",
                err / top
            );
            json!({"relative_error": err / top})
        };
        let timing = measure(&a.common, || {
            run(&mut y)?;
            black_box(&y);
            Ok(())
        })?;
        let flop = 2.0 * (m * k * n) as f64;
        p.row(Row {
            label: format!("matmul {m}x{k}x{n} {dtype}"),
            timing,
            rate: Some(Rate::new("gflops", "GFLOP/s", flop / 1e9)),
            fields: merge(
                &json!({"bench": "matmul", "m": m, "k": k, "n": n, "gflop": flop / 1e9,
                        "dtype": dtype.name()}),
                accuracy,
            ),
        })?;
    }
    Ok(())
}

/// `MxKxN` as (M, K, N), each at least 1.
fn parse_shape(shape: &str) -> Result<(usize, usize, usize)> {
    let dims: Vec<usize> = shape
        .split('x')
        .map(str::parse)
        .collect::<std::result::Result<_, _>>()
        .ok()
        .filter(|d: &Vec<usize>| d.len() == 3 && !d.contains(&0))
        .with_context(|| format!("--shapes: `{shape}` is not MxKxN with sizes ≥ 1"))?;
    Ok((dims[0], dims[1], dims[2]))
}

/// The weight of `bench matmul`, in its type.
enum MatmulWeight {
    /// the f32 weight, read in place as `product_into` reads it
    F32,
    Bf16(Bf16Weight),
    Int8(Int8Weight),
}

impl MatmulWeight {
    fn new(dtype: DType, w: &Tensor) -> Result<Self> {
        let &[n, k] = w.shape() else {
            bail!("a matmul weight is [n, k]");
        };
        Ok(match dtype {
            DType::F32 => MatmulWeight::F32,
            DType::Bf16 => MatmulWeight::Bf16(Bf16Weight::new(w.data(), n, k)?),
            DType::Int8 => {
                MatmulWeight::Int8(Int8Weight::new(w.data(), n, k, ScaleLayout::Blocks)?)
            }
            DType::Int8Row => {
                MatmulWeight::Int8(Int8Weight::new(w.data(), n, k, ScaleLayout::Rows)?)
            }
            DType::Blocks(_) | DType::F16 => {
                bail!("{dtype} weights are read from GGUF files, not made here")
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_are_three_sizes_of_at_least_one() {
        assert_eq!(parse_shape("2048x384x1536").unwrap(), (2048, 384, 1536));
        assert_eq!(parse_shape("1x1x1").unwrap(), (1, 1, 1));
        for bad in ["5x7", "5x0x3", "5x7x3x2", "5x-7x3", "5 x7x3", "", "axbxc"] {
            assert_eq!(
                parse_shape(bad).unwrap_err().to_string(),
                format!("--shapes: `{bad}` is not MxKxN with sizes ≥ 1")
            );
        }
    }
}
