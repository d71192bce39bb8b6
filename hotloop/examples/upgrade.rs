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
//! SIGTERM or SIGINT drains the server and exits without a successor.

use std::io;
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
    let rt = Runtime::new()?;

    // The sockets of the process serving on `path`, if one does.
    let handover = Handover::open(&path)?;
    let options = ServerOptions { handover: Some(handover.clone()), ..Default::default() };
    let pid = std::process::id();
    let server = serve(rt.handle(), addr.as_str(), options, move |stream| async move {
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
    // Serving: the predecessor, if any, stops accepting and drains.
    handover.ready()?;
    match handover.predecessor() {
        Some(old) => eprintln!("pid {pid} took {} over from pid {old}", server.local_addr()),
        None => eprintln!(
            "pid {pid} serves {} and waits on {path} for a successor",
            server.local_addr()
        ),
    }

    // Until a successor has taken over, or a stop signal.
    while !handover.is_replaced() {
        if let Some(sig) = signals.wait_timeout(Duration::from_millis(50))? {
            if sig.is_stop() {
                handover.close();
                break;
            }
        }
    }
    let drained = server.drain_blocking(DRAIN_TIMEOUT);
    eprintln!(
        "pid {pid} drained in {:?}: {} connections were open, {} cut",
        drained.took, drained.open, drained.cut
    );
    Ok(())
}
