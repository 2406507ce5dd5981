//! A rate limit for warnings a remote peer can trigger (bad handshakes, peers cut for not
//! reading): at most `max` per window, then a count of those suppressed.

use std::{
    sync::Mutex,
    time::{Duration, Instant},
};

use tracing::{debug, warn};

/// Rate limit for warnings a remote peer can trigger: at most `max` per `window`.
pub struct LogLimiter {
    max: u32,
    window: Duration,
    state: Mutex<(Instant, u32, u64)>,
}

impl LogLimiter {
    pub fn new(max: u32, window: Duration) -> Self {
        Self {
            max,
            window,
            state: Mutex::new((Instant::now(), 0, 0)),
        }
    }

    /// True if a message may be logged now.
    pub fn allow(&self) -> bool {
        let Ok(mut s) = self.state.lock() else {
            return false;
        };
        if s.0.elapsed() > self.window {
            if s.2 > 0 {
                warn!(
                    suppressed = s.2,
                    "peer warnings suppressed by the rate limit"
                );
            }
            *s = (Instant::now(), 0, 0);
        }
        s.1 += 1;
        if s.1 > self.max {
            s.2 += 1;
        }
        s.1 <= self.max
    }

    pub fn warn(&self, peer: &str, reason: &str) {
        if self.allow() {
            warn!(%peer, %reason, "dropped connection");
        } else {
            debug!(%peer, %reason, "dropped connection");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limiter_caps_messages_per_window() {
        let limiter = LogLimiter::new(3, Duration::from_secs(60));
        let allowed = (0..10).filter(|_| limiter.allow()).count();
        assert_eq!(allowed, 3);
    }
}
