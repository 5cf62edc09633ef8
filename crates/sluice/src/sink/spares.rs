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

    /// Keeps `buf` if it fits.
    pub(super) fn put(&mut self, buf: Vec<u8>) {
        if self.bytes + buf.capacity() <= self.max_bytes {
            self.bytes += buf.capacity();
            self.bufs.push(buf);
        }
    }

    /// The buffer put last (its pages most likely in cache).
    pub(super) fn take(&mut self) -> Option<Vec<u8>> {
        let buf = self.bufs.pop()?;
        self.bytes -= buf.capacity();
        Some(buf)
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
    fn keeps_at_most_its_bound_and_counts_capacity() {
        let mut s = Spares::new(100);
        s.put(Vec::with_capacity(60));
        s.put(Vec::with_capacity(60)); // over the bound: dropped
        s.put(Vec::with_capacity(40));
        assert_eq!(s.bytes(), 100);
        assert_eq!(s.take().map(|b| b.capacity()), Some(40));
        assert_eq!(s.bytes(), 60);
        assert_eq!(s.take().map(|b| b.capacity()), Some(60));
        assert_eq!((s.bytes(), s.take()), (0, None));
    }
}
