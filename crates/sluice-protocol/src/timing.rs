//! How long a lease runs, and how long a new owner fences.
//!
//! In: the configured `fence_wait` and `insert_timeout`. Out: the lease
//! term ([`lease_term`]) and, where `fence_wait` is too short to cover a
//! previous owner, the fence that would ([`safe_fence`]).
//!
//! A previous owner stops starting inserts within a lease of the new
//! owner's claim; an insert it started by then is refused after its
//! deadline (`insert_timeout` later) and ends within another
//! `insert_timeout` (the server's `max_execution_time`). So a fence of
//! `lease + 2 × insert_timeout`, plus [`FENCE_MARGIN`], covers it.

use std::time::Duration;

/// What a new owner's fence allows for beyond the previous owner's last
/// inserts and lease: clocks that run at slightly different rates.
pub const FENCE_MARGIN: Duration = Duration::from_secs(5);
pub const MAX_LEASE: Duration = Duration::from_secs(10);
pub const MIN_LEASE: Duration = Duration::from_secs(2);

/// A claim on a clean partition skips the fence only if it was written
/// within this long of the read that showed `clean` (Fischer's mutual
/// exclusion, with the write's own duration as its bound).
pub const SETTLE: Duration = Duration::from_secs(2);

/// How long such a claim waits before it is read back: longer than
/// [`SETTLE`], by more than two clocks drift apart over it, so that of two
/// claimers that both read `clean`, the other one's claim is stored by
/// then and only the last one reads itself back. (With the two equal, a
/// claim written exactly [`SETTLE`] after its read lands just after the
/// other's read-back: the model found both going active.)
pub const SETTLE_WAIT: Duration = Duration::from_secs(3);

/// The lease that `fence_wait` covers, within [`MIN_LEASE`, `MAX_LEASE`].
pub fn lease_term(fence_wait: Duration, insert_timeout: Duration) -> Duration {
    fence_wait
        .saturating_sub(insert_timeout * 2 + FENCE_MARGIN)
        .clamp(MIN_LEASE, MAX_LEASE)
}

/// The shortest fence that covers a previous owner's last inserts and its
/// shortest lease, if `fence_wait` is shorter.
pub fn safe_fence(fence_wait: Duration, insert_timeout: Duration) -> Option<Duration> {
    let safe = insert_timeout * 2 + MIN_LEASE + FENCE_MARGIN;
    (fence_wait < safe).then_some(safe)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fence_covers_a_lease_and_two_insert_timeouts() {
        let s = Duration::from_secs;
        assert_eq!(lease_term(s(80), s(30)), s(10), "at most MAX_LEASE");
        assert_eq!(lease_term(s(68), s(30)), s(3));
        assert_eq!(lease_term(s(60), s(30)), s(2), "at least MIN_LEASE");
        assert_eq!(safe_fence(s(66), s(30)), Some(s(67)));
        assert_eq!(safe_fence(s(67), s(30)), None);
    }
}
