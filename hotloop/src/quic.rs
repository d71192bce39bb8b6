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

use std::fmt;
use std::future::Future;
use std::io::{self, IoSliceMut};
use std::mem::ManuallyDrop;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::Instant;

use quinn::udp::{RecvMeta as QuinnRecvMeta, Transmit as QuinnTransmit};
use quinn::{AsyncTimer, AsyncUdpSocket, EndpointConfig, Runtime, ServerConfig, UdpPoller};
use send_wrapper::SendWrapper;

use crate::net::udp::{EcnCodepoint, RecvMeta, Transmit, BATCH_DATAGRAMS_MAX};
use crate::net::{UdpOptions, UdpSocket};
use crate::runtime::context;
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
    let socket = runtime.wrap(UdpSocket::bind_with(addr, options)?)?;
    quinn::Endpoint::new_with_abstract_socket(config, server_config, socket, runtime)
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
        context::with(|cx| Arc::new(HotloopRuntime { owner: cx.shared.clone(), uid: cx.uid }))
    }

    fn on_owner(&self) -> bool {
        context::try_with(|cx| cx.uid == self.uid).unwrap_or(false)
    }

    fn wrap(&self, socket: UdpSocket) -> io::Result<Arc<dyn AsyncUdpSocket>> {
        Ok(Arc::new(QuicSocket {
            local_addr: socket.local_addr()?,
            gso_segments_max: socket.max_gso_segments(),
            gro_segments_max: socket.max_gro_segments(),
            socket: Local::new(Rc::new(socket), self.owner.clone()),
            owner: self.owner.clone(),
            send_errors: AtomicU64::new(0),
        }))
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
        self.wrap(socket)
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
    gso_segments_max: usize,
    gro_segments_max: usize,
    /// Send errors other than `WouldBlock`, which are dropped (and logged now and then).
    send_errors: AtomicU64,
}

impl fmt::Debug for QuicSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QuicSocket")
            .field("gso_segments_max", &self.gso_segments_max)
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
        let transmit = Transmit {
            destination: t.destination,
            ecn: ecn_from_quinn(t.ecn),
            contents: t.contents,
            segment_size: t.segment_size,
            src_ip: t.src_ip,
        };
        match self.socket.get().try_send_msg(&transmit) {
            // As quinn-udp does: a datagram the kernel refused (a too-large
            // path MTU probe, a firewall's EPERM, ENOBUFS) is lost like any
            // other, and QUIC's recovery deals with it; an error here would
            // end the whole connection.
            Err(e) if e.kind() != io::ErrorKind::WouldBlock => {
                if self.send_errors.fetch_add(1, Ordering::Relaxed) % SEND_ERRORS_PER_LOG == 0 {
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
        let mut got = [RecvMeta::default(); BATCH_DATAGRAMS_MAX];
        let n = meta.len().min(BATCH_DATAGRAMS_MAX);
        let received =
            std::task::ready!(self.socket.get().poll_recv_msgs(cx, bufs, &mut got[..n]))?;
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
        self.gso_segments_max
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
