//! `tls::CertReloader`: a certificate read again from its files while the
//! server runs. New handshakes get the new certificate, a connection made
//! before keeps working, and bad files are refused with the certificate in
//! use kept. Both drivers.

use crate::common::{self, Certificate};

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hotloop::net::ListenerOptions;
use hotloop::tls::rustls::pki_types::{CertificateDer, ServerName};
use hotloop::tls::{rustls, serve_tls, CertReloader, TlsAcceptor};
use hotloop::{DriverKind, Runtime};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A self-signed certificate for `localhost`.
fn certificate() -> Certificate {
    common::certificate(&["localhost"])
}

type Client = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// A client trusting every certificate in `trusted`, handshake done.
fn connect(addr: SocketAddr, trusted: &[CertificateDer<'static>]) -> Client {
    let mut roots = rustls::RootCertStore::empty();
    for c in trusted {
        roots.add(c.clone()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = ServerName::try_from("localhost").unwrap();
    let conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    while tls.conn.is_handshaking() {
        tls.conn.complete_io(&mut tls.sock).unwrap();
    }
    tls
}

fn served(client: &Client) -> CertificateDer<'static> {
    client.conn.peer_certificates().unwrap()[0].clone().into_owned()
}

fn echo(client: &mut Client, msg: &[u8]) -> Vec<u8> {
    client.write_all(msg).unwrap();
    let mut back = vec![0u8; msg.len()];
    client.read_exact(&mut back).unwrap();
    back
}

fn first_cert(path: &Path) -> CertificateDer<'static> {
    hotloop::tls::load_certs(path).unwrap().remove(0)
}

#[hotloop::test(driver = "all")]
fn a_reload_serves_new_handshakes_and_a_bad_file_keeps_the_certificate(driver: DriverKind) {
    let (one, two) = (certificate(), certificate());
    let (cert, key) = (&one.path, &one.key);
    let (second_cert, second_key) = (&two.path, &two.key);
    let (first, second) = (first_cert(cert), first_cert(second_cert));
    let trusted = [first.clone(), second.clone()];
    let certs = CertReloader::from_pem_files(cert, key).unwrap();
    let acceptor = TlsAcceptor::new(certs.server_config(&[]).unwrap());
    let rt = Runtime::builder().workers(2).driver(driver).build().unwrap();
    let server = serve_tls(
        rt.handle(),
        "127.0.0.1:0",
        ListenerOptions::default(),
        acceptor,
        |mut tls| async move {
            let mut buf = [0u8; 256];
            while let Ok(n @ 1..) = tls.read(&mut buf).await {
                if tls.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        },
    )
    .unwrap();
    let addr = server.local_addr();
    let mut before = connect(addr, &trusted);
    assert_eq!(served(&before), first);
    let stats = rt.stats().lifecycle;

    std::fs::copy(second_cert, cert).unwrap();
    std::fs::copy(second_key, key).unwrap();
    certs.reload().unwrap();
    assert_eq!(served(&connect(addr, &trusted)), second, "{driver:?}: a new handshake");
    assert_eq!(echo(&mut before, b"still here"), b"still here", "the connection made before");

    // A certificate whose key is not the one beside it, then a file that
    // is no certificate at all.
    let third = certificate();
    std::fs::copy(&third.path, cert).unwrap();
    let mismatch = certs.reload().unwrap_err();
    assert!(mismatch.to_string().contains("do not make a server identity"), "{mismatch}");
    std::fs::write(cert, "not a certificate").unwrap();
    assert!(certs.reload().is_err());
    assert_eq!(served(&connect(addr, &trusted)), second, "{driver:?}: after bad files");
    let after = rt.stats().lifecycle;
    assert!(after.tls_reloads > stats.tls_reloads);
    assert!(after.tls_reload_failures >= stats.tls_reload_failures + 2);
    drop(before);
    server.drain_blocking(Duration::from_secs(5));
}
