//! `Model.classify`: a `…ForSequenceClassification` folder's labels and scores for a
//! list of texts (or text pairs), as `qkv classify` and transformers' text-classification
//! pipeline give them.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use qkv::models::Truncate;

use crate::arrays;
use crate::errors::OrPy;
use crate::model::Model;

/// `{"label": [str; N], "score": f32 [N], "scores": f32 [N, L], "logits": f32 [N, L]}`
/// for `texts` (each read with `pairs[i]` where pairs are given), the scores under the
/// folder's scoring (softmax, sigmoid, or the logits for regression) and the label
/// the top score's ([`qkv::models::SequenceClassifier::top`]).
pub fn classify<'py>(
    model: &Model,
    py: Python<'py>,
    texts: Vec<String>,
    pairs: Option<Vec<String>>,
    truncate: &str,
) -> PyResult<Bound<'py, PyDict>> {
    let truncate = Truncate::parse(truncate).or_py()?;
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
    let name = |i: usize| format!("text {i}");
    let warnings = py
        .detach(|| classifier.check_lengths(&inputs, truncate, name))
        .or_py()?;
    for w in warnings {
        py.import("warnings")?.call_method1("warn", (w,))?;
    }
    let logits = py.detach(|| classifier.classify(&inputs)).or_py()?;
    let n_labels = classifier.labels().len();
    let mut labels = Vec::with_capacity(logits.len());
    let mut top_scores = Vec::with_capacity(logits.len());
    let mut scores = Vec::with_capacity(logits.len() * n_labels);
    for row in &logits {
        let s = classifier.scoring().apply(row);
        let (label, score) = classifier.top(&s);
        labels.push(label.to_string());
        top_scores.push(score);
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
