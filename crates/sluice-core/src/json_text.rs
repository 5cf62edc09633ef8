//! JSON text for the rows the registry formats' decoders write
//! ([`crate::avro`], [`crate::protobuf`]): one way to write a string and a
//! float as ClickHouse's `JSONEachRow` reads them, and the digits of
//! numbers and timestamps.

use std::io::Write;

/// A JSON string of `bytes`: `"`, `\` and control characters escaped, every
/// other byte as it is (ClickHouse keeps bytes that are not UTF-8 as they
/// are).
pub(crate) fn string(out: &mut Vec<u8>, bytes: &[u8]) {
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    let mut rest = bytes;
    // Runs of bytes that need no escape are copied whole.
    while let Some(at) = rest
        .iter()
        .position(|&b| b == b'"' || b == b'\\' || b < 0x20)
    {
        out.extend_from_slice(&rest[..at]);
        match rest[at] {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b => write!(out, "\\u{b:04x}").expect("writing to a Vec"),
        }
        rest = &rest[at + 1..];
    }
    out.extend_from_slice(rest);
    out.push(b'"');
}

/// A `float`: its shortest exact text; NaN and ±∞ as the strings
/// ClickHouse reads them from.
pub(crate) fn f32(out: &mut Vec<u8>, x: f32) {
    if x.is_finite() {
        write!(out, "{x}").expect("writing to a Vec");
    } else {
        not_finite(out, f64::from(x));
    }
}

/// A `double`, as [`f32`] writes a `float`.
pub(crate) fn f64(out: &mut Vec<u8>, x: f64) {
    if x.is_finite() {
        write!(out, "{x:?}").expect("writing to a Vec");
    } else {
        not_finite(out, x);
    }
}

fn not_finite(out: &mut Vec<u8>, x: f64) {
    out.extend_from_slice(match () {
        _ if x.is_nan() => b"\"nan\"",
        _ if x > 0.0 => b"\"inf\"",
        _ => b"\"-inf\"",
    });
}

/// An integer.
pub(crate) fn int(out: &mut Vec<u8>, n: impl itoa::Integer) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// `v` in `width` digits, zeros first (`v` has no more digits than that).
pub(crate) fn digits(out: &mut Vec<u8>, mut v: u64, width: usize) {
    let start = out.len();
    out.resize(start + width, b'0');
    for slot in out[start..].iter_mut().rev() {
        *slot = b'0' + (v % 10) as u8;
        v /= 10;
    }
}
