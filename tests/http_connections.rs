//! Idle HTTP connections cannot lock callers out (issue 20, finding 2),
//! against a real `cronoq server` over a real nats-server, with real
//! sockets. Before, `http_max_connections` idle connections (silent, or
//! sending a head a byte at a time) took every slot, and every caller was
//! answered 503 until the header timeout closed them. Now a new connection
//! displaces the connection idle longest (or, with none idle, one whose
//! request body is still arriving); only requests the server is working
//! on hold their place (tested with a handler held on purpose in
//! `tests/http_limits.rs`).
//!
//! Nothing here waits for a timeout: the header timeout is set far beyond
//! the test, and "in a request" is observed, not assumed (a request that
//! says `Expect: 100-continue` is answered `100 Continue` once its handler
//! reads the body, i.e. once the server is serving it).

mod procs;

use std::time::Duration;

use procs::{CronoqServer, NatsServer, SERVER_CONFIG};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{timeout, Instant};

const LIMIT: usize = 16;
const DEADLINE: Duration = Duration::from_secs(30);

async fn server(dir: &std::path::Path, nats: &NatsServer) -> CronoqServer {
    let config = SERVER_CONFIG.replacen(
        "[server]\n",
        &format!(
            "[server]\nhttp_max_connections = {LIMIT}\nhttp_header_timeout = \"10m\"\n\
             http_idle_timeout = \"10m\"\n"
        ),
        1,
    );
    CronoqServer::start_configured(nats, dir, &config, &[], true).await
}

/// Reads until the peer closes; `None` if it is still open at the deadline.
async fn read_to_close(stream: &mut TcpStream) -> Option<String> {
    let mut out = Vec::new();
    let end = Instant::now() + DEADLINE;
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at(end, stream.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some(String::from_utf8_lossy(&out).into_owned()),
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
        }
    }
}

/// One request on a new connection: the whole answer.
async fn exchange(addr: &str, path: &str) -> String {
    let mut stream = TcpStream::connect(addr).await.expect("connecting");
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("writing");
    read_to_close(&mut stream)
        .await
        .expect("the server answers and closes")
}

fn status(answer: &str) -> u16 {
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// A connection in a request whose body has not arrived (a slow upload),
/// seen served (its `100 Continue` read).
async fn in_request(addr: &str) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.expect("connecting");
    let head = format!(
        "POST /v1/tasks HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: 19\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.expect("writing");
    let mut got = Vec::new();
    let mut buf = [0u8; 256];
    while !String::from_utf8_lossy(&got).contains("\r\n\r\n") {
        let n = timeout(DEADLINE, stream.read(&mut buf))
            .await
            .expect("100 Continue within the deadline")
            .expect("reading");
        assert!(n > 0, "closed before 100 Continue: {got:?}");
        got.extend_from_slice(&buf[..n]);
    }
    assert!(
        String::from_utf8_lossy(&got).starts_with("HTTP/1.1 100"),
        "{got:?}"
    );
    stream
}

#[tokio::test]
async fn idle_and_slow_loris_connections_cannot_lock_callers_out() {
    let dir = tempfile::tempdir().unwrap();
    let nats = NatsServer::start();
    let server = server(dir.path(), &nats).await;
    let addr = server
        .http_url()
        .strip_prefix("http://")
        .unwrap()
        .to_string();

    // Three times the limit: silent connections and connections that sent
    // part of a head (slow loris), interleaved.
    let mut idle = Vec::new();
    for i in 0..3 * LIMIT {
        let mut stream = TcpStream::connect(&addr).await.expect("connecting");
        if i % 2 == 1 {
            stream
                .write_all(b"GET /v1/snapshot HTTP/1.1\r\nHo")
                .await
                .unwrap();
        }
        idle.push(stream);
    }
    // Every caller is still served, again and again.
    for _ in 0..LIMIT {
        let answer = exchange(&addr, "/v1/snapshot").await;
        assert_eq!(status(&answer), 200, "{answer}");
    }
    // The connections idle longest were closed to make room (the header
    // timeout is 10 minutes: nothing else closes them).
    let first = read_to_close(&mut idle[0]).await;
    assert!(first.is_some(), "the oldest idle connection is still open");
    assert_eq!(first.unwrap(), "", "it is closed without an answer");

    // Slow uploads too: connections whose request body is still arriving
    // make room when no connection is idle, the one whose request started
    // first ...
    let mut uploads = Vec::new();
    for _ in 0..LIMIT {
        uploads.push(in_request(&addr).await);
    }
    let answer = exchange(&addr, "/healthz").await;
    assert_eq!(status(&answer), 200, "{answer}");
    assert_eq!(read_to_close(&mut uploads[0]).await.as_deref(), Some(""));
    // ... and the others are served when their bodies arrive.
    for stream in &mut uploads[1..] {
        stream.write_all(br#"{"payload": "busy"}"#).await.unwrap();
    }
    for stream in &mut uploads[1..] {
        let answer = read_to_close(stream).await.expect("an answer");
        assert_eq!(status(&answer), 200, "{answer}");
    }
    drop(idle);
}
