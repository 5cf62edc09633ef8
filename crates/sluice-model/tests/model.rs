//! The protocol, checked: the product's rules keep every property within
//! the bounds below, and each unsafe rule the protocol replaced breaks one,
//! with the trace printed. `make model` runs deeper bounds.

use sluice_model::{
    trace, Bounds, ClaimConfirm, ClaimYield, DlqConfirm, Fair, KeyDrop, LateGuard, LostSlice,
    RefusedInsert, RejectedKey, RewriteCheck, Rules, Settings, Sluice, Start, Struck, UnbackedRows,
};
use stateright::{Checker, HasDiscoveries, Model};
use std::time::{Duration, Instant};

const TWICE: &str = "no offset is stored twice";
const COMMIT: &str = "the commit passes only offsets in the table or the DLQ";
const KEY_DROP: &str = "a key-dedup drop the commit passes has its key in the table";
const KEY_TWICE: &str = "no key is stored twice";
const DONE: &str =
    "every record is stored, in the DLQ or a duplicate of a stored key, and committed";

/// `records` records, `secs` seconds, and the faults named.
fn bounds(records: i64, secs: u64, faults: [u8; 4]) -> Bounds {
    let [rebalances, crashes, lost_commits, resets] = faults;
    Bounds {
        records,
        max_rows: records as usize,
        horizon: Duration::from_secs(secs),
        rebalances,
        crashes,
        lost_commits,
        resets,
        ..Bounds::CI
    }
}

/// Checks every interleaving within `b` under the product's rules.
fn holds(what: &str, b: Bounds) {
    let t0 = Instant::now();
    let m = Sluice::new(Rules::SAFE, b);
    let c = m.clone().checker().threads(2).spawn_bfs().join();
    eprintln!(
        "{what}: {} states ({} unique), depth {}, {:.1?}",
        c.state_count(),
        c.unique_state_count(),
        c.max_depth(),
        t0.elapsed()
    );
    for p in [TWICE, COMMIT, KEY_DROP, KEY_TWICE, RECOVERS] {
        if let Some(path) = c.discovery(p) {
            panic!("{what}: {p} fails:\n{}", trace(&m, &path));
        }
    }
    assert!(c.discovery(DONE).is_some(), "{what}: never done");
    let reached = "the recovery time after the last fault is reached";
    assert!(
        c.discovery(reached).is_some(),
        "{what}: liveness never checked"
    );
}

/// Checks `m` breadth first until `property` fails; returns the trace.
fn breaks(m: Sluice, property: &'static str) -> String {
    counterexample(m, property, false)
}

/// Checks `m` until `property` fails, breadth first (the shortest trace)
/// or, where that search is too wide for CI, depth first within 30 M
/// states; returns the trace.
fn counterexample(m: Sluice, property: &'static str, depth_first: bool) -> String {
    let checker = m
        .clone()
        .checker()
        .threads(2)
        .target_state_count(30_000_000)
        .finish_when(HasDiscoveries::AnyFailures);
    let (path, states) = match depth_first {
        true => {
            let c = checker.spawn_dfs().join();
            (c.discovery(property), c.state_count())
        }
        false => {
            let c = checker.spawn_bfs().join();
            (c.discovery(property), c.state_count())
        }
    };
    let path = path.unwrap_or_else(|| {
        panic!(
            "{:?}: no counterexample within the bounds ({states} states)",
            m.rules
        )
    });
    let t = trace(&m, &path);
    eprintln!("{:?} breaks {property:?} ({states} states):\n{t}", m.rules);
    t
}

#[test]
fn a_rebalance_with_a_fence_keeps_exactly_once() {
    holds("one rebalance, 1 record, 8 s", bounds(1, 8, [1, 0, 0, 0]));
}

#[test]
fn new_batch_boundaries_keep_exactly_once() {
    holds("one rebalance, 2 records, 6 s", bounds(2, 6, [1, 0, 0, 0]));
}

#[test]
fn a_crash_keeps_exactly_once() {
    holds("a rebalance and a crash, 7 s", bounds(1, 7, [1, 1, 0, 0]));
}

#[test]
fn a_lost_commit_keeps_exactly_once() {
    holds(
        "a rebalance and a lost commit, 7 s",
        bounds(1, 7, [1, 0, 1, 0]),
    );
}

#[test]
fn a_reset_connection_keeps_exactly_once() {
    holds("a rebalance and a reset, 7 s", bounds(1, 7, [1, 0, 0, 1]));
}

#[test]
fn a_forgotten_register_entry_keeps_exactly_once() {
    let b = Bounds {
        forgets: 1,
        ..bounds(1, 7, [1, 0, 0, 0])
    };
    holds("a rebalance and a forgotten register entry, 7 s", b);
}

#[test]
fn two_clean_claimers_keep_exactly_once() {
    let b = Bounds {
        start: Start::CleanToBoth,
        ..bounds(1, 7, [0, 0, 0, 0])
    };
    holds("two claimers of a clean partition, 7 s", b);
}

#[test]
fn records_for_the_dlq_keep_exactly_once() {
    let b = Bounds {
        bad: 0b01,
        ..bounds(2, 5, [1, 1, 0, 0])
    };
    holds("a record for the DLQ, a rebalance and a crash, 5 s", b);
}

#[test]
fn a_server_that_takes_fewer_rows_per_insert_keeps_exactly_once() {
    // Inserts refused for too many table partitions after storing none or
    // some of their rows: the batch goes in shares of half as many rows.
    let b = Bounds {
        refusals: 2,
        ..bounds(3, 8, [0, 0, 0, 0])
    };
    holds("two refusals, 3 records, 8 s", b);
}

#[test]
fn taking_a_refusal_for_an_insert_that_never_started_stores_rows_twice() {
    let rules = Rules {
        refused: RefusedInsert::NothingStored,
        ..Rules::SAFE
    };
    let b = Bounds {
        refusals: 1,
        ..bounds(3, 4, [0, 0, 0, 0])
    };
    let t = breaks(Sluice::new(rules, b), TWICE);
    assert!(t.contains("then refused"), "{t}");
}

#[test]
fn a_second_server_a_second_behind_keeps_exactly_once() {
    let b = Bounds {
        servers: 2,
        ..bounds(1, 6, [0, 0, 0, 1])
    };
    holds("two servers 1 s apart and a reset, 6 s", b);
}

#[test]
fn a_deadline_on_the_clients_clock_lets_a_late_insert_in() {
    let rules = Rules {
        late: LateGuard::ClientTimeout,
        ..Rules::SAFE
    };
    breaks(Sluice::new(rules, bounds(1, 6, [0, 0, 0, 0])), TWICE);
}

#[test]
fn going_active_on_the_claims_write_lets_two_owners_write() {
    let rules = Rules {
        claim: ClaimConfirm::TrustWrite,
        ..Rules::SAFE
    };
    breaks(Sluice::new(rules, bounds(1, 6, [1, 0, 0, 0])), TWICE);
}

#[test]
fn the_reset_policy_after_a_lost_commit_inserts_again() {
    let rules = Rules {
        unbacked: UnbackedRows::ResetPolicy,
        ..Rules::SAFE
    };
    breaks(Sluice::new(rules, bounds(1, 8, [1, 0, 1, 0])), TWICE);
}

/// The fence must cover the previous owner's last inserts, not just its
/// lease. (At one-second steps an insert runs for less than a step, so the
/// model cannot tell a fence one second short from a full one.)
#[test]
fn a_fence_of_just_the_lease_lets_the_old_owners_insert_in() {
    let mut m = Sluice::new(Rules::SAFE, bounds(1, 8, [1, 0, 0, 0]));
    m.settings = Settings::with_slack(-2);
    assert_eq!(m.settings.fence_wait, m.settings.lease);
    breaks(m, TWICE);
}

#[test]
fn a_clean_claim_read_back_as_soon_as_it_may_land_lets_two_owners_write() {
    let b = Bounds {
        start: Start::CleanToBoth,
        ..bounds(1, 7, [0, 0, 0, 0])
    };
    let mut m = Sluice::new(Rules::SAFE, b);
    m.settings.settle_wait = sluice_protocol::timing::SETTLE;
    breaks(m, TWICE);
}

#[test]
fn trusting_a_late_rewrite_of_the_register_brings_an_old_owner_back() {
    let rules = Rules {
        rewrite: RewriteCheck::None,
        ..Rules::SAFE
    };
    let b = Bounds {
        forgets: 1,
        ..bounds(1, 9, [1, 0, 0, 0])
    };
    breaks(Sluice::new(rules, b), TWICE);
}

#[test]
fn a_batch_done_before_the_dlq_acknowledged_commits_past_a_lost_record() {
    let rules = Rules {
        dlq: DlqConfirm::Queued,
        ..Rules::SAFE
    };
    let b = Bounds {
        bad: 0b01,
        ..bounds(1, 4, [0, 0, 0, 0])
    };
    breaks(Sluice::new(rules, b), COMMIT);
}

/// Servers behind one address disagree by up to 1 s: a fence that ends as
/// soon as one server's clock is past the deadline lets the attempt start
/// on a server whose clock is behind.
#[test]
fn a_fence_without_a_clock_margin_lets_an_insert_in_on_a_slower_server() {
    let b = Bounds {
        servers: 2,
        ..bounds(1, 5, [0, 0, 0, 0])
    };
    let mut m = Sluice::new(Rules::SAFE, b);
    m.settings.clock_margin_ms = 0;
    breaks(m, TWICE);
}

/// `records` records with one key, under key dedup; ClickHouse rejects the
/// first. In one batch the others are written on condition and the next one
/// is sent once the first is rejected; in several, the window forgets the
/// rejected copy; a new owner rebuilds its window from the table.
fn one_key_first_rejected(records: i64, secs: u64, faults: [u8; 4]) -> Bounds {
    Bounds {
        keys: &[7; 3][..records as usize],
        rejected: 0b001,
        ..bounds(records, secs, faults)
    }
}

#[test]
fn key_dedup_with_a_rejected_copy_keeps_exactly_once() {
    holds(
        "key dedup, 3 records of one key, the first rejected, a rebalance, 4 s",
        one_key_first_rejected(3, 4, [1, 0, 0, 0]),
    );
}

/// Dropping a record as soon as the window has seen its key: the copy it
/// saw is still in flight, and ClickHouse rejects it.
#[test]
fn dropping_a_key_whose_copy_is_in_flight_loses_the_key() {
    drops_a_key_with_no_copy_stored(Rules {
        key_drop: KeyDrop::AnyCopy,
        ..Rules::SAFE
    });
}

/// Remembering the key of a rejected row: the next record with that key is
/// dropped though no copy of it is stored.
#[test]
fn remembering_a_rejected_copy_drops_the_next_one() {
    drops_a_key_with_no_copy_stored(Rules {
        rejected_key: RejectedKey::Keep,
        ..Rules::SAFE
    });
}

/// With `rules`, two records of one key whose first copy ClickHouse rejects
/// end with the commit past a drop whose key is not in the table.
fn drops_a_key_with_no_copy_stored(rules: Rules) {
    let m = Sluice::new(rules, one_key_first_rejected(2, 4, [0, 0, 0, 0]));
    let t = breaks(m, KEY_DROP);
    assert!(t.contains("rejected at offset 0"), "{t}");
}

const RECOVERS: &str =
    "once faults stop, every record lands and is committed within the recovery time";

/// Liveness: `stalls` unfair seconds, and every record landed and committed
/// within `recovery` of the last fault.
fn fair(b: Bounds, stalls: u8, recovery: u64) -> Bounds {
    Bounds {
        fair: Some(Fair {
            stalls,
            recovery: Duration::from_secs(recovery),
        }),
        ..b
    }
}

#[test]
fn once_faults_stop_every_record_lands_within_four_fences() {
    // The fence is 5 s: a claim that loses to a claimer the group then
    // revoked yields two fences after a settle, then fences.
    let b = fair(bounds(2, 40, [1, 1, 0, 0]), 1, 20);
    holds("liveness: a rebalance, a crash, a stall, 40 s", b);
}

#[test]
fn two_members_given_one_partition_take_turns() {
    let b = Bounds {
        start: Start::SharedByBoth,
        ..fair(bounds(2, 45, [0, 0, 0, 0]), 1, 30)
    };
    holds("liveness: a partition assigned to both, a stall, 45 s", b);
}

#[test]
fn claiming_back_at_once_lets_two_members_given_one_partition_stall() {
    let rules = Rules {
        claim_yield: ClaimYield::AtOnce,
        ..Rules::SAFE
    };
    let b = Bounds {
        start: Start::SharedByBoth,
        ..fair(bounds(2, 45, [0, 0, 0, 0]), 1, 30)
    };
    let t = breaks(Sluice::new(rules, b), RECOVERS);
    // A livelock: nothing is ever stored.
    assert!(!t.contains("Store("), "{t}");
}

/// Two partitions of `records` records each, cut into batches that may
/// hold rows of both.
fn two_partitions(records: i64, secs: u64, faults: [u8; 4]) -> Bounds {
    Bounds {
        partitions: 2,
        ..bounds(records, secs, faults)
    }
}

/// A batch of both partitions whose insert's outcome is unknown (a reset)
/// is fenced, reconciled by `(partition, offset)` and completed with only
/// the rows missing, in either partition; each partition commits its own.
#[test]
fn a_batch_across_two_partitions_keeps_exactly_once() {
    holds(
        "two partitions, a reset, 6 s",
        two_partitions(1, 6, [0, 0, 0, 1]),
    );
}

/// One process, a batch of both partitions, a rebalance that revokes
/// either of them (the first, whose rows come first in the batch, or the
/// last: `Struck::Any`) while the batch may be in flight, and a crash
/// (between the two partitions' commits among other moments): each
/// partition's commit still passes only rows in the table. (With two
/// processes, see the next test.)
#[test]
fn a_partition_revoked_from_a_batch_of_two_keeps_exactly_once() {
    let b = Bounds {
        processes: 1,
        struck: Struck::Any,
        ..two_partitions(1, 5, [1, 1, 0, 0])
    };
    holds(
        "one process, two partitions, a rebalance of either and a crash, 5 s",
        b,
    );
}

/// A batch across two partitions that the server takes in shares (a
/// refusal for too many table partitions, after storing none or some of
/// the rows): a partition whose rows a stored share holds settles ahead of
/// the rest (`settle_early`, `sink/writer.rs`), its frontier moves and,
/// revoked meanwhile, it hands off while the other's rows are still on
/// their way.
#[test]
fn a_partition_settled_ahead_of_its_batch_keeps_exactly_once() {
    let b = Bounds {
        processes: 1,
        refusals: 1,
        struck: Struck::Any,
        ..two_partitions(1, 5, [1, 0, 0, 0])
    };
    holds(
        "one process, two partitions, a refusal and a rebalance of either, 5 s",
        b,
    );
}

/// One process, a batch of both partitions, a rebalance and a lost commit,
/// each of either partition (`Struck::Any`, so on different partitions
/// too): the process hands a revoked partition off (cleanly, or by letting
/// its lease run out) while the other's rows may be in flight, and claims
/// it again with the commit read before or after it was lost. A claim
/// with no commit in hand plans from what the table holds. At 4 s the
/// claim after a clean hand-off (a 3 s settle) goes active and inserts;
/// a fenced one (5 s) does not. `UnbackedRows::ResetPolicy` (start at the
/// reset position when nothing is committed) breaks it on the first
/// partition, which `Struck::Last` never strikes: a batch of both is
/// stored at 1 s, the revoked first partition settles (commit, clean
/// mark), its commit is lost, and the claim back, with nothing committed,
/// inserts its offset 0 again at 4 s (2.7 M states, measured 2026-12-07).
#[test]
fn a_lost_commit_of_either_of_two_partitions_keeps_exactly_once() {
    let b = Bounds {
        processes: 1,
        struck: Struck::Any,
        ..two_partitions(1, 4, [1, 0, 1, 0])
    };
    holds(
        "one process, two partitions, a rebalance and a lost commit of either, 4 s",
        b,
    );
}

/// One process, a batch of both partitions, a rebalance and a forgotten
/// register entry, each of either partition (`Struck::Any`): a renewal
/// that finds one partition's entry forgotten writes the process back
/// and reads nothing until that write is acknowledged, so the other
/// partition's lease may run out with its rows in the batch; an
/// acknowledgement after the lease gives the partition up (its rows leave
/// the batch); a forgotten clean mark makes the claim back fence instead
/// of settle. At 3 s the claim after a clean hand-off (a 3 s settle from
/// 0 s) goes active and inserts; at 4 s the search is 11.5 M states
/// (2.8 M unique, 35 s alone; `make model` runs it).
/// `ClaimConfirm::TrustWrite` (active on the claim's write) breaks it:
/// the revoked first partition's insert, sent at 1 s with a deadline at
/// its lease's end, is still on its way when the lease runs out at 2 s;
/// the claim back goes active at once and inserts offset 0, then the old
/// insert arrives within its deadline and stores it too (2.4 M states,
/// measured 2026-12-07).
#[test]
fn a_forgotten_entry_of_either_of_two_partitions_keeps_exactly_once() {
    let b = Bounds {
        processes: 1,
        struck: Struck::Any,
        forgets: 1,
        ..two_partitions(1, 3, [1, 0, 0, 0])
    };
    holds(
        "one process, two partitions, a rebalance and a forgotten entry of either, 3 s",
        b,
    );
}

/// Two processes: process 0 holds both partitions, and a rebalance moves
/// the second to process 1 while process 0's batch may hold rows of both.
/// Process 1 claims it (fencing 5 s: within the horizon it goes active and
/// inserts at 5 s at the earliest), process 0 drops the partition's rows
/// from its batch and goes on with the first partition's: neither
/// partition stores a row twice or commits past a row not stored. The
/// rebalance moves the partition (`Bounds::moves`): a rebalance back to
/// process 0 leaves process 1 idle, which the test above covers.
#[test]
fn a_partition_taken_from_a_batch_of_two_keeps_exactly_once() {
    let b = Bounds {
        moves: true,
        ..two_partitions(1, 5, [1, 0, 0, 0])
    };
    holds("two processes, two partitions, a rebalance, 5 s", b);
}

/// Key dedup over two partitions, each with its own window: two records of
/// one key in each, the first copy of each rejected, one process cutting
/// batches that may hold both partitions' copies (a conditional row per
/// partition, each waiting on its own partition's copy; ClickHouse names
/// the first rejected row of the insert, so the other partition's is
/// rejected by the next attempt), and a reset connection (fenced and
/// reconciled with conditional rows of both partitions). A rebalance (of
/// the one process: its claim's fence outlasts the horizon) costs 3.9 M
/// states at 3 s and adds only the revocation.
#[test]
fn key_dedup_over_two_partitions_keeps_exactly_once() {
    let b = Bounds {
        partitions: 2,
        processes: 1,
        ..one_key_first_rejected(2, 4, [0, 0, 0, 1])
    };
    holds(
        "key dedup, two partitions of 2 records of one key, the first rejected, a reset, 4 s",
        b,
    );
}

/// A batch holding a partition that is taken from its process while its
/// rows are in flight, and that goes on sending them under the leases of
/// the partitions it still holds, stores them beside the new owner's copy.
#[test]
fn keeping_a_lost_partitions_rows_in_the_batch_stores_them_twice() {
    let m = Sluice::new(
        Rules {
            lost_slice: LostSlice::KeepSending,
            ..Rules::SAFE
        },
        two_partitions(1, 8, [1, 0, 0, 0]),
    );
    let t = counterexample(m, TWICE, true);
    assert!(t.contains("Rebalance"), "{t}");
}
