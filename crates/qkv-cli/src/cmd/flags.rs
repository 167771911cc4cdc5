//! The library names a request's settings by their keywords in backquotes
//! (`` `num_beams` ``, `` `stop_after` ``); a command writes them as its flags
//! (`--num-beams`, `--stop-after`).

/// A request's error as the flags of the command `A` say it. Only keywords that are
/// `A`'s flags are rewritten, and only in the library's own words: a cause underneath
/// is shown as it is (a file's `` `targets` `` is a tensor, not a flag).
pub fn in_flags<A: clap::Args>(e: qkv::Error) -> anyhow::Error {
    let known = flags_of::<A>();
    let flags = |text: &str| as_flags_of(text, &known);
    match e {
        qkv::Error::Memory { .. } => anyhow::anyhow!("{}", flags(&e.to_string())),
        qkv::Error::Invalid { field, reason } if known.contains(&flag(&field)) => {
            anyhow::anyhow!("invalid {}: {}", flag(&field), flags(&reason))
        }
        qkv::Error::Request { message, cause } => match cause {
            Some(c) => anyhow::anyhow!("{}: {c}", flags(&message)),
            None => anyhow::anyhow!("{}", flags(&message)),
        },
        e => e.into(),
    }
}

/// The long flags of `A`, `--max-new-tokens` and so on.
fn flags_of<A: clap::Args>() -> Vec<String> {
    let command = A::augment_args(clap::Command::new("qkv"));
    command
        .get_arguments()
        .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
        .collect()
}

fn flag(keyword: &str) -> String {
    format!("--{}", keyword.replace('_', "-"))
}

/// `text` with each keyword in backquotes that is one of `A`'s flags written as that
/// flag.
pub fn as_flags<A: clap::Args>(text: &str) -> String {
    as_flags_of(text, &flags_of::<A>())
}

fn as_flags_of(text: &str, known: &[String]) -> String {
    text.split('`')
        .enumerate()
        .map(|(i, part)| match (i % 2, known.contains(&flag(part))) {
            (1, true) => flag(part),
            (1, false) => format!("`{part}`"),
            _ => part.to_string(),
        })
        .collect()
}
