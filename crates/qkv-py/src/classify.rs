//! `Model.classify`: a `…ForSequenceClassification` folder's labels and scores for a
//! list of texts (or text pairs), as `qkv classify` and transformers' text-classification
//! pipeline give them.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::arrays;
use crate::errors::OrPy;
use crate::model::Model;

/// What an input longer than the model takes gets.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Truncate {
    /// cut, with a `UserWarning` naming the input
    Warn,
    Cut,
    /// a `ValueError` naming the input
    Refuse,
}

impl Truncate {
    fn parse(name: &str) -> PyResult<Self> {
        match name {
            "warn" => Ok(Truncate::Warn),
            "cut" => Ok(Truncate::Cut),
            "refuse" => Ok(Truncate::Refuse),
            _ => Err(PyValueError::new_err(format!(
                "invalid truncate: `{name}`: one of \"warn\", \"cut\", \"refuse\""
            ))),
        }
    }
}

/// `{"label": [str; N], "score": f32 [N], "scores": f32 [N, L], "logits": f32 [N, L]}`
/// for `texts` (each read with `pairs[i]` where pairs are given), the scores under the
/// folder's scoring (softmax, sigmoid, or the logits for regression) and the label
/// the top score's (the first of equals, as `argmax`).
pub fn classify<'py>(
    model: &Model,
    py: Python<'py>,
    texts: Vec<String>,
    pairs: Option<Vec<String>>,
    truncate: &str,
) -> PyResult<Bound<'py, PyDict>> {
    let truncate = Truncate::parse(truncate)?;
    let Some(classifier) = model.classifier() else {
        return Err(PyValueError::new_err(format!(
            "{} is not a …ForSequenceClassification folder (config.json's architectures): it has no head to classify with",
            model.dir.display()
        )));
    };
    if let Some(p) = &pairs {
        if p.len() != texts.len() {
            return Err(PyValueError::new_err(format!(
                "invalid pairs: {} given for {} texts; give one second text per text, or none",
                p.len(),
                texts.len()
            )));
        }
    }
    let inputs: Vec<(&str, Option<&str>)> = texts
        .iter()
        .enumerate()
        .map(|(i, t)| (t.as_str(), pairs.as_ref().map(|p| p[i].as_str())))
        .collect();
    if truncate != Truncate::Cut {
        for (i, n) in py.detach(|| classifier.overlong(&inputs)).or_py()? {
            let what = format!(
                "text {i} is {n} tokens, more than the {} the model takes",
                classifier.max_len()
            );
            match truncate {
                Truncate::Refuse => {
                    return Err(PyValueError::new_err(format!(
                        "{what} (truncate=\"refuse\")"
                    )))
                }
                _ => {
                    let warning = format!("{what}: cut to them (truncate=\"cut\" says nothing)");
                    py.import("warnings")?.call_method1("warn", (warning,))?;
                }
            }
        }
    }
    let logits = py.detach(|| classifier.classify(&inputs)).or_py()?;
    let n_labels = classifier.labels().len();
    let mut labels = Vec::with_capacity(logits.len());
    let mut top_scores = Vec::with_capacity(logits.len());
    let mut scores = Vec::with_capacity(logits.len() * n_labels);
    for row in &logits {
        let s = classifier.scoring().apply(row);
        let top = (0..s.len()).fold(0, |best, j| if s[j] > s[best] { j } else { best });
        labels.push(classifier.labels()[top].clone());
        top_scores.push(s[top]);
        scores.extend(s);
    }
    let n = logits.len();
    let d = PyDict::new(py);
    d.set_item("label", labels)?;
    d.set_item("score", arrays::out(py, top_scores, &[n])?)?;
    d.set_item("scores", arrays::out(py, scores, &[n, n_labels])?)?;
    let flat: Vec<f32> = logits.into_iter().flatten().collect();
    d.set_item("logits", arrays::out(py, flat, &[n, n_labels])?)?;
    Ok(d)
}
