//! Calling as the caller: with credentials required, a `/v1/*` request
//! calls the [`Api`] of its `Authorization: Bearer` token ([`HttpAuth`],
//! [`bearer_token`]); without, the router's own ([`Caller`]).

use std::sync::Arc;

use axum::extract::{FromRequestParts, Request, State};
use axum::http::header;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};

use super::HttpError;
use crate::api::{Api, Health};
use crate::auth::Credential;
use crate::core::{ErrorCode, Snapshot, TaskId};
use crate::task::TaskStatus;
use crate::wire::WireError;

/// The [`Api`] a `/v1/*` call of a caller goes to, by its credential
/// (`None`: no `Authorization` header).
pub type ApiFor = dyn Fn(Option<Credential>) -> Arc<dyn Api> + Send + Sync;

/// How [`super::router_with_auth`] calls as the caller: usually
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
pub(super) async fn authenticate(
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
