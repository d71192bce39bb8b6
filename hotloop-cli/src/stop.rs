//! What the process does with each signal, for `serve` and `proxy` alike.
//!
//! | signal | effect |
//! |---|---|
//! | SIGTERM, SIGINT | graceful stop: stop accepting, serve what the kernel already queued, close idle keep-alive connections at once, answer requests in flight with `Connection: close`, exit as soon as the last connection ends or `--grace-ms` has passed |
//! | a second SIGTERM or SIGINT, or SIGQUIT at any time | stop at once: every open connection is closed |
//! | SIGHUP | logged and ignored: every option comes from the command line, so there is nothing to re-read; restart to change options |
//! | SIGUSR1 | logs one status line (connections open, accepted so far) |
//! | SIGUSR2 | logged and ignored |
//!
//! nginx and haproxy differ: nginx stops gracefully on SIGQUIT and fast on
//! SIGTERM; haproxy stops hard on SIGTERM and softly on SIGUSR1. hotloop
//! follows the convention of process supervisors and Kubernetes, which send
//! SIGTERM and expect a graceful stop before their kill deadline.

use std::io;
use std::time::{Duration, Instant};

use hotloop::net::Server;
use hotloop::signal::{ShutdownSignals, SignalKind};
use hotloop::Runtime;

/// How often the stop loop looks at the connection count while it also
/// waits for a second signal.
const STOP_POLL: Duration = Duration::from_millis(5);

/// How a stop ended.
pub struct Stopped {
    /// Connections still open when the process stopped waiting.
    pub cut: usize,
    /// The stop was forced by a second signal or SIGQUIT.
    pub forced: bool,
}

/// Waits for a stop signal, answering the others, then stops `server`
/// gracefully within `grace` (see the module docs). `status` makes the
/// SIGUSR1 line; `name` starts every line.
pub fn run_until_stopped(
    name: &str,
    signals: &ShutdownSignals,
    rt: &Runtime,
    server: Server,
    grace: Duration,
    status: &dyn Fn() -> String,
) -> io::Result<Stopped> {
    let active = server.active_connections_reader();
    run_until_stopped_with(name, signals, rt, &active, grace, status, move || {
        server.stop();
        // The accept loops serve what the kernel already queued, then end.
        let _ = rt.block_on(server.stopped());
    })
}

/// [`run_until_stopped`] for any server: `active` counts its open
/// connections, and `stop_accepting` (called once, after every worker has
/// been told to stop) makes it take no new ones.
pub fn run_until_stopped_with(
    name: &str,
    signals: &ShutdownSignals,
    rt: &Runtime,
    active: &dyn Fn() -> usize,
    grace: Duration,
    status: &dyn Fn() -> String,
    stop_accepting: impl FnOnce(),
) -> io::Result<Stopped> {
    let first = loop {
        let sig = signals.wait()?;
        if sig.is_stop() {
            break sig;
        }
        other_signal(name, sig, status);
    };
    if first == SignalKind::quit() {
        eprintln!("{name}: {first:?}: stopping at once; {} connections cut", active());
        return Ok(Stopped { cut: active(), forced: true });
    }
    eprintln!(
        "{name}: {first:?}: no longer accepting; closing idle connections; waiting up to {grace:?} for the others (send it again, or SIGQUIT, to stop at once)"
    );
    let deadline = Instant::now() + grace;
    // First, so that an answer being prepared now already says `Connection: close`.
    crate::drain::begin(rt.handle());
    stop_accepting();
    loop {
        let left = active();
        let now = Instant::now();
        if left == 0 || now >= deadline {
            return Ok(Stopped { cut: left, forced: false });
        }
        match signals.wait_timeout(STOP_POLL.min(deadline - now))? {
            Some(sig) if sig.is_stop() => {
                eprintln!("{name}: {sig:?} again: stopping at once; {left} connections cut");
                return Ok(Stopped { cut: active(), forced: true });
            }
            Some(sig) => other_signal(name, sig, status),
            None => {}
        }
    }
}

fn other_signal(name: &str, sig: SignalKind, status: &dyn Fn() -> String) {
    if sig == SignalKind::hangup() {
        eprintln!(
            "{name}: SIGHUP ignored: options come from the command line only, so there is nothing to reload (restart to change them)"
        );
    } else if sig == SignalKind::user_defined1() {
        eprintln!("{name}: {}", status());
    } else {
        eprintln!("{name}: {sig:?} ignored");
    }
}
