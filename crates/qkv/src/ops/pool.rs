//! Where a model's work runs: on a worker of rayon's pool, with the other workers kept
//! awake for the duration as its thread team.

use std::cell::Cell;
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};

use rayon::prelude::*;

use super::disjoint::Disjoint;
use super::team::{Team, MAX_TASKS};
use crate::error::{Error, Result};

thread_local! {
    /// The team this thread owns while it runs an [`on_pool`] closure; null elsewhere,
    /// and while the thread runs one of its team's jobs (a nested job goes to rayon).
    static OWNED: Cell<*const Team> = const { Cell::new(ptr::null()) };
}

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
/// returns. The polling workers and this one form a thread team (`ops/team.rs`) that runs
/// [`for_each_task`]'s jobs without rayon's deques.
pub fn on_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if rayon::current_thread_index().is_some() {
        return f();
    }
    let done = AtomicBool::new(false);
    let team = Team::new();
    rayon::scope(|s| {
        for _ in 1..rayon::current_num_threads() {
            s.spawn(|_| keep_busy(&done, &team));
        }
        // set even if `f` panics, or the scope would wait for the pollers forever
        let _stop = Stop(&done);
        let _owner = Owner::install(&team);
        f()
    })
}

/// Runs `task(0..tasks)` in parallel: on the calling thread's team when it owns one
/// (inside [`on_pool`]), through rayon otherwise. Returns when all have run; a task's
/// panic comes out here.
pub fn for_each_task(tasks: usize, task: impl Fn(usize) + Sync) {
    if tasks <= 1 {
        (0..tasks).for_each(task);
        return;
    }
    let team = OWNED.with(|owned| owned.get());
    if team.is_null() || tasks > MAX_TASKS {
        (0..tasks).into_par_iter().for_each(&task);
        return;
    }
    // a job's tasks that start jobs of their own hand those to rayon
    let _owner = Owner::install(ptr::null());
    // SAFETY: `OWNED` holds a team only while the `on_pool` call that made it runs `f`
    // on this thread, so the team outlives this call.
    unsafe { &*team }.run(tasks, &task);
}

/// Runs `f` on each `chunk`-long piece of `data` (the last one shorter when `chunk`
/// does not divide its length), the pieces as [`for_each_task`]'s tasks.
pub(crate) fn for_each_chunk_mut(data: &mut [f32], chunk: usize, f: impl Fn(&mut [f32]) + Sync) {
    let n = data.len();
    let out = Disjoint::new(data);
    for_each_task(n.div_ceil(chunk), |t| {
        let start = t * chunk;
        // SAFETY: task t alone owns data[start..start + chunk].
        f(unsafe { out.range(start, chunk.min(n - start)) })
    });
}

/// Sets this thread's [`OWNED`] team and puts the previous one back when dropped.
struct Owner(*const Team);

impl Owner {
    fn install(team: *const Team) -> Self {
        Self(OWNED.with(|owned| owned.replace(team)))
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        OWNED.with(|owned| owned.set(self.0));
    }
}

/// Sets its flag when dropped, on return or unwinding alike.
struct Stop<'a>(&'a AtomicBool);

impl Drop for Stop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// Runs the team's tasks and the pool's pending jobs as they come, until `done`.
fn keep_busy(done: &AtomicBool, team: &Team) {
    while !done.load(Ordering::Acquire) {
        team.help();
        if rayon::yield_now() != Some(rayon::Yield::Executed) {
            std::hint::spin_loop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::panic::AssertUnwindSafe;
    use std::sync::atomic::AtomicUsize;

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

    /// Each task's count after `jobs` jobs of 0..tasks.
    fn counts(jobs: usize, tasks: usize) -> Vec<usize> {
        let counts: Vec<AtomicUsize> = (0..tasks).map(|_| AtomicUsize::new(0)).collect();
        for _ in 0..jobs {
            for_each_task(tasks, |t| {
                counts[t].fetch_add(1, Ordering::Relaxed);
            });
        }
        counts.into_iter().map(AtomicUsize::into_inner).collect()
    }

    #[test]
    fn every_task_runs_once_a_job_on_the_team_and_through_rayon() {
        assert_eq!(on_pool(|| counts(2000, 7)), vec![2000; 7]);
        assert_eq!(counts(50, 7), vec![50; 7]);
        assert_eq!(on_pool(|| counts(3, MAX_TASKS + 1)), vec![3; MAX_TASKS + 1]);
        assert_eq!(on_pool(|| counts(3, 1)), vec![3]);
        assert!(on_pool(|| counts(3, 0)).is_empty());
    }

    #[test]
    fn chunks_cover_the_slice_once_the_last_one_short() {
        let mut data = vec![0.0f32; 103];
        on_pool(|| {
            for_each_chunk_mut(&mut data, 10, |c| {
                let len = c.len() as f32;
                c.iter_mut().for_each(|v| *v += len);
            })
        });
        assert!(data[..100].iter().all(|&v| v == 10.0));
        assert!(data[100..].iter().all(|&v| v == 3.0));
    }

    #[test]
    fn a_job_started_inside_a_task_runs_whole() {
        let inner = on_pool(|| {
            let sums: Vec<AtomicUsize> = (0..5).map(|_| AtomicUsize::new(0)).collect();
            for_each_task(5, |t| {
                for_each_task(4, |u| {
                    sums[t].fetch_add(u + 1, Ordering::Relaxed);
                });
            });
            sums.into_iter()
                .map(AtomicUsize::into_inner)
                .collect::<Vec<_>>()
        });
        assert_eq!(inner, vec![10; 5]);
    }

    #[test]
    fn a_task_panic_comes_out_after_the_job_and_the_team_goes_on() {
        let ran = AtomicUsize::new(0);
        let caught = std::panic::catch_unwind(AssertUnwindSafe(|| {
            on_pool(|| {
                for_each_task(16, |t| {
                    ran.fetch_add(1, Ordering::Relaxed);
                    assert!(t != 3, "task 3");
                })
            })
        }));
        assert!(caught.is_err());
        assert_eq!(ran.load(Ordering::Relaxed), 16);
        assert_eq!(on_pool(|| counts(10, 9)), vec![10; 9]);
    }
}
