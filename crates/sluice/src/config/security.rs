//! Kafka TLS and SASL: the `[kafka.tls]` / `[kafka.sasl]` sections → checked
//! [`KafkaSecurity`] → librdkafka properties ([`KafkaConfig::client_config`]).
//!
//! The protocol follows from the sections (`tls` → `ssl`, `sasl` →
//! `sasl_plaintext`, both → `sasl_ssl`) unless `security_protocol` says so,
//! and a section the protocol would ignore is an error. Files are checked
//! for readability here, so a wrong path fails at start-up with its field
//! name. Named options win over nothing: setting the same librdkafka
//! property in `[kafka.properties]` too is an error.

use super::secret::{self, Secret};
use super::{ConfigError, KafkaConfig};
use rdkafka::ClientConfig;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

#[serde_with::skip_serializing_none]
#[derive(Debug, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTls {
    /// CA certificate(s) to verify the brokers with (PEM). Default: the
    /// system's trust store.
    pub(crate) ca_file: Option<PathBuf>,
    /// Client certificate for mutual TLS (PEM).
    pub(crate) cert_file: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    pub(crate) key_file: Option<PathBuf>,
    /// The private key's password, if it has one.
    pub(crate) key_password: Option<String>,
    /// A file holding the private key's password.
    pub(crate) key_password_file: Option<PathBuf>,
    /// Check that the broker's certificate names the host. Default true.
    pub(crate) verify_hostname: Option<bool>,
}

#[serde_with::skip_serializing_none]
#[derive(Debug, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSasl {
    /// `PLAIN`, `SCRAM-SHA-256` or `SCRAM-SHA-512`.
    pub(crate) mechanism: Option<String>,
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
    /// A file holding the password (one trailing newline is removed).
    pub(crate) password_file: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Tls {
    pub(crate) ca_file: Option<PathBuf>,
    pub(crate) cert_file: Option<PathBuf>,
    pub(crate) key_file: Option<PathBuf>,
    pub(crate) key_password: Option<Secret>,
    pub(crate) verify_hostname: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sasl {
    pub(crate) mechanism: String,
    pub(crate) username: String,
    pub(crate) password: Secret,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KafkaSecurity {
    /// `plaintext`, `ssl`, `sasl_plaintext` or `sasl_ssl`.
    pub(crate) protocol: String,
    pub(crate) tls: Option<Tls>,
    pub(crate) sasl: Option<Sasl>,
}

const PROTOCOLS: [&str; 4] = ["plaintext", "ssl", "sasl_plaintext", "sasl_ssl"];
const MECHANISMS: [&str; 3] = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"];

/// The librdkafka properties the named options set; `[kafka.properties]`
/// may not set them too.
const OWNED: [&str; 10] = [
    "security.protocol",
    "ssl.ca.location",
    "ssl.certificate.location",
    "ssl.key.location",
    "ssl.key.password",
    "ssl.endpoint.identification.algorithm",
    "sasl.mechanisms",
    "sasl.mechanism",
    "sasl.username",
    "sasl.password",
];

pub(crate) fn validate(
    protocol: Option<String>,
    tls: Option<RawTls>,
    sasl: Option<RawSasl>,
    properties: &std::collections::BTreeMap<String, String>,
) -> Result<KafkaSecurity, ConfigError> {
    let protocol = match protocol {
        Some(p) => {
            let p = p.to_ascii_lowercase();
            if !PROTOCOLS.contains(&p.as_str()) {
                return Err(invalid(
                    "kafka.security_protocol",
                    "plaintext, ssl, sasl_plaintext or sasl_ssl",
                    &p,
                ));
            }
            p
        }
        None => match (&tls, &sasl) {
            (None, None) => "plaintext",
            (Some(_), None) => "ssl",
            (None, Some(_)) => "sasl_plaintext",
            (Some(_), Some(_)) => "sasl_ssl",
        }
        .to_string(),
    };
    let uses_tls = protocol.ends_with("ssl");
    let uses_sasl = protocol.starts_with("sasl");
    if tls.is_some() && !uses_tls {
        return Err(invalid(
            "kafka.tls",
            "no [kafka.tls] section, since kafka.security_protocol has no TLS",
            &protocol,
        ));
    }
    if sasl.is_some() != uses_sasl {
        return Err(invalid(
            "kafka.sasl",
            "a [kafka.sasl] section exactly when kafka.security_protocol is sasl_*",
            &protocol,
        ));
    }
    if let Some(key) = properties.keys().find(|k| OWNED.contains(&k.as_str())) {
        return Err(invalid(
            &format!("kafka.properties.{key:?}"),
            "to be set through the named options (security_protocol, [kafka.tls], [kafka.sasl])",
            "set in [kafka.properties]",
        ));
    }
    let tls = match tls.filter(|_| uses_tls) {
        None if uses_tls => Some(Tls {
            ca_file: None,
            cert_file: None,
            key_file: None,
            key_password: None,
            verify_hostname: true,
        }),
        None => None,
        Some(t) => {
            for (field, path) in [
                ("kafka.tls.ca_file", &t.ca_file),
                ("kafka.tls.cert_file", &t.cert_file),
                ("kafka.tls.key_file", &t.key_file),
            ] {
                if let Some(p) = path {
                    readable(field, p)?;
                }
            }
            if t.cert_file.is_some() != t.key_file.is_some() {
                return Err(invalid(
                    "kafka.tls.key_file",
                    "cert_file and key_file together (mutual TLS) or neither",
                    if t.key_file.is_some() {
                        "key_file without cert_file"
                    } else {
                        "cert_file without key_file"
                    },
                ));
            }
            Some(Tls {
                key_password: secret::resolve(
                    "kafka.tls.key_password",
                    t.key_password,
                    t.key_password_file.as_deref(),
                )?,
                ca_file: t.ca_file,
                cert_file: t.cert_file,
                key_file: t.key_file,
                verify_hostname: t.verify_hostname.unwrap_or(true),
            })
        }
    };
    let sasl = match sasl {
        None => None,
        Some(s) => {
            let mechanism = s.mechanism.ok_or(ConfigError::Missing {
                field: "kafka.sasl.mechanism",
                expected: "PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512",
            })?;
            let mechanism = mechanism.to_ascii_uppercase();
            if !MECHANISMS.contains(&mechanism.as_str()) {
                return Err(invalid(
                    "kafka.sasl.mechanism",
                    "PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512",
                    &mechanism,
                ));
            }
            let username = s
                .username
                .filter(|u| !u.is_empty())
                .ok_or(ConfigError::Missing {
                    field: "kafka.sasl.username",
                    expected: "the SASL user name",
                })?;
            let password = secret::resolve(
                "kafka.sasl.password",
                s.password,
                s.password_file.as_deref(),
            )?
            .ok_or(ConfigError::Missing {
                field: "kafka.sasl.password",
                expected: "password, password_file or SLUICE_KAFKA_SASL_PASSWORD",
            })?;
            Some(Sasl {
                mechanism,
                username,
                password,
            })
        }
    };
    Ok(KafkaSecurity {
        protocol,
        tls,
        sasl,
    })
}

/// Checks that the file a setting names can be read.
pub(super) fn readable(field: &str, path: &Path) -> Result<(), ConfigError> {
    std::fs::File::open(path)
        .map(|_| ())
        .map_err(|e| ConfigError::File {
            field: field.to_string(),
            path: path.display().to_string(),
            reason: e.to_string(),
        })
}

fn invalid(field: &str, expected: &'static str, found: &str) -> ConfigError {
    ConfigError::Invalid {
        field: field.to_string(),
        expected,
        found: found.to_string(),
    }
}

impl KafkaConfig {
    /// A librdkafka configuration with the brokers, the security settings
    /// and the pass-through properties; the caller adds its own.
    pub fn client_config(&self) -> ClientConfig {
        let mut cc = ClientConfig::new();
        cc.set("bootstrap.servers", &self.brokers);
        let s = &self.security;
        cc.set("security.protocol", &s.protocol);
        if let Some(t) = &s.tls {
            let path = |p: &PathBuf| p.display().to_string();
            if let Some(p) = &t.ca_file {
                cc.set("ssl.ca.location", path(p));
            }
            if let Some(p) = &t.cert_file {
                cc.set("ssl.certificate.location", path(p));
            }
            if let Some(p) = &t.key_file {
                cc.set("ssl.key.location", path(p));
            }
            if let Some(pw) = &t.key_password {
                cc.set("ssl.key.password", pw.expose());
            }
            cc.set(
                "ssl.endpoint.identification.algorithm",
                if t.verify_hostname { "https" } else { "none" },
            );
        }
        if let Some(a) = &s.sasl {
            cc.set("sasl.mechanisms", &a.mechanism)
                .set("sasl.username", &a.username)
                .set("sasl.password", a.password.expose());
        }
        for (key, v) in &self.properties {
            cc.set(key, v);
        }
        cc
    }
}
