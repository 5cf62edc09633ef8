//! Checks the product's rules within bounds given on the command line and
//! prints the size of the search and any counterexample (`make model`).
//!
//! `cargo run --release -p sluice-model --example check -- SECS RECORDS
//! REBALANCES CRASHES LOST_COMMITS RESETS FORGETS [BAD [SERVERS]]`, where
//! BAD is a bit mask of the offsets that go to the DLQ and SERVERS=2 puts a
//! second server a second behind the first; `MAX_STATES` caps the search.

use sluice_model::{trace, Bounds, Rules, Sluice};
use stateright::{Checker, Model};
use std::process::ExitCode;
use std::time::{Duration, Instant};

fn main() -> ExitCode {
    let a: Vec<u64> = std::env::args()
        .skip(1)
        .map(|s| s.parse().expect("whole numbers"))
        .collect();
    let usage =
        "usage: check SECS RECORDS REBALANCES CRASHES LOST_COMMITS RESETS FORGETS [BAD [SERVERS]]";
    let (&[secs, records, rebalances, crashes, lost_commits, resets, forgets], rest) =
        a.split_at(a.len().min(7))
    else {
        eprintln!("{usage}");
        return ExitCode::from(2);
    };
    let (bad, servers) = match *rest {
        [] => (0, 1),
        [bad] => (bad, 1),
        [bad, servers] => (bad, servers),
        _ => {
            eprintln!("{usage}");
            return ExitCode::from(2);
        }
    };
    if records > 8 || !(1..=2).contains(&servers) {
        eprintln!("at most 8 records (BAD is a byte), and 1 or 2 servers");
        return ExitCode::from(2);
    }
    let b = Bounds {
        records: records as i64,
        bad: bad as u8,
        max_rows: records as usize,
        horizon: Duration::from_secs(secs),
        rebalances: rebalances as u8,
        crashes: crashes as u8,
        lost_commits: lost_commits as u8,
        resets: resets as u8,
        forgets: forgets as u8,
        servers: servers as u8,
        ..Bounds::CI
    };
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
        "{secs} s, {records} records, rebalances/crashes/lost commits/resets/forgets {rebalances}/{crashes}/{lost_commits}/{resets}/{forgets}, DLQ mask {bad:#b}, {} server(s): {} states ({} unique), depth {}, {:.0?}{}",
        b.servers,
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
            (_, None) => println!("  holds: {}", p.name),
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
