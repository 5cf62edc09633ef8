//! Matrix cells → a terminal table, Markdown and JSON.
//!
//! Rows are scenarios, column groups are delivery modes; each cell reads
//! `duplicates / missing`, with `STALL` when the sink needed an operator.

use super::scenarios::Cell;
use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};

fn cell_text(c: Option<&Cell>) -> String {
    match c {
        None => "—".into(),
        Some(c) => {
            let mut s = format!("{} dup / {} miss", c.duplicates, c.missing);
            if let Some(d) = c.dlq {
                s.push_str(&format!(" · {d} DLQ"));
            }
            if let Some(n) = c.dlq_copies.filter(|n| *n > 0) {
                s.push_str(&format!(" (+{n} copies)"));
            }
            if c.error.is_some() {
                s.push_str(" ERROR");
            } else if c.stalled {
                s.push_str(" STALL");
            } else if let Some(r) = c.recovery_s {
                s.push_str(&format!(" · {r:.0} s"));
            }
            if !c.fault_injected {
                s.push_str(" (no fault)");
            }
            s
        }
    }
}

fn grid(cells: &[Cell], scenarios: &[String], modes: &[String]) -> Vec<Vec<String>> {
    scenarios
        .iter()
        .map(|s| {
            let mut row = vec![s.clone()];
            for m in modes {
                row.push(cell_text(
                    cells.iter().find(|c| &c.scenario == s && &c.mode == m),
                ));
            }
            row
        })
        .collect()
}

/// The matrix as a table for a terminal.
pub fn terminal(cells: &[Cell], scenarios: &[String], modes: &[String]) -> String {
    let mut t = Table::new();
    t.load_style(UTF8_FULL_CONDENSED);
    let mut header = vec!["scenario".to_string()];
    header.extend(modes.iter().cloned());
    t.set_header(header);
    for row in grid(cells, scenarios, modes) {
        t.add_row(row);
    }
    t.to_string()
}

/// The matrix as a Markdown table, with the produced counts.
pub fn markdown(cells: &[Cell], scenarios: &[String], modes: &[String]) -> String {
    let mut out = format!(
        "| scenario | {} |\n|---|{}\n",
        modes.join(" | "),
        "---|".repeat(modes.len())
    );
    for row in grid(cells, scenarios, modes) {
        out.push_str(&format!("| {} |\n", row.join(" | ")));
    }
    out.push_str(
        "\nEach cell: duplicate rows / missing records, counted in ClickHouse, and the seconds from \
         the end of the fault until every record had landed; STALL = the sink stopped making \
         progress without an operator; ERROR = the harness could not measure the cell.\n",
    );
    for c in cells.iter().filter(|c| c.error.is_some()) {
        let e = c.error.as_deref().unwrap_or_default();
        out.push_str(&format!("\n- {} / {}: {e}", c.scenario, c.mode));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(s: &str, m: &str, dup: u64, stalled: bool) -> Cell {
        Cell {
            scenario: s.into(),
            mode: m.into(),
            produced: 10,
            rows: 10 + dup,
            duplicates: dup,
            missing: 0,
            stalled,
            recovery_s: Some(1.0),
            fault_injected: true,
            dlq: None,
            dlq_copies: None,
            error: None,
        }
    }

    #[test]
    fn a_cell_the_harness_failed_says_so() {
        let cells = vec![Cell::failed(
            "poison",
            "exactly-once",
            "metadata timed out".into(),
        )];
        let (s, m) = (vec!["poison".to_string()], vec!["exactly-once".to_string()]);
        let md = markdown(&cells, &s, &m);
        assert!(md.contains("ERROR"), "{md}");
        assert!(
            md.contains("- poison / exactly-once: metadata timed out"),
            "{md}"
        );
        assert!(!terminal(&cells, &s, &m).contains("STALL"));
    }

    #[test]
    fn renders_every_cell() {
        let cells = vec![
            cell("crash", "exactly-once", 0, false),
            cell("crash", "at-least-once", 5, true),
        ];
        let (s, m) = (
            vec!["crash".to_string()],
            vec!["exactly-once".to_string(), "at-least-once".to_string()],
        );
        let md = markdown(&cells, &s, &m);
        assert!(
            md.contains("| crash | 0 dup / 0 miss · 1 s | 5 dup / 0 miss STALL |"),
            "{md}"
        );
        let t = terminal(&cells, &s, &m);
        assert!(t.contains("5 dup / 0 miss STALL"), "{t}");
    }
}
