//! `Model.attribute`: what a model used on one text, by attention weights, value norms,
//! rollout, flow, gradient × attention or ablation (`qkv::models::explain`), as
//! NumPy arrays.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use qkv::models::explain::{attribute as run, token_labels, Method, Target};
use qkv::models::{Input, ModelKind, TokenBatch};
use qkv::text::TokenLabel;
use qkv::Tensor;

use crate::arrays;
use crate::errors::OrPy;
use crate::ints::{self, Int};
use crate::model::Model;

/// Token ids of `text` (a string through the folder's tokenizer, as a sentence encoder
/// reads it when it is one; or a list of ids), named `name` in errors.
fn ids(model: &Model, text: &Bound<'_, PyAny>, name: &str) -> PyResult<Vec<usize>> {
    if text.is_instance_of::<PyString>() {
        let s: String = text.extract()?;
        return match model.sentence() {
            Some(se) => Ok(se.tokenize(&[s.as_str()]).or_py()?.ids),
            None => model.tokenizer()?.encode(&s, true).or_py(),
        };
    }
    let list: Vec<Int> = text.extract().map_err(|_| {
        PyValueError::new_err(format!("`{name}` must be a str or a list of token ids"))
    })?;
    let ids = ints::counts(list, name)?;
    if ids.is_empty() {
        return Err(PyValueError::new_err(format!("`{name}` has no tokens")));
    }
    Ok(ids)
}

/// An encoder-decoder's decoder input: ids as given, or the start token then the
/// text's tokens.
fn decoder_ids(model: &Model, input: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<usize>> {
    let input = input.ok_or_else(|| {
        PyValueError::new_err(
            "an encoder-decoder is explained on a decoder input: pass `decoder_input` (a text, or ids with the start token)",
        )
    })?;
    if input.is_instance_of::<PyString>() {
        let s: String = input.extract()?;
        let start = model
            .transformer()
            .special_tokens()
            .decoder_start
            .ok_or_else(|| {
                PyValueError::new_err(
                    "the config defines no decoder_start_token_id: pass `decoder_input` as ids",
                )
            })?;
        let rest = model.tokenizer()?.encode(&s, true).or_py()?;
        return Ok(std::iter::once(start).chain(rest).collect());
    }
    ids(model, input, "decoder_input")
}

fn labels(list: Vec<TokenLabel>) -> Vec<String> {
    list.iter().map(TokenLabel::label).collect()
}

fn array<'py>(py: Python<'py>, t: &Tensor, combined: bool) -> PyResult<Bound<'py, PyAny>> {
    // [1, H, T, S] → [H, T, S], or [T, S] for a map with the heads combined
    let shape = match combined {
        true => &t.shape()[2..],
        false => &t.shape()[1..],
    };
    Ok(arrays::out(py, t.data().to_vec(), shape)?.into_any())
}

pub fn attribute<'py>(
    model: &Model,
    py: Python<'py>,
    text: &Bound<'py, PyAny>,
    method: &str,
    target: Option<&Bound<'py, PyAny>>,
    decoder_input: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyDict>> {
    let method = Method::from_name(method).or_py()?;
    let m = model.transformer();
    let source = ids(model, text, "text")?;
    let seq2seq = m.kind() == ModelKind::EncoderDecoder;
    let dec = match seq2seq {
        true => Some(decoder_ids(model, decoder_input)?),
        false if decoder_input.is_some() => {
            return Err(PyValueError::new_err(format!(
                "`decoder_input` is for encoder-decoders; {} is {}",
                model.dir.display(),
                m.info().architecture
            )))
        }
        false => None,
    };
    let (token, compare) = match target {
        None => (None, None),
        Some(t) if t.is_instance_of::<PyString>() => {
            let Some(se) = model.sentence() else {
                return Err(PyValueError::new_err(format!(
                    "a text `target` is compared with by cosine, which needs a sentence-transformers folder; {} is not one (give a token id)",
                    model.dir.display()
                )));
            };
            let other: String = t.extract()?;
            let with = py.detach(|| se.embed(&[other.as_str()])).or_py()?.remove(0);
            (None, Some((with, se.pooling().to_vec())))
        }
        Some(t) => (Some(t.extract::<Int>()?.count("target")?), None),
    };
    let read = match m.kind() {
        ModelKind::Encoder => &source,
        _ => dec.as_ref().unwrap_or(&source),
    };
    let goal = Target::default_for(m, model.maybe_tokenizer(), read, token, compare);
    if goal.is_none() && method.needs_target() {
        return Err(PyValueError::new_err(format!(
            "method `{}` explains a target, and this text gives none: a sentence encoder's is the cosine with `target=\"other text\"`, a masked-LM model's the top token at the first mask of the text",
            method.name()
        )));
    }
    let src = TokenBatch::single(source.clone()).or_py()?;
    let tgt = dec.clone().map(TokenBatch::single).transpose().or_py()?;
    let input = match m.kind() {
        ModelKind::Decoder => Input {
            target: Some(&src),
            ..Default::default()
        },
        _ => Input {
            source: Some(&src),
            target: tgt.as_ref(),
            token_types: None,
        },
    };
    let a = py
        .detach(|| run(m, &input, method, goal.as_ref()))
        .or_py()?;

    let out = PyDict::new(py);
    out.set_item("method", method.name())?;
    let tok = model.maybe_tokenizer();
    out.set_item("tokens", labels(token_labels(m, tok, &source).or_py()?))?;
    if let Some(d) = &dec {
        out.set_item("target_tokens", labels(token_labels(m, tok, d).or_py()?))?;
    }
    match &a.target {
        Some(t) => {
            let d = PyDict::new(py);
            let kind = match t.target {
                Target::NextToken(_) => "next_token",
                Target::Masked { .. } => "masked_token",
                Target::Cosine { .. } => "cosine",
            };
            d.set_item("kind", kind)?;
            d.set_item("position", t.position)?;
            d.set_item("token", t.token)?;
            d.set_item("value", t.value)?;
            out.set_item("target", d)?;
        }
        None => out.set_item("target", py.None())?,
    }
    match a.scores {
        Some(s) => {
            let n = s.len();
            out.set_item("scores", arrays::out(py, s, &[n])?)?
        }
        None => out.set_item("scores", py.None())?,
    }
    if method != Method::Ablation {
        let maps = PyDict::new(py);
        let combined = !method.per_head();
        for (kind, list) in [
            ("encoder", &a.maps.encoder),
            ("decoder", &a.maps.decoder),
            ("cross", &a.maps.cross),
        ] {
            if !list.is_empty() {
                let arrays = list
                    .iter()
                    .map(|t| array(py, t, combined))
                    .collect::<PyResult<Vec<_>>>()?;
                maps.set_item(kind, arrays)?;
            }
        }
        out.set_item("maps", maps)?;
    }
    Ok(out)
}
