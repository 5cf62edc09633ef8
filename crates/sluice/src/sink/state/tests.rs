//! What the sink decides, without Kafka, ClickHouse or a registry: events
//! in, the actions it queues out, each written as a short line
//! (`pause 0 1`, `insert 0:2 1:1`, `commit 0@7`, `fetch-schema 0:7`, ...).
//! Every commit asked for is stored; seeks, inserts, preparations, schema
//! fetches and column reads end as each test says.

use super::{Record, Sink};
use crate::config::{Config, Overrides, RawConfig};
use crate::owners::{Key, Owner, Owners};
use crate::registry::Decoder;
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
/// The columns of the table of a route with `extra_fields = "dlq"`.
const COLUMNS: [&str; 1] = ["id"];

/// A sink of one route over `TOPIC`, and what its last calls queued.
struct Bench {
    sink: Sink,
    /// The insert jobs queued and not yet answered, in order.
    jobs: Vec<Job>,
    /// The generation of each partition's last preparation.
    generations: std::collections::HashMap<Key, u64>,
}

async fn bench(delivery: &str) -> Bench {
    bench_of(delivery, 1000).await
}

async fn bench_of(delivery: &str, max_batch_rows: usize) -> Bench {
    bench_with(delivery, max_batch_rows, "").await
}

/// A bench whose route has `more` besides its topic and table (tables
/// after it too). A route with `extra_fields = "dlq"` starts with the
/// columns [`COLUMNS`].
async fn bench_with(delivery: &str, max_batch_rows: usize, more: &str) -> Bench {
    let text = format!(
        r#"
        [kafka]
        brokers = "127.0.0.1:9"
        group_id = "g"
        [clickhouse]
        url = "http://127.0.0.1:9"
        [sink]
        delivery = "{delivery}"
        max_batch_rows = {max_batch_rows}
        [[route]]
        topic = "{TOPIC}"
        table = "shop.orders"
        {more}
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
        bodies: super::super::body::Bodies::json(routes.len()),
        lease: Lease::new(cfg.lease()),
        delivery: cfg.sink.delivery,
        permits: Semaphore::new(1),
        dlq: None,
        per_insert: encoders.iter().map(|_| Default::default()).collect(),
        encoders,
    });
    // One client for every bench: it never reaches a broker, and making
    // one costs more than a run of the property test below.
    static OWNERS: std::sync::OnceLock<Owners> = std::sync::OnceLock::new();
    let owners = OWNERS
        .get_or_init(|| Owners::new(&cfg.kafka, routes.clone()).expect("a client without a broker"))
        .clone();
    let columns = routes
        .iter()
        .map(|r| r.extra_to_dlq.then(|| COLUMNS.map(String::from).to_vec()))
        .collect();
    let checks = RowChecks {
        schemas: Schemas::new(&routes, 1 << 20, 1 << 26),
        columns: TableColumns::new(&routes, columns),
        registry: None,
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
                Action::FetchSchema { route, id } => format!("fetch-schema {route}:{id}"),
                Action::RereadColumns { route } => format!("reread-columns {route}"),
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
        self.record_of(partition, offset, payload.as_bytes(), Instant::now());
    }

    /// A record of `partition` at `offset` with the value `payload`, read
    /// at `now`.
    fn record_of(&mut self, partition: i32, offset: i64, payload: &[u8], now: Instant) {
        self.sink.on_record(
            &Record {
                topic: TOPIC,
                partition,
                offset: Offset(offset),
                timestamp: Some(0),
                key: None,
                payload: Some(payload),
            },
            now,
        );
    }

    /// Every seek the sink asked for ends as `result`; the seeks, a line
    /// each, sorted.
    fn seeks(&mut self, result: Result<(), String>) -> Vec<String> {
        let mut lines = Vec::new();
        while let Some(a) = self.sink.next_action() {
            let Action::Seek { key, offset, then } = a else {
                panic!("only seeks were asked for");
            };
            lines.push(format!("seek {}@{}", key.1, offset.0));
            self.sink.on_seek(key, then, result.clone());
        }
        lines.sort();
        lines
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
    // The group's commit may have been put back since: each commits again.
    b.sink.recommit();
    assert_eq!(b.cut_and_commit(), ["commit 0@3 1@1 2@1"]);
    assert_eq!(
        b.cut_and_commit(),
        Vec::<String>::new(),
        "then once more only when asked"
    );
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
async fn a_revoked_partition_commits_what_its_batches_made_durable_as_they_land() {
    let mut b = bench("exactly-once").await;
    b.activate(&[0]);
    b.record(0, 0);
    assert_eq!(b.cut_and_commit(), ["insert 0:1"]);
    b.record(0, 1);
    assert_eq!(b.cut_and_commit(), ["insert 0:1"]);
    assert!(b.sink.on_revoke(&[(0, 0)], false).is_empty());
    b.complete(true);
    assert_eq!(
        b.cut_and_commit(),
        ["commit 0@1"],
        "the first batch's rows, under its lease, while the second is in flight"
    );
    b.complete(true);
    assert_eq!(b.actions(), ["commit 0@2", "mark-clean 0"]);
    assert_eq!(b.cut_and_commit(), Vec::<String>::new(), "handed off");
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

/// The Avro schema of the registry route's records: one `long`, `id`.
const AVRO: &str = r#"{"type":"record","name":"order","fields":[{"name":"id","type":"long"}]}"#;

/// A record value in the registry's wire format: schema `id`, then the
/// Avro body of `{"id": n}` (a zigzag varint, `n` < 64).
fn framed(id: u32, n: u8) -> Vec<u8> {
    let mut v = vec![0];
    v.extend_from_slice(&id.to_be_bytes());
    v.push(n << 1);
    v
}

fn avro_decoder() -> Decoder {
    let schema = sluice_formats::avro::AvroSchema::parse(AVRO, &[]).expect("the schema parses");
    Decoder::Avro(Arc::new(schema))
}

#[tokio::test]
async fn a_record_of_an_unknown_schema_asks_for_it_once_and_its_partitions_wait_for_the_answer() {
    let registry = "format = \"avro\"\n[schema_registry]\nurl = \"http://127.0.0.1:9\"";
    let mut b = bench_with("exactly-once", 1000, registry).await;
    b.activate(&[0, 1]);
    b.sink.apply_backpressure();
    assert_eq!(b.actions(), ["resume 0 1"]);
    let now = Instant::now();
    b.record_of(0, 0, &framed(7, 0), now);
    assert_eq!(b.actions(), ["fetch-schema 0:7"]);
    b.sink.apply_backpressure();
    assert_eq!(b.actions(), ["pause 0"]);
    // Fetched before the pause took hold: ignored, and asked for once.
    b.record_of(0, 1, &framed(7, 1), now);
    b.record_of(1, 0, &framed(7, 0), now);
    assert_eq!(b.actions(), Vec::<String>::new(), "one fetch per id");
    b.sink.apply_backpressure();
    assert_eq!(b.actions(), ["pause 1"]);
    b.sink.unstall();
    assert_eq!(
        b.actions(),
        Vec::<String>::new(),
        "nothing before the answer"
    );
    assert_eq!(
        b.cut_and_commit(),
        Vec::<String>::new(),
        "nothing taken while waiting"
    );

    // The answer: each partition goes back to the record that waited.
    b.sink.on_event(Event::Schema {
        route: 0,
        id: 7,
        answer: Ok(avro_decoder()),
    });
    assert_eq!(b.seeks(Err("timed out".into())), ["seek 0@0", "seek 1@0"]);
    b.sink.unstall();
    assert_eq!(b.actions(), Vec::<String>::new(), "a failed seek waits");
    b.sink.apply_backpressure();
    assert_eq!(b.actions(), Vec::<String>::new(), "still paused");
    std::thread::sleep(super::STALL_RETRY);
    b.sink.unstall();
    assert_eq!(b.seeks(Ok(())), ["seek 0@0", "seek 1@0"]);
    b.sink.apply_backpressure();
    assert_eq!(b.actions(), ["resume 0 1"]);
    for (p, o) in [(0, 0), (0, 1), (1, 0)] {
        b.record_of(p, o, &framed(7, o as u8), Instant::now());
    }
    assert_eq!(b.cut_and_commit(), ["insert 0:2 1:1"]);
    let job = &b.jobs[0];
    let rows: Vec<String> = (0..job.batch.len())
        .filter_map(|i| job.batch.row(i))
        .map(|(_, row)| String::from_utf8_lossy(row).into_owned())
        .collect();
    assert_eq!(rows.len(), 3);
    assert!(
        rows.iter().all(|r| r.contains(r#""id":"#)),
        "decoded: {rows:?}"
    );
}

#[tokio::test]
async fn a_schema_the_registry_refuses_refuses_its_records_once_they_are_read_again() {
    let registry = "format = \"avro\"\n[schema_registry]\nurl = \"http://127.0.0.1:9\"";
    let mut b = bench_with("exactly-once", 1000, registry).await;
    b.activate(&[0]);
    b.record_of(0, 0, &framed(9, 0), Instant::now());
    assert_eq!(b.actions(), ["fetch-schema 0:9"]);
    b.sink.on_event(Event::Schema {
        route: 0,
        id: 9,
        answer: Err("schema id 9 is not known to the registry".into()),
    });
    assert_eq!(b.seeks(Ok(())), ["seek 0@0"]);
    b.record_of(0, 0, &framed(9, 0), Instant::now());
    assert_eq!(b.actions(), Vec::<String>::new(), "not asked for again");
    let e = b.sink.stopped(false).expect("no DLQ: the sink stops");
    assert!(e.to_string().contains("schema id 9 is not known"), "{e:#}");
}

/// A moment after the columns read at the start are due for a reread.
fn later() -> Instant {
    Instant::now() + crate::sink::columns::REREAD_AFTER * 2
}

/// A JSON record with the field `extra`, which [`COLUMNS`] lacks.
fn with_extra(offset: i64) -> Vec<u8> {
    format!(r#"{{"id":{offset},"extra":1}}"#).into_bytes()
}

#[tokio::test]
async fn a_field_the_columns_lack_has_them_read_again_while_its_partition_waits() {
    let mut b = bench_with("exactly-once", 1000, "extra_fields = \"dlq\"").await;
    b.activate(&[0, 1]);
    b.sink.apply_backpressure();
    assert_eq!(b.actions(), ["resume 0 1"]);
    b.record_of(0, 0, &with_extra(0), later());
    assert_eq!(b.actions(), ["reread-columns 0"]);
    b.sink.apply_backpressure();
    assert_eq!(b.actions(), ["pause 0"]);
    // Another partition reads on: a record that fits is taken; one with
    // the field waits for the same read.
    b.record_of(1, 0, br#"{"id":0}"#, later());
    b.record_of(1, 1, &with_extra(1), later());
    assert_eq!(b.actions(), Vec::<String>::new(), "one read at a time");
    b.sink.apply_backpressure();
    assert_eq!(b.actions(), ["pause 1"]);
    b.sink.unstall();
    assert_eq!(
        b.actions(),
        Vec::<String>::new(),
        "nothing before the answer"
    );

    // The column was added: both records are read again, and land.
    b.sink.on_event(Event::Columns {
        route: 0,
        answer: Ok(vec!["id".into(), "extra".into()]),
    });
    assert_eq!(b.seeks(Ok(())), ["seek 0@0", "seek 1@1"]);
    b.sink.apply_backpressure();
    assert_eq!(b.actions(), ["resume 0 1"]);
    // Back later than REREAD_AFTER after the answer: the columns read for
    // them judge them, without another read.
    b.record_of(0, 0, &with_extra(0), later());
    b.record_of(1, 1, &with_extra(1), later());
    assert_eq!(b.cut_and_commit(), ["insert 0:1 1:2"]);
    assert!(!b.sink.failed());
}

#[tokio::test]
async fn a_failed_read_of_the_columns_leaves_the_last_ones_to_refuse_the_field() {
    let mut b = bench_with("exactly-once", 1000, "extra_fields = \"dlq\"").await;
    b.activate(&[0]);
    // Fresh columns decide at once, without a read.
    b.record_of(0, 0, br#"{"id":0}"#, Instant::now());
    assert_eq!(b.actions(), Vec::<String>::new());
    b.record_of(0, 1, &with_extra(1), later());
    assert_eq!(b.actions(), ["reread-columns 0"]);
    b.sink.on_event(Event::Columns {
        route: 0,
        answer: Err("no answer within 2s".into()),
    });
    assert_eq!(b.seeks(Ok(())), ["seek 0@1"]);
    // Read again later than REREAD_AFTER, and with no new read: the
    // columns last read decide for AFTER_FAILURE.
    b.record_of(0, 1, &with_extra(1), later());
    b.record_of(0, 2, &with_extra(2), later());
    assert_eq!(b.actions(), Vec::<String>::new(), "no read after a failure");
    let e = b.sink.stopped(false).expect("no DLQ: the sink stops");
    assert!(
        e.to_string()
            .contains("record orders[0]@1 cannot become a row: the value has a field `extra`"),
        "{e:#}"
    );
}

#[tokio::test]
async fn columns_refused_by_clickhouse_are_read_again_before_the_next_record() {
    let mut b = bench_with("exactly-once", 1000, "extra_fields = \"dlq\"").await;
    b.activate(&[0]);
    b.record(0, 0);
    assert_eq!(b.cut_and_commit(), ["insert 0:1"]);
    // ClickHouse refused a field the columns hold.
    let job = b.jobs.remove(0);
    b.sink.on_event(Event::Completion(Completion {
        route_idx: 0,
        bytes: job.bytes,
        dlq: 0,
        outcome: Outcome::Durable {
            inserted: 1,
            rejected: Vec::new(),
            excluded: 0,
            stale_columns: true,
        },
        slices: vec![Settled {
            partition: 0,
            ticket: job.slices[0].ticket,
            generation: job.slices[0].generation,
            durable: true,
            copies: Vec::new(),
        }],
    }));
    b.actions();
    // Even a record that fits waits for them, once they may be read.
    b.record_of(0, 1, br#"{"id":1}"#, later());
    assert_eq!(b.actions(), ["reread-columns 0"]);
    b.sink.on_event(Event::Columns {
        route: 0,
        answer: Ok(vec!["id".into()]),
    });
    assert_eq!(b.seeks(Ok(())), ["seek 0@1"]);
    b.record_of(0, 1, br#"{"id":1}"#, later());
    assert_eq!(b.cut_and_commit(), ["insert 0:1", "commit 0@1"]);
}

/// Random runs of one exactly-once sink over two partitions: records,
/// cuts, inserts that end (durable, or not), commits, revocations, lost
/// assignments, partitions taken by another owner and assigned again. An
/// oracle checks every action the sink asks for against what it knows of
/// the world.
mod runs {
    use super::*;
    use proptest::prelude::*;
    use std::collections::{BTreeSet, HashMap, HashSet};

    const PARTITIONS: i32 = 2;

    #[derive(Debug, Clone)]
    enum Op {
        Record(i32),
        Cut,
        /// The `n`th insert in flight ends: its rows are stored, but for
        /// a slice whose partition was given up (the writer leaves it out;
        /// it never ends a live slice otherwise, but by stopping the sink),
        /// unless `early`: they landed before it was given up.
        End {
            n: usize,
            early: bool,
        },
        Commit,
        Revoke(i32),
        Lose(i32),
        Take(i32),
        Assign(i32),
        /// A preparation of the partition ends.
        Prepared(i32),
        /// Taken by another owner and prepared again at once; then a
        /// record, and a cut: the new generation has a batch in flight
        /// beside the old one's.
        Churn(i32),
    }

    fn op() -> impl Strategy<Value = Op> {
        let p = 0..PARTITIONS;
        prop_oneof![
            5 => p.clone().prop_map(Op::Record),
            3 => Just(Op::Cut),
            4 => (0..4usize, prop::bool::ANY).prop_map(|(n, early)| Op::End { n, early }),
            3 => Just(Op::Commit),
            1 => p.clone().prop_map(Op::Revoke),
            1 => p.clone().prop_map(Op::Lose),
            2 => p.clone().prop_map(Op::Take),
            1 => p.clone().prop_map(Op::Assign),
            3 => p.clone().prop_map(Op::Prepared),
            2 => p.prop_map(Op::Churn),
        ]
    }

    /// What the world knows, and checks the sink's actions against.
    #[derive(Default)]
    struct World {
        /// Assigned to this process by the group.
        assigned: HashSet<i32>,
        /// The group's stored commit of each partition.
        commit: HashMap<i32, i64>,
        /// The offset the next record of each partition has, for the
        /// process reading it.
        next: HashMap<i32, i64>,
        /// Preparations the sink started and that have not ended, by
        /// partition: the generation.
        preparing: HashMap<i32, u64>,
        /// Each generation's start.
        start: HashMap<(i32, u64), i64>,
        /// Generations that were lost or taken: never committed again.
        gone: HashSet<(i32, u64)>,
        /// Rows stored in ClickHouse, by partition and generation.
        stored: HashMap<(i32, u64), BTreeSet<i64>>,
        /// Rows sent in an insert, by partition and generation.
        cut: HashMap<(i32, u64), BTreeSet<i64>>,
        /// The generation each partition is active in here, if any.
        active: HashMap<i32, u64>,
        /// Revoked while active: the generation, whose inserts may still
        /// be finishing (another owner may take it meanwhile).
        leaving: HashMap<i32, u64>,
    }

    /// Carries out what the sink asked for, checking each action.
    fn act(b: &mut Bench, w: &mut World) -> Result<(), TestCaseError> {
        while let Some(a) = b.sink.next_action() {
            match a {
                Action::Pause(keys) | Action::Resume(keys) => {
                    for (_, p) in keys {
                        prop_assert!(w.assigned.contains(&p), "{p} paused or resumed, not held");
                    }
                }
                Action::RetryPrepared { .. } => {}
                Action::MarkMismatch { .. } => prop_assert!(false, "no log went back"),
                Action::FetchSchema { .. } | Action::RereadColumns { .. } => {
                    prop_assert!(
                        false,
                        "a JSON route ignoring extra fields reads no schema nor columns"
                    )
                }
                Action::Seek { key, then, .. } => b.sink.on_seek(key, then, Ok(())),
                Action::Prepare(p) => {
                    for (k, g) in p.parts.values().flatten() {
                        prop_assert!(w.assigned.contains(&k.1), "{} prepared, not held", k.1);
                        w.preparing.insert(k.1, *g);
                    }
                }
                Action::Commit { offsets, .. } => {
                    for &((_, p), g, next) in &offsets {
                        prop_assert!(
                            !w.gone.contains(&(p, g)),
                            "commit of {p} by generation {g}, which lost it"
                        );
                        let from = w.start[&(p, g)];
                        let stored = w.stored.get(&(p, g));
                        for o in from..next.0 {
                            prop_assert!(
                                stored.is_some_and(|s| s.contains(&o)),
                                "commit {p}@{} by generation {g}: offset {o} is not stored",
                                next.0
                            );
                        }
                        w.commit.insert(p, next.0);
                    }
                    b.sink.on_committed(&offsets);
                }
                Action::MarkClean { keys, wait, .. } => {
                    for (_, p) in keys {
                        let running = b.jobs.iter().any(|j| {
                            j.slices
                                .iter()
                                .any(|s| s.partition == p && !s.abandon.is_cancelled())
                        });
                        prop_assert!(
                            wait || !running,
                            "{p} marked clean with an insert of it running"
                        );
                    }
                }
                Action::Insert(job) => {
                    for s in &job.slices {
                        let (p, g) = (s.partition, s.generation);
                        prop_assert_eq!(
                            w.active.get(&p),
                            Some(&g),
                            "rows of {} cut by generation {}, not active",
                            p,
                            g
                        );
                        let cut = w.cut.entry((p, g)).or_default();
                        for r in job.batch.rows().filter(|r| r.partition == p) {
                            prop_assert!(r.offset.0 >= w.start[&(p, g)]);
                            prop_assert!(
                                cut.insert(r.offset.0),
                                "{p}@{} sent twice by generation {g}",
                                r.offset.0
                            );
                        }
                    }
                    b.jobs.push(*job);
                }
            }
        }
        Ok(())
    }

    fn end(b: &mut Bench, w: &mut World, n: usize, early: bool) {
        let job = b.jobs.remove(n);
        let slices: Vec<Settled> = job
            .slices
            .iter()
            .map(|s| {
                // The writer leaves a given-up partition's rows out.
                let stored = early || !s.abandon.is_cancelled();
                if stored {
                    let rows = job.batch.rows().filter(|r| r.partition == s.partition);
                    w.stored
                        .entry((s.partition, s.generation))
                        .or_default()
                        .extend(rows.map(|r| r.offset.0));
                }
                Settled {
                    partition: s.partition,
                    ticket: s.ticket,
                    generation: s.generation,
                    durable: stored,
                    copies: Vec::new(),
                }
            })
            .collect();
        let outcome = if slices.iter().any(|s| s.durable) {
            Outcome::Durable {
                inserted: job.batch.len(),
                rejected: Vec::new(),
                excluded: 0,
                stale_columns: false,
            }
        } else {
            Outcome::Abandoned
        };
        b.sink.on_event(Event::Completion(Completion {
            route_idx: 0,
            bytes: job.bytes,
            dlq: 0,
            outcome,
            slices,
        }));
    }

    fn apply(b: &mut Bench, w: &mut World, op: &Op) -> Result<(), TestCaseError> {
        match *op {
            Op::Record(p) => {
                if w.assigned.contains(&p) {
                    let o = w.next.entry(p).or_default();
                    b.record(p, *o);
                    *o += 1;
                }
            }
            Op::Cut => b.sink.cut_due(Instant::now(), true),
            Op::End { n, early } => {
                if !b.jobs.is_empty() {
                    let n = n % b.jobs.len();
                    end(b, w, n, early);
                }
            }
            Op::Commit => b.sink.commit(None, false),
            Op::Revoke(p) | Op::Lose(p) => {
                if w.assigned.remove(&p) {
                    let lost = matches!(op, Op::Lose(_));
                    if let Some(g) = w.active.remove(&p) {
                        if lost {
                            w.gone.insert((p, g));
                        } else {
                            w.leaving.insert(p, g);
                        }
                    }
                    w.preparing.remove(&p);
                    b.sink.on_revoke(&[(0, p)], lost);
                }
            }
            Op::Take(p) => {
                if let Some(g) = w.active.remove(&p) {
                    w.gone.insert((p, g));
                    b.sink.on_event(Event::Taken {
                        key: (0, p),
                        generation: g,
                        by: Owner::Process(9),
                    });
                } else if let Some(g) = w.leaving.remove(&p) {
                    // The lease's reads never report a leaving partition
                    // taken (its lease runs out, and the next owner fences
                    // past it); a report anyway must not have the sink
                    // claim back what the group gave to another.
                    b.sink.on_event(Event::Taken {
                        key: (0, p),
                        generation: g,
                        by: Owner::Process(9),
                    });
                }
            }
            Op::Assign(p) => {
                if w.assigned.insert(p) {
                    w.leaving.remove(&p);
                    b.sink.on_assign(&[(0, p)]);
                }
            }
            Op::Churn(p) => {
                for op in [Op::Take(p), Op::Prepared(p), Op::Record(p), Op::Cut] {
                    apply(b, w, &op)?;
                }
                return Ok(());
            }
            Op::Prepared(p) => {
                if let Some(g) = w.preparing.remove(&p) {
                    // The next owner reads on from the group's commit.
                    let start = w.commit.get(&p).copied().unwrap_or(0);
                    w.start.insert((p, g), start);
                    w.next.insert(p, start);
                    w.active.insert(p, g);
                    b.generations.insert((0, p), g);
                    b.prepared(p, start);
                }
            }
        }
        act(b, w)
    }

    /// The run of the property test below that a sink which lets an
    /// older generation's batch acknowledge the new one's fails.
    #[test]
    fn an_old_generations_batch_that_lands_after_a_take_vouches_for_nothing_new() {
        use Op::*;
        run(&[
            Prepared(0),
            Record(0),
            Cut,
            Take(0),
            Prepared(0),
            Record(0),
            Cut,
            End { n: 0, early: true },
            Commit,
        ])
        .expect("the oracle holds");
    }

    /// A partition revoked with an insert in flight stays the group's
    /// next owner's: a report that it was taken does not have the sink
    /// pause it or claim it back.
    #[test]
    fn a_leaving_partition_reported_taken_is_not_claimed_back() {
        use Op::*;
        run(&[Prepared(0), Record(0), Cut, Revoke(0), Take(0)]).expect("the oracle holds");
    }

    /// Runs `ops` against one sink, then ends every preparation and insert.
    fn run(ops: &[Op]) -> Result<(), TestCaseError> {
        static RT: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
        let rt = RT.get_or_init(|| tokio::runtime::Runtime::new().expect("a runtime"));
        let _in = rt.enter();
        let mut b = rt.block_on(bench_of("exactly-once", 3));
        let mut w = World::default();
        for p in 0..PARTITIONS {
            w.assigned.insert(p);
        }
        b.sink.on_assign(&[(0, 0), (0, 1)]);
        act(&mut b, &mut w)?;
        for op in ops {
            apply(&mut b, &mut w, op)?;
        }
        // Every preparation and insert ends; what is built is sent.
        for p in 0..PARTITIONS {
            apply(&mut b, &mut w, &Op::Prepared(p))?;
        }
        for _ in 0..3 {
            b.sink.cut_due(Instant::now(), true);
            act(&mut b, &mut w)?;
            while !b.jobs.is_empty() {
                end(&mut b, &mut w, 0, false);
                act(&mut b, &mut w)?;
            }
        }
        b.sink.commit(None, false);
        act(&mut b, &mut w)?;
        for (p, _) in w.active.clone() {
            prop_assert_eq!(
                w.commit.get(&p).copied().unwrap_or(0),
                w.next[&p],
                "partition {} stalls",
                p
            );
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Whatever happens, the sink sends a partition's rows only while
        /// it holds it, never twice in one generation; commits only what
        /// is stored, never for a generation that lost its partition; and
        /// marks a partition clean only once none of its inserts runs.
        /// Once every insert is stored, every partition it holds commits
        /// everything it read.
        #[test]
        fn the_sink_commits_only_stored_rows_and_hands_off_clean(ops in prop::collection::vec(op(), 1..80)) {
            run(&ops)?;
        }
    }
}
