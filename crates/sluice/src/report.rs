//! What a command ends in, and the one table layout its report uses.
//!
//! In: what a command found. Out: an [`Outcome`], which the binary turns
//! into the exit status (0 clean, 1 found; an error is 2), and a `grid`
//! for an aligned report. No I/O: the operator tools, `check-config`,
//! `status`, `send` and `resend` all end here.

use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};

/// What a command found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing to report: exit 0.
    Clean,
    /// Something to report (duplicates, a window too short, a failed
    /// check, a stuck partition, a record left in the retry file): exit 1.
    Found,
}

impl Outcome {
    /// [`Outcome::Found`] when `found`, else [`Outcome::Clean`].
    pub(crate) fn found_if(found: bool) -> Self {
        if found {
            Self::Found
        } else {
            Self::Clean
        }
    }
}

/// An aligned table with a header row.
pub(crate) fn grid<const N: usize>(header: [&str; N]) -> Table {
    let mut t = Table::new();
    t.load_style(UTF8_FULL_CONDENSED).set_header(header);
    t
}
