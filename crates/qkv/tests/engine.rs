//! The engine's generator (`qkv::engine::generator`) as a caller outside a server uses
//! it: jobs of different lengths and settings, joining in chunks of 3 prompt tokens
//! packed into the others' decoding steps, some restoring a shared prefix from the
//! prefix cache, each produce what `generate_causal` produces for it alone.

#![cfg(feature = "models")]

mod common;

use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use common::models::load_causal;
use qkv::engine::generator::{run_jobs, Limits};
use qkv::engine::{ChannelEvents, Event, Events, Job, Observer, PrefixStats};
use qkv::models::generate::{generate_causal, GenerateOptions, Sampling};
use qkv::models::TokenBatch;

/// Keeps the prefix cache's latest statistics.
#[derive(Default)]
struct Prefix(Mutex<PrefixStats>);

impl Observer for Prefix {
    fn prefix(&self, stats: PrefixStats) {
        *self.0.lock().unwrap() = stats;
    }
}

#[test]
fn jobs_run_by_the_engine_equal_each_generated_alone() {
    let m = load_causal("llama_gqa");
    let vocab = m.arch.vocab;
    let eos = m.special_tokens().eos.clone();
    // a 35-token prefix shared by three prompts (two whole blocks of the cache), and
    // one prompt of its own
    let shared: Vec<usize> = (0..35).map(|i| (3 + 7 * i) % vocab).collect();
    let prompts: Vec<Vec<usize>> = vec![
        shared.iter().copied().chain([1, 2]).collect(),
        shared.iter().copied().chain([4]).collect(),
        vec![9, 8, 7, 6, 5],
        shared.iter().copied().chain([5, 6, 7]).collect(),
    ];
    let sampling = |i: u64| match i % 2 {
        0 => Sampling::Greedy,
        _ => Sampling::Sample {
            temperature: 0.8,
            top_k: Some(10),
            top_p: None,
            min_p: None,
            seed: 40 + i,
        },
    };
    let options = |i: usize| GenerateOptions::new(6 + 2 * i, sampling(i as u64), eos.clone());
    let (tx, rx) = mpsc::channel();
    let events: Arc<dyn Events> = Arc::new(ChannelEvents::new(tx));
    let jobs = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| Job::new(p.clone(), options(i), i, events.clone()))
        .collect();
    // two at a time: the later ones join while the first ones decode
    let limits = Limits {
        max_batch: 2,
        max_queue: 4,
        prefill_chunk: 3,
        cache_bytes: 1 << 26,
    };
    let seen = Prefix::default();
    run_jobs(&m, None, limits, jobs, &seen);
    // the first two join together and find nothing; the fourth restores the shared
    // prefix's two whole blocks
    let stats = *seen.0.lock().unwrap();
    assert_eq!((stats.looked_up, stats.hit), (116, 32), "{stats:?}");
    let mut got = vec![None; prompts.len()];
    for e in rx.try_iter() {
        match e {
            Event::Done { index, tokens, .. } => got[index] = Some(tokens),
            Event::Failed(why) => panic!("{why}"),
            Event::Prompt { .. } | Event::Piece { .. } => {}
        }
    }
    for (i, p) in prompts.iter().enumerate() {
        let batch = TokenBatch::single(p.clone()).unwrap();
        let want = generate_causal(&m, &batch, &options(i)).unwrap().remove(0);
        assert_eq!(got[i].as_ref(), Some(&want), "job {i}");
    }
}
