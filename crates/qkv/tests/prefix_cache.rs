//! The prefix cache (`qkv::engine::PrefixCache`): positions restored from it give the
//! logits that computing them gives (a chat's second turn over its first turn's tokens,
//! a sliding window, a bf16 cache), the budget holds with the least recently used
//! leaves evicted first, and a RoPE scaling that depends on a call's length shares
//! nothing past its trained length.

#![cfg(feature = "models")]

mod common;

use common::models::{load_causal, ATOL, RTOL};
use qkv::attention::{KvCache, KvDType};
use qkv::engine::{reusable_positions, PrefixCache};
use qkv::models::{TokenBatch, Transformer};

const BLOCK: usize = PrefixCache::BLOCK;

fn ids(seed: usize, len: usize, vocab: usize) -> Vec<usize> {
    (0..len)
        .map(|i| (5 + 7 * seed + 11 * i * (seed + 2)) % vocab)
        .collect()
}

/// The logits of every position of `tokens` after `cache`'s.
fn run(m: &Transformer, cache: &mut KvCache, tokens: &[usize]) -> Vec<f32> {
    let batch = TokenBatch::single(tokens.to_vec()).unwrap();
    m.forward_cached(&batch, cache).unwrap().data().to_vec()
}

fn close(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= ATOL + RTOL * w.abs(),
            "{what}: {i}: {g} vs {w}"
        );
    }
}

/// A first turn (prompt and answer) is kept; the second turn's prompt (the first turn's
/// tokens and 9 more) restores its whole blocks and computes the rest, with the logits
/// of one call over the whole second prompt.
fn second_turn(name: &str, kv: KvDType) {
    let mut m = load_causal(name);
    m.kv_dtype = kv;
    let vocab = m.arch.vocab;
    let first = ids(1, 37, vocab);
    let mut cache = m.new_cache(1);
    run(&m, &mut cache, &first);
    let mut prefix = PrefixCache::new(1 << 30);
    let usable = reusable_positions(&m, first.len(), cache.len());
    prefix.insert(&first, usable, &cache).unwrap();
    assert_eq!(prefix.stats().blocks, 2, "{name}");

    let second: Vec<usize> = first.iter().copied().chain(ids(2, 9, vocab)).collect();
    let mut restored = m.new_cache(1);
    let usable = reusable_positions(&m, second.len(), second.len() - 1);
    let n = prefix.restore(&second, usable, &mut restored).unwrap();
    assert_eq!(n, 2 * BLOCK, "{name}");
    assert_eq!(restored.len(), n);
    let got = run(&m, &mut restored, &second[n..]);
    let want = run(&m, &mut m.new_cache(1), &second);
    close(&format!("{name} {kv}"), &got, &want[n * vocab..]);
    let s = prefix.stats();
    assert_eq!((s.looked_up, s.hit), (second.len() as u64, n as u64));
}

#[test]
fn a_second_turn_restored_from_the_first_equals_computing_it() {
    second_turn("llama_gqa", KvDType::F32);
    second_turn("gpt2", KvDType::F32);
    // Gemma 2's local layers see a window of 4 keys
    second_turn("gemma2", KvDType::F32);
    second_turn("llama_gqa", KvDType::Bf16);
}

#[test]
fn the_budget_holds_and_least_recently_used_leaves_go_first() {
    let m = load_causal("llama_gqa");
    let vocab = m.arch.vocab;
    let cached = |tokens: &[usize]| {
        let mut c = m.new_cache(1);
        run(&m, &mut c, tokens);
        c
    };
    let a = ids(3, 3 * BLOCK, vocab);
    let b = ids(4, 2 * BLOCK, vocab);
    let one = {
        let mut p = PrefixCache::new(usize::MAX);
        p.insert(&a[..BLOCK], BLOCK, &cached(&a[..BLOCK])).unwrap();
        p.stats().bytes
    };
    // room for four blocks: a's three, then b's two evict a's last block alone (its
    // leaf), not the blocks before it
    let mut p = PrefixCache::new(4 * one);
    p.insert(&a, a.len(), &cached(&a)).unwrap();
    p.insert(&b, b.len(), &cached(&b)).unwrap();
    let s = p.stats();
    assert_eq!((s.blocks, s.evicted, s.bytes), (4, 1, 4 * one));
    let mut c = m.new_cache(1);
    assert_eq!(p.restore(&a, a.len(), &mut c).unwrap(), 2 * BLOCK);
    // a is now the most recent: the next room comes from b's leaf
    let d = ids(5, BLOCK, vocab);
    p.insert(&d, d.len(), &cached(&d)).unwrap();
    let mut c = m.new_cache(1);
    assert_eq!(p.restore(&b, b.len(), &mut c).unwrap(), BLOCK);
    assert!(p.stats().bytes <= 4 * one);
    // a budget below one block keeps nothing
    let mut none = PrefixCache::new(one - 1);
    none.insert(&a, a.len(), &cached(&a)).unwrap();
    assert_eq!(none.stats().blocks, 0);
}

/// Phi-3's LongRoPE (trained length 16) switches frequencies past 16 positions: a
/// prompt beyond it shares nothing, one within it restores what lies below 16.
#[test]
fn length_dependent_rope_shares_only_below_its_trained_length() {
    let m = load_causal("phi3");
    let vocab = m.arch.vocab;
    assert_eq!(reusable_positions(&m, 17, 16), 0);
    assert_eq!(reusable_positions(&m, 16, 15), 15);
    assert_eq!(reusable_positions(&m, 10, 40), 16);
    let first = ids(6, 14, vocab);
    let answer = ids(7, 7, vocab);
    let mut cache = m.new_cache(1);
    run(&m, &mut cache, &first);
    // the answer decoded one token a call, up to position 20: positions 14 and 15 were
    // computed by calls within the trained length, 16 on by longer ones
    for &t in &answer {
        run(&m, &mut cache, &[t]);
    }
    let seq: Vec<usize> = first.iter().chain(&answer).copied().collect();
    let mut p = PrefixCache::new(1 << 30);
    let usable = reusable_positions(&m, first.len(), cache.len());
    assert_eq!(usable, 16);
    p.insert(&seq, usable, &cache).unwrap();
    assert_eq!(p.stats().blocks, 1);
    // a next prompt of 17 tokens is computed with the long factors: nothing restored
    let next = &seq[..17];
    let mut c = m.new_cache(1);
    let n = p.restore(
        next,
        reusable_positions(&m, next.len(), next.len() - 1),
        &mut c,
    );
    assert_eq!(n.unwrap(), 0);
}
