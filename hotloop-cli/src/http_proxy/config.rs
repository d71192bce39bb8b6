//! What `proxy --mode http` is told: the backend groups and the routes to
//! them, from a TOML file (`--config`) or from `--backend` alone.
//!
//! A file is read whole before anything starts, and a bad one is refused
//! with its line and the reason (`proxy.toml:7: groups.api.retries: must
//! be a whole number from 0 to 16`); an unknown key is an error too, so a
//! misspelt setting never silently keeps its default.

use std::net::{SocketAddr, ToSocketAddrs};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hotloop::tls::rustls;
use hotloop::tls::{TlsConnector, ALPN_H2, ALPN_HTTP11};
use toml_edit::{Document, Table};

/// How the proxy speaks to a group's backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamProtocol {
    /// HTTP/1.1, one request at a time per connection, kept alive.
    Http1,
    /// HTTP/2 by prior knowledge: one connection per backend and worker,
    /// requests multiplexed on it.
    H2,
}

/// One named group of backends and how they are used.
#[derive(Debug, Clone)]
pub struct GroupConfig {
    /// The group's name (`[groups.NAME]`).
    pub name: String,
    /// The backends' addresses, as written, and resolved.
    pub backends: Vec<(String, SocketAddr)>,
    /// HTTP/1.1 or HTTP/2 to the backends.
    pub protocol: UpstreamProtocol,
    /// One connect's limit; then the next backend is tried.
    pub connect_timeout: Duration,
    /// From the request's body all sent to the backend's response head:
    /// 504 past it.
    pub header_timeout: Duration,
    /// The longest wait for the next piece of a backend's response body
    /// (past it the response is cut), or of a request's body on its way
    /// to the backend (past it 408 if the client paused, 504 if the
    /// backend did).
    pub body_timeout: Duration,
    /// How many other backends a request may move to when nothing of it
    /// reached a backend (any method), or when an idempotent request
    /// without a body got no answer.
    pub retries: usize,
    /// Idle keep-alive connections kept per backend on each worker.
    pub pool_idle_max: usize,
    /// An idle pooled connection older than this is closed.
    pub pool_idle_timeout: Duration,
    /// The longest a request waits for an idle HTTP/1.1 connection, one of
    /// its own worker's coming back from a request or one borrowed from
    /// another worker's pool, when its worker has none; zero: never waits.
    pub pool_borrow: Duration,
    /// Consecutive failures (connect errors, timeouts, connections lost
    /// before the answer; 5xx answers too with `fail_on_5xx`) that take a
    /// backend out of rotation, unless it is the last of its group that
    /// takes requests.
    pub max_fails: u32,
    /// Whether a 5xx answer counts as its backend's failure. Off by
    /// default: an answer is the backend's, whatever its status, and any
    /// client can provoke 5xx answers (an unhandled exception, a 501 for a
    /// method the application does not know).
    pub fail_on_5xx: bool,
    /// How long a backend so taken out stays out.
    pub fail_timeout: Duration,
    /// Active checks, if the group has a `health_path`.
    pub health: Option<HealthConfig>,
    /// TLS to each backend, in the order of `backends` (`None`: plain TCP).
    pub tls: Vec<Option<BackendTls>>,
}

/// How the proxy speaks TLS to one backend.
#[derive(Debug, Clone)]
pub struct BackendTls {
    /// The client side of the handshake: the roots the backend's
    /// certificate is checked against (or no check), and ALPN offering
    /// the group's protocol.
    pub connector: TlsConnector,
    /// Sent as SNI, and the name the backend's certificate must hold.
    pub server_name: String,
}

/// A group's active health checks.
#[derive(Debug, Clone)]
pub struct HealthConfig {
    /// The path every check asks for (`GET`); 2xx and 3xx pass.
    pub path: String,
    /// Between two checks of one backend.
    pub interval: Duration,
    /// One check's limit (connect and answer).
    pub timeout: Duration,
    /// Consecutive passes that bring a down backend back.
    pub rise: u32,
    /// Consecutive failures that take an up backend down.
    pub fall: u32,
}

/// One route: a request whose host and path match goes to `group`.
#[derive(Debug, Clone)]
pub struct RouteConfig {
    /// The host, lowercase, without port: exact, or `*.example.com` for
    /// any subdomain; `None` matches every host.
    pub host: Option<String>,
    /// A path prefix; `None` matches every path.
    pub path: Option<String>,
    /// The index of the group in [`Config::groups`].
    pub group: usize,
}

/// The whole configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The groups, in the file's order.
    pub groups: Vec<GroupConfig>,
    /// The routes, tried in the file's order; the first match wins.
    pub routes: Vec<RouteConfig>,
}

impl GroupConfig {
    /// A group with every setting at its default.
    fn with_defaults(name: &str) -> GroupConfig {
        GroupConfig {
            name: name.to_string(),
            backends: Vec::new(),
            protocol: UpstreamProtocol::Http1,
            connect_timeout: Duration::from_millis(1000),
            header_timeout: Duration::from_millis(30_000),
            body_timeout: Duration::from_millis(60_000),
            retries: 1,
            pool_idle_max: 64,
            pool_idle_timeout: Duration::from_millis(60_000),
            pool_borrow: Duration::from_millis(POOL_BORROW_MS_DEFAULT),
            max_fails: 3,
            fail_on_5xx: false,
            fail_timeout: Duration::from_millis(10_000),
            health: None,
            tls: Vec::new(),
        }
    }
}

/// The group `--backend a,b` makes: every host and path goes to it.
pub fn from_backends(
    backends: &[String],
    protocol: UpstreamProtocol,
    connect_timeout: Duration,
) -> Result<Config, String> {
    let mut group = GroupConfig::with_defaults("default");
    group.protocol = protocol;
    group.connect_timeout = connect_timeout;
    for b in backends {
        group.backends.push((b.clone(), resolve(b)?));
    }
    if group.backends.is_empty() {
        return Err("--backend names no address".into());
    }
    group.tls = backend_tls(&group.backends, protocol, &TlsSettings::default())
        .map_err(|(_, e)| format!("--backend: {e}"))?;
    Ok(Config {
        groups: vec![group],
        routes: vec![RouteConfig { host: None, path: None, group: 0 }],
    })
}

/// Reads and checks `path`.
pub fn load(path: &Path) -> Result<Config, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("--config {}: {e}", path.display()))?;
    parse(&text).map_err(|e| format!("{}:{}: {}", path.display(), e.line, e.reason))
}

/// A configuration error: where and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// 1-based line of the file.
    pub line: usize,
    /// What is wrong, naming the key.
    pub reason: String,
}

/// Parses a configuration file's text.
pub fn parse(text: &str) -> Result<Config, ConfigError> {
    let line_of = |span: Option<Range<usize>>| match span {
        Some(r) => text[..r.start.min(text.len())].matches('\n').count() + 1,
        None => 1,
    };
    let doc = Document::parse(text)
        .map_err(|e| ConfigError { line: line_of(e.span()), reason: e.message().to_string() })?;
    let err =
        |span: Option<Range<usize>>, reason: String| ConfigError { line: line_of(span), reason };
    let root = doc.as_table();
    let mut groups: Vec<GroupConfig> = Vec::new();
    let mut routes_item = None;
    for (key, item) in root.iter() {
        match key {
            "groups" => {
                let table = item.as_table().ok_or_else(|| {
                    err(item.span(), "groups: must be tables, `[groups.NAME]`".into())
                })?;
                for (name, g) in table.iter() {
                    let gt = g.as_table().ok_or_else(|| {
                        err(g.span(), format!("groups.{name}: must be a table, `[groups.{name}]`"))
                    })?;
                    let metric = metric_name(name);
                    if let Some(other) = groups.iter().find(|o| metric_name(&o.name) == metric) {
                        let span = table.get_key_value(name).and_then(|(k, _)| k.span());
                        return Err(err(
                            span.or_else(|| gt.span()),
                            format!(
                                "groups.{name}: its metrics would be those of group `{}` \
                                 (`hotloop_backend_{metric}_...`): group names must differ \
                                 in more than the characters other than ASCII letters and digits",
                                other.name
                            ),
                        ));
                    }
                    groups.push(group(name, gt, &err)?);
                }
            }
            "routes" => routes_item = Some(item),
            other => {
                let span = root.get_key_value(other).and_then(|(k, _)| k.span());
                return Err(err(
                    span,
                    format!("unknown key `{other}` (expected `groups` or `routes`)"),
                ));
            }
        }
    }
    if groups.is_empty() {
        return Err(err(None, "no backend group: add a `[groups.NAME]` table".into()));
    }
    let mut routes = Vec::new();
    match routes_item {
        None if groups.len() == 1 => routes.push(RouteConfig { host: None, path: None, group: 0 }),
        None => {
            return Err(err(
                None,
                "several groups and no `[[routes]]`: say which requests go to which group".into(),
            ))
        }
        Some(item) => {
            let array = item.as_array_of_tables().ok_or_else(|| {
                err(item.span(), "routes: must be an array of tables, `[[routes]]`".into())
            })?;
            for (i, rt) in array.iter().enumerate() {
                routes.push(route(i, rt, &groups, &err)?);
            }
        }
    }
    Ok(Config { groups, routes })
}

/// A group name as it appears in its backends' metric names: each
/// character other than an ASCII letter or digit becomes `_`. No two
/// groups may share one ([`parse`] refuses them): their metrics would be
/// the same families twice.
pub fn metric_name(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect()
}

type Err<'a> = dyn Fn(Option<Range<usize>>, String) -> ConfigError + 'a;

/// The span of `key`'s value in `table`, or of the key.
fn span_of(table: &Table, key: &str) -> Option<Range<usize>> {
    table.get_key_value(key).and_then(|(k, v)| v.span().or_else(|| k.span()))
}

fn group(name: &str, t: &Table, err: &Err<'_>) -> Result<GroupConfig, ConfigError> {
    let mut g = GroupConfig::with_defaults(name);
    let mut health_path = None;
    let (mut interval, mut timeout) = (Duration::from_millis(2000), Duration::from_millis(1000));
    let (mut rise, mut fall) = (2, 3);
    let mut health_keys = Vec::new();
    let mut tls = TlsSettings::default();
    for (key, item) in t.iter() {
        let at = || span_of(t, key);
        let full = format!("groups.{name}.{key}");
        let int = |lo: i64, hi: i64| -> Result<i64, ConfigError> {
            match item.as_integer() {
                Some(v) if (lo..=hi).contains(&v) => Ok(v),
                _ => Err(err(at(), format!("{full}: must be a whole number from {lo} to {hi}"))),
            }
        };
        let ms = |lo: i64| -> Result<Duration, ConfigError> {
            Ok(Duration::from_millis(int(lo, 86_400_000)? as u64))
        };
        match key {
            "backends" => {
                let array = item.as_array().ok_or_else(|| {
                    err(at(), format!("{full}: must be a list of \"host:port\" strings"))
                })?;
                for v in array.iter() {
                    let s = v.as_str().ok_or_else(|| {
                        err(
                            v.span().or_else(at),
                            format!("{full}: must hold \"host:port\" strings"),
                        )
                    })?;
                    let addr = resolve(s)
                        .map_err(|e| err(v.span().or_else(at), format!("{full}: {e}")))?;
                    g.backends.push((s.to_string(), addr));
                }
            }
            "protocol" => {
                g.protocol = match item.as_str() {
                    Some("http1") => UpstreamProtocol::Http1,
                    Some("h2") => UpstreamProtocol::H2,
                    _ => return Err(err(at(), format!("{full}: must be \"http1\" or \"h2\""))),
                }
            }
            "connect_timeout_ms" => g.connect_timeout = ms(1)?,
            "header_timeout_ms" => g.header_timeout = ms(1)?,
            "body_timeout_ms" => g.body_timeout = ms(1)?,
            "retries" => g.retries = int(0, 16)? as usize,
            "pool_idle_max" => g.pool_idle_max = int(0, 100_000)? as usize,
            "pool_idle_timeout_ms" => g.pool_idle_timeout = ms(1)?,
            "pool_borrow_ms" => g.pool_borrow = ms(0)?,
            "max_fails" => g.max_fails = int(0, 1000)? as u32,
            "fail_timeout_ms" => g.fail_timeout = ms(1)?,
            "fail_on_5xx" => {
                g.fail_on_5xx = item
                    .as_bool()
                    .ok_or_else(|| err(at(), format!("{full}: must be true or false")))?;
            }
            "tls" => {
                tls.all = item
                    .as_bool()
                    .ok_or_else(|| err(at(), format!("{full}: must be true or false")))?;
                tls.keys.push(key.to_string());
            }
            "tls_verify" => {
                tls.verify = item
                    .as_bool()
                    .ok_or_else(|| err(at(), format!("{full}: must be true or false")))?;
                tls.keys.push(key.to_string());
            }
            "tls_ca_file" => {
                let path = item
                    .as_str()
                    .filter(|p| !p.is_empty())
                    .ok_or_else(|| err(at(), format!("{full}: must be a file's path")))?;
                tls.ca_file = Some(PathBuf::from(path));
                tls.keys.push(key.to_string());
            }
            "tls_server_name" => {
                let name = item
                    .as_str()
                    .filter(|n| rustls::pki_types::ServerName::try_from(*n).is_ok())
                    .ok_or_else(|| {
                        err(at(), format!("{full}: must be a DNS name or an IP address"))
                    })?;
                tls.server_name = Some(name.to_string());
                tls.keys.push(key.to_string());
            }
            "health_path" => match item.as_str() {
                Some(p) if p.starts_with('/') && !p.contains(char::is_whitespace) => {
                    health_path = Some(p.to_string())
                }
                _ => return Err(err(at(), format!("{full}: must be a path starting with `/`"))),
            },
            "health_interval_ms" => {
                interval = ms(10)?;
                health_keys.push(key);
            }
            "health_timeout_ms" => {
                timeout = ms(1)?;
                health_keys.push(key);
            }
            "health_rise" => {
                rise = int(1, 100)? as u32;
                health_keys.push(key);
            }
            "health_fall" => {
                fall = int(1, 100)? as u32;
                health_keys.push(key);
            }
            other => {
                return Err(err(
                    t.get_key_value(other).and_then(|(k, _)| k.span()),
                    format!("groups.{name}: unknown key `{other}`"),
                ))
            }
        }
    }
    if g.backends.is_empty() {
        return Err(err(
            t.span().or_else(|| span_of(t, "backends")),
            format!("groups.{name}: no backend: set `backends = [\"host:port\", ...]`"),
        ));
    }
    g.tls = backend_tls(&g.backends, g.protocol, &tls)
        .map_err(|(key, e)| err(span_of(t, &key), format!("groups.{name}.{key}: {e}")))?;
    match health_path {
        Some(path) => g.health = Some(HealthConfig { path, interval, timeout, rise, fall }),
        None => {
            if let Some(key) = health_keys.first() {
                return Err(err(
                    span_of(t, key),
                    format!("groups.{name}.{key}: set without `health_path`"),
                ));
            }
        }
    }
    Ok(g)
}

fn route(
    i: usize,
    t: &Table,
    groups: &[GroupConfig],
    err: &Err<'_>,
) -> Result<RouteConfig, ConfigError> {
    let mut r = RouteConfig { host: None, path: None, group: usize::MAX };
    for (key, item) in t.iter() {
        let at = || span_of(t, key);
        match key {
            "host" => match item.as_str() {
                Some(h) if valid_host_pattern(h) => r.host = Some(h.to_ascii_lowercase()),
                _ => {
                    return Err(err(
                        at(),
                        format!(
                            "routes[{i}].host: must be a host name (`example.com`) or \
                             `*.example.com`, without port"
                        ),
                    ))
                }
            },
            "path" => match item.as_str() {
                Some(p) if p.starts_with('/') => r.path = Some(p.to_string()),
                _ => {
                    return Err(err(
                        at(),
                        format!("routes[{i}].path: must be a prefix starting with `/`"),
                    ))
                }
            },
            "group" => {
                let name = item.as_str().unwrap_or("");
                r.group = groups.iter().position(|g| g.name == name).ok_or_else(|| {
                    err(at(), format!("routes[{i}].group: no group named `{name}`"))
                })?;
            }
            other => {
                return Err(err(
                    t.get_key_value(other).and_then(|(k, _)| k.span()),
                    format!("routes[{i}]: unknown key `{other}`"),
                ))
            }
        }
    }
    if r.group == usize::MAX {
        return Err(err(t.span(), format!("routes[{i}]: no `group`")));
    }
    Ok(r)
}

/// A host name, or `*.` and one: labels of letters, digits and `-`, none
/// empty (a trailing dot, `a..b` or a leading dot would name nothing a
/// request's host, its trailing dot stripped, can match).
fn valid_host_pattern(h: &str) -> bool {
    let name = h.strip_prefix("*.").unwrap_or(h);
    !name.is_empty()
        && name.split('.').all(|label| {
            !label.is_empty() && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        })
}

/// One address, resolved now (a name that does not resolve is an error at
/// start). `https://` and `http://` in front are allowed; with one, a
/// missing port is 443 or 80.
fn resolve(s: &str) -> Result<SocketAddr, String> {
    let (hostport, default_port) = match split_scheme(s) {
        (Some(tls), rest) => (rest, Some(if tls { 443 } else { 80 })),
        (None, rest) => (rest, None),
    };
    let with_port;
    let target = match default_port {
        Some(port) if !has_port(hostport) => {
            with_port = format!("{hostport}:{port}");
            with_port.as_str()
        }
        _ => hostport,
    };
    target
        .to_socket_addrs()
        .map_err(|e| format!("`{s}`: {e}"))?
        .next()
        .ok_or_else(|| format!("`{s}` resolves to no address"))
}

/// `https://a:1` as `(Some(true), "a:1")`, `http://a:1` as
/// `(Some(false), "a:1")`, `a:1` as `(None, "a:1")`.
fn split_scheme(s: &str) -> (Option<bool>, &str) {
    if let Some(rest) = s.strip_prefix("https://") {
        (Some(true), rest)
    } else if let Some(rest) = s.strip_prefix("http://") {
        (Some(false), rest)
    } else {
        (None, s)
    }
}

fn has_port(hostport: &str) -> bool {
    match hostport.rsplit_once(':') {
        Some((host, _)) => !host.starts_with('[') || host.ends_with(']'),
        None => false,
    }
}

/// The host of a backend's address as written: `https://api.test:8443`
/// as `api.test`, `[::1]:443` as `::1`.
fn host_of(written: &str) -> &str {
    let hostport = split_scheme(written).1;
    let host = if has_port(hostport) {
        hostport.rsplit_once(':').map_or(hostport, |h| h.0)
    } else {
        hostport
    };
    host.trim_start_matches('[').trim_end_matches(']')
}

/// A group's TLS keys.
struct TlsSettings {
    /// `tls = true`: every backend of the group over TLS.
    all: bool,
    /// `tls_verify`: check the backend's certificate (the default).
    verify: bool,
    /// `tls_ca_file`: the roots to trust instead of the system's.
    ca_file: Option<PathBuf>,
    /// `tls_server_name`: SNI and the name checked, instead of the host
    /// each backend's address names.
    server_name: Option<String>,
    /// The TLS keys set, in the file's order.
    keys: Vec<String>,
}

impl Default for TlsSettings {
    fn default() -> Self {
        TlsSettings { all: false, verify: true, ca_file: None, server_name: None, keys: Vec::new() }
    }
}

/// `pool_borrow_ms` when left out: about what a connect to a backend
/// nearby costs, so a wait that does not end in time costs a request
/// about one connect more.
const POOL_BORROW_MS_DEFAULT: u64 = 1;

/// Where distributions keep the system's trusted roots (the files Go's
/// `crypto/x509` tries on Linux), tried in this order.
const SYSTEM_CA_FILES: [&str; 4] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/pki/tls/cacert.pem",
];

/// Each backend's TLS (a backend written `https://...`, or every one with
/// `tls = true`): one connector per group, shared by its backends. An
/// error names the key it is about.
fn backend_tls(
    backends: &[(String, SocketAddr)],
    protocol: UpstreamProtocol,
    s: &TlsSettings,
) -> Result<Vec<Option<BackendTls>>, (String, String)> {
    let wants: Vec<bool> = backends
        .iter()
        .map(|(written, _)| s.all || split_scheme(written).0 == Some(true))
        .collect();
    if !wants.contains(&true) {
        if let Some(key) = s.keys.iter().find(|k| *k != "tls") {
            return Err((key.clone(), "set without `tls = true` or an `https://` backend".into()));
        }
        return Ok(vec![None; backends.len()]);
    }
    let alpn: &[&[u8]] = match protocol {
        UpstreamProtocol::Http1 => &[ALPN_HTTP11],
        UpstreamProtocol::H2 => &[ALPN_H2],
    };
    let connector = if s.verify {
        let path =
            match &s.ca_file {
                Some(p) => p.clone(),
                None => SYSTEM_CA_FILES.iter().map(PathBuf::from).find(|p| p.exists()).ok_or_else(
                    || ("tls".to_string(), "no system CA bundle found: set `tls_ca_file`".into()),
                )?,
            };
        TlsConnector::from_root_pem_file(&path, alpn)
            .map_err(|e| ("tls_ca_file".to_string(), e.to_string()))?
    } else {
        TlsConnector::new(unverified(alpn).map_err(|e| ("tls_verify".to_string(), e))?)
    };
    let mut out = Vec::with_capacity(backends.len());
    for ((written, _), tls) in backends.iter().zip(wants) {
        if !tls {
            out.push(None);
            continue;
        }
        let server_name = s.server_name.clone().unwrap_or_else(|| host_of(written).to_string());
        if rustls::pki_types::ServerName::try_from(server_name.as_str()).is_err() {
            let e = format!("`{written}`: `{server_name}` is not a TLS server name");
            return Err(("backends".to_string(), e));
        }
        out.push(Some(BackendTls { connector: connector.clone(), server_name }));
    }
    Ok(out)
}

/// A client configuration that takes any certificate (`tls_verify =
/// false`): the handshake's signatures are still checked, the chain and
/// the name are not.
fn unverified(alpn: &[&[u8]]) -> Result<rustls::ClientConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

/// The verifier of `tls_verify = false`.
#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        let algs = &self.0.signature_verification_algorithms;
        rustls::crypto::verify_tls12_signature(message, cert, dss, algs)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        let algs = &self.0.signature_verification_algorithms;
        rustls::crypto::verify_tls13_signature(message, cert, dss, algs)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_file_parses() {
        let c = parse(
            r#"
[groups.api]
backends = ["127.0.0.1:9001", "127.0.0.1:9002"]
protocol = "h2"
retries = 2
fail_on_5xx = true
health_path = "/health"
health_rise = 1

[groups.web]
backends = ["127.0.0.1:9003"]

[[routes]]
host = "API.example.com"
path = "/v1/"
group = "api"

[[routes]]
group = "web"
"#,
        )
        .unwrap();
        assert_eq!(c.groups.len(), 2);
        assert_eq!(c.groups[0].protocol, UpstreamProtocol::H2);
        assert_eq!(c.groups[0].retries, 2);
        assert_eq!(c.groups[0].health.as_ref().unwrap().rise, 1);
        assert!(c.groups[0].fail_on_5xx);
        assert!(!c.groups[1].fail_on_5xx, "5xx answers are not failures by default");
        assert_eq!(c.routes[0].host.as_deref(), Some("api.example.com"));
        assert_eq!(c.routes[1].group, 1);
    }

    #[test]
    fn errors_name_the_line_and_the_key() {
        let e = parse("[groups.a]\nbackends = [\"127.0.0.1:1\"]\nretries = -1\n").unwrap_err();
        assert_eq!(e.line, 3, "{e:?}");
        assert!(e.reason.contains("groups.a.retries"), "{e:?}");
        let e = parse("[groups.a]\nbackends = [\"127.0.0.1:1\"]\n\nretrys = 1\n").unwrap_err();
        assert_eq!(e.line, 4, "{e:?}");
        assert!(e.reason.contains("unknown key `retrys`"), "{e:?}");
        let e = parse("[groups.a]\nbackends = [\"127.0.0.1:1\"]\n[[routes]]\ngroup = \"b\"\n")
            .unwrap_err();
        assert_eq!(e.line, 4, "{e:?}");
        let e = parse("[groups.a]\nbackends = [\"127.0.0.1:1\"\n").unwrap_err();
        assert!(e.line >= 2, "{e:?}");
        let e = parse("[groups.a]\nbackends = [\"127.0.0.1:1\"]\nfail_on_5xx = 1\n").unwrap_err();
        assert_eq!(e.line, 3, "{e:?}");
        assert!(e.reason.contains("groups.a.fail_on_5xx: must be true or false"), "{e:?}");
        let e = parse("[groups.a]\nbackends = [\"127.0.0.1:1\"]\nhealth_rise = 2\n").unwrap_err();
        assert_eq!(e.line, 3, "{e:?}");
        let e = parse("[groups.a]\nbackends = [\"nohost\"]\n").unwrap_err();
        assert_eq!(e.line, 2, "{e:?}");
        let e = parse("[groups.a]\nbackends = [\"127.0.0.1:1\"]\ntls_ca_file = \"/x.pem\"\n")
            .unwrap_err();
        assert_eq!(e.line, 3, "{e:?}");
        assert!(e.reason.contains("without `tls = true`"), "{e:?}");
        let e = parse("[groups.a]\ntls = true\nbackends = [\"127.0.0.1:1\"]\ntls_ca_file = \"/no/such.pem\"\n")
            .unwrap_err();
        assert_eq!(e.line, 4, "{e:?}");
        assert!(e.reason.contains("groups.a.tls_ca_file"), "{e:?}");
        // Host patterns that could never match a request's host.
        for host in ["example.com.", "*.example.com.", "a..b", ".example.com", "*."] {
            let text = format!(
                "[groups.a]\nbackends = [\"127.0.0.1:1\"]\n[[routes]]\nhost = \"{host}\"\ngroup = \"a\"\n"
            );
            let e = parse(&text).unwrap_err();
            assert_eq!(e.line, 4, "{host}: {e:?}");
        }
    }

    /// Two groups whose names differ only where a metric name cannot
    /// (`api-v1`, `api_v1`) would give the same metric families twice, an
    /// exposition Prometheus rejects: refused, at the second group's line.
    #[test]
    fn groups_whose_metric_names_collide_are_refused() {
        let text = "[groups.api-v1]\nbackends = [\"127.0.0.1:1\"]\n\n[groups.api_v1]\nbackends = [\"127.0.0.1:2\"]\n[[routes]]\ngroup = \"api-v1\"\n";
        let e = parse(text).unwrap_err();
        assert_eq!(e.line, 4, "{e:?}");
        assert!(e.reason.contains("groups.api_v1") && e.reason.contains("`api-v1`"), "{e:?}");
        let text = "[groups.\"caf\\u00e9\"]\nbackends = [\"127.0.0.1:1\"]\n[groups.\"caf\\u00e8\"]\nbackends = [\"127.0.0.1:2\"]\n[[routes]]\ngroup = \"caf\\u00e9\"\n";
        assert_eq!(parse(text).unwrap_err().line, 3);
        let text = "[groups.api-v1]\nbackends = [\"127.0.0.1:1\"]\n[groups.api-v2]\nbackends = [\"127.0.0.1:2\"]\n[[routes]]\ngroup = \"api-v1\"\n";
        assert!(parse(text).is_ok());
        assert_eq!(metric_name("api-v1.eu"), "api_v1_eu");
    }

    #[test]
    fn https_backends_speak_tls_to_their_host() {
        let c = parse(
            "[groups.a]\nbackends = [\"https://localhost\", \"127.0.0.1:8080\", \"https://[::1]:8443\"]\ntls_verify = false\n",
        )
        .unwrap();
        let g = &c.groups[0];
        assert_eq!(g.backends[0].1.port(), 443);
        let names: Vec<Option<&str>> =
            g.tls.iter().map(|t| t.as_ref().map(|t| t.server_name.as_str())).collect();
        assert_eq!(names, [Some("localhost"), None, Some("::1")]);
        let c = parse("[groups.a]\nbackends = [\"localhost:1\"]\ntls = true\ntls_server_name = \"api.test\"\n")
            .unwrap();
        assert_eq!(c.groups[0].tls[0].as_ref().unwrap().server_name, "api.test");
    }
}
