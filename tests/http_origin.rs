//! Where HTTP requests come from (issue 20, finding 1), against real
//! processes (`cronoq dev` and `cronoq server` over a real nats-server),
//! with credentials off: a web page must not be able to drive the API
//! through the user's browser.
//!
//! - CSRF: a `POST` whose body is not `Content-Type: application/json`
//!   (`text/plain`, a form, none) is 415 `INVALID_ARGUMENT` and submits
//!   nothing; a `POST` whose `Origin` is another site is 403
//!   `PERMISSION_DENIED`; no `Access-Control-*` header is ever sent, so a
//!   browser's preflight for a cross-origin JSON post fails.
//! - DNS rebinding: a `Host` that is not an IP address, `localhost` or a
//!   name of `[server] http_allowed_hosts` is 403 `PERMISSION_DENIED`
//!   (health and metrics excepted).
//!
//! The dashboard's own requests (JSON with its own `Origin`) go through.

mod procs;

use std::time::Duration;

use procs::{CronoqDev, CronoqServer, NatsServer, SERVER_CONFIG};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// An answer: status, headers (lowercase names) and body.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {self:?}"))
    }

    fn code(&self) -> String {
        self.json()["code"].as_str().unwrap_or("").to_string()
    }
}

/// One raw HTTP/1.1 request to `addr` (`host:port`) with exactly these
/// headers (plus `Content-Length` and `Connection: close`).
async fn raw(addr: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Answer {
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connecting");
    let mut request = format!("{method} {path} HTTP/1.1\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    ));
    stream.write_all(request.as_bytes()).await.expect("writing");
    let mut reply = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut reply))
        .await
        .expect("an answer within 30 s")
        .expect("reading");
    let reply = String::from_utf8_lossy(&reply).into_owned();
    let (head, body) = reply
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP head in {reply:?}"));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Answer {
        status,
        headers,
        body: body.to_string(),
    }
}

/// How many tasks the API lists.
async fn task_count(addr: &str) -> usize {
    let answer = raw(addr, "GET", "/v1/tasks", &[("Host", addr)], "").await;
    assert_eq!(answer.status, 200, "{answer:?}");
    answer.json()["tasks"]
        .as_array()
        .expect("a task list")
        .len()
}

const TASK: &str = r#"{"payload": "hello"}"#;

#[tokio::test]
async fn with_auth_off_a_web_page_cannot_submit_or_rebind() {
    let dev = CronoqDev::start().await;
    let addr = dev.http_url().strip_prefix("http://").unwrap().to_string();
    let port = addr.rsplit_once(':').unwrap().1.to_string();
    let before = task_count(&addr).await;

    // CSRF: what a form or a no-cors fetch can send. Each is refused 415
    // INVALID_ARGUMENT and submits nothing.
    for content_type in [
        Some("text/plain"),
        Some("text/plain;charset=UTF-8"),
        Some("application/x-www-form-urlencoded"),
        Some("multipart/form-data; boundary=x"),
        None,
    ] {
        // Without an Origin (curl -d, or a browser that left it out): a
        // body must say it is JSON.
        let mut headers = vec![("Host", addr.as_str())];
        if let Some(ct) = content_type {
            headers.push(("Content-Type", ct));
        }
        let answer = raw(&addr, "POST", "/v1/tasks", &headers, TASK).await;
        assert_eq!(answer.status, 415, "{content_type:?}: {answer:?}");
        assert_eq!(answer.code(), "INVALID_ARGUMENT", "{answer:?}");
        assert!(answer.body.contains("application/json"), "{answer:?}");
        // With the Origin a browser sends, the origin check answers first.
        headers.push(("Origin", "http://evil.example"));
        let answer = raw(&addr, "POST", "/v1/tasks", &headers, TASK).await;
        assert_eq!(answer.status, 403, "{content_type:?}: {answer:?}");
    }
    // A JSON post from another origin (it would need a preflight; a
    // browser that skipped it still sends Origin): 403.
    let answer = raw(
        &addr,
        "POST",
        "/v1/tasks",
        &[
            ("Host", &addr),
            ("Origin", "http://evil.example"),
            ("Content-Type", "application/json"),
        ],
        TASK,
    )
    .await;
    assert_eq!(answer.status, 403, "{answer:?}");
    assert_eq!(answer.code(), "PERMISSION_DENIED", "{answer:?}");
    // A bodiless cancel (a no-cors fetch) from another origin: 403.
    let answer = raw(
        &addr,
        "POST",
        "/v1/tasks/1/cancel",
        &[("Host", &addr), ("Origin", "null")],
        "",
    )
    .await;
    assert_eq!(answer.status, 403, "{answer:?}");
    assert_eq!(answer.code(), "PERMISSION_DENIED", "{answer:?}");

    // DNS rebinding: a page of evil.example whose name now points at
    // 127.0.0.1 reads and posts with its own Host. Refused, reads too.
    let evil = format!("evil.example:{port}");
    for (method, path, body) in [
        ("GET", "/v1/tasks", ""),
        ("GET", "/v1/snapshot", ""),
        ("GET", "/", ""),
        ("POST", "/v1/tasks", TASK),
    ] {
        let answer = raw(
            &addr,
            method,
            path,
            &[("Host", &evil), ("Content-Type", "application/json")],
            body,
        )
        .await;
        assert_eq!(answer.status, 403, "{method} {path}: {answer:?}");
        assert_eq!(answer.code(), "PERMISSION_DENIED", "{answer:?}");
        assert!(answer.body.contains("http_allowed_hosts"), "{answer:?}");
    }
    // Probes and scrapers use whatever name the server has.
    let answer = raw(&addr, "GET", "/healthz", &[("Host", &evil)], "").await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(
        task_count(&addr).await,
        before,
        "a refused request submitted a task"
    );

    // No CORS: a preflight for a cross-origin JSON post gets no
    // Access-Control-* header (so the browser never sends the post), nor
    // does any answer.
    let preflight = raw(
        &addr,
        "OPTIONS",
        "/v1/tasks",
        &[
            ("Host", &addr),
            ("Origin", "http://evil.example"),
            ("Access-Control-Request-Method", "POST"),
            ("Access-Control-Request-Headers", "content-type"),
        ],
        "",
    )
    .await;
    let read = raw(
        &addr,
        "GET",
        "/v1/tasks",
        &[("Host", &addr), ("Origin", "http://evil.example")],
        "",
    )
    .await;
    assert_eq!(read.status, 200, "{read:?}");
    for answer in [&preflight, &read] {
        assert!(
            !answer
                .headers
                .iter()
                .any(|(n, _)| n.starts_with("access-control-")),
            "{answer:?}"
        );
    }

    // What the dashboard sends (JSON, its own origin), and the loopback
    // names: accepted.
    for host in [
        addr.clone(),
        format!("localhost:{port}"),
        format!("[::1]:{port}"),
    ] {
        let origin = format!("http://{host}");
        let answer = raw(
            &addr,
            "POST",
            "/v1/tasks",
            &[
                ("Host", &host),
                ("Origin", &origin),
                ("Content-Type", "application/json; charset=utf-8"),
            ],
            TASK,
        )
        .await;
        assert_eq!(answer.status, 200, "{host}: {answer:?}");
    }
    assert_eq!(task_count(&addr).await, before + 3);
    // And the CLI over HTTP (JSON, no Origin), a cancel without a body.
    let out = procs::run_cli(&["submit", "--http", dev.http_url(), "hi"], None).await;
    assert_eq!(out.code, Some(0), "{out:?}");
    let out = procs::run_cli(
        &["cancel", "--http", dev.http_url(), out.stdout.trim()],
        None,
    )
    .await;
    assert!(
        out.code == Some(0) || out.stderr.contains("FAILED_PRECONDITION"),
        "{out:?}"
    );
}

#[tokio::test]
async fn a_server_answers_the_hosts_its_config_lists() {
    let dir = tempfile::tempdir().unwrap();
    let nats = NatsServer::start();
    let config = SERVER_CONFIG.replacen(
        "[server]\n",
        "[server]\nhttp_allowed_hosts = [\"cronoq.test\", \"api.cronoq.test:8443\"]\n",
        1,
    );
    let server = CronoqServer::start_configured(&nats, dir.path(), &config, &[], true).await;
    let addr = server
        .http_url()
        .strip_prefix("http://")
        .unwrap()
        .to_string();
    let port = addr.rsplit_once(':').unwrap().1.to_string();
    for (host, status) in [
        (format!("cronoq.test:{port}"), 200),
        ("CRONOQ.TEST".to_string(), 200),
        ("api.cronoq.test:8443".to_string(), 200),
        (format!("api.cronoq.test:{port}"), 403),
        (format!("evil.example:{port}"), 403),
        (format!("127.0.0.1:{port}"), 200),
    ] {
        let answer = raw(&addr, "GET", "/v1/snapshot", &[("Host", &host)], "").await;
        assert_eq!(answer.status, status, "{host}: {answer:?}");
    }
    // A page served under a listed name may post (behind a proxy that
    // passes Host on, its Origin is https://cronoq.test).
    let answer = raw(
        &addr,
        "POST",
        "/v1/tasks",
        &[
            ("Host", &addr),
            ("Origin", "https://cronoq.test"),
            ("Content-Type", "application/json"),
        ],
        TASK,
    )
    .await;
    assert_eq!(answer.status, 200, "{answer:?}");

    // A malformed entry stops the server at start-up with the key named.
    let bad = SERVER_CONFIG.replacen(
        "[server]\n",
        "[server]\nhttp_allowed_hosts = [\"http://cronoq.test/\"]\n",
        1,
    );
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, bad).unwrap();
    let out = procs::run_cli(
        &[
            "server",
            "--check-config",
            "--config",
            path.to_str().unwrap(),
        ],
        None,
    )
    .await;
    assert_eq!(out.code, Some(2), "{out:?}");
    assert!(
        out.stderr.contains("http_allowed_hosts") && out.stderr.contains("INVALID_ARGUMENT"),
        "{out:?}"
    );
}

/// Clickjacking (issue 34, finding 8): with auth off the dashboard's
/// submit form would be a target inside another site's frame. Its page and
/// assets say never to be framed (`X-Frame-Options: DENY`, CSP
/// `frame-ancestors 'none'`), and its CSP allows only its own script,
/// style and API. Reproduction on 53e0b1f: `curl -sI http://127.0.0.1:7070/`
/// showed neither header.
#[tokio::test]
async fn the_dashboard_cannot_be_framed() {
    let dev = CronoqDev::start().await;
    let addr = dev.http_url().strip_prefix("http://").unwrap().to_string();
    for path in ["/", "/dashboard/app.js", "/dashboard/app.css"] {
        let answer = raw(&addr, "GET", path, &[("Host", &addr)], "").await;
        assert_eq!(answer.status, 200, "{path}: {answer:?}");
        let header = |name: &str| {
            answer
                .headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.clone())
                .unwrap_or_else(|| panic!("{path}: no {name}: {answer:?}"))
        };
        assert_eq!(header("x-frame-options"), "DENY");
        let csp = header("content-security-policy");
        assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
        assert!(csp.contains("default-src 'self'"), "{csp}");
        assert_eq!(header("x-content-type-options"), "nosniff");
    }
}
