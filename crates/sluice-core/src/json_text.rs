//! JSON text for the rows the registry formats' decoders write
//! ([`crate::avro`], [`crate::protobuf`]): one way to write a string and a
//! float as ClickHouse's `JSONEachRow` reads them.

use std::io::Write;

/// A JSON string of `bytes`: `"`, `\` and control characters escaped, every
/// other byte as it is (ClickHouse keeps bytes that are not UTF-8 as they
/// are).
pub(crate) fn string(out: &mut Vec<u8>, bytes: &[u8]) {
    out.push(b'"');
    for &b in bytes {
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            0..0x20 => write!(out, "\\u{b:04x}").expect("writing to a Vec"),
            _ => out.push(b),
        }
    }
    out.push(b'"');
}

/// A float: `finite` is its shortest exact text when it is finite; NaN and
/// ±∞ as the strings ClickHouse reads them from.
pub(crate) fn float(out: &mut Vec<u8>, x: f64, finite: Option<String>) {
    match finite {
        Some(text) => out.extend_from_slice(text.as_bytes()),
        None if x.is_nan() => out.extend_from_slice(b"\"nan\""),
        None if x > 0.0 => out.extend_from_slice(b"\"inf\""),
        None => out.extend_from_slice(b"\"-inf\""),
    }
}
