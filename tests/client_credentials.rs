//! The NATS client with a credential (issue 9), against a real
//! `nats-server` and a stand-in leader that checks every request the way
//! the leader does (`auth::Authenticator::caller`, each nonce once): the
//! proof covers the exact subject and body sent, a fresh nonce per request;
//! a submission stored in the stream verifies too, its `Nats-Msg-Id` is the
//! credential's scoped key (or the proof's nonce), so the same key from
//! two credentials is two tasks; a submission the leader refused (for its
//! credential, or for a limit only it knows) comes back from `submit` with
//! the refusal's code. Without a
//! credential nothing changes: no header, the plain key, no confirmation.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_nats::jetstream::{self, stream};
use bytes::Bytes;
use cronoq::auth::{Authenticator, Credential, Nonces, Proof};
use cronoq::client::{Client, ClientOptions};
use cronoq::core::{ErrorCode, Millis, PoolName, Snapshot, TaskId, TaskState};
use cronoq::server::ServerConfig;
use cronoq::wire::{self, Subjects, WireError};
use cronoq::{Task, TaskStatus};
use futures_util::StreamExt;

mod procs;

const SUBMIT_TOKEN: &str = "submitter-token-0123456789";
const OTHER_TOKEN: &str = "other-submitter-token-0123";

fn now_ms() -> Millis {
    Millis(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64,
    )
}

/// Credentials as a server with `[auth] required = true` would hold them:
/// two submitter tokens and an admin nkey.
fn authenticator(nkey: &nkeys::KeyPair) -> Authenticator {
    let text = format!(
        r#"
[auth]
required = true
[[auth.tokens]]
token_env = "SUB"
role = "submitter"
pools = ["inference"]
[[auth.tokens]]
token_env = "OTHER"
role = "submitter"
[[auth.nkeys]]
public_key = "{}"
role = "admin"
"#,
        nkey.public_key()
    );
    let config: ServerConfig = toml::from_str(&text).unwrap();
    let env = |var: &str| match var {
        "SUB" => Some(SUBMIT_TOKEN.to_string()),
        "OTHER" => Some(OTHER_TOKEN.to_string()),
        _ => None,
    };
    Authenticator::from_config(&config.auth, &env).unwrap()
}

/// What the stand-in leader saw: `verb caller` (`caller` the principal's
/// name, or the code it refused with).
type Seen = Arc<Mutex<Vec<String>>>;

/// The answer to a `task` lookup, by id and how many lookups came before.
type TaskAnswer = Arc<dyn Fn(TaskId, u32) -> Result<TaskStatus, WireError> + Send + Sync>;

fn queued(id: TaskId) -> TaskStatus {
    TaskStatus {
        id,
        pool: PoolName::new("inference").unwrap(),
        state: TaskState::Queued,
        reason: Some(cronoq::core::WaitReason::NoGroupMatches),
        reason_key: None,
        attempts: vec![],
        output: None,
        output_base64: None,
        error: None,
        deadline_missed: false,
        schedule: None,
        scheduled_at: None,
        output_size: None,
    }
}

fn refused(id: TaskId, code: &str) -> TaskStatus {
    TaskStatus {
        state: TaskState::Failed,
        error: Some(format!(
            "submission refused: credential token:SUB may not use pool gpu [{code}]"
        )),
        ..queued(id)
    }
}

/// A leader on `cronoq.api.>` that checks each request's proof as the
/// real one does and refuses a bad one with its code; otherwise answers
/// with `tasks` for lookups, an ack, an empty snapshot or task list.
async fn stand_in_leader(url: &str, auth: Authenticator, tasks: TaskAnswer) -> Seen {
    let seen: Seen = Arc::default();
    let nats = async_nats::connect(url).await.unwrap();
    let mut requests = nats.subscribe("cronoq.api.>").await.unwrap();
    nats.flush().await.unwrap();
    let record = seen.clone();
    let lookups = AtomicU32::new(0);
    tokio::spawn(async move {
        let mut nonces = Nonces::default();
        while let Some(m) = requests.next().await {
            let Some(reply) = m.reply.clone() else {
                continue;
            };
            let verb = m.subject.as_str().trim_start_matches("cronoq.api.");
            let now = now_ms();
            let caller = auth
                .caller(m.subject.as_str(), m.headers.as_ref(), &m.payload, now)
                .and_then(|p| {
                    let nonce = Proof::of(m.headers.as_ref())?.unwrap().nonce;
                    nonces.first_use(&nonce, now)?;
                    Ok(p)
                });
            record.lock().unwrap().push(format!(
                "{verb} {}",
                match &caller {
                    Ok(p) => p.name.clone(),
                    Err(e) => e.code.to_string(),
                }
            ));
            let body = match (caller, verb) {
                (Err(e), _) => wire::encode_reply::<wire::Ack>(&Err(e)),
                (Ok(_), "task") => {
                    let q: wire::GetTask = wire::decode(&m.payload).unwrap();
                    let n = lookups.fetch_add(1, Ordering::SeqCst);
                    wire::encode_reply(&tasks(q.task_id, n))
                }
                (Ok(_), "cancel") => wire::encode_reply(&Ok(wire::Ack::default())),
                (Ok(_), "snapshot") => wire::encode_reply(&Ok(Snapshot::default())),
                (Ok(_), "tasks") => wire::encode_reply(&Ok(wire::TaskList { tasks: vec![] })),
                _ => continue,
            };
            nats.publish(reply, Bytes::from(body)).await.unwrap();
        }
    });
    seen
}

fn take(seen: &Seen) -> Vec<String> {
    std::mem::take(&mut *seen.lock().unwrap())
}

/// The submit stream as the server creates it.
async fn create_submit_stream(url: &str) -> stream::Stream {
    let subjects = Subjects::default();
    let nats = async_nats::connect(url).await.unwrap();
    jetstream::new(nats)
        .create_stream(stream::Config {
            name: subjects.submit_stream(),
            subjects: vec![subjects.submit_all()],
            storage: stream::StorageType::File,
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        })
        .await
        .unwrap()
}

async fn client(url: &str, credential: Option<Credential>) -> Client {
    let mut options = ClientOptions::new().request_timeout(Duration::from_secs(2));
    if let Some(c) = credential {
        options = options.credential(c);
    }
    options.connect(url).await.unwrap()
}

#[tokio::test]
async fn every_request_proves_its_credential_with_a_fresh_nonce() {
    let nats = procs::NatsServer::start();
    let nkey = nkeys::KeyPair::new_user();
    let always_queued: TaskAnswer = Arc::new(|id, _| Ok(queued(id)));
    let seen = stand_in_leader(&nats.url(), authenticator(&nkey), always_queued).await;

    let token = client(&nats.url(), Some(Credential::token(SUBMIT_TOKEN))).await;
    assert!(!format!("{token:?}").contains(SUBMIT_TOKEN));
    for _ in 0..2 {
        token.get(TaskId(4)).await.unwrap();
        token.cancel(TaskId(4)).await.unwrap();
        token.snapshot().await.unwrap();
        token.recent_tasks(10).await.unwrap();
    }
    // Twice each, and the stand-in refuses a nonce seen before: every
    // request had its own.
    let want: Vec<String> = ["task", "cancel", "snapshot", "tasks"]
        .iter()
        .map(|v| format!("{v} token:SUB"))
        .collect();
    assert_eq!(take(&seen), [want.clone(), want].concat());

    let seed = nkey.seed().unwrap();
    let admin = ClientOptions::new()
        .nkey_seed(&seed)
        .unwrap()
        .connect(&nats.url())
        .await
        .unwrap();
    admin.snapshot().await.unwrap();
    assert_eq!(
        take(&seen),
        [format!("snapshot nkey:{}", nkey.public_key())]
    );

    // Through with_credential (what the HTTP API does per caller): the
    // same connection acting as another credential, or as nobody.
    let other = admin.with_credential(Credential::token(OTHER_TOKEN));
    other.cancel(TaskId(9)).await.unwrap();
    let anonymous = admin.with_credential(None);
    let e = anonymous.get(TaskId(9)).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::UNAUTHENTICATED, "{e}");
    assert_eq!(take(&seen), ["cancel token:OTHER", "task UNAUTHENTICATED"]);

    // A token the server does not know: refused, with its code.
    let stranger = client(
        &nats.url(),
        Some(Credential::token("unknown-token-0123456789")),
    )
    .await;
    let e = stranger.snapshot().await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::UNAUTHENTICATED, "{e}");
    assert_eq!(take(&seen), ["snapshot UNAUTHENTICATED"]);
}

#[tokio::test]
async fn a_signed_submission_verifies_in_the_stream_and_scopes_its_key() {
    let nats = procs::NatsServer::start();
    let nkey = nkeys::KeyPair::new_user();
    let auth = authenticator(&nkey);
    let mut stream = create_submit_stream(&nats.url()).await;
    let always_queued: TaskAnswer = Arc::new(|id, _| Ok(queued(id)));
    let seen = stand_in_leader(&nats.url(), auth.clone(), always_queued).await;

    let sub = client(&nats.url(), Some(Credential::token(SUBMIT_TOKEN))).await;
    let other = client(&nats.url(), Some(Credential::token(OTHER_TOKEN))).await;
    let anonymous = client(&nats.url(), None).await;
    let keyed = Task::new("job")
        .pool("inference")
        .label("gpu", "a100")
        .idempotency_key("job-7");

    let first = sub.submit(keyed.clone()).await.unwrap();
    // Confirmed: the submitter looked its task up.
    assert_eq!(take(&seen), ["task token:SUB"]);
    assert_eq!(
        sub.submit(keyed.clone()).await.unwrap(),
        first,
        "a resubmission"
    );
    let others = other.submit(keyed.clone()).await.unwrap();
    let anonymous_id = anonymous.submit(keyed.clone()).await.unwrap();
    assert!(others != first && anonymous_id != first && anonymous_id != others);
    // No credential, no confirmation.
    assert_eq!(take(&seen), ["task token:SUB", "task token:OTHER"]);
    let unkeyed = sub
        .submit(Task::new("plain").pool("inference"))
        .await
        .unwrap();
    assert_eq!(stream.info().await.unwrap().state.messages, 4);

    let msg_id = |m: &async_nats::jetstream::message::StreamMessage| {
        m.headers
            .get(async_nats::header::NATS_MESSAGE_ID)
            .map(|v| v.as_str().to_string())
    };
    // What the leader reads from the stream verifies for its credential,
    // over the stored subject and body.
    for (id, name, key) in [
        (
            first,
            "token:SUB",
            Credential::token(SUBMIT_TOKEN).msg_id("job-7"),
        ),
        (
            others,
            "token:OTHER",
            Credential::token(OTHER_TOKEN).msg_id("job-7"),
        ),
    ] {
        let m = stream.get_raw_message(id.0).await.unwrap();
        assert_eq!(m.subject.as_str(), "cronoq.submit.inference");
        let p = auth
            .caller(m.subject.as_str(), Some(&m.headers), &m.payload, now_ms())
            .unwrap();
        assert_eq!(p.name, name);
        assert_eq!(msg_id(&m), Some(key));
        let body: wire::Submit = wire::decode(&m.payload).unwrap();
        assert_eq!(body, wire::Submit::from_task(&keyed));
        // Moved to another pool's subject, the proof fails.
        let e = auth
            .caller(
                "cronoq.submit.other",
                Some(&m.headers),
                &m.payload,
                now_ms(),
            )
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::UNAUTHENTICATED);
    }
    // Without a credential: no proof, the key as it is.
    let m = stream.get_raw_message(anonymous_id.0).await.unwrap();
    assert!(m.headers.get(cronoq::auth::AUTH_HEADER).is_none());
    assert_eq!(msg_id(&m).as_deref(), Some("job-7"));
    // Without a key: the proof's nonce is the message id.
    let m = stream.get_raw_message(unkeyed.0).await.unwrap();
    let proof = Proof::of(Some(&m.headers)).unwrap().unwrap();
    assert_eq!(msg_id(&m), Some(proof.nonce));
    auth.caller(m.subject.as_str(), Some(&m.headers), &m.payload, now_ms())
        .unwrap();
}

#[tokio::test]
async fn a_submission_the_leader_refuses_comes_back_with_its_code() {
    let nats = procs::NatsServer::start();
    let nkey = nkeys::KeyPair::new_user();
    let mut stream = create_submit_stream(&nats.url()).await;
    // The leader takes a moment (a lookup finds nothing, the next only the
    // stream's copy), then the task
    // is refused: task 1 for its pool, task 2 for its credential, task 3
    // for what only the leader knows (issue 20: a payload over its limit,
    // a pool beyond max_pools): each refusal comes back with its code.
    let answers: TaskAnswer = Arc::new(|id, n| match (id.0, n) {
        (1, 0) => Err(WireError::new(ErrorCode::NOT_FOUND, "not yet")),
        // In the stream, not taken yet: queued without a reason.
        (1, 1) => Ok(TaskStatus {
            reason: None,
            ..queued(id)
        }),
        (1, _) => Ok(refused(id, "PERMISSION_DENIED")),
        (2, _) => Ok(refused(id, "UNAUTHENTICATED")),
        _ => Ok(refused(id, "INVALID_ARGUMENT")),
    });
    let seen = stand_in_leader(&nats.url(), authenticator(&nkey), answers).await;
    let sub = client(&nats.url(), Some(Credential::token(SUBMIT_TOKEN))).await;

    let e = sub
        .submit(Task::new("a").pool("inference"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::PERMISSION_DENIED, "{e}");
    assert!(
        e.to_string().contains("task 1") && e.to_string().contains("may not use pool gpu"),
        "{e}"
    );
    assert_eq!(take(&seen), ["task token:SUB"; 3]);
    let e = sub
        .submit(Task::new("b").pool("inference"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::UNAUTHENTICATED, "{e}");
    let e = sub
        .submit(Task::new("c").pool("inference"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::INVALID_ARGUMENT, "{e}");
    assert!(e.to_string().contains("task 3"), "{e}");
    assert_eq!(stream.info().await.unwrap().state.messages, 3);
}

#[tokio::test]
async fn a_refusal_of_the_lookup_itself_is_the_submissions_refusal() {
    let nats = procs::NatsServer::start();
    let nkey = nkeys::KeyPair::new_user();
    create_submit_stream(&nats.url()).await;
    let always_queued: TaskAnswer = Arc::new(|id, _| Ok(queued(id)));
    let seen = stand_in_leader(&nats.url(), authenticator(&nkey), always_queued).await;
    // Unknown to the server: the stream takes the submission, the lookup
    // that confirms it is refused, and so is the submission.
    let stranger = client(
        &nats.url(),
        Some(Credential::token("unknown-token-0123456789")),
    )
    .await;
    let e = stranger
        .submit(Task::new("x").pool("inference"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::UNAUTHENTICATED, "{e}");
    assert!(e.to_string().contains("task 1 was not confirmed"), "{e}");
    assert_eq!(take(&seen), ["task UNAUTHENTICATED"]);
}

#[tokio::test]
async fn a_submission_no_leader_takes_yet_is_returned_as_accepted() {
    let nats = procs::NatsServer::start();
    create_submit_stream(&nats.url()).await;
    // No leader answers lookups (no responders): after CONFIRM_FOR the
    // stream's acknowledgement stands.
    let sub = client(&nats.url(), Some(Credential::token(SUBMIT_TOKEN))).await;
    let started = std::time::Instant::now();
    assert_eq!(
        sub.submit(Task::new("x").pool("inference")).await.unwrap(),
        TaskId(1)
    );
    assert!(started.elapsed() >= cronoq::client::CONFIRM_FOR);
}
