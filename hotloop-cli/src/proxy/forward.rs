//! One proxied TCP connection: the bytes both ways, the idle timeout, and
//! how the connection ends.
//!
//! Both directions ending cleanly close both sockets normally. The idle
//! timeout, a drain's deadline, or a failure on both sides resets both
//! (`SO_LINGER` 0, then close).
//!
//! One side failing (a reset, or an error reading or writing it) is passed
//! on to the other side, the survivor, after every byte already forwarded
//! to it, as the failed peer's own kernel would have delivered them had
//! the survivor been connected to it directly (data that came before a
//! reset is still read). The failed side is reset at once; nothing more
//! goes to it, and what it sent before its failure is still forwarded.
//! Then the proxy waits until the survivor has acknowledged everything
//! forwarded to it, for as long as it keeps acknowledging within the idle
//! timeout, and resets it, so the failure stays visible; but if the
//! direction toward the survivor had ended cleanly before the failure, the
//! survivor already has its clean end, and the close is a normal one.
//! Resetting at once would purge the socket's send queue: to a client that
//! reads slowly, megabytes already counted as forwarded.
//!
//! Each direction reads with `read_pooled`, so an idle proxied connection
//! holds no buffer: one task (both directions and the idle timer are
//! futures inside it) and its two sockets.

use std::cell::Cell;
use std::future::{poll_fn, Future};
use std::io;
use std::net::Shutdown;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use hotloop::net::TcpStream;
use hotloop::time::{sleep, sleep_until, timeout};

use super::{connect_backend, ProxyConfig};

/// Forwards one client connection.
pub async fn forward(client: TcpStream, config: Arc<ProxyConfig>) {
    let Some(backend) = connect_backend(&config).await else {
        config.counters.no_backend.fetch_add(1, Relaxed);
        return; // dropping the client closes it cleanly
    };
    config.counters.forwarded.fetch_add(1, Relaxed);
    // Declared before the futures awaited below, so it drops after them:
    // whatever ends this future before a close below (a drain's deadline
    // dropping the connection's task at a wait) resets both sides.
    let mut sockets = Sockets([Some(client), Some(backend)]);
    let end = relay(sockets.get(Side::Client), sockets.get(Side::Backend), &config).await;
    match end {
        End::Clean => {
            sockets.close(Side::Client, false);
            sockets.close(Side::Backend, false);
        }
        End::Cut => {} // dropping `sockets` resets both
        End::Failed { side, survivor_ended } => {
            sockets.close(side, true);
            let survivor = side.other();
            let delivered = deliver(sockets.get(survivor), config.idle_timeout).await;
            sockets.close(survivor, !(delivered && survivor_ended));
        }
    }
}

/// One of a proxied connection's two sockets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Client = 0,
    Backend = 1,
}

impl Side {
    fn other(self) -> Side {
        match self {
            Side::Client => Side::Backend,
            Side::Backend => Side::Client,
        }
    }
}

/// A proxied connection's sockets, by [`Side`]. A socket still here when
/// this drops is reset: neither peer may read a clean end of stream after
/// a cut (a truncated download would look whole).
struct Sockets([Option<TcpStream>; 2]);

impl Sockets {
    fn get(&self, side: Side) -> &TcpStream {
        self.0[side as usize].as_ref().expect("a socket is used only before its close")
    }

    /// Closes `side` now: with a reset if `reset`, else normally (a FIN
    /// after what is still queued).
    fn close(&mut self, side: Side, reset: bool) {
        if let Some(s) = self.0[side as usize].take() {
            if reset {
                // It fails only where the option cannot be set at all (a
                // direct io_uring socket out of descriptors, on a kernel
                // that sets it only through one): nothing else to try.
                let _ = s.set_linger(Some(Duration::ZERO));
            }
        }
    }
}

impl Drop for Sockets {
    fn drop(&mut self) {
        self.close(Side::Client, true);
        self.close(Side::Backend, true);
    }
}

/// How the forwarding of both directions ended.
enum End {
    /// Both directions passed their source's clean end on.
    Clean,
    /// The idle timeout, or both sides failed: reset both.
    Cut,
    /// `side` failed; the direction toward the other side has ended too.
    /// `survivor_ended`: it had ended cleanly before the failure.
    Failed { side: Side, survivor_ended: bool },
}

/// Copies both ways until both directions end, one side fails, or the
/// idle timeout passes with nothing moving. After a failure, the direction
/// toward the failed side is dropped and the other runs to its end: the
/// bytes the failed side sent before its failure still go on.
async fn relay(client: &TcpStream, backend: &TcpStream, config: &ProxyConfig) -> End {
    let counters = &config.counters;
    let moved = Cell::new(Instant::now());
    let mut up = pin!(Some(copy(client, backend, &counters.bytes_up, &moved)));
    let mut down = pin!(Some(copy(backend, client, &counters.bytes_down, &moved)));
    // By the side each direction writes to: it passed its source's clean
    // end on before any failure.
    let mut clean = [false; 2];
    let mut failed: Option<Side> = None;
    let mut idle = pin!(config.idle_timeout.map(|t| sleep_until(moved.get() + t)));
    poll_fn(|cx| {
        for to in [Side::Backend, Side::Client] {
            let mut direction = match to {
                Side::Backend => up.as_mut(),
                Side::Client => down.as_mut(),
            };
            let Some(copy) = direction.as_mut().as_pin_mut() else { continue };
            let Poll::Ready(ended) = copy.poll(cx) else { continue };
            direction.set(None);
            let failing = match ended {
                Ended::Eof => {
                    // An end read after a failure is not taken as clean:
                    // after a reset the kernel reports the end of stream
                    // once another call has taken the reset's error.
                    clean[to as usize] = failed.is_none();
                    continue;
                }
                Ended::ReadFailed => to.other(),
                Ended::WriteFailed => to,
            };
            match failed {
                Some(side) if side != failing => return Poll::Ready(End::Cut),
                Some(_) => {}
                None => {
                    failed = Some(failing);
                    // Nothing more goes to the failed side.
                    match failing {
                        Side::Backend => up.set(None),
                        Side::Client => down.set(None),
                    }
                }
            }
        }
        if up.is_none() && down.is_none() {
            return Poll::Ready(match failed {
                None => End::Clean,
                Some(side) => End::Failed { side, survivor_ended: clean[side.other() as usize] },
            });
        }
        if let (Some(mut sleep), Some(t)) = (idle.as_mut().as_pin_mut(), config.idle_timeout) {
            while sleep.as_mut().poll(cx).is_ready() {
                let due = moved.get() + t;
                if Instant::now() >= due {
                    return Poll::Ready(End::Cut);
                }
                sleep.as_mut().reset(due);
            }
        }
        Poll::Pending
    })
    .await
}

/// How one direction ended.
enum Ended {
    /// The source closed its side; the half-close was passed on.
    Eof,
    /// Reading the source failed (a reset, or an error).
    ReadFailed,
    /// Writing to the destination, or passing the end on, failed.
    WriteFailed,
}

/// Copies `from` to `to` until EOF, then half-closes `to`; notes each
/// read and write that finishes in `moved`.
async fn copy(
    from: &TcpStream,
    to: &TcpStream,
    counter: &AtomicU64,
    moved: &Cell<Instant>,
) -> Ended {
    loop {
        // A buffer is taken only once data is there: idle, this holds none.
        let Ok(buf) = from.read_pooled().await else { return Ended::ReadFailed };
        moved.set(Instant::now());
        if buf.is_empty() {
            return match to.shutdown_with(Shutdown::Write).await {
                Ok(()) => Ended::Eof,
                Err(_) => Ended::WriteFailed,
            };
        }
        counter.fetch_add(buf.len() as u64, Relaxed);
        let (res, _) = to.write_all_owned(buf).await;
        if res.is_err() {
            return Ended::WriteFailed;
        }
        moved.set(Instant::now());
    }
}

/// The first wait between two looks at what the survivor of a failure has
/// not acknowledged; each further wait doubles, up to [`ACK_LOOK_MAX`].
const ACK_LOOK_FIRST: Duration = Duration::from_millis(1);
/// The longest wait between two looks: the survivor's close comes at most
/// this long after its last acknowledgement.
const ACK_LOOK_MAX: Duration = Duration::from_millis(20);

/// After the other side failed: waits until `to` has acknowledged every
/// byte forwarded to it (`SIOCOUTQ` at zero: its FIN too, if it was sent).
/// True once it has; false if it acknowledged nothing for the idle
/// timeout, its own side failed, or the kernel could not say.
///
/// What `to` still sends is read and dropped, as there is nowhere to
/// forward it: a reset of `to` then shows as a failed read (the count of
/// unacknowledged bytes stays as it was after a reset, so it alone would
/// keep the wait going to the idle timeout).
async fn deliver(to: &TcpStream, idle: Option<Duration>) -> bool {
    let probe = to.input_probe();
    let mut reading = pin!(Some(discard(to)));
    let (mut left, mut progress) = (usize::MAX, Instant::now());
    let mut wait = ACK_LOOK_FIRST;
    loop {
        match probe.unacknowledged_output() {
            Ok(0) => return true,
            Ok(n) if n < left => (left, progress) = (n, Instant::now()),
            Ok(_) => {}
            Err(_) => return false,
        }
        if idle.is_some_and(|t| progress.elapsed() >= t) {
            return false;
        }
        match reading.as_mut().as_pin_mut() {
            Some(read) => match timeout(wait, read).await {
                Ok(Ok(())) => reading.set(None), // its end: nothing more to read
                Ok(Err(_)) => return false,
                Err(_) => {}
            },
            None => sleep(wait).await,
        }
        wait = (wait * 2).min(ACK_LOOK_MAX);
    }
}

/// Reads and drops what `from` sends, to its end (`Ok`) or an error.
async fn discard(from: &TcpStream) -> io::Result<()> {
    while !from.read_pooled().await?.is_empty() {}
    Ok(())
}
