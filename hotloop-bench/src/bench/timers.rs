//! `timers`: the neqo experiment. hotloop's timer wheel against an ordered
//! map and against neqo's flat wheel (16,384 slots, every slot scanned for
//! the next timer), timed in this process: taking the next timer from an
//! empty queue and from a queue holding one, draining a batch of due
//! timers, and re-arming one timer among many. When `cargo bench -p
//! hotloop-microbench --bench wheel` has left criterion results,
//! they are shown too.
//!
//! # Implementation notes
//! - Each case runs on each queue in short samples until its time is
//!   spent; the figure is the median nanoseconds per operation over the
//!   samples, with their range as the spread. The three queues take turns
//!   sample by sample, so a slow spell of a shared machine falls on all.
//! - Ticks are milliseconds, as in the runtime; the flat wheel's slot width
//!   is its span over its 16,384 slots, as neqo sizes it.

use std::collections::{BTreeMap, VecDeque};
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use hotloop::time::wheel::{TimerKey, TimerWheel};

use super::report::{format_figure, Better, Column, Row, Summary};
use super::{Ctx, ScenarioResult};

/// How deep below `target/criterion` result files are looked for.
const SEARCH_DEPTH_MAX: usize = 6;
/// Samples per case and queue.
const SAMPLES: usize = 7;
/// Time per case and queue, full run.
const CASE_TIME_FULL: Duration = Duration::from_millis(700);
/// Time per case and queue with `--quick`.
const CASE_TIME_QUICK: Duration = Duration::from_millis(70);
/// Timers pending in the "many" case.
const MANY_TIMERS: u64 = 100_000;
/// Timers drained at once in the "drain" case (neqo's "drain a timer
/// quickly" holds 100).
const DRAIN_TIMERS: u64 = 100;
/// How far out the one pending timer of [`Case::TakeNextOne`] is, in ticks.
const ONE_TIMER_TICKS: u64 = 30_000;
/// The farthest deadline any case sets, in ticks (one hour).
const SPAN_TICKS: u64 = 3_600_000;

/// The table's columns.
pub fn columns() -> Vec<Column> {
    vec![Column { key: "median_ns", header: "ns/op", decimals: 1, better: Better::Lower }]
}

/// Runs the scenario.
pub fn run(ctx: &mut Ctx) -> ScenarioResult {
    let case_time = if ctx.quick { CASE_TIME_QUICK } else { CASE_TIME_FULL };
    let mut result = ScenarioResult::new(
        "timers",
        "timer queues: hotloop's wheel, an ordered map and neqo's flat wheel (ns per operation)",
        "neqo: a 16,384-slot wheel scanned every slot for one timer, up to 33% of CPU; \
         \"drain an empty timer\" 40.6 -> 25.8 µs",
        columns(),
    );
    result.setup.push(format!(
        "measured in this process: {SAMPLES} samples per case and queue, {} ms in all, the queues taking turns; \
         ns/op is the median sample, the spread their range; ticks are milliseconds",
        case_time.as_millis()
    ));
    for case in Case::ALL {
        ctx.progress(&format!("timers: {}", case.title()));
        result.rows.extend(measure_case(case, case_time));
    }
    add_criterion_rows(ctx, &mut result);
    // hotloop's wheel here, and criterion's rows named `hotloop`.
    result.compare_as(&["timer wheel", ""]);
    result
}

/// What is timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Case {
    /// Take the next due timer from an empty queue, the clock stepping one
    /// tick each time (neqo's "drain an empty timer").
    TakeNextEmpty,
    /// The same with one timer pending 30 s out: a server with one
    /// connection, whose loop asks for due timers whenever it is idle.
    TakeNextOne,
    /// Insert 100 timers, then take them all once due.
    Drain,
    /// With 100,000 timers pending over an hour, cancel one and set it again.
    RearmAmongMany,
}

impl Case {
    /// Every case, in the order the table shows them.
    pub const ALL: [Case; 4] =
        [Case::TakeNextEmpty, Case::TakeNextOne, Case::Drain, Case::RearmAmongMany];

    /// The table group's title.
    pub fn title(self) -> String {
        match self {
            Case::TakeNextEmpty => "take the next timer, none pending".into(),
            Case::TakeNextOne => "take the next timer, one pending".into(),
            Case::Drain => format!("insert and drain {DRAIN_TIMERS} timers (per timer)"),
            Case::RearmAmongMany => format!("re-arm one of {MANY_TIMERS} timers"),
        }
    }
}

/// The operations every case needs, over `u64` values.
trait Queue {
    type Key: Copy;
    fn new() -> Self;
    fn insert(&mut self, deadline: u64, value: u64) -> Self::Key;
    fn cancel(&mut self, key: Self::Key) -> Option<u64>;
    /// Takes up to `max` timers due at `now`; returns how many.
    fn poll(&mut self, now: u64, max: usize) -> usize;
}

impl Queue for TimerWheel<u64> {
    type Key = TimerKey;
    fn new() -> Self {
        TimerWheel::new()
    }
    fn insert(&mut self, deadline: u64, value: u64) -> TimerKey {
        TimerWheel::insert(self, deadline, value)
    }
    fn cancel(&mut self, key: TimerKey) -> Option<u64> {
        TimerWheel::cancel(self, key)
    }
    fn poll(&mut self, now: u64, max: usize) -> usize {
        TimerWheel::poll(self, now, max, |_, v| {
            black_box(v);
        })
    }
}

/// An ordered map keyed by `(deadline, insertion sequence)`.
struct OrderedMap {
    map: BTreeMap<(u64, u64), u64>,
    seq: u64,
}

impl Queue for OrderedMap {
    type Key = (u64, u64);
    fn new() -> Self {
        OrderedMap { map: BTreeMap::new(), seq: 0 }
    }
    fn insert(&mut self, deadline: u64, value: u64) -> (u64, u64) {
        self.seq += 1;
        self.map.insert((deadline, self.seq), value);
        (deadline, self.seq)
    }
    fn cancel(&mut self, key: (u64, u64)) -> Option<u64> {
        self.map.remove(&key)
    }
    fn poll(&mut self, now: u64, max: usize) -> usize {
        let mut fired = 0;
        while fired < max {
            match self.map.first_entry() {
                Some(entry) if entry.key().0 <= now => {
                    black_box(entry.remove());
                }
                _ => break,
            }
            fired += 1;
        }
        fired
    }
}

/// Slots of neqo's flat wheel.
const NEQO_SLOTS: usize = 16_384;

/// neqo's timer before its fix (neqo-common `timer.rs`): a flat wheel of
/// sorted slots, where taking the next timer scans every slot from the
/// cursor on.
struct FlatWheel {
    slots: Vec<VecDeque<(u64, u64)>>,
    now: u64,
    granularity: u64,
    cursor: usize,
}

impl FlatWheel {
    fn delta(&self, time: u64) -> usize {
        // neqo asserts the deadline is inside the span; clamp instead.
        ((time.saturating_sub(self.now) / self.granularity) as usize).min(NEQO_SLOTS - 1)
    }

    fn slot(&self, delta: usize) -> usize {
        (self.cursor + delta) % NEQO_SLOTS
    }

    /// neqo's `take_next`: the first slot, in cursor order, whose earliest
    /// timer is due.
    fn take_next(&mut self, until: u64) -> Option<u64> {
        for i in (self.cursor..NEQO_SLOTS).chain(0..self.cursor) {
            let slot = &mut self.slots[i];
            if slot.front().is_some_and(|&(time, _)| time <= until) {
                return slot.pop_front().map(|(_, value)| value);
            }
        }
        None
    }
}

impl Queue for FlatWheel {
    type Key = (u64, u64);
    fn new() -> Self {
        FlatWheel {
            slots: (0..NEQO_SLOTS).map(|_| VecDeque::new()).collect(),
            now: 0,
            granularity: SPAN_TICKS.div_ceil(NEQO_SLOTS as u64 - 1).max(1),
            cursor: 0,
        }
    }
    fn insert(&mut self, deadline: u64, value: u64) -> (u64, u64) {
        let slot = self.slot(self.delta(deadline));
        let items = &mut self.slots[slot];
        let at = items.partition_point(|&(time, _)| time <= deadline);
        items.insert(at, (deadline, value));
        (deadline, value)
    }
    fn cancel(&mut self, (deadline, value): (u64, u64)) -> Option<u64> {
        let slot = self.slot(self.delta(deadline));
        let items = &mut self.slots[slot];
        let from = items.partition_point(|&(time, _)| time < deadline);
        let at = (from..items.len()).find(|&i| items[i] == (deadline, value))?;
        items.remove(at).map(|(_, value)| value)
    }
    fn poll(&mut self, now: u64, max: usize) -> usize {
        let mut fired = 0;
        while fired < max {
            match self.take_next(now) {
                Some(value) => {
                    black_box(value);
                }
                None => break,
            }
            fired += 1;
        }
        if fired < max && now > self.now {
            // Every slot before `now`'s is empty: move the cursor.
            let delta = self.delta(now);
            self.cursor = self.slot(delta);
            self.now += delta as u64 * self.granularity;
        }
        fired
    }
}

/// splitmix64: the same deadlines for every queue.
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

/// One queue set up for one case, timed a batch at a time.
struct Bench<Q: Queue> {
    case: Case,
    queue: Q,
    now: u64,
    keys: Vec<Q::Key>,
    /// The deadline of the one timer of [`Case::TakeNextOne`].
    deadline: u64,
    rng: Rng,
    ops: u64,
    elapsed: Duration,
}

impl<Q: Queue> Bench<Q> {
    fn new(case: Case) -> Self {
        let mut queue = Q::new();
        let mut rng = Rng(7);
        let mut keys = Vec::new();
        match case {
            Case::TakeNextEmpty | Case::Drain => {}
            Case::TakeNextOne => keys.push(queue.insert(ONE_TIMER_TICKS, 1)),
            Case::RearmAmongMany => {
                for i in 0..MANY_TIMERS {
                    keys.push(queue.insert(1_000 + rng.below(SPAN_TICKS - 2_000), i));
                }
            }
        }
        Bench {
            case,
            queue,
            now: 0,
            keys,
            deadline: ONE_TIMER_TICKS,
            rng,
            ops: 0,
            elapsed: Duration::ZERO,
        }
    }

    /// Runs `n` operations, timing them; returns how many were done.
    fn batch(&mut self, n: u64) -> u64 {
        let start = Instant::now();
        let done = match self.case {
            Case::TakeNextEmpty => {
                for _ in 0..n {
                    self.now += 1;
                    black_box(self.queue.poll(black_box(self.now), usize::MAX));
                }
                n
            }
            Case::TakeNextOne => {
                for _ in 0..n {
                    self.now += 1;
                    if self.deadline - self.now < 2 {
                        // Push the timer out before it fires, as a live
                        // connection's idle timer is (once per 30,000 steps).
                        self.queue.cancel(self.keys[0]);
                        self.deadline = self.now + ONE_TIMER_TICKS;
                        self.keys[0] = self.queue.insert(self.deadline, 1);
                    }
                    black_box(self.queue.poll(black_box(self.now), usize::MAX));
                }
                n
            }
            Case::Drain => {
                let rounds = n.div_ceil(DRAIN_TIMERS);
                for _ in 0..rounds {
                    self.now += 10;
                    for i in 0..DRAIN_TIMERS {
                        self.queue.insert(self.now + 1 + i % 7, i);
                    }
                    self.now += 8;
                    let fired = self.queue.poll(self.now, usize::MAX);
                    debug_assert_eq!(fired as u64, DRAIN_TIMERS);
                }
                rounds * DRAIN_TIMERS
            }
            Case::RearmAmongMany => {
                for _ in 0..n {
                    let i = self.rng.below(MANY_TIMERS) as usize;
                    let deadline = 1_000 + self.rng.below(SPAN_TICKS - 2_000);
                    let value = self.queue.cancel(self.keys[i]).expect("every timer stays pending");
                    self.keys[i] = self.queue.insert(deadline, value);
                }
                n
            }
        };
        self.elapsed += start.elapsed();
        self.ops += done;
        done
    }
}

/// Nanoseconds per operation of one sample lasting about `time`.
fn sample<Q: Queue>(bench: &mut Bench<Q>, time: Duration) -> f64 {
    let (ops_before, elapsed_before) = (bench.ops, bench.elapsed);
    let mut n = 16;
    while bench.elapsed - elapsed_before < time {
        bench.batch(n);
        n = (n * 2).min(1 << 16);
    }
    let ops = bench.ops - ops_before;
    (bench.elapsed - elapsed_before).as_nanos() as f64 / ops.max(1) as f64
}

/// One row per queue for `case`, their samples taken in turn.
fn measure_case(case: Case, case_time: Duration) -> Vec<Row> {
    let per_sample = case_time / SAMPLES as u32;
    let mut wheel = Bench::<TimerWheel<u64>>::new(case);
    let mut map = Bench::<OrderedMap>::new(case);
    let mut flat = Bench::<FlatWheel>::new(case);
    let mut samples = [Vec::new(), Vec::new(), Vec::new()];
    for _ in 0..SAMPLES {
        samples[0].push(sample(&mut wheel, per_sample));
        samples[1].push(sample(&mut map, per_sample));
        samples[2].push(sample(&mut flat, per_sample));
    }
    let group = case.title();
    [("hotloop", "timer wheel"), ("BTreeMap", ""), ("neqo", "flat wheel, 16,384 slots")]
        .into_iter()
        .zip(samples)
        .map(|((server, config), values)| {
            let mut row = Row::new(&group, server, config);
            if let Some(summary) = Summary::of(&values) {
                row.metrics.insert("median_ns".into(), summary);
            }
            row
        })
        .collect()
}

/// Adds the criterion results `cargo bench -p hotloop-microbench --bench wheel` left,
/// if any, as groups of their own: only those written after this
/// executable was built (older ones may be of other code), each labelled
/// with its date and given per timer (criterion times an iteration, which
/// may hold a million timers).
fn add_criterion_rows(ctx: &Ctx, result: &mut ScenarioResult) {
    let dirs = criterion_dirs(&ctx.exe);
    let Some(dir) = dirs.iter().find(|d| d.is_dir()) else {
        result.setup.push(
            "criterion's fuller set (dense queues, cascades, memory): `cargo bench -p hotloop-microbench --bench wheel`, \
             whose results a later run shows here"
                .into(),
        );
        return;
    };
    let built = std::env::current_exe()
        .and_then(std::fs::metadata)
        .and_then(|m| m.modified())
        .unwrap_or(SystemTime::UNIX_EPOCH);
    let mut files = Vec::new();
    find_estimates(dir, 0, &mut files);
    files.sort();
    let (rows, skipped) = criterion_rows(dir, &files, built);
    let shown = rows.len();
    result.rows.extend(rows);
    result.setup.push(format!(
        "also {shown} criterion results read from {} written after this build (groups named \"criterion ...\", \
         with their date; per timer where an iteration holds many)",
        dir.display()
    ));
    if skipped > 0 {
        result.setup.push(format!(
            "{skipped} criterion results older than this build left out: they may time other code; \
             `cargo bench -p hotloop-microbench --bench wheel` renews them"
        ));
    }
}

/// The rows of the criterion result `files` under `root` written after
/// `since`, and how many were older and left out. A row's group names
/// criterion's group, the timers per iteration when more than one, and the
/// date; its figures are nanoseconds per timer.
fn criterion_rows(root: &Path, files: &[PathBuf], since: SystemTime) -> (Vec<Row>, usize) {
    let mut rows = Vec::new();
    let mut skipped = 0;
    for file in files {
        let Some(written) = std::fs::metadata(file).and_then(|m| m.modified()).ok() else {
            continue;
        };
        if written < since {
            skipped += 1;
            continue;
        }
        let Some((mut row, elements)) = read_result(root, file) else { continue };
        let per = if elements > 1 {
            format!(", ns per timer ({} timers an iteration)", format_figure(elements as f64, 0))
        } else {
            String::new()
        };
        row.group = format!("criterion {}{per}, {}", row.group, utc_minute(written));
        rows.push(row);
    }
    (rows, skipped)
}

/// `YYYY-MM-DD HH:MM UTC` of `t`.
pub fn utc_minute(t: SystemTime) -> String {
    let secs = t.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rest) = ((secs / 86_400) as i64, secs % 86_400);
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {:02}:{:02} UTC", rest / 3_600, rest % 3_600 / 60)
}

/// Timers one iteration of a criterion benchmark handles: its declared
/// element throughput, else what the wheel bench's names say (`lifetime`
/// inserts and fires 1e6; `clustered` drains N, or at most 1,024 in one
/// bounded call); otherwise one operation.
pub fn elements_per_iteration(group: &str, function: &str, throughput: Option<u64>) -> u64 {
    if let Some(n) = throughput {
        return n.max(1);
    }
    let last_number = || function.rsplit('/').next().and_then(|n| n.parse::<u64>().ok());
    match group {
        "lifetime" if function.starts_with("1e6") => 1_000_000,
        "clustered" if function.starts_with("drain/") => last_number().unwrap_or(1),
        "clustered" if function.starts_with("first_bounded_call/") => {
            last_number().map_or(1, |n| n.min(CLUSTER_BATCH_MAX))
        }
        _ => 1,
    }
}

/// The wheel bench's batch bound in its `clustered` group.
const CLUSTER_BATCH_MAX: u64 = 1024;

/// Where criterion may have written: `$CARGO_TARGET_DIR`, `./target`, and
/// the target directory this executable was built into.
fn criterion_dirs(exe: &Path) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(t) = std::env::var_os("CARGO_TARGET_DIR") {
        dirs.push(PathBuf::from(t).join("criterion"));
    }
    dirs.push(PathBuf::from("target/criterion"));
    // target/<profile>/hotloop -> target/criterion, for the driven
    // executable and for this one.
    let this = std::env::current_exe().ok();
    for exe in [Some(exe), this.as_deref()].into_iter().flatten() {
        if let Some(target) = exe.parent().and_then(Path::parent) {
            let dir = target.join("criterion");
            if !dirs.contains(&dir) {
                dirs.push(dir);
            }
        }
    }
    dirs
}

fn find_estimates(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) {
    if depth > SEARCH_DEPTH_MAX {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        if !path.is_dir() {
            continue;
        }
        let estimates = path.join("estimates.json");
        if path.file_name().is_some_and(|n| n == "new") && estimates.is_file() {
            out.push(estimates);
        } else if path.file_name().is_some_and(|n| n != "report" && n != "base" && n != "change") {
            find_estimates(&path, depth + 1, out);
        }
    }
}

/// A row from one `new/estimates.json`, named from `new/benchmark.json`
/// when present, else from its directories, its figures divided by the
/// timers of one iteration; and that count.
fn read_result(root: &Path, estimates: &Path) -> Option<(Row, u64)> {
    let text = std::fs::read_to_string(estimates).ok()?;
    let (median, low, high, mean) = parse_estimates(&text)?;
    let new_dir = estimates.parent()?;
    let id = std::fs::read_to_string(new_dir.join("benchmark.json")).ok();
    let throughput = id.as_deref().and_then(parse_elements);
    let (group, function) = id.as_deref().and_then(parse_benchmark_id).or_else(|| {
        let rel = new_dir.parent()?.strip_prefix(root).ok()?;
        let parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
        match parts.as_slice() {
            [one] => Some((one.clone(), one.clone())),
            [group, rest @ ..] => Some((group.clone(), rest.join("/"))),
            [] => None,
        }
    })?;
    let elements = elements_per_iteration(&group, &function, throughput);
    let n = elements as f64;
    let (median, low, high, mean) = (median / n, low / n, high / n, mean / n);
    let (server, config) = if function.eq_ignore_ascii_case("hotloop") {
        ("hotloop".to_string(), String::new())
    } else if function.to_ascii_lowercase().contains("hotloop") {
        ("hotloop".to_string(), function)
    } else {
        (function, String::new())
    };
    let mut row = Row::new(&group, &server, &config);
    let spread_pct = if median > 0.0 { (high - low) / median * 100.0 } else { 0.0 };
    row.metrics.insert(
        "median_ns".into(),
        Summary { median, min: low, max: high, spread_pct, values: vec![low, median, high] },
    );
    if let Some(m) = Summary::of(&[mean]) {
        row.metrics.insert("mean_ns".into(), m);
    }
    row.notes.clear();
    Some((row, elements))
}

/// The element count of a criterion benchmark.json's `throughput`, if it
/// declares one (`{"Elements": N}`).
pub fn parse_elements(text: &str) -> Option<u64> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    v["throughput"]["Elements"].as_u64()
}

/// Median point estimate, its confidence bounds and the mean, in ns.
pub fn parse_estimates(text: &str) -> Option<(f64, f64, f64, f64)> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    let median = &v["median"];
    let point = median["point_estimate"].as_f64()?;
    let low = median["confidence_interval"]["lower_bound"].as_f64().unwrap_or(point);
    let high = median["confidence_interval"]["upper_bound"].as_f64().unwrap_or(point);
    let mean = v["mean"]["point_estimate"].as_f64().unwrap_or(f64::NAN);
    Some((point, low, high, mean))
}

/// `(group_id, function_id or value_str)` from criterion's benchmark.json.
pub fn parse_benchmark_id(text: &str) -> Option<(String, String)> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    let group = v["group_id"].as_str()?.to_string();
    let mut function = v["function_id"].as_str().map(str::to_string);
    if let Some(value) = v["value_str"].as_str() {
        function = Some(match function {
            Some(f) => format!("{f}/{value}"),
            None => value.to_string(),
        });
    }
    Some((group.clone(), function.unwrap_or(group)))
}

/// The rows of every case, measured for `case_time` each: what the
/// scenario shows, for tests.
#[cfg(test)]
pub fn measure_all(case_time: Duration) -> Vec<Row> {
    Case::ALL.into_iter().flat_map(|case| measure_case(case, case_time)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_criterion_files() {
        let est = r#"{"mean":{"point_estimate":12.5},"median":{"point_estimate":10.0,
            "confidence_interval":{"confidence_level":0.95,"lower_bound":9.0,"upper_bound":11.0}}}"#;
        assert_eq!(parse_estimates(est), Some((10.0, 9.0, 11.0, 12.5)));
        let id = r#"{"group_id":"take_next empty","function_id":"hotloop","value_str":null}"#;
        assert_eq!(parse_benchmark_id(id), Some(("take_next empty".into(), "hotloop".into())));
    }

    #[test]
    fn summarises_a_results_tree() {
        let guard = super::super::TestDir::new("criterion");
        let root = guard.path();
        for (f, ns) in [("hotloop", 5.0), ("btreemap", 9.0)] {
            let dir = root.join("drain").join(f).join("new");
            std::fs::create_dir_all(&dir).unwrap();
            let est = format!(
                r#"{{"mean":{{"point_estimate":{ns}}},"median":{{"point_estimate":{ns}}}}}"#
            );
            std::fs::write(dir.join("estimates.json"), est).unwrap();
        }
        let mut files = Vec::new();
        find_estimates(root, 0, &mut files);
        files.sort();
        let rows: Vec<Row> =
            files.iter().filter_map(|f| read_result(root, f)).map(|r| r.0).collect();
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[0].server.as_str(), rows[0].group.as_str()), ("btreemap", "drain"));
        assert_eq!((rows[1].server.as_str(), rows[1].label().as_str()), ("hotloop", "hotloop"));
        assert_eq!(rows[1].get("median_ns"), Some(5.0));
    }

    #[test]
    fn criterion_rows_are_this_builds_dated_and_per_timer() {
        let guard = super::super::TestDir::new("criterion-dated");
        let root = guard.path();
        let write = |group: &str, function: &str, ns: f64| {
            let dir = root.join(group).join(function.replace('/', "_")).join("new");
            std::fs::create_dir_all(&dir).unwrap();
            let est = format!(
                r#"{{"mean":{{"point_estimate":{ns}}},"median":{{"point_estimate":{ns}}}}}"#
            );
            std::fs::write(dir.join("estimates.json"), est).unwrap();
            let id = format!(
                r#"{{"group_id":"{group}","function_id":"{function}","value_str":null,"throughput":null}}"#
            );
            std::fs::write(dir.join("benchmark.json"), id).unwrap();
            dir.join("estimates.json")
        };
        // An old result (an earlier build's) and two new ones.
        let old = write("sparse", "poll_nothing_due/wheel/0", 2.0);
        let past = SystemTime::now() - Duration::from_secs(86_400);
        std::fs::File::options().write(true).open(&old).unwrap().set_modified(past).unwrap();
        let since = SystemTime::now() - Duration::from_secs(3_600);
        let files = [
            old,
            write("lifetime", "1e6_over_60s/wheel", 208_890_000.0),
            write("clustered", "first_bounded_call/wheel/100000", 2_048.0),
        ];
        let (rows, skipped) = criterion_rows(root, &files, since);
        assert_eq!((rows.len(), skipped), (2, 1));
        // 208.89 ms an iteration of a million timers: 208.89 ns per timer.
        assert!((rows[0].get("median_ns").unwrap() - 208.89).abs() < 1e-9);
        assert!(
            rows[0].group.starts_with("criterion lifetime, ns per timer (1,000,000 timers"),
            "{}",
            rows[0].group
        );
        assert!(rows[0].group.ends_with(" UTC"), "{}", rows[0].group);
        assert_eq!(rows[1].get("median_ns"), Some(2.0));
        assert_eq!(elements_per_iteration("dense", "cancel_rearm/wheel", None), 1);
        assert_eq!(elements_per_iteration("clustered", "drain/btree/1000", None), 1_000);
        assert_eq!(elements_per_iteration("any", "x", Some(64)), 64);
        assert_eq!(parse_elements(r#"{"throughput":{"Elements":512}}"#), Some(512));
    }

    #[test]
    fn dates_are_utc() {
        assert_eq!(utc_minute(SystemTime::UNIX_EPOCH), "1970-01-01 00:00 UTC");
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_969_140);
        assert_eq!(utc_minute(t), "2026-11-29 16:19 UTC");
        let leap = SystemTime::UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(utc_minute(leap), "2000-02-29 00:00 UTC");
    }

    /// Every queue does what the case says, the same way.
    #[test]
    fn the_queues_agree() {
        fn fire_order<Q: Queue>() -> Vec<usize> {
            let mut q = Q::new();
            let a = q.insert(50, 1);
            q.insert(20, 2);
            q.insert(20_000, 3);
            assert_eq!(q.cancel(a), Some(1));
            assert_eq!(q.cancel(a), None);
            (0..=20_000).step_by(10).map(|now| q.poll(now, usize::MAX)).collect()
        }
        let wheel = fire_order::<TimerWheel<u64>>();
        assert_eq!(wheel.iter().sum::<usize>(), 2);
        assert_eq!(wheel, fire_order::<OrderedMap>());
        assert_eq!(wheel, fire_order::<FlatWheel>());
    }

    #[test]
    fn every_case_gives_every_queue_a_figure() {
        let rows = measure_all(Duration::from_millis(7));
        assert_eq!(rows.len(), Case::ALL.len() * 3);
        for row in &rows {
            let ns = row.get("median_ns").unwrap_or(f64::NAN);
            assert!(ns > 0.0 && ns.is_finite(), "{}: {ns}", row.label());
        }
    }
}
