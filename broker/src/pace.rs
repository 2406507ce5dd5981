//! The pace at which the broker reads one agent's messages: a token bucket of
//! [`AGENT_BURST`] messages refilled at [`AGENT_RATE`] a second. A job's normal bursts (a
//! few hundred requests at once) pass at once; an agent that floods waits its turn, so
//! that the decisions it asks for take a bounded share of the core and other peers' grants
//! are not slowed by them. Nothing is dropped: a flooding agent's messages are read later.

use std::time::Duration;

use tokio::time::Instant;

/// Messages an agent may send at once before its pace applies.
pub const AGENT_BURST: f64 = 512.0;
/// Messages a second an agent is read at beyond its burst.
pub const AGENT_RATE: f64 = 2000.0;

/// One connection's bucket.
#[derive(Debug)]
pub struct Pace {
    tokens: f64,
    burst: f64,
    rate: f64,
    last: Instant,
}

impl Pace {
    pub fn new(burst: f64, rate: f64, now: Instant) -> Self {
        Self {
            tokens: burst,
            burst,
            rate,
            last: now,
        }
    }

    /// The agents' pace.
    pub fn agent() -> Self {
        Self::new(AGENT_BURST, AGENT_RATE, Instant::now())
    }

    /// How long to wait at `now` before one more message may be read (and takes it).
    pub fn take(&mut self, now: Instant) -> Duration {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        self.tokens -= 1.0;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.rate)
        }
    }

    /// Waits until one more message may be read.
    pub async fn wait(&mut self) {
        let wait = self.take(Instant::now());
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_passes_then_messages_wait_their_turn() {
        let t0 = Instant::now();
        let mut pace = Pace::new(3.0, 100.0, t0);
        for _ in 0..3 {
            assert_eq!(pace.take(t0), Duration::ZERO);
        }
        let wait = pace.take(t0);
        assert!((wait.as_secs_f64() - 0.01).abs() < 1e-9, "{wait:?}");
        // After a quiet second the bucket is full again, not fuller.
        let later = t0 + Duration::from_secs(1);
        for _ in 0..3 {
            assert_eq!(pace.take(later), Duration::ZERO);
        }
        assert!(!pace.take(later).is_zero());
    }
}
