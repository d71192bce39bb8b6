//! The runtime's integration tests, built as one binary: one build and
//! one link for all of them instead of one per file. A test file is a
//! module here; `tests/common` holds the helpers they share. Files that
//! change what the whole process shares (the open-file limit, signal
//! dispositions, child reaping, the resolver) or count the process's open
//! descriptors stay binaries of their own (`Cargo.toml`), so no test here
//! sees another's change. `tests/docs.rs` checks every file is one or the
//! other.
mod common;

mod abort_and_run_local;
mod accept;
#[cfg(all(feature = "hyper", feature = "tower"))]
mod axum;
mod balance;
mod blocking;
mod busy_poll;
#[cfg(feature = "tls")]
mod cert_reload;
#[cfg(all(feature = "tokio-io", feature = "futures-io"))]
mod compat;
mod coop;
mod cross_runtime;
mod defaults;
mod docs;
#[cfg(feature = "hyper")]
mod drain;
mod driver_choice;
mod echo;
mod faults;
mod first_poll;
#[cfg(feature = "tokio-io")]
mod fs_tokio;
mod fs_tree;
#[cfg(feature = "hyper")]
mod handover;
#[cfg(feature = "hyper")]
mod hyper;
#[cfg(feature = "hyper")]
mod hyper_abuse;
#[cfg(feature = "hyper")]
mod hyper_release;
mod into_std;
mod join_handle_send;
mod join_set;
mod layering;
#[cfg(feature = "macros")]
mod macros;
mod ownership;
mod panics;
mod paused_time;
mod pooled;
#[cfg(feature = "quic")]
mod quic;
#[cfg(all(feature = "tokio-io", feature = "futures-io"))]
mod read_styles;
mod registration;
mod runtime;
mod send_file;
mod sockopt;
#[cfg(feature = "tokio-io")]
mod stream_api;
mod task_local;
mod time;
#[cfg(all(feature = "tls", feature = "hyper"))]
mod tls;
#[cfg(feature = "tokio-io")]
mod tokio_ext_traits;
#[cfg(all(feature = "tokio-time", feature = "tower"))]
mod tokio_time;
mod udp;
#[cfg(feature = "tokio-io")]
mod unix;
mod unix_datagram;
#[cfg(feature = "bench")]
mod wheel_model;
mod write_behind;
