//! `sluice lab`: the documents' experiments, run against sluice itself.
//!
//! For each scenario × delivery mode ([`scenarios`]) the lab produces a
//! known set of records ([`fixture`]), runs `sluice run` as separate
//! processes ([`process`]), injects the fault by real means ([`proxy`],
//! kill -9, SIGSTOP), waits until the table is still and counts in
//! ClickHouse. [`report`] prints the matrix. The modes of one scenario run
//! side by side on the broker `--brokers` names, each with its own topic,
//! table and group (a scenario that restarts or cuts off a broker starts one
//! of its own); `--jobs` scenarios (3) run at once, reported in the matrix's
//! order.

pub mod children;
pub mod fixture;
pub mod kafka_proxy;
pub mod poison;
pub mod process;
pub mod proxy;
pub mod reject;
pub mod report;
pub mod scenarios;
pub mod soak;

use clap::builder::PossibleValuesParser;
use fixture::Stack;
use futures::StreamExt as _;
use scenarios::{Cell, Params, MODES, SCENARIOS};
use sluice::report::Outcome;
use std::path::PathBuf;
use std::time::Duration;

/// `sluice lab`'s flags.
#[derive(Debug, Clone, clap::Args)]
pub struct LabArgs {
    /// A reduced version of every scenario (minutes, not an hour).
    #[arg(long)]
    pub quick: bool,
    /// Scenarios to run (default: all).
    #[arg(long = "scenario", value_name = "NAME", value_parser = PossibleValuesParser::new(SCENARIOS))]
    pub scenarios: Vec<String>,
    /// Delivery modes to compare (default: all).
    #[arg(long = "mode", value_name = "MODE", value_parser = PossibleValuesParser::new(MODES))]
    pub modes: Vec<String>,
    /// Scenarios run at once (each mode of each side by side); the report
    /// keeps the matrix's order.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..))]
    pub jobs: u16,
    /// Also write every count as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Also write the matrix (or the soak report) as Markdown.
    #[arg(long)]
    pub markdown: Option<PathBuf>,
    /// Render a saved run's JSON (with --markdown, to a file) and exit.
    #[arg(long, value_name = "JSON")]
    pub render: Option<PathBuf>,
    /// Instead of the matrix: a soak run this long (e.g. 30m) with a
    /// random fault every --fault-every; exit 1 on any duplicate or loss.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub soak: Option<Duration>,
    /// Soak: the mean time between faults.
    #[arg(long, default_value = "3m", value_parser = humantime::parse_duration)]
    pub fault_every: Duration,
    /// Soak: records produced per second.
    #[arg(long, default_value_t = 500)]
    pub rate: u64,
    /// Soak: the seed of the fault sequence (default: the clock).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Kafka bootstrap servers the cells share. (The scenarios that restart
    /// or cut off a broker start one of their own, with
    /// SLUICE_STACK_KAFKA_NODE.)
    #[arg(long, env = "KAFKA_BROKERS")]
    pub brokers: String,
    /// ClickHouse HTTP URL.
    #[arg(long, env = "CLICKHOUSE_URL")]
    pub clickhouse_url: String,
}

/// Runs what the flags ask for: the matrix (clean unless it fails to run),
/// a soak run (found something on any duplicate, loss or stall), or the
/// rendering of a saved run. When `stop` resolves (SIGINT, SIGTERM) the work
/// is dropped, and with it the sinks and brokers it started.
pub async fn main(
    a: LabArgs,
    stop: impl std::future::Future<Output = ()>,
) -> anyhow::Result<Outcome> {
    tokio::select! {
        r = work(a) => r,
        () = stop => {
            children::kill_all();
            anyhow::bail!(
                "interrupted: stopped the lab's sinks and brokers (finished scenarios are saved)"
            )
        }
    }
}

async fn work(a: LabArgs) -> anyhow::Result<Outcome> {
    let Some(duration) = a.soak else {
        run(&a).await?;
        return Ok(Outcome::Clean);
    };
    let o = soak::SoakOptions {
        duration,
        fault_every: a.fault_every,
        rate: a.rate,
        seed: a.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_secs())
        }),
    };
    let r = soak::run(&a.clickhouse_url, o).await?;
    let md = soak::markdown(&r, &o);
    println!("{md}");
    if let Some(p) = &a.markdown {
        std::fs::write(p, &md)?;
    }
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_string_pretty(&r)?)?;
    }
    Ok(if r.is_clean() {
        Outcome::Clean
    } else {
        Outcome::Found
    })
}

/// Runs the matrix, prints it, writes the files; returns the cells.
pub async fn run(o: &LabArgs) -> anyhow::Result<Vec<Cell>> {
    // Clap checked the names; asked for or all of them, in the lists' order.
    let pick = |all: &[&'static str], asked: &[String]| -> Vec<&'static str> {
        all.iter()
            .copied()
            .filter(|k| asked.is_empty() || asked.iter().any(|a| a == k))
            .collect()
    };
    let modes = pick(MODES, &o.modes);
    let scenarios: Vec<String> = pick(SCENARIOS, &o.scenarios)
        .into_iter()
        .map(String::from)
        .collect();
    if let Some(saved) = &o.render {
        return render(saved, o.markdown.as_deref());
    }
    let params = if o.quick {
        Params::quick()
    } else {
        Params::full()
    };
    // `--jobs` scenarios at once; `buffered` hands them back in the
    // matrix's order, so the report and the saves after each one are the
    // same as one at a time.
    let one = |s: String| {
        let modes = &modes;
        async move {
            let modes: Vec<&'static str> = modes
                .iter()
                .copied()
                .filter(|m| scenarios::applies(&s, m))
                .collect();
            eprintln!("lab: {s} ({})", modes.join(", "));
            // A task per cell: a cell that blocks its thread (a sink's
            // stop waits for the process) holds up no other cell's clock.
            let runs = modes.iter().map(|m| {
                let (s, m) = (s.clone(), *m);
                let stack = Stack {
                    brokers: o.brokers.clone(),
                    clickhouse_url: o.clickhouse_url.clone(),
                };
                tokio::spawn(async move { scenarios::run(&stack, &s, m, params).await })
            });
            let results: Vec<anyhow::Result<Cell>> = futures::future::join_all(runs)
                .await
                .into_iter()
                .map(|r| r.unwrap_or_else(|e| Err(anyhow::anyhow!("the cell's task ended: {e}"))))
                .collect();
            (s, modes, results)
        }
    };
    let mut done =
        futures::stream::iter(scenarios.iter().cloned().map(one)).buffered(usize::from(o.jobs));
    let mut cells = Vec::new();
    while let Some((s, ran, results)) = futures::StreamExt::next(&mut done).await {
        eprintln!("lab: {s} done");
        for (m, r) in ran.iter().zip(results) {
            // A harness failure costs its cell, not the hours of the others.
            let cell = r.unwrap_or_else(|e| {
                eprintln!("  {m}: the harness failed: {e:#}");
                Cell::failed(&s, m, format!("{e:#}"))
            });
            eprintln!(
                "  {m}: produced {} rows {} duplicates {} missing {}{}",
                cell.produced,
                cell.rows,
                cell.duplicates,
                cell.missing,
                if cell.stalled { " STALLED" } else { "" }
            );
            cells.push(cell);
        }
        // After every scenario: an interrupted run keeps what it measured.
        save(o, &cells, &scenarios, &modes)?;
    }
    drop(done);
    let modes: Vec<String> = modes.into_iter().map(String::from).collect();
    println!("{}", report::terminal(&cells, &scenarios, &modes));
    let failed: Vec<String> = cells
        .iter()
        .filter(|c| c.error.is_some())
        .map(|c| format!("{} / {}", c.scenario, c.mode))
        .collect();
    anyhow::ensure!(
        failed.is_empty(),
        "the harness could not measure {} (the other cells are saved)",
        failed.join(", ")
    );
    Ok(cells)
}

/// Writes the cells so far to `--markdown` and `--json`, if asked.
fn save(o: &LabArgs, cells: &[Cell], scenarios: &[String], modes: &[&str]) -> anyhow::Result<()> {
    let modes: Vec<String> = modes.iter().map(|m| m.to_string()).collect();
    if let Some(p) = &o.markdown {
        std::fs::write(p, report::markdown(cells, scenarios, &modes))?;
    }
    if let Some(p) = &o.json {
        std::fs::write(p, serde_json::to_string_pretty(cells)?)?;
    }
    Ok(())
}

/// Prints a saved run (its JSON) and, with `markdown`, writes it as Markdown.
fn render(
    saved: &std::path::Path,
    markdown: Option<&std::path::Path>,
) -> anyhow::Result<Vec<Cell>> {
    let cells: Vec<Cell> = serde_json::from_slice(&std::fs::read(saved)?)
        .map_err(|e| anyhow::anyhow!("{} is not a lab JSON file: {e}", saved.display()))?;
    let scenarios: Vec<String> = SCENARIOS
        .iter()
        .filter(|s| cells.iter().any(|c| c.scenario == **s))
        .map(|s| s.to_string())
        .collect();
    let modes: Vec<String> = MODES
        .iter()
        .filter(|m| cells.iter().any(|c| c.mode == **m))
        .map(|m| m.to_string())
        .collect();
    println!("{}", report::terminal(&cells, &scenarios, &modes));
    if let Some(p) = markdown {
        std::fs::write(p, report::markdown(&cells, &scenarios, &modes))?;
    }
    Ok(cells)
}
