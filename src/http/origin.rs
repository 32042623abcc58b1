//! Where a request comes from: the checks that keep a web page the user
//! happens to visit from driving the API through the user's browser.
//!
//! With credentials off (`cronoq dev`, a server without `[auth] required`)
//! the API answers anyone who can reach it, and a browser can reach
//! `127.0.0.1`. Two browser tricks matter:
//!
//! - **Cross-site requests (CSRF)**: any page may make the browser send a
//!   "simple" request (a form post, or `fetch` in `no-cors` mode) to
//!   another origin: method `POST`, a `Content-Type` of `text/plain`,
//!   `application/x-www-form-urlencoded` or `multipart/form-data`, or no
//!   body. So `require_json` answers a `POST` (any method but `GET`,
//!   `HEAD`, `OPTIONS`) with a body or a `Content-Type` other than
//!   `application/json` with **415 `INVALID_ARGUMENT`**: a JSON request
//!   from another origin needs a CORS preflight, which fails (no
//!   `Access-Control-*` header is ever sent). A bodiless `POST` (a
//!   cancel) needs no `Content-Type`; a browser sends `Origin` with it, and
//!   `check_host` refuses an `Origin` that is not this server (**403
//!   `PERMISSION_DENIED`**): it must name the request's own `Host`, or a
//!   host listed in `http_allowed_hosts`.
//! - **DNS rebinding**: a page of `evil.example` points its name at
//!   `127.0.0.1`; its requests are then same-origin to the browser, with
//!   `Host: evil.example:7070`. `check_host` answers a `Host` that is not
//!   allowed with **403 `PERMISSION_DENIED`**. Allowed: an IP address
//!   (v4, or v6 in brackets) and `localhost`, any port (such a name cannot
//!   be rebound: the browser connected to exactly that address), and the
//!   names of [`AllowedHosts`] (`[server] http_allowed_hosts`). A request
//!   without `Host` (HTTP/1.0; a browser always sends one) passes.
//!   `/healthz`, `/readyz` and `/metrics` are not checked: probes and
//!   scrapers address a server by whatever name it has, and these pages
//!   carry no task data.
//!
//! The checks apply whatever the auth mode: a non-browser client (the
//! CLI, the Python package, `curl -H 'content-type: application/json'`)
//! sends JSON and no `Origin`, and is not affected. One exception: with
//! `[auth] required = true` and no `http_allowed_hosts`, `cronoq server`
//! does not check `Host` ([`AllowedHosts::any`]): every `/v1` call then
//! needs a Bearer token that a rebound page does not have, and deployments
//! that reach the API by a DNS name (KEDA's scaler, an ingress) keep
//! working as they did. Nothing here changes state: a refusal is answered
//! before any handler runs.

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::Response;

use crate::core::{ErrorCode, Rejection};

/// The `Host` names the HTTP API answers besides IP addresses and
/// `localhost` (see the module docs), and whether it answers any.
///
/// ```
/// use cronoq::http::AllowedHosts;
/// let hosts = AllowedHosts::new(&["cronoq.example.com".to_string()]).unwrap();
/// assert!(hosts.allows_host("cronoq.example.com:7070"));
/// assert!(hosts.allows_host("127.0.0.1:7070") && hosts.allows_host("[::1]:7070"));
/// assert!(hosts.allows_host("localhost:7070"));
/// assert!(!hosts.allows_host("evil.example:7070"));
/// assert!(AllowedHosts::any().allows_host("evil.example:7070"));
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllowedHosts {
    /// Lowercase, without a trailing dot; with a port when one was given.
    names: Vec<String>,
    /// `"*"` was listed: every `Host` is answered.
    any: bool,
}

impl AllowedHosts {
    /// IP addresses, `localhost` and `names` (each a host name, or
    /// `name:port` to allow that port only; `"*"` allows every `Host`).
    /// A name with a scheme, path, space or empty is `INVALID_ARGUMENT`.
    pub fn new(names: &[String]) -> Result<AllowedHosts, Rejection> {
        let mut hosts = AllowedHosts::default();
        for name in names {
            let trimmed = name.trim();
            if trimmed == "*" {
                hosts.any = true;
                continue;
            }
            let bad = trimmed.is_empty()
                || trimmed
                    .chars()
                    .any(|c| c.is_whitespace() || c.is_control() || "/?#@,".contains(c));
            if bad {
                return Err(Rejection::InvalidArgument(format!(
                    "http_allowed_hosts: {} is not a host name (give `name` or `name:port`, \
                     without a scheme or path)",
                    crate::core::excerpt(name)
                )));
            }
            hosts.names.push(normalize(trimmed));
        }
        Ok(hosts)
    }

    /// Every `Host` is answered (no DNS-rebinding check).
    pub fn any() -> AllowedHosts {
        AllowedHosts {
            names: Vec::new(),
            any: true,
        }
    }

    /// Whether a request with this `Host` header value is answered.
    pub fn allows_host(&self, host: &str) -> bool {
        if self.any {
            return true;
        }
        let host = normalize(host);
        let (name, _port) = split_port(&host);
        is_ip_or_localhost(name) || self.lists(&host)
    }

    /// Whether `authority` (`host[:port]`) is listed by name.
    fn lists(&self, authority: &str) -> bool {
        let (name, _) = split_port(authority);
        self.names
            .iter()
            .any(|listed| listed == authority || listed == name)
    }

    /// Whether a request may carry this `Origin` (see the module docs).
    fn allows_origin(&self, origin: &str, host: Option<&str>) -> bool {
        let Some(authority) = origin_authority(origin) else {
            return false;
        };
        host.is_some_and(|h| normalize(h) == authority) || self.lists(&authority)
    }
}

/// Lowercase, without a trailing dot on the name.
fn normalize(host: &str) -> String {
    let host = host.trim().to_ascii_lowercase();
    let (name, port) = split_port(&host);
    let name = name.strip_suffix('.').unwrap_or(name);
    match port {
        Some(port) => format!("{name}:{port}"),
        None => name.to_string(),
    }
}

/// `name` and the port, if any, of `host[:port]` (`[v6]:port` too).
fn split_port(host: &str) -> (&str, Option<&str>) {
    if host.starts_with('[') {
        return match host.find(']') {
            Some(end) => (
                &host[..=end],
                host[end + 1..].strip_prefix(':').filter(|p| !p.is_empty()),
            ),
            None => (host, None),
        };
    }
    match host.rsplit_once(':') {
        Some((name, port)) if !name.contains(':') => (name, Some(port)),
        _ => (host, None),
    }
}

fn is_ip_or_localhost(name: &str) -> bool {
    if name == "localhost" || name.parse::<std::net::Ipv4Addr>().is_ok() {
        return true;
    }
    name.strip_prefix('[')
        .and_then(|n| n.strip_suffix(']'))
        .is_some_and(|n| n.parse::<std::net::Ipv6Addr>().is_ok())
}

/// `host[:port]` of an `Origin` (`scheme://host[:port]`), lowercase, the
/// scheme's default port left out; `None` for `null` or anything else.
fn origin_authority(origin: &str) -> Option<String> {
    let origin = origin.trim().to_ascii_lowercase();
    let (scheme, rest) = origin.split_once("://")?;
    if rest.is_empty() || rest.contains(['/', '?', '#', '@']) {
        return None;
    }
    let rest = normalize(rest);
    let (name, port) = split_port(&rest);
    match (scheme, port) {
        ("http", Some("80")) | ("https", Some("443")) => Some(name.to_string()),
        _ => Some(rest.clone()),
    }
}

/// Methods that change nothing, and that a browser sends cross-origin
/// without a preflight only as reads.
fn is_safe(method: &Method) -> bool {
    matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// Paths not subject to the `Host` check (see the module docs).
fn unchecked_path(path: &str) -> bool {
    matches!(path, "/healthz" | "/readyz" | "/metrics")
}

/// Whether the request has a body: its headers announce one (a length
/// above 0, or chunked), or the body itself may hold bytes (a router
/// served by something else, e.g. HTTP/2 without a length).
fn has_body(headers: &HeaderMap, body: &axum::body::Body) -> bool {
    use axum::body::HttpBody as _;
    if headers.contains_key(header::TRANSFER_ENCODING) || body.size_hint().upper() != Some(0) {
        return true;
    }
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim() != "0")
}

/// Whether a `Content-Type` value is `application/json` (parameters such
/// as `; charset=utf-8` allowed).
fn is_json(value: &header::HeaderValue) -> bool {
    let Ok(text) = value.to_str() else {
        return false;
    };
    let essence = text.split(';').next().unwrap_or("").trim();
    essence.eq_ignore_ascii_case("application/json")
}

/// The router's middleware: an unsafe request with a body, or with any
/// `Content-Type`, must say `application/json` (415 `INVALID_ARGUMENT`).
pub(crate) async fn require_json(request: Request, next: Next) -> Response {
    if !is_safe(request.method()) {
        let headers = request.headers();
        let content_types: Vec<_> = headers.get_all(header::CONTENT_TYPE).iter().collect();
        let json = match content_types.as_slice() {
            [] => !has_body(headers, request.body()),
            [one] => is_json(one),
            _ => false,
        };
        if !json {
            let given = match content_types.first() {
                Some(v) => crate::core::excerpt(&String::from_utf8_lossy(v.as_bytes())),
                None => "none".to_string(),
            };
            return super::serve::refusal(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                ErrorCode::INVALID_ARGUMENT,
                format!(
                    "{} {} takes a JSON body: send `Content-Type: application/json` \
                     (given: {given})",
                    request.method(),
                    request.uri().path()
                ),
            );
        }
    }
    next.run(request).await
}

/// [`super::serve`]'s middleware: the `Host` and `Origin` checks of the
/// module docs (403 `PERMISSION_DENIED`).
pub(crate) async fn check_host(
    State(allowed): State<std::sync::Arc<AllowedHosts>>,
    request: Request,
    next: Next,
) -> Response {
    let headers = request.headers();
    let host = headers
        .get(header::HOST)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let path = request.uri().path();
    if let Some(host) = &host {
        if !unchecked_path(path) && !allowed.allows_host(host) {
            return super::serve::refusal(
                StatusCode::FORBIDDEN,
                ErrorCode::PERMISSION_DENIED,
                format!(
                    "host {} is not served here: list it in [server] http_allowed_hosts \
                     (IP addresses and localhost are always served)",
                    crate::core::excerpt(host)
                ),
            );
        }
    }
    if !is_safe(request.method()) {
        let origins: Vec<_> = headers.get_all(header::ORIGIN).iter().collect();
        let allowed_origin = match origins.as_slice() {
            [] => true,
            [one] => one
                .to_str()
                .is_ok_and(|o| allowed.allows_origin(o, host.as_deref())),
            _ => false,
        };
        if !allowed_origin {
            let origin = origins
                .first()
                .map(|o| String::from_utf8_lossy(o.as_bytes()).into_owned())
                .unwrap_or_default();
            return super::serve::refusal(
                StatusCode::FORBIDDEN,
                ErrorCode::PERMISSION_DENIED,
                format!(
                    "a request from origin {} is refused: only pages of this server \
                     (or of a host in [server] http_allowed_hosts) may send it",
                    crate::core::excerpt(&origin)
                ),
            );
        }
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(names: &[&str]) -> AllowedHosts {
        AllowedHosts::new(&names.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn hosts_allowed_by_default_and_by_name() {
        let h = hosts(&["cronoq.example.com", "api.example.com:8443"]);
        for ok in [
            "127.0.0.1:7070",
            "127.0.0.1",
            "10.1.2.3:80",
            "[::1]:7070",
            "[::1]",
            "localhost:7070",
            "LOCALHOST",
            "localhost.:7070",
            "cronoq.example.com",
            "Cronoq.Example.Com.:7070",
            "api.example.com:8443",
        ] {
            assert!(h.allows_host(ok), "{ok}");
        }
        for refused in [
            "evil.example:7070",
            "api.example.com:7070",
            "127.0.0.1.evil.example",
            "localhost.evil.example",
            "[::1",
            "",
        ] {
            assert!(!h.allows_host(refused), "{refused}");
        }
    }

    #[test]
    fn origins_must_be_this_server() {
        let h = hosts(&["cronoq.example.com"]);
        let host = Some("127.0.0.1:7070");
        assert!(h.allows_origin("http://127.0.0.1:7070", host));
        assert!(h.allows_origin("https://cronoq.example.com", host));
        assert!(h.allows_origin("http://cronoq.example.com:80", Some("cronoq.example.com")));
        assert!(!h.allows_origin("http://127.0.0.1:7071", host));
        assert!(!h.allows_origin("http://evil.example", host));
        assert!(!h.allows_origin("null", host));
        assert!(!h.allows_origin("http://localhost:7070", host));
        // `*` answers any Host but still wants the page to be this server.
        assert!(!AllowedHosts::any().allows_origin("http://evil.example", host));
    }

    #[test]
    fn malformed_names_are_refused() {
        for bad in ["", " ", "http://x", "x/y", "a b"] {
            assert!(AllowedHosts::new(&[bad.to_string()]).is_err(), "{bad:?}");
        }
    }
}
