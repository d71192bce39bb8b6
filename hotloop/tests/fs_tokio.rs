//! `hotloop::fs::File` through tokio's `AsyncRead`, `AsyncWrite` and
//! `AsyncSeek`, mixed with its own owned-buffer calls, against
//! `tokio::fs::File`: the same steps run on both (tokio's on a runtime of
//! its own, on another thread) and must give the same results and leave the
//! same bytes. `std::fs::File` runs them too, where a write that returned
//! is in the file, and says what the file must hold once a dropped file's
//! last write has landed.
//!
//! The owned calls have no tokio counterpart; tokio's side does what they
//! mean with its cursor (`read_at`: remember the position, seek, read,
//! seek back), so both must see the same file.

use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncSeek, AsyncSeekExt, AsyncWrite, AsyncWriteExt};

/// How long a dropped file's last write may take to land.
const DROPPED_WRITE_LIMIT: Duration = Duration::from_secs(10);
/// The pause between two looks at a dropped file.
const LOOK_EVERY: Duration = Duration::from_millis(2);

/// A fresh directory under the temporary directory, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("hotloop-fst-{}-{n}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// How a sequence opens its file.
#[derive(Clone, Copy, Debug)]
enum Open {
    Read,
    ReadWrite,
    /// Read and write, created or truncated.
    Create,
    /// Read and append.
    Append,
}

/// One call on the file.
#[derive(Clone, Copy, Debug)]
enum Step {
    /// `write_all`.
    Write(&'static [u8]),
    /// `write_all` of this many bytes of a pattern (several chunks).
    WriteLong(usize),
    Flush,
    Shutdown,
    ReadExact(usize),
    /// `AsyncReadExt::read_to_end`.
    ReadToEnd,
    /// hotloop: the owned `read_to_end`; tokio: the trait's.
    ReadToEndOwned,
    Seek(SeekFrom),
    /// `stream_position`.
    Position,
    SetLen(u64),
    SyncAll,
    SyncData,
    /// `metadata().len()` (tokio's does not wait for a write in flight:
    /// only after a flush).
    Len,
    /// hotloop: the owned `read_at`; tokio: the same through its cursor.
    ReadAt(u64, usize),
    /// hotloop: the owned `write_all_at`; tokio: the same through its cursor.
    WriteAt(u64, &'static [u8]),
    /// Drops the file, then waits for what it reported written to land.
    /// The last step.
    DropFile,
    /// `into_std`, then a write at the standard file's position. The last step.
    IntoStd(&'static [u8]),
}

struct Sequence {
    name: &'static str,
    initial: Option<&'static [u8]>,
    open: Open,
    steps: &'static [Step],
    /// `std::fs::File` gives the same results (not where a write fails:
    /// std says so at the write, the others at the next flush).
    std_agrees: bool,
}

use Step::*;

static SEQUENCES: &[Sequence] = &[
    Sequence {
        name: "two writes, then a drop",
        initial: None,
        open: Open::Create,
        steps: &[Write(b"hello "), Write(b"world"), DropFile],
        std_agrees: true,
    },
    Sequence {
        name: "a long write in several chunks, then a drop",
        initial: None,
        open: Open::Create,
        steps: &[WriteLong(300_000), Write(b"end"), DropFile],
        std_agrees: true,
    },
    Sequence {
        name: "a read ahead, then the owned read_to_end",
        initial: Some(b"0123456789"),
        open: Open::Read,
        steps: &[ReadExact(2), ReadToEndOwned, Position, ReadToEndOwned],
        std_agrees: true,
    },
    Sequence {
        name: "a read ahead, then the trait's read_to_end",
        initial: Some(b"0123456789"),
        open: Open::Read,
        steps: &[ReadExact(2), ReadToEnd, Position],
        std_agrees: true,
    },
    Sequence {
        name: "seeks after a read ahead",
        initial: Some(b"0123456789"),
        open: Open::Read,
        steps: &[
            ReadExact(2),
            Seek(SeekFrom::Current(3)),
            ReadExact(2),
            Position,
            Seek(SeekFrom::End(-1)),
            ReadToEnd,
            Seek(SeekFrom::Start(0)),
            ReadExact(1),
            Seek(SeekFrom::Current(-100)),
            Position,
            ReadExact(20),
        ],
        std_agrees: true,
    },
    Sequence {
        name: "a write after a read ahead",
        initial: Some(b"0123456789"),
        open: Open::ReadWrite,
        steps: &[ReadExact(2), Write(b"XY"), ReadExact(2), Position, Flush],
        std_agrees: true,
    },
    Sequence {
        name: "reading after writing",
        initial: None,
        open: Open::Create,
        steps: &[
            Write(b"abcdef"),
            ReadToEnd,
            Position,
            Seek(SeekFrom::Start(1)),
            ReadExact(3),
            Write(b"!"),
            Seek(SeekFrom::Start(0)),
            ReadToEndOwned,
            Flush,
        ],
        std_agrees: true,
    },
    Sequence {
        name: "set_len, sync_all and sync_data after writes",
        initial: None,
        open: Open::Create,
        steps: &[
            Write(b"abcdef"),
            SetLen(3),
            Position,
            Write(b"Z"),
            SyncAll,
            Write(b"z"),
            SyncData,
            Flush,
            Len,
            Seek(SeekFrom::Start(0)),
            ReadToEnd,
        ],
        std_agrees: true,
    },
    Sequence {
        name: "set_len after a read ahead",
        initial: Some(b"0123456789"),
        open: Open::ReadWrite,
        steps: &[ReadExact(4), SetLen(6), ReadToEnd, Position, Shutdown],
        std_agrees: true,
    },
    Sequence {
        name: "owned calls between trait writes",
        initial: None,
        open: Open::Create,
        steps: &[
            Write(b"hello"),
            ReadAt(0, 5),
            WriteAt(0, b"J"),
            Position,
            Write(b" world"),
            ReadAt(0, 11),
            ReadExact(1),
            Flush,
        ],
        std_agrees: true,
    },
    Sequence {
        name: "an owned write inside what was read ahead",
        initial: Some(b"0123456789"),
        open: Open::ReadWrite,
        steps: &[ReadExact(2), WriteAt(3, b"*"), ReadExact(3), Flush],
        std_agrees: true,
    },
    Sequence {
        name: "into_std after writes",
        initial: None,
        open: Open::Create,
        steps: &[Write(b"hello"), IntoStd(b"!")],
        std_agrees: true,
    },
    Sequence {
        name: "into_std after a seek",
        initial: Some(b"0123456789"),
        open: Open::ReadWrite,
        steps: &[Seek(SeekFrom::Start(4)), IntoStd(b"--")],
        std_agrees: true,
    },
    Sequence {
        name: "appending",
        initial: Some(b"log:"),
        open: Open::Append,
        steps: &[Write(b"a"), Write(b"b"), Position, Seek(SeekFrom::Start(0)), ReadToEnd, Flush],
        std_agrees: true,
    },
    Sequence {
        name: "a write after a read ahead, then a drop",
        initial: Some(b"0123456789"),
        open: Open::ReadWrite,
        steps: &[ReadExact(3), Write(b"!!"), DropFile],
        std_agrees: true,
    },
    Sequence {
        name: "a failed write is reported once, by the next flush or write",
        initial: Some(b"original"),
        open: Open::Read,
        steps: &[Write(b"x"), Flush, Flush, Write(b"y"), Write(b"z"), Shutdown, Shutdown],
        std_agrees: false,
    },
];

/// The file's calls as the steps use them, for each kind of file.
trait Subject: AsyncRead + AsyncWrite + AsyncSeek + Unpin + Sized {
    async fn open_as(path: &Path, how: Open) -> io::Result<Self>;
    async fn truncate(&self, len: u64) -> io::Result<()>;
    async fn fsync(&self, data_only: bool) -> io::Result<()>;
    async fn length(&self) -> io::Result<u64>;
    async fn owned_read_to_end(&mut self) -> io::Result<Vec<u8>>;
    async fn owned_read_at(&mut self, offset: u64, n: usize) -> io::Result<Vec<u8>>;
    async fn owned_write_at(&mut self, offset: u64, bytes: &[u8]) -> io::Result<()>;
    async fn to_std(self) -> std::fs::File;
    async fn pause();
}

impl Subject for hotloop::fs::File {
    async fn open_as(path: &Path, how: Open) -> io::Result<Self> {
        let mut o = hotloop::fs::OpenOptions::new();
        match how {
            Open::Read => o.read(true),
            Open::ReadWrite => o.read(true).write(true),
            Open::Create => o.read(true).write(true).create(true).truncate(true),
            Open::Append => o.read(true).append(true),
        };
        o.open(path).await
    }

    async fn truncate(&self, len: u64) -> io::Result<()> {
        self.set_len(len).await
    }

    async fn fsync(&self, data_only: bool) -> io::Result<()> {
        if data_only {
            self.sync_data().await
        } else {
            self.sync_all().await
        }
    }

    async fn length(&self) -> io::Result<u64> {
        Ok(self.metadata().await?.len())
    }

    async fn owned_read_to_end(&mut self) -> io::Result<Vec<u8>> {
        let (res, buf) = self.read_to_end(Vec::new()).await;
        res.map(|_| buf)
    }

    async fn owned_read_at(&mut self, offset: u64, n: usize) -> io::Result<Vec<u8>> {
        let (res, buf) = self.read_at(Vec::with_capacity(n), offset).await;
        res.map(|_| buf)
    }

    async fn owned_write_at(&mut self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        self.write_all_at(bytes.to_vec(), offset).await.0
    }

    async fn to_std(self) -> std::fs::File {
        self.into_std().await
    }

    async fn pause() {
        hotloop::time::sleep(LOOK_EVERY).await;
    }
}

impl Subject for tokio::fs::File {
    async fn open_as(path: &Path, how: Open) -> io::Result<Self> {
        let mut o = tokio::fs::OpenOptions::new();
        match how {
            Open::Read => o.read(true),
            Open::ReadWrite => o.read(true).write(true),
            Open::Create => o.read(true).write(true).create(true).truncate(true),
            Open::Append => o.read(true).append(true),
        };
        o.open(path).await
    }

    async fn truncate(&self, len: u64) -> io::Result<()> {
        self.set_len(len).await
    }

    async fn fsync(&self, data_only: bool) -> io::Result<()> {
        if data_only {
            self.sync_data().await
        } else {
            self.sync_all().await
        }
    }

    async fn length(&self) -> io::Result<u64> {
        Ok(self.metadata().await?.len())
    }

    async fn owned_read_to_end(&mut self) -> io::Result<Vec<u8>> {
        let mut buf = Vec::new();
        AsyncReadExt::read_to_end(self, &mut buf).await?;
        Ok(buf)
    }

    async fn owned_read_at(&mut self, offset: u64, n: usize) -> io::Result<Vec<u8>> {
        let back = self.stream_position().await?;
        self.seek(SeekFrom::Start(offset)).await?;
        let mut buf = vec![0; n];
        let mut got = 0;
        while got < n {
            match self.read(&mut buf[got..]).await? {
                0 => break,
                k => got += k,
            }
        }
        buf.truncate(got);
        self.seek(SeekFrom::Start(back)).await?;
        Ok(buf)
    }

    async fn owned_write_at(&mut self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        let back = self.stream_position().await?;
        self.seek(SeekFrom::Start(offset)).await?;
        self.write_all(bytes).await?;
        self.flush().await?;
        self.seek(SeekFrom::Start(back)).await?;
        Ok(())
    }

    async fn to_std(self) -> std::fs::File {
        self.into_std().await
    }

    async fn pause() {
        tokio::time::sleep(LOOK_EVERY).await;
    }
}

fn show<T: std::fmt::Debug>(res: io::Result<T>) -> String {
    match res {
        Ok(v) => format!("Ok({v:?})"),
        Err(e) => format!("Err({:?})", e.kind()),
    }
}

fn show_bytes(res: io::Result<Vec<u8>>) -> String {
    show(res.map(|b| String::from_utf8_lossy(&b).into_owned()))
}

/// Bytes of the long write's pattern.
fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

/// Runs `seq` on the file at `path` opened as `S`; `expected` is what the
/// file holds at the end (std's result), for a drop to wait for.
async fn run<S: Subject>(path: &Path, seq: &Sequence, expected: &[u8]) -> Vec<String> {
    let mut log = Vec::new();
    let mut file = Some(S::open_as(path, seq.open).await.unwrap());
    for (i, step) in seq.steps.iter().enumerate() {
        let last = i + 1 == seq.steps.len();
        let f = file.as_mut().expect("no step after the file is gone");
        let out = match *step {
            Write(b) => show(f.write_all(b).await),
            WriteLong(n) => show(f.write_all(&pattern(n)).await),
            Flush => show(f.flush().await),
            Shutdown => show(f.shutdown().await),
            ReadExact(n) => {
                let mut buf = vec![0; n];
                show_bytes(f.read_exact(&mut buf).await.map(|_| buf))
            }
            ReadToEnd => {
                let mut buf = Vec::new();
                show_bytes(AsyncReadExt::read_to_end(f, &mut buf).await.map(|_| buf))
            }
            ReadToEndOwned => show_bytes(f.owned_read_to_end().await),
            Seek(to) => show(f.seek(to).await),
            Position => show(f.stream_position().await),
            SetLen(n) => show(f.truncate(n).await),
            SyncAll => show(f.fsync(false).await),
            SyncData => show(f.fsync(true).await),
            Len => show(f.length().await),
            ReadAt(at, n) => show_bytes(f.owned_read_at(at, n).await),
            WriteAt(at, b) => show(f.owned_write_at(at, b).await),
            DropFile => {
                assert!(last, "{}: a drop ends a sequence", seq.name);
                drop(file.take());
                let mut looks = DROPPED_WRITE_LIMIT.as_millis() / LOOK_EVERY.as_millis();
                loop {
                    let now = std::fs::read(path).unwrap();
                    if now == expected {
                        break "every write reported is in the file".to_string();
                    }
                    if looks == 0 {
                        break format!("the file holds {:?}", String::from_utf8_lossy(&now));
                    }
                    looks -= 1;
                    S::pause().await;
                }
            }
            IntoStd(b) => {
                assert!(last, "{}: into_std ends a sequence", seq.name);
                let mut std = file.take().unwrap().to_std().await;
                let at = std.stream_position();
                format!("{} then {}", show(at), show(std.write_all(b)))
            }
        };
        log.push(format!("{step:?}: {out}"));
    }
    if let Some(mut f) = file {
        // So that every byte written is there to compare.
        f.flush().await.ok();
    }
    log
}

/// Runs `seq` on `std::fs::File`; returns its log and the file's bytes.
fn run_std(path: &Path, seq: &Sequence) -> (Vec<String>, Vec<u8>) {
    let mut o = std::fs::OpenOptions::new();
    match seq.open {
        Open::Read => o.read(true),
        Open::ReadWrite => o.read(true).write(true),
        Open::Create => o.read(true).write(true).create(true).truncate(true),
        Open::Append => o.read(true).append(true),
    };
    let mut f = o.open(path).unwrap();
    let mut log = Vec::new();
    for step in seq.steps {
        let out = match *step {
            Write(b) => show(f.write_all(b)),
            WriteLong(n) => show(f.write_all(&pattern(n))),
            Flush | Shutdown => show(f.flush()),
            ReadExact(n) => {
                let mut buf = vec![0; n];
                show_bytes(f.read_exact(&mut buf).map(|_| buf))
            }
            ReadToEnd | ReadToEndOwned => {
                let mut buf = Vec::new();
                show_bytes(f.read_to_end(&mut buf).map(|_| buf))
            }
            Seek(to) => show(f.seek(to)),
            Position => show(f.stream_position()),
            SetLen(n) => show(f.set_len(n)),
            SyncAll => show(f.sync_all()),
            SyncData => show(f.sync_data()),
            Len => show(f.metadata().map(|m| m.len())),
            ReadAt(at, n) => {
                let mut buf = vec![0; n];
                show_bytes(f.read_at(&mut buf, at).map(|k| {
                    buf.truncate(k);
                    buf
                }))
            }
            WriteAt(at, b) => show(f.write_all_at(b, at)),
            DropFile => "every write reported is in the file".to_string(),
            IntoStd(b) => {
                let at = f.stream_position();
                format!("{} then {}", show(at), show(f.write_all(b)))
            }
        };
        log.push(format!("{step:?}: {out}"));
    }
    drop(f);
    (log, std::fs::read(path).unwrap())
}

/// Runs `seq` on tokio's file, on a tokio runtime of its own on another thread.
fn run_tokio(path: PathBuf, seq: &'static Sequence, expected: Vec<u8>) -> Vec<String> {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        rt.block_on(run::<tokio::fs::File>(&path, seq, &expected))
    })
    .join()
    .unwrap()
}

/// Every sequence, on hotloop's file (on each driver), tokio's and std's.
#[hotloop::test(driver = "all")]
async fn file_through_tokios_traits_agrees_with_tokios_file() {
    let dir = TempDir::new("matrix");
    let mut differences = Vec::new();
    for (i, seq) in SEQUENCES.iter().enumerate() {
        let [std_path, tokio_path, hot_path] =
            ["std", "tokio", "hotloop"].map(|who| dir.0.join(format!("{i}-{who}")));
        if let Some(initial) = seq.initial {
            for p in [&std_path, &tokio_path, &hot_path] {
                std::fs::write(p, initial).unwrap();
            }
        }
        let (std_log, expected) = run_std(&std_path, seq);
        let tokio_log = run_tokio(tokio_path.clone(), seq, expected.clone());
        let hot_log = run::<hotloop::fs::File>(&hot_path, seq, &expected).await;
        let tokio_bytes = std::fs::read(&tokio_path).unwrap();
        let hot_bytes = std::fs::read(&hot_path).unwrap();
        let lossy = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        if hot_log != tokio_log || hot_bytes != tokio_bytes {
            differences.push(format!(
                "{}:\n  hotloop {hot_log:#?} -> {:?}\n  tokio   {tokio_log:#?} -> {:?}",
                seq.name,
                lossy(&hot_bytes),
                lossy(&tokio_bytes)
            ));
        }
        if seq.std_agrees && (hot_log != std_log || hot_bytes != expected) {
            differences.push(format!(
                "{} (against std):\n  hotloop {hot_log:#?} -> {:?}\n  std     {std_log:#?} -> {:?}",
                seq.name,
                lossy(&hot_bytes),
                lossy(&expected)
            ));
        }
    }
    assert!(differences.is_empty(), "{}", differences.join("\n"));
}
