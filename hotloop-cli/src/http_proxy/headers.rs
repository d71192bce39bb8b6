//! The header changes a proxy owes each side (RFC 9110 section 7.6).
//!
//! Hop-by-hop fields are removed both ways: the fixed set (`Connection`,
//! `Keep-Alive`, `Proxy-Connection`, `TE` except `trailers`,
//! `Transfer-Encoding`, `Upgrade`, `Proxy-Authorization`,
//! `Proxy-Authenticate`) and every field the message's `Connection` names.
//! hyper frames each message again itself, so a length or chunking the
//! client wrote never reaches the backend as written. Towards the backend
//! `Via`, `X-Forwarded-For` and `Forwarded` are appended to what the
//! client sent, and the answer gets `Via` too, and a `Date` if it has none
//! (either way marked never to be indexed: [`add_date`]).

use std::cell::RefCell;
use std::net::{IpAddr, SocketAddr};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::{BufMut, BytesMut};
use hyper::header::{self, Entry, HeaderMap, HeaderName, HeaderValue};
use hyper::Version;

/// The pseudonym in `Via` (RFC 9110 section 7.6.3).
const VIA_NAME: &str = "hotloop";

/// The fixed hop-by-hop fields, as names made once: a field looked up by
/// a string is parsed again at every lookup, and these are looked up on
/// every request and every answer.
static HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::PROXY_AUTHORIZATION,
    header::PROXY_AUTHENTICATE,
];
/// The lengths of the names in [`HOP_BY_HOP`].
const HOP_BY_HOP_LENGTHS: [usize; 7] = [2, 7, 10, 16, 17, 18, 19];
/// `Connection`'s place in [`HOP_BY_HOP`].
const CONNECTION_AT: usize = 0;
/// `TE`'s place in [`HOP_BY_HOP`].
const TE_AT: usize = 3;

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// Removes the hop-by-hop fields of a message. `TE: trailers` is kept on
/// a request (the backend may then send trailers, which are passed on);
/// with `upgrade`, the `Upgrade` field and a `Connection: upgrade` are
/// kept, for a tunnel the backend must agree to.
pub fn remove_hop_by_hop(headers: &mut HeaderMap, keep_te_trailers: bool, upgrade: bool) {
    // One pass over the message's names finds those present (most
    // messages carry none, or only `Connection`); only they are removed.
    debug_assert!(
        HOP_BY_HOP[CONNECTION_AT] == header::CONNECTION && HOP_BY_HOP[TE_AT] == header::TE
    );
    debug_assert!(HOP_BY_HOP.iter().all(|h| HOP_BY_HOP_LENGTHS.contains(&h.as_str().len())));
    let mut present = [false; HOP_BY_HOP.len()];
    for name in headers.keys() {
        // A name's text is at hand (a table entry for the standard ones);
        // its length rules out nearly every field before any comparison.
        let text = name.as_str();
        if !HOP_BY_HOP_LENGTHS.contains(&text.len()) {
            continue;
        }
        if let Some(i) = HOP_BY_HOP.iter().position(|h| h.as_str() == text) {
            present[i] = true;
        }
    }
    if !present.contains(&true) {
        return;
    }
    if present[CONNECTION_AT] {
        // Every field the message's `Connection` names goes too. The usual
        // tokens (`keep-alive`, `close`, `upgrade`) name no other field:
        // a token is looked up by its bytes, with no name made for it.
        // Removing other fields leaves `Connection`'s values in place, and
        // a value parsed from the wire shares its message's buffer, so a
        // clone of it copies nothing.
        let mut values = headers.get_all(header::CONNECTION).iter();
        let first = values.next().cloned();
        let more = values.next().is_some();
        if let Some(v) = first {
            remove_named(headers, &v);
        }
        if more {
            let count = headers.get_all(header::CONNECTION).iter().count();
            for i in 1..count {
                if let Some(v) = headers.get_all(header::CONNECTION).iter().nth(i).cloned() {
                    remove_named(headers, &v);
                }
            }
        }
    }
    let te_trailers = keep_te_trailers
        && present[TE_AT]
        && headers.get_all(header::TE).iter().any(|v| {
            v.to_str()
                .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case("trailers")))
        });
    for (name, _) in HOP_BY_HOP.iter().zip(present).filter(|(_, here)| *here) {
        if upgrade && (name == header::UPGRADE || name == header::CONNECTION) {
            continue;
        }
        headers.remove(name);
    }
    if upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
    if te_trailers {
        headers.insert(header::TE, HeaderValue::from_static("trailers"));
    }
}

/// Removes the fields a `Connection` value names, except the fixed
/// hop-by-hop ones (removed by the caller, or kept for an upgrade).
fn remove_named(headers: &mut HeaderMap, connection: &HeaderValue) {
    for token in connection.as_bytes().split(|&b| b == b',') {
        let token = token.trim_ascii();
        if token.is_empty() || is_hop_by_hop(token) {
            continue;
        }
        // Not a valid name: nothing to remove.
        if let Ok(name) = std::str::from_utf8(token) {
            headers.remove(name);
        }
    }
}

/// Whether `token` names one of the fixed hop-by-hop fields (any case).
fn is_hop_by_hop(token: &[u8]) -> bool {
    HOP_BY_HOP.iter().any(|h| h.as_str().as_bytes().eq_ignore_ascii_case(token))
}

/// The `Via` token for a message received as `version`.
fn via(version: Version) -> HeaderValue {
    HeaderValue::from_static(match version {
        Version::HTTP_09 => "0.9 hotloop",
        Version::HTTP_10 => "1.0 hotloop",
        Version::HTTP_2 => "2 hotloop",
        Version::HTTP_3 => "3 hotloop",
        _ => "1.1 hotloop",
    })
}

/// The forwarding fields' elements for one client connection, each
/// written once: the client's address is the same for every request of
/// the connection, and nearly every request of it names the same host.
/// A field then holds a shared copy of the element; nothing is formatted
/// per request.
pub struct Forwarding {
    ip: IpAddr,
    tls: bool,
    /// `X-Forwarded-For`'s element: the address.
    xff: HeaderValue,
    /// `Forwarded`'s element for the host last asked for, and that host.
    forwarded: RefCell<Option<(Option<Box<str>>, HeaderValue)>>,
    /// The `Host` field last made from a request's authority (HTTP/2
    /// clients send none), and that authority.
    host: RefCell<Option<(Box<str>, HeaderValue)>>,
}

impl Forwarding {
    /// The elements for a client at `peer`, over TLS or not.
    pub fn new(peer: SocketAddr, tls: bool) -> Forwarding {
        let ip = match peer.ip() {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(IpAddr::V6(v6)),
            v4 => v4,
        };
        let mut item = BytesMut::with_capacity(48);
        put_ip(&mut item, ip, false);
        // An address's text is always a valid field value.
        let xff = HeaderValue::from_maybe_shared(item.freeze())
            .unwrap_or_else(|_| HeaderValue::from_static("unknown"));
        Forwarding { ip, tls, xff, forwarded: RefCell::new(None), host: RefCell::new(None) }
    }

    /// A `Host` field for `host` (a request's authority), or `None` if it
    /// is no valid field value.
    pub fn host_field(&self, host: &str) -> Option<HeaderValue> {
        let mut last = self.host.borrow_mut();
        if let Some((h, v)) = &*last {
            if **h == *host {
                return Some(v.clone());
            }
        }
        let v = HeaderValue::from_str(host).ok()?;
        *last = Some((host.into(), v.clone()));
        Some(v)
    }

    /// `Forwarded`'s element (`for`, `host`, `proto`) for `host`.
    fn forwarded(&self, host: Option<&str>) -> HeaderValue {
        let host = host.filter(|h| valid_token_host(h));
        let mut last = self.forwarded.borrow_mut();
        if let Some((h, v)) = &*last {
            if h.as_deref() == host {
                return v.clone();
            }
        }
        let mut f = BytesMut::with_capacity(64 + host.map_or(0, str::len));
        f.put_slice(b"for=");
        put_ip(&mut f, self.ip, true);
        if let Some(h) = host {
            f.put_slice(b";host=\"");
            f.put_slice(h.as_bytes());
            f.put_u8(b'"');
        }
        f.put_slice(if self.tls { b";proto=https" } else { b";proto=http" });
        // Made of an address, a checked host and fixed text: a valid value.
        let v = HeaderValue::from_maybe_shared(f.freeze())
            .unwrap_or_else(|_| HeaderValue::from_static("for=unknown"));
        *last = Some((host.map(Box::from), v.clone()));
        v
    }
}

/// Appends `Via`, `X-Forwarded-For` and `Forwarded` (`for`, `host`,
/// `proto`) for a request of the client connection `client`, received
/// as `version`, for `host`.
pub fn add_forwarding(
    headers: &mut HeaderMap,
    version: Version,
    client: &Forwarding,
    host: Option<&str>,
) {
    debug_assert!(via(version).to_str().unwrap().ends_with(VIA_NAME));
    headers.append(header::VIA, via(version));
    append_list(headers, X_FORWARDED_FOR, client.xff.clone());
    append_list(headers, header::FORWARDED, client.forwarded(host));
}

/// Writes `ip` as text; an IPv6 address as `Forwarded` wants a node
/// (`"[v6]"`, RFC 7239 section 6) when `node`.
fn put_ip(out: &mut BytesMut, ip: IpAddr, node: bool) {
    match ip {
        IpAddr::V4(v4) => {
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    out.put_u8(b'.');
                }
                if octet >= 100 {
                    out.put_u8(b'0' + octet / 100);
                }
                if octet >= 10 {
                    out.put_u8(b'0' + octet / 10 % 10);
                }
                out.put_u8(b'0' + octet % 10);
            }
        }
        IpAddr::V6(v6) => {
            use std::fmt::Write;
            let mut text = String::with_capacity(48);
            let _ = if node { write!(text, "\"[{v6}]\"") } else { write!(text, "{v6}") };
            out.put_slice(text.as_bytes());
        }
    }
}

/// Adds `Via` to an answer received from a backend as `version`.
pub fn add_via(headers: &mut HeaderMap, version: Version) {
    headers.append(header::VIA, via(version));
}

/// Gives an answer its `Date` (RFC 9110 section 6.6.1: a proxy adds one
/// to an answer that has none), marked never to be indexed.
///
/// HPACK would otherwise add each second's new value to a client
/// connection's table (h2 indexes `Date`), and h2 finds a field's value
/// by walking every entry of the same name: on a connection open for a
/// minute that is tens of stale dates compared for every answer, until
/// the table's size evicts them. Never indexed, the value is sent as a
/// literal (about 22 bytes) and the table holds no date. The backend's own
/// `Date` is kept, marked the same way; hyper adds none once one is there.
pub fn add_date(headers: &mut HeaderMap) {
    match headers.get_mut(header::DATE) {
        Some(date) => date.set_sensitive(true),
        None => {
            headers.insert(header::DATE, now_date());
        }
    }
}

thread_local! {
    /// This worker's `Date` value and the second it says.
    static DATE: RefCell<Option<(u64, HeaderValue)>> = const { RefCell::new(None) };
}

/// The current second as a never-indexed `Date` value, formatted once per
/// second per worker.
fn now_date() -> HeaderValue {
    let now = SystemTime::now();
    let second = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    DATE.with(|cache| {
        let mut cache = cache.borrow_mut();
        match &*cache {
            Some((at, value)) if *at == second => value.clone(),
            _ => {
                // An HTTP date is always a valid field value.
                let mut value = HeaderValue::from_str(&crate::http_date::format(now))
                    .unwrap_or_else(|_| HeaderValue::from_static("Thu, 01 Jan 1970 00:00:00 GMT"));
                value.set_sensitive(true);
                *cache = Some((second, value.clone()));
                value
            }
        }
    })
}

/// HTTP/2 lets a client split `Cookie` into several fields; HTTP/1.1 wants
/// one (RFC 9113 section 8.2.3), joined with `; `.
pub fn join_cookies(headers: &mut HeaderMap) {
    if headers.get_all(header::COOKIE).iter().nth(1).is_none() {
        return;
    }
    let joined: Vec<u8> = headers
        .get_all(header::COOKIE)
        .iter()
        .map(|v| v.as_bytes())
        .collect::<Vec<_>>()
        .join(&b"; "[..]);
    if let Ok(v) = HeaderValue::from_bytes(&joined) {
        headers.insert(header::COOKIE, v);
    }
}

/// Whether a host may go into `Forwarded`'s quoted string as it is.
fn valid_token_host(h: &str) -> bool {
    h.bytes().all(|b| b.is_ascii_alphanumeric() || b"-.:[]".contains(&b))
}

/// Appends `item` to the comma list in `name` (one field, as proxies write it).
fn append_list(headers: &mut HeaderMap, name: HeaderName, item: HeaderValue) {
    match headers.entry(name) {
        Entry::Vacant(e) => {
            e.insert(item);
        }
        Entry::Occupied(mut e) => {
            let mut joined = BytesMut::new();
            for v in e.iter() {
                joined.put_slice(v.as_bytes());
                joined.put_slice(b", ");
            }
            joined.put_slice(item.as_bytes());
            if let Ok(v) = HeaderValue::from_maybe_shared(joined.freeze()) {
                e.insert(v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_gets_a_current_date_never_indexed_and_keeps_its_own() {
        let mut h = HeaderMap::new();
        add_date(&mut h);
        let date = h.get(header::DATE).expect("a Date");
        assert!(date.is_sensitive(), "indexed by HPACK");
        let when = httpdate::parse_http_date(date.to_str().unwrap()).unwrap();
        let off = SystemTime::now().duration_since(when).unwrap_or_default();
        assert!(off.as_secs() <= 2, "{date:?} is {off:?} old");

        let mut h = HeaderMap::new();
        h.insert(header::DATE, HeaderValue::from_static("Sun, 06 Nov 1994 08:49:37 GMT"));
        add_date(&mut h);
        assert_eq!(h.get_all(header::DATE).iter().count(), 1);
        assert_eq!(h[header::DATE], "Sun, 06 Nov 1994 08:49:37 GMT");
        assert!(h[header::DATE].is_sensitive());
    }

    #[test]
    fn hop_by_hop_fields_go_and_forwarding_fields_come() {
        let mut h = HeaderMap::new();
        h.insert("connection", HeaderValue::from_static("keep-alive, X-Secret"));
        h.append("connection", HeaderValue::from_static("Close,x-other , Keep-Alive"));
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("x-other", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("te", HeaderValue::from_static("trailers, deflate"));
        h.insert("upgrade", HeaderValue::from_static("websocket"));
        h.insert("x-forwarded-for", HeaderValue::from_static("10.0.0.1"));
        h.insert("x-kept", HeaderValue::from_static("yes"));
        remove_hop_by_hop(&mut h, true, false);
        let client = Forwarding::new("[::ffff:127.0.0.2]:5".parse().unwrap(), false);
        add_forwarding(&mut h, Version::HTTP_11, &client, Some("a.test"));
        assert!(h.get("x-secret").is_none() && h.get("keep-alive").is_none());
        assert!(h.get("x-other").is_none());
        assert!(h.get("upgrade").is_none() && h.get("connection").is_none());
        assert_eq!(h["te"], "trailers");
        assert_eq!(h["x-forwarded-for"], "10.0.0.1, 127.0.0.2");
        assert_eq!(h["forwarded"], "for=127.0.0.2;host=\"a.test\";proto=http");
        assert_eq!(h["via"], "1.1 hotloop");
        assert_eq!(h["x-kept"], "yes");
        let mut h = HeaderMap::new();
        h.insert("forwarded", HeaderValue::from_static("for=10.0.0.1"));
        let v6 = Forwarding::new("[2001:db8::7]:5".parse().unwrap(), true);
        add_forwarding(&mut h, Version::HTTP_2, &v6, None);
        assert_eq!(h["x-forwarded-for"], "2001:db8::7");
        assert_eq!(h["forwarded"], "for=10.0.0.1, for=\"[2001:db8::7]\";proto=https");
        assert_eq!(h["via"], "2 hotloop");
        let mut h = HeaderMap::new();
        let client = Forwarding::new("[::ffff:10.20.3.255]:5".parse().unwrap(), false);
        add_forwarding(&mut h, Version::HTTP_11, &client, None);
        assert_eq!(h["x-forwarded-for"], "10.20.3.255");
        assert_eq!(h["forwarded"], "for=10.20.3.255;proto=http");
        // The next request of the connection, for a host again: the
        // element follows the host it names.
        let mut h = HeaderMap::new();
        add_forwarding(&mut h, Version::HTTP_11, &client, Some("b.test"));
        assert_eq!(h["forwarded"], "for=10.20.3.255;host=\"b.test\";proto=http");
        let mut h = HeaderMap::new();
        add_forwarding(&mut h, Version::HTTP_11, &client, None);
        assert_eq!(h["forwarded"], "for=10.20.3.255;proto=http");
        assert_eq!(client.host_field("a.test").unwrap(), "a.test");
        assert_eq!(client.host_field("b.test:8080").unwrap(), "b.test:8080");
        assert!(client.host_field("bad\nhost").is_none());
        assert_eq!(client.host_field("b.test:8080").unwrap(), "b.test:8080");
    }

    #[test]
    fn cookies_are_joined_for_http1() {
        let mut h = HeaderMap::new();
        h.append("cookie", HeaderValue::from_static("a=1"));
        h.append("cookie", HeaderValue::from_static("b=2"));
        join_cookies(&mut h);
        assert_eq!(h.get_all("cookie").iter().count(), 1);
        assert_eq!(h["cookie"], "a=1; b=2");
    }
}
