//! One JSON value → its RowBinary encoding, type by type, as ClickHouse's
//! JSONEachRow would have read it (with [`InputSettings`]), or a
//! [`Fallback`].
//!
//! Each rule below was checked against the engine (chDB 26.9) by
//! `tests/binary_vs_json.rs`; the notes say what the engine does that is
//! not obvious, and which of those the encoder leaves to the JSON path.

use super::addr::{ipv4, uuid};
use super::json::{fb, number_text, Cursor, Num, Text, R};
use super::num::{decimal, decimal_bits, fit, magnitude, write_le};
use super::settings::{DateTimeInput, InputSettings};
use super::time::{date, datetime, frac_ticks, Forms};
use super::types::{enum_min, Type};
use super::Fallback;
use std::net::Ipv6Addr;

/// What encoding a row needs besides the row: the settings and a buffer
/// for unescaped strings.
pub(crate) struct Ctx<'s> {
    pub settings: &'s InputSettings,
    pub scratch: Vec<u8>,
}

/// The range of a `Date`, in days (1970-01-01 to 2149-06-06); JSONEachRow
/// clamps a date outside it and wraps a number past it.
const DATE_DAYS: (i64, i64) = (0, 65_535);
/// The range of a `Date32` read here (1900-01-01 to 2299-12-31).
const DATE32_DAYS: (i64, i64) = (-25_567, 120_529);
/// The range of a `DateTime64` read here, in seconds (1900-01-01
/// 00:00:00 to 2299-12-31 23:59:59 and its fraction).
const DT64_SECS: (i64, i64) = (-2_208_988_800, 10_413_791_999);

/// Writes a RowBinary length.
pub(crate) fn varint(mut n: u64, out: &mut Vec<u8>) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

/// Inserts the length `n` at `at`, before what was written since.
fn varint_at(n: u64, at: usize, out: &mut Vec<u8>) {
    let mut buf = Vec::with_capacity(10);
    varint(n, &mut buf);
    out.splice(at..at, buf);
}

/// A value inside an array, a map or a tuple: `null` is NULL in a
/// Nullable, else the column's zero (JSONEachRow inserts the column's
/// default there, `[null]` into `Array(Int32)` is `[0]`).
pub(crate) fn nested(ty: &Type, cur: &mut Cursor, out: &mut Vec<u8>, cx: &mut Ctx) -> R<()> {
    if cur.null()? {
        if let Type::Nullable(_) = ty {
            out.push(1);
            return Ok(());
        }
        if !cx.settings.null_as_default {
            return fb("null where the type is not Nullable");
        }
        return column_default(ty, out);
    }
    value(ty, cur, out, cx)
}

/// The zero a column takes by itself (`IColumn::insertDefault`): what a
/// RowBinaryWithDefaults "default" flag gives a column without a DEFAULT
/// expression, and what JSONEachRow puts for `null` in a composite or for
/// a named tuple's missing element. An `Enum`'s is 0 even when 0 names no
/// element: RowBinary on 26.9 takes that 0 and stores what JSONEachRow
/// stores, but the encoder falls back rather than write a value the type
/// does not name.
pub(crate) fn column_default(ty: &Type, out: &mut Vec<u8>) -> R<()> {
    match ty {
        Type::Enum { wide, values } => {
            if !values.iter().any(|v| v.1 == 0) {
                return fb("the zero of an Enum without a 0 element");
            }
            out.extend_from_slice(if *wide { &[0, 0][..] } else { &[0] });
        }
        Type::Tuple(elems) => {
            for (_, t) in elems {
                column_default(t, out)?;
            }
        }
        t => zero(t, out)?,
    }
    Ok(())
}

/// The type's default (`IDataType::getDefault`): what JSONEachRow puts in
/// a column without a DEFAULT expression when its field is missing. The
/// same as [`column_default`] except for an `Enum`, whose default is its
/// smallest value.
pub(crate) fn type_default(ty: &Type, out: &mut Vec<u8>) -> R<()> {
    match ty {
        Type::Enum { wide, values } => write_enum(*wide, enum_min(values), out),
        Type::Tuple(elems) => {
            for (_, t) in elems {
                type_default(t, out)?;
            }
        }
        t => zero(t, out)?,
    }
    Ok(())
}

/// The all-zero value of a type that has one.
fn zero(ty: &Type, out: &mut Vec<u8>) -> R<()> {
    let n = match ty {
        Type::Int { bits, .. } => usize::from(*bits) / 8,
        Type::Float32 | Type::Date32 | Type::DateTime(_) | Type::Ipv4 => 4,
        Type::Float64 | Type::DateTime64 { .. } => 8,
        Type::Date => 2,
        Type::Bool => 1,
        // An empty string, array or map: a zero length.
        Type::String | Type::Array(_) | Type::Map(..) => 1,
        Type::FixedString(n) => *n,
        Type::Decimal { precision, .. } => usize::from(decimal_bits(*precision)) / 8,
        Type::Uuid | Type::Ipv6 => 16,
        Type::Nullable(_) => {
            out.push(1);
            return Ok(());
        }
        Type::Enum { .. } | Type::Tuple(_) => return column_default(ty, out),
        Type::Unsupported(_) => return fb("an unsupported type"),
    };
    out.resize(out.len() + n, 0);
    Ok(())
}

fn write_enum(wide: bool, v: i16, out: &mut Vec<u8>) {
    if wide {
        out.extend_from_slice(&v.to_le_bytes());
    } else {
        out.push(v as i8 as u8);
    }
}

/// A value that is not `null`.
pub(crate) fn value(ty: &Type, cur: &mut Cursor, out: &mut Vec<u8>, cx: &mut Ctx) -> R<()> {
    let s = cx.settings;
    match ty {
        Type::Nullable(t) => {
            out.push(0);
            value(t, cur, out, cx)
        }
        Type::Int { bits, signed } => {
            // A quoted integer reads as the integer; `true` and `false` as 1
            // and 0 (`input_format_json_read_bools_as_numbers`). `1.0`,
            // `1e2` and `""` (0) are left to the JSON path.
            let n = match cur.peek()? {
                b'"' => {
                    number_text(cur.plain_string()?).ok_or(Fallback::new("text into an integer"))?
                }
                b't' | b'f' => return bool_number(cur, usize::from(*bits) / 8, s, out),
                _ => cur.number()?,
            };
            if !n.is_int() {
                return fb("a fraction or exponent into an integer");
            }
            let mag = magnitude(n.int).ok_or(Fallback::new("an integer out of range"))?;
            let v =
                fit(n.neg, mag, *bits, *signed).ok_or(Fallback::new("an integer out of range"))?;
            write_le(&v, *bits, out);
            Ok(())
        }
        Type::Float32 | Type::Float64 => float(ty == &Type::Float32, cur, out, s),
        Type::Bool => match cur.peek()? {
            b't' => {
                cur.literal(b"true")?;
                out.push(1);
                Ok(())
            }
            b'f' => {
                cur.literal(b"false")?;
                out.push(0);
                Ok(())
            }
            // `0` and `1` are false and true; anything else is refused.
            b'0' | b'1' => match cur.number()?.raw {
                b"0" => {
                    out.push(0);
                    Ok(())
                }
                b"1" => {
                    out.push(1);
                    Ok(())
                }
                _ => fb("a number other than 0 or 1 into a Bool"),
            },
            _ => fb("not a boolean"),
        },
        Type::String => string(cur, out, cx),
        Type::FixedString(n) => {
            let t = cur.string(&mut cx.scratch)?;
            let bytes = t.get(&cx.scratch);
            // Shorter: zeros after it; longer: refused.
            if bytes.len() > *n {
                return fb("a string longer than its FixedString");
            }
            if bytes.is_empty() && s.empty_as_default {
                return fb("an empty string under input_format_json_empty_as_default");
            }
            out.extend_from_slice(bytes);
            out.resize(out.len() + n - bytes.len(), 0);
            Ok(())
        }
        Type::Decimal { precision, scale } => {
            // The digits past the scale are cut off (toward zero); an
            // exponent is read too, with limits of its own: left to JSON.
            let n = match cur.peek()? {
                b'"' => {
                    number_text(cur.plain_string()?).ok_or(Fallback::new("text into a Decimal"))?
                }
                _ => cur.number()?,
            };
            if n.exp {
                return fb("an exponent into a Decimal");
            }
            let v = decimal(n.neg, n.int, n.frac, *precision, *scale)
                .ok_or(Fallback::new("a Decimal out of range"))?;
            write_le(&v, decimal_bits(*precision), out);
            Ok(())
        }
        Type::Date | Type::Date32 => {
            // `date_time_input_format` does not change how a date reads.
            // A number is a count of days (a `Date` wraps it at 65,536).
            let (lo, hi) = if ty == &Type::Date {
                DATE_DAYS
            } else {
                DATE32_DAYS
            };
            let days = match cur.peek()? {
                b'"' => date(cur.plain_string()?)
                    .ok_or(Fallback::new("a date in a form not read here"))?,
                _ => {
                    let n = cur.number()?;
                    // `-0` into a `Date` is refused (it reads a UInt16).
                    if n.neg && ty == &Type::Date {
                        return fb("a negative number into a Date");
                    }
                    whole(&n).ok_or(Fallback::new("a date number not read here"))?
                }
            };
            if days < lo || days > hi {
                return fb("a date out of range");
            }
            if ty == &Type::Date {
                out.extend_from_slice(&(days as u16).to_le_bytes());
            } else {
                out.extend_from_slice(&(days as i32).to_le_bytes());
            }
            Ok(())
        }
        Type::DateTime(tz) => {
            // Text outside the range is clamped to it: left to JSON.
            let secs = match cur.peek()? {
                b'"' => {
                    let best = s.date_time_input_format == DateTimeInput::BestEffort;
                    let forms = Forms {
                        fraction: best,
                        offset: best,
                    };
                    let st = datetime(cur.plain_string()?, forms)
                        .ok_or(Fallback::new("a time in a form not read here"))?;
                    if !st.offset && !s.utc(tz.as_deref()) {
                        return fb("a local time in a zone other than UTC");
                    }
                    st.secs
                }
                // A number is seconds since the epoch (a negative one is
                // clamped to 0: left to JSON).
                _ => {
                    let n = cur.number()?;
                    if n.neg {
                        return fb("a negative number into a DateTime");
                    }
                    whole(&n).ok_or(Fallback::new("a time number not read here"))?
                }
            };
            let secs = u32::try_from(secs).map_err(|_| Fallback::new("a time out of range"))?;
            out.extend_from_slice(&secs.to_le_bytes());
            Ok(())
        }
        Type::DateTime64 { precision, tz } => {
            let ticks = datetime64(*precision, tz.as_deref(), cur, s)?;
            out.extend_from_slice(&ticks.to_le_bytes());
            Ok(())
        }
        Type::Uuid => {
            let v =
                uuid(cur.plain_string()?).ok_or(Fallback::new("a UUID in a form not read here"))?;
            out.extend_from_slice(
                &u64::from_be_bytes(v[..8].try_into().unwrap_or_default()).to_le_bytes(),
            );
            out.extend_from_slice(
                &u64::from_be_bytes(v[8..].try_into().unwrap_or_default()).to_le_bytes(),
            );
            Ok(())
        }
        Type::Ipv4 => {
            let v = ipv4(cur.plain_string()?)
                .ok_or(Fallback::new("an IPv4 in a form not read here"))?;
            out.extend_from_slice(&v.to_le_bytes());
            Ok(())
        }
        Type::Ipv6 => {
            let text = cur.plain_string()?;
            // An IPv4 address reads as its IPv4-mapped IPv6 one.
            let v = match ipv4(text) {
                Some(v4) => std::net::Ipv4Addr::from(v4).to_ipv6_mapped(),
                None => std::str::from_utf8(text)
                    .ok()
                    .and_then(|t| t.parse::<Ipv6Addr>().ok())
                    .ok_or(Fallback::new("an IPv6 in a form not read here"))?,
            };
            out.extend_from_slice(&v.octets());
            Ok(())
        }
        Type::Enum { wide, values } => {
            // A name, or a number that is an element's value. A quoted
            // number that names nothing reads as that number: left to JSON.
            let v = match cur.peek()? {
                b'"' => {
                    let name = cur.plain_string()?;
                    values
                        .iter()
                        .find(|(n, _)| n == name)
                        .map(|e| e.1)
                        .ok_or(Fallback::new("a name that is no element of the Enum"))?
                }
                _ => {
                    let n = cur.number()?;
                    let v = whole(&n)
                        .and_then(|v| i16::try_from(v).ok())
                        .ok_or(Fallback::new("a number into an Enum"))?;
                    values
                        .iter()
                        .find(|e| e.1 == v)
                        .map(|e| e.1)
                        .ok_or(Fallback::new("a number that is no element of the Enum"))?
                }
            };
            write_enum(*wide, v, out);
            Ok(())
        }
        Type::Array(t) => {
            cur.expect(b'[')?;
            cur.enter()?;
            let at = out.len();
            let mut n = 0u64;
            if !cur.eat(b']')? {
                loop {
                    nested(t, cur, out, cx)?;
                    n += 1;
                    if !cur.eat(b',')? {
                        break;
                    }
                }
                cur.expect(b']')?;
            }
            cur.leave();
            check_array(n, s)?;
            varint_at(n, at, out);
            Ok(())
        }
        Type::Map(k, v) => {
            // A JSON object; a key read as the key type; a key given twice
            // is kept twice, as JSONEachRow keeps it.
            cur.expect(b'{')?;
            if s.map_as_array_of_tuples {
                return fb("input_format_json_map_as_array_of_tuples is on");
            }
            cur.enter()?;
            let at = out.len();
            let mut n = 0u64;
            if !cur.eat(b'}')? {
                loop {
                    map_key(k, cur, out, cx)?;
                    cur.expect(b':')?;
                    nested(v, cur, out, cx)?;
                    n += 1;
                    if !cur.eat(b',')? {
                        break;
                    }
                }
                cur.expect(b'}')?;
            }
            cur.leave();
            check_array(n, s)?;
            varint_at(n, at, out);
            Ok(())
        }
        Type::Tuple(elems) => tuple(elems, cur, out, cx),
        Type::Unsupported(_) => fb("an unsupported type"),
    }
}

/// `true` or `false` into a number column, as 1 or 0 in `width` bytes.
fn bool_number(cur: &mut Cursor, width: usize, s: &InputSettings, out: &mut Vec<u8>) -> R<()> {
    if !s.read_bools_as_numbers {
        return fb("a boolean into a number");
    }
    let one = cur.peek()? == b't';
    cur.literal(if one { b"true" } else { b"false" })?;
    out.push(u8::from(one));
    out.resize(out.len() + width - 1, 0);
    Ok(())
}

/// A JSON integer as an `i64`, or `None` (a fraction, an exponent, too big).
fn whole(n: &Num) -> Option<i64> {
    if !n.is_int() || n.int.len() > 19 {
        return None;
    }
    let v: i64 = std::str::from_utf8(n.int).ok()?.parse().ok()?;
    Some(if n.neg { -v } else { v })
}

fn check_array(n: u64, s: &InputSettings) -> R<()> {
    if s.binary_max_array_size != 0 && n > s.binary_max_array_size {
        return fb("an array longer than format_binary_max_array_size");
    }
    Ok(())
}

/// A float. Only under `precise_float_parsing`, whose reading is the
/// correctly rounded one Rust's `parse` makes (a `Float32` straight from
/// the text, not through a `Float64`: `1.00000005960464477539062501` is
/// `1.0000001`). A number too large is infinity; the strings `nan`,
/// `NaN`, `inf`, `-inf`, `Infinity`, `-Infinity` and quoted numbers read
/// too; `true` is 1.
fn float(f32_: bool, cur: &mut Cursor, out: &mut Vec<u8>, s: &InputSettings) -> R<()> {
    if !s.precise_float_parsing {
        return fb("floats without precise_float_parsing");
    }
    let text: &[u8] = match cur.peek()? {
        b'"' => {
            let t = cur.plain_string()?;
            let special = match t {
                b"nan" | b"NaN" => Some(f64::NAN),
                b"inf" | b"Infinity" => Some(f64::INFINITY),
                b"-inf" | b"-Infinity" => Some(f64::NEG_INFINITY),
                _ => None,
            };
            if let Some(x) = special {
                write_float(f32_, x, x as f32, out);
                return Ok(());
            }
            number_text(t)
                .ok_or(Fallback::new("text into a float"))?
                .raw
        }
        b't' | b'f' => return bool_number_float(cur, f32_, s, out),
        _ => cur.number()?.raw,
    };
    let text = std::str::from_utf8(text).map_err(|_| Fallback::new("not a number"))?;
    if f32_ {
        let x: f32 = text.parse().map_err(|_| Fallback::new("not a number"))?;
        out.extend_from_slice(&x.to_le_bytes());
    } else {
        let x: f64 = text.parse().map_err(|_| Fallback::new("not a number"))?;
        out.extend_from_slice(&x.to_le_bytes());
    }
    Ok(())
}

fn write_float(f32_: bool, x: f64, y: f32, out: &mut Vec<u8>) {
    if f32_ {
        out.extend_from_slice(&y.to_le_bytes());
    } else {
        out.extend_from_slice(&x.to_le_bytes());
    }
}

fn bool_number_float(cur: &mut Cursor, f32_: bool, s: &InputSettings, out: &mut Vec<u8>) -> R<()> {
    if !s.read_bools_as_numbers {
        return fb("a boolean into a number");
    }
    let one = cur.peek()? == b't';
    cur.literal(if one { b"true" } else { b"false" })?;
    let x = if one { 1.0 } else { 0.0 };
    write_float(f32_, x, x as f32, out);
    Ok(())
}

/// A `String`: a JSON string unescaped; a number, a boolean, an object or
/// an array as its own text, byte for byte as it stands in the row
/// (`1E+02` stays `1E+02`, `{"a": [1, 2] }` keeps its spaces and escapes),
/// each under its `input_format_json_read_*_as_strings`.
fn string(cur: &mut Cursor, out: &mut Vec<u8>, cx: &mut Ctx) -> R<()> {
    let s = cx.settings;
    let b = cur.peek()?;
    let bytes: &[u8] = match b {
        b'"' => {
            let t = cur.string(&mut cx.scratch)?;
            let bytes = match t {
                Text::Raw(r) => r,
                Text::Scratch => &cx.scratch[..],
            };
            if bytes.is_empty() && s.empty_as_default {
                return fb("an empty string under input_format_json_empty_as_default");
            }
            bytes
        }
        b'{' | b'[' => {
            let on = if b == b'{' {
                s.read_objects_as_strings
            } else {
                s.read_arrays_as_strings
            };
            if !on {
                return fb("an object or array into a String");
            }
            let (from, to) = cur.skip()?;
            &cur.s[from..to]
        }
        b't' | b'f' => {
            if !s.read_bools_as_strings {
                return fb("a boolean into a String");
            }
            let one = b == b't';
            cur.literal(if one { b"true" } else { b"false" })?;
            if one {
                b"true"
            } else {
                b"false"
            }
        }
        _ => {
            if !s.read_numbers_as_strings {
                return fb("a number into a String");
            }
            cur.number()?.raw
        }
    };
    if s.binary_max_string_size != 0 && bytes.len() as u64 > s.binary_max_string_size {
        return fb("a string longer than format_binary_max_string_size");
    }
    varint(bytes.len() as u64, out);
    out.extend_from_slice(bytes);
    Ok(())
}

/// A `DateTime64`'s ticks.
fn datetime64(precision: u8, tz: Option<&str>, cur: &mut Cursor, s: &InputSettings) -> R<i64> {
    let scale = 10i64.pow(u32::from(precision));
    let oor = || Fallback::new("a time out of range");
    let ticks = match cur.peek()? {
        b'"' => {
            // `basic` reads a fraction here too; only `best_effort` an offset.
            let forms = Forms {
                fraction: true,
                offset: s.date_time_input_format == DateTimeInput::BestEffort,
            };
            let st = datetime(cur.plain_string()?, forms)
                .ok_or(Fallback::new("a time in a form not read here"))?;
            if !st.offset && !s.utc(tz) {
                return fb("a local time in a zone other than UTC");
            }
            if st.secs < DT64_SECS.0 || st.secs > DT64_SECS.1 {
                return Err(oor());
            }
            st.secs
                .checked_mul(scale)
                .and_then(|t| t.checked_add(frac_ticks(st.frac, precision)))
                .ok_or_else(oor)?
        }
        _ => {
            let n = cur.number()?;
            if n.exp {
                return fb("an exponent into a DateTime64");
            }
            match s.datetime_number_as_raw {
                // Before 26.8 (or with the setting on) an integer is ticks.
                Some(true) => {
                    let t = whole(&n).ok_or(Fallback::new("a time number not read here"))?;
                    let secs = t.div_euclid(scale);
                    if secs < DT64_SECS.0 || secs > DT64_SECS.1 {
                        return Err(oor());
                    }
                    t
                }
                // Seconds, and a fraction of them, cut to the precision
                // (`-1.5` is -1,500 ms: the sign covers the fraction too).
                Some(false) => {
                    if n.int.len() > 12 {
                        return Err(oor());
                    }
                    let secs: i64 = std::str::from_utf8(n.int)
                        .ok()
                        .and_then(|t| t.parse().ok())
                        .ok_or_else(oor)?;
                    let secs = if n.neg { -secs } else { secs };
                    if secs < DT64_SECS.0 || secs > DT64_SECS.1 {
                        return Err(oor());
                    }
                    let t = (secs.abs())
                        .checked_mul(scale)
                        .and_then(|t| t.checked_add(frac_ticks(n.frac, precision)))
                        .ok_or_else(oor)?;
                    if n.neg {
                        -t
                    } else {
                        t
                    }
                }
                None => return fb("a number into a DateTime64 on a server without input_format_read_datetime_number_as_raw_value"),
            }
        }
    };
    Ok(ticks)
}

/// A map's key, read from the JSON key's text as the key type.
fn map_key(k: &Type, cur: &mut Cursor, out: &mut Vec<u8>, cx: &mut Ctx) -> R<()> {
    match k {
        Type::String => {
            let t = cur.string(&mut cx.scratch)?;
            let bytes = t.get(&cx.scratch);
            varint(bytes.len() as u64, out);
            out.extend_from_slice(bytes);
            Ok(())
        }
        Type::Int { bits, signed } => {
            let n = number_text(cur.plain_string()?)
                .ok_or(Fallback::new("a map key that is not an integer"))?;
            if !n.is_int() {
                return fb("a map key that is not an integer");
            }
            let mag = magnitude(n.int).ok_or(Fallback::new("a map key out of range"))?;
            let v =
                fit(n.neg, mag, *bits, *signed).ok_or(Fallback::new("a map key out of range"))?;
            write_le(&v, *bits, out);
            Ok(())
        }
        _ => fb("a map key type not read here"),
    }
}

/// A tuple: a JSON array of exactly its elements, or for a named tuple an
/// object (`input_format_json_named_tuples_as_objects`) whose keys name
/// them: in any order, a missing one as its column's zero, an unknown one
/// skipped, a key given twice refused, a key with an escape not unescaped
/// (left to JSON).
fn tuple(
    elems: &[(Option<String>, Type)],
    cur: &mut Cursor,
    out: &mut Vec<u8>,
    cx: &mut Ctx,
) -> R<()> {
    let s = cx.settings;
    let named = elems.first().is_some_and(|e| e.0.is_some());
    if !named {
        cur.expect(b'[')?;
        cur.enter()?;
        for (i, (_, t)) in elems.iter().enumerate() {
            if i > 0 {
                cur.expect(b',')?;
            }
            nested(t, cur, out, cx)?;
        }
        cur.expect(b']')?;
        cur.leave();
        return Ok(());
    }
    if !s.named_tuples_as_objects {
        return fb("a named tuple without input_format_json_named_tuples_as_objects");
    }
    cur.expect(b'{')?;
    cur.enter()?;
    let mut spans: Vec<Option<(usize, usize)>> = vec![None; elems.len()];
    if !cur.eat(b'}')? {
        loop {
            // Unlike a row's keys and a map's, a named tuple's key is matched
            // as written: `{"\u0061":1}` is no `a` (it is skipped).
            let key = match cur.string(&mut cx.scratch)? {
                Text::Raw(key) => key,
                Text::Scratch => return fb("an escape in a named tuple's key"),
            };
            let at = elems
                .iter()
                .position(|e| e.0.as_deref().map(str::as_bytes) == Some(key));
            cur.expect(b':')?;
            match at {
                Some(i) => {
                    if spans[i].is_some() {
                        return fb("a named tuple's key given twice");
                    }
                    spans[i] = Some(cur.skip()?);
                }
                None => {
                    let near = !key.is_ascii()
                        || elems.iter().any(|e| {
                            e.0.as_deref().is_some_and(|n| {
                                !n.is_ascii() || n.as_bytes().eq_ignore_ascii_case(key)
                            })
                        });
                    if near || !s.ignore_unknown_keys_in_named_tuple {
                        return fb("a named tuple's key that is no element");
                    }
                    cur.skip()?;
                }
            }
            if !cur.eat(b',')? {
                break;
            }
        }
        cur.expect(b'}')?;
    }
    cur.leave();
    for ((_, t), span) in elems.iter().zip(spans) {
        match span {
            Some((from, to)) => {
                let mut sub = Cursor::at(&cur.s[..to], from);
                nested(t, &mut sub, out, cx)?;
            }
            None if s.defaults_for_missing_elements_in_named_tuple => column_default(t, out)?,
            None => return fb("a named tuple's element missing"),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints() {
        let v = |n| {
            let mut out = Vec::new();
            varint(n, &mut out);
            out
        };
        assert_eq!(v(0), [0]);
        assert_eq!(v(127), [127]);
        assert_eq!(v(128), [0x80, 1]);
        assert_eq!(v(300), [0xac, 2]);
    }
}
