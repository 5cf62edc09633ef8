//! `sluice lab`: the documents' experiments, run against sluice itself.
//!
//! For each scenario × delivery mode ([`scenarios`]) the lab produces a
//! known set of records ([`fixture`]), runs `sluice run` as separate
//! processes ([`process`]), injects the fault by real means ([`proxy`],
//! kill -9, SIGSTOP), waits until the table is still and counts in
//! ClickHouse. [`report`] prints the matrix. The modes of one scenario run
//! side by side; each has its own topic, table and group.

pub mod fixture;
pub mod kafka_proxy;
pub mod poison;
pub mod process;
pub mod proxy;
pub mod reject;
pub mod report;
pub mod scenarios;
pub mod soak;

use fixture::Stack;
use scenarios::{Cell, Params, MODES, SCENARIOS};
use std::path::PathBuf;

/// What `sluice lab` was asked to do.
#[derive(Debug, Clone)]
pub struct LabOptions {
    pub stack: Stack,
    pub quick: bool,
    pub scenarios: Vec<String>,
    pub modes: Vec<String>,
    pub json: Option<PathBuf>,
    pub markdown: Option<PathBuf>,
    /// Render a saved run (its JSON) instead of running anything.
    pub render: Option<PathBuf>,
}

/// Runs the matrix, prints it, writes the files; returns the cells.
pub async fn run(o: LabOptions) -> anyhow::Result<Vec<Cell>> {
    let scenarios: Vec<String> = if o.scenarios.is_empty() {
        SCENARIOS.iter().map(|s| s.to_string()).collect()
    } else {
        o.scenarios.clone()
    };
    let modes: Vec<&'static str> = if o.modes.is_empty() {
        MODES.to_vec()
    } else {
        o.modes
            .iter()
            .map(|m| {
                MODES.iter().copied().find(|k| k == m).ok_or_else(|| {
                    anyhow::anyhow!("unknown mode {m:?}; known: {}", MODES.join(", "))
                })
            })
            .collect::<anyhow::Result<_>>()?
    };
    for s in &scenarios {
        if !SCENARIOS.contains(&s.as_str()) {
            anyhow::bail!("unknown scenario {s:?}; known: {}", SCENARIOS.join(", "));
        }
    }
    if let Some(saved) = &o.render {
        return render(saved, o.markdown.as_deref());
    }
    let params = if o.quick {
        Params::quick()
    } else {
        Params::full()
    };
    let mut cells = Vec::new();
    for s in &scenarios {
        eprintln!("lab: {s} ({})", modes.join(", "));
        let runs = modes.iter().map(|m| scenarios::run(&o.stack, s, m, params));
        for (m, r) in modes.iter().zip(futures::future::join_all(runs).await) {
            let cell = r.map_err(|e| anyhow::anyhow!("{s} / {m}: {e:#}"))?;
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
    }
    let mode_names: Vec<String> = modes.iter().map(|m| m.to_string()).collect();
    println!("{}", report::terminal(&cells, &scenarios, &mode_names));
    if let Some(p) = &o.markdown {
        std::fs::write(p, report::markdown(&cells, &scenarios, &mode_names))?;
    }
    if let Some(p) = &o.json {
        std::fs::write(p, serde_json::to_string_pretty(&cells)?)?;
    }
    Ok(cells)
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
