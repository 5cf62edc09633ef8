//! Buffers of sent batches, kept for the next batches to write into.
//!
//! In: the body of a batch whose insert ended, when nothing else holds it
//! ([`sluice_core::Batch::into_buffer`]). Out: a buffer for a partition's
//! next batch ([`sluice_core::BatchBuilder::give`]). Writing rows into pages
//! the process already has saves the kernel's zeroing of fresh ones, which
//! was a quarter of the consumer thread's time. The spares count towards
//! `max_buffered_bytes` by capacity, and the sink keeps at most a quarter
//! of its bound (and one batch's worth): below the half at which a paused
//! sink resumes, so spares alone never hold it paused.

/// The spare buffers and their total capacity.
#[derive(Debug, Default)]
pub(super) struct Spares {
    bufs: Vec<Vec<u8>>,
    bytes: usize,
    max_bytes: usize,
}

impl Spares {
    /// Keeps buffers up to `max_bytes` of capacity in all.
    pub(super) fn new(max_bytes: usize) -> Self {
        Self {
            max_bytes,
            ..Self::default()
        }
    }

    /// Keeps `buf`, making room by dropping smaller spares if need be;
    /// drops it if it does not fit.
    pub(super) fn put(&mut self, buf: Vec<u8>) {
        let cap = buf.capacity();
        if cap > self.max_bytes {
            return;
        }
        while self.bytes + cap > self.max_bytes {
            match self.smallest().filter(|&i| self.bufs[i].capacity() < cap) {
                Some(i) => self.bytes -= self.bufs.swap_remove(i).capacity(),
                None => return,
            }
        }
        self.bytes += cap;
        self.bufs.push(buf);
    }

    /// The smallest spare of at least `capacity` bytes: one that a batch
    /// like the last will not outgrow (growing copies into fresh pages).
    pub(super) fn take(&mut self, capacity: usize) -> Option<Vec<u8>> {
        let (i, _) = self
            .bufs
            .iter()
            .enumerate()
            .filter(|(_, b)| b.capacity() >= capacity)
            .min_by_key(|(_, b)| b.capacity())?;
        let buf = self.bufs.swap_remove(i);
        self.bytes -= buf.capacity();
        Some(buf)
    }

    fn smallest(&self) -> Option<usize> {
        (0..self.bufs.len()).min_by_key(|&i| self.bufs[i].capacity())
    }

    /// The memory they hold.
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_largest_within_its_bound_and_gives_the_best_fit() {
        let mut s = Spares::new(100);
        s.put(Vec::with_capacity(30));
        s.put(Vec::with_capacity(60));
        s.put(Vec::with_capacity(20)); // no room, and nothing smaller: dropped
        assert_eq!(s.bytes(), 90);
        s.put(Vec::with_capacity(40)); // room made by dropping the 30
        assert_eq!(s.bytes(), 100);
        assert_eq!(s.take(70).map(|b| b.capacity()), None);
        assert_eq!(s.take(35).map(|b| b.capacity()), Some(40));
        assert_eq!(s.bytes(), 60);
        assert_eq!(s.take(0).map(|b| b.capacity()), Some(60));
        assert_eq!((s.bytes(), s.take(0)), (0, None));
    }
}
