//! Date and time text → days and seconds since the epoch, in the forms
//! ClickHouse's JSONEachRow reads the same way whatever the edge.
//!
//! In: a JSON string's bytes. Out: days (a date), or seconds, a fraction's
//! digits and whether an offset was given (a time), or `None`, which
//! sends the row by the JSON path. Only the strict forms are read:
//! `YYYY-MM-DD`, `YYYY-MM-DD hh:mm:ss` (or `T` between), with a fraction
//! where the column and mode read one, and, under `best_effort`, a final
//! `Z`, `±hh:mm` or `±hhmm`. ClickHouse reads more (`2024-1-2`,
//! `2024-02-30` as March 1st in `basic`, `24:00:00` as the next day, a
//! trailing space under `best_effort`, `20240102`, ...) and clamps what is
//! out of range; none of that is mirrored.

/// Days from 1970-01-01 to a valid proleptic Gregorian date.
pub(crate) fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn days_in_month(y: i64, m: u32) -> u32 {
    match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        _ if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        _ => 28,
    }
}

fn digits(s: &[u8]) -> Option<u32> {
    if s.is_empty() || !s.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(s.iter().fold(0, |v, d| v * 10 + u32::from(d - b'0')))
}

/// `YYYY-MM-DD`, a valid date: its days since 1970-01-01.
pub(crate) fn date(s: &[u8]) -> Option<i64> {
    if s.len() != 10 || s[4] != b'-' || s[7] != b'-' {
        return None;
    }
    let y = i64::from(digits(&s[..4])?);
    let m = digits(&s[5..7])?;
    let d = digits(&s[8..10])?;
    if !(1..=12).contains(&m) || d == 0 || d > days_in_month(y, m) {
        return None;
    }
    Some(days_from_civil(y, m, d))
}

/// A time read from text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stamp<'a> {
    /// Seconds since the epoch: in UTC when `offset` is set, else as the
    /// wall-clock time read (in the column's time zone).
    pub secs: i64,
    /// The fraction's digits (empty without one).
    pub frac: &'a [u8],
    /// Whether the text named its offset from UTC (`Z`, `±hh:mm`).
    pub offset: bool,
}

/// How the text of a time may be written.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Forms {
    /// A fraction of a second may follow the seconds.
    pub fraction: bool,
    /// `Z`, `±hh:mm` or `±hhmm` may end it (`best_effort` only).
    pub offset: bool,
}

/// A date, or a date and time, in the strict forms `forms` allows.
pub(crate) fn datetime<'a>(s: &'a [u8], forms: Forms) -> Option<Stamp<'a>> {
    let days = date(s.get(..10)?)?;
    let mut stamp = Stamp {
        secs: days * 86_400,
        frac: &[],
        offset: false,
    };
    if s.len() == 10 {
        return Some(stamp);
    }
    let t = s.get(10..19)?;
    if !(t[0] == b' ' || t[0] == b'T') || t[3] != b':' || t[6] != b':' {
        return None;
    }
    let (h, m, sec) = (digits(&t[1..3])?, digits(&t[4..6])?, digits(&t[7..9])?);
    if h > 23 || m > 59 || sec > 59 {
        return None;
    }
    stamp.secs += i64::from(h * 3600 + m * 60 + sec);
    let mut rest = &s[19..];
    if forms.fraction && rest.first() == Some(&b'.') {
        let n = rest[1..].iter().take_while(|b| b.is_ascii_digit()).count();
        if n == 0 {
            return None;
        }
        stamp.frac = &rest[1..1 + n];
        rest = &rest[1 + n..];
    }
    if rest.is_empty() {
        return Some(stamp);
    }
    if !forms.offset {
        return None;
    }
    let shift = match rest {
        b"Z" => 0,
        [sign @ (b'+' | b'-'), hh @ ..] => {
            let (hh, mm) = match hh.len() {
                5 if hh[2] == b':' => (&hh[..2], &hh[3..]),
                4 => (&hh[..2], &hh[2..]),
                _ => return None,
            };
            let (hh, mm) = (digits(hh)?, digits(mm)?);
            if hh > 14 || mm > 59 {
                return None;
            }
            let v = i64::from(hh * 3600 + mm * 60);
            if *sign == b'-' {
                -v
            } else {
                v
            }
        }
        _ => return None,
    };
    stamp.secs -= shift;
    stamp.offset = true;
    Some(stamp)
}

/// `frac` (digits of a fraction) in units of 10^-`precision`, the digits
/// past it cut off.
pub(crate) fn frac_ticks(frac: &[u8], precision: u8) -> i64 {
    let p = usize::from(precision);
    (0..p).fold(0i64, |v, i| {
        v * 10 + frac.get(i).map_or(0, |d| i64::from(d - b'0'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOOSE: Forms = Forms {
        fraction: true,
        offset: true,
    };
    const STRICT: Forms = Forms {
        fraction: false,
        offset: false,
    };

    #[test]
    fn civil_days() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2024, 1, 2), 19724);
        assert_eq!(days_from_civil(2149, 6, 6), 65535);
        assert_eq!(days_from_civil(1900, 1, 1), -25567);
        assert_eq!(days_from_civil(2299, 12, 31), 120529);
        assert_eq!(days_from_civil(2000, 2, 29), 11016);
    }

    #[test]
    fn dates_are_strict() {
        assert_eq!(date(b"2024-01-02"), Some(19724));
        assert_eq!(date(b"2024-02-29"), Some(19782));
        for bad in [
            "2023-02-29",
            "2024-1-2",
            "2024-13-01",
            "2024-00-10",
            "20240102",
            "2024-01-02 ",
        ] {
            assert_eq!(date(bad.as_bytes()), None, "{bad}");
        }
    }

    #[test]
    fn times_in_each_form() {
        fn at(s: &str, f: Forms) -> Option<Stamp<'_>> {
            datetime(s.as_bytes(), f)
        }
        assert_eq!(
            at("2024-01-02 03:04:05", STRICT).unwrap().secs,
            1_704_164_645
        );
        assert_eq!(
            at("2024-01-02T03:04:05", STRICT).unwrap().secs,
            1_704_164_645
        );
        assert_eq!(at("2024-01-02", STRICT).unwrap().secs, 1_704_153_600);
        assert_eq!(at("2024-01-02 03:04:05.123", STRICT), None);
        let s = at("2024-01-02T03:04:05.5+01:00", LOOSE).unwrap();
        assert_eq!((s.secs, s.frac, s.offset), (1_704_161_045, &b"5"[..], true));
        assert_eq!(
            at("2024-01-02T03:04:05-0130", LOOSE).unwrap().secs,
            1_704_170_045
        );
        assert_eq!(
            at("2024-01-02T03:04:05Z", LOOSE).unwrap().secs,
            1_704_164_645
        );
        for bad in [
            "2024-01-02 24:00:00",
            "2024-01-02 03:04",
            "2024-01-02 03:04:05.",
            "2024-01-02 03:04:05 ",
            "2024-01-02T03:04:05+1",
        ] {
            assert_eq!(at(bad, LOOSE), None, "{bad}");
        }
    }

    #[test]
    fn fractions_cut_to_precision() {
        assert_eq!(frac_ticks(b"1239", 3), 123);
        assert_eq!(frac_ticks(b"5", 3), 500);
        assert_eq!(frac_ticks(b"", 6), 0);
        assert_eq!(frac_ticks(b"999", 0), 0);
    }
}
