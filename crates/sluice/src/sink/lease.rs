//! Fencing by time: may this process start an insert right now?
//!
//! Kafka cannot fence a write into ClickHouse, so sluice fences by time, as
//! leases do. A ticker thread notes the monotonic clock every 100
//! milliseconds. If the process was frozen (SIGSTOP, a VM pause, a stalled
//! host), the ticker sees the gap when it wakes and inserts are held for long
//! enough that librdkafka can learn whether the group moved on and revoke
//! the partitions first. An insert task that runs before the ticker wakes
//! sees a stale tick and waits too, so there is no race on wake-up.
//!
//! Membership: a process cut off from the group coordinator alone (it still
//! reaches the partition leaders and ClickHouse) hears of its lost
//! partitions late, or never. So inserts also need a recent proof that the
//! coordinator knew this member: an offset commit it accepted, or an
//! assignment. The proof counts from when its request was *sent* (a lower
//! bound of when the coordinator saw the member); without one younger than
//! `max_unconfirmed` (the session timeout less a heartbeat interval), no
//! insert starts. The group evicts a silent member no earlier than a session
//! timeout after it last heard from it, and the next owner waits out the
//! fence after that, by when every attempt started under the old proof has
//! passed its deadline.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Async commits awaiting their result, at most (a commit past it is not
/// tracked, which only makes the proof older).
const MAX_PENDING_COMMITS: usize = 1024;

/// Far below the 1.5 s gap that counts as a freeze, and rare enough to cost
/// nothing measurable (50 wake-ups a second showed up in the profile).
const TICK: Duration = Duration::from_millis(100);

#[derive(Debug)]
struct State {
    last_tick: Instant,
    held_until: Instant,
    gaps: u64,
    /// When the newest proof of membership was sent.
    confirmed: Option<Instant>,
    /// Send times of async commits awaiting their result, oldest first.
    commits: VecDeque<Instant>,
}

/// Shared view of whether the process has been running continuously.
#[derive(Debug, Clone)]
pub struct Lease {
    state: Arc<Mutex<State>>,
    max_gap: Duration,
    max_unconfirmed: Duration,
}

impl Lease {
    /// Starts the ticker. A gap longer than `max_gap` holds inserts for
    /// `hold`; so does a proof of membership older than `max_unconfirmed`.
    pub fn start(max_gap: Duration, hold: Duration, max_unconfirmed: Duration) -> Self {
        let now = Instant::now();
        let state = Arc::new(Mutex::new(State {
            last_tick: now,
            held_until: now,
            gaps: 0,
            confirmed: None,
            commits: VecDeque::new(),
        }));
        let weak = Arc::downgrade(&state);
        std::thread::Builder::new()
            .name("sluice-lease".into())
            .spawn(move || {
                while let Some(state) = weak.upgrade() {
                    {
                        let now = Instant::now();
                        let mut s = state.lock().unwrap_or_else(|p| p.into_inner());
                        if now.duration_since(s.last_tick) > max_gap {
                            s.held_until = now + hold;
                            s.gaps += 1;
                            tracing::warn!(
                                gap_ms = now.duration_since(s.last_tick).as_millis() as u64,
                                hold_ms = hold.as_millis() as u64,
                                "process was frozen; holding inserts until group membership is confirmed"
                            );
                        }
                        s.last_tick = now;
                    }
                    drop(state);
                    std::thread::sleep(TICK);
                }
            })
            .ok();
        Self {
            state,
            max_gap,
            max_unconfirmed,
        }
    }

    /// The coordinator knew this member at `sent` (a request sent then was
    /// answered: a sync commit, or the join behind an assignment).
    pub fn confirm(&self, sent: Instant) {
        let mut s = self.lock();
        s.confirmed = s.confirmed.max(Some(sent));
    }

    /// How often the proof should be renewed: a third of its life, so that
    /// a slow commit or a failed one leaves time for the next.
    pub fn renew_every(&self) -> Duration {
        self.max_unconfirmed / 3
    }

    /// An async commit awaits its result. One that waited past a lease's
    /// life is given up (it proves nothing any more), so commits go on.
    pub fn commit_in_flight(&self) -> bool {
        let mut s = self.lock();
        while s
            .commits
            .front()
            .is_some_and(|sent| sent.elapsed() > self.max_unconfirmed)
        {
            s.commits.pop_front();
        }
        !s.commits.is_empty()
    }

    /// An async offset commit is being sent now.
    pub fn commit_sent(&self) {
        let mut s = self.lock();
        if s.commits.len() < MAX_PENDING_COMMITS {
            s.commits.push_back(Instant::now());
        }
    }

    /// The result of the oldest async commit still awaited. A success proves
    /// membership as of the oldest send time awaited: never later than the
    /// commit's own (librdkafka may also report sync commits here, which
    /// were sent later still).
    pub fn commit_done(&self, ok: bool) {
        let mut s = self.lock();
        if let Some(sent) = s.commits.pop_front() {
            if ok {
                s.confirmed = s.confirmed.max(Some(sent));
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How long to wait before an insert may start; zero if it may start now.
    pub fn wait_needed(&self) -> Duration {
        let now = Instant::now();
        let s = self.lock();
        if now.duration_since(s.last_tick) > self.max_gap {
            // The ticker has not run since the freeze: it will set the hold.
            return TICK;
        }
        if s.confirmed
            .is_none_or(|c| now.saturating_duration_since(c) >= self.max_unconfirmed)
        {
            // No recent word from the coordinator: wait for the next commit.
            return TICK;
        }
        s.held_until.saturating_duration_since(now)
    }

    /// Waits until an insert may start.
    pub async fn ready(&self) {
        let since = Instant::now();
        let mut warned = false;
        loop {
            let wait = self.wait_needed();
            if wait.is_zero() {
                return;
            }
            if !warned && since.elapsed() > self.max_unconfirmed {
                warned = true;
                tracing::warn!(
                    waited_ms = since.elapsed().as_millis() as u64,
                    "inserts held: no recent word from the group coordinator (an accepted offset commit)"
                );
            }
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(max_unconfirmed: Duration) -> Lease {
        Lease::start(Duration::from_secs(60), Duration::ZERO, max_unconfirmed)
    }

    #[test]
    fn no_insert_without_word_from_the_coordinator() {
        let l = lease(Duration::from_secs(5));
        assert!(!l.wait_needed().is_zero(), "never confirmed");
        l.confirm(Instant::now());
        assert!(l.wait_needed().is_zero());
        // A proof older than the bound is no proof.
        let l = lease(Duration::from_millis(50));
        l.confirm(Instant::now());
        std::thread::sleep(Duration::from_millis(80));
        assert!(!l.wait_needed().is_zero());
    }

    #[test]
    fn a_commit_proves_membership_from_the_oldest_send_awaited() {
        let l = lease(Duration::from_millis(300));
        l.commit_sent();
        std::thread::sleep(Duration::from_millis(200));
        l.commit_sent();
        // One success: counted from the first send, 200 ms ago.
        l.commit_done(true);
        assert!(l.wait_needed().is_zero());
        std::thread::sleep(Duration::from_millis(150));
        assert!(!l.wait_needed().is_zero(), "the proof is 350 ms old");
        // A failure proves nothing; the queue is empty after it.
        l.commit_done(false);
        l.commit_done(true);
        assert!(!l.wait_needed().is_zero());
    }
}
