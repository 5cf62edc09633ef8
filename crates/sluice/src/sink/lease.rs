//! Fencing by time: may this process write a partition right now?
//!
//! Kafka cannot fence a write into ClickHouse, and a member cut off from
//! the group coordinator (or frozen, or stuck in a rebalance) may never
//! hear that its partitions moved. So a writer holds a lease per partition
//! and stops on its own clock:
//!
//! - The lease starts from the read that last showed this process in the
//!   register of owners ([`crate::owners`]) when the partition was claimed
//!   ([`Lease::hold`]), and lasts [`crate::config::Config::lease`].
//! - [`renew`] reads the register every quarter of the lease. A partition
//!   still this process's gets its lease extended from the moment the read
//!   was *sent*; one that is someone else's (or clean) is taken: its lease
//!   ends at once and the consumer thread gives it up ([`Event::Taken`]).
//!   One the broker forgot (offset retention) is written again; the next
//!   read renews it. A write not acknowledged within the lease may have
//!   landed over a new owner's claim: the partition is claimed again.
//! - An insert attempt starts, and a commit is sent, only under a live
//!   lease. Unreachable coordinator, frozen process, lost partition: the
//!   reads stop succeeding and the lease runs out.
//!
//! A new owner claims the partition (writes itself into the register)
//! before its fence, and its fence lasts `2 × insert_timeout + lease + 5 s`: every
//! attempt this process started under a lease read before the claim has
//! ended by then, on the server's clock (see [`super::handoff`]).
//!
//! The decisions are [`sluice_protocol::lease`]'s; here are the table shared on
//! this host's monotonic clock and the task that reads the register.

use super::event::Event;
use crate::owners::{Key, Owner, Owners};
use sluice_protocol::lease::{on_register, Leases, Renewal};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// The leases of this process's active partitions ([`Leases`] on this
/// host's monotonic clock), shared by the consumer thread, the insert tasks
/// and [`renew`].
#[derive(Debug, Clone)]
pub(crate) struct Lease {
    held: Arc<Mutex<Leases<Key, Instant>>>,
    /// The server clock's jumps ahead of ours seen so far.
    jumps: Arc<Mutex<u64>>,
}

impl Lease {
    pub(crate) fn new(term: Duration) -> Self {
        Self {
            held: Arc::new(Mutex::new(Leases::new(term))),
            jumps: Arc::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Leases<Key, Instant>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// See [`Leases::hold`].
    pub(crate) fn hold(&self, key: Key, generation: u64, sent: Instant) {
        self.lock().hold(key, generation, sent);
    }

    /// See [`Leases::leave`].
    pub(crate) fn leave(&self, key: Key, generation: u64) {
        self.lock().leave(key, generation);
    }

    /// See [`Leases::give_up`].
    pub(crate) fn give_up(&self, key: Key, generation: u64) -> bool {
        self.lock().give_up(key, generation)
    }

    /// Whether this generation of `key` may write right now.
    pub(crate) fn live(&self, key: Key, generation: u64) -> bool {
        self.lock().live(key, generation, Instant::now())
    }

    /// When the live lease of this generation of `key` ends; `None` if it
    /// has none.
    pub(crate) fn until(&self, key: Key, generation: u64) -> Option<Instant> {
        self.lock().until(key, generation, Instant::now())
    }

    /// Ends the lease of this generation of `key` until a renewal read sent
    /// from now on confirms it: our clock may not be trusted.
    pub(crate) fn suspect(&self, key: Key, generation: u64) {
        self.lock().suspect(key, generation, Instant::now());
    }

    /// Suspects every lease if the server's clock ran ahead of ours since
    /// the last call (`jumps`: [`crate::ch::ClickHouse::clock_jumps`]);
    /// true if it did.
    pub(crate) fn follow_clock(&self, jumps: u64) -> bool {
        let mut seen = self.jumps.lock().unwrap_or_else(|p| p.into_inner());
        if jumps <= *seen {
            return false;
        }
        *seen = jumps;
        self.lock().suspect_all(Instant::now());
        tracing::warn!(
            "ClickHouse's clock ran ahead of ours (a suspended host?): every lease waits for a renewal read sent from now on"
        );
        true
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
    let term = lease.lock().term();
    let every = term / 4;
    let mut failing = false;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stopping.cancelled() => return,
        }
        let held: Vec<(Key, u64, bool)> = lease.lock().held().collect();
        if held.is_empty() {
            continue;
        }
        let (o, keys) = (
            owners.clone(),
            held.iter().map(|(k, ..)| *k).collect::<Vec<_>>(),
        );
        let sent = Instant::now();
        let answer = tokio::task::spawn_blocking(move || o.read(keys, term)).await;
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
            let live = lease.live(key, generation);
            match on_register(found.get(&key).copied(), me, live, leaving) {
                Renewal::Renew => lease.lock().renew(key, generation, sent),
                Renewal::Rewrite => forgotten.push((key, generation)),
                Renewal::Taken(other) if lease.give_up(key, generation) => {
                    tracing::warn!(
                        partition = %owners.name(key),
                        owner = ?other,
                        "another owner claimed the partition; this process stops writing it"
                    );
                    let _ = tx.send(Event::Taken {
                        key,
                        generation,
                        by: other,
                    });
                }
                Renewal::Reclaim => reclaim(&lease, &owners, &tx, key, generation),
                Renewal::Taken(_) | Renewal::Keep => {}
            }
        }
        rewrite(&lease, &owners, me, &tx, forgotten).await;
    }
}

/// Writes this process back into the register for partitions the broker
/// forgot while their leases are live. A write acknowledged after its
/// lease ended may have landed over a new owner's claim (this process was
/// stopped between the read and the write): the lease is given up and
/// the partition claimed again, with a fence. One acknowledged in time
/// landed before any new owner's fence could end (that fence outlasts the
/// lease), so that owner reads this process and claims again. A write that
/// failed may land later: it counts as late.
async fn rewrite(
    lease: &Lease,
    owners: &Owners,
    me: u64,
    tx: &mpsc::Sender<Event>,
    forgotten: Vec<(Key, u64)>,
) {
    let (forgotten, ended): (Vec<_>, Vec<_>) = forgotten
        .into_iter()
        .partition(|&(k, g): &(Key, u64)| lease.live(k, g));
    for (key, generation) in ended {
        reclaim(lease, owners, tx, key, generation);
    }
    if forgotten.is_empty() {
        return;
    }
    let (o, keys) = (
        owners.clone(),
        forgotten.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
    );
    let written = match tokio::task::spawn_blocking(move || o.write(keys, me)).await {
        Ok(Ok(())) => true,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "cannot write this process into the register again");
            false
        }
        Err(_) => false,
    };
    for (key, generation) in forgotten {
        // A failed write may still land, later.
        if !written || !lease.live(key, generation) {
            reclaim(lease, owners, tx, key, generation);
        }
    }
}

/// Gives up a partition whose register entry the broker forgot and whose
/// lease ended (or whose rewrite was not acknowledged within it): someone
/// may have claimed it meanwhile. The consumer thread claims it again,
/// with a fence.
fn reclaim(lease: &Lease, owners: &Owners, tx: &mpsc::Sender<Event>, key: Key, generation: u64) {
    if lease.give_up(key, generation) {
        tracing::warn!(
            partition = %owners.name(key),
            "the register forgot this process and its lease ended; it claims the partition again"
        );
        let _ = tx.send(Event::Taken {
            key,
            generation,
            by: Owner::Nobody,
        });
    }
}
