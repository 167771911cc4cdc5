//! The bytes this thread holds at its peak while a closure runs: the test binary's
//! allocator counts each thread's allocations apart, so tests running beside it do not
//! blur the count.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

pub struct Counting;

thread_local! {
    /// (bytes held now, the most held since the count started), counted while `ON`
    static HELD: Cell<(isize, isize)> = const { Cell::new((0, 0)) };
    static ON: Cell<bool> = const { Cell::new(false) };
}

fn count(delta: isize) {
    // `try_with`: a thread's locals may be gone while it exits
    if ON.try_with(Cell::get).unwrap_or(false) {
        let _ = HELD.try_with(|h| {
            let (now, most) = h.get();
            h.set((now + delta, most.max(now + delta)));
        });
    }
}

// SAFETY: every call goes to the system allocator unchanged; only thread-local counters
// are added, which never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size() as isize);
        System.alloc(layout)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(-(layout.size() as isize));
        System.dealloc(ptr, layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size as isize - layout.size() as isize);
        System.realloc(ptr, layout, new_size)
    }
}

/// `f`'s result and the most bytes this thread held above its start while it ran.
pub fn peak<T>(f: impl FnOnce() -> T) -> (T, usize) {
    HELD.with(|h| h.set((0, 0)));
    ON.with(|o| o.set(true));
    let out = f();
    ON.with(|o| o.set(false));
    (out, HELD.with(|h| h.get().1.max(0) as usize))
}
