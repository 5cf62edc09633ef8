//! A batch's rows → its `insert_deduplication_token` and per-attempt query ids.
//!
//! The token is a pure function of the target table, the topic, the
//! partition and the exact set of offsets in the insert, so the same rows
//! always carry the same token and different rows never share one. It is a
//! cheap first line of defence against re-submits inside ClickHouse's dedup
//! window, never the guarantee. Query ids add the attempt number, so every
//! attempt can be found in `system.processes` and killed before a retry.
//! Every id of one partition of one table and topic starts with the same
//! [`partition_query_prefix`], so a new owner can find and end whatever an
//! earlier owner of the partition still runs.

use crate::offset::Offset;
use xxhash_rust::xxh3::Xxh3;

/// The deterministic token of one insert.
pub fn insert_token(
    table: &str,
    topic: &str,
    partition: i32,
    offsets: impl ExactSizeIterator<Item = Offset>,
) -> String {
    let n = offsets.len();
    let prefix = partition_query_prefix(table, topic, partition);
    let mut h = Xxh3::new();
    for part in [table.as_bytes(), b"\0", topic.as_bytes(), b"\0"] {
        h.update(part);
    }
    h.update(&partition.to_le_bytes());
    let (mut first, mut last) = (None, None);
    for o in offsets {
        first.get_or_insert(o);
        last = Some(o);
        h.update(&o.0.to_le_bytes());
    }
    let span = match (first, last) {
        (Some(f), Some(l)) => format!("{f}-{l}"),
        _ => "empty".into(),
    };
    format!("{prefix}{span}-{n}-{:032x}", h.digest128())
}

/// The query id of attempt `attempt` of the insert with `token`.
pub fn query_id(token: &str, attempt: u32) -> String {
    format!("{token}-a{attempt}")
}

/// The prefix shared by the query ids of every insert sluice makes for one
/// partition of one topic into one table, for finding them in
/// `system.processes`: `sluice-`, 8 hex digits naming the table and topic,
/// the partition and a dash (so partition 1 never matches partition 10).
pub fn partition_query_prefix(table: &str, topic: &str, partition: i32) -> String {
    let scope = xxhash_rust::xxh3::xxh3_64(format!("{table}\0{topic}").as_bytes());
    format!("sluice-{:08x}-{partition}-", scope as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn tok(table: &str, topic: &str, p: i32, offs: &[i64]) -> String {
        insert_token(
            table,
            topic,
            p,
            offs.iter()
                .map(|o| Offset(*o))
                .collect::<Vec<_>>()
                .into_iter(),
        )
    }

    #[test]
    fn token_names_its_range_and_is_stable() {
        let t = tok("db.t", "orders", 3, &[5, 6, 9]);
        let prefix = partition_query_prefix("db.t", "orders", 3);
        assert!(t.starts_with(&format!("{prefix}5-9-3-")), "{t}");
        assert_eq!(t, tok("db.t", "orders", 3, &[5, 6, 9]));
        assert!(query_id(&t, 2).ends_with("-a2"));
        assert!(!tok("db.t", "orders", 30, &[5]).starts_with(&prefix));
        assert!(!tok("db.t", "payments", 3, &[5]).starts_with(&prefix));
        assert!(!tok("db.u", "orders", 3, &[5]).starts_with(&prefix));
    }

    proptest! {
        #[test]
        fn different_inputs_give_different_tokens(
            a in proptest::collection::btree_set(0i64..1000, 1..20),
            b in proptest::collection::btree_set(0i64..1000, 1..20),
            pa in 0i32..4, pb in 0i32..4,
        ) {
            let a: Vec<i64> = a.into_iter().collect();
            let b: Vec<i64> = b.into_iter().collect();
            let same = a == b && pa == pb;
            prop_assert_eq!(tok("t", "x", pa, &a) == tok("t", "x", pb, &b), same);
            prop_assert_ne!(tok("t1", "x", pa, &a), tok("t2", "x", pa, &a));
            prop_assert_ne!(tok("t", "x", pa, &a), tok("t", "y", pa, &a));
        }
    }
}
