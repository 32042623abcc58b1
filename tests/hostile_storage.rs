//! Issue 20 finding 8, against real processes: on an open NATS (no
//! NATS-level auth) anyone can write to JetStream. With a storage key
//! (`[server] storage_key_env`) the servers seal what they store, so what
//! a plain NATS client writes into the results bucket is never taken: a
//! forged result is not served, a forged record does not mark a queued
//! task succeeded, and a forged leader record is followed by nobody.
//! (Overwriting or deleting a stored value still loses it: only NATS
//! permissions stop that; see SECURITY.md.)
//!
//! No test sleeps to wait for something: every wait polls with a deadline.

mod procs;

use cronoq::core::{Labels, Millis, PoolName, TaskId, TaskState};
use cronoq::task::AttemptRecord;
use cronoq::wire::{self, TaskRecord, PROTOCOL_VERSION};
use procs::{eventually, Cluster, CronoqServer, SERVER_CONFIG};

const KEY_ENV: (&str, &str) = (
    "CRONOQ_TEST_STORAGE_KEY",
    "a-storage-key-of-more-than-32-characters",
);

fn config() -> String {
    SERVER_CONFIG.replace(
        "[server]\n",
        "[server]\nstorage_key_env = \"CRONOQ_TEST_STORAGE_KEY\"\n",
    )
}

/// A record a forger would write: `task` succeeded with `output`.
fn forged_success(task: TaskId, output: &str) -> bytes::Bytes {
    wire::encode(&TaskRecord {
        v: PROTOCOL_VERSION,
        id: task,
        pool: PoolName::new("default").unwrap(),
        state: TaskState::Succeeded,
        attempts: vec![AttemptRecord {
            attempt: 1,
            group: Labels::new(),
            worker: Some("evil".into()),
            credential: None,
            started_at: Millis(1),
            ended_at: Some(Millis(2)),
            outcome: Some("succeeded".into()),
            error: None,
        }],
        output: Some(bytes::Bytes::from(output.to_string())),
        error: None,
        deadline_missed: false,
        written_at: None,
        schedule: None,
        scheduled_at: None,
        key: None,
    })
    .into()
}

/// Puts `body` under `key` of the results bucket, as any NATS client can.
async fn forge(c: &Cluster, key: &str, body: bytes::Bytes) {
    let nats = async_nats::connect(c.nats_url()).await.unwrap();
    let js = async_nats::jetstream::new(nats);
    js.publish(format!("$KV.CRONOQ_RESULTS.{key}"), body)
        .await
        .unwrap()
        .await
        .unwrap();
}

/// A forged result over a finished task is not served after a handover,
/// and a forged "succeeded" record of a queued task, under its id or in a
/// forged result batch, does not finish it: the successor runs the task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_journal_records_are_not_taken() {
    let mut c = Cluster::start_with_env(&config(), &[KEY_ENV], &[("cpu", "", 2)]).await;
    let mut standby =
        CronoqServer::start_configured(&c.nats, c.dir.path(), &config(), &[KEY_ENV], false).await;
    let done = c.submit_payload("genuine", "").await;
    assert_eq!(c.succeeded(done).await, "genuine on [] by cpu");
    // Nobody has gpu=h100: the task waits.
    let queued = c.submit_payload("waiting", "gpu=h100").await;
    c.waiting(queued, "no_group_matches").await;

    forge(&c, &done.0.to_string(), forged_success(done, "forged")).await;
    forge(&c, &queued.0.to_string(), forged_success(queued, "forged")).await;
    // And a forged lookup block (`server::journal::lookups`: ids and
    // encoded records, under `r.<id / 256>.<entry>_<part>`) naming both
    // tasks finished.
    #[derive(serde::Serialize)]
    struct Block {
        ids: Vec<u64>,
        records: Vec<bytes::Bytes>,
    }
    // A task never submitted, in the same block: only the forged
    // block names it, so its lookup reads (and refuses) that block.
    let ghost = TaskId(done.0 + 100);
    let block = Block {
        ids: vec![done.0, queued.0, ghost.0],
        records: vec![
            forged_success(done, "forged"),
            forged_success(queued, "forged"),
            forged_success(ghost, "forged"),
        ],
    };
    forge(
        &c,
        &format!("r.{}.1_0", done.0 / 256),
        wire::encode(&block).into(),
    )
    .await;
    c.server.kill9();
    let standby_id = standby.id().to_string();
    c.snapshot_until("the standby to lead", |s| {
        s.leader.as_ref().is_some_and(|l| l.id == standby_id)
    })
    .await;
    // The forged result is never served (the genuine one was overwritten:
    // that loss only NATS permissions prevent).
    eventually("the successor to answer for the finished task", || async {
        match c.client.get(done).await {
            Ok(s) if s.output.as_deref() == Some("forged") => {
                panic!("the forged result was served: {}", procs::describe(&s))
            }
            Ok(_) => Ok(()),
            Err(e) if e.to_string().contains("NOT_FOUND") => Ok(()),
            Err(e) => Err(e.to_string()),
        }
    })
    .await;
    let e = c
        .client
        .get(ghost)
        .await
        .expect_err("a forged lookup served");
    assert!(e.to_string().contains("NOT_FOUND"), "{e}");
    // The queued task is still queued, and runs once a worker can take it.
    c.waiting(queued, "no_group_matches").await;
    c.add_worker("gpu", "gpu=h100", 1).await;
    assert_eq!(c.succeeded(queued).await, "waiting on [gpu=h100] by gpu");
    let log = standby.log_tail(400);
    assert!(
        log.contains("not sealed with the servers' storage key"),
        "{log}"
    );
    // The metrics say so too.
    let (status, metrics) = procs::http_get(&format!("{}/metrics", standby.http_url())).await;
    assert_eq!(status, 200);
    let refused: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("cronoq_storage_refused_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no cronoq_storage_refused_total in {metrics}"));
    assert!(refused >= 1, "{metrics}");
    standby.kill9();
}

/// A forged leader record naming "evil" with a huge epoch, written again
/// and again as a persistent attacker would, is followed by nobody: while
/// it comes, no server answers that "evil" leads (leadership may change
/// hands among our servers: each forged write moves the fence); once it
/// stops, one of our servers leads with an epoch of its own and tasks run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_leader_record_is_followed_by_nobody() {
    let c = Cluster::start_with_env(&config(), &[KEY_ENV], &[("cpu", "", 1)]).await;
    let mut standby =
        CronoqServer::start_configured(&c.nats, c.dir.path(), &config(), &[KEY_ENV], false).await;
    let forged: bytes::Bytes =
        serde_json::to_vec(&serde_json::json!({"id": "evil", "epoch": 99_999_999u64}))
            .unwrap()
            .into();
    let nats = async_nats::connect(c.nats_url()).await.unwrap();
    let js = async_nats::jetstream::new(nats);
    let mut named_evil = Vec::new();
    for _ in 0..40 {
        js.publish("$KV.CRONOQ_RESULTS._leader", forged.clone())
            .await
            .unwrap()
            .await
            .unwrap();
        for server in [&c.server, &standby] {
            let addr = server
                .http_url()
                .trim_start_matches("http://")
                .parse()
                .unwrap();
            if let Some(health) = procs::readyz(addr).await {
                if health.detail.contains("evil") {
                    named_evil.push(health.detail);
                }
            }
        }
        if let Ok(Ok(snap)) =
            tokio::time::timeout(std::time::Duration::from_millis(500), c.client.snapshot()).await
        {
            if let Some(l) = snap.leader.filter(|l| l.id == "evil") {
                named_evil.push(format!("snapshot: {l:?}"));
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(named_evil.is_empty(), "{named_evil:?}");
    let ours = [c.server.id().to_string(), standby.id().to_string()];
    let snap = c
        .snapshot_until("one of our servers to lead", |s| {
            s.leader.as_ref().is_some_and(|l| ours.contains(&l.id))
        })
        .await;
    assert_ne!(snap.leader.unwrap().epoch, 99_999_999);
    let id = c.submit_payload("after-forgery", "").await;
    assert_eq!(c.succeeded(id).await, "after-forgery on [] by cpu");
    standby.kill9();
}

/// Issue 34, finding 9 (on an open NATS): the probe took the dead
/// leader's last *genuine* record (sealed, so believed) and published it
/// again every 0.5 s after `kill -9` of the leader; the standby saw the
/// subject move, counted it as renewals, and the cluster stayed leaderless
/// (one `/readyz` answered 200 "follower of" the dead server). A record
/// now carries its writer's count: a replay is no renewal, and the
/// standby takes over while the replays go on.
#[tokio::test]
async fn a_dead_leaders_replayed_record_does_not_keep_the_cluster_leaderless() {
    let mut c = Cluster::start_with_env(&config(), &[KEY_ENV], &[("cpu", "", 1)]).await;
    let mut standby =
        CronoqServer::start_configured(&c.nats, c.dir.path(), &config(), &[KEY_ENV], false).await;
    let nats = async_nats::connect(c.nats_url()).await.unwrap();
    let js = async_nats::jetstream::new(nats);
    let stream = js.get_stream("KV_CRONOQ_RESULTS").await.unwrap();
    let genuine = stream
        .get_last_raw_message_by_subject("$KV.CRONOQ_RESULTS._leader")
        .await
        .expect("the leader's record")
        .payload;
    let dead = c.server.id().to_string();
    c.server.kill9();
    let replaying = tokio::spawn({
        let js = js.clone();
        async move {
            loop {
                let _ = js
                    .publish("$KV.CRONOQ_RESULTS._leader", genuine.clone())
                    .await;
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
        }
    });
    let addr = standby
        .http_url()
        .trim_start_matches("http://")
        .parse()
        .unwrap();
    procs::eventually("the standby to lead despite the replays", || async {
        match procs::readyz(addr).await {
            Some(h) if h.ready && h.detail.starts_with("leader") => Ok(()),
            Some(h) if h.ready && h.detail.contains(&dead) => Err(format!(
                "ready as a follower of the dead leader: {}",
                h.detail
            )),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    replaying.abort();
    std::mem::swap(&mut c.server, &mut standby);
    let id = c.submit_payload("after-replays", "").await;
    assert_eq!(c.succeeded(id).await, "after-replays on [] by cpu");
}
