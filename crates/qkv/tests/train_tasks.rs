//! The synthetic tasks and byte-level text data: each batch has the documented layout,
//! batches are deterministic for a seed, −100 sits exactly on the unscored positions,
//! and bad options or files give clear errors.

#![cfg(feature = "models")]

use qkv::rng::Rng;
use qkv::train::tasks::{
    accuracy, exact_match, Accuracy, Batch, Task, TaskKind, TaskOptions, IGNORE_INDEX,
};
use qkv::train::text_data::{decode, encode, Split, TextData, BYTE_VOCAB};

fn task(name: &str, o: TaskOptions) -> Task {
    Task::from_name(name, &o).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn opts(length: usize, symbols: usize) -> TaskOptions {
    TaskOptions {
        length: Some(length),
        symbols: Some(symbols),
        ..Default::default()
    }
}

fn row(b: &Batch, r: usize) -> (&[usize], &[i64]) {
    let span = r * b.len..(r + 1) * b.len;
    (&b.inputs[span.clone()], &b.targets[span])
}

/// Checks what every task shares: shapes, ids in the vocabulary, and that every scored
/// target is the next input token (teacher forcing), and returns the batch.
fn sample(t: &Task, batch: usize, seed: u64) -> Batch {
    let b = t.batch(batch, &mut Rng::new(seed));
    assert_eq!((b.batch, b.len), (batch, t.seq_len()), "{t}");
    assert_eq!(b.inputs.len(), batch * t.seq_len());
    assert_eq!(b.targets.len(), batch * t.seq_len());
    assert!(
        b.inputs.iter().all(|&x| x < t.vocab_size()),
        "{t}: input id"
    );
    for r in 0..batch {
        let (x, y) = row(&b, r);
        for i in 0..y.len() {
            let target = y[i];
            if target == IGNORE_INDEX {
                continue;
            }
            assert!((0..t.vocab_size() as i64).contains(&target), "{t}: target");
            if i + 1 < x.len() {
                assert_eq!(
                    target,
                    x[i + 1] as i64,
                    "{t}: row {r} target {i} is not the next input"
                );
            }
        }
        let scored = y.iter().filter(|&&v| v != IGNORE_INDEX).count();
        assert_eq!(scored, t.scored_per_example(), "{t}: scored per row");
    }
    b
}

#[test]
fn copy_reverse_sort_layout() {
    for (name, len, sym) in [
        ("copy", 5, 7),
        ("reverse", 7, 3),
        ("sort", 6, 4),
        ("copy", 1, 2),
    ] {
        let t = task(name, opts(len, sym));
        assert_eq!(t.seq_len(), 2 * len);
        assert_eq!(t.vocab_size(), sym + 1);
        assert_eq!(t.separator(), Some(sym));
        let b = sample(&t, 9, 11);
        for r in 0..b.batch {
            let (x, y) = row(&b, r);
            let source = &x[..len];
            assert!(source.iter().all(|&s| s < sym), "{name}: source symbols");
            assert_eq!(x[len], sym, "{name}: separator after the source");
            assert!(
                y[..len].iter().all(|&v| v == IGNORE_INDEX),
                "{name}: source unscored"
            );
            let mut want: Vec<usize> = source.to_vec();
            match name {
                "reverse" => want.reverse(),
                "sort" => want.sort(),
                _ => {}
            }
            let answer: Vec<usize> = y[len..].iter().map(|&v| v as usize).collect();
            assert_eq!(answer, want, "{name}: row {r}");
            assert_eq!(
                &x[len + 1..],
                &want[..len - 1],
                "{name}: teacher-forced answer"
            );
        }
    }
}

#[test]
fn recall_layout() {
    let t = task(
        "recall",
        TaskOptions {
            length: Some(6),
            symbols: Some(9),
            queries: Some(3),
            distance: None,
        },
    );
    let (n, pairs, queries) = (9, 6, 3);
    assert_eq!(t.vocab_size(), 2 * n + 1);
    assert_eq!(t.seq_len(), 2 * (pairs + queries));
    let b = sample(&t, 16, 5);
    for r in 0..b.batch {
        let (x, y) = row(&b, r);
        let keys: Vec<usize> = (0..pairs).map(|i| x[2 * i]).collect();
        let values: Vec<usize> = (0..pairs).map(|i| x[2 * i + 1]).collect();
        assert!(keys.iter().all(|&k| k < n) && values.iter().all(|&v| (n..2 * n).contains(&v)));
        let mut distinct = keys.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), pairs, "keys are distinct");
        assert_eq!(x[2 * pairs], 2 * n, "separator");
        let mut asked = Vec::new();
        for (i, &target) in y.iter().enumerate() {
            let is_query = i > 2 * pairs && (i - 2 * pairs) % 2 == 1;
            if !is_query {
                assert_eq!(target, IGNORE_INDEX, "row {r} position {i}");
                continue;
            }
            let q = x[i];
            let k = keys
                .iter()
                .position(|&k| k == q)
                .expect("query is a key of the row");
            assert_eq!(target, values[k] as i64, "row {r}: value of key {q}");
            asked.push(q);
        }
        asked.sort();
        asked.dedup();
        assert_eq!(asked.len(), queries, "queries ask distinct keys");
    }
}

#[test]
fn long_range_layout() {
    for (len, d) in [(7, 3), (20, 20), (33, 2), (17, 9)] {
        let t = task(
            "long_range",
            TaskOptions {
                length: Some(len),
                symbols: Some(5),
                distance: Some(d),
                queries: None,
            },
        );
        assert_eq!((t.seq_len(), t.vocab_size(), t.separator()), (len, 5, None));
        let b = sample(&t, 6, 3);
        for r in 0..b.batch {
            let (x, y) = row(&b, r);
            for i in 0..len {
                if i + 1 < d {
                    assert_eq!(y[i], IGNORE_INDEX, "len {len} d {d}: position {i}");
                } else {
                    // the next token repeats the one d positions before it
                    assert_eq!(y[i], x[i + 1 - d] as i64, "len {len} d {d}: position {i}");
                }
                if i >= d {
                    assert_eq!(x[i], x[i - d]);
                }
            }
        }
    }
}

#[test]
fn first_layout() {
    for d in [1, 3, 40] {
        let t = task(
            "first",
            TaskOptions {
                symbols: Some(7),
                distance: Some(d),
                ..Default::default()
            },
        );
        assert_eq!(
            (t.seq_len(), t.vocab_size(), t.separator()),
            (d + 2, 8, Some(7))
        );
        assert_eq!(t.scored_per_example(), 1);
        let b = sample(&t, 5, 4);
        for r in 0..b.batch {
            let (x, y) = row(&b, r);
            // the first symbol, d distractors, the separator; the first symbol asked for there
            assert!(
                x[..=d].iter().all(|&s| s < 7) && x[d + 1] == 7,
                "d {d}: {x:?}"
            );
            for (i, &target) in y.iter().enumerate() {
                let want = if i == d + 1 {
                    x[0] as i64
                } else {
                    IGNORE_INDEX
                };
                assert_eq!(target, want, "d {d}: position {i}");
            }
        }
        // the options round-trip
        assert_eq!(Task::from_name("first", &t.options()).unwrap(), t);
    }
    let e = Task::from_name("first", &opts(4, 5))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("length") && e.contains("`first` does not take"),
        "{e}"
    );
}

#[test]
fn batches_are_deterministic_for_a_seed() {
    for name in TaskKind::NAMES {
        let t = task(name, TaskOptions::default());
        assert_eq!(
            t.batch(4, &mut Rng::new(9)),
            t.batch(4, &mut Rng::new(9)),
            "{name}"
        );
        assert_ne!(
            t.batch(4, &mut Rng::new(9)),
            t.batch(4, &mut Rng::new(10)),
            "{name}"
        );
        // a batch of 4 is the first 4 examples of a longer stream
        let mut rng = Rng::new(9);
        let two = [t.batch(2, &mut rng), t.batch(2, &mut rng)];
        let four = t.batch(4, &mut Rng::new(9));
        assert_eq!(
            [two[0].inputs.clone(), two[1].inputs.clone()].concat(),
            four.inputs
        );
        sample(&t, 3, 1);
    }
}

#[test]
fn defaults_options_and_names() {
    for name in TaskKind::NAMES {
        let t = task(name, TaskOptions::default());
        assert_eq!(t.name(), name);
        assert_eq!(t.kind().name(), name);
        // the resolved options rebuild the same task
        assert_eq!(Task::from_name(name, &t.options()).unwrap(), t);
        assert!(t.to_string().starts_with(&format!("{name}(")), "{t}");
    }
    let copy = task("copy", TaskOptions::default());
    assert_eq!((copy.seq_len(), copy.vocab_size()), (16, 11));
    assert_eq!(copy.to_string(), "copy(length=8, symbols=10)");
}

#[test]
fn bad_names_and_options_are_explained() {
    let err = |name: &str, o: TaskOptions| Task::from_name(name, &o).unwrap_err().to_string();
    let e = err("copyy", TaskOptions::default());
    assert!(e.contains("unknown task `copyy`"), "{e}");
    for n in TaskKind::NAMES {
        assert!(e.contains(n), "{e} lists {n}");
    }
    let e = err(
        "copy",
        TaskOptions {
            distance: Some(3),
            ..Default::default()
        },
    );
    assert!(
        e.contains("distance") && e.contains("`copy` does not take"),
        "{e}"
    );
    let e = err(
        "long_range",
        TaskOptions {
            queries: Some(3),
            ..Default::default()
        },
    );
    assert!(e.contains("queries"), "{e}");
    let e = err("sort", opts(0, 10));
    assert!(e.contains("length"), "{e}");
    let e = err("reverse", opts(4, 1));
    assert!(e.contains("symbols"), "{e}");
    let e = err("recall", opts(10, 5));
    assert!(e.contains("symbols") && e.contains("distinct"), "{e}");
    let e = err(
        "recall",
        TaskOptions {
            length: Some(3),
            queries: Some(4),
            ..Default::default()
        },
    );
    assert!(e.contains("queries"), "{e}");
    let e = err(
        "long_range",
        TaskOptions {
            length: Some(5),
            distance: Some(6),
            ..Default::default()
        },
    );
    assert!(e.contains("length") && e.contains("distance 6"), "{e}");
    let e = err(
        "long_range",
        TaskOptions {
            distance: Some(1),
            ..Default::default()
        },
    );
    assert!(e.contains("distance"), "{e}");
}

#[test]
fn accuracy_counts_scored_positions_only() {
    let targets = [IGNORE_INDEX, 3, 4, IGNORE_INDEX, 1, 2];
    let preds = [9, 3, 0, 9, 1, 2];
    assert_eq!(
        accuracy(&preds, &targets).unwrap(),
        Accuracy {
            correct: 1 + 2,
            total: 4
        }
    );
    assert_eq!(accuracy(&preds, &targets).unwrap().fraction(), 0.75);
    // rows of 3: row 0 misses one, row 1 is exact
    let rows = exact_match(&preds, &targets, 3).unwrap();
    assert_eq!((rows.correct, rows.total), (1, 2));
    // a row with nothing scored does not count
    let rows = exact_match(&[0, 0], &[IGNORE_INDEX, IGNORE_INDEX], 1).unwrap();
    assert_eq!((rows.total, rows.fraction()), (0, 0.0));
    let mut sum = Accuracy::default();
    sum += Accuracy {
        correct: 1,
        total: 2,
    };
    sum += Accuracy {
        correct: 3,
        total: 4,
    };
    assert_eq!(sum.fraction(), 4.0 / 6.0);
    assert!(accuracy(&preds[..5], &targets).is_err());
    assert!(exact_match(&preds, &targets, 4).is_err());
    // perfect predictions of a real batch score 1
    let t = task("reverse", TaskOptions::default());
    let b = t.batch(3, &mut Rng::new(2));
    let perfect: Vec<usize> = b.targets.iter().map(|&v| v.max(0) as usize).collect();
    assert_eq!(accuracy(&perfect, &b.targets).unwrap().fraction(), 1.0);
    assert_eq!(
        exact_match(&perfect, &b.targets, b.len).unwrap().fraction(),
        1.0
    );
}

// ---------------------------------------------------------------- text data

fn temp_file(name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("qkv-text-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

const TEXT: &str = "The quick brown fox jumps over the lazy dog; attention is all you need. \
                    Queries meet keys, values follow. ";

#[test]
fn text_windows_are_shifted_by_one() {
    let path = temp_file("fox.txt", TEXT.as_bytes());
    let (t, f) = (9, 0.2);
    let data = TextData::open(&path, t, f).unwrap();
    assert_eq!(data.vocab_size(), BYTE_VOCAB);
    assert_eq!(data.seq_len(), t);
    assert!(data.name().ends_with("fox.txt"));
    let n = TEXT.len();
    let n_val = (n as f64 * f).round() as usize;
    assert_eq!(data.bytes(Split::Validation), &TEXT.as_bytes()[n - n_val..]);
    assert_eq!(data.bytes(Split::Train), &TEXT.as_bytes()[..n - n_val]);
    assert_eq!(data.windows(Split::Train), n - n_val - t);

    let (x, y) = data.window(Split::Train, 4);
    assert_eq!(decode(&x).unwrap(), "quick bro");
    assert_eq!(
        y,
        encode("uick brow")
            .iter()
            .map(|&b| b as i64)
            .collect::<Vec<_>>()
    );

    for split in [Split::Train, Split::Validation] {
        let b = data.batch(split, 7, &mut Rng::new(4)).unwrap();
        assert_eq!((b.batch, b.len, b.inputs.len()), (7, t, 7 * t));
        let source = data.bytes(split);
        for r in 0..b.batch {
            let (x, y) = row(&b, r);
            let window: Vec<u8> = x
                .iter()
                .map(|&v| v as u8)
                .chain([*y.last().unwrap() as u8])
                .collect();
            assert!(
                source.windows(t + 1).any(|w| w == window.as_slice()),
                "{split:?} row {r} is a window of its split"
            );
            for i in 0..t - 1 {
                assert_eq!(y[i], x[i + 1] as i64);
            }
            assert!(
                y.iter().all(|&v| v != IGNORE_INDEX),
                "every position scored"
            );
        }
        assert_eq!(
            b,
            data.batch(split, 7, &mut Rng::new(4)).unwrap(),
            "deterministic"
        );
    }
}

#[test]
fn text_errors_name_the_file_and_the_needed_length() {
    let empty = temp_file("empty.txt", b"");
    let e = TextData::open(&empty, 8, 0.1).unwrap_err().to_string();
    assert!(e.contains("empty.txt") && e.contains("empty"), "{e}");

    // T = 8 → windows of 9 bytes; validation = round(0.1·n) ≥ 9 needs n ≥ 85
    let short = temp_file("short.txt", &[b'a'; 84]);
    let e = TextData::open(&short, 8, 0.1).unwrap_err().to_string();
    assert!(
        e.contains("short.txt") && e.contains("84 bytes") && e.contains("at least 85 bytes"),
        "{e}"
    );
    let ok = temp_file("ok.txt", &[b'a'; 85]);
    assert_eq!(
        TextData::open(&ok, 8, 0.1)
            .unwrap()
            .windows(Split::Validation),
        1
    );

    // without validation one window of T + 1 bytes is enough
    let e = TextData::from_bytes("tiny", b"abcd".to_vec(), 4, 0.0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("tiny") && e.contains("at least 5 bytes"), "{e}");
    let data = TextData::from_bytes("tiny", b"abcde".to_vec(), 4, 0.0).unwrap();
    assert!(!data.has_validation());
    assert_eq!(data.windows(Split::Train), 1);
    let e = data
        .batch(Split::Validation, 1, &mut Rng::new(0))
        .unwrap_err()
        .to_string();
    assert!(e.contains("Validation") && e.contains("empty"), "{e}");

    let missing = std::env::temp_dir().join("qkv-no-such-dir/none.txt");
    let e = TextData::open(&missing, 8, 0.1).unwrap_err().to_string();
    assert!(e.contains("none.txt"), "{e}");
    let dir = missing.parent().unwrap().parent().unwrap();
    assert!(
        TextData::open(dir, 8, 0.1).is_err(),
        "a directory is unreadable as text"
    );

    assert!(TextData::from_bytes("x", vec![1; 100], 0, 0.1).is_err());
    assert!(TextData::from_bytes("x", vec![1; 100], 4, 1.0).is_err());
    assert!(TextData::from_bytes("x", vec![1; 100], 4, -0.1).is_err());
}

#[test]
fn bytes_cover_any_file() {
    // invalid UTF-8 and every byte value are fine: the vocabulary is the bytes
    let all: Vec<u8> = (0..=255u8).cycle().take(700).collect();
    let data = TextData::from_bytes("binary", all, 31, 0.1).unwrap();
    let b = data.batch(Split::Train, 4, &mut Rng::new(1)).unwrap();
    assert!(b.inputs.iter().all(|&x| x < BYTE_VOCAB));
    assert_eq!(encode("é"), vec![0xC3, 0xA9]);
    assert_eq!(decode(&[0x68, 0xFF]).unwrap(), "h\u{FFFD}");
}
