//! What the credential tests share: a `cronoq server` with `[auth]
//! required = true` and its tokens, clients that sign by hand, and a
//! worker session opened by hand over the wire (`register_over_the_wire`),
//! as `cronoq worker` does it — so a test can speak for a worker
//! credential the way an attacker holding one would.

#![allow(dead_code)]

use std::time::SystemTime;

use async_nats::HeaderMap;
use cronoq::auth::{client_nonce, Credential};
use cronoq::core::{ErrorCode, Labels, PoolName, Snapshot, TaskId};
use cronoq::task::TaskStatus;
use cronoq::wire::{self, Reply, Subjects, WireError, PROTOCOL_VERSION};
use cronoq::Task;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::procs::{eventually, CronoqServer, CronoqWorker, NatsServer};

pub const GPU: &str = "gpu-worker-token-0123456789";
/// A second worker credential with the same pools and labels as `GPU`.
pub const GPU2: &str = "gpu-worker-two-token-0123456789";
pub const SUB_A: &str = "submitter-a-token-0123456789";
pub const SUB_B: &str = "submitter-b-token-0123456789";
pub const READER: &str = "reader-token-0123456789abcd";
pub const ADMIN: &str = "admin-token-0123456789abcdef";

pub fn config(nkey_public: &str) -> String {
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
token_env = "T_GPU2"
role = "worker"
pools = ["default"]
labels = ["gpu=a100", "zone=*"]

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

pub const SERVER_ENV: [(&str, &str); 6] = [
    ("T_GPU", GPU),
    ("T_SUB_A", SUB_A),
    ("T_SUB_B", SUB_B),
    ("T_READ", READER),
    ("T_ADMIN", ADMIN),
    ("T_GPU2", GPU2),
];

pub struct Setup {
    pub nats: NatsServer,
    pub _server: CronoqServer,
    pub dir: tempfile::TempDir,
    pub client: async_nats::Client,
    pub subjects: Subjects,
    pub nkey: nkeys::KeyPair,
    pub workers: Vec<CronoqWorker>,
}

impl Setup {
    pub async fn start() -> Setup {
        Setup::start_with(|text| text).await
    }

    /// Like [`Setup::start`], with the server config changed by `edit`.
    pub async fn start_with(edit: impl Fn(String) -> String) -> Setup {
        Setup::start_with_env(edit, &[]).await
    }

    /// Like [`Setup::start_with`], the server's environment extended by
    /// `env` (a storage key, say).
    pub async fn start_with_env(edit: impl Fn(String) -> String, env: &[(&str, &str)]) -> Setup {
        let nats = NatsServer::start();
        let dir = tempfile::Builder::new()
            .prefix("cronoq-auth-")
            .tempdir()
            .unwrap();
        let nkey = nkeys::KeyPair::new_user();
        let server = CronoqServer::start_configured(
            &nats,
            dir.path(),
            &edit(config(&nkey.public_key())),
            &[&SERVER_ENV[..], env].concat(),
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
    pub fn token_worker(&mut self, id: &str, labels: &str) -> usize {
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
    pub fn nkey_worker(&mut self, id: &str, labels: &str) -> usize {
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
    pub async fn request<Q: Serialize, R: DeserializeOwned>(
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

    pub async fn get(
        &self,
        cred: Option<&Credential>,
        id: TaskId,
    ) -> Result<TaskStatus, WireError> {
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

    pub async fn cancel(&self, cred: Option<&Credential>, id: TaskId) -> Result<(), WireError> {
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

    pub async fn snapshot(&self) -> Snapshot {
        self.try_snapshot()
            .await
            .expect("the admin reads the snapshot")
    }

    pub async fn try_snapshot(&self) -> Result<Snapshot, WireError> {
        self.request(
            Some(&Credential::token(ADMIN)),
            &self.subjects.api("snapshot"),
            &wire::GetSnapshot::default(),
        )
        .await
    }

    /// Publishes a submission as a client does, signed with `cred`; the
    /// stream's sequence (the task id).
    pub async fn submit(&self, cred: Option<&Credential>, task: &Task) -> TaskId {
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
        self.publish((subject, headers, body)).await
    }

    /// Publishes a submission to the stream as it is; the stream's
    /// sequence (the task id).
    pub async fn publish(
        &self,
        (subject, headers, body): (String, HeaderMap, bytes::Bytes),
    ) -> TaskId {
        let js = async_nats::jetstream::new(self.client.clone());
        let ack = js
            .publish_with_headers(subject, headers, body)
            .await
            .unwrap()
            .await
            .unwrap();
        TaskId(ack.sequence)
    }

    pub async fn until(
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

    pub async fn worker_registered(&self, id: &str) {
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

    pub fn runs(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("runs.log")).unwrap_or_default()
    }
}

/// A worker session opened by hand, as `cronoq worker` does it.
pub struct HandSession(pub cronoq::auth::WorkerSession);

impl HandSession {
    pub async fn call<Q: Serialize, R: DeserializeOwned>(
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
pub async fn register_over_the_wire(s: &Setup, id: &str, labels: &str) -> HandSession {
    let cred = Credential::nkey_seed(&s.nkey.seed().unwrap()).unwrap();
    match register_as(s, &cred, id, labels, 1, &[]).await {
        Ok((session, _)) => session,
        Err(e) => panic!("registering {id}: {e}"),
    }
}

/// Registers `id` with `cred` over the wire, offering `slots` and listing
/// `running` (task, attempt) as running: the session and the reply, or
/// the refusal.
pub async fn register_as(
    s: &Setup,
    cred: &Credential,
    id: &str,
    labels: &str,
    slots: u32,
    running: &[(u64, u32)],
) -> Result<(HandSession, wire::RegisterReply), WireError> {
    register_on(
        &s.client,
        &s.subjects,
        "default",
        cred,
        id,
        labels,
        slots,
        running,
    )
    .await
}

/// [`register_as`] over any NATS connection (one logged in as a worker's
/// NATS user, say), in `pool`.
#[allow(clippy::too_many_arguments)]
pub async fn register_on(
    client: &async_nats::Client,
    subjects: &Subjects,
    pool: &str,
    cred: &Credential,
    id: &str,
    labels: &str,
    slots: u32,
    running: &[(u64, u32)],
) -> Result<(HandSession, wire::RegisterReply), WireError> {
    let unavailable = |e: String| WireError::new(ErrorCode::UNAVAILABLE, e);
    let reply = client
        .request(
            subjects.worker_api(id, "challenge"),
            wire::encode(&wire::Challenge::default()).into(),
        )
        .await
        .map_err(|e| unavailable(e.to_string()))?;
    let challenge = match wire::decode::<Reply<wire::ChallengeReply>>(&reply.payload).unwrap() {
        Reply::Ok(c) => c,
        Reply::Error(e) => return Err(e),
    };
    let keys = cronoq::auth::WorkerKeys::new();
    let register = wire::Register {
        lease_batches: false,
        v: PROTOCOL_VERSION,
        worker_id: id.into(),
        pool: PoolName::new(pool).unwrap(),
        labels: Labels::parse(labels).unwrap(),
        slots,
        xkey: Some(keys.public_key()),
        instance: Some(format!("{id}-by-hand")),
        running: running
            .iter()
            .map(|&(t, attempt)| wire::RunningAttempt {
                task_id: TaskId(t),
                attempt,
            })
            .collect(),
    };
    let subject = subjects.worker_api(id, "register");
    let body = wire::encode(&register);
    let mut headers = HeaderMap::new();
    cred.sign_message(&challenge.nonce, &subject, &mut headers, &body);
    let reply = client
        .request_with_headers(subject, headers, body.into())
        .await
        .map_err(|e| unavailable(e.to_string()))?;
    let reply = match wire::decode::<Reply<wire::RegisterReply>>(&reply.payload).unwrap() {
        Reply::Ok(r) => r,
        Reply::Error(e) => return Err(e),
    };
    let grant = reply.session.clone().expect("a session");
    let session = keys
        .open(&cronoq::auth::Grant {
            id: grant.id,
            sealed_key: grant.sealed_key.to_vec(),
            server_xkey: grant.server_xkey,
        })
        .expect("the session key opens");
    Ok((HandSession(session), reply))
}

/// The heaviest flood one worker credential can send with its session:
/// `heartbeats` signed heartbeats, each listing `listed` attempts nobody
/// leased (a NATS message's worth at 30,000), published as fast as the
/// connection takes them, replies to `reply_to` (never read).
pub async fn heartbeat_flood(
    client: &async_nats::Client,
    subjects: &Subjects,
    session: &HandSession,
    worker_id: &str,
    reply_to: &str,
    heartbeats: u64,
    listed: u64,
) {
    let subject = subjects.worker_api(worker_id, "heartbeat");
    for n in 0..heartbeats {
        let body = wire::encode(&wire::Heartbeat {
            v: PROTOCOL_VERSION,
            worker_id: worker_id.into(),
            free_slots: 0,
            running: (n * listed..(n + 1) * listed)
                .map(|t| wire::RunningAttempt {
                    task_id: TaskId(1_000_000 + t),
                    attempt: 1,
                })
                .collect(),
        });
        let mut headers = HeaderMap::new();
        session.0.sign(&subject, &mut headers, &body);
        client
            .publish_with_reply_and_headers(
                subject.clone(),
                reply_to.to_string(),
                headers,
                body.into(),
            )
            .await
            .unwrap();
    }
    client.flush().await.unwrap();
}

pub fn labelled(payload: &str, labels: &str) -> Task {
    let mut task = Task::new(payload.to_string());
    for l in labels.split(',').filter(|l| !l.is_empty()) {
        task = task.label_text(l);
    }
    task
}

/// A Rust client that acts as `token` (requests time out after 10 s).
pub async fn as_token(nats: &NatsServer, token: &str) -> cronoq::client::Client {
    cronoq::client::ClientOptions::new()
        .token(token)
        .request_timeout(std::time::Duration::from_secs(10))
        .connect(&nats.url())
        .await
        .unwrap()
}
