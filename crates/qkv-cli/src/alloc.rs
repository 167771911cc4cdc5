//! How the process's allocator treats the large, short-lived buffers a model makes.
//!
//! A forward or training step allocates activations of megabytes (2,048 tokens × 1,536
//! floats is 12 MiB) and frees them within the step. glibc's defaults return such
//! blocks to the kernel on free — through `munmap`, a trimmed heap top, or the heap of
//! a worker thread's own arena — so the next step faults every page in again, zeroed
//! by the kernel: 700k page faults and about a tenth of a training run here. Keeping
//! freed memory in one arena lets the next step reuse it: the faults drop to the
//! first step's (130k), and training runs about 10% faster.

/// Tells glibc to keep freed memory for reuse: one arena for all threads (the worker
/// threads' own arenas are given back to the kernel however they are tuned), blocks
/// of up to 32 MiB (glibc's largest threshold) from the heap rather than their own
/// mappings, and up to 1 GiB of free heap kept rather than trimmed. Blocks larger
/// than 32 MiB are still mapped and unmapped one by one.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn keep_freed_memory() {
    const ARENAS: i32 = 1;
    const MMAP_THRESHOLD: i32 = 32 << 20;
    const TRIM_THRESHOLD: i32 = 1 << 30;
    // SAFETY: mallopt only sets allocator parameters; it is called before any other
    // thread exists. A refused setting (return 0) leaves glibc's default, which is
    // only slower, so the results are not checked.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, ARENAS);
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
        libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD);
    }
}

/// Other platforms' allocators are left as they are.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn keep_freed_memory() {}
