//! A generational slab: values addressed by keys that go stale when their
//! slot is freed.
//!
//! Tasks, epoll registrations and io_uring operations all live in one of
//! these. Each key carries its slot's generation, which the slab bumps when
//! the slot is freed, so a key that outlived its value (a waker of a
//! finished task, an epoll event or a completion for a closed socket) finds
//! nothing instead of the slot's next occupant.
//!
//! A key packs into a `u64` as `generation << 32 | index`, the form the
//! kernel carries back in `epoll_data` and `user_data`. Generations start
//! at 1 and skip 0 when they wrap, so an `Option<Key>` is as small as a
//! key (8 bytes, not 12): the driver keeps one per socket and operation.

use std::num::NonZeroU32;

/// A slot's index and the generation it had when the value went in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    index: u32,
    generation: NonZeroU32,
}

impl Key {
    /// The key as one word: `generation << 32 | index`.
    pub(crate) fn to_u64(self) -> u64 {
        (u64::from(self.generation.get()) << 32) | u64::from(self.index)
    }

    /// The key a word made by [`Key::to_u64`] names; `None` for a word no
    /// key makes (generation 0).
    pub(crate) fn from_u64(word: u64) -> Option<Key> {
        let generation = NonZeroU32::new((word >> 32) as u32)?;
        Some(Key { index: word as u32, generation })
    }
}

/// The generation a slot starts with.
const FIRST_GENERATION: NonZeroU32 = NonZeroU32::MIN;

struct Entry<T> {
    generation: NonZeroU32,
    value: Option<T>,
}

/// Values addressed by generational [`Key`]s; freed slots are reused.
pub(crate) struct Slab<T> {
    entries: Vec<Entry<T>>,
    free: Vec<u32>,
    len: usize,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab { entries: Vec::new(), free: Vec::new(), len: 0 }
    }
}

impl<T> Slab<T> {
    /// The key the next [`Slab::insert`] will return.
    pub(crate) fn vacant_key(&self) -> Key {
        match self.free.last() {
            Some(&index) => Key { index, generation: self.entries[index as usize].generation },
            None => Key { index: self.entries.len() as u32, generation: FIRST_GENERATION },
        }
    }

    /// Stores `value`; returns its key.
    pub(crate) fn insert(&mut self, value: T) -> Key {
        self.len += 1;
        match self.free.pop() {
            Some(index) => {
                let e = &mut self.entries[index as usize];
                e.value = Some(value);
                Key { index, generation: e.generation }
            }
            None => {
                let index = u32::try_from(self.entries.len()).expect("slab full: 2^32 entries");
                self.entries.push(Entry { generation: FIRST_GENERATION, value: Some(value) });
                Key { index, generation: FIRST_GENERATION }
            }
        }
    }

    /// The value behind `key`, if the slot still holds it.
    pub(crate) fn get(&self, key: Key) -> Option<&T> {
        match self.entries.get(key.index as usize) {
            Some(e) if e.generation == key.generation => e.value.as_ref(),
            _ => None,
        }
    }

    /// The value behind `key`, mutably, if the slot still holds it.
    pub(crate) fn get_mut(&mut self, key: Key) -> Option<&mut T> {
        match self.entries.get_mut(key.index as usize) {
            Some(e) if e.generation == key.generation => e.value.as_mut(),
            _ => None,
        }
    }

    /// Takes the value behind `key` out and frees its slot; every copy of
    /// `key` is stale from now on. `None` (and no change) for a stale key.
    pub(crate) fn remove(&mut self, key: Key) -> Option<T> {
        let e = self.entries.get_mut(key.index as usize)?;
        if e.generation != key.generation {
            return None;
        }
        let value = e.value.take()?;
        e.generation = e.generation.checked_add(1).unwrap_or(FIRST_GENERATION);
        self.free.push(key.index);
        self.len -= 1;
        Some(value)
    }

    /// How many values the slab holds.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// True if the slab holds nothing.
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The keys of every value, in slot order.
    pub(crate) fn keys(&self) -> Vec<Key> {
        self.iter().map(|(k, _)| k).collect()
    }

    /// Every value with its key, in slot order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (Key, &T)> {
        self.entries.iter().enumerate().filter_map(|(i, e)| {
            e.value.as_ref().map(|v| (Key { index: i as u32, generation: e.generation }, v))
        })
    }

    /// Takes every value out, freeing every slot.
    pub(crate) fn drain(&mut self) -> Vec<T> {
        let keys = self.keys();
        keys.into_iter().filter_map(|k| self.remove(k)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_round_trips_through_a_word() {
        let key = Key { index: 7, generation: NonZeroU32::new(0xdead_beef).unwrap() };
        assert_eq!(Key::from_u64(key.to_u64()), Some(key));
        assert_eq!(Key::from_u64(7), None, "no key has generation 0");
    }

    #[test]
    fn an_optional_key_is_one_word() {
        assert_eq!(std::mem::size_of::<Option<Key>>(), 8);
    }

    #[test]
    fn a_generation_that_wraps_skips_zero() {
        let mut slab = Slab::default();
        let first = slab.insert(1);
        slab.entries[0].generation = NonZeroU32::MAX;
        let key = Key { index: 0, generation: NonZeroU32::MAX };
        assert_eq!(slab.remove(key), Some(1));
        let next = slab.insert(2);
        assert_eq!(next.generation, FIRST_GENERATION);
        assert_eq!(next, first, "after a full wrap the slot's first key names it again");
    }

    #[test]
    fn a_reused_slot_rejects_the_old_key() {
        let mut slab = Slab::default();
        let old = slab.insert("a");
        assert_eq!(slab.vacant_key().index, 1);
        assert_eq!(slab.remove(old), Some("a"));
        assert_eq!(slab.vacant_key().index, old.index, "the freed slot is next");
        let new = slab.insert("b");
        assert_eq!(new.index, old.index);
        assert_ne!(new, old);
        assert_eq!(slab.get(old), None, "stale");
        assert_eq!(slab.remove(old), None, "removing a stale key changes nothing");
        assert_eq!(slab.get(new), Some(&"b"));
        assert_eq!(slab.len(), 1);
    }

    #[test]
    fn vacant_key_is_the_next_insert() {
        let mut slab = Slab::default();
        for i in 0..10 {
            let k = slab.vacant_key();
            assert_eq!(slab.insert(i), k);
        }
        let gone: Vec<_> = slab.keys().into_iter().step_by(3).collect();
        for k in gone {
            slab.remove(k);
        }
        for i in 0..5 {
            let k = slab.vacant_key();
            assert_eq!(slab.insert(i), k);
        }
    }

    #[test]
    fn drain_empties_and_keeps_keys_stale() {
        let mut slab = Slab::default();
        let keys: Vec<_> = (0..4).map(|i| slab.insert(i)).collect();
        assert_eq!(slab.drain(), vec![0, 1, 2, 3]);
        assert!(slab.is_empty());
        for k in keys {
            assert!(slab.get(k).is_none());
        }
    }

    /// Against a model: a map from live keys to values.
    #[test]
    fn matches_a_map_model() {
        use std::collections::BTreeMap;
        let mut slab = Slab::default();
        // Ordered by the key's word, as a plain map of integers.
        let mut model: BTreeMap<u64, u32> = BTreeMap::new();
        let mut dead: Vec<Key> = Vec::new();
        // The live keys again, to pick one at random in O(1) (walking the
        // map to the n-th key made the test quadratic).
        let mut live: Vec<Key> = Vec::new();
        // A small deterministic generator (xorshift) keeps this test Miri-friendly.
        let mut x: u32 = 0x9e37_79b9;
        // Under Miri every step costs milliseconds: fewer steps there.
        let steps: u32 = if cfg!(miri) { 400 } else { 20_000 };
        for step in 0..steps {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            if !x.is_multiple_of(3) || model.is_empty() {
                let k = slab.insert(step);
                assert!(
                    model.insert(k.to_u64(), step).is_none(),
                    "a live key was handed out twice"
                );
                live.push(k);
            } else {
                let k = live.swap_remove(x as usize % live.len());
                assert_eq!(slab.remove(k), model.remove(&k.to_u64()));
                dead.push(k);
            }
            assert_eq!(slab.len(), model.len());
        }
        for (k, v) in &model {
            assert_eq!(slab.get(Key::from_u64(*k).unwrap()), Some(v));
        }
        for k in dead {
            if !model.contains_key(&k.to_u64()) {
                assert_eq!(slab.get(k), None);
            }
        }
    }
}
