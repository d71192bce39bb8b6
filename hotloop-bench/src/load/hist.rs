//! Latency recording: an HDR histogram in microseconds and its summary.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The smallest latency the histogram tells apart, in microseconds.
pub const LATENCY_LOW_US: u64 = 1;

/// The largest latency the histogram records, in microseconds (60 s); longer
/// ones are recorded as this value.
pub const LATENCY_HIGH_US: u64 = 60_000_000;

/// Significant decimal digits kept for every recorded value.
const LATENCY_SIGFIG: u8 = 3;

/// Each chart bucket's upper bound is this many times the previous one's.
const CHART_BUCKET_RATIO: f64 = 1.2;

/// The most (value, count) pairs [`Latencies::buckets`] returns.
pub const CHART_BUCKETS_MAX: usize = 100;

/// Latencies recorded during a run.
pub struct Latencies {
    hist: Histogram<u64>,
}

/// Summary statistics of a run's latencies, in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencySummary {
    /// Arithmetic mean.
    pub mean: f64,
    /// Standard deviation.
    pub stdev: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Largest recorded value.
    pub max: f64,
}

impl Latencies {
    /// An empty histogram covering 1 us to 60 s.
    pub fn new() -> Self {
        let hist = Histogram::new_with_bounds(LATENCY_LOW_US, LATENCY_HIGH_US, LATENCY_SIGFIG)
            .expect("constant histogram bounds are valid");
        Latencies { hist }
    }

    /// Records one latency; values below 1 us count as 1 us and values above
    /// 60 s as 60 s.
    pub fn record(&mut self, latency: Duration) {
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.hist.saturating_record(us.clamp(LATENCY_LOW_US, LATENCY_HIGH_US));
    }

    /// Records `n` latencies of the same value (clamped as [`Latencies::record`]).
    pub fn record_n(&mut self, latency: Duration, n: u64) {
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.hist.saturating_record_n(us.clamp(LATENCY_LOW_US, LATENCY_HIGH_US), n);
    }

    /// How many latencies were recorded.
    #[cfg(test)]
    pub fn count(&self) -> u64 {
        self.hist.len()
    }

    /// Mean, standard deviation, percentiles and maximum; all zero when
    /// nothing was recorded.
    pub fn summary(&self) -> LatencySummary {
        if self.hist.is_empty() {
            return LatencySummary::default();
        }
        let q = |q: f64| self.hist.value_at_quantile(q) as f64;
        LatencySummary {
            mean: self.hist.mean(),
            stdev: self.hist.stdev(),
            p50: q(0.50),
            p90: q(0.90),
            p99: q(0.99),
            p999: q(0.999),
            max: self.hist.max() as f64,
        }
    }

    /// A compact (upper bound in us, count) list for charts: logarithmic
    /// buckets, each 1.2 times wider than the one before, empty ones left
    /// out, at most [`CHART_BUCKETS_MAX`] of them.
    pub fn buckets(&self) -> Vec<(u64, u64)> {
        if self.hist.is_empty() {
            return Vec::new();
        }
        // Start at the smallest recorded value so that a narrow distribution
        // still gets fine buckets.
        let start = self.hist.lowest_equivalent(self.hist.min()).max(LATENCY_LOW_US);
        let mut out: Vec<(u64, u64)> = self
            .hist
            .iter_log(start, CHART_BUCKET_RATIO)
            .filter(|v| v.count_since_last_iteration() > 0)
            .map(|v| (v.value_iterated_to(), v.count_since_last_iteration()))
            .collect();
        // A 1.2 ratio spans 1 us .. 60 s in about 98 steps, so this only
        // trims in corner cases; merge the tail rather than drop counts.
        while out.len() > CHART_BUCKETS_MAX {
            let (v, c) = out.pop().expect("len > max > 0");
            let last = out.last_mut().expect("len > max > 0");
            *last = (v, last.1 + c);
        }
        out
    }
}

impl Default for Latencies {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_summary_is_zero() {
        let l = Latencies::new();
        assert_eq!(l.summary(), LatencySummary::default());
        assert!(l.buckets().is_empty());
    }

    #[test]
    fn percentiles_of_uniform_values() {
        let mut l = Latencies::new();
        for us in 1..=1000u64 {
            l.record(Duration::from_micros(us));
        }
        let s = l.summary();
        assert_eq!(l.count(), 1000);
        assert!((s.mean - 500.5).abs() < 1.0, "{s:?}");
        assert!((s.stdev - 288.7).abs() < 2.0, "{s:?}");
        assert!((s.p50 - 500.0).abs() <= 1.0, "{s:?}");
        assert!((s.p90 - 900.0).abs() <= 1.0, "{s:?}");
        assert!((s.p99 - 990.0).abs() <= 1.0, "{s:?}");
        assert!((s.p999 - 999.0).abs() <= 1.0, "{s:?}");
        assert!((s.max - 1000.0).abs() <= 1.0, "{s:?}");
    }

    #[test]
    fn out_of_range_values_are_clamped() {
        let mut l = Latencies::new();
        l.record(Duration::from_nanos(10));
        l.record(Duration::from_secs(3600));
        let s = l.summary();
        assert_eq!(l.count(), 2);
        assert!(s.max >= LATENCY_HIGH_US as f64 * 0.999, "{s:?}");
        assert!(l.summary().p50 <= 1.0, "{s:?}");
    }

    #[test]
    fn buckets_are_compact_and_keep_every_count() {
        let mut l = Latencies::new();
        for us in (1..=60_000_000u64).step_by(997) {
            l.record(Duration::from_micros(us));
        }
        let b = l.buckets();
        assert!(b.len() <= CHART_BUCKETS_MAX, "{}", b.len());
        assert!(b.len() >= 40, "{}", b.len());
        assert_eq!(b.iter().map(|&(_, c)| c).sum::<u64>(), l.count());
        assert!(b.windows(2).all(|w| w[0].0 < w[1].0));
    }
}
