//! Name resolution off the worker: [`lookup_host`] and the address forms
//! [`TcpStream::connect`](super::TcpStream::connect) accepts.
//!
//! A socket address (or an IP address with a port, or a string that parses
//! as one) is used as it is, with no resolution and no thread hop. A host
//! name is resolved with the system resolver (`getaddrinfo`, through
//! `std::net::ToSocketAddrs`) on the runtime's blocking pool, so a slow DNS
//! server or a stalled `nsswitch` module delays that one connect and no
//! other task on the worker.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::sync::RwLock;

/// A resolver: host and port to addresses. The default calls the system resolver.
#[cfg_attr(not(feature = "test-util"), allow(dead_code))]
pub type ResolverFn = fn(&str, u16) -> io::Result<Vec<SocketAddr>>;

/// The resolver every lookup uses; replaced only by tests.
static RESOLVER: RwLock<ResolverFn> = RwLock::new(system_resolver);

fn system_resolver(host: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
    std::net::ToSocketAddrs::to_socket_addrs(&(host, port)).map(Iterator::collect)
}

/// Replaces the resolver that host names go through (`None` restores the
/// system resolver). For tests that need a slow or scripted resolver; the
/// function runs on the blocking pool, exactly where `getaddrinfo` would.
#[cfg(feature = "test-util")]
pub fn set_resolver(resolver: Option<ResolverFn>) {
    *RESOLVER.write().unwrap_or_else(|e| e.into_inner()) = resolver.unwrap_or(system_resolver);
}

/// What an address argument needs before a connect: nothing, or a lookup.
#[derive(Debug, Clone)]
pub enum Target {
    /// Addresses known without resolution.
    Addrs(Vec<SocketAddr>),
    /// A host name and port to resolve.
    Lookup(String, u16),
}

/// Something that names one or more socket addresses: the forms of
/// `std::net::ToSocketAddrs` (`SocketAddr`, `(IpAddr, u16)`, `"host:port"`,
/// `("host", port)`, `&[SocketAddr]`, ...). Host names are resolved on the
/// blocking pool; everything else needs no resolution.
pub trait ToSocketAddrs {
    /// The addresses, or the host name and port to resolve.
    fn to_target(&self) -> io::Result<Target>;
}

impl<T: ToSocketAddrs + ?Sized> ToSocketAddrs for &T {
    fn to_target(&self) -> io::Result<Target> {
        (**self).to_target()
    }
}

macro_rules! addr_forms {
    ($($ty:ty),*) => {$(
        impl ToSocketAddrs for $ty {
            fn to_target(&self) -> io::Result<Target> {
                Ok(Target::Addrs(vec![SocketAddr::from(*self)]))
            }
        }
    )*};
}
addr_forms!(
    SocketAddr,
    SocketAddrV4,
    SocketAddrV6,
    (IpAddr, u16),
    (Ipv4Addr, u16),
    (Ipv6Addr, u16)
);

impl ToSocketAddrs for [SocketAddr] {
    fn to_target(&self) -> io::Result<Target> {
        Ok(Target::Addrs(self.to_vec()))
    }
}

impl ToSocketAddrs for str {
    fn to_target(&self) -> io::Result<Target> {
        if let Ok(addr) = self.parse::<SocketAddr>() {
            return Ok(Target::Addrs(vec![addr]));
        }
        let invalid = || io::Error::new(io::ErrorKind::InvalidInput, "invalid socket address");
        let (host, port) = self.rsplit_once(':').ok_or_else(invalid)?;
        let port = port.parse::<u16>().map_err(|_| invalid())?;
        (host, port).to_target()
    }
}

impl ToSocketAddrs for String {
    fn to_target(&self) -> io::Result<Target> {
        self.as_str().to_target()
    }
}

impl ToSocketAddrs for (&str, u16) {
    fn to_target(&self) -> io::Result<Target> {
        let (host, port) = *self;
        match host.parse::<IpAddr>() {
            Ok(ip) => Ok(Target::Addrs(vec![SocketAddr::new(ip, port)])),
            Err(_) => Ok(Target::Lookup(host.to_owned(), port)),
        }
    }
}

impl ToSocketAddrs for (String, u16) {
    fn to_target(&self) -> io::Result<Target> {
        (self.0.as_str(), self.1).to_target()
    }
}

impl Target {
    /// The addresses, resolving a host name on the blocking pool.
    pub(crate) async fn resolve(self) -> io::Result<Vec<SocketAddr>> {
        match self {
            Target::Addrs(addrs) => Ok(addrs),
            Target::Lookup(host, port) => {
                let resolver = *RESOLVER.read().unwrap_or_else(|e| e.into_inner());
                crate::spawn_blocking(move || resolver(&host, port))
                    .await
                    .map_err(|e| io::Error::other(format!("name resolution failed: {e}")))?
            }
        }
    }
}

/// Resolves `host` (`"example.com:443"`, `("example.com", 443)`, or any
/// [`ToSocketAddrs`] form) to socket addresses, as tokio's `lookup_host`
/// does. Host names are resolved on the runtime's blocking pool, so the
/// worker keeps serving other tasks meanwhile.
///
/// # Panics
/// Outside a hotloop worker.
pub async fn lookup_host(host: impl ToSocketAddrs) -> io::Result<impl Iterator<Item = SocketAddr>> {
    Ok(host.to_target()?.resolve().await?.into_iter())
}
