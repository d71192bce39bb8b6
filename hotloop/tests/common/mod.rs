//! Shared helpers for the integration tests: the driver matrix, small
//! clients, and temporary files that go away with the test.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// Why the io_uring variant of a test cannot run here, if it cannot.
pub fn uring_unavailable() -> Option<String> {
    hotloop::runtime::uring_available().err()
}

/// The environment variable that turns a skipped io_uring test into a
/// failure, so a green run where the kernel allows io_uring proves both
/// drivers ran (`.ci/run` sets it when the kernel allows io_uring).
pub const REQUIRE_URING: &str = "HOTLOOP_REQUIRE_URING";

/// True (after saying why) if the io_uring variant must skip here.
///
/// # Panics
/// If it would skip while [`REQUIRE_URING`] is set to `1`.
pub fn skip_uring() -> bool {
    let Some(reason) = uring_unavailable() else { return false };
    if std::env::var(REQUIRE_URING).is_ok_and(|v| v == "1") {
        panic!("io_uring is required ({REQUIRE_URING}=1) but cannot run here: {reason}");
    }
    eprintln!("skipped on io_uring: {reason}");
    true
}

/// A blocking client: connect, send `req`, read until EOF or `expect` bytes.
pub fn roundtrip(addr: SocketAddr, req: &[u8], expect: usize) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(req).unwrap();
    let mut out = vec![0u8; expect];
    s.read_exact(&mut out).expect("read reply");
    out
}

/// An echo handler: writes back what it reads until EOF.
pub async fn echo(stream: hotloop::net::TcpStream) {
    let mut buf = Vec::with_capacity(4096);
    loop {
        let (res, b) = stream.read_owned(buf).await;
        buf = b;
        match res {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let (res, b) = stream.write_all_owned(buf).await;
        buf = b;
        if res.is_err() {
            return;
        }
    }
}

/// Runs the test named `child` of this test binary in a child process (for
/// a failure that would abort the process), with `driver` in the
/// environment variable `env`; returns its stdout.
///
/// # Panics
/// If the child fails; the message carries its stderr.
pub fn run_child(child: &str, env: &str, driver: hotloop::DriverKind) -> String {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([child, "--exact", "--nocapture", "--test-threads=1"])
        .env(env, format!("{driver:?}"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the child ended with {:?}:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// In a child started by [`run_child`]: the driver it was given, or
/// `None` when this is not that child (the test then does nothing).
pub fn child_driver(env: &str) -> Option<hotloop::DriverKind> {
    let driver = std::env::var(env).ok()?;
    Some(driver.to_lowercase().parse().unwrap())
}

/// A fresh directory under the system's temporary directory, removed with
/// everything in it when dropped: held by a test for as long as it uses
/// what is inside, it goes whether the test passes or panics.
pub struct TempDir(PathBuf);

impl TempDir {
    /// Creates `hotloop-NAME-PID-N`.
    pub fn new(name: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "hotloop-{name}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        // Anything there was left by an earlier process with this pid.
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        TempDir(dir)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// `NAME` inside the directory.
    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A self-signed certificate and its key, written to a directory of their
/// own that is removed when this is dropped.
pub struct Certificate {
    /// The certificate's PEM file.
    pub path: PathBuf,
    /// The private key's PEM file.
    pub key: PathBuf,
    _dir: TempDir,
}

/// A self-signed certificate for `names` (DNS names or IP addresses).
pub fn certificate(names: &[&str]) -> Certificate {
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let made = rcgen::generate_simple_self_signed(names).unwrap();
    let dir = TempDir::new("cert");
    let (path, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&path, made.cert.pem()).unwrap();
    std::fs::write(&key, made.key_pair.serialize_pem()).unwrap();
    Certificate { path, key, _dir: dir }
}
