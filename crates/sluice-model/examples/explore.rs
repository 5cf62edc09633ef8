//! `cargo run --release -p sluice-model --example explore -- SECS REBALANCES CRASHES LOST RESETS [RECORDS]`
use sluice_model::{Bounds, Rules, Sluice};
use stateright::{Checker, Model};
use std::time::{Duration, Instant};

fn main() {
    let a: Vec<u64> = std::env::args()
        .skip(1)
        .map(|s| s.parse().unwrap())
        .collect();
    let mut b = Bounds::CI;
    b.horizon = Duration::from_secs(a[0]);
    (b.rebalances, b.crashes, b.lost_commits, b.resets) =
        (a[1] as u8, a[2] as u8, a[3] as u8, a[4] as u8);
    if let Some(&r) = a.get(5) {
        (b.records, b.max_rows) = (r as i64, r as usize);
    }
    let t0 = Instant::now();
    let m = Sluice::new(Rules::SAFE, b);
    let c = m
        .clone()
        .checker()
        .threads(2)
        .target_state_count(30_000_000)
        .spawn_bfs()
        .join();
    println!(
        "{a:?}: {} states ({} unique), depth {}, {:?}",
        c.state_count(),
        c.unique_state_count(),
        c.max_depth(),
        t0.elapsed()
    );
    for (name, path) in c.discoveries() {
        println!("== {name}\n{}", sluice_model::trace(&m, &path));
    }
}
