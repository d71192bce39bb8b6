//! Which group a request goes to: the first route, in the file's order,
//! whose host and path prefix match.
//!
//! The host is the request's `Host` (HTTP/1.1) or its URI's authority
//! (HTTP/2), lowercased and without its port; `*.example.com` matches any
//! name that ends with `.example.com` (not `example.com` itself), as
//! nginx's `server_name`.

use super::config::RouteConfig;

/// The routes of one configuration.
#[derive(Debug, Clone)]
pub struct Routes {
    routes: Vec<RouteConfig>,
}

impl Routes {
    /// The routes, tried in this order.
    pub fn new(routes: Vec<RouteConfig>) -> Routes {
        Routes { routes }
    }

    /// The group `host` and `path` go to, if a route matches.
    pub fn pick(&self, host: Option<&str>, path: &str) -> Option<usize> {
        let host = host.map(host_name);
        self.routes.iter().find(|r| matches(r, host, path)).map(|r| r.group)
    }
}

/// Whether `r` takes `host` (without port or trailing dot, any case: the
/// patterns are lowercase) and `path`.
fn matches(r: &RouteConfig, host: Option<&str>, path: &str) -> bool {
    let host_ok = match (&r.host, host) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(pattern), Some(host)) => match pattern.strip_prefix('*') {
            Some(suffix) => {
                host.len() > suffix.len()
                    && host.is_char_boundary(host.len() - suffix.len())
                    && host[host.len() - suffix.len()..].eq_ignore_ascii_case(suffix)
            }
            None => pattern.eq_ignore_ascii_case(host),
        },
    };
    host_ok && r.path.as_deref().is_none_or(|prefix| path.starts_with(prefix))
}

/// `Host: Example.COM:8080` as `Example.COM`; `[::1]:80` as `[::1]`
/// (compared without regard to case: no copy per request).
fn host_name(host: &str) -> &str {
    let name = if host.starts_with('[') {
        host.find(']').map_or(host, |end| &host[..=end])
    } else {
        host.rsplit_once(':').map_or(host, |(name, _)| name)
    };
    name.trim_end_matches('.')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(host: Option<&str>, path: Option<&str>, group: usize) -> RouteConfig {
        RouteConfig { host: host.map(Into::into), path: path.map(Into::into), group }
    }

    #[test]
    fn first_match_wins_by_host_then_path() {
        let r = Routes::new(vec![
            route(Some("api.example.com"), Some("/v1/"), 0),
            route(Some("*.example.com"), None, 1),
            route(None, Some("/static/"), 2),
            route(None, None, 3),
        ]);
        assert_eq!(r.pick(Some("API.example.com:8080"), "/v1/users"), Some(0));
        assert_eq!(r.pick(Some("api.example.com"), "/v2/"), Some(1));
        assert_eq!(r.pick(Some("www.example.com."), "/"), Some(1));
        assert_eq!(r.pick(Some("example.com"), "/static/a.css"), Some(2));
        assert_eq!(r.pick(None, "/"), Some(3));
        let strict = Routes::new(vec![route(Some("a.test"), None, 0)]);
        assert_eq!(strict.pick(Some("b.test"), "/"), None);
        assert_eq!(strict.pick(None, "/"), None);
        assert_eq!(host_name("[::1]:80"), "[::1]");
        assert_eq!(r.pick(Some("WWW.Example.Com"), "/"), Some(1));
    }
}
