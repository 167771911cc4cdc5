//! Continuous batching's step (`Transformer::step_rows`): sequences of different
//! lengths, each with its own one-row cache, joining and leaving between steps, give
//! the logits each would get decoded alone (`forward_cached` on its own cache), on the
//! fixture families of every position kind: learned (GPT-2), RoPE with GQA (Llama),
//! a sliding window (Mistral, Qwen2) and ALiBi (BLOOM). Packed steps
//! (`Transformer::step_packed`) mix joining prompts' chunks into the decoding rows and
//! give what one call of each whole prompt gives, RoPE scalings that depend on a
//! call's length (LongRoPE, dynamic) included.

#![cfg(feature = "models")]

mod common;

use common::models::{load_causal, ATOL, RTOL};
use qkv::attention::KvCache;
use qkv::models::generate::{generate_causal, Chooser, GenerateOptions, Sampling};
use qkv::models::{Chunk, TokenBatch, Transformer};
use qkv::{Error, Tensor};

/// Sequence s's prompt: `len` ids from a pattern of its own.
fn prompt(s: usize, len: usize, vocab: usize) -> Vec<usize> {
    (0..len)
        .map(|i| (7 + 13 * s + 5 * i * (s + 1)) % vocab)
        .collect()
}

/// The token sequence s is fed at step n (teacher forcing: any fixed ids do).
fn token(s: usize, n: usize, vocab: usize) -> usize {
    (3 + 11 * n + 17 * s) % vocab
}

fn prefill(m: &Transformer, ids: &[usize]) -> KvCache {
    let mut cache = m.new_cache(1);
    m.prefill(&TokenBatch::single(ids.to_vec()).unwrap(), &mut cache)
        .unwrap();
    cache
}

fn close(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= ATOL + RTOL * w.abs(),
            "{what}: logit {i} is {g}, alone {w}"
        );
    }
}

/// Three sequences with prompts of 5, 2 and 9 tokens; the third joins at step 2 and
/// the first leaves after step 3. Every step's logits equal each sequence's own.
fn check(name: &str) {
    let m = load_causal(name);
    let vocab = m.arch.vocab;
    let prompts: Vec<Vec<usize>> = [5, 2, 9]
        .iter()
        .enumerate()
        .map(|(s, &len)| prompt(s, len, vocab))
        .collect();
    let mut alone: Vec<KvCache> = prompts.iter().map(|p| prefill(&m, p)).collect();
    let mut shared: Vec<Option<KvCache>> = vec![None; 3];
    for n in 0..6 {
        let live: Vec<usize> = (0..3)
            .filter(|&s| (s != 2 || n >= 2) && (s != 0 || n <= 3))
            .collect();
        for &s in &live {
            if shared[s].is_none() {
                shared[s] = Some(prefill(&m, &prompts[s]));
            }
        }
        if n == 4 {
            shared[0] = None;
        }
        let tokens: Vec<usize> = live.iter().map(|&s| token(s, n, vocab)).collect();
        let mut caches: Vec<&mut KvCache> = shared.iter_mut().flatten().collect();
        let logits = m.step_rows(&tokens, &mut caches).unwrap();
        assert_eq!(logits.shape(), [live.len(), 1, vocab]);
        for (row, &s) in live.iter().enumerate() {
            let one = TokenBatch::single(vec![token(s, n, vocab)]).unwrap();
            let want: Tensor = m.forward_cached(&one, &mut alone[s]).unwrap();
            let got = &logits.data()[row * vocab..][..vocab];
            close(
                &format!("{name}: sequence {s} at step {n}"),
                got,
                want.data(),
            );
        }
    }
}

#[test]
fn gpt2_sequences_stepped_together_equal_each_alone() {
    check("gpt2");
}

#[test]
fn llama_gqa_sequences_stepped_together_equal_each_alone() {
    check("llama_gqa");
}

#[test]
fn sliding_window_sequences_stepped_together_equal_each_alone() {
    check("mistral");
    check("qwen2_window");
    check("qwen3");
}

#[test]
fn gpt_neox_sequences_stepped_together_equal_each_alone() {
    check("gpt_neox");
    check("gemma2");
    check("gemma3");
    check("phi3");
}

#[test]
fn bloom_alibi_sequences_stepped_together_equal_each_alone() {
    check("bloom");
}

#[test]
fn a_rejected_step_names_its_cause_and_changes_no_cache() {
    let m = load_causal("gpt2");
    let (vocab, max) = (m.arch.vocab, m.arch.max_positions().unwrap());
    let mut a = prefill(&m, &prompt(0, 3, vocab));
    let mut full = prefill(&m, &prompt(1, max, vocab));
    let mut two = m.new_cache(2);
    let err = m.step_rows(&[1], &mut [&mut a, &mut full]).unwrap_err();
    assert!(err.to_string().contains("1 tokens for 2 caches"), "{err}");
    let err = m.step_rows(&[1, 2], &mut [&mut a, &mut full]).unwrap_err();
    assert!(matches!(err, Error::OutOfRange { .. }), "{err}");
    let mut b = prefill(&m, &prompt(2, 2, vocab));
    let err = m.step_rows(&[1, vocab], &mut [&mut a, &mut b]).unwrap_err();
    assert!(err.to_string().contains(&vocab.to_string()), "{err}");
    let err = m.step_rows(&[1], &mut [&mut two]).unwrap_err();
    assert!(err.to_string().contains("holds 2 rows"), "{err}");
    assert_eq!((a.len(), b.len(), full.len()), (3, 2, max));
    // and the caches go on as if the bad steps never happened
    let got = m.step_rows(&[4], &mut [&mut a]).unwrap();
    let mut alone = prefill(&m, &prompt(0, 3, vocab));
    let want = m
        .forward_cached(&TokenBatch::single(vec![4]).unwrap(), &mut alone)
        .unwrap();
    close("after the rejected steps", got.data(), want.data());
}

/// A server's loop: sequences with their own settings and seeds prefilled one by one,
/// then stepped together, each choosing with its own [`Chooser`] and leaving when it
/// ends, produce what `generate` produces for each alone.
#[test]
fn sequences_decoded_side_by_side_equal_generate_alone() {
    let m = load_causal("llama_gqa");
    let vocab = m.arch.vocab;
    let sample = |seed| Sampling::Sample {
        temperature: 0.9,
        top_k: Some(20),
        top_p: Some(0.95),
        min_p: Some(0.02),
        seed,
    };
    let runs = [
        (prompt(0, 4, vocab), Sampling::Greedy, 12),
        (prompt(1, 7, vocab), sample(5), 9),
        (prompt(2, 1, vocab), sample(6), 15),
    ];
    let eos = m.special_tokens().eos.clone();
    let want: Vec<Vec<usize>> = runs
        .iter()
        .map(|(p, s, n)| {
            let opts = GenerateOptions::new(*n, *s, eos.clone());
            let batch = TokenBatch::single(p.clone()).unwrap();
            generate_causal(&m, &batch, &opts).unwrap().remove(0)
        })
        .collect();
    let mut live: Vec<(usize, Chooser, KvCache, usize)> = Vec::new();
    let mut got = vec![Vec::new(); runs.len()];
    for (i, (p, s, n)) in runs.iter().enumerate() {
        let mut chooser =
            Chooser::new(GenerateOptions::new(*n, *s, eos.clone()), p.clone()).unwrap();
        let mut cache = m.new_cache(1);
        let first = m
            .prefill(&TokenBatch::single(p.clone()).unwrap(), &mut cache)
            .unwrap();
        let tok = chooser.choose(first.data()).unwrap();
        live.push((i, chooser, cache, tok));
    }
    while !live.is_empty() {
        live.retain(|(i, c, _, _)| match c.finished() {
            Some(_) => {
                got[*i] = c.tokens().to_vec();
                false
            }
            None => true,
        });
        if live.is_empty() {
            break;
        }
        let tokens: Vec<usize> = live.iter().map(|l| l.3).collect();
        let mut caches: Vec<&mut KvCache> = live.iter_mut().map(|l| &mut l.2).collect();
        let logits = m.step_rows(&tokens, &mut caches).unwrap();
        for (row, l) in logits.data().chunks_exact(vocab).zip(live.iter_mut()) {
            l.3 = l.1.choose(row).unwrap();
        }
    }
    assert_eq!(got, want);
    assert!(want.iter().any(|w| w.len() > 5), "{want:?}");
}

/// Two sequences decode while a third's prompt of 11 tokens joins in chunks of 4 (the
/// middle one scored, every position's logits) packed into the same steps: the
/// decoding rows equal each sequence alone, and the prompt's logits equal one call of
/// the whole prompt.
fn check_packed(name: &str) {
    let m = load_causal(name);
    let vocab = m.arch.vocab;
    let joining = prompt(2, 11, vocab);
    let prefilled = || -> Vec<KvCache> {
        [4, 7]
            .iter()
            .enumerate()
            .map(|(s, &n)| prefill(&m, &prompt(s, n, vocab)))
            .collect()
    };
    let (mut alone, mut shared) = (prefilled(), prefilled());
    let mut whole = m.new_cache(1);
    let want_prompt = m
        .forward_cached(&TokenBatch::single(joining.clone()).unwrap(), &mut whole)
        .unwrap();
    let mut join = m.new_cache(1);
    for (n, part) in joining.chunks(4).enumerate() {
        let tokens: Vec<Vec<usize>> = (0..2).map(|s| vec![token(s, n, vocab)]).collect();
        let scored = n == 1;
        let chunks = [
            Chunk {
                tokens: &tokens[0],
                all_logits: false,
                prompt_len: None,
            },
            Chunk {
                tokens: part,
                all_logits: scored,
                prompt_len: Some(joining.len()),
            },
            Chunk {
                tokens: &tokens[1],
                all_logits: false,
                prompt_len: None,
            },
        ];
        let [a, b] = &mut shared[..] else {
            unreachable!()
        };
        let logits = m.step_packed(&chunks, &mut [a, &mut join, b]).unwrap();
        let rows = if scored { part.len() } else { 1 };
        assert_eq!(logits.shape(), [rows + 2, vocab], "{name}");
        for (s, row) in [(0, 0), (1, rows + 1)] {
            let one = TokenBatch::single(tokens[s].clone()).unwrap();
            let want = m.forward_cached(&one, &mut alone[s]).unwrap();
            close(
                &format!("{name}: sequence {s} at step {n}"),
                &logits.data()[row * vocab..][..vocab],
                want.data(),
            );
        }
        let end = 4 * n + part.len();
        for (r, p) in (end - rows..end).enumerate() {
            close(
                &format!("{name}: prompt position {p}"),
                &logits.data()[(1 + r) * vocab..][..vocab],
                &want_prompt.data()[p * vocab..][..vocab],
            );
        }
    }
    assert_eq!(join.len(), joining.len());
}

#[test]
fn prompt_chunks_packed_into_decoding_steps_equal_one_call() {
    for name in ["gpt2", "llama_gqa", "mistral", "gemma2", "bloom"] {
        check_packed(name);
    }
}

/// LongRoPE (Phi-3, trained length 16) and dynamic NTK (trained length 10) pick their
/// frequencies by a call's length: a prompt longer than that, packed in chunks, takes
/// the whole prompt's frequencies, as transformers' one call of it does.
#[test]
fn length_dependent_rope_chunks_take_the_whole_prompts_frequencies() {
    check_packed("llama_dynamic");
    let m = load_causal("phi3");
    let vocab = m.arch.vocab;
    let joining = prompt(3, 21, vocab);
    let mut whole = m.new_cache(1);
    let want = m
        .forward_cached(&TokenBatch::single(joining.clone()).unwrap(), &mut whole)
        .unwrap();
    let mut cache = m.new_cache(1);
    for (n, part) in joining.chunks(6).enumerate() {
        let chunk = Chunk {
            tokens: part,
            all_logits: true,
            prompt_len: Some(joining.len()),
        };
        let got = m.step_packed(&[chunk], &mut [&mut cache]).unwrap();
        close(
            &format!("phi3: chunk {n}"),
            got.data(),
            &want.data()[6 * n * vocab..][..part.len() * vocab],
        );
    }
}

#[test]
fn a_rejected_packed_step_names_its_cause() {
    let m = load_causal("gpt2");
    let (vocab, max) = (m.arch.vocab, m.arch.max_positions().unwrap());
    let mut a = prefill(&m, &prompt(0, max - 2, vocab));
    let three = [1, 2, 3];
    let chunk = |tokens| Chunk {
        tokens,
        all_logits: false,
        prompt_len: None,
    };
    let err = m.step_packed(&[chunk(&three)], &mut [&mut a]).unwrap_err();
    assert!(matches!(err, Error::OutOfRange { .. }), "{err}");
    let err = m.step_packed(&[chunk(&[])], &mut [&mut a]).unwrap_err();
    assert!(err.to_string().contains("chunk 0 has no tokens"), "{err}");
    assert_eq!(a.len(), max - 2);
    m.step_packed(&[chunk(&three[..2])], &mut [&mut a]).unwrap();
    assert_eq!(a.len(), max);
}
