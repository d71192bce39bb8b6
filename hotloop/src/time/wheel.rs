//! A hierarchical timer wheel for one worker thread.
//!
//! [`TimerWheel`] holds timers keyed by a deadline in ticks (the caller picks
//! the unit; the runtime uses milliseconds since the worker started) and hands
//! them back once the wheel is polled at or after that deadline. It follows
//! Varghese and Lauck, "Hashed and Hierarchical Timing Wheels: Data Structures
//! for the Efficient Implementation of a Timer Facility" (SOSP 1987), scheme 7,
//! with the layout tokio uses in `runtime/time/wheel`: six levels of 64 slots,
//! each level with a 64-bit occupancy bitmap.
//!
//! # Levels
//!
//! ```text
//!            slot width        level span (64 slots)
//! level 0    1 tick            64 ticks              (~64 ms at 1 ms ticks)
//! level 1    64 ticks          4 096 ticks           (~4 s)
//! level 2    4 096 ticks       262 144 ticks         (~4.4 min)
//! level 3    262 144 ticks     16 777 216 ticks      (~4.7 h)
//! level 4    2^24 ticks        2^30 ticks            (~12.4 days)
//! level 5    2^30 ticks        2^36 ticks            (~2.2 years)
//! overflow   everything in a later 2^36-tick epoch than the cursor
//! due        deadline <= cursor, waiting to be handed out
//! ```
//!
//! A deadline is read as six 6-bit digits. A timer is filed at the level of the
//! highest digit in which its deadline differs from the wheel's cursor (the
//! tick the wheel has processed up to), in the slot named by that digit. So a
//! slot at level `L` holds timers that agree with the cursor above digit `L`
//! and whose digit `L` is strictly greater than the cursor's. That gives the
//! central ordering fact: every occupied slot of level 0 comes before every
//! occupied slot of level 1, and so on, and inside a level the slots are in
//! index order. The next slot to process is therefore the lowest set bit of the
//! lowest non-empty level: two `trailing_zeros` instructions, no scan of empty
//! slots, and no rotation of the bitmap (tokio's levels wrap around the cursor
//! and rotate; these never hold a slot at or behind it).
//!
//! When the cursor reaches the start of an occupied slot above level 0, its
//! timers move down ("cascade") to the level their exact deadline now belongs
//! to. A timer falls at most five times in its life and ends in the level-0
//! slot of exactly its tick (or straight on the due list when its tick is the
//! one being processed); level-0 slots hold a single tick, so they are spliced
//! onto the due list whole. A second bitmap per level marks the slots whose timers
//! were filed with different deadlines; a slot whose timers share one (a burst
//! of equal timeouts) moves down as one splice without reading them. In a mixed
//! slot, runs of consecutive timers bound for the same slot still move as one
//! splice each.
//!
//! Moving a mixed slot down is a list walk, and a list walk is a chain of
//! dependent loads: with a million timers each step is a cache miss, and the
//! next address is only known once it returns. The walk therefore runs from
//! both ends at once, the front forwards and the back backwards, so two misses
//! are in flight instead of one. The front appends to the target lists as it
//! goes; the back prepends each timer to a chain of its own per target list,
//! and the chains are appended once the walks meet, which keeps every list in
//! its original order. This is safe because every list below the level being
//! moved is empty when the move begins (the lowest occupied slot is always the
//! one processed); a lazily reset timer bound for a higher list ends the back
//! walk and the front finishes alone. This cut the lifetime benchmark (a
//! million timers, each moved down twice) by more than a third.
//!
//! # Overflow
//!
//! Deadlines in a later 2^36-tick epoch than the cursor (2.2 years at 1 ms
//! ticks) wait on an overflow list with a cached lower bound of their
//! deadlines. When the cursor reaches the start of that epoch, the list is
//! re-filed in one pass; timers still too far go back on it.
//!
//! # Laziness
//!
//! [`TimerWheel::reset`] to a later deadline only rewrites the deadline: the
//! timer stays in the slot it was filed in, which now comes up early, and is
//! re-filed by its new deadline then (haproxy and nginx do the same with their
//! trees). An idle timeout pushed back on every packet therefore costs one
//! store per packet. A reset to an earlier deadline moves the timer at once,
//! unless the new deadline is filed on the same list as the old one (the same
//! upper slot, or both due, or both in overflow): then the timer already sits
//! no later than its new deadline and stays put, touching only its own cache
//! line; an upper slot it stays on is marked as holding differing deadlines,
//! so that it cascades timer by timer.
//!
//! # Guarantees
//!
//! - A timer never fires before its deadline: it is handed out only by a
//!   `poll(now, ..)` with `now >= deadline`.
//! - A timer fires on the first poll whose `now` is at or past its deadline,
//!   at every level and from the overflow list alike, unless that poll's batch
//!   bound was used up first; then it fires on a following call. Cascading is
//!   exact, so there is no extra lateness for far deadlines.
//! - [`TimerWheel::next_deadline`] is never later than the earliest pending
//!   deadline. It is exact except in three cases, where it is early: after a
//!   cancel or a reset to a later deadline, until the next poll that does
//!   work; when the earliest timer sits in an upper-level slot holding more
//!   than 16 timers with differing deadlines (the slot's start is given); and
//!   while a batch bound has left due timers unfired (a tick at or before
//!   `now`).
//! - A poll with nothing due is one comparison against that cached deadline.
//! - The batch bound counts fired timers. Moving a slot down is not split
//!   across calls: a slot of one shared deadline moves in O(1), any other in
//!   one pass over its timers.
//! - Insert, cancel and reset are O(1) and allocate nothing once the slab has
//!   grown to the peak number of timers: freed entries are reused.
//! - A [`TimerKey`] carries a generation, so a key whose timer has fired or
//!   been cancelled does nothing, even after its slab entry is reused. The
//!   generation is 32 bits and odd exactly while the entry is occupied (it is
//!   bumped when the entry is taken and when it is freed): a key would only
//!   alias after its entry has been reused 2^31 times.
//! - Among timers with the same deadline, the one inserted first fires first
//!   (a reset keeps a timer's place unless it moves the timer, which then
//!   counts as inserted at the reset).
//!
//! # Memory
//!
//! Each timer is one 32-byte slab entry, aligned to 32 bytes so that it never
//! straddles a cache line:
//!
//! ```text
//! offset  0        4            8      12     16                  32
//!         deadline generation   prev   next   value: Option<T>
//!         (low 32 bits)         (32-bit slab indices or list ends)
//! ```
//!
//! The value is an `Option<T>` (`None` marks a vacant entry): for a
//! `std::task::Waker`, the runtime's value, the `Option` costs nothing (the
//! waker's vtable pointer is never null), so a waker timer is 32 bytes; so is
//! a `u64` one (8 bytes of value, 8 of tag). Everything a timer needs, its
//! links, its deadline and its value, is in one line: a cancel reads the
//! timer's line and its two neighbours', firing a timer reads one line, and a
//! lazy reset writes one. (Before, the deadline and links sat in a 16-byte
//! node apart from a slab entry holding the value and generation, which made
//! a waker timer 40 bytes and every cancel or fire read two lines for the
//! timer itself.)
//!
//! The deadline keeps only its low 32 bits and is read back as the tick with
//! those bits nearest the cursor, within 2^31 ticks either side (24.8 days at
//! 1 ms ticks). That is exact for every timer the wheel files while the window
//! holds it: a timer on a slot or the overflow list is due after the cursor,
//! and the cursor moves toward it, never past it, so a deadline less than 2^31
//! ahead when stored stays so; timers on the due list are due at or before the
//! cursor, and the cursor stands still while the due list holds any. The rare
//! timer outside the window when its deadline is stored (more than 24.8 days
//! out, or inserted that late), and any whose low bits are `u32::MAX`, stores
//! a `FAR` mark instead and keeps its full deadline in a side `BTreeMap`, which
//! allocates nothing while no timer is that far.
//!
//! The slab grows like a `Vec`, by doubling: [`TimerWheel::with_capacity`]
//! avoids both the slack and the copy. A slab of 4 MiB (131,072 timers) or
//! more asks the kernel for transparent huge pages (`madvise(MADV_HUGEPAGE)`):
//! a million timers span 32 MiB, and with 4 KiB pages nearly every random
//! cancel or list step would also miss the TLB. The empty wheel keeps its 386
//! list heads and tails, the shared deadline of each of the 320 upper slots
//! and the bitmaps inline, 5.8 KiB, and allocates nothing until the first
//! insert. The first move of a mixed slot allocates the back walk's chains,
//! 9.2 KiB (one 24-byte chain per slot list and the due list), kept for reuse.
//!
//! # Implementation notes
//!
//! Invariants the code relies on:
//!
//! - Every occupied entry is on exactly one list: a slot list, the due list or
//!   the overflow list. List ends carry `END | list id` instead of an index, so
//!   unlinking needs no search for the list an entry is on.
//! - A timer on slot list `(L, s)` has a deadline at or after the slot's start
//!   (equal to its filing deadline, or later after a lazy reset), and the
//!   slot's start is after the cursor.
//! - Bit `s` of `occupied[L]` is set exactly when slot list `(L, s)` is
//!   non-empty, and bit `L` of `occupied_levels` exactly when `occupied[L]`
//!   is non-zero.
//! - For a non-empty slot above level 0 whose bit in `mixed[L]` is clear,
//!   every timer on it was filed with that slot's `filed_deadline`, and its
//!   deadline now is that or later.
//! - `next_deadline` is at most the earliest deadline of any pending timer;
//!   `due_min` and `overflow_min` bound their lists the same way and are
//!   `u64::MAX` when their list is empty, so a bound never names a tick the
//!   cursor has passed while nothing is filed under it.
//! - The cursor only moves forward, and only to a tick before every slot start
//!   and the overflow epoch not yet processed. It moves only when a poll does
//!   work, so between such polls it may trail [`TimerWheel::now`]; inserts are
//!   filed relative to the cursor, which is correct at any distance.
//! - A timer whose stored deadline is not `FAR` has its deadline within 2^31
//!   ticks of the cursor (see Memory), and `far` holds an entry exactly for
//!   the occupied entries whose stored deadline is `FAR`.

use std::collections::BTreeMap;
use std::fmt;
use std::mem;

/// Bits of a deadline that pick a slot within one level.
const SLOT_BITS: u32 = 6;
/// Slots per level: one per bit of the occupancy bitmap.
const SLOTS: usize = 1 << SLOT_BITS;
/// Levels in the wheel; together they cover 2^36 ticks past the cursor.
const LEVELS: usize = 6;
/// log2 of the span covered by all levels; deadlines further out overflow.
const WHEEL_BITS: u32 = SLOT_BITS * LEVELS as u32;
/// Number of slot lists; list ids below this are `level * SLOTS + slot`.
const SLOT_LISTS: usize = LEVELS * SLOTS;
/// Number of slot lists above level 0, the ones that cascade.
const UPPER_SLOT_LISTS: usize = SLOT_LISTS - SLOTS;
/// List id of timers whose deadline has been reached.
const DUE: usize = SLOT_LISTS;
/// List id of timers beyond the wheel's span.
const OVERFLOW: usize = SLOT_LISTS + 1;
/// Total number of lists.
const LISTS: usize = SLOT_LISTS + 2;
/// Marks a link as a list end; the low bits then hold the list id.
const END: u32 = 1 << 31;
/// No entry: an empty list's head and tail, or the end of the free list.
const NIL: u32 = u32::MAX;
/// Slab indices must stay below `END` so they never look like list ends.
const ENTRIES_MAX: usize = END as usize;
/// A timer's stored deadline when its full deadline lies outside the window
/// the low 32 bits can name and sits in [`TimerWheel::far`] instead.
const FAR: u32 = u32::MAX;
/// Half the window of deadlines around the cursor that a timer stores as
/// their low 32 bits.
const NEAR_HALF: u64 = 1 << 31;
/// Entries `next_deadline` looks at in an upper-level slot before settling
/// for the slot's start as a lower bound.
const EXACT_SCAN_MAX: usize = 16;

/// Identifies one timer in a [`TimerWheel`].
///
/// A key is the timer's slab index plus a generation. Once the timer fires or
/// is cancelled, the key is stale: every method given it does nothing, even if
/// the slab entry now holds another timer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TimerKey {
    index: u32,
    generation: u32,
}

/// A hierarchical timer wheel: timers with `u64` tick deadlines, fired by
/// [`poll`](TimerWheel::poll) in deadline order.
///
/// See the [module documentation](self) for the design and its guarantees.
pub struct TimerWheel<T> {
    /// Slab of timers; a key's index points here. Each is 32 bytes, aligned
    /// to 32, so everything one timer needs is in one cache line.
    timers: Vec<Timer<T>>,
    /// Full deadlines of the timers whose stored deadline is [`FAR`].
    far: BTreeMap<u32, u64>,
    /// Head of the free list threaded through vacant entries.
    free_head: u32,
    /// Occupied entries.
    len: usize,
    /// The latest tick given to `poll`.
    now: u64,
    /// The tick the levels are laid out from; see the module's invariants.
    cursor: u64,
    /// Lower bound of every pending deadline; `u64::MAX` when empty.
    next_deadline: u64,
    /// Lower bound of the due list's deadlines.
    due_min: u64,
    /// Lower bound of the overflow list's deadlines.
    overflow_min: u64,
    /// Bit `s` of `occupied[L]`: slot `s` of level `L` is non-empty.
    occupied: [u64; LEVELS],
    /// Bit `L`: `occupied[L] != 0`.
    occupied_levels: u32,
    /// Bit `s` of `mixed[L]`: slot `s` of level `L` holds timers filed with
    /// different deadlines. When clear, all of them were filed with
    /// `filed_deadline` of that slot and the slot cascades as one splice.
    mixed: [u64; LEVELS],
    /// The common filing deadline of each slot above level 0 whose `mixed`
    /// bit is clear.
    filed_deadline: [u64; UPPER_SLOT_LISTS],
    /// Ends of every slot list, then the due and overflow lists.
    lists: [List; LISTS],
    /// Scratch for `refile`'s back walk, all empty between calls; allocated
    /// by the first refile.
    back_chains: Option<Box<[Chain; CHAINS]>>,
}

/// One slab entry: a pending timer, or a vacant entry on the free list.
///
/// The 16 bytes of bookkeeping come first and the value after, and the entry
/// is aligned to 32 bytes: with a value of up to 16 bytes (a `u64`, a
/// `std::task::Waker`) the whole entry is 32 bytes in one cache line, so a
/// cancel reads one line for the timer itself and one for each neighbour.
#[repr(C, align(32))]
struct Timer<T> {
    /// The deadline's low 32 bits, read relative to the cursor (see
    /// [`expand`]), or [`FAR`] when the full deadline is in `far`.
    deadline: u32,
    /// Bumped when the entry is taken and when it is freed, so it is odd
    /// exactly while a timer is pending here, and old keys go stale.
    generation: u32,
    /// The previous timer on the same list, or `END | list id`.
    prev: u32,
    /// The next timer on the same list, or `END | list id`; in a vacant
    /// entry, the next vacant one (or `NIL`).
    next: u32,
    /// `Some` exactly while the timer is pending.
    value: Option<T>,
}

impl<T> Timer<T> {
    #[inline]
    fn set_links(&mut self, prev: u32, next: u32) {
        (self.prev, self.next) = (prev, next);
    }
}

/// The full deadline whose low 32 bits are `low`, taken as the one within
/// `NEAR_HALF` of `cursor` (from `NEAR_HALF` before it to just under
/// `NEAR_HALF` after).
#[inline]
fn expand(cursor: u64, low: u32) -> u64 {
    cursor.wrapping_add(i64::from(low.wrapping_sub(cursor as u32) as i32) as u64)
}

/// Whether `deadline` can be stored as its low 32 bits while the cursor is
/// at `cursor`: within the window `expand` reads, and not the [`FAR`] mark.
#[inline]
fn is_near(cursor: u64, deadline: u64) -> bool {
    let in_window = if deadline >= cursor {
        deadline - cursor < NEAR_HALF
    } else {
        cursor - deadline <= NEAR_HALF
    };
    in_window && deadline as u32 != FAR
}

/// A chain the back walk of `refile` builds for one target list: its ends
/// and the range of its deadlines.
#[derive(Clone, Copy)]
struct Chain {
    head: u32,
    tail: u32,
    min: u64,
    max: u64,
}

const EMPTY_CHAIN: Chain = Chain { head: NIL, tail: NIL, min: u64::MAX, max: 0 };

/// Back-walk chains: one per slot list, then one for the due list.
const CHAINS: usize = SLOT_LISTS + 1;

#[derive(Clone, Copy)]
struct List {
    head: u32,
    tail: u32,
}

const EMPTY_LIST: List = List { head: NIL, tail: NIL };

impl<T> TimerWheel<T> {
    /// Creates an empty wheel at tick 0. It allocates nothing until the first
    /// insert.
    pub fn new() -> Self {
        Self::with_capacity(0)
    }

    /// Creates an empty wheel at tick 0 with room for `n` timers before its
    /// slab grows.
    pub fn with_capacity(n: usize) -> Self {
        let timers = Vec::with_capacity(n);
        advise_huge_pages(&timers);
        TimerWheel {
            timers,
            far: BTreeMap::new(),
            free_head: NIL,
            len: 0,
            now: 0,
            cursor: 0,
            next_deadline: u64::MAX,
            due_min: u64::MAX,
            overflow_min: u64::MAX,
            occupied: [0; LEVELS],
            occupied_levels: 0,
            mixed: [0; LEVELS],
            filed_deadline: [0; UPPER_SLOT_LISTS],
            lists: [EMPTY_LIST; LISTS],
            back_chains: None,
        }
    }

    /// Returns the latest tick the wheel has been polled at.
    pub fn now(&self) -> u64 {
        self.now
    }

    /// Returns the number of pending timers.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Returns `true` if no timer is pending.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Returns the number of timers the slab holds without growing.
    pub fn capacity(&self) -> usize {
        self.timers.capacity()
    }

    /// Adds a timer that fires at `deadline` and returns its key.
    ///
    /// A deadline at or before [`now`](Self::now) fires on the next poll.
    ///
    /// # Panics
    ///
    /// Panics if 2^31 timers are pending at once.
    pub fn insert(&mut self, deadline: u64, value: T) -> TimerKey {
        if self.len == 0 {
            // Nothing is filed, so the levels can be laid out from `now`
            // rather than from wherever the last busy poll left the cursor.
            // Every list is empty, so are their bounds (see `mark_empty`).
            debug_assert!(self.due_min == u64::MAX && self.overflow_min == u64::MAX);
            self.cursor = self.now;
        }
        // File the new entry with its final links in one write; only the
        // list's old tail is touched besides.
        let list = self.list_for(deadline);
        self.note_filed(list, deadline);
        let end = END | list as u32;
        let old_tail = self.lists[list].tail;
        let prev = if old_tail == NIL { end } else { old_tail };
        let key = self.alloc(deadline, prev, end, value);
        if old_tail == NIL {
            self.lists[list].head = key.index;
            self.mark_occupied(list, Some(deadline));
        } else {
            self.timers[old_tail as usize].next = key.index;
            self.note_mixed(list, Some(deadline));
        }
        self.lists[list].tail = key.index;
        self.len += 1;
        if deadline < self.next_deadline {
            self.next_deadline = deadline;
        }
        key
    }

    /// Removes a pending timer and returns its value, or `None` if the key is
    /// stale (the timer fired or was cancelled).
    pub fn cancel(&mut self, key: TimerKey) -> Option<T> {
        if !self.is_pending(key) {
            return None;
        }
        self.unlink(key.index);
        let (_, value) = self.release(key.index);
        self.len -= 1;
        if self.len == 0 {
            self.next_deadline = u64::MAX;
        }
        Some(value)
    }

    /// Moves a pending timer to `deadline`. Returns `false`, and does nothing,
    /// if the key is stale.
    ///
    /// A later deadline is recorded without moving the timer (see the module
    /// documentation); an earlier one moves it at once. Both are O(1).
    pub fn reset(&mut self, key: TimerKey, deadline: u64) -> bool {
        let cursor = self.cursor;
        let Some(timer) = self.timers.get_mut(key.index as usize) else {
            return false;
        };
        if timer.generation != key.generation {
            return false;
        }
        // The common case, an idle timeout pushed back: a later deadline
        // still in the window of the cursor is one store, kept short so that
        // a stream of resets keeps several cache misses in flight.
        let ahead = deadline.wrapping_sub(cursor);
        if timer.deadline != FAR
            && deadline >= cursor
            && ahead < NEAR_HALF
            && deadline as u32 != FAR
            && ahead as i64 >= i64::from(timer.deadline.wrapping_sub(cursor as u32) as i32)
        {
            timer.deadline = deadline as u32;
            return true;
        }
        let current = self.deadline_of(key.index);
        self.set_deadline(key.index, deadline);
        if deadline < current {
            let list = self.list_for(deadline);
            if list == self.list_for(current) {
                // The timer sits on this list, or on an earlier slot after a
                // lazy reset: either way no later than the new deadline, so
                // it stays put. The list is no longer uniform (its timers
                // would cascade to their common deadline, after this one).
                self.note_filed(list, deadline);
                if (SLOTS..SLOT_LISTS).contains(&list) {
                    self.mixed[list / SLOTS] |= 1 << (list % SLOTS);
                }
            } else {
                self.unlink(key.index);
                self.file(key.index);
            }
            if deadline < self.next_deadline {
                self.next_deadline = deadline;
            }
        }
        true
    }

    /// Returns the value of a pending timer, or `None` if the key is stale.
    pub fn get(&self, key: TimerKey) -> Option<&T> {
        match self.timers.get(key.index as usize) {
            Some(timer) if timer.generation == key.generation => timer.value.as_ref(),
            _ => None,
        }
    }

    /// Returns the value of a pending timer mutably, or `None` if the key is
    /// stale.
    pub fn get_mut(&mut self, key: TimerKey) -> Option<&mut T> {
        match self.timers.get_mut(key.index as usize) {
            Some(timer) if timer.generation == key.generation => timer.value.as_mut(),
            _ => None,
        }
    }

    /// Returns the deadline of a pending timer, or `None` if the key is stale.
    pub fn deadline(&self, key: TimerKey) -> Option<u64> {
        if self.is_pending(key) {
            Some(self.deadline_of(key.index))
        } else {
            None
        }
    }

    #[inline]
    fn is_pending(&self, key: TimerKey) -> bool {
        matches!(
            self.timers.get(key.index as usize),
            Some(timer) if timer.generation == key.generation
        )
    }

    /// The full deadline of an occupied entry.
    #[inline]
    fn deadline_of(&self, index: u32) -> u64 {
        match self.timers[index as usize].deadline {
            FAR => self.far_deadline(index),
            low => expand(self.cursor, low),
        }
    }

    /// The full deadline of an occupied entry whose stored deadline is `FAR`.
    #[cold]
    #[inline(never)]
    fn far_deadline(&self, index: u32) -> u64 {
        *self.far.get(&index).expect("timer wheel lost a far deadline")
    }

    /// Stores the deadline of an occupied entry: its low 32 bits when the
    /// cursor can read them back (see `is_near`), else in `far`.
    #[inline]
    fn set_deadline(&mut self, index: u32, deadline: u64) {
        let timer = &mut self.timers[index as usize];
        let was_far = timer.deadline == FAR;
        if is_near(self.cursor, deadline) {
            timer.deadline = deadline as u32;
            if was_far {
                self.far.remove(&index);
            }
        } else {
            timer.deadline = FAR;
            self.far.insert(index, deadline);
        }
    }

    /// Returns a tick no later than the earliest pending deadline, or `None`
    /// if no timer is pending.
    ///
    /// The answer is cached, so this is O(1). It is usually exact; after a
    /// cancel or a lazy [`reset`](Self::reset) it may be early until the next
    /// poll that does work. A caller that sleeps until this tick may wake
    /// early, never late.
    #[inline]
    pub fn next_deadline(&self) -> Option<u64> {
        if self.len == 0 {
            None
        } else {
            Some(self.next_deadline)
        }
    }

    /// Advances the wheel to `now` and hands every timer whose deadline is at
    /// or before `now` to `f`, at most `max` of them (`usize::MAX` for no
    /// bound). Returns how many fired.
    ///
    /// If the bound stopped it, the timers still due fire first on the
    /// following calls, before any that become due later. Timers with equal
    /// deadlines fire in insertion order. `now` never moves backwards: an
    /// earlier `now` than a previous poll's is treated as that one.
    #[inline]
    pub fn poll(&mut self, now: u64, max: usize, mut f: impl FnMut(TimerKey, T)) -> usize {
        // Nothing due and time not going backwards: record `now` and return.
        // Comparing rather than taking `max` keeps a stream of polls from
        // waiting on each other's store to `self.now`.
        if now >= self.now && now < self.next_deadline {
            self.now = now;
            return 0;
        }
        let now = now.max(self.now);
        self.now = now;
        self.poll_due(now, max, &mut f)
    }

    /// The part of `poll` that runs when something may be due. Kept out of
    /// line so the nothing-due check inlines into the caller's loop small.
    #[inline(never)]
    fn poll_due(&mut self, now: u64, max: usize, f: &mut impl FnMut(TimerKey, T)) -> usize {
        let mut fired = 0;
        loop {
            fired += self.fire_due(max - fired, f);
            if fired == max {
                break;
            }
            // The due list is empty: move the cursor to the next tick that
            // needs work, if it is not past `now`.
            if let Some((level, slot, start)) = self.first_slot() {
                if start > now {
                    self.cursor = now;
                    break;
                }
                self.cursor = start;
                let list = level * SLOTS + slot;
                let uniform = self.uniform_deadline(list);
                let (head, tail) = self.take_list(list);
                if level == 0 {
                    // A level-0 slot holds one tick: all of it is due.
                    self.splice_back(DUE, head, tail, None);
                    self.due_min = self.due_min.min(start);
                } else if let Some(deadline) = uniform {
                    // Every timer here was filed with one deadline (later
                    // ones were reset lazily and may ride along): move the
                    // whole list to where that deadline belongs.
                    let target = self.list_for(deadline);
                    self.note_filed(target, deadline);
                    self.splice_back(target, head, tail, Some(deadline));
                } else {
                    self.refile(head, tail, level * SLOTS);
                }
            } else if self.lists[OVERFLOW].head != NIL {
                let epoch_start = self.overflow_min >> WHEEL_BITS << WHEEL_BITS;
                if epoch_start > now {
                    self.cursor = now;
                    break;
                }
                debug_assert!(epoch_start > self.cursor);
                self.cursor = epoch_start;
                let (head, tail) = self.take_list(OVERFLOW);
                self.overflow_min = u64::MAX;
                self.refile(head, tail, SLOT_LISTS);
            } else {
                self.cursor = now;
                break;
            }
        }
        self.next_deadline = self.earliest();
        fired
    }

    /// Hands out up to `max` timers from the front of the due list.
    #[inline]
    fn fire_due(&mut self, max: usize, f: &mut impl FnMut(TimerKey, T)) -> usize {
        let head = self.lists[DUE].head;
        let mut due = DueWalk { wheel: self, head };
        let mut fired = 0;
        while fired < max && due.head != NIL {
            let index = due.head;
            let wheel = &mut *due.wheel;
            let timer = &mut wheel.timers[index as usize];
            let (next, deadline, generation) = (timer.next, timer.deadline, timer.generation);
            // Due unless reset to a later deadline after it became due. A
            // near deadline is after the cursor exactly when its offset from
            // the cursor's low 32 bits is positive (see `expand`).
            let later = if deadline != FAR {
                deadline.wrapping_sub(wheel.cursor as u32) as i32 > 0
            } else {
                wheel.far_deadline(index) > wheel.cursor
            };
            due.head = if next & END == 0 { next } else { NIL };
            if later {
                wheel.file(index);
                continue;
            }
            // `release`, with the fields already at hand.
            let timer = &mut wheel.timers[index as usize];
            let value = timer.value.take();
            timer.generation = generation.wrapping_add(1);
            timer.next = wheel.free_head;
            wheel.free_head = index;
            if deadline == FAR {
                wheel.far.remove(&index);
            }
            wheel.len -= 1;
            let Some(value) = value else { unreachable!("timer wheel fired a vacant entry") };
            f(TimerKey { index, generation }, value);
            fired += 1;
        }
        fired
    }

    /// Recomputes the lower bound of all pending deadlines.
    fn earliest(&mut self) -> u64 {
        if self.len == 0 {
            return u64::MAX;
        }
        if self.lists[DUE].head == NIL {
            self.due_min = u64::MAX;
        }
        if self.lists[OVERFLOW].head == NIL {
            self.overflow_min = u64::MAX;
        }
        self.due_min.min(self.overflow_min).min(self.wheel_earliest())
    }

    /// Lower bound of the deadlines filed in the levels, exact when it can be
    /// had cheaply.
    fn wheel_earliest(&self) -> u64 {
        let Some((level, slot, start)) = self.first_slot() else {
            return u64::MAX;
        };
        if level == 0 {
            // Level-0 slots are one tick wide.
            return start;
        }
        if let Some(deadline) = self.uniform_deadline(level * SLOTS + slot) {
            return deadline;
        }
        // An upper-level slot spans many ticks; a short one is worth reading
        // for the exact answer, because the runtime sleeps until it.
        let mut earliest = u64::MAX;
        let mut index = self.lists[level * SLOTS + slot].head;
        for _ in 0..EXACT_SCAN_MAX {
            earliest = earliest.min(self.deadline_of(index));
            let next = self.timers[index as usize].next;
            if next & END != 0 {
                // Lazily reset timers in this slot may be later than timers
                // in the next slot, so that slot's start bounds the answer.
                return earliest.min(self.second_slot_start(level, slot));
            }
            index = next;
        }
        start
    }

    /// Level, slot and start tick of the next slot to process.
    #[inline]
    fn first_slot(&self) -> Option<(usize, usize, u64)> {
        if self.occupied_levels == 0 {
            return None;
        }
        let level = self.occupied_levels.trailing_zeros() as usize;
        let slot = self.occupied[level].trailing_zeros() as usize;
        Some((level, slot, self.slot_start(level, slot)))
    }

    /// Start tick of the occupied slot after `(level, slot)`, the first one.
    fn second_slot_start(&self, level: usize, slot: usize) -> u64 {
        let rest = self.occupied[level] & !(1 << slot);
        if rest != 0 {
            return self.slot_start(level, rest.trailing_zeros() as usize);
        }
        let higher_levels = self.occupied_levels & !((2 << level) - 1);
        if higher_levels == 0 {
            return u64::MAX;
        }
        let level = higher_levels.trailing_zeros() as usize;
        self.slot_start(level, self.occupied[level].trailing_zeros() as usize)
    }

    /// First tick of `slot` at `level` in the cursor's current rotation.
    #[inline]
    fn slot_start(&self, level: usize, slot: usize) -> u64 {
        let shift = level as u32 * SLOT_BITS;
        let level_span_mask = (1u64 << (shift + SLOT_BITS)) - 1;
        (self.cursor & !level_span_mask) | ((slot as u64) << shift)
    }

    /// The list a deadline is filed on, relative to the cursor.
    #[inline]
    fn list_for(&self, deadline: u64) -> usize {
        if deadline <= self.cursor {
            return DUE;
        }
        let highest_differing_bit =
            63 - ((deadline ^ self.cursor) | (SLOTS as u64 - 1)).leading_zeros();
        let level = (highest_differing_bit / SLOT_BITS) as usize;
        if level >= LEVELS {
            return OVERFLOW;
        }
        level * SLOTS + ((deadline >> (level as u32 * SLOT_BITS)) as usize & (SLOTS - 1))
    }

    /// Appends an unlinked entry to the list its deadline belongs on.
    #[inline]
    fn file(&mut self, index: u32) {
        let deadline = self.deadline_of(index);
        let list = self.list_for(deadline);
        self.note_filed(list, deadline);
        self.splice_back(list, index, index, Some(deadline));
    }

    /// The deadline every timer on a slot list above level 0 was filed with,
    /// if they share one. Lazily reset timers may now be due later.
    #[inline]
    fn uniform_deadline(&self, list: usize) -> Option<u64> {
        let (level, slot) = (list / SLOTS, list % SLOTS);
        if level == 0 || self.mixed[level] & (1 << slot) != 0 {
            None
        } else {
            Some(self.filed_deadline[list - SLOTS])
        }
    }

    /// Keeps the due and overflow lower bounds when `deadline` joins `list`.
    #[inline]
    fn note_filed(&mut self, list: usize, deadline: u64) {
        if list == DUE {
            self.due_min = self.due_min.min(deadline);
        } else if list == OVERFLOW {
            self.overflow_min = self.overflow_min.min(deadline);
        }
    }

    /// Files every entry of the detached list `head..=tail` anew.
    ///
    /// Walking a list is a chain of dependent loads, one cache miss per entry
    /// once the list outgrows the cache, so the list is walked from both ends
    /// at once: two misses in flight instead of one. The front walk appends to
    /// the target lists as it goes; consecutive entries bound for the same list
    /// stay linked and move as one splice. The back walk, going backwards,
    /// prepends each entry to a chain of its own per target list, and those
    /// chains are appended once the walks meet, so every list keeps the
    /// original order. The back walk only takes entries bound for lists that
    /// were empty when the refile began (`list < empty_below`, or the due
    /// list), which every level below the one being refiled is: a lazily
    /// reset entry bound elsewhere ends it, and the front walk does the rest.
    fn refile(&mut self, head: u32, tail: u32, empty_below: usize) {
        let mut back = self.back_chains.take().unwrap_or_else(|| Box::new([EMPTY_CHAIN; CHAINS]));
        let mut touched = [0u64; CHAINS.div_ceil(64)];
        let mut run_head = head;
        let mut run_deadline_min = self.deadline_of(head);
        let mut run_deadline_max = run_deadline_min;
        let mut run_list = self.list_for(run_deadline_min);
        // `front` has been filed; `rear` is the last entry not yet filed.
        let (mut front, mut rear) = (head, tail);
        let mut back_open = true;
        while front != rear {
            if back_open {
                let deadline = self.deadline_of(rear);
                let list = self.list_for(deadline);
                if list < empty_below || list == DUE {
                    let chain_id = if list == DUE { SLOT_LISTS } else { list };
                    let chain = &mut back[chain_id];
                    let Timer { prev, .. } = self.timers[rear as usize];
                    if chain.head == NIL {
                        touched[chain_id / 64] |= 1 << (chain_id % 64);
                        chain.tail = rear;
                    } else {
                        self.timers[chain.head as usize].prev = rear;
                    }
                    self.timers[rear as usize].next = chain.head;
                    chain.head = rear;
                    chain.min = chain.min.min(deadline);
                    chain.max = chain.max.max(deadline);
                    rear = prev;
                    if rear == front {
                        break;
                    }
                } else {
                    back_open = false;
                }
            }
            let next = self.timers[front as usize].next;
            let deadline = self.deadline_of(next);
            let list = self.list_for(deadline);
            if list != run_list {
                self.splice_run(run_list, run_head, front, run_deadline_min, run_deadline_max);
                run_head = next;
                run_list = list;
                run_deadline_min = deadline;
                run_deadline_max = deadline;
            } else {
                run_deadline_min = run_deadline_min.min(deadline);
                run_deadline_max = run_deadline_max.max(deadline);
            }
            front = next;
        }
        self.splice_run(run_list, run_head, front, run_deadline_min, run_deadline_max);
        for (word_index, mut word) in touched.into_iter().enumerate() {
            while word != 0 {
                let chain_id = word_index * 64 + word.trailing_zeros() as usize;
                word &= word - 1;
                let chain = mem::replace(&mut back[chain_id], EMPTY_CHAIN);
                let list = if chain_id == SLOT_LISTS { DUE } else { chain_id };
                self.splice_run(list, chain.head, chain.tail, chain.min, chain.max);
            }
        }
        self.back_chains = Some(back);
    }

    /// Appends a run of entries whose deadlines all lie in `min..=max` and
    /// belong on `list`.
    #[inline]
    fn splice_run(&mut self, list: usize, head: u32, tail: u32, min: u64, max: u64) {
        self.note_filed(list, min);
        let filed = if min == max { Some(min) } else { None };
        self.splice_back(list, head, tail, filed);
    }

    /// Appends the chain `head..=tail` (already linked internally) to `list`.
    /// `filed` is the deadline all of the chain was filed with, if it has one.
    #[inline]
    fn splice_back(&mut self, list: usize, head: u32, tail: u32, filed: Option<u64>) {
        let end = END | list as u32;
        let old_tail = self.lists[list].tail;
        let prev = if old_tail == NIL { end } else { old_tail };
        if head == tail {
            self.timers[head as usize].set_links(prev, end);
        } else {
            self.timers[head as usize].prev = prev;
            self.timers[tail as usize].next = end;
        }
        if old_tail == NIL {
            self.lists[list].head = head;
            self.mark_occupied(list, filed);
        } else {
            self.timers[old_tail as usize].next = head;
            self.note_mixed(list, filed);
        }
        self.lists[list].tail = tail;
    }

    /// Sets the occupancy bits of a list that just became non-empty, and
    /// starts its uniformity record. `filed` is as in `splice_back`.
    #[inline]
    fn mark_occupied(&mut self, list: usize, filed: Option<u64>) {
        if list < SLOT_LISTS {
            let (level, bit) = (list / SLOTS, 1 << (list % SLOTS));
            self.occupied[level] |= bit;
            self.occupied_levels |= 1 << level;
            if level > 0 {
                match filed {
                    Some(deadline) => {
                        self.mixed[level] &= !bit;
                        self.filed_deadline[list - SLOTS] = deadline;
                    }
                    None => self.mixed[level] |= bit,
                }
            }
        }
    }

    /// Marks an upper slot mixed unless what joins it was filed with the
    /// slot's deadline. Setting an already set bit is harmless, so the bit
    /// is not read first.
    #[inline]
    fn note_mixed(&mut self, list: usize, filed: Option<u64>) {
        if (SLOTS..SLOT_LISTS).contains(&list) && filed != Some(self.filed_deadline[list - SLOTS]) {
            self.mixed[list / SLOTS] |= 1 << (list % SLOTS);
        }
    }

    /// Detaches a non-empty list and returns its `(head, tail)`.
    fn take_list(&mut self, list: usize) -> (u32, u32) {
        let List { head, tail } = mem::replace(&mut self.lists[list], EMPTY_LIST);
        debug_assert!(head != NIL);
        self.mark_empty(list);
        (head, tail)
    }

    /// Removes an entry from whichever list holds it.
    #[inline]
    fn unlink(&mut self, index: u32) {
        let Timer { prev, next, .. } = self.timers[index as usize];
        self.unlink_links(prev, next);
    }

    /// Removes the entry between `prev` and `next` (indices or list ends).
    #[inline]
    fn unlink_links(&mut self, prev: u32, next: u32) {
        if next & END == 0 {
            self.timers[next as usize].prev = prev;
        } else {
            let list = (next & !END) as usize;
            self.lists[list].tail = if prev & END == 0 { prev } else { NIL };
        }
        if prev & END == 0 {
            self.timers[prev as usize].next = next;
        } else {
            let list = (prev & !END) as usize;
            if next & END == 0 {
                self.lists[list].head = next;
            } else {
                self.lists[list].head = NIL;
                self.mark_empty(list);
            }
        }
    }

    /// Clears the occupancy bits of a list that just became empty.
    #[inline]
    fn mark_empty(&mut self, list: usize) {
        if list < SLOT_LISTS {
            let level = list / SLOTS;
            self.occupied[level] &= !(1 << (list % SLOTS));
            if self.occupied[level] == 0 {
                self.occupied_levels &= !(1 << level);
            }
        } else if list == DUE {
            self.due_min = u64::MAX;
        } else {
            // A stale bound left behind here could name an epoch the cursor
            // has since passed.
            self.overflow_min = u64::MAX;
        }
    }

    /// Takes a vacant entry (or grows the slab) and fills it with a pending
    /// timer linked between `prev` and `next`.
    #[inline]
    fn alloc(&mut self, deadline: u64, prev: u32, next: u32, value: T) -> TimerKey {
        let index = if self.free_head != NIL { self.free_head } else { self.grow() };
        let timer = &mut self.timers[index as usize];
        debug_assert!(timer.value.is_none(), "timer wheel free list holds an occupied entry");
        self.free_head = timer.next;
        let generation = timer.generation.wrapping_add(1);
        timer.generation = generation;
        timer.set_links(prev, next);
        timer.value = Some(value);
        if is_near(self.cursor, deadline) {
            timer.deadline = deadline as u32;
        } else {
            timer.deadline = FAR;
            self.far.insert(index, deadline);
        }
        TimerKey { index, generation }
    }

    /// Appends a vacant entry (generation 0) to the free list and returns its
    /// index. Kept out of line: it runs only until the slab reaches its peak.
    #[cold]
    #[inline(never)]
    fn grow(&mut self) -> u32 {
        let index = self.timers.len();
        assert!(
            index < ENTRIES_MAX,
            "timer wheel is full: 2^31 timers are pending; cancel or fire some first"
        );
        let capacity = self.timers.capacity();
        self.timers.push(Timer { deadline: 0, generation: 0, prev: NIL, next: NIL, value: None });
        if self.timers.capacity() != capacity {
            advise_huge_pages(&self.timers);
        }
        self.free_head = index as u32;
        index as u32
    }

    /// Frees an unlinked entry, bumping its generation so old keys go stale.
    #[inline]
    fn release(&mut self, index: u32) -> (TimerKey, T) {
        let timer = &mut self.timers[index as usize];
        let generation = timer.generation;
        let value = timer.value.take().expect("timer wheel released a vacant entry");
        timer.generation = generation.wrapping_add(1);
        timer.next = self.free_head;
        if timer.deadline == FAR {
            self.far.remove(&index);
        }
        self.free_head = index;
        (TimerKey { index, generation }, value)
    }
}

/// Slabs at least this large ask for transparent huge pages.
const HUGE_PAGE_SLAB_MIN: usize = 4 << 20;

/// Asks the kernel to back a large slab with 2 MiB pages (`MADV_HUGEPAGE`),
/// so random cancels and list walks over it do not each miss the TLB.
/// Advice only: without transparent huge pages it does nothing.
#[cold]
fn advise_huge_pages<T>(timers: &Vec<Timer<T>>) {
    const HUGE_PAGE: usize = 2 << 20;
    let bytes = timers.capacity() * mem::size_of::<Timer<T>>();
    if bytes < HUGE_PAGE_SLAB_MIN || cfg!(miri) {
        return;
    }
    let start = timers.as_ptr() as usize;
    let first = start.next_multiple_of(HUGE_PAGE);
    let end = (start + bytes) / HUGE_PAGE * HUGE_PAGE;
    if end > first {
        crate::sys::advise_huge_pages(first, end - first);
    }
}

/// Walks the due list from the front without rewriting each new head's
/// back link; dropping it, even while `f` unwinds, makes the list whole.
struct DueWalk<'a, T> {
    wheel: &'a mut TimerWheel<T>,
    head: u32,
}

impl<T> Drop for DueWalk<'_, T> {
    fn drop(&mut self) {
        let wheel = &mut *self.wheel;
        if self.head == NIL {
            wheel.lists[DUE] = EMPTY_LIST;
            wheel.due_min = u64::MAX;
        } else {
            wheel.lists[DUE].head = self.head;
            wheel.timers[self.head as usize].prev = END | DUE as u32;
        }
    }
}

impl<T> Default for TimerWheel<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> fmt::Debug for TimerWheel<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TimerWheel")
            .field("len", &self.len)
            .field("now", &self.now)
            .field("next_deadline", &self.next_deadline())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(wheel: &mut TimerWheel<u32>, now: u64) -> Vec<u32> {
        let mut fired = Vec::new();
        wheel.poll(now, usize::MAX, |_, v| fired.push(v));
        fired
    }

    #[test]
    fn entry_is_32_bytes_for_u64() {
        assert_eq!(mem::size_of::<Timer<u64>>(), 32);
        assert_eq!(mem::size_of::<Timer<std::task::Waker>>(), 32);
        assert!(mem::size_of::<TimerWheel<u64>>() <= 6 * 1024);
    }

    #[test]
    fn empty_wheel() {
        let mut wheel = TimerWheel::<u32>::new();
        assert!(wheel.is_empty());
        assert_eq!(wheel.len(), 0);
        assert_eq!(wheel.next_deadline(), None);
        assert_eq!(wheel.capacity(), 0);
        assert_eq!(wheel.poll(1_000, usize::MAX, |_, _| panic!("fired")), 0);
        assert_eq!(wheel.now(), 1_000);
        assert_eq!(wheel.poll(u64::MAX, usize::MAX, |_, _| panic!("fired")), 0);
        assert_eq!(wheel.now(), u64::MAX);
        assert_eq!(wheel.next_deadline(), None);
    }

    #[test]
    fn stale_key_after_cancel_does_not_touch_reused_entry() {
        let mut wheel = TimerWheel::new();
        let old = wheel.insert(10, 1);
        assert_eq!(wheel.cancel(old), Some(1));
        let new = wheel.insert(20, 2);
        assert_eq!(new.index, old.index, "the freed entry is reused");
        assert_ne!(new, old);
        assert_eq!(wheel.cancel(old), None);
        assert!(!wheel.reset(old, 5));
        assert_eq!(wheel.get(old), None);
        assert_eq!(wheel.get_mut(old), None);
        assert_eq!(wheel.deadline(old), None);
        assert_eq!(wheel.deadline(new), Some(20));
        assert_eq!(wheel.get(new), Some(&2));
        assert_eq!(drain(&mut wheel, 19), Vec::<u32>::new());
        assert_eq!(drain(&mut wheel, 20), vec![2]);
        assert_eq!(wheel.cancel(new), None, "a fired key is stale");
    }

    #[test]
    fn batch_bound_defers_the_rest() {
        let mut wheel = TimerWheel::new();
        for i in 0..10 {
            wheel.insert(100, i);
        }
        let mut fired = Vec::new();
        assert_eq!(wheel.poll(100, 4, |_, v| fired.push(v)), 4);
        assert_eq!(fired, [0, 1, 2, 3]);
        assert_eq!(wheel.next_deadline(), Some(100));
        assert_eq!(wheel.poll(100, 4, |_, v| fired.push(v)), 4);
        assert_eq!(wheel.poll(100, 4, |_, v| fired.push(v)), 2);
        assert_eq!(fired, (0..10).collect::<Vec<_>>());
        assert!(wheel.is_empty());
        assert_eq!(wheel.poll(100, 0, |_, _| panic!("fired")), 0);
    }

    #[test]
    fn deferred_timers_fire_before_later_ones() {
        let mut wheel = TimerWheel::new();
        wheel.insert(5, 0);
        wheel.insert(5, 1);
        wheel.insert(7, 2);
        let mut fired = Vec::new();
        wheel.poll(10, 1, |_, v| fired.push(v));
        wheel.poll(10, 1, |_, v| fired.push(v));
        wheel.poll(10, 1, |_, v| fired.push(v));
        assert_eq!(fired, [0, 1, 2]);
    }

    #[test]
    fn next_deadline_is_exact_for_sparse_timers() {
        let mut wheel = TimerWheel::new();
        let far = wheel.insert(30_000, 1);
        assert_eq!(wheel.next_deadline(), Some(30_000));
        for now in (0..30_000).step_by(7) {
            assert_eq!(wheel.poll(now, usize::MAX, |_, _| panic!("early")), 0);
            assert_eq!(wheel.next_deadline(), Some(30_000));
        }
        let near = wheel.insert(29_999 + 100, 2);
        assert_eq!(wheel.next_deadline(), Some(30_000));
        assert_eq!(drain(&mut wheel, 30_000), vec![1]);
        assert_eq!(wheel.next_deadline(), Some(30_099));
        assert_eq!(wheel.deadline(far), None);
        assert_eq!(wheel.cancel(near), Some(2));
        assert_eq!(wheel.next_deadline(), None);
    }

    #[test]
    fn next_deadline_is_never_late_after_cancel_and_lazy_reset() {
        let mut wheel = TimerWheel::new();
        let a = wheel.insert(1_000, 1);
        let b = wheel.insert(5_000, 2);
        assert!(wheel.reset(a, 9_000));
        assert!(wheel.next_deadline().unwrap() <= 5_000);
        assert_eq!(drain(&mut wheel, 4_999), Vec::<u32>::new());
        assert_eq!(wheel.next_deadline(), Some(5_000));
        assert_eq!(wheel.cancel(b), Some(2));
        assert!(wheel.next_deadline().unwrap() <= 9_000);
        assert_eq!(drain(&mut wheel, 8_999), Vec::<u32>::new());
        assert_eq!(wheel.next_deadline(), Some(9_000));
        assert_eq!(drain(&mut wheel, 9_000), vec![1]);
    }

    #[test]
    fn reset_earlier_and_later() {
        let mut wheel = TimerWheel::new();
        let k = wheel.insert(10_000, 1);
        assert!(wheel.reset(k, 50));
        assert_eq!(wheel.next_deadline(), Some(50));
        assert_eq!(drain(&mut wheel, 49), Vec::<u32>::new());
        assert!(wheel.reset(k, 200_000));
        assert_eq!(drain(&mut wheel, 199_999), Vec::<u32>::new());
        assert_eq!(wheel.deadline(k), Some(200_000));
        assert_eq!(drain(&mut wheel, 200_000), vec![1]);
    }

    #[test]
    fn past_deadlines_fire_on_next_poll() {
        let mut wheel = TimerWheel::new();
        wheel.poll(500, usize::MAX, |_, _| {});
        wheel.insert(3, 1);
        wheel.insert(500, 2);
        assert_eq!(wheel.next_deadline(), Some(3));
        assert_eq!(drain(&mut wheel, 500), vec![1, 2]);
    }

    #[test]
    fn overflow_timers_fire_on_their_tick() {
        let mut wheel = TimerWheel::new();
        let beyond = 1u64 << 40;
        wheel.insert(beyond + 12_345, 1);
        wheel.insert(u64::MAX, 2);
        wheel.insert(3 << 36, 3);
        assert_eq!(wheel.next_deadline(), Some(3 << 36));
        assert_eq!(drain(&mut wheel, (3 << 36) - 1), Vec::<u32>::new());
        assert_eq!(drain(&mut wheel, 3 << 36), vec![3]);
        assert_eq!(drain(&mut wheel, beyond + 12_344), Vec::<u32>::new());
        assert_eq!(wheel.next_deadline(), Some(beyond + 12_345));
        assert_eq!(drain(&mut wheel, beyond + 12_345), vec![1]);
        assert_eq!(drain(&mut wheel, u64::MAX - 1), Vec::<u32>::new());
        assert_eq!(drain(&mut wheel, u64::MAX), vec![2]);
    }

    #[test]
    fn a_cluster_cascades_whole_and_carries_lazy_resets() {
        let mut wheel = TimerWheel::new();
        let keys: Vec<_> = (0..100).map(|i| wheel.insert(300_001, i)).collect();
        let cluster = wheel.list_for(300_001);
        assert_eq!(wheel.uniform_deadline(cluster), Some(300_001));
        assert!(wheel.reset(keys[10], 300_500));
        assert!(wheel.reset(keys[20], 900_000));
        assert_eq!(wheel.cancel(keys[30]), Some(30));
        assert_eq!(wheel.uniform_deadline(cluster), Some(300_001));
        assert_eq!(wheel.next_deadline(), Some(300_001));
        assert_eq!(drain(&mut wheel, 300_000), Vec::<u32>::new());
        let expected: Vec<u32> = (0..100).filter(|i| ![10, 20, 30].contains(i)).collect();
        assert_eq!(drain(&mut wheel, 300_001), expected);
        assert_eq!(drain(&mut wheel, 300_499), Vec::<u32>::new());
        assert_eq!(drain(&mut wheel, 300_500), vec![10]);
        assert_eq!(drain(&mut wheel, 899_999), Vec::<u32>::new());
        assert_eq!(drain(&mut wheel, 900_000), vec![20]);
    }

    #[test]
    fn an_earlier_reset_within_the_slot_stays_put_and_fires_on_time() {
        let mut wheel = TimerWheel::new();
        let keys: Vec<_> = (0..10).map(|i| wheel.insert(300_001, i)).collect();
        let cluster = wheel.list_for(300_001);
        assert_eq!(wheel.list_for(299_500), cluster);
        // Lazily later, then earlier than it was filed, all in one slot.
        assert!(wheel.reset(keys[3], 302_000));
        assert!(wheel.reset(keys[3], 299_500));
        assert!(wheel.reset(keys[5], 300_000));
        assert_eq!(wheel.uniform_deadline(cluster), None, "no longer one deadline");
        assert_eq!(wheel.next_deadline(), Some(299_500));
        assert_eq!(drain(&mut wheel, 299_499), Vec::<u32>::new());
        assert_eq!(drain(&mut wheel, 299_500), vec![3]);
        assert_eq!(drain(&mut wheel, 300_000), vec![5]);
        assert_eq!(drain(&mut wheel, 300_001), vec![0, 1, 2, 4, 6, 7, 8, 9]);
        // Due and overflow timers stay put too.
        let due = wheel.insert(300_001, 10);
        let far = wheel.insert(1 << 40, 11);
        assert!(wheel.reset(due, 5));
        assert!(wheel.reset(far, (1 << 40) - 7));
        assert_eq!(wheel.next_deadline(), Some(5));
        assert_eq!(drain(&mut wheel, 300_001), vec![10]);
        assert_eq!(drain(&mut wheel, (1 << 40) - 8), Vec::<u32>::new());
        assert_eq!(drain(&mut wheel, (1 << 40) - 7), vec![11]);
    }

    #[test]
    fn a_mixed_slot_cascades_timer_by_timer() {
        let mut wheel = TimerWheel::new();
        wheel.insert(300_003, 3);
        wheel.insert(300_001, 1);
        wheel.insert(300_002, 2);
        let slot = wheel.list_for(300_001);
        assert_eq!(wheel.uniform_deadline(slot), None);
        assert_eq!(wheel.next_deadline(), Some(300_001));
        let mut fired = Vec::new();
        for now in 300_000..300_004 {
            wheel.poll(now, usize::MAX, |_, v| fired.push((now, v)));
        }
        assert_eq!(fired, [(300_001, 1), (300_002, 2), (300_003, 3)]);
    }

    #[test]
    fn an_emptied_overflow_list_leaves_no_stale_bound() {
        let mut wheel = TimerWheel::new();
        let keys: Vec<_> = (0..3).map(|i| wheel.insert(7_000, i)).collect();
        // Lazily reset far out: it rides the cascade down, then is re-filed on
        // the overflow list when its old tick comes up.
        assert!(wheel.reset(keys[1], 1 << 36));
        assert_eq!(drain(&mut wheel, 7_000), vec![0, 2]);
        // Moved back out of the overflow list, which is now empty.
        assert!(wheel.reset(keys[1], 7_000));
        assert_eq!(drain(&mut wheel, 7_000 + (1 << 36)), vec![1]);
        let deadline = wheel.now() + (1 << 36);
        wheel.insert(deadline, 3);
        assert_eq!(drain(&mut wheel, deadline - 1), Vec::<u32>::new());
        assert_eq!(drain(&mut wheel, deadline), vec![3]);
    }

    #[test]
    fn deadlines_read_back_exactly_at_the_edges_of_the_near_window() {
        let mut wheel = TimerWheel::new();
        let base = 3u64 << 33;
        wheel.poll(base, usize::MAX, |_, _| {});
        let half = NEAR_HALF;
        let deadlines = [
            0,
            base - half - 1,
            base - half,
            base - half + 1,
            base - 1,
            base,
            base + 1,
            (base | u64::from(u32::MAX)) + 1 - (1 << 32),
            base | u64::from(u32::MAX),
            base + half - 1,
            base + half,
            base + half + 1,
            u64::MAX,
        ];
        let keys: Vec<_> = deadlines.iter().map(|&d| wheel.insert(d, d)).collect();
        for (&key, &d) in keys.iter().zip(&deadlines) {
            assert_eq!(wheel.deadline(key), Some(d));
        }
        // Move the cursor through part of the window: every deadline must
        // still read back and fire on its tick.
        assert!(wheel.reset(keys[9], base + half + 5));
        let mut fired = Vec::new();
        for now in [base, base + 1, base + half - 1, base + half + 1, base + half + 5, u64::MAX] {
            wheel.poll(now, usize::MAX, |_, v| fired.push((now, v)));
            for (&key, &d) in keys.iter().zip(&deadlines) {
                if let Some(read) = wheel.deadline(key) {
                    assert!(read == d || (key == keys[9] && read == base + half + 5));
                }
            }
        }
        let mut expected: Vec<(u64, u64)> = deadlines
            .iter()
            .map(|&d| {
                let d = if d == base + half - 1 { base + half + 5 } else { d };
                let now =
                    [base, base + 1, base + half - 1, base + half + 1, base + half + 5, u64::MAX]
                        .into_iter()
                        .find(|&now| now >= d)
                        .unwrap();
                (now, if d == base + half + 5 { base + half - 1 } else { d })
            })
            .collect();
        expected.sort_unstable();
        fired.sort_unstable();
        assert_eq!(fired, expected);
        assert!(wheel.is_empty());
        assert!(wheel.far.is_empty(), "released far timers leave nothing behind");
    }

    #[test]
    fn a_reset_near_the_end_of_time_to_an_early_tick_is_not_read_as_ahead() {
        let mut wheel = TimerWheel::new();
        wheel.poll(u64::MAX - 2, usize::MAX, |_, _| {});
        let key = wheel.insert(u64::MAX - 1, 1);
        // 7 000 is 7 002 ticks "ahead" of the cursor modulo 2^64.
        assert!(wheel.reset(key, 7_000));
        assert_eq!(wheel.deadline(key), Some(7_000));
        assert_eq!(wheel.next_deadline(), Some(7_000));
        assert_eq!(drain(&mut wheel, u64::MAX - 2), vec![1]);
    }

    #[test]
    fn every_tick_of_a_range_fires_exactly_once_on_time() {
        let mut wheel = TimerWheel::new();
        // Under Miri (some thousand times slower) a tenth of the range; it
        // still reaches the third level (past 64 * 64 = 4,096 ticks).
        let timers: u32 = if cfg!(miri) { 2_000 } else { 20_000 };
        for d in 0..timers {
            wheel.insert(u64::from(d) * 3, d);
        }
        let mut expected = 0;
        for now in 0..u64::from(timers) * 3 {
            wheel.poll(now, usize::MAX, |_, v| {
                assert_eq!(u64::from(v) * 3, now);
                assert_eq!(v, expected);
                expected += 1;
            });
        }
        assert!(wheel.is_empty());
    }
}
