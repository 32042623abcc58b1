//! Idempotency keys across a takeover, with real processes: a task with a
//! key finishes, the leader is killed (`kill -9`), a follower takes over,
//! and a later submission with the same key — published with another
//! `Nats-Msg-Id`, as a client past JetStream's 120 s duplicate window or
//! one that sets its own would — is that first task: it answers with the
//! first task's outcome and does not run again. The successor learns the
//! key from the finished task's result record (it names the key), from its
//! warm copy of the journal or read cold, also once the task's submission
//! was purged from the stream (warm copy only: docs/limits.md).
//!
//! No test sleeps to wait for something: every wait polls with a deadline.

mod procs;

use cronoq::core::{Snapshot, TaskId, TaskState};
use cronoq::task::Task;
use cronoq::wire::Subjects;
use procs::{describe, eventually, Cluster, CronoqServer};

/// The key every test submits under.
const KEY: &str = "nightly-report-2026-12-05";

/// How the successor reads the journal at takeover.
#[derive(Clone, Copy, PartialEq)]
enum Standby {
    Warm,
    Cold,
}

/// Whether the keyed task's submission is still in the stream at the kill
/// (an unfinished task before it holds the purge back) or purged.
#[derive(Clone, Copy, PartialEq)]
enum Submission {
    InStream,
    Purged,
}

#[tokio::test]
async fn a_key_finished_before_a_takeover_binds_its_duplicate_from_the_warm_copy() {
    key_survives_a_takeover(Standby::Warm, Submission::InStream).await;
}

#[tokio::test]
async fn a_key_whose_submission_was_purged_still_binds_its_duplicate_after_a_takeover() {
    key_survives_a_takeover(Standby::Warm, Submission::Purged).await;
}

/// A result over the size the warm copy keeps whole (a 5,000-byte
/// output): the copy keeps its id, and the successor reads it back.
#[tokio::test]
async fn a_key_with_a_large_result_binds_its_duplicate_after_a_takeover() {
    key_survives_a_takeover_with(Standby::Warm, Submission::Purged, 5_000).await;
}

#[tokio::test]
async fn a_key_finished_before_a_cold_takeover_binds_its_duplicate() {
    key_survives_a_takeover(Standby::Cold, Submission::InStream).await;
}

/// The leader's snapshot names `server` as leader.
async fn led_by(c: &Cluster, server: &str) -> Snapshot {
    c.snapshot_until(&format!("{server} to lead"), |s| {
        s.leader.as_ref().is_some_and(|l| l.id == server)
    })
    .await
}

/// The submit stream's first sequence now.
async fn first_in_stream(c: &Cluster) -> u64 {
    let js = async_nats::jetstream::new(c.client.nats().clone());
    let name = Subjects::default().submit_stream();
    let mut stream = js.get_stream(&name).await.expect("the submit stream");
    stream.info().await.expect("its info").state.first_sequence
}

/// Publishes `payload` with idempotency key `key` straight to the submit
/// stream (plain-publish headers) under a `Nats-Msg-Id` of its own, so
/// JetStream's duplicate window does not catch it; its sequence.
async fn publish_with_other_msg_id(c: &Cluster, payload: &str, key: &str) -> TaskId {
    let js = async_nats::jetstream::new(c.client.nats().clone());
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Cronoq-Idempotency-Key", key);
    headers.insert("Nats-Msg-Id", format!("not-the-key-{key}").as_str());
    let subject = Subjects::default().submit(&cronoq::core::PoolName::new("default").unwrap());
    let ack = js
        .publish_with_headers(subject, headers, payload.to_string().into())
        .await
        .expect("publishing")
        .await
        .expect("acknowledged");
    assert!(!ack.duplicate, "JetStream took it as a duplicate: {ack:?}");
    TaskId(ack.sequence)
}

async fn key_survives_a_takeover(standby: Standby, submission: Submission) {
    key_survives_a_takeover_with(standby, submission, 0).await;
}

/// The keyed task's output is `big` bytes when not 0 (else its usual line).
async fn key_survives_a_takeover_with(standby: Standby, submission: Submission, big: usize) {
    let (payload, output) = match big {
        0 => ("keyed".to_string(), "keyed on [] by cpu".to_string()),
        n => (format!("keyed big={n}"), "x".repeat(n)),
    };
    let mut c = Cluster::start(&[("cpu", "", 2)]).await;
    let config = match standby {
        Standby::Warm => procs::SERVER_CONFIG.to_string(),
        Standby::Cold => {
            procs::SERVER_CONFIG.replacen("[server]\n", "[server]\nwarm_standby = false\n", 1)
        }
    };
    let mut second =
        CronoqServer::start_configured(&c.nats, c.dir.path(), &config, &[], false).await;

    // A task no worker can run holds the purge below it.
    let blocker = match submission {
        Submission::InStream => Some(c.submit_payload("blocker", "gpu=h100").await),
        Submission::Purged => None,
    };
    let first = c
        .submit(Task::new(payload.clone()).idempotency_key(KEY))
        .await;
    assert_eq!(c.succeeded(first).await, output);
    match submission {
        Submission::InStream => {
            let blocker = blocker.expect("a blocker");
            assert!(!c.status(blocker).await.state.is_terminal());
            assert!(first_in_stream(&c).await <= blocker.0);
        }
        Submission::Purged => {
            eventually("the keyed submission to be purged", || async {
                let at = first_in_stream(&c).await;
                if at > first.0 {
                    Ok(())
                } else {
                    Err(format!("the stream starts at {at}"))
                }
            })
            .await;
        }
    }

    c.server.kill9();
    led_by(&c, second.id()).await;
    std::mem::swap(&mut c.server, &mut second);

    // The same key under another Msg-Id: the first task, not a new run.
    let dup = publish_with_other_msg_id(&c, &payload, KEY).await;
    assert_ne!(dup, first);
    let status = c
        .task_until(dup, "read by the successor", |s| s.state.is_terminal())
        .await;
    assert_eq!(
        (status.id, status.state),
        (first, TaskState::Succeeded),
        "the duplicate ran as a task of its own: {}",
        describe(&status)
    );
    assert_eq!(status.output.as_deref(), Some(output.as_str()));

    // The worker follows the successor (a new task runs), and by then the
    // duplicate has had every chance to run: it ran once in all.
    let after = c.submit_payload("after", "").await;
    assert_eq!(c.succeeded(after).await, "after on [] by cpu");
    let keyed: Vec<_> = c.runs().into_iter().filter(|r| r.name == "keyed").collect();
    assert_eq!(
        keyed.len(),
        1,
        "the keyed task ran once: {:?}",
        c.run_names()
    );
    assert_eq!(keyed[0].task, first.0);

    let log = c.server.log_tail(400);
    match standby {
        Standby::Warm => {
            let read = if big > 0 { "read=1" } else { "read=0" };
            assert!(
                log.lines()
                    .any(|l| l.contains("keys of finished tasks bound again") && l.contains(read)),
                "{log}"
            );
        }
        Standby::Cold => assert!(log.contains("warm_standby = false"), "{log}"),
    }
    second.kill9();
}
