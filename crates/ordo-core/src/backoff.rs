//! Exponential backoff with full jitter, a leaf shared by the relay and the
//! stores that record its failures.

/// Exponential backoff with full jitter for transient delivery failures: the
/// n-th attempt that fails (conflicts and earlier attempts count too) waits
/// a uniformly random time in
/// `0..=min(cap, base * 2^(n-1))`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The ceiling of the first wait.
    pub base_ms: u64,
    /// The largest ceiling.
    pub cap_ms: u64,
    /// The least wait, whatever the jitter draws (a consumer's
    /// `Retry-After`); 0 by default.
    pub floor_ms: u64,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            base_ms: 100,
            cap_ms: 60_000,
            floor_ms: 0,
        }
    }
}

impl Backoff {
    /// The ceiling of the wait after the `attempts`-th attempt (>= 1).
    pub fn ceiling_ms(&self, attempts: u32) -> u64 {
        let exponent = attempts.saturating_sub(1).min(62);
        self.base_ms
            .saturating_mul(1u64 << exponent)
            .min(self.cap_ms)
    }

    /// The wait after `attempts` failures, for a uniform `unit` in `[0, 1)`,
    /// never less than `floor_ms`.
    pub fn delay_ms(&self, attempts: u32, unit: f64) -> u64 {
        debug_assert!((0.0..1.0).contains(&unit));
        let ceiling = self.ceiling_ms(attempts);
        let jittered = ((ceiling as f64 + 1.0) * unit.clamp(0.0, 1.0))
            .floor()
            .min(ceiling as f64) as u64;
        jittered.max(self.floor_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_exponentially_up_to_the_cap() {
        let b = Backoff {
            base_ms: 100,
            cap_ms: 1_000,
            floor_ms: 0,
        };
        let ceilings: Vec<u64> = (1..=6).map(|n| b.ceiling_ms(n)).collect();
        assert_eq!(ceilings, vec![100, 200, 400, 800, 1_000, 1_000]);
        assert_eq!(b.ceiling_ms(u32::MAX), 1_000);
        assert_eq!(b.delay_ms(3, 0.0), 0);
        assert_eq!(b.delay_ms(3, 0.5), 200);
        assert_eq!(b.delay_ms(3, 0.999_999_9), 400);
        let floored = Backoff { floor_ms: 250, ..b };
        assert_eq!(floored.delay_ms(3, 0.0), 250);
        assert_eq!(floored.delay_ms(3, 0.999_999_9), 400);
    }
}
