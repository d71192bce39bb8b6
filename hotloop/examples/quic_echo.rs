//! A QUIC echo server on hotloop: every worker runs its own quinn endpoint
//! on the same UDP port (`SO_REUSEPORT`), and every bidirectional stream
//! gets back what it sent.
//!
//! ```sh
//! cargo run --release -p hotloop --features quic --example quic_echo -- 127.0.0.1:4433
//! ```
//!
//! The certificate is self-signed for "localhost" and generated at start;
//! its DER form is written to `quic_echo_cert.der` in the current directory
//! so a client can trust it.
//!
//! QUIC's handshake requires an application protocol (ALPN, RFC 9001
//! section 8.1): clients that offer none, or another, are refused. This
//! server speaks [`ALPN`], `hotloop-echo`, as `hotloop serve quic` does, so
//! a client sets the same (quinn: `rustls::ClientConfig::alpn_protocols`).

use std::net::SocketAddr;
use std::sync::Arc;

use hotloop::Runtime;
use quinn::crypto::rustls::QuicServerConfig;
use quinn::{ServerConfig, TransportConfig, VarInt};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// The application protocol this echo server speaks.
pub const ALPN: &[u8] = b"hotloop-echo";

/// quinn's server configuration: TLS 1.3 with the certificate and the
/// ALPN, and how many streams a client may open at once.
pub fn server_config(
    cert_der: CertificateDer<'static>,
    key: PrivateKeyDer<'static>,
) -> Result<ServerConfig, Box<dyn std::error::Error>> {
    let mut tls = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])?
    .with_no_client_auth()
    .with_single_cert(vec![cert_der], key)?;
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let mut server_config = ServerConfig::with_crypto(Arc::new(QuicServerConfig::try_from(tls)?));
    let mut transport = TransportConfig::default();
    transport.max_concurrent_bidi_streams(VarInt::from_u32(1024));
    server_config.transport_config(Arc::new(transport));
    Ok(server_config)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr: SocketAddr =
        std::env::args().nth(1).as_deref().unwrap_or("127.0.0.1:4433").parse()?;

    // 1. A certificate for the TLS handshake QUIC starts with.
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()])?;
    let cert_der = CertificateDer::from(cert.cert);
    std::fs::write("quic_echo_cert.der", &cert_der)?;
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(cert.key_pair.serialize_der()));

    let server_config = server_config(cert_der, key)?;

    // 3. One worker per core; each binds its own endpoint to `addr`.
    let rt = Runtime::builder().build()?;
    println!("QUIC echo on {addr} with {} workers", rt.handle().workers());
    rt.block_on_all(move |worker| {
        let server_config = server_config.clone();
        async move {
            let endpoint = match hotloop::quic::endpoint(addr, Some(server_config)) {
                Ok(endpoint) => endpoint,
                Err(e) => return eprintln!("worker {worker}: cannot bind {addr}: {e}"),
            };
            // 4. Accept connections; each gets a task on this worker.
            while let Some(incoming) = endpoint.accept().await {
                hotloop::spawn(async move {
                    let connection = match incoming.await {
                        Ok(c) => c,
                        Err(e) => return eprintln!("handshake failed: {e}"),
                    };
                    // 5. Each stream the client opens gets a task too.
                    while let Ok((mut send, mut recv)) = connection.accept_bi().await {
                        hotloop::spawn(async move {
                            let mut buf = vec![0u8; 64 * 1024];
                            while let Ok(Some(n)) = recv.read(&mut buf).await {
                                if send.write_all(&buf[..n]).await.is_err() {
                                    return;
                                }
                            }
                            let _ = send.finish();
                        });
                    }
                });
            }
        }
    });
    Ok(())
}
