//! TLS on rustls (feature `tls`): an acceptor for servers, a connector for
//! clients, [`serve_tls`], [`serve`](crate::net::serve) with a TLS
//! handshake before the handler runs, and [`CertReloader`], a certificate
//! that can be read again from its files while the server runs.
//!
//! The TLS layer is `tokio-rustls` over [`TcpStream`]'s tokio traits, on
//! either driver. Every handshake has a time limit
//! ([`HANDSHAKE_TIMEOUT_DEFAULT`], 10 s): a client that sends garbage, an
//! old protocol version, or stalls halfway through loses its connection
//! within that limit and costs nothing else.
//!
//! ```no_run
//! use hotloop::tls::{serve_tls, TlsAcceptor};
//! use hotloop::net::ListenerOptions;
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//!
//! let rt = hotloop::Runtime::builder().build()?;
//! let acceptor = TlsAcceptor::from_pem_files("cert.pem", "key.pem")?;
//! let server = serve_tls(rt.handle(), "127.0.0.1:8443", ListenerOptions::default(), acceptor,
//!     |mut tls| async move {
//!         let mut buf = [0u8; 1024];
//!         while let Ok(n @ 1..) = tls.read(&mut buf).await {
//!             if tls.write_all(&buf[..n]).await.is_err() { break; }
//!         }
//!     })?;
//! rt.block_on(server.stopped())
//! # ;Ok::<(), std::io::Error>(())
//! ```
//!
//! The crypto provider is rustls' `ring`; configurations built here name
//! it explicitly, so another provider elsewhere in the program does not
//! make rustls' process-wide default ambiguous.

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

pub use rustls;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

use crate::net::{Server, ServerOptions, StopSignal, TcpStream, ToSocketAddrs};
use crate::stats::{count_event, LIFECYCLE};
use crate::Handle;

/// A server-side TLS connection over a hotloop [`TcpStream`].
pub type ServerTlsStream = tokio_rustls::server::TlsStream<TcpStream>;
/// A client-side TLS connection over a hotloop [`TcpStream`].
pub type ClientTlsStream = tokio_rustls::client::TlsStream<TcpStream>;

/// How long a handshake may take unless set otherwise.
pub const HANDSHAKE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);

/// The ALPN protocol id of HTTP/2.
pub const ALPN_H2: &[u8] = b"h2";
/// The ALPN protocol id of HTTP/1.1.
pub const ALPN_HTTP11: &[u8] = b"http/1.1";

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

/// Reads every certificate in a PEM file (the leaf first, then its chain).
pub fn load_certs(path: impl AsRef<Path>) -> io::Result<Vec<CertificateDer<'static>>> {
    let path = path.as_ref();
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| invalid(format!("reading certificates from {}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(invalid(format!("no certificate found in {}", path.display())));
    }
    Ok(certs)
}

/// Reads the first private key (PKCS#8, PKCS#1 or SEC1) in a PEM file.
pub fn load_private_key(path: impl AsRef<Path>) -> io::Result<PrivateKeyDer<'static>> {
    let path = path.as_ref();
    PrivateKeyDer::from_pem_file(path)
        .map_err(|e| invalid(format!("reading a private key from {}: {e}", path.display())))
}

/// A rustls server configuration (TLS 1.2 and 1.3, no client
/// certificates) from a certificate chain and key, with ALPN set to
/// `alpn` (e.g. `&[ALPN_H2, ALPN_HTTP11]`, or empty for none).
pub fn server_config(
    certs: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    alpn: &[&[u8]],
) -> io::Result<ServerConfig> {
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| invalid(format!("certificate and key do not make a server identity: {e}")))?;
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

/// A certificate chain and private key read from two PEM files, which
/// [`CertReloader::reload`] reads again while the server runs (on SIGHUP,
/// say): new handshakes get the new certificate, connections already
/// established keep theirs. A file that is missing, unreadable or does
/// not match its key is refused, and the previous certificate stays.
///
/// It is rustls' certificate resolver for the configurations it makes
/// ([`CertReloader::server_config`]), so a TLS server over TCP and a
/// QUIC server can share one.
///
/// ```no_run
/// use hotloop::tls::{CertReloader, TlsAcceptor, ALPN_H2, ALPN_HTTP11};
/// let certs = CertReloader::from_pem_files("cert.pem", "key.pem")?;
/// let acceptor = TlsAcceptor::new(certs.server_config(&[ALPN_H2, ALPN_HTTP11])?);
/// // Later, when the files were replaced:
/// if let Err(e) = certs.reload() {
///     eprintln!("kept the previous certificate: {e}");
/// }
/// # Ok::<(), std::io::Error>(())
/// ```
pub struct CertReloader {
    cert: PathBuf,
    key: PathBuf,
    provider: Arc<rustls::crypto::CryptoProvider>,
    current: RwLock<Arc<CertifiedKey>>,
    /// Held by a reload from its read of the files to its store: of two
    /// reloads at once, the one that read the older files could otherwise
    /// store last, and the older certificate would stay.
    reloading: Mutex<()>,
}

impl CertReloader {
    /// Reads the chain (the server's certificate first) and the key
    /// (PKCS#8, PKCS#1 or SEC1), which must match.
    pub fn from_pem_files(
        cert: impl AsRef<Path>,
        key: impl AsRef<Path>,
    ) -> io::Result<Arc<CertReloader>> {
        let (cert, key) = (cert.as_ref().to_path_buf(), key.as_ref().to_path_buf());
        let provider = provider();
        let current = RwLock::new(Arc::new(certified_key(&cert, &key, &provider)?));
        Ok(Arc::new(CertReloader { cert, key, provider, current, reloading: Mutex::new(()) }))
    }

    /// Reads both files again. On success new handshakes use them; on an
    /// error (logged, and counted in `tls_reload_failures`) the previous
    /// certificate stays in use. Reloads from several threads at once
    /// run one after the other, so the last to start installs what the
    /// files held last.
    pub fn reload(&self) -> io::Result<()> {
        self.reload_from(|| certified_key(&self.cert, &self.key, &self.provider))
    }

    /// [`Self::reload`] with what `read` makes of the files.
    fn reload_from(&self, read: impl FnOnce() -> io::Result<CertifiedKey>) -> io::Result<()> {
        let _one_at_a_time = self.reloading.lock().unwrap_or_else(|e| e.into_inner());
        match read() {
            Ok(fresh) => {
                *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(fresh);
                count_event(&LIFECYCLE.tls_reloads, 1);
                crate::log::info(format_args!(
                    "TLS: reloaded the certificate from {} for new handshakes",
                    self.cert.display()
                ));
                Ok(())
            }
            Err(e) => {
                count_event(&LIFECYCLE.tls_reload_failures, 1);
                crate::log::warn(format_args!(
                    "TLS: certificate reload refused, keeping the previous one: {e}"
                ));
                Err(e)
            }
        }
    }

    /// The certificate file.
    pub fn cert_path(&self) -> &Path {
        &self.cert
    }

    /// The certificate new handshakes get now.
    pub fn current(&self) -> Arc<CertifiedKey> {
        self.current.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// A server configuration (TLS 1.2 and 1.3, no client certificates,
    /// ALPN `alpn`) whose certificate is this one, reloads included.
    pub fn server_config(self: &Arc<Self>, alpn: &[&[u8]]) -> io::Result<ServerConfig> {
        self.server_config_with_versions(rustls::DEFAULT_VERSIONS, alpn)
    }

    /// [`CertReloader::server_config`] for the protocol versions given
    /// (QUIC takes TLS 1.3 only).
    pub fn server_config_with_versions(
        self: &Arc<Self>,
        versions: &[&'static rustls::SupportedProtocolVersion],
        alpn: &[&[u8]],
    ) -> io::Result<ServerConfig> {
        let mut config = ServerConfig::builder_with_provider(self.provider.clone())
            .with_protocol_versions(versions)
            .map_err(|e| invalid(e.to_string()))?
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(config)
    }
}

impl std::fmt::Debug for CertReloader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertReloader").field("cert", &self.cert).field("key", &self.key).finish()
    }
}

impl ResolvesServerCert for CertReloader {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// The chain and key of two PEM files, checked against each other.
fn certified_key(
    cert: &Path,
    key: &Path,
    provider: &rustls::crypto::CryptoProvider,
) -> io::Result<CertifiedKey> {
    let certs = load_certs(cert)?;
    let key_der = load_private_key(key)?;
    CertifiedKey::from_der(certs, key_der, provider).map_err(|e| {
        invalid(format!(
            "{} with {}: certificate and key do not make a server identity: {e}",
            cert.display(),
            key.display()
        ))
    })
}

/// Accepts TLS connections: performs the server side of the handshake on
/// an accepted [`TcpStream`], within a time limit.
#[derive(Clone)]
pub struct TlsAcceptor {
    config: Arc<ServerConfig>,
    handshake_timeout: Duration,
}

impl TlsAcceptor {
    /// An acceptor with `config` as it is (its ALPN list included).
    pub fn new(config: impl Into<Arc<ServerConfig>>) -> Self {
        TlsAcceptor { config: config.into(), handshake_timeout: HANDSHAKE_TIMEOUT_DEFAULT }
    }

    /// An acceptor for the certificate chain and private key in two PEM
    /// files, offering ALPN `h2` and `http/1.1`.
    pub fn from_pem_files(cert: impl AsRef<Path>, key: impl AsRef<Path>) -> io::Result<Self> {
        let config =
            server_config(load_certs(cert)?, load_private_key(key)?, &[ALPN_H2, ALPN_HTTP11])?;
        Ok(Self::new(config))
    }

    /// Sets the most time a handshake may take (default 10 s); a client that
    /// has not finished by then is disconnected.
    pub fn handshake_timeout(mut self, limit: Duration) -> Self {
        self.handshake_timeout = limit;
        self
    }

    /// The configured handshake limit.
    pub fn handshake_timeout_limit(&self) -> Duration {
        self.handshake_timeout
    }

    /// The rustls configuration.
    pub fn config(&self) -> &Arc<ServerConfig> {
        &self.config
    }

    /// The same acceptor, offering `alpn` if the configuration offers no ALPN
    /// protocol yet (how `serve_hyper_tls` makes sure h2 can be negotiated).
    pub fn with_default_alpn(mut self, alpn: &[&[u8]]) -> Self {
        if self.config.alpn_protocols.is_empty() {
            let mut config = (*self.config).clone();
            config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
            self.config = Arc::new(config);
        }
        self
    }

    /// Performs the server handshake on `stream`. Fails with
    /// `ErrorKind::TimedOut` if the client takes longer than the handshake
    /// limit, and with `InvalidData` (or the I/O error) if it fails.
    ///
    /// The future holds the handshake once: every connection's task is as
    /// large as its largest state, so a handshake stored three times over
    /// (as `time::timeout`'s nested `async fn`s store their future, 3.9 KB
    /// here) stayed in every idle TLS connection's memory long after the
    /// handshake ended; `Handshake` is 1.3 KB.
    pub fn accept(&self, stream: TcpStream) -> impl Future<Output = io::Result<ServerTlsStream>> {
        self.handshake(stream, None)
    }

    /// [`accept`](Self::accept) for a connection of a server that may
    /// stop ([`serve_tls_with_stop`] uses it): once `stop` says the server
    /// is stopping, a handshake whose client has sent nothing for the
    /// drain's quiet time ([`StopSignal::idle_close_after`]; counted from
    /// the connection's start if it never sent a byte) fails with
    /// `ErrorKind::ConnectionAborted`, as a keep-alive connection idle
    /// that long is closed. Before, such a connection (a client that
    /// connected and stayed silent) held the drain until the handshake
    /// limit, or was cut at the drain's deadline. A client that is
    /// sending goes on within the limit.
    pub fn accept_with_stop(
        &self,
        stream: TcpStream,
        stop: &StopSignal,
    ) -> impl Future<Output = io::Result<ServerTlsStream>> {
        self.handshake(stream, Some(stop.clone()))
    }

    fn handshake(&self, stream: TcpStream, stop: Option<StopSignal>) -> Handshake {
        let limit = crate::time::sleep(self.handshake_timeout);
        Handshake {
            deadline: limit.deadline(),
            accept: tokio_rustls::TlsAcceptor::from(self.config.clone()).accept(stream),
            limit,
            stop,
        }
    }
}

impl std::fmt::Debug for TlsAcceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsAcceptor")
            .field("alpn", &self.config.alpn_protocols)
            .field("handshake_timeout", &self.handshake_timeout)
            .finish()
    }
}

/// A server handshake within its time limit: [`TlsAcceptor::accept`]'s
/// future, the handshake and its timer side by side. While its server
/// stops, the timer also wakes it to look whether the client is still
/// sending ([`TlsAcceptor::accept_with_stop`]).
struct Handshake {
    accept: tokio_rustls::Accept<TcpStream>,
    /// At `deadline`, or sooner for the next look during a stop.
    limit: crate::time::Sleep,
    /// The handshake's time limit.
    deadline: Instant,
    stop: Option<StopSignal>,
}

impl Handshake {
    /// During a stop: `None` if the client has sent nothing for the
    /// drain's quiet time (nothing waits in the socket, and the kernel's
    /// last data from it, which counts bytes rustls or io_uring have taken
    /// already, is that old; where the kernel cannot say, the socket alone
    /// decides), else how long until the next look.
    fn quiet_left(&self, quiet: Duration) -> Option<Duration> {
        let Some(stream) = self.accept.get_ref() else { return Some(quiet) };
        let probe = stream.input_probe();
        if probe.pending().unwrap_or(false) {
            return Some(quiet);
        }
        match probe.since_data_received() {
            Ok(since) if since < quiet => Some(quiet - since),
            _ => None,
        }
    }

    /// Looks at a stopping server's client (see [`Self::quiet_left`]):
    /// false if the handshake should end now, else the timer is set for
    /// the next look (or the limit, if sooner).
    fn look(&mut self) -> bool {
        let quiet = self.stop.as_ref().and_then(StopSignal::idle_close_after);
        // No quiet time: the drain closes no idle connection before its deadline.
        let wait = match quiet {
            Some(quiet) => match self.quiet_left(quiet) {
                Some(wait) => wait,
                None => return false,
            },
            None => Duration::MAX,
        };
        let next =
            crate::time::now().checked_add(wait).map_or(self.deadline, |t| t.min(self.deadline));
        self.limit.reset(next);
        true
    }
}

impl Future for Handshake {
    type Output = io::Result<ServerTlsStream>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        if let Poll::Ready(done) = Pin::new(&mut this.accept).poll(cx) {
            return Poll::Ready(done);
        }
        let aborted =
            || io::Error::new(io::ErrorKind::ConnectionAborted, "server stopping, client silent");
        // The stop wakes every task of the worker: the first poll after it
        // looks at once (the timer still at the limit says no look yet).
        let stopping = this.stop.as_ref().is_some_and(StopSignal::is_stopping);
        if stopping && this.limit.deadline() >= this.deadline && !this.look() {
            return Poll::Ready(Err(aborted()));
        }
        loop {
            std::task::ready!(Pin::new(&mut this.limit).poll(cx));
            if this.limit.deadline() >= this.deadline {
                let timed_out = io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out");
                return Poll::Ready(Err(timed_out));
            }
            if !this.look() {
                return Poll::Ready(Err(aborted()));
            }
        }
    }
}

/// Opens TLS connections: the client side of the handshake, within a time limit.
#[derive(Clone)]
pub struct TlsConnector {
    config: Arc<ClientConfig>,
    handshake_timeout: Duration,
}

impl TlsConnector {
    /// A connector with `config` as it is.
    pub fn new(config: impl Into<Arc<ClientConfig>>) -> Self {
        TlsConnector { config: config.into(), handshake_timeout: HANDSHAKE_TIMEOUT_DEFAULT }
    }

    /// A connector that trusts the certificates in `roots` (DER), offering
    /// ALPN `alpn` (empty for none).
    pub fn with_roots(
        roots: impl IntoIterator<Item = CertificateDer<'static>>,
        alpn: &[&[u8]],
    ) -> io::Result<Self> {
        let mut store = RootCertStore::empty();
        for cert in roots {
            store.add(cert).map_err(|e| invalid(format!("unusable root certificate: {e}")))?;
        }
        let mut config = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| invalid(e.to_string()))?
            .with_root_certificates(store)
            .with_no_client_auth();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(Self::new(config))
    }

    /// A connector that trusts the certificates in a PEM file (a private CA,
    /// or a self-signed server certificate), offering ALPN `alpn`.
    pub fn from_root_pem_file(path: impl AsRef<Path>, alpn: &[&[u8]]) -> io::Result<Self> {
        Self::with_roots(load_certs(path)?, alpn)
    }

    /// Sets the most time a handshake may take (default 10 s).
    pub fn handshake_timeout(mut self, limit: Duration) -> Self {
        self.handshake_timeout = limit;
        self
    }

    /// The rustls configuration.
    pub fn config(&self) -> &Arc<ClientConfig> {
        &self.config
    }

    /// Performs the client handshake on a connected `stream`, checking the
    /// server's certificate against `server_name` (a DNS name or an IP).
    pub async fn connect(
        &self,
        server_name: &str,
        stream: TcpStream,
    ) -> io::Result<ClientTlsStream> {
        let name = ServerName::try_from(server_name.to_owned())
            .map_err(|e| invalid(format!("invalid TLS server name `{server_name}`: {e}")))?;
        let connector = tokio_rustls::TlsConnector::from(self.config.clone());
        crate::time::timeout(self.handshake_timeout, connector.connect(name, stream))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out"))?
    }

    /// Connects to `addr` (resolving a host name off the worker) and
    /// performs the handshake for `server_name`.
    pub async fn connect_to(
        &self,
        addr: impl ToSocketAddrs,
        server_name: &str,
    ) -> io::Result<ClientTlsStream> {
        let stream = TcpStream::connect(addr).await?;
        self.connect(server_name, stream).await
    }
}

impl std::fmt::Debug for TlsConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConnector")
            .field("alpn", &self.config.alpn_protocols)
            .field("handshake_timeout", &self.handshake_timeout)
            .finish()
    }
}

/// [`serve`](crate::net::serve) over TLS: each accepted connection is
/// handshaken by `acceptor` (within its time limit) on the worker that
/// accepted it, then handed to `handler`. A failed handshake ends that
/// connection only.
pub fn serve_tls<H, Fut>(
    handle: impl AsRef<Handle>,
    addr: impl std::net::ToSocketAddrs,
    options: impl Into<ServerOptions>,
    acceptor: TlsAcceptor,
    handler: H,
) -> io::Result<Server>
where
    H: Fn(ServerTlsStream) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + 'static,
{
    let handle = handle.as_ref();
    serve_tls_with_stop(handle, addr, options, acceptor, move |tls, _stop| handler(tls))
}

/// [`serve_tls`] with the server's [`StopSignal`] for each handler.
pub fn serve_tls_with_stop<H, Fut>(
    handle: impl AsRef<Handle>,
    addr: impl std::net::ToSocketAddrs,
    options: impl Into<ServerOptions>,
    acceptor: TlsAcceptor,
    handler: H,
) -> io::Result<Server>
where
    H: Fn(ServerTlsStream, StopSignal) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + 'static,
{
    let handle = handle.as_ref();
    let handler = Arc::new(handler);
    crate::net::serve_with_stop(handle, addr, options, move |stream, stop| {
        let acceptor = acceptor.clone();
        let handler = handler.clone();
        async move {
            // A failed or timed-out handshake just ends this connection, and
            // so does a silent one when the server stops.
            if let Ok(tls) = acceptor.accept_with_stop(stream, &stop).await {
                handler(tls, stop).await;
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use std::mem::size_of;

    use super::*;

    /// Every TLS connection's task is at least as large as its handshake
    /// state, long after the handshake: the handshake holds the TLS stream
    /// once, beside its timer (3,856 bytes through `time::timeout`).
    /// Two reloads at once: the first has read the files (the older
    /// certificate) and not stored it yet when the second, which reads
    /// the newer, starts. The second waits for the first and stores last.
    /// Before, it stored first, and the first then put the older
    /// certificate back.
    #[test]
    fn concurrent_reloads_leave_the_newer_certificate() {
        use std::sync::mpsc;
        use std::time::Duration;

        let dir = std::env::temp_dir().join(format!("hotloop-reload-race-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
        let made = |name: &str| rcgen::generate_simple_self_signed(vec![name.to_string()]).unwrap();
        let first = made("first.test");
        std::fs::write(&cert, first.cert.pem()).unwrap();
        std::fs::write(&key, first.key_pair.serialize_pem()).unwrap();
        let certs = CertReloader::from_pem_files(&cert, &key).unwrap();
        let (older, newer) = (made("older.test"), made("newer.test"));
        let key_of = |c: &rcgen::CertifiedKey| {
            let der = PrivateKeyDer::Pkcs8(c.key_pair.serialize_der().into());
            let chain = vec![c.cert.der().clone()];
            CertifiedKey::from_der(chain, der, &certs.provider).unwrap()
        };
        let (older_key, newer_key) = (key_of(&older), key_of(&newer));

        let (read_tx, read_rx) = mpsc::channel();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let c = &*certs;
        std::thread::scope(|scope| {
            let a = scope.spawn(move || {
                c.reload_from(move || {
                    read_tx.send(()).unwrap();
                    go_rx.recv().unwrap();
                    Ok(older_key)
                })
            });
            read_rx.recv().unwrap();
            let (done_tx, done_rx) = mpsc::channel();
            let b = scope.spawn(move || {
                let r = c.reload_from(|| Ok(newer_key));
                let _ = done_tx.send(());
                r
            });
            // Unserialised, the second reload is done within this wait.
            let _ = done_rx.recv_timeout(Duration::from_millis(300));
            go_tx.send(()).unwrap();
            a.join().unwrap().unwrap();
            b.join().unwrap().unwrap();
        });
        assert_eq!(certs.current().cert[0], *newer.cert.der());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_handshake_holds_its_stream_once() {
        let stream = size_of::<ServerTlsStream>();
        let handshake = size_of::<Handshake>();
        assert!(handshake < stream + 256, "handshake {handshake} B, stream {stream} B");
    }
}
