//! quinn's server configuration: the TLS identity (given, and reloaded on
//! SIGHUP, or a self-signed certificate made at start), TLS 1.3 with the ALPN id, the
//! transport's windows, stream counts and idle timeout, and the bounds on
//! the connection attempts quinn queues.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use hotloop::tls::rustls;
use hotloop::tls::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use hotloop::tls::CertReloader;
use quinn::crypto::rustls::QuicServerConfig;
use quinn::{IdleTimeout, TransportConfig, VarInt};

use super::settings::ALPN_H3;
use crate::serve_args::{millis_or_never, ServeArgs};

/// Connection attempts quinn queues per endpoint before the accept loop
/// takes them; beyond it new ones are dropped unanswered.
const INCOMING_PER_ENDPOINT_MAX: usize = 1024;
/// What quinn buffers for one queued attempt after its first datagram (more
/// Initial datagrams of a large ClientHello).
const INCOMING_BUFFER_BYTES: u64 = 16 * 1024;
/// The same over all queued attempts of one endpoint.
const INCOMING_BUFFERS_TOTAL_BYTES: u64 = 1024 * 1024;

/// The certificate a server serves.
pub(super) enum Identity {
    /// `--tls-cert` and `--tls-key`, which SIGHUP reloads.
    Files(Arc<CertReloader>),
    /// Made at start.
    Generated(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>),
}

/// The certificate to serve, and a line for the operator saying where it
/// came from.
pub(super) fn identity(args: &ServeArgs, addr: SocketAddr) -> io::Result<(Identity, String)> {
    if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
        let certs = CertReloader::from_pem_files(cert, key)
            .map_err(|e| crate::tls::identity_error(cert, key, e))?;
        return Ok((Identity::Files(certs), format!("certificate from {}", cert.display())));
    }
    let mut names = vec!["localhost".to_string(), "127.0.0.1".to_string(), "::1".to_string()];
    if !addr.ip().is_unspecified() && !names.contains(&addr.ip().to_string()) {
        names.push(addr.ip().to_string());
    }
    let made = rcgen::generate_simple_self_signed(names.clone())
        .map_err(|e| io::Error::other(format!("making a self-signed certificate: {e}")))?;
    let der = CertificateDer::from(made.cert.der().to_vec());
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(made.key_pair.serialize_der()));
    let fingerprint = sha256_hex(&der);
    let note = match &args.write_cert {
        Some(path) => {
            std::fs::write(path, made.cert.pem()).map_err(|e| {
                io::Error::new(e.kind(), format!("writing the certificate to {}: {e}", path.display()))
            })?;
            format!(
                "self-signed certificate for {} written to {} (SHA-256 {fingerprint})",
                names.join(", "),
                path.display()
            )
        }
        None => format!(
            "self-signed certificate for {} (SHA-256 {fingerprint}), not saved: pass --write-cert FILE for clients to trust it",
            names.join(", ")
        ),
    };
    Ok((Identity::Generated(vec![der], key), note))
}

/// The SHA-256 of `data` as colon-separated hex, as `openssl x509 -fingerprint` prints it.
fn sha256_hex(data: &[u8]) -> String {
    let suite = rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256;
    let Some(tls13) = suite.tls13() else { return String::from("unavailable") };
    let digest = tls13.common.hash_provider.hash(data);
    digest.as_ref().iter().map(|b| format!("{b:02X}")).collect::<Vec<_>>().join(":")
}

/// quinn's server configuration: TLS 1.3 with `alpn`, the idle timeout,
/// the flow-control windows and bidirectional stream count of [`QuicArgs`]
/// (and no unidirectional streams for echo, which nothing would read), and
/// bounds on the connection attempts quinn queues.
///
/// [`QuicArgs`]: crate::serve_args::QuicArgs
pub(super) fn server_config(
    args: &ServeArgs,
    identity: &Identity,
    alpn: &[u8],
) -> io::Result<quinn::ServerConfig> {
    let invalid = |msg: String| io::Error::new(io::ErrorKind::InvalidInput, msg);
    let tls = match identity {
        Identity::Files(certs) => {
            certs.server_config_with_versions(&[&rustls::version::TLS13], &[alpn])?
        }
        Identity::Generated(certs, key) => {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let mut tls = rustls::ServerConfig::builder_with_provider(provider)
                .with_protocol_versions(&[&rustls::version::TLS13])
                .map_err(|e| invalid(e.to_string()))?
                .with_no_client_auth()
                .with_single_cert(certs.clone(), key.clone_key())
                .map_err(|e| invalid(format!("the generated certificate is unusable: {e}")))?;
            tls.alpn_protocols = vec![alpn.to_vec()];
            tls
        }
    };
    let crypto = QuicServerConfig::try_from(tls).map_err(|e| invalid(e.to_string()))?;
    let q = &args.quic;
    let mut transport = TransportConfig::default();
    transport.max_concurrent_bidi_streams(VarInt::from_u32(q.quic_max_streams));
    // quinn's defaults are sized for one fast stream (1.25 MB a stream, no
    // bound for the connection, 10 MB to send): a client that opens many
    // streams and reads nothing would make the server hold 1.4 MB each.
    transport.receive_window(VarInt::from_u32(q.quic_receive_window_bytes));
    transport.stream_receive_window(VarInt::from_u32(q.quic_stream_receive_window_bytes));
    transport.send_window(u64::from(q.quic_send_window_bytes));
    // Neither echo nor HTTP/3 reads DATAGRAM frames: not offering them
    // keeps a client from parking up to quinn's default 1.25 MB of them in
    // each connection.
    transport.datagram_receive_buffer_size(None);
    // HTTP/3 opens three unidirectional streams (control, QPACK encoder
    // and decoder); echo has no use for any.
    let uni = if alpn == ALPN_H3 { 8 } else { 0 };
    transport.max_concurrent_uni_streams(VarInt::from_u32(uni));
    let idle = match millis_or_never(args.idle_timeout_ms) {
        Some(d) => Some(IdleTimeout::try_from(d).map_err(|_| {
            invalid(format!("--idle-timeout-ms {} is too long", args.idle_timeout_ms))
        })?),
        None => None,
    };
    transport.max_idle_timeout(idle);
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    config.transport_config(Arc::new(transport));
    config.max_incoming(INCOMING_PER_ENDPOINT_MAX);
    config.incoming_buffer_size(INCOMING_BUFFER_BYTES);
    config.incoming_buffer_size_total(INCOMING_BUFFERS_TOTAL_BYTES);
    Ok(config)
}
