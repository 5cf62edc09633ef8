//! Late INSERTs, decided on the server's clock.
//!
//! An INSERT can reach ClickHouse after its client gave up on it (a proxy,
//! a server queue, a retransmission), so no bound on the client's clock says
//! when an attempt can no longer commit. Instead every exactly-once attempt
//! carries a deadline D on the server's clock and refuses to start after it.
//!
//! In: readings of the server's clock, each with the local moments its
//! request was sent and answered ([`ServerClock::observe`]); the lease's end
//! and the insert timeout. Out: an attempt's deadline ([`attempt_deadline`]),
//! and, after an unknown outcome, what the fence does next ([`Fence`]):
//! an attempt is fenced once the server's clock is past D (plus a margin) and
//! the server lists no query with its id.

use std::time::Duration;

/// How much later than the deadline the fence waits: servers behind one
/// address may disagree, and a server's clock may step back a little.
pub const CLOCK_MARGIN_MS: i64 = 1_000;

/// How long the reading with the shortest round trip is preferred over a
/// later one with a longer round trip.
pub const CLOCK_READING_TTL: Duration = Duration::from_secs(300);

/// How far a reading may stray from what the held one predicts (beyond both
/// round trips) before the server's clock counts as moved: stepped, or
/// drifted against ours. The sink reads the clock every
/// [`CLOCK_REREAD`], so an error this small is all a deadline carries.
pub const CLOCK_STEP_MS: i64 = 100;

/// How often the sink reads the server's clock again.
pub const CLOCK_REREAD: Duration = Duration::from_secs(5);

/// A point on a local monotonic clock: [`std::time::Instant`] in the sink,
/// a counter in a model.
pub trait Moment: Copy + Ord {
    /// `self - earlier`; zero if `earlier` is later.
    fn since(self, earlier: Self) -> Duration;
    /// `self + d`.
    fn after(self, d: Duration) -> Self;
}

impl Moment for std::time::Instant {
    fn since(self, earlier: Self) -> Duration {
        self.saturating_duration_since(earlier)
    }
    fn after(self, d: Duration) -> Self {
        self + d
    }
}

/// A clock counted in milliseconds: the time of a model (or a test), where
/// the sink uses [`std::time::Instant`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Millis(pub u64);

impl Moment for Millis {
    fn since(self, earlier: Self) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0))
    }
    fn after(self, d: Duration) -> Self {
        Millis(
            self.0
                .saturating_add(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        )
    }
}

/// The server's clock, as seen from here: the reading with the shortest
/// round trip, counted forward on the local monotonic clock (a step of the
/// local wall clock changes nothing). A reading is placed at the moment its
/// answer arrived: the server read its clock before that, so the estimate is
/// never ahead of the server (behind by at most the round trip), and a
/// deadline built on it never ends later than meant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ServerClock<T> {
    held: Option<Reading<T>>,
}

impl<T> Default for ServerClock<T> {
    fn default() -> Self {
        Self { held: None }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Reading<T> {
    /// When its answer arrived, on the local clock.
    at: T,
    server_ms: i64,
    rtt: Duration,
}

impl<T: Moment> ServerClock<T> {
    /// A reading `server_ms` (Unix ms) by a request sent at `sent` and
    /// answered at `received`; kept if it is more precise than the one held,
    /// or that one is older than [`CLOCK_READING_TTL`], or `force`, or the
    /// server's clock moved: the reading lies more than [`CLOCK_STEP_MS`]
    /// outside what the held one predicts for the span of the request.
    /// Returns how far it moved (ms, negative: back), if it did.
    pub fn observe(&mut self, server_ms: i64, sent: T, received: T, force: bool) -> Option<i64> {
        let new = Reading {
            at: received,
            server_ms,
            rtt: received.since(sent),
        };
        // The held reading is behind the server by up to its round trip.
        let moved = self.held.and_then(|old| {
            let earliest = self.ms_at(sent)? - CLOCK_STEP_MS;
            let latest = self.ms_at(received)? + millis(old.rtt) + CLOCK_STEP_MS;
            match server_ms {
                m if m < earliest => Some(m - earliest),
                m if m > latest => Some(m - latest),
                _ => None,
            }
        });
        let keep_old = self.held.is_some_and(|old| {
            !force
                && moved.is_none()
                && old.rtt < new.rtt
                && new.at.since(old.at) < CLOCK_READING_TTL
        });
        if !keep_old {
            self.held = Some(new);
        }
        moved
    }

    /// The server's clock at `t` on ours (Unix ms); `None` before the first
    /// reading.
    pub fn ms_at(&self, t: T) -> Option<i64> {
        let r = self.held?;
        Some(if t >= r.at {
            r.server_ms + millis(t.since(r.at))
        } else {
            r.server_ms - millis(r.at.since(t))
        })
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The deadline (server ms) of an attempt sent at `now` that must start by
/// `latest` (its lease's end) on the local clock: `insert_timeout` after the
/// earlier of the two, on the server's clock. A process stopped between
/// checking its lease and sending gets a deadline already past. `server_ms`
/// is the server's clock at that moment ([`ServerClock::ms_at`]).
pub fn attempt_deadline<T: Moment>(
    server_ms: impl Fn(T) -> i64,
    latest: T,
    now: T,
    insert_timeout: Duration,
) -> i64 {
    server_ms(latest.min(now)) + millis(insert_timeout)
}

/// The fence's next step for an attempt whose outcome is unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FenceStep {
    /// The attempt can no longer commit.
    Done,
    /// The server still runs it: ask it to kill the query, look again.
    KillAgain,
    /// Look again once the server's clock is past this (Unix ms).
    WaitUntil(i64),
}

/// The fence of one attempt whose outcome is unknown, look by look.
///
/// The attempt refuses to start after its deadline, so once the server's
/// clock is past it (plus [`CLOCK_MARGIN_MS`]) and nothing with its id runs,
/// it never commits. Without a view of the running queries, a run that
/// started in time ends within `insert_timeout` (the server's
/// `max_execution_time`) after the deadline; and once one look had no view,
/// that longer bound holds for the rest of the fence: the node that could
/// not list its queries may be the one running the attempt, and the next
/// look may be answered by another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fence {
    deadline_ms: i64,
    insert_timeout: Duration,
    margin_ms: i64,
    blind: bool,
}

impl Fence {
    pub fn new(deadline_ms: i64, insert_timeout: Duration) -> Self {
        Self::with_margin(deadline_ms, insert_timeout, CLOCK_MARGIN_MS)
    }

    /// A fence that allows `margin_ms` instead of [`CLOCK_MARGIN_MS`] for
    /// servers that disagree (a checked model tries a smaller one).
    pub fn with_margin(deadline_ms: i64, insert_timeout: Duration, margin_ms: i64) -> Self {
        Self {
            deadline_ms,
            insert_timeout,
            margin_ms,
            blind: false,
        }
    }

    /// The next step after one look at the server: its clock, and how many
    /// queries with the attempt's id it runs (`None`: it could not list
    /// them).
    pub fn step(&mut self, server_now_ms: i64, running: Option<u64>) -> FenceStep {
        match running {
            Some(0) => {}
            Some(_) => return FenceStep::KillAgain,
            None => self.blind = true,
        }
        let until = match self.blind {
            false => self.deadline_ms + self.margin_ms,
            true => self.deadline_ms + millis(self.insert_timeout) + self.margin_ms,
        };
        if server_now_ms > until {
            FenceStep::Done
        } else {
            FenceStep::WaitUntil(until)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clock_that_moved_replaces_a_more_precise_reading() {
        let mut c = ServerClock::default();
        assert_eq!(c.observe(1_000_000, Millis(0), Millis(2), false), None);
        // In step, a slower answer: the precise reading stays.
        assert_eq!(
            c.observe(1_010_003, Millis(10_000), Millis(10_010), false),
            None
        );
        assert_eq!(c.ms_at(Millis(10_010)), Some(1_010_008));
        // The server stepped back 30 s: taken at once, and reported.
        let moved = c.observe(990_000, Millis(20_000), Millis(20_050), false);
        assert!(moved.is_some_and(|m| m < -29_000), "{moved:?}");
        assert_eq!(c.ms_at(Millis(20_050)), Some(990_000));
        // Forward too.
        let moved = c.observe(1_100_000, Millis(30_000), Millis(30_001), false);
        assert!(moved.is_some_and(|m| m > 79_000), "{moved:?}");
    }

    use Millis as Ms;

    #[test]
    fn the_clock_keeps_the_tightest_reading_and_never_runs_ahead() {
        let mut c = ServerClock::default();
        assert_eq!(c.ms_at(Ms(0)), None);
        // Sent at 100, answered at 300: the server read 5_000 somewhere in
        // between; placed at 300, the estimate is behind, never ahead.
        c.observe(5_000, Ms(100), Ms(300), false);
        assert_eq!(c.ms_at(Ms(300)), Some(5_000));
        assert_eq!(c.ms_at(Ms(1_300)), Some(6_000));
        assert_eq!(c.ms_at(Ms(200)), Some(4_900));
        // A looser reading does not replace it; a tighter one does.
        c.observe(5_400, Ms(400), Ms(900), false);
        assert_eq!(c.ms_at(Ms(1_300)), Some(6_000));
        c.observe(5_705, Ms(1_000), Ms(1_010), false);
        assert_eq!(c.ms_at(Ms(1_010)), Some(5_705));
        // An old reading gives way to a looser but fresh one, and force wins.
        let later = Ms(1_010 + CLOCK_READING_TTL.as_millis() as u64);
        c.observe(1, Ms(later.0 - 50), later, false);
        assert_eq!(c.ms_at(later), Some(1));
        c.observe(2, Ms(later.0), Ms(later.0 + 900), true);
        assert_eq!(c.ms_at(Ms(later.0 + 900)), Some(2));
    }

    #[test]
    fn the_deadline_counts_from_the_lease_end_if_it_came_first() {
        let t = Duration::from_secs(30);
        let server = |m: Ms| 1_000_000 + m.0 as i64;
        assert_eq!(attempt_deadline(server, Ms(500), Ms(100), t), 1_030_100);
        // Frozen past the lease's end: the deadline is already past on
        // arrival, counted from the lease's end.
        assert_eq!(attempt_deadline(server, Ms(500), Ms(90_000), t), 1_030_500);
    }

    #[test]
    fn the_fence_ends_on_the_servers_clock_only() {
        let t = Duration::from_secs(30);
        let d = 50_000;
        let mut f = Fence::new(d, t);
        assert_eq!(f.step(10, Some(1)), FenceStep::KillAgain);
        assert_eq!(f.step(d + 5_000, Some(2)), FenceStep::KillAgain);
        assert_eq!(
            f.step(d, Some(0)),
            FenceStep::WaitUntil(d + CLOCK_MARGIN_MS)
        );
        assert_eq!(
            f.step(d + CLOCK_MARGIN_MS, Some(0)),
            FenceStep::WaitUntil(d + CLOCK_MARGIN_MS)
        );
        assert_eq!(f.step(d + CLOCK_MARGIN_MS + 1, Some(0)), FenceStep::Done);
    }

    #[test]
    fn one_blind_look_keeps_the_longer_bound() {
        let t = Duration::from_secs(30);
        let d = 50_000;
        let blind = d + 30_000 + CLOCK_MARGIN_MS;
        let mut f = Fence::new(d, t);
        assert_eq!(
            f.step(d + CLOCK_MARGIN_MS + 1, None),
            FenceStep::WaitUntil(blind)
        );
        // Another node answers: nothing runs there, its clock is past the
        // short bound. The node that could not answer may run it still.
        assert_eq!(
            f.step(d + CLOCK_MARGIN_MS + 1, Some(0)),
            FenceStep::WaitUntil(blind)
        );
        assert_eq!(f.step(blind, Some(1)), FenceStep::KillAgain);
        assert_eq!(f.step(blind + 1, Some(0)), FenceStep::Done);
    }
}
