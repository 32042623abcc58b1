//! Hostile input against real processes (issue 7): a plain NATS client and
//! an HTTP client send what used to stop or confuse a `cronoq server` — a
//! poison submission, payloads at the NATS size limit, a second worker
//! process with a live worker's id — and the server refuses each with a
//! stable code, records and dead-letters what it cannot run, and goes on
//! serving, across a restart too.
//!
//! No test sleeps to wait for something: every wait polls with a deadline.

mod procs;

use async_nats::jetstream;
use async_nats::HeaderMap;
use cronoq::core::{TaskId, TaskState};
use futures_util::StreamExt;
use procs::{describe, eventually, Cluster, CronoqServer, CronoqWorker};

/// The dead letters in the stream so far: (seq header, code, reason).
async fn dead_letters(js: &jetstream::Context) -> Vec<(String, String, String)> {
    let Ok(stream) = js.get_stream("CRONOQ_DEADLETTER").await else {
        return Vec::new();
    };
    let consumer = stream
        .create_consumer(jetstream::consumer::pull::OrderedConfig::default())
        .await
        .expect("dead-letter consumer");
    let mut messages = consumer.messages().await.expect("dead-letter messages");
    let mut out = Vec::new();
    while let Ok(Some(Ok(m))) =
        tokio::time::timeout(std::time::Duration::from_millis(500), messages.next()).await
    {
        let h = m.message.headers.clone().unwrap_or_default();
        let get = |k: &str| h.get(k).map(|v| v.to_string()).unwrap_or_default();
        out.push((
            get("Cronoq-Dead-Letter-Seq"),
            get("Cronoq-Dead-Letter-Code"),
            get("Cronoq-Dead-Letter-Reason"),
        ));
    }
    out
}

/// Every dead letter: headers and body.
async fn dead_letters_full(c: &Cluster) -> Vec<(HeaderMap, bytes::Bytes)> {
    let nats = async_nats::connect(c.nats_url()).await.expect("nats");
    let js = jetstream::new(nats);
    let mut out = Vec::new();
    // Written right after the result; give it a moment.
    for _ in 0..50 {
        let Ok(stream) = js.get_stream("CRONOQ_DEADLETTER").await else {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            continue;
        };
        let consumer = stream
            .create_consumer(jetstream::consumer::pull::OrderedConfig::default())
            .await
            .expect("dead-letter consumer");
        let mut messages = consumer.messages().await.expect("dead-letter messages");
        while let Ok(Some(Ok(m))) =
            tokio::time::timeout(std::time::Duration::from_millis(500), messages.next()).await
        {
            out.push((
                m.message.headers.clone().unwrap_or_default(),
                m.message.payload.clone(),
            ));
        }
        if !out.is_empty() {
            break;
        }
    }
    out
}

/// Finding 1: `Cronoq-Deadline: 10000000000000000000s` used to panic the
/// submit consumer for good (and again after every restart). Now it is
/// refused, recorded failed with its reason, dead-lettered, and the next
/// submissions run — before and after a `kill -9` and restart.
#[tokio::test]
async fn a_poison_submission_is_refused_dead_lettered_and_survives_a_restart() {
    let mut c = Cluster::start(&[("cpu", "", 2)]).await;
    let nats = async_nats::connect(c.nats_url()).await.expect("nats");
    let js = jetstream::new(nats.clone());
    let mut poison_ids = Vec::new();
    for (header, value) in [
        ("Cronoq-Deadline", "10000000000000000000s"),
        ("Cronoq-Start-At", "300000000000y"),
        ("Cronoq-Deadline", "9999-12-31T00:00:00Z"),
    ] {
        let mut headers = HeaderMap::new();
        headers.insert(header, value);
        let ack = js
            .publish_with_headers("cronoq.submit.default", headers, "poison".into())
            .await
            .expect("publish")
            .await
            .expect("puback");
        poison_ids.push(TaskId(ack.sequence));
    }
    for &id in &poison_ids {
        let status = c.finished(id).await;
        assert_eq!(status.state, TaskState::Failed, "{}", describe(&status));
        let error = status.error.clone().unwrap_or_default();
        assert!(
            error.contains("submission refused") && error.contains("INVALID_ARGUMENT"),
            "{}",
            describe(&status)
        );
        assert!(status.attempts.is_empty());
    }
    let ok = c.submit_payload("after-poison", "").await;
    assert_eq!(c.succeeded(ok).await, "after-poison on [] by cpu");

    let letters = eventually("three dead letters", || {
        let js = js.clone();
        async move {
            let letters = dead_letters(&js).await;
            if letters.len() == 3 {
                Ok(letters)
            } else {
                Err(format!("{letters:?}"))
            }
        }
    })
    .await;
    // Written concurrently with other records: in any order.
    let mut letters = letters;
    letters.sort_by_key(|(seq, _, _)| seq.parse::<u64>().unwrap_or(0));
    for ((seq, code, reason), id) in letters.iter().zip(&poison_ids) {
        assert_eq!(seq, &id.0.to_string());
        assert_eq!(code, "INVALID_ARGUMENT");
        assert!(!reason.is_empty());
    }
    assert!(!c.run_names().contains(&"poison".to_string()));

    // A restart meets no poison: submissions still run, the refusals stay.
    c.server.kill9();
    c.server = CronoqServer::start(&c.nats, c.dir.path()).await;
    let again = c.submit_payload("after-restart", "").await;
    assert_eq!(c.succeeded(again).await, "after-restart on [] by cpu");
    for &id in &poison_ids {
        assert_eq!(c.finished(id).await.state, TaskState::Failed);
    }
    // The same values over HTTP: a JSON INVALID_ARGUMENT, not an empty reply.
    let http = c.server.http_url();
    for body in [
        r#"{"payload":"x","deadline":"10000000000000000000s"}"#,
        r#"{"payload":"x","start_at":"300000000000y"}"#,
    ] {
        let (status, reply) = procs::http_post(&format!("{http}/v1/tasks"), body).await;
        assert_eq!(status, 400, "{reply}");
        assert!(reply.contains("INVALID_ARGUMENT"), "{reply}");
    }
    let health = procs::http_get(&format!("{http}/readyz")).await;
    assert_eq!(health.0, 200, "{}", health.1);
}

/// Raw NATS protocol: publishes `payload` on `subject` with a header block
/// taken as given (no client library would send these bytes).
async fn publish_raw(nats_url: &str, subject: &str, header_block: &[u8], payload: &[u8]) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = nats_url.trim_start_matches("nats://");
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let mut info = [0u8; 4096];
    let _ = stream.read(&mut info).await.expect("INFO");
    let mut out = b"CONNECT {\"verbose\":false,\"headers\":true,\"protocol\":1}\r\n".to_vec();
    out.extend(
        format!(
            "HPUB {subject} {} {}\r\n",
            header_block.len(),
            header_block.len() + payload.len()
        )
        .as_bytes(),
    );
    out.extend(header_block);
    out.extend(payload);
    out.extend(b"\r\nPING\r\n");
    stream.write_all(&out).await.expect("publish");
    // PONG: the server has taken the message.
    let mut pong = Vec::new();
    while !String::from_utf8_lossy(&pong).contains("PONG") {
        let mut buf = [0u8; 1024];
        let n = stream.read(&mut buf).await.expect("PONG");
        assert!(n > 0, "nats-server closed the connection");
        pong.extend(&buf[..n]);
    }
}

/// Finding (2026-12-05): a header value holding a line break used to panic
/// the NATS connection task of whoever received it (async-nats before
/// 0.52). Stored in the submit stream, one such submission kept the
/// leader reconnecting and re-reading it for good, and every successor
/// after it: one plain publish by any submitter stopped the cluster. Now
/// the consumer reads such a submission through the JetStream API and
/// takes it like any other plain publish (here refused for its unreadable
/// priority); only the leader's inbound connection is reset, never the
/// one its journal and renewals use; the leader, the worker and a
/// restarted server go on serving.
#[tokio::test]
async fn a_header_value_with_a_line_break_stops_neither_leader_nor_worker() {
    let mut c = Cluster::start(&[("cpu", "", 2)]).await;
    let url = c.nats_url();
    let nats = async_nats::connect(&url).await.expect("nats");
    let js = jetstream::new(nats);
    let before = js
        .get_stream("CRONOQ_SUBMIT")
        .await
        .expect("submit stream")
        .info()
        .await
        .expect("stream info")
        .state
        .last_sequence;
    publish_raw(
        &url,
        "cronoq.submit.default",
        b"NATS/1.0\r\nCronoq-Priority: 1\n2\r\nX-Evil: a\rb\r\n\r\n",
        b"evil",
    )
    .await;
    // At the leader's worker requests and at the worker's lease subject too.
    for subject in ["cronoq.w.cpu.heartbeat", "cronoq.worker.cpu.leases"] {
        publish_raw(&url, subject, b"NATS/1.0\r\nX-Evil: a\nb\r\n\r\n", b"x").await;
    }
    let evil = TaskId(before + 1);
    let status = c.finished(evil).await;
    assert_eq!(status.state, TaskState::Failed, "{}", describe(&status));
    assert!(
        status
            .error
            .clone()
            .unwrap_or_default()
            .contains("INVALID_ARGUMENT"),
        "{}",
        describe(&status)
    );
    let ok = c.submit_payload("after-line-break", "").await;
    assert_eq!(c.succeeded(ok).await, "after-line-break on [] by cpu");
    // Only the connection that receives others' messages was reset: the
    // journal's and the election's was not.
    let log = c.server.log_tail(100_000);
    let lost: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("nats connection lost"))
        .collect();
    assert!(
        !lost.is_empty(),
        "the test sent nothing that resets a connection?\n{log}"
    );
    assert!(
        lost.iter().all(|l| l.contains("inbound")),
        "the leader's main connection was reset:\n{}",
        lost.join("\n")
    );
    c.server.kill9();
    c.server = CronoqServer::start(&c.nats, c.dir.path()).await;
    let again = c.submit_payload("after-restart", "").await;
    assert_eq!(c.succeeded(again).await, "after-restart on [] by cpu");
    assert!(!c.run_names().contains(&"evil".to_string()));
}

/// Finding 2: a payload that could never be leased is refused at submit:
/// over HTTP at once, over a plain publish by the server (failed, with a
/// reason, dead-lettered) — never leased and lost three times.
#[tokio::test]
async fn a_payload_that_cannot_be_leased_is_refused_on_every_path() {
    let c = Cluster::start(&[("cpu", "", 1)]).await;
    let http = c.server.http_url();
    // 1 MiB minus a little: passed the old check, failed every lease.
    let text = "x".repeat((1 << 20) - 20);
    let body = format!(r#"{{"payload":"{text}"}}"#);
    let (status, reply) = procs::http_post(&format!("{http}/v1/tasks"), &body).await;
    assert_eq!(status, 400, "{}", &reply[..reply.len().min(300)]);
    assert!(
        reply.contains("INVALID_ARGUMENT") && reply.len() < 1_000,
        "{reply}"
    );

    let nats = async_nats::connect(c.nats_url()).await.expect("nats");
    let js = jetstream::new(nats);
    let ack = js
        .publish("cronoq.submit.default", vec![b'y'; 1 << 20].into())
        .await
        .expect("publish")
        .await
        .expect("puback: exactly max_payload is accepted by the stream");
    let status = c.finished(TaskId(ack.sequence)).await;
    assert_eq!(status.state, TaskState::Failed, "{}", describe(&status));
    assert!(
        status.attempts.is_empty(),
        "never leased: {}",
        describe(&status)
    );
    assert!(
        status.error.as_deref().unwrap_or("").contains("payload"),
        "{}",
        describe(&status)
    );
    // Its dead letter has no room for the body beside the reason headers:
    // it keeps the headers and says how long the body was (sending it
    // whole made NATS drop the server's connection, again and again).
    let letters = dead_letters_full(&c).await;
    let (headers, body) = letters
        .iter()
        .find(|(h, _)| {
            h.get("Cronoq-Dead-Letter-Seq").map(|v| v.to_string()) == Some(ack.sequence.to_string())
        })
        .expect("a dead letter for the oversized submission");
    assert_eq!(
        headers
            .get("Cronoq-Dead-Letter-Body-Dropped")
            .map(|v| v.to_string()),
        Some((1u64 << 20).to_string())
    );
    assert!(body.is_empty());
    // The largest payload that is accepted runs.
    let ok = c
        .submit(cronoq::Task::new(vec![b'z'; (1 << 20) - 16 * 1024]))
        .await;
    assert_eq!(c.finished(ok).await.state, TaskState::Succeeded);
}

/// Finding 6: two `cronoq worker --id dup` processes used to run every
/// task twice. The second is refused (`ALREADY_EXISTS`) while the first
/// lives, so each task runs once.
#[tokio::test]
async fn a_second_worker_process_with_a_live_id_is_refused() {
    let mut c = Cluster::start(&[("dup", "", 2)]).await;
    let second = CronoqWorker::start(&c.nats_url(), c.dir.path(), "dup", "", 2);
    c.workers.insert("dup-second".into(), second);
    eventually("the second process to be refused", || {
        let log = c.workers["dup-second"].log_tail(50);
        async move {
            if log.contains("ALREADY_EXISTS") {
                Ok(())
            } else {
                Err(log)
            }
        }
    })
    .await;
    let mut ids = Vec::new();
    for i in 0..4 {
        ids.push(c.submit_payload(&format!("t{i}"), "").await);
    }
    for id in &ids {
        c.finished(*id).await;
    }
    let runs = c.runs();
    assert_eq!(runs.len(), 4, "each task ran once: {runs:?}");
    let snap = c.client.snapshot().await.expect("snapshot");
    assert_eq!(snap.workers.len(), 1, "{:?}", snap.workers);
}
