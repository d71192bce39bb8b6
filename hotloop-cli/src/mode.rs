//! The life of a server process, written once for every mode (`serve
//! echo|http|hyper|static|quic|h3`, `proxy`, `proxy --mode http`): start,
//! banner, stats endpoint, signals, upgrade hand-over, drain, farewell.
//!
//! A mode is a type that implements [`Mode`]: how it binds and what it
//! serves ([`Mode::start`]), its first line ([`Mode::banner`]), what its
//! stats add ([`Mode::stats`]), its SIGUSR1 and SIGHUP answers, and its
//! last line. [`run`] does the rest, in this order:
//!
//! 1. block the stop signals (before any thread exists, so every thread
//!    inherits the mask) and raise the open-file limit; the mode reads and
//!    checks its flags;
//! 2. build the runtime and open the hand-over (`--upgrade-socket`, or
//!    systemd's `LISTEN_FDS`): the mode has proved its options good by
//!    then, so a successor that cannot start never takes the sockets;
//! 3. the stats endpoint starts, before anything is served: a successor
//!    that fails here has taken no connection from the queues it shares
//!    with its predecessor (it would cut them when it exits);
//! 4. the mode starts serving ([`Mode::start`]): a TCP server accepts
//!    (both processes may accept from the same queue meanwhile), UDP
//!    endpoints are made but read nothing yet ([`Start::recv_gate`]), since
//!    two QUIC endpoints cannot share a socket;
//! 5. the banner (the first line with ` on ADDR`: tests and scripts take
//!    the address after it), the stats endpoint's address;
//! 6. a predecessor is told to drain ([`Handover::ready`]), last, for every
//!    mode: once it is told nobody else serves, so nothing that can fail
//!    comes after; then the UDP endpoints read. If it fails (the
//!    predecessor was not told, or answered that it had stopped waiting
//!    for this process: `--upgrade-ready-timeout-ms` of its own had
//!    passed, and it goes on serving), or a stop signal came during the start
//!    (the predecessor is then not told, and goes on serving), what was
//!    accepted is drained before the process exits;
//! 7. signals are answered until a stop or a successor (`stop.rs`), then
//!    the drain: the library's for a TCP [`Server`], a count of open
//!    connections for UDP endpoints, which then close what is left;
//! 8. the farewell: how the process stopped, and the mode's last line.

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use hotloop::net::{Handover, Server, ServerOptions, UdpOptions};
use hotloop::quic::RecvGate;
use hotloop::signal::ShutdownSignals;
use hotloop::Runtime;

use crate::runtime_args::RuntimeArgs;
use crate::stats_server::{Count, Extra, ExtraFields, Kind, StatsServer};
use crate::stop;

/// A server mode: what [`run`] needs to know of it.
pub trait Mode {
    /// Begins every line the process prints: `hotloop serve` or `hotloop proxy`.
    const NAME: &'static str;
    /// The help text of the stats endpoint's `active_connections` gauge.
    const ACTIVE_HELP: &'static str;

    /// The runtime's, listeners' and process's flags.
    fn runtime_args(&self) -> &RuntimeArgs;

    /// Binds and starts serving on the workers of `at.rt`: a TCP mode
    /// starts a [`Server`] with [`Start::server_options`]; a UDP mode
    /// takes its sockets from [`Start::udp_sockets`] and runs its
    /// endpoints.
    fn start(&mut self, at: &Start<'_>) -> io::Result<Serving>;

    /// The first line once serving; it must say ` on {on}`.
    fn banner(&self, at: &Start<'_>, on: SocketAddr) -> String;

    /// Lines printed after the banner, before the stats endpoint's.
    fn notes(&self) -> Vec<String> {
        Vec::new()
    }

    /// The stats fields the mode adds after `active_connections`, read at
    /// each scrape (on worker 0).
    fn stats(&self) -> Option<ExtraFields> {
        None
    }

    /// The connections it accepted since start, for the stats endpoint's
    /// connection rate, if the runtime's `accepted` does not count them
    /// (a UDP mode's connections pass no listener); `None`: the runtime's.
    fn accepted(&self) -> Option<Count> {
        None
    }

    /// The SIGUSR1 line; `open` connections are open now.
    fn status(&self, rt: &Runtime, open: usize) -> String;

    /// SIGHUP: reloads what can be reloaded and says what happened
    /// (`None`: nothing to reload).
    fn reload(&self) -> Option<String> {
        None
    }

    /// The last line after the stop's own, if any.
    fn farewell(&self) -> Option<String> {
        None
    }
}

/// What a mode serves once started.
pub enum Serving {
    /// TCP: the library's server (an accept loop per worker), drained by
    /// the library ([`Server::drain_blocking`]).
    Tcp(Server),
    /// UDP: the mode's own endpoints, one or more per worker.
    Udp(Box<dyn Endpoints>),
}

/// A UDP mode's endpoints: what the drain and the farewell need of them.
pub trait Endpoints {
    /// The address served.
    fn local_addr(&self) -> SocketAddr;
    /// Reads the number of connections open now (the drain waits for 0).
    fn active(&self) -> Arc<dyn Fn() -> usize + Send + Sync>;
    /// Connections accepted since start.
    fn accepted(&self) -> u64;
    /// After the drain: closes what is left (the drain told the endpoints
    /// to refuse new connections already).
    fn close(&mut self, rt: &Runtime);
}

/// What a mode starts with.
pub struct Start<'a> {
    /// The runtime it serves on.
    pub rt: &'a Runtime,
    /// Where the sockets come from: a predecessor, systemd, or a new bind.
    pub handover: &'a Handover,
    /// The open-file limit in force.
    pub nofile: u64,
    args: &'a RuntimeArgs,
    recv_gate: RecvGate,
}

impl Start<'_> {
    /// A TCP server's options from the flags, its sockets from the hand-over.
    pub fn server_options(&self) -> ServerOptions {
        self.args.server_options(self.handover)
    }

    /// One UDP socket per worker on `addr` (a predecessor's or systemd's,
    /// or new ones on one port, `SO_REUSEPORT`). A predecessor reads them
    /// until this process is ready: start the endpoints on them held by
    /// [`Start::recv_gate`].
    pub fn udp_sockets(
        &self,
        addr: SocketAddr,
        options: &UdpOptions,
    ) -> io::Result<Vec<std::net::UdpSocket>> {
        let workers = self.rt.handle().workers();
        self.handover
            .udp_sockets(addr, workers, options)
            .map_err(|e| io::Error::new(e.kind(), format!("binding UDP {addr}: {e}")))
    }

    /// Holds the reads of UDP endpoints (`hotloop::quic::endpoint_on_gated`)
    /// until a predecessor has stopped reading the same sockets; opened
    /// once this process is ready, the last step of its start.
    pub fn recv_gate(&self) -> &RecvGate {
        &self.recv_gate
    }
}

/// Runs the mode `prepare` makes (from its flags, checking them) until a
/// stop signal or a successor, then drains it (see the module docs for the
/// order of things).
pub fn run<M: Mode>(prepare: impl FnOnce() -> io::Result<M>) -> io::Result<()> {
    let signals = ShutdownSignals::block()?;
    let nofile = hotloop::raise_nofile_limit()?;
    let mut mode = prepare()?;
    let args = mode.runtime_args().clone();
    crate::drain::set_idle_quiet(args.drain_idle_quiet(), args.drain_timeout());
    let rt = args.build_runtime()?;
    let handover = args.handover()?;
    let serving_now = Arc::new(OnceLock::new());
    let stats =
        stats_endpoint::<M>(&args, &rt, serving_now.clone(), mode.stats(), mode.accepted())?;
    let at =
        Start { rt: &rt, handover: &handover, nofile, args: &args, recv_gate: RecvGate::new() };
    let serving = mode.start(&at)?;
    let (on, active) = match &serving {
        Serving::Tcp(server) => {
            let active = server.active_connections_reader();
            (server.local_addr(), Arc::new(active) as Arc<dyn Fn() -> usize + Send + Sync>)
        }
        Serving::Udp(endpoints) => (endpoints.local_addr(), endpoints.active()),
    };
    let _ = serving_now.set(active.clone());
    say!("{}", mode.banner(&at, on));
    for note in mode.notes() {
        say!("{}: {note}", M::NAME);
    }
    if let Some(stats) = &stats {
        say!("{}: stats on http://{}/stats", M::NAME, stats.local_addr());
    }
    // Taken only with a predecessor: without one, the stop is answered below.
    let stopped_early = handover.predecessor().and_then(|pid| Some((pid, signals.take_stop()?)));
    if let Some((pid, sig)) = stopped_early {
        // Told to stop while starting: the predecessor, not told yet, goes
        // on serving (taking over now would leave nobody serving).
        handover.close();
        say!("{}: {sig:?} while starting: not taking over from pid {pid}, which goes on serving; stopping", M::NAME);
        abandon(serving, &rt, &args);
        return Ok(());
    }
    // Serving: a predecessor stops accepting (and reading) now, and drains.
    if let Err(e) = handover.ready() {
        abandon(serving, &rt, &args);
        return Err(e);
    }
    at.recv_gate.open();
    if let Some(pid) = handover.predecessor() {
        let what = match serving {
            Serving::Tcp(_) => "listening",
            Serving::Udp(_) => "UDP",
        };
        say!("{}: took the {what} sockets over from pid {pid}, which drains", M::NAME);
    }
    let (stopped, accepted) =
        until_stopped(&mode, &signals, &args, &rt, &handover, serving, &*active)?;
    stop::say_stopped(M::NAME, &stopped, accepted, rt.stats().total.accepted_unserved);
    if let Some(line) = mode.farewell() {
        say!("{}: {line}", M::NAME);
    }
    Ok(())
}

/// A reader of the number of open connections, once the mode serves.
type Active = Arc<OnceLock<Arc<dyn Fn() -> usize + Send + Sync>>>;

/// With `--stats-addr`, the stats endpoint: the runtime's counters, the
/// mode's `active_connections` from `active` (0 until it is set), then the
/// mode's own fields; its connection rate counts `accepted` if given.
fn stats_endpoint<M: Mode>(
    args: &RuntimeArgs,
    rt: &Runtime,
    active: Active,
    more: Option<ExtraFields>,
    accepted: Option<Count>,
) -> io::Result<Option<StatsServer>> {
    let Some(addr) = &args.stats_addr else { return Ok(None) };
    let fields: ExtraFields = Arc::new(move || {
        let mut fields = vec![Extra {
            name: "active_connections",
            help: M::ACTIVE_HELP,
            kind: Kind::Gauge,
            value: active.get().map_or(0, |active| active()) as u64,
        }];
        fields.extend(more.as_ref().map(|f| f()).unwrap_or_default());
        fields
    });
    StatsServer::start(addr, rt.handle().clone(), fields, accepted).map(Some)
}

/// When the process will not serve after all (it could not tell its
/// predecessor, or was told to stop first): what it accepted meanwhile is answered, as in a drain,
/// and UDP endpoints, which never read, are closed.
fn abandon(serving: Serving, rt: &Runtime, args: &RuntimeArgs) {
    crate::drain::begin(rt.handle());
    match serving {
        Serving::Tcp(server) => {
            server.drain_blocking(args.drain_timeout());
        }
        Serving::Udp(mut endpoints) => endpoints.close(rt),
    }
}

/// Answers signals until a stop or a successor, then drains what
/// `serving` holds (`active` counts its connections; see `stop.rs`);
/// returns how it stopped and how many connections were accepted.
fn until_stopped<M: Mode>(
    mode: &M,
    signals: &ShutdownSignals,
    args: &RuntimeArgs,
    rt: &Runtime,
    handover: &Handover,
    serving: Serving,
    active: &dyn Fn() -> usize,
) -> io::Result<(stop::Stopped, u64)> {
    let status = || mode.status(rt, active());
    let reload = || mode.reload();
    let control = stop::Control {
        name: M::NAME,
        signals,
        handover,
        drain_timeout: args.drain_timeout(),
        status: &status,
        reload: &reload,
    };
    Ok(match serving {
        Serving::Tcp(server) => {
            let stopped = stop::run_until_stopped(&control, rt, server)?;
            (stopped, rt.stats().total.accepted)
        }
        Serving::Udp(mut endpoints) => {
            // The endpoints refuse new connections once `drain` says stopping.
            let stopped = stop::run_until_stopped_with(&control, rt, active)?;
            endpoints.close(rt);
            (stopped, endpoints.accepted())
        }
    })
}
