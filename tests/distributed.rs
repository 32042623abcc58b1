//! Distributed mode end to end, with real processes only: a `nats-server`
//! with JetStream, a `cronoq server` and `cronoq worker … -- sh -c …`
//! processes (see `procs`), driven through the Rust client, the `cronoq`
//! CLI and plain NATS publishes. Covers placement across workers (SPEC §2
//! rules 1–3, 5, 6, 8), cancel (rule 9), worker death and drain, the CLI's
//! exit codes, plain-publish submissions and their de-duplication, and
//! NATS going away mid-run (a clean restart and a `kill -9`), and `cronoq
//! dev` (the README's first command) end to end.
//!
//! No test sleeps to wait for something: every wait polls with a deadline
//! (`procs::eventually`), and a command that must stay busy holds its slot
//! until the test releases it (`procs::hold`, `Cluster::release`).

mod procs;

use std::collections::BTreeMap;

use async_nats::jetstream;
use async_nats::HeaderMap;
use cronoq::core::{ErrorCode, Labels, TaskId, TaskState};
use cronoq::Task;
use procs::{describe, eventually, hold, run_cli, Cluster, CronoqDev};

fn labels(text: &str) -> Labels {
    Labels::parse(text).expect("valid labels")
}

/// The worker that ran the task's attempt `n` (1-based).
fn worker_of(status: &cronoq::TaskStatus, n: usize) -> String {
    status.attempts[n - 1]
        .worker
        .clone()
        .unwrap_or_else(|| panic!("attempt {n} has no worker: {}", describe(status)))
}

/// The id in the `task N` line that `submit --wait` prints on stderr.
fn task_id_in(stderr: &str) -> TaskId {
    stderr
        .lines()
        .find_map(|l| {
            l.strip_prefix("task ")?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .map(TaskId)
        .unwrap_or_else(|| panic!("no `task N` line in stderr: {stderr:?}"))
}

#[tokio::test]
async fn unlabeled_tasks_prefer_the_unlabeled_worker_and_labeled_ones_run_only_where_labels_are() {
    let c = Cluster::start(&[("cpu", "", 1), ("gpu", "gpu=a100,zone=eu", 1)]).await;

    // Both free: an unlabeled task goes to the least specialized group,
    // every time, so the gpu worker stays free for gpu work.
    for i in 0..3 {
        let id = c.submit_payload(&format!("plain{i}"), "").await;
        assert_eq!(c.succeeded(id).await, format!("plain{i} on [] by cpu"));
    }

    // A labeled task runs where its labels are; the worker may carry more.
    let train = c.submit_payload("train", "gpu=a100").await;
    assert_eq!(
        c.succeeded(train).await,
        "train on [gpu=a100,zone=eu] by gpu"
    );
    let status = c.status(train).await;
    assert_eq!(status.attempts.len(), 1, "{}", describe(&status));
    assert_eq!(status.attempts[0].group, labels("gpu=a100,zone=eu"));
    assert_eq!(worker_of(&status, 1), "gpu");

    // With the unlabeled worker busy, an unlabeled task may use the gpu
    // worker's free slot (it matches every group).
    let long = c.submit_payload(&hold("long", "go"), "").await;
    assert_eq!(worker_of(&c.running(long).await, 1), "cpu");
    let spill = c.submit_payload("spill", "").await;
    assert_eq!(
        c.succeeded(spill).await,
        "spill on [gpu=a100,zone=eu] by gpu"
    );
    c.release("go");
    assert_eq!(c.succeeded(long).await, "long on [] by cpu");
}

#[tokio::test]
async fn a_waiting_task_never_blocks_the_pool() {
    let c = Cluster::start(&[("cpu", "", 1), ("gpu", "gpu=a100", 1)]).await;
    let first = c.submit_payload(&hold("gpu1", "go"), "gpu=a100").await;
    assert_eq!(worker_of(&c.running(first).await, 1), "gpu");

    // The only a100 slot is busy: the next a100 task waits…
    let second = c.submit_payload("gpu2", "gpu=a100").await;
    c.waiting(second, "groups_full").await;

    // …without holding anything: later unlabeled tasks run meanwhile.
    for i in 0..3 {
        let id = c.submit_payload(&format!("cpu{i}"), "").await;
        assert_eq!(c.succeeded(id).await, format!("cpu{i} on [] by cpu"));
    }

    // The free unlabeled slot never tempted the a100 task.
    let status = c.status(second).await;
    assert_eq!(status.state, TaskState::Queued, "{}", describe(&status));
    assert!(status.attempts.is_empty(), "{}", describe(&status));
    let snap = c.client.snapshot().await.expect("snapshot");
    let pool = &snap.pools[0];
    assert_eq!(pool.waiting, 1, "{}", snap.to_table());
    assert!(
        pool.demand
            .iter()
            .any(|d| d.labels == labels("gpu=a100") && d.waiting == 1),
        "{}",
        snap.to_table()
    );

    c.release("go");
    assert_eq!(c.succeeded(first).await, "gpu1 on [gpu=a100] by gpu");
    assert_eq!(c.succeeded(second).await, "gpu2 on [gpu=a100] by gpu");
}

#[tokio::test]
async fn a_task_for_labels_nobody_has_waits_until_a_matching_worker_connects() {
    let mut c = Cluster::start(&[("cpu", "", 1)]).await;
    let render = c.submit_payload("render", "gpu=h100").await;
    c.waiting(render, "no_group_matches").await;

    // `cronoq task` says why it waits.
    let url = c.nats_url();
    let id = render.to_string();
    let text = c.cli(&["task", "--nats", &url, &id]).await;
    assert_eq!(text.code, Some(0), "{text:?}");
    assert!(
        text.stdout.contains("state queued (no_group_matches)"),
        "{text:?}"
    );
    let json = c.cli(&["task", "--nats", &url, "--json", &id]).await;
    assert_eq!(json.code, Some(0), "{json:?}");
    let value: serde_json::Value = serde_json::from_str(&json.stdout).expect("task json");
    assert_eq!(value["state"], "queued", "{value}");
    assert_eq!(value["reason"], "no_group_matches", "{value}");

    // Other work flows past it, and it shows as demand for its labels.
    let other = c.submit_payload("other", "").await;
    assert_eq!(c.succeeded(other).await, "other on [] by cpu");
    c.snapshot_until("h100 demand in the snapshot", |s| {
        s.pools[0]
            .demand
            .iter()
            .any(|d| d.labels == labels("gpu=h100") && d.waiting == 1)
    })
    .await;
    assert_eq!(
        c.status(render).await.state,
        TaskState::Queued,
        "never dropped"
    );

    // A matching worker connects: it runs there.
    c.add_worker("h100", "gpu=h100", 1).await;
    assert_eq!(c.succeeded(render).await, "render on [gpu=h100] by h100");
}

#[tokio::test]
async fn waiters_start_in_submission_order() {
    let c = Cluster::start(&[("solo", "", 1)]).await;
    let blocker = c.submit_payload(&hold("blocker", "go"), "").await;
    c.running(blocker).await;

    let mut waiters = Vec::new();
    for i in 1..=5 {
        waiters.push(c.submit_payload(&format!("w{i}"), "").await);
    }
    for &id in &waiters {
        c.waiting(id, "groups_full").await;
    }

    c.release("go");
    c.succeeded(blocker).await;
    let mut started = Vec::new();
    for (i, &id) in waiters.iter().enumerate() {
        assert_eq!(c.succeeded(id).await, format!("w{} on [] by solo", i + 1));
        started.push(c.status(id).await.attempts[0].started_at);
    }
    assert_eq!(
        c.run_names(),
        ["blocker", "w1", "w2", "w3", "w4", "w5"],
        "commands ran out of submission order"
    );
    assert!(
        started.windows(2).all(|w| w[0] <= w[1]),
        "attempts started out of order: {started:?}"
    );
}

#[tokio::test]
async fn a_worker_killed_mid_task_is_replaced_by_another_matching_worker() {
    let mut c = Cluster::start(&[
        ("cpu", "", 1),
        ("gpu-a", "gpu=a100", 1),
        ("gpu-b", "gpu=a100", 1),
    ])
    .await;
    let victim = c.submit_payload(&hold("victim", "go"), "gpu=a100").await;
    let first = worker_of(&c.running(victim).await, 1);
    assert!(first.starts_with("gpu-"), "ran on {first}");
    let other = if first == "gpu-a" { "gpu-b" } else { "gpu-a" };
    // Mid-task: the command has started.
    eventually("the command to start", || async {
        let runs = c.runs();
        if runs.iter().any(|r| r.name == "victim" && r.worker == first) {
            Ok(())
        } else {
            Err(format!("{runs:?}"))
        }
    })
    .await;

    c.kill_worker(&first);

    // Attempt 1 is lost; attempt 2 runs on the other a100 worker (never on
    // the free unlabeled one).
    let status = c
        .task_until(victim, "attempt 2 running", |s| {
            s.state == TaskState::Running && s.attempts.len() == 2
        })
        .await;
    assert_eq!(status.attempts[0].outcome.as_deref(), Some("lost"));
    assert_eq!(worker_of(&status, 1), first);
    assert_eq!(status.attempts[1].attempt, 2);
    assert_eq!(worker_of(&status, 2), other);
    assert_eq!(status.attempts[1].group, labels("gpu=a100"));

    // The dead worker's slot has left the snapshot.
    let snap = c
        .snapshot_until("the dead worker to leave the snapshot", |s| {
            !s.workers.iter().any(|w| w.id == first)
        })
        .await;
    let group = snap.pools[0]
        .groups
        .iter()
        .find(|g| g.labels == labels("gpu=a100"))
        .expect("the a100 group");
    assert_eq!(
        (group.capacity, group.busy, group.workers),
        (1, 1, 1),
        "{}",
        snap.to_table()
    );
    assert_eq!(snap.pools[0].capacity, 2, "{}", snap.to_table());

    c.release("go");
    assert_eq!(
        c.succeeded(victim).await,
        format!("victim on [gpu=a100] by {other}")
    );
    let status = c.status(victim).await;
    let outcomes: Vec<_> = status
        .attempts
        .iter()
        .map(|a| {
            (
                a.attempt,
                a.worker.clone().unwrap(),
                a.outcome.clone().unwrap().into_owned(),
            )
        })
        .collect();
    assert_eq!(
        outcomes,
        [
            (1, first.clone(), "lost".to_string()),
            (2, other.to_string(), "succeeded".to_string())
        ]
    );
}

#[tokio::test]
async fn a_draining_worker_finishes_its_attempt_without_blocking_its_group() {
    let mut c = Cluster::start(&[("w1", "", 1), ("w2", "", 1)]).await;
    let long = c.submit_payload(&hold("long", "go"), "").await;
    let draining = worker_of(&c.running(long).await, 1);
    let other = if draining == "w1" { "w2" } else { "w1" };
    eventually("the command to start", || async {
        let runs = c.runs();
        if runs.iter().any(|r| r.name == "long") {
            Ok(())
        } else {
            Err(format!("{runs:?}"))
        }
    })
    .await;

    // SIGTERM: the worker drains. Its slot is no longer offered…
    c.workers.get_mut(&draining).expect("worker").terminate();
    c.snapshot_until("the worker to drain", |s| {
        s.workers.iter().any(|w| w.id == draining && w.slots == 0)
    })
    .await;
    // …but the other worker of the group still takes new work.
    let next = c.submit_payload("next", "").await;
    assert_eq!(c.succeeded(next).await, format!("next on [] by {other}"));

    // The attempt it was running finishes there, and then it leaves.
    c.release("go");
    assert_eq!(c.succeeded(long).await, format!("long on [] by {draining}"));
    let status = c.status(long).await;
    assert_eq!(status.attempts.len(), 1, "{}", describe(&status));
    let exit = eventually("the drained worker to exit", || {
        let exit = c.workers.get_mut(&draining).expect("worker").exited();
        async move { exit.ok_or_else(|| "still running".to_string()) }
    })
    .await;
    assert!(exit.success(), "{exit:?}");
    let snap = c
        .snapshot_until("the drained worker to leave the snapshot", |s| {
            !s.workers.iter().any(|w| w.id == draining)
        })
        .await;
    assert_eq!(snap.pools[0].capacity, 1, "{}", snap.to_table());
}

#[tokio::test]
async fn cancel_drops_a_waiting_task_and_stops_a_running_one() {
    let c = Cluster::start(&[("w1", "", 1)]).await;
    let url = c.nats_url();
    let long = c.submit_payload(&hold("long", "never"), "").await;
    c.running(long).await;
    let queued = c.submit_payload("queued", "").await;
    c.waiting(queued, "groups_full").await;

    let out = c
        .cli(&["cancel", "--nats", &url, &queued.to_string()])
        .await;
    assert_eq!(out.code, Some(0), "{out:?}");
    let status = c.finished(queued).await;
    assert_eq!(status.state, TaskState::Cancelled, "{}", describe(&status));
    assert!(status.attempts.is_empty(), "{}", describe(&status));

    let out = c.cli(&["cancel", "--nats", &url, &long.to_string()]).await;
    assert_eq!(out.code, Some(0), "{out:?}");
    let status = c.finished(long).await;
    assert_eq!(status.state, TaskState::Cancelled, "{}", describe(&status));
    assert_eq!(status.attempts.len(), 1, "{}", describe(&status));
    assert_eq!(
        status.attempts[0].outcome.as_deref(),
        Some("cancelled"),
        "the revoked attempt ends with the task: {}",
        describe(&status)
    );
    assert!(
        status.attempts[0].ended_at.is_some(),
        "{}",
        describe(&status)
    );

    // The slot comes back once the worker has stopped the command.
    let next = c.submit_payload("next", "").await;
    assert_eq!(c.succeeded(next).await, "next on [] by w1");
    assert_eq!(c.run_names(), ["long", "next"]);

    let again = c.cli(&["cancel", "--nats", &url, &long.to_string()]).await;
    assert_eq!(again.code, Some(2), "{again:?}");
    assert!(again.stderr.contains("[FAILED_PRECONDITION]"), "{again:?}");
}

#[tokio::test]
async fn cli_submit_wait_prints_the_output_and_exits_with_the_outcome() {
    let c = Cluster::start(&[("cpu", "", 1)]).await;
    let url = c.nats_url();

    // With --wait, stdout is the output alone; the id goes to stderr.
    let ok = c.cli(&["submit", "--nats", &url, "--wait", "hello"]).await;
    assert_eq!(ok.code, Some(0), "{ok:?}");
    assert_eq!(ok.stdout, "hello on [] by cpu", "{ok:?}");
    let id = task_id_in(&ok.stderr);
    assert_eq!(c.status(id).await.state, TaskState::Succeeded);

    // The payload may come from stdin.
    let piped = run_cli(&["submit", "--nats", &url, "--wait", "-"], Some("piped")).await;
    assert_eq!(piped.code, Some(0), "{piped:?}");
    assert_eq!(piped.stdout, "piped on [] by cpu", "{piped:?}");

    let failed = c
        .cli(&[
            "submit",
            "--nats",
            &url,
            "--max-attempts",
            "1",
            "--wait",
            "boom fail",
        ])
        .await;
    assert_eq!(failed.code, Some(1), "{failed:?}");
    assert!(
        failed.stderr.contains("failed") && failed.stderr.contains("boom failed on purpose"),
        "{failed:?}"
    );
    assert!(failed.stdout.is_empty(), "{failed:?}");
    let status = c.status(task_id_in(&failed.stderr)).await;
    assert_eq!(status.state, TaskState::Failed, "{}", describe(&status));
    assert_eq!(status.attempts.len(), 1, "{}", describe(&status));
    let boom_runs = c.runs().into_iter().filter(|r| r.name == "boom").count();
    assert_eq!(boom_runs, 1, "max attempts 1 means one run");
}

#[tokio::test]
async fn a_plain_nats_publish_with_headers_runs_with_those_options() {
    let c = Cluster::start(&[("cpu", "", 1), ("gpu", "gpu=a100", 1)]).await;
    let nats = async_nats::connect(c.nats_url()).await.expect("nats");
    let js = jetstream::new(nats.clone());
    let subject = "cronoq.submit.default";

    // Hold the only a100 slot and queue a priority-0 a100 task behind it.
    let blocker = c.submit_payload(&hold("blocker", "go"), "gpu=a100").await;
    c.running(blocker).await;
    let normal = c.submit_payload("normal", "gpu=a100").await;
    c.waiting(normal, "groups_full").await;

    // Raw body = payload; options in headers; the PubAck names the task.
    let mut headers = HeaderMap::new();
    headers.insert("Cronoq-Labels", "gpu=a100");
    headers.insert("Cronoq-Priority", "5");
    let ack = js
        .publish_with_headers(subject, headers, "urgent".into())
        .await
        .expect("publish")
        .await
        .expect("puback");
    let urgent = TaskId(ack.sequence);
    c.waiting(urgent, "groups_full").await;

    c.release("go");
    assert_eq!(c.succeeded(urgent).await, "urgent on [gpu=a100] by gpu");
    assert_eq!(c.succeeded(normal).await, "normal on [gpu=a100] by gpu");
    assert_eq!(
        c.run_names(),
        ["blocker", "urgent", "normal"],
        "priority 5 goes before priority 0"
    );

    // A core NATS publish (no ack) is captured by the stream as well.
    let mut headers = HeaderMap::new();
    headers.insert("Cronoq-Labels", "gpu=a100");
    nats.publish_with_headers(subject, headers, "fire".into())
        .await
        .expect("publish");
    nats.flush().await.expect("flush");
    let fire = eventually("the plain publish to run", || async {
        let runs = c.runs();
        runs.iter()
            .find(|r| r.name == "fire")
            .map(|r| TaskId(r.task))
            .ok_or_else(|| format!("{runs:?}"))
    })
    .await;
    assert_eq!(c.succeeded(fire).await, "fire on [gpu=a100] by gpu");

    // A bad header: the stream accepts anything, the server refuses it and
    // nothing runs.
    let mut headers = HeaderMap::new();
    headers.insert("Cronoq-Priority", "high");
    let ack = js
        .publish_with_headers(subject, headers, "typo".into())
        .await
        .expect("publish")
        .await
        .expect("puback");
    let typo = c.finished(TaskId(ack.sequence)).await;
    assert_eq!(typo.state, TaskState::Failed, "{}", describe(&typo));
    assert!(
        typo.error
            .as_deref()
            .is_some_and(|e| e.contains("submission refused") && e.contains("Cronoq-Priority")),
        "{}",
        describe(&typo)
    );
    assert!(typo.attempts.is_empty(), "{}", describe(&typo));
    assert!(!c.run_names().contains(&"typo".to_string()));
}

#[tokio::test]
async fn a_duplicate_nats_msg_id_is_accepted_once() {
    let c = Cluster::start(&[("cpu", "", 1)]).await;
    let js = jetstream::new(async_nats::connect(c.nats_url()).await.expect("nats"));
    let publish = |key: &'static str, payload: &'static str| {
        let js = js.clone();
        async move {
            let mut headers = HeaderMap::new();
            headers.insert("Nats-Msg-Id", key);
            js.publish_with_headers("cronoq.submit.default", headers, payload.into())
                .await
                .expect("publish")
                .await
                .expect("puback")
        }
    };

    let first = publish("job-42", "once").await;
    let second = publish("job-42", "once").await;
    assert!(!first.duplicate);
    assert!(second.duplicate, "{second:?}");
    assert_eq!(first.sequence, second.sequence, "same stream sequence");
    let once = TaskId(first.sequence);
    assert_eq!(c.succeeded(once).await, "once on [] by cpu");

    // The client's idempotency key is the same mechanism.
    let a = c.submit(Task::new("keyed").idempotency_key("key-7")).await;
    let b = c.submit(Task::new("keyed").idempotency_key("key-7")).await;
    assert_eq!(a, b);
    assert_eq!(c.succeeded(a).await, "keyed on [] by cpu");

    // Within the duplicate window, even a finished task is not run again.
    let again = publish("job-42", "once").await;
    assert!(again.duplicate, "{again:?}");
    assert_eq!(again.sequence, once.0);
    assert_eq!(c.status(once).await.state, TaskState::Succeeded);

    // Anything run twice would have run before this (one slot, in order).
    let sentinel = c.submit_payload("sentinel", "").await;
    c.succeeded(sentinel).await;
    assert_eq!(c.run_names(), ["once", "keyed", "sentinel"]);
}

#[tokio::test]
async fn a_nats_restart_mid_run_loses_no_accepted_task() {
    nats_goes_away_mid_run(procs::NatsServer::restart).await;
}

#[tokio::test]
async fn a_nats_crash_mid_run_loses_no_accepted_task() {
    nats_goes_away_mid_run(procs::NatsServer::crash_and_restart).await;
}

/// Tasks running, waiting and just accepted when NATS goes away (`stop`
/// brings it back on the same port and store): each succeeds exactly once,
/// and submissions work again afterwards.
async fn nats_goes_away_mid_run(stop: fn(&mut procs::NatsServer)) {
    let mut c = Cluster::start(&[("w1", "", 2)]).await;
    let mut ids = Vec::new();
    for i in 0..4 {
        ids.push(c.submit_payload(&hold(&format!("r{i}"), "go"), "").await);
    }
    // Two run, two wait.
    c.snapshot_until("2 busy and 2 waiting", |s| {
        s.pools
            .first()
            .is_some_and(|p| p.busy == 2 && p.waiting == 2)
    })
    .await;
    // Accepted (acknowledged by JetStream), perhaps not seen by the leader.
    for i in 0..3 {
        ids.push(
            c.submit_payload(&hold(&format!("fresh{i}"), "go"), "")
                .await,
        );
    }

    stop(&mut c.nats);

    // Submissions work again once the client has reconnected. A retry
    // after a lost acknowledgement must not make a second task: hence the
    // idempotency key.
    for i in 0..2 {
        let task = Task::new(format!("after{i}")).idempotency_key(format!("after{i}"));
        let id = eventually("a submission after the restart", || async {
            c.client
                .submit(task.clone())
                .await
                .map_err(|e| e.to_string())
        })
        .await;
        ids.push(id);
    }
    c.release("go");

    let mut succeeded_attempts = BTreeMap::new();
    for &id in &ids {
        c.succeeded(id).await;
        let status = c.status(id).await;
        let ok = status
            .attempts
            .iter()
            .filter(|a| a.outcome.as_deref() == Some("succeeded"))
            .count();
        succeeded_attempts.insert(id.0, ok);
    }
    assert!(
        succeeded_attempts.values().all(|&n| n == 1),
        "each task succeeds exactly once: {succeeded_attempts:?}"
    );
    let runs = c.runs();
    let mut names: Vec<String> = runs.iter().map(|r| r.name.clone()).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), ids.len(), "every task ran: {runs:?}");
    // No attempt was delivered twice.
    let mut attempts: Vec<(u64, u32)> = runs.iter().map(|r| (r.task, r.attempt)).collect();
    attempts.sort();
    let before = attempts.len();
    attempts.dedup();
    assert_eq!(attempts.len(), before, "an attempt ran twice: {runs:?}");
}

#[tokio::test]
async fn malformed_labels_are_refused_and_nothing_is_submitted() {
    let c = Cluster::start(&[("cpu", "", 1)]).await;
    let url = c.nats_url();
    for bad in ["gpu", "=a100", "gpu=a 100", "gpu=a100=x"] {
        let out = c
            .cli(&["submit", "--nats", &url, "--label", bad, "--wait", "x"])
            .await;
        assert_eq!(out.code, Some(2), "--label {bad:?}: {out:?}");
        assert!(
            out.stderr.starts_with("error: ") && out.stderr.contains("[INVALID_ARGUMENT]"),
            "--label {bad:?}: {out:?}"
        );
        assert!(out.stdout.is_empty(), "--label {bad:?}: {out:?}");
    }
    let e = c
        .client
        .submit(Task::new("x").label_text("gpu"))
        .await
        .expect_err("a malformed label is refused");
    assert_eq!(e.code(), ErrorCode::INVALID_ARGUMENT, "{e}");

    let js = jetstream::new(async_nats::connect(&url).await.expect("nats"));
    let mut stream = js.get_stream("CRONOQ_SUBMIT").await.expect("submit stream");
    let state = stream.info().await.expect("stream info").state.clone();
    assert_eq!((state.messages, state.last_sequence), (0, 0), "{state:?}");
    // So the first good task is task 1.
    let id = c.submit_payload("good", "").await;
    assert_eq!(id, TaskId(1));
    assert_eq!(c.succeeded(id).await, "good on [] by cpu");
}

/// The README's first command: `cronoq dev` runs a task where its labels
/// say, and on SIGTERM stops its workers before its server, so both
/// workers' deregistrations are answered and it exits cleanly, its
/// nats-server with it.
#[tokio::test]
async fn cronoq_dev_runs_tasks_and_stops_workers_before_its_server() {
    let mut dev = CronoqDev::start().await;
    let url = dev.http_url().to_string();
    let out = run_cli(&["submit", "--http", &url, "--wait", "hello"], None).await;
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stdout.contains("ran on dev-cpu"), "{out:?}");
    let out = run_cli(
        &[
            "submit", "--http", &url, "--label", "gpu=a100", "--wait", "train",
        ],
        None,
    )
    .await;
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stdout.contains("ran on dev-gpu"), "{out:?}");

    let pid = dev.pid().expect("dev runs");
    let (status, log) = dev.stop();
    assert!(status.is_some_and(|s| s.success()), "{status:?}\n{log}");
    // Its nats-server went with it, although `nats-server` on PATH may be
    // a wrapper (a pyenv shim) whose child is the real server.
    #[cfg(target_os = "linux")]
    eventually("dev's nats-server to stop", || async move {
        let left = procs::processes_with(&format!("cronoq-dev-{pid}"));
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("still running: {left:?}"))
        }
    })
    .await;
    let line_of = |needle: &dyn Fn(&str) -> bool| log.lines().position(needle);
    let server_down = line_of(&|l| l.contains("shutting down")).expect("server shut down");
    for worker in ["dev-cpu", "dev-gpu"] {
        let deregistered = line_of(&|l| l.contains("deregistered") && l.contains(worker))
            .unwrap_or_else(|| panic!("{worker} did not deregister:\n{log}"));
        assert!(
            deregistered < server_down,
            "{worker} after the server:\n{log}"
        );
    }
    assert!(!log.contains("deregister failed"), "{log}");
}

/// Issue 8: `kill -9` of a `cronoq worker` used to leave its job running
/// (own process group, parent 1), overlapping the retry elsewhere. The job
/// now dies with its worker (Linux: `PR_SET_PDEATHSIG`).
#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_job_dies_with_its_killed_worker() {
    let c = Cluster::start(&[]).await;
    let dir = c.dir.path().to_path_buf();
    let pid_file = dir.join("job.pid");
    let script = format!("echo $$ > '{}'; exec sleep 300", pid_file.display());
    let mut worker = std::process::Command::new(procs::cronoq_binary())
        .args(["worker", "--nats", &c.nats_url(), "--pool", "default"])
        .args(["--id", "doomed", "--", "sh", "-c", &script])
        .env("CRONOQ_LOG", "warn")
        .spawn()
        .expect("starting the worker");
    let id = c.submit_payload("job", "").await;
    c.running(id).await;
    let pid: u32 = eventually("the job to write its pid", || {
        let pid_file = pid_file.clone();
        async move {
            std::fs::read_to_string(&pid_file)
                .ok()
                .and_then(|t| t.trim().parse().ok())
                .ok_or_else(|| "no pid yet".to_string())
        }
    })
    .await;
    let alive = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|stat| {
                // `pid (comm) STATE …`: a zombie is dead.
                let state = stat.rsplit(')').next().unwrap_or("").trim_start();
                !state.starts_with('Z') && !state.starts_with('X')
            })
            .unwrap_or(false)
    };
    assert!(alive(pid), "the job runs");
    worker.kill().expect("kill -9 of the worker");
    let _ = worker.wait();
    eventually("the job to die with its worker", || async move {
        if alive(pid) {
            Err(format!("job {pid} still runs"))
        } else {
            Ok(())
        }
    })
    .await;
}

/// A worker that registers with `lease_batches` (every `cronoq worker`)
/// gets the leases of one leader turn in one message on
/// `P.worker.<id>.leases`: eight tasks waiting for labels nobody has are
/// all leased in the turn a matching worker of eight slots registers, in
/// one message, and each runs once.
#[tokio::test]
async fn the_leases_of_one_turn_reach_a_worker_in_one_message() {
    let mut c = Cluster::start(&[]).await;
    let nats = async_nats::connect(c.nats_url()).await.expect("nats");
    let subjects = cronoq::wire::Subjects::default();
    let mut batches = nats
        .subscribe(subjects.leases("gpu"))
        .await
        .expect("subscribe");
    nats.flush().await.expect("flush");
    let mut ids = Vec::new();
    for i in 0..8 {
        ids.push(c.submit_payload(&format!("t{i}"), "gpu=a100").await);
    }
    for id in &ids {
        c.waiting(*id, "no_group_matches").await;
    }
    c.add_worker("gpu", "gpu=a100", 8).await;
    use futures_util::StreamExt as _;
    let message = tokio::time::timeout(std::time::Duration::from_secs(30), batches.next())
        .await
        .expect("a leases message")
        .expect("subscription open");
    let leases: cronoq::wire::Leases = cronoq::wire::decode(&message.payload).expect("Leases");
    assert_eq!(leases.leases.len(), 8, "{leases:?}");
    for id in &ids {
        let status = c.finished(*id).await;
        assert_eq!(status.state, TaskState::Succeeded, "{}", describe(&status));
        assert_eq!(status.attempts.len(), 1, "{}", describe(&status));
    }
    assert_eq!(c.runs().len(), 8, "{:?}", c.runs());
}

/// A task whose journal record would not fit one NATS message (an output
/// just under the limit, beside an earlier attempt's error) is stored cut
/// to fit — its output kept, the earlier attempt left out — and the
/// journal goes on: NATS refuses a message over its limit for good, and a
/// record retried forever would hold up every later announcement.
#[tokio::test]
async fn a_result_too_large_for_one_nats_message_is_cut_and_the_journal_goes_on() {
    let c = Cluster::start(&[("cpu", "", 2)]).await;
    let nats = async_nats::connect(c.nats_url()).await.expect("nats");
    let limit = nats.server_info().max_payload;
    let size = limit - 1_100;
    let big = c
        .submit_payload(&format!("big failfirst big={size}"), "")
        .await;
    // Runs twice (the first attempt fails), then succeeds.
    eventually("the second attempt ran", || {
        let ran = c.runs().iter().any(|r| r.task == big.0 && r.attempt == 2);
        async move {
            if ran {
                Ok(())
            } else {
                Err("not yet".to_string())
            }
        }
    })
    .await;
    let after = c.submit_payload("after", "").await;
    assert_eq!(c.finished(after).await.state, TaskState::Succeeded);

    let js = jetstream::new(nats);
    let bucket = cronoq::wire::Subjects::default().results_bucket();
    let kv = js.get_key_value(&bucket).await.expect("the results bucket");
    // Lookups are written by block of 256 ids, `r.<block>.<entry>_<part>`
    // (`server::journal::lookups`), each message a MessagePack map of ids
    // and encoded records.
    #[derive(serde::Deserialize)]
    struct Block {
        ids: Vec<u64>,
        records: Vec<bytes::Bytes>,
    }
    let filter = format!("$KV.{bucket}.r.{}.*", big.0 / 256);
    let record = eventually("the big result is stored", || {
        let (kv, filter) = (kv.clone(), filter.clone());
        async move {
            let mut from = 1;
            loop {
                let m = kv
                    .stream
                    .direct_get_next_for_subject(filter.as_str(), Some(from))
                    .await
                    .map_err(|e| e.to_string())?;
                from = m.sequence + 1;
                let block: Block = cronoq::wire::decode(&m.payload).map_err(|e| e.message)?;
                if let Some(i) = block.ids.iter().position(|id| *id == big.0) {
                    let record = cronoq::wire::TaskRecord::decode(&block.records[i])
                        .map_err(|e| e.message)?;
                    return Ok(record);
                }
            }
        }
    })
    .await;
    assert!(record.state.is_terminal(), "{}", record.state);
    assert_eq!(record.state, TaskState::Succeeded);
    assert_eq!(record.output.as_ref().map(|o| o.len()), Some(size));
    let numbers: Vec<u32> = record.attempts.iter().map(|a| a.attempt).collect();
    assert_eq!(numbers, vec![2], "the failed first attempt was left out");
    assert!(
        c.server
            .log_tail(200)
            .contains("cut to fit one NATS message"),
        "{}",
        c.server.log_tail(200)
    );
}

/// Issue 20 finding 3: a plain NATS subscriber on `cronoq.events.>` (what
/// every submitter and reader NATS user may do) sees the tasks of every
/// pool end, but never what they produced: the terminal events of a task
/// whose output is a secret and of one whose error is carry neither, and
/// a waiter still gets both by reading the task.
#[tokio::test]
async fn task_events_carry_no_output_or_error_text() {
    use futures_util::StreamExt as _;
    let config = procs::SERVER_CONFIG.replacen("[server]\n", "[server]\nevents = \"all\"\n", 1);
    let c = Cluster::start_configured(&config, &[("cpu", "", 2)]).await;
    let nats = async_nats::connect(c.nats_url()).await.unwrap();
    let mut events = nats.subscribe("cronoq.events.>").await.unwrap();
    nats.flush().await.unwrap();

    let ok = c.submit_payload("secret-output-8c1f", "").await;
    let failed = c
        .submit(Task::new("secret-error-5d2e fail").max_attempts(1))
        .await;
    let done = c.client.wait(ok).await.unwrap();
    assert_eq!(
        done.output.as_deref(),
        Some("secret-output-8c1f on [] by cpu"),
        "{}",
        describe(&done)
    );
    let done = c.client.wait(failed).await.unwrap();
    assert_eq!(done.state, TaskState::Failed, "{}", describe(&done));
    assert!(
        done.error
            .as_deref()
            .unwrap_or("")
            .contains("secret-error-5d2e"),
        "{}",
        describe(&done)
    );

    // Every event of both tasks, until both terminal ones came.
    let mut terminal = BTreeMap::new();
    let mut seen = 0;
    while terminal.len() < 2 {
        let message = tokio::time::timeout(procs::DEADLINE, events.next())
            .await
            .expect("the terminal events")
            .expect("the subscription");
        seen += 1;
        let text = String::from_utf8_lossy(&message.payload);
        assert!(!text.contains("secret"), "{}: {text:?}", message.subject);
        let event: cronoq::wire::TaskEvent = cronoq::wire::decode(&message.payload).unwrap();
        assert_eq!(event.pool.as_str(), "default");
        if event.state.is_terminal() {
            terminal.insert(event.task_id, event.state);
        }
    }
    assert_eq!(terminal[&ok], TaskState::Succeeded);
    assert_eq!(terminal[&failed], TaskState::Failed);
    assert!(seen >= 4, "queued, running and the end of each: {seen}");
}
