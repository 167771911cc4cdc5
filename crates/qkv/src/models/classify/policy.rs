//! The rules every front end of a classifier shares: which label a row of scores names,
//! and what an input longer than the model takes gets.

use super::SequenceClassifier;
use crate::error::{Error, Result};

/// What an input longer than [`SequenceClassifier::max_len`] gets. Every input is cut
/// to that length either way (the longer text of a pair first); the policy decides
/// whether the user hears of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Truncate {
    /// cut, with a warning naming the input
    Warn,
    /// cut without a word
    Cut,
    /// an error naming the input, before anything runs
    Refuse,
}

impl Truncate {
    /// `"warn"`, `"cut"` or `"refuse"`.
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "warn" => Ok(Truncate::Warn),
            "cut" => Ok(Truncate::Cut),
            "refuse" => Ok(Truncate::Refuse),
            _ => Err(Error::Invalid {
                field: "truncate".into(),
                reason: format!("`{name}`: one of warn, cut, refuse"),
            }),
        }
    }
}

impl SequenceClassifier {
    /// Applies `policy` to `inputs` ahead of [`SequenceClassifier::classify`]: the
    /// warnings to show, one per input longer than the model takes (none under `Cut`,
    /// which tokenizes nothing for it), or under `Refuse` an error for the first such
    /// input. `name(i)` names input `i` as the caller's user knows it (`--text 2`,
    /// `text 1`, `--input row 7`).
    pub fn check_lengths(
        &self,
        inputs: &[(&str, Option<&str>)],
        policy: Truncate,
        name: impl Fn(usize) -> String,
    ) -> Result<Vec<String>> {
        if policy == Truncate::Cut {
            return Ok(Vec::new());
        }
        let mut warnings = Vec::new();
        for (i, n) in self.overlong(inputs)? {
            let what = format!(
                "{} is {n} tokens, more than the {} the model takes",
                name(i),
                self.max_len
            );
            if policy == Truncate::Refuse {
                return Err(Error::request(format!("{what} (`truncate` refuse)")));
            }
            warnings.push(format!(
                "{what}: cut to them (`truncate` cut says nothing, refuse stops)"
            ));
        }
        Ok(warnings)
    }

    /// The label a row of [`SequenceClassifier::labels`]' scores names and its score:
    /// the top one, the first of equals (as `argmax` and transformers' pipeline take
    /// it); a NaN never wins.
    pub fn top<'a>(&'a self, scores: &[f32]) -> (&'a str, f32) {
        let best = first_max(scores);
        let label = self.labels.get(best).map_or("", String::as_str);
        (label, scores.get(best).copied().unwrap_or(f32::NAN))
    }
}

/// The index of the largest of `scores`, the first of equals; a NaN never wins (0 for
/// none, or where all are NaN).
fn first_max(scores: &[f32]) -> usize {
    (1..scores.len()).fold(0, |best, j| {
        match scores[j] > scores[best] || scores[best].is_nan() {
            true if !scores[j].is_nan() => j,
            _ => best,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_top_is_the_first_of_equals_and_never_a_nan() {
        assert_eq!(first_max(&[0.2, 0.5, 0.3]), 1);
        assert_eq!(first_max(&[0.4, 0.2, 0.4]), 0);
        assert_eq!(first_max(&[0.1, 0.45, 0.45]), 1);
        assert_eq!(first_max(&[f32::NAN, 0.3, 0.7]), 2);
        assert_eq!(first_max(&[0.3, f32::NAN, 0.2]), 0);
        assert_eq!(first_max(&[f32::NAN, f32::NAN]), 0);
        assert_eq!(first_max(&[]), 0);
    }

    #[test]
    fn policies_parse_by_name() {
        assert_eq!(Truncate::parse("warn").unwrap(), Truncate::Warn);
        assert_eq!(Truncate::parse("cut").unwrap(), Truncate::Cut);
        assert_eq!(Truncate::parse("refuse").unwrap(), Truncate::Refuse);
        let e = Truncate::parse("drop").unwrap_err().to_string();
        assert!(e.contains("`truncate`") && e.contains("`drop`"), "{e}");
    }
}
