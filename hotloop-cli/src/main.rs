//! The `hotloop` command: the runtime as a production server (`serve`, over
//! TCP, TLS or QUIC), a TCP forwarder or an HTTP reverse proxy (`proxy`),
//! each with a live stats endpoint.
//!
//! It links hotloop and no other runtime; the measuring tools (load
//! generator, peers, benchmark suite) live in `hotloop-bench`.

/// `eprintln!` for what the process says while it runs: a stderr that
/// fails (the terminal or pipe that started the process went away) loses
/// the line instead of panicking, which would end the process in the
/// middle of a drain or an upgrade.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), $($arg)*);
    }};
}

mod conn;
mod drain;
mod http_date;
mod http_proxy;
mod mode;
mod proxy;
mod quic;
mod runtime_args;
mod serve;
mod serve_args;
mod static_files;
mod stats_server;
mod stop;
mod tls;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// A thread-per-core runtime's servers.
#[derive(Parser, Debug)]
#[command(name = "hotloop", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run an echo, HTTP, hyper or static-file server (plain or TLS), or a QUIC echo or HTTP/3 server.
    #[command(after_help = SERVE_NOTES)]
    Serve(serve_args::ServeArgs),
    /// Forward TCP connections to backends, round-robin (the default), or
    /// HTTP requests by host and path to groups of backends (--mode http).
    #[command(after_help = PROXY_NOTES)]
    Proxy(proxy::ProxyArgs),
}

const SERVE_NOTES: &str = notes::SERVE;
const PROXY_NOTES: &str = notes::PROXY;

/// The help text after each command's flags (`concat!` takes literals only, hence the macro).
mod notes {
    macro_rules! signals {
        () => {
            "\
Signals: SIGTERM or SIGINT drains: no new connections, idle keep-alive connections
closed once quiet for 1 s (--drain-idle-quiet-ms), answers in flight sent with `Connection: close`
(HTTP/2: GOAWAY), exit as soon as the last connection ends or --drain-timeout-ms
(default 5000) has passed, when the rest are cut. A second SIGTERM or SIGINT, or
SIGQUIT at any time, stops at once (after a hand-over the process drains already:
the first SIGTERM or SIGINT then is only logged). SIGHUP reloads the TLS certificate and key
from their files for new handshakes (a bad file keeps the old certificate);
without TLS it is logged and ignored. SIGUSR1 logs one status line. SIGUSR2 is
logged and ignored.

Upgrades: --upgrade-socket PATH. The first process binds its addresses and waits
on PATH; a process started later with the same PATH (a new build, new options)
receives every listening socket over it (TCP and UDP, all workers'), serves them,
and the old process then stops accepting and drains as on SIGTERM. Nothing waiting
in a listen queue is refused or lost. A successor that fails before it serves
leaves the old process serving, which says so. With systemd socket activation
(LISTEN_FDS and LISTEN_PID naming the process) the given sockets are served
instead of binding --addr (for 0.0.0.0:PORT, a [::]:PORT socket that takes IPv4
too, as ListenStream=PORT makes); a given socket no server serves fails the start."
        };
    }
    pub const SERVE: &str = concat!(
        "\
Timeouts (echo, http, hyper and static):
  --idle-timeout-ms    60000  nothing moved in either direction, whether the server
                              waits to read or to write: close (http: 408 first if
                              a request head is unfinished; hyper over HTTP/2:
                              GOAWAY, then close within 1 s)
  --header-timeout-ms  10000  a request head not complete: 408 and close (http);
                              hyper over HTTP/1.1: hyper's header-read timeout,
                              counted from the end of the previous answer: close
  --send-timeout-ms    60000  a write made no progress (the client does not read): close
  (0 turns any of the three above off)
  --drain-timeout-ms    5000  on a drain (a stop, or a successor took over), how long
                              open connections may take; then they are cut and
                              counted (--grace-ms is the same)
  --drain-idle-quiet-ms 1000  on a drain, how long an idle keep-alive connection must
                              have been quiet to be closed; one quiet for less waits
                              for its next request (answered with Connection: close).
                              At or above --drain-timeout-ms none is closed early, so
                              no request can meet a close (haproxy's
                              idle-close-on-response); the drain lasts longer
  after an error reply (400, 405, 408, 431, 501, 505), and after an answer the
  server closes on (Connection: close, HTTP/1.0, a stop) when the client has sent
  more: writing is shut down, and what the client still sends is read and
  dropped until it has sent nothing for 2 s (30 s at most) before closing, so
  the client reads the answer rather than a reset.

Static files (serve static --root DIR): GET and HEAD of the files under DIR,
  with Last-Modified and If-Modified-Since (304), one Range (206; 416 past the
  end; several ranges get the whole file), a directory's index.html, 405 for
  other methods; `..` (also percent-encoded) is 403 and links out of DIR are
  refused; the timeouts and TLS flags apply as for http. Bodies go by sendfile
  (small ones on io_uring with the head); a file that shrinks while sent closes the
  connection short of its Content-Length.

TLS (echo, http, hyper, static): --tls-cert FILE --tls-key FILE (PEM: the chain, the
server's certificate first; a PKCS#8, PKCS#1 or SEC1 key). TLS 1.2 and 1.3 on
rustls; ALPN h2 and http/1.1 (hyper), http/1.1 (http, static), none (echo).
  --handshake-timeout-ms 10000  a handshake not done: close (garbage or an old
                                protocol version closes at once)
  then the timeouts above apply as on plain TCP; a write counts as progress once
  a TLS record (up to 16 KiB) is out. Connections end with close_notify.

QUIC (UDP; one endpoint per worker on one port, SO_REUSEPORT):
  quic  every bidirectional stream gets back what it sends until the client
        finishes it; ALPN `hotloop-echo` (a client offering no ALPN is served)
  h3    HTTP/3 (ALPN h3): every request gets 200 and --body-size bytes
  Certificate: --tls-cert/--tls-key, or a self-signed one for localhost,
  127.0.0.1, ::1 (and --addr) made at start; --write-cert FILE saves it (PEM)
  for clients to trust; its SHA-256 is printed either way.
  --idle-timeout-ms is QUIC's idle timeout; --handshake-timeout-ms bounds the
  handshake; --send-timeout-ms resets a stream (code 1) whose echo the client
  does not read; --maxconn (default 4096) refuses connections beyond it. The TCP
  listener flags (--backlog, --max-accepts, --accept-pacing, --defer-accept,
  --accept) and --maxconn-per-worker do not apply.
  Address validation: a handshake from an address not yet validated takes no
  --maxconn slot until it completes (then, if none is left, it is closed with
  code 2, h3 H3_EXCESSIVE_LOAD), and is sent at most 3 times the bytes the
  address sent (RFC 9000 section 8); --quic-retry auto (the default) answers new
  addresses with a Retry once --quic-unvalidated-max (256) such handshakes are in
  progress, `always` answers every new address so, `never` refuses past the bound.
  Per connection: --quic-max-streams (100) open streams, and what the server
  holds for it: --quic-receive-window-bytes (1 MiB, all streams),
  --quic-stream-receive-window-bytes (256 KiB), --quic-send-window-bytes (1 MiB).
  On a stop: new connections are refused; a connection with no stream (request)
  open closes at once, others once their streams are done (h3 sends GOAWAY
  first); the close code is 0 (quic) or H3_NO_ERROR (h3), reason \"server
  stopping\"; what is open at the end of --drain-timeout-ms is closed the same
  way. At an upgrade the old process closes its connections at once (reason
  \"server upgrading\"): both processes would read the same UDP sockets.

",
        signals!()
    );
    pub const PROXY: &str = concat!(
        "\
Timeouts (--mode tcp, the default):
  --connect-timeout-ms  1000  one backend's connect; then the next backend is tried
  --idle-timeout-ms    60000  no byte moved in either direction (writes blocked on a
                              peer that does not read included): both sides reset
  --drain-timeout-ms    5000  on a drain (a stop, or a successor took over), how long
                              open connections may take (proxied connections have no
                              request boundary: they run until they end or the drain
                              timeout does; --grace-ms is the same)

HTTP (--mode http): HTTP/1.1 and HTTP/2 clients (h2c, or ALPN over TLS with
--tls-cert/--tls-key), routed by host and path to groups of backends from
--config FILE (TOML; README.md lists every key), or one group of --backend
addresses (--backend-protocol http1|h2). Client timeouts as `serve hyper`:
  --idle-timeout-ms    60000  nothing moved either way: close (HTTP/2: GOAWAY)
  --header-timeout-ms  10000  a request head not complete: close
  --send-timeout-ms    60000  a write made no progress (the client does not read): close
  --drain-timeout-ms    5000  as above; an upgraded (WebSocket) tunnel runs until it
                              ends or this cuts it
Backend timeouts are per group in the file (connect, response head, body); a
request no backend answered gets 502, one every backend is down for 503 with
Retry-After, a backend too slow 504.

",
        signals!()
    );
}

fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Serve(args) => serve::run(&args),
        // Runs until a stop signal (see `stop.rs` for each signal).
        Command::Proxy(args) => match args.mode {
            proxy::Mode::Tcp => mode::run(|| proxy::TcpProxy::new(&args)),
            proxy::Mode::Http => mode::run(|| http_proxy::HttpProxy::new(&args)),
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            say!("hotloop: {e}");
            ExitCode::FAILURE
        }
    }
}
