//! Issue 23 (items 2 and 4, credentials), against real processes: a
//! `cronoq server` with `[auth] required = true` and a storage key, a
//! `cronoq worker -- CMD` whose command prints the schedule env, and
//! fires published to the submit stream as the leader publishes them.
//!
//! Only the leader fires schedules: a fire sealed with the servers'
//! storage key (`server::fires::fire_submission`) runs, owned by the
//! sealed credential, with `schedule`/`scheduled_at` in its status and
//! `CRONOQ_SCHEDULE`/`CRONOQ_SCHEDULED_AT` in its command's env; a
//! submission with schedule fields and no valid seal — signed by a real
//! submitter, sealed under another key, or with its owner changed — never
//! runs. In embedded mode a fired task carries the same fields to its
//! executor (`TaskContext::schedule`), outcome and status.
//!
//! No test sleeps to wait for something: every wait polls with a deadline.

mod auth_kit;
mod procs;

use std::time::SystemTime;

use async_nats::HeaderMap;
use bytes::Bytes;
use cronoq::auth::{client_nonce, Credential};
use cronoq::core::{ErrorCode, Millis, TaskState};
use cronoq::server::fires::fire_submission;
use cronoq::server::seal::Seal;
use cronoq::wire;
use cronoq::Task;
use procs::{command, cronoq_binary, eventually, Proc};

use auth_kit::*;

const KEY_ENV: (&str, &str) = (
    "CRONOQ_TEST_STORAGE_KEY",
    "a-storage-key-of-more-than-32-characters",
);

/// 2026-12-05T04:00:00Z.
const TICK: Millis = Millis(1_796_443_200_000);

/// What the command prints: its payload, then the schedule env.
const ENV_SCRIPT: &str =
    r#"printf '%s|%s|%s' "$(cat)" "${CRONOQ_SCHEDULE-unset}" "${CRONOQ_SCHEDULED_AT-unset}""#;

/// The auth-on server of `auth_kit`, with a storage key.
async fn setup() -> Setup {
    let key = format!("[server]\nstorage_key_env = \"{}\"\n", KEY_ENV.0);
    Setup::start_with_env(|config| config.replace("[server]\n", &key), &[KEY_ENV]).await
}

/// A `cronoq worker` (the GPU token, `gpu=a100`) running [`ENV_SCRIPT`].
fn env_worker(s: &Setup) -> Proc {
    let mut cmd = command(cronoq_binary());
    cmd.arg("worker")
        .args(["--nats", &s.nats.url(), "--id", "env", "--pool", "default"])
        .args([
            "--slots",
            "2",
            "--label",
            "gpu=a100",
            "--token-env",
            "T_GPU",
        ])
        .args(["--", "sh", "-c", ENV_SCRIPT])
        .env("T_GPU", GPU)
        .env("CRONOQ_LOG", "info,cronoq=debug,async_nats=warn");
    Proc::spawn(
        "cronoq worker env",
        cmd,
        &s.dir.path().join("worker-env.log"),
    )
}

fn now() -> Millis {
    Millis::since_epoch(SystemTime::now())
}

fn fire_task(payload: &str, labels: &str) -> Task {
    let mut task = Task::new(payload.to_string())
        .idempotency_key(format!("schedule:nightly:{}:{payload}", TICK.0));
    for label in labels.split(',').filter(|l| !l.is_empty()) {
        task = task.label_text(label);
    }
    task
}

/// A fire sealed as the leader seals it, owned by the `T_SUB_A` token.
fn sealed_fire(s: &Setup, seal: &Seal, payload: &str, labels: &str) -> (String, HeaderMap, Bytes) {
    fire_submission(
        &s.subjects,
        seal,
        &fire_task(payload, labels),
        ("nightly", TICK),
        Some("token:T_SUB_A"),
        now(),
    )
    .unwrap()
}

/// A submission with schedule fields in its body, signed by a real
/// submitter credential as a client signs, and no fire seal.
fn signed_forgery(s: &Setup, cred: &Credential, payload: &str) -> (String, HeaderMap, Bytes) {
    let task = fire_task(payload, "gpu=a100");
    let (subject, mut headers, _) = wire::submission(&s.subjects, &task).unwrap();
    let body: Bytes = wire::encode(&wire::Submit {
        schedule: Some("nightly".into()),
        scheduled_at: Some(TICK),
        ..wire::Submit::from_task(&task)
    })
    .into();
    let nonce = client_nonce(SystemTime::now());
    headers.insert("Nats-Msg-Id", cred.msg_id(task.key().unwrap()).as_str());
    cred.sign_message(&nonce, &subject, &mut headers, &body);
    (subject, headers, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_fires_sealed_by_the_leader_run_and_they_carry_their_schedule() {
    let s = setup().await;
    let _worker = env_worker(&s);
    s.worker_registered("env").await;
    let seal = Seal::from_secret(KEY_ENV.1).unwrap();
    let sub_a = Credential::token(SUB_A);
    let admin = Credential::token(ADMIN);

    // (a) Forged fires, before the genuine one (the stream is read in
    // order: once the genuine one ran, each was decided).
    // A real submitter's signed submission with schedule fields: refused,
    // recorded against it (its proof names it).
    let signed = s
        .publish(signed_forgery(&s, &sub_a, "signed-forgery"))
        .await;
    // Sealed under another key, and a genuine seal with its owner changed:
    // nobody verifies on them, so they are dropped, not recorded.
    let other = Seal::from_secret(&format!("{}-other", KEY_ENV.1)).unwrap();
    let other_key = s
        .publish(sealed_fire(&s, &other, "other-key", "gpu=a100"))
        .await;
    let mut changed = sealed_fire(&s, &seal, "owner-changed", "gpu=a100");
    changed.1.insert("Cronoq-Fire-Owner", "token:T_ADMIN");
    let owner_changed = s.publish(changed).await;

    // (b) A sealed fire runs on the worker, which sees the schedule.
    let fired = s.publish(sealed_fire(&s, &seal, "fired", "gpu=a100")).await;
    let done = s
        .until(fired, "succeeded", |t| t.state == TaskState::Succeeded)
        .await;
    assert_eq!(
        done.output.as_deref(),
        Some("fired|nightly|2026-12-05T04:00:00Z")
    );
    assert_eq!(done.schedule.as_deref(), Some("nightly"));
    assert_eq!(done.scheduled_at, Some(TICK));
    let json = serde_json::to_value(&done).unwrap();
    assert_eq!(json["scheduled_at"], "2026-12-05T04:00:00Z");

    let refused = s
        .until(signed, "refused", |t| t.state == TaskState::Failed)
        .await;
    assert!(refused.attempts.is_empty(), "{:?}", refused.attempts);
    let error = refused.error.unwrap_or_default();
    assert!(
        error.contains("PERMISSION_DENIED") && error.contains("only the leader fires schedules"),
        "{error}"
    );
    for id in [other_key, owner_changed] {
        let e = s.get(Some(&admin), id).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::NOT_FOUND, "task {id}: {e}");
    }

    // The owner is the sealed credential: it may cancel the fire's task,
    // another submitter may not. (Nobody has gpu=h100: it waits.)
    let waiting = s
        .publish(sealed_fire(&s, &seal, "waiting", "gpu=h100"))
        .await;
    // Queued with the leader's reason: taken by the leader (a status read
    // from the stream before the leader takes it is queued too, without
    // a reason or the schedule).
    let queued = s
        .until(waiting, "queued", |t| {
            t.state == TaskState::Queued && t.reason.is_some()
        })
        .await;
    assert_eq!(queued.schedule.as_deref(), Some("nightly"));
    let e = s
        .cancel(Some(&Credential::token(SUB_B)), waiting)
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::PERMISSION_DENIED, "{e}");
    s.cancel(Some(&sub_a), waiting).await.unwrap();
    let cancelled = s
        .until(waiting, "cancelled", |t| t.state == TaskState::Cancelled)
        .await;
    assert_eq!(cancelled.scheduled_at, Some(TICK), "kept once finished");
}

/// Embedded: a task a schedule fired shows its schedule and tick in its
/// outcome and status, and its executor sees them in its context.
#[tokio::test(start_paused = true)]
async fn an_embedded_fire_carries_its_schedule_to_the_executor_and_the_status() {
    let sched = cronoq::Scheduler::new();
    sched.set_capacity("default", 2).unwrap();
    sched
        .executor(
            "default",
            |ctx: cronoq::TaskContext, _payload: Bytes| async move {
                Ok::<_, cronoq::TaskError>(match ctx.schedule {
                    Some((name, at)) => format!("{name}|{}", cronoq::task::rfc3339_utc(at)).into(),
                    None => Bytes::from_static(b"none"),
                })
            },
        )
        .unwrap();
    let spec = serde_json::from_value(serde_json::json!({
        "name": "nightly", "every": "1s", "task": { "pool": "default", "payload": "x" },
    }))
    .unwrap();
    let created = sched.schedule(spec).unwrap();
    let tick = created.next_fires[0];
    let id = loop {
        let info = sched.get_schedule("nightly").unwrap();
        if let Some(id) = info.history.last().and_then(|r| r.task) {
            break id;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    let outcome = sched.wait(id).await.unwrap();
    assert_eq!(
        outcome.output.as_deref(),
        Some(format!("nightly|{}", cronoq::task::rfc3339_utc(tick)).as_bytes())
    );
    assert_eq!(outcome.schedule, Some(("nightly".to_string(), tick)));
    let status = sched.task(id).unwrap();
    assert_eq!(status.schedule.as_deref(), Some("nightly"));
    assert_eq!(status.scheduled_at, Some(tick));
    // An ordinary task has neither.
    let plain = sched.submit_now(Task::new("plain")).unwrap();
    let outcome = sched.wait(plain.id()).await.unwrap();
    assert_eq!(outcome.output.as_deref(), Some(&b"none"[..]));
    assert_eq!(outcome.schedule, None);
    let status = sched.task(plain.id()).unwrap();
    assert_eq!((status.schedule, status.scheduled_at), (None, None));
}

/// End to end with credentials and a storage key: a schedule a submitter
/// creates over HTTP fires on the leader, sealed, and the guard takes it:
/// it runs on a real worker with the schedule in its env and status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_created_with_credentials_fires_sealed_and_runs() {
    let s = setup().await;
    let _worker = env_worker(&s);
    s.worker_registered("env").await;
    let creator = cronoq::client::ClientOptions::new()
        .token(SUB_A)
        .request_timeout(std::time::Duration::from_secs(5))
        .http(&s._server.http_url())
        .expect("an HTTP client");
    let spec: cronoq::schedule::ScheduleSpec = serde_json::from_value(serde_json::json!({
        "name": "e2e", "every": "1s",
        "task": { "labels": { "gpu": "a100" }, "payload": "tick" },
    }))
    .unwrap();
    creator.create_schedule(spec).await.expect("created");
    let id = eventually("the first fire's task", || async {
        let info = creator
            .get_schedule("e2e")
            .await
            .map_err(|e| e.to_string())?;
        info.history
            .iter()
            .find_map(|r| r.task)
            .ok_or_else(|| format!("{:?}", info.history))
    })
    .await;
    let done = s
        .until(id, "succeeded", |t| t.state == TaskState::Succeeded)
        .await;
    let at = done.scheduled_at.expect("a fired task has its tick");
    assert_eq!(done.schedule.as_deref(), Some("e2e"));
    assert_eq!(
        done.output.as_deref(),
        Some(format!("tick|e2e|{}", cronoq::task::rfc3339_utc(at)).as_str())
    );
}
