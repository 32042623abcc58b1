//! What people look at, in process: the dashboard page and its JSON view
//! (also for a big installation: 10,000 workers and 100,000 waiting
//! tasks), the recent-task list (`GET /v1/tasks`, `Api::recent_tasks`,
//! `HttpClient`), the W3C trace context through the embedded scheduler and
//! the HTTP API, and `cronoq snapshot --watch` / `submit --traceparent`
//! against a served router. The browser test of the page is
//! `tests/dashboard/` (run by `scripts/test`).

use std::future::pending;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use bytes::Bytes;
use cronoq::api::{Api, ApiFuture, Health};
use cronoq::client::HttpClient;
use cronoq::core::{
    ErrorCode, Labels, Millis, PoolName, Snapshot, TaskId, TaskState, WaitReason, WorkerInfo,
};
use cronoq::{Scheduler, Task, TaskContext, TaskError, TaskStatus};
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// Malformed trace contexts, each refused `INVALID_ARGUMENT` on every path.
const BAD_TRACEPARENTS: [&str; 9] = [
    "",
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
    "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
    "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
    "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
    "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
];

/// Pools `p` (echo, recording each attempt's context; 1 slot), `slow`
/// (never ends; 1 slot), `flaky` (always fails; 1 slot).
fn scheduler() -> (Scheduler, Arc<Mutex<Vec<TaskContext>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sched = Scheduler::new();
    sched.set_capacity("p", 1).unwrap();
    let record = seen.clone();
    sched
        .executor("p", move |ctx: TaskContext, payload: Bytes| {
            record.lock().unwrap().push(ctx);
            async move { Ok(payload) }
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
            Err::<Bytes, _>(TaskError::permanent("bad input"))
        })
        .unwrap();
    (sched, seen)
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

async fn call(app: &axum::Router, request: Request<Body>) -> Answer {
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
    call(app, Request::get(uri).body(Body::empty()).unwrap()).await
}

/// `POST /v1/tasks` with `body` and these `traceparent` headers.
async fn submit(app: &axum::Router, body: &str, traceparents: &[&str]) -> Answer {
    let mut request = Request::builder()
        .method(Method::POST)
        .uri("/v1/tasks")
        .header("content-type", "application/json");
    for tp in traceparents {
        request = request.header("traceparent", *tp);
    }
    call(app, request.body(Body::from(body.to_string())).unwrap()).await
}

/// Polls until `done` holds for the scheduler's status of `id`.
async fn until(sched: &Scheduler, id: TaskId, done: impl Fn(&TaskStatus) -> bool) -> TaskStatus {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(s) = sched.task(id).filter(|s| done(s)) {
            return s;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "task {id}: {:?}",
            sched.task(id)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn the_page_and_its_assets_are_compiled_in_and_load_nothing_from_elsewhere() {
    let (sched, _) = scheduler();
    let app = cronoq::http::router(Arc::new(sched));
    let page = get(&app, "/").await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(
        page.content_type.starts_with("text/html"),
        "{}",
        page.content_type
    );
    assert!(page.text.contains(r#"<script src="/dashboard/app.js">"#));
    assert!(page.text.contains(r#"href="/dashboard/app.css""#));
    for (path, kind) in [
        ("/dashboard/app.js", "text/javascript"),
        ("/dashboard/app.css", "text/css"),
    ] {
        let asset = get(&app, path).await;
        assert_eq!(asset.status, StatusCode::OK, "{path}");
        assert!(
            asset.content_type.starts_with(kind),
            "{path}: {}",
            asset.content_type
        );
        assert!(asset.text.len() > 1000, "{path} is the real asset");
    }
    // Offline: no asset names another host.
    for path in ["/", "/dashboard/app.js", "/dashboard/app.css"] {
        let text = get(&app, path).await.text;
        assert!(
            !text.contains("http://") && !text.contains("https://") && !text.contains("//cdn"),
            "{path} loads something from elsewhere"
        );
    }
    assert_eq!(
        get(&app, "/dashboard/nothing.js").await.status,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn recent_tasks_are_newest_first_with_attempts_and_outcomes_and_no_output() {
    let (sched, _) = scheduler();
    let app = cronoq::http::router(Arc::new(sched.clone()));
    let ok = sched
        .submit(Task::new("x".repeat(10_000)).pool("p"))
        .await
        .unwrap();
    let failed = sched.submit(Task::new("y").pool("flaky")).await.unwrap();
    let running = sched.submit(Task::new("z").pool("slow")).await.unwrap();
    let waiting = sched.submit(Task::new("w").pool("slow")).await.unwrap();
    let (ok, failed, running, waiting) = (ok.id(), failed.id(), running.id(), waiting.id());
    until(&sched, ok, |s| s.state == TaskState::Succeeded).await;
    until(&sched, failed, |s| s.state == TaskState::Failed).await;
    until(&sched, running, |s| s.state == TaskState::Running).await;

    let answer = get(&app, "/v1/tasks").await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text);
    let list: cronoq::wire::TaskList = serde_json::from_str(&answer.text).unwrap();
    let ids: Vec<TaskId> = list.tasks.iter().map(|t| t.id).collect();
    assert_eq!(ids, [waiting, running, failed, ok]);
    let by_id = |id| list.tasks.iter().find(|t| t.id == id).unwrap();
    assert_eq!(by_id(waiting).reason, Some(WaitReason::GroupsFull));
    assert_eq!(by_id(running).attempts.len(), 1);
    assert_eq!(by_id(failed).error.as_deref(), Some("bad input"));
    assert_eq!(by_id(failed).attempts[0].outcome.as_deref(), Some("failed"));
    let done = by_id(ok);
    assert_eq!(done.state, TaskState::Succeeded);
    assert_eq!(done.attempts[0].outcome.as_deref(), Some("succeeded"));
    assert!(
        done.output.is_none() && done.output_base64.is_none(),
        "lists leave outputs out"
    );
    // The task itself still has it.
    assert_eq!(sched.task(ok).unwrap().output.unwrap().len(), 10_000);

    let two = get(&app, "/v1/tasks?limit=2").await.json();
    assert_eq!(two["tasks"].as_array().unwrap().len(), 2);
    assert_eq!(two["tasks"][0]["id"], waiting.0);
    // The same through the trait and the HTTP client.
    let url = serve(Arc::new(sched.clone())).await;
    let client = HttpClient::new(&url).unwrap();
    assert_eq!(client.recent_tasks(4).await.unwrap(), list.tasks);
    let e = client.recent_tasks(0).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::INVALID_ARGUMENT);
    let e = Api::recent_tasks(&sched, 501).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::INVALID_ARGUMENT);
}

#[tokio::test]
async fn recent_tasks_read_only_the_newest_of_many() {
    let sched = Scheduler::builder().retain_finished(100).build().unwrap();
    sched.set_capacity("p", 1).unwrap();
    sched
        .executor("p", |_ctx: TaskContext, p: Bytes| async move { Ok(p) })
        .unwrap();
    let mut last = TaskId(0);
    for i in 0..300 {
        last = sched
            .submit(Task::new(format!("t{i}")).pool("p"))
            .await
            .unwrap()
            .id();
    }
    until(&sched, last, |s| s.state == TaskState::Succeeded).await;
    let tasks = sched.recent_tasks(50);
    let ids: Vec<u64> = tasks.iter().map(|t| t.id.0).collect();
    let want: Vec<u64> = (last.0 - 49..=last.0).rev().collect();
    assert_eq!(ids, want);
    // Only the retained finished tasks exist to list.
    assert_eq!(sched.recent_tasks(500).len(), 100);
}

/// The embedded scheduler with 10,000 remote-looking workers added to its
/// snapshot (the embedded scheduler has none of its own).
struct Big {
    sched: Scheduler,
    workers: Vec<WorkerInfo>,
}

impl Api for Big {
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
            let mut snap = self.sched.snapshot();
            snap.workers = self.workers.clone();
            Ok(snap)
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
async fn the_dashboard_view_of_10000_workers_and_100000_waiting_tasks_stays_small() {
    let (sched, _) = scheduler();
    sched
        .set_group_capacity("p", Labels::from([("gpu", "a100")]), 1)
        .unwrap();
    // 100,000 waiting: 50,000 for labels nobody has, 50,000 behind a busy
    // slot (in 200 label sets).
    sched.submit(Task::new("hold").pool("slow")).await.unwrap();
    for i in 0..100_000u32 {
        let task = if i % 2 == 0 {
            Task::new("").pool("p").label("gpu", "h100")
        } else {
            Task::new("")
                .pool("slow")
                .label("batch", format!("b{}", (i / 2) % 200))
        };
        sched.submit(task).await.unwrap();
    }
    let workers: Vec<WorkerInfo> = (0..10_000)
        .map(|i| WorkerInfo {
            id: format!("w{i:05}"),
            pool: PoolName::new(if i % 2 == 0 { "p" } else { "slow" }).unwrap(),
            labels: if i % 10 == 0 {
                Labels::from([("gpu", "a100")])
            } else {
                Labels::new()
            },
            slots: 4,
            busy: (i % 5) as u32,
            last_seen: Millis(1_800_000_000_000),
            draining: i % 1000 == 0,
        })
        .collect();
    let app = cronoq::http::router(Arc::new(Big { sched, workers }));

    let answer = get(&app, "/v1/dashboard").await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text);
    assert!(
        answer.text.len() < 100_000,
        "the view is {} bytes: it must not carry every worker or task",
        answer.text.len()
    );
    let view = answer.json();
    let w = &view["workers"];
    assert_eq!(w["total"], 10_000);
    assert_eq!(w["matching"], 10_000);
    assert_eq!(w["rows"].as_array().unwrap().len(), 50, "one page of rows");
    assert_eq!(w["draining"], 10);
    assert_eq!(w["full"], 2_000, "busy 4 of 4 slots");
    assert_eq!(w["slots"], 40_000);
    assert_eq!(view["tasks"].as_array().unwrap().len(), 25);
    let pools = view["pools"].as_array().unwrap();
    let p = pools.iter().find(|p| p["name"] == "p").unwrap();
    assert_eq!(p["waiting"], 50_000);
    assert_eq!(p["demand"][0]["labels"]["gpu"], "h100");
    assert_eq!(p["demand"][0]["reason"], "no_group_matches");
    let slow = pools.iter().find(|p| p["name"] == "slow").unwrap();
    assert_eq!(slow["waiting"], 50_000);
    assert_eq!(slow["demand"].as_array().unwrap().len(), 200);
    assert!(slow["demand"]
        .as_array()
        .unwrap()
        .iter()
        .all(|d| d["reason"] == "no_group_matches"));

    // A filter narrows, counts what matches, and pages by pool then id.
    let page = get(
        &app,
        "/v1/dashboard?filter=gpu%3Da100&workers=20&offset=100",
    )
    .await
    .json();
    let w = &page["workers"];
    assert_eq!(
        (w["total"].clone(), w["matching"].clone()),
        (10_000.into(), 1_000.into())
    );
    let rows = w["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 20);
    assert_eq!(
        rows[0]["id"], "w01000",
        "the 101st gpu worker (every tenth)"
    );
    assert!(rows.iter().all(|r| r["labels"]["gpu"] == "a100"));
    let none = get(&app, "/v1/dashboard?filter=nobody&workers=0")
        .await
        .json();
    assert_eq!(none["workers"]["matching"], 0);
    assert!(none["workers"]["rows"].as_array().unwrap().is_empty());
    let long = format!("/v1/dashboard?filter={}", "x".repeat(201));
    let refused = get(&app, &long).await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    assert_eq!(refused.json()["code"], "INVALID_ARGUMENT");
}

#[tokio::test]
async fn the_view_names_the_leader_health_and_why_demand_waits() {
    let (sched, _) = scheduler();
    let app = cronoq::http::router(Arc::new(sched.clone()));
    sched.submit(Task::new("a").pool("slow")).await.unwrap();
    sched.submit(Task::new("b").pool("slow")).await.unwrap();
    let view = get(&app, "/v1/dashboard?workers=5&tasks=1").await.json();
    assert!(view["leader"].is_null(), "embedded: no leader");
    assert_eq!(view["health"]["ready"], true);
    assert!(view["now"].as_u64().unwrap() > 1_700_000_000_000);
    let slow = view["pools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "slow")
        .unwrap();
    assert_eq!(slow["demand"][0]["reason"], "groups_full");
    assert_eq!(view["tasks"].as_array().unwrap().len(), 1);
    assert_eq!(view["tasks"][0]["id"], 2);
}

#[tokio::test]
async fn a_trace_context_reaches_the_executor_and_a_bad_one_submits_nothing() {
    let (sched, seen) = scheduler();
    let app = cronoq::http::router(Arc::new(sched.clone()));

    // Every bad value, on both paths, changes nothing.
    for bad in BAD_TRACEPARENTS {
        let e = sched
            .submit(Task::new("x").pool("p").traceparent(bad))
            .await
            .expect_err(bad);
        assert_eq!(e.code(), ErrorCode::INVALID_ARGUMENT, "{bad:?}: {e}");
        let answer = submit(&app, r#"{"pool":"p"}"#, &[bad]).await;
        assert_eq!(
            answer.status,
            StatusCode::BAD_REQUEST,
            "{bad:?}: {}",
            answer.text
        );
        assert_eq!(answer.json()["code"], "INVALID_ARGUMENT", "{bad:?}");
    }
    let twice = submit(&app, r#"{"pool":"p"}"#, &[TRACEPARENT, TRACEPARENT]).await;
    assert_eq!(twice.status, StatusCode::BAD_REQUEST, "{}", twice.text);
    let request = Request::post("/v1/tasks")
        .header("content-type", "application/json")
        .header("traceparent", &b"00-\xff"[..])
        .body(Body::from(r#"{"pool":"p"}"#))
        .unwrap();
    assert_eq!(call(&app, request).await.status, StatusCode::BAD_REQUEST);
    assert!(seen.lock().unwrap().is_empty());
    assert!(sched.recent_tasks(10).is_empty(), "nothing was submitted");

    // Builder, HTTP header, HTTP client: the executor sees it.
    let built = sched
        .submit(Task::new("a").pool("p").traceparent(TRACEPARENT))
        .await
        .unwrap();
    assert_eq!(built.id(), TaskId(1), "the refusals took no id");
    built.wait().await.unwrap();
    let answer = submit(&app, r#"{"pool":"p","payload":"b"}"#, &[TRACEPARENT]).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text);
    let id = TaskId(answer.json()["id"].as_u64().unwrap());
    until(&sched, id, |s| s.state == TaskState::Succeeded).await;
    let url = serve(Arc::new(sched.clone())).await;
    let client = HttpClient::new(&url).unwrap();
    let other = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";
    let id = client
        .submit(Task::new("c").pool("p").traceparent(other))
        .await
        .unwrap();
    client.wait(id).await.unwrap();
    let plain = sched.submit(Task::new("d").pool("p")).await.unwrap();
    plain.wait().await.unwrap();

    let seen: Vec<Option<String>> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|c| c.traceparent.clone())
        .collect();
    assert_eq!(
        seen,
        [
            Some(TRACEPARENT.to_string()),
            Some(TRACEPARENT.to_string()),
            Some(other.to_string()),
            None
        ]
    );
}

/// Serves the router over `api` on a free loopback port; its base URL.
async fn serve(api: Arc<dyn Api>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = cronoq::http::router(api);
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

async fn cli(args: &[&str]) -> std::process::Output {
    let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_cronoq"))
        .args(args)
        .env_remove("TRACEPARENT")
        .stdin(std::process::Stdio::null())
        .output();
    tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("the cli ends")
        .expect("the cli runs")
}

#[tokio::test]
async fn snapshot_watch_redraws_the_table_and_submit_checks_the_trace_context() {
    let (sched, seen) = scheduler();
    let url = serve(Arc::new(sched.clone())).await;

    let out = cli(&["snapshot", "--http", &url, "--watch", "--watch-count", "2"]).await;
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    // Not a terminal: no escape codes, tables one after another.
    assert_eq!(stdout.matches("--- ").count(), 2, "{stdout}");
    assert_eq!(stdout.matches("pool slow").count(), 2, "{stdout}");
    assert!(!stdout.contains('\x1b'), "{stdout:?}");
    let out = cli(&["snapshot", "--http", &url, "--watch", "--json"]).await;
    assert_eq!(out.status.code(), Some(2), "--watch and --json conflict");
    let out = cli(&["snapshot", "--http", &url, "--watch", "--watch-count", "0"]).await;
    assert_eq!(out.status.code(), Some(2), "a count of 0 is refused");

    for bad in BAD_TRACEPARENTS {
        let out = cli(&[
            "submit",
            "--http",
            &url,
            "--pool",
            "p",
            "--traceparent",
            bad,
            "x",
        ])
        .await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {stderr}");
        assert!(stderr.contains("[INVALID_ARGUMENT]"), "{bad:?}: {stderr}");
    }
    assert!(sched.recent_tasks(10).is_empty(), "nothing was submitted");
    let out = cli(&[
        "submit",
        "--http",
        &url,
        "--pool",
        "p",
        "--traceparent",
        TRACEPARENT,
        "--wait",
        "x",
    ])
    .await;
    assert!(out.status.success(), "{out:?}");
    // stderr is not a terminal: just the id, no progress lines.
    assert_eq!(String::from_utf8_lossy(&out.stderr), "task 1\n");
    assert_eq!(
        seen.lock().unwrap()[0].traceparent.as_deref(),
        Some(TRACEPARENT)
    );
}
