//! The ClickHouse side: typed errors and the service that runs inserts and
//! the few queries the exactly-once protocol needs.

mod error;
mod service;

pub use error::{ChError, ChErrorKind};
pub use service::{deadline_passed, ClickHouse, InsertRequest};
