//! QUIC on hotloop: quinn's runtime traits on hotloop's UDP sockets and
//! timer wheel (feature `quic`).
//!
//! One endpoint per worker: [`endpoint`] binds a UDP socket with
//! `SO_REUSEPORT` (and GRO, ECN, destination addresses, don't-fragment) on
//! the calling worker and starts a `quinn::Endpoint` on it whose tasks all
//! run on that worker. Call it on every worker (for example in
//! [`Runtime::block_on_all`](crate::Runtime::block_on_all)) with the same
//! address: the kernel spreads peers over the sockets by a hash of their
//! address, so a connection's datagrams always reach the worker that owns
//! it.
//!
//! ```no_run
//! # async fn f(server_config: quinn::ServerConfig) -> std::io::Result<()> {
//! let addr = "127.0.0.1:4433".parse().unwrap();
//! let endpoint = hotloop::quic::endpoint(addr, Some(server_config))?;
//! while let Some(incoming) = endpoint.accept().await {
//!     hotloop::spawn(async move {
//!         let _connection = incoming.await;
//!     });
//! }
//! # Ok(()) }
//! ```
//!
//! # Implementation notes
//! - quinn asks for `Send + Sync` sockets and `Send` futures, since its
//!   other runtimes move tasks between threads; hotloop's sockets are
//!   `!Send` (they hold their worker's driver). [`HotloopRuntime::spawn`]
//!   runs quinn's endpoint and connection drivers on the endpoint's own
//!   worker (via its inbox when called from another thread), so the socket
//!   is only ever used there. The socket and its write pollers sit in a
//!   wrapper that checks the thread on every use (a use from another thread
//!   panics and names the fix) and sends itself back to its worker to be
//!   dropped if its last reference goes away elsewhere.
//! - Timers are [`Sleep`]s on the worker's wheel; quinn resets a
//!   connection's timer on nearly every packet, which the wheel does in
//!   constant time.
//! - Receives are `recvmmsg` batches (with GRO, each buffer may hold many
//!   datagrams); sends are one `sendmsg` per transmit, with `UDP_SEGMENT`
//!   when quinn batches datagrams for GSO.
//! - quinn checks its anti-amplification budget only before starting a
//!   datagram and then lets a whole one go out, so a server answering an
//!   address that never replies sends up to a datagram more than three
//!   times what it received (RFC 9000 section 8 makes three times a hard
//!   limit). [`limit_amplification`] holds the socket itself to the limit
//!   for a peer while a handshake from it is unvalidated
//!   (`quic/amplification.rs`): the handshake's datagrams only, not those
//!   of another connection already established from the same address.
//! - Endpoints on the sockets of one `SO_REUSEPORT` group keep a client
//!   whose address changes (connection migration, a NAT rebinding) on the
//!   socket that owns its connection when started with [`group_configs`]:
//!   connection IDs that name their socket, and a BPF program on the group
//!   that steers by them (`quic/steer.rs`).

mod amplification;
mod steer;

pub use amplification::{limit_amplification, AmplificationLimit, AMPLIFICATION_FACTOR};
pub use steer::group_configs;

use std::fmt;
use std::future::Future;
use std::io::{self, IoSliceMut};
use std::mem::ManuallyDrop;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context as TaskContext, Poll, Waker};
use std::time::Instant;

use quinn::udp::{RecvMeta as QuinnRecvMeta, Transmit as QuinnTransmit};
use quinn::{AsyncTimer, AsyncUdpSocket, EndpointConfig, Runtime, ServerConfig, UdpPoller};
use send_wrapper::SendWrapper;

use crate::net::{EcnCodepoint, RecvMeta, Transmit, BATCH_DATAGRAMS_MAX};
use crate::net::{UdpOptions, UdpSocket};
use crate::runtime::current;
use crate::runtime::WorkerShared;
use crate::time::Sleep;

/// One send error in this many is logged.
const SEND_ERRORS_PER_LOG: u64 = 1000;

/// Binds a UDP socket for QUIC on the calling worker ([`UdpOptions::quic`]:
/// `SO_REUSEPORT`, GRO, ECN, destination addresses, don't-fragment) and
/// starts a quinn endpoint on it, a server if `server_config` is given.
///
/// # Panics
/// Outside a hotloop worker.
pub fn endpoint(
    addr: SocketAddr,
    server_config: Option<ServerConfig>,
) -> io::Result<quinn::Endpoint> {
    endpoint_with(addr, EndpointConfig::default(), server_config, &UdpOptions::quic())
}

/// [`endpoint`] with quinn's endpoint configuration and the socket options given.
///
/// # Panics
/// Outside a hotloop worker.
pub fn endpoint_with(
    addr: SocketAddr,
    config: EndpointConfig,
    server_config: Option<ServerConfig>,
    options: &UdpOptions,
) -> io::Result<quinn::Endpoint> {
    let runtime = HotloopRuntime::current();
    let socket = runtime.wrap(UdpSocket::bind_with(addr, options)?, None)?;
    quinn::Endpoint::new_with_abstract_socket(config, server_config, socket, runtime)
}

/// Starts a quinn endpoint on `socket`, a UDP socket already bound (one
/// a [`Handover`](crate::net::Handover) received from a predecessor, or
/// bound for it), on the calling worker, with the options of
/// [`UdpOptions::quic`] that apply after binding.
///
/// # Panics
/// Outside a hotloop worker.
pub fn endpoint_on(
    socket: std::net::UdpSocket,
    server_config: Option<ServerConfig>,
) -> io::Result<quinn::Endpoint> {
    endpoint_on_socket(socket, EndpointConfig::default(), server_config, None)
}

/// [`endpoint_on`] with quinn's endpoint configuration `config` (one of
/// [`group_configs`], say), except that the endpoint reads nothing from
/// `socket` until `gate` is opened: for a socket another process still
/// reads (a predecessor, at an upgrade), where two QUIC endpoints cannot
/// share the datagrams. Everything that can fail in starting the endpoint
/// is done here, before that process is told to stop.
///
/// # Panics
/// Outside a hotloop worker.
pub fn endpoint_on_gated(
    socket: std::net::UdpSocket,
    config: EndpointConfig,
    server_config: Option<ServerConfig>,
    gate: RecvGate,
) -> io::Result<quinn::Endpoint> {
    endpoint_on_socket(socket, config, server_config, Some(gate))
}

fn endpoint_on_socket(
    socket: std::net::UdpSocket,
    config: EndpointConfig,
    server_config: Option<ServerConfig>,
    gate: Option<RecvGate>,
) -> io::Result<quinn::Endpoint> {
    let runtime = HotloopRuntime::current();
    let socket = UdpSocket::from_std(socket)?;
    let v6 = socket.local_addr()?.is_ipv6();
    socket.configure(v6, &UdpOptions::quic())?;
    let socket = runtime.wrap(socket, gate)?;
    quinn::Endpoint::new_with_abstract_socket(config, server_config, socket, runtime)
}

/// Holds back the receives of the endpoints started with it
/// ([`endpoint_on_gated`]) until [`open`](Self::open), and stops them for
/// good at [`retire`](Self::retire). Cloning gives another handle on the
/// same gate.
#[derive(Debug, Clone, Default)]
pub struct RecvGate {
    inner: Arc<GateInner>,
}

#[derive(Debug, Default)]
struct GateInner {
    open: AtomicBool,
    retired: AtomicBool,
    /// The endpoints' tasks waiting for the gate to open.
    waiting: Mutex<Vec<Waker>>,
    /// The sockets started with the gate, each with its worker, for `retire`.
    sockets: Mutex<Vec<GatedSocket>>,
}

/// A socket started with a gate, stopped on its own worker.
struct GatedSocket {
    uid: u64,
    owner: Arc<WorkerShared>,
    socket: Weak<QuicSocket>,
}

impl fmt::Debug for GatedSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GatedSocket").field("worker", &self.uid).finish_non_exhaustive()
    }
}

impl RecvGate {
    /// A closed gate.
    pub fn new() -> RecvGate {
        RecvGate::default()
    }

    /// Lets the endpoints read, from any thread: each is woken.
    pub fn open(&self) {
        self.inner.open.store(true, Ordering::SeqCst);
        let waiting = std::mem::take(&mut *self.lock());
        for w in waiting {
            w.wake();
        }
    }

    /// True once opened.
    pub fn is_open(&self) -> bool {
        self.inner.open.load(Ordering::SeqCst)
    }

    /// Stops the endpoints' receives for good, from any thread: their
    /// sockets are read by another process now (a successor, at an
    /// upgrade), which must get every datagram. Sends go on, so an
    /// endpoint closed after this still sends its close packets.
    ///
    /// No receive reads a socket once this has begun. Each socket also
    /// stops on its worker ([`UdpSocket::stop_receiving`]: on io_uring its
    /// armed multishot receive, which would go on taking datagrams, is
    /// cancelled and what it queued dropped): those of the calling worker
    /// before this returns, the others at their worker's next turn. So call
    /// it on every worker that runs such an endpoint (as a task there) to
    /// know all have stopped when those calls return.
    pub fn retire(&self) {
        self.inner.retired.store(true, Ordering::SeqCst);
        let here = current::try_worker_uid();
        let mut sockets = self.inner.sockets.lock().unwrap_or_else(|e| e.into_inner());
        sockets.retain(|s| s.socket.strong_count() > 0);
        for s in sockets.iter() {
            if here == Some(s.uid) {
                if let Some(socket) = s.socket.upgrade() {
                    socket.stop_receiving();
                }
            } else {
                let socket = s.socket.clone();
                s.owner.push_runnable(Box::new(move || {
                    if let Some(socket) = socket.upgrade() {
                        socket.stop_receiving();
                    }
                }));
            }
        }
    }

    /// True once retired.
    pub fn is_retired(&self) -> bool {
        self.inner.retired.load(Ordering::SeqCst)
    }

    /// Files `socket`, started with this gate on worker `uid`, for [`Self::retire`].
    fn register(&self, uid: u64, owner: Arc<WorkerShared>, socket: Weak<QuicSocket>) {
        let mut sockets = self.inner.sockets.lock().unwrap_or_else(|e| e.into_inner());
        sockets.retain(|s| s.socket.strong_count() > 0);
        sockets.push(GatedSocket { uid, owner, socket });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Waker>> {
        self.inner.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn poll_open(&self, cx: &mut TaskContext<'_>) -> Poll<()> {
        if self.is_open() {
            return Poll::Ready(());
        }
        let mut waiting = self.lock();
        // Looked at again under the lock: `open` takes the wakers after it
        // sets the flag, so one filed now is woken.
        if self.is_open() {
            return Poll::Ready(());
        }
        if !waiting.iter().any(|w| w.will_wake(cx.waker())) {
            waiting.push(cx.waker().clone());
        }
        Poll::Pending
    }
}

/// quinn's [`Runtime`] for one hotloop worker: tasks and sockets it makes
/// live on that worker.
pub struct HotloopRuntime {
    owner: Arc<WorkerShared>,
    uid: u64,
}

impl HotloopRuntime {
    /// The runtime of the calling worker.
    ///
    /// # Panics
    /// Outside a hotloop worker.
    pub fn current() -> Arc<HotloopRuntime> {
        Arc::new(HotloopRuntime { owner: current::worker_shared(), uid: current::worker_uid() })
    }

    fn on_owner(&self) -> bool {
        current::try_worker_uid() == Some(self.uid)
    }

    fn wrap(
        &self,
        socket: UdpSocket,
        gate: Option<RecvGate>,
    ) -> io::Result<Arc<dyn AsyncUdpSocket>> {
        let socket = Arc::new(QuicSocket {
            gate: gate.clone(),
            local_addr: socket.local_addr()?,
            gso_segments_max: AtomicUsize::new(socket.max_gso_segments()),
            gro_segments_max: socket.max_gro_segments(),
            socket: Local::new(Rc::new(socket), self.owner.clone()),
            owner: self.owner.clone(),
            send_errors: AtomicU64::new(0),
            stopped: AtomicBool::new(false),
        });
        if let Some(gate) = gate {
            gate.register(self.uid, self.owner.clone(), Arc::downgrade(&socket));
        }
        Ok(socket)
    }
}

impl fmt::Debug for HotloopRuntime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HotloopRuntime").field("worker", &self.uid).finish()
    }
}

impl Runtime for HotloopRuntime {
    fn new_timer(&self, deadline: Instant) -> Pin<Box<dyn AsyncTimer>> {
        Box::pin(Timer(crate::time::sleep_until(deadline)))
    }

    fn spawn(&self, future: Pin<Box<dyn Future<Output = ()> + Send>>) {
        if self.on_owner() {
            crate::runtime::spawn_detached(future);
        } else {
            self.owner.push_runnable(Box::new(move || {
                crate::runtime::spawn_detached(future);
            }));
        }
    }

    /// Wraps a bound std socket on the calling worker, which must be this
    /// runtime's worker, with GRO, ECN and destination addresses on.
    fn wrap_udp_socket(&self, socket: std::net::UdpSocket) -> io::Result<Arc<dyn AsyncUdpSocket>> {
        if !self.on_owner() {
            return Err(io::Error::other(
                "a hotloop QUIC socket must be made on its endpoint's worker: \
                 rebind the endpoint from a task on that worker",
            ));
        }
        let socket = UdpSocket::from_std(socket)?;
        let v6 = socket.local_addr()?.is_ipv6();
        socket.configure(v6, &UdpOptions { reuse_port: false, ..UdpOptions::quic() })?;
        self.wrap(socket, None)
    }
}

/// A timer on the worker's wheel.
struct Timer(Sleep);

impl fmt::Debug for Timer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Timer").field("deadline", &self.0.deadline()).finish()
    }
}

impl AsyncTimer for Timer {
    fn reset(mut self: Pin<&mut Self>, deadline: Instant) {
        self.0.reset(deadline);
    }

    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<()> {
        Pin::new(&mut self.0).poll(cx)
    }
}

/// A value that stays on the worker that made it: using it on another
/// thread panics; dropping it on another thread sends it back to be dropped
/// there (or leaks it if that worker is gone).
struct Local<T: 'static> {
    value: Option<SendWrapper<T>>,
    owner: Arc<WorkerShared>,
}

impl<T: 'static> Local<T> {
    fn new(value: T, owner: Arc<WorkerShared>) -> Self {
        Local { value: Some(SendWrapper::new(value)), owner }
    }

    fn get(&self) -> &T {
        match &self.value {
            Some(v) if v.valid() => v,
            _ => panic!(
                "a hotloop QUIC socket was used on another thread than its worker's: \
                 drive quinn endpoints and connections from tasks on the endpoint's worker"
            ),
        }
    }

    fn get_mut(&mut self) -> &mut T {
        match &mut self.value {
            Some(v) if v.valid() => v,
            _ => panic!("a hotloop QUIC socket was used on another thread than its worker's"),
        }
    }
}

impl<T: 'static> Drop for Local<T> {
    fn drop(&mut self) {
        let Some(value) = self.value.take() else { return };
        if value.valid() {
            return drop(value);
        }
        // Dropped elsewhere: the worker drops it. If the worker is gone, its
        // inbox drops the closure unrun and `ManuallyDrop` leaks the value
        // rather than drop it on the wrong thread.
        let shipped = ManuallyDrop::new(value);
        self.owner.push_runnable(Box::new(move || drop(ManuallyDrop::into_inner(shipped))));
    }
}

/// quinn's socket: a hotloop [`UdpSocket`] that stays on its worker. What
/// quinn may ask from any thread (the address, the offload limits) is
/// copied out at creation.
struct QuicSocket {
    socket: Local<Rc<UdpSocket>>,
    owner: Arc<WorkerShared>,
    local_addr: SocketAddr,
    /// Datagrams per send (GSO), 1 once the kernel refused a segmented
    /// send (as quinn-udp does: `EIO` on a path without checksum offload
    /// or through IPsec, `EINVAL` with `SO_NO_CHECK`); quinn asks before
    /// every batch it builds.
    gso_segments_max: AtomicUsize,
    gro_segments_max: usize,
    /// Send errors other than `WouldBlock`, which are dropped (and logged now and then).
    send_errors: AtomicU64,
    /// Receives wait for it to open ([`endpoint_on_gated`]), and stop for
    /// good once it is retired.
    gate: Option<RecvGate>,
    /// The socket no longer receives ([`RecvGate::retire`]).
    stopped: AtomicBool,
}

impl QuicSocket {
    /// Stops the socket's receives for good; on its worker only.
    fn stop_receiving(&self) {
        if !self.stopped.swap(true, Ordering::SeqCst) {
            self.socket.get().stop_receiving();
        }
    }
}

impl fmt::Debug for QuicSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QuicSocket")
            .field("gso_segments_max", &self.gso_segments_max.load(Ordering::Relaxed))
            .field("gro_segments_max", &self.gro_segments_max)
            .finish()
    }
}

fn ecn_to_quinn(ecn: Option<EcnCodepoint>) -> Option<quinn::udp::EcnCodepoint> {
    ecn.and_then(|e| quinn::udp::EcnCodepoint::from_bits(e.bits()))
}

fn ecn_from_quinn(ecn: Option<quinn::udp::EcnCodepoint>) -> Option<EcnCodepoint> {
    ecn.and_then(|e| EcnCodepoint::from_bits(e as u8))
}

impl AsyncUdpSocket for QuicSocket {
    /// May run on any thread (quinn makes a poller when a connection is
    /// made, wherever `connect` or `accept` was called); the wait itself is
    /// made at the first poll, on the worker.
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        Box::pin(WritePoller { socket: self, waiting: None })
    }

    fn try_send(&self, t: &QuinnTransmit<'_>) -> io::Result<()> {
        let limit = amplification::transmit_allowance(
            self.local_addr,
            t.destination,
            t.contents,
            t.segment_size,
        );
        let (allowed, held) = (limit.unwrap_or(t.contents.len()), limit.is_some());
        if allowed == 0 {
            // Over the peer's amplification limit: lost, as far as quinn knows.
            return Ok(());
        }
        let transmit = Transmit {
            destination: t.destination,
            ecn: ecn_from_quinn(t.ecn),
            contents: &t.contents[..allowed],
            // One datagram is sent without `UDP_SEGMENT` (quinn-udp's rule):
            // a limit cut to one segment, or a batch of one.
            segment_size: t.segment_size.filter(|&size| size < allowed),
            src_ip: t.src_ip,
        };
        match self.socket.get().try_send_msg(&transmit) {
            Ok(()) => {
                if held {
                    amplification::amplification_sent(self.local_addr, t.destination, allowed);
                }
                Ok(())
            }
            Err(e)
                if transmit.segment_size.is_some()
                    && matches!(e.raw_os_error(), Some(libc::EIO | libc::EINVAL))
                    && self.gso_segments_max.swap(1, Ordering::Relaxed) > 1 =>
            {
                // The kernel cannot segment on this path: from now on quinn
                // builds one datagram per send. This batch is lost, as a
                // refused datagram is, and recovery sends it again.
                crate::log::warn(format_args!(
                    "QUIC to {}: the kernel refused a segmented send ({e}); sending one datagram at a time",
                    t.destination
                ));
                Ok(())
            }
            // As quinn-udp does: a datagram the kernel refused (a too-large
            // path MTU probe, a firewall's EPERM, ENOBUFS) is lost like any
            // other, and QUIC's recovery deals with it; an error here would
            // end the whole connection.
            Err(e) if e.kind() != io::ErrorKind::WouldBlock => {
                if self
                    .send_errors
                    .fetch_add(1, Ordering::Relaxed)
                    .is_multiple_of(SEND_ERRORS_PER_LOG)
                {
                    crate::log::warn(format_args!(
                        "QUIC datagram to {} not sent: {e} (logged once per {SEND_ERRORS_PER_LOG})",
                        t.destination
                    ));
                }
                Ok(())
            }
            r => r,
        }
    }

    fn poll_recv(
        &self,
        cx: &mut TaskContext<'_>,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [QuinnRecvMeta],
    ) -> Poll<io::Result<usize>> {
        if let Some(gate) = &self.gate {
            if gate.is_retired() {
                // Another process reads the socket now. Pending for good,
                // not an error: quinn ends an endpoint whose receive fails,
                // and a closing one still has close packets to send.
                self.stop_receiving();
                return Poll::Pending;
            }
            std::task::ready!(gate.poll_open(cx));
        }
        let mut got = [RecvMeta::default(); BATCH_DATAGRAMS_MAX];
        let n = meta.len().min(BATCH_DATAGRAMS_MAX);
        let received =
            std::task::ready!(self.socket.get().poll_recv_msgs(cx, bufs, &mut got[..n]))?;
        amplification::amplification_received(self.local_addr, &got[..received], bufs);
        for (out, m) in meta.iter_mut().zip(&got[..received]) {
            *out = QuinnRecvMeta {
                addr: m.addr,
                len: m.len,
                stride: m.stride,
                ecn: ecn_to_quinn(m.ecn),
                dst_ip: m.dst_ip,
            };
        }
        Poll::Ready(Ok(received))
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local_addr)
    }

    fn max_transmit_segments(&self) -> usize {
        self.gso_segments_max.load(Ordering::Relaxed)
    }

    fn max_receive_segments(&self) -> usize {
        self.gro_segments_max
    }

    fn may_fragment(&self) -> bool {
        false
    }
}

/// A wait for room to send, made on the socket's worker.
type WriteWait = Local<Pin<Box<dyn Future<Output = io::Result<()>>>>>;

/// quinn's write poller: one per connection, each with its own wait.
struct WritePoller {
    socket: Arc<QuicSocket>,
    waiting: Option<WriteWait>,
}

impl fmt::Debug for WritePoller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WritePoller").finish_non_exhaustive()
    }
}

impl UdpPoller for WritePoller {
    fn poll_writable(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let waiting = this.waiting.get_or_insert_with(|| {
            let socket = this.socket.socket.get().clone();
            Local::new(Box::pin(async move { socket.writable().await }), this.socket.owner.clone())
        });
        let ready = waiting.get_mut().as_mut().poll(cx);
        if ready.is_ready() {
            this.waiting = None;
        }
        ready
    }
}
