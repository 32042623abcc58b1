//! The HTTP API of SPEC §5 (axum), served over anything that implements
//! [`Api`]: the embedded [`crate::Scheduler`], the distributed leader, or a
//! remote [`crate::client::Client`].
//!
//! | route | answer |
//! |---|---|
//! | `GET /v1/snapshot` | the [`Snapshot`](crate::core::Snapshot) as JSON |
//! | `GET /` | the live dashboard ([`dashboard`]; its data: `GET /v1/dashboard`) |
//! | `POST /v1/tasks` | a [`SubmitRequest`] → [`SubmitResponse`] `{"id": n}`; a `traceparent` header is the task's W3C trace context |
//! | `GET /v1/tasks?limit=N` | the newest N (default 50, at most 500) tasks, live or recently finished: [`crate::wire::TaskList`] `{"tasks": […]}`, highest id first, without outputs |
//! | `GET /v1/tasks/{id}` | the [`TaskStatus`](crate::task::TaskStatus) as JSON |
//! | `POST /v1/tasks/{id}/cancel` | `{"id": n}` |
//! | `/v1/schedules…` | schedules: list, create, get, delete, pause, resume, trigger, backfill ([`schedules`]) |
//! | `GET /v1/autoscale?pool=P&labels=k=v,…` | the fleet's [`AutoscaleAnswer`](crate::core::AutoscaleAnswer) (see [`autoscale_query`]) |
//! | `GET /metrics` | Prometheus text format: the snapshot's gauges ([`metrics_text`]), then the counters and histograms of [`Api::metrics`] ([`counters_text`]), then this process's span export counters ([`telemetry_text`]) |
//! | `GET /healthz` | [`Health`](crate::api::Health) JSON; 200 when live, else 503 |
//! | `GET /readyz` | [`Health`](crate::api::Health) JSON; 200 when ready, else 503 |
//! | `GET /v1/openapi.json` | the OpenAPI 3.1 document of every route here ([`openapi_document`]; checked in as `proto-schemas/openapi.yaml`) |
//!
//! Every route is added by the one list of `openapi.rs`, which documents
//! it in the same call (see [`served_routes`]): a new route is one line in
//! its file's `routes()`, with its summary.
//!
//! Every error is JSON `{"code": "…", "message": "…"}` with the status of
//! [`status_of`]; the mapping lives in one place, the [`IntoResponse`] of
//! [`HttpError`], and covers axum's own rejections (malformed JSON, a bad
//! id in the path), unknown routes and wrong methods (`NOT_FOUND`).
//! `FAILED_PRECONDITION` is 409 Conflict (e.g. cancelling a finished task),
//! not 412: no request here carries HTTP preconditions (`If-Match`).
//! A 503 of `/healthz` or `/readyz` carries both shapes: the [`Health`](crate::api::Health)
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

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{Method, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;

use crate::api::Api;
use crate::core::ErrorCode;
use crate::wire::WireError;

mod caller;
pub mod dashboard;
mod error;
mod extract;
mod health;
mod metrics;
mod openapi;
pub mod origin;
pub mod schedules;
mod serve;
mod snapshot;
mod tasks;

pub use crate::api::{BackoffRequest, SubmitRequest, SubmitResponse};
pub(crate) use caller::Caller;
pub use caller::{bearer_token, ApiFor, HttpAuth};
pub use error::{clamp_message, status_of, HttpError, MAX_MESSAGE_CHARS};
pub use metrics::{
    counters_text, escape_label_value, metrics_text, telemetry_text, MAX_LABEL_SET_SERIES,
};
pub use openapi::{openapi_document, served_routes};
pub use origin::AllowedHosts;
pub use serve::{serve, HttpLimits};
pub use snapshot::autoscale_query;
pub use tasks::DEFAULT_TASK_LIST;

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
    // Every route is in the one list of `openapi::all`, which documents
    // them as it adds them.
    let router = openapi::router()
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method);
    let router = match auth {
        Some(auth) => router.layer(axum::middleware::from_fn_with_state(
            auth,
            caller::authenticate,
        )),
        None => router,
    };
    router
        .layer(axum::middleware::from_fn(origin::require_json))
        .layer(axum::middleware::from_fn(catch_panics))
        .with_state(api)
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

type ApiState = State<Arc<dyn Api>>;

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
