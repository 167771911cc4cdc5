//! The rules every front end of a classifier shares (through
//! [`super::SequenceClassifier`]'s `check_lengths` and `top`): what an input longer than
//! the model takes gets, and which label a row of scores names.

use crate::error::{Error, Result};

/// What an input longer than the model takes gets. Every input is cut
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

/// The warnings `policy` gives for the inputs `overlong` names ((index, tokens) of each
/// longer than `max_len`), or under `Refuse` the error of the first; `name(i)` names
/// input `i` as the caller's user knows it.
pub(super) fn judge_lengths(
    policy: Truncate,
    max_len: usize,
    overlong: &[(usize, usize)],
    name: impl Fn(usize) -> String,
) -> Result<Vec<String>> {
    let mut warnings = Vec::new();
    for &(i, n) in overlong {
        let what = format!(
            "{} is {n} tokens, more than the {max_len} the model takes",
            name(i)
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

/// The index of the largest of `scores`, the first of equals; a NaN never wins (0 for
/// none, or where all are NaN).
pub(super) fn first_max(scores: &[f32]) -> usize {
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
    fn overlong_inputs_are_warned_of_or_refused() {
        let name = |i: usize| format!("text {i}");
        let long = [(1, 20), (3, 18)];
        let warned = judge_lengths(Truncate::Warn, 16, &long, name).unwrap();
        assert_eq!(warned.len(), 2);
        assert!(
            warned[0].starts_with("text 1 is 20 tokens, more than the 16"),
            "{warned:?}"
        );
        assert!(warned[1].starts_with("text 3 is 18 tokens"), "{warned:?}");
        let e = judge_lengths(Truncate::Refuse, 16, &long, name)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("text 1 is 20 tokens") && e.ends_with("(`truncate` refuse)"),
            "{e}"
        );
        assert!(judge_lengths(Truncate::Refuse, 16, &[], name)
            .unwrap()
            .is_empty());
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
