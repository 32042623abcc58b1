//! Schedules under attack and faults (issue 34), against real processes: a
//! `nats-server`, `cronoq server`s with `[auth] required = true` and a
//! storage key, and `cronoq worker`s. Each test's doc says which finding
//! of the issue it holds and how the probe reproduced it on 53e0b1f; each
//! failed there.
//!
//! No test sleeps to wait for something: every wait polls with a deadline.

mod auth_kit;
mod procs;

use auth_kit::as_token;

use std::time::SystemTime;

use cronoq::api::ScheduleInfo;
use cronoq::auth::{client_nonce, Credential};
use cronoq::client::Client;
use cronoq::core::{ErrorCode, Millis, TaskState};
use cronoq::schedule::ScheduleSpec;
use cronoq::wire::{self, Subjects};
use cronoq::Task;
use procs::{eventually, CronoqServer, CronoqWorker, NatsServer};

/// The storage key's variable and value.
const KEY_ENV: (&str, &str) = (
    "CRONOQ_TEST_STORAGE_KEY",
    "a-storage-key-of-more-than-32-characters",
);

fn spec(json: serde_json::Value) -> ScheduleSpec {
    serde_json::from_value(json).expect("a schedule spec")
}

fn now() -> Millis {
    Millis::since_epoch(SystemTime::now())
}

/// The auth kit's config with a storage key, changed by `edit`.
fn config(edit: impl Fn(String) -> String) -> String {
    let config = auth_kit::config(&nkeys::KeyPair::new_user().public_key()).replace(
        "[server]\n",
        "[server]\nstorage_key_env = \"CRONOQ_TEST_STORAGE_KEY\"\n",
    );
    edit(config)
}

fn env() -> Vec<(&'static str, &'static str)> {
    let mut env = auth_kit::SERVER_ENV.to_vec();
    env.push(KEY_ENV);
    env
}

async fn server(nats: &NatsServer, dir: &std::path::Path, config: &str) -> CronoqServer {
    CronoqServer::start_configured(nats, dir, config, &env(), true).await
}

/// A worker with the GPU token (`gpu=a100`), two slots.
fn gpu_worker(nats: &NatsServer, dir: &std::path::Path, id: &str) -> CronoqWorker {
    CronoqWorker::start_with(
        &nats.url(),
        dir,
        id,
        "gpu=a100",
        2,
        &["--token-env", "T_GPU"],
        &[("T_GPU", auth_kit::GPU)],
    )
}

/// The schedule as `client` sees it, once `check` holds.
async fn schedule_until(
    client: &Client,
    name: &str,
    what: &str,
    check: impl Fn(&ScheduleInfo) -> bool,
) -> ScheduleInfo {
    eventually(what, || async {
        match client.get_schedule(name).await {
            Ok(info) if check(&info) => Ok(info),
            other => Err(format!("{other:?}")),
        }
    })
    .await
}

/// Findings 2, 3 and 4: a tick's id was `schedule:<name>:<tick ms>`,
/// which anyone could publish first. Reproduction on 53e0b1f: before a
/// tick, one unsigned publish to `cronoq.submit.default` with that
/// `Nats-Msg-Id` (dropped as unsigned, but the stream kept the id) made
/// the leader's fire a duplicate and the tick never ran; the same publish
/// signed by a second submitter ran *its* task as the tick's run; on an
/// `overlap = skip` schedule the forged run never ended and every later
/// tick was skipped. Now the fire's id carries a MAC under the storage
/// key and a duplicate answer is taken only for a stored fire of the same
/// tick: every tick runs the schedule's own task, none is skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pre_published_tick_id_neither_suppresses_nor_replaces_a_tick() {
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let _server = server(&nats, dir.path(), &config(|c| c)).await;
    let _worker = gpu_worker(&nats, dir.path(), "w1");
    let sub_a = as_token(&nats, auth_kit::SUB_A).await;
    let raw = async_nats::connect(nats.url()).await.unwrap();
    let js = async_nats::jetstream::new(raw);

    let every = 2_000;
    sub_a
        .create_schedule(spec(serde_json::json!({
            "name": "beat", "every": "2s", "overlap": "skip",
            "task": {"labels": {"gpu": "a100"}, "payload": "genuine"}
        })))
        .await
        .unwrap();
    // The next four ticks, each claimed first: two by unsigned publishes,
    // two signed by another submitter of the pool (its own payload).
    let first = (now().0 / every + 2) * every;
    let ticks: Vec<u64> = (0..4).map(|i| first + i * every).collect();
    let subjects = Subjects::default();
    let sub_b = Credential::token(auth_kit::SUB_B);
    for (i, tick) in ticks.iter().enumerate() {
        let key = format!("schedule:beat:{tick}");
        let task = Task::new("forged").label_text("gpu=a100");
        let (subject, mut headers, body) = wire::submission(&subjects, &task).unwrap();
        headers.insert("Nats-Msg-Id", key.as_str());
        if i % 2 == 1 {
            sub_b.sign_message(
                &client_nonce(SystemTime::now()),
                &subject,
                &mut headers,
                &body,
            );
        }
        js.publish_with_headers(subject, headers, body)
            .await
            .unwrap()
            .await
            .unwrap();
    }

    let last = *ticks.last().unwrap();
    let info = schedule_until(&sub_a, "beat", "the claimed ticks to have run", |i| {
        ticks.iter().all(|t| {
            i.history
                .iter()
                .any(|r| r.tick.0 == *t && r.outcome == Some(TaskState::Succeeded))
        })
    })
    .await;
    assert!(info.skipped.iter().all(|t| t.0 > last), "{info:?}");
    for tick in &ticks {
        let record = info.history.iter().find(|r| r.tick.0 == *tick).unwrap();
        assert!(record.error.is_none(), "{record:?}");
        let status = sub_a.get(record.task.unwrap()).await.unwrap();
        assert_eq!(status.schedule.as_deref(), Some("beat"), "{status:?}");
        assert_eq!(status.scheduled_at, Some(Millis(*tick)), "{status:?}");
        let output = status.output.unwrap_or_default();
        assert!(output.starts_with("genuine on"), "{output}");
    }
}

/// Finding 5: a fire's owner was trusted as sealed and never checked
/// against the config. Reproduction on 53e0b1f: a credential allowed pool
/// `default` creates a schedule there; the config narrows it to `other`
/// and the server restarts; the schedule went on firing tasks into
/// `default` owned by it. Now each fire is checked against the owner's
/// current rights and recorded refused on the schedule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_stops_firing_when_its_owner_loses_the_pool() {
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let mut first = server(&nats, dir.path(), &config(|c| c)).await;
    let sub_a = as_token(&nats, auth_kit::SUB_A).await;
    sub_a
        .create_schedule(spec(serde_json::json!({
            "name": "mine", "every": "1s", "overlap": "allow",
            "task": {"payload": "x"}
        })))
        .await
        .unwrap();
    schedule_until(&sub_a, "mine", "a first fire", |i| {
        i.history.iter().any(|r| r.task.is_some())
    })
    .await;
    first.kill9();
    drop(first);

    // T_SUB_A may now use `other` only.
    let narrowed = config(|c| {
        c.replace(
            "token_env = \"T_SUB_A\"\nrole = \"submitter\"\npools = [\"default\"]",
            "token_env = \"T_SUB_A\"\nrole = \"submitter\"\npools = [\"other\"]",
        )
    });
    assert!(narrowed.contains("pools = [\"other\"]"), "the edit took");
    let _second = server(&nats, dir.path(), &narrowed).await;
    let admin = as_token(&nats, auth_kit::ADMIN).await;
    let since = now();
    let info = schedule_until(
        &admin,
        "mine",
        "fires refused for the owner's rights",
        |i| {
            i.history
                .iter()
                .filter(|r| r.fired_at >= since)
                .filter(|r| {
                    r.task.is_none()
                        && r.error
                            .as_deref()
                            .is_some_and(|e| e.contains("may not use pool default"))
                })
                .count()
                >= 2
        },
    )
    .await;
    // No fire of the new leadership started a task.
    let started: Vec<_> = info
        .history
        .iter()
        .filter(|r| r.fired_at >= since && r.task.is_some())
        .collect();
    assert!(started.is_empty(), "{started:?}");
}

/// Finding 6: another submitter of the pool could trigger, pause and
/// delete a schedule it did not create, whose tasks it then could not
/// cancel. Now schedules follow the rule of tasks: their creator or an
/// admin changes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_schedules_creator_or_an_admin_may_change_it() {
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let _server = server(&nats, dir.path(), &config(|c| c)).await;
    let sub_a = as_token(&nats, auth_kit::SUB_A).await;
    let sub_b = as_token(&nats, auth_kit::SUB_B).await;
    let admin = as_token(&nats, auth_kit::ADMIN).await;
    sub_a
        .create_schedule(spec(serde_json::json!({"name": "mine", "every": "1h"})))
        .await
        .unwrap();
    let code = |r: Result<(), cronoq::client::Error>| r.expect_err("refused").code();
    for refused in [
        code(sub_b.pause_schedule("mine").await.map(|_| ())),
        code(sub_b.resume_schedule("mine").await.map(|_| ())),
        code(sub_b.trigger_schedule("mine").await.map(|_| ())),
        code(sub_b.delete_schedule("mine").await),
    ] {
        assert_eq!(refused, ErrorCode::PERMISSION_DENIED);
    }
    let range = cronoq::api::BackfillRange::new(Millis(0), Millis(3_600_000)).unwrap();
    assert_eq!(
        code(sub_b.backfill_schedule("mine", range).await.map(|_| ())),
        ErrorCode::PERMISSION_DENIED
    );
    // Nothing changed; it may still read it.
    let info = sub_b.get_schedule("mine").await.unwrap();
    assert!(!info.paused && info.counters.fires == 0, "{info:?}");
    // Its creator and an admin may.
    assert!(sub_a.pause_schedule("mine").await.unwrap().paused);
    assert!(!admin.resume_schedule("mine").await.unwrap().paused);
    let fire = sub_a.trigger_schedule("mine").await.unwrap();
    sub_a.cancel(fire.task.unwrap()).await.unwrap();
    admin.delete_schedule("mine").await.unwrap();
}

/// Finding 1: a schedule record was JSON with the payload as an array of
/// numbers; a 270 KB payload made a record larger than a NATS message,
/// the leader retried it for ever and every later journal write waited
/// behind it. Reproduction on 53e0b1f: `POST /v1/schedules` with a 270 KB
/// payload, then any submission stays `queued` without a reason for ever.
/// Now the record is MessagePack (the payload as bytes), a payload over
/// the task payload limit is refused `INVALID_ARGUMENT` at creation, and
/// the journal goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_schedule_payload_neither_stalls_the_journal_nor_passes_the_limit() {
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let config = config(|c| c.replace("[server]\n", "[server]\nmax_payload_bytes = 400000\n"));
    let mut first = server(&nats, dir.path(), &config).await;
    let _worker = gpu_worker(&nats, dir.path(), "w1");
    let sub_a = as_token(&nats, auth_kit::SUB_A).await;
    let big = "y".repeat(270_000);
    let info = sub_a
        .create_schedule(spec(serde_json::json!({
            "name": "big", "every": "1h",
            "task": {"labels": {"gpu": "a100"}, "payload": big}
        })))
        .await
        .unwrap();
    assert_eq!(info.spec.task.payload.len(), 270_000);
    // Over the task payload limit: refused, nothing made.
    let e = sub_a
        .create_schedule(spec(serde_json::json!({
            "name": "bigger", "every": "1h", "task": {"payload": "z".repeat(400_001)}
        })))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::INVALID_ARGUMENT, "{e}");
    assert!(e.to_string().contains("over the limit"), "{e}");
    assert_eq!(
        sub_a.get_schedule("bigger").await.unwrap_err().code(),
        ErrorCode::NOT_FOUND
    );

    // The journal goes on: a task runs, a trigger runs the big payload.
    let id = sub_a
        .submit(Task::new("after").label_text("gpu=a100"))
        .await
        .unwrap();
    let done = sub_a.wait(id).await.unwrap();
    assert_eq!(done.state, TaskState::Succeeded, "{done:?}");
    let fire = sub_a.trigger_schedule("big").await.unwrap();
    let done = sub_a.wait(fire.task.unwrap()).await.unwrap();
    assert_eq!(done.state, TaskState::Succeeded, "{done:?}");

    // A successor reads the record back, payload and all.
    first.kill9();
    drop(first);
    let _second = server(&nats, dir.path(), &config).await;
    let read = sub_a.get_schedule("big").await.unwrap();
    assert_eq!(read.spec.task.payload.len(), 270_000);
    assert_eq!(read.counters.fires, 1, "{:?}", read.counters);
}

/// Finding 13: skipped ticks were not stored, so each leader change
/// emptied the list while the counters survived. Reproduction on
/// 53e0b1f: an `overlap = skip` schedule whose run never ends (no worker
/// for its labels), a leader kill: `schedule get` showed the counter but
/// only the ticks skipped since the takeover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skipped_ticks_survive_a_leader_change() {
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let config = config(|c| c);
    let mut first = server(&nats, dir.path(), &config).await;
    let sub_a = as_token(&nats, auth_kit::SUB_A).await;
    sub_a
        .create_schedule(spec(serde_json::json!({
            "name": "stuck", "every": "1s", "overlap": "skip",
            "task": {"labels": {"gpu": "h100"}, "payload": "x"}
        })))
        .await
        .unwrap();
    let before = schedule_until(&sub_a, "stuck", "three skipped ticks", |i| {
        i.skipped.len() >= 3
    })
    .await;
    first.kill9();
    drop(first);
    let _second = server(&nats, dir.path(), &config).await;
    let after = schedule_until(&sub_a, "stuck", "the successor's answer", |i| {
        i.counters.skipped >= before.counters.skipped
    })
    .await;
    // What the stored record held is still listed (a tick skipped after
    // it was written may be missing: the record is written per turn).
    let kept: Vec<_> = before.skipped[..before.skipped.len() - 1].to_vec();
    for tick in &kept {
        assert!(after.skipped.contains(tick), "{tick:?} lost: {after:?}");
    }
}

/// Finding 10: a submission carrying schedule fields and a fire header no
/// seal verifies on, signed by a real submitter, was dropped as if nobody
/// had sent it (`NOT_FOUND`). Its signer is known: it is recorded
/// refused `PERMISSION_DENIED`, as SECURITY.md says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_forged_fire_is_recorded_against_its_signer() {
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let _server = server(&nats, dir.path(), &config(|c| c)).await;
    let sub_a = Credential::token(auth_kit::SUB_A);
    let subjects = Subjects::default();
    let task = Task::new("forged").idempotency_key("k1");
    let (subject, mut headers, _) = wire::submission(&subjects, &task).unwrap();
    let body: bytes::Bytes = wire::encode(&wire::Submit {
        schedule: Some("nightly".into()),
        scheduled_at: Some(Millis(1_796_443_200_000)),
        ..wire::Submit::from_task(&task)
    })
    .into();
    headers.insert("Cronoq-Fire-Seal", "1796443200000.00");
    headers.insert("Nats-Msg-Id", sub_a.msg_id("k1").as_str());
    sub_a.sign_message(
        &client_nonce(SystemTime::now()),
        &subject,
        &mut headers,
        &body,
    );
    let raw = async_nats::connect(nats.url()).await.unwrap();
    let js = async_nats::jetstream::new(raw);
    let seq = js
        .publish_with_headers(subject, headers, body)
        .await
        .unwrap()
        .await
        .unwrap()
        .sequence;
    let client = as_token(&nats, auth_kit::SUB_A).await;
    let refused = eventually("the forged fire to be recorded refused", || async {
        match client.get(cronoq::core::TaskId(seq)).await {
            Ok(s) if s.state == TaskState::Failed => Ok(s),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let error = refused.error.unwrap_or_default();
    assert!(error.contains("PERMISSION_DENIED"), "{error}");
    assert!(refused.attempts.is_empty());
}

/// Finding 12: an `overlap = skip` schedule whose run ended while no
/// server led skipped its whole catch-up: the successor decided the
/// catch-up ticks while the run's attempt still waited for its worker to
/// re-attach (and report the end). Reproduction on 53e0b1f: a run held
/// on a worker, the only server killed, the run released, the server
/// started again 5 s later: every catch-up tick and the first live one
/// were recorded skipped. Now the book waits for the re-attach (bounded
/// by the grace) before it decides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skip_schedule_catches_up_after_its_run_ended_while_no_one_led() {
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    // A re-attach grace (the worker timeout) no loaded machine outlasts:
    // the worker must re-register and report within it.
    let config =
        procs::SERVER_CONFIG.replace("worker_timeout = \"2s\"", "worker_timeout = \"15s\"");
    assert!(config.contains("\"15s\""));
    let mut first = CronoqServer::start_configured(&nats, dir.path(), &config, &[], true).await;
    let _worker = CronoqWorker::start(&nats.url(), dir.path(), "w1", "", 2);
    let client = Client::connect(&nats.url()).await.unwrap();
    client
        .create_schedule(spec(serde_json::json!({
            "name": "held", "every": "1s", "overlap": "skip", "catchup_window": "1h",
            "task": {"payload": "beat hold=go"}
        })))
        .await
        .unwrap();
    // Its first run holds on the worker.
    let info = schedule_until(&client, "held", "a run", |i| {
        i.history.iter().any(|r| r.task.is_some())
    })
    .await;
    let run = info.history.iter().find_map(|r| r.task).unwrap();
    eventually("the run to start", || async {
        match client.get(run).await {
            Ok(s) if s.state == TaskState::Running => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    // Two ticks skipped for it: the record that names the run as live
    // (written with the first skip) is stored before the kill.
    schedule_until(&client, "held", "two ticks skipped for the run", |i| {
        i.skipped.len() >= 2
    })
    .await;
    first.kill9();
    drop(first);
    let killed = now();
    // The run ends while nobody leads; ticks pass.
    std::fs::File::create(dir.path().join("go")).unwrap();
    eventually("three ticks to pass with no leader", || async {
        if now().0 > killed.0 + 3_000 {
            Ok(())
        } else {
            Err("not yet".to_string())
        }
    })
    .await;
    let restarted = now();
    let _second = CronoqServer::start_configured(&nats, dir.path(), &config, &[], true).await;
    let info = eventually("a catch-up tick to fire", || async {
        match client.get_schedule("held").await {
            Ok(i)
                if i.history
                    .iter()
                    .any(|r| r.tick > killed && r.tick < restarted && r.task.is_some()) =>
            {
                Ok(i)
            }
            Ok(i) => Err(format!(
                "killed {} restarted {} skipped {:?} missed {:?} fired {:?}",
                killed.0,
                restarted.0,
                i.skipped,
                i.missed,
                i.history
                    .iter()
                    .map(|r| (r.tick.0, r.task))
                    .collect::<Vec<_>>()
            )),
            Err(e) => Err(e.to_string()),
        }
    })
    .await;
    let done = client.get(run).await.unwrap();
    assert_eq!(done.state, TaskState::Succeeded, "{done:?}");
    // The first catch-up tick fired; the ones after it are skipped while
    // that run lives (the policy), not all of them for the ended one.
    let first_catch_up = info
        .history
        .iter()
        .filter(|r| r.tick > killed && r.tick < restarted)
        .map(|r| r.tick)
        .min();
    assert!(
        info.skipped
            .iter()
            .filter(|t| **t > killed)
            .all(|t| first_catch_up.is_some_and(|f| *t > f)),
        "{info:?}"
    );
}
