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
//!         let (n, b) = stream.read(buf).await;
//!         buf = b;
//!         match n {
//!             Ok(0) | Err(_) => return,
//!             Ok(_) => {}
//!         }
//!         let (res, b) = stream.write_all(buf).await;
//!         buf = b;
//!         if res.is_err() {
//!             return;
//!         }
//!     }
//! })?;
//! rt.block_on(server.stopped())?;
//! # Ok::<(), std::io::Error>(())
//! ```
#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod buf;
mod driver;
mod loom;
#[cfg(feature = "hyper")]
pub mod hyper;
mod log;
pub mod net;
#[cfg(feature = "quic")]
pub mod quic;
pub mod runtime;
pub mod signal;
mod slab;
pub mod stats;
mod sys;
pub mod time;

pub use driver::AcceptMode;
pub use runtime::{
    spawn, yield_now, Builder, BusyPoll, DriverKind, Handle, JoinError, JoinHandle, KernelBusyPoll,
    Registration, RemoteJoinHandle, Runtime,
};
pub use sys::{open_fd_count, raise_nofile_limit};
