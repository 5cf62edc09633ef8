//! A batch's rows → its `insert_deduplication_token` and per-attempt query ids.
//!
//! The token is a pure function of the target table, the topic, the
//! partition and the exact set of offsets in the insert, so the same rows
//! always carry the same token and different rows never share one. It is a
//! cheap first line of defence against re-submits inside ClickHouse's dedup
//! window, never the guarantee. Query ids add the attempt number, so every
//! attempt can be found in `system.processes` and killed before a retry.

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
    format!("sluice-{partition}-{span}-{n}-{:032x}", h.digest128())
}

/// The query id of attempt `attempt` of the insert with `token`.
pub fn query_id(token: &str, attempt: u32) -> String {
    format!("{token}-a{attempt}")
}

/// The prefix shared by the query ids of every insert sluice makes for one
/// partition of one table, for finding them in `system.processes`.
pub fn partition_query_prefix(partition: i32) -> String {
    format!("sluice-{partition}-")
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
        assert!(t.starts_with("sluice-3-5-9-3-"), "{t}");
        assert_eq!(t, tok("db.t", "orders", 3, &[5, 6, 9]));
        assert!(query_id(&t, 2).ends_with("-a2"));
        assert!(t.starts_with(&partition_query_prefix(3)));
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
