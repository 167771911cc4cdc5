//! Where a model's work runs: on a worker of rayon's pool.

/// Runs `f` on a worker thread of rayon's global pool, or right here when this thread
/// is one already. A forward pass issues dozens of parallel operations (every matrix
/// product, norm and activation). Called from a thread outside the pool, each of them
/// is handed to the pool and waited for, two thread wake-ups apiece (tens of µs on a
/// small VM, much of a 13-token sentence's time). Called from a worker, the worker
/// starts each operation itself while the others join in.
pub fn on_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if rayon::current_thread_index().is_some() {
        f()
    } else {
        rayon::scope(|_| f())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
