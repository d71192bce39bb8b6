//! Networking: TCP listeners with an accept policy, streams with
//! owned-buffer I/O, a thread-per-core server helper, and UDP sockets.

mod compat;
mod listener;
mod options;
pub(crate) mod pool;
mod server;
mod stream;
pub mod udp;

pub use listener::TcpListener;
pub use options::{ListenerOptions, ServerOptions};
pub use pool::{PooledBuf, POOLED_BUFFER_BYTES};
pub use server::{serve, Server};
pub use stream::TcpStream;
pub use udp::{UdpOptions, UdpSocket};
