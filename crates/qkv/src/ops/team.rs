//! A forward's thread team: the pool's workers, kept spinning by [`super::on_pool`] for
//! the whole forward, take the tasks of each parallel operation from one shared word.
//!
//! A rayon fork-join hands a product's tasks out through per-thread deques: the caller
//! pushes them, the others find them by stealing, and the caller waits on a latch —
//! tens of atomic operations and a few cache-line transfers a call, paid 36 times a
//! MiniLM sentence and 65 times a decoding step (~10% of one sentence on two threads).
//! Here the caller (the team's owner, the thread that runs the forward) publishes a
//! job as one 64-bit word, every member claims tasks from it by compare-and-swap, and
//! the owner waits until the job's count of finished tasks reaches its size: one
//! cache line each way, no deque, no latch, no sleeping thread to wake.

use std::any::Any;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

/// The most tasks one job may have: a task index and a count share 16 bits each of
/// the job word.
pub(crate) const MAX_TASKS: usize = 0xFFFF;

/// One parallel operation's tasks, on its owner's stack while they run.
struct Job<'a> {
    task: &'a (dyn Fn(usize) + Sync),
    /// tasks finished (run to the end or panicked)
    done: AtomicUsize,
    /// the first panic of a task, resumed on the owner
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

/// The state the team's members share.
pub(crate) struct Team {
    /// generation (bits 32..64) | next task to claim (16..32) | tasks (0..16). A new
    /// generation a job, so a member that read an older word cannot claim in this one.
    word: AtomicU64,
    /// the current job (a `Job`), valid while its generation has unclaimed or
    /// unfinished tasks
    job: AtomicPtr<()>,
}

impl Team {
    pub(crate) fn new() -> Self {
        Self {
            word: AtomicU64::new(0),
            job: AtomicPtr::new(ptr::null_mut()),
        }
    }

    /// Runs `task(0..tasks)` on the members that are free and on this thread, which
    /// must be the team's only owner, and returns when every task has finished. A
    /// task's panic is resumed here once all have finished. `tasks` ≤ [`MAX_TASKS`].
    pub(crate) fn run(&self, tasks: usize, task: &(dyn Fn(usize) + Sync)) {
        assert!(tasks <= MAX_TASKS, "a team job of {tasks} tasks");
        let job = Job {
            task,
            done: AtomicUsize::new(0),
            panic: Mutex::new(None),
        };
        let generation = (self.word.load(Ordering::Relaxed) >> 32) + 1;
        // the job first, then the word that announces it (a member that reads this
        // word reads this job or, once it is over, a later one)
        self.job
            .store(&job as *const Job<'_> as *mut (), Ordering::Release);
        self.word
            .store((generation << 32) | tasks as u64, Ordering::Release);
        self.help();
        while job.done.load(Ordering::Acquire) < tasks {
            std::hint::spin_loop();
        }
        let panic = job.panic.into_inner().unwrap_or_else(|e| e.into_inner());
        if let Some(payload) = panic {
            resume_unwind(payload);
        }
    }

    /// Claims and runs the current job's tasks until none is left to claim.
    pub(crate) fn help(&self) {
        loop {
            let word = self.word.load(Ordering::Acquire);
            let next = (word >> 16) & 0xFFFF;
            if next >= word & 0xFFFF {
                return;
            }
            let job = self.job.load(Ordering::Acquire);
            let claimed = (word & !(0xFFFF << 16)) | ((next + 1) << 16);
            if self
                .word
                .compare_exchange_weak(word, claimed, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            // SAFETY: the claim succeeded on the word as read, so the job it announced
            // was unfinished (task `next` was unclaimed) and its owner is still waiting
            // in `run`; it cannot publish the next job, nor free this one, before this
            // task counts itself done below. `job` was loaded after that word, so it is
            // that job (a later one is stored only after this one finishes).
            let job = unsafe { &*(job as *const Job<'_>) };
            if let Err(payload) = catch_unwind(AssertUnwindSafe(|| (job.task)(next as usize))) {
                let mut first = job.panic.lock().unwrap_or_else(|e| e.into_inner());
                first.get_or_insert(payload);
            }
            // the last touch of `job`: the owner may return as soon as it sees the count
            job.done.fetch_add(1, Ordering::Release);
        }
    }
}
