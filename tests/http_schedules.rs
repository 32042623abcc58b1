//! The schedule routes of the HTTP API (`/v1/schedules…`, issue 23): each
//! route calls the right [`Api`] method with what the request said and
//! answers its JSON; every bad input is refused with its code and status
//! and calls nothing; the API's refusals keep their codes; and
//! `HttpClient`'s schedule calls round-trip through the router on a
//! loopback port. A recording [`Api`] stands behind the router here (the
//! routes are what is tested; the schedule rules are the scheduler's).

use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use cronoq::api::{
    Api, ApiFuture, BackfillRange, BackfillReport, CreateScheduleRequest, FireKind, FireRecord,
    Health, ScheduleCounters, ScheduleEntry, ScheduleInfo,
};
use cronoq::client::HttpClient;
use cronoq::core::{ErrorCode, Millis, Snapshot, TaskId, TaskState};
use cronoq::schedule::{Overlap, ScheduleSpec, ScheduleState};
use cronoq::wire::WireError;
use cronoq::{Task, TaskStatus};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

/// An [`Api`] that records each schedule call and answers canned values,
/// or `error` when set.
#[derive(Default)]
struct Recorder {
    calls: Mutex<Vec<String>>,
    error: Mutex<Option<WireError>>,
}

fn info(name: &str) -> ScheduleInfo {
    ScheduleInfo {
        spec: ScheduleSpec {
            name: name.into(),
            every: Some("1m".into()),
            ..ScheduleSpec::default()
        },
        state: ScheduleState::new(Millis(1_000)),
        paused: false,
        owner: None,
        created_at: Millis(1_000),
        next_fires: vec![Millis(60_000), Millis(120_000)],
        history: vec![fire(60_000, 7)],
        skipped: vec![],
        missed: vec![],
        counters: ScheduleCounters {
            fires: 1,
            skipped: 0,
            missed: 0,
        },
    }
}

fn fire(tick: u64, task: u64) -> FireRecord {
    FireRecord {
        tick: Millis(tick),
        fired_at: Millis(tick + 3),
        kind: FireKind::Tick,
        task: Some(TaskId(task)),
        outcome: Some(TaskState::Succeeded),
        error: None,
    }
}

impl Recorder {
    fn answer<T: Send + 'static>(&self, call: String, ok: T) -> ApiFuture<'_, T> {
        self.calls.lock().unwrap().push(call);
        let error = self.error.lock().unwrap().clone();
        Box::pin(async move {
            match error {
                Some(e) => Err(e),
                None => Ok(ok),
            }
        })
    }

    fn calls(&self) -> Vec<String> {
        std::mem::take(&mut *self.calls.lock().unwrap())
    }
}

fn none<'a, T: Send + 'a>() -> ApiFuture<'a, T> {
    Box::pin(async { Err(WireError::new(ErrorCode::INTERNAL, "not used here")) })
}

/// The [`Api`] methods every stub here has alike: no tasks, an empty
/// snapshot, healthy.
macro_rules! no_tasks {
    () => {
        fn submit(&self, _task: Task) -> ApiFuture<'_, TaskId> {
            none()
        }
        fn task(&self, _id: TaskId) -> ApiFuture<'_, TaskStatus> {
            none()
        }
        fn cancel(&self, _id: TaskId) -> ApiFuture<'_, ()> {
            none()
        }
        fn snapshot(&self) -> ApiFuture<'_, Snapshot> {
            Box::pin(async { Ok(Snapshot::default()) })
        }
        fn recent_tasks(&self, _limit: usize) -> ApiFuture<'_, Vec<TaskStatus>> {
            Box::pin(async { Ok(Vec::new()) })
        }
        fn health(&self) -> Health {
            Health {
                live: true,
                ready: true,
                detail: String::new(),
            }
        }
    };
}

impl Api for Recorder {
    no_tasks!();
    fn create_schedule(&self, spec: CreateScheduleRequest) -> ApiFuture<'_, ScheduleInfo> {
        let mut answer = info(&spec.name);
        answer.spec = spec.clone();
        self.answer(
            format!("create {}", serde_json::to_string(&spec).unwrap()),
            answer,
        )
    }
    fn list_schedules(&self) -> ApiFuture<'_, Vec<ScheduleEntry>> {
        let entry = |name: &str| ScheduleEntry {
            name: name.into(),
            cron: Some("*/5 * * * *".into()),
            every: None,
            tz: Some("Europe/Berlin".into()),
            overlap: Overlap::Skip,
            pool: "p".into(),
            paused: false,
            owner: None,
            next_fire: Some(Millis(300_000)),
            last: Some(fire(0, 3)),
            counters: ScheduleCounters::default(),
        };
        // Out of order: the route lists by name.
        self.answer("list".into(), vec![entry("b"), entry("a")])
    }
    fn get_schedule(&self, name: String) -> ApiFuture<'_, ScheduleInfo> {
        self.answer(format!("get {name}"), info(&name))
    }
    fn pause_schedule(&self, name: String) -> ApiFuture<'_, ScheduleInfo> {
        let mut answer = info(&name);
        answer.paused = true;
        answer.next_fires.clear();
        self.answer(format!("pause {name}"), answer)
    }
    fn resume_schedule(&self, name: String) -> ApiFuture<'_, ScheduleInfo> {
        self.answer(format!("resume {name}"), info(&name))
    }
    fn delete_schedule(&self, name: String) -> ApiFuture<'_, ()> {
        self.answer(format!("delete {name}"), ())
    }
    fn trigger_schedule(&self, name: String) -> ApiFuture<'_, FireRecord> {
        let mut answer = fire(90_000, 12);
        answer.kind = FireKind::Trigger;
        answer.outcome = None;
        self.answer(format!("trigger {name}"), answer)
    }
    fn backfill_schedule(
        &self,
        name: String,
        range: BackfillRange,
    ) -> ApiFuture<'_, BackfillReport> {
        let report = BackfillReport {
            fired: vec![fire(range.from.0, 20)],
            skipped: vec![range.to],
        };
        self.answer(
            format!("backfill {name} {}..={}", range.from.0, range.to.0),
            report,
        )
    }
}

struct Answer {
    status: StatusCode,
    text: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text))
    }

    /// Asserts a refusal: `status`, `code`, a message holding `want`.
    fn refused(&self, status: StatusCode, code: &str, want: &str) {
        assert_eq!(self.status, status, "{}", self.text);
        let v = self.json();
        assert_eq!(v["code"], code, "{}", self.text);
        let message = v["message"].as_str().unwrap();
        assert!(message.contains(want), "{message:?} does not name {want:?}");
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
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        text: String::from_utf8(bytes.to_vec()).unwrap(),
    }
}

fn app() -> (Arc<Recorder>, axum::Router) {
    let api = Arc::new(Recorder::default());
    let app = cronoq::http::router(api.clone());
    (api, app)
}

#[tokio::test]
async fn each_route_calls_its_method_and_answers_its_json() {
    let (api, app) = app();

    let body = r#"{"name": "nightly", "cron": "30 2 * * *", "tz": "Europe/Berlin",
        "overlap": "skip", "catchup_window": "10m", "jitter": "30s",
        "task": {"pool": "reports", "labels": {"gpu": "a100"}, "priority": 2,
                 "payload": "build", "max_attempts": 3, "attempt_timeout": "1h", "deadline": "2h"}}"#;
    let a = call(&app, Method::POST, "/v1/schedules", Some(body)).await;
    assert_eq!(a.status, StatusCode::CREATED, "{}", a.text);
    let created: ScheduleInfo = serde_json::from_str(&a.text).unwrap();
    let sent: ScheduleSpec = serde_json::from_str(body).unwrap();
    assert_eq!(created.spec, sent);
    assert_eq!(
        api.calls(),
        [format!("create {}", serde_json::to_string(&sent).unwrap())]
    );

    let a = call(&app, Method::GET, "/v1/schedules", None).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text);
    let v = a.json();
    let names: Vec<&str> = v["schedules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a", "b"]);
    assert_eq!(v["schedules"][0]["next_fire"], 300_000);
    assert_eq!(v["schedules"][0]["last"]["task"], 3);
    assert_eq!(v["schedules"][0]["overlap"], "skip");

    let a = call(&app, Method::GET, "/v1/schedules/nightly", None).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text);
    let v = a.json();
    assert_eq!(v["spec"]["name"], "nightly");
    assert_eq!(v["next_fires"], json!([60_000, 120_000]));
    assert_eq!(v["history"][0]["task"], 7);
    assert_eq!(v["history"][0]["outcome"], "succeeded");

    let a = call(&app, Method::POST, "/v1/schedules/nightly/pause", None).await;
    assert_eq!(
        (a.status, a.json()["paused"].clone()),
        (StatusCode::OK, json!(true))
    );
    let a = call(&app, Method::POST, "/v1/schedules/nightly/resume", None).await;
    assert_eq!(
        (a.status, a.json()["paused"].clone()),
        (StatusCode::OK, json!(false))
    );
    let a = call(&app, Method::POST, "/v1/schedules/nightly/trigger", None).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text);
    assert_eq!(
        (a.json()["task"].clone(), a.json()["kind"].clone()),
        (json!(12), json!("trigger"))
    );

    let a = call(
        &app,
        Method::POST,
        "/v1/schedules/nightly/backfill",
        Some(r#"{"from": "2026-01-01T00:00:00Z", "to": "2026-01-01T00:00:00Z"}"#),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text);
    let report: BackfillReport = serde_json::from_str(&a.text).unwrap();
    assert_eq!(report.fired[0].task, Some(TaskId(20)));

    let a = call(&app, Method::DELETE, "/v1/schedules/nightly", None).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text);
    assert_eq!(a.json(), json!({"deleted": "nightly"}));

    let from = 1_767_225_600_000u64; // 2026-01-01T00:00:00Z
    assert_eq!(
        api.calls(),
        [
            "list".to_string(),
            "get nightly".into(),
            "pause nightly".into(),
            "resume nightly".into(),
            "trigger nightly".into(),
            format!("backfill nightly {from}..={from}"),
            "delete nightly".into(),
        ]
    );
}

#[tokio::test]
async fn bad_input_is_refused_with_its_code_and_calls_nothing() {
    let (api, app) = app();
    let bad = StatusCode::BAD_REQUEST;
    // (method, path, body, status, code, what the message names)
    type Case<'a> = (
        Method,
        &'a str,
        Option<&'a str>,
        StatusCode,
        &'a str,
        &'a str,
    );
    let cases: Vec<Case> = vec![
        (
            Method::POST,
            "/v1/schedules",
            Some(r#"{"name":"x","cron":"61 * * * *"}"#),
            bad,
            "INVALID_ARGUMENT",
            "invalid cron expression \"61 * * * *\"",
        ),
        (
            Method::POST,
            "/v1/schedules",
            Some(r#"{"name":"x","cron":"0 0 30 2 *"}"#),
            bad,
            "INVALID_ARGUMENT",
            "never fires",
        ),
        (
            Method::POST,
            "/v1/schedules",
            Some(r#"{"name":"x","cron":"@daily","tz":"Mars/Olympus"}"#),
            bad,
            "INVALID_ARGUMENT",
            "unknown time zone \"Mars/Olympus\"",
        ),
        (
            Method::POST,
            "/v1/schedules",
            Some(r#"{"name":"x","every":"0s"}"#),
            bad,
            "INVALID_ARGUMENT",
            "below the minimum of 1s",
        ),
        (
            Method::POST,
            "/v1/schedules",
            Some(r#"{"name":"x","every":"500ms"}"#),
            bad,
            "INVALID_ARGUMENT",
            "below the minimum of 1s",
        ),
        (
            Method::POST,
            "/v1/schedules",
            Some(r#"{"name":"x"}"#),
            bad,
            "INVALID_ARGUMENT",
            "give cron (an expression) or every",
        ),
        (
            Method::POST,
            "/v1/schedules",
            Some(r#"{"name":"a b","every":"1m"}"#),
            bad,
            "INVALID_ARGUMENT",
            "schedule name \"a b\"",
        ),
        (
            Method::POST,
            "/v1/schedules",
            Some(r#"{"name":"x","every":"1m","colour":"red"}"#),
            bad,
            "INVALID_ARGUMENT",
            "unknown field `colour`",
        ),
        (
            Method::POST,
            "/v1/schedules",
            Some(r#"{"name":"x","every":"1m","overlap":"sometimes"}"#),
            bad,
            "INVALID_ARGUMENT",
            "unknown variant `sometimes`",
        ),
        (
            Method::POST,
            "/v1/schedules",
            Some(r#"{"name":"x","every":"1m","task":{"pool":"no pool"}}"#),
            bad,
            "INVALID_ARGUMENT",
            "pool",
        ),
        (
            Method::POST,
            "/v1/schedules",
            Some(r#"["x"]"#),
            bad,
            "INVALID_ARGUMENT",
            "the body must be a JSON object",
        ),
        (
            Method::POST,
            "/v1/schedules",
            Some("{"),
            bad,
            "INVALID_ARGUMENT",
            "malformed JSON body",
        ),
        (
            Method::GET,
            "/v1/schedules/a.b",
            None,
            bad,
            "INVALID_ARGUMENT",
            "schedule name \"a.b\"",
        ),
        (
            Method::DELETE,
            "/v1/schedules/a%20b",
            None,
            bad,
            "INVALID_ARGUMENT",
            "schedule name \"a b\"",
        ),
        (
            Method::POST,
            "/v1/schedules/a.b/pause",
            None,
            bad,
            "INVALID_ARGUMENT",
            "schedule name",
        ),
        (
            Method::POST,
            "/v1/schedules/x/backfill",
            Some(r#"{"from":"yesterday","to":"2026-01-01T00:00:00Z"}"#),
            bad,
            "INVALID_ARGUMENT",
            "from \"yesterday\" is not an RFC 3339 time",
        ),
        (
            Method::POST,
            "/v1/schedules/x/backfill",
            Some(r#"{"from":"2026-01-02T00:00:00Z","to":"2026-01-01T00:00:00Z"}"#),
            bad,
            "INVALID_ARGUMENT",
            "from is after to",
        ),
        (
            Method::POST,
            "/v1/schedules/x/backfill",
            Some(r#"{"from":"2026-01-01T00:00:00Z"}"#),
            bad,
            "INVALID_ARGUMENT",
            "missing field `to`",
        ),
        (
            Method::POST,
            "/v1/schedules/x/backfill",
            None,
            bad,
            "INVALID_ARGUMENT",
            "the body must be a JSON object",
        ),
        (
            Method::POST,
            "/v1/schedules/x/explode",
            None,
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
            "no route POST /v1/schedules/x/explode",
        ),
        (
            Method::PUT,
            "/v1/schedules/x",
            None,
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
            "the path takes other methods",
        ),
        (
            Method::GET,
            "/v1/schedules/x/trigger",
            None,
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
            "the path takes other methods",
        ),
    ];
    for (method, uri, body, status, code, want) in cases {
        let a = call(&app, method.clone(), uri, body).await;
        a.refused(status, code, want);
        assert_eq!(
            api.calls(),
            Vec::<String>::new(),
            "{method} {uri} called the API"
        );
    }

    // A post that is not JSON is refused before any handler (a browser
    // form cannot create a schedule).
    let request = Request::builder()
        .method(Method::POST)
        .uri("/v1/schedules")
        .header("content-type", "text/plain")
        .body(Body::from(r#"{"name":"x","every":"1m"}"#))
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert!(api.calls().is_empty());
}

#[tokio::test]
async fn the_schedulers_refusals_keep_their_codes() {
    let (api, app) = app();
    let cases = [
        (ErrorCode::ALREADY_EXISTS, StatusCode::CONFLICT),
        (ErrorCode::NOT_FOUND, StatusCode::NOT_FOUND),
        (ErrorCode::RESOURCE_EXHAUSTED, StatusCode::TOO_MANY_REQUESTS),
        (ErrorCode::PERMISSION_DENIED, StatusCode::FORBIDDEN),
        (ErrorCode::UNAUTHENTICATED, StatusCode::UNAUTHORIZED),
        (ErrorCode::FAILED_PRECONDITION, StatusCode::CONFLICT),
        (ErrorCode::UNAVAILABLE, StatusCode::SERVICE_UNAVAILABLE),
    ];
    for (code, status) in cases {
        *api.error.lock().unwrap() = Some(WireError::new(code.clone(), "as the scheduler said"));
        for (method, uri, body) in [
            (
                Method::POST,
                "/v1/schedules",
                Some(r#"{"name":"x","every":"1m"}"#),
            ),
            (Method::GET, "/v1/schedules", None),
            (Method::GET, "/v1/schedules/x", None),
            (Method::POST, "/v1/schedules/x/trigger", None),
        ] {
            let a = call(&app, method.clone(), uri, body).await;
            a.refused(status, code.as_str(), "as the scheduler said");
        }
        api.calls();
    }
}

#[tokio::test]
async fn http_client_schedule_calls_round_trip_through_the_router() {
    let api = Arc::new(Recorder::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = cronoq::http::router(api.clone());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let client = HttpClient::new(&format!("http://{addr}")).unwrap();

    let spec: ScheduleSpec = serde_json::from_value(json!({
        "name": "etl", "cron": "0 * * * *", "overlap": "cancel_previous",
        "task": {"pool": "p", "labels": {"zone": "eu"}, "payload": "go"}
    }))
    .unwrap();
    let created = client.create_schedule(spec.clone()).await.unwrap();
    assert_eq!(created.spec, spec);
    let list = client.list_schedules().await.unwrap();
    assert_eq!(list.len(), 2);
    assert_eq!(
        client.get_schedule("etl").await.unwrap().history[0].task,
        Some(TaskId(7))
    );
    assert!(client.pause_schedule("etl").await.unwrap().paused);
    assert!(!client.resume_schedule("etl").await.unwrap().paused);
    assert_eq!(
        client.trigger_schedule("etl").await.unwrap().task,
        Some(TaskId(12))
    );
    let range = BackfillRange::new(Millis(1_767_225_600_000), Millis(1_767_229_200_000)).unwrap();
    let report = client.backfill_schedule("etl", range).await.unwrap();
    assert_eq!(report.skipped, [range.to]);
    client.delete_schedule("etl").await.unwrap();
    assert_eq!(
        api.calls(),
        [
            format!("create {}", serde_json::to_string(&spec).unwrap()),
            "list".into(),
            "get etl".into(),
            "pause etl".into(),
            "resume etl".into(),
            "trigger etl".into(),
            format!("backfill etl {}..={}", range.from.0, range.to.0),
            "delete etl".into(),
        ]
    );

    // Refused by the client itself, before sending: a name that would make
    // another path, a schedule that cannot be.
    let e = client.get_schedule("../tasks/1").await.unwrap_err();
    assert_eq!(WireError::from(e).code, ErrorCode::INVALID_ARGUMENT);
    let mut never = spec.clone();
    never.cron = Some("0 0 30 2 *".into());
    let e = WireError::from(client.create_schedule(never).await.unwrap_err());
    assert_eq!(e.code, ErrorCode::INVALID_ARGUMENT);
    assert!(e.message.contains("never fires"), "{}", e.message);
    assert!(api.calls().is_empty());

    // The scheduler's refusal comes back with its code.
    *api.error.lock().unwrap() = Some(WireError::new(
        ErrorCode::ALREADY_EXISTS,
        "schedule etl exists",
    ));
    let e = WireError::from(client.create_schedule(spec).await.unwrap_err());
    assert_eq!(
        (e.code, e.message.as_str()),
        (ErrorCode::ALREADY_EXISTS, "schedule etl exists")
    );
}

/// The routes over the real embedded scheduler: a schedule created over
/// HTTP fires, shows its runs, and each refusal (a taken name, an unknown
/// one, the limit's neighbours) changes nothing.
#[tokio::test]
async fn over_the_embedded_scheduler_a_schedule_fires_and_refusals_change_nothing() {
    let sched = cronoq::Scheduler::new();
    sched.set_capacity("p", 2).unwrap();
    sched
        .executor(
            "p",
            |_ctx, payload: bytes::Bytes| async move { Ok(payload) },
        )
        .unwrap();
    let app = cronoq::http::router(Arc::new(sched.clone()));
    let body =
        r#"{"name":"beat","every":"1s","overlap":"skip","task":{"pool":"p","payload":"hi"}}"#;
    let a = call(&app, Method::POST, "/v1/schedules", Some(body)).await;
    assert_eq!(a.status, StatusCode::CREATED, "{}", a.text);
    assert_eq!(a.json()["next_fires"].as_array().unwrap().len(), 5);

    // It fires: poll until a run succeeded (deadline 10 s).
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    let info = loop {
        let a = call(&app, Method::GET, "/v1/schedules/beat", None).await;
        assert_eq!(a.status, StatusCode::OK, "{}", a.text);
        let info: ScheduleInfo = serde_json::from_str(&a.text).unwrap();
        if info
            .history
            .iter()
            .any(|f| f.outcome == Some(TaskState::Succeeded))
        {
            break info;
        }
        assert!(tokio::time::Instant::now() < deadline, "no run: {}", a.text);
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    let run = info.history.iter().find(|f| f.outcome.is_some()).unwrap();
    let task = call(
        &app,
        Method::GET,
        &format!("/v1/tasks/{}", run.task.unwrap()),
        None,
    )
    .await;
    assert_eq!(task.json()["output"], "hi", "{}", task.text);

    let before = call(&app, Method::GET, "/v1/schedules", None).await.json();
    let again = r#"{"name":"beat","cron":"@daily","task":{"pool":"p"}}"#;
    call(&app, Method::POST, "/v1/schedules", Some(again))
        .await
        .refused(StatusCode::CONFLICT, "ALREADY_EXISTS", "beat");
    for (method, uri) in [
        (Method::GET, "/v1/schedules/nope"),
        (Method::DELETE, "/v1/schedules/nope"),
        (Method::POST, "/v1/schedules/nope/pause"),
        (Method::POST, "/v1/schedules/nope/trigger"),
    ] {
        call(&app, method, uri, None)
            .await
            .refused(StatusCode::NOT_FOUND, "NOT_FOUND", "nope");
    }
    let after = call(&app, Method::GET, "/v1/schedules", None).await.json();
    let names = |v: &Value| {
        v["schedules"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| (e["name"].clone(), e["cron"].clone(), e["every"].clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(names(&before), names(&after));
    assert_eq!(names(&after), [(json!("beat"), Value::Null, json!("1s"))]);

    // Paused, then deleted.
    let a = call(&app, Method::POST, "/v1/schedules/beat/pause", None).await;
    assert_eq!(
        (a.status, a.json()["paused"].clone()),
        (StatusCode::OK, json!(true))
    );
    let a = call(&app, Method::DELETE, "/v1/schedules/beat", None).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text);
    let a = call(&app, Method::GET, "/v1/schedules", None).await;
    assert_eq!(a.json(), json!({"schedules": []}));
}

/// An [`Api`] that serves no schedules (the trait's defaults): an older
/// server, or a client without them.
struct Bare;

impl Api for Bare {
    no_tasks!();
}

#[tokio::test]
async fn the_dashboard_lists_schedules_next_to_fire_first_and_does_without_them() {
    let (_api, app) = app();
    let a = call(&app, Method::GET, "/v1/dashboard", None).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text);
    let v = a.json();
    assert_eq!(
        (
            v["schedules"]["total"].clone(),
            v["schedules"]["paused"].clone()
        ),
        (json!(2), json!(0))
    );
    let rows: Vec<&str> = v["schedules"]["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(rows, ["a", "b"]);
    assert_eq!(v["schedules"]["rows"][0]["last"]["task"], 3);

    // 250 schedules: the 100 that fire next, paused ones last.
    let entries: Vec<ScheduleEntry> = (0..250u64)
        .map(|i| ScheduleEntry {
            name: format!("s{i:03}"),
            cron: None,
            every: Some("1m".into()),
            tz: None,
            overlap: Overlap::Allow,
            pool: "p".into(),
            paused: i % 2 == 0,
            owner: None,
            next_fire: (i % 2 == 1).then(|| Millis(1_000_000 - i)),
            last: None,
            counters: ScheduleCounters::default(),
        })
        .collect();
    let view = cronoq::http::dashboard::schedules_view(entries);
    assert_eq!((view.total, view.paused, view.rows.len()), (250, 125, 100));
    assert_eq!(view.rows[0].name, "s249");
    assert!(view.rows.iter().all(|r| !r.paused));
    assert!(view
        .rows
        .windows(2)
        .all(|w| w[0].next_fire <= w[1].next_fire));

    // A server that serves no schedules: the routes say so, the page does
    // without them.
    let app = cronoq::http::router(Arc::new(Bare));
    call(&app, Method::GET, "/v1/schedules", None)
        .await
        .refused(
            StatusCode::CONFLICT,
            "FAILED_PRECONDITION",
            "serves no schedules",
        );
    let a = call(&app, Method::GET, "/v1/dashboard", None).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text);
    let v = a.json();
    assert!(
        v["schedules"]["error"]
            .as_str()
            .unwrap()
            .contains("serves no schedules"),
        "{v}"
    );
    assert_eq!(v["schedules"]["rows"], json!([]));
}
