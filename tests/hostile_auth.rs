//! Issue 20, against real processes: what one worker credential (or a
//! plain NATS client that captured traffic) could still do to a `cronoq
//! server` with `[auth] required = true`, tried as an attacker would, and
//! refused now. Each test is the attack as the issue describes it; it
//! fails on the code before the fix.
//!
//! - a flood of heartbeats listing made-up attempts (finding 1);
//! - a second credential taking a worker id, and its running attempt,
//!   while the leader changes (finding 2);
//! - a lease captured and published again after thousands of attempts
//!   (finding 3);
//! - a proof moved onto other headers, a signed submission without a
//!   `Nats-Msg-Id`, a replayed heartbeat (finding 4);
//! - a challenge flood across many worker ids (finding 6);
//! - one credential registering more workers and slots than it may hold
//!   (findings 1 and 11).
//!
//! No test sleeps to wait for something: every wait polls with a deadline.

mod auth_kit;
mod procs;

use std::time::{Duration, Instant, SystemTime};

use async_nats::HeaderMap;
use cronoq::auth::{client_nonce, Credential};
use cronoq::core::{ErrorCode, TaskId, TaskState};
use cronoq::wire::{self, PROTOCOL_VERSION};
use futures_util::StreamExt;

use auth_kit::*;
use procs::eventually;

/// The leader's id and epoch, as the admin's snapshot says.
async fn leader(s: &Setup) -> (String, u64) {
    let snap = s.snapshot().await;
    let l = snap.leader.expect("a leader");
    (l.id, l.epoch)
}

/// Finding 1: a worker credential registered with all the slots it may
/// hold sends signed heartbeats listing tens of thousands of attempts the
/// leader never leased, as fast as it can. The leader answers each
/// distinct attempt with at most one revoke, at most the worker's slots
/// per heartbeat interval, keeps its leadership (no epoch change) and
/// goes on running tasks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_worker_credential_cannot_depose_the_leader_with_heartbeats() {
    // A long worker_timeout: this test's debug build sends the flood,
    // slower than a heartbeat interval on a busy machine.
    let mut s = Setup::start_with(|text| {
        text.replace("worker_timeout = \"2s\"", "worker_timeout = \"60s\"")
    })
    .await;
    // The honest worker's group (zone=eu) is one the flooder is not in,
    // so the task after the flood can only run there.
    s.token_worker("honest", "gpu=a100,zone=eu");
    s.worker_registered("honest").await;
    let before = leader(&s).await;
    let gpu = Credential::token(GPU);
    // More slots than the credential may hold: refused, nothing registered.
    let e = register_as(&s, &gpu, "flood", "gpu=a100", 100_000, &[])
        .await
        .err()
        .expect("100,000 slots are above the credential's max_slots");
    assert_eq!(e.code, ErrorCode::RESOURCE_EXHAUSTED, "{e}");
    // All it may hold (10,000 less the honest worker's one slot).
    let (session, reply) = register_as(&s, &gpu, "flood", "gpu=a100", 9_999, &[])
        .await
        .expect("registered within max_slots");
    let interval = Duration::from_millis(reply.heartbeat_interval.0);
    let mut revokes = s
        .client
        .subscribe(s.subjects.revoke("flood"))
        .await
        .unwrap();
    s.client.flush().await.unwrap();

    let started = Instant::now();
    const HEARTBEATS: u64 = 60;
    const LISTED: u64 = 30_000;
    heartbeat_flood(
        &s.client,
        &s.subjects,
        &session,
        "flood",
        "flood.replies",
        HEARTBEATS,
        LISTED,
    )
    .await;

    // The leader still leads and still runs tasks.
    let sub = Credential::token(SUB_A);
    let after = s
        .submit(Some(&sub), &labelled("after-flood", "gpu=a100,zone=eu"))
        .await;
    s.until(after, "succeeded", |t| t.state == TaskState::Succeeded)
        .await;
    let elapsed = started.elapsed();
    assert_eq!(leader(&s).await, before, "leadership changed hands");
    // Count the revokes that came (they go out as the heartbeats are
    // taken; the task above ran after the last of them).
    let mut seen = 0u64;
    while let Ok(Some(_)) = tokio::time::timeout(Duration::from_millis(500), revokes.next()).await {
        seen += 1;
    }
    let intervals = elapsed.as_millis() as u64 / interval.as_millis().max(1) as u64 + 2;
    assert!(
        seen <= 9_999 * intervals,
        "{seen} revokes in {elapsed:?} ({intervals} intervals of {interval:?})"
    );
    assert!(
        seen < HEARTBEATS * LISTED / 4,
        "{seen} revokes for {HEARTBEATS} heartbeats"
    );
}

/// Findings 1 and 11: one credential may hold at most its `max_workers`
/// workers (here 3, from the config), so it cannot fill the server's
/// `max_workers` with silent ones; another credential still registers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_credential_holds_at_most_its_max_workers() {
    let s = Setup::start_with(|text| {
        text.replacen(
            "token_env = \"T_GPU\"\n",
            "token_env = \"T_GPU\"\nmax_workers = 3\n",
            1,
        )
    })
    .await;
    let gpu = Credential::token(GPU);
    let mut sessions = Vec::new();
    for i in 0..3 {
        let id = format!("silent{i}");
        sessions.push(
            register_as(&s, &gpu, &id, "gpu=a100", 1, &[])
                .await
                .unwrap(),
        );
    }
    let e = register_as(&s, &gpu, "silent3", "gpu=a100", 1, &[])
        .await
        .err()
        .expect("a fourth worker is refused");
    assert_eq!(e.code, ErrorCode::RESOURCE_EXHAUSTED, "{e}");
    assert!(e.message.contains("max_workers"), "{e}");
    let snap = s.snapshot().await;
    assert_eq!(snap.workers.len(), 3, "{:?}", snap.workers);
    register_as(&s, &Credential::token(GPU2), "other", "gpu=a100", 1, &[])
        .await
        .expect("another credential registers");
}

/// Finding 2: worker `vw1` (credential GPU) runs a task; the leader is
/// killed; before `vw1` is back, credential GPU2 registers `vw1` with the
/// new leader listing the running attempt. It is refused (the journal
/// says the attempt's worker is GPU's) and adopts nothing; the real `vw1`
/// re-attaches the attempt and the task ends with its output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_id_cannot_be_hijacked_across_a_leader_change() {
    // A longer worker_timeout (and re-attach grace): the real worker is
    // held stopped while the thief tries.
    let mut s = Setup::start_with(|text| {
        text.replace("worker_timeout = \"2s\"", "worker_timeout = \"8s\"")
    })
    .await;
    let mut standby = procs::CronoqServer::start_configured(
        &s.nats,
        s.dir.path(),
        &config(&s.nkey.public_key()).replace("worker_timeout = \"2s\"", "worker_timeout = \"8s\""),
        &SERVER_ENV,
        false,
    )
    .await;
    let real = s.token_worker("vw1", "gpu=a100");
    s.worker_registered("vw1").await;
    let sub = Credential::token(SUB_A);
    let held = s
        .submit(Some(&sub), &labelled("genuine hold=go", "gpu=a100"))
        .await;
    s.until(held, "running", |t| t.state == TaskState::Running)
        .await;
    let pid = s.workers[real].pid().expect("the worker runs") as i32;
    // SAFETY: signalling a child process of this test.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    s._server.kill9();

    let thief = Credential::token(GPU2);
    let refusal = eventually("the new leader to answer the thief", || {
        let (s, thief) = (&s, &thief);
        async move {
            let attempt = tokio::time::timeout(
                Duration::from_secs(3),
                register_as(s, thief, "vw1", "gpu=a100", 1, &[(held.0, 1)]),
            )
            .await;
            match attempt {
                Ok(Ok((_, reply))) => Ok(Ok(reply)),
                Ok(Err(e))
                    if e.code == ErrorCode::UNAVAILABLE
                        || e.code == ErrorCode::FAILED_PRECONDITION =>
                {
                    Err(e.to_string())
                }
                Ok(Err(e)) => Ok(Err(e)),
                Err(_) => Err("no answer".to_string()),
            }
        }
    })
    .await;
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    match refusal {
        Err(e) => assert_eq!(e.code, ErrorCode::PERMISSION_DENIED, "{e}"),
        Ok(reply) => panic!("the thief registered vw1: adopted {:?}", reply.adopted),
    }
    std::fs::write(s.dir.path().join("go"), "").unwrap();
    let done = s
        .until(held, "succeeded", |t| t.state == TaskState::Succeeded)
        .await;
    assert_eq!(
        done.output.as_deref(),
        Some("genuine on [gpu=a100] by vw1"),
        "{done:?}"
    );
    assert!(done
        .attempts
        .iter()
        .all(|a| a.worker.as_deref() == Some("vw1")));
    standby.kill9();
}

/// Finding 3: a lease captured off the bus is published again after the
/// worker has run more attempts than it remembers (4,096). The lease's
/// session count was taken, so the worker ignores it: the task ran once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_lease_is_refused_whatever_the_worker_remembers() {
    let mut s = Setup::start().await;
    s.workers.push(procs::CronoqWorker::start_with(
        &s.nats.url(),
        s.dir.path(),
        "lw",
        "gpu=a100",
        32,
        &["--token-env", "T_GPU"],
        &[("T_GPU", GPU)],
    ));
    let w = s.workers.len() - 1;
    s.worker_registered("lw").await;
    let mut leases = s.client.subscribe("cronoq.worker.lw.>").await.unwrap();
    s.client.flush().await.unwrap();
    let sub = Credential::token(SUB_A);
    let first = s
        .submit(Some(&sub), &labelled("first-run", "gpu=a100"))
        .await;
    s.until(first, "succeeded", |t| t.state == TaskState::Succeeded)
        .await;
    let captured = loop {
        let m = tokio::time::timeout(Duration::from_secs(10), leases.next())
            .await
            .expect("the lease went by")
            .expect("subscribed");
        if m.subject.as_str().ends_with(".lease") || m.subject.as_str().ends_with(".leases") {
            break m;
        }
    };
    drop(leases);
    // More attempts than the worker's memory of attempts it ran.
    const MORE: usize = 4_200;
    let tasks: Vec<_> = (0..MORE)
        .map(|i| labelled(&format!("filler{i}"), "gpu=a100"))
        .collect();
    futures_util::stream::iter(tasks.iter())
        .for_each_concurrent(64, |t| {
            let (s, sub) = (&s, &sub);
            async move {
                s.submit(Some(sub), t).await;
            }
        })
        .await;
    // Thousands of processes on a small machine: a deadline of its own.
    let until = Instant::now() + Duration::from_secs(300);
    loop {
        let n = s.runs().lines().filter(|l| l.starts_with("filler")).count();
        if n >= MORE {
            break;
        }
        assert!(Instant::now() < until, "{n} of {MORE} fillers ran");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    s.client
        .publish_with_headers(
            captured.subject.clone(),
            captured.headers.clone().unwrap_or_default(),
            captured.payload.clone(),
        )
        .await
        .unwrap();
    s.client.flush().await.unwrap();
    let worker = &s.workers[w];
    eventually("the worker to ignore the replayed lease", || {
        let log = worker.log_tail(50);
        async move {
            if log.contains("message without this session's proof ignored") {
                Ok(())
            } else {
                Err(log)
            }
        }
    })
    .await;
    let runs = s.runs();
    assert_eq!(
        runs.lines().filter(|l| l.starts_with("first-run ")).count(),
        1,
        "the first task ran again"
    );
}

/// Finding 4: a proof covers every header the leader reads. A signed
/// MessagePack submission with `Content-Type` stripped, or with another
/// `traceparent`, or signed without a `Nats-Msg-Id`, does not run; a
/// session message (heartbeat) sent twice is taken once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proofs_cover_every_header_the_leader_reads() {
    let mut s = Setup::start().await;
    s.token_worker("hw", "");
    s.worker_registered("hw").await;
    let sub = Credential::token(SUB_A);
    let js = async_nats::jetstream::new(s.client.clone());
    // A signed submission, then changed under its proof.
    let signed = |name: &str, traceparent: Option<&str>, msg_id: bool| {
        let mut task = cronoq::Task::new(name.to_string());
        if let Some(tp) = traceparent {
            task = task.traceparent(tp);
        }
        let (subject, mut headers, body) = wire::submission(&s.subjects, &task).unwrap();
        let nonce = client_nonce(SystemTime::now());
        if msg_id {
            headers.insert("Nats-Msg-Id", nonce.as_str());
        }
        if let Some(tp) = traceparent {
            headers.insert("traceparent", tp);
        }
        sub.sign_message(&nonce, &subject, &mut headers, &body);
        (subject, headers, body)
    };
    let strip = |headers: &HeaderMap, name: &str| {
        let mut out = HeaderMap::new();
        for (k, values) in headers.iter() {
            if !k.to_string().eq_ignore_ascii_case(name) {
                for v in values {
                    out.append(k.clone(), v.clone());
                }
            }
        }
        out
    };
    let mut refused = Vec::new();
    // Content-Type stripped: it would run as a plain publish.
    let (subject, headers, body) = signed("typed", None, true);
    let ack = js
        .publish_with_headers(subject, strip(&headers, "Content-Type"), body)
        .await
        .unwrap()
        .await
        .unwrap();
    refused.push(TaskId(ack.sequence));
    // Another trace context under the proof.
    let tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let (subject, headers, body) = signed("traced", Some(tp), true);
    let mut changed = strip(&headers, "traceparent");
    changed.insert(
        "traceparent",
        "00-11111111111111111111111111111111-2222222222222222-01",
    );
    let ack = js
        .publish_with_headers(subject, changed, body)
        .await
        .unwrap()
        .await
        .unwrap();
    refused.push(TaskId(ack.sequence));
    // Signed without a Nats-Msg-Id: a copy would be stored again.
    let (subject, headers, body) = signed("unkeyed", None, false);
    for _ in 0..2 {
        let ack = js
            .publish_with_headers(subject.clone(), headers.clone(), body.clone())
            .await
            .unwrap()
            .await
            .unwrap();
        refused.push(TaskId(ack.sequence));
    }
    // A good one after them: once it ran, the leader has taken them all.
    let good = s.submit(Some(&sub), &labelled("good", "")).await;
    s.until(good, "succeeded", |t| t.state == TaskState::Succeeded)
        .await;
    let admin = Credential::token(ADMIN);
    for id in refused {
        match s.get(Some(&admin), id).await {
            Ok(t) => {
                assert_eq!(t.state, TaskState::Failed, "task {id}: {t:?}");
                assert!(
                    t.error.as_deref().unwrap_or("").contains("UNAUTHENTICATED")
                        || t.attempts.is_empty(),
                    "task {id}: {t:?}"
                );
                assert!(t.attempts.is_empty(), "task {id} ran: {t:?}");
            }
            Err(e) => assert_eq!(e.code, ErrorCode::NOT_FOUND, "task {id}: {e}"),
        }
    }
    let runs = s.runs();
    for name in ["typed", "traced", "unkeyed"] {
        assert!(
            !runs.lines().any(|l| l.starts_with(&format!("{name} "))),
            "{name} ran: {runs}"
        );
    }
    assert!(!runs.contains("\u{FFFD}"), "msgpack bytes ran as a payload");

    // A heartbeat sent twice: taken once.
    let hand = register_over_the_wire(&s, "hb", "gpu=h100").await;
    let subject = s.subjects.worker_api("hb", "heartbeat");
    let body = wire::encode(&wire::Heartbeat {
        v: PROTOCOL_VERSION,
        worker_id: "hb".into(),
        free_slots: 1,
        running: Vec::new(),
    });
    let mut headers = HeaderMap::new();
    hand.0.sign(&subject, &mut headers, &body);
    let ask = || async {
        let reply = s
            .client
            .request_with_headers(subject.clone(), headers.clone(), body.clone().into())
            .await
            .unwrap();
        match wire::decode::<wire::Reply<wire::HeartbeatReply>>(&reply.payload).unwrap() {
            wire::Reply::Ok(r) => r.registered,
            wire::Reply::Error(e) => panic!("{e}"),
        }
    };
    assert!(ask().await, "the heartbeat is taken");
    assert!(!ask().await, "the same heartbeat again is a replay");
}

/// Finding 6: 20,000 challenges under as many worker ids leave nothing
/// behind to fill: a worker registers at once afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_challenge_flood_across_many_ids_locks_no_registration_out() {
    let s = Setup::start().await;
    let ids: Vec<String> = (0..20_000).map(|i| format!("ghost{i}")).collect();
    futures_util::stream::iter(ids.iter())
        .for_each_concurrent(256, |id| {
            let s = &s;
            async move {
                let _ = s
                    .request::<_, wire::ChallengeReply>(
                        None,
                        &s.subjects.worker_api(id, "challenge"),
                        &wire::Challenge::default(),
                    )
                    .await;
            }
        })
        .await;
    let gpu = Credential::token(GPU);
    register_as(&s, &gpu, "after-flood", "gpu=a100", 1, &[])
        .await
        .expect("a registration right after the flood");
    // This server runs with auth required on an open NATS and no storage
    // key: it said so when it started.
    let log = s._server.log_tail(2_000);
    assert!(
        log.contains("without credentials ([server] nats_creds)"),
        "{log}"
    );
    assert!(log.contains("no [server] storage_key_env"), "{log}");
}
