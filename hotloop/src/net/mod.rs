//! Networking: TCP listeners with an accept policy, streams with
//! owned-buffer I/O, a thread-per-core server helper, and UDP sockets.

mod compat;
mod listener;
mod options;
pub(crate) mod pool;
mod resolve;
mod server;
mod stream;
pub mod udp;

pub use listener::TcpListener;
pub use options::{AcceptPacing, ListenerOptions, ServerOptions};
pub use pool::{PooledBuf, ReadPooled, POOLED_BUFFER_BYTES};
#[doc(hidden)]
pub use resolve::__set_resolver;
pub use resolve::{lookup_host, Target, ToSocketAddrs};
pub use server::{serve, serve_with_stop, Server, StopSignal, Stopping};
pub use stream::TcpStream;
pub use udp::{UdpOptions, UdpSocket};
