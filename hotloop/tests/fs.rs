//! `hotloop::fs` on both drivers: every function, the errors of bad paths
//! (with the path in the message and the kind kept), a read-only file
//! written to, reads and opens dropped while in flight (nothing leaks, the
//! file stays usable), tokio's `AsyncRead`/`AsyncWrite`/`AsyncSeek`, tasks
//! sharing a file while an operation through them is in flight, and
//! `Dir`, which refuses paths that leave it.

use std::future::Future;
use std::io::{self, SeekFrom};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Poll;
use std::time::{Duration, SystemTime};

use hotloop::fs::{self, File, OpenOptions};
use hotloop::time::{sleep, timeout};
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

const LIMIT: Duration = Duration::from_secs(20);

/// A fresh directory under the temporary directory, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("hotloop-fs-{}-{n}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir(&p).unwrap();
        TempDir(p)
    }

    fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// How many of this process's descriptors are open on `path`.
fn fds_open_on(path: &Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target == path)
        .count()
}

/// Polls `fut` once; true if it finished.
async fn poll_once<F: Future + Unpin>(fut: &mut F) -> bool {
    std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut *fut).poll(cx).is_ready())).await
}

/// Asserts that `e` has `kind` and a message that starts with `op path: `.
fn assert_names_path(e: &io::Error, kind: io::ErrorKind, op: &str, path: &Path) {
    assert_eq!(e.kind(), kind, "{e}");
    let prefix = format!("{op} {}: ", path.display());
    assert!(e.to_string().starts_with(&prefix), "{e:?} does not start with {prefix:?}");
}

#[hotloop::test(driver = "all")]
async fn write_read_and_metadata() {
    let dir = TempDir::new("whole");
    let path = dir.join("a.txt");
    let before = SystemTime::now() - Duration::from_secs(2);
    fs::write(&path, b"hello, file").await.unwrap();
    assert_eq!(fs::read(&path).await.unwrap(), b"hello, file");
    assert_eq!(fs::read_to_string(&path).await.unwrap(), "hello, file");
    let m = fs::metadata(&path).await.unwrap();
    assert_eq!(m.len(), 11);
    assert!(m.is_file() && !m.is_dir() && !m.is_symlink());
    assert!(m.modified().unwrap() >= before, "mtime is now-ish");
    assert!(!m.permissions().readonly());
    // Overwriting truncates.
    fs::write(&path, b"short").await.unwrap();
    assert_eq!(fs::read(&path).await.unwrap(), b"short");
    // Larger than one read: the loop goes on to the end.
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    fs::write(&path, &big).await.unwrap();
    assert_eq!(fs::read(&path).await.unwrap(), big);
    assert_eq!(fs::metadata(&path).await.unwrap().len(), big.len() as u64);
    // An empty file.
    fs::write(&path, b"").await.unwrap();
    assert!(fs::read(&path).await.unwrap().is_empty());
}

#[hotloop::test(driver = "all")]
async fn positioned_reads_and_writes() {
    let dir = TempDir::new("at");
    let path = dir.join("f");
    let file = File::create(&path).await.unwrap();
    let (res, _) = file.write_at(b"0123456789".to_vec(), 0).await;
    assert_eq!(res.unwrap(), 10);
    file.write_all_at(b"abc".to_vec(), 4).await.0.unwrap();
    // Past the end: the gap reads as zeros.
    file.write_all_at(&b"Z"[..], 12).await.0.unwrap();
    file.sync_all().await.unwrap();
    file.sync_data().await.unwrap();
    assert_eq!(file.metadata().await.unwrap().len(), 13);
    drop(file);

    let file = File::open(&path).await.unwrap();
    let (res, buf) = file.read_at(Vec::with_capacity(64), 0).await;
    assert_eq!(res.unwrap(), 13);
    assert_eq!(buf, b"0123abc789\0\0Z");
    let (res, buf) = file.read_at(Vec::with_capacity(3), 5).await;
    assert_eq!((res.unwrap(), &buf[..]), (3, &b"bc7"[..]));
    let (res, buf) = file.read_at(Vec::with_capacity(8), 13).await;
    assert_eq!((res.unwrap(), buf.len()), (0, 0), "at the end a read gives 0");
    let (res, _) = file.read_at(Vec::with_capacity(8), 1 << 40).await;
    assert_eq!(res.unwrap(), 0, "far past the end too");

    let rw = OpenOptions::new().read(true).write(true).open(&path).await.unwrap();
    rw.set_len(4).await.unwrap();
    assert_eq!(rw.metadata().await.unwrap().len(), 4);
    rw.set_len(6).await.unwrap();
    assert_eq!(fs::read(&path).await.unwrap(), b"0123\0\0");
}

#[hotloop::test(driver = "all")]
async fn read_to_end_follows_the_cursor() {
    let dir = TempDir::new("cursor");
    let path = dir.join("f");
    fs::write(&path, b"first part|second part").await.unwrap();
    let mut file = File::open(&path).await.unwrap();
    let (res, buf) = file.read_to_end(b"kept:".to_vec()).await;
    assert_eq!(res.unwrap(), 22);
    assert_eq!(buf, b"kept:first part|second part");
    let (res, buf) = file.read_to_end(Vec::new()).await;
    assert_eq!((res.unwrap(), buf.len()), (0, 0), "the cursor is at the end");
}

#[hotloop::test(driver = "all")]
async fn directories_rename_and_remove() {
    let dir = TempDir::new("dirs");
    let deep = dir.join("a/b/c");
    fs::create_dir_all(&deep).await.unwrap();
    assert!(fs::metadata(&deep).await.unwrap().is_dir());
    fs::create_dir_all(&deep).await.unwrap();
    fs::create_dir_all(dir.join("a/b/d")).await.unwrap();
    fs::create_dir(dir.join("a/e")).await.unwrap();
    let e = fs::create_dir(dir.join("a/e")).await.unwrap_err();
    assert_names_path(&e, io::ErrorKind::AlreadyExists, "mkdir", &dir.join("a/e"));

    let file = deep.join("f");
    fs::write(&file, b"x").await.unwrap();
    let e = fs::create_dir_all(&file).await.unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::AlreadyExists, "a file is in the way: {e}");
    let e = fs::create_dir_all(file.join("under")).await.unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::NotADirectory, "{e}");

    let moved = dir.join("a/moved");
    fs::rename(&file, &moved).await.unwrap();
    assert_eq!(fs::read(&moved).await.unwrap(), b"x");
    assert_eq!(fs::metadata(&file).await.unwrap_err().kind(), io::ErrorKind::NotFound);

    std::os::unix::fs::symlink(&moved, dir.join("link")).unwrap();
    assert!(fs::symlink_metadata(dir.join("link")).await.unwrap().is_symlink());
    assert!(fs::metadata(dir.join("link")).await.unwrap().is_file());

    fs::remove_file(&moved).await.unwrap();
    assert_eq!(fs::metadata(&moved).await.unwrap_err().kind(), io::ErrorKind::NotFound);
    let e = fs::remove_dir(dir.join("a")).await.unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::DirectoryNotEmpty, "{e}");
    fs::remove_dir(dir.join("a/e")).await.unwrap();
    assert_eq!(fs::metadata(dir.join("a/e")).await.unwrap_err().kind(), io::ErrorKind::NotFound);
}

#[hotloop::test(driver = "all")]
async fn bad_paths_name_the_path_and_keep_the_kind() {
    let dir = TempDir::new("errors");
    let missing = dir.join("no/such/file");
    let e = File::open(&missing).await.unwrap_err();
    assert_names_path(&e, io::ErrorKind::NotFound, "open", &missing);
    assert!(e.to_string().contains("No such file or directory"), "{e}");
    let e = fs::read(&missing).await.unwrap_err();
    assert_names_path(&e, io::ErrorKind::NotFound, "open", &missing);
    let e = fs::metadata(&missing).await.unwrap_err();
    assert_names_path(&e, io::ErrorKind::NotFound, "stat", &missing);
    let e = fs::remove_file(&missing).await.unwrap_err();
    assert_names_path(&e, io::ErrorKind::NotFound, "remove", &missing);
    let e = fs::rename(&missing, dir.join("to")).await.unwrap_err();
    assert_names_path(&e, io::ErrorKind::NotFound, "rename", &missing);
    let e = fs::create_dir(&missing).await.unwrap_err();
    assert_names_path(&e, io::ErrorKind::NotFound, "mkdir", &missing);

    // A path under a regular file: refused even for root.
    let file = dir.join("plain");
    fs::write(&file, b"data").await.unwrap();
    let under = file.join("child");
    let e = File::open(&under).await.unwrap_err();
    assert_names_path(&e, io::ErrorKind::NotADirectory, "open", &under);
    let e = fs::write(&under, b"x").await.unwrap_err();
    assert_names_path(&e, io::ErrorKind::NotADirectory, "open", &under);

    // Opening a directory for writing.
    let e = File::create(&dir.0).await.unwrap_err();
    assert_names_path(&e, io::ErrorKind::IsADirectory, "open", &dir.0);

    let e = File::create_new(&file).await.unwrap_err();
    assert_names_path(&e, io::ErrorKind::AlreadyExists, "open", &file);
    let e = OpenOptions::new().open(&file).await.unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "no access mode: {e}");
    let e = File::open("bad\0path").await.unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");

    fs::write(&file, [0xff, 0xfe]).await.unwrap();
    let e = fs::read_to_string(&file).await.unwrap_err();
    assert_names_path(&e, io::ErrorKind::InvalidData, "read", &file);
}

#[hotloop::test(driver = "all")]
async fn writing_a_read_only_file_fails_and_loses_nothing() {
    let dir = TempDir::new("readonly");
    let path = dir.join("f");
    fs::write(&path, b"original").await.unwrap();
    let file = File::open(&path).await.unwrap();
    let (res, buf) = file.write_at(b"overwrite".to_vec(), 0).await;
    let e = res.unwrap_err();
    assert_eq!(e.raw_os_error(), None, "wrapped: {e:?}");
    assert!(e.to_string().starts_with(&format!("write {}: ", path.display())), "{e}");
    assert!(e.to_string().contains("Bad file descriptor"), "{e}");
    assert_eq!(buf, b"overwrite", "the buffer comes back");
    let e = file.set_len(0).await.unwrap_err();
    assert!(e.to_string().starts_with(&format!("truncate {}: ", path.display())), "{e}");
    assert_eq!(fs::read(&path).await.unwrap(), b"original");
}

#[hotloop::test(driver = "all")]
async fn dropped_reads_and_opens_leak_nothing() {
    let dir = TempDir::new("dropped");
    let path = dir.join("big");
    let data: Vec<u8> = (0..4_000_000u32).map(|i| (i % 253) as u8).collect();
    fs::write(&path, &data).await.unwrap();
    let file = File::open(&path).await.unwrap();
    for i in 0..60 {
        // Polled once, then dropped: still queued, handed to
        // the kernel at the next loop turn, or completed there.
        let mut read = Box::pin(file.read_at(Vec::with_capacity(data.len()), 0));
        let mut open = Box::pin(File::open(&path));
        let _ = poll_once(&mut read).await;
        let _ = poll_once(&mut open).await;
        match i % 3 {
            0 => {}
            1 => hotloop::yield_now().await,
            _ => sleep(Duration::from_millis(1)).await,
        }
        drop(read);
        drop(open);
    }
    // The file is still usable and reads what is there.
    let (res, buf) = file.read_at(Vec::with_capacity(data.len()), 0).await;
    assert_eq!(res.unwrap(), data.len());
    assert!(buf == data);
    drop(file);
    // Every open, finished or not, is closed (the driver closes what a
    // dropped open returned once its completion arrives).
    let settled = timeout(LIMIT, async {
        while fds_open_on(&path) > 0 {
            sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(settled.is_ok(), "{} descriptors still open on the file", fds_open_on(&path));
}

#[hotloop::test(driver = "all")]
async fn tokio_read_seek_and_write() {
    let dir = TempDir::new("tokio");
    let path = dir.join("f");
    let mut file =
        OpenOptions::new().read(true).write(true).create(true).open(&path).await.unwrap();
    file.write_all(b"hello ").await.unwrap();
    file.write_all(b"tokio traits").await.unwrap();
    file.flush().await.unwrap();
    assert_eq!(file.stream_position().await.unwrap(), 18);
    assert_eq!(fs::read(&path).await.unwrap(), b"hello tokio traits");

    assert_eq!(file.seek(SeekFrom::Start(6)).await.unwrap(), 6);
    let mut small = [0u8; 3];
    file.read_exact(&mut small).await.unwrap();
    assert_eq!(&small, b"tok");
    // Relative to what the caller has read, not to what was read ahead.
    assert_eq!(file.seek(SeekFrom::Current(3)).await.unwrap(), 12);
    let mut rest = Vec::new();
    // The inherent `read_to_end` (owned buffer) shadows the trait method.
    AsyncReadExt::read_to_end(&mut file, &mut rest).await.unwrap();
    assert_eq!(rest, b"traits");
    assert_eq!(file.seek(SeekFrom::End(-6)).await.unwrap(), 12);
    file.write_all(b"TRAITS!").await.unwrap();
    file.shutdown().await.unwrap();
    assert_eq!(fs::read(&path).await.unwrap(), b"hello tokio TRAITS!");
    let e = file.seek(SeekFrom::Current(-100)).await.unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput);

    // Byte-sized reads through a buffered reader see the whole file.
    let big: Vec<u8> = (0..200_000u32).map(|i| (i % 249) as u8).collect();
    fs::write(&path, &big).await.unwrap();
    let file = File::open(&path).await.unwrap();
    let mut reader = tokio::io::BufReader::with_capacity(7, file);
    let mut all = Vec::new();
    timeout(LIMIT, reader.read_to_end(&mut all)).await.unwrap().unwrap();
    assert!(all == big);
}

#[hotloop::test(driver = "all")]
async fn dir_opens_beneath_and_refuses_ways_out() {
    let outside = TempDir::new("outside");
    fs::write(outside.join("secret"), b"secret").await.unwrap();
    let root = TempDir::new("root");
    fs::create_dir_all(root.join("sub")).await.unwrap();
    fs::write(root.join("sub/file"), b"inside").await.unwrap();
    std::os::unix::fs::symlink("sub/file", root.join("inner-link")).unwrap();
    std::os::unix::fs::symlink(outside.join("secret"), root.join("abs-link")).unwrap();
    std::os::unix::fs::symlink("../../outside-rel", root.join("sub/rel-link")).unwrap();
    let dir = fs::Dir::open(&root.0).await.unwrap();
    let blocking = fs::Dir::open_blocking(&root.0).unwrap();
    let mut read = OpenOptions::new();
    read.read(true);
    for dir in [&dir, &blocking] {
        let mut f = dir.open_file("sub/file", &read).await.unwrap();
        assert_eq!(f.read_to_end(Vec::new()).await.1, b"inside");
        let mut f = dir.open_file("inner-link", &read).await.unwrap();
        assert_eq!(f.read_to_end(Vec::new()).await.1, b"inside", "a link inside is followed");
        let escape = format!("../{}/secret", outside.0.file_name().unwrap().to_str().unwrap());
        for bad in [escape.as_str(), "abs-link", "sub/rel-link", "sub/../../x"] {
            let e = dir.open_file(bad, &read).await.unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{bad}: {e}");
            assert!(e.to_string().contains("resolves outside"), "{e}");
        }
        let e = dir.open_file(outside.join("secret"), &read).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "an absolute path: {e}");
        let e = dir.open_file("sub/missing", &read).await.unwrap_err();
        assert_names_path(&e, io::ErrorKind::NotFound, "open", &root.join("sub/missing"));
    }
    let e = fs::Dir::open(root.join("sub/file")).await.unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::NotADirectory, "{e}");
}

/// The same path written relative to the working directory.
fn relative_to_cwd(path: &Path) -> PathBuf {
    let cwd = std::env::current_dir().unwrap();
    let up = cwd.components().count() - 1;
    let mut rel: PathBuf = std::iter::repeat_n("..", up).collect();
    rel.push(path.strip_prefix("/").unwrap());
    rel
}

/// A symbolic link is judged by where it leads, however it is written: an
/// absolute target inside the directory (by its own name, or through a
/// link to the directory), `../root/...`, a linked directory on the way;
/// and the directory opened by a relative path or through a link to it.
/// One that leads out stays refused, whichever way it is written. (Before,
/// `RESOLVE_BENEATH` refused every absolute link and every step above the
/// directory, inside or not.)
#[hotloop::test(driver = "all")]
async fn dir_follows_links_that_lead_back_inside_however_written() {
    let outside = TempDir::new("outside-2");
    fs::write(outside.join("secret"), b"secret").await.unwrap();
    let base = TempDir::new("base");
    let root = base.join("root");
    fs::create_dir_all(root.join("sub")).await.unwrap();
    fs::write(root.join("sub/file"), b"inside").await.unwrap();
    let linked_root = base.join("root-link");
    std::os::unix::fs::symlink(&root, &linked_root).unwrap();
    let link =
        |target: &Path, name: &str| std::os::unix::fs::symlink(target, root.join(name)).unwrap();
    link(&root.join("sub/file"), "abs-in");
    link(&linked_root.join("sub/file"), "abs-in-via-link");
    link(Path::new("../root/sub/file"), "up-and-in");
    link(&root.join("sub"), "abs-dir");
    link(&root.join("."), "abs-root");
    link(&outside.join("secret"), "abs-out");
    link(
        &linked_root
            .join("../root-link/../../")
            .join(outside.0.file_name().unwrap())
            .join("secret"),
        "abs-out-winding",
    );
    link(Path::new("../root-link/sub/../../root/../../"), "up-and-out");
    let mut read = OpenOptions::new();
    read.read(true);
    let dirs = [
        fs::Dir::open(&root).await.unwrap(),
        fs::Dir::open(&linked_root).await.unwrap(),
        fs::Dir::open_blocking(relative_to_cwd(&root)).unwrap(),
        fs::Dir::open_blocking(relative_to_cwd(&linked_root)).unwrap(),
    ];
    for dir in &dirs {
        let at = dir.path().display();
        for good in [
            "sub/file",
            "abs-in",
            "abs-in-via-link",
            "up-and-in",
            "abs-dir/file",
            "abs-root/sub/file",
        ] {
            let mut f =
                dir.open_file(good, &read).await.unwrap_or_else(|e| panic!("{at}: {good}: {e}"));
            assert_eq!(f.read_to_end(Vec::new()).await.1, b"inside", "{at}: {good}");
        }
        for bad in
            ["abs-out", "abs-out-winding", "up-and-out/x", "abs-dir/../../x", "/etc/hostname"]
        {
            let e = dir.open_file(bad, &read).await.unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{at}: {bad}: {e}");
        }
    }
}

#[hotloop::test(driver = "all")]
async fn offsets_past_the_largest_are_refused() {
    let dir = TempDir::new("offsets");
    let path = dir.join("f");
    fs::write(&path, b"abc").await.unwrap();
    let file = OpenOptions::new().read(true).write(true).open(&path).await.unwrap();
    // u64::MAX would mean "the file's position" to the kernel on io_uring.
    let (res, _) = file.read_at(Vec::with_capacity(8), u64::MAX).await;
    assert_eq!(res.unwrap_err().kind(), io::ErrorKind::InvalidInput);
    let (res, _) = file.write_at(b"x".to_vec(), u64::MAX).await;
    assert_eq!(res.unwrap_err().kind(), io::ErrorKind::InvalidInput);
    assert_eq!(fs::read(&path).await.unwrap(), b"abc");
}

/// Two writes through tokio's `AsyncWrite`, then a drop: both are in the
/// file (the last by its own task, after the drop), as with tokio's file.
#[hotloop::test(driver = "all")]
async fn a_dropped_file_carries_out_the_writes_it_reported() {
    let dir = TempDir::new("dropped-write");
    let path = dir.join("f");
    let mut file = File::create(&path).await.unwrap();
    file.write_all(b"hello ").await.unwrap();
    file.write_all(b"world").await.unwrap();
    drop(file);
    let landed = timeout(LIMIT, async {
        while std::fs::read(&path).unwrap() != b"hello world" {
            sleep(Duration::from_millis(2)).await;
        }
    })
    .await;
    assert!(
        landed.is_ok(),
        "the file holds {:?}",
        String::from_utf8_lossy(&std::fs::read(&path).unwrap())
    );
}

/// A write reported as written is in the file even when the runtime stops
/// right after the file is dropped, before the write's task could run: the
/// rest is written as the task is dropped.
#[hotloop::test(driver = "all")]
fn a_write_reported_before_the_runtime_stops_is_in_the_file(driver: hotloop::DriverKind) {
    let dir = TempDir::new("stopped");
    let path = dir.join("f");
    let rt = hotloop::Runtime::builder().workers(1).driver(driver).build().unwrap();
    let kept = rt.block_on(async {
        let mut file = File::create(&path).await.unwrap();
        file.write_all(b"first ").await.unwrap();
        file.write_all(b"second").await.unwrap();
        drop(file);
        let mut kept = File::create(dir.join("kept")).await.unwrap();
        kept.write_all(b"outlives its runtime").await.unwrap();
        kept
    });
    drop(rt);
    assert_eq!(std::fs::read(&path).unwrap(), b"first second");
    assert_eq!(std::fs::read(dir.join("kept")).unwrap(), b"outlives its runtime");
    drop(kept);
}

/// After a small read through tokio's `AsyncRead` (which reads ahead), the
/// owned `read_to_end` goes on from where the caller stopped.
#[hotloop::test(driver = "all")]
async fn read_to_end_after_a_small_read_goes_on_where_the_caller_stopped() {
    let dir = TempDir::new("read-ahead");
    let path = dir.join("f");
    fs::write(&path, b"0123456789").await.unwrap();
    let mut file = File::open(&path).await.unwrap();
    let mut two = [0u8; 2];
    file.read_exact(&mut two).await.unwrap();
    assert_eq!(&two, b"01");
    let (res, rest) = file.read_to_end(Vec::new()).await;
    assert_eq!(res.unwrap(), 8);
    assert_eq!(rest, b"23456789");
    assert_eq!(file.stream_position().await.unwrap(), 10);
}

/// A write through the traits that fails is reported by `sync_all` (and
/// `sync_data`), so `write_all` then `sync_all` never reports success for
/// bytes that are not in the file. (tokio's `sync_all` reports only the
/// `fsync`: the write's error waits for the next flush.)
#[hotloop::test(driver = "all")]
async fn sync_all_reports_a_failed_write_through_the_traits() {
    let dir = TempDir::new("sync-error");
    let path = dir.join("f");
    fs::write(&path, b"original").await.unwrap();
    let mut file = File::open(&path).await.unwrap();
    file.write_all(b"x").await.expect("reported written, as tokio does");
    let e = file.sync_all().await.unwrap_err();
    assert!(e.to_string().starts_with(&format!("write {}: ", path.display())), "{e}");
    file.sync_all().await.expect("reported once");
    file.write_all(b"y").await.unwrap();
    assert!(file.sync_data().await.is_err());
    file.flush().await.expect("reported once");
    assert_eq!(fs::read(&path).await.unwrap(), b"original");
}

/// Calls taking `&self` from several tasks at once all wait for the write
/// in flight through the traits (each wakes, though the write keeps only
/// one waker), and see it.
#[hotloop::test(driver = "all")]
async fn several_tasks_wait_for_the_write_in_flight() {
    let dir = TempDir::new("waiters");
    let path = dir.join("f");
    let mut file =
        OpenOptions::new().read(true).write(true).create(true).open(&path).await.unwrap();
    let body: Vec<u8> = (0..60_000u32).map(|i| (i % 241) as u8).collect();
    file.write_all(&body).await.unwrap();
    let (file, len) = (std::rc::Rc::new(file), body.len());
    let readers: Vec<_> = (0..4)
        .map(|_| {
            let file = file.clone();
            hotloop::spawn(async move {
                let (res, buf) = file.read_at(Vec::with_capacity(len), 0).await;
                res.map(|_| buf)
            })
        })
        .collect();
    for reader in readers {
        let got = timeout(LIMIT, reader).await.expect("a waiter was never woken").unwrap();
        assert!(got.unwrap() == body);
    }
}

/// A task that stops waiting for the operation in flight through the
/// traits (its future dropped after one poll) takes no other task's
/// wake-up with it: the operation wakes the waker it was polled with last,
/// and before, that was the task that left, so the one still waiting hung.
/// A read ahead on a FIFO keeps the operation in flight until the test
/// writes to it.
#[hotloop::test(driver = "all")]
async fn a_waiter_that_gives_up_leaves_the_others_woken() {
    use std::io::Write as _;
    let dir = TempDir::new("gives-up");
    let fifo = dir.join("fifo");
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let mut file = OpenOptions::new().read(true).write(true).open(&fifo).await.unwrap();
    let mut byte = [0u8; 1];
    assert!(!poll_once(&mut Box::pin(file.read(&mut byte))).await, "the FIFO is empty");
    let file = std::rc::Rc::new(file);
    let waiting = hotloop::spawn({
        let file = file.clone();
        async move { file.metadata().await.map(|m| m.is_file()) }
    });
    hotloop::yield_now().await;
    let gave_up = hotloop::spawn({
        let file = file.clone();
        async move { poll_once(&mut Box::pin(file.metadata())).await }
    });
    hotloop::yield_now().await;
    assert!(!gave_up.await.unwrap(), "the read is still in flight");
    std::fs::OpenOptions::new().write(true).open(&fifo).unwrap().write_all(b"x").unwrap();
    let waited = timeout(LIMIT, waiting).await.expect("the waiting task was never woken");
    assert!(!waited.unwrap().unwrap(), "a FIFO");
    let mut file = std::rc::Rc::try_unwrap(file).unwrap();
    assert_eq!(timeout(LIMIT, file.read(&mut byte)).await.unwrap().unwrap(), 1);
    assert_eq!(&byte, b"x");
}

/// `into_std` hands back the standard file at the caller's position, even
/// after a read ahead (tokio's leaves it where its read ahead stopped).
#[hotloop::test(driver = "all")]
async fn into_std_hands_back_the_file_at_the_callers_position() {
    use std::io::Read;
    let dir = TempDir::new("into-std");
    let path = dir.join("f");
    fs::write(&path, b"0123456789").await.unwrap();
    let mut file = File::open(&path).await.unwrap();
    let mut two = [0u8; 2];
    file.read_exact(&mut two).await.unwrap();
    let mut std = file.into_std().await;
    let mut rest = String::new();
    std.read_to_string(&mut rest).unwrap();
    assert_eq!(rest, "23456789");
}

/// A std file wrapped after std wrote to it goes on from std's position,
/// as tokio's `File::from_std` does (before, its cursor started at 0 and
/// wrote over what std had written).
#[hotloop::test(driver = "all")]
async fn a_file_from_std_goes_on_from_its_position() {
    use std::io::Write;
    let dir = TempDir::new("from-std");
    let path = dir.join("f");
    let mut std_file = std::fs::File::create(&path).unwrap();
    std_file.write_all(b"header").unwrap();
    let mut file = File::from_std(std_file);
    file.write_all(b"body").await.unwrap();
    file.flush().await.unwrap();
    drop(file);
    assert_eq!(std::fs::read(&path).unwrap(), b"headerbody");
}
