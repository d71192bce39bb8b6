//! hotloop: a thread-per-core async runtime for low-latency Linux network servers.
//!
//! Each worker owns one core's worth of everything: a task queue, an I/O
//! driver (epoll or io_uring, chosen at start-up) and a timer wheel. Tasks
//! never move between workers, so they need not be `Send`, and nothing on
//! the hot path takes a lock.
//!
//! ```no_run
//! use hotloop::net::{serve, ListenerOptions};
//! use hotloop::Runtime;
//!
//! let rt = Runtime::builder().workers(2).build()?;
//! let server = serve(rt.handle(), "127.0.0.1:8080", ListenerOptions::default(), |stream| async move {
//!     let mut buf = Vec::with_capacity(4096);
//!     loop {
//!         let (n, b) = stream.read_owned(buf).await;
//!         buf = b;
//!         match n {
//!             Ok(0) | Err(_) => return,
//!             Ok(_) => {}
//!         }
//!         let (res, b) = stream.write_all_owned(buf).await;
//!         buf = b;
//!         if res.is_err() {
//!             return;
//!         }
//!     }
//! })?;
//! rt.block_on(server.stopped())?;
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! With the default feature `macros`, `#[hotloop::main]` and
//! `#[hotloop::test]` build the runtime for an `async fn`;
//! `#[hotloop::test(driver = "all")]` runs a test once per driver.
//! Blocking work goes to [`spawn_blocking`]; host names resolve there
//! ([`net::lookup_host`]). [`signal::ctrl_c`] and [`signal::signal`] wait
//! for process signals in a task, as `tokio::signal` does. [`task::JoinSet`]
//! joins groups of tasks; [`task::run_local`] runs hotloop I/O for code
//! that must be `Send` (an axum handler); [`task_local!`] declares
//! task-local values; [`process::Command`] runs child processes;
//! [`time::pause`] (or `#[hotloop::test(start_paused = true)]`) runs
//! timers on a paused clock. A server drains (`Server::drain`, or `stop`
//! then `stopped`), and [`net::Handover`] hands its listening sockets to
//! a new process (an upgrade without a refused connection) or takes
//! systemd's. The owned-buffer stream methods
//! (`read_owned`, `write_all_owned`, ...) sit beside tokio's
//! `AsyncReadExt`/`AsyncWriteExt`, which work by plain method calls.
//! Features `hyper`, `tls` and `tower` add hyper serving, TLS with ALPN,
//! and a tower `TimeoutLayer` on hotloop's timers; `tokio-time` (a default)
//! hosts tokio's timer for code that calls `tokio::time` inside a task.
#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod buf;
mod coop;
mod driver;
pub mod fs;
#[cfg(feature = "hyper")]
pub mod hyper;
mod log;
mod loom;
pub mod net;
pub mod process;
#[cfg(feature = "quic")]
pub mod quic;
pub mod runtime;
pub mod signal;
mod slab;
pub mod stats;
mod sys;
pub mod task;
mod task_local;
pub mod time;
#[cfg(feature = "tls")]
pub mod tls;
#[cfg(feature = "tower")]
pub mod tower;

pub use runtime::{
    spawn, spawn_blocking, yield_now, AbortHandle, Builder, BusyPoll, DriverKind, Handle,
    JoinError, JoinHandle, JoinSet, KernelBusyPoll, Registration, RemoteJoinHandle, Runtime,
};
pub use sys::{open_fd_count, raise_nofile_limit, release_free_memory};

#[cfg(feature = "macros")]
pub use hotloop_macros::{main, test};

/// Support for the code `#[hotloop::test]` generates; not a public API.
#[doc(hidden)]
pub mod __private {
    use std::any::Any;
    use std::panic::{catch_unwind, AssertUnwindSafe};

    /// True if an io_uring test must be skipped here (it prints why): the
    /// kernel cannot run io_uring, or `HOTLOOP_DRIVER=epoll` forces epoll
    /// on every runtime (the test would run on epoll). Panics instead when
    /// `HOTLOOP_REQUIRE_URING=1` demands io_uring.
    pub fn skip_uring_test() -> bool {
        let forced = std::env::var("HOTLOOP_DRIVER")
            .ok()
            .filter(|v| v.parse::<crate::DriverKind>() == Ok(crate::DriverKind::Epoll));
        let reason = match (forced, crate::runtime::uring_available()) {
            (Some(v), _) => format!("HOTLOOP_DRIVER={v} forces the epoll driver"),
            (None, Err(reason)) => reason,
            (None, Ok(())) => return false,
        };
        if std::env::var_os("HOTLOOP_REQUIRE_URING").is_some_and(|v| v == "1") {
            panic!("HOTLOOP_REQUIRE_URING=1, but io_uring cannot run here: {reason}");
        }
        eprintln!("skipped on io_uring: {reason}");
        true
    }

    /// Runs a `#[should_panic]` test's body on io_uring and checks its
    /// panic as the test harness would: it must panic, and with a message
    /// containing `expected` when one is given. Panics (failing the test)
    /// otherwise.
    pub fn expect_panic(expected: Option<&str>, body: impl FnOnce()) {
        let Err(payload) = catch_unwind(AssertUnwindSafe(body)) else {
            panic!("the test did not panic as `#[should_panic]` expects");
        };
        let Some(expected) = expected else { return };
        match message(&*payload) {
            Some(msg) if msg.contains(expected) => {}
            Some(msg) => panic!(
                "the panic did not contain the expected string\n      panic message: \
                 {msg:?}\n expected substring: {expected:?}"
            ),
            None => panic!("the panic had no string message; expected one containing {expected:?}"),
        }
    }

    /// The message of a panic's payload, if it is a string.
    fn message(payload: &(dyn Any + Send)) -> Option<&str> {
        payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
    }
}
