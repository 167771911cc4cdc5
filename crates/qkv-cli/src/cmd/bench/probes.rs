//! The machine's own limits, which every workload of `qkv bench` is bounded by: how
//! many f32 multiply-adds the cores can issue, and how fast they read memory. A
//! workload's distance from these numbers says how much speed is left to find; the
//! README's measurement table quotes them.
//!
//! Both probes run on every thread of the rayon pool at once (`rayon::broadcast`), so
//! they measure what `--threads` threads get together, as the workloads do. A third
//! measures what a forward pays per parallel operation: handing empty tasks to the
//! other threads and waiting for them.

use qkv::ops::vector::Isa;
use rayon::prelude::*;

/// Independent FMA chains per thread: enough to cover an FMA's latency (4 cycles on
/// Zen 3, Intel's cores alike) times the two it can start a cycle, with room to spare.
const CHAINS: usize = 12;

/// Runs `steps` steps of [`CHAINS`] FMAs of the widest vectors qkv's kernels use on
/// this CPU (16 lanes on AVX-512, 8 on AVX2 + FMA, scalar fused multiply-adds
/// otherwise) on every thread of the pool and returns the floating-point operations
/// done in all (2 per lane per FMA).
pub fn fma_probe(steps: u64) -> f64 {
    let sums: Vec<f32> = rayon::broadcast(|_| fma_chains(steps));
    // The sums are kept (and checked finite) so the loop cannot be optimised away.
    assert!(
        sums.iter().all(|s| s.is_finite()),
        "FMA probe sums: {sums:?}"
    );
    (sums.len() as u64 * steps * CHAINS as u64 * lanes() * 2) as f64
}

/// Lanes per FMA in [`fma_chains`] on this CPU.
fn lanes() -> u64 {
    match Isa::detect() {
        Isa::Avx512 => 16,
        Isa::Avx2 => 8,
        Isa::Portable => 1,
    }
}

/// [`CHAINS`] accumulators, each x ← x·a + b per step: a and b keep x bounded (it
/// tends to b / (1 − a) = 1) so no lane overflows or goes subnormal.
fn fma_chains(steps: u64) -> f32 {
    match Isa::detect() {
        // SAFETY: the CPU has the instruction set `Isa` names.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { x86::fma_chains_avx512(steps) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::fma_chains_avx2(steps) },
        _ => {
            let (a, b) = (0.5f32, 0.5f32);
            let mut acc = [0.0f32; CHAINS];
            for _ in 0..steps {
                for x in acc.iter_mut() {
                    *x = x.mul_add(a, b);
                }
                acc = std::hint::black_box(acc);
            }
            acc.iter().sum()
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::CHAINS;
    use qkv::ops::vector::Vector;
    use std::arch::x86_64::{__m256, __m512};

    /// # Safety
    /// AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn fma_chains_avx2(steps: u64) -> f32 {
        fma_chains::<__m256>(steps)
    }

    /// # Safety
    /// AVX-512 F.
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) unsafe fn fma_chains_avx512(steps: u64) -> f32 {
        fma_chains::<__m512>(steps)
    }

    #[inline(always)]
    unsafe fn fma_chains<V: Vector>(steps: u64) -> f32 {
        let (a, b) = (V::splat(0.5), V::splat(0.5));
        let mut acc = [V::zero(); CHAINS];
        for _ in 0..steps {
            for x in acc.iter_mut() {
                *x = x.mul_add(a, b);
            }
        }
        let mut total = V::zero();
        for x in acc {
            total = total.plus(x);
        }
        total.sum()
    }
}

/// A buffer far larger than the caches, read by all threads of the pool at once.
pub struct MemoryProbe {
    words: Vec<u64>,
}

impl MemoryProbe {
    /// A buffer of `bytes` (rounded down to whole 8-byte words, at least one per
    /// thread), every page written once so that reading it later takes no page fault.
    pub fn new(bytes: usize) -> Self {
        let len = (bytes / 8).max(rayon::current_num_threads());
        let mut words = vec![0u64; len];
        words
            .par_iter_mut()
            .enumerate()
            .for_each(|(i, w)| *w = i as u64);
        MemoryProbe { words }
    }

    /// Bytes one [`Self::read`] reads.
    pub fn bytes(&self) -> usize {
        self.words.len() * 8
    }

    /// Reads every word once, each thread its own contiguous share, and returns their
    /// sum (so the reads cannot be optimised away). Integer adds vectorise, and cost
    /// far less than the memory traffic.
    pub fn read(&self) -> u64 {
        let share = self.words.len().div_ceil(rayon::current_num_threads());
        let sums: Vec<u64> = rayon::broadcast(|ctx| {
            let start = (ctx.index() * share).min(self.words.len());
            let end = (start + share).min(self.words.len());
            self.words[start..end]
                .iter()
                .fold(0u64, |s, &w| s.wrapping_add(w))
        });
        sums.iter().fold(0u64, |s, &x| s.wrapping_add(x))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_probe_reads_every_word_once() {
        let probe = MemoryProbe::new(8 * 1000 + 5);
        assert_eq!(probe.bytes(), 8000);
        // the words are 0..1000
        assert_eq!(probe.read(), 999 * 1000 / 2);
    }

    #[test]
    fn fma_probe_counts_two_operations_per_lane_per_chain_per_step() {
        let flop = fma_probe(10);
        let per_thread = 10.0 * CHAINS as f64 * lanes() as f64 * 2.0;
        assert_eq!(flop, per_thread * rayon::current_num_threads() as f64);
        // the chains converge to 1, whatever the steps
        assert!((fma_chains(1000) - (CHAINS as u64 * lanes()) as f32).abs() < 1e-3);
    }
}

/// How a [`handoffs`] job reaches the other threads.
#[derive(Clone, Copy)]
pub enum Handoff {
    /// `qkv::ops::for_each_task`, on the forward's thread team
    Team,
    /// a rayon parallel iterator, as every parallel operation ran before the team
    Rayon,
    /// none: every task on the calling thread (the time a perfect split divides)
    Alone,
}

/// Runs `jobs` parallel jobs inside `on_pool` (where a forward runs), each waited for
/// before the next, of two tasks a thread, each task a chain of `TASK_ADDS` dependent
/// additions (~1 µs at 3 GHz): a job's time over its share of the work
/// (2 × `TASK_ADDS` additions) is what handing it out and waiting for it cost.
pub fn handoffs(jobs: usize, how: Handoff) {
    let tasks = 2 * rayon::current_num_threads();
    let task = |t: usize| {
        let mut x = t as u64;
        for _ in 0..TASK_ADDS {
            x = std::hint::black_box(x + 1);
        }
        x
    };
    qkv::ops::on_pool(|| {
        for _ in 0..jobs {
            match how {
                Handoff::Team => qkv::ops::for_each_task(tasks, |t| {
                    std::hint::black_box(task(t));
                }),
                Handoff::Rayon => (0..tasks).into_par_iter().for_each(|t| {
                    std::hint::black_box(task(t));
                }),
                Handoff::Alone => (0..tasks).for_each(|t| {
                    std::hint::black_box(task(t));
                }),
            }
        }
    });
}

/// Dependent additions a [`handoffs`] task makes.
pub const TASK_ADDS: usize = 3000;
