//! Credentials end to end (issue 9) against real processes: a `cronoq
//! server` with `[auth] required = true`, `cronoq worker`s registering with
//! a token and with an nkey seed, and an attacker on the same NATS with a
//! plain client and no credentials (or the wrong ones). Each spoof the
//! issue lists is tried and must be refused with a stable code, changing
//! nothing: forged outcomes, cancels, deregistrations and registrations,
//! over-claimed labels, injected leases, squatted idempotency keys, a
//! flood of made-up attempts in a heartbeat. (That one credential cannot
//! *read* another's leases is NATS' job: `tests/nats_permissions.rs`.)
//!
//! Client calls are signed here by hand with `auth::Credential`, so this
//! also pins the wire contract clients implement.

mod procs;

use std::time::{Duration, SystemTime};

use async_nats::HeaderMap;
use cronoq::auth::{client_nonce, Credential};
use cronoq::core::{ErrorCode, Labels, Millis, PoolName, Snapshot, TaskId, TaskState};
use cronoq::task::TaskStatus;
use cronoq::wire::{self, Reply, Subjects, WireError, PROTOCOL_VERSION};
use cronoq::Task;
use procs::{eventually, CronoqServer, CronoqWorker, NatsServer};
use serde::de::DeserializeOwned;
use serde::Serialize;

const GPU: &str = "gpu-worker-token-0123456789";
const SUB_A: &str = "submitter-a-token-0123456789";
const SUB_B: &str = "submitter-b-token-0123456789";
const READER: &str = "reader-token-0123456789abcd";
const ADMIN: &str = "admin-token-0123456789abcdef";

fn config(nkey_public: &str) -> String {
    format!(
        r#"
[server]
worker_timeout = "2s"
lease_ttl = "3s"
election_timeout = "3s"

[[pools]]
name = "default"
backoff_initial = "100ms"
backoff_max = "1s"

[[pools]]
name = "other"

[auth]
required = true

[[auth.tokens]]
token_env = "T_GPU"
role = "worker"
pools = ["default"]
labels = ["gpu=a100", "zone=*"]

[[auth.tokens]]
token_env = "T_SUB_A"
role = "submitter"
pools = ["default"]

[[auth.tokens]]
token_env = "T_SUB_B"
role = "submitter"
pools = ["default"]

[[auth.tokens]]
token_env = "T_READ"
role = "reader"

[[auth.tokens]]
token_env = "T_ADMIN"
role = "admin"

[[auth.nkeys]]
public_key = "{nkey_public}"
role = "worker"
pools = ["default"]
labels = ["gpu=h100"]
"#
    )
}

const SERVER_ENV: [(&str, &str); 5] = [
    ("T_GPU", GPU),
    ("T_SUB_A", SUB_A),
    ("T_SUB_B", SUB_B),
    ("T_READ", READER),
    ("T_ADMIN", ADMIN),
];

struct Setup {
    nats: NatsServer,
    _server: CronoqServer,
    dir: tempfile::TempDir,
    client: async_nats::Client,
    subjects: Subjects,
    nkey: nkeys::KeyPair,
    workers: Vec<CronoqWorker>,
}

impl Setup {
    async fn start() -> Setup {
        let nats = NatsServer::start();
        let dir = tempfile::Builder::new()
            .prefix("cronoq-auth-")
            .tempdir()
            .unwrap();
        let nkey = nkeys::KeyPair::new_user();
        let server = CronoqServer::start_configured(
            &nats,
            dir.path(),
            &config(&nkey.public_key()),
            &SERVER_ENV,
            true,
        )
        .await;
        let client = async_nats::connect(nats.url()).await.unwrap();
        Setup {
            nats,
            _server: server,
            dir,
            client,
            subjects: Subjects::default(),
            nkey,
            workers: Vec::new(),
        }
    }

    /// A worker with the GPU token in `T_GPU`.
    fn token_worker(&mut self, id: &str, labels: &str) -> usize {
        self.workers.push(CronoqWorker::start_with(
            &self.nats.url(),
            self.dir.path(),
            id,
            labels,
            1,
            &["--token-env", "T_GPU"],
            &[("T_GPU", GPU)],
        ));
        self.workers.len() - 1
    }

    /// A worker with the nkey seed in a file.
    fn nkey_worker(&mut self, id: &str, labels: &str) -> usize {
        let seed = self.dir.path().join(format!("{id}.nk"));
        std::fs::write(&seed, self.nkey.seed().unwrap()).unwrap();
        self.workers.push(CronoqWorker::start_with(
            &self.nats.url(),
            self.dir.path(),
            id,
            labels,
            1,
            &["--nkey-seed", seed.to_str().unwrap()],
            &[],
        ));
        self.workers.len() - 1
    }

    /// A request as a client sends it, signed with `cred` if given.
    async fn request<Q: Serialize, R: DeserializeOwned>(
        &self,
        cred: Option<&Credential>,
        subject: &str,
        body: &Q,
    ) -> Result<R, WireError> {
        let body = wire::encode(body);
        let mut headers = HeaderMap::new();
        if let Some(cred) = cred {
            cred.sign_message(
                &client_nonce(SystemTime::now()),
                subject,
                &mut headers,
                &body,
            );
        }
        let reply = self
            .client
            .request_with_headers(subject.to_string(), headers, body.into())
            .await
            .map_err(|e| WireError::new(ErrorCode::UNAVAILABLE, e.to_string()))?;
        match wire::decode::<Reply<R>>(&reply.payload).expect("a readable reply") {
            Reply::Ok(r) => Ok(r),
            Reply::Error(e) => Err(e),
        }
    }

    async fn get(&self, cred: Option<&Credential>, id: TaskId) -> Result<TaskStatus, WireError> {
        self.request(
            cred,
            &self.subjects.api("task"),
            &wire::GetTask {
                v: PROTOCOL_VERSION,
                task_id: id,
            },
        )
        .await
    }

    async fn cancel(&self, cred: Option<&Credential>, id: TaskId) -> Result<(), WireError> {
        self.request::<_, wire::Ack>(
            cred,
            &self.subjects.api("cancel"),
            &wire::Cancel {
                v: PROTOCOL_VERSION,
                task_id: id,
            },
        )
        .await
        .map(|_| ())
    }

    async fn snapshot(&self) -> Snapshot {
        self.try_snapshot()
            .await
            .expect("the admin reads the snapshot")
    }

    async fn try_snapshot(&self) -> Result<Snapshot, WireError> {
        self.request(
            Some(&Credential::token(ADMIN)),
            &self.subjects.api("snapshot"),
            &wire::GetSnapshot::default(),
        )
        .await
    }

    /// Publishes a submission as a client does, signed with `cred`; the
    /// stream's sequence (the task id).
    async fn submit(&self, cred: Option<&Credential>, task: &Task) -> TaskId {
        let (subject, mut headers, body) = wire::submission(&self.subjects, task).unwrap();
        if let Some(cred) = cred {
            let nonce = client_nonce(SystemTime::now());
            let msg_id = match task.key() {
                Some(key) => cred.msg_id(key),
                None => nonce.clone(),
            };
            headers.insert("Nats-Msg-Id", msg_id.as_str());
            cred.sign_message(&nonce, &subject, &mut headers, &body);
        }
        let js = async_nats::jetstream::new(self.client.clone());
        let ack = js
            .publish_with_headers(subject, headers, body)
            .await
            .unwrap()
            .await
            .unwrap();
        TaskId(ack.sequence)
    }

    async fn until(
        &self,
        id: TaskId,
        what: &str,
        check: impl Fn(&TaskStatus) -> bool,
    ) -> TaskStatus {
        let admin = Credential::token(ADMIN);
        eventually(&format!("task {id}: {what}"), || {
            let admin = admin.clone();
            let check = &check;
            async move {
                let s = self
                    .get(Some(&admin), id)
                    .await
                    .map_err(|e| e.to_string())?;
                if check(&s) {
                    Ok(s)
                } else {
                    Err(format!("{:?} {:?}", s.state, s.error))
                }
            }
        })
        .await
    }

    async fn worker_registered(&self, id: &str) {
        eventually(&format!("worker {id} to register"), || async move {
            let snap = self.snapshot().await;
            if snap.workers.iter().any(|w| w.id == id) {
                Ok(())
            } else {
                Err(format!("{:?}", snap.workers))
            }
        })
        .await;
    }

    fn runs(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("runs.log")).unwrap_or_default()
    }
}

/// A worker session opened by hand, as `cronoq worker` does it.
struct HandSession(cronoq::auth::WorkerSession);

impl HandSession {
    async fn call<Q: Serialize, R: DeserializeOwned>(
        &self,
        s: &Setup,
        worker_id: &str,
        verb: &str,
        body: &Q,
    ) -> Result<R, WireError> {
        let subject = s.subjects.worker_api(worker_id, verb);
        let body = wire::encode(body);
        let mut headers = HeaderMap::new();
        self.0.sign(&subject, &mut headers, &body);
        let reply = s
            .client
            .request_with_headers(subject, headers, body.into())
            .await
            .unwrap();
        match wire::decode::<Reply<R>>(&reply.payload).unwrap() {
            Reply::Ok(r) => Ok(r),
            Reply::Error(e) => Err(e),
        }
    }
}

/// Registers `id` with the nkey credential over the wire: challenge,
/// signed `Register`, sealed session key.
async fn register_over_the_wire(s: &Setup, id: &str, labels: &str) -> HandSession {
    let challenge: wire::ChallengeReply = s
        .request(
            None,
            &s.subjects.worker_api(id, "challenge"),
            &wire::Challenge::default(),
        )
        .await
        .unwrap();
    let keys = cronoq::auth::WorkerKeys::new();
    let register = wire::Register {
        lease_batches: false,
        v: PROTOCOL_VERSION,
        worker_id: id.into(),
        pool: PoolName::new("default").unwrap(),
        labels: Labels::parse(labels).unwrap(),
        slots: 1,
        xkey: Some(keys.public_key()),
        instance: Some(format!("{id}-by-hand")),
        running: Vec::new(),
    };
    let subject = s.subjects.worker_api(id, "register");
    let body = wire::encode(&register);
    let mut headers = HeaderMap::new();
    Credential::nkey_seed(&s.nkey.seed().unwrap())
        .unwrap()
        .sign_message(&challenge.nonce, &subject, &mut headers, &body);
    let reply = s
        .client
        .request_with_headers(subject, headers, body.into())
        .await
        .unwrap();
    let reply = match wire::decode::<Reply<wire::RegisterReply>>(&reply.payload).unwrap() {
        Reply::Ok(r) => r,
        Reply::Error(e) => panic!("registering {id}: {e}"),
    };
    let grant = reply.session.expect("a session");
    HandSession(
        keys.open(&cronoq::auth::Grant {
            id: grant.id,
            sealed_key: grant.sealed_key.to_vec(),
            server_xkey: grant.server_xkey,
        })
        .expect("the session key opens"),
    )
}

fn labelled(payload: &str, labels: &str) -> Task {
    let mut task = Task::new(payload.to_string());
    for l in labels.split(',').filter(|l| !l.is_empty()) {
        task = task.label_text(l);
    }
    task
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_register_with_a_token_or_an_nkey_and_claim_only_their_labels() {
    let mut s = Setup::start().await;
    let sub = Credential::token(SUB_A);
    // Waiting before any worker registers: leased in the very turn that
    // registers the worker, so the lease must already carry the session.
    let early = s.submit(Some(&sub), &labelled("early", "gpu=a100")).await;
    s.until(early, "queued", |t| t.state == TaskState::Queued)
        .await;
    s.token_worker("gpu-a100", "gpu=a100,zone=eu");
    s.nkey_worker("gpu-h100", "gpu=h100");
    s.worker_registered("gpu-a100").await;
    s.worker_registered("gpu-h100").await;

    let a = s.submit(Some(&sub), &labelled("on-a100", "gpu=a100")).await;
    let h = s.submit(Some(&sub), &labelled("on-h100", "gpu=h100")).await;
    let a = s
        .until(a, "succeeded", |t| t.state == TaskState::Succeeded)
        .await;
    let h = s
        .until(h, "succeeded", |t| t.state == TaskState::Succeeded)
        .await;
    assert_eq!(
        a.output.as_deref(),
        Some("on-a100 on [gpu=a100,zone=eu] by gpu-a100")
    );
    assert_eq!(
        h.output.as_deref(),
        Some("on-h100 on [gpu=h100] by gpu-h100")
    );
    let early = s
        .until(early, "succeeded", |t| t.state == TaskState::Succeeded)
        .await;
    assert_eq!(early.attempts.len(), 1, "{:?}", early.attempts);
    let log = s.workers[0].log_tail(200);
    assert!(
        !log.contains("without this session's proof ignored"),
        "{log}"
    );

    // A claim outside the credential: refused PERMISSION_DENIED, the
    // worker exits, nothing registered.
    let before = s.snapshot().await.workers.len();
    let over = s.token_worker("over-claim", "gpu=h100");
    let unknown = {
        s.workers.push(CronoqWorker::start_with(
            &s.nats.url(),
            s.dir.path(),
            "stranger",
            "gpu=a100",
            1,
            &["--token-env", "T_X"],
            &[("T_X", "a-token-nobody-configured")],
        ));
        s.workers.len() - 1
    };
    let wrong_pool = {
        let seed = s.dir.path().join("wrong-pool.nk");
        std::fs::write(&seed, s.nkey.seed().unwrap()).unwrap();
        let mut cmd_args = vec!["--nkey-seed", seed.to_str().unwrap()];
        cmd_args.extend(["--pool", "other"]);
        s.workers.push(CronoqWorker::start_with(
            &s.nats.url(),
            s.dir.path(),
            "wrong-pool",
            "gpu=h100",
            1,
            &cmd_args,
            &[],
        ));
        s.workers.len() - 1
    };
    for (i, code) in [
        (over, "PERMISSION_DENIED"),
        (unknown, "UNAUTHENTICATED"),
        (wrong_pool, "PERMISSION_DENIED"),
    ] {
        let status = eventually("the refused worker to exit", || {
            let exited = s.workers[i].exited();
            async move { exited.ok_or_else(|| "still running".to_string()) }
        })
        .await;
        assert!(!status.success());
        let log = s.workers[i].log_tail(40);
        assert!(log.contains(code), "worker {i} should say {code}:\n{log}");
        assert!(!log.contains(GPU), "a token in the log:\n{log}");
    }
    let snap = s.snapshot().await;
    assert_eq!(snap.workers.len(), before, "{:?}", snap.workers);
    assert!(!snap
        .workers
        .iter()
        .any(|w| w.id == "over-claim" || w.id == "stranger" || w.id == "wrong-pool"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spoofed_worker_messages_are_refused_and_change_nothing() {
    let mut s = Setup::start().await;
    let sub = Credential::token(SUB_A);
    let w = s.token_worker("victim", "gpu=a100");
    s.worker_registered("victim").await;

    // A task that holds until released, so its attempt is running.
    let held = s
        .submit(Some(&sub), &labelled("held hold=go", "gpu=a100"))
        .await;
    s.until(held, "running", |t| t.state == TaskState::Running)
        .await;
    let attacker = s.client.clone();
    let api = |verb: &str| s.subjects.worker_api("victim", verb);

    // A forged outcome (no session proof): refused, the attempt still runs.
    let forged = wire::AttemptReport {
        v: PROTOCOL_VERSION,
        worker_id: "victim".into(),
        task_id: held,
        attempt: 1,
        epoch: 1,
        result: wire::AttemptResult::Succeeded {
            output: bytes::Bytes::from_static(b"forged"),
        },
    };
    let e = s
        .request::<_, wire::Ack>(None, &api("outcome"), &forged)
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::UNAUTHENTICATED, "{e}");
    // Signed by another credential (a submitter): still no session.
    let e = s
        .request::<_, wire::Ack>(Some(&sub), &api("outcome"), &forged)
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::UNAUTHENTICATED, "{e}");

    // A forged deregistration: refused; the worker stays.
    let e = s
        .request::<_, wire::Ack>(
            None,
            &api("deregister"),
            &wire::Deregister {
                v: PROTOCOL_VERSION,
                worker_id: "victim".into(),
                drain: false,
            },
        )
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::UNAUTHENTICATED, "{e}");

    // Re-registering the victim's id into another pool: without a proof,
    // and with the nkey worker credential (the id is bound to the token).
    let hijack = wire::Register {
        lease_batches: false,
        v: PROTOCOL_VERSION,
        worker_id: "victim".into(),
        pool: PoolName::new("default").unwrap(),
        labels: Labels::parse("gpu=h100").unwrap(),
        slots: 100_000,
        xkey: Some(nkeys::XKey::new().public_key()),
        instance: Some("attacker".into()),
        running: Vec::new(),
    };
    let e = s
        .request::<_, wire::RegisterReply>(None, &api("register"), &hijack)
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::UNAUTHENTICATED, "{e}");
    let nonce: wire::ChallengeReply = s
        .request(None, &api("challenge"), &wire::Challenge::default())
        .await
        .unwrap();
    let body = wire::encode(&hijack);
    let mut headers = HeaderMap::new();
    let other = Credential::nkey_seed(&s.nkey.seed().unwrap()).unwrap();
    other.sign_message(&nonce.nonce, &api("register"), &mut headers, &body);
    let reply = attacker
        .request_with_headers(api("register"), headers.clone(), body.clone().into())
        .await
        .unwrap();
    match wire::decode::<Reply<wire::RegisterReply>>(&reply.payload).unwrap() {
        Reply::Error(e) => assert_eq!(e.code, ErrorCode::PERMISSION_DENIED, "{e}"),
        Reply::Ok(r) => panic!("hijack registered: {r:?}"),
    }
    // The same signed registration again: its nonce is used up.
    let reply = attacker
        .request_with_headers(api("register"), headers, body.into())
        .await
        .unwrap();
    match wire::decode::<Reply<wire::RegisterReply>>(&reply.payload).unwrap() {
        Reply::Error(e) => assert_eq!(e.code, ErrorCode::FAILED_PRECONDITION, "{e}"),
        Reply::Ok(r) => panic!("replayed registration accepted: {r:?}"),
    }

    // A worker with a valid session of its own (the nkey credential,
    // registered over the real protocol) cannot report the victim's
    // attempt: not under its own id (not leased to it), nor under the
    // victim's (the session is not the victim's).
    let intruder = register_over_the_wire(&s, "intruder", "gpu=h100").await;
    let mut as_intruder = forged.clone();
    as_intruder.worker_id = "intruder".into();
    let e = intruder
        .call::<_, wire::Ack>(&s, "intruder", "outcome", &as_intruder)
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::FAILED_PRECONDITION, "{e}");
    let e = intruder
        .call::<_, wire::Ack>(&s, "victim", "outcome", &forged)
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::PERMISSION_DENIED, "{e}");
    // Nor in a batch of outcomes: a report of another worker refuses the
    // whole request; its own report of the victim's attempt is refused
    // as not its lease; unsigned, nothing is read.
    let batch = |reports: Vec<wire::AttemptReport>| wire::AttemptReports {
        v: PROTOCOL_VERSION,
        worker_id: "intruder".into(),
        reports,
    };
    let e = intruder
        .call::<_, wire::AttemptReportsReply>(
            &s,
            "intruder",
            "outcomes",
            &batch(vec![as_intruder.clone(), forged.clone()]),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::INVALID_ARGUMENT, "{e}");
    let reply = intruder
        .call::<_, wire::AttemptReportsReply>(
            &s,
            "intruder",
            "outcomes",
            &batch(vec![as_intruder.clone(), as_intruder.clone()]),
        )
        .await
        .unwrap();
    assert_eq!(reply.refused.len(), 2);
    for refused in &reply.refused {
        let code = &refused.as_ref().expect("refused").code;
        assert_eq!(*code, ErrorCode::FAILED_PRECONDITION);
    }
    let e = s
        .request::<_, wire::AttemptReportsReply>(
            None,
            &api("outcomes"),
            &wire::AttemptReports {
                v: PROTOCOL_VERSION,
                worker_id: "victim".into(),
                reports: vec![forged.clone()],
            },
        )
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::UNAUTHENTICATED, "{e}");

    // An id in the subject that is not the body's: refused.
    let e = s
        .request::<_, wire::Ack>(None, &s.subjects.worker_api("attacker", "outcome"), &forged)
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::INVALID_ARGUMENT, "{e}");

    // A flood of made-up attempts in an unsigned heartbeat: "not
    // registered", no revocations, the real worker unaffected.
    let heartbeat = wire::Heartbeat {
        v: PROTOCOL_VERSION,
        worker_id: "victim".into(),
        free_slots: 0,
        running: (0..35_000)
            .map(|i| wire::RunningAttempt {
                task_id: TaskId(1_000_000 + i),
                attempt: 1,
            })
            .collect(),
    };
    let reply: wire::HeartbeatReply = s
        .request(None, &api("heartbeat"), &heartbeat)
        .await
        .unwrap();
    assert!(!reply.registered);

    // A made-up lease on the victim's lease subject (no session proof):
    // not obeyed.
    let lease = wire::Lease {
        v: PROTOCOL_VERSION,
        task_id: TaskId(999_999),
        attempt: 1,
        pool: PoolName::new("default").unwrap(),
        group: Labels::parse("gpu=a100").unwrap(),
        payload: bytes::Bytes::from_static(b"injected"),
        ttl: Millis(60_000),
        epoch: 1,
        traceparent: None,
    };
    attacker
        .publish(s.subjects.lease("victim"), wire::encode(&lease).into())
        .await
        .unwrap();
    attacker.flush().await.unwrap();

    // Nothing changed: the worker is there with its labels, pool and slot;
    // the held attempt is still its one running attempt; release it and
    // its real output is the result.
    let snap = s.snapshot().await;
    let victim = snap
        .workers
        .iter()
        .find(|w| w.id == "victim")
        .expect("victim registered");
    assert_eq!(
        (
            victim.pool.as_str(),
            victim.labels.to_string(),
            victim.slots
        ),
        ("default", "gpu=a100".into(), 1)
    );
    std::fs::write(s.dir.path().join("go"), "").unwrap();
    let done = s
        .until(held, "succeeded", |t| t.state == TaskState::Succeeded)
        .await;
    assert_eq!(done.output.as_deref(), Some("held on [gpu=a100] by victim"));
    assert_eq!(done.attempts.len(), 1);
    // One more task runs normally: the worker took no injected lease
    // (its slot was free for this one) and the log shows no injected run.
    let next = s.submit(Some(&sub), &labelled("after", "gpu=a100")).await;
    s.until(next, "succeeded", |t| t.state == TaskState::Succeeded)
        .await;
    let runs = s.runs();
    assert!(!runs.contains("injected"), "{runs}");
    assert!(!runs.contains("999999"), "{runs}");
    let log = s.workers[w].log_tail(200);
    assert!(
        log.contains("without this session's proof ignored"),
        "{log}"
    );
    assert!(!log.contains("revok"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_need_a_credential_a_role_a_pool_and_ownership() {
    let mut s = Setup::start().await;
    s.token_worker("w", "gpu=a100");
    s.worker_registered("w").await;
    let (a, b, reader, admin) = (
        Credential::token(SUB_A),
        Credential::token(SUB_B),
        Credential::token(READER),
        Credential::token(ADMIN),
    );
    let held = s
        .submit(Some(&a), &labelled("held hold=never", "gpu=a100"))
        .await;
    s.until(held, "running", |t| t.state == TaskState::Running)
        .await;

    // No credential: UNAUTHENTICATED for reads and cancels.
    assert_eq!(
        s.get(None, held).await.unwrap_err().code,
        ErrorCode::UNAUTHENTICATED
    );
    assert_eq!(
        s.cancel(None, held).await.unwrap_err().code,
        ErrorCode::UNAUTHENTICATED
    );
    // A reader reads but cannot cancel; a worker credential cannot read.
    assert_eq!(
        s.get(Some(&reader), held).await.unwrap().state,
        TaskState::Running
    );
    assert_eq!(
        s.cancel(Some(&reader), held).await.unwrap_err().code,
        ErrorCode::PERMISSION_DENIED
    );
    assert_eq!(
        s.get(Some(&Credential::token(GPU)), held)
            .await
            .unwrap_err()
            .code,
        ErrorCode::PERMISSION_DENIED
    );
    // Another submitter cannot cancel it; its owner can (an admin could).
    assert_eq!(
        s.cancel(Some(&b), held).await.unwrap_err().code,
        ErrorCode::PERMISSION_DENIED
    );
    assert_eq!(
        s.get(Some(&a), held).await.unwrap().state,
        TaskState::Running
    );
    s.cancel(Some(&a), held).await.unwrap();
    s.until(held, "cancelled", |t| t.state == TaskState::Cancelled)
        .await;
    let other = s
        .submit(Some(&b), &labelled("b-held hold=never", "gpu=a100"))
        .await;
    s.until(other, "running", |t| t.state == TaskState::Running)
        .await;
    s.cancel(Some(&admin), other).await.unwrap();
    s.until(other, "cancelled", |t| t.state == TaskState::Cancelled)
        .await;

    // A replayed request (same nonce) is refused.
    let subject = s.subjects.api("task");
    let body = wire::encode(&wire::GetTask {
        v: PROTOCOL_VERSION,
        task_id: held,
    });
    let mut headers = HeaderMap::new();
    a.sign_message(
        &client_nonce(SystemTime::now()),
        &subject,
        &mut headers,
        &body,
    );
    for expect_ok in [true, false] {
        let reply = s
            .client
            .request_with_headers(subject.clone(), headers.clone(), body.clone().into())
            .await
            .unwrap();
        match wire::decode::<Reply<TaskStatus>>(&reply.payload).unwrap() {
            Reply::Ok(_) => assert!(expect_ok, "a replay was answered"),
            Reply::Error(e) => {
                assert!(!expect_ok, "{e}");
                assert_eq!(e.code, ErrorCode::UNAUTHENTICATED);
            }
        }
    }

    // Submissions by a reader, by a worker, or to a pool not allowed are
    // recorded failed with the code; nothing runs. An unsigned one has
    // nobody to attribute it to: counted and dropped, never recorded
    // (issue 20 finding 4; it used to be recorded `[UNAUTHENTICATED]`).
    let unsigned = s.submit(None, &labelled("unsigned", "gpu=a100")).await;
    let by_reader = s
        .submit(Some(&reader), &labelled("by-reader", "gpu=a100"))
        .await;
    let by_worker = s
        .submit(
            Some(&Credential::token(GPU)),
            &labelled("by-worker", "gpu=a100"),
        )
        .await;
    let wrong_pool = s
        .submit(Some(&a), &labelled("wrong-pool", "gpu=a100").pool("other"))
        .await;
    let admin_cred = Credential::token(ADMIN);
    let admin_cred = &admin_cred;
    let s_ref = &s;
    eventually("the unsigned submission to be dropped", || async move {
        match s_ref.get(Some(admin_cred), unsigned).await {
            Err(e) if e.code == ErrorCode::NOT_FOUND => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    for (id, code) in [
        (by_reader, "[PERMISSION_DENIED]"),
        (by_worker, "[PERMISSION_DENIED]"),
        (wrong_pool, "[PERMISSION_DENIED]"),
    ] {
        let t = s
            .until(id, "refused", |t| t.state == TaskState::Failed)
            .await;
        assert!(
            t.error.as_deref().unwrap_or("").ends_with(code),
            "{:?}",
            t.error
        );
        assert!(t.attempts.is_empty());
    }

    // Idempotency keys are per credential: the same key from A and B is
    // two tasks; A again is A's task. A squatter publishing the key as a
    // plain Nats-Msg-Id first takes nothing from A.
    let js = async_nats::jetstream::new(s.client.clone());
    let mut squat = HeaderMap::new();
    squat.insert("Nats-Msg-Id", "shared-key");
    js.publish_with_headers(
        s.subjects.submit(&PoolName::new("default").unwrap()),
        squat,
        "squatted".into(),
    )
    .await
    .unwrap()
    .await
    .unwrap();
    let keyed = |payload: &str| labelled(payload, "gpu=a100").idempotency_key("shared-key");
    let from_a = s.submit(Some(&a), &keyed("from-a")).await;
    let from_b = s.submit(Some(&b), &keyed("from-b")).await;
    let again = s.submit(Some(&a), &keyed("from-a-again")).await;
    assert_ne!(from_a, from_b);
    assert_eq!(again, from_a, "JetStream dedupes A's own key");
    let ta = s
        .until(from_a, "succeeded", |t| t.state == TaskState::Succeeded)
        .await;
    let tb = s
        .until(from_b, "succeeded", |t| t.state == TaskState::Succeeded)
        .await;
    assert_eq!(ta.output.as_deref(), Some("from-a on [gpu=a100] by w"));
    assert_eq!(tb.output.as_deref(), Some("from-b on [gpu=a100] by w"));
}

/// Sessions are per leadership: after `kill -9` of the leader the workers
/// register again with the successor (new session, its leases signed by
/// it), the running attempt is re-attached and counts once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_get_new_sessions_from_a_new_leader() {
    let mut s = Setup::start().await;
    let mut standby = CronoqServer::start_configured(
        &s.nats,
        s.dir.path(),
        &config(&s.nkey.public_key()),
        &SERVER_ENV,
        false,
    )
    .await;
    let sub = Credential::token(SUB_A);
    s.token_worker("survivor", "gpu=a100");
    s.worker_registered("survivor").await;
    let held = s
        .submit(Some(&sub), &labelled("across hold=go2", "gpu=a100"))
        .await;
    s.until(held, "running", |t| t.state == TaskState::Running)
        .await;

    // Open routes stay open; a follower's /metrics works without a
    // credential to ask the leader with (its health alone).
    for server in [&s._server, &standby] {
        let (status, body) = procs::http_get(&format!("{}/metrics", server.http_url())).await;
        assert_eq!(status, 200, "{body}");
        let (status, _) = procs::http_get(&format!("{}/v1/snapshot", server.http_url())).await;
        assert_eq!(status, 401);
    }
    s._server.kill9();
    let standby_id = standby.id().to_string();
    eventually("the standby to lead, with the worker registered", || {
        let (snap, standby_id) = (s.try_snapshot(), standby_id.clone());
        async move {
            match tokio::time::timeout(Duration::from_secs(2), snap).await {
                Ok(Ok(snap))
                    if snap.leader.as_ref().is_some_and(|l| l.id == standby_id)
                        && snap.workers.iter().any(|w| w.id == "survivor") =>
                {
                    Ok(())
                }
                Ok(Ok(snap)) => Err(format!(
                    "leader {:?}, workers {:?}",
                    snap.leader, snap.workers
                )),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err("no answer".to_string()),
            }
        }
    })
    .await;
    std::fs::write(s.dir.path().join("go2"), "").unwrap();
    let done = s
        .until(held, "succeeded", |t| t.state == TaskState::Succeeded)
        .await;
    assert_eq!(
        done.output.as_deref(),
        Some("across on [gpu=a100] by survivor")
    );
    assert_eq!(done.attempts.len(), 1, "{:?}", done.attempts);
    // New work runs under the new leader's session.
    let next = s
        .submit(Some(&sub), &labelled("after-failover", "gpu=a100"))
        .await;
    s.until(next, "succeeded", |t| t.state == TaskState::Succeeded)
        .await;
    let log = s.workers[0].log_tail(300);
    assert!(
        !log.contains("without this session's proof ignored"),
        "{log}"
    );
    standby.kill9();
}

/// The number of messages a stream holds now.
async fn stream_messages(js: &async_nats::jetstream::Context, name: &str) -> u64 {
    js.get_stream(name)
        .await
        .unwrap_or_else(|e| panic!("stream {name}: {e}"))
        .info()
        .await
        .unwrap_or_else(|e| panic!("stream {name}: {e}"))
        .state
        .messages
}

/// Issue 20 finding 4: submissions no credential's proof verifies on (any
/// NATS user allowed to publish to the submit subject can send them by
/// the hundred thousand) leave one count by code and a bounded sample,
/// not a task record and a dead letter each, and the stream drops them;
/// a signed submission still runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsigned_submissions_leave_a_count_not_a_record_each() {
    const FLOOD: u64 = 2_000;
    let mut s = Setup::start().await;
    s.token_worker("gpu1", "gpu=a100");
    let js = async_nats::jetstream::new(s.client.clone());
    let results = format!("KV_{}", s.subjects.results_bucket());
    let dead_letters = s.subjects.dead_letter_stream();
    let (results_before, dead_before) = (
        stream_messages(&js, &results).await,
        stream_messages(&js, &dead_letters).await,
    );

    let (subject, headers, body) =
        wire::submission(&s.subjects, &labelled("unsigned", "gpu=a100")).unwrap();
    for _ in 0..FLOOD {
        s.client
            .publish_with_headers(subject.clone(), headers.clone(), body.clone())
            .await
            .unwrap();
    }
    // Garbage without a proof is the same: nobody to attribute it to.
    s.client
        .publish_with_headers(subject.clone(), headers.clone(), "not msgpack".into())
        .await
        .unwrap();
    s.client.flush().await.unwrap();

    let metrics_url = format!("{}/metrics", s._server.http_url());
    let metrics_url = &metrics_url;
    let unauthenticated = format!(
        "cronoq_submissions_refused_unattributed_total{{code=\"UNAUTHENTICATED\"}} {FLOOD}"
    );
    let unauthenticated = &unauthenticated;
    eventually(
        "the leader to count every unsigned submission",
        || async move {
            let (status, text) = procs::http_get(metrics_url).await;
            if status == 200 && text.contains(unauthenticated.as_str()) {
                Ok(text)
            } else {
                Err(text
                    .lines()
                    .filter(|l| l.contains("refused_unattributed"))
                    .collect::<Vec<_>>()
                    .join("\n"))
            }
        },
    )
    .await;
    // The malformed one counts under its own code.
    let (_, text) = procs::http_get(metrics_url).await;
    assert!(
        text.lines().any(|l| l.starts_with(
            "cronoq_submissions_refused_unattributed_total{code=\"INVALID_ARGUMENT\"} 1"
        )),
        "{text}"
    );

    // No record, no dead letter each; the stream drops them.
    let results_after = stream_messages(&js, &results).await;
    let dead_after = stream_messages(&js, &dead_letters).await;
    assert!(
        results_after < results_before + 10,
        "results stream {results_before} → {results_after}"
    );
    assert_eq!(dead_after, dead_before, "dead letters");
    let submit = s.subjects.submit_stream();
    let (js, submit) = (&js, &submit);
    eventually("the submit stream to drop them", || async move {
        match stream_messages(js, submit).await {
            0 => Ok(()),
            n => Err(format!("{n} messages")),
        }
    })
    .await;
    // The sample (last 64) is in the server's metrics; not a task.
    let e = s
        .get(Some(&Credential::token(ADMIN)), TaskId(1))
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::NOT_FOUND, "{e}");

    let valid = s
        .submit(
            Some(&Credential::token(SUB_A)),
            &labelled("valid", "gpu=a100"),
        )
        .await;
    let done = s
        .until(valid, "the signed submission to run", |t| {
            t.state.is_terminal()
        })
        .await;
    assert_eq!(done.state, TaskState::Succeeded, "{done:?}");
}
