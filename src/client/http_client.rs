//! [`HttpClient`]: the same client operations against the HTTP API of
//! [`crate::http`] (plain `http://` only), for `--http`.
//!
//! Waiting is polling here: the HTTP API has no events.
//!
//! A token credential ([`ClientOptions::token`] and friends) is sent as
//! `Authorization: Bearer <token>` on every request; the HTTP API of a
//! server that requires credentials passes it on to the leader. An nkey
//! credential cannot be sent this way (it signs, and HTTP carries no
//! proof), so it is refused when the client is built (`INVALID_ARGUMENT`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::http::{header, Method, Request, Uri};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::de::DeserializeOwned;

use super::{wait_by_polling, ClientOptions, Error};
use crate::api::{Api, ApiFuture, Health, SubmitRequest, SubmitResponse};
use crate::auth::Credential;
use crate::core::{Rejection, Snapshot, TaskId};
use crate::task::{Task, TaskStatus};
use crate::wire::WireError;

mod schedules;

/// A client of the HTTP API: cheap to clone, safe to share.
///
/// ```no_run
/// # async fn f() -> Result<(), cronoq::client::Error> {
/// use cronoq::{client::HttpClient, Task};
/// let client = HttpClient::new("http://127.0.0.1:7070")?;
/// let id = client.submit(Task::new("hello")).await?;
/// let status = client.wait(id).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct HttpClient {
    base: String,
    http: hyper_util::client::legacy::Client<HttpConnector, Full<Bytes>>,
    /// The token credential, sent as `Authorization: Bearer`.
    bearer: Option<Arc<str>>,
    request_timeout: Duration,
    max_payload_bytes: usize,
    wait_poll_interval: Duration,
    /// Whether the last request reached a server (for [`Api::health`]).
    reachable: Arc<AtomicBool>,
}

impl std::fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpClient")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

impl HttpClient {
    /// A client of the API at `url` (`http://host:port`, optionally with a
    /// path prefix), with the default options.
    pub fn new(url: &str) -> Result<HttpClient, Error> {
        HttpClient::with_options(url, ClientOptions::new())
    }

    /// A client of the API at `url` with `options` (the prefix and the
    /// NATS connection token are unused). An nkey credential is refused
    /// `INVALID_ARGUMENT`: over HTTP a credential is a Bearer token.
    pub fn with_options(url: &str, options: ClientOptions) -> Result<HttpClient, Error> {
        let bearer = match &options.credential {
            None => None,
            Some(Credential::Token(token)) => Some(token.clone()),
            Some(Credential::Nkey(_)) => {
                return Err(Rejection::InvalidArgument(
                    "an nkey credential cannot be used over HTTP: the HTTP API takes a token \
                     (Authorization: Bearer); use NATS for an nkey, or a token credential"
                        .into(),
                )
                .into())
            }
        };
        let base = url.trim().trim_end_matches('/').to_string();
        let uri: Uri = base
            .parse()
            .map_err(|e| Rejection::InvalidArgument(format!("HTTP URL {url:?}: {e}")))?;
        if uri.scheme_str() != Some("http") || uri.host().is_none() {
            return Err(Rejection::InvalidArgument(format!(
                "HTTP URL {url:?} must be http://host:port (plain http only)"
            ))
            .into());
        }
        let http = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build_http();
        Ok(HttpClient {
            base,
            http,
            bearer,
            request_timeout: options.request_timeout,
            max_payload_bytes: options.max_payload_bytes,
            wait_poll_interval: options
                .wait_poll_interval
                .unwrap_or(Duration::from_millis(500)),
            reachable: Arc::new(AtomicBool::new(true)),
        })
    }

    /// The base URL.
    pub fn url(&self) -> &str {
        &self.base
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<T, Error> {
        self.call_with(method, path, body, None).await
    }

    async fn call_with<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
        traceparent: Option<&str>,
    ) -> Result<T, Error> {
        let url = format!("{}{path}", self.base);
        let mut request = Request::builder()
            .method(method.clone())
            .uri(&url)
            .header(header::ACCEPT, "application/json");
        if let Some(tp) = traceparent {
            request = request.header(crate::wire::TRACEPARENT, tp);
        }
        if body.is_some() {
            request = request.header(header::CONTENT_TYPE, "application/json");
        }
        if let Some(token) = &self.bearer {
            let mut value =
                header::HeaderValue::try_from(format!("Bearer {token}")).map_err(|_| {
                    Rejection::InvalidArgument(
                        "the token cannot be sent as an HTTP header (it must be visible ASCII)"
                            .into(),
                    )
                })?;
            value.set_sensitive(true);
            request = request.header(header::AUTHORIZATION, value);
        }
        let request = request
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| Rejection::InvalidArgument(format!("request to {url}: {e}")))?;
        let unavailable = |source: Option<super::BoxError>| {
            self.reachable.store(false, Ordering::Relaxed);
            Error::Unavailable {
                message: format!("no cronoq server is answering on {}", self.base),
                source,
            }
        };
        let exchange = async {
            let response = self.http.request(request).await?;
            let status = response.status();
            let body = response.into_body().collect().await?.to_bytes();
            Ok::<_, super::BoxError>((status, body))
        };
        let (status, body) = match tokio::time::timeout(self.request_timeout, exchange).await {
            Err(_) => {
                return Err(unavailable(Some(
                    format!("no answer within {:?}", self.request_timeout).into(),
                )))
            }
            Ok(Err(e)) => return Err(unavailable(Some(e))),
            Ok(Ok(answer)) => answer,
        };
        self.reachable.store(true, Ordering::Relaxed);
        if status.is_success() {
            return serde_json::from_slice(&body)
                .map_err(|e| Error::Protocol(format!("unreadable answer to {method} {url}: {e}")));
        }
        match serde_json::from_slice::<WireError>(&body) {
            Ok(e) => Err(Error::Refused(e)),
            Err(_) => {
                let text = String::from_utf8_lossy(&body);
                let message = format!("HTTP {status} from {method} {url}: {}", text.trim());
                if status.is_server_error() {
                    Err(Error::Unavailable {
                        message,
                        source: None,
                    })
                } else {
                    Err(Error::Protocol(message))
                }
            }
        }
    }

    /// Submits a task (validated here first); its id.
    pub async fn submit(&self, task: Task) -> Result<TaskId, Error> {
        task.to_spec(TaskId(1), self.max_payload_bytes)?;
        if let Some(key) = task.key() {
            crate::task::check_key(key)?;
        }
        let body = serde_json::to_vec(&SubmitRequest::from_task(&task))
            .map_err(|e| Error::Protocol(format!("encoding the task: {e}")))?;
        let answer: SubmitResponse = self
            .call_with(Method::POST, "/v1/tasks", Some(body), task.trace_context())
            .await?;
        Ok(answer.id)
    }

    /// A task's state, why it waits, its attempts and result.
    pub async fn get(&self, id: TaskId) -> Result<TaskStatus, Error> {
        self.call(Method::GET, &format!("/v1/tasks/{id}"), None)
            .await
    }

    /// Cancels a task.
    pub async fn cancel(&self, id: TaskId) -> Result<(), Error> {
        let _: serde_json::Value = self
            .call(Method::POST, &format!("/v1/tasks/{id}/cancel"), None)
            .await?;
        Ok(())
    }

    /// Pools, groups, demand and workers.
    pub async fn snapshot(&self) -> Result<Snapshot, Error> {
        self.call(Method::GET, "/v1/snapshot", None).await
    }

    /// The newest `limit` tasks (1 to 500), live or recently finished,
    /// highest id first, as summaries (`GET /v1/tasks?limit=N`).
    pub async fn recent_tasks(&self, limit: usize) -> Result<Vec<TaskStatus>, Error> {
        crate::api::check_recent_limit(limit)?;
        let list: crate::wire::TaskList = self
            .call(Method::GET, &format!("/v1/tasks?limit={limit}"), None)
            .await?;
        Ok(list.tasks)
    }

    /// Waits until the task is finished, looking it up every 500 ms.
    pub async fn wait(&self, id: TaskId) -> Result<TaskStatus, Error> {
        wait_by_polling(self.wait_poll_interval, || self.get(id)).await
    }
}

impl Api for HttpClient {
    fn submit(&self, task: Task) -> ApiFuture<'_, TaskId> {
        Box::pin(async move { Ok(HttpClient::submit(self, task).await?) })
    }

    fn task(&self, id: TaskId) -> ApiFuture<'_, TaskStatus> {
        Box::pin(async move { Ok(self.get(id).await?) })
    }

    fn cancel(&self, id: TaskId) -> ApiFuture<'_, ()> {
        Box::pin(async move { Ok(HttpClient::cancel(self, id).await?) })
    }

    fn snapshot(&self) -> ApiFuture<'_, Snapshot> {
        Box::pin(async move { Ok(HttpClient::snapshot(self).await?) })
    }

    fn recent_tasks(&self, limit: usize) -> ApiFuture<'_, Vec<TaskStatus>> {
        Box::pin(async move { Ok(HttpClient::recent_tasks(self, limit).await?) })
    }

    fn create_schedule(
        &self,
        spec: crate::api::CreateScheduleRequest,
    ) -> ApiFuture<'_, crate::api::ScheduleInfo> {
        Box::pin(async move { Ok(HttpClient::create_schedule(self, spec).await?) })
    }

    fn list_schedules(&self) -> ApiFuture<'_, Vec<crate::api::ScheduleEntry>> {
        Box::pin(async move { Ok(HttpClient::list_schedules(self).await?) })
    }

    fn get_schedule(&self, name: String) -> ApiFuture<'_, crate::api::ScheduleInfo> {
        Box::pin(async move { Ok(HttpClient::get_schedule(self, &name).await?) })
    }

    fn pause_schedule(&self, name: String) -> ApiFuture<'_, crate::api::ScheduleInfo> {
        Box::pin(async move { Ok(HttpClient::pause_schedule(self, &name).await?) })
    }

    fn resume_schedule(&self, name: String) -> ApiFuture<'_, crate::api::ScheduleInfo> {
        Box::pin(async move { Ok(HttpClient::resume_schedule(self, &name).await?) })
    }

    fn delete_schedule(&self, name: String) -> ApiFuture<'_, ()> {
        Box::pin(async move { Ok(HttpClient::delete_schedule(self, &name).await?) })
    }

    fn trigger_schedule(&self, name: String) -> ApiFuture<'_, crate::api::FireRecord> {
        Box::pin(async move { Ok(HttpClient::trigger_schedule(self, &name).await?) })
    }

    fn backfill_schedule(
        &self,
        name: String,
        range: crate::api::BackfillRange,
    ) -> ApiFuture<'_, crate::api::BackfillReport> {
        Box::pin(async move { Ok(HttpClient::backfill_schedule(self, &name, range).await?) })
    }

    /// Live always; ready while the last request reached a server (not
    /// checked here: this is a client).
    fn health(&self) -> Health {
        let ready = self.reachable.load(Ordering::Relaxed);
        Health {
            live: true,
            ready,
            detail: if ready {
                format!("HTTP API at {}", self.base)
            } else {
                format!("HTTP API at {} did not answer the last request", self.base)
            },
        }
    }
}
