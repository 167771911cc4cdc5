//! Float buffers that start on a 64-byte boundary. A 16-lane vector load from an
//! address that is not a multiple of 64 spans two cache lines and costs two L1
//! accesses; `Vec<f32>` promises only 4-byte alignment (large ones come back 16 bytes
//! past a page), so the attention kernels keep their packed keys, values and tiles here,
//! and a packed weight its panels.

use std::ops::{Deref, DerefMut};

/// Floats past the allocation's start that may be skipped to reach a 64-byte boundary.
const SLACK: usize = 15;

/// `len` floats, zero-initialised, the first on a 64-byte boundary.
pub(crate) struct AlignedBuf {
    buf: Vec<f32>,
    skip: usize,
    len: usize,
}

impl AlignedBuf {
    pub(crate) fn zeros(len: usize) -> Self {
        let buf = vec![0.0; len + SLACK];
        // an f32 pointer is 4-byte aligned, so at most 15 floats lead to the boundary
        let skip = buf.as_ptr().align_offset(64).min(SLACK);
        AlignedBuf { buf, skip, len }
    }
}

/// A copy on a boundary of its own (a cloned `Vec` would keep the old skip at a new,
/// differently aligned address).
impl Clone for AlignedBuf {
    fn clone(&self) -> Self {
        let mut copy = AlignedBuf::zeros(self.len);
        copy.copy_from_slice(self);
        copy
    }
}

impl Deref for AlignedBuf {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        &self.buf[self.skip..self.skip + self.len]
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [f32] {
        &mut self.buf[self.skip..self.skip + self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::AlignedBuf;

    #[test]
    fn buffers_start_on_a_cache_line_and_hold_their_length_in_zeros() {
        for len in [0, 1, 15, 16, 1000, 1 << 20] {
            let b = AlignedBuf::zeros(len);
            assert_eq!(b.len(), len);
            assert_eq!(b.as_ptr() as usize % 64, 0, "len {len}");
            assert!(b.iter().all(|&x| x == 0.0));
            let copy = b.clone();
            assert_eq!(copy.as_ptr() as usize % 64, 0, "clone of len {len}");
            assert_eq!(&copy[..], &b[..]);
        }
    }
}
