//! Schedules over NATS (issue 23), with real processes: a `nats-server`,
//! `cronoq server`s and no workers. The Rust [`Client`] speaks the
//! `P.api.schedule_*` verbs to the leader: create, a duplicate refused,
//! list, get (five next fires), pause and resume, trigger (a task in the
//! stream, queued), backfill, delete; bad bodies refused
//! `INVALID_ARGUMENT` and changing nothing. A follower's HTTP
//! `/v1/schedules` reaches the leader the same way. With `[auth]
//! required` (and a storage key) the leader decides by the caller's
//! credential: readers list but do not create, a submitter only in its
//! pools and changes only its own schedules, admins anywhere; without a storage key it refuses to create
//! (it could not attribute the fires).
//!
//! No test sleeps to wait for something: every wait polls with a deadline.

mod auth_kit;
mod procs;

use auth_kit::as_token;

use std::time::SystemTime;

use cronoq::api::{BackfillRange, ScheduleInfo};
use cronoq::auth::Credential;
use cronoq::client::Client;
use cronoq::core::{ErrorCode, Millis, TaskState};
use cronoq::schedule::{FireKind, ScheduleSpec};
use cronoq::wire::{self, Subjects, WireError};
use procs::{eventually, http_get, http_post, CronoqServer, NatsServer};

fn spec(json: serde_json::Value) -> ScheduleSpec {
    serde_json::from_value(json).expect("a schedule spec")
}

fn now() -> Millis {
    Millis::since_epoch(SystemTime::now())
}

fn code<T: std::fmt::Debug>(r: Result<T, cronoq::client::Error>) -> ErrorCode {
    r.expect_err("a refusal").code()
}

/// A raw request on `P.api.<verb>`, signed with `cred` if given: what a
/// client that skips `Client`'s own checks would send.
async fn raw(
    nats: &async_nats::Client,
    cred: Option<&Credential>,
    verb: &str,
    body: Vec<u8>,
) -> Result<serde_json::Value, WireError> {
    let subject = Subjects::default().api(verb);
    let mut headers = async_nats::HeaderMap::new();
    if let Some(cred) = cred {
        let nonce = cronoq::auth::client_nonce(SystemTime::now());
        cred.sign_message(&nonce, &subject, &mut headers, &body);
    }
    let reply = nats
        .request_with_headers(subject, headers, body.into())
        .await
        .expect("a reply");
    wire::decode_reply::<serde_json::Value>(&reply.payload)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_over_the_nats_client_and_through_a_follower() {
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let leader = CronoqServer::start(&nats, dir.path()).await;
    let follower = CronoqServer::start_follower(&nats, dir.path()).await;
    let client = Client::connect(&nats.url()).await.unwrap();

    // Create: hourly, so no tick comes while the test runs.
    let hourly = spec(serde_json::json!({
        "name": "hourly", "every": "1h", "overlap": "allow",
        "task": {"payload": "report", "priority": 2}
    }));
    let info = client.create_schedule(hourly.clone()).await.unwrap();
    assert_eq!(info.spec.name, "hourly");
    assert_eq!(info.next_fires.len(), 5, "{info:?}");
    assert!(info.owner.is_none(), "anonymous: no owner");
    assert_eq!(
        code(client.create_schedule(hourly.clone()).await),
        ErrorCode::ALREADY_EXISTS
    );

    let list = client.list_schedules().await.unwrap();
    assert_eq!(
        list.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(),
        ["hourly"]
    );
    assert_eq!(list[0].pool, "default");
    let got = client.get_schedule("hourly").await.unwrap();
    assert_eq!(got.next_fires.len(), 5);
    assert_eq!(got.next_fires, info.next_fires);

    let paused = client.pause_schedule("hourly").await.unwrap();
    assert!(paused.paused && paused.next_fires.is_empty(), "{paused:?}");
    let resumed = client.resume_schedule("hourly").await.unwrap();
    assert!(
        !resumed.paused && resumed.next_fires.len() == 5,
        "{resumed:?}"
    );

    // Trigger: one run now, its task in the stream (no worker: queued).
    let fire = client.trigger_schedule("hourly").await.unwrap();
    assert_eq!(fire.kind, FireKind::Trigger);
    let task = fire.task.unwrap_or_else(|| panic!("no task: {fire:?}"));
    eventually("the triggered task to be taken, waiting", || async {
        match client.get(task).await {
            Ok(s) if s.state == TaskState::Queued && s.reason.is_some() => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;

    // Backfill the three past hourly ticks.
    let hour = 3_600_000;
    let last_tick = now().0 / hour * hour;
    let range = BackfillRange::new(Millis(last_tick - 2 * hour), Millis(last_tick)).unwrap();
    let report = client.backfill_schedule("hourly", range).await.unwrap();
    assert_eq!(report.fired.len(), 3, "{report:?}");
    assert!(report.fired.iter().all(|f| f.task.is_some()), "{report:?}");

    // Bad bodies, straight to the leader: refused, nothing changes.
    let raw_nats = async_nats::connect(nats.url()).await.unwrap();
    let bad_cron = wire::CreateSchedule::new(spec(serde_json::json!({
        "name": "bad", "cron": "61 * * * *"
    })));
    let never = wire::CreateSchedule::new(spec(serde_json::json!({
        "name": "never", "cron": "0 0 30 2 *"
    })));
    let too_fast = wire::CreateSchedule::new(spec(serde_json::json!({
        "name": "fast", "every": "500ms"
    })));
    for (verb, body) in [
        ("schedule_create", wire::encode(&bad_cron)),
        ("schedule_create", wire::encode(&never)),
        ("schedule_create", wire::encode(&too_fast)),
        ("schedule_create", b"not messagepack".to_vec()),
        (
            "schedule_create",
            wire::encode(&serde_json::json!({"v": 1})),
        ),
        (
            "schedule_get",
            wire::encode(&wire::ScheduleName::new("a.b")),
        ),
        (
            "schedule_delete",
            wire::encode(&serde_json::json!({"v": 1, "name": 7})),
        ),
        (
            "schedule_backfill",
            wire::encode(&wire::BackfillSchedule::new("hourly", Millis(2), Millis(1))),
        ),
    ] {
        let e = raw(&raw_nats, None, verb, body).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::INVALID_ARGUMENT, "{verb}: {e}");
    }
    let e = raw(&raw_nats, None, "schedule_frob", b"anything".to_vec())
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::NOT_FOUND, "{e}");
    // The client refuses a bad spec before sending anything.
    let bad = spec(serde_json::json!({"name": "bad", "cron": "61 * * * *"}));
    assert_eq!(
        code(client.create_schedule(bad).await),
        ErrorCode::INVALID_ARGUMENT
    );
    assert_eq!(
        code(client.get_schedule("a b").await),
        ErrorCode::INVALID_ARGUMENT
    );
    let after = client.get_schedule("hourly").await.unwrap();
    assert_eq!(
        after.counters.fires, 4,
        "a trigger and three backfills: {after:?}"
    );
    assert_eq!(client.list_schedules().await.unwrap().len(), 1);

    // Through the follower's HTTP API, which asks the leader over NATS.
    let health = procs::readyz(
        follower
            .http_url()
            .trim_start_matches("http://")
            .parse()
            .unwrap(),
    )
    .await
    .unwrap();
    assert!(!health.detail.starts_with("leader"), "{health:?}");
    let (status, body) = http_post(
        &format!("{}/v1/schedules", follower.http_url()),
        r#"{"name": "nightly", "cron": "30 2 * * *", "tz": "Europe/Berlin", "task": {"pool": "default"}}"#,
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let created: ScheduleInfo = serde_json::from_str(&body).unwrap();
    assert_eq!(created.next_fires.len(), 5);
    let (status, body) = http_get(&format!("{}/v1/schedules", follower.http_url())).await;
    assert_eq!(status, 200, "{body}");
    let names: Vec<String> = serde_json::from_str::<serde_json::Value>(&body).unwrap()["schedules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["hourly", "nightly"]);
    let (status, body) = http_post(
        &format!("{}/v1/schedules", follower.http_url()),
        r#"{"name": "nightly", "every": "1m"}"#,
    )
    .await;
    assert_eq!(status, 409, "{body}");
    let (status, body) = http_post(
        &format!("{}/v1/schedules/nightly/trigger", follower.http_url()),
        "",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, _) = procs::http_request(
        "DELETE",
        &format!("{}/v1/schedules/nightly", follower.http_url()),
        "",
    )
    .await;
    assert_eq!(status, 200);

    // Delete: gone, and a second delete finds nothing.
    client.delete_schedule("hourly").await.unwrap();
    assert_eq!(
        code(client.get_schedule("hourly").await),
        ErrorCode::NOT_FOUND
    );
    assert_eq!(
        code(client.delete_schedule("hourly").await),
        ErrorCode::NOT_FOUND
    );
    assert_eq!(
        code(client.trigger_schedule("hourly").await),
        ErrorCode::NOT_FOUND
    );
    assert!(client.list_schedules().await.unwrap().is_empty());
    drop((leader, follower));
}

/// The auth kit's config with a storage key (the leader seals what it
/// stores, so it can attribute fires to a schedule's owner).
const KEY_ENV: (&str, &str) = (
    "CRONOQ_TEST_STORAGE_KEY",
    "a-storage-key-of-more-than-32-characters",
);

async fn auth_server(nats: &NatsServer, dir: &std::path::Path, sealed: bool) -> CronoqServer {
    let mut config = auth_kit::config(&nkeys::KeyPair::new_user().public_key());
    if sealed {
        config = config.replace(
            "[server]\n",
            "[server]\nstorage_key_env = \"CRONOQ_TEST_STORAGE_KEY\"\n",
        );
    }
    let mut env = auth_kit::SERVER_ENV.to_vec();
    env.push(KEY_ENV);
    CronoqServer::start_configured(nats, dir, &config, &env, true).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_decide_who_may_change_schedules() {
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let _server = auth_server(&nats, dir.path(), true).await;
    let reader = as_token(&nats, auth_kit::READER).await;
    let sub_a = as_token(&nats, auth_kit::SUB_A).await;
    let sub_b = as_token(&nats, auth_kit::SUB_B).await;
    let admin = as_token(&nats, auth_kit::ADMIN).await;
    let anonymous = Client::connect(&nats.url()).await.unwrap();
    let in_pool = |name: &str, pool: &str| {
        spec(serde_json::json!({"name": name, "every": "1h", "task": {"pool": pool}}))
    };

    assert!(reader.list_schedules().await.unwrap().is_empty());
    assert_eq!(
        code(reader.create_schedule(in_pool("r", "default")).await),
        ErrorCode::PERMISSION_DENIED
    );
    assert_eq!(
        code(sub_a.create_schedule(in_pool("x", "other")).await),
        ErrorCode::PERMISSION_DENIED,
        "a submitter of `default` may not schedule into `other`"
    );
    assert_eq!(
        code(anonymous.list_schedules().await),
        ErrorCode::UNAUTHENTICATED
    );
    assert_eq!(
        code(anonymous.create_schedule(in_pool("n", "default")).await),
        ErrorCode::UNAUTHENTICATED
    );

    let mine = sub_a
        .create_schedule(in_pool("mine", "default"))
        .await
        .unwrap();
    assert_eq!(mine.owner.as_deref(), Some("token:T_SUB_A"));
    let theirs = admin
        .create_schedule(in_pool("theirs", "other"))
        .await
        .unwrap();
    assert_eq!(theirs.owner.as_deref(), Some("token:T_ADMIN"));

    // Readers read; a submitter changes only schedules of its pools.
    assert_eq!(
        reader.get_schedule("theirs").await.unwrap().spec.name,
        "theirs"
    );
    assert_eq!(
        code(reader.pause_schedule("mine").await),
        ErrorCode::PERMISSION_DENIED
    );
    assert_eq!(
        code(reader.delete_schedule("nothing-here").await),
        ErrorCode::PERMISSION_DENIED,
        "a reader learns nothing from a name it may not change"
    );
    for refused in [
        sub_a.pause_schedule("theirs").await.map(|_| ()),
        sub_a.trigger_schedule("theirs").await.map(|_| ()),
        sub_a.delete_schedule("theirs").await,
    ] {
        assert_eq!(code(refused), ErrorCode::PERMISSION_DENIED);
    }
    // Another submitter of the same pool may not: a schedule is changed
    // by its creator or an admin, as a task is cancelled (issue 34).
    assert_eq!(
        code(sub_b.pause_schedule("mine").await),
        ErrorCode::PERMISSION_DENIED
    );
    assert!(sub_a.pause_schedule("mine").await.unwrap().paused);
    assert!(!sub_a.resume_schedule("mine").await.unwrap().paused);

    // What was refused changed nothing.
    let names: Vec<String> = admin
        .list_schedules()
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, ["mine", "theirs"]);
    let theirs_now = admin.get_schedule("theirs").await.unwrap();
    assert!(
        !theirs_now.paused && theirs_now.counters.fires == 0,
        "{theirs_now:?}"
    );

    // A submitter of the pool may trigger: the fire is in the stream.
    let fire = sub_a.trigger_schedule("mine").await.unwrap();
    assert!(fire.task.is_some(), "{fire:?}");
    admin.delete_schedule("theirs").await.unwrap();
    sub_a.delete_schedule("mine").await.unwrap();
    assert!(reader.list_schedules().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_storage_key_the_leader_refuses_to_create_schedules() {
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let _server = auth_server(&nats, dir.path(), false).await;
    let admin = as_token(&nats, auth_kit::ADMIN).await;
    let e = admin
        .create_schedule(spec(serde_json::json!({"name": "a", "every": "1m"})))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::FAILED_PRECONDITION, "{e}");
    assert!(admin.list_schedules().await.unwrap().is_empty());
}

/// A fire with credentials on is its schedule owner's task, and the leader
/// takes it from the stream (queued and waiting, not dropped as unsigned).
/// Ignored until the leader attributes the fires it publishes
/// (`server/journal/committer.rs` `publish_fire` sends them unsigned, so
/// the consumer drops them: the task is `NOT_FOUND`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fire_with_credentials_on_is_taken_as_its_owners_task() {
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let _server = auth_server(&nats, dir.path(), true).await;
    let sub_a = as_token(&nats, auth_kit::SUB_A).await;
    let mine = spec(serde_json::json!({"name": "mine", "every": "1h"}));
    sub_a.create_schedule(mine).await.unwrap();
    let fire = sub_a.trigger_schedule("mine").await.unwrap();
    let task = fire.task.unwrap_or_else(|| panic!("no task: {fire:?}"));
    eventually("the fired task to be taken by the leader", || async {
        match sub_a.get(task).await {
            // Taken and waiting for a worker (a reason), not refused.
            Ok(s) if s.state == TaskState::Queued && s.reason.is_some() => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}
