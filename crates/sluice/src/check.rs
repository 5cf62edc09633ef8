//! `sluice check-config`: is this config valid, and can both ends be
//! reached?
//!
//! In: a validated [`Config`]. Out: one verdict per check — Kafka reachable,
//! each routed topic present, ClickHouse reachable, each target table
//! present with the metadata columns (and the dedup key columns), and for
//! each Avro or Protobuf route its subject's latest schema — printed
//! as a table. Secrets (the ClickHouse password, librdkafka properties
//! whose names say password, secret or key) never appear in the output.

use crate::ch::ClickHouse;
use crate::config::{secret, Config, Format};
use crate::registry::Registry;
use crate::report::{grid, Outcome};
use rdkafka::consumer::{BaseConsumer, Consumer};
use std::time::Duration;

/// One line of the verdict.
#[derive(Debug, Clone)]
pub(crate) struct Check {
    pub(crate) what: String,
    pub(crate) ok: bool,
    pub(crate) detail: String,
}

/// `sluice check-config` once the file is valid: where each endpoint came
/// from, then every check as a table; found something when one failed.
pub async fn main(cfg: &Config) -> Outcome {
    for line in cfg.endpoints() {
        println!("{line}");
    }
    for ignored in cfg.origins.warnings() {
        println!("warning: {ignored}");
    }
    let (text, outcome) = render(&check(cfg).await);
    print!("{text}");
    outcome
}

/// Runs every check; never fails itself.
pub(crate) async fn check(cfg: &Config) -> Vec<Check> {
    let mut out = Vec::new();
    let k = cfg.kafka.clone();
    let topics: Vec<String> = cfg.routes.iter().map(|r| r.topic.clone()).collect();
    let dlq = cfg.dlq.clone();
    let kafka = tokio::task::spawn_blocking(move || kafka_checks(&k, &topics, dlq.as_deref()))
        .await
        .unwrap_or_else(|e| {
            vec![Check {
                what: "kafka".into(),
                ok: false,
                detail: format!("the check itself failed: {e}"),
            }]
        });
    out.extend(kafka);
    out.extend(clickhouse_checks(cfg).await);
    out.extend(registry_checks(cfg).await);
    out
}

/// For each Avro or Protobuf route: its subject's latest schema, fetched
/// with every schema it references, is of the route's format and compiles.
async fn registry_checks(cfg: &Config) -> Vec<Check> {
    let binary: Vec<_> = cfg
        .routes
        .iter()
        .filter(|r| r.format != Format::Json)
        .collect();
    let Some(rc) = cfg.schema_registry.as_ref().filter(|_| !binary.is_empty()) else {
        return Vec::new();
    };
    let registry = match Registry::new(rc) {
        Ok(r) => r,
        Err(e) => {
            return vec![Check {
                what: format!("schema registry {}", secret::redact_url(&rc.url)),
                ok: false,
                detail: e.to_string(),
            }]
        }
    };
    let mut out = Vec::new();
    for r in binary {
        let subject = r.subject.clone().unwrap_or_default();
        let expected = r.format.name();
        let verdict = async {
            let latest = registry.version(&subject, "latest").await?;
            let (id, version) = (latest.id.unwrap_or(0), latest.version.unwrap_or(0));
            let resolved = registry.resolve(latest).await?;
            crate::registry::build(id, &resolved, expected)?;
            Ok::<_, crate::registry::RegistryError>(format!(
                "version {version} (id {id}, {} reference(s)) compiles as {expected}",
                resolved.references.len()
            ))
        };
        out.push(match verdict.await {
            Ok(detail) => Check {
                what: format!("subject {subject} (topic {})", r.topic),
                ok: true,
                detail,
            },
            Err(e) => Check {
                what: format!("subject {subject} (topic {})", r.topic),
                ok: false,
                detail: e.to_string(),
            },
        });
    }
    out
}

fn kafka_checks(
    k: &crate::config::KafkaConfig,
    topics: &[String],
    dlq: Option<&str>,
) -> Vec<Check> {
    let mut cc = k.client_config();
    cc.set("group.id", &k.group_id);
    let consumer: BaseConsumer = match cc.create() {
        Ok(c) => c,
        Err(e) => {
            return vec![Check {
                what: format!("kafka {}", k.brokers),
                ok: false,
                detail: format!("cannot create a client: {e}"),
            }]
        }
    };
    let md = match consumer.fetch_metadata(None, Duration::from_secs(10)) {
        Ok(md) => md,
        Err(e) => {
            return vec![Check {
                what: format!("kafka {}", k.brokers),
                ok: false,
                detail: format!("unreachable: {e}"),
            }]
        }
    };
    let mut out = vec![Check {
        what: format!("kafka {}", k.brokers),
        ok: true,
        detail: format!(
            "{} broker(s), {}{}",
            md.brokers().len(),
            k.security.protocol,
            k.security
                .sasl
                .as_ref()
                .map(|s| format!(" {} as {}", s.mechanism, s.username))
                .unwrap_or_default()
        ),
    }];
    let named = topics
        .iter()
        .map(|t| (t.as_str(), "topic"))
        .chain(dlq.map(|t| (t, "dlq topic")));
    for (t, label) in named {
        let found = md.topics().iter().find(|x| x.name() == t);
        out.push(match found {
            Some(x) if x.error().is_none() => Check {
                what: format!("{label} {t}"),
                ok: true,
                detail: format!("{} partition(s)", x.partitions().len()),
            },
            _ => Check {
                what: format!("{label} {t}"),
                ok: false,
                detail: "does not exist".into(),
            },
        });
    }
    out
}

async fn clickhouse_checks(cfg: &Config) -> Vec<Check> {
    let what = format!("clickhouse {}", cfg.clickhouse.url);
    let ch = match ClickHouse::connect(
        &cfg.clickhouse,
        cfg.sink.columns.clone(),
        cfg.sink.delivery,
        cfg.sink.limits.max_rows,
    )
    .await
    {
        Ok(ch) => ch,
        Err(e) => {
            return vec![Check {
                what,
                ok: false,
                detail: format!("unreachable: {e}"),
            }]
        }
    };
    let mut out = vec![Check {
        what,
        ok: true,
        detail: format!("as user {}", cfg.clickhouse.user),
    }];
    for r in &cfg.routes {
        let result = ch.check_table(r).await;
        let dedup = match (&result, &r.dedup) {
            (Ok(()), Some(d)) => ch.check_columns(r, &d.fields).await.err(),
            _ => None,
        };
        out.push(match (result, dedup) {
            (Ok(()), None) => Check {
                what: format!("table {}.{}", r.database, r.table),
                ok: true,
                detail: format!("has the metadata columns (for topic {})", r.topic),
            },
            (Err(e), _) | (Ok(()), Some(e)) => Check {
                what: format!("table {}.{}", r.database, r.table),
                ok: false,
                detail: e.to_string(),
            },
        });
    }
    out
}

/// The verdicts as a table; clean when every check passed.
pub(crate) fn render(checks: &[Check]) -> (String, Outcome) {
    let mut g = grid(["check", "verdict", "detail"]);
    for c in checks {
        g.add_row([
            c.what.clone(),
            if c.ok { "ok" } else { "FAILED" }.to_string(),
            c.detail.clone(),
        ]);
    }
    let outcome = if checks.iter().all(|c| c.ok) {
        Outcome::Clean
    } else {
        Outcome::Found
    };
    (format!("{g}\n"), outcome)
}
