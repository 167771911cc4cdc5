//! f32 weights → the bytes of a ggml type, as llama.cpp's reference quantizers make
//! them (`quantize_row_q8_0_ref`, `quantize_row_q4_0_ref`; f16 and bf16 rounded to
//! nearest, ties to even). Rows are whole blocks: the caller chose the type so.

use half::{bf16, f16};

use crate::error::{Error, Result};
use crate::io::gguf::GgmlType;
use crate::weights::int8::quant::quantize;

/// The bytes of `values` (row-major, rows of whole blocks) in `ty`; `name` names the
/// tensor in an error. A block whose scale f16 cannot hold is refused (llama.cpp would
/// write an infinite one).
pub(super) fn encode(ty: GgmlType, values: &[f32], name: &str) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(ty.bytes_of(values.len()).unwrap_or(0));
    match ty {
        GgmlType::F32 => values.iter().for_each(|v| out.extend(v.to_le_bytes())),
        GgmlType::F16 => values
            .iter()
            .for_each(|v| out.extend(f16::from_f32(*v).to_le_bytes())),
        GgmlType::BF16 => values
            .iter()
            .for_each(|v| out.extend(bf16::from_f32(*v).to_le_bytes())),
        GgmlType::Q8_0 => {
            let mut q = [0i8; 32];
            for (b, x) in values.chunks_exact(32).enumerate() {
                let d = scale(quantize(x, &mut q), name, b)?;
                out.extend(d.to_le_bytes());
                out.extend(q.iter().map(|&c| c as u8));
            }
        }
        GgmlType::Q4_0 => {
            for (b, x) in values.chunks_exact(32).enumerate() {
                // the value of largest magnitude, with its sign, maps to code 0 (−8)
                let max = x
                    .iter()
                    .fold(0.0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
                let d = max / -8.0;
                let inverse = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend(scale(d, name, b)?.to_le_bytes());
                // (x·(1/d) + 8.5) truncated, as C's cast to an integer truncates
                let code = |v: f32| ((v * inverse + 8.5) as i32).min(15) as u8;
                out.extend((0..16).map(|j| code(x[j]) | (code(x[j + 16]) << 4)));
            }
        }
        _ => unreachable!("{ty} is not a type qkv writes"),
    }
    Ok(out)
}

/// Block `b`'s scale as the f16 the block stores.
fn scale(d: f32, name: &str, b: usize) -> Result<f16> {
    let h = f16::from_f32(d);
    match h.is_finite() {
        true => Ok(h),
        false => Err(Error::invalid(
            name,
            format!("block {b} has the scale {d}, which f16 cannot hold (weights beyond ±8·10⁶)"),
        )),
    }
}
