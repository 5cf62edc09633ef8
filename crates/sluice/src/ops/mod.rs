//! The operator tools: measure and repair duplicates in a table.
//!
//! - [`window`]: `sluice window`, the dedup window in seconds from
//!   `system.part_log`, against the client's re-submit interval.
//! - [`audit`]: `sluice audit`, duplicate rows counted by entry point.
//! - [`repair`]: `sluice repair`, the `REPLACE PARTITION` runbook, made safe.
//! - [`schema`]: `sluice schema`, the recommended DDL for a target table.
//! - `db`: the table introspection they share.
//!
//! Each tool reads ClickHouse only through SQL it builds in one place, prints
//! an aligned report (or JSON) to stdout and progress to stderr, and ends in
//! an [`Outcome`](crate::report::Outcome): exit 0 when clean, 1 when it found something, 2 on
//! error. Each reaches ClickHouse through a [`Conn`](crate::ch::Conn) built
//! from its flags.

pub mod audit;
pub(crate) mod db;
pub mod repair;
pub mod schema;
pub mod window;

use indicatif::{ProgressBar, ProgressStyle};
use std::time::Duration;

/// Why a tool stopped.
#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    #[error(transparent)]
    ClickHouse(#[from] crate::ch::ChError),
    /// Bad arguments, or a table the tool cannot work on.
    #[error("{0}")]
    Invalid(String),
    /// `repair` found the partition still receiving writes.
    #[error("refused: {0}")]
    Refused(String),
    /// A step of `repair --execute` failed before the replace and left
    /// sluice tables behind.
    #[error("{error}. {left}")]
    Left { error: Box<OpsError>, left: String },
}

impl OpsError {
    /// ClickHouse could not be reached at all.
    pub fn is_unreachable(&self) -> bool {
        match self {
            Self::ClickHouse(c) => c.kind == crate::ch::ChErrorKind::Connect,
            Self::Left { error, .. } => error.is_unreachable(),
            _ => false,
        }
    }
}

impl From<clickhouse::error::Error> for OpsError {
    fn from(e: clickhouse::error::Error) -> Self {
        Self::ClickHouse(e.into())
    }
}

/// Prints a report: JSON with `json`, else `render`ed for people.
pub(crate) fn emit<R: serde::Serialize>(
    json: bool,
    report: &R,
    render: fn(&R) -> String,
) -> Result<(), OpsError> {
    if json {
        let text = serde_json::to_string_pretty(report)
            .map_err(|e| OpsError::Invalid(format!("cannot write the report as JSON: {e}")))?;
        println!("{text}");
    } else {
        print!("{}", render(report));
    }
    Ok(())
}

/// A spinner on stderr for a long step; hidden when `show` is false or
/// stderr is not a terminal.
pub(crate) fn progress(show: bool, msg: &'static str) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new_spinner().with_message(msg);
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    bar.enable_steady_tick(Duration::from_millis(120));
    bar
}

/// 19282 → "19,282".
pub(crate) fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn thousands() {
        assert_eq!(super::thousands(0), "0");
        assert_eq!(super::thousands(999), "999");
        assert_eq!(super::thousands(19_282), "19,282");
        assert_eq!(super::thousands(2_000_000), "2,000,000");
    }
}
