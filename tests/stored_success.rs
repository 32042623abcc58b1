//! A stored success never runs again (issue 35). The operator's scenario:
//! a task nobody can run yet waits; a second task succeeds; its stored
//! result in the results bucket expires (`results_ttl = "3s"`) while its
//! submission stays in the submit stream (purged only below the oldest
//! unfinished task); then a takeover. Before the log, a cold takeover or a
//! restarted standby found the submission with no result and ran the task
//! again. The log expires nothing: the successor knows it finished.
//!
//! Three ways to take over: a warm standby, a standby restarted just
//! before (a rolling upgrade), and `warm_standby = false`.

mod procs;

use std::time::Duration;

use cronoq::core::TaskState;
use procs::{describe, taken_over_by, Cluster, CronoqServer};

fn config(warm: bool) -> String {
    let config = format!("{}\n", procs::SERVER_CONFIG)
        .replacen(
            "[server]\n",
            &format!("[server]\nresults_ttl = \"3s\"\nwarm_standby = {warm}\n"),
            1,
        )
        .replacen(
            "election_timeout = \"3s\"",
            "election_timeout = \"1500ms\"",
            1,
        );
    assert!(config.contains("results_ttl = \"3s\""), "{config}");
    config
}

async fn a_success_behind_a_waiting_task_does_not_run_again(warm: bool, restart_standby: bool) {
    let config = config(warm);
    let mut c = Cluster::start_configured(&config, &[("cpu", "", 2)]).await;
    let mut second =
        CronoqServer::start_configured(&c.nats, c.dir.path(), &config, &[], false).await;
    // Nobody can run it: it waits, and pins the submit stream below it.
    let waiting = c.submit_payload("waits-for-h100", "gpu=h100").await;
    let done = c.submit_payload("succeeds-once", "").await;
    let status = c.finished(done).await;
    assert_eq!(status.state, TaskState::Succeeded, "{}", describe(&status));
    // Past the results bucket's max age (real time, not speed): the
    // stored result is gone, the submission is not.
    tokio::time::sleep(Duration::from_secs(7)).await;
    if restart_standby {
        second.kill9();
        second = CronoqServer::start_configured(&c.nats, c.dir.path(), &config, &[], false).await;
    }
    c.server.kill9();
    taken_over_by(&second).await;
    std::mem::swap(&mut c.server, &mut second);
    // A task submitted after the takeover runs; by the time it has, the
    // successor has admitted (and would have leased) everything before it.
    let after = c.submit_payload("after-takeover", "").await;
    assert_eq!(c.finished(after).await.state, TaskState::Succeeded);
    let runs = c.runs();
    let again = runs.iter().filter(|r| r.name == "succeeds-once").count();
    assert_eq!(again, 1, "the stored success ran again: {runs:?}");
    // Its result is kept for `results_ttl` (past here): the successor
    // answers it succeeded in one attempt, or does not know it — never
    // that it runs.
    match c.client.get(done).await {
        Ok(status) => {
            assert_eq!(status.state, TaskState::Succeeded, "{}", describe(&status));
            assert_eq!(status.attempts.len(), 1, "{}", describe(&status));
        }
        Err(e) => assert!(e.to_string().contains("NOT_FOUND"), "{e}"),
    }
    assert_eq!(c.status(waiting).await.state, TaskState::Queued);
}

#[tokio::test]
async fn a_warm_standby_does_not_run_a_stored_success_again() {
    a_success_behind_a_waiting_task_does_not_run_again(true, false).await;
}

#[tokio::test]
async fn a_restarted_standby_does_not_run_a_stored_success_again() {
    a_success_behind_a_waiting_task_does_not_run_again(true, true).await;
}

#[tokio::test]
async fn a_cold_takeover_does_not_run_a_stored_success_again() {
    a_success_behind_a_waiting_task_does_not_run_again(false, false).await;
}
