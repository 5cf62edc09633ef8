//! `sluice status`: how far behind ClickHouse is, per route and partition.
//!
//! Data flow: `read` takes a reading of every partition from Kafka and
//! ClickHouse (read-only) → `progress` works out the lag in records and in
//! time and how long a lagging partition has not moved → printed as a table
//! (or a JSON object per reading). Once by default; `--watch` redraws it
//! every `--interval`, like `top`; `--stuck-after` watches until each
//! lagging partition has moved, and ends with exit 1 if one did not within
//! that time.

mod progress;
mod read;

use crate::config::{ConfigArgs, Overrides};
use crate::report::Outcome;
use comfy_table::{presets::UTF8_FULL_CONDENSED, Cell, CellAlignment, Table};
use progress::{Movement, Reading};
use std::io::{IsTerminal, Write};
use std::time::Duration;

#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub(crate) config: ConfigArgs,
    /// Redraw every --interval until interrupted.
    #[arg(long)]
    pub(crate) watch: bool,
    /// Time between readings with --watch or --stuck-after.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub(crate) interval: Duration,
    /// Watch until every partition with lag has moved; exit 1 if one has
    /// not moved for this long. With --watch, mark such partitions STUCK.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub(crate) stuck_after: Option<Duration>,
    /// One JSON object per reading on stdout, instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
}

pub async fn main(
    a: StatusArgs,
    stop: impl std::future::Future<Output = ()>,
) -> anyhow::Result<Outcome> {
    let cfg = a.config.load(Overrides::default())?;
    let reader = read::Reader::connect(&cfg).await?;
    let mut movement = Movement::default();
    let redraw = a.watch && !a.json && std::io::stdout().is_terminal();
    tokio::pin!(stop);
    loop {
        let readings = reader.read().await?;
        let now = unix_ms();
        let rows: Vec<Row> = readings
            .into_iter()
            .map(|(route, r)| Row {
                idle: movement.observe(&r, now),
                route,
                r,
            })
            .collect();
        let threshold = a.stuck_after;
        let stuck = |row: &Row| threshold.is_some_and(|t| row.idle >= t);
        let mut out = std::io::stdout().lock();
        if a.json {
            writeln!(out, "{}", json(&reader, &rows, now, &stuck))?;
        } else {
            if redraw {
                write!(out, "\x1b[2J\x1b[H")?;
            }
            write!(
                out,
                "{}",
                table(&reader, &rows, a.watch || threshold.is_some(), &stuck)
            )?;
        }
        out.flush()?;
        drop(out);
        match threshold {
            _ if a.watch => {}
            None => return Ok(Outcome::Clean),
            Some(_) if rows.iter().any(&stuck) => {
                let names: Vec<String> = rows
                    .iter()
                    .filter(|r| stuck(r))
                    .map(|r| format!("{}[{}]", r.r.topic, r.r.partition))
                    .collect();
                eprintln!(
                    "sluice status: stuck (lag, and no progress for {}): {}",
                    humantime::format_duration(threshold.unwrap_or_default()),
                    names.join(", ")
                );
                return Ok(Outcome::Found);
            }
            // Every partition with lag has moved since its lag appeared.
            Some(_) if movement.all_moving() => return Ok(Outcome::Clean),
            Some(_) => {}
        }
        tokio::select! {
            _ = tokio::time::sleep(a.interval) => {}
            _ = &mut stop => return Ok(Outcome::Clean),
        }
    }
}

/// A partition's reading, its route, and how long it has lagged unmoved.
struct Row {
    route: usize,
    r: Reading,
    idle: Duration,
}

fn table(reader: &read::Reader, rows: &[Row], idle: bool, stuck: &dyn Fn(&Row) -> bool) -> String {
    let mut out = format!("group {}\n", reader.group_id());
    for (ri, route) in reader.routes().iter().enumerate() {
        let mut t = Table::new();
        t.load_style(UTF8_FULL_CONDENSED);
        let mut header = vec![
            "partition",
            "high watermark",
            "committed",
            "in ClickHouse",
            "lag",
            "lag time",
            "owner",
        ];
        if idle {
            header.push("idle");
        }
        t.set_header(header);
        for row in rows.iter().filter(|r| r.route == ri) {
            let r = &row.r;
            let opt = |o: Option<i64>| o.map_or("-".to_string(), |o| o.to_string());
            let mut cells = vec![
                Cell::new(r.partition).set_alignment(CellAlignment::Right),
                Cell::new(r.high_watermark).set_alignment(CellAlignment::Right),
                Cell::new(opt(r.committed)).set_alignment(CellAlignment::Right),
                Cell::new(opt(r.stored)).set_alignment(CellAlignment::Right),
                Cell::new(r.lag_records()).set_alignment(CellAlignment::Right),
                Cell::new(r.lag_time().map_or("?".into(), short))
                    .set_alignment(CellAlignment::Right),
                Cell::new(r.owner.as_deref().unwrap_or("-")),
            ];
            if idle {
                let mark = if stuck(row) { " STUCK" } else { "" };
                cells.push(Cell::new(format!("{}{mark}", short(row.idle))));
            }
            t.add_row(cells);
        }
        out.push_str(&format!(
            "{} → {}.{}\n{t}\n",
            route.topic, route.database, route.table
        ));
    }
    out
}

fn json(
    reader: &read::Reader,
    rows: &[Row],
    now: i64,
    stuck: &dyn Fn(&Row) -> bool,
) -> serde_json::Value {
    let parts: Vec<serde_json::Value> = rows
        .iter()
        .map(|row| {
            let r = &row.r;
            serde_json::json!({
                "topic": r.topic,
                "table": format!("{}.{}", reader.routes()[row.route].database, reader.routes()[row.route].table),
                "partition": r.partition,
                "low_watermark": r.low_watermark,
                "high_watermark": r.high_watermark,
                "committed": r.committed,
                "clickhouse_offset": r.stored,
                "done": r.done(),
                "lag_records": r.lag_records(),
                "lag_seconds": r.lag_time().map(|d| d.as_secs_f64()),
                "owner": r.owner,
                "idle_seconds": row.idle.as_secs_f64(),
                "stuck": stuck(row),
            })
        })
        .collect();
    serde_json::json!({ "at_ms": now, "group": reader.group_id(), "partitions": parts })
}

/// `3m12s`, `850ms`: a duration in at most two units.
fn short(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0 if d.is_zero() => "0s".into(),
        0 => format!("{}ms", d.as_millis()),
        1..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86400, s % 86400 / 3600),
    }
}

fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use super::short;
    use std::time::Duration;

    #[test]
    fn durations_read_short() {
        let s = Duration::from_secs;
        assert_eq!(short(Duration::ZERO), "0s");
        assert_eq!(short(Duration::from_millis(850)), "850ms");
        assert_eq!(short(s(42)), "42s");
        assert_eq!(short(s(192)), "3m12s");
        assert_eq!(short(s(7260)), "2h01m");
        assert_eq!(short(s(90000)), "1d01h");
    }
}
