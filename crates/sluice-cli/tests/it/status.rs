//! `sluice status` and `sluice run --until-caught-up` on the real stack:
//! the lag it reports before, during and after a run, a frozen sink found
//! stuck, and a run that drains what was there at start and exits 0 while
//! a producer keeps writing.

use crate::harness::*;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// `sluice status --config CONFIG ARGS`.
pub(crate) fn status_of(config: &std::path::Path, args: &[&str]) -> Ran {
    let mut cmd = sluice(["status", "--config"]);
    cmd.arg(config).args(args);
    run(&mut cmd)
}

/// `sluice status` with a running sink's config.
fn status(sink: &Sink, args: &[&str]) -> Ran {
    status_of(&sink.config, args)
}

/// The partitions of a `status --json` reading, by partition number.
pub(crate) fn partitions(ran: &Ran) -> BTreeMap<i64, serde_json::Value> {
    assert_eq!(ran.code, 0, "status failed: {}\n{}", ran.stdout, ran.stderr);
    let line = ran.stdout.lines().last().unwrap_or_default();
    let v: serde_json::Value =
        serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {}", ran.stdout));
    v["partitions"]
        .as_array()
        .expect("partitions")
        .iter()
        .map(|p| (p["partition"].as_i64().unwrap(), p.clone()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_reports_lag_owners_and_a_frozen_sink_as_stuck() {
    let (topic, table, ch) = setup("status", 2, 1000).await;
    let mut spec = SinkSpec::new(&topic, &table);
    spec.max_batch_rows = 200;
    // Written but never started: the readings before any sink.
    let mut sink = spec.start();
    sink.freeze();
    let before = partitions(&status(&sink, &["--json"]));
    sink.thaw();
    assert_eq!(before.len(), 2, "{before:?}");
    for p in before.values() {
        assert_eq!(p["high_watermark"], 500, "{p}");
        assert_eq!(p["lag_records"], 500, "{p}");
        assert_eq!(p["clickhouse_offset"], serde_json::Value::Null, "{p}");
    }

    let got = wait_for(&ch, &table, 1000, Duration::from_secs(120)).await;
    assert_eq!(got.distinct_offsets, 1000, "{}", sink.log_tail());
    // Caught up: no lag, ClickHouse's watermark at the last offset, and the
    // register names this process (the id the sink logged).
    let log = std::fs::read_to_string(&sink.log).unwrap_or_default();
    let me = log
        .split("owner=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .unwrap_or_else(|| panic!("no owner id in the log: {log}"));
    let deadline = Instant::now() + Duration::from_secs(30);
    let caught_up = loop {
        let now = partitions(&status(&sink, &["--json"]));
        let done = now.values().all(|p| p["lag_records"] == 0);
        if done || Instant::now() > deadline {
            break now;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    for p in caught_up.values() {
        assert_eq!(p["lag_records"], 0, "{p}");
        assert_eq!(p["clickhouse_offset"], 499, "{p}");
        assert_eq!(p["owner"], format!("sluice-{me}"), "{p}");
    }
    // The table prints the same, by route.
    let shown = status(&sink, &[]);
    assert_eq!(shown.code, 0, "{}", shown.stderr);
    assert!(
        shown.stdout.contains(&topic) && shown.stdout.contains(&format!("sluice-{me}")),
        "{}",
        shown.stdout
    );

    // Frozen with records waiting: stuck, named, exit 1.
    sink.freeze();
    let s = stack();
    let t = topic.clone();
    tokio::task::spawn_blocking(move || s.produce(&t, 2, 1000, 200))
        .await
        .unwrap()
        .unwrap();
    let started = Instant::now();
    let stuck = status(&sink, &["--stuck-after", "4s", "--interval", "1s"]);
    assert_eq!(stuck.code, 1, "{}\n{}", stuck.stdout, stuck.stderr);
    assert!(started.elapsed() >= Duration::from_secs(4));
    for p in 0..2 {
        assert!(
            stuck.stderr.contains(&format!("{topic}[{p}]")),
            "{}",
            stuck.stderr
        );
    }
    let lagging = partitions(&status(&sink, &["--json"]));
    for p in lagging.values() {
        assert_eq!(p["lag_records"], 100, "{p}");
        assert!(p["lag_seconds"].as_f64().is_some(), "no lag in time: {p}");
    }

    // Thawed, it moves again: the same check ends well, before its time.
    sink.thaw();
    let started = Instant::now();
    let moving = status(&sink, &["--stuck-after", "90s", "--interval", "1s"]);
    assert_eq!(
        moving.code,
        0,
        "{}\n{}\n{}",
        moving.stdout,
        moving.stderr,
        sink.log_tail()
    );
    assert!(started.elapsed() < Duration::from_secs(90));
    let got = wait_for(&ch, &table, 1200, Duration::from_secs(60)).await;
    sink.stop(Duration::from_secs(30));
    assert_eq!((got.rows, got.distinct_offsets), (1200, 1200));
}

/// Drains what was there at start, then hands off and exits 0 on its own,
/// though a producer keeps writing: what came later is left for the next
/// run, and nothing is written twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_until_caught_up_drains_what_was_there_and_exits_0() {
    let (topic, table, ch) = setup("until", 2, 2000).await;
    let mut spec = SinkSpec::new(&topic, &table);
    spec.max_batch_rows = 300;
    spec.args = vec!["--until-caught-up".into()];
    let sink = spec.start();
    let (s, t) = (stack(), topic.clone());
    let producing = tokio::task::spawn_blocking(move || {
        for i in 0..20 {
            s.produce(&t, 2, 2000 + i * 100, 100).unwrap();
            std::thread::sleep(Duration::from_millis(250));
        }
    });
    let (code, log) = tokio::task::spawn_blocking(move || exit_of(sink, Duration::from_secs(180)))
        .await
        .unwrap();
    producing.await.unwrap();
    assert_eq!(code, Some(0), "{log}");
    assert!(
        log.contains("caught up with the high watermarks seen at start"),
        "{log}"
    );
    let got = landed(&ch, &table).await;
    assert_eq!(
        got.rows, got.distinct_offsets,
        "a row written twice: {got:?}"
    );
    let first: u64 = ch
        .query(&format!(
            "SELECT uniqExact(id) FROM {table} WHERE id < 2000"
        ))
        .fetch_one()
        .await
        .unwrap();
    assert_eq!(first, 2000, "{got:?}\n{log}");

    // A second run takes the rest, from where the first handed off.
    let mut again = SinkSpec::new(&topic, &table);
    again.group = spec.group.clone();
    again.args = vec!["--until-caught-up".into()];
    let sink = again.start();
    let (code, log) = tokio::task::spawn_blocking(move || exit_of(sink, Duration::from_secs(180)))
        .await
        .unwrap();
    assert_eq!(code, Some(0), "{log}");
    let got = landed(&ch, &table).await;
    assert_eq!((got.rows, got.distinct_offsets), (4000, 4000), "{log}");
}

/// docs/operations.md's upgrade procedure: two static members; each in turn is
/// stopped with SIGTERM (exit 0), started again with its `instance_id`,
/// and `status --stuck-after` passes before the next; a producer writes
/// all along. Every record lands exactly once on a plain MergeTree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_of_static_members_writes_every_record_once() {
    let (topic, table, ch) = setup("roll", 2, 1000).await;
    let group = unique("g");
    let spec = |member: &str| {
        let mut s = SinkSpec::new(&topic, &table);
        s.group = group.clone();
        s.instance_id = Some(member.to_string());
        s.session_timeout = Duration::from_secs(20);
        s.max_batch_rows = 100;
        s
    };
    let (s, t) = (stack(), topic.clone());
    let producing = tokio::task::spawn_blocking(move || {
        for i in 0..40 {
            s.produce(&t, 2, 1000 + i * 50, 50).unwrap();
            std::thread::sleep(Duration::from_millis(500));
        }
    });
    let mut members = vec![spec("m-0").start(), spec("m-1").start()];
    for (i, name) in ["m-0", "m-1"].iter().enumerate() {
        tokio::time::sleep(Duration::from_secs(4)).await;
        let old = &mut members[i];
        // `stop`: SIGTERM, and true only on exit 0.
        assert!(
            old.stop(Duration::from_secs(60)),
            "{name}: {}",
            old.log_tail()
        );
        members[i] = spec(name).start();
        let check = status(&members[i], &["--stuck-after", "60s", "--interval", "1s"]);
        assert_eq!(check.code, 0, "{name}: {}\n{}", check.stdout, check.stderr);
    }
    producing.await.unwrap();
    let got = wait_for(&ch, &table, 3000, Duration::from_secs(180)).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let got = got.max_rows(landed(&ch, &table).await);
    let logs: Vec<String> = members.iter().map(|m| m.log_tail()).collect();
    for m in &mut members {
        m.stop(Duration::from_secs(60));
    }
    assert_eq!((got.rows, got.distinct_offsets), (3000, 3000), "{logs:#?}");
}

/// `--watch --json` prints a reading per interval until interrupted, and
/// an end it cannot reach is named, exit 2, in bounded time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_watches_and_names_an_end_it_cannot_reach() {
    let (topic, table, _ch) = setup("stw", 1, 10).await;
    let dir = std::env::temp_dir().join(unique("sluice_status"));
    std::fs::create_dir_all(&dir).unwrap();
    let config = |brokers: &str, url: &str| {
        let path = dir.join(format!("{}.toml", unique("c")));
        std::fs::write(
            &path,
            format!(
                "[kafka]\nbrokers = \"{brokers}\"\ngroup_id = \"g\"\n\
                 [clickhouse]\nurl = \"{url}\"\n\
                 [[route]]\ntopic = \"{topic}\"\ntable = \"{table}\"\n"
            ),
        )
        .unwrap();
        path
    };
    let good = config(&brokers(), &clickhouse_url());
    let mut watch = sluice([
        "status",
        "--watch",
        "--json",
        "--interval",
        "500ms",
        "--config",
    ]);
    let child = watch
        .arg(&good)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let _ = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let readings: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(readings.len() >= 3, "{readings:?}");
    assert!(readings
        .iter()
        .all(|r| r["partitions"][0]["lag_records"] == 10));

    let nobody = format!("127.0.0.1:{}", free_port());
    for (path, names) in [
        (
            config(&nobody, &clickhouse_url()),
            format!("Kafka at {nobody}"),
        ),
        (
            config(&brokers(), &format!("http://{nobody}")),
            format!("ClickHouse at http://{nobody}"),
        ),
    ] {
        let started = Instant::now();
        let mut cmd = sluice(["status", "--config"]);
        let ran = run(cmd.arg(&path));
        assert_eq!(ran.code, 2, "{}", ran.stderr);
        assert!(ran.stderr.contains(&names), "{names}: {}", ran.stderr);
        assert!(started.elapsed() < Duration::from_secs(60));
    }
    let _ = std::fs::remove_dir_all(&dir);
}
