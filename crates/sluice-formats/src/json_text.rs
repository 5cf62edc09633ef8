//! JSON text for the rows the registry formats' decoders write
//! ([`crate::avro`], [`crate::protobuf`]): one way to write a string and a
//! float as ClickHouse's `JSONEachRow` reads them, and the digits of
//! numbers and timestamps.

use std::io::Write;
use std::ops::RangeInclusive;
use std::sync::LazyLock;

/// A JSON string of `bytes`: `"`, `\` and control characters escaped, every
/// other byte as it is (ClickHouse keeps bytes that are not UTF-8 as they
/// are).
pub(crate) fn string(out: &mut Vec<u8>, bytes: &[u8]) {
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    let mut rest = bytes;
    // Runs of bytes that need no escape are copied whole.
    while let Some(at) = needs_escape(rest) {
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

/// Where the first byte that [`string`] escapes is, eight bytes at a time.
fn needs_escape(bytes: &[u8]) -> Option<usize> {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    let escaped = |b: u8| b == b'"' || b == b'\\' || b < 0x20;
    let mut chunks = bytes.chunks_exact(8);
    for (i, chunk) in chunks.by_ref().enumerate() {
        let x = u64::from_ne_bytes(chunk.try_into().expect("eight bytes"));
        // A byte's high bit is set where it is below 0x20, or equal to `"`
        // or `\` (the classic "has a zero byte" test on x - 0x20 and on
        // x xor the quote); bytes with their own high bit set are masked.
        let zero = |v: u64| v.wrapping_sub(ONES) & !v & HIGHS;
        let below = x.wrapping_sub(ONES * 0x20) & !x & HIGHS;
        let hit = below | zero(x ^ (ONES * u64::from(b'"'))) | zero(x ^ (ONES * u64::from(b'\\')));
        if hit != 0 {
            if let Some(j) = chunk.iter().position(|&b| escaped(b)) {
                return Some(i * 8 + j);
            }
        }
    }
    let done = bytes.len() - chunks.remainder().len();
    chunks
        .remainder()
        .iter()
        .position(|&b| escaped(b))
        .map(|j| done + j)
}

/// A `float`: its shortest exact text; NaN and ±∞ as the strings
/// ClickHouse reads them from.
pub(crate) fn f32(out: &mut Vec<u8>, x: f32) {
    if x.is_finite() {
        out.extend_from_slice(zmij::Buffer::new().format_finite(x).as_bytes());
    } else {
        not_finite(out, f64::from(x));
    }
}

/// A `double`, as [`f32`] writes a `float`.
pub(crate) fn f64(out: &mut Vec<u8>, x: f64) {
    if x.is_finite() {
        out.extend_from_slice(zmij::Buffer::new().format_finite(x).as_bytes());
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

/// A quoted date and time, `secs` after the epoch and `frac` units of
/// `places` digits past it: `"2024-05-01T12:00:00.250Z"` in UTC, or
/// `"2024-05-01 12:00:00.250"` for a local time (`utc` false). False, and
/// nothing written, when no calendar reaches that far.
pub(crate) fn datetime(out: &mut Vec<u8>, secs: i64, frac: u64, places: usize, utc: bool) -> bool {
    // The instants chrono can name: the same range as before this was
    // written without it.
    static RANGE: LazyLock<RangeInclusive<i64>> = LazyLock::new(|| {
        let utc = |t: chrono::DateTime<chrono::Utc>| t.timestamp();
        utc(chrono::DateTime::<chrono::Utc>::MIN_UTC)
            ..=utc(chrono::DateTime::<chrono::Utc>::MAX_UTC)
    });
    if !RANGE.contains(&secs) {
        return false;
    }
    let (days, time) = (secs.div_euclid(86_400), secs.rem_euclid(86_400) as u32);
    let (year, month, day) = civil(days);
    let (hour, minute, second) = (time / 3600, time / 60 % 60, time % 60);
    out.push(b'"');
    if (0..10_000).contains(&year) {
        digits(out, year as u64, 4);
    } else {
        // chrono's way: a sign and at least five digits.
        write!(out, "{year:+05}").expect("writing to a Vec");
    }
    for (sep, v) in [
        (b'-', month),
        (b'-', day),
        (if utc { b'T' } else { b' ' }, hour),
        (b':', minute),
        (b':', second),
    ] {
        out.push(sep);
        digits(out, u64::from(v), 2);
    }
    out.push(b'.');
    digits(out, frac, places);
    out.extend_from_slice(if utc { b"Z\"" } else { b"\"" });
    true
}

/// The proleptic Gregorian (year, month, day) `days` after 1970-01-01
/// (Howard Hinnant's `civil_from_days`), for any `days` chrono accepts.
fn civil(days: i64) -> (i32, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097); // [0, 146096]
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365]
    let mp = (5 * doy + 2) / 153; // [0, 11], from March
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year as i32, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Datelike;
    use proptest::prelude::*;

    #[test]
    fn the_calendars_ends_are_chronos() {
        let min = chrono::DateTime::<chrono::Utc>::MIN_UTC.timestamp();
        let max = chrono::DateTime::<chrono::Utc>::MAX_UTC.timestamp();
        for secs in [
            min - 1,
            min,
            min + 86_399,
            -1,
            0,
            max - 86_400,
            max,
            max + 1,
        ] {
            let mut out = Vec::new();
            let named = chrono::DateTime::from_timestamp(secs, 0)
                .map(|at| format!("\"{}.0Z\"", at.format("%Y-%m-%dT%H:%M:%S")));
            let written =
                datetime(&mut out, secs, 0, 1, true).then(|| String::from_utf8(out).unwrap());
            assert_eq!(written, named, "{secs}");
        }
    }

    proptest! {
        #[test]
        fn escapes_are_found_where_a_byte_by_byte_scan_finds_them(
            bytes in prop::collection::vec(prop_oneof![any::<u8>(), Just(b'"'), Just(b'\\'), 0u8..0x20, 0x20u8..0x7f], 0..40)
        ) {
            let naive = bytes.iter().position(|&b| b == b'"' || b == b'\\' || b < 0x20);
            prop_assert_eq!(needs_escape(&bytes), naive);
        }

        #[test]
        fn dates_are_chronos(secs in -8_334_632_851_300i64..8_210_298_412_900) {
            let Some(at) = chrono::DateTime::from_timestamp(secs, 0) else {
                prop_assert!(!datetime(&mut Vec::new(), secs, 0, 3, true));
                return Ok(());
            };
            prop_assert_eq!(civil(secs.div_euclid(86_400)), (at.year(), at.month(), at.day()));
            let mut out = Vec::new();
            prop_assert!(datetime(&mut out, secs, 7, 3, true));
            let text = String::from_utf8(out).unwrap();
            let want = format!("\"{}.007Z\"", at.format("%Y-%m-%dT%H:%M:%S"));
            prop_assert_eq!(text, want);
        }
    }

    fn naive(bytes: &[u8]) -> Option<usize> {
        bytes
            .iter()
            .position(|&b| b == b'"' || b == b'\\' || b < 0x20)
    }

    #[test]
    fn every_byte_at_every_place_is_found_as_a_byte_by_byte_scan_finds_it() {
        // Fillers around the byte: just above the control range, next to the
        // quote and the backslash, and bytes with their high bit set (which
        // the word test masks, and whose borrows could spill).
        let fillers = [
            0x20u8, 0x21, 0x23, 0x5b, 0x5d, 0x7f, 0x80, 0xa2, 0xdc, 0xff, 0xa0, 0x9f,
        ];
        for len in 0..=24 {
            for filler in fillers {
                let mut bytes = vec![filler; len];
                assert_eq!(needs_escape(&bytes), None);
                for at in 0..len {
                    for b in 0..=255u8 {
                        bytes[at] = b;
                        assert_eq!(needs_escape(&bytes), naive(&bytes), "{bytes:02x?}");
                    }
                    bytes[at] = filler;
                }
            }
        }
        // Two bytes of one word: every pair, with a high filler.
        for filler in [0x20u8, 0x80, 0xff] {
            for p in 0..8 {
                for q in 0..8 {
                    for a in 0..=255u8 {
                        for b in 0..=255u8 {
                            let mut w = [filler; 8];
                            w[p] = a;
                            w[q] = b;
                            assert_eq!(needs_escape(&w), naive(&w), "{w:02x?}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn zmij_writes_the_shortest_text_that_reads_back() {
        // f32: every value was checked outside the suite (4.3e9, all read
        // back exactly); here a sample, with Rust's shortest as the reference.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..2_000_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            for v in [f64::from_bits(x), f64::from(f32::from_bits(x as u32))] {
                if !v.is_finite() {
                    continue;
                }
                let mut out = Vec::new();
                f64(&mut out, v);
                let text = String::from_utf8(out).unwrap();
                assert_eq!(
                    text.parse::<f64>().unwrap().to_bits(),
                    v.to_bits(),
                    "{text}"
                );
                let sig = |s: &str| {
                    let m = s.split(['e', 'E']).next().unwrap();
                    let d: String = m.chars().filter(|c| c.is_ascii_digit()).collect();
                    d.trim_start_matches('0').trim_end_matches('0').len()
                };
                assert_eq!(sig(&text), sig(&format!("{v:e}")), "{text} vs {v:e}");
            }
            let v = f32::from_bits(x as u32);
            if v.is_finite() {
                let mut out = Vec::new();
                f32(&mut out, v);
                let text = String::from_utf8(out).unwrap();
                assert_eq!(
                    text.parse::<f32>().unwrap().to_bits(),
                    v.to_bits(),
                    "{text}"
                );
            }
        }
        for (v, want) in [
            (-0.0f64, "-0.0"),
            (5e-324, "5e-324"),
            (f64::MAX, "1.7976931348623157e+308"),
        ] {
            let mut out = Vec::new();
            f64(&mut out, v);
            assert_eq!(out, want.as_bytes());
        }
    }

    #[test]
    fn local_and_utc_times_at_chronos_ends_are_chronos() {
        let min = chrono::DateTime::<chrono::Utc>::MIN_UTC.timestamp();
        let max = chrono::DateTime::<chrono::Utc>::MAX_UTC.timestamp();
        for secs in [
            min,
            min + 1,
            min + 86_400 * 366,
            -62_167_219_200 - 1,
            -62_167_219_200,
            -62_135_596_800,
            253_402_300_799,
            253_402_300_800,
            max - 1,
            max,
        ] {
            let at = chrono::DateTime::from_timestamp(secs, 0).unwrap();
            for (utc, fmt, zone) in [
                (true, "%Y-%m-%dT%H:%M:%S", "Z"),
                (false, "%Y-%m-%d %H:%M:%S", ""),
            ] {
                let mut out = Vec::new();
                assert!(datetime(&mut out, secs, 999_999, 6, utc));
                let want = format!("\"{}.999999{zone}\"", at.format(fmt));
                assert_eq!(String::from_utf8(out).unwrap(), want);
            }
        }
    }
}
