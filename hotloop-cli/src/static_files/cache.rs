//! Open files kept per worker for a short while, as nginx's
//! `open_file_cache` keeps them: a request for a file served within the
//! last [`VALID`] costs no open and no `statx`.
//!
//! # Implementation notes
//! - One map per worker thread (a thread-local: tasks never leave their
//!   worker), at most [`ENTRIES_MAX`] entries; when full, entries older
//!   than [`VALID`] are dropped, and if none is, the map is emptied.
//! - What may be stale, for at most [`VALID`]: a file renamed or removed
//!   is still served from the descriptor held; a file changed in place is
//!   served with the length and `Last-Modified` seen at the open (a file
//!   that has since shrunk ends its send short, and the connection closes,
//!   as for any file that shrinks mid-send). Errors are not kept: a
//!   missing file is looked up again on every request.

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

use hotloop::fs::{File, Metadata};

/// How long an open file is used without looking at its path again.
pub const VALID: Duration = Duration::from_secs(1);
/// The most open files one worker keeps.
pub const ENTRIES_MAX: usize = 1024;

/// An open file with what the response needs.
pub struct Entry {
    pub file: File,
    pub meta: Metadata,
    /// The name the content type comes from (`index.html` for a directory).
    pub name: String,
    opened: Instant,
}

impl Entry {
    pub fn new(file: File, meta: Metadata, name: String) -> Entry {
        Entry { file, meta, name, opened: hotloop::time::now() }
    }
}

thread_local! {
    static OPEN: RefCell<HashMap<PathBuf, Rc<Entry>>> = RefCell::new(HashMap::new());
}

/// The entry for `rel` if it was opened within [`VALID`].
pub fn get(rel: &Path) -> Option<Rc<Entry>> {
    let now = hotloop::time::now();
    OPEN.with(|open| {
        let open = open.borrow();
        let entry = open.get(rel)?;
        (now.duration_since(entry.opened) < VALID).then(|| entry.clone())
    })
}

/// Keeps `entry` for `rel`.
pub fn put(rel: &Path, entry: Rc<Entry>) {
    let now = hotloop::time::now();
    OPEN.with(|open| {
        let mut open = open.borrow_mut();
        if open.len() >= ENTRIES_MAX && !open.contains_key(rel) {
            open.retain(|_, e| now.duration_since(e.opened) < VALID);
            if open.len() >= ENTRIES_MAX {
                open.clear();
            }
        }
        open.insert(rel.to_path_buf(), entry);
    });
}
