//! The shipped dashboard and alert rules against a real Prometheus (the
//! Debian package, `scripts/install-prometheus.sh`) scraping a real `sluice
//! run` that has inserted, retried, reconciled and written to the DLQ:
//! every metric they name is served, every panel's query returns data,
//! and every rule evaluates without error.

use crate::binary::produce_raw;
use crate::harness::*;
use sluice_lab::proxy::{Fault, Proxy};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const DASHBOARD: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../deploy/grafana/sluice.json"
);
const RULES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../deploy/prometheus/sluice-alerts.yml"
);

/// A Prometheus server of the test's own; killed on drop.
struct Prometheus {
    child: Child,
    addr: String,
    _dir: TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Prometheus {
    /// Scrapes `target` every second, with the shipped rules loaded.
    async fn start(target: &str) -> Self {
        let dir = TempDir(std::env::temp_dir().join(unique("sluice_prometheus")));
        std::fs::create_dir_all(&dir.0).unwrap();
        let config = dir.0.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 rule_files: [{RULES:?}]\n\
                 scrape_configs:\n  - job_name: sluice\n    static_configs:\n      - targets: [{target:?}]\n"
            ),
        )
        .unwrap();
        let addr = format!("127.0.0.1:{}", free_port());
        let log = std::fs::File::create(dir.0.join("prometheus.log")).unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.0.join("data").display()))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting prometheus: install it with scripts/install-prometheus.sh (make test does)");
        let p = Self {
            child,
            addr,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while get_ok(&p.addr, "/-/ready").await != Some(200) {
            assert!(
                Instant::now() < deadline,
                "prometheus never ready: {}",
                p.log()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        p
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self._dir.0.join("prometheus.log")).unwrap_or_default()
    }

    /// The JSON answer to an instant query.
    async fn query(&self, expr: &str) -> serde_json::Value {
        let q: String = form_urlencoded::Serializer::new(String::new())
            .append_pair("query", expr)
            .finish();
        let (status, body) = get(&self.addr, &format!("/api/v1/query?{q}")).await;
        let v: serde_json::Value =
            serde_json::from_str(&body).unwrap_or_else(|e| panic!("{expr}: {e}: {body}"));
        assert_eq!(
            (status, &v["status"]),
            (200, &"success".into()),
            "{expr}: {body}"
        );
        v
    }
}

/// The status of `GET path`, or `None` if nothing answers.
async fn get_ok(addr: &str, path: &str) -> Option<u16> {
    let stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    drop(stream);
    Some(get(addr, path).await.0)
}

/// Every panel query of the dashboard, with Grafana's variables replaced
/// as "all" would: `(panel title, expr)`.
fn panel_queries(dashboard: &Path) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(dashboard).unwrap();
    let d: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let mut out = Vec::new();
    let mut panels: Vec<&serde_json::Value> =
        d["panels"].as_array().expect("panels").iter().collect();
    while let Some(p) = panels.pop() {
        if let Some(inner) = p["panels"].as_array() {
            panels.extend(inner);
        }
        for t in p["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"].as_str().expect("a target with an expr");
            let expr = expr
                .replace("$__rate_interval", "1m")
                .replace("$__interval", "1m")
                .replace("$__range", "1h")
                .replace("$job", ".*")
                .replace("$instance", ".*")
                .replace("$topic", ".*");
            assert!(!expr.contains('$'), "an unknown variable in {expr}");
            out.push((p["title"].as_str().unwrap_or("?").to_string(), expr));
        }
    }
    assert!(out.len() >= 10, "{out:?}");
    out
}

/// The metric names in `text`: `sluice_…` and `process_…` words.
fn metric_names(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("sluice_") || w.starts_with("process_"))
        .map(String::from)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_panel_and_alert_rule_works_on_a_real_prometheus() {
    // A sink that inserts, retries and reconciles (its first insert's
    // answer is withheld) and sends a record to the DLQ.
    let (topic, table, ch) = setup("dash", 2, 3000).await;
    let dlq = unique("dash_dlq");
    create_topic(&dlq, 1).await;
    produce_raw(&brokers(), &topic, 0, &[b"not json".to_vec()]);
    let upstream = Proxy::upstream_of(&clickhouse_url());
    let proxy = Proxy::start(upstream, Duration::from_secs(4))
        .await
        .unwrap();
    proxy.arm(Fault::WithholdResponse);
    let metrics = format!("127.0.0.1:{}", free_port());
    let mut spec = SinkSpec::new(&topic, &table);
    spec.clickhouse_url = proxy.url.clone();
    spec.insert_timeout = Duration::from_secs(2);
    spec.max_batch_rows = 500;
    spec.metrics_listen = Some(metrics.clone());
    spec.dlq_topic = Some(dlq);
    let mut sink = spec.start();
    let prometheus = Prometheus::start(&metrics).await;
    let got = wait_for(&ch, &table, 3000, Duration::from_secs(120)).await;
    assert_eq!(got.distinct_offsets, 3000, "{}", sink.log_tail());
    assert_eq!(proxy.fired(), 1);

    // Every metric the dashboard and the rules name is served, and every
    // panel's query returns data, once a few scrapes are in (the retry and
    // the reconciliation come after the rows: the answer was withheld).
    let dashboard = std::fs::read_to_string(DASHBOARD).unwrap();
    let rules = std::fs::read_to_string(RULES).unwrap();
    let named: BTreeSet<String> = metric_names(&dashboard)
        .into_iter()
        .chain(metric_names(&rules))
        .collect();
    let queries = panel_queries(Path::new(DASHBOARD));
    let deadline = Instant::now() + Duration::from_secs(90);
    let (missing, empty) = loop {
        let (_, served) = get(&metrics, "/metrics").await;
        let missing: Vec<&String> = named
            .iter()
            .filter(|m| !served.lines().any(|l| l.starts_with(m.as_str())))
            .collect();
        let mut empty = Vec::new();
        for q in &queries {
            let v = prometheus.query(&q.1).await;
            if v["data"]["result"].as_array().is_none_or(|r| r.is_empty()) {
                empty.push(q);
            }
        }
        if (missing.is_empty() && empty.is_empty()) || Instant::now() > deadline {
            break (missing, empty);
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    assert!(missing.is_empty(), "named but not served: {missing:?}");
    assert!(
        empty.is_empty(),
        "panels without data: {empty:#?}\n{}\n{}",
        sink.log_tail(),
        prometheus.log()
    );

    // Every rule has been evaluated, without error.
    let (_, body) = get(&prometheus.addr, "/api/v1/rules").await;
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let rules: Vec<&serde_json::Value> = v["data"]["groups"]
        .as_array()
        .expect("rule groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().into_iter().flatten())
        .collect();
    assert!(rules.len() >= 8, "{body}");
    for r in rules {
        assert_eq!(r["health"], "ok", "{r}");
    }
    // The DLQ record fires its alert (after its `for`, if any, it would
    // page): pending or firing already.
    let alerts = prometheus
        .query("ALERTS{alertname=\"SluiceDlqRecords\"}")
        .await;
    assert!(
        !alerts["data"]["result"].as_array().unwrap().is_empty(),
        "the DLQ record raised no alert: {alerts}"
    );
    sink.stop(Duration::from_secs(30));
}
