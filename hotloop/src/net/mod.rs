//! Networking: TCP and Unix domain listeners with an accept policy,
//! streams with owned-buffer I/O and socket options, a thread-per-core
//! server helper (with socket hand-over between processes and draining),
//! UDP sockets and Unix datagram sockets.

mod balance;
mod compat;
mod handover;
mod listener;
mod options;
pub(crate) mod pool;
mod quiet;
mod resolve;
mod server;
mod slot;
mod socket;
mod sockopt;
mod split;
mod stream;
mod stream_core;
mod udp;
mod unix;
mod unix_datagram;

pub use crate::driver::AcceptMode;
pub use handover::{Handover, Replaced, HANDOVER_WAIT, READY_WAIT, STOP_ACK_WAIT};
pub use listener::{on_descriptor_shortage, TcpListener};
pub use options::{AcceptPacing, Balance, ListenerOptions, ServerOptions};
pub use pool::{ReadPooled, POOLED_BUFFER_BYTES};
pub use quiet::{Quiet, QuietCheck};
pub use resolve::{lookup_host, Target, ToSocketAddrs};
#[cfg(feature = "test-util")]
pub use resolve::{set_resolver, ResolverFn};
pub use server::{
    input_pending, serve, serve_unix, serve_unix_with_stop, serve_with_stop, Drained, Server,
    StopSignal, Stopping, UnixServer, DRAIN_CUT_WAIT, DRAIN_IDLE_QUIET,
};
pub use socket::TcpSocket;
pub use sockopt::TcpKeepalive;
pub use split::{OwnedReadHalf, OwnedWriteHalf, ReadHalf, ReuniteError, WriteHalf};
pub use stream::{InputProbe, IntoStdError, TcpStream};
pub use udp::{
    EcnCodepoint, RecvMeta, SendMeta, Transmit, UdpOptions, UdpSocket, BATCH_DATAGRAMS_MAX,
    GRO_SEGMENTS_MAX,
};
pub use unix::{UnixListener, UnixStream};
pub use unix_datagram::{UCred, UnixDatagram};
