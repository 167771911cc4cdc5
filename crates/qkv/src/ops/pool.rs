//! Where a model's work runs: on a worker of rayon's pool, with the other workers kept
//! awake for the duration.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::{Error, Result};

/// Most threads a caller may ask for: far more than any machine's cores, few enough
/// that starting them is quick (100 000 took 19 s and failed in the OS).
pub const MAX_THREADS: usize = 1024;

/// Sizes rayon's global pool to `threads` (`None`: leave it, all cores by default).
/// The pool is made once per process: asking again for the size it has is fine,
/// asking for another size after it started is an error that says so.
pub fn use_threads(threads: Option<usize>) -> Result<()> {
    let Some(n) = threads else {
        return Ok(());
    };
    if n == 0 {
        return Err(Error::request("`threads` must be at least 1"));
    }
    if n > MAX_THREADS {
        return Err(Error::request(format!(
            "`threads` {n}: at most {MAX_THREADS}"
        )));
    }
    let built = rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build_global();
    // a pool that already runs (this call's own, or an earlier one) answers now
    match built.is_ok() || rayon::current_num_threads() == n {
        true => Ok(()),
        false => Err(Error::request(format!(
            "`threads` {n}: this process already runs its {} threads (set them before the first computation)",
            rayon::current_num_threads()
        ))),
    }
}

/// Runs `f` on a worker thread of rayon's global pool, or right here when this thread
/// is one already. A forward pass issues dozens of parallel operations (every matrix
/// product, norm and activation). Called from a thread outside the pool, each of them
/// is handed to the pool and waited for, two thread wake-ups apiece (tens of µs on a
/// small VM, much of a 13-token sentence's time). Called from a worker, the worker
/// starts each operation itself while the others join in.
///
/// While `f` runs, every other worker polls the pool for work (`rayon::yield_now`) instead
/// of going to sleep between two operations: a sleeping worker is woken through the
/// kernel, which cost a fifth of a 13-token sentence's time on two threads. This is
/// what OpenMP runtimes do between parallel regions; the cores spin only until `f`
/// returns.
pub fn on_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if rayon::current_thread_index().is_some() {
        return f();
    }
    let done = AtomicBool::new(false);
    rayon::scope(|s| {
        for _ in 1..rayon::current_num_threads() {
            s.spawn(|_| keep_busy(&done));
        }
        // set even if `f` panics, or the scope would wait for the pollers forever
        let _stop = Stop(&done);
        f()
    })
}

/// Sets its flag when dropped, on return or unwinding alike.
struct Stop<'a>(&'a AtomicBool);

impl Drop for Stop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// Runs the pool's pending jobs as they come, until `done`.
fn keep_busy(done: &AtomicBool) {
    while !done.load(Ordering::Acquire) {
        if rayon::yield_now() != Some(rayon::Yield::Executed) {
            std::hint::spin_loop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;

    #[test]
    fn runs_on_a_worker_and_returns_the_result() {
        let (inside, value) = on_pool(|| (rayon::current_thread_index().is_some(), 41 + 1));
        assert!(inside);
        assert_eq!(value, 42);
        // nested: already on a worker, so the inner call runs on the same thread
        assert!(on_pool(
            || rayon::current_thread_index() == on_pool(rayon::current_thread_index)
        ));
    }

    #[test]
    fn parallel_work_inside_completes_and_a_panic_comes_out() {
        let sum: u64 = on_pool(|| (0..100_000u64).into_par_iter().sum());
        assert_eq!(sum, 100_000 * 99_999 / 2);
        let caught = std::panic::catch_unwind(|| on_pool(|| panic!("inside")));
        assert!(caught.is_err());
        // the pool is usable afterwards
        assert_eq!(on_pool(|| (0..10u32).into_par_iter().sum::<u32>()), 45);
    }
}
