//! Serving the HTTP API over TCP with bounds ([`serve`], [`HttpLimits`]):
//! how long a client may take to send a request head, how long a
//! connection may sit without moving a byte, how long one request may take,
//! how many connections are open at once, and how many and how large the
//! headers may be. `axum::serve` has none of these: it holds a connection
//! that never finishes its head forever.
//!
//! Every refusal is cronoq's JSON error `{"code", "message"}`:
//!
//! | refusal | status | code |
//! |---|---|---|
//! | too many headers, or a head over `max_header_bytes` | 431 | `INVALID_ARGUMENT` |
//! | a malformed request line or header | 400 | `INVALID_ARGUMENT` |
//! | a URI over hyper's 64 KiB | 414 | `INVALID_ARGUMENT` |
//! | a body over the router's limit (2 MB) | 413 | `INVALID_ARGUMENT` |
//! | a request not answered within `request_timeout` | 503 | `UNAVAILABLE` |
//! | a connection over `max_connections` while every open one is in a request | 503 | `UNAVAILABLE` |
//! | a `Host` or `Origin` that is not this server ([`super::origin`]) | 403 | `PERMISSION_DENIED` |
//!
//! The oversized and malformed requests are `INVALID_ARGUMENT`, like an
//! oversized payload: sending the same request again never helps, whereas
//! `RESOURCE_EXHAUSTED` tells a client to retry later. The two 503s are
//! `UNAVAILABLE`, the code a client retries.
//!
//! hyper answers a head it cannot parse (431, 400, 414) itself, with an
//! empty body, and offers no hook for the body. So the connection's I/O is
//! wrapped ([`Guarded`]): a response head that is exactly such an automatic
//! answer (one of those statuses, `content-length: 0`) is replaced, as it is
//! written, by the same status with the JSON body and `connection: close`.
//! No handler here answers those statuses without a body, so nothing else
//! is rewritten; `tests/http_limits.rs` fails if hyper's output changes.
//!
//! **At the connection limit**, a new connection does not wait and is not
//! refused while some open connection is idle, i.e. not in a request (it
//! sent nothing yet, sent part of a head, or is a keep-alive connection
//! between requests): the one idle longest is closed and the new one takes
//! its place ([`Connections`]). So idle or slow-loris connections cannot
//! lock others out: they only displace each other. A connection is in a
//! request from when its head has arrived until its response has been
//! written. When every connection is, one whose request body is still
//! arriving (a slow upload, or a slow-body attack) makes room, the one
//! whose request started first; only when every connection is in a request
//! with its body read (the server is working on them) is a new one refused
//! (503 `UNAVAILABLE`). (If an idle connection's head completes just as it
//! is chosen, that request is dropped with the connection: the client sees
//! a reset, as with any keep-alive connection the server closes.)
//!
//! A connection whose head does not arrive within `header_timeout` is
//! closed without an answer (there is no request to answer, and hyper gives
//! no way to write one). hyper starts that timer whenever it waits for a
//! head, so a keep-alive connection idle between requests is also closed
//! after `header_timeout`; `idle_timeout` bounds silence at any point (a
//! stalled body, a client that stops reading the response).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use axum::body::HttpBody as _;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::{Instant, Sleep};

use crate::core::ErrorCode;

/// The bounds [`serve`] holds every connection to. `cronoq server` reads
/// the first three from `[server]` (`http_header_timeout`,
/// `http_idle_timeout`, `http_max_connections`).
///
/// ```
/// let limits = cronoq::http::HttpLimits::default();
/// assert_eq!(limits.header_timeout, std::time::Duration::from_secs(10));
/// assert_eq!(limits.max_connections, 1024);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpLimits {
    /// From when the server waits for a request head (a new connection, or
    /// a keep-alive one after its last response) until the whole head has
    /// arrived; past it the connection is closed. Default 10 s.
    pub header_timeout: Duration,
    /// A connection on which no byte moves either way for this long is
    /// closed. Default 60 s.
    pub idle_timeout: Duration,
    /// A request not answered within this (its body read included) is
    /// answered 503 `UNAVAILABLE`. Default 30 s.
    pub request_timeout: Duration,
    /// Connections open at once (at least 1). One more closes the open
    /// connection idle longest (not in a request), or else one whose
    /// request body is still arriving, and takes its place; when every
    /// open one is in a request with its body read, it is answered 503
    /// `UNAVAILABLE` and closed at once. Default 1,024.
    pub max_connections: usize,
    /// Headers in one request; more is 431. Default 100.
    pub max_headers: usize,
    /// Bytes in one request head (request line and headers); more is 431.
    /// Default 64 KiB.
    pub max_header_bytes: usize,
    /// On shutdown, how long requests in flight may take to finish before
    /// their connections are dropped. Default 10 s.
    pub shutdown_grace: Duration,
    /// The `Host` names answered besides IP addresses and `localhost`
    /// (DNS rebinding; see [`super::origin`]). Default: none.
    pub allowed_hosts: super::AllowedHosts,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            request_timeout: Duration::from_secs(30),
            max_connections: 1024,
            max_headers: 100,
            max_header_bytes: 64 * 1024,
            shutdown_grace: Duration::from_secs(10),
            allowed_hosts: super::AllowedHosts::default(),
        }
    }
}

/// A JSON refusal `{"code", "message"}` with an explicit status, for the
/// refusals whose status is not [`super::status_of`] of their code (413,
/// 431, …).
pub(crate) fn refusal(status: StatusCode, code: ErrorCode, message: String) -> Response {
    let body = crate::wire::WireError::new(code, super::clamp_message(&message).into_owned());
    (status, axum::Json(body)).into_response()
}

/// Serves `router` on `listener` within `limits` until `shutdown`
/// resolves; then stops accepting, lets requests in flight finish within
/// `limits.shutdown_grace`, drops what is left and returns. Errors of
/// single connections, and accept errors (such as running out of file
/// descriptors, logged at most once a second), do not end it.
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::io::Result<()> {
/// use std::sync::Arc;
/// let app = cronoq::http::router(Arc::new(cronoq::Scheduler::new()));
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:7070").await?;
/// let limits = cronoq::http::HttpLimits::default();
/// cronoq::http::serve(listener, app, limits, async {
///     let _ = tokio::signal::ctrl_c().await;
/// })
/// .await
/// # }
/// ```
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: HttpLimits,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let limits = Arc::new(limits);
    let router = router
        .layer(axum::middleware::from_fn_with_state(
            Arc::new(limits.allowed_hosts.clone()),
            super::origin::check_host,
        ))
        .layer(axum::middleware::from_fn_with_state(
            limits.request_timeout,
            request_timeout,
        ));
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_headers(limits.max_headers)
        .max_header_size(limits.max_header_bytes)
        // The read buffer must hold a head of `max_header_bytes`; hyper's
        // own floor is 8 KiB + 4 KiB.
        .max_buf_size((limits.max_header_bytes + 4096).max(8192 + 4096));
    let max_connections = limits.max_connections.max(1);
    let open = Arc::new(Connections::default());
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut connections = JoinSet::new();
    let mut accept_errors = AcceptErrors::default();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, _peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    accept_errors.note(&e);
                    if is_resource_error(&e) {
                        // Nothing frees a descriptor faster than in-flight
                        // requests finishing: wait a little, don't spin.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    continue;
                }
            },
        };
        while connections.try_join_next().is_some() {}
        let Some(slot) = open.admit(max_connections) else {
            tracing::debug!(
                max_connections,
                "connection refused: every connection is in a request"
            );
            refuse_connection(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let io = TokioIo::new(Guarded::new(stream, limits.clone()));
        let service = {
            let (router, slot) = (TowerToHyperService::new(router.clone()), slot.clone());
            hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
                let in_request = slot.in_request();
                let request = if request.body().is_end_stream() {
                    request.map(axum::body::Body::new)
                } else {
                    // Displaceable until its body has been read (or dropped).
                    let reading = slot.reading_body();
                    request.map(|body| {
                        axum::body::Body::new(http_body_util::BodyExt::map_frame(
                            body,
                            move |frame| {
                                let _ = &reading;
                                frame
                            },
                        ))
                    })
                };
                let response = hyper::service::Service::call(&router, request);
                async move {
                    let response = response.await?;
                    // In a request until the body is written (or dropped).
                    Ok::<_, std::convert::Infallible>(response.map(|body| {
                        axum::body::Body::new(http_body_util::BodyExt::map_frame(
                            body,
                            move |frame| {
                                let _ = &in_request;
                                frame
                            },
                        ))
                    }))
                }
            })
        };
        let connection = builder.serve_connection(io, service);
        let mut stop = stop_rx.clone();
        connections.spawn(async move {
            let mut connection = std::pin::pin!(connection);
            let result = tokio::select! {
                result = connection.as_mut() => result,
                () = slot.displaced() => {
                    tracing::debug!("http connection closed to make room for a new one (idle, or its body still arriving)");
                    Ok(())
                }
                () = async { drop(stop.wait_for(|stop| *stop).await) } => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            drop(slot);
            if let Err(e) = result {
                tracing::debug!(error = %e, "http connection ended");
            }
        });
    }
    drop(listener);
    let _ = stop_tx.send(true);
    let drained = tokio::time::timeout(limits.shutdown_grace, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            open = connections.len(),
            "http connections still open after the shutdown grace; dropping them"
        );
        connections.shutdown().await;
    }
    Ok(())
}

/// The open connections of one [`serve`], and which of them are in a
/// request: at the limit, the one idle longest makes room for a new one
/// (see the module docs).
#[derive(Default)]
struct Connections {
    inner: std::sync::Mutex<ConnectionsInner>,
}

#[derive(Default)]
struct ConnectionsInner {
    next_id: u64,
    open: std::collections::HashMap<u64, ConnectionState>,
}

struct ConnectionState {
    /// Requests in progress (hyper serves one at a time; a response body
    /// being written still counts).
    in_requests: usize,
    /// Since when it has been out of any request (accepted, or its last
    /// response written).
    idle_since: Instant,
    /// Since when its request's body has been arriving, while it is.
    body_since: Option<Instant>,
    /// Notified when it is chosen to make room.
    displace: Arc<tokio::sync::Notify>,
}

impl Connections {
    fn lock(&self) -> std::sync::MutexGuard<'_, ConnectionsInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A slot for a new connection: a free one, or that of the connection
    /// idle longest, which is told to close; `None` when all `max` are in
    /// a request.
    fn admit(self: &Arc<Self>, max: usize) -> Option<Slot> {
        let mut inner = self.lock();
        if inner.open.len() >= max {
            let idle = inner
                .open
                .iter()
                .filter(|(_, c)| c.in_requests == 0)
                .min_by_key(|(id, c)| (c.idle_since, **id));
            let reading = || {
                inner
                    .open
                    .iter()
                    .filter_map(|(id, c)| Some((id, c.body_since?)))
                    .min_by_key(|(id, since)| (*since, **id))
                    .map(|(id, _)| *id)
            };
            let victim = idle.map(|(id, _)| *id).or_else(reading)?;
            if let Some(displaced) = inner.open.remove(&victim) {
                displaced.displace.notify_one();
            }
        }
        let id = inner.next_id;
        inner.next_id += 1;
        let displace = Arc::new(tokio::sync::Notify::new());
        inner.open.insert(
            id,
            ConnectionState {
                in_requests: 0,
                idle_since: Instant::now(),
                body_since: None,
                displace: displace.clone(),
            },
        );
        Some(Slot(Arc::new(SlotInner {
            id,
            connections: self.clone(),
            displace,
        })))
    }
}

/// One connection's place in [`Connections`]; freed when the last clone
/// is dropped.
#[derive(Clone)]
struct Slot(Arc<SlotInner>);

struct SlotInner {
    id: u64,
    connections: Arc<Connections>,
    displace: Arc<tokio::sync::Notify>,
}

impl Drop for SlotInner {
    fn drop(&mut self) {
        self.connections.lock().open.remove(&self.id);
    }
}

impl Slot {
    /// Marks the connection in a request until the guard is dropped.
    fn in_request(&self) -> InRequest {
        if let Some(c) = self.0.connections.lock().open.get_mut(&self.0.id) {
            c.in_requests += 1;
        }
        InRequest(self.0.clone())
    }

    /// Marks the request's body as arriving until the guard is dropped.
    fn reading_body(&self) -> ReadingBody {
        if let Some(c) = self.0.connections.lock().open.get_mut(&self.0.id) {
            c.body_since = Some(Instant::now());
        }
        ReadingBody(self.0.clone())
    }

    /// Resolves when the connection was chosen to make room.
    async fn displaced(&self) {
        self.0.displace.notified().await;
    }
}

/// A request body being read (see [`Slot::reading_body`]).
struct ReadingBody(Arc<SlotInner>);

impl Drop for ReadingBody {
    fn drop(&mut self) {
        if let Some(c) = self.0.connections.lock().open.get_mut(&self.0.id) {
            c.body_since = None;
        }
    }
}

/// A request in progress on a connection (see [`Slot::in_request`]).
struct InRequest(Arc<SlotInner>);

impl Drop for InRequest {
    fn drop(&mut self) {
        if let Some(c) = self.0.connections.lock().open.get_mut(&self.0.id) {
            c.in_requests = c.in_requests.saturating_sub(1);
            if c.in_requests == 0 {
                c.idle_since = Instant::now();
            }
        }
    }
}

/// The middleware bounding one request's time, body included.
async fn request_timeout(State(limit): State<Duration>, request: Request, next: Next) -> Response {
    match tokio::time::timeout(limit, next.run(request)).await {
        Ok(response) => response,
        Err(_) => refusal(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::UNAVAILABLE,
            format!(
                "the request was not answered within {}",
                humantime::format_duration(limit)
            ),
        ),
    }
}

/// Answers a connection over the limit with a 503 and closes it, without
/// waiting: if the socket cannot take the answer at once, it is only closed.
fn refuse_connection(stream: TcpStream) {
    let body = serde_json::json!({
        "code": ErrorCode::UNAVAILABLE.as_str(),
        "message": "too many open connections; try again later",
    })
    .to_string();
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.try_write(response.as_bytes());
}

fn is_resource_error(e: &io::Error) -> bool {
    #[cfg(unix)]
    if let Some(errno) = e.raw_os_error() {
        return matches!(
            errno,
            libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM
        );
    }
    e.kind() == io::ErrorKind::OutOfMemory
}

/// Logs accept errors at most once a second, with how many it skipped.
#[derive(Default)]
struct AcceptErrors {
    last_logged: Option<Instant>,
    skipped: u64,
}

impl AcceptErrors {
    fn note(&mut self, e: &io::Error) {
        let now = Instant::now();
        if self
            .last_logged
            .is_some_and(|last| now.duration_since(last) < Duration::from_secs(1))
        {
            self.skipped += 1;
            return;
        }
        tracing::warn!(error = %e, skipped = self.skipped, "http accept error");
        self.last_logged = Some(now);
        self.skipped = 0;
    }
}

/// A connection's socket with an inactivity timeout, whose writes turn
/// hyper's automatic empty refusals into JSON ones (see the module docs).
struct Guarded {
    io: TcpStream,
    limits: Arc<HttpLimits>,
    last_activity: Instant,
    idle: Pin<Box<Sleep>>,
    /// A JSON refusal being written instead of hyper's: its bytes, how many
    /// are written, and the length of hyper's buffer it stands for.
    replacing: Option<(Vec<u8>, usize, usize)>,
}

impl Guarded {
    fn new(io: TcpStream, limits: Arc<HttpLimits>) -> Guarded {
        let now = Instant::now();
        Guarded {
            io,
            idle: Box::pin(tokio::time::sleep_until(now + limits.idle_timeout)),
            limits,
            last_activity: now,
            replacing: None,
        }
    }

    /// Pending until the connection has been silent for `idle_timeout`,
    /// then an error that ends it.
    fn poll_idle(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        loop {
            ready!(self.idle.as_mut().poll(cx));
            let deadline = self.last_activity + self.limits.idle_timeout;
            if deadline <= Instant::now() {
                return Poll::Ready(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "connection idle too long",
                ));
            }
            self.idle.as_mut().reset(deadline);
        }
    }

    /// The JSON answer standing for `head`, when `head` is one of hyper's
    /// automatic refusals.
    fn replacement(&self, head: &[u8]) -> Option<Vec<u8>> {
        // hyper's automatic answers are a short head alone; anything else
        // (every 2xx, every body) is out after this comparison.
        if head.len() > 512 || !head.starts_with(b"HTTP/1.1 4") {
            return None;
        }
        let head = std::str::from_utf8(head).ok()?;
        let rest = head.strip_prefix("HTTP/1.1 ")?;
        if !head.ends_with("\r\n\r\n")
            || !head
                .to_ascii_lowercase()
                .contains("\r\ncontent-length: 0\r\n")
        {
            return None;
        }
        let limits = &self.limits;
        let (status, message) = match rest.get(..4)? {
            "431 " => (
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                format!(
                    "the request head is too large: at most {} headers and {} bytes",
                    limits.max_headers, limits.max_header_bytes
                ),
            ),
            "400 " => (
                StatusCode::BAD_REQUEST,
                "malformed HTTP request line or header".to_string(),
            ),
            "414 " => (StatusCode::URI_TOO_LONG, "the URI is too long".to_string()),
            _ => return None,
        };
        let body = serde_json::json!({
            "code": ErrorCode::INVALID_ARGUMENT.as_str(),
            "message": message,
        })
        .to_string();
        Some(
            format!(
                "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
                 connection: close\r\n\r\n{body}",
                status.as_u16(),
                status.canonical_reason().unwrap_or(""),
                body.len()
            )
            .into_bytes(),
        )
    }

    /// Writes the pending replacement; Ready with the length of hyper's
    /// buffer once all of it is out.
    fn poll_replace(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        while let Some((bytes, written, stands_for)) = &mut self.replacing {
            if *written == bytes.len() {
                let n = *stands_for;
                self.replacing = None;
                return Poll::Ready(Ok(n));
            }
            match Pin::new(&mut self.io).poll_write(cx, &bytes[*written..]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => {
                    *written += n;
                    self.last_activity = Instant::now();
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => {
                    if let Poll::Ready(e) = self.poll_idle(cx) {
                        return Poll::Ready(Err(e));
                    }
                    return Poll::Pending;
                }
            }
        }
        Poll::Ready(Ok(0))
    }

    fn wrote(
        &mut self,
        result: Poll<io::Result<usize>>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<usize>> {
        match result {
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    self.last_activity = Instant::now();
                }
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => match self.poll_idle(cx) {
                Poll::Ready(e) => Poll::Ready(Err(e)),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

impl AsyncRead for Guarded {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    this.last_activity = Instant::now();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => match this.poll_idle(cx) {
                Poll::Ready(e) => Poll::Ready(Err(e)),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

impl AsyncWrite for Guarded {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.replacing.is_none() {
            if let Some(bytes) = this.replacement(buf) {
                this.replacing = Some((bytes, 0, buf.len()));
            }
        }
        if this.replacing.is_some() {
            return this.poll_replace(cx);
        }
        let result = Pin::new(&mut this.io).poll_write(cx, buf);
        this.wrote(result, cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let first = bufs.iter().find(|b| !b.is_empty());
        if this.replacing.is_none() {
            if let Some(bytes) = first.and_then(|b| this.replacement(b)) {
                this.replacing = Some((bytes, 0, first.map_or(0, |b| b.len())));
            }
        }
        if this.replacing.is_some() {
            return this.poll_replace(cx);
        }
        let result = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.wrote(result, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}
