//! Reads each partition's state from Kafka and ClickHouse, changing
//! nothing: no group join, no commit, nothing a running sink would notice.
//!
//! In: the config's routes. Kafka: the partitions and their watermarks,
//! the group's committed offsets (an offset fetch, as any admin tool does),
//! the group's members and their assignments (a group description), and
//! the Kafka timestamps of two records per lagging partition (a consumer
//! without a group, assigned by hand). ClickHouse: the highest stored
//! offset per partition. Out: a [`Reading`] per partition.

use super::progress::Reading;
use crate::ch::ClickHouse;
use crate::config::{Config, Route};
use crate::owners::{client_id, Key, Owner, Owners};
use anyhow::{anyhow, Context as _};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a Kafka request may take.
const TIMEOUT: Duration = Duration::from_secs(10);
/// How long to wait for the records whose timestamps are wanted.
const STAMPS_WAIT: Duration = Duration::from_secs(3);

pub(crate) struct Reader {
    /// Carries the group id, for its committed offsets and members; it
    /// never subscribes, so it never joins.
    group: BaseConsumer,
    /// Assigned by hand to read a record's timestamp: it never joins or
    /// commits, so its group id stays unknown to the broker.
    stamps: BaseConsumer,
    group_id: String,
    /// Exactly-once: the register of owners, which says which sluice
    /// process claimed each partition (any broker answers it).
    register: Option<Owners>,
    ch: ClickHouse,
    routes: Vec<Route>,
}

impl Reader {
    pub(crate) async fn connect(cfg: &Config) -> anyhow::Result<Self> {
        let k = &cfg.kafka;
        let mut cc = k.client_config();
        cc.set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "false");
        let stamps: BaseConsumer = cc
            .clone()
            .set("group.id", format!("{}.sluice-status", k.group_id))
            .set("isolation.level", "read_uncommitted")
            .set("fetch.wait.max.ms", "100")
            .create()
            .with_context(|| format!("creating a Kafka client for {}", k.brokers))?;
        let group: BaseConsumer = cc
            .set("group.id", &k.group_id)
            .create()
            .with_context(|| format!("creating a Kafka client for {}", k.brokers))?;
        group
            .fetch_metadata(None, TIMEOUT)
            .with_context(|| format!("cannot reach Kafka at {}", k.brokers))?;
        let ch = ClickHouse::connect(
            &cfg.clickhouse,
            cfg.sink.columns.clone(),
            cfg.sink.delivery,
            cfg.sink.limits.max_rows,
        )
        .await
        .map_err(|e| {
            let url = crate::config::secret::redact_url(&cfg.clickhouse.url);
            anyhow!("cannot use ClickHouse at {url}: {e}")
        })?;
        let register = match cfg.sink.delivery.is_exactly_once() {
            true => Some(
                Owners::new(k, cfg.routes.iter().cloned().map(Arc::new).collect())
                    .context("creating the client of the register of owners")?,
            ),
            false => None,
        };
        Ok(Self {
            group,
            stamps,
            register,
            group_id: k.group_id.clone(),
            ch,
            routes: cfg.routes.clone(),
        })
    }

    pub(crate) fn routes(&self) -> &[Route] {
        &self.routes
    }

    pub(crate) fn group_id(&self) -> &str {
        &self.group_id
    }

    /// Every partition of every route, by route index.
    pub(crate) async fn read(&self) -> anyhow::Result<Vec<(usize, Reading)>> {
        let mut stored = Vec::with_capacity(self.routes.len());
        for route in &self.routes {
            let w = self.ch.watermarks(route).await.with_context(|| {
                format!("reading the offsets stored in {}", route.table_ref().sql())
            })?;
            stored.push(w);
        }
        tokio::task::block_in_place(|| self.read_kafka(&stored))
    }

    fn read_kafka(
        &self,
        stored: &[HashMap<i32, sluice_protocol::Offset>],
    ) -> anyhow::Result<Vec<(usize, Reading)>> {
        let mut readings = Vec::new();
        let mut tpl = TopicPartitionList::new();
        for (ri, route) in self.routes.iter().enumerate() {
            let topic = &route.topic;
            for p in self.partitions(topic)? {
                let (low, high) = self
                    .group
                    .fetch_watermarks(topic, p, TIMEOUT)
                    .with_context(|| format!("reading the watermarks of {topic}[{p}]"))?;
                tpl.add_partition(topic, p);
                readings.push((
                    ri,
                    Reading {
                        topic: topic.clone(),
                        partition: p,
                        low_watermark: low,
                        high_watermark: high,
                        committed: None,
                        stored: stored[ri].get(&p).map(|o| o.0),
                        done_timestamp: None,
                        newest_timestamp: None,
                        owner: None,
                    },
                ));
            }
        }
        let committed = self
            .group
            .committed_offsets(tpl, TIMEOUT)
            .with_context(|| {
                format!("reading the committed offsets of group {:?}", self.group_id)
            })?;
        let keys: Vec<Key> = readings.iter().map(|(ri, r)| (*ri, r.partition)).collect();
        let owners = self.owners(&keys)?;
        for (_, r) in &mut readings {
            if let Some(Offset::Offset(o)) = committed
                .find_partition(&r.topic, r.partition)
                .map(|e| e.offset())
            {
                r.committed = Some(o);
            }
        }
        for (ri, r) in &mut readings {
            r.owner = owners.get(&(*ri, r.partition)).cloned();
        }
        // The timestamps of the newest record done and of the newest record,
        // where the partition lags.
        let lagging = || readings.iter().filter(|(_, r)| r.lag_records() > 0);
        let wanted: Vec<(String, i32, i64)> = lagging()
            .filter(|(_, r)| r.done() > r.low_watermark)
            .map(|(_, r)| (r.topic.clone(), r.partition, r.done() - 1))
            .chain(lagging().map(|(_, r)| (r.topic.clone(), r.partition, r.high_watermark - 1)))
            .collect();
        let stamps = self.timestamps(&wanted)?;
        for (_, r) in &mut readings {
            let at = |o: i64| stamps.get(&(r.topic.clone(), r.partition, o)).copied();
            if r.lag_records() > 0 {
                r.done_timestamp = at(r.done() - 1);
                r.newest_timestamp = at(r.high_watermark - 1);
            }
        }
        Ok(readings)
    }

    fn partitions(&self, topic: &str) -> anyhow::Result<Vec<i32>> {
        let md = self
            .group
            .fetch_metadata(Some(topic), TIMEOUT)
            .with_context(|| format!("reading the partitions of topic {topic:?}"))?;
        let t = md
            .topics()
            .iter()
            .find(|t| t.name() == topic)
            .ok_or_else(|| anyhow!("topic {topic:?} is not in the broker's metadata"))?;
        if let Some(e) = t.error() {
            let code = rdkafka::types::RDKafkaErrorCode::from(e);
            return Err(anyhow!("topic {topic:?}: {code}"));
        }
        let mut ps: Vec<i32> = t.partitions().iter().map(|p| p.id()).collect();
        ps.sort_unstable();
        Ok(ps)
    }

    /// Who holds each partition, by `(route index, partition)`.
    /// Exactly-once: the register's owner (`sluice-<id>`, the client id of
    /// that process's consumer). At-least-once: the group member the
    /// group's description assigns it to (`client_id@host`); a broker that
    /// cannot describe groups leaves them unknown.
    fn owners(&self, keys: &[Key]) -> anyhow::Result<HashMap<Key, String>> {
        if let Some(register) = &self.register {
            let found = register
                .read(keys.iter().copied(), TIMEOUT)
                .context("reading the register of owners")?;
            return Ok(found
                .into_iter()
                .filter_map(|(k, o)| match o {
                    Owner::Process(id) => Some((k, client_id(id))),
                    Owner::Clean => Some((k, "none (handed off)".into())),
                    Owner::Nobody => None,
                })
                .collect());
        }
        let groups = match self.group.fetch_group_list(Some(&self.group_id), TIMEOUT) {
            Ok(g) => g,
            Err(e) => {
                tracing::warn!(group = %self.group_id, error = %e, "the broker did not describe the group: owners unknown");
                return Ok(HashMap::new());
            }
        };
        let mut owners = HashMap::new();
        for g in groups.groups().iter().filter(|g| g.name() == self.group_id) {
            for m in g.members() {
                let who = format!(
                    "{}@{}",
                    m.client_id(),
                    m.client_host().trim_start_matches('/')
                );
                let held = m.assignment().map(assigned).unwrap_or_default();
                for (topic, p) in held {
                    if let Some(ri) = self.routes.iter().position(|r| r.topic == topic) {
                        owners.insert((ri, p), who.clone());
                    }
                }
            }
        }
        Ok(owners)
    }

    /// The Kafka timestamp of each `(topic, partition, offset)` that can
    /// be read within [`STAMPS_WAIT`].
    fn timestamps(
        &self,
        wanted: &[(String, i32, i64)],
    ) -> anyhow::Result<HashMap<(String, i32, i64), i64>> {
        let mut found = HashMap::new();
        // One offset per partition at a time: a partition is assigned once.
        let mut rounds: Vec<Vec<&(String, i32, i64)>> = Vec::new();
        for w in wanted {
            match rounds
                .iter_mut()
                .find(|r| !r.iter().any(|x| x.0 == w.0 && x.1 == w.1))
            {
                Some(r) => r.push(w),
                None => rounds.push(vec![w]),
            }
        }
        for round in rounds {
            let mut tpl = TopicPartitionList::new();
            for (t, p, o) in &round {
                tpl.add_partition_offset(t, *p, Offset::Offset(*o))
                    .context("listing the records to read")?;
            }
            self.stamps
                .assign(&tpl)
                .context("assigning partitions to read timestamps")?;
            let deadline = Instant::now() + STAMPS_WAIT;
            let mut left = round.len();
            while left > 0 && Instant::now() < deadline {
                let Some(Ok(m)) = self.stamps.poll(Duration::from_millis(100)) else {
                    continue;
                };
                let key = (m.topic().to_string(), m.partition(), m.offset());
                if round
                    .iter()
                    .any(|w| (&w.0, w.1, w.2) == (&key.0, key.1, key.2))
                {
                    if let Some(ts) = m.timestamp().to_millis() {
                        if found.insert(key, ts).is_none() {
                            left -= 1;
                        }
                    }
                }
            }
            self.stamps.unassign().context("unassigning")?;
        }
        Ok(found)
    }
}

/// The partitions in a consumer-protocol member assignment: version
/// (int16), then topics (int32 count; each a string of int16 length and
/// partitions of int32 count), then user data, which is not read. A
/// malformed one yields what could be read.
fn assigned(bytes: &[u8]) -> Vec<(String, i32)> {
    let mut r = Wire(bytes);
    let mut out = Vec::new();
    let _version = r.i16();
    let Some(topics) = r.i32() else {
        return out;
    };
    for _ in 0..topics.max(0) {
        let Some(topic) = r.string() else {
            return out;
        };
        let Some(n) = r.i32() else {
            return out;
        };
        for _ in 0..n.max(0) {
            let Some(p) = r.i32() else {
                return out;
            };
            out.push((topic.clone(), p));
        }
    }
    out
}

/// A reader of Kafka's big-endian wire types.
struct Wire<'a>(&'a [u8]);

impl Wire<'_> {
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.0.split_first_chunk::<N>()?;
        self.0 = rest;
        Some(*head)
    }

    fn i16(&mut self) -> Option<i16> {
        self.take().map(i16::from_be_bytes)
    }

    fn i32(&mut self) -> Option<i32> {
        self.take().map(i32::from_be_bytes)
    }

    fn string(&mut self) -> Option<String> {
        let n = usize::try_from(self.i16()?).ok()?;
        let s = self.0.get(..n)?;
        self.0 = &self.0[n..];
        Some(String::from_utf8_lossy(s).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assignment(topics: &[(&str, &[i32])]) -> Vec<u8> {
        let mut b = 1i16.to_be_bytes().to_vec();
        b.extend((topics.len() as i32).to_be_bytes());
        for (t, ps) in topics {
            b.extend((t.len() as i16).to_be_bytes());
            b.extend(t.as_bytes());
            b.extend((ps.len() as i32).to_be_bytes());
            for p in *ps {
                b.extend(p.to_be_bytes());
            }
        }
        b.extend((-1i32).to_be_bytes()); // no user data
        b
    }

    #[test]
    fn reads_a_member_assignment() {
        let b = assignment(&[("orders", &[0, 2]), ("users", &[1])]);
        assert_eq!(
            assigned(&b),
            vec![
                ("orders".into(), 0),
                ("orders".into(), 2),
                ("users".into(), 1)
            ]
        );
        assert!(assigned(&[]).is_empty());
    }

    proptest::proptest! {
        /// Any bytes (a cut or foreign assignment) read without a panic,
        /// and a cut one yields a prefix of the whole.
        #[test]
        fn cut_assignments_read_a_prefix(cut in 0usize..64, junk in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64)) {
            let whole = assignment(&[("orders", &[0, 2, 5]), ("users", &[1])]);
            let all = assigned(&whole);
            let part = assigned(&whole[..cut.min(whole.len())]);
            proptest::prop_assert!(all.starts_with(&part));
            let _ = assigned(&junk);
        }
    }
}
