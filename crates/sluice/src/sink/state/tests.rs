//! What the sink decides, without Kafka or ClickHouse: events in, the
//! actions it queues out, each written as a short line
//! (`pause 0 1`, `insert 0:2 1:1`, `commit 0@7`, ...). Every commit asked
//! for is stored; seeks, inserts and preparations end as each test says.

use super::{Record, Sink};
use crate::config::{Config, Overrides, RawConfig};
use crate::owners::{Key, Owner, Owners};
use crate::retry::Delays;
use crate::sink::action::{Action, AfterSeek};
use crate::sink::columns::TableColumns;
use crate::sink::event::{Completion, Event, Outcome, Prepared, Settled};
use crate::sink::lease::Lease;
use crate::sink::schemas::Schemas;
use crate::sink::state::RowChecks;
use crate::sink::writer::{Job, WriterCtx};
use sluice_protocol::resume::{resume_plan, Committed, LogBounds};
use sluice_protocol::{NextOffset, Offset, ResetPolicy};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

const TOPIC: &str = "orders";

/// A sink of one route over `TOPIC`, and what its last calls queued.
struct Bench {
    sink: Sink,
    /// The insert jobs queued and not yet answered, in order.
    jobs: Vec<Job>,
    /// The generation of each partition's last preparation.
    generations: std::collections::HashMap<Key, u64>,
}

async fn bench(delivery: &str) -> Bench {
    let text = format!(
        r#"
        [kafka]
        brokers = "127.0.0.1:9"
        group_id = "g"
        [clickhouse]
        url = "http://127.0.0.1:9"
        [sink]
        delivery = "{delivery}"
        max_batch_rows = 1000
        [[route]]
        topic = "{TOPIC}"
        table = "shop.orders"
        "#
    );
    let cfg: Config = RawConfig::from_toml(&text)
        .and_then(|raw| raw.validate(Overrides::default()))
        .expect("the test's config loads");
    let routes: Vec<Arc<crate::config::Route>> = cfg.routes.iter().cloned().map(Arc::new).collect();
    let ch = crate::ch::ClickHouse::offline(&cfg.clickhouse, cfg.sink.delivery);
    let encoders = cfg
        .routes
        .iter()
        .map(|r| cfg.encoder(r))
        .collect::<Vec<_>>();
    let ctx = Arc::new(WriterCtx {
        ch: ch.clone(),
        lease: Lease::new(cfg.lease()),
        delivery: cfg.sink.delivery,
        permits: Semaphore::new(1),
        dlq: None,
        per_insert: encoders.iter().map(|_| Default::default()).collect(),
        encoders,
    });
    let owners = Owners::new(&cfg.kafka, routes.clone()).expect("a client without a broker");
    let checks = RowChecks {
        schemas: Schemas::new(None, &routes, 1 << 20, 1 << 26),
        columns: TableColumns::read(ch, &routes)
            .await
            .expect("no route reads its table's columns"),
    };
    let sink = Sink::new(
        cfg,
        routes,
        ctx,
        owners,
        7,
        CancellationToken::new(),
        checks,
    );
    Bench {
        sink,
        jobs: Vec::new(),
        generations: Default::default(),
    }
}

impl Bench {
    /// What the sink queued since the last call, a line each; insert jobs
    /// and preparations are kept for the test to answer.
    fn actions(&mut self) -> Vec<String> {
        let mut lines = Vec::new();
        while let Some(a) = self.sink.next_action() {
            lines.push(match a {
                Action::Pause(keys) => format!("pause {}", names(&keys)),
                Action::Resume(keys) => format!("resume {}", names(&keys)),
                Action::Seek { key, offset, then } => {
                    let why = match then {
                        AfterSeek::Activate(_) => "activate",
                        AfterSeek::Unstall => "unstall",
                    };
                    format!("seek {}@{} {why}", key.1, offset.0)
                }
                Action::Commit { offsets, sync } => {
                    let mut list: Vec<String> = offsets
                        .iter()
                        .map(|(k, _, next)| format!("{}@{}", k.1, next.0))
                        .collect();
                    list.sort();
                    // The group stores it.
                    self.sink.on_committed(&offsets);
                    let sync = if sync { " sync" } else { "" };
                    format!("commit {}{sync}", list.join(" "))
                }
                Action::MarkMismatch { keys, .. } => format!("mark-mismatch {}", names(&keys)),
                Action::Insert(job) => {
                    let slices: Vec<String> = job
                        .slices
                        .iter()
                        .map(|s| {
                            let rows = job
                                .batch
                                .rows()
                                .filter(|r| r.partition == s.partition)
                                .count();
                            format!("{}:{rows}", s.partition)
                        })
                        .collect();
                    self.jobs.push(*job);
                    format!("insert {}", slices.join(" "))
                }
                Action::Prepare(p) => {
                    let keys: Vec<Key> = p.parts.values().flatten().map(|(k, _)| *k).collect();
                    for (k, g) in p.parts.values().flatten() {
                        self.generations.insert(*k, *g);
                    }
                    format!("prepare {}", names(&keys))
                }
                Action::RetryPrepared { prepared, .. } => {
                    format!("retry-prepared {}", prepared.key.1)
                }
                Action::MarkClean { keys, wait, .. } => {
                    let wait = if wait { " wait" } else { "" };
                    format!("mark-clean {}{wait}", names(&keys))
                }
            });
        }
        lines
    }

    /// The preparation of `partition` ends: it starts at `start`.
    fn prepared(&mut self, partition: i32, start: i64) {
        let key = (0, partition);
        let plan = resume_plan(
            Committed::At(NextOffset(start)),
            None,
            LogBounds {
                low: NextOffset(0),
                high: NextOffset(1_000),
            },
            ResetPolicy::Earliest,
        );
        self.sink.on_event(Event::Prepared(Prepared {
            key,
            generation: self.generations[&key],
            plan,
            seeds: None,
            confirmed: Instant::now(),
            attempts: 0,
            delays: Delays::new(Duration::from_millis(500)),
        }));
    }

    /// Prepares and activates `partitions` (exactly-once), each from 0;
    /// the group's commit is at the start then.
    fn activate(&mut self, partitions: &[i32]) {
        let keys: Vec<Key> = partitions.iter().map(|p| (0, *p)).collect();
        self.sink.on_assign(&keys);
        self.actions();
        for p in partitions {
            self.prepared(*p, 0);
            self.sought(*p, Ok(()));
        }
        let starts: Vec<String> = partitions.iter().map(|p| format!("{p}@0")).collect();
        assert_eq!(
            self.cut_and_commit(),
            [format!("commit {}", starts.join(" "))]
        );
    }

    /// The seek the sink asked for ended.
    fn sought(&mut self, partition: i32, result: Result<(), String>) {
        let mut then = None;
        while let Some(a) = self.sink.next_action() {
            if let Action::Seek { key, then: t, .. } = a {
                assert_eq!(key, (0, partition));
                then = Some(t);
            }
        }
        let then = then.expect("the sink asked for a seek");
        self.sink.on_seek((0, partition), then, result);
    }

    /// A record of `partition` at `offset`.
    fn record(&mut self, partition: i32, offset: i64) {
        let payload = format!(r#"{{"id":{offset}}}"#);
        self.sink.on_record(
            &Record {
                topic: TOPIC,
                partition,
                offset: Offset(offset),
                timestamp: Some(0),
                key: None,
                payload: Some(payload.as_bytes()),
            },
            Instant::now(),
        );
    }

    /// The oldest job still in flight ends; `durable`: per slice.
    fn complete(&mut self, durable: bool) {
        let job = self.jobs.remove(0);
        let slices = job
            .slices
            .iter()
            .map(|s| Settled {
                partition: s.partition,
                ticket: s.ticket,
                generation: s.generation,
                durable,
                copies: Vec::new(),
            })
            .collect();
        let outcome = match durable {
            true => Outcome::Durable {
                inserted: job.batch.len(),
                rejected: Vec::new(),
                excluded: 0,
                stale_columns: false,
            },
            false => Outcome::Abandoned,
        };
        self.sink.on_event(Event::Completion(Completion {
            route_idx: 0,
            bytes: job.bytes,
            dlq: 0,
            outcome,
            slices,
        }));
    }

    /// Cuts what is built and commits what is durable.
    fn cut_and_commit(&mut self) -> Vec<String> {
        self.sink.cut_due(Instant::now(), true);
        self.sink.commit(None, false);
        self.actions()
    }
}

fn names(keys: &[Key]) -> String {
    let mut ps: Vec<String> = keys.iter().map(|k| k.1.to_string()).collect();
    ps.sort();
    ps.join(" ")
}

#[tokio::test]
async fn assigned_partitions_read_nothing_until_prepared_and_sought() {
    let mut b = bench("exactly-once").await;
    b.sink.on_assign(&[(0, 0), (0, 1)]);
    assert_eq!(b.actions(), ["pause 0 1", "prepare 0 1"]);
    b.record(0, 0);
    assert_eq!(
        b.cut_and_commit(),
        Vec::<String>::new(),
        "read while preparing"
    );
    b.prepared(0, 5);
    assert_eq!(b.actions(), ["seek 0@5 activate"]);
    // That seek never ends: the partition still reads nothing.
    b.record(0, 5);
    assert_eq!(
        b.cut_and_commit(),
        Vec::<String>::new(),
        "read before the seek"
    );
    b.prepared(0, 5);
    b.sought(0, Ok(()));
    assert_eq!(b.cut_and_commit(), ["commit 0@5"], "the start, once");
    b.record(0, 4);
    assert_eq!(
        b.cut_and_commit(),
        Vec::<String>::new(),
        "read below its start"
    );
    b.record(0, 5);
    assert_eq!(b.cut_and_commit(), ["insert 0:1"]);
}

#[tokio::test]
async fn one_insert_holds_every_partition_of_the_route_and_each_commits_once_durable() {
    let mut b = bench("exactly-once").await;
    b.activate(&[0, 1, 2]);
    for o in 0..3 {
        b.record(0, o);
    }
    b.record(2, 0);
    assert_eq!(b.cut_and_commit(), ["insert 0:3 2:1"]);
    b.record(1, 0);
    assert_eq!(b.cut_and_commit(), ["insert 1:1"]);
    b.complete(true);
    assert_eq!(b.cut_and_commit(), ["commit 0@3 2@1"]);
    assert_eq!(b.cut_and_commit(), Vec::<String>::new(), "committed once");
    b.complete(true);
    assert_eq!(b.cut_and_commit(), ["commit 1@1"]);
}

#[tokio::test]
async fn a_partition_revoked_with_rows_in_flight_settles_when_they_land_and_is_not_written_again() {
    let mut b = bench("exactly-once").await;
    b.activate(&[0, 1]);
    b.record(0, 0);
    b.record(1, 0);
    assert_eq!(b.cut_and_commit(), ["insert 0:1 1:1"]);
    b.record(0, 1);
    let drain = b.sink.on_revoke(&[(0, 0)], false);
    assert!(drain.is_empty(), "exactly-once lets go at once");
    assert_eq!(
        b.actions(),
        Vec::<String>::new(),
        "nothing settles while its rows are in flight"
    );
    // Its records are the next owner's: what was built and what comes are dropped.
    b.record(0, 2);
    b.record(1, 1);
    b.complete(true);
    assert_eq!(b.actions(), ["commit 0@1", "mark-clean 0"]);
    assert_eq!(b.cut_and_commit(), ["insert 1:1", "commit 1@1"]);
}

#[tokio::test]
async fn a_lost_partition_is_abandoned_at_once_and_never_committed() {
    let mut b = bench("exactly-once").await;
    b.activate(&[0, 1]);
    b.record(0, 0);
    b.record(1, 0);
    assert_eq!(b.cut_and_commit(), ["insert 0:1 1:1"]);
    let drain = b.sink.on_revoke(&[(0, 0)], true);
    assert!(drain.is_empty());
    assert!(
        b.jobs[0].slices[0].abandon.is_cancelled(),
        "its slice is given up"
    );
    assert!(!b.jobs[0].slices[1].abandon.is_cancelled());
    b.complete(true);
    assert_eq!(b.actions(), Vec::<String>::new());
    assert_eq!(b.cut_and_commit(), ["commit 1@1"]);
}

#[tokio::test]
async fn a_failed_seek_prepares_again_and_reads_nothing_meanwhile() {
    let mut b = bench("exactly-once").await;
    b.sink.on_assign(&[(0, 0)]);
    b.actions();
    b.prepared(0, 3);
    b.sought(0, Err("timed out".into()));
    assert_eq!(b.actions(), ["retry-prepared 0"]);
    b.record(0, 3);
    assert_eq!(b.cut_and_commit(), Vec::<String>::new());
}

#[tokio::test]
async fn a_taken_partition_is_prepared_again_and_its_old_batch_moves_nothing() {
    let mut b = bench("exactly-once").await;
    b.activate(&[0]);
    b.record(0, 0);
    assert_eq!(b.cut_and_commit(), ["insert 0:1"]);
    let generation = b.jobs[0].slices[0].generation;
    b.sink.on_event(Event::Taken {
        key: (0, 0),
        generation,
        by: Owner::Process(9),
    });
    assert!(b.jobs[0].slices[0].abandon.is_cancelled());
    assert_eq!(b.actions(), ["pause 0", "prepare 0"]);
    assert_ne!(b.generations[&(0, 0)], generation);
    b.prepared(0, 0);
    b.sought(0, Ok(()));
    assert_eq!(b.cut_and_commit(), ["commit 0@0"]);
    b.record(0, 0);
    assert_eq!(b.cut_and_commit(), ["insert 0:1"]);
    // The old generation's batch ends first: it vouches for nothing of
    // the new one's.
    b.complete(true);
    assert_eq!(b.cut_and_commit(), Vec::<String>::new());
    b.complete(true);
    assert_eq!(b.cut_and_commit(), ["commit 0@1"]);
}

#[tokio::test]
async fn at_least_once_revocation_waits_for_the_inserts_then_commits_synchronously() {
    let mut b = bench("at-least-once").await;
    b.sink.on_assign(&[(0, 0), (0, 1)]);
    assert_eq!(b.actions(), ["resume 0 1"]);
    b.record(0, 0);
    b.record(1, 0);
    // At least once, a partition's first record sets where it starts.
    assert_eq!(b.cut_and_commit(), ["insert 0:1 1:1", "commit 0@0 1@0"]);
    let drain = b.sink.on_revoke(&[(0, 0)], false);
    assert_eq!(drain, [(0, 0)]);
    assert!(b.sink.busy(Some(&drain)));
    b.complete(true);
    assert!(!b.sink.busy(Some(&drain)));
    b.actions();
    b.sink.let_go(&drain);
    assert_eq!(b.actions(), ["commit 0@1 sync"]);
    assert_eq!(b.cut_and_commit(), ["commit 1@1"]);
}

#[tokio::test]
async fn the_stop_marks_clean_only_what_drained() {
    let mut b = bench("exactly-once").await;
    b.activate(&[0, 1]);
    b.record(0, 0);
    assert_eq!(b.cut_and_commit(), ["insert 0:1"]);
    b.complete(true);
    assert_eq!(b.cut_and_commit(), ["commit 0@1"]);
    assert!(b.sink.stopped(true).is_none());
    assert_eq!(b.actions(), ["mark-clean 0 1 wait"]);

    let mut b = bench("exactly-once").await;
    b.activate(&[0]);
    b.record(0, 0);
    b.cut_and_commit();
    assert!(b.sink.stopped(false).is_none());
    assert_eq!(
        b.actions(),
        Vec::<String>::new(),
        "inserts still running: the next owner fences"
    );
    assert!(b.jobs[0].slices[0].abandon.is_cancelled());
}
