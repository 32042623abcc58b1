//! The worker against a real `nats-server` and a fake leader written here
//! with async-nats: registration, leases, renewals, outcomes, revokes,
//! lost leases, re-registration and the drain on shutdown. The real
//! leader is tested end to end in `tests/`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{Error, Worker, WorkerOptions};
use crate::core::{ErrorCode, Labels, Millis, PoolName, RevokeReason, TaskId};
use crate::task::{TaskContext, TaskError};
use crate::test_nats::NatsServer;
use crate::wire::{
    self, Ack, AttemptReport, AttemptReports, AttemptReportsReply, AttemptResult, Deregister,
    Heartbeat, HeartbeatReply, Lease, Register, RegisterReply, Renew, RenewReply, Revoke, Subjects,
    WireError, PROTOCOL_VERSION,
};

const WAIT: Duration = Duration::from_secs(10);
const PREFIX: &str = "cqtest";

/// What the fake leader was asked.
#[derive(Debug)]
enum Seen {
    Register(Register),
    Heartbeat(Heartbeat),
    Renew(Renew),
    Outcome(AttemptReport),
    Deregister(Deregister),
}

/// How the fake leader answers.
struct Answers {
    register: Result<RegisterReply, WireError>,
    heartbeat_registered: bool,
    renew: Result<RenewReply, WireError>,
    /// While set, outcome replies wait until it turns false.
    hold_outcomes: Option<tokio::sync::watch::Receiver<bool>>,
    /// Outcome requests (`outcome` or `outcomes`) received.
    outcome_requests: usize,
    /// Outcomes in them.
    outcomes_seen: usize,
    /// An older leader: `outcomes` is an unknown verb.
    no_outcomes: bool,
    /// `outcomes` requests refused so.
    outcomes_refused: usize,
}

fn register_reply(epoch: u64) -> RegisterReply {
    RegisterReply {
        v: PROTOCOL_VERSION,
        epoch,
        heartbeat_interval: Millis(100),
        worker_timeout: Millis(1_000),
        lease_ttl: Millis(150),
        adopted: Vec::new(),
        session: None,
    }
}

/// Answers `P.api.*` as configured and records every request.
struct FakeLeader {
    client: async_nats::Client,
    subjects: Subjects,
    answers: Arc<Mutex<Answers>>,
    seen: mpsc::UnboundedReceiver<Seen>,
    task: JoinHandle<()>,
}

impl FakeLeader {
    async fn start(url: &str, epoch: u64) -> FakeLeader {
        let client = async_nats::connect(url).await.unwrap();
        let subjects = Subjects::new(PREFIX).unwrap();
        let mut requests = client.subscribe(format!("{PREFIX}.w.*.*")).await.unwrap();
        client.flush().await.unwrap();
        let answers = Arc::new(Mutex::new(Answers {
            register: Ok(register_reply(epoch)),
            heartbeat_registered: true,
            renew: Ok(RenewReply {
                v: PROTOCOL_VERSION,
                ttl: Millis(150),
            }),
            hold_outcomes: None,
            outcome_requests: 0,
            outcomes_seen: 0,
            no_outcomes: false,
            outcomes_refused: 0,
        }));
        let (tx, seen) = mpsc::unbounded_channel();
        let task = {
            let client = client.clone();
            let answers = answers.clone();
            tokio::spawn(async move {
                while let Some(m) = requests.next().await {
                    let verb = m.subject.as_str().rsplit('.').next().unwrap().to_string();
                    let (seen, body, hold) = {
                        let mut a = answers.lock().unwrap();
                        let hold = a
                            .hold_outcomes
                            .clone()
                            .filter(|_| verb.starts_with("outcome"));
                        if verb.starts_with("outcome") {
                            a.outcome_requests += 1;
                        }
                        let (seen, body) = match verb.as_str() {
                            "register" => {
                                // A registered worker is known again.
                                a.heartbeat_registered |= a.register.is_ok();
                                (
                                    vec![Seen::Register(wire::decode(&m.payload).unwrap())],
                                    wire::encode_reply(&a.register),
                                )
                            }
                            "heartbeat" => (
                                vec![Seen::Heartbeat(wire::decode(&m.payload).unwrap())],
                                wire::encode_reply(&Ok(HeartbeatReply {
                                    v: PROTOCOL_VERSION,
                                    epoch: a.register.as_ref().map(|r| r.epoch).unwrap_or(0),
                                    registered: a.heartbeat_registered,
                                })),
                            ),
                            "renew" => (
                                vec![Seen::Renew(wire::decode(&m.payload).unwrap())],
                                wire::encode_reply(&a.renew),
                            ),
                            "outcome" => (
                                {
                                    a.outcomes_seen += 1;
                                    vec![Seen::Outcome(wire::decode(&m.payload).unwrap())]
                                },
                                wire::encode_reply(&Ok(Ack::default())),
                            ),
                            "outcomes" if a.no_outcomes => (
                                {
                                    a.outcomes_refused += 1;
                                    Vec::new()
                                },
                                wire::encode_reply::<Ack>(&Err(WireError::new(
                                    ErrorCode::NOT_FOUND,
                                    "unknown worker verb \"outcomes\"",
                                ))),
                            ),
                            "outcomes" => {
                                let batch: AttemptReports = wire::decode(&m.payload).unwrap();
                                a.outcomes_seen += batch.reports.len();
                                let reply = AttemptReportsReply {
                                    v: PROTOCOL_VERSION,
                                    refused: vec![None; batch.reports.len()],
                                };
                                (
                                    batch.reports.into_iter().map(Seen::Outcome).collect(),
                                    wire::encode_reply(&Ok(reply)),
                                )
                            }
                            "deregister" => (
                                vec![Seen::Deregister(wire::decode(&m.payload).unwrap())],
                                wire::encode_reply(&Ok(Ack::default())),
                            ),
                            other => panic!("unexpected request {other}"),
                        };
                        (seen, body, hold)
                    };
                    for seen in seen {
                        if tx.send(seen).is_err() {
                            return;
                        }
                    }
                    if let Some(reply) = m.reply {
                        let client = client.clone();
                        tokio::spawn(async move {
                            if let Some(mut hold) = hold {
                                let _ = hold.wait_for(|held| !held).await;
                            }
                            let _ = client.publish(reply, body.into()).await;
                        });
                    }
                }
            })
        };
        FakeLeader {
            client,
            subjects,
            answers,
            seen,
            task,
        }
    }

    /// The next request that `pick` accepts; others are passed to `other`.
    async fn next<T>(
        &mut self,
        mut pick: impl FnMut(&Seen) -> Option<T>,
        mut other: impl FnMut(&Seen),
    ) -> T {
        let deadline = Instant::now() + WAIT;
        loop {
            let seen = tokio::time::timeout_at(deadline, self.seen.recv())
                .await
                .expect("timed out waiting for a request")
                .expect("fake leader stopped");
            match pick(&seen) {
                Some(t) => return t,
                None => other(&seen),
            }
        }
    }

    async fn lease(&self, worker: &str, lease: &Lease) {
        self.client
            .publish(self.subjects.lease(worker), wire::encode(lease).into())
            .await
            .unwrap();
        self.client.flush().await.unwrap();
    }

    async fn revoke(&self, worker: &str, revoke: &Revoke) {
        self.client
            .publish(self.subjects.revoke(worker), wire::encode(revoke).into())
            .await
            .unwrap();
        self.client.flush().await.unwrap();
    }
}

impl Drop for FakeLeader {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn lease(task: u64, attempt: u32, epoch: u64, payload: &str) -> Lease {
    Lease {
        v: PROTOCOL_VERSION,
        task_id: TaskId(task),
        attempt,
        pool: PoolName::new("inference").unwrap(),
        group: Labels::from([("gpu", "a100")]),
        payload: Bytes::from(payload.to_string()),
        ttl: Millis(150),
        epoch,
        traceparent: None,
        schedule: None,
        scheduled_at: None,
    }
}

fn options(url: &str, id: &str) -> WorkerOptions {
    WorkerOptions::new(url)
        .pool("inference")
        .label("gpu", "a100")
        .slots(2)
        .id(id)
        .prefix(PREFIX)
        .grace(Duration::from_secs(5))
        .request_timeout(Duration::from_secs(1))
}

/// A worker running in the background until `stop` is sent.
struct Running {
    stop: Option<oneshot::Sender<()>>,
    join: JoinHandle<Result<(), Error>>,
}

impl Running {
    fn spawn(worker: Worker) -> Running {
        let (stop, stopped) = oneshot::channel::<()>();
        let join = tokio::spawn(worker.run_until(async {
            let _ = stopped.await;
        }));
        Running {
            stop: Some(stop),
            join,
        }
    }

    fn shutdown(&mut self) {
        let _ = self.stop.take().unwrap().send(());
    }

    async fn finished(self) -> Result<(), Error> {
        tokio::time::timeout(WAIT, self.join)
            .await
            .expect("worker did not stop")
            .unwrap()
    }
}

/// Sets a flag when dropped: tells that a handler's future was dropped.
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

async fn wait_for(mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !condition() {
        assert!(Instant::now() < deadline, "condition not met in time");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A handler for the tests: payload `sleep:<ms>` sleeps then echoes its
/// context, `hang` waits forever (with a drop flag), `fail` fails
/// permanently, `panic` panics.
fn handler(
    dropped: Arc<AtomicBool>,
) -> impl Fn(TaskContext, Bytes) -> futures_util::future::BoxFuture<'static, Result<Bytes, TaskError>>
       + Send
       + Sync
       + 'static {
    move |ctx: TaskContext, payload: Bytes| {
        let dropped = dropped.clone();
        Box::pin(async move {
            let text = String::from_utf8(payload.to_vec()).unwrap();
            if let Some(ms) = text.strip_prefix("sleep:") {
                tokio::time::sleep(Duration::from_millis(ms.parse().unwrap())).await;
                return Ok(Bytes::from(format!(
                    "{}|{}|{}|{}",
                    ctx.task_id, ctx.attempt, ctx.pool, ctx.group
                )));
            }
            match text.as_str() {
                "hang" => {
                    let _flag = DropFlag(dropped);
                    std::future::pending::<()>().await;
                    unreachable!()
                }
                "fail" => Err(TaskError::permanent("bad payload")),
                "panic" => panic!("boom"),
                other => Ok(Bytes::from(other.to_string())),
            }
        })
    }
}

fn mentions(seen: &Seen, task: u64) -> bool {
    let id = TaskId(task);
    match seen {
        Seen::Heartbeat(h) => h.running.iter().any(|r| r.task_id == id),
        Seen::Renew(r) => r.task_id == id,
        Seen::Outcome(o) => o.task_id == id,
        Seen::Register(_) | Seen::Deregister(_) => false,
    }
}

#[tokio::test]
async fn lease_runs_renews_and_reports_outcome() {
    let nats = NatsServer::start();
    let mut leader = FakeLeader::start(&nats.url, 7).await;
    let dropped = Arc::new(AtomicBool::new(false));
    let mut worker = Running::spawn(Worker::new(options(&nats.url, "w1"), handler(dropped)));

    let register = leader
        .next(
            |s| match s {
                Seen::Register(r) => Some(r.clone()),
                _ => None,
            },
            |_| {},
        )
        .await;
    assert_eq!(register.worker_id, "w1");
    assert_eq!(register.pool.as_str(), "inference");
    assert_eq!(register.labels.to_string(), "gpu=a100");
    assert_eq!(register.slots, 2);
    assert_eq!(register.xkey, None);

    // A lease of another epoch is ignored; the current one runs.
    leader.lease("w1", &lease(1, 1, 6, "sleep:0")).await;
    leader.lease("w1", &lease(2, 1, 7, "sleep:400")).await;

    let mut stale_seen = false;
    let renew = leader
        .next(
            |s| match s {
                Seen::Renew(r) => Some(r.clone()),
                _ => None,
            },
            |s| stale_seen |= mentions(s, 1),
        )
        .await;
    assert_eq!(
        (
            renew.worker_id.as_str(),
            renew.task_id,
            renew.attempt,
            renew.epoch
        ),
        ("w1", TaskId(2), 1, 7)
    );
    let heartbeat = leader
        .next(
            |s| match s {
                Seen::Heartbeat(h) if !h.running.is_empty() => Some(h.clone()),
                _ => None,
            },
            |s| stale_seen |= mentions(s, 1),
        )
        .await;
    assert_eq!(heartbeat.free_slots, 1);
    assert_eq!(heartbeat.running.len(), 1);
    assert_eq!(heartbeat.running[0].task_id, TaskId(2));
    let report = leader
        .next(
            |s| match s {
                Seen::Outcome(o) => Some(o.clone()),
                _ => None,
            },
            |s| stale_seen |= mentions(s, 1),
        )
        .await;
    assert!(!stale_seen, "the stale lease was run");
    assert_eq!(
        (report.task_id, report.attempt, report.epoch),
        (TaskId(2), 1, 7)
    );
    assert_eq!(
        report.result,
        AttemptResult::Succeeded {
            output: Bytes::from("2|1|inference|gpu=a100")
        }
    );
    // Acknowledged: the slot is free again.
    leader
        .next(
            |s| match s {
                Seen::Heartbeat(h) if h.running.is_empty() && h.free_slots == 2 => Some(()),
                _ => None,
            },
            |_| {},
        )
        .await;

    // Failures and panics are reported as such.
    leader.lease("w1", &lease(3, 1, 7, "fail")).await;
    leader.lease("w1", &lease(4, 2, 7, "panic")).await;
    let mut reports = Vec::new();
    while reports.len() < 2 {
        let r = leader
            .next(
                |s| match s {
                    Seen::Outcome(o) => Some(o.clone()),
                    _ => None,
                },
                |_| {},
            )
            .await;
        reports.push(r);
    }
    reports.sort_by_key(|r| r.task_id);
    assert_eq!(
        reports[0].result,
        AttemptResult::Failed {
            error: "bad payload".into(),
            retryable: false
        }
    );
    assert_eq!(
        reports[1].result,
        AttemptResult::Failed {
            error: "handler panicked: boom".into(),
            retryable: true
        }
    );

    worker.shutdown();
    let drains: Vec<bool> = vec![
        leader
            .next(
                |s| match s {
                    Seen::Deregister(d) => Some(d.drain),
                    _ => None,
                },
                |_| {},
            )
            .await,
        leader
            .next(
                |s| match s {
                    Seen::Deregister(d) => Some(d.drain),
                    _ => None,
                },
                |_| {},
            )
            .await,
    ];
    assert_eq!(drains, [true, false]);
    worker.finished().await.unwrap();
}

#[tokio::test]
async fn revoke_cancels_the_attempt() {
    let nats = NatsServer::start();
    let mut leader = FakeLeader::start(&nats.url, 3).await;
    let dropped = Arc::new(AtomicBool::new(false));
    let mut worker = Running::spawn(Worker::new(
        options(&nats.url, "w2"),
        handler(dropped.clone()),
    ));
    leader
        .next(|s| matches!(s, Seen::Register(_)).then_some(()), |_| {})
        .await;

    leader.lease("w2", &lease(10, 2, 3, "hang")).await;
    leader
        .next(
            |s| match s {
                Seen::Heartbeat(h) if h.running.iter().any(|r| r.task_id == TaskId(10)) => Some(()),
                _ => None,
            },
            |_| {},
        )
        .await;
    // A revoke from an older epoch is ignored; the current one stops it.
    let mut revoke = Revoke {
        v: PROTOCOL_VERSION,
        task_id: TaskId(10),
        attempt: 2,
        epoch: 2,
        reason: RevokeReason::Cancelled,
        grace: None,
    };
    leader.revoke("w2", &revoke).await;
    revoke.epoch = 3;
    leader.revoke("w2", &revoke).await;
    let report = leader
        .next(
            |s| match s {
                Seen::Outcome(o) => Some(o.clone()),
                _ => None,
            },
            |_| {},
        )
        .await;
    assert_eq!(
        (report.task_id, report.attempt, report.epoch),
        (TaskId(10), 2, 3)
    );
    assert_eq!(report.result, AttemptResult::Cancelled);
    assert!(dropped.load(Ordering::SeqCst));

    worker.shutdown();
    worker.finished().await.unwrap();
}

#[tokio::test]
async fn lost_lease_stops_the_attempt_without_a_report() {
    let nats = NatsServer::start();
    let mut leader = FakeLeader::start(&nats.url, 1).await;
    leader.answers.lock().unwrap().renew = Err(WireError::new(
        ErrorCode::FAILED_PRECONDITION,
        "attempt 1 of task 5 is not live",
    ));
    let dropped = Arc::new(AtomicBool::new(false));
    let mut worker = Running::spawn(Worker::new(
        options(&nats.url, "w3"),
        handler(dropped.clone()),
    ));
    leader
        .next(|s| matches!(s, Seen::Register(_)).then_some(()), |_| {})
        .await;

    leader.lease("w3", &lease(5, 1, 1, "hang")).await;
    leader
        .next(|s| matches!(s, Seen::Renew(_)).then_some(()), |_| {})
        .await;
    wait_for(|| dropped.load(Ordering::SeqCst)).await;
    let mut reported = false;
    leader
        .next(
            |s| match s {
                Seen::Heartbeat(h) if h.running.is_empty() => Some(()),
                _ => None,
            },
            |s| reported |= matches!(s, Seen::Outcome(_)),
        )
        .await;
    assert!(!reported, "a lost attempt was reported");

    worker.shutdown();
    worker.finished().await.unwrap();
}

#[tokio::test]
async fn refused_registration_ends_the_worker_with_its_code() {
    let nats = NatsServer::start();
    let leader = FakeLeader::start(&nats.url, 1).await;
    leader.answers.lock().unwrap().register = Err(WireError::new(
        ErrorCode::PERMISSION_DENIED,
        "worker may not claim gpu=a100",
    ));
    let worker = Worker::new(options(&nats.url, "w4"), handler(Arc::default()));
    let error = tokio::time::timeout(WAIT, worker.run_until(std::future::pending()))
        .await
        .expect("worker kept running")
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::PERMISSION_DENIED);
    let wire = WireError::from(error);
    assert_eq!(
        wire.to_string(),
        "leader refused registration: worker may not claim gpu=a100 [PERMISSION_DENIED]"
    );
}

#[tokio::test]
async fn bad_options_fail_before_connecting() {
    // Nothing listens here: validation must fail first.
    let url = "nats://127.0.0.1:1";
    for options in [
        options(url, "w5").label_text("gpu"),
        options(url, "w5").label("gpu", "a 100"),
        options(url, "w.5"),
        options(url, "w5").slots(0),
        options(url, "w5").pool("no pool"),
        options(url, "w5").nkey_seed("SUnot-a-seed"),
        options(url, "w5")
            .token("t0k-t0k-t0k-t0k-t0k")
            .nkey_seed(nkeys::KeyPair::new_user().seed().unwrap()),
        options(url, "w5").prefix("a.b"),
        options(url, "w5").token(""),
        options(url, "w5")
            .token("t0k-t0k-t0k-t0k-t0k")
            .credential(crate::auth::Credential::token("another-t0k-t0k")),
    ] {
        let worker = Worker::new(options, handler(Arc::default()));
        let error = tokio::time::timeout(WAIT, worker.run_until(std::future::pending()))
            .await
            .expect("worker kept running")
            .unwrap_err();
        assert_eq!(error.code(), ErrorCode::INVALID_ARGUMENT, "{error}");
    }
}

#[tokio::test]
async fn waits_for_a_leader_and_registers_again_when_forgotten() {
    let nats = NatsServer::start();
    let worker = Worker::new(options(&nats.url, "w6"), handler(Arc::default()));
    let mut worker = Running::spawn(worker);
    // No leader yet: the worker keeps trying (no responders).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!worker.join.is_finished());
    let mut leader = FakeLeader::start(&nats.url, 1).await;
    let register = leader
        .next(
            |s| match s {
                Seen::Register(r) => Some(r.clone()),
                _ => None,
            },
            |_| {},
        )
        .await;
    assert_eq!(register.worker_id, "w6");

    // The leader restarts with a new epoch and forgets the worker.
    {
        let mut answers = leader.answers.lock().unwrap();
        answers.heartbeat_registered = false;
        answers.register = Ok(register_reply(2));
    }
    leader
        .next(|s| matches!(s, Seen::Register(_)).then_some(()), |_| {})
        .await;
    // Leases of the new epoch run now.
    leader.lease("w6", &lease(20, 1, 2, "done")).await;
    let report = leader
        .next(
            |s| match s {
                Seen::Outcome(o) => Some(o.clone()),
                _ => None,
            },
            |_| {},
        )
        .await;
    assert_eq!(report.epoch, 2);
    assert_eq!(
        report.result,
        AttemptResult::Succeeded {
            output: Bytes::from("done")
        }
    );

    worker.shutdown();
    worker.finished().await.unwrap();
}

#[tokio::test]
async fn shutdown_drains_within_the_grace_then_aborts() {
    let nats = NatsServer::start();
    let mut leader = FakeLeader::start(&nats.url, 4).await;
    let dropped = Arc::new(AtomicBool::new(false));
    let options = options(&nats.url, "w7").grace(Duration::from_millis(600));
    let mut worker = Running::spawn(Worker::new(options, handler(dropped.clone())));
    leader
        .next(|s| matches!(s, Seen::Register(_)).then_some(()), |_| {})
        .await;

    leader.lease("w7", &lease(30, 1, 4, "sleep:200")).await;
    leader.lease("w7", &lease(31, 1, 4, "hang")).await;
    leader
        .next(
            |s| match s {
                Seen::Heartbeat(h) if h.running.len() == 2 => Some(()),
                _ => None,
            },
            |_| {},
        )
        .await;
    worker.shutdown();
    leader
        .next(
            |s| matches!(s, Seen::Deregister(Deregister { drain: true, .. })).then_some(()),
            |_| {},
        )
        .await;
    // A lease that crosses the drain is not run.
    leader.lease("w7", &lease(32, 1, 4, "sleep:0")).await;
    let mut outcomes = Vec::new();
    leader
        .next(
            |s| matches!(s, Seen::Deregister(Deregister { drain: false, .. })).then_some(()),
            |s| {
                if let Seen::Outcome(o) = s {
                    outcomes.push(o.task_id);
                }
            },
        )
        .await;
    // The quick attempt finished within the grace; the hanging one was
    // aborted and left for the leader to count as lost.
    assert_eq!(outcomes, [TaskId(30)]);
    assert!(dropped.load(Ordering::SeqCst));
    worker.finished().await.unwrap();
}

/// Outcomes that end while earlier reports are on the way travel
/// together: with the leader holding its replies, a worker that finished
/// 12 attempts has at most 4 requests (its limit in flight) out, the rest
/// queued or inside them; once answered, every outcome arrives in fewer
/// requests than outcomes.
#[tokio::test]
async fn outcomes_that_end_together_go_in_one_request() {
    let nats = NatsServer::start();
    let mut leader = FakeLeader::start(&nats.url, 7).await;
    let (hold, held) = tokio::sync::watch::channel(true);
    leader.answers.lock().unwrap().hold_outcomes = Some(held);
    let dropped = Arc::new(AtomicBool::new(false));
    // No request times out while the replies are held.
    let options = options(&nats.url, "w1")
        .slots(16)
        .request_timeout(Duration::from_secs(60));
    let mut worker = Running::spawn(Worker::new(options, handler(dropped)));
    leader
        .next(|s| matches!(s, Seen::Register(_)).then_some(()), |_| {})
        .await;
    // Leases before the registration's reply reached the worker would be
    // of an epoch it does not know yet: wait for a heartbeat first.
    leader
        .next(|s| matches!(s, Seen::Heartbeat(_)).then_some(()), |_| {})
        .await;
    for task in 1..=12 {
        leader.lease("w1", &lease(task, 1, 7, "done")).await;
    }
    wait_for(|| {
        let a = leader.answers.lock().unwrap();
        a.outcomes_seen == 12 || a.outcome_requests >= 4
    })
    .await;
    let out = leader.answers.lock().unwrap().outcome_requests;
    assert!(out <= 4, "{out} requests in flight");
    hold.send(false).unwrap();
    let mut reported = std::collections::BTreeSet::new();
    while reported.len() < 12 {
        let task = leader
            .next(
                |s| match s {
                    Seen::Outcome(o) => Some(o.task_id),
                    _ => None,
                },
                |_| {},
            )
            .await;
        reported.insert(task);
    }
    let requests = leader.answers.lock().unwrap().outcome_requests;
    assert!(requests < 12, "{requests} requests for 12 outcomes");
    worker.shutdown();
    worker.finished().await.unwrap();
}

/// A leader older than `outcomes` answers it "unknown verb": the worker
/// reports those outcomes again one per request, and every one arrives.
#[tokio::test]
async fn an_older_leader_gets_one_outcome_per_request() {
    let nats = NatsServer::start();
    let mut leader = FakeLeader::start(&nats.url, 7).await;
    let (hold, held) = tokio::sync::watch::channel(true);
    {
        let mut a = leader.answers.lock().unwrap();
        a.hold_outcomes = Some(held);
        a.no_outcomes = true;
    }
    let dropped = Arc::new(AtomicBool::new(false));
    let options = options(&nats.url, "w1")
        .slots(16)
        .request_timeout(Duration::from_secs(60));
    let mut worker = Running::spawn(Worker::new(options, handler(dropped)));
    leader
        .next(|s| matches!(s, Seen::Register(_)).then_some(()), |_| {})
        .await;
    leader
        .next(|s| matches!(s, Seen::Heartbeat(_)).then_some(()), |_| {})
        .await;
    for task in 1..=12 {
        leader.lease("w1", &lease(task, 1, 7, "done")).await;
    }
    // Held until 4 requests are out or one carries several outcomes.
    wait_for(|| {
        let a = leader.answers.lock().unwrap();
        a.outcome_requests >= 4 || a.outcomes_refused > 0
    })
    .await;
    hold.send(false).unwrap();
    let mut reported = std::collections::BTreeSet::new();
    while reported.len() < 12 {
        let task = leader
            .next(
                |s| match s {
                    Seen::Outcome(o) => Some(o.task_id),
                    _ => None,
                },
                |_| {},
            )
            .await;
        reported.insert(task);
    }
    assert!(leader.answers.lock().unwrap().outcomes_refused > 0);
    worker.shutdown();
    worker.finished().await.unwrap();
}
