//! Claiming partitions in the register of owners: when a new owner may
//! start writing.
//!
//! In: what each read of the register found and when it was sent, whether
//! a write of the claim was stored, and the clock. Out: what to do next
//! ([`Claim::next`]: read the group's commits, read or write the register,
//! wait) and, from a read, the partitions that are now this process's, each
//! with the send time of the read that showed it (where its lease starts).
//! The sink (`sink/prepare.rs`) and the checked model drive the same
//! [`Claim`]; only they do I/O.
//!
//! A round:
//! 1. Read the group's commits, then the register.
//! 2. Write this process into it.
//! 3. If every entry read was `clean` and the write was stored within
//!    [`SETTLE`] of the read, wait [`SETTLE_WAIT`]: two claimers that both
//!    read `clean` cannot both read themselves back then (Fischer's mutual
//!    exclusion, with the write's own duration as its bound).
//! 4. Read the claim back. After a clean hand-off, what shows this process
//!    is its own now. Otherwise it fences: it waits `fence_wait` (a previous
//!    owner stops writing within a lease of the claim, and its last inserts
//!    end within `2 × insert_timeout` after that), watching the register;
//!    a `clean` mark over the claim ends the fence and the round (the
//!    previous owner's inserts ended: claim again, without a fence). After
//!    the fence, what still shows this process is its own.
//! 5. What is left is claimed again in a new round: after a yield if the
//!    register named another process during the round (two members a
//!    coordinator gave one partition would otherwise overwrite each other's
//!    claim within each other's fence for ever), after the driver's backoff
//!    if not. The yield is a fence, then two; it ends sooner once the
//!    register shows every partition left `clean`.
//!
//! A partition taken from this process starts with a wait ([`Start::After`]).

use crate::deadline::Moment;
use crate::lease::Owner;
use crate::timing::{SETTLE, SETTLE_WAIT};
use std::time::Duration;

/// How often a wait that watches the register reads it.
pub const WATCH_EVERY: Duration = Duration::from_secs(1);

/// A partition another owner took from this process, which had written
/// it for `held` (`None`: it never went active): `taken`, how often it was
/// taken since the group assigned it here, counts this taking, afresh if
/// the partition stayed this process's for two fences; returns how long
/// to wait before claiming it back: a fence, doubling with each taking,
/// up to four. Two members a coordinator gave one partition take it from
/// each other; the longer wait lets the other's fence end.
pub fn taken_again(taken: &mut u32, held: Option<Duration>, fence_wait: Duration) -> Duration {
    if held.is_some_and(|h| h > fence_wait * 2) {
        *taken = 0;
    }
    *taken += 1;
    fence_wait * 2u32.pow(taken.saturating_sub(1).min(2))
}

/// What the driver does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Do<T> {
    /// Read the group's committed offsets of [`Claim::keys`], then report
    /// [`Claim::commits_read`].
    ReadCommits,
    /// Read the register's entries of [`Claim::keys`], every one of them,
    /// and report them with [`Claim::read`].
    Read,
    /// Write this process into the register for [`Claim::keys`]; report
    /// [`Claim::written`] or [`Claim::write_failed`].
    Write,
    /// Wait until `until`, then report [`Claim::woke`]. If `why` watches,
    /// read the register of [`Claim::keys`] every [`WATCH_EVERY`] meanwhile
    /// and report each read with [`Claim::watched`].
    Wait { until: T, why: Why },
    /// Wait the driver's backoff (the claim could not be written, or was
    /// overwritten by a `clean` mark), then report [`Claim::woke`].
    Backoff,
    /// Every partition is claimed or given up.
    Done,
}

/// Why a claim waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Why {
    /// The partition was taken from this process.
    Taken { watch: bool },
    /// Another process claimed the partitions during the last round.
    Yield,
    /// A claim on a clean hand-off settles before it is read back.
    Settle,
    /// Waiting out the previous owner's lease and inserts.
    Fence,
}

impl Why {
    /// Whether the wait reads the register, and ends once it shows every
    /// partition `clean`.
    pub fn watches(self) -> bool {
        match self {
            Why::Taken { watch } => watch,
            Why::Yield | Why::Fence => true,
            Why::Settle => false,
        }
    }
}

/// How a claim starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Start<T> {
    Now,
    /// The partitions were just taken from this process: wait until then
    /// (or, if `watch`, until the register shows them `clean`).
    After {
        until: T,
        watch: bool,
    },
}

/// The claim's durations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClaimTimes {
    pub fence_wait: Duration,
    pub settle_wait: Duration,
}

impl ClaimTimes {
    pub fn new(fence_wait: Duration) -> Self {
        Self {
            fence_wait,
            settle_wait: SETTLE_WAIT,
        }
    }

    /// The yield after the `n`th round (from 1) that lost to another
    /// process: a fence, then two.
    fn yield_after(&self, n: u32) -> Duration {
        self.fence_wait.max(WATCH_EVERY) * if n <= 1 { 1 } else { 2 }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Step<T> {
    Wait {
        until: T,
        why: Why,
    },
    ReadCommits,
    Read,
    Write {
        clean: bool,
        read_sent: T,
    },
    ReadBack {
        clean: bool,
    },
    /// The fence's end reads the register once more.
    ReadAgain,
    Backoff,
}

/// The claim of a set of partitions `K` by process `me`, on the clock `T`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Claim<K, T> {
    me: u64,
    times: ClaimTimes,
    /// Not yet this process's.
    pending: Vec<K>,
    /// Of those, the ones the last read back showed claimed (they fence).
    fencing: Vec<K>,
    step: Step<T>,
    /// Of those, the ones the register named another process for during
    /// this round.
    contested: Vec<K>,
    /// Rounds lost to another process so far.
    yields: u32,
    /// The yield the last read began, until the driver says when planning
    /// what it claimed ended ([`Self::planned`]).
    unplanned: bool,
}

impl<K: Copy + Eq, T: Moment> Claim<K, T> {
    pub fn new(keys: Vec<K>, me: u64, times: ClaimTimes, start: Start<T>) -> Self {
        let step = match start {
            Start::Now => Step::ReadCommits,
            Start::After { until, watch } => Step::Wait {
                until,
                why: Why::Taken { watch },
            },
        };
        Self {
            me,
            times,
            pending: keys,
            fencing: Vec::new(),
            step,
            contested: Vec::new(),
            yields: 0,
            unplanned: false,
        }
    }

    pub fn next(&self) -> Do<T> {
        if self.pending.is_empty() {
            return Do::Done;
        }
        match self.step {
            Step::Wait { until, why } => Do::Wait { until, why },
            Step::ReadCommits => Do::ReadCommits,
            Step::Read | Step::ReadBack { .. } | Step::ReadAgain => Do::Read,
            Step::Write { .. } => Do::Write,
            Step::Backoff => Do::Backoff,
        }
    }

    /// The partitions the next read, write or watch concerns.
    pub fn keys(&self) -> &[K] {
        match self.step {
            Step::Wait {
                why: Why::Fence, ..
            }
            | Step::ReadAgain => &self.fencing,
            _ => &self.pending,
        }
    }

    /// Every partition not yet this process's.
    pub fn pending(&self) -> &[K] {
        &self.pending
    }

    /// Keeps only the partitions `keep` says are still to be claimed (the
    /// others were revoked, lost or taken), at `now`.
    pub fn retain(&mut self, now: T, mut keep: impl FnMut(&K) -> bool) {
        self.pending.retain(&mut keep);
        self.fencing.retain(&mut keep);
        self.contested.retain(keep);
        if self.fencing.is_empty() && self.fencing_step() {
            self.end_round(now);
        }
        // Every partition that made this round yield was given up: what is
        // left was never contested and need not wait.
        let yielding = matches!(
            self.step,
            Step::Wait {
                why: Why::Yield,
                ..
            }
        );
        if yielding && self.contested.is_empty() {
            self.step = Step::Backoff;
        }
    }

    fn fencing_step(&self) -> bool {
        matches!(
            self.step,
            Step::Wait {
                why: Why::Fence,
                ..
            } | Step::ReadAgain
        )
    }

    /// The group's commits were read: the register is next.
    pub fn commits_read(&mut self) {
        if self.step == Step::ReadCommits {
            self.step = Step::Read;
            self.contested.clear();
        }
    }

    /// A read of the register of [`Self::keys`], sent at `sent` and answered
    /// at `now`, found `entry` for each. Returns the partitions that are
    /// this process's from now, each with `sent`.
    pub fn read(&mut self, sent: T, now: T, entry: impl Fn(&K) -> Owner) -> Vec<(K, T)> {
        match self.step {
            Step::Read => {
                let clean = self.pending.iter().all(|k| entry(k) == Owner::Clean);
                self.step = Step::Write {
                    clean,
                    read_sent: sent,
                };
                Vec::new()
            }
            Step::ReadBack { clean } => {
                self.contested = self.others(&self.pending, &entry);
                let claimed: Vec<K> = self
                    .pending
                    .iter()
                    .copied()
                    .filter(|k| entry(k) == Owner::Process(self.me))
                    .collect();
                if clean || claimed.is_empty() {
                    return self.take(claimed, sent, now);
                }
                self.fencing = claimed;
                self.step = Step::Wait {
                    until: now.after(self.times.fence_wait),
                    why: Why::Fence,
                };
                Vec::new()
            }
            Step::ReadAgain => {
                for k in self.others(&self.fencing, &entry) {
                    if !self.contested.contains(&k) {
                        self.contested.push(k);
                    }
                }
                let ours: Vec<K> = self
                    .fencing
                    .iter()
                    .copied()
                    .filter(|k| entry(k) == Owner::Process(self.me))
                    .collect();
                self.take(ours, sent, now)
            }
            _ => Vec::new(),
        }
    }

    /// Those of `keys` the register names another process for.
    fn others(&self, keys: &[K], entry: impl Fn(&K) -> Owner) -> Vec<K> {
        let other = |k: &&K| matches!(entry(k), Owner::Process(id) if id != self.me);
        keys.iter().filter(other).copied().collect()
    }

    /// The partitions the register named another process for during the
    /// round that just ended (two members a coordinator gave one partition
    /// show here), while it yields.
    pub fn contested(&self) -> &[K] {
        match self.step {
            Step::Wait {
                why: Why::Yield, ..
            } => &self.contested,
            _ => &[],
        }
    }

    /// Planning what the round claimed took until `now`: a yield starts
    /// from here, so that the other claimer's fence can end within it.
    pub fn planned(&mut self, now: T) {
        let yielding = matches!(
            self.step,
            Step::Wait {
                why: Why::Yield,
                ..
            }
        );
        if yielding && std::mem::take(&mut self.unplanned) {
            self.step = Step::Wait {
                until: now.after(self.times.yield_after(self.yields)),
                why: Why::Yield,
            };
        }
    }

    /// `ours` are this process's since a read sent at `sent`; the round ends.
    fn take(&mut self, ours: Vec<K>, sent: T, now: T) -> Vec<(K, T)> {
        self.pending.retain(|k| !ours.contains(k));
        self.end_round(now);
        self.unplanned = !self.contested.is_empty();
        ours.into_iter().map(|k| (k, sent)).collect()
    }

    /// What is left is claimed again: after a yield if another process
    /// claimed it this round, after the driver's backoff if not.
    fn end_round(&mut self, now: T) {
        self.fencing.clear();
        self.step = if !self.contested.is_empty() {
            self.yields += 1;
            Step::Wait {
                until: now.after(self.times.yield_after(self.yields)),
                why: Why::Yield,
            }
        } else {
            Step::Backoff
        };
    }

    /// The write of the claim was stored; the driver knew it at `now`.
    pub fn written(&mut self, now: T) {
        if let Step::Write { clean, read_sent } = self.step {
            let settles = clean && now.since(read_sent) <= SETTLE;
            self.step = if settles {
                Step::Wait {
                    until: now.after(self.times.settle_wait),
                    why: Why::Settle,
                }
            } else {
                Step::ReadBack { clean: false }
            };
        }
    }

    /// The write of the claim failed (or its outcome is unknown), at `now`.
    pub fn write_failed(&mut self, now: T) {
        if matches!(self.step, Step::Write { .. }) {
            self.end_round(now);
        }
    }

    /// A read at `now`, during a wait that watches, found `entry` for each
    /// of [`Self::keys`]. Returns whether the wait ended: it does once every
    /// one is `clean`. A `clean` mark over a fencing claim was written by an
    /// owner whose inserts ended: the round ends, and what is left is
    /// claimed again (after a yield if the read back named another process).
    pub fn watched(&mut self, now: T, entry: impl Fn(&K) -> Owner) -> bool {
        let Step::Wait { why, .. } = self.step else {
            return false;
        };
        if !why.watches() || !self.keys().iter().all(|k| entry(k) == Owner::Clean) {
            return false;
        }
        match why {
            Why::Fence => self.end_round(now),
            _ => self.step = Step::ReadCommits,
        }
        true
    }

    /// The driver's wait (or backoff) ended at `now`.
    pub fn woke(&mut self, now: T) {
        match self.step {
            Step::Wait { until, why } if now >= until => {
                self.step = match why {
                    Why::Settle => Step::ReadBack { clean: true },
                    Why::Fence => Step::ReadAgain,
                    Why::Taken { .. } | Why::Yield => Step::ReadCommits,
                };
            }
            Step::Backoff => self.step = Step::ReadCommits,
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deadline::Millis;

    const ME: u64 = 7;

    fn claim(start: Start<Millis>) -> Claim<u8, Millis> {
        Claim::new(
            vec![1, 2],
            ME,
            ClaimTimes::new(Duration::from_secs(10)),
            start,
        )
    }

    fn s(n: u64) -> Millis {
        Millis(n * 1000)
    }

    /// Reads the commits and the register (finding `first`), writes at `at`.
    fn write(c: &mut Claim<u8, Millis>, at: Millis, first: Owner) {
        assert_eq!(c.next(), Do::ReadCommits);
        c.commits_read();
        assert_eq!(c.next(), Do::Read);
        assert!(c.read(s(0), s(0), |_| first).is_empty());
        assert_eq!(c.next(), Do::Write);
        c.written(at);
    }

    #[test]
    fn a_clean_hand_off_settles_and_skips_the_fence() {
        let mut c = claim(Start::Now);
        write(&mut c, s(1), Owner::Clean);
        let settle = Do::Wait {
            until: s(4),
            why: Why::Settle,
        };
        assert_eq!(c.next(), settle);
        c.woke(s(3));
        assert_eq!(c.next(), settle, "not before its end");
        c.woke(s(4));
        assert_eq!(c.next(), Do::Read);
        let ours = c.read(s(4), s(5), |&k| match k {
            1 => Owner::Process(ME),
            _ => Owner::Nobody,
        });
        assert_eq!(ours, vec![(1, s(4))], "from the read's send time");
        assert_eq!(c.next(), Do::Backoff, "nobody else claimed 2");
        c.woke(s(6));
        assert_eq!(c.next(), Do::ReadCommits);
        assert_eq!(c.keys(), &[2]);
    }

    #[test]
    fn a_slow_write_after_a_clean_read_fences() {
        let mut c = claim(Start::Now);
        write(&mut c, s(3), Owner::Clean);
        assert_eq!(c.next(), Do::Read, "read back at once");
        assert!(c.read(s(3), s(3), |_| Owner::Process(ME)).is_empty());
        assert_eq!(
            c.next(),
            Do::Wait {
                until: s(13),
                why: Why::Fence
            }
        );
    }

    #[test]
    fn the_fence_keeps_what_still_shows_this_process() {
        let mut c = claim(Start::Now);
        write(&mut c, s(1), Owner::Process(3));
        assert!(c.read(s(1), s(1), |_| Owner::Process(ME)).is_empty());
        assert!(!c.watched(s(2), |&k| match k {
            1 => Owner::Clean,
            _ => Owner::Process(ME),
        }));
        c.woke(s(11));
        assert_eq!(c.keys(), &[1, 2], "the fence is still on");
        c.woke(s(12));
        assert_eq!(c.next(), Do::Read);
        let ours = c.read(s(12), s(12), |&k| match k {
            1 => Owner::Process(ME),
            _ => Owner::Process(4),
        });
        assert_eq!(ours, vec![(1, s(12))]);
        assert_eq!(
            c.next(),
            Do::Wait {
                until: s(22),
                why: Why::Yield
            },
            "another process claimed 2: yield a fence"
        );
        assert_eq!(c.keys(), &[2]);
    }

    #[test]
    fn a_loss_yields_a_fence_then_two_or_until_clean() {
        let mut c = claim(Start::Now);
        write(&mut c, s(1), Owner::Nobody);
        assert!(c.read(s(1), s(1), |_| Owner::Process(3)).is_empty());
        assert_eq!(
            c.next(),
            Do::Wait {
                until: s(11),
                why: Why::Yield
            }
        );
        assert!(!c.watched(s(2), |_| Owner::Process(3)));
        c.woke(s(11));
        write(&mut c, s(12), Owner::Process(3));
        assert!(c.read(s(12), s(12), |_| Owner::Process(3)).is_empty());
        assert_eq!(
            c.next(),
            Do::Wait {
                until: s(32),
                why: Why::Yield
            },
            "two fences the second time"
        );
        assert!(c.watched(s(13), |_| Owner::Clean), "a clean hand-off");
        assert_eq!(c.next(), Do::ReadCommits);
    }

    #[test]
    fn a_clean_mark_during_the_fence_ends_the_round_and_keeps_a_loss() {
        let mut c = claim(Start::Now);
        write(&mut c, s(1), Owner::Process(3));
        let found = |k: &u8| match k {
            1 => Owner::Process(ME),
            _ => Owner::Process(4),
        };
        assert!(c.read(s(1), s(1), found).is_empty());
        assert_eq!(c.keys(), &[1], "only the claimed one fences");
        assert!(c.watched(s(5), |_| Owner::Clean));
        assert_eq!(
            c.next(),
            Do::Wait {
                until: s(15),
                why: Why::Yield
            },
            "2 was claimed by 4 at the read back"
        );
        assert_eq!(c.pending(), &[1, 2]);
    }

    #[test]
    fn a_failed_write_backs_off_and_a_given_up_fence_ends() {
        let mut c = claim(Start::Now);
        c.commits_read();
        c.read(s(0), s(0), |_| Owner::Nobody);
        c.write_failed(s(1));
        assert_eq!(c.next(), Do::Backoff);
        c.woke(s(2));
        write(&mut c, s(3), Owner::Nobody);
        c.read(s(3), s(3), |&k| match k {
            1 => Owner::Process(ME),
            _ => Owner::Nobody,
        });
        c.retain(s(4), |&k| k != 1);
        assert_eq!(c.next(), Do::Backoff, "the fenced partition was given up");
        c.retain(s(4), |_| false);
        assert_eq!(c.next(), Do::Done);
    }

    #[test]
    fn a_contested_partition_given_up_does_not_make_the_others_yield() {
        let mut c = Claim::new(
            vec![1, 2, 3],
            ME,
            ClaimTimes::new(Duration::from_secs(10)),
            Start::Now,
        );
        c.commits_read();
        c.read(s(0), s(0), |_| Owner::Nobody);
        c.written(s(0));
        c.read(s(0), s(0), |&k| match k {
            1 => Owner::Process(ME),
            2 => Owner::Process(3),
            _ => Owner::Nobody,
        });
        c.retain(s(1), |&k| k != 2);
        c.woke(s(10));
        let ours = c.read(s(10), s(10), |_| Owner::Process(ME));
        assert_eq!(ours, vec![(1, s(10))]);
        assert_eq!(c.next(), Do::Backoff, "3 was never contested");
        assert!(c.contested().is_empty());
    }

    #[test]
    fn a_yield_starts_once_the_claimed_partitions_are_planned() {
        let mut c = claim(Start::Now);
        write(&mut c, s(1), Owner::Nobody);
        let ours = c.read(s(1), s(1), |&k| match k {
            1 => Owner::Process(ME),
            _ => Owner::Process(3),
        });
        assert!(ours.is_empty(), "1 fences");
        c.woke(s(11));
        let ours = c.read(s(11), s(11), |&k| match k {
            1 => Owner::Process(ME),
            _ => Owner::Process(3),
        });
        assert_eq!(ours, vec![(1, s(11))]);
        assert_eq!(c.contested(), &[2]);
        c.planned(s(30));
        assert_eq!(
            c.next(),
            Do::Wait {
                until: s(40),
                why: Why::Yield
            }
        );
    }

    #[test]
    fn a_yield_ends_once_its_contested_partitions_are_given_up() {
        let mut c = Claim::new(
            vec![1, 2, 3],
            ME,
            ClaimTimes::new(Duration::from_secs(10)),
            Start::Now,
        );
        c.commits_read();
        c.read(s(0), s(0), |_| Owner::Nobody);
        c.written(s(0));
        let found = |k: &u8| match k {
            1 => Owner::Process(ME),
            2 => Owner::Process(3),
            _ => Owner::Nobody,
        };
        c.read(s(0), s(0), found);
        c.woke(s(10));
        assert_eq!(c.read(s(10), s(10), found), vec![(1, s(10))]);
        assert!(matches!(
            c.next(),
            Do::Wait {
                why: Why::Yield,
                ..
            }
        ));
        c.planned(s(12));
        c.planned(s(30));
        assert_eq!(
            c.next(),
            Do::Wait {
                until: s(22),
                why: Why::Yield
            },
            "only the first call after the read moves the yield"
        );
        c.retain(s(13), |&k| k != 2);
        assert_eq!(c.next(), Do::Backoff, "3 was never contested");
    }

    #[test]
    fn a_taken_partition_waits_first() {
        let mut c = claim(Start::After {
            until: s(20),
            watch: false,
        });
        assert!(!c.watched(s(1), |_| Owner::Clean), "it does not watch");
        c.woke(s(20));
        assert_eq!(c.next(), Do::ReadCommits);
        let mut c = claim(Start::After {
            until: s(20),
            watch: true,
        });
        assert!(c.watched(s(1), |_| Owner::Clean));
        assert_eq!(c.next(), Do::ReadCommits);
    }

    #[test]
    fn the_wait_after_a_taking_doubles_up_to_four_fences() {
        let f = Duration::from_secs(10);
        let mut n = 0;
        let waits: Vec<u64> = (1..=4)
            .map(|_| taken_again(&mut n, Some(f * 2), f).as_secs())
            .collect();
        assert_eq!(waits, [10, 20, 40, 40], "held for two fences at most");
        let afresh = f * 2 + Duration::from_millis(1);
        assert_eq!(taken_again(&mut n, Some(afresh), f), f);
        assert_eq!(taken_again(&mut n, None, f), f * 2, "never active");
    }
}
