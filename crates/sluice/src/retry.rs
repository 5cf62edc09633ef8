//! The one retry policy: every loop that waits and tries again takes its
//! delays from here.
//!
//! The delays are backon's exponential backoff: from a first delay that
//! suits the call, doubling, at most [`MAX_DELAY`], each with up to as much
//! again of jitter, so processes that failed together do not retry in step.
//! Whether to try again is the error's own call (a ClickHouse error's
//! [`crate::ch::ChError::is_retriable`], a claim that lost a race); the
//! loops decide what happens between tries, and every wait ends at once
//! when the process stops.

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder, Retryable};
use std::fmt::Display;
use std::future::Future;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The longest wait between two tries (before jitter).
pub const MAX_DELAY: Duration = Duration::from_secs(5);

/// The policy, from `first` on: endless.
fn policy(first: Duration) -> ExponentialBuilder {
    ExponentialBuilder::default()
        .with_min_delay(first)
        .with_max_delay(MAX_DELAY)
        .with_jitter()
        .without_max_times()
}

/// The waits before each next try of one call, the first about `first`.
pub struct Delays(ExponentialBackoff);

impl Delays {
    pub fn new(first: Duration) -> Self {
        Self::up_to(first, MAX_DELAY)
    }

    /// Waits from `first` up to `max`: for a local condition that clears
    /// fast (a full producer queue), where [`MAX_DELAY`] would idle.
    pub fn up_to(first: Duration, max: Duration) -> Self {
        Self(policy(first).with_max_delay(max).build())
    }

    /// The next wait.
    pub fn next_delay(&mut self) -> Duration {
        self.0.next().unwrap_or(MAX_DELAY)
    }

    /// Sleeps the next wait; false if `stop` fired first.
    pub async fn wait(&mut self, stop: &CancellationToken) -> bool {
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
pub async fn until_ok<T, E, F, Fut>(
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
        .retry(policy(first))
        .sleep(tokio::time::sleep)
        .notify(|e: &E, next: Duration| {
            tracing::warn!(error = %format_args!("{e:#}"), retry_in = ?next, "cannot {what} yet; retrying");
        });
    tokio::select! {
        biased;
        _ = stop.cancelled() => None,
        r = tries => r.ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[test]
    fn the_waits_double_up_to_the_cap_with_jitter_below_as_much_again() {
        let mut d = Delays::new(Duration::from_millis(100));
        let mut floor = Duration::from_millis(100);
        for _ in 0..20 {
            let w = d.next_delay();
            assert!(w >= floor && w <= floor * 2, "{w:?} for {floor:?}");
            floor = (floor * 2).min(MAX_DELAY);
        }
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

        stop.cancel();
        let never = until_ok("fail", Duration::from_millis(1), &stop, || async {
            Err::<(), _>("never")
        })
        .await;
        assert_eq!(never, None);
    }
}
