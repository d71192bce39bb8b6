//! Shared helpers for the integration tests: the driver matrix and small clients.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

pub use hotloop::DriverKind;

/// Why the io_uring variant of a test cannot run here, if it cannot.
pub fn uring_unavailable() -> Option<String> {
    hotloop::runtime::uring_available().err()
}

/// Defines each test once per driver, as modules `name::epoll` and
/// `name::uring`; the io_uring variant prints why it skipped where the
/// kernel cannot run it.
#[macro_export]
macro_rules! test_all_drivers {
    ($( $(#[$meta:meta])* fn $name:ident($driver:ident: DriverKind) $body:block )*) => {
        $(
            mod $name {
                #[allow(unused_imports)]
                use super::*;

                fn run($driver: $crate::common::DriverKind) $body

                $(#[$meta])*
                #[test]
                fn epoll() {
                    run($crate::common::DriverKind::Epoll);
                }

                $(#[$meta])*
                #[test]
                fn uring() {
                    if let Some(reason) = $crate::common::uring_unavailable() {
                        eprintln!("skipped on io_uring: {reason}");
                        return;
                    }
                    run($crate::common::DriverKind::Uring);
                }
            }
        )*
    };
}

/// A blocking client: connect, send `req`, read until EOF or `expect` bytes.
pub fn roundtrip(addr: SocketAddr, req: &[u8], expect: usize) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(req).unwrap();
    let mut out = vec![0u8; expect];
    s.read_exact(&mut out).expect("read reply");
    out
}

/// An echo handler: writes back what it reads until EOF.
pub async fn echo(stream: hotloop::net::TcpStream) {
    let mut buf = Vec::with_capacity(4096);
    loop {
        let (res, b) = stream.read(buf).await;
        buf = b;
        match res {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let (res, b) = stream.write_all(buf).await;
        buf = b;
        if res.is_err() {
            return;
        }
    }
}
