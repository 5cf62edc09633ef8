//! The one retry policy: every loop that waits and tries again takes its
//! delays from here.
//!
//! The delays are backon's exponential backoff: from a first delay that
//! suits the call, doubling, with up to as much again of jitter (so
//! processes that failed together do not retry in step), never over
//! [`MAX_DELAY`]. Whether to try again is the error's own call (a
//! ClickHouse error's [`crate::ch::ChError::is_retriable`], a claim that
//! lost a race); the loops decide what happens between tries. A wait ends
//! early when its caller's token fires: the process stopping, or the
//! partition given up.

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder, Retryable};
use std::fmt::Display;
use std::future::Future;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The longest wait between two tries, jitter included.
pub(crate) const MAX_DELAY: Duration = Duration::from_secs(5);

/// The policy, from `first` on, waits never over `max`: endless.
fn policy(first: Duration, max: Duration) -> ExponentialBuilder {
    // Jitter adds up to as much again: the delay itself stops at half.
    ExponentialBuilder::default()
        .with_min_delay(first.min(max / 2))
        .with_max_delay(max / 2)
        .with_jitter()
        .without_max_times()
}

/// The waits before each next try of one call, the first about `first`.
pub(crate) struct Delays(ExponentialBackoff, Duration);

impl Delays {
    pub(crate) fn new(first: Duration) -> Self {
        Self::up_to(first, MAX_DELAY)
    }

    /// Waits from `first` up to `max`: for a local condition that clears
    /// fast (a full producer queue), where [`MAX_DELAY`] would idle.
    pub(crate) fn up_to(first: Duration, max: Duration) -> Self {
        Self(policy(first, max).build(), max)
    }

    /// The next wait.
    pub(crate) fn next_delay(&mut self) -> Duration {
        self.0.next().unwrap_or(self.1).min(self.1)
    }

    /// Sleeps the next wait; false if `stop` fired first.
    pub(crate) async fn wait(&mut self, stop: &CancellationToken) -> bool {
        let d = self.next_delay();
        tokio::select! {
            biased;
            _ = stop.cancelled() => false,
            _ = tokio::time::sleep(d) => true,
        }
    }
}

/// Runs `f` until it succeeds, logging each failure as "cannot `what` yet";
/// `None` once `stop` fires.
pub(crate) async fn until_ok<T, E, F, Fut>(
    what: &str,
    first: Duration,
    stop: &CancellationToken,
    f: F,
) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: Display,
{
    let tries = f
        .retry(policy(first, MAX_DELAY))
        .sleep(tokio::time::sleep)
        .notify(|e: &E, next: Duration| {
            tracing::warn!(error = %format_args!("{e:#}"), retry_in = ?next, "cannot {what} yet; retrying");
        });
    tokio::select! {
        biased;
        _ = stop.cancelled() => None,
        r = tries => match r {
            Ok(v) => Some(v),
            // The policy is endless: only a stop ends it.
            Err(e) => {
                tracing::error!(error = %format_args!("{e:#}"), "gave up trying to {what}");
                None
            }
        },
    }
}

/// Runs `f` until it succeeds or fails in a way that `transient` says a
/// retry cannot fix, logging each transient failure as "cannot `what`
/// yet": the outcome, or `None` once `stop` fires.
pub(crate) async fn while_transient<T, E, F, Fut>(
    what: &str,
    first: Duration,
    stop: &CancellationToken,
    transient: impl FnMut(&E) -> bool,
    f: F,
) -> Option<Result<T, E>>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: Display,
{
    let tries = f
        .retry(policy(first, MAX_DELAY))
        .sleep(tokio::time::sleep)
        .when(transient)
        .notify(|e: &E, next: Duration| {
            tracing::warn!(error = %format_args!("{e:#}"), retry_in = ?next, "cannot {what} yet; retrying");
        });
    tokio::select! {
        biased;
        _ = stop.cancelled() => None,
        r = tries => Some(r),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[test]
    fn the_waits_double_with_jitter_and_never_pass_the_cap() {
        let mut d = Delays::new(Duration::from_millis(100));
        let mut floor = Duration::from_millis(100);
        for _ in 0..30 {
            let w = d.next_delay();
            assert!(w >= floor && w <= floor * 2, "{w:?} for {floor:?}");
            assert!(w <= MAX_DELAY);
            floor = (floor * 2).min(MAX_DELAY / 2);
        }
        let mut small = Delays::up_to(Duration::from_millis(10), Duration::from_millis(50));
        assert!((0..100).all(|_| small.next_delay() <= Duration::from_millis(50)));
    }

    #[tokio::test]
    async fn until_ok_tries_until_success_and_stops_when_told() {
        let stop = CancellationToken::new();
        let tries = AtomicU32::new(0);
        let got = until_ok("count", Duration::from_millis(1), &stop, || async {
            match tries.fetch_add(1, Ordering::SeqCst) {
                0..=2 => Err("not yet"),
                n => Ok(n),
            }
        })
        .await;
        assert_eq!(got, Some(3));

        let tries = AtomicU32::new(0);
        let got = while_transient(
            "count",
            Duration::from_millis(1),
            &stop,
            |e: &&str| *e == "not yet",
            || async {
                match tries.fetch_add(1, Ordering::SeqCst) {
                    0..=1 => Err("not yet"),
                    _ => Err::<u32, _>("never"),
                }
            },
        )
        .await;
        assert_eq!(got, Some(Err("never")), "a permanent error ends the tries");

        stop.cancel();
        let never = until_ok("fail", Duration::from_millis(1), &stop, || async {
            Err::<(), _>("never")
        })
        .await;
        assert_eq!(never, None);
    }
}
