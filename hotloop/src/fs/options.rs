//! `OpenOptions`: how a file is opened, as in `std::fs`.

use std::io;
use std::path::Path;

use super::File;

/// Options for opening a file, with the standard library's rules: at least
/// one of read, write or append; create, create-new and truncate need
/// write (or append, except truncate).
#[derive(Debug, Clone)]
pub struct OpenOptions {
    pub(super) read: bool,
    pub(super) write: bool,
    pub(super) append: bool,
    pub(super) truncate: bool,
    pub(super) create: bool,
    pub(super) create_new: bool,
    pub(super) mode: u32,
    pub(super) custom_flags: i32,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions::new()
    }
}

impl OpenOptions {
    /// All options off; a created file gets mode `0o666` (less the umask).
    pub fn new() -> OpenOptions {
        OpenOptions {
            read: false,
            write: false,
            append: false,
            truncate: false,
            create: false,
            create_new: false,
            mode: 0o666,
            custom_flags: 0,
        }
    }

    /// Open for reading.
    pub fn read(&mut self, read: bool) -> &mut Self {
        self.read = read;
        self
    }

    /// Open for writing.
    pub fn write(&mut self, write: bool) -> &mut Self {
        self.write = write;
        self
    }

    /// Every write goes to the end of the file (`O_APPEND`).
    pub fn append(&mut self, append: bool) -> &mut Self {
        self.append = append;
        self
    }

    /// Truncate the file to 0 bytes (needs write).
    pub fn truncate(&mut self, truncate: bool) -> &mut Self {
        self.truncate = truncate;
        self
    }

    /// Create the file if it does not exist.
    pub fn create(&mut self, create: bool) -> &mut Self {
        self.create = create;
        self
    }

    /// Create the file, failing if it exists (`O_EXCL`).
    pub fn create_new(&mut self, create_new: bool) -> &mut Self {
        self.create_new = create_new;
        self
    }

    /// The permission bits of a created file (before the umask).
    pub fn mode(&mut self, mode: u32) -> &mut Self {
        self.mode = mode;
        self
    }

    /// Extra `open(2)` flags (`O_DIRECT`, `O_NOFOLLOW`, ...); the access
    /// mode bits are ignored.
    pub fn custom_flags(&mut self, flags: i32) -> &mut Self {
        self.custom_flags = flags;
        self
    }

    /// Opens `path` with these options.
    pub async fn open(&self, path: impl AsRef<Path>) -> io::Result<File> {
        File::open_with(path.as_ref(), self).await
    }

    /// The `open(2)` flags, or the standard library's error for a
    /// combination that makes no sense.
    pub(super) fn flags(&self) -> io::Result<i32> {
        let invalid = || io::Error::from_raw_os_error(libc::EINVAL);
        let access = match (self.read, self.write, self.append) {
            (true, false, false) => libc::O_RDONLY,
            (false, true, false) => libc::O_WRONLY,
            (true, true, false) => libc::O_RDWR,
            (false, _, true) => libc::O_WRONLY | libc::O_APPEND,
            (true, _, true) => libc::O_RDWR | libc::O_APPEND,
            (false, false, false) => return Err(invalid()),
        };
        match (self.write, self.append) {
            (true, false) => {}
            (false, false) if self.truncate || self.create || self.create_new => {
                return Err(invalid())
            }
            (_, true) if self.truncate && !self.create_new => return Err(invalid()),
            _ => {}
        }
        let creation = match (self.create, self.truncate, self.create_new) {
            (false, false, false) => 0,
            (true, false, false) => libc::O_CREAT,
            (false, true, false) => libc::O_TRUNC,
            (true, true, false) => libc::O_CREAT | libc::O_TRUNC,
            (_, _, true) => libc::O_CREAT | libc::O_EXCL,
        };
        Ok(access | creation | (self.custom_flags & !libc::O_ACCMODE))
    }

    /// The same options for `std::fs`, for the blocking pool.
    pub(super) fn to_std(&self) -> std::fs::OpenOptions {
        use std::os::unix::fs::OpenOptionsExt;
        let mut o = std::fs::OpenOptions::new();
        o.read(self.read)
            .write(self.write)
            .append(self.append)
            .truncate(self.truncate)
            .create(self.create)
            .create_new(self.create_new)
            .mode(self.mode)
            .custom_flags(self.custom_flags);
        o
    }
}
