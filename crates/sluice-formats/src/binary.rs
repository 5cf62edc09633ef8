//! A JSONEachRow row → the same row in `RowBinaryWithDefaults`, exactly as
//! ClickHouse would have stored it, or a [`Fallback`].
//!
//! In: the table's columns as `system.columns` lists them (name, type,
//! `default_kind`), the insert's [`InputSettings`], and rows as
//! [`crate::RowEncoder`] writes them (one JSON object per row, metadata
//! columns included). Out: per row, each insertable column (not
//! MATERIALIZED or ALIAS) in table order, led by a byte: 1 = "use the
//! column's default", 0 = a value follows in RowBinary. The rows go to
//! `INSERT INTO t SELECT * FROM input() FORMAT RowBinaryWithDefaults`,
//! which parses about twice as fast as JSONEachRow on the server.
//!
//! The guarantee: a row encoded here lands as the same bytes as its JSON
//! line would have under the same settings; a value not known to convert
//! exactly is a [`Fallback`], and the caller sends that row (its batch) as
//! JSONEachRow. `tests/binary_vs_json.rs` checks it against the engine.
//!
//! - [`types`]: the type string → [`Type`] (what it does not know is
//!   [`Type::Unsupported`], its column's values fall back).
//! - `settings`: the input settings the conversion depends on.
//! - `json`: a strict JSON reader over bytes (strings may hold bytes that
//!   are not UTF-8, which ClickHouse stores as they are).
//! - `encode`: one value of one type; `num`, `time` and `addr`: digits,
//!   dates, UUIDs and addresses.
//!
//! What ClickHouse's JSONEachRow does that shapes the rules (chDB 26.9,
//! each checked by `tests/binary_vs_json.rs` or by hand):
//! - A missing field takes the DEFAULT expression, else the type's
//!   default; the "default" flag of RowBinaryWithDefaults gives the
//!   column's zero instead, which differs for an `Enum` whose smallest
//!   value is not 0 (its type default), alone or in a `Tuple`: such a
//!   column gets its default written out. `null` into a column that is not
//!   Nullable is what the flag gives (the DEFAULT expression, else the
//!   column's zero: 0 even for an `Enum` with no 0 element); `null` in an
//!   array, a map or a tuple, and a named tuple's missing element, is the
//!   element's zero (`[null]` into `Array(Int32)` is `[0]`).
//! - Keys are matched unescaped (`"\u0061"` is `a`) in a row and in a map,
//!   but as written in a named tuple (there `"\u0061"` is an unknown key).
//!   A key that names no column but one differing only by case fills that
//!   column (`input_format_column_name_matching_mode = auto`). A known key
//!   given twice is refused; an unknown one is skipped unread
//!   (`input_format_json_ignore_unnecessary_fields`); a map keeps a key
//!   given twice, twice.
//! - Integers wrap (`256` into `UInt8` is 0; `-0` into one is refused);
//!   dates and times clamp to their range (`1969-12-31` is `1970-01-01`),
//!   and in `basic` `2024-02-30` is March 1st, `24:00:00` the next day.
//! - A number, a boolean, an object or an array read into a `String` is its
//!   own text, byte for byte; bytes that are not UTF-8 are kept; `"\a"` is
//!   `a` and a lone low surrogate escape becomes three bytes.
//! - Floats (`precise_float_parsing`) are correctly rounded, a `Float32`
//!   straight from the text; `Decimal` digits past the scale are cut off
//!   toward zero.
//! - A bare number into a `DateTime64` is seconds with a fraction from 26.8
//!   (`input_format_read_datetime_number_as_raw_value = 0`), ticks before.
//! - Text read as a number, a date or an address is read without undoing
//!   escapes (`"2024\u002d01-02"` is refused); `01.2.3.4` is an IPv4
//!   address; a quoted number that names no `Enum` element reads as that
//!   number; the encoder leaves all of these to the JSON path.
//! - RowBinary takes an `Enum` value that names no element (its 0, stored
//!   as JSONEachRow stores it); the encoder still falls back there, as a
//!   server that checked the value would refuse the whole insert.

mod addr;
mod encode;
mod json;
mod num;
mod settings;
mod time;
pub mod types;

pub use settings::{server_defaults, DateTimeInput, InputSettings};
pub use types::Type;

use encode::{type_default, value, Ctx};
use json::Cursor;
use std::collections::HashMap;

/// Why a row cannot be encoded here: it goes by JSONEachRow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}{}", column.map(|c| format!(" (column {c})")).unwrap_or_default())]
pub struct Fallback {
    /// What was met (a static phrase, no allocation per row).
    pub reason: &'static str,
    /// The index of the insertable column it was met in, if any
    /// ([`Layout::columns`]).
    pub column: Option<usize>,
}

impl Fallback {
    pub(crate) fn new(reason: &'static str) -> Self {
        Fallback {
            reason,
            column: None,
        }
    }

    fn at(mut self, column: usize) -> Self {
        self.column.get_or_insert(column);
        self
    }
}

/// A column's `default_kind` in `system.columns`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DefaultKind {
    /// No default expression.
    None,
    Default,
    Materialized,
    Alias,
    Ephemeral,
}

impl DefaultKind {
    /// From `system.columns.default_kind` (`""`, `DEFAULT`, ...); `None`
    /// for a kind not known here.
    pub fn parse(kind: &str) -> Option<DefaultKind> {
        Some(match kind {
            "" => DefaultKind::None,
            "DEFAULT" => DefaultKind::Default,
            "MATERIALIZED" => DefaultKind::Materialized,
            "ALIAS" => DefaultKind::Alias,
            "EPHEMERAL" => DefaultKind::Ephemeral,
            _ => return None,
        })
    }
}

/// One column as `system.columns` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnSpec {
    pub name: String,
    /// The type as `system.columns.type` spells it.
    pub type_name: String,
    pub default_kind: DefaultKind,
}

/// An insertable column, as the encoder writes it.
#[derive(Debug, Clone)]
pub struct Column {
    pub name: String,
    pub ty: Type,
    /// It has a DEFAULT expression.
    pub has_default: bool,
    /// A `Nested` column flattened (`n.x Array(T)`): ClickHouse sizes a
    /// missing one from its siblings; not mirrored.
    nested_part: bool,
}

/// A table's insertable columns and the settings its rows are read with.
#[derive(Debug, Clone)]
pub struct Layout {
    columns: Vec<Column>,
    by_name: HashMap<Vec<u8>, usize>,
    /// Column names, ASCII-lowercased (all of them are ASCII when
    /// `ascii` is set).
    folded: HashMap<Vec<u8>, usize>,
    ascii: bool,
    settings: InputSettings,
    /// Why no row can be encoded, if so.
    unusable: Option<&'static str>,
}

/// How many columns' spans a row keeps on the stack.
const STACK_COLUMNS: usize = 64;

impl Layout {
    /// The layout of a table with `columns` (all of them, in table order,
    /// as `system.columns` lists them), whose rows are read with `settings`.
    pub fn new(columns: &[ColumnSpec], settings: InputSettings) -> Layout {
        let mut unusable = settings.unusable();
        let mut cols = Vec::new();
        for c in columns {
            match c.default_kind {
                DefaultKind::Materialized | DefaultKind::Alias => continue,
                // `input()` without a structure leaves them out, whose
                // values only a JSON row can give: not mirrored.
                DefaultKind::Ephemeral => {
                    unusable.get_or_insert("the table has an EPHEMERAL column");
                    continue;
                }
                DefaultKind::None | DefaultKind::Default => {}
            }
            let ty = Type::parse(&c.type_name);
            let nested_part =
                c.name.contains('.') && matches!(ty, Type::Array(_) | Type::Unsupported(_));
            cols.push(Column {
                name: c.name.clone(),
                ty: if nested_part {
                    Type::Unsupported(c.type_name.clone())
                } else {
                    ty
                },
                has_default: c.default_kind == DefaultKind::Default,
                nested_part,
            });
        }
        let by_name: HashMap<Vec<u8>, usize> = cols
            .iter()
            .enumerate()
            .map(|(i, c)| (c.name.as_bytes().to_vec(), i))
            .collect();
        let folded: HashMap<Vec<u8>, usize> = cols
            .iter()
            .enumerate()
            .map(|(i, c)| (c.name.as_bytes().to_ascii_lowercase(), i))
            .collect();
        if folded.len() != cols.len() {
            unusable.get_or_insert("two columns' names differ only by case");
        }
        if cols.is_empty() {
            unusable.get_or_insert("the table has no insertable column");
        }
        Layout {
            ascii: cols.iter().all(|c| c.name.is_ascii()),
            columns: cols,
            by_name,
            folded,
            settings,
            unusable,
        }
    }

    /// The insertable columns, in the order rows write them.
    pub fn columns(&self) -> &[Column] {
        &self.columns
    }

    /// Why no row can be encoded with this layout, if so.
    pub fn unusable(&self) -> Option<&'static str> {
        self.unusable
    }

    /// Appends `row`'s RowBinaryWithDefaults encoding to `out`. On a
    /// fallback `out` is left as it was.
    pub fn encode(&self, row: &[u8], out: &mut Vec<u8>) -> Result<(), Fallback> {
        if let Some(why) = self.unusable {
            return Err(Fallback::new(why));
        }
        let start = out.len();
        let r = self.encode_row(row, out);
        if r.is_err() {
            out.truncate(start);
        }
        r
    }

    fn encode_row(&self, row: &[u8], out: &mut Vec<u8>) -> Result<(), Fallback> {
        let s = &self.settings;
        if s.max_object_size != 0 && row.len() as u64 > s.max_object_size / 2 {
            return Err(Fallback::new(
                "a row near input_format_json_max_object_size",
            ));
        }
        let start = out.len();
        if let Ok(true) = self.in_order(row, out) {
            return Ok(());
        }
        out.truncate(start);
        self.any_order(row, out)
    }

    /// A row whose fields name columns in the table's order (any of them
    /// missing, fields the table lacks anywhere), each value encoded as it
    /// is read: one pass. `Ok(false)` or a fallback: a field out of order
    /// (or given twice), or a value not read here; [`Self::any_order`]
    /// decides.
    fn in_order(&self, row: &[u8], out: &mut Vec<u8>) -> Result<bool, Fallback> {
        let mut cx = Ctx {
            settings: &self.settings,
            scratch: Vec::new(),
        };
        let mut cur = Cursor::new(row);
        cur.expect(b'{')?;
        cur.enter()?;
        // The columns before `next` are written: present or missing.
        let mut next = 0;
        if !cur.eat(b'}')? {
            loop {
                let key = cur.string(&mut cx.scratch)?;
                let key = key.get(&cx.scratch);
                let at = match self.columns.get(next) {
                    Some(c) if c.name.as_bytes() == key => Some(next),
                    _ => self.by_name.get(key).copied(),
                };
                match at {
                    None => {
                        self.unknown(key)?;
                        cur.expect(b':')?;
                        cur.skip()?;
                    }
                    Some(i) if i < next => return Ok(false),
                    Some(i) => {
                        for col in &self.columns[next..i] {
                            self.missing(col, out)?;
                        }
                        cur.expect(b':')?;
                        self.present(&self.columns[i], &mut cur, out, &mut cx)?;
                        next = i + 1;
                    }
                }
                if !cur.eat(b',')? {
                    break;
                }
            }
            cur.expect(b'}')?;
        }
        if !cur.at_end() {
            return Ok(false);
        }
        for col in &self.columns[next..] {
            self.missing(col, out)?;
        }
        Ok(true)
    }

    /// Any row: each field's span found first, then the columns written
    /// in the table's order.
    fn any_order(&self, row: &[u8], out: &mut Vec<u8>) -> Result<(), Fallback> {
        let s = &self.settings;
        let n = self.columns.len();
        let mut on_stack = [(0usize, 0usize); STACK_COLUMNS];
        let mut on_heap = Vec::new();
        let spans: &mut [(usize, usize)] = if n <= STACK_COLUMNS {
            &mut on_stack[..n]
        } else {
            on_heap.resize(n, (0, 0));
            &mut on_heap
        };
        let mut cx = Ctx {
            settings: s,
            scratch: Vec::new(),
        };
        // Where each column's value is (end 0: missing).
        let mut cur = Cursor::new(row);
        cur.expect(b'{')?;
        cur.enter()?;
        if !cur.eat(b'}')? {
            loop {
                let key = cur.string(&mut cx.scratch)?;
                let key = key.get(&cx.scratch);
                let at = self.by_name.get(key).copied();
                if at.is_none() {
                    self.unknown(key)?;
                }
                cur.expect(b':')?;
                let span = cur.skip()?;
                if let Some(i) = at {
                    if spans[i].1 != 0 {
                        return Err(Fallback::new("a field given twice").at(i));
                    }
                    spans[i] = span;
                }
                if !cur.eat(b',')? {
                    break;
                }
            }
            cur.expect(b'}')?;
        }
        if !cur.at_end() {
            return Err(Fallback::new("more than one object in the row"));
        }
        out.reserve(row.len());
        for (i, (col, &(from, to))) in self.columns.iter().zip(spans.iter()).enumerate() {
            let r = if to == 0 {
                self.missing(col, out)
            } else {
                let mut c = Cursor::at(&row[..to], from);
                self.present(col, &mut c, out, &mut cx).and_then(|()| {
                    if c.at_end() {
                        Ok(())
                    } else {
                        Err(Fallback::new("a value read short"))
                    }
                })
            };
            r.map_err(|e| e.at(i))?;
        }
        Ok(())
    }

    /// A key that names no column: skipped, as JSONEachRow skips it, unless
    /// it might be read as a column's (by case) or would be refused.
    fn unknown(&self, key: &[u8]) -> Result<(), Fallback> {
        if !key.is_ascii() || !self.ascii || self.folded.contains_key(&key.to_ascii_lowercase()) {
            return Err(Fallback::new("a field that names a column but for case"));
        }
        if !self.settings.skip_unknown_fields {
            return Err(Fallback::new("a field the table lacks, not skipped"));
        }
        if !self.settings.ignore_unnecessary_fields {
            return Err(Fallback::new("a field the table lacks, parsed"));
        }
        Ok(())
    }

    /// A column whose field the row lacks.
    fn missing(&self, col: &Column, out: &mut Vec<u8>) -> Result<(), Fallback> {
        if col.nested_part {
            return Err(Fallback::new("a missing part of a Nested column"));
        }
        if col.has_default || col.ty.defaults_agree() && col.ty.is_supported() {
            out.push(1);
            return Ok(());
        }
        if !col.ty.is_supported() {
            return Err(Fallback::new("a missing field of an unsupported type"));
        }
        out.push(0);
        type_default(&col.ty, out)
    }

    /// A column whose field the row has, at `cur`.
    fn present(
        &self,
        col: &Column,
        cur: &mut Cursor,
        out: &mut Vec<u8>,
        cx: &mut Ctx,
    ) -> Result<(), Fallback> {
        if !col.ty.is_supported() {
            return Err(Fallback::new("an unsupported type"));
        }
        if cur.null()? {
            if let Type::Nullable(_) = col.ty {
                out.extend_from_slice(&[0, 1]);
                return Ok(());
            }
            if !self.settings.null_as_default {
                return Err(Fallback::new("null where the type is not Nullable"));
            }
            // JSONEachRow marks the field for its default, as the flag does.
            out.push(1);
            return Ok(());
        }
        out.push(0);
        value(&col.ty, cur, out, cx)
    }
}

/// [`Layout::encode`]: `row`'s RowBinaryWithDefaults encoding appended to
/// `out`, or the reason it must go as JSONEachRow (`out` then unchanged).
pub fn encode(layout: &Layout, row: &[u8], out: &mut Vec<u8>) -> Result<(), Fallback> {
    layout.encode(row, out)
}

// Used by the tests, which write values of a type alone.
#[cfg(test)]
pub(crate) fn encode_value(
    ty: &Type,
    settings: &InputSettings,
    json: &[u8],
) -> Result<Vec<u8>, Fallback> {
    let mut out = Vec::new();
    let mut cx = Ctx {
        settings,
        scratch: Vec::new(),
    };
    let mut cur = Cursor::new(json);
    encode::nested(ty, &mut cur, &mut out, &mut cx)?;
    if !cur.at_end() {
        return Err(Fallback::new("a value read short"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
