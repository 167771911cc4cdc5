//! The process's allocation counter: the `qkv` binary's global allocator is the system
//! one with a running count of the bytes it holds, which experiments read through
//! [`qkv::experiments::MemoryProbe`] to measure a call's peak extra memory.
//!
//! Counting costs two relaxed atomic operations per allocation, and only once a probe
//! exists ([`probe`]); before that the allocator is the system one with one load more.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering::Relaxed};

use qkv::experiments::MemoryProbe;

static COUNTING: AtomicBool = AtomicBool::new(false);
/// Bytes allocated minus bytes freed since counting began (frees of blocks allocated
/// before it make this run low, which a difference of two readings cancels).
static CURRENT: AtomicIsize = AtomicIsize::new(0);
static PEAK: AtomicIsize = AtomicIsize::new(0);

pub struct Counting;

impl Counting {
    fn grew(by: usize) {
        if COUNTING.load(Relaxed) {
            let now = CURRENT.fetch_add(by as isize, Relaxed) + by as isize;
            PEAK.fetch_max(now, Relaxed);
        }
    }

    fn shrank(by: usize) {
        if COUNTING.load(Relaxed) {
            CURRENT.fetch_sub(by as isize, Relaxed);
        }
    }
}

// SAFETY: every call is forwarded to the system allocator unchanged; the counters
// only observe sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            Counting::grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc_zeroed(layout);
        if !p.is_null() {
            Counting::grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        Counting::shrank(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = System.realloc(ptr, layout, new_size);
        if !p.is_null() {
            Counting::shrank(layout.size());
            Counting::grew(new_size);
        }
        p
    }
}

/// Reads the counters.
struct Probe;

impl MemoryProbe for Probe {
    fn reset_peak(&self) -> usize {
        let now = CURRENT.load(Relaxed);
        PEAK.store(now, Relaxed);
        now.max(0) as usize
    }

    fn peak(&self) -> usize {
        PEAK.load(Relaxed).max(0) as usize
    }
}

/// Starts counting and returns the probe that reads the count.
pub fn probe() -> &'static dyn MemoryProbe {
    COUNTING.store(true, Relaxed);
    &Probe
}
