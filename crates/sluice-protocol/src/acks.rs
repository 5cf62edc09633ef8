//! Out-of-order batch completions → the in-order durable frontier.
//!
//! In: batches registered in read order (by their end position) and later
//! marked durable in any order. Out: the position up to which every record
//! is durable. The frontier stops at the first batch that is not yet
//! durable: a later success never skips an earlier failure. This is the only
//! position sluice ever commits to Kafka.

use crate::offset::NextOffset;
use std::collections::VecDeque;

/// Identifies one registered batch within its partition's tracker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ticket(u64);

/// Tracks the batches of one partition.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AckTracker {
    frontier: NextOffset,
    next_ticket: u64,
    /// Registered batches not yet folded into the frontier, in read order.
    pending: VecDeque<(u64, NextOffset, bool)>,
}

impl AckTracker {
    /// A tracker whose records before `start` are already durable.
    pub fn new(start: NextOffset) -> Self {
        Self {
            frontier: start,
            next_ticket: 0,
            pending: VecDeque::new(),
        }
    }

    /// Registers the next batch, which ends at `end`.
    pub fn register(&mut self, end: NextOffset) -> Ticket {
        let t = self.next_ticket;
        self.next_ticket += 1;
        self.pending.push_back((t, end, false));
        Ticket(t)
    }

    /// Marks a batch durable. Unknown tickets are ignored.
    pub fn ack(&mut self, ticket: Ticket) {
        if let Some(entry) = self.pending.iter_mut().find(|e| e.0 == ticket.0) {
            entry.2 = true;
        }
        while let Some(&(_, end, true)) = self.pending.front() {
            self.frontier = self.frontier.max(end);
            self.pending.pop_front();
        }
    }

    /// Every record before this position is durable.
    pub fn frontier(&self) -> NextOffset {
        self.frontier
    }

    /// The position to commit, given the last one committed: the frontier,
    /// if it moved and the partition may still write (in exactly-once mode,
    /// under a live lease: one whose lease ran out may have a new owner,
    /// and a commit from it could pass that owner's records).
    pub fn to_commit(&self, committed: Option<NextOffset>, may_write: bool) -> Option<NextOffset> {
        (may_write && committed != Some(self.frontier)).then_some(self.frontier)
    }

    /// Batches registered and not yet folded into the frontier.
    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn later_success_never_skips_earlier_failure() {
        let mut t = AckTracker::new(NextOffset(10));
        let a = t.register(NextOffset(20));
        let b = t.register(NextOffset(30));
        t.ack(b);
        assert_eq!(t.frontier(), NextOffset(10));
        t.ack(a);
        assert_eq!(t.frontier(), NextOffset(30));
        assert_eq!(t.in_flight(), 0);
    }

    proptest! {
        /// Whatever the order of acknowledgements, the frontier is the end
        /// of the longest fully acknowledged prefix.
        #[test]
        fn frontier_is_longest_acked_prefix(
            n in 1usize..40,
            order in proptest::collection::vec(any::<proptest::sample::Index>(), 0..40),
        ) {
            let mut t = AckTracker::new(NextOffset(0));
            let tickets: Vec<_> = (0..n).map(|i| t.register(NextOffset((i as i64 + 1) * 10))).collect();
            let mut acked = vec![false; n];
            for idx in order {
                let i = idx.index(n);
                t.ack(tickets[i]);
                acked[i] = true;
                let prefix = acked.iter().take_while(|a| **a).count();
                prop_assert_eq!(t.frontier(), NextOffset(prefix as i64 * 10));
                prop_assert_eq!(t.in_flight(), n - prefix);
            }
        }
    }
}
