//! The command's integration tests, built as one binary: one build and
//! one link for all of them instead of one per file. Each starts the
//! `hotloop` binary as a child process; a test file is a module here and
//! `tests/common` holds the helpers they share.
mod common;

mod busy_connection;
mod busy_turn_deadlines;
mod deps;
mod help;
mod http3;
mod http_edges;
mod http_proxy;
mod http_proxy_backend_faults;
mod hyper_deadlines;
mod keepalive_deadlines;
mod layering;
mod limits;
mod never_reading;
mod proxy_exhaustion;
mod proxy_half_close;
mod proxy_idle;
mod proxy_side_fails;
mod quic;
mod quic_abuse;
mod serve;
mod serve_static;
mod stats_endpoint;
mod stop;
mod tls;
mod upgrade;
