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

use std::net::SocketAddr;
use std::sync::Arc;

use hotloop::Runtime;
use quinn::{ServerConfig, TransportConfig, VarInt};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr: SocketAddr =
        std::env::args().nth(1).as_deref().unwrap_or("127.0.0.1:4433").parse()?;

    // 1. A certificate for the TLS handshake QUIC starts with.
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()])?;
    let cert_der = CertificateDer::from(cert.cert);
    std::fs::write("quic_echo_cert.der", &cert_der)?;
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(cert.key_pair.serialize_der()));

    // 2. quinn's server configuration: the certificate, and how many
    //    streams a client may open at once.
    let mut server_config = ServerConfig::with_single_cert(vec![cert_der], key)?;
    let mut transport = TransportConfig::default();
    transport.max_concurrent_bidi_streams(VarInt::from_u32(1024));
    server_config.transport_config(Arc::new(transport));

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
