//! Schedules on `cronoq server`s (issue 23), real processes throughout:
//! a one-second schedule fires each tick exactly once through two `kill -9`s
//! of the leader (checked from the workers' own logs: `CRONOQ_SCHEDULE` and
//! `CRONOQ_SCHEDULED_AT` of every attempt), and the overlap policies
//! (skip, buffer_one, cancel_previous) hold against runs on real workers.
//!
//! No test sleeps to wait for something: every wait polls with a deadline.

mod procs;

use std::collections::BTreeMap;
use std::time::Duration;

use cronoq::api::ScheduleInfo;
use cronoq::client::{ClientOptions, HttpClient};
use cronoq::core::TaskState;
use cronoq::schedule::ScheduleSpec;
use procs::{eventually, hold, taken_over_by, Cluster, CronoqServer};

/// The HTTP client of one server.
fn http(server: &CronoqServer) -> HttpClient {
    ClientOptions::new()
        .request_timeout(Duration::from_secs(5))
        .http(&server.http_url())
        .expect("an HTTP client")
}

fn spec(json: serde_json::Value) -> ScheduleSpec {
    serde_json::from_value(json).expect("a schedule spec")
}

/// One line of `schedules.log`: (schedule, scheduled at in ms, task id).
fn fired(c: &Cluster) -> Vec<(String, u64, u64)> {
    let text = std::fs::read_to_string(c.dir.path().join("schedules.log")).unwrap_or_default();
    text.lines()
        .map(|line| {
            let parts: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(parts.len(), 5, "schedules.log line {line:?}");
            let at = cronoq::task::parse_rfc3339(parts[1])
                .unwrap_or_else(|| panic!("CRONOQ_SCHEDULED_AT {:?} is RFC 3339", parts[1]))
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis() as u64;
            (parts[0].to_string(), at, parts[2].parse().expect("task id"))
        })
        .collect()
}

/// Waits until `n` more ticks of `name` ran than `before`.
async fn ticks_run(c: &Cluster, name: &str, at_least: usize) {
    eventually(&format!("{at_least} ticks of {name} to run"), || async {
        let n = fired(c).iter().filter(|(s, _, _)| s == name).count();
        if n >= at_least {
            Ok(())
        } else {
            Err(format!("{n} ran"))
        }
    })
    .await;
}

#[tokio::test]
async fn a_schedule_fires_each_tick_exactly_once_through_two_leader_kills() {
    let mut c = Cluster::start(&[("cpu", "", 4), ("cpu2", "", 4)]).await;
    let mut second = CronoqServer::start_follower(&c.nats, c.dir.path()).await;
    let mut third = CronoqServer::start_follower(&c.nats, c.dir.path()).await;
    let created = http(&c.server)
        .create_schedule(spec(serde_json::json!({
            "name": "beat", "every": "1s", "task": {"payload": "beat"}
        })))
        .await
        .expect("created");
    assert_eq!(created.next_fires.len(), 5);
    ticks_run(&c, "beat", 3).await;

    // kill -9 of the leader: one of the others takes over and goes on.
    c.server.kill9();
    let next = eventually("a follower to take over", || async {
        for (i, s) in [&second, &third].into_iter().enumerate() {
            if let Ok((id, _)) = procs::leader_seen_by(s).await {
                if id == s.id() {
                    return Ok(i);
                }
            }
        }
        Err("no follower leads yet".to_string())
    })
    .await;
    let before = fired(&c).len();
    ticks_run(&c, "beat", before + 3).await;
    // And again: kill -9 of the new leader; the last one takes over.
    let (killed, last) = if next == 0 {
        (&mut second, &third)
    } else {
        (&mut third, &second)
    };
    killed.kill9();
    taken_over_by(last).await;
    let before = fired(&c).len();
    ticks_run(&c, "beat", before + 3).await;
    // Stop firing; let the last runs finish.
    http(last).pause_schedule("beat").await.expect("paused");
    let info: ScheduleInfo = http(last).get_schedule("beat").await.expect("get");
    let last_tick = info.state.last_fired.expect("fired").0;
    eventually("every fired tick to have run", || async {
        let runs = fired(&c);
        match runs.iter().map(|r| r.1).max() {
            Some(t) if t >= last_tick => Ok(()),
            other => Err(format!("last run {other:?}, last fired {last_tick}")),
        }
    })
    .await;

    // Exactly once: one task per tick, every tick from the first to the
    // last (each inside the catch-up window, so none is missed).
    let mut tasks: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for (schedule, at, task) in fired(&c) {
        assert_eq!(schedule, "beat");
        let ids = tasks.entry(at).or_default();
        if !ids.contains(&task) {
            ids.push(task);
        }
    }
    let twice: Vec<_> = tasks.iter().filter(|(_, ids)| ids.len() > 1).collect();
    assert!(twice.is_empty(), "ticks run as two tasks: {twice:?}");
    let ticks: Vec<u64> = tasks.keys().copied().collect();
    let first = ticks[0];
    let expected: Vec<u64> = (0..ticks.len() as u64).map(|i| first + i * 1_000).collect();
    assert_eq!(ticks, expected, "a tick is missing (runs: {tasks:?})");
    assert!(ticks.len() >= 9, "{ticks:?}");
    let counters = http(last).get_schedule("beat").await.unwrap().counters;
    assert_eq!(counters.missed, 0, "{counters:?}");
}

#[tokio::test]
async fn overlap_policies_hold_against_runs_on_real_workers() {
    let c = Cluster::start(&[("cpu", "", 4)]).await;
    let api = http(&c.server);
    // skip: the first run holds; the ticks meanwhile are skipped.
    api.create_schedule(spec(serde_json::json!({
        "name": "skipper", "every": "1s", "overlap": "skip",
        "task": {"payload": hold("skipper", "skip-go")}
    })))
    .await
    .unwrap();
    let first = eventually("skipper's first run", || async {
        let runs = c.runs();
        runs.iter()
            .find(|r| r.name == "skipper")
            .map(|r| r.task)
            .ok_or_else(|| format!("{runs:?}"))
    })
    .await;
    eventually("two ticks skipped", || async {
        let info = api
            .get_schedule("skipper")
            .await
            .map_err(|e| e.to_string())?;
        if info.counters.skipped >= 2 {
            Ok(())
        } else {
            Err(format!("{:?}", info.counters))
        }
    })
    .await;
    let runs: Vec<_> = c
        .runs()
        .into_iter()
        .filter(|r| r.name == "skipper")
        .collect();
    assert_eq!(
        runs.len(),
        1,
        "no second run while the first is live: {runs:?}"
    );
    api.pause_schedule("skipper").await.unwrap();
    c.release("skip-go");
    let status = c.finished(cronoq::core::TaskId(first)).await;
    assert_eq!(status.state, TaskState::Succeeded);

    // buffer_one: the first run holds, one tick waits behind it, the
    // others are skipped; released, the buffered tick runs.
    api.create_schedule(spec(serde_json::json!({
        "name": "buffer", "every": "1s", "overlap": "buffer_one",
        "task": {"payload": hold("buffer", "buffer-go")}
    })))
    .await
    .unwrap();
    eventually(
        "buffer's first run and two ticks skipped behind the buffered one",
        || async {
            let info = api
                .get_schedule("buffer")
                .await
                .map_err(|e| e.to_string())?;
            let runs = c.runs().into_iter().filter(|r| r.name == "buffer").count();
            if runs == 1 && info.state.buffered.is_some() && info.counters.skipped >= 2 {
                Ok(())
            } else {
                Err(format!(
                    "{runs} runs, {:?}, {:?}",
                    info.state, info.counters
                ))
            }
        },
    )
    .await;
    api.pause_schedule("buffer").await.unwrap();
    c.release("buffer-go");
    eventually("the buffered tick to run once the first ended", || async {
        let runs: Vec<_> = c
            .runs()
            .into_iter()
            .filter(|r| r.name == "buffer")
            .collect();
        if runs.len() == 2 && runs[0].task != runs[1].task {
            Ok(())
        } else {
            Err(format!("{runs:?}"))
        }
    })
    .await;

    // cancel_previous: each tick cancels the run before it.
    api.create_schedule(spec(serde_json::json!({
        "name": "canceller", "every": "1s", "overlap": "cancel_previous",
        "task": {"payload": hold("canceller", "never")}
    })))
    .await
    .unwrap();
    let ids = eventually("two runs of canceller", || async {
        let ids: Vec<u64> = c
            .runs()
            .into_iter()
            .filter(|r| r.name == "canceller")
            .map(|r| r.task)
            .collect();
        if ids.len() >= 2 {
            Ok(ids)
        } else {
            Err(format!("{ids:?}"))
        }
    })
    .await;
    api.pause_schedule("canceller").await.unwrap();
    let status = c.finished(cronoq::core::TaskId(ids[0])).await;
    assert_eq!(
        status.state,
        TaskState::Cancelled,
        "the earlier run is cancelled"
    );
    api.delete_schedule("canceller").await.unwrap();
}
