//! ClickHouse failures → [`ChError`], carrying the server's numeric code.
//!
//! The `clickhouse` crate reports a server error as text beginning with
//! ClickHouse's own `Code: N.` prefix; it is parsed once, here, into
//! `code: Option<u32>`. Everything downstream classifies by that number
//! ([`ChError::is_retriable`]), never by message text.

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChErrorKind {
    /// The server answered with an exception.
    Server,
    /// No answer in time: the outcome is unknown.
    Timeout,
    /// No connection was made: nothing was sent, nothing can commit.
    Connect,
    /// Connection reset or broken: the outcome may be unknown.
    Network,
    /// Anything else the client reported.
    Client,
}

#[derive(Debug, Clone, thiserror::Error)]
pub struct ChError {
    pub kind: ChErrorKind,
    pub code: Option<u32>,
    pub message: String,
}

impl fmt::Display for ChError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.kind, self.code) {
            (_, Some(code)) => write!(f, "ClickHouse error {code}: {}", self.message),
            (ChErrorKind::Timeout, _) => write!(f, "ClickHouse did not answer in time"),
            (ChErrorKind::Connect, _) => {
                write!(f, "cannot connect to ClickHouse: {}", self.message)
            }
            (ChErrorKind::Network, _) => {
                write!(f, "ClickHouse connection failed: {}", self.message)
            }
            _ => write!(f, "ClickHouse client error: {}", self.message),
        }
    }
}

/// Codes that a retry cannot fix: the data, the schema or the permissions
/// are wrong.
const PERMANENT: &[u32] = &[
    6,   // CANNOT_PARSE_TEXT
    8,   // THERE_IS_NO_COLUMN
    10,  // NOT_FOUND_COLUMN_IN_BLOCK
    16,  // NO_SUCH_COLUMN_IN_TABLE
    20,  // NUMBER_OF_COLUMNS_DOESNT_MATCH
    25,  // CANNOT_PARSE_ESCAPE_SEQUENCE
    26,  // CANNOT_PARSE_QUOTED_STRING
    27,  // CANNOT_PARSE_INPUT_ASSERTION_FAILED
    36,  // BAD_ARGUMENTS
    38,  // CANNOT_PARSE_DATE
    41,  // CANNOT_PARSE_DATETIME
    43,  // ILLEGAL_TYPE_OF_ARGUMENT
    44,  // ILLEGAL_COLUMN
    46,  // UNKNOWN_FUNCTION
    47,  // UNKNOWN_IDENTIFIER
    48,  // NOT_IMPLEMENTED
    53,  // TYPE_MISMATCH
    60,  // UNKNOWN_TABLE
    62,  // SYNTAX_ERROR
    69,  // ARGUMENT_OUT_OF_BOUND
    70,  // CANNOT_CONVERT_TYPE
    72,  // CANNOT_PARSE_NUMBER
    81,  // UNKNOWN_DATABASE
    115, // UNKNOWN_SETTING
    117, // INCORRECT_DATA
    131, // TOO_LARGE_STRING_SIZE
    164, // READONLY
    192, // UNKNOWN_USER
    193, // WRONG_PASSWORD
    194, // REQUIRED_PASSWORD
    349, // CANNOT_INSERT_NULL_IN_ORDINARY_COLUMN
    497, // ACCESS_DENIED
    516, // AUTHENTICATION_FAILED
];

impl ChErrorKind {
    /// A short name, for metric labels.
    pub fn name(self) -> &'static str {
        match self {
            Self::Server => "server",
            Self::Timeout => "timeout",
            Self::Connect => "connect",
            Self::Network => "network",
            Self::Client => "client",
        }
    }
}

impl ChError {
    pub fn client(message: impl Into<String>) -> Self {
        Self {
            kind: ChErrorKind::Client,
            code: None,
            message: message.into(),
        }
    }

    /// Whether trying again may succeed. Server errors are judged by code;
    /// timeouts and network failures always may.
    pub fn is_retriable(&self) -> bool {
        match self.kind {
            ChErrorKind::Timeout | ChErrorKind::Connect | ChErrorKind::Network => true,
            ChErrorKind::Server => self.code.is_none_or(|c| !PERMANENT.contains(&c)),
            ChErrorKind::Client => false,
        }
    }
}

impl From<clickhouse::error::Error> for ChError {
    fn from(e: clickhouse::error::Error) -> Self {
        use clickhouse::error::Error as E;
        match e {
            E::TimedOut => Self {
                kind: ChErrorKind::Timeout,
                code: None,
                message: "timed out".into(),
            },
            E::Network(inner) => {
                let connect = inner
                    .downcast_ref::<hyper_util::client::legacy::Error>()
                    .is_some_and(|e| e.is_connect());
                Self {
                    kind: if connect {
                        ChErrorKind::Connect
                    } else {
                        ChErrorKind::Network
                    },
                    code: None,
                    message: error_chain(&*inner),
                }
            }
            E::BadResponse(text) => {
                let code = parse_code(&text);
                // An HTTP error without an exception code (a proxy's 502, …)
                // says nothing about the insert: treat it like the network.
                let kind = if code.is_some() {
                    ChErrorKind::Server
                } else {
                    ChErrorKind::Network
                };
                Self {
                    kind,
                    code,
                    message: text,
                }
            }
            other => Self::client(other.to_string()),
        }
    }
}

/// An error with its sources, `a: b: c`.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        out.push_str(": ");
        out.push_str(&s.to_string());
        src = s.source();
    }
    out
}

/// `Code: 60. DB::Exception: …` → 60.
fn parse_code(text: &str) -> Option<u32> {
    let rest = text.trim_start().strip_prefix("Code:")?.trim_start();
    let end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_parsed_and_classified() {
        let e = ChError::from(clickhouse::error::Error::BadResponse(
            "Code: 60. DB::Exception: Table default.x does not exist. (UNKNOWN_TABLE)".into(),
        ));
        assert_eq!(e.code, Some(60));
        assert!(!e.is_retriable());
        let e = ChError::from(clickhouse::error::Error::BadResponse(
            "Code: 252. DB::Exception: Too many parts".into(),
        ));
        assert_eq!(e.code, Some(252));
        assert!(e.is_retriable());
        let e = ChError::from(clickhouse::error::Error::BadResponse(
            "502 Bad Gateway".into(),
        ));
        assert_eq!((e.kind, e.code), (ChErrorKind::Network, None));
        assert!(e.is_retriable());
        assert!(ChError::from(clickhouse::error::Error::TimedOut).is_retriable());
        assert_eq!(parse_code("Code:  27 ."), Some(27));
        assert_eq!(parse_code("nothing"), None);
    }
}
