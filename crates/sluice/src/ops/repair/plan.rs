//! The pure half of `sluice repair`: what an interrupted run left behind,
//! what to do about it ([`decide`]), and the statements of one repair
//! ([`plan`], [`copy_ddl`]). No I/O: every rule here is unit-tested.

use crate::ops::db::Table;
use crate::sql::{ident, ident_list, literal, TableRef};
use serde::Serialize;

/// What a partition (or a sluice table) holds, as far as the repair cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, clickhouse::Row)]
pub(crate) struct Snapshot {
    pub(crate) rows: u64,
    pub(crate) keys: u64,
    pub(crate) max_offset: i64,
}

impl Snapshot {
    /// One row per key, and the same keys and highest offset as `source`.
    pub(crate) fn is_deduplicated_copy_of(&self, source: &Snapshot) -> bool {
        self.rows == self.keys && self.keys == source.keys && self.max_offset == source.max_offset
    }
}

/// The sluice tables an earlier run left behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Leftovers {
    None,
    StagingOnly,
    /// A finished repair keeps only its backup.
    BackupOnly,
    Both {
        original: Snapshot,
        backup: Snapshot,
        staging: Snapshot,
    },
}

/// What to do about them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Nothing left over: start.
    Start,
    /// The original was not replaced yet: drop the sluice tables, start over.
    RollBack,
    /// The original was replaced: verify and clean up.
    Finish { backup: Snapshot, staging: Snapshot },
    /// A finished repair's backup is still there.
    AlreadyRepaired,
    /// The partition matches neither the backup nor the staged copy.
    Refuse,
}

/// Reads what an interrupted run left and decides how to go on.
pub(crate) fn decide(left: Leftovers) -> Decision {
    match left {
        Leftovers::None => Decision::Start,
        Leftovers::StagingOnly => Decision::RollBack,
        Leftovers::BackupOnly => Decision::AlreadyRepaired,
        Leftovers::Both {
            original,
            backup,
            staging,
        } => {
            // The backup is filled by one atomic REPLACE: empty means the
            // run stopped before it, and the original is untouched.
            if backup.rows == 0 || original == backup {
                Decision::RollBack
            } else if original == staging && staging.is_deduplicated_copy_of(&backup) {
                Decision::Finish { backup, staging }
            } else {
                Decision::Refuse
            }
        }
    }
}

/// The names and statements of one repair.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) staging: TableRef,
    pub(crate) backup: TableRef,
    pub(crate) create_staging: String,
    pub(crate) create_backup: String,
    /// The same, keys spelled out ([`explicit_copy_ddl`]).
    pub(crate) create_staging_explicit: String,
    pub(crate) create_backup_explicit: String,
    pub(crate) backup_partition: String,
    pub(crate) fill_staging: String,
    pub(crate) replace: String,
}

/// Builds the statements for repairing `partition` of `t` by `key`,
/// keeping for each key the row with the highest `offset` column.
pub(crate) fn plan(t: &Table, partition: &str, key: &[String], offset: &str) -> Plan {
    let suffix: String = partition
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    let staging = t
        .name
        .sibling(format!("{}__sluice_staging_{suffix}", t.name.table));
    let backup = t
        .name
        .sibling(format!("{}__sluice_backup_{suffix}", t.name.table));
    let pid = literal(partition);
    let cols: Vec<String> = t
        .columns
        .iter()
        .filter(|c| c.is_stored())
        .map(|c| c.name.clone())
        .collect();
    let cols = ident_list(&cols);
    let comment = |what: &str| {
        literal(&format!(
            "sluice repair {what} of {} partition {partition}, key ({})",
            t.name,
            key.join(", ")
        ))
    };
    Plan {
        create_staging: copy_ddl(t, &staging, &comment("staging")),
        create_backup: copy_ddl(t, &backup, &comment("backup")),
        create_staging_explicit: explicit_copy_ddl(t, &staging, &comment("staging")),
        create_backup_explicit: explicit_copy_ddl(t, &backup, &comment("backup")),
        backup_partition: format!(
            "ALTER TABLE {} REPLACE PARTITION ID {pid} FROM {}",
            backup.sql(),
            t.name.sql()
        ),
        fill_staging: format!(
            "INSERT INTO {} ({cols}) SELECT {cols} FROM {} WHERE _partition_id = {pid} \
             ORDER BY {k}, {o} DESC LIMIT 1 BY {k}",
            staging.sql(),
            backup.sql(),
            k = ident_list(key),
            o = ident(offset)
        ),
        replace: format!(
            "ALTER TABLE {} REPLACE PARTITION ID {pid} FROM {}",
            t.name.sql(),
            staging.sql()
        ),
        staging,
        backup,
    }
}

/// `CREATE TABLE new AS t ENGINE = MergeTree` with `t`'s settings: the
/// server copies `t`'s partition, primary, sorting and sampling keys as
/// written (`tuple(…)`, `DESC`), which is what `REPLACE PARTITION` compares,
/// and leaves out `t`'s merging rules, TTL and Keeper path. The run checks
/// the copy's keys against `t`'s; a server that does not copy them gets
/// [`explicit_copy_ddl`] instead.
pub(crate) fn copy_ddl(t: &Table, new: &TableRef, comment: &str) -> String {
    let mut ddl = format!(
        "CREATE TABLE {} AS {} ENGINE = MergeTree",
        new.sql(),
        t.name.sql()
    );
    if let Some(s) = t.info.settings_clause() {
        ddl += &format!(" SETTINGS {s}");
    }
    ddl + &format!(" COMMENT {comment}")
}

/// [`copy_ddl`] with each key spelled out from `system.tables`, which lists
/// a key's columns without their parentheses (so each goes back inside a
/// pair) and an absent key as empty (so it stays absent: an unpartitioned
/// table's copy is unpartitioned too).
pub(crate) fn explicit_copy_ddl(t: &Table, new: &TableRef, comment: &str) -> String {
    let i = &t.info;
    let mut ddl = format!(
        "CREATE TABLE {} AS {} ENGINE = MergeTree",
        new.sql(),
        t.name.sql()
    );
    if !i.partition_key.is_empty() {
        ddl += &format!(" PARTITION BY ({})", i.partition_key);
    }
    if !i.primary_key.is_empty() && i.primary_key != i.sorting_key {
        ddl += &format!(" PRIMARY KEY ({})", i.primary_key);
    }
    match i.sorting_key.as_str() {
        "" => ddl += " ORDER BY tuple()",
        k => ddl += &format!(" ORDER BY ({k})"),
    }
    if !i.sampling_key.is_empty() {
        ddl += &format!(" SAMPLE BY {}", i.sampling_key);
    }
    if let Some(s) = i.settings_clause() {
        ddl += &format!(" SETTINGS {s}");
    }
    ddl + &format!(" COMMENT {comment}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::db::{Column, TableInfo};

    fn snap(rows: u64, keys: u64, max_offset: i64) -> Snapshot {
        Snapshot {
            rows,
            keys,
            max_offset,
        }
    }

    #[test]
    fn decisions_after_an_interruption() {
        let orig = snap(120, 100, 999);
        let staged = snap(100, 100, 999);
        let both = |original, backup, staging| Leftovers::Both {
            original,
            backup,
            staging,
        };
        assert_eq!(decide(Leftovers::None), Decision::Start);
        assert_eq!(decide(Leftovers::StagingOnly), Decision::RollBack);
        assert_eq!(decide(Leftovers::BackupOnly), Decision::AlreadyRepaired);
        // Stopped before the backup was filled.
        assert_eq!(
            decide(both(orig, snap(0, 0, 0), snap(0, 0, 0))),
            Decision::RollBack
        );
        // Stopped while staging (partly filled or not at all).
        assert_eq!(
            decide(both(orig, orig, snap(40, 40, 500))),
            Decision::RollBack
        );
        assert_eq!(decide(both(orig, orig, staged)), Decision::RollBack);
        // Stopped after the replace.
        assert_eq!(
            decide(both(staged, orig, staged)),
            Decision::Finish {
                backup: orig,
                staging: staged
            }
        );
        // Written to since.
        assert_eq!(
            decide(both(snap(130, 105, 1010), orig, staged)),
            Decision::Refuse
        );
        // A staged copy that lost a key never counts as finished.
        let short = snap(99, 99, 999);
        assert_eq!(decide(both(short, orig, short)), Decision::Refuse);
    }

    fn table(engine: &str, engine_full: &str, partition: &str, order: &str) -> Table {
        let col = |n: &str, t: &str, k: &str| Column {
            name: n.into(),
            type_: t.into(),
            default_kind: k.into(),
        };
        Table {
            name: TableRef::parse("db.events").unwrap(),
            info: TableInfo {
                engine: engine.into(),
                engine_full: engine_full.into(),
                partition_key: partition.into(),
                sorting_key: order.into(),
                primary_key: order.into(),
                sampling_key: String::new(),
            },
            columns: vec![
                col("id", "UInt64", ""),
                col("doubled", "UInt64", "MATERIALIZED"),
                col("alias", "UInt64", "ALIAS"),
                col("_offset", "Int64", ""),
            ],
        }
    }

    #[test]
    fn replicated_tables_get_plain_copies() {
        let t = table(
            "ReplicatedReplacingMergeTree",
            "ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/events', '{replica}', _offset) \
             PARTITION BY toYYYYMM(d) ORDER BY id SETTINGS index_granularity = 8192",
            "toYYYYMM(d)",
            "id",
        );
        let p = plan(&t, "202607", &["id".into()], "_offset");
        assert_eq!(p.staging.to_string(), "db.events__sluice_staging_202607");
        assert_eq!(
            p.create_backup,
            "CREATE TABLE `db`.`events__sluice_backup_202607` AS `db`.`events` ENGINE = MergeTree \
             SETTINGS index_granularity = 8192 \
             COMMENT 'sluice repair backup of db.events partition 202607, key (id)'"
        );
        assert!(!p.create_staging.contains("Replicated"));
        assert_eq!(
            p.fill_staging,
            "INSERT INTO `db`.`events__sluice_staging_202607` (`id`, `doubled`, `_offset`) \
             SELECT `id`, `doubled`, `_offset` FROM `db`.`events__sluice_backup_202607` \
             WHERE _partition_id = '202607' ORDER BY `id`, `_offset` DESC LIMIT 1 BY `id`"
        );
        assert_eq!(
            p.replace,
            "ALTER TABLE `db`.`events` REPLACE PARTITION ID '202607' FROM \
             `db`.`events__sluice_staging_202607`"
        );
    }

    #[test]
    fn unpartitioned_tables_and_odd_ids() {
        let t = table("MergeTree", "MergeTree ORDER BY tuple()", "", "");
        let p = plan(&t, "all", &["id".into()], "src_offset");
        assert!(p
            .create_staging_explicit
            .contains("ENGINE = MergeTree ORDER BY tuple() COMMENT"));
        assert!(p.fill_staging.contains("ORDER BY `id`, `src_offset` DESC"));
        // Keys of several columns keep their parentheses.
        let t = table(
            "ReplacingMergeTree",
            "ReplacingMergeTree PARTITION BY (toYYYYMM(d), r) ORDER BY (id, r)",
            "(toYYYYMM(d), r)",
            "id, r",
        );
        let p = plan(&t, "x", &["id".into()], "_offset");
        assert!(p.create_backup_explicit.contains(
            "ENGINE = MergeTree PARTITION BY ((toYYYYMM(d), r)) ORDER BY (id, r) COMMENT"
        ));
        let p = plan(&t, "a-b'c", &["id".into()], "_offset");
        assert_eq!(p.backup.table, "events__sluice_backup_a_b_c");
        assert!(p.replace.contains("PARTITION ID 'a-b\\'c'"));
    }
}
