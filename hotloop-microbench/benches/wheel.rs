//! The timer wheel against three baselines.
//!
//! - `btree`: a `BTreeMap<(deadline, seq), T>` ordered queue.
//! - `heap`: a `BinaryHeap` of `(deadline, slot, generation)` with lazy
//!   cancellation (cancelled entries stay in the heap until they surface or a
//!   compaction drops them).
//! - `neqo`: a flat 16,384-slot wheel that scans every slot for the next timer,
//!   the design of neqo's `neqo_common::timer::Timer` (mozilla/neqo#1780).
//!
//! Scenarios: sparse (0 and 1 pending, time stepped 1 ms at a time), dense
//! (1e6 pending over 1 s to 1 h, random cancel and re-arm, and the wheel's
//! `reset` to a later or a random deadline), churn (insert then
//! cancel), clustered (1e3 to 1e6 timers with one deadline, drained at once and
//! with a batch bound of 1024), lifetime (1e6 timers from insertion to expiry,
//! stepping 1 ms) and memory (printed before the benchmarks run).
//!
//! Run with `cargo bench -p hotloop-microbench --bench wheel`; ticks are milliseconds.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Wake, Waker};
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{criterion_group, BenchmarkGroup, Criterion, SamplingMode};
use hotloop::time::wheel::{TimerKey, TimerWheel};

/// Counts live heap bytes so the memory report measures real allocations.
struct CountingAlloc;

static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged, so `System`'s guarantees hold; the counter is only bookkeeping.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE_BYTES.fetch_add(new_size, Ordering::Relaxed);
        LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller upholds `GlobalAlloc::realloc`'s contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAlloc = CountingAlloc;

/// One second in ticks.
const SECOND: u64 = 1_000;

/// The operations every scenario needs, over `u64` values.
trait Queue: Sized {
    type Key: Copy;
    const NAME: &'static str;
    /// An empty queue for deadlines up to `span` ticks ahead.
    fn for_span(span: u64) -> Self;
    fn insert(&mut self, deadline: u64, value: u64) -> Self::Key;
    fn cancel(&mut self, key: Self::Key) -> Option<u64>;
    fn next_deadline(&mut self) -> Option<u64>;
    fn poll(&mut self, now: u64, max: usize, f: impl FnMut(u64)) -> usize;
}

impl Queue for TimerWheel<u64> {
    type Key = TimerKey;
    const NAME: &'static str = "wheel";

    fn for_span(_: u64) -> Self {
        TimerWheel::new()
    }

    #[inline]
    fn insert(&mut self, deadline: u64, value: u64) -> TimerKey {
        TimerWheel::insert(self, deadline, value)
    }

    #[inline]
    fn cancel(&mut self, key: TimerKey) -> Option<u64> {
        TimerWheel::cancel(self, key)
    }

    #[inline]
    fn next_deadline(&mut self) -> Option<u64> {
        TimerWheel::next_deadline(self)
    }

    #[inline]
    fn poll(&mut self, now: u64, max: usize, mut f: impl FnMut(u64)) -> usize {
        TimerWheel::poll(self, now, max, |_, value| f(value))
    }
}

/// Baseline: an ordered map keyed by `(deadline, insertion sequence)`.
struct BTreeQueue {
    map: BTreeMap<(u64, u64), u64>,
    seq: u64,
}

impl Queue for BTreeQueue {
    type Key = (u64, u64);
    const NAME: &'static str = "btree";

    fn for_span(_: u64) -> Self {
        BTreeQueue { map: BTreeMap::new(), seq: 0 }
    }

    fn insert(&mut self, deadline: u64, value: u64) -> (u64, u64) {
        self.seq += 1;
        self.map.insert((deadline, self.seq), value);
        (deadline, self.seq)
    }

    fn cancel(&mut self, key: (u64, u64)) -> Option<u64> {
        self.map.remove(&key)
    }

    fn next_deadline(&mut self) -> Option<u64> {
        self.map.first_key_value().map(|(&(deadline, _), _)| deadline)
    }

    fn poll(&mut self, now: u64, max: usize, mut f: impl FnMut(u64)) -> usize {
        let mut fired = 0;
        while fired < max {
            match self.map.first_entry() {
                Some(entry) if entry.key().0 <= now => f(entry.remove()),
                _ => break,
            }
            fired += 1;
        }
        fired
    }
}

/// Baseline: a binary heap with lazy cancellation. Values live in a slab with
/// generations; heap entries whose generation no longer matches are skipped.
struct HeapQueue {
    heap: BinaryHeap<Reverse<(u64, u32, u32)>>,
    slots: Vec<(u32, Option<u64>)>,
    free: Vec<u32>,
    live: usize,
}

impl HeapQueue {
    fn is_live(&self, index: u32, generation: u32) -> bool {
        self.slots[index as usize].0 == generation
    }

    fn take(&mut self, index: u32) -> u64 {
        let slot = &mut self.slots[index as usize];
        slot.0 = slot.0.wrapping_add(1);
        self.free.push(index);
        self.live -= 1;
        slot.1.take().expect("live heap slot has a value")
    }
}

impl Queue for HeapQueue {
    type Key = (u32, u32);
    const NAME: &'static str = "heap";

    fn for_span(_: u64) -> Self {
        HeapQueue { heap: BinaryHeap::new(), slots: Vec::new(), free: Vec::new(), live: 0 }
    }

    fn insert(&mut self, deadline: u64, value: u64) -> (u32, u32) {
        let index = match self.free.pop() {
            Some(index) => index,
            None => {
                self.slots.push((0, None));
                (self.slots.len() - 1) as u32
            }
        };
        let slot = &mut self.slots[index as usize];
        slot.1 = Some(value);
        self.live += 1;
        self.heap.push(Reverse((deadline, index, slot.0)));
        (index, slot.0)
    }

    fn cancel(&mut self, (index, generation): (u32, u32)) -> Option<u64> {
        if !self.is_live(index, generation) {
            return None;
        }
        let value = self.take(index);
        // Drop dead entries once they outnumber live ones, or the heap grows
        // without bound under churn.
        if self.heap.len() > 2 * self.live + 1024 {
            let slots = &self.slots;
            self.heap.retain(|Reverse((_, i, g))| slots[*i as usize].0 == *g);
        }
        Some(value)
    }

    fn next_deadline(&mut self) -> Option<u64> {
        while let Some(&Reverse((deadline, index, generation))) = self.heap.peek() {
            if self.is_live(index, generation) {
                return Some(deadline);
            }
            self.heap.pop();
        }
        None
    }

    fn poll(&mut self, now: u64, max: usize, mut f: impl FnMut(u64)) -> usize {
        let mut fired = 0;
        while fired < max {
            let Some(&Reverse((deadline, index, generation))) = self.heap.peek() else {
                break;
            };
            if !self.is_live(index, generation) {
                self.heap.pop();
                continue;
            }
            if deadline > now {
                break;
            }
            self.heap.pop();
            f(self.take(index));
            fired += 1;
        }
        fired
    }
}

/// Baseline: neqo's flat timer wheel. 16,384 buckets of `granularity` ticks,
/// each a deque sorted by deadline; finding the next timer scans every bucket
/// from the cursor on.
struct NeqoWheel {
    items: Vec<VecDeque<(u64, u64)>>,
    now: u64,
    granularity: u64,
    cursor: usize,
}

const NEQO_BUCKETS: usize = 16_384;

impl NeqoWheel {
    fn delta(&self, time: u64) -> usize {
        // neqo asserts the deadline is inside the span; clamp instead.
        ((time.saturating_sub(self.now) / self.granularity) as usize).min(NEQO_BUCKETS - 1)
    }

    fn bucket(&self, delta: usize) -> usize {
        (self.cursor + delta) % NEQO_BUCKETS
    }

    /// neqo's `take_next`: the first bucket, in cursor order, whose earliest
    /// item is due.
    fn take_next(&mut self, until: u64) -> Option<u64> {
        for i in (self.cursor..NEQO_BUCKETS).chain(0..self.cursor) {
            let bucket = &mut self.items[i];
            if bucket.front().is_some_and(|&(time, _)| time <= until) {
                return bucket.pop_front().map(|(_, value)| value);
            }
        }
        None
    }
}

impl Queue for NeqoWheel {
    type Key = (u64, u64);
    const NAME: &'static str = "neqo";

    fn for_span(span: u64) -> Self {
        NeqoWheel {
            items: (0..NEQO_BUCKETS).map(|_| VecDeque::new()).collect(),
            now: 0,
            granularity: span.div_ceil(NEQO_BUCKETS as u64 - 1).max(1),
            cursor: 0,
        }
    }

    fn insert(&mut self, deadline: u64, value: u64) -> (u64, u64) {
        let bucket = self.bucket(self.delta(deadline));
        let items = &mut self.items[bucket];
        let at = items.partition_point(|&(time, _)| time <= deadline);
        items.insert(at, (deadline, value));
        (deadline, value)
    }

    fn cancel(&mut self, (deadline, value): (u64, u64)) -> Option<u64> {
        let bucket = self.bucket(self.delta(deadline));
        let items = &mut self.items[bucket];
        let from = items.partition_point(|&(time, _)| time < deadline);
        let at = (from..items.len()).find(|&i| items[i] == (deadline, value))?;
        items.remove(at).map(|(_, value)| value)
    }

    fn next_deadline(&mut self) -> Option<u64> {
        (0..NEQO_BUCKETS)
            .find_map(|delta| self.items[self.bucket(delta)].front())
            .map(|&(time, _)| time)
    }

    fn poll(&mut self, now: u64, max: usize, mut f: impl FnMut(u64)) -> usize {
        let mut fired = 0;
        while fired < max {
            match self.take_next(now) {
                Some(value) => f(value),
                None => break,
            }
            fired += 1;
        }
        if fired < max && now > self.now {
            // Every bucket before `now`'s has been emptied: move the cursor.
            let delta = self.delta(now);
            self.cursor = self.bucket(delta);
            self.now += delta as u64 * self.granularity;
        }
        fired
    }
}

/// splitmix64: a small deterministic generator, so every queue sees the same
/// deadlines.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn fast(group: &mut BenchmarkGroup<'_, WallTime>) {
    group
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_millis(1_000))
        .sample_size(30);
}

fn heavy(group: &mut BenchmarkGroup<'_, WallTime>) {
    group
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_millis(1))
        .measurement_time(Duration::from_millis(500))
        .sample_size(10);
}

/// `next_deadline` as one `u64` for `black_box`: handing it the 16-byte
/// `Option` made the compiler store it with one vector write and read it back
/// as two words, a store-forwarding stall that cost more than the call.
#[inline]
fn next_deadline_scalar<Q: Queue>(queue: &mut Q) -> u64 {
    black_box(queue.next_deadline().unwrap_or(u64::MAX))
}

// ---------------------------------------------------------------- (1) sparse

/// Deadline of the single timer in the sparse scenario, relative to now.
const SPARSE_TIMEOUT: u64 = 30 * SECOND;

fn sparse_one<Q: Queue>(group: &mut BenchmarkGroup<'_, WallTime>, pending: usize) {
    let mut queue = Q::for_span(2 * SPARSE_TIMEOUT);
    let mut now = 0;
    let mut deadline = SPARSE_TIMEOUT;
    let mut key = (pending == 1).then(|| queue.insert(deadline, 1));
    group.bench_function(format!("next_deadline/{}/{pending}", Q::NAME), |b| {
        b.iter(|| next_deadline_scalar(&mut queue))
    });
    group.bench_function(format!("poll_nothing_due/{}/{pending}", Q::NAME), |b| {
        b.iter(|| {
            now += 1;
            if let Some(k) = key.filter(|_| deadline - now < 2) {
                // Push the timer out before it fires (once per 30 000 steps).
                queue.cancel(k);
                deadline = now + SPARSE_TIMEOUT;
                key = Some(queue.insert(deadline, 1));
            }
            black_box(queue.poll(black_box(now), usize::MAX, |_| unreachable!()))
        })
    });
}

fn sparse(c: &mut Criterion) {
    let mut group = c.benchmark_group("sparse");
    fast(&mut group);
    for pending in [0, 1] {
        sparse_one::<TimerWheel<u64>>(&mut group, pending);
        sparse_one::<BTreeQueue>(&mut group, pending);
        sparse_one::<HeapQueue>(&mut group, pending);
        sparse_one::<NeqoWheel>(&mut group, pending);
    }
    group.finish();
}

// ----------------------------------------------------------------- (2) dense

const DENSE_TIMERS: usize = 1_000_000;
const DENSE_MIN: u64 = SECOND;
const DENSE_MAX: u64 = 3_600 * SECOND;

fn dense_queue<Q: Queue>(rng: &mut Rng) -> (Q, Vec<Q::Key>) {
    let mut queue = Q::for_span(DENSE_MAX + SECOND);
    let keys = (0..DENSE_TIMERS as u64)
        .map(|i| queue.insert(DENSE_MIN + rng.below(DENSE_MAX - DENSE_MIN), i))
        .collect();
    (queue, keys)
}

fn dense_one<Q: Queue>(group: &mut BenchmarkGroup<'_, WallTime>) {
    let mut rng = Rng(7);
    let (mut queue, mut keys) = dense_queue::<Q>(&mut rng);
    group.bench_function(format!("next_deadline/{}", Q::NAME), |b| {
        b.iter(|| next_deadline_scalar(&mut queue))
    });
    group.bench_function(format!("poll_nothing_due/{}", Q::NAME), |b| {
        b.iter(|| black_box(queue.poll(black_box(DENSE_MIN - 1), usize::MAX, |_| unreachable!())))
    });
    let picks: Vec<(usize, u64)> = (0..1 << 16)
        .map(|_| {
            let deadline = DENSE_MIN + rng.below(DENSE_MAX - DENSE_MIN);
            (rng.below(DENSE_TIMERS as u64) as usize, deadline)
        })
        .collect();
    let mut next_pick = 0;
    group.bench_function(format!("cancel_rearm/{}", Q::NAME), |b| {
        b.iter(|| {
            let (i, deadline) = picks[next_pick & 0xffff];
            next_pick += 1;
            let value = queue.cancel(keys[i]).expect("dense timers stay pending");
            keys[i] = queue.insert(deadline, value);
        })
    });
}

fn dense_reset_later(group: &mut BenchmarkGroup<'_, WallTime>) {
    let mut rng = Rng(7);
    let (mut wheel, keys) = dense_queue::<TimerWheel<u64>>(&mut rng);
    let picks: Vec<usize> = (0..1 << 16).map(|_| rng.below(DENSE_TIMERS as u64) as usize).collect();
    let mut next_pick = 0;
    group.bench_function("reset_later/wheel", |b| {
        b.iter(|| {
            let key = keys[picks[next_pick & 0xffff]];
            next_pick += 1;
            let deadline = wheel.deadline(key).expect("dense timers stay pending");
            wheel.reset(key, deadline + 1)
        })
    });
}

/// The runtime's re-arm: `reset` of a random timer to a random deadline in
/// the same range (half move earlier, half are pushed back lazily).
fn dense_reset_random(group: &mut BenchmarkGroup<'_, WallTime>) {
    let mut rng = Rng(7);
    let (mut wheel, keys) = dense_queue::<TimerWheel<u64>>(&mut rng);
    let picks: Vec<(usize, u64)> = (0..1 << 16)
        .map(|_| {
            let deadline = DENSE_MIN + rng.below(DENSE_MAX - DENSE_MIN);
            (rng.below(DENSE_TIMERS as u64) as usize, deadline)
        })
        .collect();
    let mut next_pick = 0;
    group.bench_function("reset_random/wheel", |b| {
        b.iter(|| {
            let (i, deadline) = picks[next_pick & 0xffff];
            next_pick += 1;
            wheel.reset(keys[i], deadline)
        })
    });
}

fn dense(c: &mut Criterion) {
    let mut group = c.benchmark_group("dense");
    fast(&mut group);
    dense_one::<TimerWheel<u64>>(&mut group);
    dense_reset_later(&mut group);
    dense_reset_random(&mut group);
    dense_one::<BTreeQueue>(&mut group);
    dense_one::<HeapQueue>(&mut group);
    dense_one::<NeqoWheel>(&mut group);
    group.finish();
}

// ----------------------------------------------------------------- (3) churn

/// Timers already pending while the churn runs.
const CHURN_BACKGROUND: u64 = 1_000;

fn churn_queue<Q: Queue>() -> Q {
    let mut queue = Q::for_span(2 * SPARSE_TIMEOUT);
    let mut rng = Rng(3);
    for i in 0..CHURN_BACKGROUND {
        queue.insert(SECOND + rng.below(SPARSE_TIMEOUT), i);
    }
    queue
}

fn churn_one<Q: Queue>(group: &mut BenchmarkGroup<'_, WallTime>) {
    let mut queue = churn_queue::<Q>();
    let mut deadline = SECOND;
    group.bench_function(format!("insert_cancel/{}", Q::NAME), |b| {
        b.iter(|| {
            deadline = if deadline >= SPARSE_TIMEOUT { SECOND } else { deadline + 7 };
            let key = queue.insert(black_box(deadline), 1);
            queue.cancel(key)
        })
    });
}

/// Inserts alone and cancels alone, timed in batches of 1024.
fn churn_split(group: &mut BenchmarkGroup<'_, WallTime>) {
    const BATCH: u64 = 1024;
    let mut wheel = churn_queue::<TimerWheel<u64>>();
    let mut keys = Vec::with_capacity(BATCH as usize);
    let mut run = |iters: u64, time_inserts: bool| {
        let mut timed = Duration::ZERO;
        let mut left = iters;
        while left > 0 {
            let n = left.min(BATCH);
            left -= n;
            let start = Instant::now();
            for i in 0..n {
                keys.push(wheel.insert(SECOND + i * 29, i));
            }
            let inserted = Instant::now();
            for key in keys.drain(..) {
                black_box(wheel.cancel(key));
            }
            timed += if time_inserts { inserted - start } else { inserted.elapsed() };
        }
        timed
    };
    group.bench_function("insert/wheel", |b| b.iter_custom(|iters| run(iters, true)));
    group.bench_function("cancel/wheel", |b| b.iter_custom(|iters| run(iters, false)));
}

fn churn(c: &mut Criterion) {
    let mut group = c.benchmark_group("churn");
    fast(&mut group);
    churn_one::<TimerWheel<u64>>(&mut group);
    churn_split(&mut group);
    churn_one::<BTreeQueue>(&mut group);
    churn_one::<HeapQueue>(&mut group);
    churn_one::<NeqoWheel>(&mut group);
    group.finish();
}

// ------------------------------------------------------------- (4) clustered

/// The shared deadline: in level 2 of the wheel when inserted at tick 0, so
/// draining it from tick 0 includes two cascades.
const CLUSTER_DEADLINE: u64 = 30 * SECOND + 1;
const CLUSTER_BATCH_MAX: usize = 1024;

fn clustered_queue<Q: Queue>(timers: u64) -> Q {
    let mut queue = Q::for_span(2 * SPARSE_TIMEOUT);
    for i in 0..timers {
        queue.insert(CLUSTER_DEADLINE, i);
    }
    queue
}

/// Times one `poll(CLUSTER_DEADLINE, max)` on a freshly filled queue.
fn time_first_poll<Q: Queue>(iters: u64, timers: u64, max: usize) -> Duration {
    let mut timed = Duration::ZERO;
    for _ in 0..iters {
        let mut queue = clustered_queue::<Q>(timers);
        let start = Instant::now();
        let fired = queue.poll(CLUSTER_DEADLINE, max, |v| {
            black_box(v);
        });
        timed += start.elapsed();
        assert_eq!(fired as u64, timers.min(max as u64));
    }
    timed
}

fn clustered_one<Q: Queue>(group: &mut BenchmarkGroup<'_, WallTime>, timers: u64) {
    group.bench_function(format!("drain/{}/{timers}", Q::NAME), |b| {
        b.iter_custom(|iters| time_first_poll::<Q>(iters, timers, usize::MAX))
    });
    if timers == 100_000 {
        group.bench_function(format!("first_bounded_call/{}/{timers}", Q::NAME), |b| {
            b.iter_custom(|iters| time_first_poll::<Q>(iters, timers, CLUSTER_BATCH_MAX))
        });
    }
}

/// The slowest single bounded call while draining a cluster, by wall clock.
fn worst_bounded_call<Q: Queue>(timers: u64) -> Duration {
    let mut queue = clustered_queue::<Q>(timers);
    let mut worst = Duration::ZERO;
    loop {
        let start = Instant::now();
        let fired = queue.poll(CLUSTER_DEADLINE, CLUSTER_BATCH_MAX, |v| {
            black_box(v);
        });
        worst = worst.max(start.elapsed());
        if fired < CLUSTER_BATCH_MAX {
            return worst;
        }
    }
}

fn clustered(c: &mut Criterion) {
    let mut group = c.benchmark_group("clustered");
    heavy(&mut group);
    for timers in [1_000, 100_000, 1_000_000] {
        clustered_one::<TimerWheel<u64>>(&mut group, timers);
        clustered_one::<BTreeQueue>(&mut group, timers);
        clustered_one::<HeapQueue>(&mut group, timers);
        // neqo rescans the buckets before the cluster for every timer it
        // takes: a million would take seconds per drain, so stop at 1e5.
        if timers <= 100_000 {
            clustered_one::<NeqoWheel>(&mut group, timers);
        }
    }
    group.finish();
    if !wanted("clustered/worst_bounded_call") {
        return;
    }
    for (name, worst) in [
        ("wheel", worst_bounded_call::<TimerWheel<u64>>(100_000)),
        ("btree", worst_bounded_call::<BTreeQueue>(100_000)),
        ("heap", worst_bounded_call::<HeapQueue>(100_000)),
        ("neqo", worst_bounded_call::<NeqoWheel>(100_000)),
    ] {
        println!("clustered/worst_bounded_call/{name}/100000: {worst:?} (max {CLUSTER_BATCH_MAX} per call, one run)");
    }
}

// -------------------------------------------------------------- (5) lifetime

const LIFETIME_TIMERS: u64 = 1_000_000;
/// Deadlines spread over the first minute: levels 0 to 2, so most timers
/// cascade twice.
const LIFETIME_SPAN: u64 = 60 * SECOND;

/// Inserts every timer at tick 0, then polls each tick until all have fired.
fn lifetime_run<Q: Queue>(iters: u64) -> Duration {
    let mut timed = Duration::ZERO;
    for _ in 0..iters {
        let mut rng = Rng(11);
        let deadlines: Vec<u64> =
            (0..LIFETIME_TIMERS).map(|_| 1 + rng.below(LIFETIME_SPAN)).collect();
        let start = Instant::now();
        let mut queue = Q::for_span(LIFETIME_SPAN + SECOND);
        for (i, &deadline) in deadlines.iter().enumerate() {
            queue.insert(deadline, i as u64);
        }
        let mut fired = 0;
        for now in 1..=LIFETIME_SPAN {
            fired += queue.poll(now, usize::MAX, |v| {
                black_box(v);
            });
        }
        timed += start.elapsed();
        assert_eq!(fired as u64, LIFETIME_TIMERS);
    }
    timed
}

fn lifetime(c: &mut Criterion) {
    let mut group = c.benchmark_group("lifetime");
    heavy(&mut group);
    group.bench_function("1e6_over_60s/wheel", |b| b.iter_custom(lifetime_run::<TimerWheel<u64>>));
    group.bench_function("1e6_over_60s/btree", |b| b.iter_custom(lifetime_run::<BTreeQueue>));
    group.bench_function("1e6_over_60s/heap", |b| b.iter_custom(lifetime_run::<HeapQueue>));
    group.finish();
    // neqo scans all 16,384 buckets on each of the 60,000 steps: about ten
    // seconds a run here, too long for criterion's ten samples.
    if wanted("lifetime/1e6_over_60s/neqo") {
        let took = lifetime_run::<NeqoWheel>(1);
        println!("lifetime/1e6_over_60s/neqo: {took:?} (one run)");
    }
}

// ---------------------------------------------------------------- (6) memory

/// Heap bytes held by the queue `build` returns, plus its inline size.
fn measure<Q>(build: impl FnOnce() -> Q) -> usize {
    let before = LIVE_BYTES.load(Ordering::Relaxed);
    let queue = build();
    let bytes = LIVE_BYTES.load(Ordering::Relaxed) - before + std::mem::size_of::<Q>();
    drop(queue);
    bytes
}

fn per_timer<Q>(timers: usize, build: impl FnOnce() -> Q) -> f64 {
    measure(build) as f64 / timers as f64
}

fn fill<Q: Queue>(mut queue: Q, timers: usize) -> Q {
    let mut rng = Rng(5);
    for i in 0..timers as u64 {
        queue.insert(DENSE_MIN + rng.below(DENSE_MAX - DENSE_MIN), i);
    }
    queue
}

/// A waker that does nothing; all clones share one allocation.
struct NoopWake;

impl Wake for NoopWake {
    fn wake(self: Arc<Self>) {}
}

fn fill_wakers(mut wheel: TimerWheel<Waker>, timers: usize) -> TimerWheel<Waker> {
    let mut rng = Rng(5);
    let waker = Waker::from(Arc::new(NoopWake));
    for _ in 0..timers {
        wheel.insert(DENSE_MIN + rng.below(DENSE_MAX - DENSE_MIN), waker.clone());
    }
    wheel
}

fn memory_report() {
    let n = DENSE_TIMERS;
    println!(
        "memory: empty TimerWheel<u64>: {} bytes (inline, no heap)",
        measure(TimerWheel::<u64>::new)
    );
    println!("memory: empty neqo wheel: {} bytes", measure(|| NeqoWheel::for_span(DENSE_MAX)));
    println!(
        "memory: wheel<u64>, 1e6 timers: {:.1} B/timer grown from new(), {:.1} B/timer with_capacity(1e6)",
        per_timer(n, || fill(TimerWheel::<u64>::new(), n)),
        per_timer(n, || fill(TimerWheel::<u64>::with_capacity(n), n)),
    );
    println!(
        "memory: wheel<Waker>, 1e6 timers: {:.1} B/timer grown from new(), {:.1} B/timer with_capacity(1e6)",
        per_timer(n, || fill_wakers(TimerWheel::new(), n)),
        per_timer(n, || fill_wakers(TimerWheel::with_capacity(n), n)),
    );
    println!(
        "memory: 1e6 u64 timers: btree {:.1} B/timer, heap {:.1} B/timer, neqo {:.1} B/timer",
        per_timer(n, || fill(BTreeQueue::for_span(DENSE_MAX), n)),
        per_timer(n, || fill(HeapQueue::for_span(DENSE_MAX), n)),
        per_timer(n, || fill(NeqoWheel::for_span(DENSE_MAX + SECOND), n)),
    );
}

criterion_group!(benches, sparse, dense, churn, clustered, lifetime);

/// Whether the command line's filter, if any, selects the named report.
fn wanted(report: &str) -> bool {
    let filter = std::env::args().skip(1).find(|arg| !arg.starts_with('-'));
    filter.is_none_or(|filter| report.contains(&filter))
}

fn main() {
    if wanted("memory") {
        memory_report();
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
