//! ClickHouse failures → [`ChError`], carrying what the server said.
//!
//! The `clickhouse` crate reports a server error as text beginning with
//! ClickHouse's own `Code: N.` prefix. That text is parsed once, here, into
//! `code: Option<u32>` and, when the server names the input row it refused
//! (`(at row N)`, `violated at row N`), into `row: Option<usize>`.
//! Everything downstream works from those fields, never from message text:
//! [`ChError::is_retriable`] classifies by code against an allowlist of what
//! a retry can fix, and the writer finds a refused record by `row`.
//!
//! An answer without a ClickHouse code comes from something in front of the
//! server (a proxy, a load balancer). The crate hands over its body, or its
//! status line when the body is empty; the status is read from either
//! ([`http_status`]) and classified as the codes are: 413 (the body is too
//! large) asks for fewer rows per insert; 404, 408, 425 and 429 (a deploy, a
//! timeout, a rate limit) and 5xx, or no status at all, are a network
//! failure, retried with its outcome unknown; any other 4xx stops the sink
//! with the status and the start of the body. The crate keeps the status
//! only for an empty body: a plain-text body that names no status (Envoy's
//! `upstream connect error …`, a firewall's own words) is retried as a
//! network failure, and logged with its start, since it may be a 5xx.

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChErrorKind {
    /// The server answered with an exception.
    Server,
    /// No answer in time: the outcome is unknown.
    Timeout,
    /// No connection was made: nothing was sent, nothing can commit.
    Connect,
    /// Connection reset or broken: the outcome may be unknown.
    Network,
    /// Something in front of the server refused the body as too large
    /// (HTTP 413): fewer rows per insert may pass.
    TooLarge,
    /// Anything else the client reported, or an HTTP 4xx without a
    /// ClickHouse code (a proxy refused the request).
    Client,
}

#[derive(Debug, Clone, thiserror::Error)]
pub struct ChError {
    pub(crate) kind: ChErrorKind,
    /// ClickHouse's exception code (`Code: N.`), for a server answer.
    pub(crate) code: Option<u32>,
    /// The input row the server names as the one it refused, counted from 1
    /// as ClickHouse prints it; `None` when it names none.
    pub(crate) row: Option<usize>,
    pub(crate) message: String,
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
            (ChErrorKind::TooLarge, _) => write!(
                f,
                "the insert is too large for ClickHouse or a proxy in front of it: {}",
                self.message
            ),
            _ => write!(f, "ClickHouse client error: {}", self.message),
        }
    }
}

/// Server codes a retry can fix: the server, the network between its nodes,
/// Keeper or a replica is briefly unable to take the insert, and nothing
/// about the rows or the table is wrong. Every other server code is
/// permanent: the same bytes would be refused again.
///
/// The starting point is the list the ClickHouse Kafka Connect sink retries
/// (`Utils.handleException` in ClickHouse/clickhouse-kafka-connect: 3, 107,
/// 159, 164, 202, 203, 209, 210, 241, 242, 252, 285, 319, 425, 999), minus
/// 164 `READONLY` (a user's or profile's `readonly` setting: no retry changes
/// it; a read-only *replica* is 242), plus the other codes of the same
/// families. Numbers and names as in ClickHouse's `src/Common/ErrorCodes.cpp`
/// (checked against `errorCodeToName` of 26.9). Sorted, for `binary_search`.
const RETRIABLE: &[u32] = &[
    3,    // UNEXPECTED_END_OF_FILE: the request body was cut short on the way
    95,   // CANNOT_READ_FROM_SOCKET
    96,   // CANNOT_WRITE_TO_SOCKET
    107,  // FILE_DOESNT_EXIST: a part's file gone under a merge or on shared storage
    159,  // TIMEOUT_EXCEEDED
    173,  // CANNOT_ALLOCATE_MEMORY
    198,  // DNS_ERROR
    201,  // QUOTA_EXCEEDED: the quota's interval ends
    202,  // TOO_MANY_SIMULTANEOUS_QUERIES
    203,  // NO_FREE_CONNECTION
    209,  // SOCKET_TIMEOUT
    210,  // NETWORK_ERROR
    216,  // QUERY_WITH_SAME_ID_IS_ALREADY_RUNNING: an earlier attempt still runs
    218,  // TABLE_IS_DROPPED: being dropped or detached; once gone it is 60
    225,  // NO_ZOOKEEPER
    236,  // ABORTED
    241,  // MEMORY_LIMIT_EXCEEDED
    242,  // TABLE_IS_READ_ONLY: a replica lost its Keeper session
    243,  // NOT_ENOUGH_SPACE: merges and TTLs free space
    244,  // UNEXPECTED_ZOOKEEPER_ERROR
    252,  // TOO_MANY_PARTS: merge back-pressure
    254,  // NO_ACTIVE_REPLICAS
    265,  // NO_AVAILABLE_REPLICA
    279,  // ALL_CONNECTION_TRIES_FAILED
    285,  // TOO_FEW_LIVE_REPLICAS
    286,  // UNSATISFIED_QUORUM_FOR_PREVIOUS_WRITE
    289,  // REPLICA_IS_NOT_IN_QUORUM
    297,  // SHARD_HAS_NO_CONNECTIONS
    319,  // UNKNOWN_STATUS_OF_INSERT
    369,  // ALL_REPLICAS_ARE_STALE
    384,  // PART_IS_TEMPORARILY_LOCKED
    394,  // QUERY_WAS_CANCELLED: a server shutting down cancels its queries
    415,  // ALL_REPLICAS_LOST
    416,  // REPLICA_STATUS_CHANGED
    425,  // SYSTEM_ERROR: an errno (too many open files, …)
    439,  // CANNOT_SCHEDULE_TASK: thread pool full
    473,  // DEADLOCK_AVOIDED: lock contention with DDL or merges
    519,  // NO_REMOTE_SHARD_AVAILABLE
    529,  // NOT_A_LEADER
    574,  // DISTRIBUTED_TOO_MANY_PENDING_BYTES: Distributed back-pressure
    733,  // TABLE_IS_BEING_RESTARTED
    735,  // QUERY_WAS_CANCELLED_BY_CLIENT
    738,  // PART_IS_LOCKED
    745,  // SERVER_OVERLOADED
    749,  // TCP_CONNECTION_LIMIT_REACHED
    762,  // HTTP_CONNECTION_LIMIT_REACHED
    777,  // MEMORY_RESERVATION_KILLED
    778,  // MEMORY_RESERVATION_FAILED
    904,  // TOO_MANY_UNAVAILABLE_SHARDS
    999,  // KEEPER_EXCEPTION
    1017, // ASYNC_INSERT_FLUSH_TIMEOUT
    1019, // QUERY_SLOT_ACQUISITION_TIMEOUT
    1020, // MEMORY_RESERVATION_ACQUISITION_TIMEOUT
];

impl ChErrorKind {
    /// A short name, for metric labels.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Server => "server",
            Self::Timeout => "timeout",
            Self::Connect => "connect",
            Self::Network => "network",
            Self::TooLarge => "too_large",
            Self::Client => "client",
        }
    }
}

impl ChError {
    pub(crate) fn client(message: impl Into<String>) -> Self {
        Self::without_code(ChErrorKind::Client, message)
    }

    /// No answer in time.
    pub(crate) fn timeout(message: impl Into<String>) -> Self {
        Self::without_code(ChErrorKind::Timeout, message)
    }

    fn without_code(kind: ChErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            code: None,
            row: None,
            message: message.into(),
        }
    }

    /// An HTTP error answer (`Code: 60. DB::Exception: …`, or a bare status
    /// line or an error page from something in front of the server), parsed
    /// once: its code and the row it names. Without a code: see the module
    /// header.
    pub(crate) fn from_response(text: impl Into<String>) -> Self {
        let message = text.into();
        let code = parse_code(&message);
        if code.is_some() {
            return Self {
                kind: ChErrorKind::Server,
                code,
                row: parse_row(&message),
                message,
            };
        }
        match http_status(&message) {
            Some(413) => Self::without_code(ChErrorKind::TooLarge, message),
            // Not found (a deploy in progress), timeouts, rate limits: retried.
            Some(404 | 408 | 425 | 429) => Self::without_code(ChErrorKind::Network, message),
            Some(status @ 400..=499) => {
                let start: String = message.chars().take(200).collect();
                Self::client(format!(
                    "HTTP {status} from {}: {start}",
                    "something in front of ClickHouse (no ClickHouse error code)"
                ))
            }
            Some(_) => Self::without_code(ChErrorKind::Network, message),
            None => {
                let start: String = message.chars().take(200).collect();
                Self::without_code(
                    ChErrorKind::Network,
                    format!("an answer with no ClickHouse error code and no HTTP status in it (from something in front of ClickHouse?): {start}"),
                )
            }
        }
    }

    /// Whether trying again may succeed. Server errors are judged by code,
    /// from the allowlist [`RETRIABLE`]; timeouts and network failures
    /// always may; anything else never does.
    pub(crate) fn is_retriable(&self) -> bool {
        match self.kind {
            ChErrorKind::Timeout
            | ChErrorKind::Connect
            | ChErrorKind::Network
            | ChErrorKind::TooLarge => true,
            ChErrorKind::Server => self.code.is_some_and(retriable_code),
            ChErrorKind::Client => false,
        }
    }

    /// The DLQ kind of a row this error names: `extra-field` when the row
    /// has a field the table has no column for (a route with
    /// `extra_fields = "dlq"` inserts without skipping unknown fields),
    /// `rejected` for any other refusal.
    pub(crate) fn row_kind(&self) -> &'static str {
        if self.unknown_field().is_some() {
            "extra-field"
        } else {
            "rejected"
        }
    }

    /// The field a refusal of kind `extra-field` names: ClickHouse writes
    /// `Unknown field found while parsing JSONEachRow format: NAME: (at row N)`.
    pub(crate) fn unknown_field(&self) -> Option<&str> {
        if self.code != Some(INCORRECT_DATA) {
            return None;
        }
        let (_, rest) = self
            .message
            .split_once("Unknown field found while parsing ")?;
        let (_, rest) = rest.split_once(" format: ")?;
        rest.rsplit_once(": (at row ").map(|(name, _)| name)
    }

    /// Whether the server says the table, its database or a column the
    /// protocol reads is gone (NO_SUCH_COLUMN_IN_TABLE, UNKNOWN_IDENTIFIER,
    /// UNKNOWN_TABLE, UNKNOWN_DATABASE): no retry of a read of it can pass.
    pub(crate) fn table_is_gone(&self) -> bool {
        self.kind == ChErrorKind::Server && self.code.is_some_and(|c| [16, 47, 60, 81].contains(&c))
    }

    /// Whether no retry of the same rows can pass but fewer rows per insert
    /// may: the rows fall into more partitions of the table than one insert
    /// may create parts for (`max_partitions_per_insert_block`; the same
    /// code as merge back-pressure), or the body is too large for something
    /// in front of the server (413).
    pub(crate) fn wants_fewer_rows(&self) -> bool {
        let partitions = self.kind == ChErrorKind::Server
            && self.code == Some(TOO_MANY_PARTS)
            && self.message.contains("partitions for single INSERT block");
        partitions || self.kind == ChErrorKind::TooLarge
    }
}

/// `TOO_MANY_PARTS`: merge back-pressure, or too many partitions in one insert.
const TOO_MANY_PARTS: u32 = 252;

/// `INCORRECT_DATA`: among others, a field the table has no column for.
const INCORRECT_DATA: u32 = 117;

/// Whether a retry can fix server code `code` ([`RETRIABLE`]).
fn retriable_code(code: u32) -> bool {
    RETRIABLE.binary_search(&code).is_ok()
}

impl From<clickhouse::error::Error> for ChError {
    fn from(e: clickhouse::error::Error) -> Self {
        use clickhouse::error::Error as E;
        match e {
            E::TimedOut => Self::timeout("timed out"),
            E::Network(inner) => {
                let connect = inner
                    .downcast_ref::<hyper_util::client::legacy::Error>()
                    .is_some_and(|e| e.is_connect());
                let kind = if connect {
                    ChErrorKind::Connect
                } else {
                    ChErrorKind::Network
                };
                Self::without_code(kind, error_chain(&*inner))
            }
            E::BadResponse(text) => Self::from_response(text),
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

/// The HTTP status of an answer without a ClickHouse code: the crate's
/// status line for an empty body (`413 Payload Too Large`), or an error
/// page's title or heading (`<title>502 Bad Gateway</title>`, `<h1>503 …`).
fn http_status(text: &str) -> Option<u16> {
    let lead = |s: &str| -> Option<u16> {
        let s = s.trim_start();
        let n: u16 = s.get(..3)?.parse().ok()?;
        let spaced = s
            .get(3..)
            .is_some_and(|r| r.is_empty() || r.starts_with(' '));
        (spaced && (100..600).contains(&n)).then_some(n)
    };
    lead(text).or_else(|| {
        ["<title>", "<h1>"].into_iter().find_map(|marker| {
            let at = text.find(marker)? + marker.len();
            lead(&text[at..])
        })
    })
}

/// `Code: 60. DB::Exception: …` → 60.
fn parse_code(text: &str) -> Option<u32> {
    let rest = text.trim_start().strip_prefix("Code:")?.trim_start();
    let end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// The input row an error names, from 1: `(at row 6)` (a value the input
/// format cannot parse or the column refuses) or `violated at row 6` (a
/// `CONSTRAINT … CHECK`). The first mention counts; row 0, a missing number
/// or one that does not fit are no row.
fn parse_row(text: &str) -> Option<usize> {
    ["(at row ", "violated at row "]
        .into_iter()
        .find_map(|marker| {
            let at = text.find(marker)? + marker.len();
            let rest = &text[at..];
            let end = rest
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(rest.len());
            let closed = match marker {
                "(at row " => rest[end..].starts_with(')'),
                _ => true,
            };
            let n: usize = rest[..end].parse().ok()?;
            (closed && n > 0).then_some(n)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(text: &str) -> ChError {
        ChError::from(clickhouse::error::Error::BadResponse(text.into()))
    }

    fn server(code: u32) -> ChError {
        answer(&format!(
            "Code: {code}. DB::Exception: something. (SOMETHING)"
        ))
    }

    #[test]
    fn a_field_the_table_lacks_is_an_extra_field() {
        let e = answer(
            "Code: 117. DB::Exception: Unknown field found while parsing JSONEachRow format: extra: (at row 2)\n\
             : While executing JSONEachRowRowInputFormat. (INCORRECT_DATA) (version 26.9.2.1 (official build))",
        );
        assert_eq!((e.row, e.row_kind()), (Some(2), "extra-field"));
        assert_eq!(e.unknown_field(), Some("extra"));
        let e = answer("Code: 117. DB::Exception: Cannot parse JSON object here: (at row 3)");
        assert_eq!(e.row_kind(), "rejected");
        assert_eq!(server(53).row_kind(), "rejected");
    }

    #[test]
    fn codes_are_parsed_and_classified() {
        let e = answer("Code: 60. DB::Exception: Table default.x does not exist. (UNKNOWN_TABLE)");
        assert_eq!(
            (e.kind, e.code, e.row),
            (ChErrorKind::Server, Some(60), None)
        );
        assert!(!e.is_retriable());
        let e = answer("Code: 252. DB::Exception: Too many parts");
        assert_eq!(e.code, Some(252));
        assert!(e.is_retriable());
        assert!(!e.wants_fewer_rows());
        let e = answer(
            "Code: 252. DB::Exception: Too many partitions for single INSERT block (more than 100). \
             The limit is controlled by 'max_partitions_per_insert_block' setting. (TOO_MANY_PARTS)",
        );
        assert!(e.wants_fewer_rows());
        assert!(!server(53).wants_fewer_rows());
        // Only a status header, no body: the crate gives `Code: N`.
        assert_eq!(answer("Code: 241").code, Some(241));
        assert_eq!(parse_code("Code:  27 ."), Some(27));
        assert_eq!(parse_code("nothing"), None);
        assert_eq!(parse_code("Code: x"), None);
    }

    #[test]
    fn only_what_a_retry_can_fix_is_retried() {
        for code in [
            3, 159, 202, 203, 209, 210, 241, 242, 252, 285, 319, 415, 999, 218, 733, 236, 225,
        ] {
            assert!(server(code).is_retriable(), "{code} should be retried");
        }
        // Data the column refuses, a table or user that is wrong, a read-only
        // user, our own deadline (`throwIf`), and codes nobody listed.
        for code in [
            691, 27, 6, 53, 60, 81, 349, 469, 497, 164, 395, 774, 999_999, 0,
        ] {
            assert!(!server(code).is_retriable(), "{code} should be permanent");
        }
    }

    #[test]
    fn the_allowlist_is_sorted_and_has_no_duplicates() {
        assert!(RETRIABLE.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn answers_without_a_code_are_classified_by_their_status() {
        let e = answer("413 Payload Too Large");
        assert_eq!(e.kind, ChErrorKind::TooLarge);
        assert!(e.wants_fewer_rows() && e.is_retriable());
        let page = "<html>\r\n<head><title>413 Request Entity Too Large</title></head>\r\n<body>nginx</body></html>";
        assert_eq!(answer(page).kind, ChErrorKind::TooLarge);
        for text in [
            "403 Forbidden",
            "<html><head><title>401 Authorization Required</title></head></html>",
            "<html><body><h1>400 Bad Request</h1></body></html>",
        ] {
            let e = answer(text);
            assert_eq!(e.kind, ChErrorKind::Client, "{text}");
            assert!(!e.is_retriable(), "{text}");
            assert!(e.to_string().contains("HTTP 4"), "{e}");
        }
        for text in [
            "429 Too Many Requests",
            "<html><body><h1>429 Too Many Requests</h1></body></html>",
            "408 Request Timeout",
            "502 Bad Gateway",
            "<html><head><title>504 Gateway Time-out</title></head></html>",
            "<html><body><h1>503 Service Unavailable</h1>No server is available</body></html>",
            "upstream connect error or disconnect/reset before headers",
            "4000 rows",
            "",
        ] {
            let e = answer(text);
            assert_eq!(e.kind, ChErrorKind::Network, "{text}");
            assert!(e.is_retriable(), "{text}");
        }
        assert_eq!(http_status("  418"), Some(418));
        assert_eq!(http_status("99 x"), None);
        assert_eq!(http_status("é"), None);
    }

    #[test]
    fn transport_failures_are_retried() {
        let e = answer("502 Bad Gateway");
        assert_eq!((e.kind, e.code, e.row), (ChErrorKind::Network, None, None));
        assert!(e.is_retriable());
        // A bare status naming a row is still no server answer.
        assert_eq!(answer("503 Service Unavailable (at row 2)").row, None);
        assert!(ChError::from(clickhouse::error::Error::TimedOut).is_retriable());
        assert!(ChError::timeout("no answer").is_retriable());
        let e = ChError::client("bad config");
        assert!(!e.is_retriable());
    }

    #[test]
    fn the_row_is_parsed_once_where_the_error_is_built() {
        let e = answer(
            "Code: 691. DB::Exception: Unknown element 'zz' for enum: \
             (while reading the value of key e): (at row 6)\n: \
             While executing JSONEachRowRowInputFormat. (UNKNOWN_ELEMENT_OF_ENUM) (version 26.9.2.1)",
        );
        assert_eq!((e.code, e.row), (Some(691), Some(6)));
        assert!(!e.is_retriable());
        let e = answer(
            "Code: 469. DB::Exception: Constraint `c` for table t is violated at row 3. \
             Expression: (n < 1000). Column values: n = 5000. (VIOLATED_CONSTRAINT)",
        );
        assert_eq!((e.code, e.row), (Some(469), Some(3)));
    }

    #[test]
    fn row_edge_cases() {
        assert_eq!(parse_row("(at row 1)"), Some(1));
        assert_eq!(parse_row("x (at row 12345) y (at row 7)"), Some(12345));
        assert_eq!(parse_row("(at row 0)"), None);
        assert_eq!(parse_row("(at row )"), None);
        assert_eq!(parse_row("(at row 12"), None);
        assert_eq!(parse_row("(at row 12x)"), None);
        assert_eq!(parse_row("(at row -1)"), None);
        assert_eq!(parse_row("(at row 99999999999999999999999999)"), None);
        assert_eq!(parse_row("at row 5"), None);
        assert_eq!(parse_row("(AT ROW 5)"), None);
        assert_eq!(parse_row("is violated at row 4. Expression"), Some(4));
        assert_eq!(parse_row("is violated at row 0."), None);
        assert_eq!(parse_row(""), None);
    }
}
