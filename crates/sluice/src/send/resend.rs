//! `sluice resend`: a manual re-send that sends only what is missing.
//!
//! In: records (a retry table's export, or a `sluice send` retry file), the
//! table they should be in and the key field. Out: the records whose key
//! the table does not hold, sent with `sluice send`'s producer; a report of
//! how many were sent, skipped (already there) and failed (retry file).
//! Keys are looked up in batches (`key IN (…)`, which ClickHouse converts
//! to the column's type). A record still in flight through the sink when
//! the lookup runs looks missing: run it once the sink has caught up, or
//! let the sink's key dedup drop the copy.

use super::input::{key_of, Line};
use super::{send, ProducerArgs, SendError, SendOptions, SendReport};
use crate::ch::ChServer;
use crate::report::Outcome;
use crate::sql::{ident, literal, TableRef};
use anyhow::Context;
use std::collections::HashSet;
use std::path::PathBuf;

/// `sluice resend`'s command line.
#[derive(Debug, Clone, clap::Args)]
pub struct ResendArgs {
    /// The table the records should be in, as DB.TABLE.
    #[arg(long, value_parser = TableRef::parse)]
    pub(crate) table: TableRef,
    /// Only list what would be sent and skipped.
    #[arg(long)]
    pub(crate) dry_run: bool,
    #[command(flatten)]
    pub(crate) producer: ProducerArgs,
    #[command(flatten)]
    pub(crate) ch: ChServer,
    /// Input files of JSON lines (or a retry file).
    pub(crate) files: Vec<PathBuf>,
}

/// `sluice resend`: looks the records' keys up, sends the missing ones (or
/// lists them with `--dry-run`), prints the tally on stderr; found
/// something when a record ended in the retry file.
pub async fn main(a: ResendArgs) -> anyhow::Result<Outcome> {
    let key = a
        .producer
        .key_field
        .clone()
        .context("--key-field is required: resend looks records up by their key")?;
    let lines = super::input::read_all(&a.files)?;
    let mut opts = a.producer.options()?;
    opts.framing = a.producer.framing().await?.map(std::sync::Arc::new);
    let conn = a.ch.connect(a.producer.config.as_deref())?;
    let r = resend(&conn.client, &a.table, &key, &opts, lines, a.dry_run).await?;
    if a.dry_run {
        for s in &r.missing {
            println!("send {s}");
        }
    }
    let failed = r.send.as_ref().map_or(0, |s| s.failed);
    let what = if a.dry_run {
        "to send (dry run)"
    } else {
        "sent"
    };
    let retry = match failed {
        0 => String::new(),
        n => format!(
            ", {n} of them in the retry file ({})",
            opts.retry_file.display()
        ),
    };
    eprintln!(
        "sluice resend: {} read, {} already in {} (skipped), {} {what}{retry}",
        r.read,
        r.skipped,
        a.table,
        r.missing.len()
    );
    Ok(Outcome::found_if(failed > 0))
}

/// Keys looked up per query.
pub(crate) const LOOKUP_BATCH: usize = 5_000;

#[derive(Debug, Default, serde::Serialize)]
pub(crate) struct ResendReport {
    pub(crate) read: u64,
    /// Already in the table: not sent.
    pub(crate) skipped: u64,
    /// The records to send (sent, unless a dry run).
    pub(crate) missing: Vec<String>,
    pub(crate) send: Option<SendReport>,
}

/// The lookup for one batch of keys.
pub(crate) fn lookup_sql(table: &TableRef, field: &str, keys: &[&str]) -> String {
    let list: Vec<String> = keys.iter().map(|k| literal(k)).collect();
    format!(
        "SELECT DISTINCT toString({f}) FROM {} WHERE {f} IN ({})",
        table.sql(),
        list.join(", "),
        f = ident(field)
    )
}

/// Splits `lines` into those whose key the table holds and the rest, then
/// sends the rest (unless `dry_run`).
pub(crate) async fn resend(
    client: &clickhouse::Client,
    table: &TableRef,
    key_field: &str,
    opts: &SendOptions,
    lines: Vec<Line>,
    dry_run: bool,
) -> Result<ResendReport, SendError> {
    let mut report = ResendReport {
        read: lines.len() as u64,
        ..ResendReport::default()
    };
    let mut to_send: Vec<Line> = Vec::new();
    for chunk in lines.chunks(LOOKUP_BATCH) {
        // A record without a usable key cannot be checked: it is sent, and
        // `sluice send` puts it in the retry file with the reason.
        let keyed: Vec<(&Line, String)> = chunk
            .iter()
            .filter_map(|l| key_of(&l.text, key_field).ok().map(|k| (l, k)))
            .collect();
        let keys: Vec<&str> = keyed.iter().map(|(_, k)| k.as_str()).collect();
        let present: HashSet<String> = if keys.is_empty() {
            HashSet::new()
        } else {
            client
                .query(&lookup_sql(table, key_field, &keys))
                .fetch_all::<String>()
                .await
                .map_err(|e| SendError::Invalid(format!("looking the keys up in {table}: {e}")))?
                .into_iter()
                .collect()
        };
        for l in chunk {
            match key_of(&l.text, key_field) {
                Ok(k) if present.contains(&k) => report.skipped += 1,
                _ => {
                    report.missing.push(l.source.clone());
                    to_send.push(l.clone());
                }
            }
        }
    }
    if !dry_run && !to_send.is_empty() {
        let opts = opts.clone();
        let r = tokio::task::spawn_blocking(move || send(&opts, &to_send))
            .await
            .map_err(|e| SendError::Invalid(format!("the producer thread failed: {e}")))??;
        report.send = Some(r);
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_quotes_keys() {
        let t = TableRef::parse("shop.orders").unwrap();
        assert_eq!(
            lookup_sql(&t, "order_id", &["1", "it's"]),
            "SELECT DISTINCT toString(`order_id`) FROM `shop`.`orders` WHERE `order_id` IN ('1', 'it\\'s')"
        );
    }
}
