//! ClickHouse's block-level dedup window, in seconds.
//!
//! In: the window's settings (blocks, and for replicated tables a seconds
//! bound), the table's measured block rate and the interval after which a
//! client re-submits a timed-out INSERT. Out: how long the window lasts,
//! which re-submits it still catches, the smallest window that would catch
//! them all and a recommended size with margin, and what that costs in
//! Keeper znodes. This is the arithmetic of the documents' experiments
//! 01–03: 1000 blocks at 124.4 blocks/s last about 8 s, and covering a
//! 124 s re-submit takes about 15–20 k blocks.

use std::time::Duration;

/// The margin a recommended window keeps over `rate × longest interval`.
pub const MARGIN: f64 = 1.25;

/// The dedup window settings in effect for one table.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WindowSettings {
    /// How many recent blocks are remembered (0 turns dedup off).
    pub blocks: u64,
    /// Blocks older than this are forgotten whatever their count
    /// (`replicated_deduplication_window_seconds`; `None` for non-replicated
    /// tables, whose window has no time bound).
    pub seconds: Option<u64>,
}

/// A client's re-submit interval: the shortest and longest time between an
/// INSERT and its re-submission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryInterval {
    pub min: Duration,
    pub max: Duration,
}

impl RetryInterval {
    /// Parses `32s..124s`, or a single duration such as `90s`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let (a, b) = s.split_once("..").unwrap_or((s, s));
        let parse = |x: &str| {
            humantime_like(x.trim())
                .ok_or_else(|| format!("{x:?} is not a duration (expected e.g. 32s, 2m or 1h)"))
        };
        let (min, max) = (parse(a)?, parse(b)?);
        if min > max {
            return Err(format!(
                "retry interval {s:?} runs backwards: {min:?} > {max:?}"
            ));
        }
        Ok(Self { min, max })
    }
}

/// `<n>{ms,s,m,h,d}` → a duration (the core has no humantime dependency).
fn humantime_like(s: &str) -> Option<Duration> {
    let split = s.find(|c: char| !c.is_ascii_digit() && c != '.')?;
    let (n, unit) = s.split_at(split);
    let n: f64 = n.parse().ok()?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" | "min" => n * 60.0,
        "h" => n * 3600.0,
        "d" => n * 86_400.0,
        _ => return None,
    };
    (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs))
}

/// How long the window lasts at `blocks_per_sec`: blocks ÷ rate, capped by
/// the seconds bound. `None` when nothing bounds it (no blocks are being
/// written and there is no seconds bound).
pub fn window_seconds(w: WindowSettings, blocks_per_sec: f64) -> Option<f64> {
    let by_count = (blocks_per_sec > 0.0).then(|| w.blocks as f64 / blocks_per_sec);
    match (by_count, w.seconds) {
        (Some(c), Some(s)) => Some(c.min(s as f64)),
        (Some(c), None) => Some(c),
        (None, Some(s)) => Some(s as f64),
        (None, None) => None,
    }
}

/// Whether a re-submit `after` the first attempt still finds its block in
/// the window. (The cleanup thread may keep expired blocks up to a few
/// minutes longer; that extra is luck, not a bound, so it is not counted.)
pub fn catches(w: WindowSettings, blocks_per_sec: f64, after: Duration) -> bool {
    w.blocks > 0 && window_seconds(w, blocks_per_sec).is_none_or(|s| s >= after.as_secs_f64())
}

/// The window a table needs, and what it costs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Recommendation {
    /// `rate × longest interval`, rounded up: the least that covers it.
    pub minimum_blocks: u64,
    /// The minimum with [`MARGIN`], rounded up to two significant digits.
    pub recommended_blocks: u64,
    /// The `…_window_seconds` bound must not cut the window short either.
    pub minimum_seconds: u64,
    /// Znodes in Keeper's `blocks/` if every replicated table kept the
    /// recommended window (a server-wide default).
    pub znodes_as_default: u64,
    /// Extra znodes if only this table's window changes.
    pub znodes_this_table: u64,
}

/// Sizes the window for `rate` blocks/s and the longest re-submit interval.
/// Keeper keeps one znode per remembered block of each replicated table.
pub fn recommend(
    blocks_per_sec: f64,
    interval: RetryInterval,
    current: WindowSettings,
    replicated_tables: u64,
) -> Recommendation {
    let need = (blocks_per_sec.max(0.0) * interval.max.as_secs_f64()).ceil() as u64;
    let recommended = round_up_2_digits((need as f64 * MARGIN).ceil() as u64);
    Recommendation {
        minimum_blocks: need,
        recommended_blocks: recommended,
        minimum_seconds: (interval.max.as_secs_f64() * MARGIN).ceil() as u64,
        znodes_as_default: recommended.saturating_mul(replicated_tables),
        znodes_this_table: recommended.saturating_sub(current.blocks),
    }
}

/// 19,282 → 20,000; 1,234 → 1,300; 0 → 0.
pub fn round_up_2_digits(n: u64) -> u64 {
    if n < 100 {
        return n;
    }
    let mut step = 1u64;
    while n / step >= 100 {
        step *= 10;
    }
    n.div_ceil(step).saturating_mul(step)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const DOCS_RATE: f64 = 124.4;

    fn replicated(blocks: u64, seconds: u64) -> WindowSettings {
        WindowSettings {
            blocks,
            seconds: Some(seconds),
        }
    }

    #[test]
    fn the_documents_figures() {
        // 25.3 defaults: 1000 blocks, one week → about 8 s.
        let s = window_seconds(replicated(1000, 604_800), DOCS_RATE).unwrap();
        assert!((s - 8.04).abs() < 0.01, "{s}");
        // 26.3 defaults: 10,000 blocks, one hour → about 80 s.
        let s = window_seconds(replicated(10_000, 3600), DOCS_RATE).unwrap();
        assert!((s - 80.4).abs() < 0.1, "{s}");
        // The other region: 40.2 blocks/s → about 25 s.
        let s = window_seconds(replicated(1000, 604_800), 40.2).unwrap();
        assert!((s - 24.9).abs() < 0.1, "{s}");
        // 32..124 s needs about 15–20 k blocks.
        let iv = RetryInterval::parse("32s..124s").unwrap();
        let r = recommend(DOCS_RATE, iv, replicated(1000, 604_800), 100);
        assert_eq!(r.minimum_blocks, 15_426);
        assert_eq!(r.recommended_blocks, 20_000);
        assert_eq!(r.znodes_as_default, 2_000_000);
        assert_eq!(r.znodes_this_table, 19_000);
        assert_eq!(r.minimum_seconds, 155);
        // 10,000 blocks catch the 32 s and 60 s re-submits, not 90 s or 124 s.
        let w = replicated(10_000, 3600);
        assert!(catches(w, DOCS_RATE, Duration::from_secs(32)));
        assert!(catches(w, DOCS_RATE, Duration::from_secs(60)));
        assert!(!catches(w, DOCS_RATE, Duration::from_secs(90)));
        assert!(!catches(w, DOCS_RATE, Duration::from_secs(124)));
    }

    #[test]
    fn seconds_bound_and_idle_tables() {
        // A slow table: the seconds bound expires first.
        assert_eq!(window_seconds(replicated(1000, 3600), 0.01), Some(3600.0));
        assert_eq!(window_seconds(replicated(1000, 3600), 0.0), Some(3600.0));
        let nonrep = WindowSettings {
            blocks: 100,
            seconds: None,
        };
        assert_eq!(window_seconds(nonrep, 0.0), None);
        assert!(catches(nonrep, 0.0, Duration::from_secs(1000)));
        let off = WindowSettings {
            blocks: 0,
            seconds: None,
        };
        assert!(!catches(off, 0.0, Duration::ZERO));
    }

    #[test]
    fn parses_intervals() {
        let iv = RetryInterval::parse("32s..124s").unwrap();
        assert_eq!(iv.min, Duration::from_secs(32));
        assert_eq!(iv.max, Duration::from_secs(124));
        assert_eq!(
            RetryInterval::parse("2m").unwrap().max,
            Duration::from_secs(120)
        );
        assert!(RetryInterval::parse("124s..32s").is_err());
        assert!(RetryInterval::parse("soon").is_err());
        assert!(RetryInterval::parse("5parsecs").is_err());
    }

    #[test]
    fn rounding() {
        assert_eq!(round_up_2_digits(19_282), 20_000);
        assert_eq!(round_up_2_digits(15_426), 16_000);
        assert_eq!(round_up_2_digits(1_234), 1_300);
        assert_eq!(round_up_2_digits(1_200), 1_200);
        assert_eq!(round_up_2_digits(99), 99);
        assert_eq!(round_up_2_digits(0), 0);
    }

    proptest! {
        /// The recommendation always catches the longest re-submit.
        #[test]
        fn recommendation_covers_the_interval(rate in 0.01f64..10_000.0, max_s in 1u64..3600) {
            let iv = RetryInterval { min: Duration::from_secs(1), max: Duration::from_secs(max_s) };
            let r = recommend(rate, iv, replicated(1000, 3600), 1);
            prop_assert!(r.recommended_blocks >= r.minimum_blocks);
            let w = replicated(r.recommended_blocks, r.minimum_seconds);
            prop_assert!(catches(w, rate, iv.max));
        }

        #[test]
        fn rounding_never_goes_down(n in 0u64..u64::MAX / 100) {
            let r = round_up_2_digits(n);
            prop_assert!(r >= n);
            prop_assert!(r - n < n / 10 + 1);
        }
    }
}
