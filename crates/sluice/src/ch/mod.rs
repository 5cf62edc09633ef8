//! The ClickHouse side: typed errors and the service that runs inserts and
//! the few queries the exactly-once protocol needs.

mod client;
mod error;
mod service;
mod table;

pub use client::{client, CONNECT_TIMEOUT};
pub use error::{ChError, ChErrorKind};
pub use service::{deadline_passed, ClickHouse, InsertRequest};
pub use table::{ident, ident_list, literal, TableRef};
