//! Secrets: where they come from, and how they stay out of every output.
//!
//! A secret is given inline (`password = "…"`), through its `SLUICE_…`
//! variable (the environment layer puts it in the same place), or as a file
//! (`password_file = "/run/secrets/…"`, one trailing newline removed). The
//! value lives in a [`Secret`], whose `Debug` and `Display` print
//! `<redacted>`, so neither logs, errors nor `check-config` can show it.

use super::ConfigError;
use std::fmt;
use std::path::Path;

/// A URL fit for a log line: whatever comes before the last `@` (a user
/// and password, even one holding `/` or `?`) and the query string
/// (`?password=…`) are replaced by `…`. Erring on the side of hiding: an
/// `@` in a path or query hides what precedes it too.
pub fn redact_url(url: &str) -> String {
    let scheme_len = url
        .split_once("://")
        .filter(|(s, _)| {
            let mut c = s.chars();
            c.next().is_some_and(|f| f.is_ascii_alphabetic())
                && c.all(|c| c.is_ascii_alphanumeric() || "+.-".contains(c))
        })
        .map_or(0, |(s, _)| s.len() + 3);
    let (scheme, rest) = url.split_at(scheme_len);
    let (credentials, rest) = match rest.rfind('@') {
        Some(i) => ("…@", &rest[i + 1..]),
        None => ("", rest),
    };
    match rest.find(['?', '#']) {
        Some(i) => format!("{scheme}{credentials}{}?…", &rest[..i]),
        None => format!("{scheme}{credentials}{rest}"),
    }
}

#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub(crate) fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The value, for the one place that hands it to a client library.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_empty() {
            "<empty>"
        } else {
            "<redacted>"
        })
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// The secret `field` from its inline value or its `<field>_file`; both at
/// once is an error, since one of them would be silently ignored.
pub(crate) fn resolve(
    field: &str,
    inline: Option<String>,
    file: Option<&Path>,
) -> Result<Option<Secret>, ConfigError> {
    match (inline, file) {
        (Some(_), Some(_)) => Err(ConfigError::Invalid {
            field: field.to_string(),
            expected: "either the value or the `_file`, not both",
            found: "both".into(),
        }),
        (Some(v), None) => Ok(Some(Secret(v))),
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path).map_err(|e| ConfigError::File {
                field: format!("{field}_file"),
                path: path.display().to_string(),
                reason: e.to_string(),
            })?;
            let value = text.strip_suffix('\n').unwrap_or(&text);
            let value = value.strip_suffix('\r').unwrap_or(value);
            Ok(Some(Secret(value.to_string())))
        }
        (None, None) => Ok(None),
    }
}

/// Whether a librdkafka property carries a secret (its value is hidden).
pub(crate) fn is_secret_property(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    n.contains("password") || n.contains("secret") || n.ends_with(".pem") || n.contains("jaas")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_in_logs_hide_their_secrets() {
        assert_eq!(redact_url("http://ch:8123"), "http://ch:8123");
        assert_eq!(
            redact_url("https://u:pw@ch:8443/x?password=pw"),
            "https://…@ch:8443/x?…"
        );
        assert_eq!(redact_url("k1:9092,k2:9092"), "k1:9092,k2:9092");
        assert_eq!(redact_url("http://ch?user=a&password=b#f"), "http://ch?…");
        assert_eq!(redact_url("http://u:p/w@ch:8123"), "http://…@ch:8123");
        assert_eq!(redact_url("http://u:p?w@ch:8123"), "http://…@ch:8123");
        assert_eq!(
            redact_url("ch:8123/?password=s&next=http://x"),
            "ch:8123/?…"
        );
        assert_eq!(
            redact_url("http://u:pw@[::1]:8123/db"),
            "http://…@[::1]:8123/db"
        );
    }

    #[test]
    fn never_printed() {
        let s = Secret::new("hunter2");
        assert_eq!(format!("{s:?} {s}"), "<redacted> <redacted>");
        assert_eq!(s.expose(), "hunter2");
        assert_eq!(format!("{:?}", Secret::default()), "<empty>");
    }

    #[test]
    fn from_a_file_or_inline_not_both() {
        let dir = std::env::temp_dir().join(format!("sluice-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("pw");
        std::fs::write(&f, "s3cret\n").unwrap();
        let got = resolve("x.password", None, Some(&f)).unwrap().unwrap();
        assert_eq!(got.expose(), "s3cret");
        assert_eq!(resolve("x.password", None, None).unwrap(), None);
        let both = resolve("x.password", Some("a".into()), Some(&f)).unwrap_err();
        assert!(both.to_string().contains("x.password"), "{both}");
        let missing = resolve("x.password", None, Some(&dir.join("nope"))).unwrap_err();
        let m = missing.to_string();
        assert!(m.contains("x.password_file") && m.contains("nope"), "{m}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
