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

mod auth_kit;
mod procs;

use std::time::{Duration, SystemTime};

use async_nats::HeaderMap;
use cronoq::auth::{client_nonce, Credential};
use cronoq::core::{ErrorCode, Labels, Millis, PoolName, TaskId, TaskState};
use cronoq::task::TaskStatus;
use cronoq::wire::{self, Reply, PROTOCOL_VERSION};
use procs::{eventually, CronoqServer, CronoqWorker};

use auth_kit::*;

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
        schedule: None,
        scheduled_at: None,
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
