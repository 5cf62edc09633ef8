//! Checks the product's rules within bounds given on the command line and
//! prints the size of the search and any counterexample (`make model`).
//!
//! `cargo run --release -p sluice-model --example check -- SECS RECORDS
//! REBALANCES CRASHES LOST_COMMITS RESETS FORGETS [BAD [SERVERS [REJECTED
//! [KEYS]]]]`, where BAD is a bit mask of the offsets that go to the DLQ,
//! SERVERS=2 puts a second server a second behind the first, REJECTED is a
//! bit mask of the offsets whose rows ClickHouse rejects, and KEYS gives
//! each record's business key as one digit (`001`: key dedup, the first two
//! records share a key; absent: no key dedup); `MAX_STATES` caps the search
//! and `MAX_ROWS` the rows per batch (default: RECORDS); `REFUSALS=N` lets
//! ClickHouse refuse N inserts for too many table partitions (the sink
//! splits the batch); `PARTITIONS=N` (1 to 4) gives the topic N partitions
//! of RECORDS records each, which one batch may span; `STRUCK=any` lets
//! the faults that strike one partition strike any (default: the last);
//! `MOVES=1` makes every rebalance move the partition to another process;
//! `PROCESSES=N` (1 to 3, default 2) sets the sink processes.
//! `FAIR=STALLS,SECS`
//! checks liveness too (`Fair`: at most STALLS unfair seconds, recovery
//! within SECS of the last fault); `START=clean` or `START=shared` starts
//! with a clean partition assigned to both processes (`shared`: until a
//! rebalance).

use sluice_model::{trace, Bounds, Fair, Rules, Sluice, Start, Struck};
use stateright::{Checker, Model};
use std::process::ExitCode;
use std::time::{Duration, Instant};

const USAGE: &str = "usage: check SECS RECORDS REBALANCES CRASHES LOST_COMMITS RESETS FORGETS \
                     [BAD [SERVERS [REJECTED [KEYS]]]]";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(b) = bounds(&args) else {
        eprintln!("{USAGE}\n(at most 8 records, 1 or 2 servers, one key digit per record)");
        return ExitCode::from(2);
    };
    let (secs, records) = (b.horizon.as_secs(), b.records);
    let (rebalances, crashes, lost_commits) = (b.rebalances, b.crashes, b.lost_commits);
    let (resets, forgets, bad) = (b.resets, b.forgets, b.bad);
    let keys: String = b.keys.iter().map(|k| char::from(b'0' + k)).collect();
    let cap = std::env::var("MAX_STATES").map_or(usize::MAX, |s| s.parse().expect("a count"));
    let t0 = Instant::now();
    let m = Sluice::new(Rules::SAFE, b);
    let c = m
        .clone()
        .checker()
        .threads(std::thread::available_parallelism().map_or(2, |n| n.get()))
        .target_state_count(cap)
        .spawn_bfs()
        .join();
    let complete = c.state_count() < cap;
    println!(
        "{secs} s, {} partition(s) of {records} records, rebalances/crashes/lost commits/resets/forgets {rebalances}/{crashes}/{lost_commits}/{resets}/{forgets}, DLQ mask {bad:#b}, {} server(s), rejected mask {:#b}, keys {:?}, {} rows per batch: {} states ({} unique), depth {}, {:.0?}{}",
        b.partitions,
        b.servers,
        b.rejected,
        keys,
        b.max_rows,
        c.state_count(),
        c.unique_state_count(),
        c.max_depth(),
        t0.elapsed(),
        if complete { "" } else { " (capped)" }
    );
    let mut failed = false;
    for p in m.properties() {
        let found = c.discovery(p.name);
        match (p.expectation, found) {
            (stateright::Expectation::Sometimes, None) => {
                println!("  never: {}", p.name);
                failed |= complete;
            }
            (stateright::Expectation::Sometimes, Some(_)) => {}
            (_, Some(path)) => {
                println!("  FAILS: {}\n{}", p.name, trace(&m, &path));
                failed = true;
            }
            (_, None) if p.name.starts_with("once faults stop") && b.fair.is_none() => {
                println!("  not checked (no FAIR): {}", p.name)
            }
            (_, None) => println!("  holds: {}", p.name),
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// The bounds the arguments give; `None` if they do not parse.
fn bounds(args: &[String]) -> Option<Bounds> {
    if !(7..=11).contains(&args.len()) {
        return None;
    }
    let (nums, keys) = args.split_at(args.len().min(10));
    let n: Vec<u64> = nums.iter().map(|s| s.parse().ok()).collect::<Option<_>>()?;
    let small = |i: usize, default: u64| u8::try_from(n.get(i).copied().unwrap_or(default)).ok();
    let records = n[1];
    let keys: Vec<u8> = match keys.first() {
        None => Vec::new(),
        Some(k) => k
            .bytes()
            .map(|c| c.is_ascii_digit().then(|| c - b'0'))
            .collect::<Option<_>>()?,
    };
    let servers = small(8, 1)?;
    let fits = records <= 8 && (1..=2).contains(&servers);
    if !fits || !(keys.is_empty() || keys.len() as u64 == records) {
        return None;
    }
    let max_rows = match std::env::var("MAX_ROWS") {
        Ok(s) => s.parse().ok()?,
        Err(_) => records as usize,
    };
    Some(Bounds {
        partitions: match std::env::var("PARTITIONS") {
            Ok(s) => s.parse().ok().filter(|&n| (1..=4).contains(&n))?,
            Err(_) => 1,
        },
        struck: match std::env::var("STRUCK").as_deref() {
            Ok("any") => Struck::Any,
            _ => Struck::Last,
        },
        processes: match std::env::var("PROCESSES") {
            Ok(s) => s.parse().ok().filter(|&n| (1..=3).contains(&n))?,
            Err(_) => 2,
        },
        records: records as i64,
        bad: small(7, 0)?,
        rejected: small(9, 0)?,
        // The example runs once: the keys live as long as it does.
        keys: Box::leak(keys.into_boxed_slice()),
        max_rows,
        horizon: Duration::from_secs(n[0]),
        rebalances: small(2, 0)?,
        moves: std::env::var("MOVES").is_ok_and(|v| v == "1"),
        crashes: small(3, 0)?,
        lost_commits: small(4, 0)?,
        resets: small(5, 0)?,
        forgets: small(6, 0)?,
        refusals: match std::env::var("REFUSALS") {
            Ok(s) => s.parse().ok()?,
            Err(_) => 0,
        },
        servers,
        start: match std::env::var("START").as_deref() {
            Ok("shared") => Start::SharedByBoth,
            Ok("clean") => Start::CleanToBoth,
            _ => Start::Owned,
        },
        fair: match std::env::var("FAIR") {
            Ok(f) => {
                let (stalls, recovery) = f.split_once(',')?;
                Some(Fair {
                    stalls: stalls.parse().ok()?,
                    recovery: Duration::from_secs(recovery.parse().ok()?),
                })
            }
            Err(_) => None,
        },
    })
}
