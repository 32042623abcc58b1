//! The HTTP API of SPEC §5 (axum), served over anything that implements
//! [`Api`]: the embedded [`crate::Scheduler`], the distributed leader, or a
//! remote [`crate::client::Client`].
//!
//! | route | answer |
//! |---|---|
//! | `GET /v1/snapshot` | the [`Snapshot`] as JSON |
//! | `GET /` | the live dashboard ([`dashboard`]; its data: `GET /v1/dashboard`) |
//! | `POST /v1/tasks` | a [`SubmitRequest`] → [`SubmitResponse`] `{"id": n}`; a `traceparent` header is the task's W3C trace context |
//! | `GET /v1/tasks?limit=N` | the newest N (default 50, at most 500) tasks, live or recently finished: [`crate::wire::TaskList`] `{"tasks": […]}`, highest id first, without outputs |
//! | `GET /v1/tasks/{id}` | the [`TaskStatus`] as JSON |
//! | `POST /v1/tasks/{id}/cancel` | `{"id": n}` |
//! | `/v1/schedules…` | schedules: list, create, get, delete, pause, resume, trigger, backfill ([`schedules`]) |
//! | `GET /v1/autoscale?pool=P&labels=k=v,…` | the fleet's [`AutoscaleAnswer`] (see [`autoscale`]) |
//! | `GET /metrics` | Prometheus text format: the snapshot's gauges ([`metrics_text`]), then the counters and histograms of [`Api::metrics`] ([`counters_text`]) |
//! | `GET /healthz` | [`Health`] JSON; 200 when live, else 503 |
//! | `GET /readyz` | [`Health`] JSON; 200 when ready, else 503 |
//!
//! Every error is JSON `{"code": "…", "message": "…"}` with the status of
//! [`status_of`]; the mapping lives in one place, the [`IntoResponse`] of
//! [`HttpError`], and covers axum's own rejections (malformed JSON, a bad
//! id in the path), unknown routes and wrong methods (`NOT_FOUND`).
//! `FAILED_PRECONDITION` is 409 Conflict (e.g. cancelling a finished task),
//! not 412: no request here carries HTTP preconditions (`If-Match`).
//! A 503 of `/healthz` or `/readyz` carries both shapes: the [`Health`]
//! fields and `code`/`message`.
//!
//! A message never echoes a long value back: one over
//! [`MAX_MESSAGE_CHARS`] characters is cut (see [`HttpError`]). A body over
//! the router's limit (axum's 2 MB) is 413 `INVALID_ARGUMENT`. [`serve`]
//! serves the router with timeouts and connection and header limits
//! ([`HttpLimits`]); its refusals are JSON too.
//!
//! **Credentials** ([`router_with_auth`], what `cronoq server` serves when
//! its config says `[auth] required = true`): every `/v1/*` call is made
//! through NATS as the caller, so the leader alone decides (the same rules
//! as for any NATS client; this layer re-implements none). The caller is
//! `Authorization: Bearer <token>`, a cronoq token credential; no header
//! calls anonymously, which the leader answers `UNAUTHENTICATED` (401); a
//! malformed header is 401 at once, calling nothing. A role or pool the
//! credential lacks is `PERMISSION_DENIED` (403). `GET /`, the dashboard's
//! assets, `/healthz`, `/readyz` and `/metrics` stay open (they say how
//! busy the installation is, not what its tasks carry); the dashboard page
//! asks for a token and sends it as Bearer. A 401 carries
//! `WWW-Authenticate: Bearer`.
//!
//! **A submission to a `cronoq server` is answered with the leader's
//! verdict**, with or without credentials (the server's [`Api`] waits for
//! it: [`crate::client::Client::submit`] with a credential, the server's
//! own `submit` without). It goes through the submit stream, which the
//! leader reads later: what can be checked before publishing is (the
//! payload against the server's limit in force: `INVALID_ARGUMENT`,
//! nothing published), then the task is looked up until the leader has
//! taken it, and its refusal is the answer with its code and status
//! (`PERMISSION_DENIED` 403, `RESOURCE_EXHAUSTED` 429 for the
//! `max_pools`-th-plus-one pool, …). Only a submission no leader takes
//! within [`crate::client::CONFIRM_FOR`] (no leader at the moment) is
//! answered 200 with its id unconfirmed: it is durable in the stream, and
//! a later refusal shows in its status.
//!
//! **Where requests come from** ([`origin`]): a `POST` with a body or a
//! `Content-Type` must say `Content-Type: application/json` (else 415
//! `INVALID_ARGUMENT`), so a web page cannot post to the API through a
//! browser without a CORS preflight, and no `Access-Control-*` header is
//! ever sent, so a preflight fails. [`serve`] also refuses a `Host` that is
//! not an IP address, `localhost` or a name of [`AllowedHosts`] (DNS
//! rebinding), and a `POST` whose `Origin` is another site (403
//! `PERMISSION_DENIED`). These apply whatever the auth mode (details and
//! the one exception in [`origin`]'s docs). This module knows JSON and
//! HTTP only; the wire (MessagePack) is [`crate::wire`]'s.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::SystemTime;

use axum::extract::{FromRequest, FromRequestParts, Path, Request, State};
use axum::http::request::Parts;
use axum::http::{header, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use serde::de::DeserializeOwned;

use crate::api::{Api, ApiError, Health};
use crate::auth::Credential;
use crate::core::{AutoscaleAnswer, ErrorCode, Labels, PoolName, Rejection, Snapshot, TaskId};
use crate::task::TaskStatus;
use crate::wire::WireError;

pub mod dashboard;
pub mod origin;
pub mod schedules;
mod serve;

pub use crate::api::{BackoffRequest, SubmitRequest, SubmitResponse};
pub use origin::AllowedHosts;
pub use serve::{serve, HttpLimits};

/// The HTTP API over `api`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use std::sync::Arc;
/// let app = cronoq::http::router(Arc::new(cronoq::Scheduler::new()));
/// # let _ = app;
/// // Serve it with `cronoq::http::serve` (timeouts, connection limit).
/// # }
/// ```
pub fn router(api: Arc<dyn Api>) -> Router {
    router_with_auth(api, None)
}

/// The HTTP API over `api`; with `auth`, every `/v1/*` call goes to the
/// [`Api`] that `auth` gives for the caller's credential instead (see the
/// module docs). `api` still answers `/healthz`, `/readyz` and `/metrics`.
///
/// ```no_run
/// # async fn f(remote: cronoq::client::Client) {
/// use std::sync::Arc;
/// let app = cronoq::http::router_with_auth(
///     Arc::new(cronoq::Scheduler::new()),
///     Some(cronoq::http::HttpAuth::through(remote)),
/// );
/// # let _ = app;
/// # }
/// ```
pub fn router_with_auth(api: Arc<dyn Api>, auth: Option<HttpAuth>) -> Router {
    let router = Router::new()
        .route("/v1/snapshot", get(snapshot))
        .route("/v1/tasks", post(submit).get(list_tasks))
        .route("/v1/tasks/{id}", get(task))
        .route("/v1/tasks/{id}/cancel", post(cancel))
        .route("/v1/autoscale", get(autoscale))
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .merge(dashboard::routes())
        .merge(schedules::routes())
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method);
    let router = match auth {
        Some(auth) => router.layer(axum::middleware::from_fn_with_state(auth, authenticate)),
        None => router,
    };
    router
        .layer(axum::middleware::from_fn(origin::require_json))
        .layer(axum::middleware::from_fn(catch_panics))
        .with_state(api)
}

/// The [`Api`] a `/v1/*` call of a caller goes to, by its credential
/// (`None`: no `Authorization` header).
pub type ApiFor = dyn Fn(Option<Credential>) -> Arc<dyn Api> + Send + Sync;

/// How [`router_with_auth`] calls as the caller: usually
/// [`HttpAuth::through`] a NATS [`crate::client::Client`], whose requests
/// then carry the caller's proof to the leader.
#[derive(Clone)]
pub struct HttpAuth {
    api_for: Arc<ApiFor>,
}

impl std::fmt::Debug for HttpAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HttpAuth")
    }
}

impl HttpAuth {
    /// Calls through `client` acting as each caller's credential. A caller
    /// without one is asked of the leader too (which refuses it), except a
    /// submission: the stream would take it and the leader refuse it only
    /// later, so it is refused here at once (`UNAUTHENTICATED`), publishing
    /// nothing.
    pub fn through(client: crate::client::Client) -> HttpAuth {
        HttpAuth::with(move |credential| match credential {
            Some(c) => Arc::new(client.with_credential(c)) as Arc<dyn Api>,
            None => Arc::new(Anonymous(client.with_credential(None))),
        })
    }

    /// Calls the [`Api`] that `api_for` gives for the caller's credential.
    pub fn with(
        api_for: impl Fn(Option<Credential>) -> Arc<dyn Api> + Send + Sync + 'static,
    ) -> HttpAuth {
        HttpAuth {
            api_for: Arc::new(api_for),
        }
    }
}

/// A caller without a credential, on a server that requires one: its
/// requests go to the leader (which answers `UNAUTHENTICATED`); its
/// submissions are refused without publishing.
struct Anonymous(crate::client::Client);

impl Api for Anonymous {
    fn submit(&self, _task: crate::task::Task) -> crate::api::ApiFuture<'_, TaskId> {
        Box::pin(async {
            Err(WireError::new(
                ErrorCode::UNAUTHENTICATED,
                "credentials required: send `Authorization: Bearer <token>`",
            ))
        })
    }
    fn task(&self, id: TaskId) -> crate::api::ApiFuture<'_, TaskStatus> {
        Api::task(&self.0, id)
    }
    fn cancel(&self, id: TaskId) -> crate::api::ApiFuture<'_, ()> {
        Api::cancel(&self.0, id)
    }
    fn snapshot(&self) -> crate::api::ApiFuture<'_, Snapshot> {
        Api::snapshot(&self.0)
    }
    fn recent_tasks(&self, limit: usize) -> crate::api::ApiFuture<'_, Vec<TaskStatus>> {
        Api::recent_tasks(&self.0, limit)
    }
    fn health(&self) -> Health {
        Api::health(&self.0)
    }
    // Schedule calls are requests the leader answers (nothing is
    // published first), so it refuses an anonymous one itself.
    fn create_schedule(
        &self,
        spec: crate::api::CreateScheduleRequest,
    ) -> crate::api::ApiFuture<'_, crate::api::ScheduleInfo> {
        Api::create_schedule(&self.0, spec)
    }
    fn list_schedules(&self) -> crate::api::ApiFuture<'_, Vec<crate::api::ScheduleEntry>> {
        Api::list_schedules(&self.0)
    }
    fn get_schedule(&self, name: String) -> crate::api::ApiFuture<'_, crate::api::ScheduleInfo> {
        Api::get_schedule(&self.0, name)
    }
    fn pause_schedule(&self, name: String) -> crate::api::ApiFuture<'_, crate::api::ScheduleInfo> {
        Api::pause_schedule(&self.0, name)
    }
    fn resume_schedule(&self, name: String) -> crate::api::ApiFuture<'_, crate::api::ScheduleInfo> {
        Api::resume_schedule(&self.0, name)
    }
    fn delete_schedule(&self, name: String) -> crate::api::ApiFuture<'_, ()> {
        Api::delete_schedule(&self.0, name)
    }
    fn trigger_schedule(&self, name: String) -> crate::api::ApiFuture<'_, crate::api::FireRecord> {
        Api::trigger_schedule(&self.0, name)
    }
    fn backfill_schedule(
        &self,
        name: String,
        range: crate::api::BackfillRange,
    ) -> crate::api::ApiFuture<'_, crate::api::BackfillReport> {
        Api::backfill_schedule(&self.0, name, range)
    }
}

/// The [`Api`] one request calls: the caller's, put there by
/// [`authenticate`], else the router's.
#[derive(Clone)]
struct CallerApi(Arc<dyn Api>);

/// The [`Api`] to call for this request: as the caller when the router
/// checks credentials, else the router's own. Every `/v1/*` handler
/// takes its `Api` through this, never through `State`.
pub(crate) struct Caller(pub(crate) Arc<dyn Api>);

impl FromRequestParts<Arc<dyn Api>> for Caller {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<dyn Api>,
    ) -> Result<Self, Self::Rejection> {
        Ok(Caller(match parts.extensions.get::<CallerApi>() {
            Some(CallerApi(api)) => api.clone(),
            None => state.clone(),
        }))
    }
}

/// The token of an `Authorization: Bearer <token>` header; `None` without
/// the header; `UNAUTHENTICATED` when it is there but not one Bearer
/// token (another scheme, two headers, no token, a space in it). The
/// message never quotes the header.
///
/// ```
/// use axum::http::{header::AUTHORIZATION, HeaderMap};
/// let mut h = HeaderMap::new();
/// assert_eq!(cronoq::http::bearer_token(&h).unwrap(), None);
/// h.insert(AUTHORIZATION, "Bearer s3cret-token".parse().unwrap());
/// assert_eq!(cronoq::http::bearer_token(&h).unwrap(), Some("s3cret-token"));
/// h.insert(AUTHORIZATION, "Basic dXNlcjpwYXNz".parse().unwrap());
/// assert_eq!(cronoq::http::bearer_token(&h).unwrap_err().code.as_str(), "UNAUTHENTICATED");
/// ```
pub fn bearer_token(headers: &axum::http::HeaderMap) -> Result<Option<&str>, WireError> {
    let malformed = |why: &str| {
        WireError::new(
            ErrorCode::UNAUTHENTICATED,
            format!("malformed Authorization header: {why}; send `Authorization: Bearer <token>`"),
        )
    };
    let mut values = headers.get_all(header::AUTHORIZATION).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(malformed("more than one"));
    }
    let text = value
        .to_str()
        .map_err(|_| malformed("it is not visible ASCII"))?;
    let (scheme, token) = text
        .trim()
        .split_once(' ')
        .ok_or_else(|| malformed("no token"))?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(malformed("only the Bearer scheme is accepted"));
    }
    let token = token.trim_start_matches(' ');
    if token.is_empty() {
        return Err(malformed("no token"));
    }
    if token.chars().any(|c| !c.is_ascii_graphic()) {
        return Err(malformed("the token has a space or control character"));
    }
    Ok(Some(token))
}

/// With credentials checked: a `/v1/*` request calls the [`Api`] of its
/// Bearer token (or of no credential); a malformed `Authorization` is 401
/// and calls nothing. Other paths pass as they are.
async fn authenticate(
    State(auth): State<HttpAuth>,
    mut request: Request,
    next: axum::middleware::Next,
) -> Response {
    if request.uri().path().starts_with("/v1/") {
        let credential = match bearer_token(request.headers()) {
            Ok(token) => token.map(Credential::token),
            Err(e) => return HttpError(e).into_response(),
        };
        let api = (auth.api_for)(credential);
        request.extensions_mut().insert(CallerApi(api));
    }
    next.run(request).await
}

/// A handler that panics (a bug: every input is checked) answers a JSON
/// `INTERNAL` error instead of dropping the connection, and the server
/// goes on.
async fn catch_panics(request: Request, next: axum::middleware::Next) -> Response {
    use futures_util::FutureExt as _;
    let (method, uri) = (request.method().clone(), request.uri().path().to_string());
    match std::panic::AssertUnwindSafe(next.run(request))
        .catch_unwind()
        .await
    {
        Ok(response) => response,
        Err(panic) => {
            let why = crate::task::panic_message(&*panic);
            tracing::error!(%method, path = %uri, panic = %why, "a request handler panicked");
            HttpError(WireError::new(ErrorCode::INTERNAL, why)).into_response()
        }
    }
}

/// The HTTP status of a stable code; an unknown code is 500.
///
/// ```
/// use cronoq::core::ErrorCode;
/// use cronoq::http::status_of;
/// assert_eq!(status_of(&ErrorCode::NOT_FOUND).as_u16(), 404);
/// assert_eq!(status_of(&ErrorCode::FAILED_PRECONDITION).as_u16(), 409);
/// assert_eq!(status_of(&ErrorCode("NEWER_CODE".into())).as_u16(), 500);
/// ```
pub fn status_of(code: &ErrorCode) -> StatusCode {
    match code.as_str() {
        "INVALID_ARGUMENT" => StatusCode::BAD_REQUEST,
        "UNAUTHENTICATED" => StatusCode::UNAUTHORIZED,
        "PERMISSION_DENIED" => StatusCode::FORBIDDEN,
        "NOT_FOUND" => StatusCode::NOT_FOUND,
        "ALREADY_EXISTS" | "FAILED_PRECONDITION" => StatusCode::CONFLICT,
        "RESOURCE_EXHAUSTED" => StatusCode::TOO_MANY_REQUESTS,
        "UNAVAILABLE" => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// An error answered over HTTP: the one place where a code becomes a status.
#[derive(Debug)]
pub struct HttpError(pub ApiError);

impl HttpError {
    fn invalid(message: impl Into<String>) -> HttpError {
        HttpError(WireError::new(ErrorCode::INVALID_ARGUMENT, message))
    }
}

impl From<ApiError> for HttpError {
    fn from(e: ApiError) -> HttpError {
        HttpError(e)
    }
}

impl From<Rejection> for HttpError {
    fn from(r: Rejection) -> HttpError {
        HttpError(r.into())
    }
}

/// The longest message an HTTP error carries, in characters. Messages quote
/// the offending value (`deadline "…": …`); a value of a megabyte must not
/// come back whole.
pub const MAX_MESSAGE_CHARS: usize = 200;

/// `message`, cut to [`MAX_MESSAGE_CHARS`] characters with a note of how
/// long it was.
///
/// ```
/// let long = format!("deadline {:?}: bad", "x".repeat(100_000));
/// let short = cronoq::http::clamp_message(&long);
/// assert!(short.len() < 300 && short.starts_with("deadline \"xxx"));
/// assert_eq!(cronoq::http::clamp_message("short"), "short");
/// ```
pub fn clamp_message(message: &str) -> std::borrow::Cow<'_, str> {
    match message.char_indices().nth(MAX_MESSAGE_CHARS) {
        None => message.into(),
        Some((cut, _)) => format!(
            "{}… (message cut, {} bytes in all)",
            &message[..cut],
            message.len()
        )
        .into(),
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let status = status_of(&self.0.code);
        let body = if status == StatusCode::INTERNAL_SERVER_ERROR {
            // Internal detail goes to the log, not to the caller.
            tracing::error!(code = %self.0.code, error = %clamp_message(&self.0.message), "request failed");
            WireError::new(self.0.code, "internal error; the server log has the detail")
        } else {
            let message = clamp_message(&self.0.message).into_owned();
            tracing::debug!(code = %self.0.code, error = %message, "request refused");
            WireError::new(self.0.code, message)
        };
        let mut response = (status, Json(body)).into_response();
        if status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer realm=\"cronoq\""),
            );
        }
        response
    }
}

/// A JSON object body (its `Content-Type`, `application/json`, is checked
/// by [`origin::require_json`] before); refusals are `INVALID_ARGUMENT`.
struct JsonBody<T>(T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for JsonBody<T> {
    type Rejection = Response;

    async fn from_request(req: Request, state: &S) -> Result<Self, Response> {
        let body = match Bytes::from_request(req, state).await {
            Ok(body) => body,
            Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                // 413 rather than `status_of`'s 400: the status says which
                // limit it was; the code is the payload limit's.
                return Err(serve::refusal(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    ErrorCode::INVALID_ARGUMENT,
                    format!("reading the body: {}", e.body_text()),
                ));
            }
            Err(e) => {
                return Err(
                    HttpError::invalid(format!("reading the body: {}", e.body_text()))
                        .into_response(),
                )
            }
        };
        // A struct would also accept a JSON array of its fields in order.
        if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
            return Err(HttpError::invalid("the body must be a JSON object").into_response());
        }
        serde_json::from_slice(&body)
            .map(JsonBody)
            .map_err(|e| HttpError::invalid(format!("malformed JSON body: {e}")).into_response())
    }
}

/// The `{id}` of a path, as a [`TaskId`].
struct IdPath(TaskId);

impl<S: Send + Sync> FromRequestParts<S> for IdPath {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, HttpError> {
        let Path(text) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|e| HttpError::invalid(e.body_text()))?;
        Ok(IdPath(text.parse()?))
    }
}

type ApiState = State<Arc<dyn Api>>;

async fn snapshot(Caller(api): Caller) -> Result<Json<Snapshot>, HttpError> {
    Ok(Json(api.snapshot().await?))
}

async fn submit(
    Caller(api): Caller,
    headers: axum::http::HeaderMap,
    JsonBody(req): JsonBody<SubmitRequest>,
) -> Result<Json<SubmitResponse>, HttpError> {
    let mut task = req.into_task(SystemTime::now())?;
    if let Some(tp) = traceparent_header(&headers)? {
        crate::task::check_traceparent(tp)?;
        task = task.traceparent(tp);
    }
    let id = api.submit(task).await?;
    Ok(Json(SubmitResponse { id }))
}

/// The request's `traceparent` header: at most one, visible ASCII.
fn traceparent_header(headers: &axum::http::HeaderMap) -> Result<Option<&str>, HttpError> {
    let mut values = headers.get_all(crate::wire::TRACEPARENT).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(HttpError::invalid("more than one traceparent header"));
    }
    value
        .to_str()
        .map(Some)
        .map_err(|_| HttpError::invalid("the traceparent header is not visible ASCII"))
}

/// `GET /v1/tasks?limit=N`: the newest tasks (default 50).
async fn list_tasks(
    Caller(api): Caller,
    query: Result<
        axum::extract::Query<Vec<(String, String)>>,
        axum::extract::rejection::QueryRejection,
    >,
) -> Result<Json<crate::wire::TaskList>, HttpError> {
    let axum::extract::Query(pairs) = query.map_err(|e| HttpError::invalid(e.body_text()))?;
    let mut limit = DEFAULT_TASK_LIST;
    for (i, (key, value)) in pairs.iter().enumerate() {
        if key != "limit" || i > 0 {
            return Err(HttpError::invalid(format!(
                "the only query parameter is one limit, not {:?}",
                clamp_message(key)
            )));
        }
        limit = value.parse().map_err(|_| {
            HttpError::invalid(format!(
                "limit must be an integer, not {:?}",
                clamp_message(value)
            ))
        })?;
    }
    crate::api::check_recent_limit(limit)?;
    Ok(Json(crate::wire::TaskList {
        tasks: api.recent_tasks(limit).await?,
    }))
}

/// Tasks `GET /v1/tasks` lists without `?limit=`.
pub const DEFAULT_TASK_LIST: usize = 50;

async fn task(Caller(api): Caller, IdPath(id): IdPath) -> Result<Json<TaskStatus>, HttpError> {
    Ok(Json(api.task(id).await?))
}

async fn cancel(
    Caller(api): Caller,
    IdPath(id): IdPath,
) -> Result<Json<SubmitResponse>, HttpError> {
    api.cancel(id).await?;
    Ok(Json(SubmitResponse { id }))
}

/// The query of `GET /v1/autoscale`: `pool` (default `default`) and
/// `labels` (`k=v,k=v`, URL-encoded or not; empty or absent: the
/// unlabeled fleet). Any other parameter, a parameter given twice, a
/// malformed pool name or label set is `INVALID_ARGUMENT`.
///
/// ```
/// use cronoq::core::Labels;
/// let (pool, labels) = cronoq::http::autoscale_query(Some("pool=inference&labels=gpu=a100,zone=eu")).unwrap();
/// assert_eq!((pool.as_str(), labels), ("inference", Labels::from([("gpu", "a100"), ("zone", "eu")])));
/// assert!(cronoq::http::autoscale_query(Some("pool=inference&label=gpu=a100")).is_err());
/// assert!(cronoq::http::autoscale_query(Some("labels=gpu")).is_err());
/// ```
pub fn autoscale_query(query: Option<&str>) -> Result<(PoolName, Labels), Rejection> {
    let invalid = |m: String| Rejection::InvalidArgument(format!("autoscale query: {m}"));
    let uri: Uri = format!("/?{}", query.unwrap_or(""))
        .parse()
        .map_err(|e| invalid(format!("{e}")))?;
    let axum::extract::Query(pairs) =
        axum::extract::Query::<Vec<(String, String)>>::try_from_uri(&uri)
            .map_err(|e| invalid(e.body_text()))?;
    let (mut pool, mut labels): (Option<String>, Option<String>) = (None, None);
    for (key, value) in pairs {
        let slot = match key.as_str() {
            "pool" => &mut pool,
            "labels" => &mut labels,
            other => {
                return Err(invalid(format!(
                    "unknown parameter {} (expected pool and labels)",
                    crate::core::excerpt(other)
                )))
            }
        };
        if slot.replace(value).is_some() {
            return Err(invalid(format!("{key} is given twice")));
        }
    }
    let pool = PoolName::new(pool.as_deref().unwrap_or(PoolName::DEFAULT))
        .map_err(|e| invalid(e.to_string()))?;
    // Any malformed label set is INVALID_ARGUMENT here, too many labels
    // included: no fleet can have them, the query is wrong.
    let labels = Labels::parse(labels.as_deref().unwrap_or(""))
        .map_err(|e| invalid(format!("labels: {e}")))?;
    Ok((pool, labels))
}

/// `GET /v1/autoscale?pool=P&labels=k=v,…`: the autoscaling figures of one
/// fleet ([`crate::core::answer`]), for KEDA's `metrics-api` scaler
/// (`valueLocation: desired`). Always 200 for a well-formed query: an
/// idle fleet, a fleet with no worker yet, an unknown pool or an
/// undeclared label set answer (`declared: false` for the last two,
/// desired 0).
async fn autoscale(Caller(api): Caller, uri: Uri) -> Result<Json<AutoscaleAnswer>, HttpError> {
    let (pool, labels) = autoscale_query(uri.query())?;
    let snapshot = api.snapshot().await?;
    Ok(Json(crate::core::answer(&snapshot, &pool, &labels)))
}

async fn metrics(State(api): ApiState) -> Result<Response, HttpError> {
    // A follower asks the leader for the snapshot; with `[auth] required`
    // it has no credential of its own to ask with, and exports its health
    // alone (the leader exports the pools). Unready with no leader to ask:
    // its health alone too, so `cronoq_unready` says why.
    let snapshot = match api.snapshot().await {
        Ok(snapshot) => snapshot,
        Err(e)
            if e.code == ErrorCode::UNAUTHENTICATED
                || e.code == ErrorCode::PERMISSION_DENIED
                || (e.code == ErrorCode::UNAVAILABLE && !api.health().ready) =>
        {
            Snapshot::default()
        }
        Err(e) => return Err(e.into()),
    };
    let mut text = metrics_text(&snapshot, &api.health());
    // A remote client's Api has no counters: the gauges alone then.
    if let Ok(counted) = api.metrics().await {
        text.push_str(&counters_text(&counted));
    }
    Ok((
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response())
}

fn health_response(ok: bool, health: Health) -> Response {
    if ok {
        return Json(health).into_response();
    }
    let mut body = serde_json::to_value(&health).unwrap_or_default();
    if let Some(map) = body.as_object_mut() {
        map.insert("code".into(), ErrorCode::UNAVAILABLE.as_str().into());
        map.insert("message".into(), health.detail.clone().into());
    }
    (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
}

async fn healthz(State(api): ApiState) -> Response {
    let health = api.health();
    health_response(health.live, health)
}

async fn readyz(State(api): ApiState) -> Response {
    let health = api.health();
    health_response(health.live && health.ready, health)
}

async fn no_route(method: Method, uri: Uri) -> HttpError {
    HttpError(WireError::new(
        ErrorCode::NOT_FOUND,
        format!("no route {method} {}", uri.path()),
    ))
}

async fn wrong_method(method: Method, uri: Uri) -> HttpError {
    HttpError(WireError::new(
        ErrorCode::NOT_FOUND,
        format!(
            "no route {method} {} (the path takes other methods)",
            uri.path()
        ),
    ))
}

/// Escapes a Prometheus label value: `\`, `"` and newlines.
///
/// ```
/// assert_eq!(cronoq::http::escape_label_value("a\"b\\c\nd"), r#"a\"b\\c\nd"#);
/// ```
pub fn escape_label_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// One metric family: `# HELP`, `# TYPE`, then its samples.
struct Family<'a> {
    out: &'a mut String,
}

impl Family<'_> {
    fn start<'a>(out: &'a mut String, name: &str, kind: &str, help: &str) -> Family<'a> {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        Family { out }
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: u64) {
        self.sample_text(name, labels, &value.to_string());
    }

    fn sample_text(&mut self, name: &str, labels: &[(&str, &str)], value: &str) {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape_label_value(v));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
    }
}

/// The Prometheus text exposition of a snapshot: per-pool gauges (label
/// `pool`), per-group and per-demand gauges (labels `pool` and `labels`,
/// the label set as `k=v,k=v`, empty for the unlabeled group), readiness
/// and the leader's epoch.
///
/// ```
/// use cronoq::core::*;
/// let mut core = Core::new();
/// let pool = PoolName::new("p").unwrap();
/// core.handle(Millis(0), Event::CapacitySet { pool, labels: Labels::from([("gpu", "a100")]), slots: 2 }).unwrap();
/// let health = cronoq::api::Health { live: true, ready: true, detail: String::new() };
/// let text = cronoq::http::metrics_text(&core.snapshot(), &health);
/// assert!(text.contains(r#"cronoq_group_capacity{pool="p",labels="gpu=a100"} 2"#));
/// ```
pub fn metrics_text(snapshot: &Snapshot, health: &Health) -> String {
    let mut out = String::new();
    Family::start(
        &mut out,
        "cronoq_ready",
        "gauge",
        "1 when the server is ready (connected, and leading or following a known leader).",
    )
    .sample("cronoq_ready", &[], u64::from(health.ready));
    if !health.ready {
        Family::start(
            &mut out,
            "cronoq_unready",
            "gauge",
            "1 while the server is not ready, with the reason /readyz gives.",
        )
        .sample("cronoq_unready", &[("reason", &health.detail)], 1);
    }
    if let Some(leader) = &snapshot.leader {
        Family::start(
            &mut out,
            "cronoq_leader_epoch",
            "gauge",
            "The current leadership epoch.",
        )
        .sample(
            "cronoq_leader_epoch",
            &[("leader", &leader.id)],
            leader.epoch,
        );
    }

    type PoolValue = fn(&crate::core::PoolSnapshot) -> u64;
    let pool_gauges: [(&str, &str, &str, PoolValue); 9] = [
        ("cronoq_pool_capacity", "gauge", "Slots in the pool.", |p| {
            p.capacity
        }),
        (
            "cronoq_pool_busy",
            "gauge",
            "Slots running attempts.",
            |p| p.busy,
        ),
        (
            "cronoq_pool_waiting",
            "gauge",
            "Tasks waiting for a slot.",
            |p| p.waiting,
        ),
        (
            "cronoq_pool_scheduled",
            "gauge",
            "Fixed-start tasks whose start is in the future.",
            |p| p.scheduled,
        ),
        (
            "cronoq_pool_reserved",
            "gauge",
            "Slots held back for due reservations.",
            |p| p.reserved,
        ),
        (
            "cronoq_pool_desired",
            "gauge",
            "Slots the pool should have (the autoscaling signal).",
            |p| p.autoscale.desired,
        ),
        (
            "cronoq_pool_autoscale_min",
            "gauge",
            "Configured lower bound of the autoscaling signal.",
            |p| p.autoscale.min,
        ),
        (
            "cronoq_pool_autoscale_max",
            "gauge",
            "Configured upper bound of the autoscaling signal.",
            |p| p.autoscale.max,
        ),
        (
            "cronoq_pool_deadline_missed_total",
            "counter",
            "Tasks that finished after their deadline, since the scheduler started.",
            |p| p.deadline_missed,
        ),
    ];
    for (name, kind, help, value) in pool_gauges {
        let mut family = Family::start(&mut out, name, kind, help);
        for p in &snapshot.pools {
            family.sample(name, &[("pool", p.name.as_str())], value(p));
        }
    }

    let mut family = Family::start(
        &mut out,
        "cronoq_pool_workers",
        "gauge",
        "Remote workers registered in the pool.",
    );
    let mut per_pool: std::collections::HashMap<&str, u64> = std::collections::HashMap::new();
    for w in &snapshot.workers {
        *per_pool.entry(w.pool.as_str()).or_default() += 1;
    }
    for p in &snapshot.pools {
        let n = per_pool.get(p.name.as_str()).copied().unwrap_or(0);
        family.sample("cronoq_pool_workers", &[("pool", p.name.as_str())], n);
    }
    // Series per label set are bounded (the first MAX_LABEL_SET_SERIES of
    // each family, pools by name), so a flood of label sets cannot make a
    // scrape huge; what was left out is counted.
    let mut dropped = 0u64;

    let mut family = Family::start(
        &mut out,
        "cronoq_demand_waiting",
        "gauge",
        "Tasks waiting with exactly these required labels.",
    );
    let demand = snapshot
        .pools
        .iter()
        .flat_map(|p| p.demand.iter().map(move |d| (p, d)));
    for (n, (p, d)) in demand.enumerate() {
        if n >= MAX_LABEL_SET_SERIES {
            dropped += 1;
            continue;
        }
        {
            let labels = d.labels.to_string();
            family.sample(
                "cronoq_demand_waiting",
                &[("pool", p.name.as_str()), ("labels", &labels)],
                d.waiting,
            );
        }
    }

    type GroupValue = fn(&crate::core::GroupSnapshot) -> u32;
    let group_gauges: [(&str, &str, GroupValue); 3] = [
        ("cronoq_group_capacity", "Slots in the group.", |g| {
            g.capacity
        }),
        (
            "cronoq_group_busy",
            "Slots of the group running attempts.",
            |g| g.busy,
        ),
        (
            "cronoq_group_workers",
            "Remote workers in the group.",
            |g| g.workers,
        ),
    ];
    for (i, (name, help, value)) in group_gauges.into_iter().enumerate() {
        let mut family = Family::start(&mut out, name, "gauge", help);
        let groups = snapshot
            .pools
            .iter()
            .flat_map(|p| p.groups.iter().map(move |g| (p, g)));
        for (n, (p, g)) in groups.enumerate() {
            if n >= MAX_LABEL_SET_SERIES {
                dropped += u64::from(i == 0);
                continue;
            }
            let labels = g.labels.to_string();
            family.sample(
                name,
                &[("pool", p.name.as_str()), ("labels", &labels)],
                u64::from(value(g)),
            );
        }
    }
    // Fleets are declared in the configuration, so their series are
    // bounded by it (at most MAX_FLEETS per pool).
    type FleetValue = fn(&crate::core::FleetAutoscale) -> u64;
    let fleet_gauges: [(&str, &str, FleetValue); 3] = [
        (
            "cronoq_autoscale_desired",
            "Workers a declared fleet should have: ceil((busy + waiting + reserved) / slots_per_worker) within its min and max.",
            |f| f.desired,
        ),
        (
            "cronoq_autoscale_waiting",
            "Waiting tasks that count toward a declared fleet (each task toward one fleet).",
            |f| f.waiting,
        ),
        (
            "cronoq_autoscale_reserved",
            "Due fixed-start reservations that count toward a declared fleet.",
            |f| f.reserved,
        ),
    ];
    for (name, help, value) in fleet_gauges {
        let mut family = Family::start(&mut out, name, "gauge", help);
        for p in &snapshot.pools {
            for f in &p.fleets {
                let labels = f.labels.to_string();
                family.sample(
                    name,
                    &[("pool", p.name.as_str()), ("labels", &labels)],
                    value(f),
                );
            }
        }
    }
    let mut family = Family::start(
        &mut out,
        "cronoq_autoscale_waiting_without_fleet",
        "gauge",
        "Waiting tasks and due reservations of a pool that declares fleets but whose labels no fleet covers.",
    );
    for p in snapshot.pools.iter().filter(|p| !p.fleets.is_empty()) {
        family.sample(
            "cronoq_autoscale_waiting_without_fleet",
            &[("pool", p.name.as_str())],
            p.waiting_without_fleet,
        );
    }

    let mut family = Family::start(
        &mut out,
        "cronoq_metrics_label_sets_dropped",
        "gauge",
        "Label sets (demand rows and groups) left out of this scrape to bound its size.",
    );
    family.sample("cronoq_metrics_label_sets_dropped", &[], dropped);
    out
}

/// The bucket bounds as `le` labels: seconds, shortest form.
fn le_labels() -> Vec<String> {
    crate::metrics::BUCKETS_MS
        .iter()
        .map(|ms| format!("{}", *ms as f64 / 1000.0))
        .chain(std::iter::once("+Inf".to_string()))
        .collect()
}

/// The Prometheus text of the ledger's counters and histograms (label
/// `pool`, and `outcome` for finished tasks) and a server's election and
/// journal figures. Pools are bounded by [`crate::metrics::MAX_METRIC_POOLS`]
/// (the rest under `pool="_other"`).
///
/// ```
/// let mut p = cronoq::metrics::PoolMetrics::new("p");
/// p.succeeded = 3;
/// p.run.observe(cronoq::core::Millis(50));
/// let m = cronoq::metrics::MetricsSnapshot { pools: vec![p], server: None, schedules: None };
/// let text = cronoq::http::counters_text(&m);
/// assert!(text.contains(r#"cronoq_tasks_finished_total{pool="p",outcome="succeeded"} 3"#));
/// assert!(text.contains(r#"cronoq_run_seconds_bucket{pool="p",le="0.05"} 1"#));
/// assert!(text.contains(r#"cronoq_run_seconds_sum{pool="p"} 0.05"#));
/// ```
pub fn counters_text(m: &crate::metrics::MetricsSnapshot) -> String {
    use crate::metrics::{Histogram, PoolMetrics};
    let mut out = String::new();
    type Count = fn(&PoolMetrics) -> u64;
    let counters: [(&str, &str, Count); 5] = [
        (
            "cronoq_tasks_submitted_total",
            "Tasks submitted (accepted, or refused and dead-lettered).",
            |p| p.submitted,
        ),
        (
            "cronoq_attempts_started_total",
            "Attempts started, first attempts and retries.",
            |p| p.started,
        ),
        (
            "cronoq_attempts_retried_total",
            "Attempts started after an earlier attempt of the same task.",
            |p| p.retried,
        ),
        (
            "cronoq_attempts_lost_total",
            "Attempts lost: worker gone, lease expired, or stopped for the attempt timeout.",
            |p| p.lost,
        ),
        (
            "cronoq_tasks_dead_lettered_total",
            "Submissions refused (malformed, over a limit) and copied to the dead-letter stream.",
            |p| p.dead_lettered,
        ),
    ];
    for (name, help, value) in counters {
        let mut family = Family::start(&mut out, name, "counter", help);
        for p in &m.pools {
            family.sample(name, &[("pool", &p.pool)], value(p));
        }
    }
    let name = "cronoq_tasks_finished_total";
    let mut family = Family::start(
        &mut out,
        name,
        "counter",
        "Tasks finished, by outcome (succeeded, failed, cancelled, missed).",
    );
    for p in &m.pools {
        for (outcome, n) in [
            ("succeeded", p.succeeded),
            ("failed", p.failed),
            ("cancelled", p.cancelled),
            ("missed", p.missed),
        ] {
            family.sample(name, &[("pool", &p.pool), ("outcome", outcome)], n);
        }
    }
    let les = le_labels();
    type Hist = fn(&PoolMetrics) -> &Histogram;
    let histograms: [(&str, &str, Hist); 2] = [
        (
            "cronoq_queue_wait_seconds",
            "Time from submit to the first attempt's start.",
            |p| &p.queue_wait,
        ),
        (
            "cronoq_run_seconds",
            "Time from an attempt's start to its end.",
            |p| &p.run,
        ),
    ];
    for (name, help, hist) in histograms {
        let mut family = Family::start(&mut out, name, "histogram", help);
        let (bucket, sum, count) = (
            format!("{name}_bucket"),
            format!("{name}_sum"),
            format!("{name}_count"),
        );
        for p in &m.pools {
            let h = hist(p);
            for (le, n) in les.iter().zip(h.cumulative()) {
                family.sample(&bucket, &[("pool", &p.pool), ("le", le)], n);
            }
            family.sample_text(
                &sum,
                &[("pool", &p.pool)],
                &format!("{}", h.sum_ms as f64 / 1000.0),
            );
            family.sample(&count, &[("pool", &p.pool)], h.count);
        }
    }
    if let Some(s) = &m.server {
        Family::start(
            &mut out,
            "cronoq_leader_takeovers_total",
            "counter",
            "Times this server process took the lead.",
        )
        .sample("cronoq_leader_takeovers_total", &[], s.takeovers);
        Family::start(
            &mut out,
            "cronoq_journal_pending_records",
            "gauge",
            "Journal records (task results) being written and not yet acknowledged by JetStream.",
        )
        .sample("cronoq_journal_pending_records", &[], s.journal_pending);
        Family::start(
            &mut out,
            "cronoq_storage_refused_total",
            "counter",
            "Stored values refused as not sealed with the servers' storage key (forged, or another deployment's).",
        )
        .sample("cronoq_storage_refused_total", &[], s.storage_refused);
        let name = "cronoq_submissions_refused_unattributed_total";
        let mut family = Family::start(
            &mut out,
            name,
            "counter",
            "Submissions dropped unrecorded because no credential's proof verifies on them, by code.",
        );
        for (code, count) in &s.refused_unattributed {
            family.sample(name, &[("code", code)], *count);
        }
    }
    out
}

/// The most series per label set (per family) one scrape carries.
pub const MAX_LABEL_SET_SERIES: usize = 1_000;
