//! Fencing by time: may this process start an insert right now?
//!
//! Kafka cannot fence a write into ClickHouse, so sluice fences by time, as
//! leases do. A ticker thread notes the monotonic clock every 100
//! milliseconds. If the process was frozen (SIGSTOP, a VM pause, a stalled
//! host), the ticker sees the gap when it wakes and inserts are held for long
//! enough that librdkafka can learn whether the group moved on and revoke
//! the partitions first. An insert task that runs before the ticker wakes
//! sees a stale tick and waits too, so there is no race on wake-up.

use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Far below the 1.5 s gap that counts as a freeze, and rare enough to cost
/// nothing measurable (50 wake-ups a second showed up in the profile).
const TICK: Duration = Duration::from_millis(100);

#[derive(Debug)]
struct State {
    last_tick: Instant,
    held_until: Instant,
    gaps: u64,
}

/// Shared view of whether the process has been running continuously.
#[derive(Debug, Clone)]
pub struct Lease {
    state: Arc<Mutex<State>>,
    max_gap: Duration,
}

impl Lease {
    /// Starts the ticker. A gap longer than `max_gap` holds inserts for `hold`.
    pub fn start(max_gap: Duration, hold: Duration) -> Self {
        let now = Instant::now();
        let state = Arc::new(Mutex::new(State {
            last_tick: now,
            held_until: now,
            gaps: 0,
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
        Self { state, max_gap }
    }

    /// How long to wait before an insert may start; zero if it may start now.
    pub fn wait_needed(&self) -> Duration {
        let now = Instant::now();
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if now.duration_since(s.last_tick) > self.max_gap {
            // The ticker has not run since the freeze: it will set the hold.
            return TICK;
        }
        s.held_until.saturating_duration_since(now)
    }

    /// Waits until an insert may start.
    pub async fn ready(&self) {
        loop {
            let wait = self.wait_needed();
            if wait.is_zero() {
                return;
            }
            tokio::time::sleep(wait).await;
        }
    }
}
