//! A ClickHouse type string, as `system.columns` spells it → [`Type`].
//!
//! In: `Nullable(Decimal(9, 2))`, `Map(String, Array(Tuple(a Int32, b
//! String)))`, `Enum8('a' = 1, 'b' = 2)`, `DateTime64(3, 'UTC')`, ...
//! Out: the type as a tree the encoder walks. A type this module does not
//! know, or one whose arguments it does not read exactly, is
//! [`Type::Unsupported`] (its text kept): a column of it sends every row
//! that holds it by the JSON path. `LowCardinality(T)` is `T` here:
//! RowBinary writes it as `T` and JSONEachRow reads it as `T`.

use std::fmt;

/// A column's type, as the binary encoder knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Type {
    /// A signed or unsigned integer of `bits` bits (8 to 256).
    Int {
        bits: u16,
        signed: bool,
    },
    Float32,
    Float64,
    Bool,
    String,
    FixedString(usize),
    /// `Decimal(P, S)`; `Decimal32(S)` and the others are `Decimal(9, S)`,
    /// `Decimal(18, S)`, `Decimal(38, S)`, `Decimal(76, S)`.
    Decimal {
        precision: u8,
        scale: u8,
    },
    Date,
    Date32,
    /// The time zone named in the type, if any (else the server's).
    DateTime(Option<String>),
    DateTime64 {
        precision: u8,
        tz: Option<String>,
    },
    Uuid,
    Ipv4,
    Ipv6,
    /// `Enum8` (`wide` false) or `Enum16`: each name (as bytes, unescaped)
    /// and its value, in the order the type declares them.
    Enum {
        wide: bool,
        values: Vec<(Vec<u8>, i16)>,
    },
    Nullable(Box<Type>),
    Array(Box<Type>),
    Map(Box<Type>, Box<Type>),
    /// Elements, with their names if the tuple is named.
    Tuple(Vec<(Option<String>, Type)>),
    /// A type the encoder does not convert: its text.
    Unsupported(String),
}

impl Type {
    /// Parses a type as `system.columns` spells it. Never fails: what it
    /// cannot read exactly is [`Type::Unsupported`].
    pub fn parse(text: &str) -> Type {
        let mut p = Parser {
            s: text.as_bytes(),
            i: 0,
        };
        match p.ty(0) {
            Some(t) if p.at_end() => t,
            _ => Type::Unsupported(text.to_string()),
        }
    }

    /// Whether any part of the type is [`Type::Unsupported`].
    pub fn is_supported(&self) -> bool {
        match self {
            Type::Unsupported(_) => false,
            Type::Nullable(t) | Type::Array(t) => t.is_supported(),
            Type::Map(k, v) => k.is_supported() && v.is_supported(),
            Type::Tuple(ts) => ts.iter().all(|(_, t)| t.is_supported()),
            _ => true,
        }
    }

    /// Whether the value ClickHouse fills in for a missing field (the
    /// type's default: an `Enum`'s smallest value) is the value a
    /// RowBinaryWithDefaults "use the default" flag gives a column without
    /// a DEFAULT expression (the column's zero: 0 for an `Enum` too). They
    /// differ only for an `Enum` whose smallest value is not 0, alone or in
    /// a `Tuple`; under `Nullable`, `Array` or `Map` both are NULL or empty.
    pub(crate) fn defaults_agree(&self) -> bool {
        match self {
            Type::Enum { values, .. } => enum_min(values) == 0,
            Type::Tuple(ts) => ts.iter().all(|(_, t)| t.defaults_agree()),
            _ => true,
        }
    }
}

/// The smallest value of an enum (its type default).
pub(crate) fn enum_min(values: &[(Vec<u8>, i16)]) -> i16 {
    values.iter().map(|v| v.1).min().unwrap_or(0)
}

impl fmt::Display for Type {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Type::Int { bits, signed } => write!(f, "{}Int{bits}", if *signed { "" } else { "U" }),
            Type::Float32 => f.write_str("Float32"),
            Type::Float64 => f.write_str("Float64"),
            Type::Bool => f.write_str("Bool"),
            Type::String => f.write_str("String"),
            Type::FixedString(n) => write!(f, "FixedString({n})"),
            Type::Decimal { precision, scale } => write!(f, "Decimal({precision}, {scale})"),
            Type::Date => f.write_str("Date"),
            Type::Date32 => f.write_str("Date32"),
            Type::DateTime(None) => f.write_str("DateTime"),
            Type::DateTime(Some(tz)) => write!(f, "DateTime('{tz}')"),
            Type::DateTime64 {
                precision,
                tz: None,
            } => write!(f, "DateTime64({precision})"),
            Type::DateTime64 {
                precision,
                tz: Some(tz),
            } => write!(f, "DateTime64({precision}, '{tz}')"),
            Type::Uuid => f.write_str("UUID"),
            Type::Ipv4 => f.write_str("IPv4"),
            Type::Ipv6 => f.write_str("IPv6"),
            Type::Enum { wide, values } => {
                write!(f, "Enum{}(", if *wide { 16 } else { 8 })?;
                for (i, (name, v)) in values.iter().enumerate() {
                    let sep = if i > 0 { ", " } else { "" };
                    write!(f, "{sep}'{}' = {v}", String::from_utf8_lossy(name))?;
                }
                f.write_str(")")
            }
            Type::Nullable(t) => write!(f, "Nullable({t})"),
            Type::Array(t) => write!(f, "Array({t})"),
            Type::Map(k, v) => write!(f, "Map({k}, {v})"),
            Type::Tuple(ts) => {
                f.write_str("Tuple(")?;
                for (i, (name, t)) in ts.iter().enumerate() {
                    let sep = if i > 0 { ", " } else { "" };
                    match name {
                        Some(n) => write!(f, "{sep}{n} {t}")?,
                        None => write!(f, "{sep}{t}")?,
                    }
                }
                f.write_str(")")
            }
            Type::Unsupported(s) => f.write_str(s),
        }
    }
}

/// How deep types may nest before the parser gives up (`Unsupported`).
const MAX_NESTING: usize = 32;

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl<'a> Parser<'a> {
    fn ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }

    fn at_end(&mut self) -> bool {
        self.ws();
        self.i == self.s.len()
    }

    fn eat(&mut self, b: u8) -> bool {
        self.ws();
        if self.s.get(self.i) == Some(&b) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, b: u8) -> Option<()> {
        self.eat(b).then_some(())
    }

    /// A bare identifier (letters, digits, `_`).
    fn ident(&mut self) -> Option<&'a str> {
        self.ws();
        let start = self.i;
        while self.i < self.s.len()
            && (self.s[self.i].is_ascii_alphanumeric() || self.s[self.i] == b'_')
        {
            self.i += 1;
        }
        if self.i == start || self.s[start].is_ascii_digit() {
            return None;
        }
        std::str::from_utf8(&self.s[start..self.i]).ok()
    }

    /// An unsigned decimal number.
    fn number(&mut self) -> Option<u64> {
        self.ws();
        let start = self.i;
        while self.i < self.s.len() && self.s[self.i].is_ascii_digit() {
            self.i += 1;
        }
        std::str::from_utf8(&self.s[start..self.i])
            .ok()?
            .parse()
            .ok()
    }

    /// A signed decimal number.
    fn signed(&mut self) -> Option<i64> {
        let neg = self.eat(b'-');
        let n = i64::try_from(self.number()?).ok()?;
        Some(if neg { -n } else { n })
    }

    /// A single-quoted string. Only `\'` and `\\` escapes are read; any
    /// other escape makes the type unsupported.
    fn quoted(&mut self) -> Option<Vec<u8>> {
        self.ws();
        if self.s.get(self.i) != Some(&b'\'') {
            return None;
        }
        self.i += 1;
        let mut out = Vec::new();
        loop {
            match *self.s.get(self.i)? {
                b'\'' => {
                    self.i += 1;
                    return Some(out);
                }
                b'\\' => {
                    let c = *self.s.get(self.i + 1)?;
                    if c != b'\'' && c != b'\\' {
                        return None;
                    }
                    out.push(c);
                    self.i += 2;
                }
                c => {
                    out.push(c);
                    self.i += 1;
                }
            }
        }
    }

    /// A time zone argument: a quoted name of plain characters.
    fn tz(&mut self) -> Option<String> {
        let tz = String::from_utf8(self.quoted()?).ok()?;
        tz.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/_+-".contains(&b))
            .then_some(tz)
    }

    /// A tuple element's name: an identifier or a back-quoted name (only
    /// plain ones; a name that needs escapes is unsupported).
    fn element_name(&mut self) -> Option<String> {
        self.ws();
        if self.s.get(self.i) == Some(&b'`') {
            let start = self.i + 1;
            let len = self.s[start..].iter().position(|&b| b == b'`')?;
            let name = &self.s[start..start + len];
            if name.contains(&b'\\') {
                return None;
            }
            self.i = start + len + 1;
            return String::from_utf8(name.to_vec()).ok();
        }
        self.ident().map(str::to_string)
    }

    fn ty(&mut self, depth: usize) -> Option<Type> {
        if depth > MAX_NESTING {
            return None;
        }
        let start = self.i;
        let name = self.ident()?;
        let int = |bits, signed| Some(Type::Int { bits, signed });
        let simple = match name {
            "Int8" => int(8, true),
            "Int16" => int(16, true),
            "Int32" => int(32, true),
            "Int64" => int(64, true),
            "Int128" => int(128, true),
            "Int256" => int(256, true),
            "UInt8" => int(8, false),
            "UInt16" => int(16, false),
            "UInt32" => int(32, false),
            "UInt64" => int(64, false),
            "UInt128" => int(128, false),
            "UInt256" => int(256, false),
            "Float32" => Some(Type::Float32),
            "Float64" => Some(Type::Float64),
            "Bool" => Some(Type::Bool),
            "String" => Some(Type::String),
            "Date" => Some(Type::Date),
            "Date32" => Some(Type::Date32),
            "UUID" => Some(Type::Uuid),
            "IPv4" => Some(Type::Ipv4),
            "IPv6" => Some(Type::Ipv6),
            _ => None,
        };
        if let Some(t) = simple {
            return Some(t);
        }
        let t = match name {
            "DateTime" => {
                if self.eat(b'(') {
                    let tz = self.tz()?;
                    self.expect(b')')?;
                    Type::DateTime(Some(tz))
                } else {
                    Type::DateTime(None)
                }
            }
            "DateTime64" => {
                self.expect(b'(')?;
                let precision = u8::try_from(self.number()?).ok().filter(|p| *p <= 9)?;
                let tz = if self.eat(b',') {
                    Some(self.tz()?)
                } else {
                    None
                };
                self.expect(b')')?;
                Type::DateTime64 { precision, tz }
            }
            "FixedString" => {
                self.expect(b'(')?;
                let n = usize::try_from(self.number()?).ok().filter(|n| *n > 0)?;
                self.expect(b')')?;
                Type::FixedString(n)
            }
            "Decimal" => {
                self.expect(b'(')?;
                let precision = u8::try_from(self.number()?).ok()?;
                let scale = if self.eat(b',') {
                    u8::try_from(self.number()?).ok()?
                } else {
                    0
                };
                self.expect(b')')?;
                decimal(precision, scale)?
            }
            "Decimal32" | "Decimal64" | "Decimal128" | "Decimal256" => {
                let precision = match name {
                    "Decimal32" => 9,
                    "Decimal64" => 18,
                    "Decimal128" => 38,
                    _ => 76,
                };
                self.expect(b'(')?;
                let scale = u8::try_from(self.number()?).ok()?;
                self.expect(b')')?;
                decimal(precision, scale)?
            }
            "Enum8" | "Enum16" => {
                let wide = name == "Enum16";
                self.expect(b'(')?;
                let mut values: Vec<(Vec<u8>, i16)> = Vec::new();
                loop {
                    let label = self.quoted()?;
                    self.expect(b'=')?;
                    let v = self.signed()?;
                    let v = if wide {
                        i16::try_from(v).ok()?
                    } else {
                        i16::from(i8::try_from(v).ok()?)
                    };
                    if values.iter().any(|(n, x)| *n == label || *x == v) {
                        return None;
                    }
                    values.push((label, v));
                    if !self.eat(b',') {
                        break;
                    }
                }
                self.expect(b')')?;
                Type::Enum { wide, values }
            }
            "LowCardinality" => {
                self.expect(b'(')?;
                let t = self.ty(depth + 1)?;
                self.expect(b')')?;
                t
            }
            "Nullable" => {
                self.expect(b'(')?;
                let t = self.ty(depth + 1)?;
                self.expect(b')')?;
                // Nullable(Nullable(T)) and Nullable(Array(T)) do not exist.
                match t {
                    Type::Nullable(_) | Type::Array(_) | Type::Map(..) | Type::Tuple(_) => {
                        return None
                    }
                    t => Type::Nullable(Box::new(t)),
                }
            }
            "Array" => {
                self.expect(b'(')?;
                let t = self.ty(depth + 1)?;
                self.expect(b')')?;
                Type::Array(Box::new(t))
            }
            "Map" => {
                self.expect(b'(')?;
                let k = self.ty(depth + 1)?;
                self.expect(b',')?;
                let v = self.ty(depth + 1)?;
                self.expect(b')')?;
                Type::Map(Box::new(k), Box::new(v))
            }
            "Tuple" => {
                self.expect(b'(')?;
                let mut elems = Vec::new();
                loop {
                    elems.push(self.element(depth)?);
                    if !self.eat(b',') {
                        break;
                    }
                }
                self.expect(b')')?;
                let named = elems.iter().filter(|e| e.0.is_some()).count();
                if named != 0 && named != elems.len() {
                    return None;
                }
                Type::Tuple(elems)
            }
            _ => {
                // Not a type this encoder knows: keep its text whole so the
                // column says what it is.
                self.i = start;
                return None;
            }
        };
        Some(t)
    }

    /// One tuple element: `T` or `name T`.
    fn element(&mut self, depth: usize) -> Option<(Option<String>, Type)> {
        let at = self.i;
        // `name T`: a name followed by a type that starts with a letter.
        if let Some(name) = self.element_name() {
            let after = self.i;
            self.ws();
            let next = self.s.get(self.i).copied();
            if next.is_some_and(|b| b.is_ascii_alphabetic()) {
                let t = self.ty(depth + 1)?;
                return Some((Some(name), t));
            }
            self.i = after;
        }
        self.i = at;
        Some((None, self.ty(depth + 1)?))
    }
}

/// A decimal type when its precision and scale are ones ClickHouse allows.
fn decimal(precision: u8, scale: u8) -> Option<Type> {
    ((1..=76).contains(&precision) && scale <= precision)
        .then_some(Type::Decimal { precision, scale })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Type {
        Type::parse(s)
    }

    #[test]
    fn scalars() {
        assert_eq!(
            t("Int8"),
            Type::Int {
                bits: 8,
                signed: true
            }
        );
        assert_eq!(
            t("UInt256"),
            Type::Int {
                bits: 256,
                signed: false
            }
        );
        assert_eq!(t("Float32"), Type::Float32);
        assert_eq!(t("FixedString(16)"), Type::FixedString(16));
        assert_eq!(
            t("Decimal(9, 2)"),
            Type::Decimal {
                precision: 9,
                scale: 2
            }
        );
        assert_eq!(
            t("Decimal32(3)"),
            Type::Decimal {
                precision: 9,
                scale: 3
            }
        );
        assert_eq!(
            t("Decimal256(40)"),
            Type::Decimal {
                precision: 76,
                scale: 40
            }
        );
        assert_eq!(
            t("Decimal(10)"),
            Type::Decimal {
                precision: 10,
                scale: 0
            }
        );
        assert_eq!(t("DateTime"), Type::DateTime(None));
        assert_eq!(
            t("DateTime('Europe/Moscow')"),
            Type::DateTime(Some("Europe/Moscow".into()))
        );
        assert_eq!(
            t("DateTime64(3, 'UTC')"),
            Type::DateTime64 {
                precision: 3,
                tz: Some("UTC".into())
            }
        );
        assert_eq!(
            t("DateTime64(9)"),
            Type::DateTime64 {
                precision: 9,
                tz: None
            }
        );
        assert_eq!(t("LowCardinality(String)"), Type::String);
    }

    #[test]
    fn enums_read_their_quoted_names() {
        let e = t("Enum8('a' = 1, 'b\\'c' = -2, '' = 3, 'x\\\\' = 4)");
        let Type::Enum {
            wide: false,
            values,
        } = e
        else {
            panic!("{e:?}")
        };
        assert_eq!(values[0], (b"a".to_vec(), 1));
        assert_eq!(values[1], (b"b'c".to_vec(), -2));
        assert_eq!(values[2], (b"".to_vec(), 3));
        assert_eq!(values[3], (b"x\\".to_vec(), 4));
        assert!(matches!(
            t("Enum16('x' = 1000)"),
            Type::Enum { wide: true, .. }
        ));
        // Out of Enum8's range, or an escape not read exactly.
        assert!(!t("Enum8('x' = 200)").is_supported());
        assert!(!t("Enum8('x\\n' = 1)").is_supported());
    }

    #[test]
    fn composites() {
        assert_eq!(
            t("Map(LowCardinality(String), Array(Nullable(Int32)))"),
            Type::Map(
                Box::new(Type::String),
                Box::new(Type::Array(Box::new(Type::Nullable(Box::new(Type::Int {
                    bits: 32,
                    signed: true
                })))))
            )
        );
        assert_eq!(
            t("Tuple(a Int32, `b c` String)"),
            Type::Tuple(vec![
                (
                    Some("a".into()),
                    Type::Int {
                        bits: 32,
                        signed: true
                    }
                ),
                (Some("b c".into()), Type::String),
            ])
        );
        assert_eq!(
            t("Tuple(Int32, String)"),
            Type::Tuple(vec![
                (
                    None,
                    Type::Int {
                        bits: 32,
                        signed: true
                    }
                ),
                (None, Type::String)
            ])
        );
        // An element named like a type.
        assert_eq!(
            t("Tuple(String String)"),
            Type::Tuple(vec![(Some("String".into()), Type::String)])
        );
    }

    #[test]
    fn what_it_does_not_know_is_unsupported() {
        for s in [
            "JSON",
            "Variant(String, UInt64)",
            "Dynamic",
            "Object('json')",
            "AggregateFunction(sum, UInt64)",
            "SimpleAggregateFunction(sum, UInt64)",
            "Point",
            "Time",
            "Time64(3)",
            "BFloat16",
            "Nested(a Int32)",
            "Array(JSON)",
            "Nullable(Array(Int32))",
            "Int32 garbage",
            "Decimal(77, 2)",
            "Decimal(9, 10)",
            "DateTime64(10)",
            "FixedString(0)",
            "Tuple(a Int32, String)",
        ] {
            assert!(!t(s).is_supported(), "{s}");
        }
        assert_eq!(t("Array(JSON)"), Type::Unsupported("Array(JSON)".into()));
    }

    #[test]
    fn display_reads_back() {
        for s in [
            "Map(String, Array(Nullable(Int32)))",
            "Tuple(a Int32, b Decimal(18, 4))",
            "DateTime64(6, 'Asia/Tokyo')",
            "Enum8('a' = 1, 'b' = -2)",
        ] {
            assert_eq!(t(s).to_string(), s);
            assert_eq!(t(&t(s).to_string()), t(s));
        }
    }

    #[test]
    fn defaults_differ_only_for_enums_without_zero() {
        assert!(t("Enum8('a' = 0, 'b' = 1)").defaults_agree());
        assert!(!t("Enum8('a' = 5, 'b' = 2)").defaults_agree());
        assert!(!t("Tuple(Int8, Enum8('a' = 5))").defaults_agree());
        assert!(t("Nullable(Enum8('a' = 5))").defaults_agree());
        assert!(t("Array(Enum8('a' = 5))").defaults_agree());
    }
}
