//! The `[kafka]` section: where records come from and how the group is
//! joined.
//!
//! In: the section as written ([`RawKafka`]) and the `--brokers` and
//! `--group-id` flags. Out: a [`KafkaConfig`] with every default filled in
//! and TLS/SASL checked ([`super::security`]), or a [`ConfigError`] naming
//! the field.

use super::{bounded, invalid, secret, security, ConfigError, KafkaSecurity};
use serde::{Deserialize, Serialize};
use sluice_protocol::resume::ResetPolicy;
use std::collections::BTreeMap;
use std::time::Duration;

/// The consumer group when the file names none.
pub(crate) const DEFAULT_GROUP_ID: &str = "sluice";
/// The group session timeout when the file does not say.
pub(crate) const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(10);

#[serde_with::skip_serializing_none]
#[derive(Debug, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RawKafka {
    /// Bootstrap servers, `host:port[,host:port]`. `KAFKA_BROKERS` fills
    /// them in when nothing sets them.
    pub brokers: Option<String>,
    /// Consumer group id. Default `sluice`.
    pub group_id: Option<String>,
    /// Static group membership (`group.instance.id`, KIP-345): a restarted
    /// instance with the same id takes its partitions back at once, without
    /// a rebalance. Give each instance its own, stable id (a pod name).
    pub instance_id: Option<String>,
    /// Group session timeout. Default 10s.
    #[serde(default, with = "humantime_serde")]
    pub session_timeout: Option<Duration>,
    /// Heartbeat interval. Default 3s (a third of the session timeout at most).
    #[serde(default, with = "humantime_serde")]
    pub heartbeat_interval: Option<Duration>,
    /// Where to start a partition that ClickHouse holds nothing of, when
    /// nothing is committed either: `earliest` (default) or `latest`. Where
    /// ClickHouse holds rows, they decide (see `sluice_protocol::resume`).
    pub auto_offset_reset: Option<String>,
    /// `plaintext`, `ssl`, `sasl_plaintext` or `sasl_ssl`. Default: from
    /// the `tls` and `sasl` sections present.
    pub(crate) security_protocol: Option<String>,
    /// TLS to the brokers.
    pub(crate) tls: Option<security::RawTls>,
    /// SASL authentication (PLAIN, SCRAM).
    pub(crate) sasl: Option<security::RawSasl>,
    /// Extra librdkafka properties, passed through as they are.
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
}

#[derive(Clone)]
pub struct KafkaConfig {
    pub(crate) brokers: String,
    pub(crate) group_id: String,
    pub(crate) instance_id: Option<String>,
    pub(crate) session_timeout: Duration,
    pub(crate) heartbeat_interval: Duration,
    pub(crate) auto_offset_reset: ResetPolicy,
    pub(crate) security: KafkaSecurity,
    pub(crate) properties: BTreeMap<String, String>,
}

/// Secret-looking pass-through properties never reach a log line.
impl std::fmt::Debug for KafkaConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let properties: BTreeMap<&str, &str> = self
            .properties
            .iter()
            .map(|(k, v)| {
                let shown = if secret::is_secret_property(k) {
                    "<redacted>"
                } else {
                    v.as_str()
                };
                (k.as_str(), shown)
            })
            .collect();
        f.debug_struct("KafkaConfig")
            .field("brokers", &self.brokers)
            .field("group_id", &self.group_id)
            .field("instance_id", &self.instance_id)
            .field("session_timeout", &self.session_timeout)
            .field("heartbeat_interval", &self.heartbeat_interval)
            .field("auto_offset_reset", &self.auto_offset_reset)
            .field("security", &self.security)
            .field("properties", &properties)
            .finish()
    }
}

impl RawKafka {
    /// The section with defaults filled in; the flags beat the file.
    pub(super) fn validate(
        self,
        brokers: Option<String>,
        group_id: Option<String>,
    ) -> Result<KafkaConfig, ConfigError> {
        let brokers = brokers
            .or(self.brokers)
            .filter(|b| !b.trim().is_empty())
            .ok_or(ConfigError::Missing {
                field: "kafka.brokers",
                expected: "host:port (or KAFKA_BROKERS / --brokers)",
            })?;
        let auto_offset_reset = match self.auto_offset_reset.as_deref() {
            None => ResetPolicy::Earliest,
            Some(s) => ResetPolicy::parse(s)
                .ok_or_else(|| invalid("kafka.auto_offset_reset", "earliest or latest", s))?,
        };
        let session_timeout = bounded("kafka.session_timeout", self.session_timeout)?
            .unwrap_or(DEFAULT_SESSION_TIMEOUT);
        let heartbeat_interval = bounded("kafka.heartbeat_interval", self.heartbeat_interval)?
            .unwrap_or_else(|| (session_timeout / 3).min(Duration::from_secs(3)));
        if heartbeat_interval * 3 > session_timeout {
            return Err(ConfigError::Heartbeat {
                heartbeat: heartbeat_interval,
                session: session_timeout,
            });
        }
        let security = security::validate(
            self.security_protocol,
            self.tls,
            self.sasl,
            &self.properties,
        )?;
        Ok(KafkaConfig {
            brokers,
            group_id: group_id
                .or(self.group_id)
                .unwrap_or_else(|| DEFAULT_GROUP_ID.into()),
            instance_id: self.instance_id.filter(|s| !s.is_empty()),
            session_timeout,
            heartbeat_interval,
            auto_offset_reset,
            security,
            properties: self.properties,
        })
    }
}
