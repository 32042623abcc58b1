//! The HTTP API (SPEC §5) over the embedded `Scheduler`: every route, every
//! bad input answered with the right code and status and changing nothing,
//! the error mapping of every code (through a stub `Api`), the Prometheus
//! text, and `HttpClient` against the router served on a loopback port.

use std::future::pending;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use base64::Engine as _;
use bytes::Bytes;
use cronoq::api::{Api, ApiFuture, Health};
use cronoq::client::HttpClient;
use cronoq::core::{
    Autoscale, ErrorCode, GroupSnapshot, Labels, PoolName, PoolSnapshot, Snapshot, TaskId,
    TaskState,
};
use cronoq::wire::WireError;
use cronoq::{Scheduler, Task, TaskContext, TaskError, TaskStatus};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

/// A scheduler with pools `p` (echo; 1 unlabeled slot and 1 `gpu=a100`),
/// `slow` (never finishes; 1 slot), `flaky` (always fails, retryable) and
/// `bare` (capacity, no executor).
fn scheduler() -> Scheduler {
    let sched = Scheduler::builder().max_payload_bytes(64).build().unwrap();
    sched.set_capacity("p", 1).unwrap();
    sched
        .set_group_capacity("p", Labels::from([("gpu", "a100")]), 1)
        .unwrap();
    sched
        .executor("p", |_ctx: TaskContext, payload: Bytes| async move {
            Ok(payload)
        })
        .unwrap();
    sched.set_capacity("slow", 1).unwrap();
    sched
        .executor("slow", |_ctx: TaskContext, _payload: Bytes| async move {
            pending::<Result<Bytes, TaskError>>().await
        })
        .unwrap();
    sched.set_capacity("flaky", 1).unwrap();
    sched
        .executor("flaky", |_ctx: TaskContext, _payload: Bytes| async move {
            Err::<Bytes, _>(TaskError::retryable("boom"))
        })
        .unwrap();
    sched.set_capacity("bare", 1).unwrap();
    sched
}

struct Answer {
    status: StatusCode,
    content_type: String,
    text: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text))
    }
}

async fn call(app: &axum::Router, method: Method, uri: &str, body: Option<&str>) -> Answer {
    let mut request = Request::builder().method(method).uri(uri);
    if body.is_some() {
        request = request.header("content-type", "application/json");
    }
    let request = request
        .body(Body::from(body.unwrap_or("").to_string()))
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        content_type,
        text: String::from_utf8(bytes.to_vec()).unwrap(),
    }
}

async fn get(app: &axum::Router, uri: &str) -> Answer {
    call(app, Method::GET, uri, None).await
}

async fn post(app: &axum::Router, uri: &str, body: &str) -> Answer {
    call(app, Method::POST, uri, Some(body)).await
}

/// Polls `GET /v1/tasks/{id}` until `done` holds (deadline 5 s).
async fn poll_task(app: &axum::Router, id: u64, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let answer = get(app, &format!("/v1/tasks/{id}")).await;
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.text);
        let v = answer.json();
        if done(&v) {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "task {id} stuck: {v}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn snapshot_lists_pools_and_groups() {
    let sched = scheduler();
    let app = cronoq::http::router(Arc::new(sched.clone()));
    let answer = get(&app, "/v1/snapshot").await;
    assert_eq!(answer.status, StatusCode::OK);
    assert!(answer.content_type.starts_with("application/json"));
    let snap: Snapshot = serde_json::from_str(&answer.text).unwrap();
    assert_eq!(snap, sched.snapshot());
    let v = answer.json();
    let p = v["pools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "p")
        .unwrap();
    assert_eq!(p["capacity"], 2);
    assert_eq!(p["groups"][1]["labels"], json!({"gpu": "a100"}));
    assert!(p["autoscale"]["desired"].is_u64());
}

#[tokio::test]
async fn submit_then_status_with_text_and_binary_output() {
    let app = cronoq::http::router(Arc::new(scheduler()));
    let answer = post(
        &app,
        "/v1/tasks",
        r#"{"pool":"p","labels":{"gpu":"a100"},"payload":"hello","priority":3,
            "deadline":"1m","max_attempts":2,"attempt_timeout":"30s","est_runtime":"1s",
            "idempotency_key":"k1"}"#,
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text);
    let id = answer.json()["id"].as_u64().unwrap();
    let v = poll_task(&app, id, |v| v["state"] == "succeeded").await;
    assert_eq!(v["output"], "hello");
    assert_eq!(v["output_base64"], "aGVsbG8=");
    assert_eq!(v["pool"], "p");
    assert_eq!(v["reason"], Value::Null);
    let attempt = &v["attempts"][0];
    assert_eq!(attempt["attempt"], 1);
    assert_eq!(attempt["group"], json!({"gpu": "a100"}));
    assert_eq!(attempt["outcome"], "succeeded");
    assert!(attempt["started_at"].as_u64().unwrap() > 0);
    assert!(attempt["ended_at"].as_u64().unwrap() >= attempt["started_at"].as_u64().unwrap());

    let binary = [0u8, 159, 146, 150, 255];
    let b64 = base64::engine::general_purpose::STANDARD.encode(binary);
    let answer = post(
        &app,
        "/v1/tasks",
        &format!(r#"{{"pool":"p","payload_base64":"{b64}"}}"#),
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text);
    let id = answer.json()["id"].as_u64().unwrap();
    let v = poll_task(&app, id, |v| v["state"] == "succeeded").await;
    assert_eq!(v["output_base64"], b64.as_str());
    let status: TaskStatus = serde_json::from_value(v).unwrap();
    assert_eq!(status.output_bytes().unwrap(), binary);
}

#[tokio::test]
async fn waiting_tasks_say_why() {
    let app = cronoq::http::router(Arc::new(scheduler()));
    let id_of = |a: Answer| {
        assert_eq!(a.status, StatusCode::OK, "{}", a.text);
        a.json()["id"].as_u64().unwrap()
    };
    let nobody = id_of(post(&app, "/v1/tasks", r#"{"pool":"p","labels":{"gpu":"h100"}}"#).await);
    let v = get(&app, &format!("/v1/tasks/{nobody}")).await.json();
    assert_eq!(
        (v["state"].as_str(), v["reason"].as_str()),
        (Some("queued"), Some("no_group_matches"))
    );

    let later = id_of(
        post(
            &app,
            "/v1/tasks",
            r#"{"pool":"p","start_at":"1h","tolerance":"5m"}"#,
        )
        .await,
    );
    let v = get(&app, &format!("/v1/tasks/{later}")).await.json();
    assert_eq!(
        (v["state"].as_str(), v["reason"].as_str()),
        (Some("scheduled"), Some("scheduled"))
    );

    let running = id_of(post(&app, "/v1/tasks", r#"{"pool":"slow"}"#).await);
    poll_task(&app, running, |v| v["state"] == "running").await;
    let full = id_of(post(&app, "/v1/tasks", r#"{"pool":"slow"}"#).await);
    let v = get(&app, &format!("/v1/tasks/{full}")).await.json();
    assert_eq!(
        (v["state"].as_str(), v["reason"].as_str()),
        (Some("queued"), Some("groups_full"))
    );

    let flaky = id_of(
        post(
            &app,
            "/v1/tasks",
            r#"{"pool":"flaky","max_attempts":3,"backoff":{"initial":"1h","max":"2h"}}"#,
        )
        .await,
    );
    let v = poll_task(&app, flaky, |v| v["reason"] == "backoff").await;
    assert_eq!(v["state"], "queued");
    assert_eq!(v["attempts"][0]["outcome"], "failed");
    assert_eq!(v["attempts"][0]["error"], "boom");
}

#[tokio::test]
async fn cancel_a_task() {
    let sched = scheduler();
    let app = cronoq::http::router(Arc::new(sched.clone()));
    let answer = post(&app, "/v1/tasks", r#"{"pool":"slow"}"#).await;
    let id = answer.json()["id"].as_u64().unwrap();
    let answer = post(&app, &format!("/v1/tasks/{id}/cancel"), "").await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text);
    assert_eq!(answer.json(), json!({"id": id}));
    poll_task(&app, id, |v| v["state"] == "cancelled").await;
    // Once finished, a cancel is refused: FAILED_PRECONDITION is 409.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let answer = post(&app, &format!("/v1/tasks/{id}/cancel"), "").await;
        if answer.status == StatusCode::CONFLICT {
            assert_eq!(answer.json()["code"], "FAILED_PRECONDITION");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{}", answer.text);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn bad_input_is_refused_and_changes_nothing() {
    let sched = scheduler();
    let app = cronoq::http::router(Arc::new(sched.clone()));
    let cases: &[(Method, &str, Option<&str>, StatusCode, &str)] = &[
        (
            Method::POST,
            "/v1/tasks",
            Some("{"),
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
        ),
        (
            Method::POST,
            "/v1/tasks",
            Some("[]"),
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
        ),
        (
            Method::POST,
            "/v1/tasks",
            Some(""),
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
        ),
        (
            Method::POST,
            "/v1/tasks",
            Some(r#"{"pool":"p","colour":"red"}"#),
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
        ),
        (
            Method::POST,
            "/v1/tasks",
            Some(r#"{"pool":"p","payload":"a","payload_base64":"YQ=="}"#),
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
        ),
        (
            Method::POST,
            "/v1/tasks",
            Some(r#"{"pool":"p","payload_base64":"@@"}"#),
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
        ),
        (
            Method::POST,
            "/v1/tasks",
            Some(r#"{"pool":"p","labels":{"gpu":"a 100"}}"#),
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
        ),
        (
            Method::POST,
            "/v1/tasks",
            Some(r#"{"pool":"p","labels":{"gpu":1}}"#),
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
        ),
        (
            Method::POST,
            "/v1/tasks",
            Some(r#"{"pool":"no such pool"}"#),
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
        ),
        (
            Method::POST,
            "/v1/tasks",
            Some(r#"{"pool":"p","priority":"high"}"#),
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
        ),
        (
            Method::POST,
            "/v1/tasks",
            Some(r#"{"pool":"p","deadline":"tomorrow"}"#),
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
        ),
        (
            Method::POST,
            "/v1/tasks",
            Some(r#"{"pool":"p","start_at":"later"}"#),
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
        ),
        (
            Method::POST,
            "/v1/tasks",
            Some(r#"{"pool":"p","tolerance":"5s"}"#),
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
        ),
        (
            Method::POST,
            "/v1/tasks",
            Some(r#"{"pool":"p","max_attempts":0}"#),
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
        ),
        (
            Method::POST,
            "/v1/tasks",
            Some(r#"{"pool":"p","max_attempts":-1}"#),
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
        ),
        (
            Method::POST,
            "/v1/tasks",
            Some(r#"{"pool":"p","attempt_timeout":"0s"}"#),
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
        ),
        (
            Method::POST,
            "/v1/tasks",
            Some(r#"{"pool":"p","est_runtime":"fast"}"#),
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
        ),
        (
            Method::POST,
            "/v1/tasks",
            Some(r#"{"pool":"p","backoff":{"initial":"1m","max":"1s"}}"#),
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
        ),
        (
            Method::POST,
            "/v1/tasks",
            Some(
                r#"{"pool":"p","payload":"this payload is longer than the sixty-four byte limit of the test"}"#,
            ),
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
        ),
        (
            Method::POST,
            "/v1/tasks",
            Some(r#"{"pool":"bare"}"#),
            StatusCode::CONFLICT,
            "FAILED_PRECONDITION",
        ),
        (
            Method::GET,
            "/v1/tasks/abc",
            None,
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
        ),
        (
            Method::GET,
            "/v1/tasks/-1",
            None,
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
        ),
        (
            Method::GET,
            "/v1/tasks/99999999999999999999999",
            None,
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
        ),
        (
            Method::GET,
            "/v1/tasks/4242",
            None,
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
        ),
        (
            Method::POST,
            "/v1/tasks/abc/cancel",
            None,
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
        ),
        (
            Method::POST,
            "/v1/tasks/4242/cancel",
            None,
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
        ),
        (
            Method::GET,
            "/v1/nothing",
            None,
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
        ),
        (Method::POST, "/", None, StatusCode::NOT_FOUND, "NOT_FOUND"),
        (
            Method::DELETE,
            "/v1/snapshot",
            None,
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
        ),
        (
            Method::GET,
            "/v1/tasks?limit=0",
            None,
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
        ),
        (
            Method::GET,
            "/v1/tasks?limit=501",
            None,
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
        ),
        (
            Method::GET,
            "/v1/tasks?limit=ten",
            None,
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
        ),
        (
            Method::GET,
            "/v1/tasks?limit=5&limit=6",
            None,
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
        ),
        (
            Method::GET,
            "/v1/tasks?colour=red",
            None,
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
        ),
        (
            Method::GET,
            "/v1/dashboard?workers=501",
            None,
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
        ),
        (
            Method::GET,
            "/v1/dashboard?tasks=0",
            None,
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
        ),
        (
            Method::GET,
            "/v1/dashboard?offset=-1",
            None,
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
        ),
        (
            Method::GET,
            "/v1/dashboard?colour=red",
            None,
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
        ),
        (
            Method::GET,
            "/v1/dashboard?workers=1&workers=2",
            None,
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
        ),
        (
            Method::DELETE,
            "/v1/tasks",
            None,
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
        ),
        (
            Method::GET,
            "/v1/tasks/1/cancel",
            None,
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
        ),
    ];
    let before = sched.snapshot();
    for (method, uri, body, status, code) in cases {
        let answer = call(&app, method.clone(), uri, *body).await;
        let what = format!("{method} {uri} {body:?}: {}", answer.text);
        assert_eq!(answer.status, *status, "{what}");
        assert!(
            answer.content_type.starts_with("application/json"),
            "{what}"
        );
        let v = answer.json();
        assert_eq!(v["code"], *code, "{what}");
        assert!(!v["message"].as_str().unwrap().is_empty(), "{what}");
        assert_eq!(v.as_object().unwrap().len(), 2, "{what}");
    }
    assert_eq!(sched.snapshot(), before);
    // The first accepted task still gets id 1: nothing was submitted.
    let answer = post(&app, "/v1/tasks", r#"{"pool":"p"}"#).await;
    assert_eq!(answer.json(), json!({"id": 1}));
}

#[tokio::test]
async fn an_oversized_body_is_413_and_a_long_value_is_not_echoed() {
    let sched = scheduler();
    let app = cronoq::http::router(Arc::new(sched.clone()));
    let before = sched.snapshot();
    // Over axum's 2 MB body limit: 413 with the payload limit's code.
    let body = format!(r#"{{"pool":"p","payload":"{}"}}"#, "x".repeat(3 << 20));
    let answer = post(&app, "/v1/tasks", &body).await;
    assert_eq!(
        answer.status,
        StatusCode::PAYLOAD_TOO_LARGE,
        "{}",
        answer.text
    );
    assert_eq!(answer.content_type, "application/json");
    assert_eq!(answer.json()["code"], "INVALID_ARGUMENT");
    // A bad value of a megabyte comes back cut, in every error path that
    // quotes it: serde's, a field's parser, the label checks.
    let huge = "9".repeat(1 << 20);
    for body in [
        format!(r#"{{"pool":"p","priority":"{huge}"}}"#),
        format!(r#"{{"pool":"p","{huge}":1}}"#),
        format!(r#"{{"pool":"p","deadline":"{huge}y"}}"#),
        format!(r#"{{"pool":"p","backoff":{{"initial":"{huge}","max":"1s"}}}}"#),
        format!(r#"{{"pool":"p","labels":{{"gpu":"{huge}"}}}}"#),
        format!(r#"{{"pool":"{huge}"}}"#),
    ] {
        let answer = post(&app, "/v1/tasks", &body).await;
        assert_eq!(
            answer.status,
            StatusCode::BAD_REQUEST,
            "{:.300}",
            answer.text
        );
        assert_eq!(answer.json()["code"], "INVALID_ARGUMENT");
        assert!(
            answer.text.len() < 500,
            "{} bytes: {:.300}",
            answer.text.len(),
            answer.text
        );
    }
    // hyper takes URIs up to 64 KiB.
    let answer = get(&app, &format!("/v1/tasks/{}", &huge[..60_000])).await;
    assert_eq!(
        answer.status,
        StatusCode::BAD_REQUEST,
        "{:.300}",
        answer.text
    );
    assert!(answer.text.len() < 500, "{:.300}", answer.text);
    assert_eq!(sched.snapshot(), before);
}

#[tokio::test]
async fn health_and_readiness() {
    let app = cronoq::http::router(Arc::new(scheduler()));
    for uri in ["/healthz", "/readyz"] {
        let answer = get(&app, uri).await;
        assert_eq!(answer.status, StatusCode::OK, "{uri}");
        let v = answer.json();
        assert_eq!(
            (v["live"].as_bool(), v["ready"].as_bool()),
            (Some(true), Some(true))
        );
    }
    let stub = Arc::new(Stub {
        error: None,
        health: Health {
            live: true,
            ready: false,
            detail: "following nobody".into(),
        },
    });
    let app = cronoq::http::router(stub);
    assert_eq!(get(&app, "/healthz").await.status, StatusCode::OK);
    let answer = get(&app, "/readyz").await;
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
    let v = answer.json();
    assert_eq!(v["ready"], false);
    assert_eq!(v["code"], "UNAVAILABLE");
    assert_eq!(v["message"], "following nobody");
}

/// Issue 7 finding 3: `/metrics` stays bounded however many label sets go
/// by: at most `MAX_LABEL_SET_SERIES` per family, the rest counted.
#[test]
fn metrics_cardinality_is_bounded() {
    let mut snap = odd_snapshot();
    let groups: Vec<GroupSnapshot> = (0..5_000)
        .map(|i| GroupSnapshot {
            labels: Labels::from([("k", format!("v{i}"))]),
            capacity: 1,
            busy: 0,
            workers: 1,
        })
        .collect();
    snap.pools[0].groups = groups;
    let health = Health {
        live: true,
        ready: true,
        detail: "ok".into(),
    };
    let text = cronoq::http::metrics_text(&snap, &health);
    let series = text
        .lines()
        .filter(|l| l.starts_with("cronoq_group_capacity{"))
        .count();
    assert_eq!(series, cronoq::http::MAX_LABEL_SET_SERIES);
    assert!(
        text.contains("cronoq_metrics_label_sets_dropped 4000"),
        "{}",
        &text[text.len().saturating_sub(400)..]
    );
}

/// An `Api` that panics in every call: a bug somewhere below the routes.
struct Panicky;

impl Api for Panicky {
    fn submit(&self, _task: Task) -> ApiFuture<'_, TaskId> {
        Box::pin(async move { panic!("overflow when adding duration to instant") })
    }
    fn task(&self, _id: TaskId) -> ApiFuture<'_, TaskStatus> {
        Box::pin(async move { panic!("boom") })
    }
    fn cancel(&self, _id: TaskId) -> ApiFuture<'_, ()> {
        Box::pin(async move { panic!("boom") })
    }
    fn snapshot(&self) -> ApiFuture<'_, Snapshot> {
        Box::pin(async move { panic!("boom") })
    }
    fn recent_tasks(&self, _limit: usize) -> ApiFuture<'_, Vec<TaskStatus>> {
        Box::pin(async move { panic!("boom") })
    }
    fn health(&self) -> Health {
        Health {
            live: true,
            ready: true,
            detail: "ok".into(),
        }
    }
}

/// Issue 7 finding 1 (HTTP): a panicking handler used to drop the
/// connection with an empty reply; now it is a JSON `INTERNAL` error and
/// the next request is served.
#[tokio::test]
async fn a_panicking_handler_answers_a_json_internal_error() {
    let app = cronoq::http::router(Arc::new(Panicky));
    let answer = call(&app, Method::POST, "/v1/tasks", Some(r#"{"payload":"x"}"#)).await;
    assert_eq!(answer.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(answer.json()["code"], "INTERNAL");
    assert!(
        !answer.text.contains("overflow"),
        "detail stays in the log: {}",
        answer.text
    );
    assert_eq!(get(&app, "/healthz").await.status, StatusCode::OK);
}

/// An `Api` whose answers the test chooses.
struct Stub {
    error: Option<WireError>,
    health: Health,
}

impl Stub {
    fn answer<T>(&self, ok: T) -> Result<T, WireError> {
        match &self.error {
            Some(e) => Err(e.clone()),
            None => Ok(ok),
        }
    }
}

fn odd_snapshot() -> Snapshot {
    let pool = PoolName::new("p").unwrap();
    Snapshot {
        leader: None,
        pools: vec![PoolSnapshot {
            name: pool,
            capacity: 3,
            busy: 1,
            waiting: 4,
            scheduled: 2,
            reserved: 1,
            deadline_missed: 5,
            autoscale: Autoscale {
                desired: 6,
                min: 0,
                max: 10,
            },
            demand: vec![],
            groups: vec![
                GroupSnapshot {
                    labels: Labels::new(),
                    capacity: 1,
                    busy: 0,
                    workers: 0,
                },
                // Not a valid label set: the escaping must hold anyway.
                GroupSnapshot {
                    labels: Labels::from([("a", "x\"y\\z\nw")]),
                    capacity: 2,
                    busy: 1,
                    workers: 1,
                },
            ],
            fleets: vec![],
            waiting_without_fleet: 0,
            fairness_keys: vec![],
            concurrency_keys: vec![],
        }],
        workers: vec![],
        truncated: false,
    }
}

impl Api for Stub {
    fn submit(&self, _task: Task) -> ApiFuture<'_, TaskId> {
        Box::pin(async move { self.answer(TaskId(7)) })
    }
    fn task(&self, id: TaskId) -> ApiFuture<'_, TaskStatus> {
        Box::pin(async move {
            self.answer(TaskStatus {
                id,
                pool: PoolName::default(),
                state: TaskState::Queued,
                reason: None,
                reason_key: None,
                attempts: vec![],
                output: None,
                output_base64: None,
                error: None,
                deadline_missed: false,
                schedule: None,
                scheduled_at: None,
                output_size: None,
            })
        })
    }
    fn cancel(&self, _id: TaskId) -> ApiFuture<'_, ()> {
        Box::pin(async move { self.answer(()) })
    }
    fn snapshot(&self) -> ApiFuture<'_, Snapshot> {
        Box::pin(async move { self.answer(odd_snapshot()) })
    }
    fn recent_tasks(&self, _limit: usize) -> ApiFuture<'_, Vec<TaskStatus>> {
        Box::pin(async move { self.answer(vec![]) })
    }
    fn health(&self) -> Health {
        self.health.clone()
    }
}

#[tokio::test]
async fn every_code_has_its_status() {
    let cases = [
        ("INVALID_ARGUMENT", 400),
        ("UNAUTHENTICATED", 401),
        ("PERMISSION_DENIED", 403),
        ("NOT_FOUND", 404),
        ("ALREADY_EXISTS", 409),
        ("FAILED_PRECONDITION", 409),
        ("RESOURCE_EXHAUSTED", 429),
        ("UNAVAILABLE", 503),
        ("INTERNAL", 500),
        ("SOME_NEWER_CODE", 500),
    ];
    // A status stated here for every code of the one list.
    let mut stated: Vec<&str> = cases.iter().map(|case| case.0).collect();
    stated.retain(|code| *code != "SOME_NEWER_CODE");
    stated.sort_unstable();
    let mut known: Vec<&str> = ErrorCode::ALL.iter().map(ErrorCode::as_str).collect();
    known.sort_unstable();
    assert_eq!(stated, known, "every code of ErrorCode::ALL has its case");
    for (code, status) in cases {
        let stub = Arc::new(Stub {
            error: Some(WireError::new(
                ErrorCode(code.to_string().into()),
                "secret detail",
            )),
            health: Health {
                live: true,
                ready: true,
                detail: String::new(),
            },
        });
        let app = cronoq::http::router(stub);
        for (method, uri, body) in [
            (Method::GET, "/v1/snapshot", None),
            (Method::POST, "/v1/tasks", Some("{}")),
            (Method::GET, "/v1/tasks/1", None),
            (Method::POST, "/v1/tasks/1/cancel", None),
            (Method::GET, "/metrics", None),
        ] {
            let answer = call(&app, method.clone(), uri, body).await;
            if uri == "/metrics" && (status == 401 || status == 403) {
                // A follower with auth on cannot ask the leader for the
                // snapshot: it exports its health alone, not an error.
                assert_eq!(answer.status.as_u16(), 200, "{code} {uri}: {}", answer.text);
                assert!(answer.text.contains("cronoq_ready"), "{}", answer.text);
                continue;
            }
            assert_eq!(answer.status.as_u16(), status, "{code} {method} {uri}");
            let v = answer.json();
            assert_eq!(v["code"], code);
            // Internal detail goes to the log, not to the caller.
            assert_eq!(
                v["message"] == "secret detail",
                status != 500,
                "{code}: {}",
                answer.text
            );
        }
    }
}

#[tokio::test]
async fn metrics_in_prometheus_text() {
    let stub = Arc::new(Stub {
        error: None,
        health: Health {
            live: true,
            ready: true,
            detail: String::new(),
        },
    });
    let answer = get(&cronoq::http::router(stub), "/metrics").await;
    assert_eq!(answer.status, StatusCode::OK);
    assert!(answer.content_type.starts_with("text/plain; version=0.0.4"));
    let text = answer.text;
    for line in [
        "# TYPE cronoq_pool_capacity gauge",
        "cronoq_ready 1",
        r#"cronoq_pool_capacity{pool="p"} 3"#,
        r#"cronoq_pool_busy{pool="p"} 1"#,
        r#"cronoq_pool_waiting{pool="p"} 4"#,
        r#"cronoq_pool_scheduled{pool="p"} 2"#,
        r#"cronoq_pool_reserved{pool="p"} 1"#,
        r#"cronoq_pool_desired{pool="p"} 6"#,
        "# TYPE cronoq_pool_deadline_missed_total counter",
        r#"cronoq_pool_deadline_missed_total{pool="p"} 5"#,
        r#"cronoq_group_capacity{pool="p",labels=""} 1"#,
        r#"cronoq_group_capacity{pool="p",labels="a=x\"y\\z\nw"} 2"#,
        r#"cronoq_group_busy{pool="p",labels="a=x\"y\\z\nw"} 1"#,
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in\n{text}"
        );
    }
    // Every sample line is `name{labels} value` with one family per TYPE.
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let value = line.rsplit(' ').next().unwrap();
        assert!(value.parse::<u64>().is_ok(), "{line}");
    }
    let types = text.lines().filter(|l| l.starts_with("# TYPE")).count();
    let helps = text.lines().filter(|l| l.starts_with("# HELP")).count();
    assert_eq!(types, helps);

    // Over the embedded scheduler, too.
    let app = cronoq::http::router(Arc::new(scheduler()));
    let answer = get(&app, "/metrics").await;
    assert_eq!(answer.status, StatusCode::OK);
    assert!(answer
        .text
        .contains(r#"cronoq_group_capacity{pool="p",labels="gpu=a100"} 1"#));
}

/// Serves the router over `sched` on a free loopback port; its base URL.
async fn serve(sched: Scheduler) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = cronoq::http::router(Arc::new(sched));
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

#[tokio::test]
async fn http_client_against_the_router() {
    let sched = scheduler();
    let url = serve(sched.clone()).await;
    let client = HttpClient::new(&url).unwrap();

    let id = client
        .submit(Task::new("hi").pool("p").label("gpu", "a100").priority(2))
        .await
        .unwrap();
    let status = client.wait(id).await.unwrap();
    assert_eq!(status.state, TaskState::Succeeded);
    assert_eq!(status.output_bytes().unwrap(), b"hi");
    assert_eq!(status.attempts[0].group.to_string(), "gpu=a100");

    let binary = vec![0u8, 255, 1, 254];
    let id = client
        .submit(Task::new(binary.clone()).pool("p"))
        .await
        .unwrap();
    assert_eq!(
        client.wait(id).await.unwrap().output_bytes().unwrap(),
        binary
    );

    // Every option survives the JSON form.
    let id = client
        .submit(
            Task::new("x")
                .pool("slow")
                .deadline(std::time::SystemTime::now() + Duration::from_secs(60))
                .start_at(
                    std::time::SystemTime::now() + Duration::from_secs(3600),
                    Duration::from_secs(5),
                )
                .max_attempts(2)
                .backoff(Duration::from_millis(10), Duration::from_secs(1))
                .attempt_timeout(Duration::from_secs(9))
                .est_runtime(Duration::from_secs(1))
                .idempotency_key("key-1"),
        )
        .await
        .unwrap();
    let status = client.get(id).await.unwrap();
    assert_eq!(status.state, TaskState::Scheduled);
    client.cancel(id).await.unwrap();
    assert_eq!(client.wait(id).await.unwrap().state, TaskState::Cancelled);

    let snap = client.snapshot().await.unwrap();
    assert_eq!(snap, sched.snapshot());
    assert!(client.health().ready);

    // Refused by the client before sending: nothing changes.
    let before = sched.snapshot();
    let e = client
        .submit(Task::new("x").pool("p").label_text("gpu"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::INVALID_ARGUMENT);
    let e = client
        .submit(Task::new(vec![b'x'; 1 << 21]).pool("p"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::INVALID_ARGUMENT);
    // Refused by the server: its code comes back.
    let e = client
        .submit(Task::new("x").pool("bare"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::FAILED_PRECONDITION);
    let e = client.get(TaskId(4242)).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::NOT_FOUND);
    assert_eq!(sched.snapshot(), before);
}

#[tokio::test]
async fn http_client_without_a_server_is_unavailable() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let client = HttpClient::new(&format!("http://127.0.0.1:{port}")).unwrap();
    let e = client.snapshot().await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::UNAVAILABLE);
    assert!(
        e.to_string().contains("no cronoq server is answering"),
        "{e}"
    );
    assert!(!client.health().ready);
    let e = WireError::from(client.get(TaskId(1)).await.unwrap_err());
    assert_eq!(e.code, ErrorCode::UNAVAILABLE);

    for bad in [
        "https://127.0.0.1:7070",
        "127.0.0.1:7070",
        "http://",
        "nats://x:1",
    ] {
        let e = HttpClient::new(bad).unwrap_err();
        assert_eq!(e.code(), ErrorCode::INVALID_ARGUMENT, "{bad}");
    }
}
