//! One output buffer that parallel tasks write into, each task to elements no other
//! task touches: the tiled attention kernels and the blocked matrix product share it.

/// A buffer that parallel tasks write through, each to its own disjoint elements.
#[derive(Clone, Copy)]
pub(crate) struct Disjoint {
    ptr: *mut f32,
    len: usize,
}

// SAFETY: tasks only write disjoint ranges (see `Disjoint::range`), so sharing the
// pointer across threads cannot produce a data race.
unsafe impl Send for Disjoint {}
unsafe impl Sync for Disjoint {}

impl Disjoint {
    pub(crate) fn new(data: &mut [f32]) -> Self {
        Disjoint {
            ptr: data.as_mut_ptr(),
            len: data.len(),
        }
    }

    /// # Safety
    /// No other live reference may overlap `start..start + n`.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn range(&self, start: usize, n: usize) -> &mut [f32] {
        assert!(start + n <= self.len, "disjoint write outside buffer");
        std::slice::from_raw_parts_mut(self.ptr.add(start), n)
    }

    /// The address of element `at`, only to hand to a prefetch (which reads nothing and
    /// cannot fault): never dereferenced.
    pub(crate) fn address(&self, at: usize) -> *const f32 {
        self.ptr.wrapping_add(at).cast_const()
    }

    /// A pointer to element `start`, for a task that writes a strided set of elements
    /// (a tile of a matrix) that ends before `end`.
    ///
    /// # Safety
    /// The task writes only elements in `start..end` that no other task touches.
    pub(crate) unsafe fn ptr(&self, start: usize, end: usize) -> *mut f32 {
        assert!(
            start <= end && end <= self.len,
            "disjoint write outside buffer"
        );
        self.ptr.add(start)
    }
}
