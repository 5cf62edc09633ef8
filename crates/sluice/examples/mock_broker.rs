//! A Kafka broker that is not the bottleneck: librdkafka's in-memory mock
//! cluster, so that `BENCH_KAFKA=mock make bench` measures sluice's own CPU
//! per record rather than a broker's (a JVM on the same two cores shares
//! the CPU with the sink and ClickHouse). It keeps about 5 MB
//! (compressed) per partition and trims older records: give it partitions.
//!
//! `cargo run --release --example mock_broker`
//!
//! Data flow: create a one-broker mock cluster on 127.0.0.1 → print
//! `KAFKA_BROKERS=<host:port>` on stdout → for each line `TOPIC PARTITIONS`
//! on stdin, create that topic (the mock's admin API has no controller) and
//! print `created TOPIC` → serve producers and consumers (groups and commits
//! work) until stdin closes or the process is killed. It keeps every record
//! in memory and has no transactions that isolate `read_committed` readers.

use anyhow::Context;
use rdkafka::mocking::MockCluster;
use std::io::{BufRead, Write};

fn main() -> anyhow::Result<()> {
    let mock = MockCluster::new(1)?;
    let mut out = std::io::stdout();
    writeln!(out, "KAFKA_BROKERS={}", mock.bootstrap_servers())?;
    out.flush()?;
    // Serve until whoever started us closes our stdin (or kills us).
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let (topic, partitions) = line
            .split_once(' ')
            .with_context(|| format!("expected `TOPIC PARTITIONS`, got {line:?}"))?;
        let partitions: i32 = partitions.trim().parse().context("PARTITIONS")?;
        mock.create_topic(topic, partitions, 1)?;
        writeln!(out, "created {topic}")?;
        out.flush()?;
    }
    Ok(())
}
