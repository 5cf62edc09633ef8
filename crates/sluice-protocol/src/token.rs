//! A batch's rows → its `insert_deduplication_token` and per-attempt query ids.
//!
//! The token is a pure function of the target table, the topic and the
//! exact set of `(partition, offset)` rows in the insert, so the same rows
//! always carry the same token and different rows never share one. It is a
//! cheap first line of defence against re-submits inside ClickHouse's dedup
//! window, never the guarantee. Query ids add the attempt number, so every
//! attempt can be found in `system.processes` and killed before a retry.
//!
//! Every id names the partitions its rows come from, so a new owner of a
//! partition can find and end whatever an earlier owner still runs for it,
//! alone or beside other partitions: `sluice-`, 8 hex digits naming the
//! table and topic ([`query_scope`]), the partitions joined by `.`, then
//! `-` and the rest ([`partitions_named`] reads them back).

use crate::batch::Row;
use xxhash_rust::xxh3::Xxh3;

/// The deterministic token of one insert of `rows` (ascending).
pub fn insert_token(table: &str, topic: &str, rows: impl ExactSizeIterator<Item = Row>) -> String {
    let n = rows.len();
    let mut h = Xxh3::new();
    for part in [table.as_bytes(), b"\0", topic.as_bytes(), b"\0"] {
        h.update(part);
    }
    let (mut first, mut last) = (None, None);
    let mut partitions: Vec<i32> = Vec::new();
    for r in rows {
        first.get_or_insert(r);
        last = Some(r);
        if partitions.last() != Some(&r.partition) {
            partitions.push(r.partition);
        }
        h.update(&r.partition.to_le_bytes());
        h.update(&r.offset.0.to_le_bytes());
    }
    let named: Vec<String> = partitions.iter().map(i32::to_string).collect();
    let span = match (first, last) {
        (Some(f), Some(l)) => format!("{}-{}", f.offset, l.offset),
        _ => "empty".into(),
    };
    format!(
        "{}{}-{span}-{n}-{:032x}",
        query_scope(table, topic),
        named.join("."),
        h.digest128()
    )
}

/// The query id of attempt `attempt` of the insert with `token`.
pub fn query_id(token: &str, attempt: u32) -> String {
    format!("{token}-a{attempt}")
}

/// The start of the query id of every insert sluice makes from `topic`
/// into `table`: `sluice-` and 8 hex digits naming both, then `-`.
pub fn query_scope(table: &str, topic: &str) -> String {
    let scope = xxhash_rust::xxh3::xxh3_64(format!("{table}\0{topic}").as_bytes());
    format!("sluice-{:08x}-", scope as u32)
}

/// The partitions a query id of `scope` ([`query_scope`]) names; `None`
/// for any other id.
pub fn partitions_named(query_id: &str, scope: &str) -> Option<Vec<i32>> {
    let rest = query_id.strip_prefix(scope)?;
    let field = rest.split('-').next()?;
    field.split('.').map(|p| p.parse().ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn tok(table: &str, topic: &str, p: i32, offs: &[i64]) -> String {
        let rows: Vec<Row> = offs.iter().map(|&o| Row::new(p, o)).collect();
        insert_token(table, topic, rows.into_iter())
    }

    #[test]
    fn token_names_its_range_and_is_stable() {
        let t = tok("db.t", "orders", 3, &[5, 6, 9]);
        let scope = query_scope("db.t", "orders");
        assert!(t.starts_with(&format!("{scope}3-5-9-3-")), "{t}");
        assert_eq!(t, tok("db.t", "orders", 3, &[5, 6, 9]));
        assert!(query_id(&t, 2).ends_with("-a2"));
        assert_eq!(partitions_named(&query_id(&t, 2), &scope), Some(vec![3]));
        let other = |table, topic, p| partitions_named(&tok(table, topic, p, &[5]), &scope);
        assert_eq!(other("db.t", "orders", 30), Some(vec![30]));
        assert_eq!(other("db.t", "payments", 3), None);
        assert_eq!(other("db.u", "orders", 3), None);
    }

    #[test]
    fn a_token_of_several_partitions_names_each() {
        let rows = [Row::new(1, 7), Row::new(1, 8), Row::new(12, 0)];
        let t = insert_token("db.t", "orders", rows.into_iter());
        let scope = query_scope("db.t", "orders");
        assert_eq!(
            partitions_named(&query_id(&t, 0), &scope),
            Some(vec![1, 12])
        );
        assert_ne!(t, tok("db.t", "orders", 1, &[7, 8, 0]));
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
