//! The schema registry end to end: `sluice check-config` reads each Avro or
//! Protobuf route's subject from the stack's registry (a real HTTP server,
//! `stack/schema_registry.py`), with references, basic auth, and a registry
//! that is down or answers 404, each named.

use crate::harness::*;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// The stack's registry.
pub fn registry_url() -> String {
    std::env::var("SCHEMA_REGISTRY_URL")
        .expect("SCHEMA_REGISTRY_URL is not set: the stack is missing (run `make test`, or `make stack` and export its lines)")
}

/// Registers `schema` (a JSON request body) under `subject`; returns the id.
pub async fn register(
    url: &str,
    auth: Option<&str>,
    subject: &str,
    body: serde_json::Value,
) -> u64 {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<bytes::Bytes>>();
    let mut req = hyper::Request::post(format!(
        "{url}/subjects/{}/versions",
        subject.replace('/', "%2F")
    ))
    .header("Content-Type", "application/vnd.schemaregistry.v1+json");
    if let Some(a) = auth {
        use base64::Engine;
        let token = base64::engine::general_purpose::STANDARD.encode(a);
        req = req.header("Authorization", format!("Basic {token}"));
    }
    let req = req.body(Full::from(body.to_string())).unwrap();
    let resp = client.request(req).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
    serde_json::from_slice::<serde_json::Value>(&bytes).unwrap()["id"]
        .as_u64()
        .unwrap()
}

/// A registry of this test's own, optionally with basic auth, that can be
/// stopped and started again on the same port and database; killed on drop.
pub struct PrivateRegistry {
    child: Option<std::process::Child>,
    pub url: String,
    port: u16,
    auth: Option<String>,
    dir: std::path::PathBuf,
}

impl PrivateRegistry {
    pub async fn start(auth: Option<&str>) -> Self {
        let dir = std::env::temp_dir().join(unique("registry"));
        std::fs::create_dir_all(&dir).unwrap();
        let port = free_port();
        let mut r = PrivateRegistry {
            child: None,
            url: format!("http://127.0.0.1:{port}"),
            port,
            auth: auth.map(String::from),
            dir,
        };
        r.restart().await;
        r
    }

    /// Starts it again (after [`Self::stop`]) where it was, with its schemas.
    pub async fn restart(&mut self) {
        let python = std::env::var("SLUICE_CHDB_PYTHON").expect("SLUICE_CHDB_PYTHON (make stack)");
        let server =
            std::env::var("SLUICE_REGISTRY_SERVER").expect("SLUICE_REGISTRY_SERVER (make stack)");
        let mut cmd = std::process::Command::new(python);
        cmd.arg(server)
            .arg("--db")
            .arg(self.dir.join("r.db"))
            .args(["--port", &self.port.to_string()]);
        if let Some(a) = &self.auth {
            cmd.args(["--basic-auth", a]);
        }
        self.child = Some(cmd.stderr(std::process::Stdio::null()).spawn().unwrap());
        for _ in 0..200 {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        panic!("the registry did not listen on {}", self.port);
    }

    /// Kills it (`kill -9`).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for PrivateRegistry {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn config(topic: &str, table: &str, registry: &str, extra: &str) -> String {
    format!(
        r#"
[kafka]
brokers = "{}"
[clickhouse]
url = "{}"
[schema_registry]
url = "{registry}"
{extra}
[[route]]
topic = "{topic}"
table = "{table}"
format = "avro"
"#,
        brokers(),
        clickhouse_url()
    )
}

/// `sluice check-config` on `toml`: (exit code, output).
fn check(toml: &str) -> (i32, String) {
    let path = std::env::temp_dir().join(format!("{}.toml", unique("regcheck")));
    std::fs::write(&path, toml).unwrap();
    let out = run(sluice(["check-config", "--config"])
        .arg(&path)
        .env_remove("SCHEMA_REGISTRY_URL"));
    let _ = std::fs::remove_file(&path);
    (out.code, format!("{}{}", out.stdout, out.stderr))
}

const MONEY: &str = r#"{"type":"record","name":"Money","namespace":"common","fields":[{"name":"units","type":"long"}]}"#;
const ORDER: &str = r#"{"type":"record","name":"Order","namespace":"shop","fields":[{"name":"id","type":"long"},{"name":"total","type":"common.Money"}]}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_config_reads_each_routes_subject_with_its_references() {
    let (topic, table, _ch) = setup("registry", 1, 0).await;
    let url = registry_url();
    let money = format!("{topic}-money");
    register(&url, None, &money, serde_json::json!({ "schema": MONEY })).await;
    let refs = [serde_json::json!({"name": "common.Money", "subject": money, "version": 1})];
    let body = serde_json::json!({ "schema": ORDER, "references": refs });
    let id = register(&url, None, &format!("{topic}-value"), body).await;

    let (code, out) = check(&config(&topic, &table, &url, ""));
    assert_eq!(code, 0, "{out}");
    let line = format!("version 1 (id {id}, 1 reference(s)) compiles as avro");
    assert!(
        out.contains(&format!("subject {topic}-value")) && out.contains(&line),
        "{out}"
    );

    // A subject nobody registered, and a registry that is not there.
    let (code, out) = check(&config(&format!("{topic}-nothing"), &table, &url, ""));
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!(
            "has no subject \"{topic}-nothing-value\" version latest"
        )),
        "{out}"
    );
    let down = format!("http://127.0.0.1:{}", free_port());
    let (code, out) = check(&config(&topic, &table, &down, ""));
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!("the schema registry at {down} does not answer")),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_config_signs_in_to_the_registry_and_never_prints_the_password() {
    let (topic, table, _ch) = setup("regauth", 1, 0).await;
    let registry = PrivateRegistry::start(Some("sluice:s3cret-pw")).await;
    let body = serde_json::json!({ "schema": MONEY });
    register(
        &registry.url,
        Some("sluice:s3cret-pw"),
        &format!("{topic}-value"),
        body,
    )
    .await;

    let wrong = "username = \"sluice\"\npassword = \"wrong-pw\"";
    let (code, out) = check(&config(&topic, &table, &registry.url, wrong));
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("the schema registry refused the credentials (401)"),
        "{out}"
    );
    let right = "username = \"sluice\"\npassword = \"s3cret-pw\"";
    let (code, out) = check(&config(&topic, &table, &registry.url, right));
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("compiles as avro"), "{out}");
    assert!(
        !out.contains("s3cret-pw") && !out.contains("wrong-pw"),
        "{out}"
    );
}

/// POSTs `body` to ClickHouse's HTTP interface with `query`; returns the
/// answer, failing on an error status.
async fn ch_post(query: &str, body: Vec<u8>) -> String {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<bytes::Bytes>>();
    let url = format!(
        "{}/?query={}",
        clickhouse_url(),
        query
            .bytes()
            .map(|b| format!("%{b:02X}"))
            .collect::<String>()
    );
    let req = hyper::Request::post(url).body(Full::from(body)).unwrap();
    let resp = client.request(req).await.unwrap();
    let status = resp.status();
    let text =
        String::from_utf8_lossy(&resp.into_body().collect().await.unwrap().to_bytes()).to_string();
    assert_eq!(status, 200, "{query}: {text}");
    text
}

const TYPED: &str = r#"{"type":"record","name":"Typed","namespace":"shop","fields":[
  {"name":"id","type":"long"},
  {"name":"price","type":{"type":"bytes","logicalType":"decimal","precision":20,"scale":4}},
  {"name":"at","type":{"type":"long","logicalType":"timestamp-millis"}},
  {"name":"at_us","type":{"type":"long","logicalType":"timestamp-micros"}},
  {"name":"day","type":{"type":"int","logicalType":"date"}},
  {"name":"uid","type":{"type":"string","logicalType":"uuid"}},
  {"name":"status","type":{"type":"enum","name":"Status","symbols":["NEW","PAID"]}},
  {"name":"note","type":["null","string"],"default":null},
  {"name":"score","type":"double"},
  {"name":"blob","type":"bytes"},
  {"name":"tags","type":{"type":"array","items":"string"}},
  {"name":"attrs","type":{"type":"map","values":"long"}},
  {"name":"ship","type":{"type":"record","name":"Ship","fields":[{"name":"city","type":"string"},{"name":"zip","type":["null","int"]}]}}
]}"#;

/// Every Avro type round-trips through ClickHouse: the table is the one
/// `AvroSchema::columns` recommends, the row what `to_json` writes, and
/// what ClickHouse reads back is the value that went in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn avro_values_come_back_from_clickhouse_as_they_went_in() {
    use apache_avro::types::Value as V;
    let schema = sluice_formats::avro::AvroSchema::parse(TYPED, &[]).unwrap();
    let table = format!("default.{}", unique("avro_typed"));
    let cols: Vec<String> = schema
        .columns()
        .iter()
        .map(|(n, t)| format!("`{n}` {t}"))
        .collect();
    ch_post(
        &format!(
            "CREATE TABLE {table} ({}) ENGINE = MergeTree ORDER BY id",
            cols.join(", ")
        ),
        Vec::new(),
    )
    .await;

    let price = num_bigint::BigInt::from(-123_456_789_012_345i64).to_signed_bytes_be();
    let ship = |zip: V| {
        V::Record(vec![
            ("city".into(), V::String("Oslo".into())),
            ("zip".into(), zip),
        ])
    };
    let rows = [
        vec![
            ("id", V::Long(1)),
            ("price", V::Decimal(apache_avro::Decimal::from(price))),
            ("at", V::TimestampMillis(-1_500)),
            ("at_us", V::TimestampMicros(1_700_000_000_123_456)),
            ("day", V::Date(-25_567)),
            (
                "uid",
                V::Uuid("123e4567-e89b-12d3-a456-426614174000".parse().unwrap()),
            ),
            ("status", V::Enum(1, "PAID".into())),
            ("note", V::Union(1, Box::new(V::String("a \"b\"\n".into())))),
            ("score", V::Double(f64::NAN)),
            ("blob", V::Bytes(vec![0xff, 0x00, b'"'])),
            ("tags", V::Array(vec![V::String("x".into())])),
            ("attrs", V::Map([("k".to_string(), V::Long(-1))].into())),
            ("ship", ship(V::Union(1, Box::new(V::Int(1234))))),
        ],
        vec![
            ("id", V::Long(2)),
            ("price", V::Decimal(apache_avro::Decimal::from(vec![0u8]))),
            ("at", V::TimestampMillis(4_102_444_800_000)),
            ("at_us", V::TimestampMicros(0)),
            ("day", V::Date(0)),
            (
                "uid",
                V::Uuid("00000000-0000-0000-0000-000000000000".parse().unwrap()),
            ),
            ("status", V::Enum(0, "NEW".into())),
            ("note", V::Union(0, Box::new(V::Null))),
            ("score", V::Double(-0.1)),
            ("blob", V::Bytes(Vec::new())),
            ("tags", V::Array(Vec::new())),
            ("attrs", V::Map(Default::default())),
            ("ship", ship(V::Union(0, Box::new(V::Null)))),
        ],
    ];
    let avro = apache_avro::Schema::parse_str(TYPED).unwrap();
    let writer = apache_avro::writer::datum::GenericDatumWriter::builder(&avro)
        .build()
        .unwrap();
    let mut body = Vec::new();
    for r in rows {
        let record = V::Record(r.into_iter().map(|(k, v)| (k.to_string(), v)).collect());
        let payload = writer.write_value_to_vec(record).unwrap();
        schema.to_json(&payload, &mut body, usize::MAX).unwrap();
        body.push(b'\n');
    }
    ch_post(
        &format!("INSERT INTO {table} SETTINGS date_time_input_format = 'best_effort' FORMAT JSONEachRow"),
        body,
    )
    .await;
    let got = ch_post(
        &format!(
            "SELECT id, toString(price), toUnixTimestamp64Milli(at), toUnixTimestamp64Micro(at_us), toString(day), \
             toString(uid), toString(status), note, score, hex(blob), tags, attrs, ship FROM {table} ORDER BY id FORMAT TSV"
        ),
        Vec::new(),
    )
    .await;
    assert_eq!(
        got,
        "1\t-12345678901.2345\t-1500\t1700000000123456\t1900-01-01\t123e4567-e89b-12d3-a456-426614174000\tPAID\ta \"b\"\\n\tnan\tFF0022\t['x']\t{'k':-1}\t('Oslo',1234)\n\
         2\t0\t4102444800000\t0\t1970-01-01\t00000000-0000-0000-0000-000000000000\tNEW\t\\N\t-0.1\t\t[]\t{}\t('Oslo',NULL)\n"
    );
    ch_post(&format!("DROP TABLE {table}"), Vec::new()).await;
}

/// Floats and doubles at their ends come back bit for bit through the
/// registry routes' insert settings: the decoders write the shortest text,
/// with an exponent where it is shorter, which ClickHouse's fast float
/// parser (the default before 26.7) reads one unit off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floats_come_back_bit_for_bit_through_the_registry_settings() {
    const FLOATS: &str = r#"{"type":"record","name":"F","fields":[
      {"name":"id","type":"long"},{"name":"f","type":"float"},{"name":"d","type":"double"}]}"#;
    let schema = sluice_formats::avro::AvroSchema::parse(FLOATS, &[]).unwrap();
    let table = format!("default.{}", unique("avro_floats"));
    ch_post(
        &format!(
            "CREATE TABLE {table} (id Int64, f Float32, d Float64) ENGINE = MergeTree ORDER BY id"
        ),
        Vec::new(),
    )
    .await;
    let values: Vec<(f32, f64)> = vec![
        (f32::MAX, f64::MAX),
        (f32::MIN_POSITIVE, f64::MIN_POSITIVE),
        (1e-40, 5e-324),
        (-3e38, -1e300),
        (1.5e-7, 1.5e-7),
        (1e16, 1e16),
        (123_456.79, 0.1),
        (-0.0, -0.0),
    ];
    let mut body = Vec::new();
    for (id, (f, d)) in values.iter().enumerate() {
        // Avro: the id as a zigzag varint, then the float and the double
        // as they are.
        let mut payload = Vec::new();
        let mut v = (id as u64) << 1;
        loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                payload.push(b);
                break;
            }
            payload.push(b | 0x80);
        }
        payload.extend(f.to_le_bytes());
        payload.extend(d.to_le_bytes());
        schema.to_json(&payload, &mut body, usize::MAX).unwrap();
        body.push(b'\n');
    }
    let settings: Vec<String> = sluice::config::Format::Avro
        .insert_settings(false)
        .iter()
        .map(|(k, v)| format!("{k} = '{v}'"))
        .collect();
    ch_post(
        &format!(
            "INSERT INTO {table} SETTINGS {} FORMAT JSONEachRow",
            settings.join(", ")
        ),
        body,
    )
    .await;
    let got = ch_post(
        &format!("SELECT reinterpretAsUInt32(f), reinterpretAsUInt64(d) FROM {table} ORDER BY id FORMAT TSV"),
        Vec::new(),
    )
    .await;
    let want: String = values
        .iter()
        .map(|(f, d)| format!("{}\t{}\n", f.to_bits(), d.to_bits()))
        .collect();
    assert_eq!(got, want);
    ch_post(&format!("DROP TABLE {table}"), Vec::new()).await;
}

const TYPED_PROTO: &str = r#"
syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";
import "google/protobuf/wrappers.proto";
import "google/protobuf/duration.proto";
enum Status { NEW = 0; PAID = 1; }
message Order {
  int64 id = 1;
  uint64 big = 2;
  double score = 3;
  string name = 4;
  bytes blob = 5;
  Status status = 6;
  google.protobuf.Timestamp at = 7;
  google.protobuf.Int64Value maybe = 8;
  google.protobuf.Duration took = 9;
  repeated string tags = 10;
  map<string, int64> attrs = 11;
  map<int32, string> byno = 12;
  optional int32 opt = 13;
  oneof pay { string card = 14; string cash = 15; }
  message Line { string sku = 1; int32 qty = 2; }
  Line line = 16;
  repeated Line lines = 17;
}
"#;

/// The same for Protobuf: `ProtoSchema::columns` makes the table, every
/// field type and an unset one of each kind (presence or not) come back as
/// they went in, or as the column's default.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protobuf_values_come_back_from_clickhouse_as_they_went_in() {
    use prost_reflect::prost::Message;
    use prost_reflect::{DynamicMessage, MapKey, ReflectMessage, Value as P};
    let schema = sluice_formats::protobuf::ProtoSchema::parse(TYPED_PROTO, &[]).unwrap();
    let table = format!("default.{}", unique("proto_typed"));
    let cols: Vec<String> = schema
        .columns(&[0])
        .unwrap()
        .iter()
        .map(|(n, t)| format!("`{n}` {t}"))
        .collect();
    ch_post(
        &format!(
            "CREATE TABLE {table} ({}) ENGINE = MergeTree ORDER BY id",
            cols.join(", ")
        ),
        Vec::new(),
    )
    .await;

    let order = schema.message(&[0]).unwrap();
    let sub =
        |m: &DynamicMessage, f: &str| match m.descriptor().get_field_by_name(f).unwrap().kind() {
            prost_reflect::Kind::Message(d) => DynamicMessage::new(d),
            k => panic!("{k:?}"),
        };
    let mut full = DynamicMessage::new(order.clone());
    full.set_field_by_name("id", P::I64(1));
    full.set_field_by_name("big", P::U64(u64::MAX));
    full.set_field_by_name("score", P::F64(-0.1));
    full.set_field_by_name("name", P::String("a\tb".into()));
    full.set_field_by_name("blob", P::Bytes(vec![0xff, 0].into()));
    full.set_field_by_name("status", P::EnumNumber(1));
    let mut at = sub(&full, "at");
    at.set_field_by_name("seconds", P::I64(1_700_000_000));
    at.set_field_by_name("nanos", P::I32(123_456_789));
    full.set_field_by_name("at", P::Message(at));
    let mut maybe = sub(&full, "maybe");
    maybe.set_field_by_name("value", P::I64(0));
    full.set_field_by_name("maybe", P::Message(maybe));
    let mut took = sub(&full, "took");
    took.set_field_by_name("seconds", P::I64(-3));
    took.set_field_by_name("nanos", P::I32(-250_000_000));
    full.set_field_by_name("took", P::Message(took));
    full.set_field_by_name("tags", P::List(vec![P::String("x".into())]));
    full.set_field_by_name(
        "attrs",
        P::Map([(MapKey::String("k".into()), P::I64(-1))].into()),
    );
    full.set_field_by_name(
        "byno",
        P::Map([(MapKey::I32(7), P::String("seven".into()))].into()),
    );
    full.set_field_by_name("opt", P::I32(0));
    full.set_field_by_name("cash", P::String("yes".into()));
    let mut line = sub(&full, "line");
    line.set_field_by_name("sku", P::String("S1".into()));
    line.set_field_by_name("qty", P::I32(2));
    full.set_field_by_name("line", P::Message(line.clone()));
    full.set_field_by_name("lines", P::List(vec![P::Message(line)]));
    let mut empty = DynamicMessage::new(order);
    empty.set_field_by_name("id", P::I64(2));

    let mut body = Vec::new();
    for m in [full, empty] {
        let mut payload = vec![0u8]; // message indexes: [0]
        payload.extend(m.encode_to_vec());
        schema.to_json(&payload, &mut body, usize::MAX).unwrap();
        body.push(b'\n');
    }
    ch_post(
        &format!("INSERT INTO {table} SETTINGS date_time_input_format = 'best_effort' FORMAT JSONEachRow"),
        body,
    )
    .await;
    let got = ch_post(
        &format!(
            "SELECT id, big, score, name, hex(blob), toString(status), toUnixTimestamp64Nano(at), maybe, toString(took), \
             tags, attrs, byno, opt, card, cash, line, lines FROM {table} ORDER BY id FORMAT TSV"
        ),
        Vec::new(),
    )
    .await;
    assert_eq!(
        got,
        "1\t18446744073709551615\t-0.1\ta\\tb\tFF00\tPAID\t1700000000123456789\t0\t-3.25\t['x']\t{'k':-1}\t{7:'seven'}\t0\t\\N\tyes\t('S1',2)\t[('S1',2)]\n\
         2\t0\t0\t\t\tNEW\t\\N\t\\N\t\\N\t[]\t{}\t{}\t\\N\t\\N\t\\N\t('',0)\t[]\n"
    );
    ch_post(&format!("DROP TABLE {table}"), Vec::new()).await;
}

/// `sluice schema --registry --subject`: the DDL's columns come from the
/// subject's latest schema, and ClickHouse accepts the DDL as printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_prints_a_table_for_a_registry_subject() {
    let url = registry_url();
    let subject = format!("{}-value", unique("ddl"));
    register(&url, None, &subject, serde_json::json!({ "schema": TYPED })).await;
    let table = format!("default.{}", unique("ddl"));
    let out = run(&mut sluice([
        "schema",
        "--table",
        &table,
        "--key",
        "id",
        "--registry",
        &url,
        "--subject",
        &subject,
    ]));
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    for col in [
        "`price` Decimal(20, 4)",
        "`at` DateTime64(3, 'UTC')",
        "`status` Enum8('NEW' = 0, 'PAID' = 1)",
        "`note` Nullable(String)",
        "`ship` Tuple(`city` String, `zip` Nullable(Int32))",
    ] {
        assert!(out.stdout.contains(col), "{col}: {}", out.stdout);
    }
    let ddl: String = out
        .stdout
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n");
    let create = ddl.split(';').next().unwrap();
    ch_post(create, Vec::new()).await;
    ch_post(&format!("DROP TABLE {table}"), Vec::new()).await;

    let out = run(&mut sluice([
        "schema",
        "--table",
        &table,
        "--key",
        "id",
        "--registry",
        &url,
        "--subject",
        "no-such-subject",
    ]));
    assert_ne!(out.code, 0);
    assert!(
        out.stderr.contains("has no subject \"no-such-subject\""),
        "{}",
        out.stderr
    );
}
