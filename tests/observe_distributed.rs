//! Trace context and the task list in distributed mode, with real
//! processes: a `nats-server`, `cronoq server`s and a `cronoq worker …
//! -- sh -c 'printf %s "$TRACEPARENT"'`. A `traceparent` given to the Rust
//! client, the CLI or a plain NATS publish reaches the worker's command
//! and its log; a malformed one is refused `INVALID_ARGUMENT` (by the
//! client before anything is published; by the server, recorded failed
//! and never run, for a plain publish). The task list answers over NATS
//! and through a follower's HTTP API.

mod procs;

use std::time::Duration;

use async_nats::jetstream;
use async_nats::HeaderMap;
use cronoq::client::{ClientOptions, HttpClient};
use cronoq::core::{ErrorCode, TaskId, TaskState};
use cronoq::Task;
use procs::{command, cronoq_binary, describe, run_cli, CronoqServer, NatsServer, Proc};

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

const BAD: [&str; 4] = [
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
    "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
    "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
    "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
];

#[tokio::test]
async fn a_traceparent_reaches_the_workers_command_from_every_submit_path() {
    let dir = tempfile::tempdir().unwrap();
    let nats = NatsServer::start();
    let server = CronoqServer::start(&nats, dir.path()).await;
    let worker_log = dir.path().join("worker.log");
    let mut cmd = command(cronoq_binary());
    cmd.args([
        "worker",
        "--nats",
        &nats.url(),
        "--pool",
        "default",
        "--id",
        "tracer",
    ])
    .args(["--", "sh", "-c", r#"printf '[%s]' "${TRACEPARENT-unset}""#])
    .env("CRONOQ_LOG", "info,async_nats=warn")
    // The worker's own environment does not leak into a task without one.
    .env(
        "TRACEPARENT",
        "00-11111111111111111111111111111111-2222222222222222-01",
    );
    let _worker = Proc::spawn("cronoq worker tracer", cmd, &worker_log);
    let client = ClientOptions::new()
        .request_timeout(Duration::from_secs(2))
        .wait_poll_interval(Duration::from_millis(200))
        .connect(&nats.url())
        .await
        .unwrap();
    let js = jetstream::new(async_nats::connect(nats.url()).await.unwrap());

    // Refused before anything is published: the Rust client and the CLI.
    for bad in BAD {
        let e = client
            .submit(Task::new("x").traceparent(bad))
            .await
            .expect_err(bad);
        assert_eq!(e.code(), ErrorCode::INVALID_ARGUMENT, "{bad}: {e}");
        let out = run_cli(
            &["submit", "--nats", &nats.url(), "--traceparent", bad, "x"],
            None,
        )
        .await;
        assert_eq!(out.code, Some(2), "{bad}: {out:?}");
        assert!(out.stderr.contains("[INVALID_ARGUMENT]"), "{bad}: {out:?}");
    }
    let mut stream = js.get_stream("CRONOQ_SUBMIT").await.unwrap();
    let state = stream.info().await.unwrap().state.clone();
    assert_eq!(state.last_sequence, 0, "nothing was published: {state:?}");

    // The Rust client (MessagePack `Submit`).
    let id = client
        .submit(Task::new("a").traceparent(TRACEPARENT))
        .await
        .unwrap();
    let done = client.wait(id).await.unwrap();
    assert_eq!(done.state, TaskState::Succeeded, "{}", describe(&done));
    assert_eq!(
        done.output.as_deref(),
        Some(format!("[{TRACEPARENT}]").as_str())
    );

    // The CLI, over NATS and over the HTTP API.
    let other = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";
    for connect in [["--nats", &nats.url()], ["--http", &server.http_url()]] {
        let out = run_cli(
            &[
                "submit",
                connect[0],
                connect[1],
                "--traceparent",
                other,
                "--wait",
                "b",
            ],
            None,
        )
        .await;
        assert_eq!(out.code, Some(0), "{out:?}");
        assert_eq!(out.stdout, format!("[{other}]"));
    }

    // A plain publish with the `traceparent` header.
    let mut headers = HeaderMap::new();
    headers.insert("traceparent", TRACEPARENT);
    let ack = js
        .publish_with_headers("cronoq.submit.default", headers, "c".into())
        .await
        .unwrap()
        .await
        .unwrap();
    let done = client.wait(TaskId(ack.sequence)).await.unwrap();
    assert_eq!(
        done.output.as_deref(),
        Some(format!("[{TRACEPARENT}]").as_str())
    );

    // A plain publish with a bad one: recorded failed, never run.
    let mut headers = HeaderMap::new();
    headers.insert("traceparent", BAD[1]);
    let ack = js
        .publish_with_headers("cronoq.submit.default", headers, "d".into())
        .await
        .unwrap()
        .await
        .unwrap();
    let refused = client.wait(TaskId(ack.sequence)).await.unwrap();
    assert_eq!(refused.state, TaskState::Failed, "{}", describe(&refused));
    assert!(refused.attempts.is_empty(), "{}", describe(&refused));
    let error = refused.error.unwrap_or_default();
    assert!(
        error.contains("submission refused") && error.contains("[INVALID_ARGUMENT]"),
        "{error}"
    );

    // Without one, the command sees none (not the worker's own).
    let id = client.submit(Task::new("e")).await.unwrap();
    let done = client.wait(id).await.unwrap();
    assert_eq!(done.output.as_deref(), Some("[unset]"));

    // The worker logs it with the attempt.
    let log = std::fs::read_to_string(&worker_log).unwrap();
    assert!(
        log.lines()
            .any(|l| l.contains("attempt started") && l.contains(TRACEPARENT)),
        "{log}"
    );
}

#[tokio::test]
async fn the_task_list_answers_over_nats_and_through_a_follower() {
    let dir = tempfile::tempdir().unwrap();
    let nats = NatsServer::start();
    let leader = CronoqServer::start(&nats, dir.path()).await;
    let follower = CronoqServer::start_follower(&nats, dir.path()).await;
    let client = ClientOptions::new()
        .request_timeout(Duration::from_secs(2))
        .connect(&nats.url())
        .await
        .unwrap();
    // No worker: they wait, for labels nobody has.
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(
            client
                .submit(Task::new(format!("t{i}")).label("gpu", "h100"))
                .await
                .unwrap(),
        );
    }
    ids.reverse();
    let listed = procs::eventually("the leader to list the three tasks", || async {
        let tasks = client.recent_tasks(10).await.map_err(|e| e.to_string())?;
        let got: Vec<TaskId> = tasks.iter().map(|t| t.id).collect();
        if got == ids {
            Ok(tasks)
        } else {
            Err(format!("{got:?}"))
        }
    })
    .await;
    assert!(listed.iter().all(|t| t.state == TaskState::Queued
        && t.reason.is_some_and(|r| r.as_str() == "no_group_matches")));
    let e = client.recent_tasks(0).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::INVALID_ARGUMENT);

    // Through either server's HTTP API (the follower asks the leader), and
    // the dashboard view names the leader.
    for url in [leader.http_url(), follower.http_url()] {
        let http = HttpClient::new(&url).unwrap();
        // Both serve the API's document (issue 37): the one the library
        // generates, whichever role.
        let (status, text) = procs::http_get(&format!("{url}/v1/openapi.json")).await;
        assert_eq!(status, 200, "{text}");
        let served: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(served, cronoq::http::openapi_document());
        let tasks = http.recent_tasks(2).await.unwrap();
        assert_eq!(tasks.iter().map(|t| t.id).collect::<Vec<_>>(), ids[..2]);
        let view = run_cli(
            &["snapshot", "--http", &url, "--watch", "--watch-count", "1"],
            None,
        )
        .await;
        assert_eq!(view.code, Some(0), "{view:?}");
        assert!(
            view.stdout.contains(&format!("leader {}", leader.id())),
            "{view:?}"
        );
    }
}
