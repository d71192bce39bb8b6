//! A timer queue (interim implementation on a B-tree).

use std::collections::BTreeMap;

/// A handle to one timer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TimerKey(u64);

/// A timer queue keyed by tick.
pub struct TimerWheel<T> {
    now: u64,
    next_id: u64,
    by_deadline: BTreeMap<(u64, u64), T>,
    deadline_of: std::collections::HashMap<u64, u64>,
}

impl<T> Default for TimerWheel<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> TimerWheel<T> {
    /// An empty queue at tick 0.
    pub fn new() -> Self {
        TimerWheel {
            now: 0,
            next_id: 0,
            by_deadline: BTreeMap::new(),
            deadline_of: Default::default(),
        }
    }
    /// The tick the queue has been advanced to.
    pub fn now(&self) -> u64 {
        self.now
    }
    /// Number of pending timers.
    pub fn len(&self) -> usize {
        self.by_deadline.len()
    }
    /// True if no timer is pending.
    pub fn is_empty(&self) -> bool {
        self.by_deadline.is_empty()
    }
    /// Adds a timer.
    pub fn insert(&mut self, deadline: u64, value: T) -> TimerKey {
        let id = self.next_id;
        self.next_id += 1;
        self.by_deadline.insert((deadline, id), value);
        self.deadline_of.insert(id, deadline);
        TimerKey(id)
    }
    /// Removes a timer.
    pub fn cancel(&mut self, key: TimerKey) -> Option<T> {
        let d = self.deadline_of.remove(&key.0)?;
        self.by_deadline.remove(&(d, key.0))
    }
    /// Moves a timer.
    pub fn reset(&mut self, key: TimerKey, deadline: u64) -> bool {
        match self.cancel(key) {
            Some(v) => {
                self.by_deadline.insert((deadline, key.0), v);
                self.deadline_of.insert(key.0, deadline);
                true
            }
            None => false,
        }
    }
    /// The value of a timer.
    pub fn get_mut(&mut self, key: TimerKey) -> Option<&mut T> {
        let d = *self.deadline_of.get(&key.0)?;
        self.by_deadline.get_mut(&(d, key.0))
    }
    /// The earliest deadline.
    pub fn next_deadline(&self) -> Option<u64> {
        self.by_deadline.keys().next().map(|k| k.0)
    }
    /// Fires due timers.
    pub fn poll(&mut self, now: u64, max: usize, mut f: impl FnMut(TimerKey, T)) -> usize {
        self.now = self.now.max(now);
        let mut n = 0;
        while n < max {
            match self.by_deadline.first_key_value() {
                Some((&(d, id), _)) if d <= now => {
                    let v = self.by_deadline.remove(&(d, id)).unwrap();
                    self.deadline_of.remove(&id);
                    f(TimerKey(id), v);
                    n += 1;
                }
                _ => break,
            }
        }
        n
    }
}
