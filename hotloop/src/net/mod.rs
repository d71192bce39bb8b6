//! TCP networking: listeners with an accept policy, streams with
//! owned-buffer I/O, and a thread-per-core server helper.

mod compat;
mod listener;
mod options;
pub(crate) mod pool;
mod server;
mod stream;

pub use listener::TcpListener;
pub use options::{AcceptPacing, ListenerOptions, ServerOptions};
pub use pool::{PooledBuf, POOLED_BUFFER_BYTES};
pub use server::{serve, Server};
pub use stream::TcpStream;
