//! What the process does with each signal, and with a successor that took
//! its sockets over, for `serve` and `proxy` alike.
//!
//! | event | effect |
//! |---|---|
//! | SIGTERM, SIGINT | graceful stop (a drain): stop accepting, serve what the kernel already queued, answer requests in flight with `Connection: close`, close idle keep-alive connections once quiet, exit as soon as the last connection ends or `--drain-timeout-ms` has passed (then the rest are cut and counted) |
//! | a successor started with the same `--upgrade-socket` is ready | the same drain, except that what waits in the kernel's queues is the successor's |
//! | a second SIGTERM or SIGINT, or SIGQUIT at any time | stop at once: every open connection is closed |
//! | SIGTERM or SIGINT during the drain that follows a hand-over | logged: the process already drains (a supervisor or deploy script that stops the old process after an upgrade must not cut what it still serves); a second one stops at once, as SIGQUIT does |
//! | SIGHUP | reload the TLS certificate and key from their files for new handshakes (live connections keep theirs); a bad file keeps the old certificate and says why; without TLS, logged and ignored |
//! | SIGUSR1 | logs one status line (connections open, accepted so far) |
//! | SIGUSR2 | logged and ignored |
//!
//! nginx and haproxy differ: nginx stops gracefully on SIGQUIT and fast on
//! SIGTERM; haproxy stops hard on SIGTERM and softly on SIGUSR1. hotloop
//! follows the convention of process supervisors and Kubernetes, which send
//! SIGTERM and expect a graceful stop before their kill deadline. An
//! upgrade is not a signal to the old process (nginx's SIGUSR2, haproxy's
//! `-sf`): the new process asks for the sockets over the upgrade socket,
//! and the old one drains once the new one serves.
//!
//! A TCP server drains through the library's one drain
//! ([`Server::drain_blocking`]), the same that `Server::stop` then
//! `Server::stopped` runs; a second stop signal during it stops at once
//! (after a hand-over, the first SIGTERM or SIGINT is the drain's own).

use std::io;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use hotloop::net::{Handover, Server};
use hotloop::signal::{ShutdownSignals, SignalKind};
use hotloop::Runtime;

/// How often the stop loop looks at the connection count while it also
/// waits for a second signal.
const STOP_POLL: Duration = Duration::from_millis(5);

/// With an upgrade socket, how often the main thread looks whether a
/// successor took over while it waits for a signal.
const HANDOVER_POLL: Duration = Duration::from_millis(50);

/// How a stop ended.
pub struct Stopped {
    /// Connections still open when the process stopped waiting.
    pub cut: usize,
    /// The stop was forced by a second signal or SIGQUIT.
    pub forced: bool,
    /// The pid of the successor that took the sockets over, if one did.
    pub successor: Option<u32>,
}

/// What the stop loop answers besides the stop itself.
pub struct Control<'a> {
    /// Starts every line.
    pub name: &'a str,
    pub signals: &'a ShutdownSignals,
    /// Says when a successor took the sockets over; closed once the
    /// process stops on its own.
    pub handover: &'a Handover,
    /// How long open connections may take once the drain begins.
    pub drain_timeout: Duration,
    /// Makes the SIGUSR1 line.
    pub status: &'a dyn Fn() -> String,
    /// SIGHUP: reloads what can be reloaded, and says what happened
    /// (`None`: nothing to reload).
    pub reload: &'a dyn Fn() -> Option<String>,
}

/// Why the process stops.
enum End {
    Signal(SignalKind),
    Replaced(u32),
}

/// Waits for a stop signal or a successor, answering the other signals,
/// then drains `server` (see the module docs).
pub fn run_until_stopped(ctl: &Control<'_>, rt: &Runtime, server: Server) -> io::Result<Stopped> {
    let active = server.active_connections_reader();
    let successor = match begin(ctl, &active)? {
        Some(successor) => successor,
        None => return Ok(forced(ctl, active())),
    };
    // First, so that an answer being prepared now already says `Connection: close`.
    crate::drain::begin(rt.handle());
    let (done_tx, done) = mpsc::channel();
    let timeout = ctl.drain_timeout;
    let mut drain = Drain::new(successor);
    // The drain blocks; this thread keeps answering signals meanwhile.
    std::thread::Builder::new().name("hotloop-drain".into()).spawn(move || {
        let _ = done_tx.send(server.drain_blocking(timeout));
    })?;
    loop {
        match done.try_recv() {
            Ok(drained) => {
                return Ok(Stopped { cut: drained.cut + drained.left, forced: false, successor })
            }
            // The drain's thread ended without an answer (it panicked): its
            // drain is over either way, and waiting would never end.
            Err(mpsc::TryRecvError::Disconnected) => {
                return Ok(Stopped { cut: active(), forced: false, successor })
            }
            Err(mpsc::TryRecvError::Empty) => {}
        }
        if let Some(stopped) = second_signal(ctl, &mut drain, &active)? {
            return Ok(Stopped { successor, ..stopped });
        }
    }
}

/// [`run_until_stopped`] for a server that is not a [`Server`] (QUIC):
/// `active` counts its open connections, which take no new ones once
/// [`crate::drain::stopping`] says so; the drain waits for `active` to
/// reach zero.
pub fn run_until_stopped_with(
    ctl: &Control<'_>,
    rt: &Runtime,
    active: &dyn Fn() -> usize,
) -> io::Result<Stopped> {
    let successor = match begin(ctl, active)? {
        Some(successor) => successor,
        None => return Ok(forced(ctl, active())),
    };
    let deadline = Instant::now() + ctl.drain_timeout;
    let mut drain = Drain::new(successor);
    // Counted and logged as a `Server`'s drain is, in the library.
    hotloop::stats::record_drain(ctl.name, active(), ctl.drain_timeout);
    crate::drain::begin(rt.handle());
    loop {
        let left = active();
        if left == 0 || Instant::now() >= deadline {
            hotloop::stats::record_drain_cut(ctl.name, left);
            return Ok(Stopped { cut: left, forced: false, successor });
        }
        if let Some(stopped) = second_signal(ctl, &mut drain, active)? {
            return Ok(Stopped { successor, ..stopped });
        }
    }
}

/// Waits for the end and says what happens next. `None`: stop at once
/// (SIGQUIT); otherwise the drain begins, for this successor, if any.
fn begin(ctl: &Control<'_>, active: &dyn Fn() -> usize) -> io::Result<Option<Option<u32>>> {
    let name = ctl.name;
    let end = wait_for_end(ctl)?;
    // No successor is taken once the process stops on its own; one that
    // has the sockets already keeps them (`close` runs the hand-over's
    // stops: QUIC endpoints stop reading them and close their connections).
    ctl.handover.close();
    let open = active();
    let timeout = ctl.drain_timeout;
    Ok(match end {
        End::Signal(sig) if sig == SignalKind::quit() => {
            say!("{name}: {sig:?}: stopping at once; {open} connections cut");
            None
        }
        End::Signal(sig) => {
            say!(
                "{name}: {sig:?}: draining: no longer accepting; {open} connections open; closing idle ones; waiting up to {timeout:?} for the others (send it again, or SIGQUIT, to stop at once)"
            );
            Some(None)
        }
        End::Replaced(pid) => {
            say!(
                "{name}: handed over to pid {pid}: draining: no longer accepting; {open} connections open; waiting up to {timeout:?} for them (SIGTERM twice, or SIGQUIT, stops at once)"
            );
            Some(Some(pid))
        }
    })
}

fn wait_for_end(ctl: &Control<'_>) -> io::Result<End> {
    // Without an upgrade socket no successor can come: wait for signals alone.
    let poll = ctl.handover.path().is_some().then_some(HANDOVER_POLL);
    loop {
        if let Some(pid) = ctl.handover.successor() {
            return Ok(End::Replaced(pid));
        }
        let sig = match poll {
            Some(limit) => ctl.signals.wait_timeout(limit)?,
            None => Some(ctl.signals.wait()?),
        };
        match sig {
            Some(sig) if sig.is_stop() => return Ok(End::Signal(sig)),
            Some(sig) => other_signal(ctl, sig),
            None => {}
        }
    }
}

/// What started a drain, and the stop signals it has had since.
struct Drain {
    /// A successor took the sockets over: no signal began this drain.
    handed_over: bool,
    /// SIGTERM or SIGINT seen during a hand-over's drain.
    told: bool,
}

impl Drain {
    fn new(successor: Option<u32>) -> Drain {
        Drain { handed_over: successor.is_some(), told: false }
    }

    /// True if `sig`, come during this drain, stops the process at once:
    /// SIGQUIT always; SIGTERM and SIGINT when a signal began the drain,
    /// or when one came already during a hand-over's drain. The first
    /// SIGTERM after a hand-over is the one a supervisor or a deploy
    /// script sends the old process to stop it gracefully (nginx's QUIT
    /// to an old master, haproxy's `-sf`): it already does.
    fn forces(&mut self, sig: SignalKind) -> bool {
        if sig == SignalKind::quit() || !self.handed_over {
            return true;
        }
        std::mem::replace(&mut self.told, true)
    }
}

/// During a drain: waits up to [`STOP_POLL`] for a signal; a stop signal
/// that [`Drain::forces`] the stop ends the drain at once.
fn second_signal(
    ctl: &Control<'_>,
    drain: &mut Drain,
    active: &dyn Fn() -> usize,
) -> io::Result<Option<Stopped>> {
    match ctl.signals.wait_timeout(STOP_POLL)? {
        Some(sig) if sig.is_stop() && !drain.forces(sig) => {
            say!(
                "{}: {sig:?}: already draining after the hand-over; {} connections open (send it again, or SIGQUIT, to stop at once)",
                ctl.name,
                active()
            );
            Ok(None)
        }
        Some(sig) if sig.is_stop() => {
            let cut = active();
            say!("{}: {sig:?} again: stopping at once; {cut} connections cut", ctl.name);
            Ok(Some(forced(ctl, cut)))
        }
        Some(sig) => {
            other_signal(ctl, sig);
            Ok(None)
        }
        None => Ok(None),
    }
}

/// A stop forced before the drain's end: `cut` connections are still
/// open, and are counted in `drain_cut` (the process exits next).
fn forced(ctl: &Control<'_>, cut: usize) -> Stopped {
    hotloop::stats::record_cut(ctl.name, cut, "by a forced stop");
    Stopped { cut, forced: true, successor: None }
}

fn other_signal(ctl: &Control<'_>, sig: SignalKind) {
    let name = ctl.name;
    if sig == SignalKind::hangup() {
        match (ctl.reload)() {
            Some(what) => say!("{name}: SIGHUP: {what}"),
            None => say!(
                "{name}: SIGHUP ignored: no TLS certificate to reload, and options come from the command line only (start a new process with --upgrade-socket to change them)"
            ),
        }
    } else if sig == SignalKind::user_defined1() {
        say!("{name}: {}", (ctl.status)());
    } else {
        say!("{name}: {sig:?} ignored");
    }
}

/// SIGHUP with TLS: reads the certificate and key again; says what happened.
pub(crate) fn reload_certificate(certs: &hotloop::tls::CertReloader) -> String {
    match certs.reload() {
        Ok(()) => format!(
            "reloaded the TLS certificate from {} for new handshakes",
            certs.cert_path().display()
        ),
        Err(e) => format!("TLS certificate reload refused, keeping the previous certificate: {e}"),
    }
}

/// The last line of a `serve` or `proxy` process.
/// `unserved`: connections accepted and closed before a handler had them
/// (the runtime's `accepted_unserved`), said only when there were any.
pub(crate) fn say_stopped(name: &str, stopped: &Stopped, accepted: u64, unserved: u64) {
    let how = match (stopped.forced, stopped.successor) {
        (true, _) => "stopped at once".to_string(),
        (false, Some(pid)) => format!("drained after handing over to pid {pid}"),
        (false, None) => "stopped".to_string(),
    };
    let unserved = if unserved > 0 {
        format!(", {unserved} of them closed before a handler had them")
    } else {
        String::new()
    };
    let when = if stopped.forced { "" } else { " at the drain deadline" };
    say!("{name}: {how} ({} connections cut{when}); {accepted} accepted{unserved}", stopped.cut);
}
