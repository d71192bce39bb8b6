//! Amplification limits: what a server sends to a peer whose handshake is
//! unvalidated, held to three times what it received from the peer
//! ([`limit_amplification`]), counted by the socket as datagrams go out
//! and come in. The budgets are per worker (thread-local): a worker's
//! sockets and its accept loops run on its thread.

use std::cell::RefCell;
use std::collections::HashMap;
use std::io::{self, IoSliceMut};
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::net::RecvMeta;
use crate::runtime::current;

/// Before a peer's address is validated a server may send it at most this
/// many times the bytes it has received from it (RFC 9000 section 8).
pub const AMPLIFICATION_FACTOR: u64 = 3;
/// What a handshake's datagrams count for when its limit starts and none
/// of them was counted (its sender fell out of [`EARLY`]): the least a
/// server accepts a client's first datagram with (RFC 9000 section 14.1),
/// so the count only ever errs low.
const INITIAL_DATAGRAM_MIN_BYTES: u64 = 1200;
/// How long a sender's early Initial bytes wait for its limit to start.
const EARLY_KEEP: Duration = Duration::from_secs(1);
/// The most senders whose early Initial bytes a worker keeps: a flood of
/// Initials from new addresses holds no more (those past it count as one
/// minimal datagram when their limit starts, as before).
const EARLY_SENDERS_MAX: usize = 1024;
/// The most connection IDs a budget keeps for its handshakes' short-header
/// datagrams (see [`Budget::holds`]); those of more handshakes from one
/// address at once go unheld, within quinn's own limit.
const HANDSHAKE_CIDS_MAX: usize = 8;
/// The longest connection ID (RFC 9000 section 17.2).
const CID_BYTES_MAX: usize = 20;

/// A peer held to [`AMPLIFICATION_FACTOR`]: what it sent and was sent.
struct Budget {
    /// The [`AmplificationLimit`]s held for it (handshakes in progress).
    holders: u32,
    received: u64,
    sent: u64,
    /// The connection IDs the server's long-header datagrams to the peer
    /// named as their destination: its handshakes' (see [`Budget::holds`]).
    cids: Vec<Vec<u8>>,
}

impl Budget {
    fn new() -> Budget {
        Budget { holders: 0, received: 0, sent: 0, cids: Vec::new() }
    }

    /// Whether the datagrams of `contents` (a transmit) are the peer's
    /// handshakes', which the budget holds: a long header (quinn puts the
    /// packets of a datagram, and the datagrams of a batch, in the order
    /// Initial, Handshake, 1-RTT, so a batch holding one starts with one),
    /// whose destination connection ID is noted as a handshake's; or a
    /// short header to a connection ID so noted (a handshake's 1-RTT
    /// packets before it completes). The short headers of another
    /// connection from the same address (one established, which a spoofed
    /// Initial or the client's second connection comes beside) name
    /// another ID and go out unheld. A handshake with a zero-length ID has
    /// short headers that name none: those go unheld too (quinn's own
    /// check still bounds them).
    fn holds(&mut self, contents: &[u8]) -> bool {
        let Some(&first) = contents.first() else { return false };
        if !starts_with_long_header(first) {
            return self.cids.iter().any(|c| contents.get(1..=c.len()) == Some(&c[..]));
        }
        if let Some(cid) = long_header_dcid(contents).filter(|c| !c.is_empty()) {
            if self.cids.len() < HANDSHAKE_CIDS_MAX && !self.cids.iter().any(|c| c[..] == *cid) {
                self.cids.push(cid.to_vec());
            }
        }
        true
    }

    /// How many of `len` bytes (datagrams of `segment` bytes, the last
    /// maybe shorter) may go out, in whole datagrams.
    fn allowance(&self, len: usize, segment: Option<usize>) -> usize {
        let left = (self.received * AMPLIFICATION_FACTOR).saturating_sub(self.sent);
        if len as u64 <= left {
            len
        } else {
            let segment = segment.unwrap_or(len).max(1);
            (left as usize / segment) * segment
        }
    }
}

/// The bytes of Initial datagrams from one sender that has no budget yet.
struct Early {
    received: u64,
    /// When its first such datagram came.
    since: Instant,
}

/// The senders of Initial datagrams whose limit has not started: their
/// datagrams come before the accept loop takes the handshake (a
/// ClientHello over two datagrams, often both in one receive batch), and
/// [`limit_amplification`] starts the budget from their sum.
#[derive(Default)]
struct EarlySenders {
    senders: HashMap<(SocketAddr, SocketAddr), Early>,
    /// The last sweep of stale senders, made only once the table is full.
    swept: Option<Instant>,
}

impl EarlySenders {
    /// Counts `len` bytes of an Initial datagram from `key`'s sender.
    fn note(&mut self, key: (SocketAddr, SocketAddr), len: u64) {
        let now = Instant::now();
        if let Some(e) = self.senders.get_mut(&key) {
            if now.duration_since(e.since) < EARLY_KEEP {
                e.received += len;
            } else {
                *e = Early { received: len, since: now };
            }
            return;
        }
        if self.senders.len() >= EARLY_SENDERS_MAX {
            // At most one sweep a quarter of the keep time: a flood costs no
            // scan per datagram.
            if self.swept.is_some_and(|t| now.duration_since(t) < EARLY_KEEP / 4) {
                return;
            }
            self.swept = Some(now);
            self.senders.retain(|_, e| now.duration_since(e.since) < EARLY_KEEP);
            if self.senders.len() >= EARLY_SENDERS_MAX {
                return;
            }
        }
        self.senders.insert(key, Early { received: len, since: now });
    }

    /// Takes what `key`'s sender sent lately, if anything was counted.
    fn take(&mut self, key: (SocketAddr, SocketAddr)) -> Option<u64> {
        let e = self.senders.remove(&key)?;
        (e.since.elapsed() < EARLY_KEEP).then_some(e.received)
    }
}

thread_local! {
    /// The peers this worker's QUIC sockets answer under an amplification
    /// limit, by (local address, peer address). A worker's sockets and its
    /// accept loops run on the worker's thread, so no lock is needed; it is
    /// empty (one check per batch) unless handshakes are unvalidated.
    static UNVALIDATED: RefCell<HashMap<(SocketAddr, SocketAddr), Budget>> =
        RefCell::new(HashMap::new());
    /// Initial bytes from senders not in `UNVALIDATED` yet.
    static EARLY: RefCell<EarlySenders> = RefCell::new(EarlySenders::default());
}

/// Whether a datagram starting with `first` starts with an Initial packet
/// (a long header of type 0, RFC 9000 section 17.2.2; the type bits are
/// not header-protected).
fn starts_with_initial(first: u8) -> bool {
    first & 0xb0 == 0x80
}

/// Whether a datagram starting with `first` starts with a long-header
/// packet (RFC 9000 section 17.2; the form bit is not header-protected):
/// a handshake's Initial, 0-RTT or Handshake packet, a Retry or a version
/// negotiation. Once a connection's handshake is done, its datagrams
/// start with a short header.
fn starts_with_long_header(first: u8) -> bool {
    first & 0x80 != 0
}

/// The destination connection ID of the long-header packet `d` starts
/// with (after the first byte and the version; not protected), if whole.
fn long_header_dcid(d: &[u8]) -> Option<&[u8]> {
    let len = usize::from(*d.get(5)?);
    (len <= CID_BYTES_MAX).then_some(())?;
    d.get(6..6 + len)
}

/// The bytes of the long-header datagrams among the `len` bytes of `buf`
/// (datagrams of `stride` bytes, the last maybe shorter, as GRO gives
/// them): what counts towards an amplification budget.
fn long_header_bytes(buf: &[u8], len: usize, stride: usize) -> u64 {
    let len = len.min(buf.len());
    buf[..len]
        .chunks(stride.max(1))
        .filter(|d| d.first().is_some_and(|&b| starts_with_long_header(b)))
        .map(|d| d.len() as u64)
        .sum()
}

/// Holds what `endpoint` sends to one peer to [`AMPLIFICATION_FACTOR`] times
/// what it has received from that peer until dropped (the Initial
/// datagrams that came before are counted by their size: each worker keeps
/// that count for up to 1,024 senders for a second; a sender not kept
/// counts as one 1,200-byte datagram); datagrams beyond it are dropped by the
/// socket, as a lost datagram is, and recovered by QUIC once the peer
/// answers. Only the handshakes' datagrams are held: long headers, and
/// short headers to a connection ID the server's long headers to the peer
/// named; a connection already established from the same address
/// (another of the client's, or the one whose address a spoofed Initial
/// borrows) names another, and its traffic goes out whole. Only
/// long-header datagrams from the peer count as received (what its
/// handshakes send before they complete). Take one for a handshake whose address quinn has not validated
/// (`Incoming::remote_address_validated`) before accepting it, and drop it
/// when the handshake has ended either way; several for one peer share its
/// budget.
///
/// quinn applies the same limit but checks it only before each datagram,
/// and so sends up to one datagram more; this makes the limit exact.
///
/// Call it on the worker that runs `endpoint` (where its `accept` is
/// awaited) and drop it there: the limits are kept per worker.
///
/// # Panics
/// Outside a hotloop worker.
pub fn limit_amplification(
    endpoint: &quinn::Endpoint,
    remote: SocketAddr,
) -> io::Result<AmplificationLimit> {
    // The limits live with the worker's sockets; a thread without them would keep one in vain.
    current::assert_on_worker();
    let key = (endpoint.local_addr()?, remote);
    let early = EARLY.with(|e| e.borrow_mut().take(key));
    UNVALIDATED.with(|t| {
        let mut t = t.borrow_mut();
        let b = t.entry(key).or_insert_with(Budget::new);
        if b.holders == 0 {
            // A new budget; with one already held, every datagram from the
            // peer, this handshake's too, was counted as it came.
            b.received += early.unwrap_or(0).max(INITIAL_DATAGRAM_MIN_BYTES);
        }
        b.holders += 1;
    });
    Ok(AmplificationLimit { key, _on_worker: PhantomData })
}

/// A peer's amplification limit, lifted when the last one for it is
/// dropped (see [`limit_amplification`]).
#[derive(Debug)]
pub struct AmplificationLimit {
    key: (SocketAddr, SocketAddr),
    /// The limit is the worker's: it is dropped where it was taken.
    _on_worker: PhantomData<*const ()>,
}

impl Drop for AmplificationLimit {
    fn drop(&mut self) {
        UNVALIDATED.with(|t| {
            let mut t = t.borrow_mut();
            if let Some(b) = t.get_mut(&self.key) {
                b.holders -= 1;
                if b.holders == 0 {
                    t.remove(&self.key);
                }
            }
        });
    }
}

/// How many of `len` bytes to `remote` (datagrams of `segment` bytes, the
/// last maybe shorter) may go out under its amplification limit, in whole
/// datagrams; what goes out is charged by [`amplification_sent`].
#[cfg(test)]
fn amplification_allowance(
    local: SocketAddr,
    remote: SocketAddr,
    len: usize,
    segment: Option<usize>,
) -> usize {
    UNVALIDATED
        .with(|t| t.borrow().get(&(local, remote)).map_or(len, |b| b.allowance(len, segment)))
}

/// What may go out of a transmit of `contents` (datagrams of `segment`
/// bytes) to `remote`: `None` if it is not held to a limit (no handshake
/// from `remote` is unvalidated, or its datagrams are another
/// connection's: [`Budget::holds`]), else how many bytes, in whole
/// datagrams; what goes out is charged by [`amplification_sent`].
pub(super) fn transmit_allowance(
    local: SocketAddr,
    remote: SocketAddr,
    contents: &[u8],
    segment: Option<usize>,
) -> Option<usize> {
    UNVALIDATED.with(|t| {
        let mut t = t.borrow_mut();
        if t.is_empty() {
            return None;
        }
        let b = t.get_mut(&(local, remote))?;
        b.holds(contents).then(|| b.allowance(contents.len(), segment))
    })
}

/// Charges `sent` bytes, which the kernel took, to the peer's
/// amplification limit. Only a send that went out counts: quinn sends a
/// transmit that met a full socket (`WouldBlock`) again, and charging each
/// try would spend an unvalidated peer's budget on nothing.
pub(super) fn amplification_sent(local: SocketAddr, remote: SocketAddr, sent: usize) {
    UNVALIDATED.with(|t| {
        let mut t = t.borrow_mut();
        if let Some(b) = t.get_mut(&(local, remote)) {
            b.sent += sent as u64;
        }
    });
}

/// Counts received long-header datagrams (`got`, in `bufs`) towards their
/// senders' amplification limits, or, for an Initial from a sender with no
/// limit yet, in [`EARLY`] for the limit its handshake may take.
pub(super) fn amplification_received(local: SocketAddr, got: &[RecvMeta], bufs: &[IoSliceMut<'_>]) {
    UNVALIDATED.with(|t| {
        let mut t = t.borrow_mut();
        for (m, buf) in got.iter().zip(bufs) {
            let budget = if t.is_empty() { None } else { t.get_mut(&(local, m.addr)) };
            match budget {
                Some(b) => b.received += long_header_bytes(buf, m.len, m.stride),
                None if buf.first().is_some_and(|&b| starts_with_initial(b)) => {
                    EARLY.with(|e| e.borrow_mut().note((local, m.addr), m.len as u64));
                }
                None => {}
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A transmit quinn asks to send again after the socket was full is
    /// charged once, when it goes out.
    #[test]
    fn a_send_retried_after_a_full_socket_is_charged_once() {
        let local: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let remote: SocketAddr = "127.0.0.1:2".parse().unwrap();
        let budget = Budget { holders: 1, received: 1_200, ..Budget::new() };
        UNVALIDATED.with(|t| t.borrow_mut().insert((local, remote), budget));
        // Three times 1,200 may go out; the same 1,200 met a full socket twice.
        for _ in 0..3 {
            assert_eq!(amplification_allowance(local, remote, 1_200, None), 1_200);
        }
        amplification_sent(local, remote, 1_200);
        assert_eq!(amplification_allowance(local, remote, 3_600, Some(1_200)), 2_400);
        UNVALIDATED.with(|t| t.borrow_mut().clear());
    }

    /// A budget spent to its limit holds back its handshakes' datagrams:
    /// long headers, and short headers to the connection ID a long header
    /// to the peer named; not those of another connection from the same
    /// address (short headers to another ID). Only long-header datagrams
    /// from the peer fill it. Before, every datagram to the address was
    /// held: an unvalidated Initial from the address of a connection cut
    /// that connection's traffic to three times what the address sent
    /// until the handshake ended.
    #[test]
    fn only_the_handshakes_datagrams_are_held_and_counted() {
        let local: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let remote: SocketAddr = "127.0.0.1:3".parse().unwrap();
        let budget = Budget { holders: 1, received: 1_200, ..Budget::new() };
        UNVALIDATED.with(|t| t.borrow_mut().insert((local, remote), budget));
        let handshake_cid = [0xaa; 8];
        // An Initial to the handshake's client: 0xc3, version 1, its ID.
        let mut long = vec![0xc3, 0, 0, 0, 1, 8];
        long.extend_from_slice(&handshake_cid);
        long.resize(1_200, 0);
        let short_to = |cid: &[u8]| {
            let mut d = vec![0x43];
            d.extend_from_slice(cid);
            d.resize(3 * 1_200, 0);
            d
        };
        assert_eq!(transmit_allowance(local, remote, &long, None), Some(1_200));
        amplification_sent(local, remote, 3_600);
        assert_eq!(transmit_allowance(local, remote, &long, None), Some(0));
        // The handshake's 1-RTT datagrams are held; another connection's are not.
        assert_eq!(transmit_allowance(local, remote, &short_to(&handshake_cid), None), Some(0));
        assert_eq!(transmit_allowance(local, remote, &short_to(&[0xbb; 8]), Some(1_200)), None);
        let other: SocketAddr = "127.0.0.1:4".parse().unwrap();
        assert_eq!(transmit_allowance(local, other, &long, None), None);
        UNVALIDATED.with(|t| t.borrow_mut().clear());

        // A GRO buffer of three datagrams: long, short, long (the last shorter).
        let mut buf = vec![0xc3u8; 100];
        buf.extend_from_slice(&[0x43; 100]);
        buf.extend_from_slice(&[0xe3; 50]);
        assert_eq!(long_header_bytes(&buf, buf.len(), 100), 150);
        assert_eq!(long_header_bytes(&buf[100..], 150, 100), 50);
        assert_eq!(long_header_bytes(&buf, 100, 100), 100);
    }

    /// A sender's Initial datagrams that came before its limit are summed
    /// for it, once; the table of such senders stays bounded.
    #[test]
    fn early_initials_are_summed_and_bounded() {
        let local: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let remote: SocketAddr = "127.0.0.1:2".parse().unwrap();
        let mut early = EarlySenders::default();
        early.note((local, remote), 1_250);
        early.note((local, remote), 1_300);
        assert_eq!(early.take((local, remote)), Some(2_550));
        assert_eq!(early.take((local, remote)), None);
        for port in 0..EARLY_SENDERS_MAX + 10 {
            early.note((local, SocketAddr::new(remote.ip(), port as u16)), 1_200);
        }
        assert_eq!(early.senders.len(), EARLY_SENDERS_MAX);
        assert!(
            starts_with_initial(0xc3) && !starts_with_initial(0xe3) && !starts_with_initial(0x43)
        );
    }
}
