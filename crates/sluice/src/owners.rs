//! Who writes each partition: a register kept by the broker.
//!
//! The register is an auxiliary consumer group, `<group_id>.sluice-owners`,
//! that no member ever joins. For each topic-partition its committed
//! "offset" is not a position but an owner:
//!
//! - a process's id ([`Owner::Process`], 1 to 2^63 − 1): that process
//!   claimed the partition and may have inserts in flight;
//! - `0` ([`Owner::Clean`]): the last owner drained its inserts and left,
//!   so the next owner need not fence;
//! - nothing ([`Owner::Nobody`]): never claimed (or expired by the broker's
//!   offset retention).
//!
//! Offset commits are a last-writer-wins register with linearizable reads
//! at the group coordinator, on every broker (some Kafka-protocol brokers
//! keep offsets but not their metadata, so a marker in the main group's
//! commit metadata would not do). A claim is a commit from a client that never joined: brokers
//! take those for a group without members.
//!
//! In: the Kafka config and the routes. Out: the owner of each partition
//! asked about, or a write of one. The sink claims, hands off and marks
//! clean through it; `sluice status` only reads it. Every call here blocks;
//! the sink runs them off the consumer thread (the clean hand-off at a
//! revocation excepted, where the thread waits anyway).

use crate::config::{KafkaConfig, Route};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::KafkaResult;
use rdkafka::{Offset, TopicPartitionList};
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::time::Duration;

/// A partition of a route: `(route index, partition)`.
pub(crate) type Key = (usize, i32);

pub(crate) use sluice_protocol::lease::Owner;

/// The register's client, shareable across threads.
#[derive(Clone)]
pub(crate) struct Owners {
    client: Arc<BaseConsumer>,
    routes: Vec<Arc<Route>>,
}

impl Owners {
    pub(crate) fn new(kafka: &KafkaConfig, routes: Vec<Arc<Route>>) -> KafkaResult<Self> {
        let mut cc = kafka.client_config();
        cc.set("group.id", register_group(&kafka.group_id))
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "false");
        Ok(Self {
            client: Arc::new(cc.create()?),
            routes,
        })
    }

    fn list(&self, keys: impl IntoIterator<Item = Key>, at: Option<u64>) -> TopicPartitionList {
        let mut tpl = TopicPartitionList::new();
        for (ri, p) in keys {
            let mut e = tpl.add_partition(&self.routes[ri].topic, p);
            if let Some(v) = at {
                let _ = e.set_offset(Offset::Offset(v as i64));
            }
        }
        tpl
    }

    /// `topic[partition]` of `key`, for the log.
    pub(crate) fn name(&self, (ri, p): Key) -> String {
        format!("{}[{p}]", self.routes[ri].topic)
    }

    /// Writes `owner` (a process id, or `0` for clean) for `keys`.
    pub(crate) fn write(&self, keys: impl IntoIterator<Item = Key>, owner: u64) -> KafkaResult<()> {
        let tpl = self.list(keys, Some(owner));
        if tpl.count() == 0 {
            return Ok(());
        }
        self.client.commit(&tpl, CommitMode::Sync)
    }

    /// Reads the owners of `keys`; a key whose answer carries an error is
    /// missing from the result.
    pub(crate) fn read(
        &self,
        keys: impl IntoIterator<Item = Key>,
        timeout: Duration,
    ) -> KafkaResult<HashMap<Key, Owner>> {
        let answer = self
            .client
            .committed_offsets(self.list(keys, None), timeout)?;
        let mut out = HashMap::new();
        for e in answer.elements() {
            let Some(ri) = self.routes.iter().position(|r| r.topic == e.topic()) else {
                continue;
            };
            if e.error().is_err() {
                continue;
            }
            let owner = match e.offset() {
                Offset::Offset(0) => Owner::Clean,
                Offset::Offset(n) if n > 0 => Owner::Process(n as u64),
                _ => Owner::Nobody,
            };
            out.insert((ri, e.partition()), owner);
        }
        Ok(out)
    }
}

/// The Kafka client id of the sink whose register id is `owner`, unless
/// the config sets one: `sluice status` shows it as the owner.
pub(crate) fn client_id(owner: u64) -> String {
    format!("sluice-{owner}")
}

/// The register of the group `group`.
pub(crate) fn register_group(group: &str) -> String {
    format!("{group}.sluice-owners")
}

/// An id for this process as an owner: 63 random bits, never 0.
pub(crate) fn new_owner() -> u64 {
    (random() >> 1).max(1)
}

/// 64 random bits, from the standard library's randomly keyed hasher.
fn random() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    std::collections::hash_map::RandomState::new().hash_one((std::process::id(), nanos))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_ids_are_positive_offsets_and_differ() {
        for _ in 0..1000 {
            let id = new_owner();
            assert!(id > 0 && i64::try_from(id).is_ok());
        }
        assert_ne!(new_owner(), new_owner());
        assert_eq!(register_group("g"), "g.sluice-owners");
    }
}
