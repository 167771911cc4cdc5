//! An encoder-decoder trains and then generates through the same model, with its KV
//! cache: the source → target split of a task batch, learning `reverse` to exact
//! greedy outputs, cached decoding equal to the full forward, and clear errors.

#![cfg(feature = "models")]

use qkv::models::generate::{generate_seq2seq, GenerateOptions, Sampling};
use qkv::models::{Arch, Input, Position, TokenBatch, Transformer};
use qkv::rng::Rng;
use qkv::train::optim::{AdamW, AdamWConfig};
use qkv::train::tasks::{accuracy, source_target_batch, Task, TaskOptions};
use qkv::train::trainable::{Batch, Source, TrainableModel};

fn reverse_task(length: usize, symbols: usize) -> Task {
    let options = TaskOptions {
        length: Some(length),
        symbols: Some(symbols),
        ..Default::default()
    };
    Task::from_name("reverse", &options).unwrap()
}

/// The source as the generator reads it.
fn source_tokens(batch: &Batch) -> TokenBatch {
    let s = batch.source.as_ref().unwrap();
    TokenBatch::new(s.ids.clone(), Some(s.mask.clone()), batch.batch, s.len).unwrap()
}

/// `reverse` (6 symbols of 8, separator 8) as source → target: the source is the
/// prompt, the decoder starts from the separator and must emit the prompt reversed.
/// Two 1 + 1 layer, C = 32 models — the `vaswani` preset (post-norm LayerNorm,
/// sinusoidal positions, ReLU, shared √C-scaled embeddings tied to the head) and a
/// pre-norm one with learned positions, GELU and separate untied tables — train 300
/// AdamW steps (lr 3e-3, batches of 32). The scored loss starts at ≈ ln 9 ≈ 2.2 and
/// must fall below 0.1, with ≥ 98% held-out token accuracy and greedy decoding (KV
/// cache, from the separator) reproducing ≥ 56 of 64 held-out rows.
#[test]
fn learns_reverse_and_generates_it() {
    let task = reverse_task(6, 8);
    let sep = task.separator().unwrap();
    let v = task.vocab_size();
    let mut vaswani = Arch::vaswani(v, 32, 1, 4, 8);
    let mut pre = vaswani.clone();
    pre.residual = qkv::block::Residual::PreNorm;
    pre.position = Position::Learned { max_len: 8 };
    pre.ffn.activation = qkv::ops::Activation::Gelu;
    pre.src_vocab = Some(v);
    pre.embed.scale = false;
    pre.head = qkv::models::Head::Lm {
        tied: false,
        rescale: false,
        logits_bias: false,
    };
    for s in [&mut vaswani, &mut pre] {
        s.encoder.as_mut().unwrap().ffn_dim = 64;
        s.decoder.as_mut().unwrap().ffn_dim = 64;
    }
    for (label, arch) in [("vaswani", vaswani), ("prenorm_learned_gelu", pre)] {
        let mut m = Transformer::new(&arch, 1).unwrap();
        let mut opt = AdamW::new(AdamWConfig {
            weight_decay: 0.0,
            ..Default::default()
        });
        let mut rng = Rng::new(2);
        let mut losses = Vec::new();
        for _ in 0..300 {
            let batch = source_target_batch(&task.batch(32, &mut rng), sep).unwrap();
            m.zero_grads();
            losses.push(m.loss_and_backward(&batch).unwrap());
            opt.step(3e-3, &mut m).unwrap();
        }
        let first: f32 = losses[..10].iter().sum::<f32>() / 10.0;
        let last: f32 = losses[losses.len() - 10..].iter().sum::<f32>() / 10.0;
        assert!(first > 1.8, "{label}: initial loss {first}");
        assert!(last < 0.1, "{label}: final loss {last} (from {first})");

        // held-out rows: teacher-forced token accuracy, then greedy decoding
        let held = source_target_batch(&task.batch(64, &mut Rng::new(99)), sep).unwrap();
        let logits = m.logits(&held).unwrap();
        let predictions: Vec<usize> = logits
            .data()
            .chunks_exact(v)
            .map(|row| (0..v).fold(0, |b, i| if row[i] > row[b] { i } else { b }))
            .collect();
        let acc = accuracy(&predictions, &held.targets).unwrap().fraction();
        m.special.decoder_start = Some(sep);
        let opts = GenerateOptions::new(held.len, Sampling::Greedy, Vec::new());
        let out = generate_seq2seq(&m, &source_tokens(&held), &opts).unwrap();
        let exact = out
            .iter()
            .zip(held.targets.chunks_exact(held.len))
            .filter(|(o, t)| o.iter().zip(t.iter()).all(|(&a, &b)| a as i64 == b))
            .count();
        eprintln!(
            "{label}: loss {first:.3} → {last:.4}, held-out token accuracy {acc:.3}, greedy exact rows {exact}/64"
        );
        assert!(acc >= 0.98, "{label}: token accuracy {acc}");
        assert!(
            exact >= 56,
            "{label}: greedy decoding got {exact} of 64 rows right"
        );
    }
}

/// Decoding one token at a time through the KV cache gives the full forward's logits,
/// with a padded source (ALiBi + post-norm, an architecture no Hugging Face class has).
#[test]
fn cached_decoding_equals_the_full_forward() {
    let mut arch = Arch::vaswani(13, 16, 2, 4, 8);
    arch.position = Position::Alibi;
    let m = Transformer::new(&arch, 5).unwrap();
    let mut rng = Rng::new(6);
    let (b, s, t) = (2, 5, 6);
    let mut mask = vec![true; b * s];
    mask[b * s - 2..].fill(false);
    let src = TokenBatch::new(
        (0..b * s).map(|_| rng.below(13)).collect(),
        Some(mask),
        b,
        s,
    )
    .unwrap();
    let tgt = TokenBatch::new((0..b * t).map(|_| rng.below(13)).collect(), None, b, t).unwrap();
    let full = m
        .forward(
            &Input {
                source: Some(&src),
                target: Some(&tgt),
                token_types: None,
            },
            false,
        )
        .unwrap()
        .logits;
    let enc = m.encode(&src).unwrap();
    let mut cache = m.new_cache(b);
    for i in 0..t {
        let step =
            TokenBatch::new((0..b).map(|r| tgt.ids[r * t + i]).collect(), None, b, 1).unwrap();
        let got = m.decode_cached(&step, &enc, &mut cache).unwrap();
        for r in 0..b {
            let want = &full.data()[(r * t + i) * 13..(r * t + i + 1) * 13];
            let have = &got.data()[r * 13..(r + 1) * 13];
            for (x, y) in have.iter().zip(want) {
                assert!((x - y).abs() < 1e-5, "step {i} row {r}: {x} vs {y}");
            }
        }
    }
}

#[test]
fn source_target_batch_splits_task_rows() {
    let task = reverse_task(3, 10);
    let flat = task.batch(4, &mut Rng::new(5));
    let b = source_target_batch(&flat, 10).unwrap();
    let src = b.source.as_ref().unwrap();
    assert_eq!((b.batch, b.len, src.len), (4, 3, 3));
    assert!(src.mask.iter().all(|&m| m));
    for r in 0..4 {
        let s = &src.ids[r * 3..r * 3 + 3];
        let inputs = &b.inputs[r * 3..r * 3 + 3];
        let targets = &b.targets[r * 3..r * 3 + 3];
        let reversed: Vec<i64> = s.iter().rev().map(|&x| x as i64).collect();
        assert_eq!(targets, reversed.as_slice());
        assert_eq!(inputs[0], 10);
        assert_eq!(
            &inputs[1..],
            &s.iter().rev().copied().collect::<Vec<_>>()[..2]
        );
    }
    // no separator, or a scored target in the source part: errors
    assert!(source_target_batch(&flat, 11).is_err());
    let mut scored = flat.clone();
    scored.targets[0] = 1;
    assert!(source_target_batch(&scored, 10).is_err());
}

#[test]
fn bad_batches_are_clear_errors() {
    let mut m = Transformer::new(&Arch::vaswani(11, 8, 1, 2, 4), 0).unwrap();
    let batch = |src: Vec<usize>, s: usize, inputs: Vec<usize>, t: usize| Batch {
        targets: vec![1; inputs.len()],
        inputs,
        batch: 1,
        len: t,
        mask: None,
        source: Some(Source {
            mask: vec![true; src.len()],
            ids: src,
            len: s,
        }),
    };
    let err = |m: &mut Transformer, b: Batch| m.loss_and_backward(&b).unwrap_err().to_string();
    m.loss_and_backward(&batch(vec![1; 3], 3, vec![2; 4], 4))
        .unwrap();
    let e = err(&mut m, batch(vec![1; 2], 3, vec![2; 4], 4));
    assert!(e.contains("input_ids"), "{e}");
    let e = err(&mut m, batch(vec![1; 3], 3, vec![2; 3], 4));
    assert!(e.contains("input_ids"), "{e}");
    let e = err(&mut m, batch(vec![1; 5], 5, vec![2; 4], 4));
    assert!(e.contains("sequence longer"), "{e}");
    let e = err(&mut m, batch(vec![11; 3], 3, vec![2; 4], 4));
    assert!(e.contains("11"), "{e}");
    let e = err(&mut m, batch(vec![], 0, vec![2; 4], 4));
    assert!(e.contains("empty"), "{e}");
}
