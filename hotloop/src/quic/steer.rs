//! Keeping a QUIC connection on the socket (and so the worker) that owns
//! it when its client's address changes: a client that moves to another
//! network (connection migration) or whose NAT gives it a new port. The
//! kernel spreads datagrams over a `SO_REUSEPORT` group by a hash of the
//! addresses, so a new address lands on any socket, whose endpoint does
//! not know the connection.
//!
//! Each socket's endpoint writes the socket's index in the group into the
//! first byte of every connection ID it issues (the other seven random),
//! and a classic BPF program on the group sends a datagram with a short
//! header (every packet after the handshake) to the socket its
//! destination connection ID names; a long header (a handshake's) keeps
//! the hash. The endpoints share one stateless-reset key, so a datagram
//! that still reaches another socket (one whose connection ID names none)
//! is answered with a reset its client recognises.
//!
//! # Implementation notes
//! - The group's index of a socket is its place in bind order: the kernel
//!   appends each socket that joins, and closing one moves the last into
//!   its place. The sockets here are bound in order and close together (a
//!   successor at an upgrade receives the same sockets, in the same
//!   order, and the group stays as it was).
//! - The program runs on the UDP payload. It returns an index past the
//!   group for a long header, and the kernel then takes the hash; the
//!   first byte of a short header's destination connection ID is an index
//!   in range for a connection issued here, and out of range (the hash
//!   again) only for what none of these endpoints issued.

use std::io;
use std::os::fd::AsRawFd;
use std::time::Duration;

use quinn::{ConnectionId, ConnectionIdGenerator, EndpointConfig};

/// Bytes of a connection ID: quinn's default.
const CID_BYTES: usize = 8;
/// The most sockets a connection ID's first byte can name.
const STEERED_SOCKETS_MAX: usize = 256;
/// The long-header bit of a QUIC packet's first byte (RFC 9000 section 17.2).
const LONG_HEADER: u32 = 0x80;

/// quinn's endpoint configuration for each socket of a `SO_REUSEPORT`
/// group, in the group's order (the order the sockets were bound in):
/// one stateless-reset key for all, and, with more than one socket (at
/// most 256), connection IDs that name their socket and a BPF program on
/// the group that steers each datagram after a handshake to the socket
/// its connection ID names, so a client whose address changes stays with
/// its connection (see the module notes). Start socket `i`'s endpoint with
/// configuration `i` ([`super::endpoint_on_gated`]).
pub fn group_configs(sockets: &[std::net::UdpSocket]) -> io::Result<Vec<EndpointConfig>> {
    // One random reset key, shared by the clones.
    let shared = EndpointConfig::default();
    if sockets.len() < 2 || sockets.len() > STEERED_SOCKETS_MAX {
        return Ok(vec![shared; sockets.len()]);
    }
    crate::sys::attach_reuseport_cbpf(sockets[0].as_raw_fd(), &steering_program())?;
    Ok((0..sockets.len())
        .map(|i| {
            let index = i as u8;
            let mut config = shared.clone();
            config.cid_generator(move || Box::new(SocketIndexCids::new(index)));
            config
        })
        .collect())
}

/// The group's program, run on each datagram's UDP payload: a long header
/// returns an index past any group (the kernel then hashes the addresses);
/// a short header returns its destination connection ID's first byte.
fn steering_program() -> [libc::sock_filter; 5] {
    let op = |code: u32, jt: u8, jf: u8, k: u32| libc::sock_filter { code: code as u16, jt, jf, k };
    [
        op(libc::BPF_LD | libc::BPF_B | libc::BPF_ABS, 0, 0, 0),
        // Long header: to the last instruction; else on to the next.
        op(libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K, 2, 0, LONG_HEADER),
        op(libc::BPF_LD | libc::BPF_B | libc::BPF_ABS, 0, 0, 1),
        op(libc::BPF_RET | libc::BPF_A, 0, 0, 0),
        op(libc::BPF_RET | libc::BPF_K, 0, 0, u32::MAX),
    ]
}

/// Connection IDs whose first byte is the index of their socket in its
/// group, the other seven random.
#[derive(Debug)]
struct SocketIndexCids {
    index: u8,
    random: quinn_proto::RandomConnectionIdGenerator,
}

impl SocketIndexCids {
    fn new(index: u8) -> SocketIndexCids {
        SocketIndexCids { index, random: quinn_proto::RandomConnectionIdGenerator::new(CID_BYTES) }
    }
}

impl ConnectionIdGenerator for SocketIndexCids {
    fn generate_cid(&mut self) -> ConnectionId {
        let mut bytes = [0; CID_BYTES];
        bytes.copy_from_slice(&self.random.generate_cid());
        bytes[0] = self.index;
        ConnectionId::new(&bytes)
    }

    fn cid_len(&self) -> usize {
        CID_BYTES
    }

    fn cid_lifetime(&self) -> Option<Duration> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_id_names_its_socket() {
        let mut cids = SocketIndexCids::new(3);
        let (a, b) = (cids.generate_cid(), cids.generate_cid());
        assert_eq!((a.len(), a[0], b[0]), (CID_BYTES, 3, 3));
        assert_ne!(a, b);
    }
}
