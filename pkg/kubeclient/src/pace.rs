//! How requests are spaced while they fail.

use std::time::{Duration, Instant};

/// After a failure the next request waits from this, doubling at each failure in a row...
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
/// ...up to this (client-go's reflector backs off to 30 s too).
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Failures further apart than this start the backoff from the beginning again.
const BACKOFF_RESET: Duration = Duration::from_secs(120);
/// The longest `Retry-After` taken as it is; a longer one is waited this long.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(600);

/// Each failure pushes the next request back, from `FIRST_BACKOFF` doubling to `MAX_BACKOFF`
/// with jitter, or as far as `Retry-After` says when that is later.
#[derive(Debug, Default)]
pub(crate) struct Pace {
    pub(crate) not_before: Option<Instant>,
    backoff: Duration,
    last_failure: Option<Instant>,
}

impl Pace {
    pub(crate) fn failed(&mut self, retry_after: Option<Duration>) {
        let now = Instant::now();
        if self
            .last_failure
            .is_none_or(|t| now.duration_since(t) > BACKOFF_RESET)
        {
            self.backoff = Duration::ZERO;
        }
        self.backoff = if self.backoff.is_zero() {
            FIRST_BACKOFF
        } else {
            (self.backoff * 2).min(MAX_BACKOFF)
        };
        let half = self.backoff / 2;
        let jittered = half + half.mul_f64(fastrand::f64());
        let wait = jittered.max(retry_after.unwrap_or_default().min(MAX_RETRY_AFTER));
        self.not_before = Some(now + wait);
        self.last_failure = Some(now);
    }

    pub(crate) fn passed(&mut self) {
        self.not_before = None;
    }
}
