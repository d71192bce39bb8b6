//! Datagrams with ancillary data, shared by both backends: the types a
//! QUIC stack reads and writes (as `quinn-udp` exposes them), the encoding
//! and decoding of control messages, and the non-blocking `sendmsg`,
//! `sendmmsg` and `recvmmsg` calls both backends make.
//!
//! # Implementation notes
//! - Control messages (`man 7 ip`, `man 7 ipv6`, `man 7 udp`): on receive,
//!   `IP_TOS`/`IPV6_TCLASS` carry the ECN bits (Linux sends `IP_TOS` as one
//!   byte, `IPV6_TCLASS` as an `int`), `IP_PKTINFO`/`IPV6_PKTINFO` the
//!   destination address, and `UDP_GRO` the segment size of a coalesced
//!   datagram. On send, `UDP_SEGMENT` (a `u16`) asks the kernel to cut the
//!   buffer into datagrams of that size (GSO), `IP_TOS`/`IPV6_TCLASS` set
//!   the ECN bits and `IP_PKTINFO`/`IPV6_PKTINFO` the source address.
//! - Every call passes `MSG_DONTWAIT`, so it never blocks whether or not
//!   the socket is in non-blocking mode (io_uring sockets are not).
//! - A message's header, address and control buffer live together in one
//!   [`MsgBuf`], which io_uring operations box so their addresses stay fixed
//!   until the last completion.

use std::io::{self, IoSliceMut};
use std::mem::{size_of, zeroed};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::RawFd;
use std::sync::OnceLock;

use crate::sys;

/// The most datagrams one `recvmmsg` or `sendmmsg` moves.
pub const BATCH_DATAGRAMS_MAX: usize = 32;
/// The most segments the kernel accepts in one GSO send (`UDP_MAX_SEGMENTS`).
const GSO_SEGMENTS_MAX: usize = 64;
/// Bytes of control data one message may carry: room for segment size,
/// ECN and a v6 packet-info message, each `CMSG_SPACE` aligned.
const CONTROL_BYTES: usize = 128;

/// The explicit congestion notification codepoint of a datagram (RFC 3168).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EcnCodepoint {
    /// ECN-capable transport, codepoint 0 (`0b10`).
    Ect0,
    /// ECN-capable transport, codepoint 1 (`0b01`).
    Ect1,
    /// Congestion experienced (`0b11`).
    Ce,
}

impl EcnCodepoint {
    /// The codepoint in the two low bits of a TOS or traffic-class byte;
    /// `None` for "not ECN-capable" (`0b00`).
    pub fn from_bits(bits: u8) -> Option<EcnCodepoint> {
        match bits & 0b11 {
            0b10 => Some(EcnCodepoint::Ect0),
            0b01 => Some(EcnCodepoint::Ect1),
            0b11 => Some(EcnCodepoint::Ce),
            _ => None,
        }
    }

    /// The two bits as they go into a TOS or traffic-class byte.
    pub fn bits(self) -> u8 {
        match self {
            EcnCodepoint::Ect0 => 0b10,
            EcnCodepoint::Ect1 => 0b01,
            EcnCodepoint::Ce => 0b11,
        }
    }
}

/// What the kernel said about one received datagram (or one coalesced
/// train of datagrams, with GRO).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvMeta {
    /// The sender.
    pub addr: SocketAddr,
    /// Bytes written into the buffer.
    pub len: usize,
    /// The size of each datagram in the buffer: `len` unless GRO
    /// coalesced several datagrams of this size (the last may be shorter).
    pub stride: usize,
    /// The ECN codepoint, if the socket asked for it and the sender set one.
    pub ecn: Option<EcnCodepoint>,
    /// The address the datagram was sent to, if the socket asked for it.
    pub dst_ip: Option<IpAddr>,
    /// True when the datagram was larger than the buffer and its tail was
    /// discarded (`MSG_TRUNC`).
    pub truncated: bool,
}

impl Default for RecvMeta {
    fn default() -> Self {
        RecvMeta {
            addr: SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), 0),
            len: 0,
            stride: 0,
            ecn: None,
            dst_ip: None,
            truncated: false,
        }
    }
}

/// One send: a buffer, where it goes, and how.
#[derive(Debug, Clone)]
pub struct Transmit<'a> {
    /// The receiver.
    pub destination: SocketAddr,
    /// The ECN codepoint to set.
    pub ecn: Option<EcnCodepoint>,
    /// The bytes: one datagram, or with `segment_size` several of that
    /// size back to back (the last may be shorter).
    pub contents: &'a [u8],
    /// The size of each datagram in `contents` (GSO); `None`: one datagram.
    pub segment_size: Option<usize>,
    /// The source address to send from (on a socket bound to a wildcard address).
    pub src_ip: Option<IpAddr>,
}

/// How an owned-buffer send goes: [`Transmit`] without the bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SendMeta {
    /// The receiver; `None` on a connected socket.
    pub destination: Option<SocketAddr>,
    /// The ECN codepoint to set.
    pub ecn: Option<EcnCodepoint>,
    /// The size of each datagram in the buffer (GSO); `None`: one datagram.
    pub segment_size: Option<usize>,
    /// The source address to send from.
    pub src_ip: Option<IpAddr>,
}

impl Transmit<'_> {
    fn meta(&self) -> SendMeta {
        SendMeta {
            destination: Some(self.destination),
            ecn: self.ecn,
            segment_size: self.segment_size,
            src_ip: self.src_ip,
        }
    }
}

/// Control-message space, aligned as `cmsghdr` needs.
#[repr(C, align(8))]
struct Control([u8; CONTROL_BYTES]);

/// One message's header with the address and control buffer it points at.
/// Its iovecs are the caller's. Box it when the kernel may use it after
/// the call that made it (io_uring).
pub(crate) struct MsgBuf {
    pub(crate) hdr: libc::msghdr,
    name: libc::sockaddr_storage,
    control: Control,
    iov: libc::iovec,
}

impl MsgBuf {
    /// An empty message.
    pub(crate) fn new() -> MsgBuf {
        // SAFETY: msghdr, sockaddr_storage and iovec are plain old data, for which all-zero is a
        // valid (empty) value.
        unsafe { zeroed() }
    }

    /// Points the header at this buffer's own address, control space and
    /// one iovec of `len` bytes at `ptr`, ready for `recvmsg`. Call again
    /// after the value moved.
    pub(crate) fn prepare_recv(&mut self, ptr: *mut u8, len: usize) {
        self.iov = libc::iovec { iov_base: ptr.cast(), iov_len: len };
        self.hdr.msg_iov = &mut self.iov;
        self.hdr.msg_iovlen = 1;
        self.point_recv();
    }

    fn point_recv(&mut self) {
        self.hdr.msg_name = (&mut self.name as *mut libc::sockaddr_storage).cast();
        self.hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        self.hdr.msg_control = self.control.0.as_mut_ptr().cast();
        self.hdr.msg_controllen = CONTROL_BYTES;
        self.hdr.msg_flags = 0;
    }

    /// Fills the header for sending `len` bytes at `ptr` as `meta` says.
    /// Call again after the value moved.
    pub(crate) fn prepare_send(&mut self, ptr: *const u8, len: usize, meta: &SendMeta) {
        self.iov = libc::iovec { iov_base: ptr as *mut libc::c_void, iov_len: len };
        self.hdr.msg_iov = &mut self.iov;
        self.hdr.msg_iovlen = 1;
        self.encode_send(meta);
    }

    fn encode_send(&mut self, meta: &SendMeta) {
        match meta.destination {
            Some(addr) => {
                let (name, len) = sys::std_to_sockaddr(&addr);
                self.name = name;
                self.hdr.msg_name = (&mut self.name as *mut libc::sockaddr_storage).cast();
                self.hdr.msg_namelen = len;
            }
            None => {
                self.hdr.msg_name = std::ptr::null_mut();
                self.hdr.msg_namelen = 0;
            }
        }
        self.hdr.msg_control = self.control.0.as_mut_ptr().cast();
        self.hdr.msg_controllen = CONTROL_BYTES;
        // A v4-mapped destination on a dual-stack socket leaves as IPv4, so
        // its ECN bits and source address go in IPv4 control messages (as
        // quinn-udp does).
        let v6 = matches!(meta.destination, Some(SocketAddr::V6(a)) if a.ip().to_ipv4_mapped().is_none());
        let mut enc = Encoder { hdr: &mut self.hdr, cmsg: std::ptr::null_mut(), len: 0 };
        if let Some(ecn) = meta.ecn {
            let bits = ecn.bits() as libc::c_int;
            if v6 {
                enc.push(libc::IPPROTO_IPV6, libc::IPV6_TCLASS, bits);
            } else {
                enc.push(libc::IPPROTO_IP, libc::IP_TOS, bits);
            }
        }
        if let Some(size) = meta.segment_size {
            enc.push(libc::SOL_UDP, libc::UDP_SEGMENT, size.min(u16::MAX as usize) as u16);
        }
        match meta.src_ip {
            Some(ip) if !v6 => {
                let ip = match ip {
                    IpAddr::V4(v4) => v4,
                    IpAddr::V6(v6) => v6.to_ipv4_mapped().unwrap_or(Ipv4Addr::UNSPECIFIED),
                };
                let info = libc::in_pktinfo {
                    ipi_ifindex: 0,
                    ipi_spec_dst: libc::in_addr { s_addr: u32::from(ip).to_be() },
                    ipi_addr: libc::in_addr { s_addr: 0 },
                };
                enc.push(libc::IPPROTO_IP, libc::IP_PKTINFO, info);
            }
            Some(ip) if v6 => {
                let ip = match ip {
                    IpAddr::V4(v4) => v4.to_ipv6_mapped(),
                    IpAddr::V6(v6) => v6,
                };
                let info = libc::in6_pktinfo {
                    ipi6_addr: libc::in6_addr { s6_addr: ip.octets() },
                    ipi6_ifindex: 0,
                };
                enc.push(libc::IPPROTO_IPV6, libc::IPV6_PKTINFO, info);
            }
            _ => {}
        }
        let len = enc.len;
        if len == 0 {
            self.hdr.msg_control = std::ptr::null_mut();
        }
        self.hdr.msg_controllen = len;
    }

    /// What the kernel reported for a message of `len` bytes received into
    /// this buffer.
    pub(crate) fn decode_recv(&self, len: usize) -> RecvMeta {
        let addr = sys::sockaddr_to_std(&self.name)
            .unwrap_or_else(|_| SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), 0));
        decode(&self.hdr, addr, len)
    }
}

/// The name and control space a multishot `RECVMSG` reserves in each
/// provided buffer, after its `io_uring_recvmsg_out` header and before the
/// payload: a header naming these sizes goes with the operation.
pub(crate) fn multishot_recv_template() -> libc::msghdr {
    // SAFETY: msghdr is plain old data; all-zero is a valid, empty header.
    let mut hdr: libc::msghdr = unsafe { zeroed() };
    hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    hdr.msg_controllen = CONTROL_BYTES;
    hdr
}

/// Bytes a multishot `RECVMSG` puts before the payload in each buffer: the
/// `io_uring_recvmsg_out` header (16 bytes), then the name and control
/// space of [`multishot_recv_template`].
pub(crate) const MULTISHOT_RECV_HEADER_BYTES: usize =
    16 + size_of::<libc::sockaddr_storage>() + CONTROL_BYTES;

/// What the kernel said about a datagram a multishot `RECVMSG` put in a
/// provided buffer: `name` and `control` as it wrote them there (at any
/// alignment), `flags` from its `io_uring_recvmsg_out` header, `len` the
/// payload bytes it holds.
pub(crate) fn decode_multishot(name: &[u8], control: &[u8], flags: u32, len: usize) -> RecvMeta {
    let mut msg = MsgBuf::new();
    // The buffer's bytes are copied into a `MsgBuf`, whose control space
    // is aligned as `cmsghdr` needs; the provided buffer's need not be.
    let name_len = name.len().min(size_of::<libc::sockaddr_storage>());
    let control_len = control.len().min(CONTROL_BYTES);
    // SAFETY: the destination is `msg.name`, a sockaddr_storage of at least `name_len` bytes,
    // and does not overlap `name`.
    unsafe {
        std::ptr::copy_nonoverlapping(
            name.as_ptr(),
            (&mut msg.name as *mut libc::sockaddr_storage).cast::<u8>(),
            name_len,
        )
    };
    msg.control.0[..control_len].copy_from_slice(&control[..control_len]);
    msg.point_recv();
    msg.hdr.msg_controllen = control_len;
    msg.hdr.msg_flags = flags as libc::c_int;
    msg.decode_recv(len)
}

/// Appends control messages to a header's control space.
struct Encoder<'a> {
    hdr: &'a mut libc::msghdr,
    cmsg: *mut libc::cmsghdr,
    len: usize,
}

impl Encoder<'_> {
    fn push<T: Copy>(&mut self, level: i32, ty: i32, value: T) {
        // The header's controllen is the whole space while we encode, so
        // CMSG_FIRSTHDR/NXTHDR know where it ends.
        // SAFETY: `hdr` points at a control buffer of `msg_controllen` bytes (CONTROL_BYTES);
        // CMSG_FIRSTHDR/CMSG_NXTHDR return null when the next header would not fit.
        let next = unsafe {
            if self.cmsg.is_null() {
                libc::CMSG_FIRSTHDR(self.hdr)
            } else {
                libc::CMSG_NXTHDR(self.hdr, self.cmsg)
            }
        };
        // SAFETY: CMSG_SPACE is arithmetic on a size.
        let space = unsafe { libc::CMSG_SPACE(size_of::<T>() as u32) } as usize;
        assert!(
            !next.is_null() && self.len + space <= CONTROL_BYTES,
            "control messages exceed CONTROL_BYTES"
        );
        // SAFETY: `next` is a properly aligned cmsghdr inside the control buffer with room for
        // CMSG_SPACE(size_of::<T>()) bytes (checked above); the data is written unaligned.
        unsafe {
            (*next).cmsg_level = level;
            (*next).cmsg_type = ty;
            (*next).cmsg_len = libc::CMSG_LEN(size_of::<T>() as u32) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(next).cast::<T>(), value);
        }
        self.cmsg = next;
        self.len += space;
    }
}

/// Reads the control messages and flags of a received message.
fn decode(hdr: &libc::msghdr, addr: SocketAddr, len: usize) -> RecvMeta {
    let mut meta = RecvMeta {
        addr,
        len,
        stride: len,
        ecn: None,
        dst_ip: None,
        truncated: hdr.msg_flags & libc::MSG_TRUNC != 0,
    };
    if hdr.msg_control.is_null() || hdr.msg_controllen == 0 {
        return meta;
    }
    // SAFETY: the kernel filled `msg_controllen` bytes of the control buffer the header points
    // at with well-formed cmsghdrs; CMSG_FIRSTHDR/NXTHDR stay inside it and return null at its end.
    let mut cmsg = unsafe { libc::CMSG_FIRSTHDR(hdr) };
    while !cmsg.is_null() {
        // SAFETY: `cmsg` is a cmsghdr inside the control buffer (see above).
        let c = unsafe { &*cmsg };
        // SAFETY: the data of a control message follows its header inside the buffer.
        let data = unsafe { libc::CMSG_DATA(cmsg) };
        let data_len = c.cmsg_len.saturating_sub(
            // SAFETY: CMSG_LEN is arithmetic on a size.
            unsafe { libc::CMSG_LEN(0) } as usize,
        );
        match (c.cmsg_level, c.cmsg_type) {
            (libc::IPPROTO_IP, libc::IP_TOS) | (libc::IPPROTO_IP, libc::IP_RECVTOS) => {
                // Linux sends one byte for IP_TOS; other systems an int.
                // SAFETY: the message carries at least one byte of data.
                let tos = unsafe { *data };
                meta.ecn = EcnCodepoint::from_bits(tos);
            }
            (libc::IPPROTO_IPV6, libc::IPV6_TCLASS) if data_len >= size_of::<libc::c_int>() => {
                // SAFETY: the message carries an int (checked); read unaligned.
                let tclass = unsafe { std::ptr::read_unaligned(data.cast::<libc::c_int>()) };
                meta.ecn = EcnCodepoint::from_bits(tclass as u8);
            }
            (libc::IPPROTO_IP, libc::IP_PKTINFO) if data_len >= size_of::<libc::in_pktinfo>() => {
                // SAFETY: the message carries an in_pktinfo (checked); read unaligned.
                let info = unsafe { std::ptr::read_unaligned(data.cast::<libc::in_pktinfo>()) };
                meta.dst_ip = Some(Ipv4Addr::from(u32::from_be(info.ipi_addr.s_addr)).into());
            }
            (libc::IPPROTO_IPV6, libc::IPV6_PKTINFO)
                if data_len >= size_of::<libc::in6_pktinfo>() =>
            {
                // SAFETY: the message carries an in6_pktinfo (checked); read unaligned.
                let info = unsafe { std::ptr::read_unaligned(data.cast::<libc::in6_pktinfo>()) };
                meta.dst_ip = Some(Ipv6Addr::from(info.ipi6_addr.s6_addr).into());
            }
            (libc::SOL_UDP, libc::UDP_GRO) if data_len >= size_of::<libc::c_int>() => {
                // SAFETY: the message carries an int (checked); read unaligned.
                let size = unsafe { std::ptr::read_unaligned(data.cast::<libc::c_int>()) };
                if size > 0 {
                    meta.stride = size as usize;
                }
            }
            _ => {}
        }
        // SAFETY: as above; returns null after the last message.
        cmsg = unsafe { libc::CMSG_NXTHDR(hdr, cmsg) };
    }
    meta
}

/// Receives up to `min(bufs.len(), meta.len(), BATCH_DATAGRAMS_MAX)`
/// datagrams with one `recvmmsg`, without waiting. Returns how many.
pub(crate) fn recv_batch(
    fd: RawFd,
    bufs: &mut [IoSliceMut<'_>],
    meta: &mut [RecvMeta],
) -> io::Result<usize> {
    let n = bufs.len().min(meta.len()).min(BATCH_DATAGRAMS_MAX);
    if n == 0 {
        return Ok(0);
    }
    if n == 1 {
        let mut msg = MsgBuf::new();
        msg.prepare_recv(bufs[0].as_mut_ptr(), bufs[0].len());
        // SAFETY: the header points at `msg`'s own address and control space and at `bufs[0]`,
        // all live and writable for the call.
        let len = unsafe { sys::recvmsg(fd, &mut msg.hdr, libc::MSG_DONTWAIT) }?;
        meta[0] = msg.decode_recv(len);
        return Ok(1);
    }
    let mut msgs: [MsgBuf; BATCH_DATAGRAMS_MAX] = std::array::from_fn(|_| MsgBuf::new());
    // SAFETY: mmsghdr is plain old data; all-zero is a valid value.
    let mut hdrs: [libc::mmsghdr; BATCH_DATAGRAMS_MAX] = unsafe { zeroed() };
    for i in 0..n {
        msgs[i].prepare_recv(bufs[i].as_mut_ptr(), bufs[i].len());
        hdrs[i].msg_hdr = msgs[i].hdr;
    }
    // SAFETY: each of the first `n` headers points at its MsgBuf's address, control space and
    // iovec (none of which move during the call) and at one of `bufs`, all live and writable.
    let got = unsafe { sys::recvmmsg(fd, &mut hdrs[..n], libc::MSG_DONTWAIT) }?;
    for i in 0..got {
        let addr = sys::sockaddr_to_std(&msgs[i].name)
            .unwrap_or_else(|_| SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), 0));
        meta[i] = decode(&hdrs[i].msg_hdr, addr, hdrs[i].msg_len as usize);
    }
    Ok(got)
}

/// Sends one transmit (one datagram, or a GSO train) without waiting.
pub(crate) fn send_one(fd: RawFd, transmit: &Transmit<'_>) -> io::Result<usize> {
    let mut msg = MsgBuf::new();
    msg.prepare_send(transmit.contents.as_ptr(), transmit.contents.len(), &transmit.meta());
    // SAFETY: the header points at `msg`'s address and control data and at `transmit.contents`,
    // all live for the call.
    unsafe { sys::sendmsg_hdr(fd, &msg.hdr, libc::MSG_DONTWAIT) }
}

/// Sends up to `min(transmits.len(), BATCH_DATAGRAMS_MAX)` transmits with
/// one `sendmmsg`, without waiting. Returns how many the kernel took.
pub(crate) fn send_batch(fd: RawFd, transmits: &[Transmit<'_>]) -> io::Result<usize> {
    let n = transmits.len().min(BATCH_DATAGRAMS_MAX);
    match n {
        0 => return Ok(0),
        1 => return send_one(fd, &transmits[0]).map(|_| 1),
        _ => {}
    }
    let mut msgs: [MsgBuf; BATCH_DATAGRAMS_MAX] = std::array::from_fn(|_| MsgBuf::new());
    // SAFETY: mmsghdr is plain old data; all-zero is a valid value.
    let mut hdrs: [libc::mmsghdr; BATCH_DATAGRAMS_MAX] = unsafe { zeroed() };
    for i in 0..n {
        let t = &transmits[i];
        msgs[i].prepare_send(t.contents.as_ptr(), t.contents.len(), &t.meta());
        hdrs[i].msg_hdr = msgs[i].hdr;
    }
    // SAFETY: each of the first `n` headers points at its MsgBuf's address, control data and
    // iovec (which do not move during the call) and at one transmit's contents, all live.
    unsafe { sys::sendmmsg(fd, &mut hdrs[..n], libc::MSG_DONTWAIT) }
}

/// The most segments one GSO send may carry on this kernel: 1 where
/// `UDP_SEGMENT` is missing. Probed once per process.
pub fn gso_segments_max() -> usize {
    static PROBED: OnceLock<usize> = OnceLock::new();
    *PROBED.get_or_init(|| {
        let addr = SocketAddr::new(Ipv4Addr::LOCALHOST.into(), 0);
        match sys::udp_socket(&addr) {
            Ok(fd) => {
                use std::os::fd::AsRawFd;
                match sys::setsockopt_int(fd.as_raw_fd(), libc::SOL_UDP, libc::UDP_SEGMENT, 1500) {
                    Ok(()) => GSO_SEGMENTS_MAX,
                    Err(_) => 1,
                }
            }
            Err(_) => 1,
        }
    })
}
