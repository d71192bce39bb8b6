//! UDP echo, side by side: hotloop (epoll, io_uring) against tokio's
//! `UdpSocket` and a raw-syscall floor, one server thread each, 1,200-byte
//! datagrams, with and without GSO/GRO.
//!
//! ```sh
//! cargo bench -p hotloop --bench udp_echo -- [SECONDS] [ROUNDS]
//! ```
//!
//! Each server runs on its own thread in this process; one load thread
//! (raw `sendmmsg`/`recvmmsg`, or GSO sends and GRO receives in the GSO
//! rows) keeps a window of datagrams in flight and counts the echoes.
//! Server CPU is the server thread's on-CPU time from
//! `/proc/self/task/TID/schedstat`, which includes the kernel's work on
//! the thread's behalf (loopback delivers each echo in the sender's
//! context). Rows run interleaved, `ROUNDS` times; the table shows the
//! median round. `UDP_ECHO_SERVERS=uring,uring-plain,...` picks the rows
//! (`epoll`, `uring`, `uring-plain`, `uring-owned`, `uring-owned-plain`,
//! `tokio`, `floor`; all by default). The `-plain` rows run the io_uring
//! server with `HOTLOOP_URING_MULTISHOT_RECVMSG=0`: receives through
//! `recvmmsg`/`RECVMSG` instead of the multishot `RECVMSG` queue.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

use std::future::poll_fn;
use std::io::{self, IoSliceMut};
use std::mem::zeroed;
use std::net::{SocketAddr, UdpSocket as StdUdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use hotloop::net::{RecvMeta, Transmit, BATCH_DATAGRAMS_MAX};
use hotloop::net::{UdpOptions, UdpSocket};

/// Bytes per datagram.
const PAYLOAD_BYTES: usize = 1200;
/// Datagrams the load keeps in flight.
const WINDOW_DATAGRAMS: usize = 256;
/// Datagrams per load batch (one `sendmmsg`, or one GSO send).
const LOAD_BATCH_DATAGRAMS: usize = 32;
/// Receive buffer per GRO receive (64 datagrams).
const GRO_BUFFER_BYTES: usize = 64 * PAYLOAD_BYTES;
/// How long the load waits for an echo before it counts the window as lost.
const LOSS_TIMEOUT: Duration = Duration::from_millis(20);
/// Socket buffers of every server and of the load.
const SOCKET_BUFFER_BYTES: usize = 4 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Server {
    HotloopEpoll,
    HotloopUring,
    /// io_uring with the owned-buffer forms: one RECVMSG and one SENDMSG
    /// ring operation per datagram.
    HotloopUringOwned,
    /// [`Server::HotloopUring`] without multishot `RECVMSG`.
    HotloopUringPlain,
    /// [`Server::HotloopUringOwned`] without multishot `RECVMSG`.
    HotloopUringOwnedPlain,
    Tokio,
    Floor,
}

impl Server {
    fn name(self) -> &'static str {
        match self {
            Server::HotloopEpoll => "hotloop epoll (recvmmsg/sendmmsg)",
            Server::HotloopUring => "hotloop io_uring (poll forms)",
            Server::HotloopUringOwned => "hotloop io_uring (owned forms)",
            Server::HotloopUringPlain => "hotloop io_uring (poll forms, no multishot RECVMSG)",
            Server::HotloopUringOwnedPlain => {
                "hotloop io_uring (owned RECVMSG/SENDMSG ops, no multishot RECVMSG)"
            }
            Server::Tokio => "tokio UdpSocket",
            Server::Floor => "floor (blocking recvmmsg/sendmmsg)",
        }
    }

    /// The row's key in `UDP_ECHO_SERVERS`.
    fn key(self) -> &'static str {
        match self {
            Server::HotloopEpoll => "epoll",
            Server::HotloopUring => "uring",
            Server::HotloopUringOwned => "uring-owned",
            Server::HotloopUringPlain => "uring-plain",
            Server::HotloopUringOwnedPlain => "uring-owned-plain",
            Server::Tokio => "tokio",
            Server::Floor => "floor",
        }
    }

    fn uring(self) -> bool {
        matches!(
            self,
            Server::HotloopUring
                | Server::HotloopUringOwned
                | Server::HotloopUringPlain
                | Server::HotloopUringOwnedPlain
        )
    }

    fn owned(self) -> bool {
        matches!(self, Server::HotloopUringOwned | Server::HotloopUringOwnedPlain)
    }
}

struct Row {
    server: Server,
    gso: bool,
    datagrams_per_s: f64,
    cpu_s_per_million: f64,
    lost: u64,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let seconds: f64 = args.first().and_then(|s| s.parse().ok()).unwrap_or(3.0);
    let rounds: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(3);
    let uring = hotloop::runtime::uring_available();
    if let Err(why) = &uring {
        eprintln!("io_uring rows skipped: {why}");
    }
    let picked = std::env::var("UDP_ECHO_SERVERS").ok();
    let mut configs = Vec::new();
    for gso in [false, true] {
        for server in [
            Server::HotloopEpoll,
            Server::HotloopUring,
            Server::HotloopUringPlain,
            Server::HotloopUringOwned,
            Server::HotloopUringOwnedPlain,
            Server::Tokio,
            Server::Floor,
        ] {
            if picked.as_deref().is_some_and(|p| !p.split(',').any(|k| k.trim() == server.key())) {
                continue;
            }
            if (server.uring() && uring.is_err()) || (gso && server == Server::Tokio) {
                continue;
            }
            configs.push((server, gso));
        }
    }
    let mut results: Vec<Vec<Row>> = configs.iter().map(|_| Vec::new()).collect();
    for round in 0..rounds {
        for (i, &(server, gso)) in configs.iter().enumerate() {
            let row = run(server, gso, Duration::from_secs_f64(seconds));
            eprintln!(
                "round {round}: {:<46} gso/gro={:<5} {:>10.0} datagrams/s {:>7.3} CPU s/M lost {}",
                server.name(),
                gso,
                row.datagrams_per_s,
                row.cpu_s_per_million,
                row.lost
            );
            results[i].push(row);
        }
    }
    println!("| server | GSO/GRO | datagrams/s | server CPU s per million datagrams | lost (window resets) |");
    println!("|---|---|---:|---:|---:|");
    for rows in &mut results {
        rows.sort_by(|a, b| a.datagrams_per_s.total_cmp(&b.datagrams_per_s));
        let m = &rows[rows.len() / 2];
        println!(
            "| {} | {} | {:.0} | {:.3} | {} |",
            m.server.name(),
            if m.gso { "on" } else { "off" },
            m.datagrams_per_s,
            m.cpu_s_per_million,
            m.lost
        );
    }
}

/// Runs one server and the load for `duration`.
fn run(server: Server, gso: bool, duration: Duration) -> Row {
    let stop = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = mpsc::channel::<(SocketAddr, String)>();
    let handle = {
        let stop = stop.clone();
        thread::spawn(move || serve(server, gso, stop, ready_tx))
    };
    let (addr, tid) = ready_rx.recv_timeout(Duration::from_secs(10)).expect("server started");
    let cpu_before = thread_cpu(&tid);
    let start = Instant::now();
    let (echoed, lost) = load(addr, gso, duration);
    let elapsed = start.elapsed();
    let cpu = thread_cpu(&tid) - cpu_before;
    stop.store(true, Ordering::Relaxed);
    // Wake a server blocked in a receive.
    let poke = StdUdpSocket::bind("127.0.0.1:0").unwrap();
    let _ = poke.send_to(b"stop", addr);
    handle.join().unwrap();
    Row {
        server,
        gso,
        datagrams_per_s: echoed as f64 / elapsed.as_secs_f64(),
        cpu_s_per_million: cpu.as_secs_f64() / (echoed.max(1) as f64) * 1e6,
        lost,
    }
}

/// The on-CPU time of thread `tid` of this process so far.
fn thread_cpu(tid: &str) -> Duration {
    let s = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).unwrap_or_default();
    Duration::from_nanos(s.split_whitespace().next().and_then(|n| n.parse().ok()).unwrap_or(0))
}

/// The calling thread's id, as `/proc/self/task` names it.
fn my_tid() -> String {
    let link = std::fs::read_link("/proc/thread-self").expect("/proc/thread-self");
    link.file_name().unwrap().to_string_lossy().into_owned()
}

fn server_options(gso: bool) -> UdpOptions {
    UdpOptions {
        gro: gso,
        recv_buffer_bytes: Some(SOCKET_BUFFER_BYTES),
        send_buffer_bytes: Some(SOCKET_BUFFER_BYTES),
        ..UdpOptions::default()
    }
}

fn serve(
    server: Server,
    gso: bool,
    stop: Arc<AtomicBool>,
    ready: mpsc::Sender<(SocketAddr, String)>,
) {
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    match server {
        Server::HotloopEpoll
        | Server::HotloopUring
        | Server::HotloopUringOwned
        | Server::HotloopUringPlain
        | Server::HotloopUringOwnedPlain => {
            let driver = if server == Server::HotloopEpoll {
                hotloop::DriverKind::Epoll
            } else {
                hotloop::DriverKind::Uring
            };
            // The switch is read when the driver starts; rows run one at a time.
            if matches!(server, Server::HotloopUringPlain | Server::HotloopUringOwnedPlain) {
                std::env::set_var("HOTLOOP_URING_MULTISHOT_RECVMSG", "0");
            } else {
                std::env::remove_var("HOTLOOP_URING_MULTISHOT_RECVMSG");
            }
            // The server runs on this thread, in `block_on`.
            let rt = hotloop::Runtime::builder().workers(1).driver(driver).build().unwrap();
            rt.block_on(async move {
                let sock = UdpSocket::bind_with(addr, &server_options(gso)).unwrap();
                ready.send((sock.local_addr().unwrap(), my_tid())).unwrap();
                if server.owned() {
                    hotloop_owned(&sock, gso, &stop).await
                } else {
                    hotloop_batched(&sock, gso, &stop).await
                }
            });
        }
        Server::Tokio => {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                let std = StdUdpSocket::bind(addr).unwrap();
                set_buffers(&std);
                std.set_nonblocking(true).unwrap();
                let sock = tokio::net::UdpSocket::from_std(std).unwrap();
                ready.send((sock.local_addr().unwrap(), my_tid())).unwrap();
                let mut buf = vec![0u8; 2048];
                while !stop.load(Ordering::Relaxed) {
                    let Ok((n, from)) = sock.recv_from(&mut buf).await else { continue };
                    let _ = sock.send_to(&buf[..n], from).await;
                }
            });
        }
        Server::Floor => {
            let sock = StdUdpSocket::bind(addr).unwrap();
            set_buffers(&sock);
            if gso {
                floor::set_gro(&sock);
            }
            ready.send((sock.local_addr().unwrap(), my_tid())).unwrap();
            floor::serve(&sock, gso, &stop);
        }
    }
}

fn set_buffers(sock: &StdUdpSocket) {
    floor::setsockopt(sock, libc::SOL_SOCKET, libc::SO_RCVBUF, SOCKET_BUFFER_BYTES as i32);
    floor::setsockopt(sock, libc::SOL_SOCKET, libc::SO_SNDBUF, SOCKET_BUFFER_BYTES as i32);
}

/// Batches of datagrams in, the same batches out (as GSO trains when GRO
/// coalesced them).
async fn hotloop_batched(sock: &UdpSocket, gso: bool, stop: &AtomicBool) {
    let buf_bytes = if gso { GRO_BUFFER_BYTES } else { 2048 };
    let mut storage = vec![vec![0u8; buf_bytes]; BATCH_DATAGRAMS_MAX];
    let mut meta = [RecvMeta::default(); BATCH_DATAGRAMS_MAX];
    while !stop.load(Ordering::Relaxed) {
        let n = {
            let mut bufs: Vec<IoSliceMut<'_>> =
                storage.iter_mut().map(|b| IoSliceMut::new(&mut b[..])).collect();
            match poll_fn(|cx| sock.poll_recv_msgs(cx, &mut bufs, &mut meta)).await {
                Ok(n) => n,
                Err(_) => continue,
            }
        };
        let transmits: Vec<Transmit<'_>> = (0..n)
            .map(|i| Transmit {
                destination: meta[i].addr,
                ecn: None,
                contents: &storage[i][..meta[i].len],
                segment_size: (meta[i].len > meta[i].stride).then_some(meta[i].stride),
                src_ip: None,
            })
            .collect();
        let mut sent = 0;
        while sent < n {
            match poll_fn(|cx| sock.poll_send_msgs(cx, &transmits[sent..])).await {
                Ok(k) => sent += k,
                Err(_) => break,
            }
        }
    }
}

/// One owned receive and one owned send per datagram (or GRO train).
async fn hotloop_owned(sock: &UdpSocket, gso: bool, stop: &AtomicBool) {
    let buf_bytes = if gso { GRO_BUFFER_BYTES } else { 2048 };
    let mut buf = Vec::with_capacity(buf_bytes);
    while !stop.load(Ordering::Relaxed) {
        let (res, b) = sock.recv_msg(buf).await;
        buf = b;
        let Ok(meta) = res else { continue };
        let send = hotloop::net::SendMeta {
            destination: Some(meta.addr),
            segment_size: (meta.len > meta.stride).then_some(meta.stride),
            ..Default::default()
        };
        let (_, b) = sock.send_msg(buf, send).await;
        buf = b;
    }
}

/// Keeps [`WINDOW_DATAGRAMS`] in flight to `addr` for `duration`; returns
/// the echoes counted and how many times the window was lost.
fn load(addr: SocketAddr, gso: bool, duration: Duration) -> (u64, u64) {
    let sock = StdUdpSocket::bind("127.0.0.1:0").unwrap();
    set_buffers(&sock);
    sock.connect(addr).unwrap();
    sock.set_nonblocking(true).unwrap();
    if gso {
        floor::set_gro(&sock);
    }
    let payload = vec![0xabu8; PAYLOAD_BYTES * LOAD_BATCH_DATAGRAMS];
    let mut bufs = vec![vec![0u8; if gso { GRO_BUFFER_BYTES } else { 2048 }]; BATCH_DATAGRAMS_MAX];
    let deadline = Instant::now() + duration;
    let (mut inflight, mut echoed, mut lost) = (0usize, 0u64, 0u64);
    let mut idle_since: Option<Instant> = None;
    while Instant::now() < deadline {
        let mut progressed = false;
        if inflight + LOAD_BATCH_DATAGRAMS <= WINDOW_DATAGRAMS {
            let sent = if gso {
                floor::send_gso(&sock, &payload, PAYLOAD_BYTES)
            } else {
                floor::send_batch(&sock, &payload, PAYLOAD_BYTES)
            };
            if sent > 0 {
                inflight += sent;
                progressed = true;
            }
        }
        let got = floor::recv_count(&sock, &mut bufs, PAYLOAD_BYTES, false);
        if got > 0 {
            echoed += got as u64;
            inflight = inflight.saturating_sub(got);
            progressed = true;
        }
        if progressed {
            idle_since = None;
            continue;
        }
        let since = *idle_since.get_or_insert_with(Instant::now);
        if since.elapsed() > LOSS_TIMEOUT {
            lost += 1;
            inflight = 0;
            idle_since = None;
        } else {
            floor::wait_readable(&sock, 1);
        }
    }
    (echoed, lost)
}

/// The raw-syscall side: the floor server and the load generator's calls.
mod floor {
    use super::*;

    pub fn setsockopt(sock: &StdUdpSocket, level: i32, name: i32, value: i32) {
        // SAFETY: passes a live i32 and its exact size.
        let rc = unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                level,
                name,
                (&value as *const i32).cast(),
                size_of::<i32>() as libc::socklen_t,
            )
        };
        assert_eq!(rc, 0, "setsockopt({level}, {name}): {}", io::Error::last_os_error());
    }

    pub fn set_gro(sock: &StdUdpSocket) {
        setsockopt(sock, libc::SOL_UDP, libc::UDP_GRO, 1);
    }

    /// Waits at most `ms` for the socket to become readable.
    pub fn wait_readable(sock: &StdUdpSocket, ms: i32) {
        let mut pfd = libc::pollfd { fd: sock.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one live pollfd.
        unsafe { libc::poll(&mut pfd, 1, ms) };
    }

    /// Sends `payload` as datagrams of `size` with one `sendmmsg` on a
    /// connected socket; returns how many went.
    pub fn send_batch(sock: &StdUdpSocket, payload: &[u8], size: usize) -> usize {
        let n = payload.len() / size;
        let mut iov: Vec<libc::iovec> = (0..n)
            .map(|i| libc::iovec {
                iov_base: payload[i * size..].as_ptr() as *mut _,
                iov_len: size,
            })
            .collect();
        // SAFETY: mmsghdr is plain old data; all-zero is an empty header.
        let mut hdrs: Vec<libc::mmsghdr> = (0..n).map(|_| unsafe { zeroed() }).collect();
        for (h, v) in hdrs.iter_mut().zip(iov.iter_mut()) {
            h.msg_hdr.msg_iov = v;
            h.msg_hdr.msg_iovlen = 1;
        }
        // SAFETY: every header points at one iovec into `payload`, all live for the call.
        let rc = unsafe {
            libc::sendmmsg(sock.as_raw_fd(), hdrs.as_mut_ptr(), n as u32, libc::MSG_DONTWAIT)
        };
        rc.max(0) as usize
    }

    /// Sends `payload` as one GSO train of `size`-byte datagrams on a
    /// connected socket; returns how many datagrams went.
    pub fn send_gso(sock: &StdUdpSocket, payload: &[u8], size: usize) -> usize {
        #[repr(C, align(8))]
        struct Control([u8; 32]);
        let mut control = Control([0; 32]);
        let mut iov = libc::iovec { iov_base: payload.as_ptr() as *mut _, iov_len: payload.len() };
        // SAFETY: msghdr is plain old data; all-zero is an empty header.
        let mut msg: libc::msghdr = unsafe { zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.0.as_mut_ptr().cast();
        // SAFETY: CMSG_SPACE is arithmetic.
        msg.msg_controllen = unsafe { libc::CMSG_SPACE(2) } as usize;
        // SAFETY: the control buffer has room for one cmsghdr with 2 bytes of data (32 >= CMSG_SPACE(2)).
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_UDP;
            (*c).cmsg_type = libc::UDP_SEGMENT;
            (*c).cmsg_len = libc::CMSG_LEN(2) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<u16>(), size as u16);
        }
        // SAFETY: the header points at live iovec, payload and control data.
        let rc = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_DONTWAIT) };
        if rc < 0 {
            0
        } else {
            (rc as usize).div_ceil(size)
        }
    }

    /// Receives what is there with one `recvmmsg` (blocking for the first
    /// datagram if `block`); returns the datagrams received (GRO trains
    /// counted by their `size`-byte segments).
    pub fn recv_count(
        sock: &StdUdpSocket,
        bufs: &mut [Vec<u8>],
        size: usize,
        block: bool,
    ) -> usize {
        let (n, lens) = recv_batch(sock, bufs, None, block);
        lens[..n].iter().map(|&l| l.div_ceil(size)).sum()
    }

    /// One `recvmmsg` into `bufs`; fills `from` with the senders if given.
    /// Returns the count and each message's length.
    pub fn recv_batch(
        sock: &StdUdpSocket,
        bufs: &mut [Vec<u8>],
        mut from: Option<&mut [libc::sockaddr_storage]>,
        block: bool,
    ) -> (usize, [usize; BATCH_DATAGRAMS_MAX]) {
        let n = bufs.len().min(BATCH_DATAGRAMS_MAX);
        let mut iov: Vec<libc::iovec> = bufs[..n]
            .iter_mut()
            .map(|b| libc::iovec { iov_base: b.as_mut_ptr().cast(), iov_len: b.len() })
            .collect();
        // SAFETY: mmsghdr is plain old data; all-zero is an empty header.
        let mut hdrs: Vec<libc::mmsghdr> = (0..n).map(|_| unsafe { zeroed() }).collect();
        for (i, (h, v)) in hdrs.iter_mut().zip(iov.iter_mut()).enumerate() {
            h.msg_hdr.msg_iov = v;
            h.msg_hdr.msg_iovlen = 1;
            if let Some(from) = from.as_deref_mut() {
                h.msg_hdr.msg_name = (&mut from[i] as *mut libc::sockaddr_storage).cast();
                h.msg_hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as u32;
            }
        }
        let flags = if block { libc::MSG_WAITFORONE } else { libc::MSG_DONTWAIT };
        // SAFETY: every header points at a live iovec into `bufs` and, if given, a live
        // sockaddr_storage; no timeout.
        let rc = unsafe {
            libc::recvmmsg(
                sock.as_raw_fd(),
                hdrs.as_mut_ptr(),
                n as u32,
                flags,
                std::ptr::null_mut(),
            )
        };
        let mut lens = [0usize; BATCH_DATAGRAMS_MAX];
        let got = rc.max(0) as usize;
        for i in 0..got {
            lens[i] = hdrs[i].msg_len as usize;
        }
        (got, lens)
    }

    /// The floor: blocking `recvmmsg`, then the batch back with one
    /// `sendmmsg` (one `sendmsg` with `UDP_SEGMENT` per GRO train).
    pub fn serve(sock: &StdUdpSocket, gso: bool, stop: &AtomicBool) {
        sock.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
        let buf_bytes = if gso { GRO_BUFFER_BYTES } else { 2048 };
        let mut bufs = vec![vec![0u8; buf_bytes]; BATCH_DATAGRAMS_MAX];
        // SAFETY: sockaddr_storage is plain old data; all-zero is valid.
        let mut from: Vec<libc::sockaddr_storage> =
            (0..BATCH_DATAGRAMS_MAX).map(|_| unsafe { zeroed() }).collect();
        while !stop.load(Ordering::Relaxed) {
            let (n, lens) = recv_batch(sock, &mut bufs, Some(&mut from), true);
            if n == 0 {
                continue;
            }
            // The load is connected: every datagram comes from one peer.
            let peer = from[0];
            let peer_len = size_of::<libc::sockaddr_in>() as u32;
            let mut iov: Vec<libc::iovec> = (0..n)
                .map(|i| libc::iovec { iov_base: bufs[i].as_mut_ptr().cast(), iov_len: lens[i] })
                .collect();
            #[repr(C, align(8))]
            #[derive(Clone, Copy)]
            struct Control([u8; 32]);
            let mut controls = vec![Control([0; 32]); n];
            // SAFETY: mmsghdr is plain old data; all-zero is an empty header.
            let mut hdrs: Vec<libc::mmsghdr> = (0..n).map(|_| unsafe { zeroed() }).collect();
            for i in 0..n {
                let h = &mut hdrs[i].msg_hdr;
                h.msg_iov = &mut iov[i];
                h.msg_iovlen = 1;
                h.msg_name =
                    (&peer as *const libc::sockaddr_storage as *mut libc::sockaddr_storage).cast();
                h.msg_namelen = peer_len;
                if gso && lens[i] > PAYLOAD_BYTES {
                    h.msg_control = controls[i].0.as_mut_ptr().cast();
                    // SAFETY: CMSG_SPACE is arithmetic.
                    h.msg_controllen = unsafe { libc::CMSG_SPACE(2) } as usize;
                    // SAFETY: the control buffer has room for one cmsghdr with 2 bytes of data.
                    unsafe {
                        let c = libc::CMSG_FIRSTHDR(h);
                        (*c).cmsg_level = libc::SOL_UDP;
                        (*c).cmsg_type = libc::UDP_SEGMENT;
                        (*c).cmsg_len = libc::CMSG_LEN(2) as usize;
                        std::ptr::write_unaligned(
                            libc::CMSG_DATA(c).cast::<u16>(),
                            PAYLOAD_BYTES as u16,
                        );
                    }
                }
            }
            // SAFETY: every header points at live iovecs, the peer address and control data.
            unsafe { libc::sendmmsg(sock.as_raw_fd(), hdrs.as_mut_ptr(), n as u32, 0) };
        }
    }
}
