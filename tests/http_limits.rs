//! The bounds of `cronoq::http::serve` over raw TCP (issue 7, finding 7 and
//! the HTTP part of 8): a stalled head is closed after the header timeout,
//! connections beyond the limit are refused while the others are held, a
//! request with too many headers gets 431 with a JSON code, and an error
//! never echoes a huge value back. The embedded scheduler stands behind the
//! router; no NATS. Every wait is a poll with a generous deadline.

use std::sync::Arc;
use std::time::Duration;

use cronoq::api::{Api, ApiFuture, Health};
use cronoq::core::{Snapshot, TaskId};
use cronoq::http::HttpLimits;
use cronoq::{Scheduler, Task, TaskStatus};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{oneshot, Notify};
use tokio::time::{timeout, Instant};

/// How long any single wait may take before the test fails: far above
/// every timeout configured here, so a slow machine does not fail a test.
const DEADLINE: Duration = Duration::from_secs(10);

struct Served {
    addr: std::net::SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    done: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Served {
    /// The router over an embedded scheduler with pool `p`.
    async fn start(limits: HttpLimits) -> Served {
        let sched = Scheduler::new();
        sched.set_capacity("p", 1).unwrap();
        Served::start_with(Arc::new(sched), limits).await
    }

    async fn start_with(api: Arc<dyn Api>, limits: HttpLimits) -> Served {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = cronoq::http::router(api);
        let (stop, stopped) = oneshot::channel();
        let done = tokio::spawn(cronoq::http::serve(listener, app, limits, async {
            let _ = stopped.await;
        }));
        Served {
            addr,
            stop: Some(stop),
            done,
        }
    }

    async fn connect(&self) -> TcpStream {
        TcpStream::connect(self.addr).await.unwrap()
    }

    /// Sends `request` on a new connection; the whole answer (the server
    /// closes the connection: every request here says `connection: close`
    /// or is refused).
    async fn exchange(&self, request: &[u8]) -> String {
        let mut stream = self.connect().await;
        stream.write_all(request).await.unwrap();
        read_to_close(&mut stream)
            .await
            .expect("the server closes the connection")
    }

    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        timeout(DEADLINE, &mut self.done)
            .await
            .expect("serve returns after shutdown")
            .unwrap()
            .unwrap();
    }
}

/// Reads until the peer closes (EOF or reset); `None` if it is still open
/// at [`DEADLINE`].
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

/// The status and JSON body of a raw HTTP/1.1 answer.
fn parse(answer: &str) -> (u16, Value) {
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP head in {answer:?}"));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    let json = serde_json::from_str(body)
        .unwrap_or_else(|e| panic!("body is not JSON ({e}): {head}\r\n\r\n{body:?}"));
    (status, json)
}

const HEALTHZ: &[u8] = b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n";

#[tokio::test]
async fn a_stalled_head_is_closed_after_the_header_timeout() {
    let served = Served::start(HttpLimits {
        header_timeout: Duration::from_millis(200),
        ..Default::default()
    })
    .await;
    let mut stalled = served.connect().await;
    stalled
        .write_all(b"GET /healthz HTTP/1.1\r\nho")
        .await
        .unwrap();
    let started = Instant::now();
    let answer = read_to_close(&mut stalled).await;
    assert!(
        answer.is_some(),
        "a connection with half a header line is still open after {DEADLINE:?}"
    );
    assert!(started.elapsed() >= Duration::from_millis(150));
    // A silent connection (no byte at all) too.
    let mut silent = served.connect().await;
    assert!(read_to_close(&mut silent).await.is_some());
    // And the server still answers.
    let (status, body) = parse(&served.exchange(HEALTHZ).await);
    assert_eq!(status, 200, "{body}");
    served.stop().await;
}

/// The embedded scheduler, except that `snapshot` says it has started
/// and waits for a permit: requests held in the handler on purpose, any
/// number of them (semaphores: no wake-up is lost).
struct Hold {
    sched: Scheduler,
    entered: tokio::sync::Semaphore,
    release: tokio::sync::Semaphore,
}

impl Hold {
    fn new() -> Arc<Hold> {
        Arc::new(Hold {
            sched: Scheduler::new(),
            entered: tokio::sync::Semaphore::new(0),
            release: tokio::sync::Semaphore::new(0),
        })
    }

    /// A connection whose `GET /v1/snapshot` is in the handler.
    async fn held(&self, served: &Served) -> TcpStream {
        let mut conn = served.connect().await;
        conn.write_all(
            b"GET /v1/snapshot HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n",
        )
        .await
        .unwrap();
        timeout(DEADLINE, self.entered.acquire())
            .await
            .expect("the request reaches the handler")
            .unwrap()
            .forget();
        conn
    }
}

impl Api for Hold {
    fn submit(&self, task: Task) -> ApiFuture<'_, TaskId> {
        Api::submit(&self.sched, task)
    }
    fn task(&self, id: TaskId) -> ApiFuture<'_, TaskStatus> {
        Api::task(&self.sched, id)
    }
    fn cancel(&self, id: TaskId) -> ApiFuture<'_, ()> {
        Api::cancel(&self.sched, id)
    }
    fn snapshot(&self) -> ApiFuture<'_, Snapshot> {
        Box::pin(async move {
            self.entered.add_permits(1);
            self.release.acquire().await.unwrap().forget();
            Api::snapshot(&self.sched).await
        })
    }
    fn recent_tasks(&self, limit: usize) -> ApiFuture<'_, Vec<TaskStatus>> {
        Api::recent_tasks(&self.sched, limit)
    }
    fn health(&self) -> Health {
        Api::health(&self.sched)
    }
}

/// A connection whose request body has not arrived, seen served (its
/// `100 Continue` read, sent once the handler reads the body).
async fn slow_body(served: &Served) -> TcpStream {
    let mut stream = served.connect().await;
    stream
        .write_all(
            b"POST /v1/tasks HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n\
              content-length: 13\r\nexpect: 100-continue\r\nconnection: close\r\n\r\n",
        )
        .await
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 256];
    while !String::from_utf8_lossy(&got).contains("\r\n\r\n") {
        let n = timeout(DEADLINE, stream.read(&mut buf))
            .await
            .expect("100 Continue")
            .unwrap();
        assert!(n > 0, "closed before 100 Continue: {got:?}");
        got.extend_from_slice(&buf[..n]);
    }
    assert!(got.starts_with(b"HTTP/1.1 100"), "{got:?}");
    stream
}

#[tokio::test]
async fn connections_beyond_the_limit_are_refused_while_the_others_are_being_served() {
    const LIMIT: usize = 4;
    let hold = Hold::new();
    let served = Served::start_with(
        hold.clone(),
        HttpLimits {
            max_connections: LIMIT,
            ..Default::default()
        },
    )
    .await;
    let mut held = Vec::new();
    for _ in 0..LIMIT {
        held.push(hold.held(&served).await);
    }
    // Every connection is in a request the server is working on: one more
    // is answered 503 and closed at once, rather than waiting in the
    // backlog.
    let answer = served.exchange(HEALTHZ).await;
    if !answer.is_empty() {
        let (status, body) = parse(&answer);
        assert_eq!(status, 503, "{body}");
        assert_eq!(body["code"], "UNAVAILABLE", "{body}");
    }
    // The held requests are still answered.
    hold.release.add_permits(LIMIT);
    for conn in &mut held {
        let answer = read_to_close(conn).await.expect("an answer");
        assert_eq!(parse(&answer).0, 200, "{answer}");
    }
    drop(held);
    // Once they are gone, a new connection is served (the server notices
    // the closes asynchronously: poll).
    let end = Instant::now() + DEADLINE;
    loop {
        let answer = served.exchange(HEALTHZ).await;
        if answer.starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(Instant::now() < end, "still refused: {answer:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    served.stop().await;
}

#[tokio::test]
async fn at_the_limit_the_connection_idle_longest_makes_room() {
    const LIMIT: usize = 4;
    let hold = Hold::new();
    let served = Served::start_with(
        hold.clone(),
        HttpLimits {
            max_connections: LIMIT,
            ..Default::default()
        },
    )
    .await;
    let mut busy = hold.held(&served).await;
    let mut idle = Vec::new();
    for _ in 0..LIMIT - 1 {
        idle.push(served.connect().await);
    }
    // Full: a new connection is served, and the idle one accepted first
    // is closed without an answer (not `busy`, which is older but in a
    // request).
    let (status, body) = parse(&served.exchange(HEALTHZ).await);
    assert_eq!(status, 200, "{body}");
    assert_eq!(read_to_close(&mut idle[0]).await.as_deref(), Some(""));
    // The connection in a request was left alone.
    hold.release.add_permits(1);
    let answer = read_to_close(&mut busy).await.expect("an answer");
    assert_eq!(parse(&answer).0, 200, "{answer}");
    served.stop().await;
}

#[tokio::test]
async fn with_none_idle_a_request_whose_body_is_still_arriving_makes_room() {
    const LIMIT: usize = 4;
    let hold = Hold::new();
    let served = Served::start_with(
        hold.clone(),
        HttpLimits {
            max_connections: LIMIT,
            ..Default::default()
        },
    )
    .await;
    let mut held = vec![hold.held(&served).await];
    let mut slow = slow_body(&served).await;
    for _ in 0..LIMIT - 2 {
        held.push(hold.held(&served).await);
    }
    // Full, nobody idle: the slow upload makes room, not a request the
    // server is working on (the first one is older).
    let (status, body) = parse(&served.exchange(HEALTHZ).await);
    assert_eq!(status, 200, "{body}");
    assert_eq!(read_to_close(&mut slow).await.as_deref(), Some(""));
    hold.release.add_permits(held.len());
    for conn in &mut held {
        let answer = read_to_close(conn).await.expect("an answer");
        assert_eq!(parse(&answer).0, 200, "{answer}");
    }
    served.stop().await;
}

#[tokio::test]
async fn too_many_headers_is_431_with_a_json_code() {
    let served = Served::start(HttpLimits::default()).await;
    let mut request =
        String::from("GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n");
    for i in 0..200 {
        request.push_str(&format!("x-h{i}: v\r\n"));
    }
    request.push_str("\r\n");
    let (status, body) = parse(&served.exchange(request.as_bytes()).await);
    assert_eq!(status, 431);
    assert_eq!(body["code"], "INVALID_ARGUMENT", "{body}");
    assert!(body["message"].as_str().unwrap().contains("100 headers"));

    // One huge header is the same refusal. (Just over the 64 KiB limit and
    // within hyper's read buffer, so the server has read all of it when it
    // answers: unread bytes at close would reset the connection and could
    // lose the answer.)
    let request = format!(
        "GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\nx-big: {}\r\n\r\n",
        "v".repeat(65 * 1024)
    );
    let (status, body) = parse(&served.exchange(request.as_bytes()).await);
    assert_eq!(status, 431);
    assert_eq!(body["code"], "INVALID_ARGUMENT", "{body}");

    // A malformed header line is a JSON 400.
    let (status, body) = parse(
        &served
            .exchange(b"GET /healthz HTTP/1.1\r\nno colon here\r\n\r\n")
            .await,
    );
    assert_eq!(status, 400);
    assert_eq!(body["code"], "INVALID_ARGUMENT", "{body}");

    // A request within the limits is still answered normally.
    let (status, _) = parse(&served.exchange(HEALTHZ).await);
    assert_eq!(status, 200);
    served.stop().await;
}

fn post(path: &str, body: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[tokio::test]
async fn a_huge_bad_value_is_not_echoed_back() {
    let served = Served::start(HttpLimits::default()).await;
    let huge = "9".repeat(1_000_000);
    for body in [
        format!(r#"{{"pool": "p", "deadline": "{huge}y"}}"#),
        format!(r#"{{"pool": "p", "priority": "{huge}"}}"#),
        format!(r#"{{"pool": "p", "{huge}": 1}}"#),
        format!(r#"{{"pool": "p", "labels": {{"gpu": "{huge}"}}}}"#),
    ] {
        let answer = served.exchange(&post("/v1/tasks", &body)).await;
        let (status, json) = parse(&answer);
        assert_eq!(status, 400, "{json}");
        assert_eq!(json["code"], "INVALID_ARGUMENT", "{json}");
        assert!(
            answer.len() < 1000,
            "an answer of {} bytes: {:.300}",
            answer.len(),
            answer
        );
    }
    served.stop().await;
}

/// The head of a `POST /v1/tasks` announcing a 100-byte body, and the
/// first few bytes of that body; the rest never comes.
const STALLED_BODY: &[u8] =
    b"POST /v1/tasks HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"pool\": ";

#[tokio::test]
async fn a_stalled_body_is_closed_after_the_idle_timeout() {
    let served = Served::start(HttpLimits {
        idle_timeout: Duration::from_millis(200),
        ..Default::default()
    })
    .await;
    let mut stalled = served.connect().await;
    stalled.write_all(STALLED_BODY).await.unwrap();
    assert!(
        read_to_close(&mut stalled).await.is_some(),
        "a connection whose body stalled is still open after {DEADLINE:?}"
    );
    served.stop().await;
}

#[tokio::test]
async fn a_request_not_answered_in_time_is_503_unavailable() {
    let served = Served::start(HttpLimits {
        request_timeout: Duration::from_millis(200),
        ..Default::default()
    })
    .await;
    let answer = served.exchange(STALLED_BODY).await;
    let (status, body) = parse(&answer);
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["code"], "UNAVAILABLE", "{body}");
    served.stop().await;
}

#[tokio::test]
async fn shutdown_closes_idle_connections_and_returns() {
    let served = Served::start(HttpLimits::default()).await;
    // An idle keep-alive connection after one answered request.
    let mut idle = served.connect().await;
    idle.write_all(b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 1024];
    let n = timeout(DEADLINE, idle.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    served.stop().await;
    assert!(read_to_close(&mut idle).await.is_some());
}

/// The embedded scheduler, except that `snapshot` says it has started and
/// then waits to be released: a request held in flight on purpose.
struct Gate {
    sched: Scheduler,
    entered: Notify,
    release: Notify,
}

impl Api for Gate {
    fn submit(&self, task: Task) -> ApiFuture<'_, TaskId> {
        Api::submit(&self.sched, task)
    }
    fn task(&self, id: TaskId) -> ApiFuture<'_, TaskStatus> {
        Api::task(&self.sched, id)
    }
    fn cancel(&self, id: TaskId) -> ApiFuture<'_, ()> {
        Api::cancel(&self.sched, id)
    }
    fn snapshot(&self) -> ApiFuture<'_, Snapshot> {
        Box::pin(async move {
            self.entered.notify_one();
            self.release.notified().await;
            Api::snapshot(&self.sched).await
        })
    }
    fn recent_tasks(&self, limit: usize) -> ApiFuture<'_, Vec<TaskStatus>> {
        Api::recent_tasks(&self.sched, limit)
    }
    fn health(&self) -> Health {
        Api::health(&self.sched)
    }
}

#[tokio::test]
async fn shutdown_lets_a_request_in_flight_finish_and_accepts_no_more() {
    let gate = Arc::new(Gate {
        sched: Scheduler::new(),
        entered: Notify::new(),
        release: Notify::new(),
    });
    let served = Served::start_with(gate.clone(), HttpLimits::default()).await;
    let addr = served.addr;
    let mut conn = served.connect().await;
    conn.write_all(b"GET /v1/snapshot HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    timeout(DEADLINE, gate.entered.notified())
        .await
        .expect("the request reaches the handler");
    let Served { stop, mut done, .. } = served;
    let _ = stop.unwrap().send(());
    // No new connection is taken once shutdown has begun.
    let end = Instant::now() + DEADLINE;
    while TcpStream::connect(addr).await.is_ok() {
        assert!(Instant::now() < end, "still accepting after shutdown");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        !done.is_finished(),
        "serve returned with a request in flight"
    );
    gate.release.notify_one();
    let answer = read_to_close(&mut conn)
        .await
        .expect("the connection is closed after its answer");
    let (status, json) = parse(&answer);
    assert_eq!(status, 200, "{json}");
    assert!(json["pools"].is_array(), "{json}");
    timeout(DEADLINE, &mut done)
        .await
        .expect("serve returns once the request is answered")
        .unwrap()
        .unwrap();
}

#[test]
fn the_limits_come_from_the_server_config() {
    let config = cronoq::server::ServerConfig::parse(
        "[server]\nhttp_header_timeout = \"2s\"\nhttp_idle_timeout = \"5m\"\nhttp_max_connections = 7\n",
    )
    .unwrap();
    assert_eq!(config.server.http_header_timeout, Duration::from_secs(2));
    assert_eq!(config.server.http_idle_timeout, Duration::from_secs(300));
    assert_eq!(config.server.http_max_connections, 7);
    let defaults = cronoq::server::ServerConfig::parse("").unwrap().server;
    let limits = HttpLimits::default();
    assert_eq!(defaults.http_header_timeout, limits.header_timeout);
    assert_eq!(defaults.http_idle_timeout, limits.idle_timeout);
    assert_eq!(defaults.http_max_connections, limits.max_connections);
    assert!(
        cronoq::server::ServerConfig::parse("[server]\nhttp_idle_timeout = \"soon\"\n").is_err()
    );
}
