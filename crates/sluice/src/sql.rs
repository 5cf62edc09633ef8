//! Names in SQL: the one table-reference type, and identifiers and
//! literals for the SQL text that cannot take the client's binds.
//!
//! In: `DB.TABLE` as given on a command line, or a route's database and
//! table. Out: a [`TableRef`], and quoted text for SQL. No I/O: the config
//! names its routes' tables with it, and everything that talks to
//! ClickHouse quotes with it.
//!
//! Queries take names and values through the client's binds (`?` with
//! [`clickhouse::sql::Identifier`] for a name), escaped by the official
//! client. SQL that is text to the end (an INSERT's head, the statements
//! `sluice repair` prints before it runs them) quotes names here, and only
//! here.

use std::fmt;

/// A table: `database.table`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TableRef {
    pub database: String,
    pub table: String,
}

impl TableRef {
    pub(crate) fn new(database: impl Into<String>, table: impl Into<String>) -> Self {
        Self {
            database: database.into(),
            table: table.into(),
        }
    }

    /// `DB.TABLE`, as given on the command line.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s.split_once('.') {
            Some((d, t)) if !d.is_empty() && !t.is_empty() && !t.contains('.') => {
                Ok(Self::new(d, t))
            }
            _ => Err(format!("{s:?} is not DB.TABLE")),
        }
    }

    /// `` `db`.`table` ``, for SQL text.
    pub fn sql(&self) -> String {
        format!("{}.{}", ident(&self.database), ident(&self.table))
    }

    /// Another table in the same database.
    pub(crate) fn sibling(&self, table: String) -> Self {
        Self::new(self.database.clone(), table)
    }
}

/// `db.table`, unquoted: for messages and metric labels.
impl fmt::Display for TableRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.database, self.table)
    }
}

/// A back-quoted identifier for SQL text.
pub(crate) fn ident(s: &str) -> String {
    format!("`{}`", s.replace('\\', "\\\\").replace('`', "\\`"))
}

/// `` `a`, `b` ``.
pub(crate) fn ident_list(cols: &[String]) -> String {
    cols.iter().map(|c| ident(c)).collect::<Vec<_>>().join(", ")
}

/// A single-quoted string literal for SQL text.
pub(crate) fn literal(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_quoted_and_parsed() {
        let t = TableRef::parse("db.events").unwrap();
        assert_eq!(t.sql(), "`db`.`events`");
        assert_eq!(t.to_string(), "db.events");
        assert_eq!(ident("a`b\\c"), "`a\\`b\\\\c`");
        assert_eq!(literal("it's"), "'it\\'s'");
        assert_eq!(ident_list(&["a".into(), "b`c".into()]), "`a`, `b\\`c`");
        for bad in ["events", ".t", "db.", "a.b.c"] {
            assert!(TableRef::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(t.sibling("x".into()), TableRef::new("db", "x"));
    }
}
