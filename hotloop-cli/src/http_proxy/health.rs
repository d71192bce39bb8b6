//! Which backends take requests: active checks and passive ejection.
//!
//! - **Active**: for a group with `health_path`, worker 0 asks each of its
//!   backends `GET health_path` every `health_interval_ms` on a new
//!   connection (in the group's protocol); 2xx and 3xx pass. `health_fall`
//!   failures in a row take an up backend down, `health_rise` passes in a
//!   row bring a down one back (haproxy's `rise`/`fall`). Backends start up.
//! - **Passive**: `max_fails` failures in a row seen by any worker on real
//!   requests (a connect error or timeout, a connection lost before the
//!   answer, a header timeout; a 5xx answer only with `fail_on_5xx`) take
//!   a backend out for `fail_timeout_ms` (nginx's `max_fails`/
//!   `fail_timeout`); any answer clears the count. After that time it
//!   takes requests again, and one more failure takes it out again.
//!   Failures while it is out (of requests sent before) change nothing:
//!   no second ejection is counted, and its end does not move. The
//!   proxy's own shortage of sockets (out of descriptors) is no failure
//!   of a backend's, and gives a check no verdict.
//!   Failures never take out the last backend of a group that takes
//!   requests: with none left every client would get `503` for
//!   `fail_timeout_ms`, where trying the last one may still answer (nginx
//!   ignores `max_fails` for a group of one, Envoy caps ejection at a
//!   share of the group). The active checks may take it down: they ask
//!   the backend itself, and no client's requests decide their verdict.
//!
//! The state is a few atomics per backend shared by all workers: a
//! worker's observation reaches the others at once, and the request path
//! reads it with relaxed loads.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper::{Method, Request};

use super::config::HealthConfig;
use super::pool::{self, Backend, ConnectError, Sender, UpBody};

/// One backend's health.
#[derive(Debug)]
pub struct BackendHealth {
    /// The active checks' verdict (true without checks).
    up: AtomicBool,
    /// Failures in a row on requests.
    fails: AtomicU32,
    /// Out of rotation until this many milliseconds after the epoch.
    ejected_until_ms: AtomicU64,
    /// Passive ejection: failures in a row that take it out (0: never).
    max_fails: u32,
    /// How long a passive ejection lasts.
    fail_timeout: Duration,
    /// The ids of its group's backends, itself included.
    group: Range<usize>,
}

/// Every backend's health.
#[derive(Debug)]
pub struct Health {
    epoch: Instant,
    backends: Vec<BackendHealth>,
    /// Held while a passive ejection is decided: two workers taking out
    /// the last two backends of a group at once would otherwise each see
    /// the other's still in.
    ejecting: Mutex<()>,
}

impl Health {
    /// All up; `settings[i]` is backend `i`'s `(max_fails, fail_timeout)`,
    /// and `members` each group's backend ids.
    pub fn new(
        settings: impl Iterator<Item = (u32, Duration)>,
        members: &[Range<usize>],
    ) -> Health {
        let backends = settings
            .enumerate()
            .map(|(id, (max_fails, fail_timeout))| BackendHealth {
                up: AtomicBool::new(true),
                fails: AtomicU32::new(0),
                ejected_until_ms: AtomicU64::new(0),
                max_fails,
                fail_timeout,
                group: members.iter().find(|r| r.contains(&id)).cloned().unwrap_or(id..id + 1),
            })
            .collect();
        Health { epoch: Instant::now(), backends, ejecting: Mutex::new(()) }
    }

    fn now_ms(&self) -> u64 {
        hotloop::time::now().saturating_duration_since(self.epoch).as_millis() as u64
    }

    /// Whether backend `id` takes requests now.
    pub fn usable(&self, id: usize) -> bool {
        let b = &self.backends[id];
        b.up.load(Relaxed) && b.ejected_until_ms.load(Relaxed) <= self.now_ms()
    }

    /// Whether the active checks hold backend `id` up.
    pub fn is_up(&self, id: usize) -> bool {
        self.backends[id].up.load(Relaxed)
    }

    /// A request to backend `id` went well.
    pub fn success(&self, id: usize) {
        let b = &self.backends[id];
        if b.fails.load(Relaxed) != 0 {
            b.fails.store(0, Relaxed);
        }
    }

    /// A request to backend `id` failed; returns whether this took it out
    /// (never the last of its group that takes requests). A backend out
    /// already stays out until its time ends, no longer: the failures of
    /// requests sent before its ejection, ending after it, neither count
    /// another ejection nor move its end.
    pub fn failure(&self, id: usize) -> bool {
        let b = &self.backends[id];
        if b.ejected_until_ms.load(Relaxed) > self.now_ms() {
            return false;
        }
        let fails = b.fails.fetch_add(1, Relaxed) + 1;
        if b.max_fails == 0 || fails < b.max_fails {
            return false;
        }
        // On probation when the ejection ends: one more failure before a
        // success takes it out again (nginx's `max_fails` works so), rather
        // than `max_fails` more requests paying for a backend still down.
        // Kept so while it is the last one in, too: the next failure after
        // another comes back takes it out.
        b.fails.store(b.max_fails - 1, Relaxed);
        let _deciding = self.ejecting.lock().unwrap_or_else(|e| e.into_inner());
        if !b.group.clone().any(|other| other != id && self.usable(other)) {
            return false;
        }
        // Under the lock: two workers failing it at once eject it once.
        let now = self.now_ms();
        if b.ejected_until_ms.load(Relaxed) > now {
            return false;
        }
        b.ejected_until_ms.store(now + b.fail_timeout.as_millis() as u64, Relaxed);
        true
    }

    /// Seconds until one of `ids` may take requests again, at least 1: the
    /// earliest end of a passive ejection, or `check` (the time the checks
    /// take to bring a backend back) for one they hold down.
    pub fn retry_after_secs(
        &self,
        ids: impl Iterator<Item = usize>,
        check: Option<Duration>,
    ) -> u64 {
        let now = self.now_ms();
        let mut best = u64::MAX;
        for id in ids {
            let b = &self.backends[id];
            let wait_ms = if !b.up.load(Relaxed) {
                check.map_or(u64::MAX, |d| d.as_millis() as u64)
            } else {
                b.ejected_until_ms.load(Relaxed).saturating_sub(now)
            };
            best = best.min(wait_ms);
        }
        if best == u64::MAX {
            return 1;
        }
        best.div_ceil(1000).max(1)
    }

    fn set_up(&self, id: usize, up: bool) {
        let b = &self.backends[id];
        b.up.store(up, Relaxed);
        if up {
            // A backend the checks bring back starts with a clean slate.
            b.fails.store(0, Relaxed);
            b.ejected_until_ms.store(0, Relaxed);
        }
    }
}

/// Checks backend `id` forever, every `cfg.interval` (a task on worker 0).
pub async fn check_loop(
    health: Arc<Health>,
    backends: Arc<[Backend]>,
    id: usize,
    cfg: HealthConfig,
    name: String,
) {
    let (mut passes, mut fails) = (0u32, 0u32);
    let mut tick = hotloop::time::interval(cfg.interval);
    loop {
        tick.tick().await;
        if crate::drain::stopping() {
            return;
        }
        // No verdict when the proxy itself had no socket for the check
        // (out of descriptors): the backend's state stays as it was.
        let Some(ok) = check_once(&backends[id], &cfg).await else { continue };
        if ok {
            passes += 1;
            fails = 0;
        } else {
            fails += 1;
            passes = 0;
        }
        let up = health.is_up(id);
        if !up && passes >= cfg.rise {
            health.set_up(id, true);
            say!("hotloop proxy: backend {name} ({}) is up", backends[id].addr);
        } else if up && fails >= cfg.fall {
            health.set_up(id, false);
            backends[id].stats.ejections.fetch_add(1, Relaxed);
            say!(
                "hotloop proxy: backend {name} ({}) is down: its health check failed {fails} times",
                backends[id].addr
            );
        }
    }
}

/// One check: `GET path` on a new connection, a 2xx or 3xx within the
/// timeout; `None` (no verdict) if the proxy had no socket to make it.
async fn check_once(b: &Backend, cfg: &HealthConfig) -> Option<bool> {
    let deadline = hotloop::time::now() + cfg.timeout;
    let attempt = async {
        match pool::open(b, cfg.timeout, None, 0).await {
            Ok(sender) => Some(ask(b, cfg, sender).await.unwrap_or(false)),
            Err(ConnectError::Local(_)) => None,
            Err(_) => Some(false),
        }
    };
    hotloop::time::timeout_at(deadline, attempt).await.unwrap_or(Some(false))
}

/// The check's request on `sender`: whether its answer passes (`None`: no answer).
async fn ask(b: &Backend, cfg: &HealthConfig, sender: Sender) -> Option<bool> {
    let authority = b.addr.to_string();
    let mut req =
        Request::builder().method(Method::GET).header("user-agent", "hotloop-health-check");
    let response = match sender {
        Sender::H1(mut s) => {
            req =
                req.uri(cfg.path.as_str()).header("host", authority).header("connection", "close");
            s.send_request(req.body(UpBody::Empty).ok()?).await.ok()?
        }
        Sender::H2(mut s, _) => {
            let scheme = if b.tls.is_some() { "https" } else { "http" };
            let uri = format!("{scheme}://{authority}{}", cfg.path);
            req = req.uri(uri).version(hyper::Version::HTTP_2);
            s.send_request(req.body(UpBody::Empty).ok()?).await.ok()?
        }
    };
    let status = response.status();
    Some(status.is_success() || status.is_redirection())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_fails_in_a_row_eject_and_a_success_clears_the_count() {
        let h = Health::new(
            [(2, Duration::from_secs(30)), (0, Duration::from_secs(30))].into_iter(),
            std::slice::from_ref(&(0..2)),
        );
        assert!(!h.failure(0));
        h.success(0);
        assert!(!h.failure(0));
        assert!(h.usable(0));
        assert!(h.failure(0));
        assert!(!h.usable(0));
        assert!(h.retry_after_secs([0].into_iter(), None) >= 29);
        for _ in 0..10 {
            assert!(!h.failure(1), "max_fails 0 never ejects");
        }
        h.set_up(0, true);
        assert!(h.usable(0));
    }

    #[test]
    fn after_an_ejection_one_failure_takes_a_backend_out_again() {
        let h = Health::new(
            [(3, Duration::from_millis(1)), (3, Duration::from_millis(1))].into_iter(),
            std::slice::from_ref(&(0..2)),
        );
        assert!(!h.failure(0));
        assert!(!h.failure(0));
        assert!(h.failure(0), "the third in a row ejects");
        std::thread::sleep(Duration::from_millis(5));
        assert!(h.usable(0), "back after fail_timeout");
        assert!(h.failure(0), "one failure on probation ejects again");
        std::thread::sleep(Duration::from_millis(5));
        h.success(0);
        assert!(!h.failure(0), "a success ends the probation");
        assert!(!h.failure(0));
        assert!(h.failure(0));
    }

    #[test]
    fn failures_never_take_out_the_last_backend_of_a_group_in() {
        let h = Health::new(
            [
                (1, Duration::from_secs(30)),
                (1, Duration::from_secs(30)),
                (1, Duration::from_secs(30)),
            ]
            .into_iter(),
            &[0..1, 1..3],
        );
        for _ in 0..5 {
            assert!(!h.failure(0), "the only backend of its group was taken out");
        }
        assert!(h.usable(0));
        assert!(h.failure(1), "another of the group is in");
        for _ in 0..5 {
            assert!(!h.failure(2), "the last one in was taken out");
        }
        assert!(h.usable(2));
        // The checks may take the last one down; then the other's
        // failures take it out again.
        h.set_up(2, false);
        assert!(!h.usable(2));
        h.set_up(2, true);
        h.set_up(1, true);
        assert!(h.failure(2), "with the other back, a failure takes it out");
    }

    #[test]
    fn failures_of_a_backend_out_already_neither_count_nor_extend_its_ejection() {
        let h = Health::new(
            [(1, Duration::from_millis(300)), (1, Duration::from_millis(300))].into_iter(),
            std::slice::from_ref(&(0..2)),
        );
        assert!(h.failure(0), "the first failure ejects");
        let until = h.backends[0].ejected_until_ms.load(Relaxed);
        std::thread::sleep(Duration::from_millis(20));
        for _ in 0..5 {
            assert!(!h.failure(0), "a failure while out counted another ejection");
        }
        assert_eq!(h.backends[0].ejected_until_ms.load(Relaxed), until, "the ejection moved");
        std::thread::sleep(Duration::from_millis(400));
        assert!(h.usable(0), "back when its first ejection ends");
        assert!(h.failure(0), "on probation, one failure takes it out again");
    }

    #[test]
    fn retry_after_for_a_backend_held_down_is_the_checks_time() {
        let h =
            Health::new([(0, Duration::from_secs(30))].into_iter(), std::slice::from_ref(&(0..1)));
        h.set_up(0, false);
        let rise_times_interval = Duration::from_secs(2) * 3;
        assert_eq!(h.retry_after_secs([0].into_iter(), Some(rise_times_interval)), 6);
    }
}
