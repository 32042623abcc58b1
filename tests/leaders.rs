//! Several `cronoq server`s on one NATS (issue 8, election and fencing):
//! exactly one leads and every server's snapshot names it; `kill -9` of the
//! leader hands over to a follower and the workers follow it by
//! themselves; a leader paused past the election timeout is replaced, and
//! once resumed it steps down instead of leading beside its successor.
//!
//! No test sleeps to wait for something: every wait polls with a deadline.

mod procs;

use cronoq::core::{TaskId, TaskState};
use cronoq::Task;
use procs::{
    describe, eventually, hold, http_get, leader_seen_by, taken_over_by, Cluster, CronoqServer,
};

/// Submits `n` tasks named `<name>-<i>` that hold until `key` is
/// released, and waits until each runs.
async fn running_held(c: &Cluster, name: &str, n: usize, key: &str) -> Vec<TaskId> {
    let mut held = Vec::new();
    for i in 0..n {
        held.push(
            c.submit_payload(&hold(&format!("{name}-{i}"), key), "")
                .await,
        );
    }
    for id in &held {
        c.running(*id).await;
    }
    held
}

/// After a takeover: waits until worker `cpu` counts `held` as busy again
/// (re-attached), releases `key`, and checks each succeeded in one attempt.
async fn reattached_and_run_once(c: &Cluster, held: &[TaskId], key: &str) {
    c.snapshot_until("the re-attached attempts to count as busy", |s| {
        s.workers
            .iter()
            .any(|w| w.id == "cpu" && w.busy as usize == held.len())
    })
    .await;
    c.release(key);
    for id in held {
        let status = c.finished(*id).await;
        assert_eq!(status.state, TaskState::Succeeded, "{}", describe(&status));
        assert_eq!(status.attempts.len(), 1, "{}", describe(&status));
    }
}

#[tokio::test]
async fn two_servers_never_both_lead_and_a_killed_leader_is_replaced() {
    let mut c = Cluster::start(&[("cpu", "", 2)]).await;
    let first = c.server.id().to_string();
    let mut second = CronoqServer::start_follower(&c.nats, c.dir.path()).await;

    // Both name the same leader and epoch; the second is a ready follower.
    let (leader, epoch) = leader_seen_by(&c.server).await.expect("leader's view");
    assert_eq!(leader, first);
    assert_eq!(
        leader_seen_by(&second).await.expect("follower's view"),
        (leader.clone(), epoch)
    );
    let (status, health) = http_get(&format!("{}/readyz", second.http_url())).await;
    assert_eq!(status, 200, "{health}");
    assert!(health.contains("follower"), "{health}");

    // Tasks run once each, submitted through either server.
    let mut ids = Vec::new();
    for i in 0..10 {
        ids.push(c.submit_payload(&format!("before-{i}"), "").await);
    }
    for id in &ids {
        assert_eq!(c.finished(*id).await.state, TaskState::Succeeded);
    }
    let runs = c.runs();
    assert_eq!(runs.len(), 10, "each ran once: {runs:?}");

    // kill -9 of the leader: the follower takes over with a newer epoch,
    // the worker follows it, and new tasks run.
    c.server.kill9();
    let (new_leader, new_epoch) = taken_over_by(&second).await;
    assert!(new_epoch > epoch, "epoch {new_epoch} after {epoch}");
    assert_eq!(new_leader, second.id());
    std::mem::swap(&mut c.server, &mut second);
    let after = c.submit_payload("after-kill", "").await;
    assert_eq!(c.succeeded(after).await, "after-kill on [] by cpu");
    for id in &ids {
        // Finished before the kill: still finished, never run again.
        assert_eq!(c.finished(*id).await.state, TaskState::Succeeded);
    }
    let names = c.run_names();
    assert_eq!(
        names.iter().filter(|n| n.starts_with("before-")).count(),
        10,
        "{names:?}"
    );
    drop(second);
}

#[tokio::test]
async fn a_paused_leader_is_replaced_and_steps_down_when_resumed() {
    let c = Cluster::start(&[("cpu", "", 2)]).await;
    let mut second = CronoqServer::start_follower(&c.nats, c.dir.path()).await;
    let (_, epoch) = leader_seen_by(&second).await.expect("follower's view");

    c.server.pause();
    let (_, new_epoch) = taken_over_by(&second).await;
    assert!(new_epoch > epoch);
    let during = c.submit_payload("during-pause", "").await;
    assert_eq!(c.finished(during).await.state, TaskState::Succeeded);

    // Resumed, the old leader finds its leadership gone and follows.
    c.server.resume();
    eventually("the resumed server to follow its successor", || async {
        match leader_seen_by(&c.server).await {
            Ok((id, e)) if id == second.id() && e == new_epoch => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    // Its own view of the leader record comes with its next poll (its
    // snapshot above was answered by the leader it asked).
    ready_follower(&c.server).await;
    let mut ids = Vec::new();
    for i in 0..10 {
        ids.push(c.submit_payload(&format!("after-{i}"), "").await);
    }
    for id in &ids {
        assert_eq!(c.finished(*id).await.state, TaskState::Succeeded);
    }
    let runs = c.runs();
    let after: Vec<_> = runs
        .iter()
        .filter(|r| r.name.starts_with("after-"))
        .collect();
    assert_eq!(after.len(), 10, "each ran once: {runs:?}");
    let log = c.server.log_tail(200);
    assert!(
        log.contains("lost leadership") || log.contains("driver stops"),
        "{log}"
    );
    // Issue 20 finding 1: resumed, it judged its right to act before
    // acting on its timers. Every worker looked silent past worker_timeout
    // and every lease looked expired to it; it removed none and lost none
    // (it used to log `worker removed` for each, fenced only at the write).
    for acted in ["worker removed", "lease expired"] {
        assert!(
            !log.contains(acted),
            "the deposed leader acted ({acted}):\n{log}"
        );
    }

    // The deposed server follows the journal again (a leader does not
    // follow its own writes): when the successor dies with a task running,
    // it takes over from its warm copy, re-attaches the attempt, and the
    // task runs once; a task that finished behind it (its submission still
    // in the stream, its result only in a result batch) does not run again
    // and is still looked up.
    let held = running_held(&c, "held", 1, "go").await;
    let behind = c.submit_payload("behind-held", "").await;
    assert_eq!(c.finished(behind).await.state, TaskState::Succeeded);
    second.kill9();
    let (_, third_epoch) = taken_over_by(&c.server).await;
    assert!(third_epoch > new_epoch);
    reattached_and_run_once(&c, &held, "go").await;
    assert_eq!(c.finished(behind).await.state, TaskState::Succeeded);
    let runs = c.runs();
    let behind_runs = runs.iter().filter(|r| r.name == "behind-held").count();
    assert_eq!(behind_runs, 1, "{runs:?}");
    let log = c.server.log_tail(400);
    assert!(
        log.contains("reading the journal from the warm copy"),
        "{log}"
    );
}

/// The same takeover read cold (`[server] warm_standby = false`: every
/// journal record looked up from the stream's leader, the result batches
/// read first): attempts running when the leader is killed are
/// re-attached and run once, and the tasks that succeeded before the kill
/// are not run again — one whose submission was purged, and one whose
/// submission is still in the stream (behind the held ones) and whose
/// result is only in a result batch (`r.<epoch>.<n>`), not under its id.
/// Both are still looked up after the takeover (through the successor's
/// index of result batches).
#[tokio::test]
async fn a_cold_takeover_reattaches_running_attempts_and_skips_finished_tasks() {
    let t = ColdTakeover::stage().await;
    let log = t.kill_leader_and_check_each_ran_once().await;
    assert!(log.contains("warm_standby = false"), "{log}");
    assert!(log.contains("task recovered from the journal"), "{log}");
}

/// A cluster whose first server leads (warm) and whose second reads the
/// journal cold when it takes over; one task succeeded, three attempts
/// are held running.
struct ColdTakeover {
    c: Cluster,
    second: CronoqServer,
    done: TaskId,
    held: Vec<TaskId>,
    /// Finished while the held ones run: its submission stays.
    done_after: TaskId,
}

impl ColdTakeover {
    async fn stage() -> ColdTakeover {
        let config = format!("{}\n", procs::SERVER_CONFIG).replacen(
            "[server]\n",
            "[server]\nwarm_standby = false\n",
            1,
        );
        assert!(config.contains("warm_standby = false"), "{config}");
        let c = Cluster::start(&[("cpu", "", 4)]).await;
        let second =
            CronoqServer::start_configured(&c.nats, c.dir.path(), &config, &[], false).await;
        let done = c.submit_payload("done-before", "").await;
        assert_eq!(c.finished(done).await.state, TaskState::Succeeded);
        let held = running_held(&c, "held", 3, "go").await;
        let done_after = c.submit_payload("done-after", "").await;
        assert_eq!(c.finished(done_after).await.state, TaskState::Succeeded);
        ColdTakeover {
            c,
            second,
            done,
            held,
            done_after,
        }
    }

    /// `kill -9` of the leader; the cold server takes over, re-attaches
    /// the held attempts, each runs once and the finished task not again.
    /// The successor's log.
    async fn kill_leader_and_check_each_ran_once(self) -> String {
        let ColdTakeover {
            mut c,
            mut second,
            done,
            held,
            done_after,
        } = self;
        c.server.kill9();
        taken_over_by(&second).await;
        std::mem::swap(&mut c.server, &mut second);
        reattached_and_run_once(&c, &held, "go").await;
        assert_eq!(c.finished(done).await.state, TaskState::Succeeded);
        assert_eq!(c.finished(done_after).await.state, TaskState::Succeeded);
        let runs = c.runs();
        assert_eq!(runs.len(), 5, "each ran once, as attempt 1: {runs:?}");
        assert!(runs.iter().all(|r| r.attempt == 1), "{runs:?}");
        c.server.log_tail(400)
    }
}

/// Messages in the log that are not the leader's entries change nothing:
/// an undecodable one and a piece claiming a later leadership that never
/// took over are logged and skipped by the successor, which re-attaches
/// the held attempts (each runs once) and does not run the finished tasks
/// again. (On an open NATS anyone may write the log: such a message also
/// fences the leader out, a leader change, never a wrong outcome.)
#[tokio::test]
async fn a_takeover_reads_the_log_and_skips_hostile_messages() {
    let t = ColdTakeover::stage().await;
    let nats = async_nats::connect(t.c.nats_url()).await.expect("nats");
    let js = async_nats::jetstream::new(nats.clone());
    #[derive(serde::Serialize)]
    struct Piece {
        epoch: u64,
        n: u64,
        part: u32,
        parts: u32,
        #[serde(with = "serde_bytes_like")]
        data: Vec<u8>,
    }
    mod serde_bytes_like {
        pub fn serialize<S: serde::Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
            s.serialize_bytes(v)
        }
    }
    let forged = Piece {
        epoch: u64::MAX,
        n: 5,
        part: 0,
        parts: 1,
        data: b"not an entry".to_vec(),
    };
    for body in [cronoq::wire::encode(&forged), b"\xc1 not a piece".to_vec()] {
        js.publish("cronoq.log.main", body.into())
            .await
            .expect("publish")
            .await
            .expect("stored");
    }
    let log = t.kill_leader_and_check_each_ran_once().await;
    assert!(
        log.contains("a message of the log is not the log's"),
        "{log}"
    );
}

/// JetStream's max age (`results_ttl`) expires every message of the
/// results bucket, a key's newest included: a live task's record is
/// written again every third of it. Attempts that ran for more than twice
/// `results_ttl` before the leader was killed still have their records,
/// and a successor that reads the journal cold (no warm copy to fall back
/// on) re-attaches them: each runs once.
#[tokio::test]
async fn attempts_running_longer_than_results_ttl_keep_their_records() {
    // results_ttl is at least twice election_timeout (the leader record
    // lives in the same bucket).
    let config = format!("{}\n", procs::SERVER_CONFIG)
        .replacen(
            "[server]\n",
            "[server]\nresults_ttl = \"3s\"\nwarm_standby = false\n",
            1,
        )
        .replacen(
            "election_timeout = \"3s\"",
            "election_timeout = \"1500ms\"",
            1,
        );
    assert!(config.contains("results_ttl = \"3s\""), "{config}");
    assert!(config.contains("election_timeout = \"1500ms\""), "{config}");
    let mut c = Cluster::start_configured(&config, &[("cpu", "", 2)]).await;
    let mut second =
        CronoqServer::start_configured(&c.nats, c.dir.path(), &config, &[], false).await;
    let held = running_held(&c, "long", 2, "go").await;
    // Real time, not speed: past two max ages, any record written only at
    // the start is gone.
    tokio::time::sleep(std::time::Duration::from_secs(7)).await;
    c.server.kill9();
    taken_over_by(&second).await;
    std::mem::swap(&mut c.server, &mut second);
    reattached_and_run_once(&c, &held, "go").await;
    let runs = c.runs();
    assert_eq!(runs.len(), 2, "each ran once, as attempt 1: {runs:?}");
    assert!(runs.iter().all(|r| r.attempt == 1), "{runs:?}");
    drop(second);
}

/// A bucket keeps the max age it was created with: a leader whose
/// `results_ttl` differs brings it to its own when it takes over, so
/// that its rewrites of the journal's records (every third of it) keep
/// pace with what JetStream expires; a follower changes nothing.
#[tokio::test]
async fn a_changed_results_ttl_is_applied_to_the_bucket_by_the_next_leader() {
    let mut c = Cluster::start(&[]).await;
    let js = async_nats::jetstream::new(async_nats::connect(c.nats_url()).await.expect("nats"));
    let bucket = format!("KV_{}", cronoq::wire::Subjects::default().results_bucket());
    let max_age = || async {
        let mut stream = js.get_stream(&bucket).await.expect("the results bucket");
        stream.info().await.expect("stream info").config.max_age
    };
    let day = std::time::Duration::from_secs(24 * 3600);
    assert_eq!(max_age().await, day);
    let config = format!("{}\n", procs::SERVER_CONFIG).replacen(
        "[server]\n",
        "[server]\nresults_ttl = \"2h\"\n",
        1,
    );
    let second = CronoqServer::start_configured(&c.nats, c.dir.path(), &config, &[], false).await;
    assert_eq!(max_age().await, day, "a follower changed the bucket");
    c.server.kill9();
    taken_over_by(&second).await;
    assert_eq!(max_age().await, std::time::Duration::from_secs(2 * 3600));
    let log = second.log_tail(200);
    assert!(log.contains("results bucket max age updated"), "{log}");
}

/// Issue 8, re-attachment: attempts running when the leader is killed keep
/// running on their workers; the successor re-attaches them from the
/// journal and counts their outcomes, so each ran exactly once (attempt
/// 1). Then the same with a single server killed and started again.
#[tokio::test]
async fn running_attempts_survive_the_leaders_death_and_run_once() {
    let mut c = Cluster::start(&[("cpu", "", 4)]).await;
    let mut second = CronoqServer::start_follower(&c.nats, c.dir.path()).await;
    let (_, epoch) = leader_seen_by(&c.server).await.expect("leader's view");

    let held = running_held(&c, "held", 3, "go").await;
    c.server.kill9();
    let (_, new_epoch) = taken_over_by(&second).await;
    assert!(new_epoch > epoch);
    std::mem::swap(&mut c.server, &mut second);
    // The worker re-registers with the successor, listing its attempts.
    reattached_and_run_once(&c, &held, "go").await;

    // A lone server killed and started again: the same.
    let more = running_held(&c, "again", 2, "go2").await;
    c.server.kill9();
    drop(second);
    c.server = CronoqServer::start(&c.nats, c.dir.path()).await;
    reattached_and_run_once(&c, &more, "go2").await;
    let runs = c.runs();
    assert_eq!(runs.len(), 5, "each ran once, as attempt 1: {runs:?}");
    assert!(runs.iter().all(|r| r.attempt == 1), "{runs:?}");
}

/// `/readyz` of `server` and its body, once it answers `want` (200 or
/// 503) with a body containing `detail`.
async fn readyz_until(server: &CronoqServer, want: u16, detail: &str) -> String {
    let url = format!("{}/readyz", server.http_url());
    let url = &url;
    eventually(
        &format!("{} readyz {want} {detail:?}", server.id()),
        || async move {
            let (status, body) = http_get(url).await;
            if status == want && body.contains(detail) {
                Ok(body)
            } else {
                Err(format!("{status} {body}"))
            }
        },
    )
    .await
}

/// The `cronoq_unready` line of `server`'s `/metrics`.
async fn unready_metric(server: &CronoqServer) -> String {
    let (status, text) = http_get(&format!("{}/metrics", server.http_url())).await;
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("cronoq_ready 0"), "{text}");
    text.lines()
        .find(|l| l.starts_with("cronoq_unready{"))
        .unwrap_or_else(|| panic!("no cronoq_unready in {text}"))
        .to_string()
}

/// Issue 20 finding 5: `/readyz` fails, and `/metrics` says why, when a
/// stream cronoq needs is missing, when no server leads, and when the
/// leader record is not one a cronoq server wrote (a plain NATS client
/// on an open NATS can put one). It used to say "follower of evil".
#[tokio::test]
async fn readyz_fails_without_a_stream_a_leader_or_a_genuine_leader_record() {
    let mut c = Cluster::start(&[]).await;
    // The follower waits long before taking over: the time without a
    // leader is long enough to see.
    let slow =
        procs::SERVER_CONFIG.replacen("election_timeout = \"3s\"", "election_timeout = \"10s\"", 1);
    assert!(slow.contains("\"10s\""));
    let follower = CronoqServer::start_configured(&c.nats, c.dir.path(), &slow, &[], false).await;
    readyz_until(&follower, 200, "follower of").await;
    let nats = async_nats::connect(c.nats_url()).await.unwrap();
    let js = async_nats::jetstream::new(nats.clone());

    // A stream deleted under the servers: both unready, naming it.
    let dead_letters = js.get_stream("CRONOQ_DEADLETTER").await.unwrap();
    let config = dead_letters.cached_info().config.clone();
    js.delete_stream("CRONOQ_DEADLETTER").await.unwrap();
    for server in [&c.server, &follower] {
        readyz_until(server, 503, "the dead-letter stream CRONOQ_DEADLETTER").await;
    }
    let line = unready_metric(&c.server).await;
    assert!(line.contains("CRONOQ_DEADLETTER"), "{line}");
    js.create_stream(config).await.unwrap();
    readyz_until(&c.server, 200, "leader").await;
    readyz_until(&follower, 200, "follower of").await;

    // The leader dies: until the follower takes over, nobody leads.
    c.server.kill9();
    readyz_until(&follower, 503, "no leader: the leader record").await;
    let line = unready_metric(&follower).await;
    assert!(line.contains("has not moved"), "{line}");
    readyz_until(&follower, 200, "leader").await;

    // A record no cronoq server wrote, put again and again: the leader
    // is fenced out, and nobody is ready behind "evil".
    let forger = tokio::spawn({
        let nats = nats.clone();
        async move {
            loop {
                let _ = nats
                    .publish(
                        "$KV.CRONOQ_RESULTS._leader",
                        r#"{"id":"evil","epoch":99999999}"#.into(),
                    )
                    .await;
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
        }
    });
    let body = readyz_until(&follower, 503, "not written by a cronoq server").await;
    assert!(!body.contains("follower of evil"), "{body}");
    let line = unready_metric(&follower).await;
    assert!(line.contains("not written by a cronoq server"), "{line}");
    forger.abort();
}

/// Issue 22: a warm standby keeps the submit stream decoded, and its
/// takeover hands that copy to the driver instead of reading the stream
/// again. What the copy held comes through as a read of the stream would
/// bring it: a running attempt is re-attached and runs once, waiting tasks
/// still wait, a finished task does not run again, and a task submitted
/// while nobody leads (after the copy was taken, or in it) runs.
#[tokio::test]
async fn a_takeover_takes_submissions_from_the_standbys_copy() {
    let mut c = Cluster::start(&[("cpu", "", 2)]).await;
    let mut second = CronoqServer::start_follower(&c.nats, c.dir.path()).await;
    leader_seen_by(&second).await.expect("follower's view");
    let done = c.submit_payload("done-before", "").await;
    assert_eq!(c.finished(done).await.state, TaskState::Succeeded);
    let held = running_held(&c, "held", 1, "go").await;
    let waiting = waiting_tasks(&c, 5).await;

    c.server.kill9();
    let during = c.submit_payload("during-takeover", "").await;
    taken_over_by(&second).await;
    std::mem::swap(&mut c.server, &mut second);
    reattached_and_run_once(&c, &held, "go").await;
    assert_eq!(c.succeeded(during).await, "during-takeover on [] by cpu");
    assert_eq!(c.finished(done).await.state, TaskState::Succeeded);
    for id in &waiting {
        assert_eq!(c.status(*id).await.state, TaskState::Queued);
    }
    let runs = ran_once(&c, &["done-before", "held-0", "during-takeover"]);
    assert!(
        !runs.iter().any(|r| r.name.starts_with("waits-")),
        "{runs:?}"
    );
    let log = strip_ansi(&c.server.log_tail(400));
    let taken = log
        .lines()
        .find(|l| l.contains("submissions taken from the standby's copy"))
        .unwrap_or_else(|| panic!("no takeover from the copy:\n{log}"));
    // The held task and the waiting ones at least (the finished one may
    // have been purged).
    let held_n: usize = taken
        .split("held=")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{taken}"));
    assert!(held_n > waiting.len(), "{taken}");
    drop(second);
}

/// Issue 22 (warm standbys): a standby is ready (`/readyz` 200) only once
/// its copies of the submit stream and the journal have caught up, so a
/// rolling restart that waits for readiness before stopping the next
/// server leaves a standby that takes over from memory. One started after
/// 1,000 waiting submissions logs "standby warm" with all of them before
/// `start_follower` sees it ready, and a kill -9 of the leader right then
/// is taken over from its copies, whole.
#[tokio::test]
async fn a_standby_is_ready_only_once_its_copies_caught_up() {
    let mut c = Cluster::start(&[("cpu", "", 2)]).await;
    let n = 1_000;
    let submits = (0..n).map(|i| {
        let client = c.client.clone();
        async move {
            client
                .submit(Task::new(format!("waits-{i}")).label("gpu", "none"))
                .await
                .expect("submitted")
        }
    });
    let ids = futures_util::future::join_all(submits).await;
    c.task_until(ids[n - 1], "queued", |s| s.state == TaskState::Queued)
        .await;
    let mut second = CronoqServer::start_follower(&c.nats, c.dir.path()).await;
    let log = strip_ansi(&second.log_tail(20_000));
    let warm = log
        .lines()
        .find(|l| l.contains("standby warm"))
        .unwrap_or_else(|| panic!("ready before it was warm:\n{log}"));
    let copied: usize = warm
        .split("submissions=")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{warm}"));
    assert!(copied >= n, "{warm}");

    c.server.kill9();
    taken_over_by(&second).await;
    std::mem::swap(&mut c.server, &mut second);
    let log = strip_ansi(&c.server.log_tail(20_000));
    assert!(
        log.contains("reading the journal from the warm copy"),
        "{log}"
    );
    let taking = log
        .lines()
        .find(|l| l.contains("taking submissions from the standby's copy"))
        .unwrap_or_else(|| panic!("no takeover from the copy:\n{log}"));
    assert!(taking.contains("whole=true"), "{taking}");
    assert_eq!(c.status(ids[0]).await.state, TaskState::Queued);
    drop(second);
}

/// Issue 22 (kill -9 → first lease under 1 s whatever the state size): a
/// standby builds the successor's driver from its warm copies once the
/// leader record has stood still for half the election timeout, and leads
/// with it; it drops it when the leader renews after all (and is warm
/// again once its copy has caught up); when the journal took a record after it prepared (here a
/// forged one, written while the standby was paused too, so it lands in
/// between for sure), the prepared driver is dropped and the journal read
/// as before. Either way the running attempt is re-attached and runs once,
/// the waiting tasks stay queued, what finished before does not run
/// again, and a task submitted during the takeover runs.
#[tokio::test]
async fn a_successor_prepared_ahead_leads_with_it_or_drops_it() {
    let mut c = Cluster::start(&[("cpu", "", 2)]).await;
    let mut second = CronoqServer::start_follower(&c.nats, c.dir.path()).await;
    leader_seen_by(&second).await.expect("follower's view");
    let done = c.submit_payload("done-before", "").await;
    assert_eq!(c.finished(done).await.state, TaskState::Succeeded);
    let waiting = waiting_tasks(&c, 3).await;

    // The leader falls silent (SIGSTOP: a dead one, as far as anyone can
    // tell); the standby prepares, then leads with what it prepared.
    let held = running_held(&c, "held", 1, "go").await;
    const PREPARED: &str = "successor prepared while the leader is silent";
    let before = logged_lines(&second, PREPARED);
    c.server.pause();
    logged_again(&second, PREPARED, before).await;
    let during = c.submit_payload("during-takeover", "").await;
    taken_over_by(&second).await;
    std::mem::swap(&mut c.server, &mut second);
    let log = strip_ansi(&c.server.log_tail(400));
    assert!(
        log.contains("leading with the successor prepared while the leader was silent"),
        "{log}"
    );
    reattached_and_run_once(&c, &held, "go").await;
    assert_eq!(c.succeeded(during).await, "during-takeover on [] by cpu");

    // The old leader, resumed, stands by (its copies caught up again);
    // A false alarm first: the leader falls silent until the standby has
    // prepared, then renews (the standby paused meanwhile, so the renewal
    // lands before any takeover of its). The standby drops what it
    // prepared, its copy of the submissions starts over, and it is ready
    // again once the copy has caught up, even with nothing new to read;
    // the leader leads on.
    second.resume();
    ready_follower(&second).await;
    let nats = async_nats::connect(c.nats_url()).await.expect("nats");
    let js = async_nats::jetstream::new(nats);
    let results = js.get_stream("KV_CRONOQ_RESULTS").await.expect("stream");
    let leader_seq = || async {
        results
            .get_last_raw_message_by_subject("$KV.CRONOQ_RESULTS._leader")
            .await
            .map(|m| m.sequence)
            .map_err(|e| e.to_string())
    };
    const DROPPED: &str = "the prepared successor is dropped";
    let (prepared, dropped) = (
        logged_lines(&second, PREPARED),
        logged_lines(&second, DROPPED),
    );
    c.server.pause();
    logged_again(&second, PREPARED, prepared).await;
    second.pause();
    let silent_at = leader_seq().await.expect("the leader record");
    c.server.resume();
    eventually("the leader to renew", || async {
        match leader_seq().await {
            Ok(seq) if seq != silent_at => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    second.resume();
    logged_again(&second, DROPPED, dropped).await;
    ready_follower(&second).await;
    let (leader, _) = leader_seen_by(&second).await.expect("follower's view");
    assert_eq!(leader, c.server.id());

    // Then the leader falls silent for good, and once the standby has
    // prepared, a record lands in the journal before its takeover.
    let held = running_held(&c, "again", 1, "go-again").await;
    let before = logged_lines(&second, PREPARED);
    c.server.pause();
    logged_again(&second, PREPARED, before).await;
    second.pause();
    // On the log itself: it moves the log's last sequence (and is no
    // entry of it).
    js.publish("cronoq.log.main", "late".into())
        .await
        .expect("published")
        .await
        .expect("stored");
    second.resume();
    taken_over_by(&second).await;
    std::mem::swap(&mut c.server, &mut second);
    let log = strip_ansi(&c.server.log_tail(400));
    assert!(
        log.contains("the prepared successor is not used")
            && log.contains("the journal took a record after it was prepared"),
        "{log}"
    );
    assert!(
        !log.contains("leading with the successor prepared"),
        "{log}"
    );
    reattached_and_run_once(&c, &held, "go-again").await;
    for id in &waiting {
        assert_eq!(c.status(*id).await.state, TaskState::Queued);
    }
    let runs = ran_once(&c, &["done-before", "held-0", "during-takeover", "again-0"]);
    assert!(
        !runs.iter().any(|r| r.name.starts_with("waits-")),
        "{runs:?}"
    );
    drop(second);
}

/// Submits `n` tasks named `waits-<i>` that no worker can run
/// (`gpu=none`), and waits until each is queued.
async fn waiting_tasks(c: &Cluster, n: usize) -> Vec<TaskId> {
    let mut waiting = Vec::new();
    for i in 0..n {
        waiting.push(c.submit_payload(&format!("waits-{i}"), "gpu=none").await);
    }
    for id in &waiting {
        c.task_until(*id, "queued", |s| s.state == TaskState::Queued)
            .await;
    }
    waiting
}

/// Waits until `server` answers `/readyz` as a ready follower (its copies
/// caught up).
async fn ready_follower(server: &CronoqServer) {
    eventually("the server to be a ready follower", || async {
        let (status, health) = http_get(&format!("{}/readyz", server.http_url())).await;
        if status == 200 && health.contains("follower") {
            Ok(())
        } else {
            Err(format!("{status} {health}"))
        }
    })
    .await;
}

/// Checks that each task named in `names` ran exactly once; every run.
fn ran_once(c: &Cluster, names: &[&str]) -> Vec<procs::Run> {
    let runs = c.runs();
    for name in names {
        let n = runs.iter().filter(|r| r.name == *name).count();
        assert_eq!(n, 1, "{name} ran once: {runs:?}");
    }
    runs
}

/// How many lines of `server`'s log contain `what`.
fn logged_lines(server: &CronoqServer, what: &str) -> usize {
    strip_ansi(&server.log_tail(20_000))
        .lines()
        .filter(|l| l.contains(what))
        .count()
}

/// Waits until `server` logs one more line containing `what` than the
/// `before` it had.
async fn logged_again(server: &CronoqServer, what: &str, before: usize) {
    eventually(&format!("{} to log {what:?}", server.id()), || async {
        let now = logged_lines(server, what);
        if now > before {
            Ok(())
        } else {
            Err(format!("{now} lines"))
        }
    })
    .await;
}

/// `text` without its terminal colour codes (`ESC [ … m`).
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            chars.by_ref().find(|c| *c == 'm');
        } else {
            out.push(c);
        }
    }
    out
}
