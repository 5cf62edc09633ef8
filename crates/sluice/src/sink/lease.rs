//! Fencing by time: may this process write a partition right now?
//!
//! Kafka cannot fence a write into ClickHouse, and a member cut off from
//! the group coordinator (or frozen, or stuck in a rebalance) may never
//! hear that its partitions moved. So a writer holds a lease per partition
//! and stops on its own clock:
//!
//! - The lease starts from the read that last showed this process in the
//!   register of owners ([`super::owners`]) when the partition was claimed
//!   ([`Lease::hold`]), and lasts [`crate::config::Config::lease`].
//! - [`renew`] reads the register every quarter of the lease. A partition
//!   still this process's gets its lease extended from the moment the read
//!   was *sent*; one that is someone else's (or clean) is taken: its lease
//!   ends at once and the consumer thread gives it up ([`Event::Taken`]).
//!   One the broker forgot (offset retention) is written again; the next
//!   read renews it.
//! - An insert attempt starts, and a commit is sent, only under a live
//!   lease. Unreachable coordinator, frozen process, lost partition: the
//!   reads stop succeeding and the lease runs out.
//!
//! A new owner claims the partition (writes itself into the register)
//! before its fence, and its fence lasts `2 × insert_timeout + lease + 5 s`: every
//! attempt this process started under a lease read before the claim has
//! ended by then, on the server's clock (see [`super::handoff`]).

use super::event::Event;
use super::owners::{Key, Owner, Owners};
use std::collections::HashMap;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone, Copy)]
struct Held {
    generation: u64,
    until: Instant,
    /// Renewals sent before this do not count ([`Lease::suspect`]).
    suspect_since: Option<Instant>,
    /// Revoked, its inserts finishing: never renewed, it just runs out
    /// ([`Lease::leave`]).
    leaving: bool,
}

/// The leases of this process's active partitions.
#[derive(Debug, Clone)]
pub struct Lease {
    held: Arc<Mutex<HashMap<Key, Held>>>,
    term: Duration,
}

impl Lease {
    pub fn new(term: Duration) -> Self {
        Self {
            held: Arc::default(),
            term,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Held>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `key` (this `generation` of it) is ours since a read of the register
    /// sent at `sent`.
    pub fn hold(&self, key: Key, generation: u64, sent: Instant) {
        let until = sent + self.term;
        self.lock().insert(
            key,
            Held {
                generation,
                until,
                suspect_since: None,
                leaving: false,
            },
        );
    }

    /// `key` is ours no more (revoked, lost, taken).
    pub fn release(&self, key: Key) {
        self.lock().remove(&key);
    }

    /// This generation of `key` was revoked and is finishing its inserts:
    /// its lease is no longer renewed (whatever the register says) and runs
    /// out, so the partition can be marked clean if they end before then.
    pub fn leave(&self, key: Key, generation: u64) {
        if let Some(h) = self
            .lock()
            .get_mut(&key)
            .filter(|h| h.generation == generation)
        {
            h.leaving = true;
        }
    }

    /// Ends the lease of this generation of `key`; false if it had none.
    pub fn give_up(&self, key: Key, generation: u64) -> bool {
        let mut held = self.lock();
        if held.get(&key).is_some_and(|h| h.generation == generation) {
            held.remove(&key);
            return true;
        }
        false
    }

    /// A read sent at `sent` found us in the register for `key`.
    fn renew(&self, key: Key, generation: u64, sent: Instant) {
        if let Some(h) = self.lock().get_mut(&key) {
            if h.generation == generation && !h.leaving && h.suspect_since.is_none_or(|s| sent >= s)
            {
                h.until = h.until.max(sent + self.term);
                h.suspect_since = None;
            }
        }
    }

    /// Whether this generation of `key` may write right now.
    pub fn live(&self, key: Key, generation: u64) -> bool {
        self.until(key, generation).is_some()
    }

    /// When the live lease of this generation of `key` ends; `None` if it
    /// has none.
    pub fn until(&self, key: Key, generation: u64) -> Option<Instant> {
        self.lock()
            .get(&key)
            .filter(|h| h.generation == generation && Instant::now() < h.until)
            .map(|h| h.until)
    }

    /// Ends the lease of this generation of `key` until a renewal read sent
    /// from now on confirms it: our clock may not be trusted.
    pub fn suspect(&self, key: Key, generation: u64) {
        if let Some(h) = self.lock().get_mut(&key) {
            if h.generation == generation {
                h.until = h.until.min(Instant::now());
                h.suspect_since = Some(Instant::now());
            }
        }
    }

    /// Waits until this generation of `key` may write. It may never: the
    /// caller also waits for the partition to be given up.
    pub async fn ready(&self, key: Key, generation: u64) {
        while !self.live(key, generation) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn snapshot(&self) -> Vec<(Key, u64, bool)> {
        self.lock()
            .iter()
            .map(|(k, h)| (*k, h.generation, h.leaving))
            .collect()
    }
}

/// Keeps the leases of `lease` fresh until `stopping`: see the module
/// header. `me` is this process's id in the register.
pub(super) async fn renew(
    lease: Lease,
    owners: Owners,
    me: u64,
    tx: mpsc::Sender<Event>,
    stopping: CancellationToken,
) {
    let every = lease.term / 4;
    let mut failing = false;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stopping.cancelled() => return,
        }
        let held = lease.snapshot();
        if held.is_empty() {
            continue;
        }
        let (o, keys, timeout) = (
            owners.clone(),
            held.iter().map(|(k, ..)| *k).collect::<Vec<_>>(),
            lease.term,
        );
        let sent = Instant::now();
        let answer = tokio::task::spawn_blocking(move || o.read(keys, timeout)).await;
        let found = match answer {
            Ok(Ok(found)) => found,
            Ok(Err(e)) => {
                if !failing {
                    tracing::warn!(error = %e, "cannot read the register of owners; inserts stop when the lease runs out");
                }
                failing = true;
                continue;
            }
            Err(_) => continue,
        };
        if failing {
            tracing::info!("the register of owners is readable again");
            failing = false;
        }
        let mut forgotten = Vec::new();
        for (key, generation, leaving) in held {
            if leaving {
                continue;
            }
            match found.get(&key) {
                None => {}
                Some(Owner::Process(id)) if *id == me => lease.renew(key, generation, sent),
                Some(Owner::Nobody) if lease.live(key, generation) => forgotten.push(key),
                Some(Owner::Nobody) => {}
                Some(other) if lease.give_up(key, generation) => {
                    tracing::warn!(
                        partition = %owners.name(key),
                        owner = ?other,
                        "another owner claimed the partition; this process stops writing it"
                    );
                    let _ = tx.send(Event::Taken {
                        key,
                        generation,
                        by: *other,
                    });
                }
                Some(_) => {}
            }
        }
        if !forgotten.is_empty() {
            let o = owners.clone();
            if let Ok(Err(e)) = tokio::task::spawn_blocking(move || o.write(forgotten, me)).await {
                tracing::warn!(error = %e, "cannot write this process into the register again");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_runs_from_the_send_time_of_its_last_confirmation() {
        let lease = Lease::new(Duration::from_secs(10));
        let key = (0, 3);
        assert!(!lease.live(key, 1));
        let long_ago = Instant::now() - Duration::from_secs(11);
        lease.hold(key, 1, long_ago);
        assert!(!lease.live(key, 1), "expired");
        lease.renew(key, 2, Instant::now());
        assert!(
            !lease.live(key, 1),
            "another generation's read renews nothing"
        );
        lease.renew(key, 1, Instant::now());
        assert!(lease.live(key, 1));
        assert!(!lease.live(key, 2));
        lease.renew(key, 1, long_ago);
        assert!(lease.live(key, 1), "an older read never shortens it");
        let before = Instant::now();
        lease.suspect(key, 1);
        assert!(!lease.live(key, 1), "a suspect lease ends at once");
        lease.renew(key, 1, before);
        assert!(
            !lease.live(key, 1),
            "a read sent before the suspicion renews nothing"
        );
        lease.renew(key, 1, Instant::now());
        assert!(lease.live(key, 1));
        lease.release(key);
        assert!(!lease.live(key, 1));
        lease.renew(key, 1, Instant::now());
        assert!(!lease.live(key, 1), "a released lease is not renewed");
    }
}
