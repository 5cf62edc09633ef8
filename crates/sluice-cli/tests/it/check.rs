//! `sluice check-config`: a verdict for each end, exit 0 only when all pass,
//! and secrets never in the output.

use crate::harness::*;

fn check(toml: &str) -> (i32, String) {
    with_config(&["check-config"], toml, &[])
}

/// `sluice <args> --config <toml>` with `env`; returns (exit code, stdout + stderr).
fn with_config(args: &[&str], toml: &str, env: &[(&str, &str)]) -> (i32, String) {
    let dir = std::env::temp_dir().join(unique("check"));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("sluice.toml");
    std::fs::write(&path, toml).unwrap();
    let out = run(sluice(args)
        .arg("--config")
        .arg(&path)
        .env_remove("KAFKA_BROKERS")
        .env_remove("CLICKHOUSE_URL")
        .env_remove("SLUICE_LOG")
        .envs(env.iter().copied()));
    (out.code, format!("{}{}", out.stdout, out.stderr))
}

fn config(brokers: &str, url: &str, topic: &str, table: &str) -> String {
    format!(
        r#"
[kafka]
brokers = "{brokers}"
properties = {{ "ssl.keystore.password" = "kafka-s3cret-pw" }}
[clickhouse]
url = "{url}"
password = "ch-s3cret-pw"
[[route]]
topic = "{topic}"
table = "{table}"
dedup_key = ["id"]
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verdicts_for_both_ends_and_no_secrets() {
    let (topic, table, _ch) = setup("check", 3, 0).await;
    let (code, out) = check(&config(&brokers(), &clickhouse_url(), &topic, &table));
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("valid"), "{out}");
    assert!(
        out.contains(&format!("topic {topic}")) && out.contains("3 partition(s)"),
        "{out}"
    );
    assert!(out.contains(&format!("table {table}")), "{out}");
    assert!(!out.contains("FAILED"), "{out}");

    // A missing topic and an unreachable ClickHouse: each named, exit 1.
    let (code, out) = check(&config(
        &brokers(),
        "http://127.0.0.1:1",
        "no_such_topic_x",
        &table,
    ));
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("topic no_such_topic_x") && out.contains("does not exist"),
        "{out}"
    );
    assert!(
        out.contains("clickhouse http://127.0.0.1:1") && out.contains("unreachable"),
        "{out}"
    );

    // A DLQ topic that does not exist is named too.
    let with_dlq = config(&brokers(), &clickhouse_url(), &topic, &table)
        .replace("[[route]]", "[dlq]\ntopic = \"no_such_dlq_x\"\n[[route]]");
    let (code, out) = check(&with_dlq);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("dlq topic no_such_dlq_x") && out.contains("does not exist"),
        "{out}"
    );

    // A table without the dedup key column.
    let (db, _) = table.split_once('.').unwrap();
    exec(&ch(), &format!("CREATE TABLE {db}.nokey (x UInt8, _topic String, _partition UInt32, _offset UInt64) ENGINE = MergeTree ORDER BY x")).await;
    let (code, out) = check(&config(
        &brokers(),
        &clickhouse_url(),
        &topic,
        &format!("{db}.nokey"),
    ));
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("dedup_key column(s) id"), "{out}");

    // An invalid file: exit 2, the field named.
    let (code, out) = check("[kafka]\nbrokers = 'a:1'\n[clickhouse]\nurl = 'ftp://x'\n");
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("clickhouse.url"), "{out}");

    for (_, out) in [
        check(&config(&brokers(), &clickhouse_url(), &topic, &table)),
        check(&config("127.0.0.1:1", "http://127.0.0.1:1", &topic, &table)),
    ] {
        assert!(!out.contains("s3cret"), "a secret leaked: {out}");
    }
}

/// Secrets given every way (a file, a variable, inline, a pass-through
/// property) appear in no output: not `check-config`'s verdict, not the
/// errors and debug logs of `run`, not a config error.
#[test]
fn secrets_never_appear_in_output() {
    let dir = std::env::temp_dir().join(unique("secrets"));
    std::fs::create_dir_all(&dir).unwrap();
    let ch_pw = dir.join("ch-password");
    std::fs::write(&ch_pw, "ch-file-s3cret\n").unwrap();
    let toml = format!(
        r#"
[kafka]
brokers = "127.0.0.1:1"
properties = {{ "ssl.keystore.password" = "prop-s3cret" }}
[kafka.sasl]
mechanism = "SCRAM-SHA-256"
username = "sluice"
[clickhouse]
url = "http://127.0.0.1:1"
password_file = "{}"
[[route]]
topic = "t"
table = "db.t"
"#,
        ch_pw.display()
    );
    let env = [("SLUICE_KAFKA_SASL_PASSWORD", "env-s3cret")];
    let (code, out) = with_config(&["check-config"], &toml, &env);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("kafka 127.0.0.1:1"), "{out}");
    let (code, run) = with_config(&["--log", "trace", "run"], &toml, &env);
    assert_eq!(code, 2, "{run}");
    // Without the variable the password is missing: a config error.
    let (code, missing) = with_config(&["check-config"], &toml, &[]);
    assert_eq!(code, 2, "{missing}");
    assert!(
        missing.contains("kafka.sasl.password: missing"),
        "{missing}"
    );
    // Inline in the file, with a bad value next to it.
    let inline = toml
        .replace(
            "username = \"sluice\"",
            "username = \"sluice\"\npassword = \"inline-s3cret\"",
        )
        .replace("[[route]]", "[sink]\nmax_batch_rows = 0\n[[route]]");
    let (code, bad) = with_config(&["run"], &inline, &[]);
    assert_eq!(code, 2, "{bad}");
    for out in [&out, &run, &missing, &bad] {
        assert!(!out.contains("s3cret"), "a secret leaked: {out}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// TLS is built in on both sides: SCRAM over TLS makes a Kafka client, and
/// an `https://` URL speaks TLS (here to a plain-HTTP server, which fails
/// in the TLS handshake, not before it).
#[test]
fn tls_and_scram_are_built_in() {
    let url = clickhouse_url().replacen("http://", "https://", 1);
    let toml = format!(
        r#"
[kafka]
brokers = "127.0.0.1:1"
[kafka.tls]
verify_hostname = true
[kafka.sasl]
mechanism = "SCRAM-SHA-512"
username = "u"
password = "p"
[clickhouse]
url = "{url}"
[[route]]
topic = "t"
table = "db.t"
"#
    );
    let (code, out) = check(&toml);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("sasl_ssl") || out.contains("Broker transport failure"),
        "{out}"
    );
    assert!(!out.contains("Unsupported value"), "{out}");
    assert!(
        out.contains("SSL routines"),
        "https did not speak TLS: {out}"
    );
}

/// A generic variable left in the shell for another tool never redirects a
/// config that names its servers: it is reported, and each endpoint's
/// source is printed. With nothing in the file, it fills the gap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_say_where_they_came_from() {
    let (topic, table, _ch) = setup("check_origin", 1, 0).await;
    let stray = [
        ("KAFKA_BROKERS", "127.0.0.1:1"),
        ("CLICKHOUSE_URL", "http://127.0.0.1:1"),
    ];
    let file = config(&brokers(), &clickhouse_url(), &topic, &table);
    let (code, out) = with_config(&["check-config"], &file, &stray);
    assert_eq!(code, 0, "the file's servers are used: {out}");
    let url = clickhouse_url();
    assert!(
        out.contains(&format!("clickhouse.url = {url} (from the config file)")),
        "{out}"
    );
    assert!(
        out.contains("warning: CLICKHOUSE_URL=http://127.0.0.1:1 is ignored")
            && out.contains("warning: KAFKA_BROKERS=127.0.0.1:1 is ignored"),
        "{out}"
    );
    // A SLUICE_ variable is meant for sluice: it beats the file.
    let mut env = stray.to_vec();
    env.push(("SLUICE_CLICKHOUSE_URL", "http://127.0.0.1:1"));
    let (code, out) = with_config(&["check-config"], &file, &env);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("clickhouse.url = http://127.0.0.1:1 (from SLUICE_CLICKHOUSE_URL)"),
        "{out}"
    );
    // Without them in the file, the generic variables fill them in.
    let bare = file
        .replace(&format!("brokers = \"{}\"", brokers()), "")
        .replace(&format!("url = \"{url}\""), "");
    let env = [
        ("KAFKA_BROKERS", brokers()),
        ("CLICKHOUSE_URL", url.clone()),
    ];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (code, out) = with_config(&["check-config"], &bare, &env);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(&format!("clickhouse.url = {url} (from CLICKHOUSE_URL)"))
            && out.contains(&format!(
                "kafka.brokers = {} (from KAFKA_BROKERS)",
                brokers()
            )),
        "{out}"
    );
    assert!(!out.contains("ignored"), "{out}");
    // A flag beats everything.
    let (code, out) = with_config(
        &["check-config", "--clickhouse-url", &url],
        &file.replace(&format!("url = \"{url}\""), "url = \"http://127.0.0.1:1\""),
        &stray,
    );
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(&format!("clickhouse.url = {url} (from --clickhouse-url)")),
        "{out}"
    );
    assert!(
        !out.contains("CLICKHOUSE_URL="),
        "the flag made it moot: {out}"
    );
}
