//! SPEC §9 against real processes (issue 36): a nats-server, `cronoq
//! server` and `cronoq worker`s running a shell command. Preemption ends
//! the lower-priority command with SIGTERM (its trap writes
//! `sigterm.log`), the attempt ends `preempted` and does not count; each
//! concurrency policy, each through another submission path (the CLI's
//! flags, plain-publish headers, the JSON of `POST /v1/tasks`, the Rust
//! client's MessagePack); config errors are clear.
//!
//! No test sleeps to wait for something: every wait polls with a deadline.

mod procs;

use async_nats::HeaderMap;
use cronoq::core::{TaskId, TaskState};
use cronoq::{ConcurrencyPolicy, Task};
use procs::{describe, http_post, Cluster, SERVER_CONFIG};

/// [`SERVER_CONFIG`] with preemption on in pool `default`.
fn preempting_config() -> String {
    SERVER_CONFIG.replace(
        "backoff_max = \"1s\"",
        "backoff_max = \"1s\"\npreemption = \"priority\"\npreemption_grace = \"20s\"",
    )
}

fn lines(c: &Cluster, file: &str) -> Vec<String> {
    std::fs::read_to_string(c.dir.path().join(file))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

#[tokio::test]
async fn preemption_sends_sigterm_and_the_attempt_ends_preempted_uncounted() {
    let c = Cluster::start_configured(&preempting_config(), &[("w1", "", 1)]).await;
    // One attempt allowed: the preempted one must not use it up.
    let low = c
        .submit(Task::new("low hold=low-done trapterm").max_attempts(1))
        .await;
    c.running(low).await;
    // The command runs (its trap is set before it writes runs.log).
    procs::eventually("low's command to start", || async {
        let runs = c.run_names();
        if runs.contains(&"low".to_string()) {
            Ok(())
        } else {
            Err(format!("runs: {runs:?}"))
        }
    })
    .await;
    let high = c.submit(Task::new("high").priority(5)).await;
    c.succeeded(high).await;
    let seen = lines(&c, "sigterm.log");
    assert_eq!(
        seen,
        [format!("low {} 1 w1", low.0)],
        "the command saw SIGTERM"
    );
    // The preempted task waits again and runs its next attempt.
    c.task_until(low, "attempt 2 running", |s| {
        s.state == TaskState::Running && s.attempts.len() == 2
    })
    .await;
    c.release("low-done");
    let status = c.finished(low).await;
    assert_eq!(status.state, TaskState::Succeeded, "{}", describe(&status));
    let outcomes: Vec<_> = status
        .attempts
        .iter()
        .map(|a| a.outcome.as_deref())
        .collect();
    assert_eq!(outcomes, [Some("preempted"), Some("succeeded")]);
}

#[tokio::test]
async fn a_task_submitted_not_preemptible_is_never_preempted() {
    let c = Cluster::start_configured(&preempting_config(), &[("w1", "", 1)]).await;
    let out = c
        .cli(&[
            "submit",
            "--nats",
            &c.nats_url(),
            "--not-preemptible",
            "low hold=low-done trapterm",
        ])
        .await;
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let low = TaskId(out.stdout.trim().parse().expect("an id"));
    c.running(low).await;
    let high = c.submit(Task::new("high").priority(5)).await;
    c.waiting(high, "groups_full").await;
    c.release("low-done");
    c.succeeded(low).await;
    c.succeeded(high).await;
    assert!(lines(&c, "sigterm.log").is_empty());
}

#[tokio::test]
async fn each_concurrency_policy_through_another_submission_path() {
    let c = Cluster::start(&[("w1", "", 4)]).await;
    let url = c.nats_url();

    // queue, through the CLI's flags: the second waits (reason concurrency).
    let cli = |payload: &'static str| {
        let url = url.clone();
        let c = &c;
        async move {
            let out = c
                .cli(&[
                    "submit",
                    "--nats",
                    &url,
                    "--concurrency-key",
                    "q",
                    "--concurrency-limit",
                    "1",
                    "--concurrency-policy",
                    "queue",
                    payload,
                ])
                .await;
            assert_eq!(out.code, Some(0), "{}", out.stderr);
            TaskId(out.stdout.trim().parse().expect("an id"))
        }
    };
    let q1 = cli("q1 hold=q").await;
    c.running(q1).await;
    let q2 = cli("q2").await;
    c.waiting(q2, "concurrency").await;
    c.release("q");
    c.succeeded(q1).await;
    c.succeeded(q2).await;

    // skip, through plain-publish headers: the newcomer ends cancelled.
    let nats = async_nats::connect(&url).await.expect("nats");
    let js = async_nats::jetstream::new(nats);
    let publish = |payload: &'static str| {
        let js = js.clone();
        async move {
            let mut headers = HeaderMap::new();
            headers.insert("Cronoq-Concurrency-Key", "s");
            headers.insert("Cronoq-Concurrency-Policy", "skip");
            let ack = js
                .publish_with_headers("cronoq.submit.default", headers, payload.into())
                .await
                .expect("publish")
                .await
                .expect("puback");
            TaskId(ack.sequence)
        }
    };
    let s1 = publish("s1 hold=s").await;
    c.running(s1).await;
    let s2 = publish("s2").await;
    let skipped = c.finished(s2).await;
    assert_eq!(
        skipped.state,
        TaskState::Cancelled,
        "{}",
        describe(&skipped)
    );
    assert!(skipped.attempts.is_empty());
    c.release("s");
    c.succeeded(s1).await;

    // replace_waiting, through the JSON of POST /v1/tasks: the older
    // waiter is cancelled, the newer runs.
    let post = |payload: &'static str| {
        let http = c.server.http_url();
        async move {
            let body = serde_json::json!({
                "payload": payload,
                "concurrency_key": "r",
                "concurrency_policy": "replace_waiting",
            });
            let (status, answer) = http_post(&format!("{http}/v1/tasks"), &body.to_string()).await;
            assert_eq!(status, 200, "{answer}");
            let answer: serde_json::Value = serde_json::from_str(&answer).unwrap();
            TaskId(answer["id"].as_u64().expect("an id"))
        }
    };
    let r1 = post("r1 hold=r").await;
    c.running(r1).await;
    let r2 = post("r2").await;
    c.waiting(r2, "concurrency").await;
    let r3 = post("r3").await;
    assert_eq!(c.finished(r2).await.state, TaskState::Cancelled);
    c.release("r");
    c.succeeded(r1).await;
    c.succeeded(r3).await;

    // cancel_running, through the Rust client (MessagePack): the running
    // one is revoked and ends cancelled, the newcomer runs.
    let cancel = |payload: &'static str| {
        Task::new(payload)
            .concurrency_key("c")
            .concurrency_policy(ConcurrencyPolicy::CancelRunning)
    };
    let c1 = c.submit(cancel("c1 hold=never")).await;
    c.running(c1).await;
    let c2 = c.submit(cancel("c2")).await;
    let cancelled = c.finished(c1).await;
    assert_eq!(
        cancelled.state,
        TaskState::Cancelled,
        "{}",
        describe(&cancelled)
    );
    c.succeeded(c2).await;
    let names = c.run_names();
    assert!(!names.contains(&"s2".to_string()) && !names.contains(&"r2".to_string()));
}

#[tokio::test]
async fn bad_sharing_config_is_a_clear_error() {
    for (bad, want) in [
        ("preemption = \"always\"", "preemption"),
        (
            "[[pools.fairness]]\nkey = \"a\"\nweight = 0",
            "fairness_weight 0",
        ),
        (
            "[[pools.quotas]]\nkey = \"\"\nmax_running = 1",
            "fairness_key is empty",
        ),
    ] {
        let config = format!("[[pools]]\nname = \"default\"\n{bad}\n");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cronoq.toml");
        std::fs::write(&path, config).unwrap();
        let out = procs::run_cli(
            &[
                "server",
                "--config",
                path.to_str().unwrap(),
                "--check-config",
            ],
            None,
        )
        .await;
        let text = format!("{}{}", out.stdout, out.stderr);
        assert!(
            out.code == Some(2) && text.contains(want),
            "{bad}: exit {:?}: {text}",
            out.code
        );
    }
}
