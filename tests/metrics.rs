//! The task counters and latency histograms of `/metrics`: over the
//! embedded scheduler through the HTTP router (families, `_bucket{le=…}`,
//! `_sum`, `_count`, and a bounded scrape with 1,000 pools), and against a
//! real `cronoq server` with a worker (the counters move, the server's
//! election and journal figures are there).

mod procs;

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use bytes::Bytes;
use cronoq::metrics::{MAX_METRIC_POOLS, OTHER_POOL};
use cronoq::{Scheduler, Task, TaskContext, TaskError};
use http_body_util::BodyExt;
use tower::ServiceExt;

async fn scrape(app: &axum::Router) -> String {
    let response = app
        .clone()
        .oneshot(Request::get("/metrics").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

/// The value of the sample line that starts with `series ` (exactly).
fn value(text: &str, series: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map(str::to_string)
}

#[tokio::test]
async fn metrics_has_counters_and_histograms_over_the_embedded_scheduler() {
    let sched = Scheduler::new();
    sched.set_capacity("p", 1).unwrap();
    sched
        .executor("p", |ctx: TaskContext, payload: Bytes| async move {
            if &payload[..] == b"flaky" && ctx.attempt == 1 {
                return Err(TaskError::retryable("once"));
            }
            Ok(payload)
        })
        .unwrap();
    let ok = sched.submit(Task::new("ok").pool("p")).await.unwrap();
    assert!(ok.wait().await.unwrap().is_success());
    let flaky = Task::new("flaky").pool("p").max_attempts(2);
    let flaky = sched.submit(flaky).await.unwrap();
    assert!(flaky.wait().await.unwrap().is_success());
    let app = cronoq::http::router(Arc::new(sched));
    let text = scrape(&app).await;
    for (series, want) in [
        (r#"cronoq_tasks_submitted_total{pool="p"}"#, "2"),
        (r#"cronoq_attempts_started_total{pool="p"}"#, "3"),
        (r#"cronoq_attempts_retried_total{pool="p"}"#, "1"),
        (r#"cronoq_attempts_lost_total{pool="p"}"#, "0"),
        (r#"cronoq_tasks_dead_lettered_total{pool="p"}"#, "0"),
        (
            r#"cronoq_tasks_finished_total{pool="p",outcome="succeeded"}"#,
            "2",
        ),
        (
            r#"cronoq_tasks_finished_total{pool="p",outcome="failed"}"#,
            "0",
        ),
        (
            r#"cronoq_queue_wait_seconds_bucket{pool="p",le="+Inf"}"#,
            "2",
        ),
        (r#"cronoq_queue_wait_seconds_count{pool="p"}"#, "2"),
        (r#"cronoq_run_seconds_bucket{pool="p",le="+Inf"}"#, "3"),
        (r#"cronoq_run_seconds_count{pool="p"}"#, "3"),
    ] {
        assert_eq!(
            value(&text, series).as_deref(),
            Some(want),
            "{series}\n{text}"
        );
    }
    assert!(text.contains("# TYPE cronoq_run_seconds histogram"));
    assert!(text.contains("# TYPE cronoq_tasks_finished_total counter"));
    // Every bucket, in order, cumulative; the sum is in seconds.
    let les: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with(r#"cronoq_run_seconds_bucket{pool="p""#))
        .map(|l| l.split("le=\"").nth(1).unwrap().split('"').next().unwrap())
        .collect();
    assert_eq!(
        les,
        [
            "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "30", "60", "300", "900", "1800",
            "3600", "+Inf"
        ]
    );
    let sum: f64 = value(&text, r#"cronoq_run_seconds_sum{pool="p"}"#)
        .unwrap()
        .parse()
        .unwrap();
    assert!((0.0..1.0).contains(&sum), "{sum}");
    // Quick tasks: every attempt ran within the first bucket's second.
    assert_eq!(
        value(&text, r#"cronoq_run_seconds_bucket{pool="p",le="1"}"#).as_deref(),
        Some("3")
    );
}

#[tokio::test]
async fn metrics_stay_bounded_with_1000_pools() {
    let sched = Scheduler::new();
    for i in 0..1_000 {
        let pool = format!("pool{i}");
        sched.set_capacity(&pool, 1).unwrap();
        sched
            .executor(&pool, |_ctx: TaskContext, payload: Bytes| async move {
                Ok(payload)
            })
            .unwrap();
        sched
            .submit(Task::new("x").pool(&pool))
            .await
            .unwrap()
            .wait()
            .await
            .unwrap();
    }
    let app = cronoq::http::router(Arc::new(sched));
    let text = scrape(&app).await;
    let counted: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("cronoq_tasks_submitted_total{"))
        .collect();
    assert_eq!(counted.len(), MAX_METRIC_POOLS + 1);
    let other = format!(r#"cronoq_tasks_submitted_total{{pool="{OTHER_POOL}"}}"#);
    assert_eq!(
        value(&text, &other).as_deref(),
        Some(&*(1_000 - MAX_METRIC_POOLS).to_string())
    );
    let buckets = text
        .lines()
        .filter(|l| l.starts_with("cronoq_queue_wait_seconds_bucket{"))
        .count();
    assert_eq!(buckets, (MAX_METRIC_POOLS + 1) * 15);
}

#[tokio::test]
async fn the_counters_move_on_a_real_server() {
    let c = procs::Cluster::start(&[("w1", "", 2)]).await;
    let url = format!("{}/metrics", c.server.http_url());
    let ok = c.submit_payload("ok", "").await;
    c.task_until(ok, "succeeded", |s| s.state == cronoq::TaskState::Succeeded)
        .await;
    let failed = c.submit(Task::new("bad fail").max_attempts(2)).await;
    c.task_until(failed, "failed", |s| s.state == cronoq::TaskState::Failed)
        .await;
    let text = procs::eventually("the counters to move", || {
        let url = url.clone();
        async move {
            let (status, text) = procs::http_get(&url).await;
            let finished = |outcome: &str| {
                value(
                    &text,
                    &format!(
                        r#"cronoq_tasks_finished_total{{pool="default",outcome="{outcome}"}}"#
                    ),
                )
            };
            if status == 200
                && finished("succeeded").as_deref() == Some("1")
                && finished("failed").as_deref() == Some("1")
            {
                Ok(text)
            } else {
                Err(format!("{status}: {text}"))
            }
        }
    })
    .await;
    for (series, want) in [
        (r#"cronoq_tasks_submitted_total{pool="default"}"#, "2"),
        (r#"cronoq_attempts_started_total{pool="default"}"#, "3"),
        (r#"cronoq_attempts_retried_total{pool="default"}"#, "1"),
        (r#"cronoq_queue_wait_seconds_count{pool="default"}"#, "2"),
        (r#"cronoq_run_seconds_count{pool="default"}"#, "3"),
        ("cronoq_leader_takeovers_total", "1"),
    ] {
        assert_eq!(
            value(&text, series).as_deref(),
            Some(want),
            "{series}\n{text}"
        );
    }
    assert!(value(&text, "cronoq_journal_pending_records").is_some());
    assert!(text.contains("cronoq_leader_epoch{"));
}
