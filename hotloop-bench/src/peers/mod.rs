//! Peer servers: the same echo and HTTP behaviour as `hotloop serve`, written
//! on other runtimes so the bench compares runtimes rather than servers.
//!
//! Every peer follows the same rules:
//! - one worker thread per `--workers`, each with its own `SO_REUSEPORT`
//!   listener on the same address, so the kernel spreads connections;
//! - `TCP_NODELAY` on every accepted socket;
//! - HTTP through [`crate::proto`], with the `200` response built once;
//! - [`crate::proto::spin_work`] once per request for `--work-us`;
//! - a reset, a half-written request or garbage closes that connection only;
//! - SIGINT or SIGTERM ends the process with status 0.
//!
//! # Implementation notes
//!
//! SIGINT and SIGTERM are blocked before any worker thread starts, so every
//! thread inherits the mask and only the main thread, parked in `sigwait(2)`,
//! ever sees them. Exiting from there needs no cooperation from the runtimes.

pub mod floor;
pub mod floor_uring;
mod monoio;
mod tokio;

use std::io;
use std::net::{SocketAddr, TcpListener};

use clap::{Args, ValueEnum};
use socket2::{Domain, Protocol, Socket, Type};

/// Backlog asked of `listen(2)`; the kernel caps it at `net.core.somaxconn`.
pub const LISTEN_BACKLOG: i32 = 65_535;

/// Bytes each connection reads into: far more than the bench's requests
/// take, and less than the largest head the parser accepts (32 KiB), so a
/// head that fills it unfinished is answered 431 ([`http_step`]) rather
/// than read into a full buffer.
pub const READ_BUFFER_BYTES: usize = 16 * 1024;

/// `hotloop-bench peer`: runs a server written on another runtime.
#[derive(Debug, Clone, Args)]
pub struct PeerArgs {
    /// The runtime the server is written on.
    pub kind: PeerKind,
    /// What the server speaks.
    pub proto: PeerProto,
    /// Address to listen on; port 0 picks a free port (printed on stdout).
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub addr: SocketAddr,
    /// Worker threads, each with its own runtime and listener.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub workers: u16,
    /// Bytes in each HTTP response body.
    #[arg(long, default_value_t = 64)]
    pub body_size: usize,
    /// Microseconds of CPU work per HTTP request.
    #[arg(long, default_value_t = 0)]
    pub work_us: u64,
    /// floor only: connections accepted per listener wakeup, a number or
    /// `unlimited` (until accept4 says EAGAIN).
    #[arg(long, default_value = "64", value_parser = floor::parse_max_accepts)]
    pub max_accepts: floor::MaxAccepts,
    /// floor and floor-uring only: never sleep, poll with a zero timeout
    /// in a loop (a whole core per worker, idle or not): the floor of
    /// hotloop's `--busy-poll always`.
    #[arg(long)]
    pub busy_poll: bool,
}

/// The runtimes a peer server can be written on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PeerKind {
    /// tokio, a current-thread runtime per worker.
    Tokio,
    /// monoio, io_uring when the kernel allows it, epoll otherwise.
    Monoio,
    /// Raw system calls, no runtime: the floor the others are measured from.
    Floor,
    /// Raw io_uring, no runtime: the floor of an io_uring server.
    FloorUring,
}

/// The protocols a peer server speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PeerProto {
    /// Writes back what it reads until the client closes.
    Echo,
    /// HTTP/1.1 with keep-alive, a fixed `200` response per request.
    Http,
    /// The same answer from a hyper service (HTTP/1.1, and HTTP/2 by prior
    /// knowledge); tokio only.
    Hyper,
}

/// Runs the peer server `args` describes until SIGINT or SIGTERM.
pub fn run(args: PeerArgs) -> io::Result<()> {
    if args.proto == PeerProto::Hyper && args.kind != PeerKind::Tokio {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "the hyper peer runs on tokio only",
        ));
    }
    if args.busy_poll && matches!(args.kind, PeerKind::Tokio | PeerKind::Monoio) {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "--busy-poll is for the floors only (floor, floor-uring)",
        ));
    }
    // Every peer may hold as many connections as the hard limit allows, as
    // `hotloop serve` does; tokio and monoio would otherwise fail at the
    // soft limit (often 1,024) the shell handed down.
    crate::load::sys::raise_nofile_limit()?;
    match args.kind {
        PeerKind::Tokio => serve_with(&args, tokio::worker),
        PeerKind::Monoio => serve_with(&args, monoio::worker),
        PeerKind::Floor => floor::run(&floor::FloorArgs {
            app: match args.proto {
                PeerProto::Echo => floor::App::Echo,
                PeerProto::Http | PeerProto::Hyper => floor::App::Http,
            },
            addr: args.addr,
            workers: usize::from(args.workers),
            body_size: args.body_size,
            work_us: args.work_us,
            max_accepts: args.max_accepts,
            busy_poll: args.busy_poll,
        }),
        PeerKind::FloorUring => floor_uring::run(&floor_uring::FloorUringArgs {
            app: match args.proto {
                PeerProto::Echo => floor::App::Echo,
                PeerProto::Http | PeerProto::Hyper => floor::App::Http,
            },
            addr: args.addr,
            workers: usize::from(args.workers),
            body_size: args.body_size,
            work_us: args.work_us,
            busy_poll: args.busy_poll,
        }),
    }
}

/// What every worker of one server shares: read-only after start-up.
#[derive(Debug, Clone, Copy)]
pub struct Shared {
    /// What the workers speak.
    pub proto: PeerProto,
    /// Microseconds of CPU work per HTTP request.
    pub work_us: u64,
    /// The `200` response that keeps the connection open.
    pub response_keepalive: &'static [u8],
    /// The `200` response that closes the connection.
    pub response_close: &'static [u8],
    /// Bytes in each response body.
    pub body_size: usize,
}

/// Binds one listener per worker, starts the workers and waits for a signal.
fn serve_with(args: &PeerArgs, worker: fn(usize, TcpListener, Shared)) -> io::Result<()> {
    let signals = hotloop::signal::ShutdownSignals::block()?;
    // The responses live as long as the process; leaking them once lets
    // every worker and every owned-buffer write borrow them for 'static.
    let shared = Shared {
        proto: args.proto,
        work_us: args.work_us,
        body_size: args.body_size,
        response_keepalive: Box::leak(
            crate::proto::response_ok(args.body_size, false).into_boxed_slice(),
        ),
        response_close: Box::leak(
            crate::proto::response_ok(args.body_size, true).into_boxed_slice(),
        ),
    };
    let first = bind_reuseport(args.addr)?;
    // With port 0 the first bind picks the port; the others must share it.
    let addr = first.local_addr()?;
    let mut listeners = vec![first];
    for _ in 1..args.workers {
        listeners.push(bind_reuseport(addr)?);
    }
    println!("listening on {addr}");
    let mut threads = Vec::new();
    for (index, listener) in listeners.into_iter().enumerate() {
        let thread = std::thread::Builder::new()
            .name(format!("peer-worker-{index}"))
            .spawn(move || worker(index, listener, shared))?;
        threads.push(thread);
    }
    let signal = signals.wait()?;
    eprintln!("peer: {signal:?}, exiting");
    std::process::exit(0)
}

/// A non-blocking listener with `SO_REUSEADDR` and `SO_REUSEPORT` set.
pub fn bind_reuseport(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into()).map_err(|e| io::Error::new(e.kind(), format!("bind {addr}: {e}")))?;
    socket.listen(LISTEN_BACKLOG)?;
    Ok(socket.into())
}

/// What a connection does with the bytes it has buffered.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Send this response, drop `consumed` bytes, and go on unless `close`.
    Respond {
        /// The bytes to write.
        response: &'static [u8],
        /// Bytes of the request the response answers.
        consumed: usize,
        /// Whether to close after writing.
        close: bool,
    },
    /// Read more.
    NeedMore,
}

/// Decides the next HTTP step for the request at the start of `buf`,
/// spending the per-request work when a request is complete.
pub fn http_step(buf: &[u8], shared: &Shared) -> Step {
    use crate::proto::{parse_request, response_error, spin_work, Request};
    match parse_request(buf) {
        Request::Complete { len, close, .. } => {
            spin_work(shared.work_us);
            let response = if close { shared.response_close } else { shared.response_keepalive };
            Step::Respond { response, consumed: len, close }
        }
        Request::Partial if buf.len() < READ_BUFFER_BYTES => Step::NeedMore,
        Request::Partial | Request::TooLarge => {
            Step::Respond { response: response_error(431), consumed: buf.len(), close: true }
        }
        Request::Malformed => {
            Step::Respond { response: response_error(400), consumed: buf.len(), close: true }
        }
        Request::Unsupported(status) => {
            Step::Respond { response: response_error(status), consumed: buf.len(), close: true }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared() -> Shared {
        Shared {
            proto: PeerProto::Http,
            work_us: 0,
            response_keepalive: b"K",
            response_close: b"C",
            body_size: 1,
        }
    }

    #[test]
    fn http_step_answers_each_kind_of_request() {
        let s = shared();
        assert_eq!(
            http_step(b"GET / HTTP/1.1\r\nHost: a\r\n\r\nGET", &s),
            Step::Respond { response: b"K", consumed: 27, close: false }
        );
        assert_eq!(
            http_step(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", &s),
            Step::Respond { response: b"C", consumed: 46, close: true }
        );
        assert_eq!(http_step(b"GET / HT", &s), Step::NeedMore);
        assert!(matches!(http_step(b"\x01\x02\r\n\r\n", &s), Step::Respond { close: true, .. }));
    }

    #[test]
    fn command_line_follows_the_contract() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            peer: PeerArgs,
        }
        let a = Cli::try_parse_from([
            "peer",
            "monoio",
            "echo",
            "--addr",
            "127.0.0.1:0",
            "--workers",
            "2",
            "--body-size",
            "5",
            "--work-us",
            "3",
        ])
        .unwrap()
        .peer;
        assert_eq!(
            (a.kind, a.proto, a.workers, a.body_size, a.work_us),
            (PeerKind::Monoio, PeerProto::Echo, 2, 5, 3)
        );
        assert_eq!(
            Cli::try_parse_from(["peer", "floor", "http"]).unwrap().peer.kind,
            PeerKind::Floor
        );
        assert_eq!(
            Cli::try_parse_from(["peer", "floor-uring", "echo"]).unwrap().peer.kind,
            PeerKind::FloorUring
        );
        assert!(Cli::try_parse_from(["peer", "tokio", "http", "--workers", "0"]).is_err());
        assert!(Cli::try_parse_from(["peer", "glommio", "http"]).is_err());
    }

    #[test]
    fn listeners_share_a_port() {
        let a = bind_reuseport("127.0.0.1:0".parse().unwrap()).unwrap();
        let b = bind_reuseport(a.local_addr().unwrap()).unwrap();
        assert_eq!(a.local_addr().unwrap(), b.local_addr().unwrap());
    }
}
