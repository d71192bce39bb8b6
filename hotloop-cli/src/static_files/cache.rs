//! Open files kept per worker for a short while, as nginx's
//! `open_file_cache` keeps them: a request for a file served within the
//! last [`VALID`] costs no open, only an `fstat` of the descriptor held.
//!
//! # Implementation notes
//! - One cache per worker thread (a thread-local: tasks never leave their
//!   worker). Its size is a share of the open-file limit, not a fixed
//!   count: all workers' caches together hold at most a
//!   [`NOFILE_SHARE_DIVISOR`]th of `RLIMIT_NOFILE` (and each at most
//!   [`ENTRIES_MAX`]), so the rest is left to connections. When it is
//!   full the oldest entry goes.
//! - Nothing is kept longer than [`VALID`] after its open: a task on each
//!   worker with a non-empty cache sleeps until the oldest entry is due
//!   and drops what is due, so an idle worker holds no descriptor for more
//!   than [`VALID`], and a deleted file's descriptor goes with its entry.
//!   The task ends when the cache is empty.
//! - Under descriptor pressure the cache gives way: when an accept on the
//!   worker fails with `EMFILE` or `ENFILE` the listener calls
//!   [`release_idle`] (registered with
//!   `hotloop::net::on_descriptor_shortage`) and tries again at once, and
//!   an open that fails the same way does the same. Idle entries (not in
//!   use by a response) are closed; an entry in use closes with its last
//!   response.
//! - Never stale: every hit first `fstat`s the descriptor (from the
//!   inode in memory; it never waits for a disk, so it runs on the worker,
//!   as `sendfile` does) and compares it with what was seen at the open.
//!   A file deleted (no link left: `st_nlink == 0`), replaced by a rename
//!   (the old inode lost its last link), or changed in place (another
//!   size or modification time) is dropped and opened again, so the
//!   response's length and `Last-Modified` always match the bytes sent.
//!   A path bound to another file while the old one keeps a link elsewhere
//!   (`mv a b; mv c a`) is seen at the open [`VALID`] later. Errors are not
//!   kept: a missing file is looked up again on every request.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hotloop::fs::File;

/// How long an open file is used without opening its path again.
pub const VALID: Duration = Duration::from_secs(1);
/// The most open files one worker keeps, whatever the open-file limit.
pub const ENTRIES_MAX: usize = 1024;
/// The caches of all workers together hold at most this fraction
/// (1/N) of the open-file limit.
pub const NOFILE_SHARE_DIVISOR: u64 = 4;

/// How many files each of `workers` workers may keep open under an
/// open-file limit of `nofile`: 0 turns the cache off.
pub fn budget(nofile: u64, workers: usize) -> usize {
    let share = nofile / NOFILE_SHARE_DIVISOR / (workers.max(1) as u64);
    share.min(ENTRIES_MAX as u64) as usize
}

/// What an open descriptor's `fstat` says that a response depends on, and
/// what tells a file changed or gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    pub len: u64,
    /// Seconds and nanoseconds since the epoch.
    mtime: (i64, u64),
    ino: u64,
    dev: u64,
    /// No name links to the file any more (it was deleted or replaced).
    unlinked: bool,
    kind: Kind,
}

/// The kinds of file the server tells apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Regular,
    Directory,
    /// A FIFO, a socket, a device: never served.
    Other,
}

impl Stat {
    /// `fstat` of `file`: a system call on the worker that never waits
    /// (an open descriptor's inode is in memory).
    // `struct stat`'s field types differ by architecture (`st_nlink` is 64
    // bits on x86-64, 32 on aarch64): the conversions are the same type on some.
    #[allow(clippy::useless_conversion)]
    pub fn of(file: &impl AsFd) -> std::io::Result<Stat> {
        let st = rustix::fs::fstat(file)?;
        let kind = match rustix::fs::FileType::from_raw_mode(st.st_mode) {
            rustix::fs::FileType::RegularFile => Kind::Regular,
            rustix::fs::FileType::Directory => Kind::Directory,
            _ => Kind::Other,
        };
        Ok(Stat {
            len: u64::try_from(i64::from(st.st_size)).unwrap_or(0),
            mtime: (i64::from(st.st_mtime), u64::from(st.st_mtime_nsec)),
            ino: u64::from(st.st_ino),
            dev: u64::from(st.st_dev),
            unlinked: u64::from(st.st_nlink) == 0,
            kind,
        })
    }

    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// The modification time.
    pub fn modified(&self) -> SystemTime {
        let (secs, nanos) = self.mtime;
        let nanos = Duration::from_nanos(nanos.min(999_999_999));
        match u64::try_from(secs) {
            Ok(s) => UNIX_EPOCH + Duration::from_secs(s) + nanos,
            Err(_) => UNIX_EPOCH,
        }
    }

    /// True when `now` describes the same file, unchanged and still linked.
    fn same_file(&self, now: &Stat) -> bool {
        !now.unlinked
            && (now.ino, now.dev, now.len, now.mtime) == (self.ino, self.dev, self.len, self.mtime)
    }
}

/// An open file with what the response needs.
pub struct Entry {
    pub file: File,
    pub stat: Stat,
    /// The name the content type comes from (`index.html` for a directory).
    pub name: String,
    opened: Instant,
    /// Its place in the cache's order of opening.
    seq: u64,
}

impl Entry {
    pub fn new(file: File, stat: Stat, name: String) -> Entry {
        Entry { file, stat, name, opened: hotloop::time::now(), seq: 0 }
    }

    /// Still the file at its path as far as the descriptor can tell (see
    /// the module notes), and opened within [`VALID`].
    fn current(&self, now: Instant) -> bool {
        now.duration_since(self.opened) < VALID
            && Stat::of(&self.file).is_ok_and(|st| self.stat.same_file(&st))
    }
}

/// One worker's cache.
#[derive(Default)]
struct Cache {
    entries: HashMap<PathBuf, Rc<Entry>>,
    /// The entries' paths in the order they were opened (by `seq`).
    order: BTreeMap<u64, PathBuf>,
    next_seq: u64,
    /// A task drops due entries (see the module notes).
    sweeping: bool,
    /// [`release_idle`] is registered with this worker's listeners.
    hooked: bool,
}

impl Cache {
    fn remove(&mut self, rel: &Path) -> Option<Rc<Entry>> {
        let entry = self.entries.remove(rel)?;
        self.order.remove(&entry.seq);
        Some(entry)
    }

    /// Drops the entries opened [`VALID`] or more before `now`.
    fn drop_due(&mut self, now: Instant) {
        while let Some((_, rel)) = self.order.first_key_value() {
            let due = self.entries.get(rel).is_none_or(|e| now.duration_since(e.opened) >= VALID);
            if !due {
                break;
            }
            let rel = rel.clone();
            if self.remove(&rel).is_none() {
                self.order.pop_first();
            }
        }
    }

    /// When the oldest entry is due.
    fn next_due(&self) -> Option<Instant> {
        let (_, rel) = self.order.first_key_value()?;
        Some(self.entries.get(rel)?.opened + VALID)
    }
}

thread_local! {
    static CACHE: RefCell<Cache> = RefCell::new(Cache::default());
}

/// The entry for `rel` if it is current (see the module notes); a stale
/// one is dropped.
pub fn get(rel: &Path) -> Option<Rc<Entry>> {
    let now = hotloop::time::now();
    CACHE.with(|cache| {
        let mut cache = cache.borrow_mut();
        let entry = cache.entries.get(rel)?;
        if entry.current(now) {
            return Some(entry.clone());
        }
        cache.remove(rel);
        None
    })
}

/// Keeps `entry` for `rel`, within `budget` entries on this worker
/// ([`budget`]); with a budget of 0 nothing is kept.
pub fn put(rel: &Path, entry: Entry, budget: usize) -> Rc<Entry> {
    if budget == 0 {
        return Rc::new(entry);
    }
    let now = hotloop::time::now();
    let (entry, start_sweeping, hook) = CACHE.with(|cache| {
        let mut cache = cache.borrow_mut();
        cache.remove(rel);
        cache.drop_due(now);
        while cache.entries.len() >= budget {
            let Some((_, oldest)) = cache.order.pop_first() else { break };
            cache.entries.remove(&oldest);
        }
        let seq = cache.next_seq;
        cache.next_seq += 1;
        let entry = Rc::new(Entry { seq, ..entry });
        cache.order.insert(seq, rel.to_path_buf());
        cache.entries.insert(rel.to_path_buf(), entry.clone());
        let start_sweeping = !std::mem::replace(&mut cache.sweeping, true);
        let hook = !std::mem::replace(&mut cache.hooked, true);
        (entry, start_sweeping, hook)
    });
    if hook {
        hotloop::net::on_descriptor_shortage(release_idle);
    }
    if start_sweeping {
        drop(hotloop::spawn(sweep()));
    }
    entry
}

/// Closes every entry no response is using; returns how many descriptors
/// that closed. What the listener calls when an accept runs out of
/// descriptors, and what an open that runs out calls before it tries again.
pub fn release_idle() -> usize {
    CACHE.with(|cache| {
        let Ok(mut cache) = cache.try_borrow_mut() else { return 0 };
        let idle: Vec<PathBuf> = cache
            .entries
            .iter()
            .filter(|(_, e)| Rc::strong_count(e) == 1)
            .map(|(rel, _)| rel.clone())
            .collect();
        for rel in &idle {
            cache.remove(rel);
        }
        idle.len()
    })
}

/// Drops entries as they fall due, until the cache is empty.
async fn sweep() {
    /// Clears the flag however the task ends (a runtime dropped with it
    /// asleep included), so the next entry starts a new one.
    struct Sweeping;
    impl Drop for Sweeping {
        fn drop(&mut self) {
            let _ = CACHE.try_with(|cache| {
                if let Ok(mut cache) = cache.try_borrow_mut() {
                    cache.sweeping = false;
                }
            });
        }
    }
    let _sweeping = Sweeping;
    loop {
        let next = CACHE.with(|cache| {
            let mut cache = cache.borrow_mut();
            // The clock itself too, not only the loop's reading of this
            // turn: a sleep ends once the clock has passed its deadline,
            // which may still be ahead of the turn's reading, and an entry
            // found not yet due would file the same, passed, deadline
            // again and spin in this poll.
            cache.drop_due(hotloop::time::now().max(Instant::now()));
            cache.next_due()
        });
        let Some(next) = next else { return };
        hotloop::time::sleep_until(next).await;
    }
}

#[cfg(test)]
mod tests {
    use super::budget;

    #[test]
    fn the_budget_is_a_share_of_the_open_file_limit() {
        assert_eq!(budget(256, 1), 64);
        assert_eq!(budget(256, 2), 32);
        assert_eq!(budget(1 << 20, 2), 1024, "capped per worker");
        assert_eq!(budget(8, 4), 0, "a tiny limit keeps nothing");
    }
}
