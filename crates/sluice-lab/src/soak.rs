//! `sluice lab --soak 30m`: a long run with a random fault every few
//! minutes, judged at the end by duplicates, loss and memory.
//!
//! Setup: a private broker (so it can be restarted), a ClickHouse proxy (so
//! inserts can be withheld, held or refused), a 4-partition topic, a fresh
//! table and two exactly-once sinks in one group. A producer thread writes
//! `rate` records per second, ids counting up. Every `fault_every` (±30 %)
//! one fault, picked at random, hits: kill -9 and restart a sink, SIGSTOP one
//! for 20 s, SIGTERM and restart one (a rebalance), withhold or hold an
//! insert's response after ClickHouse committed it, refuse ClickHouse for
//! 30 s, restart the broker. Each sink's RSS is sampled every 10 s. At the
//! end the producer stops, the table settles, and the report counts
//! duplicates (rows − distinct offsets), missing ids and the RSS trend.

use super::fixture::{PrivateBroker, Stack};
use super::process::{SinkProcess, SinkSpec};
use super::proxy::{Fault, Proxy};
use serde::Serialize;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const PARTITIONS: i32 = 4;

/// The faults, picked at random.
pub const FAULTS: &[&str] = &[
    "kill-9",
    "sigstop-20s",
    "graceful-restart",
    "withhold-response",
    "hold-request",
    "clickhouse-down-30s",
    "broker-restart",
];

#[derive(Debug, Clone, Copy)]
pub struct SoakOptions {
    pub duration: Duration,
    pub fault_every: Duration,
    pub rate: u64,
    pub seed: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct FaultEvent {
    pub at_s: u64,
    pub fault: &'static str,
    pub sink: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct MemorySample {
    pub at_s: u64,
    /// RSS in MiB per sink (0 while it is down).
    pub rss_mib: [f64; 2],
}

#[derive(Debug, Clone, Serialize)]
pub struct SoakReport {
    pub duration_s: u64,
    pub produced: u64,
    pub rows: u64,
    pub duplicates: u64,
    pub missing: u64,
    pub settled_after_s: Option<f64>,
    pub faults: Vec<FaultEvent>,
    pub memory: Vec<MemorySample>,
    /// Largest RSS of any sink in the first and the last third of the run.
    pub rss_first_third_mib: f64,
    pub rss_last_third_mib: f64,
}

impl SoakReport {
    /// No duplicate, no loss, and every record landed.
    pub fn is_clean(&self) -> bool {
        self.duplicates == 0 && self.missing == 0 && self.settled_after_s.is_some()
    }
}

/// A small deterministic generator (xorshift), so a seed replays a run.
struct Rng(u64);

impl Rng {
    /// Scrambles the seed (splitmix64), so small seeds start well mixed.
    fn new(seed: u64) -> Self {
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Self((z ^ (z >> 31)).max(1))
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

pub async fn run(clickhouse_url: &str, o: SoakOptions) -> anyhow::Result<SoakReport> {
    let mut rng = Rng::new(o.seed);
    let mut broker = PrivateBroker::start().await?;
    let insert_timeout = Duration::from_secs(5);
    let proxy = Proxy::start(
        Proxy::upstream_of(clickhouse_url),
        insert_timeout * 2 + Duration::from_secs(1),
    )
    .await?;
    let own = Stack {
        brokers: broker.brokers(),
        clickhouse_url: clickhouse_url.into(),
    };
    let topic = Stack::unique("soak");
    own.create_topic(&topic, PARTITIONS).await?;
    let table = own.create_table(&Stack::unique("soak"), 0).await?;
    let group = Stack::unique("soak");
    let spec = SinkSpec {
        brokers: own.brokers.clone(),
        clickhouse_url: proxy.url.clone(),
        topic: topic.clone(),
        table: table.clone(),
        group: group.clone(),
        max_batch_rows: 2_000,
        insert_timeout,
        // The default: 2 × insert_timeout + a 10 s lease + 5 s.
        fence_wait: Duration::from_secs(25),
        max_batch_age: Duration::from_millis(500),
        ..SinkSpec::default()
    };

    // The producer: `rate` records a second until told to stop; paused
    // while the broker is down.
    let produced = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let paused = Arc::new(AtomicBool::new(false));
    let producer = {
        let (own, topic) = (own.clone(), topic.clone());
        let (produced, stop, paused) = (produced.clone(), stop.clone(), paused.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let t0 = Instant::now();
                if !paused.load(Ordering::Relaxed) {
                    let start = produced.load(Ordering::Relaxed);
                    match own.produce(&topic, PARTITIONS, start, o.rate) {
                        Ok(()) => {
                            produced.fetch_add(o.rate, Ordering::Relaxed);
                        }
                        Err(e) => tracing::warn!(error = %e, "soak producer: retrying the chunk"),
                    }
                }
                std::thread::sleep(Duration::from_secs(1).saturating_sub(t0.elapsed()));
            }
        })
    };

    let mut sinks: [Option<SinkProcess>; 2] = [Some(spec.spawn_self()?), Some(spec.spawn_self()?)];
    let began = Instant::now();
    let mut faults = Vec::new();
    let mut memory = Vec::new();
    let mut next_fault = began + jitter(&mut rng, o.fault_every);
    let mut next_sample = began;
    let end = began + o.duration;
    while Instant::now() < end {
        let now = Instant::now();
        if now >= next_sample {
            next_sample = now + Duration::from_secs(10);
            let rss =
                |s: &Option<SinkProcess>| s.as_ref().map_or(0.0, |p| p.rss_kb() as f64 / 1024.0);
            memory.push(MemorySample {
                at_s: now.duration_since(began).as_secs(),
                rss_mib: [rss(&sinks[0]), rss(&sinks[1])],
            });
        }
        for (i, s) in sinks.iter_mut().enumerate() {
            if s.as_mut().is_some_and(|p| !p.is_running()) {
                anyhow::bail!(
                    "sink {i} exited during the soak: {}",
                    s.as_ref().map(|p| p.log_tail()).unwrap_or_default()
                );
            }
        }
        if now >= next_fault && now + Duration::from_secs(60) < end {
            next_fault = now + jitter(&mut rng, o.fault_every);
            let fault = FAULTS[rng.below(FAULTS.len() as u64) as usize];
            let victim = rng.below(2) as usize;
            tracing::info!(fault, victim, "soak: injecting");
            eprintln!(
                "soak: {:>5} s  {fault} (sink {victim})",
                now.duration_since(began).as_secs()
            );
            faults.push(FaultEvent {
                at_s: now.duration_since(began).as_secs(),
                fault,
                sink: victim,
            });
            match fault {
                "kill-9" => {
                    if let Some(p) = sinks[victim].as_mut() {
                        p.kill9();
                    }
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    sinks[victim] = Some(spec.spawn_self()?);
                }
                "sigstop-20s" => {
                    if let Some(p) = &sinks[victim] {
                        p.freeze();
                        tokio::time::sleep(Duration::from_secs(20)).await;
                        p.thaw();
                    }
                }
                "graceful-restart" => {
                    if let Some(mut p) = sinks[victim].take() {
                        p.stop(Duration::from_secs(60));
                    }
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    sinks[victim] = Some(spec.spawn_self()?);
                }
                "withhold-response" => proxy.arm(Fault::WithholdResponse),
                "hold-request" => proxy.arm(Fault::HoldRequest),
                "clickhouse-down-30s" => {
                    proxy.set_down(true);
                    tokio::time::sleep(Duration::from_secs(30)).await;
                    proxy.set_down(false);
                }
                _ => {
                    paused.store(true, Ordering::Relaxed);
                    broker.halt();
                    tokio::time::sleep(Duration::from_secs(20)).await;
                    broker.resume().await?;
                    paused.store(false, Ordering::Relaxed);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let _ = producer.join();
    let produced = produced.load(Ordering::Relaxed);
    let settle_from = Instant::now();
    let (got, complete_at) = own
        .quiesce(
            &table,
            (&group, &topic, PARTITIONS),
            produced,
            Duration::from_secs(5),
            Duration::from_secs(600),
        )
        .await?;
    for p in sinks.iter_mut().flatten() {
        p.stop(Duration::from_secs(60));
    }
    let third = o.duration.as_secs() / 3;
    let peak = |from: u64, to: u64| {
        memory
            .iter()
            .filter(|m| m.at_s >= from && m.at_s < to)
            .flat_map(|m| m.rss_mib)
            .fold(0.0, f64::max)
    };
    Ok(SoakReport {
        duration_s: o.duration.as_secs(),
        produced,
        rows: got.rows,
        duplicates: got.rows - got.distinct_offsets,
        missing: produced.saturating_sub(got.distinct_ids),
        settled_after_s: complete_at
            .map(|t| t.saturating_duration_since(settle_from).as_secs_f64()),
        faults,
        rss_first_third_mib: peak(60, third.max(61)),
        rss_last_third_mib: peak(2 * third, u64::MAX),
        memory,
    })
}

/// `every` ± 30 %.
fn jitter(rng: &mut Rng, every: Duration) -> Duration {
    let ms = every.as_millis() as u64;
    Duration::from_millis(ms * 7 / 10 + rng.below(ms * 6 / 10 + 1))
}

/// The report as Markdown.
pub fn markdown(r: &SoakReport, o: &SoakOptions) -> String {
    let mut s = format!(
        "# Soak run\n\n`sluice lab --soak {}` (fault every {} ± 30 %, {} records/s, seed {}), \
         two exactly-once sinks in one group on a private Apache Kafka broker, ClickHouse through a fault proxy.\n\n\
         | produced | rows | duplicates | missing | settled after | peak RSS, first third | peak RSS, last third |\n\
         |---:|---:|---:|---:|---:|---:|---:|\n| {} | {} | {} | {} | {} | {:.0} MiB | {:.0} MiB |\n\n## Faults\n\n| at | fault | sink |\n|---:|---|---:|\n",
        humantime::format_duration(o.duration),
        humantime::format_duration(o.fault_every),
        o.rate,
        o.seed,
        r.produced,
        r.rows,
        r.duplicates,
        r.missing,
        r.settled_after_s.map_or("did not settle".into(), |s| format!("{s:.0} s")),
        r.rss_first_third_mib,
        r.rss_last_third_mib,
    );
    for f in &r.faults {
        s.push_str(&format!("| {} s | {} | {} |\n", f.at_s, f.fault, f.sink));
    }
    s.push_str("\n## Memory (RSS per sink, MiB, every minute)\n\n| at | sink 0 | sink 1 |\n|---:|---:|---:|\n");
    for m in r.memory.iter().filter(|m| m.at_s % 60 < 10) {
        s.push_str(&format!(
            "| {} s | {:.0} | {:.0} |\n",
            m.at_s, m.rss_mib[0], m.rss_mib[1]
        ));
    }
    s
}
