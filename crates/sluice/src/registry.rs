//! The schema registry client: schema ids → the decoders of their records.
//!
//! In: a [`SchemaRegistryConfig`] and schema ids (from a record's wire
//! format, [`sluice_formats::wire`]) or subjects. Out: the schema's text with
//! every schema it references fetched too ([`Registry::resolve`]), and a
//! [`Decoder`] built from it (the sink caches it per id: a registered id
//! never changes). Requests carry basic auth and TLS as configured and give
//! up after `timeout`; an error says whether it is about the records
//! ([`RegistryError::refuses_records`]) or about reaching the registry.

use crate::config::SchemaRegistryConfig;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;
use sluice_formats::avro::{AvroError, AvroSchema};
use sluice_formats::protobuf::{ProtoError, ProtoSchema};
use std::sync::Arc;

/// The largest answer read from the registry.
const MAX_ANSWER: usize = 16 << 20;

/// References deeper than this are refused (a cycle, or a hostile registry).
const MAX_REFERENCE_DEPTH: usize = 32;

#[derive(Debug, thiserror::Error)]
pub(crate) enum RegistryError {
    /// The registry cannot be reached, timed out or failed (5xx): the
    /// partition waits and the request is tried again.
    #[error("the schema registry at {url} does not answer: {reason}")]
    Unavailable { url: String, reason: String },
    /// The registry has no schema with this id (404, error 40403).
    #[error("the schema registry has no schema with id {0}")]
    UnknownSchema(u32),
    /// No such subject or version (404, 40401 or 40402).
    #[error("the schema registry has no {0}")]
    NotFound(String),
    #[error("the schema registry refused the credentials ({0})")]
    Unauthorized(u16),
    /// An answer that is not what the registry's API promises.
    #[error("the schema registry answered {what} with {answer}")]
    BadAnswer { what: String, answer: String },
    #[error("schema id {id}: {source}")]
    Avro { id: u32, source: AvroError },
    #[error("schema id {id}: {source}")]
    Protobuf { id: u32, source: ProtoError },
    #[error("schema id {id} is a {kind} schema; this route reads {expected}")]
    WrongType {
        id: u32,
        kind: String,
        expected: &'static str,
    },
    #[error("{0}")]
    Config(String),
    /// The schema could not be compiled at all.
    #[error("schema id {id}: {what}")]
    BadSchema { id: u32, what: String },
}

impl RegistryError {
    /// A short stable name for the kind of error (metrics).
    /// Every value [`Self::kind`] returns.
    pub(crate) const KINDS: [&'static str; 8] = [
        "unavailable",
        "unknown-schema",
        "not-found",
        "unauthorized",
        "bad-answer",
        "invalid",
        "wrong-type",
        "config",
    ];

    pub(crate) fn kind(&self) -> &'static str {
        match self {
            RegistryError::Unavailable { .. } => "unavailable",
            RegistryError::UnknownSchema(_) => "unknown-schema",
            RegistryError::NotFound(_) => "not-found",
            RegistryError::Unauthorized(_) => "unauthorized",
            RegistryError::BadAnswer { .. } => "bad-answer",
            RegistryError::Avro { .. }
            | RegistryError::Protobuf { .. }
            | RegistryError::BadSchema { .. } => "invalid",
            RegistryError::WrongType { .. } => "wrong-type",
            RegistryError::Config(_) => "config",
        }
    }

    /// Whether the answer is about the schema id itself, so that no record
    /// written with it can ever be read: the registry does not know it, it
    /// is of another format, or it does not parse. Anything else (the
    /// registry down, the credentials refused, a referenced subject
    /// missing, a strange answer) is about reaching the registry, and the
    /// records wait.
    pub(crate) fn refuses_records(&self) -> bool {
        matches!(
            self,
            RegistryError::UnknownSchema(_)
                | RegistryError::WrongType { .. }
                | RegistryError::Avro { .. }
                | RegistryError::Protobuf { .. }
                | RegistryError::BadSchema { .. }
        )
    }
}

/// A schema as the registry keeps it.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Registered {
    pub(crate) schema: String,
    /// `AVRO` when the registry leaves it out.
    #[serde(default)]
    pub(crate) schema_type: Option<String>,
    #[serde(default)]
    pub(crate) references: Vec<Reference>,
    /// Set when looked up by subject and version.
    #[serde(default)]
    pub(crate) id: Option<u32>,
    #[serde(default)]
    pub(crate) version: Option<i64>,
}

impl Registered {
    pub(crate) fn kind(&self) -> &str {
        self.schema_type.as_deref().unwrap_or("AVRO")
    }
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Reference {
    pub(crate) name: String,
    pub(crate) subject: String,
    pub(crate) version: i64,
}

/// A schema with the text of everything it references, by reference name.
#[derive(Debug, Clone)]
pub(crate) struct Resolved {
    pub(crate) schema: Registered,
    pub(crate) references: Vec<(String, String)>,
}

/// What turns a record's payload into a JSON row.
#[derive(Debug, Clone)]
pub(crate) enum Decoder {
    Avro(Arc<AvroSchema>),
    Protobuf(Arc<ProtoSchema>),
}

type Https = hyper_tls::HttpsConnector<HttpConnector>;

/// A client of one registry.
#[derive(Clone)]
pub(crate) struct Registry {
    cfg: SchemaRegistryConfig,
    http: Client<Https, Full<Bytes>>,
}

impl Registry {
    pub(crate) fn new(cfg: &SchemaRegistryConfig) -> Result<Self, RegistryError> {
        let mut tls = native_tls::TlsConnector::builder();
        if let Some(ca) = &cfg.ca_file {
            let certs = native_tls::Certificate::stack_from_pem(&read(ca)?)
                .map_err(|e| RegistryError::Config(format!("schema_registry.ca_file: {e}")))?;
            for c in certs {
                tls.add_root_certificate(c);
            }
        }
        if let Some((cert, key)) = &cfg.identity {
            let id = native_tls::Identity::from_pkcs8(&read(cert)?, &read(key)?)
                .map_err(|e| RegistryError::Config(format!("schema_registry.cert_file: {e}")))?;
            tls.identity(id);
        }
        let tls = tls
            .build()
            .map_err(|e| RegistryError::Config(format!("schema_registry TLS: {e}")))?;
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(cfg.timeout));
        http.enforce_http(false);
        let https =
            hyper_tls::HttpsConnector::from((http, tokio_native_tls::TlsConnector::from(tls)));
        Ok(Registry {
            cfg: cfg.clone(),
            http: Client::builder(TokioExecutor::new()).build(https),
        })
    }

    /// GETs `path` and parses the JSON answer.
    async fn get<T: serde::de::DeserializeOwned>(&self, path: &str) -> Result<T, RegistryError> {
        self.request(path, None).await
    }

    /// GETs `path`, or POSTs `body` to it, and parses the JSON answer.
    async fn request<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<T, RegistryError> {
        let url = format!("{}{path}", self.cfg.url);
        let unavailable = |reason: String| RegistryError::Unavailable {
            url: crate::config::secret::redact_url(&self.cfg.url),
            reason,
        };
        const MEDIA: &str = "application/vnd.schemaregistry.v1+json";
        let mut req = match body {
            None => hyper::Request::get(&url),
            Some(_) => hyper::Request::post(&url).header("Content-Type", MEDIA),
        }
        .header("Accept", MEDIA);
        if let Some((user, password)) = &self.cfg.auth {
            use base64::Engine;
            let token = base64::engine::general_purpose::STANDARD
                .encode(format!("{user}:{}", password.expose()));
            req = req.header("Authorization", format!("Basic {token}"));
        }
        let req = req
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| RegistryError::Config(format!("schema_registry.url: {e}")))?;
        let answer = async {
            let resp = self
                .http
                .request(req)
                .await
                .map_err(|e| unavailable(format!("{e:#}")))?;
            let status = resp.status();
            let body = http_body_util::Limited::new(resp.into_body(), MAX_ANSWER)
                .collect()
                .await
                .map_err(|e| unavailable(e.to_string()))?
                .to_bytes();
            Ok::<_, RegistryError>((status, body))
        };
        let (status, body) = tokio::time::timeout(self.cfg.timeout, answer)
            .await
            .map_err(|_| unavailable(format!("no answer within {:?}", self.cfg.timeout)))??;
        let text = || String::from_utf8_lossy(&body[..body.len().min(300)]).to_string();
        match status.as_u16() {
            200 => serde_json::from_slice(&body).map_err(|e| RegistryError::BadAnswer {
                what: path.to_string(),
                answer: format!("{e}: {}", text()),
            }),
            401 | 403 => Err(RegistryError::Unauthorized(status.as_u16())),
            // The registry's own 404s carry an error code (40401 subject,
            // 40402 version, 40403 schema); a bare 404 is a wrong url or a
            // proxy in front of a registry that is not there yet.
            404 if registry_code(&body).is_some_and(|c| (40400..40500).contains(&c)) => {
                Err(RegistryError::NotFound(format!("{path} ({})", text())))
            }
            404 => Err(unavailable(format!(
                "HTTP 404 without a registry error code for {path} (is the url's path right?): {}",
                text()
            ))),
            s if s >= 500 || s == 408 || s == 429 => {
                Err(unavailable(format!("HTTP {s}: {}", text())))
            }
            s => Err(RegistryError::BadAnswer {
                what: path.to_string(),
                answer: format!("HTTP {s}: {}", text()),
            }),
        }
    }

    /// The schema registered under `id`.
    pub(crate) async fn schema(&self, id: u32) -> Result<Registered, RegistryError> {
        self.get(&format!("/schemas/ids/{id}"))
            .await
            .map_err(|e| match e {
                RegistryError::NotFound(_) => RegistryError::UnknownSchema(id),
                e => e,
            })
    }

    /// Version `version` (or `latest`) of `subject`.
    pub(crate) async fn version(
        &self,
        subject: &str,
        version: &str,
    ) -> Result<Registered, RegistryError> {
        let path = format!("/subjects/{}/versions/{version}", url_segment(subject));
        self.get(&path).await.map_err(|e| match e {
            RegistryError::NotFound(_) => {
                RegistryError::NotFound(format!("subject {subject:?} version {version}"))
            }
            e => e,
        })
    }

    /// Registers `text` (a schema of `kind`, `AVRO` or `PROTOBUF`, without
    /// references) under `subject`, or finds it there; returns its id.
    pub(crate) async fn register(
        &self,
        subject: &str,
        text: &str,
        kind: &str,
    ) -> Result<u32, RegistryError> {
        #[derive(Deserialize)]
        struct Id {
            id: u32,
        }
        let body = serde_json::json!({ "schema": text, "schemaType": kind });
        let path = format!("/subjects/{}/versions", url_segment(subject));
        let id: Id = self
            .request(&path, Some(body.to_string().into_bytes()))
            .await?;
        Ok(id.id)
    }

    /// `schema` with the text of every schema it references, depth first
    /// (what is referenced comes before what references it).
    pub(crate) async fn resolve(&self, schema: Registered) -> Result<Resolved, RegistryError> {
        let mut references = Vec::new();
        let mut stack: Vec<(Reference, usize)> = schema
            .references
            .iter()
            .rev()
            .map(|r| (r.clone(), 1))
            .collect();
        while let Some((r, depth)) = stack.pop() {
            if depth > MAX_REFERENCE_DEPTH {
                return Err(RegistryError::BadAnswer {
                    what: format!("reference {}", r.name),
                    answer: format!("references nested deeper than {MAX_REFERENCE_DEPTH}"),
                });
            }
            if references.iter().any(|(n, _)| *n == r.name) {
                continue;
            }
            let s = self.version(&r.subject, &r.version.to_string()).await?;
            stack.extend(s.references.iter().rev().map(|x| (x.clone(), depth + 1)));
            references.push((r.name.clone(), s.schema));
        }
        references.reverse();
        Ok(Resolved { schema, references })
    }

    /// The decoder of records written with schema `id`, fetched with what
    /// it references. `expected` is the route's format (`avro` or
    /// `protobuf`).
    pub(crate) async fn decoder(
        &self,
        id: u32,
        expected: &'static str,
    ) -> Result<Decoder, RegistryError> {
        let resolved = self.resolve(self.schema(id).await?).await?;
        build(id, &resolved, expected)
    }
}

/// The stack of the thread that compiles a schema: parsers recurse once per
/// level of nesting, and a registry's text may nest deep.
const BUILD_STACK: usize = 256 << 20;

/// Builds the decoder of `resolved` (schema `id`) for a route reading
/// `expected`, on a thread of its own with a deep stack: a schema that
/// nests too deep for the parsers, or that makes one panic, is refused
/// instead of taking the process down.
pub(crate) fn build(
    id: u32,
    resolved: &Resolved,
    expected: &'static str,
) -> Result<Decoder, RegistryError> {
    let resolved = resolved.clone();
    let failed = |what: String| RegistryError::BadSchema { id, what };
    std::thread::Builder::new()
        .name(format!("schema-{id}"))
        .stack_size(BUILD_STACK)
        .spawn(move || build_here(id, &resolved, expected))
        .map_err(|e| failed(format!("cannot start a thread to compile it: {e}")))?
        .join()
        .map_err(|_| failed("compiling it panicked".into()))?
}

/// How deep brackets may nest in a schema's text: deeper than any schema
/// written by hand or by a serializer, shallow enough for the parsers.
const MAX_NESTING: usize = 512;

/// The deepest nesting of `{`, `[`, `(` and `<` in `text`, outside quotes.
fn nesting(text: &str) -> usize {
    let (mut depth, mut deepest, mut quoted, mut escaped) = (0usize, 0usize, None, false);
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        // Comments (Protobuf's `//` and `/* */`) hold no brackets.
        if quoted.is_none() && c == '/' {
            match chars.peek() {
                Some('/') => {
                    chars.by_ref().find(|c| *c == '\n');
                    continue;
                }
                Some('*') => {
                    chars.next();
                    let mut last = ' ';
                    chars
                        .by_ref()
                        .find(|c| std::mem::replace(&mut last, *c) == '*' && *c == '/');
                    continue;
                }
                _ => {}
            }
        }
        match (quoted, c) {
            (Some(_), _) if escaped => escaped = false,
            (Some(_), '\\') => escaped = true,
            (Some(q), c) if c == q => quoted = None,
            (Some(_), _) => {}
            (None, '"' | '\'') => quoted = Some(c),
            (None, '{' | '[' | '(' | '<') => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            (None, '}' | ']' | ')' | '>') => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

fn build_here(
    id: u32,
    resolved: &Resolved,
    expected: &'static str,
) -> Result<Decoder, RegistryError> {
    let texts =
        std::iter::once(&resolved.schema.schema).chain(resolved.references.iter().map(|r| &r.1));
    if let Some(n) = texts.map(|t| nesting(t)).find(|n| *n > MAX_NESTING) {
        return Err(RegistryError::BadSchema {
            id,
            what: format!("its text nests {n} deep, more than {MAX_NESTING}"),
        });
    }
    let kind = resolved.schema.kind().to_ascii_uppercase();
    match (kind.as_str(), expected) {
        ("AVRO", "avro") => {
            let refs: Vec<&str> = resolved
                .references
                .iter()
                .map(|(_, t)| t.as_str())
                .collect();
            let s = AvroSchema::parse(&resolved.schema.schema, &refs)
                .map_err(|source| RegistryError::Avro { id, source })?;
            Ok(Decoder::Avro(Arc::new(s)))
        }
        ("PROTOBUF", "protobuf") => {
            let refs: Vec<(&str, &str)> = resolved
                .references
                .iter()
                .map(|(n, t)| (n.as_str(), t.as_str()))
                .collect();
            let s = ProtoSchema::parse(&resolved.schema.schema, &refs)
                .map_err(|source| RegistryError::Protobuf { id, source })?;
            Ok(Decoder::Protobuf(Arc::new(s)))
        }
        _ => Err(RegistryError::WrongType { id, kind, expected }),
    }
}

/// The `error_code` of a registry's error answer.
fn registry_code(body: &[u8]) -> Option<u64> {
    serde_json::from_slice::<serde_json::Value>(body).ok()?["error_code"].as_u64()
}

/// A subject as one path segment: `/` and everything else outside the
/// unreserved set percent-encoded (subjects such as `common/money.proto`).
fn url_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn read(path: &std::path::Path) -> Result<Vec<u8>, RegistryError> {
    std::fs::read(path)
        .map_err(|e| RegistryError::Config(format!("cannot read {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_404_with_a_registry_code_means_not_found() {
        assert_eq!(
            registry_code(br#"{"error_code":40403,"message":"x"}"#),
            Some(40403)
        );
        assert_eq!(registry_code(b"<html>404 Not Found</html>"), None);
        assert_eq!(registry_code(br#"{"message":"no route"}"#), None);
    }

    #[test]
    fn nesting_counts_brackets_outside_quotes() {
        assert_eq!(nesting(r#"{"a": [1, {"b": "}}}{{{"}]}"#), 3);
        assert_eq!(nesting("message A { map<string, int32> m = 1; }"), 2);
        assert_eq!(nesting(r#"{"s": "\"{"}"#), 1);
        assert_eq!(nesting(&"{".repeat(600)), 600);
        let commented = "// don't < ( {\n/* it's { { */ message A { int32 a = 1; } // {";
        assert_eq!(nesting(commented), 1);
    }

    #[test]
    fn subjects_are_one_path_segment() {
        assert_eq!(url_segment("orders-value"), "orders-value");
        assert_eq!(url_segment("common/money.proto"), "common%2Fmoney.proto");
        assert_eq!(url_segment("a b?"), "a%20b%3F");
    }

    #[test]
    fn only_answers_about_the_id_refuse_records() {
        let u = RegistryError::Unavailable {
            url: "http://r".into(),
            reason: "refused".into(),
        };
        // Only answers about the id itself refuse its records.
        assert!(RegistryError::UnknownSchema(7).refuses_records());
        assert!(!u.refuses_records());
        assert!(!RegistryError::Unauthorized(401).refuses_records());
        assert!(!RegistryError::NotFound("subject x version 1".into()).refuses_records());
    }
}
