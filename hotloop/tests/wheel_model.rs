//! The timer wheel against a `BTreeMap` reference model.
//!
//! Random sequences of inserts, cancels, resets (earlier and later) and polls
//! (bounded and unbounded, small steps, jumps past the wheel's 2^36-tick span,
//! and ticks earlier than the last poll's) run on both. After every step they must agree on which timers are
//! pending and what cancel and reset return; every poll must fire only timers
//! that are due (never early), exactly as many as the bound allows, and an
//! unbounded poll must leave nothing due (no lateness).

use std::collections::{BTreeMap, BTreeSet};

use hotloop::time::wheel::{TimerKey, TimerWheel};
use proptest::prelude::*;

/// Ticks covered by the wheel's levels; deadlines past this overflow.
const WHEEL_SPAN: u64 = 1 << 36;

#[derive(Clone, Debug)]
enum When {
    /// At or before now.
    Past(u16),
    /// Within the lower levels.
    Near(u16),
    /// Anywhere in the levels.
    Mid(u64),
    /// In the overflow list.
    Beyond(u64),
    /// One of a few fixed ticks, so many timers share a deadline.
    Cluster(u8),
    /// The largest deadline there is.
    Max,
}

#[derive(Clone, Debug)]
enum Advance {
    Step(u8),
    Small(u16),
    Medium(u32),
    /// Past the whole span of the levels.
    Jump(u64),
    /// Exactly to the model's earliest deadline.
    ToEarliest,
    /// An earlier tick than the last poll's, which counts as the last one.
    Back(u16),
}

#[derive(Clone, Debug)]
enum Op {
    Insert(When, u8),
    Cancel(usize),
    Reset(usize, When),
    Poll(Advance, Option<u8>),
}

fn when() -> impl Strategy<Value = When> {
    prop_oneof![
        1 => any::<u16>().prop_map(When::Past),
        3 => any::<u16>().prop_map(When::Near),
        1 => (0..WHEEL_SPAN).prop_map(When::Mid),
        1 => (0..WHEEL_SPAN * 8).prop_map(When::Beyond),
        2 => (0..4u8).prop_map(When::Cluster),
        1 => Just(When::Max),
    ]
}

fn advance() -> impl Strategy<Value = Advance> {
    prop_oneof![
        3 => (0..4u8).prop_map(Advance::Step),
        3 => any::<u16>().prop_map(Advance::Small),
        1 => any::<u32>().prop_map(Advance::Medium),
        1 => (0..WHEEL_SPAN * 4).prop_map(Advance::Jump),
        2 => Just(Advance::ToEarliest),
        1 => any::<u16>().prop_map(Advance::Back),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (when(), 1..20u8).prop_map(|(w, n)| Op::Insert(w, n)),
        2 => any::<usize>().prop_map(Op::Cancel),
        2 => (any::<usize>(), when()).prop_map(|(i, w)| Op::Reset(i, w)),
        3 => (advance(), proptest::option::of(1..8u8)).prop_map(|(a, m)| Op::Poll(a, m)),
    ]
}

/// The reference: pending timers by id, and the same ordered by deadline.
#[derive(Default)]
struct Model {
    now: u64,
    deadline_of: BTreeMap<u64, u64>,
    by_deadline: BTreeSet<(u64, u64)>,
}

impl Model {
    fn deadline(&self, when: &When) -> u64 {
        match *when {
            When::Past(back) => self.now.saturating_sub(u64::from(back)),
            When::Near(ahead) => self.now.saturating_add(u64::from(ahead)),
            When::Mid(ahead) => self.now.saturating_add(ahead),
            When::Beyond(ahead) => self.now.saturating_add(WHEEL_SPAN).saturating_add(ahead),
            When::Cluster(k) => [7_000, 70_000, 1 << 30, (1 << 37) + 3][k as usize],
            When::Max => u64::MAX,
        }
    }

    fn insert(&mut self, id: u64, deadline: u64) {
        self.deadline_of.insert(id, deadline);
        self.by_deadline.insert((deadline, id));
    }

    fn remove(&mut self, id: u64) -> Option<u64> {
        let deadline = self.deadline_of.remove(&id)?;
        self.by_deadline.remove(&(deadline, id));
        Some(deadline)
    }

    fn earliest(&self) -> Option<u64> {
        self.by_deadline.first().map(|&(deadline, _)| deadline)
    }

    fn due_count(&self, now: u64) -> usize {
        self.by_deadline.range(..=(now, u64::MAX)).count()
    }
}

fn check_agree(wheel: &TimerWheel<u64>, model: &Model, keys: &[TimerKey]) {
    assert_eq!(wheel.len(), model.deadline_of.len());
    assert_eq!(wheel.is_empty(), model.deadline_of.is_empty());
    match (wheel.next_deadline(), model.earliest()) {
        (None, None) => {}
        (Some(next), Some(earliest)) => assert!(
            next <= earliest,
            "next_deadline {next} is later than the earliest deadline {earliest}"
        ),
        (got, want) => panic!("next_deadline {got:?}, earliest {want:?}"),
    }
    for (id, &key) in keys.iter().enumerate() {
        let id = id as u64;
        let deadline = model.deadline_of.get(&id).copied();
        assert_eq!(wheel.deadline(key), deadline, "deadline of timer {id}");
        assert_eq!(wheel.get(key), deadline.map(|_| &id), "value of timer {id}");
    }
}

fn run(ops: Vec<Op>, start: u64) {
    let mut wheel = TimerWheel::<u64>::new();
    let mut model = Model::default();
    // Start later than zero, as a worker that has been up for a while.
    wheel.poll(start, usize::MAX, |_, _| unreachable!());
    model.now = start;
    let mut keys: Vec<TimerKey> = Vec::new();

    for op in ops {
        match op {
            Op::Insert(when, count) => {
                let deadline = model.deadline(&when);
                for _ in 0..count {
                    let id = keys.len() as u64;
                    keys.push(wheel.insert(deadline, id));
                    model.insert(id, deadline);
                }
            }
            Op::Cancel(pick) if !keys.is_empty() => {
                let id = pick % keys.len();
                let expected = model.remove(id as u64).map(|_| id as u64);
                assert_eq!(wheel.cancel(keys[id]), expected, "cancel timer {id}");
            }
            Op::Reset(pick, when) if !keys.is_empty() => {
                let id = pick % keys.len();
                let deadline = model.deadline(&when);
                let pending = model.remove(id as u64).is_some();
                if pending {
                    model.insert(id as u64, deadline);
                }
                assert_eq!(wheel.reset(keys[id], deadline), pending, "reset timer {id}");
            }
            Op::Cancel(_) | Op::Reset(..) => {}
            Op::Poll(advance, max) => {
                let asked = match advance {
                    Advance::Step(n) => model.now.saturating_add(u64::from(n)),
                    Advance::Small(n) => model.now.saturating_add(u64::from(n)),
                    Advance::Medium(n) => model.now.saturating_add(u64::from(n)),
                    Advance::Jump(n) => model.now.saturating_add(WHEEL_SPAN).saturating_add(n),
                    Advance::ToEarliest => model.earliest().unwrap_or(model.now).max(model.now),
                    Advance::Back(n) => model.now.saturating_sub(u64::from(n)),
                };
                let now = asked.max(model.now);
                model.now = now;
                let max = max.map_or(usize::MAX, usize::from);
                let due = model.due_count(now);
                let mut fired = Vec::new();
                let count = wheel.poll(asked, max, |key, id| fired.push((key, id)));
                assert_eq!(count, fired.len());
                assert_eq!(count, due.min(max), "fired {count} of {due} due, bound {max}");
                for (key, id) in fired {
                    assert_eq!(key, keys[id as usize], "fired key of timer {id}");
                    let deadline = model.remove(id).expect("fired a timer that is not pending");
                    assert!(deadline <= now, "timer {id} for {deadline} fired early at {now}");
                }
                if max == usize::MAX {
                    assert_eq!(model.due_count(now), 0, "an unbounded poll left timers due");
                }
                assert_eq!(wheel.now(), now);
            }
        }
        check_agree(&wheel, &model, &keys);
    }

    // Everything left fires once time runs out, and only once.
    let mut rest = 0;
    wheel.poll(u64::MAX, usize::MAX, |_, id| {
        model.remove(id).expect("fired a timer that is not pending");
        rest += 1;
    });
    assert!(model.deadline_of.is_empty(), "{rest} fired at the end, some never did");
    assert!(wheel.is_empty());
    assert_eq!(wheel.next_deadline(), None);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn wheel_matches_model(
        ops in proptest::collection::vec(op(), 1..200),
        start in prop_oneof![Just(0u64), 0..WHEEL_SPAN * 2, Just(u64::MAX - WHEEL_SPAN)],
    ) {
        run(ops, start);
    }
}
