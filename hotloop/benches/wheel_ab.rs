//! The timer wheel against its previous version, side by side in one run.
//!
//! `wheel_ab/baseline.rs` is the wheel as it was before the 32-byte layout
//! (separate 16-byte nodes and slab entries, one-ended cascades). Each round
//! runs every scenario on both, alternating which goes first, and the report
//! gives the median per scenario. Times are the thread's CPU time
//! (`CLOCK_THREAD_CPUTIME_ID`), not wall clock, so time spent descheduled on
//! a shared machine is left out; cache contention from other processes is
//! not.
//!
//! Run with `cargo bench -p hotloop --bench wheel_ab [-- FILTER]`; `ROUNDS`
//! sets the number of rounds (default 7).

#[allow(dead_code)]
#[path = "wheel_ab/baseline.rs"]
mod baseline;

use std::hint::black_box;

use hotloop::time::wheel::{TimerKey, TimerWheel};

/// The operations the scenarios use, over `u64` values.
trait Wheel {
    type Key: Copy;
    fn new() -> Self;
    fn insert(&mut self, deadline: u64, value: u64) -> Self::Key;
    fn cancel(&mut self, key: Self::Key) -> Option<u64>;
    fn reset(&mut self, key: Self::Key, deadline: u64) -> bool;
    fn deadline(&self, key: Self::Key) -> Option<u64>;
    fn poll(&mut self, now: u64, max: usize, f: impl FnMut(u64)) -> usize;
}

macro_rules! impl_wheel {
    ($wheel:ty, $key:ty) => {
        impl Wheel for $wheel {
            type Key = $key;
            fn new() -> Self {
                <$wheel>::new()
            }
            #[inline]
            fn insert(&mut self, deadline: u64, value: u64) -> $key {
                <$wheel>::insert(self, deadline, value)
            }
            #[inline]
            fn cancel(&mut self, key: $key) -> Option<u64> {
                <$wheel>::cancel(self, key)
            }
            #[inline]
            fn reset(&mut self, key: $key, deadline: u64) -> bool {
                <$wheel>::reset(self, key, deadline)
            }
            #[inline]
            fn deadline(&self, key: $key) -> Option<u64> {
                <$wheel>::deadline(self, key)
            }
            #[inline]
            fn poll(&mut self, now: u64, max: usize, mut f: impl FnMut(u64)) -> usize {
                <$wheel>::poll(self, now, max, |_, value| f(value))
            }
        }
    };
}

impl_wheel!(baseline::TimerWheel<u64>, baseline::TimerKey);
impl_wheel!(TimerWheel<u64>, TimerKey);

/// Nanoseconds of CPU time this thread has used.
fn cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec for the call's duration.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// splitmix64, as in the `wheel` bench.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % n
    }
}

const OPS: usize = 1 << 20;
const DENSE_TIMERS: u64 = 1_000_000;
const DENSE_MIN: u64 = 1_000;
const DENSE_MAX: u64 = 3_600_000;

/// The `wheel` bench's lifetime scenario: 1e6 timers over 60 s, from `new()`
/// to the last expiry; ns per timer.
#[inline(never)]
fn lifetime<W: Wheel>() -> f64 {
    let mut rng = Rng(11);
    let deadlines: Vec<u64> = (0..1_000_000).map(|_| 1 + rng.below(60_000)).collect();
    let start = cpu_ns();
    let mut wheel = W::new();
    for (i, &deadline) in deadlines.iter().enumerate() {
        wheel.insert(deadline, i as u64);
    }
    let mut fired = 0;
    for now in 1..=60_000 {
        fired += wheel.poll(now, usize::MAX, |v| {
            black_box(v);
        });
    }
    let took = cpu_ns() - start;
    assert_eq!(fired, 1_000_000);
    took as f64 / 1e6
}

/// The `wheel` bench's dense scenario: 1e6 timers from 1 s to 1 h.
struct Dense<W: Wheel> {
    wheel: W,
    keys: Vec<W::Key>,
    picks: Vec<(usize, u64)>,
}

fn dense<W: Wheel>() -> Dense<W> {
    let mut rng = Rng(7);
    let mut wheel = W::new();
    let keys = (0..DENSE_TIMERS)
        .map(|i| wheel.insert(DENSE_MIN + rng.below(DENSE_MAX - DENSE_MIN), i))
        .collect();
    let picks = (0..1 << 16)
        .map(|_| {
            let deadline = DENSE_MIN + rng.below(DENSE_MAX - DENSE_MIN);
            (rng.below(DENSE_TIMERS) as usize, deadline)
        })
        .collect();
    Dense { wheel, keys, picks }
}

/// Times `OPS` calls of `op` over the picks; ns per call.
#[inline(always)]
fn per_pick<W: Wheel>(d: &mut Dense<W>, mut op: impl FnMut(&mut W, &mut W::Key, u64)) -> f64 {
    let start = cpu_ns();
    for n in 0..OPS {
        let (i, deadline) = d.picks[n & 0xffff];
        op(&mut d.wheel, &mut d.keys[i], deadline);
    }
    (cpu_ns() - start) as f64 / OPS as f64
}

#[inline(never)]
fn cancel_rearm<W: Wheel>(d: &mut Dense<W>) -> f64 {
    per_pick(d, |wheel, key, deadline| {
        let value = wheel.cancel(*key).expect("dense timers stay pending");
        *key = wheel.insert(deadline, value);
    })
}

#[inline(never)]
fn reset_later<W: Wheel>(d: &mut Dense<W>) -> f64 {
    per_pick(d, |wheel, key, _| {
        let deadline = wheel.deadline(*key).expect("dense timers stay pending");
        black_box(wheel.reset(*key, deadline + 1));
    })
}

#[inline(never)]
fn reset_random<W: Wheel>(d: &mut Dense<W>) -> f64 {
    per_pick(d, |wheel, key, deadline| {
        black_box(wheel.reset(*key, deadline));
    })
}

#[inline(never)]
fn dense_poll<W: Wheel>(d: &mut Dense<W>) -> f64 {
    let start = cpu_ns();
    for _ in 0..OPS * 8 {
        black_box(d.wheel.poll(black_box(DENSE_MIN - 1), usize::MAX, |_| unreachable!()));
    }
    (cpu_ns() - start) as f64 / (OPS * 8) as f64
}

/// Insert then cancel with 1e3 pending; ns per pair.
#[inline(never)]
fn churn<W: Wheel>() -> f64 {
    let mut wheel = W::new();
    let mut rng = Rng(3);
    for i in 0..1_000 {
        wheel.insert(1_000 + rng.below(30_000), i);
    }
    let mut deadline = 1_000;
    let start = cpu_ns();
    for _ in 0..OPS * 4 {
        deadline = if deadline >= 30_000 { 1_000 } else { deadline + 7 };
        let key = wheel.insert(black_box(deadline), 1);
        black_box(wheel.cancel(key));
    }
    (cpu_ns() - start) as f64 / (OPS * 4) as f64
}

/// Polls stepping 1 ms with `pending` timers, re-armed before they fire.
#[inline(never)]
fn sparse_poll<W: Wheel>(pending: bool) -> f64 {
    let mut wheel = W::new();
    let mut now = 0;
    let mut deadline = 30_000;
    let mut key = pending.then(|| wheel.insert(deadline, 1));
    let start = cpu_ns();
    for _ in 0..OPS * 8 {
        now += 1;
        if let Some(k) = key.filter(|_| deadline - now < 2) {
            wheel.cancel(k);
            deadline = now + 30_000;
            key = Some(wheel.insert(deadline, 1));
        }
        black_box(wheel.poll(black_box(now), usize::MAX, |_| unreachable!()));
    }
    (cpu_ns() - start) as f64 / (OPS * 8) as f64
}

/// One unbounded poll of `n` timers sharing a level-2 deadline; ns per timer.
#[inline(never)]
fn drain<W: Wheel>(n: u64) -> f64 {
    let mut wheel = W::new();
    for i in 0..n {
        wheel.insert(30_001, i);
    }
    let start = cpu_ns();
    let fired = wheel.poll(30_001, usize::MAX, |v| {
        black_box(v);
    });
    let took = cpu_ns() - start;
    assert_eq!(fired as u64, n);
    took as f64 / n as f64
}

type Old = baseline::TimerWheel<u64>;
type New = TimerWheel<u64>;

fn main() {
    let rounds: usize = std::env::var("ROUNDS").ok().and_then(|s| s.parse().ok()).unwrap_or(7);
    let filter = std::env::args().skip(1).find(|arg| !arg.starts_with('-')).unwrap_or_default();
    let wanted = |name: &str| name.contains(&filter);
    let dense_names = [
        "dense cancel + insert",
        "dense reset later",
        "dense reset random",
        "dense poll nothing due",
    ];
    let mut dense_pair =
        dense_names.iter().any(|name| wanted(name)).then(|| (dense::<Old>(), dense::<New>()));
    let mut results: Vec<(&str, Vec<f64>, Vec<f64>)> = Vec::new();
    for round in 0..rounds {
        let mut record =
            |name: &'static str, old: &mut dyn FnMut() -> f64, new: &mut dyn FnMut() -> f64| {
                if !wanted(name) {
                    return;
                }
                let (a, b) = if round % 2 == 0 {
                    let a = old();
                    (a, new())
                } else {
                    let b = new();
                    (old(), b)
                };
                match results.iter_mut().find(|r| r.0 == name) {
                    Some(r) => {
                        r.1.push(a);
                        r.2.push(b);
                    }
                    None => results.push((name, vec![a], vec![b])),
                }
            };
        record("lifetime, ns per timer", &mut lifetime::<Old>, &mut lifetime::<New>);
        if let Some((old, new)) = dense_pair.as_mut() {
            record("dense cancel + insert", &mut || cancel_rearm(old), &mut || cancel_rearm(new));
            record("dense reset later", &mut || reset_later(old), &mut || reset_later(new));
            record("dense reset random", &mut || reset_random(old), &mut || reset_random(new));
            record("dense poll nothing due", &mut || dense_poll(old), &mut || dense_poll(new));
        }
        record("churn insert + cancel", &mut churn::<Old>, &mut churn::<New>);
        record("sparse 0 poll nothing due", &mut || sparse_poll::<Old>(false), &mut || {
            sparse_poll::<New>(false)
        });
        record("sparse 1 poll nothing due", &mut || sparse_poll::<Old>(true), &mut || {
            sparse_poll::<New>(true)
        });
        record("drain 1e5, ns per timer", &mut || drain::<Old>(100_000), &mut || {
            drain::<New>(100_000)
        });
        record("drain 1e6, ns per timer", &mut || drain::<Old>(1_000_000), &mut || {
            drain::<New>(1_000_000)
        });
    }
    println!(
        "{:<28} {:>9} {:>9} {:>8}  (ns, median of {rounds} rounds; min..max)",
        "scenario", "before", "after", "ratio"
    );
    for (name, mut old, mut new) in results {
        old.sort_by(f64::total_cmp);
        new.sort_by(f64::total_cmp);
        let (a, b) = (old[old.len() / 2], new[new.len() / 2]);
        println!(
            "{name:<28} {a:>9.2} {b:>9.2} {:>8.3}  before {:.2}..{:.2}, after {:.2}..{:.2}",
            b / a,
            old[0],
            old[old.len() - 1],
            new[0],
            new[new.len() - 1]
        );
    }
}
