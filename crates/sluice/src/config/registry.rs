//! The `[schema_registry]` section: where Avro and Protobuf routes find the
//! schemas their records were written with.
//!
//! In: the section as written ([`RawSchemaRegistry`]; `SCHEMA_REGISTRY_URL`
//! fills in `url` when nothing else sets it). Out: a [`SchemaRegistryConfig`]
//! with the password resolved (inline, `password_file` or its `SLUICE_…`
//! variable) and the TLS files checked for readability, or a
//! [`ConfigError`] naming the field.

use super::secret::{self, Secret};
use super::security::readable;
use super::{bounded, invalid, ConfigError};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

/// How long one request to the registry may take when the file does not
/// say.
pub(crate) const DEFAULT_REGISTRY_TIMEOUT: Duration = Duration::from_secs(10);

#[serde_with::skip_serializing_none]
#[derive(Debug, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RawSchemaRegistry {
    /// HTTP(S) endpoint of a Confluent-compatible schema registry.
    pub url: Option<String>,
    /// Basic auth user name (with `password`).
    pub(crate) username: Option<String>,
    /// Basic auth password. Prefer `password_file` or
    /// `SLUICE_SCHEMA_REGISTRY_PASSWORD`.
    pub(crate) password: Option<String>,
    /// A file holding the password (one trailing newline is removed).
    pub(crate) password_file: Option<PathBuf>,
    /// CA certificate(s) to verify the registry with (PEM). Default: the
    /// system's trust store.
    pub(crate) ca_file: Option<PathBuf>,
    /// Client certificate for mutual TLS (PEM), with `key_file`.
    pub(crate) cert_file: Option<PathBuf>,
    /// The client certificate's private key (PKCS #8 PEM).
    pub(crate) key_file: Option<PathBuf>,
    /// The longest one request may take. Default 10s.
    #[serde(default, with = "humantime_serde")]
    pub(crate) timeout: Option<Duration>,
}

#[derive(Clone, PartialEq, Eq)]
pub struct SchemaRegistryConfig {
    pub(crate) url: String,
    /// Basic auth: the user name and password.
    pub(crate) auth: Option<(String, Secret)>,
    pub(crate) ca_file: Option<PathBuf>,
    /// The client certificate and its key, for mutual TLS.
    pub(crate) identity: Option<(PathBuf, PathBuf)>,
    pub(crate) timeout: Duration,
}

impl SchemaRegistryConfig {
    /// A registry at `url`, without credentials, with the default timeout.
    pub fn from_url(url: &str) -> Self {
        Self {
            url: url.trim_end_matches('/').to_string(),
            auth: None,
            ca_file: None,
            identity: None,
            timeout: DEFAULT_REGISTRY_TIMEOUT,
        }
    }
}

/// The password never reaches a log line through `{:?}`.
impl std::fmt::Debug for SchemaRegistryConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SchemaRegistryConfig")
            .field("url", &secret::redact_url(&self.url))
            .field("auth", &self.auth)
            .field("ca_file", &self.ca_file)
            .field("identity", &self.identity)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl RawSchemaRegistry {
    /// The section checked; `None` when it names no registry.
    pub(super) fn validate(self) -> Result<Option<SchemaRegistryConfig>, ConfigError> {
        let Some(url) = self.url else {
            let set = self.username.is_some()
                || self.password.is_some()
                || self.password_file.is_some()
                || self.ca_file.is_some()
                || self.cert_file.is_some()
                || self.key_file.is_some()
                || self.timeout.is_some();
            if set {
                return Err(ConfigError::Missing {
                    field: "schema_registry.url",
                    expected: "http(s)://host:port (or SCHEMA_REGISTRY_URL), since the section sets other fields",
                });
            }
            return Ok(None);
        };
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(invalid(
                "schema_registry.url",
                "an http:// or https:// URL",
                &secret::redact_url(&url),
            ));
        }
        let password = secret::resolve(
            "schema_registry.password",
            self.password,
            self.password_file.as_deref(),
        )?;
        let auth = match (self.username, password) {
            (Some(u), Some(p)) => Some((u, p)),
            (None, None) => None,
            (Some(_), None) => {
                return Err(invalid(
                    "schema_registry.password",
                    "a password (or password_file), since username is set",
                    "nothing",
                ))
            }
            (None, Some(_)) => {
                return Err(invalid(
                    "schema_registry.username",
                    "a user name, since a password is set",
                    "nothing",
                ))
            }
        };
        if let Some(ca) = &self.ca_file {
            readable("schema_registry.ca_file", ca)?;
        }
        let identity = match (self.cert_file, self.key_file) {
            (Some(c), Some(k)) => {
                readable("schema_registry.cert_file", &c)?;
                readable("schema_registry.key_file", &k)?;
                Some((c, k))
            }
            (None, None) => None,
            (Some(_), None) => {
                return Err(invalid(
                    "schema_registry.key_file",
                    "the client certificate's key, since cert_file is set",
                    "nothing",
                ))
            }
            (None, Some(_)) => {
                return Err(invalid(
                    "schema_registry.cert_file",
                    "the client certificate, since key_file is set",
                    "nothing",
                ))
            }
        };
        let timeout =
            bounded("schema_registry.timeout", self.timeout)?.unwrap_or(DEFAULT_REGISTRY_TIMEOUT);
        if timeout < Duration::from_millis(100) {
            return Err(invalid(
                "schema_registry.timeout",
                "at least 100ms",
                &format!("{timeout:?}"),
            ));
        }
        Ok(Some(SchemaRegistryConfig {
            url: url.trim_end_matches('/').to_string(),
            auth,
            ca_file: self.ca_file,
            identity,
            timeout,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(toml: &str) -> RawSchemaRegistry {
        toml::from_str(toml).unwrap()
    }

    #[test]
    fn a_registry_with_basic_auth_keeps_its_password_secret() {
        let c = raw("url = \"http://r:8081/\"\nusername = \"u\"\npassword = \"pw\"")
            .validate()
            .unwrap()
            .unwrap();
        assert_eq!(c.url, "http://r:8081");
        assert_eq!(c.auth.as_ref().unwrap().1.expose(), "pw");
        assert!(!format!("{c:?}").contains("pw\""), "{c:?}");
        assert_eq!(c.timeout, DEFAULT_REGISTRY_TIMEOUT);
    }

    #[test]
    fn each_mistake_names_its_field() {
        let err = |t: &str| raw(t).validate().unwrap_err().to_string();
        assert!(err("username = \"u\"").starts_with("schema_registry.url: missing"));
        assert!(err("url = \"r:8081\"").starts_with("schema_registry.url: expected"));
        assert!(
            err("url = \"http://r\"\nusername = \"u\"").starts_with("schema_registry.password:")
        );
        assert!(
            err("url = \"http://r\"\npassword = \"p\"").starts_with("schema_registry.username:")
        );
        assert!(err("url = \"http://r\"\ncert_file = \"/etc/hostname\"")
            .starts_with("schema_registry.key_file:"));
        assert!(err("url = \"http://r\"\nca_file = \"/nope/ca.pem\"")
            .starts_with("schema_registry.ca_file: cannot read /nope/ca.pem"));
        assert!(
            err("url = \"http://r\"\ntimeout = \"1ms\"").starts_with("schema_registry.timeout:")
        );
        assert!(raw("").validate().unwrap().is_none());
    }
}
