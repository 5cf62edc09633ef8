//! The ClickHouse side: typed errors, the service that runs inserts and
//! the few queries the exactly-once protocol needs, and the one way to
//! build a client ([`client`]; [`Conn`] for the commands outside the sink,
//! from their flags).

mod client;
mod conn;
mod error;
mod layout;
mod service;

pub use client::client;
pub(crate) use conn::ChServer;
pub use conn::{ChArgs, Conn};
pub use error::ChError;
pub(crate) use error::ChErrorKind;
pub(crate) use layout::{TableLayout, COLUMNS_CHANGED};
pub(crate) use service::deadline_passed;
pub use service::{ClickHouse, InsertRequest, RowFormat};
