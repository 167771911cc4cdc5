//! The real model: a sentence encoder (all-MiniLM-L6-v2, say) explained on sentence
//! pairs, the target each pair's cosine; and the articles' own sentence, where the
//! question is whether "it" points at "animal" or at "street".

use std::path::Path;

use super::measure::{agreement, Agreement};
use crate::batch::TokenBatch;
use crate::error::{Error, Result};
use crate::models::explain::{attribute, token_labels, Method, Target};
use crate::models::sentence::SentenceEncoder;
use crate::models::Input;
use crate::tensor::Tensor;

/// Sentences and the sentence each is compared with: the target is their cosine.
pub(super) const PAIRS: [(&str, &str); 16] = [
    (
        "A man is playing a guitar on the stage.",
        "Someone performs music for a crowd.",
    ),
    (
        "The cat sleeps on the warm windowsill.",
        "A kitten naps in the sun.",
    ),
    (
        "Stock prices fell sharply after the announcement.",
        "The market dropped on the news.",
    ),
    (
        "She bought fresh bread at the bakery this morning.",
        "A woman shopped for food early today.",
    ),
    (
        "The train to Berlin was delayed by two hours.",
        "Rail travel in Germany ran late.",
    ),
    (
        "Heavy rain flooded the streets of the old town.",
        "A storm caused flooding in the city.",
    ),
    (
        "The children built a sandcastle near the water.",
        "Kids played on the beach.",
    ),
    (
        "He forgot his umbrella and got soaked.",
        "A man was caught in the rain without cover.",
    ),
    (
        "The new phone has a larger battery and a brighter screen.",
        "The device was improved.",
    ),
    (
        "Our team won the final match in extra time.",
        "The club took the championship.",
    ),
    (
        "The doctor told him to rest for a week.",
        "A physician prescribed time off.",
    ),
    (
        "Fresh snow covered the mountain trails overnight.",
        "Winter arrived in the hills.",
    ),
    (
        "The museum opens a new exhibition on ancient Egypt.",
        "A show about pharaohs begins.",
    ),
    (
        "I can't find my keys anywhere in the house.",
        "Something was lost at home.",
    ),
    (
        "The chef added too much salt to the soup.",
        "The meal tasted salty.",
    ),
    (
        "Volunteers planted trees along the river bank.",
        "People worked to green the riverside.",
    ),
];

/// The articles' sentence, and what its cosine target compares it with.
pub(super) const ANIMAL: &str = "The animal didn't cross the street because it was too tired.";
const ANIMAL_COMPARE: &str = "The tired dog stayed on the pavement.";

/// One row of "it"'s credit per method (ablation last), over the sentence's tokens.
pub(super) struct ItRow {
    pub(super) tokens: Vec<String>,
    pub(super) credit: Vec<Vec<f32>>,
    /// Positions of "animal" and "street".
    pub(super) animal: usize,
    pub(super) street: usize,
}

/// A model folder's results: one agreement per pair, and the animal sentence.
pub(super) struct Sentences {
    pub(super) name: String,
    pub(super) texts: Vec<Agreement>,
    pub(super) it: ItRow,
}

fn input(batch: &TokenBatch) -> Input<'_> {
    Input {
        source: Some(batch),
        ..Default::default()
    }
}

/// Row `row` of a map `[1, H, T, T]`, heads averaged; `minus_identity` takes the
/// identity off (gradient × attention's R starts from I).
fn row_of(map: &Tensor, row: usize, minus_identity: bool) -> Vec<f32> {
    let [_, h, t, _] = map.shape()[..] else {
        unreachable!("maps are [1, H, T, S]")
    };
    let mut out = vec![0f32; t];
    for head in map.data().chunks_exact(t * t) {
        for (o, &x) in out.iter_mut().zip(&head[row * t..(row + 1) * t]) {
            *o += x / h as f32;
        }
    }
    if minus_identity {
        out[row] -= 1.0;
    }
    out
}

/// "it"'s row of each method's last map; ablation: 1 − cos between "it"'s final state
/// and that state with key s hidden.
fn it_row(encoder: &SentenceEncoder) -> Result<ItRow> {
    let model = encoder.encoder();
    let batch = encoder.tokenize(&[ANIMAL])?;
    let labels = token_labels(model, Some(encoder.tokenizer()), &batch.ids)?;
    let tokens: Vec<String> = labels.iter().map(|l| l.label()).collect();
    let find = |word: &str| {
        tokens.iter().position(|t| t == word).ok_or_else(|| {
            Error::invalid(
                "model",
                format!("its tokenizer splits `{word}` of the articles' sentence"),
            )
        })
    };
    let (it, animal, street) = (find("it")?, find("animal")?, find("street")?);
    let compare = Target::Cosine {
        with: encoder.embed(&[ANIMAL_COMPARE])?.remove(0),
        pooling: encoder.pooling().to_vec(),
    };
    let mut credit = Vec::new();
    for method in super::measure::COMPARED {
        let target = (method == Method::Grad).then_some(&compare);
        let a = attribute(model, &input(&batch), method, target)?;
        let last = a.maps.encoder.last().expect("an encoder's maps");
        credit.push(row_of(last, it, method == Method::Grad));
    }
    // ablation: how far "it"'s own final state moves when each key is hidden
    let t = batch.len;
    let c = model.info().hidden;
    let state = model.forward(&input(&batch), false)?.logits;
    let h_it = &state.data()[it * c..(it + 1) * c];
    let rows = TokenBatch::new(batch.ids.repeat(t), None, t, t)?;
    let hidden = model.forward_hiding(&input(&rows), &(0..t).collect::<Vec<_>>())?;
    let cos = |a: &[f32], b: &[f32]| {
        let dot: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum();
        let n = |v: &[f32]| v.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
        dot / (n(a) * n(b)).max(1e-12)
    };
    credit.push(
        (0..t)
            .map(|s| {
                let at = (s * t + it) * c;
                (1.0 - cos(h_it, &hidden.data()[at..at + c])) as f32
            })
            .collect(),
    );
    Ok(ItRow {
        tokens,
        credit,
        animal,
        street,
    })
}

/// Every pair and the animal sentence through the sentence-transformers folder `dir`.
pub(super) fn measure(dir: &Path, progress: &mut dyn FnMut(&str)) -> Result<Sentences> {
    let encoder = SentenceEncoder::load(dir)?;
    let name = dir
        .file_name()
        .map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into());
    let mut texts = Vec::new();
    for (text, other) in PAIRS {
        let batch = encoder.tokenize(&[text])?;
        let target = Target::Cosine {
            with: encoder.embed(&[other])?.remove(0),
            pooling: encoder.pooling().to_vec(),
        };
        texts.push(agreement(encoder.encoder(), &input(&batch), &target)?);
    }
    progress(&format!("{name}: {} sentence pairs explained", PAIRS.len()));
    let it = it_row(&encoder)?;
    Ok(Sentences { name, texts, it })
}
