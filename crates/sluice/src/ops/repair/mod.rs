//! `sluice repair`: the `REPLACE PARTITION` runbook, made safe.
//!
//! In: a table, one of its partitions (by ID) and a business key. Out: the
//! partition with one row per key (the one with the highest `_offset`), a
//! backup table holding the partition as it was, and a summary.
//!
//! The steps, each verified before the next:
//! 1. snapshot the partition: rows, distinct keys, highest offset;
//! 2. create a staging and a backup table of identical structure (plain
//!    `MergeTree`, same partition and sorting keys, so no merge folds rows
//!    behind our back and no Keeper path is shared);
//! 3. copy the partition into the backup (`REPLACE PARTITION … FROM`, hard
//!    links) and check it matches the snapshot;
//! 4. fill the staging table from the backup, one row per key, and check
//!    rows = distinct keys = the snapshot's keys;
//! 5. check the partition still matches the snapshot, then
//!    `REPLACE PARTITION … FROM staging`;
//! 6. check the partition matches staging, look in `system.part_log` for
//!    any write that landed between the last check and the replace, drop
//!    staging and keep the backup.
//!
//! A partition that changes between the snapshot and the replace is a
//! partition still receiving writes: the repair rolls back and refuses.
//! Without `--execute` nothing is changed; the plan and the counts are
//! printed. Interrupted at any step and run again, it reads which sluice
//! tables exist and what they hold, and either rolls back or finishes
//! (`decide`).

mod plan;

pub(crate) use plan::{decide, plan, Decision, Leftovers, Plan, Snapshot};

use super::db::{parse_columns, Columns, Table, TableInfo};
use super::{thousands, OpsError};
use crate::ch::{ChArgs, Conn};
use crate::report::{grid, Outcome};
use crate::sql::{ident as qi, ident_list, literal, TableRef};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

#[derive(Debug, Clone, clap::Args)]
pub struct RepairArgs {
    /// The table, as DB.TABLE.
    #[arg(long, value_parser = TableRef::parse)]
    pub(crate) table: TableRef,
    /// The partition's ID (`system.parts.partition_id`; `sluice audit`
    /// prints it).
    #[arg(long)]
    pub(crate) partition: String,
    /// The business key, comma-separated columns; one row per key is kept.
    #[arg(long, value_parser = parse_columns)]
    pub(crate) key: Columns,
    /// Make the changes. Without it, only the plan and the counts are shown.
    #[arg(long)]
    pub(crate) execute: bool,
    /// Print the summary as JSON.
    #[arg(long)]
    pub(crate) json: bool,
    /// Testing aid: stop with an error right after this step.
    #[arg(long, hide = true, value_enum)]
    pub(crate) interrupt_after: Option<Step>,
    #[command(flatten)]
    pub ch: ChArgs,
}

/// Where a run stands with the partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Nothing made yet (or only read).
    Untouched,
    /// The staging and backup tables exist; the partition is as it was.
    TablesMade,
    /// The replace was sent and has not been acknowledged.
    Replacing,
    /// The replace was acknowledged.
    Replaced,
}

/// The steps that change something.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Step {
    CreateTables,
    Backup,
    Stage,
    Replace,
    Cleanup,
}

#[derive(Debug, Serialize)]
pub(crate) struct RepairReport {
    pub(crate) table: String,
    pub(crate) partition: String,
    pub(crate) key: Vec<String>,
    pub(crate) executed: bool,
    pub(crate) before: Snapshot,
    pub(crate) after: Option<Snapshot>,
    pub(crate) removed_rows: u64,
    pub(crate) backup_table: Option<String>,
    /// The statements `--execute` runs, in order (dry runs only).
    pub(crate) plan: Vec<String>,
    pub(crate) notes: Vec<String>,
}

pub async fn run(args: RepairArgs, conn: Conn) -> Result<Outcome, OpsError> {
    let report = repair(&args, &conn).await?;
    super::emit(args.json, &report, render)?;
    Ok(Outcome::Clean)
}

/// One repair run, talking to ClickHouse.
struct Run<'a> {
    args: &'a RepairArgs,
    client: clickhouse::Client,
    /// The offset column's name.
    offset: String,
    /// Where this run stands with the replace, for the note on a failure.
    phase: Phase,
    table: Table,
    plan: Plan,
    bar: ProgressBar,
    notes: Vec<String>,
}

pub(crate) async fn repair(args: &RepairArgs, conn: &Conn) -> Result<RepairReport, OpsError> {
    let client = conn.client.clone();
    let offset = conn.columns.offset.clone();
    let table = Table::describe(&client, &args.table).await?;
    if !table.is_merge_tree() {
        return Err(OpsError::Invalid(format!(
            "{} is a {} table; REPLACE PARTITION needs a MergeTree-family table",
            args.table, table.info.engine
        )));
    }
    table.require(&args.key, "key")?;
    table.require(std::slice::from_ref(&offset), "metadata")?;
    let parts: u64 = client
        .query("SELECT count() FROM system.parts WHERE database = ? AND table = ? AND partition_id = ? AND active")
        .bind(&args.table.database)
        .bind(&args.table.table)
        .bind(&args.partition)
        .fetch_one()
        .await?;
    if parts == 0 {
        return Err(OpsError::Invalid(format!(
            "{} has no partition with ID {:?} (`sluice audit --table {}` lists them)",
            args.table, args.partition, args.table
        )));
    }
    let plan = plan(&table, &args.partition, &args.key, &offset);
    let bar = if args.execute && !args.json {
        let b = ProgressBar::new(6).with_message("inspecting");
        b.set_style(
            ProgressStyle::with_template("[{pos}/{len}] {msg} ({elapsed})")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        b
    } else {
        ProgressBar::hidden()
    };
    let mut run = Run {
        args,
        client,
        offset,
        phase: Phase::Untouched,
        table,
        plan,
        bar,
        notes: Vec::new(),
    };
    let result = run.go().await;
    run.bar.finish_and_clear();
    match (result, run.phase) {
        (Err(e), Phase::TablesMade | Phase::Replacing) => Err(run.what_is_left(e).await),
        (r, _) => r,
    }
}

impl Run<'_> {
    async fn go(&mut self) -> Result<RepairReport, OpsError> {
        let (staging, backup) = (&self.plan.staging, &self.plan.backup);
        let left = match (self.exists(staging).await?, self.exists(backup).await?) {
            (false, false) => Leftovers::None,
            (true, false) => Leftovers::StagingOnly,
            (false, true) => Leftovers::BackupOnly,
            (true, true) => Leftovers::Both {
                original: self.snapshot(&self.table.name).await?,
                backup: self.snapshot(backup).await?,
                staging: self.snapshot(staging).await?,
            },
        };
        let before = self.snapshot(&self.table.name).await?;
        match decide(left) {
            Decision::Start => {}
            Decision::RollBack => {
                self.note("an interrupted repair had not replaced the partition yet: rolled back");
                if self.args.execute {
                    self.drop_sluice_tables().await?;
                }
            }
            Decision::Finish { backup, staging } => {
                self.note("an interrupted repair had replaced the partition: finishing it");
                if !self.args.execute {
                    return Ok(self.report(backup, Some(staging)));
                }
                return self.finish(backup, staging, None).await;
            }
            Decision::AlreadyRepaired if before.rows == before.keys => {
                self.note(&format!(
                    "already repaired; the backup {} is still there (DROP it once checked)",
                    self.plan.backup
                ));
                return Ok(self.report(before, Some(before)));
            }
            Decision::AlreadyRepaired => {
                return Err(OpsError::Invalid(format!(
                    "{} is left from an earlier repair of this partition; check it and \
                     DROP TABLE it before repairing again",
                    self.plan.backup
                )));
            }
            Decision::Refuse => {
                return Err(OpsError::Invalid(format!(
                    "an interrupted repair left {} and {}, and partition {} of {} matches \
                     neither: it was written to since. The backup holds the partition as it \
                     was before the repair; inspect it, then drop both tables",
                    self.plan.backup, self.plan.staging, self.args.partition, self.table.name
                )));
            }
        }
        if before.rows == before.keys {
            self.note("no duplicate keys in this partition: nothing to do");
            return Ok(self.report(before, Some(before)));
        }
        if !self.args.execute {
            return Ok(self.report(before, None));
        }
        self.execute(before).await
    }

    async fn execute(&mut self, before: Snapshot) -> Result<RepairReport, OpsError> {
        self.step("creating the staging and backup tables");
        let p = self.plan.clone();
        self.phase = Phase::TablesMade;
        self.create_copy(&p.staging, &p.create_staging, &p.create_staging_explicit)
            .await?;
        self.create_copy(&p.backup, &p.create_backup, &p.create_backup_explicit)
            .await?;
        self.checkpoint(Step::CreateTables)?;

        self.step("backing the partition up");
        self.exec(&p.backup_partition).await?;
        let backup = self.snapshot(&p.backup).await?;
        if backup != before {
            return self.refuse("while it was being backed up").await;
        }
        self.checkpoint(Step::Backup)?;

        self.step("building the deduplicated copy");
        self.fill_staging().await?;
        let staging = self.snapshot(&p.staging).await?;
        if !staging.is_deduplicated_copy_of(&backup) {
            self.drop_sluice_tables().await?;
            return Err(OpsError::Invalid(format!(
                "the staged copy has {} rows for {} keys (highest offset {}), expected one row \
                 for each of the partition's {} keys (highest offset {}); rolled back",
                staging.rows, staging.keys, staging.max_offset, backup.keys, backup.max_offset
            )));
        }
        self.checkpoint(Step::Stage)?;

        self.step("replacing the partition");
        let (now, since): (Snapshot, String) = self.snapshot_at(&self.table.name).await?;
        if now != before {
            return self.refuse("while the copy was being built").await;
        }
        self.phase = Phase::Replacing;
        self.exec(&p.replace).await?;
        self.phase = Phase::Replaced;
        self.checkpoint(Step::Replace)?;
        self.finish(backup, staging, Some(since)).await
    }

    /// After the replace: verify, look for writes the replace dropped, drop
    /// staging, keep the backup.
    async fn finish(
        &mut self,
        backup: Snapshot,
        staging: Snapshot,
        replaced_since: Option<String>,
    ) -> Result<RepairReport, OpsError> {
        self.step("verifying");
        let after = self.snapshot(&self.table.name).await?;
        if after != staging {
            self.note(&format!(
                "the partition now holds {} rows, not the {} staged: writes arrived after the \
                 replace (they are kept); run `sluice audit` again",
                after.rows, staging.rows
            ));
        }
        if let Some(since) = replaced_since {
            self.check_part_log(&since, staging.rows).await?;
        }
        self.checkpoint(Step::Cleanup)?;
        self.step("dropping the staging table");
        let staging_sql = self.plan.staging.sql();
        self.exec(&format!("DROP TABLE IF EXISTS {staging_sql}"))
            .await?;
        let summary = format!(
            "sluice repair backup of {} partition {}: {} rows before, {} after, key ({})",
            self.table.name,
            self.args.partition,
            backup.rows,
            after.rows,
            self.args.key.join(", ")
        );
        let backup_sql = self.plan.backup.sql();
        self.exec(&format!(
            "ALTER TABLE {backup_sql} MODIFY COMMENT {}",
            literal(&summary)
        ))
        .await?;
        let mut r = self.report(backup, Some(after));
        r.backup_table = Some(self.plan.backup.to_string());
        Ok(r)
    }

    /// Any part written into the partition since `since`, other than the
    /// replace's own, was dropped by the replace: say so loudly.
    async fn check_part_log(&mut self, since: &str, staged_rows: u64) -> Result<(), OpsError> {
        let _ = self.client.query("SYSTEM FLUSH LOGS").execute().await;
        let q = "SELECT toUInt64(sum(rows)) FROM system.part_log WHERE database = ? AND table = ? \
                 AND partition_id = ? AND event_type = 'NewPart' AND error = 0 \
                 AND event_time_microseconds >= toDateTime64(?, 6)";
        let rows: Result<u64, _> = self
            .client
            .query(q)
            .bind(&self.table.name.database)
            .bind(&self.table.name.table)
            .bind(&self.args.partition)
            .bind(since)
            .fetch_one()
            .await;
        match rows {
            Ok(n) if n > staged_rows => Err(OpsError::Invalid(format!(
                "system.part_log shows {} rows written into partition {} of {} since the last \
                 check, besides the {} staged: some may have been dropped by the replace. \
                 Compare with the backup {} and re-send what is missing",
                n - staged_rows,
                self.args.partition,
                self.table.name,
                staged_rows,
                self.plan.backup
            ))),
            Ok(_) => Ok(()),
            Err(e) => {
                self.note(&format!(
                    "system.part_log could not be read ({e}); writes in the instant before the \
                     replace could not be ruled out"
                ));
                Ok(())
            }
        }
    }

    async fn fill_staging(&self) -> Result<(), OpsError> {
        let wanted = [
            ("insert_allow_materialized_columns", "1"),
            ("async_insert", "0"),
            ("insert_deduplicate", "0"),
            ("deduplicate_insert", "disable"),
            ("optimize_on_insert", "0"),
        ];
        let names: Vec<&str> = wanted.iter().map(|w| w.0).collect();
        let known: Vec<String> = self
            .client
            .query("SELECT name FROM system.settings WHERE name IN ?")
            .bind(names)
            .fetch_all()
            .await?;
        let mut q = self.client.query(&self.plan.fill_staging);
        for (k, v) in wanted {
            if known.iter().any(|n| n == k) {
                q = q.with_setting(k, v);
            }
        }
        Ok(q.execute().await?)
    }

    async fn refuse(&mut self, when: &str) -> Result<RepairReport, OpsError> {
        self.drop_sluice_tables().await?;
        Err(OpsError::Refused(format!(
            "partition {} of {} received writes {when} (its rows or highest offset \
             changed). Nothing was changed and the sluice tables were dropped; repair a \
             partition that no longer receives writes",
            self.args.partition, self.table.name
        )))
    }

    async fn drop_sluice_tables(&self) -> Result<(), OpsError> {
        for t in [&self.plan.staging, &self.plan.backup] {
            self.exec(&format!("DROP TABLE IF EXISTS {}", t.sql()))
                .await?;
        }
        Ok(())
    }

    fn snapshot_sql(&self, t: &TableRef) -> String {
        format!(
            "SELECT count(), uniqExact({}), toInt64(max({})) FROM {} WHERE _partition_id = {}",
            ident_list(&self.args.key),
            qi(&self.offset),
            t.sql(),
            literal(&self.args.partition)
        )
    }

    async fn snapshot(&self, t: &TableRef) -> Result<Snapshot, OpsError> {
        Ok(self.client.query(&self.snapshot_sql(t)).fetch_one().await?)
    }

    /// A snapshot and the server's clock when it was taken.
    async fn snapshot_at(&self, t: &TableRef) -> Result<(Snapshot, String), OpsError> {
        let sql = self
            .snapshot_sql(t)
            .replacen("SELECT ", "SELECT toString(now64(6)) AS at, ", 1);
        let (at, rows, keys, max_offset): (String, u64, u64, i64) =
            self.client.query(&sql).fetch_one().await?;
        Ok((
            Snapshot {
                rows,
                keys,
                max_offset,
            },
            at,
        ))
    }

    /// The error of a run that failed before the replace, with the tables it
    /// left and what to do about them.
    async fn what_is_left(&self, e: OpsError) -> OpsError {
        let mut left = Vec::new();
        for t in [&self.plan.staging, &self.plan.backup] {
            match self.exists(t).await {
                Ok(false) => {}
                Ok(true) => left.push(t.to_string()),
                Err(_) => left.push(format!("{t} (perhaps)")),
            }
        }
        if left.is_empty() {
            return e;
        }
        let left = match self.phase {
            Phase::Replacing => format!(
                "Whether the partition was replaced is not known. This run left {}; keep \
                 them and run the same command again: it reads what the tables hold and \
                 finishes the repair or rolls it back (the backup holds the partition as it was).",
                left.join(" and ")
            ),
            _ => format!(
                "The partition was not replaced and is as it was. This run left {}: the next \
                 run drops them before it starts again, or DROP TABLE {} yourself.",
                left.join(" and "),
                left.join(", ")
            ),
        };
        OpsError::Left {
            error: Box::new(e),
            left,
        }
    }

    /// Creates a copy of the table's structure, and checks it has the
    /// table's keys (`REPLACE PARTITION` refuses otherwise).
    async fn create_copy(
        &self,
        name: &TableRef,
        inherit: &str,
        explicit: &str,
    ) -> Result<(), OpsError> {
        let first = self.exec(inherit).await;
        if first.is_ok() || self.exists(name).await? {
            if self.same_keys(name).await? {
                return Ok(());
            }
            // Made, without the keys: this server does not copy them.
            self.exec(&format!("DROP TABLE IF EXISTS {}", name.sql()))
                .await?;
        }
        if let Err(e) = self.exec(explicit).await {
            return Err(first.err().unwrap_or(e));
        }
        if !self.same_keys(name).await? {
            return Err(OpsError::Invalid(format!(
                "the copy {name} did not get the keys of {}; REPLACE PARTITION needs them \
                 identical",
                self.table.name
            )));
        }
        Ok(())
    }

    /// Whether a copy shows the table's keys in `system.tables` (one outer
    /// pair of parentheses aside: `(id)` and `id` are one key).
    async fn same_keys(&self, copy: &TableRef) -> Result<bool, OpsError> {
        let bare = |k: &str| {
            k.strip_prefix('(')
                .and_then(|k| k.strip_suffix(')'))
                .unwrap_or(k)
                .to_string()
        };
        let keys = |i: &TableInfo| {
            [
                &i.partition_key,
                &i.sorting_key,
                &i.primary_key,
                &i.sampling_key,
            ]
            .map(|k| bare(k))
        };
        let made = Table::describe(&self.client, copy).await?.info;
        Ok(keys(&made) == keys(&self.table.info))
    }

    async fn exists(&self, t: &TableRef) -> Result<bool, OpsError> {
        Table::exists(&self.client, t).await
    }

    async fn exec(&self, sql: &str) -> Result<(), OpsError> {
        tracing::debug!(%sql, "repair");
        Ok(self.client.query(sql).execute().await?)
    }

    fn step(&self, msg: &'static str) {
        self.bar.inc(1);
        self.bar.set_message(msg);
    }

    fn checkpoint(&self, done: Step) -> Result<(), OpsError> {
        if self.args.interrupt_after == Some(done) {
            return Err(OpsError::Invalid(format!(
                "interrupted after step {done:?} (--interrupt-after)"
            )));
        }
        Ok(())
    }

    fn note(&mut self, s: &str) {
        self.notes.push(s.to_string());
    }

    fn report(&self, before: Snapshot, after: Option<Snapshot>) -> RepairReport {
        RepairReport {
            table: self.table.name.to_string(),
            partition: self.args.partition.clone(),
            key: self.args.key.0.clone(),
            executed: self.args.execute,
            before,
            after,
            removed_rows: before.rows - after.map_or(before.keys, |a| a.rows.min(before.rows)),
            backup_table: None,
            plan: if self.args.execute || after.is_some() {
                Vec::new()
            } else {
                let p = &self.plan;
                vec![
                    p.create_staging.clone(),
                    p.create_backup.clone(),
                    p.backup_partition.clone(),
                    p.fill_staging.clone(),
                    p.replace.clone(),
                    format!("DROP TABLE {}", p.staging.sql()),
                ]
            },
            notes: self.notes.clone(),
        }
    }
}

pub(crate) fn render(r: &RepairReport) -> String {
    let mut out = format!(
        "sluice repair: {} partition {} by ({})\n\n",
        r.table,
        r.partition,
        r.key.join(", ")
    );
    let mut g = grid(["", "before", "after"]);
    let after = |f: fn(&Snapshot) -> String| r.after.as_ref().map(f).unwrap_or_else(|| "-".into());
    g.add_row([
        "rows".to_string(),
        thousands(r.before.rows),
        after(|s| thousands(s.rows)),
    ]);
    g.add_row([
        "distinct keys".to_string(),
        thousands(r.before.keys),
        after(|s| thousands(s.keys)),
    ]);
    g.add_row([
        "highest _offset".to_string(),
        r.before.max_offset.to_string(),
        after(|s| s.max_offset.to_string()),
    ]);
    out += &format!("{g}\n");
    for n in &r.notes {
        out += &format!("note: {n}\n");
    }
    if !r.plan.is_empty() {
        out += "\nPlan (each step is checked before the next; the partition must not change \
                until the replace):\n";
        for (i, sql) in r.plan.iter().enumerate() {
            out += &format!("  {}. {sql};\n", i + 1);
        }
    }
    if !r.executed {
        out += &format!(
            "\nDry run: {} duplicate rows would be removed. Run again with --execute to repair.\n",
            thousands(r.removed_rows)
        );
    } else if let Some(b) = &r.backup_table {
        out += &format!(
            "\nRepaired: {} rows removed. The partition as it was is kept in {b}; \
             DROP TABLE it once you have checked the result.\n",
            thousands(r.removed_rows)
        );
    }
    out
}
