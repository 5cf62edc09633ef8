//! The one way sluice builds a ClickHouse HTTP client, for the sink and the
//! operator tools alike.
//!
//! In: a [`ClickHouseConfig`]. Out: a `clickhouse::Client` on the official
//! crate's hyper stack (HTTP or HTTPS), whose connection attempts give up
//! after [`CONNECT_TIMEOUT`] and whose idle connections are probed by TCP
//! keep-alive. How long a query may run is bounded by its caller: the sink
//! per request (`bounded`), the operator tools with `max_execution_time`.
//!
//! Every request carries [`PINNED`]: a settings profile on the server can
//! limit what a query reads or returns with an overflow mode of `break`, and
//! the answer is then cut short without an error. A reconciliation that sees
//! fewer rows than are stored would send them again; a watermark read over
//! part of the table would let records in unchecked.

use crate::config::{ClickHouseConfig, PINNED};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use std::time::Duration;

/// How long opening a connection may take.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// TCP keep-alive on every connection.
const KEEPALIVE: Duration = Duration::from_secs(60);
/// Below the server's `keep_alive_timeout` (3 s by default), so a pooled
/// connection is never one the server is closing.
const POOL_IDLE: Duration = Duration::from_secs(2);

/// A client for `cfg`'s server, user, password and database.
pub fn client(cfg: &ClickHouseConfig) -> clickhouse::Client {
    let mut http = HttpConnector::new();
    http.set_connect_timeout(Some(CONNECT_TIMEOUT));
    http.set_keepalive(Some(KEEPALIVE));
    http.enforce_http(false);
    let https = hyper_tls::HttpsConnector::new_with_connector(http);
    let hyper = Client::builder(TokioExecutor::new())
        .pool_idle_timeout(POOL_IDLE)
        .build(https);
    let client = clickhouse::Client::with_http_client(hyper)
        .with_url(&cfg.url)
        .with_user(&cfg.user)
        .with_password(cfg.password.expose())
        .with_database(&cfg.database)
        .with_validation(false);
    PINNED
        .iter()
        .fold(client, |c, (name, value)| c.with_setting(*name, *value))
}
