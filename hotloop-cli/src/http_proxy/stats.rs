//! The HTTP proxy's counters: the proxy's own, and one set per backend
//! (requests, errors, latency percentiles, pooled connections, reuse),
//! added to the stats endpoint's fields.
//!
//! Every counter is a relaxed atomic that the workers add to; a scrape
//! reads them without stopping anyone. Latency goes into a histogram of
//! power-of-two microsecond buckets, so a percentile is read to within a
//! factor of two, with no lock and no allocation per request.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use crate::stats_server::{Extra, Kind};

/// Buckets of the latency histogram: bucket `i` counts latencies below
/// `2^i` microseconds (the last also everything above), so up to about 9 minutes.
const LATENCY_BUCKETS: usize = 30;

/// One backend's counters.
#[derive(Debug, Default)]
pub struct BackendStats {
    /// Requests sent to it.
    pub requests: AtomicU64,
    /// Requests that got no answer from it (connect errors, timeouts,
    /// connections lost) and answers of 5xx.
    pub errors: AtomicU64,
    /// Connections opened to it.
    pub connects: AtomicU64,
    /// Requests sent on a connection that had served one before.
    pub reused: AtomicU64,
    /// Idle connections moved here from another worker's pool.
    pub borrowed: AtomicU64,
    /// Idle connections this proxy's workers gave up for another to borrow
    /// (`borrowed` counts those that arrived).
    pub lent: AtomicU64,
    /// Idle connections in the pools now, over all workers.
    pub pool_idle: AtomicI64,
    /// Connections open to it now, idle or busy, over all workers.
    pub open: AtomicI64,
    /// Times it was taken out of rotation (passive or active).
    pub ejections: AtomicU64,
    latency: [AtomicU64; LATENCY_BUCKETS],
}

impl BackendStats {
    /// Records one request's latency: from sending it to the end of the
    /// answer's body.
    pub fn record_latency(&self, d: Duration) {
        let us = d.as_micros().min(u64::MAX as u128) as u64;
        let bucket = (u64::BITS - us.leading_zeros()) as usize;
        self.latency[bucket.min(LATENCY_BUCKETS - 1)].fetch_add(1, Relaxed);
    }

    /// The latency below which `per_mille` of the recorded ones fall, in
    /// microseconds (the upper bound of the bucket), or 0 with none recorded.
    pub fn latency_percentile_us(&self, per_mille: u64) -> u64 {
        let counts: Vec<u64> = self.latency.iter().map(|b| b.load(Relaxed)).collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return 0;
        }
        let want = (total * per_mille).div_ceil(1000).max(1);
        let mut seen = 0;
        for (i, c) in counts.iter().enumerate() {
            seen += c;
            if seen >= want {
                return 1u64 << i;
            }
        }
        1u64 << (LATENCY_BUCKETS - 1)
    }
}

/// The proxy's own counters, over all workers.
#[derive(Debug, Default)]
pub struct ProxyStats {
    /// Requests taken from clients.
    pub requests: AtomicU64,
    /// Requests retried on another backend (or another connection).
    pub retries: AtomicU64,
    /// Answers of 502 (no backend answered), 503 (none up) and 504 (a
    /// backend too slow) the proxy made itself.
    pub bad_gateway: AtomicU64,
    /// See `bad_gateway`.
    pub unavailable: AtomicU64,
    /// See `bad_gateway`.
    pub gateway_timeout: AtomicU64,
    /// Requests no route matched (404).
    pub no_route: AtomicU64,
    /// Connections tunnelled after an `Upgrade` (WebSocket).
    pub upgrades: AtomicU64,
}

/// The endpoint's fields for the proxy and each backend. A backend's
/// names carry its group and its place in the group
/// (`backend_api_0_requests`); its help text names its address.
pub fn fields(
    proxy: &ProxyStats,
    backends: &[(&'static str, &'static str, &BackendStats)],
) -> Vec<Extra> {
    let counter = |name, help, value: &AtomicU64| Extra {
        name,
        help,
        kind: Kind::Counter,
        value: value.load(Relaxed),
    };
    let mut out = vec![
        counter("http_requests", "Requests taken from clients.", &proxy.requests),
        counter(
            "http_retries",
            "Requests retried on another backend or connection.",
            &proxy.retries,
        ),
        counter("http_502", "Answers 502: no backend answered.", &proxy.bad_gateway),
        counter(
            "http_503",
            "Answers 503: no backend of the group up, or no socket for one.",
            &proxy.unavailable,
        ),
        counter("http_504", "Answers 504: a backend too slow.", &proxy.gateway_timeout),
        counter("http_no_route", "Requests no route matched (404).", &proxy.no_route),
        counter("http_upgrades", "Connections tunnelled after an Upgrade.", &proxy.upgrades),
    ];
    for &(prefix, help, b) in backends {
        let name = |what: &str| -> &'static str { leak(format!("{prefix}_{what}")) };
        let gauge = |name, value: u64| Extra { name, help, kind: Kind::Gauge, value };
        out.push(counter(name("requests"), help, &b.requests));
        out.push(counter(name("errors"), help, &b.errors));
        out.push(counter(name("connects"), help, &b.connects));
        out.push(counter(name("reused"), help, &b.reused));
        out.push(counter(name("borrowed"), help, &b.borrowed));
        out.push(counter(name("lent"), help, &b.lent));
        out.push(counter(name("ejections"), help, &b.ejections));
        out.push(gauge(name("pool_idle"), b.pool_idle.load(Relaxed).max(0) as u64));
        out.push(gauge(name("open"), b.open.load(Relaxed).max(0) as u64));
        out.push(gauge(name("latency_p50_us"), b.latency_percentile_us(500)));
        out.push(gauge(name("latency_p99_us"), b.latency_percentile_us(990)));
        out.push(gauge(name("latency_p999_us"), b.latency_percentile_us(999)));
    }
    out
}

/// The endpoint's field names are `&'static str`; a backend's are made once
/// per name and kept in a table, so scrapes leak nothing.
fn leak(s: String) -> &'static str {
    use std::collections::HashSet;
    use std::sync::Mutex;
    static NAMES: Mutex<Option<HashSet<&'static str>>> = Mutex::new(None);
    let mut names = NAMES.lock().unwrap_or_else(|p| p.into_inner());
    let set = names.get_or_insert_with(HashSet::new);
    if let Some(&known) = set.get(s.as_str()) {
        return known;
    }
    let made: &'static str = Box::leak(s.into_boxed_str());
    set.insert(made);
    made
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_come_from_the_buckets() {
        let b = BackendStats::default();
        assert_eq!(b.latency_percentile_us(500), 0);
        for _ in 0..99 {
            b.record_latency(Duration::from_micros(100));
        }
        b.record_latency(Duration::from_millis(50));
        assert_eq!(b.latency_percentile_us(500), 128);
        assert_eq!(b.latency_percentile_us(990), 128);
        assert_eq!(b.latency_percentile_us(999), 65_536);
        assert!(std::ptr::eq(leak("x_a".into()), leak("x_a".into())));
    }
}
