//! A server that can be replaced by a new build without refusing or
//! cutting a request: run it, then run it again with the same upgrade
//! socket. The second process receives the listening sockets, serves them,
//! and the first stops accepting, finishes its connections and exits.
//!
//! ```sh
//! cargo run --release -p hotloop --example upgrade -- 127.0.0.1:8080 /tmp/hotloop-upgrade.sock &
//! curl -s 127.0.0.1:8080/          # served by pid A
//! cargo run --release -p hotloop --example upgrade -- 127.0.0.1:8080 /tmp/hotloop-upgrade.sock &
//! curl -s 127.0.0.1:8080/          # served by pid B; A has drained and exited
//! ```
//!
//! SIGTERM or SIGINT drains the server and exits without a successor. A
//! new process whose predecessor stopped waiting for it (its `ready`
//! came too late) does not take over: it answers what it accepted
//! meanwhile, drains, and exits with the error.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use hotloop::net::{serve, Handover, ServerOptions};
use hotloop::signal::ShutdownSignals;
use hotloop::Runtime;

/// How long open connections may take once the server drains.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

fn main() -> io::Result<()> {
    let mut args = std::env::args().skip(1);
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:8080".into());
    let path = args.next().unwrap_or_else(|| "/tmp/hotloop-upgrade.sock".into());
    let signals = ShutdownSignals::block()?;
    let stop = || -> io::Result<bool> {
        let sig = signals.wait_timeout(Duration::from_millis(50))?;
        Ok(sig.is_some_and(|sig| sig.is_stop()))
    };
    run(Runtime::new()?, &addr, &path, |_| {}, stop)
}

/// Serves `addr` on `rt`, with the sockets of the process serving on the
/// upgrade socket `path` if one does, until a successor takes over or
/// `stop` (asked again and again; it may wait a little) says to stop;
/// then drains. `serving` is called once the server accepts, before the
/// predecessor is told.
pub fn run(
    rt: Runtime,
    addr: &str,
    path: &str,
    serving: impl FnOnce(SocketAddr),
    mut stop: impl FnMut() -> io::Result<bool>,
) -> io::Result<()> {
    // The sockets of the process serving on `path`, if one does.
    let handover = Handover::open(path)?;
    let options = ServerOptions { handover: Some(handover.clone()), ..Default::default() };
    let pid = std::process::id();
    let server = serve(rt.handle(), addr, options, move |stream| async move {
        // One request per connection, answered with this process's pid.
        let (n, _) = stream.read_owned(Vec::with_capacity(4096)).await;
        if matches!(n, Ok(n) if n > 0) {
            let body = format!("served by pid {pid}\n");
            let reply = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all_owned(reply.into_bytes()).await;
        }
    })?;
    serving(server.local_addr());
    // Serving: the predecessor, if any, stops accepting and drains.
    if let Err(e) = handover.ready() {
        // The predecessor goes on serving (it stopped waiting for this
        // process, say). What this one accepted meanwhile is answered
        // before it exits: returning now would drop the runtime and cut it.
        let drained = server.drain_blocking(DRAIN_TIMEOUT);
        eprintln!("pid {pid} does not take over ({e}); drained {} connections", drained.open);
        return Err(e);
    }
    match handover.predecessor() {
        Some(old) => eprintln!("pid {pid} took {} over from pid {old}", server.local_addr()),
        None => eprintln!(
            "pid {pid} serves {} and waits on {path} for a successor",
            server.local_addr()
        ),
    }

    // Until a successor has taken over, or a stop signal.
    while !handover.is_replaced() {
        if stop()? {
            handover.close();
            break;
        }
    }
    let drained = server.drain_blocking(DRAIN_TIMEOUT);
    eprintln!(
        "pid {pid} drained in {:?}: {} connections were open, {} cut",
        drained.took, drained.open, drained.cut
    );
    Ok(())
}
