//! What `statx` says about a file, from either driver.

use std::fs::Permissions;
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::time::{Duration, SystemTime};

/// Metadata about a file: what [`std::fs::Metadata`] offers, built from a
/// `statx` ring operation on io_uring (the standard type cannot be built
/// from one) or from `std::fs::metadata` on the blocking pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metadata {
    len: u64,
    mode: u32,
    ino: u64,
    nlink: u64,
    uid: u32,
    gid: u32,
    accessed: (i64, u32),
    modified: (i64, u32),
    /// `None` where the file system keeps no birth time.
    created: Option<(i64, u32)>,
}

impl Metadata {
    /// From a `statx` result.
    pub(crate) fn from_statx(st: &libc::statx) -> Metadata {
        let time = |t: libc::statx_timestamp| (t.tv_sec, t.tv_nsec);
        Metadata {
            len: st.stx_size,
            mode: u32::from(st.stx_mode),
            ino: st.stx_ino,
            nlink: u64::from(st.stx_nlink),
            uid: st.stx_uid,
            gid: st.stx_gid,
            accessed: time(st.stx_atime),
            modified: time(st.stx_mtime),
            created: (st.stx_mask & libc::STATX_BTIME != 0).then(|| time(st.stx_btime)),
        }
    }

    /// From the standard library's metadata.
    pub(crate) fn from_std(m: &std::fs::Metadata) -> Metadata {
        let created = m.created().ok().and_then(|t| {
            let d = t.duration_since(SystemTime::UNIX_EPOCH).ok()?;
            Some((i64::try_from(d.as_secs()).ok()?, d.subsec_nanos()))
        });
        Metadata {
            len: m.size(),
            mode: m.mode(),
            ino: m.ino(),
            nlink: m.nlink(),
            uid: m.uid(),
            gid: m.gid(),
            accessed: (m.atime(), m.atime_nsec() as u32),
            modified: (m.mtime(), m.mtime_nsec() as u32),
            created,
        }
    }

    /// The size in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True for an empty file.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True for a regular file.
    pub fn is_file(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFREG
    }

    /// True for a directory.
    pub fn is_dir(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFDIR
    }

    /// True for a symbolic link (only from [`symlink_metadata`](super::symlink_metadata)).
    pub fn is_symlink(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFLNK
    }

    /// The permission bits, as the standard library gives them.
    pub fn permissions(&self) -> Permissions {
        Permissions::from_mode(self.mode)
    }

    /// The file type and permission bits (`st_mode`).
    pub fn mode(&self) -> u32 {
        self.mode
    }

    /// The inode number.
    pub fn ino(&self) -> u64 {
        self.ino
    }

    /// The number of hard links.
    pub fn nlink(&self) -> u64 {
        self.nlink
    }

    /// The owner's user id.
    pub fn uid(&self) -> u32 {
        self.uid
    }

    /// The owner's group id.
    pub fn gid(&self) -> u32 {
        self.gid
    }

    /// The last modification time.
    pub fn modified(&self) -> io::Result<SystemTime> {
        Ok(to_system_time(self.modified))
    }

    /// The last access time.
    pub fn accessed(&self) -> io::Result<SystemTime> {
        Ok(to_system_time(self.accessed))
    }

    /// The creation (birth) time; `Unsupported` where the file system
    /// keeps none.
    pub fn created(&self) -> io::Result<SystemTime> {
        self.created.map(to_system_time).ok_or_else(|| {
            io::Error::new(io::ErrorKind::Unsupported, "creation time is not available here")
        })
    }
}

fn to_system_time((secs, nanos): (i64, u32)) -> SystemTime {
    let nanos = Duration::from_nanos(u64::from(nanos));
    if secs >= 0 {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs as u64) + nanos
    } else {
        SystemTime::UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs()) + nanos
    }
}
