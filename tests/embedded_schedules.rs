//! Schedules in the embedded `Scheduler` (issue 23), through its public
//! API and its `Api` impl: each overlap policy with real executors,
//! trigger, backfill, pause/resume, and bad input (each code, and that
//! nothing changed). Under paused tokio time: no test waits on the wall
//! clock.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use cronoq::api::{Api, BackfillRange, FireKind, ScheduleInfo};
use cronoq::core::{ErrorCode, Millis};
use cronoq::schedule::{Overlap, ScheduleSpec};
use cronoq::{Scheduler, TaskState};

const POOL: &str = "cron";

/// How many runs are live now, and the most ever live at once.
#[derive(Clone, Default)]
struct Live {
    now: Arc<AtomicUsize>,
    max: Arc<AtomicUsize>,
}

/// A scheduler whose executor runs `run_for` (or for ever with `None`).
fn scheduler(run_for: Option<Duration>) -> (Scheduler, Live) {
    let sched = Scheduler::new();
    sched.set_capacity(POOL, 8).unwrap();
    let live = Live::default();
    let l = live.clone();
    sched
        .executor(POOL, move |_ctx, payload: Bytes| {
            let l = l.clone();
            async move {
                let n = l.now.fetch_add(1, Ordering::SeqCst) + 1;
                l.max.fetch_max(n, Ordering::SeqCst);
                struct Done(Arc<AtomicUsize>);
                impl Drop for Done {
                    fn drop(&mut self) {
                        self.0.fetch_sub(1, Ordering::SeqCst);
                    }
                }
                let _done = Done(l.now.clone());
                match run_for {
                    Some(d) => tokio::time::sleep(d).await,
                    None => std::future::pending::<()>().await,
                }
                Ok(payload)
            }
        })
        .unwrap();
    (sched, live)
}

fn every(name: &str, every: &str, overlap: Overlap) -> ScheduleSpec {
    serde_json::from_value(serde_json::json!({
        "name": name, "every": every, "overlap": overlap,
        "task": { "pool": POOL, "payload": name },
    }))
    .unwrap()
}

/// Polls `get_schedule` (in paused time) until `done` holds.
async fn until(
    sched: &Scheduler,
    name: &str,
    done: impl Fn(&ScheduleInfo) -> bool,
) -> ScheduleInfo {
    for _ in 0..600 {
        let info = sched.get_schedule(name).unwrap();
        if done(&info) {
            return info;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "{name}: condition not reached: {:?}",
        sched.get_schedule(name)
    );
}

/// The fired ticks, oldest first.
fn ticks(info: &ScheduleInfo) -> Vec<u64> {
    info.history.iter().rev().map(|r| r.tick.0).collect()
}

#[tokio::test(start_paused = true)]
async fn allow_fires_every_tick_once_in_order_with_its_key() {
    let (sched, _) = scheduler(Some(Duration::from_millis(10)));
    let created = sched.schedule(every("a", "1s", Overlap::Allow)).unwrap();
    assert_eq!(created.next_fires.len(), 5);
    let info = until(&sched, "a", |i| {
        i.history.len() >= 5 && i.history.iter().all(|r| r.outcome.is_some())
    })
    .await;
    let t = ticks(&info);
    assert!(t.windows(2).all(|w| w[1] - w[0] == 1_000), "{t:?}");
    assert_eq!(t[0], created.next_fires[0].0);
    for r in &info.history {
        assert_eq!(r.kind, FireKind::Tick);
        assert_eq!(r.outcome, Some(TaskState::Succeeded));
        let status = sched.task(r.task.unwrap()).unwrap();
        assert_eq!(status.state, TaskState::Succeeded);
    }
    // The tick's idempotency key finds the tick's task.
    let again = sched
        .submit_now(
            cronoq::Task::new("x")
                .pool(POOL)
                .idempotency_key(format!("schedule:a:{}", t[0])),
        )
        .unwrap();
    assert_eq!(Some(again.id()), info.history.last().unwrap().task);
    assert_eq!(info.counters.skipped, 0);
    // Counters per schedule and the fire lag, in the metrics snapshot.
    let m = sched.metrics().schedules.unwrap();
    assert_eq!(m.schedules[0].schedule, "a");
    assert_eq!(m.schedules[0].fires, info.counters.fires);
    assert!(m.fire_lag.count >= 5);
}

#[tokio::test(start_paused = true)]
async fn allow_lets_runs_overlap_and_skip_never_does() {
    let (sched, live) = scheduler(Some(Duration::from_millis(2_500)));
    sched.schedule(every("a", "1s", Overlap::Allow)).unwrap();
    until(&sched, "a", |i| i.history.len() >= 4).await;
    assert!(live.max.load(Ordering::SeqCst) > 1);

    let (sched, live) = scheduler(Some(Duration::from_millis(2_500)));
    sched.schedule(every("s", "1s", Overlap::Skip)).unwrap();
    let info = until(&sched, "s", |i| i.history.len() >= 3).await;
    assert_eq!(live.max.load(Ordering::SeqCst), 1);
    assert!(info.counters.skipped >= 4, "{:?}", info.counters);
    // Each skipped tick lies between two fires, none is fired as well.
    let t = ticks(&info);
    assert!(info.skipped.iter().all(|s| !t.contains(&s.0)));
    assert!(t.windows(2).all(|w| w[1] - w[0] == 3_000), "{t:?}");
}

#[tokio::test(start_paused = true)]
async fn buffer_one_keeps_one_waiting_and_runs_it_next() {
    let (sched, live) = scheduler(Some(Duration::from_millis(2_500)));
    sched
        .schedule(every("b", "1s", Overlap::BufferOne))
        .unwrap();
    let info = until(&sched, "b", |i| i.history.len() >= 4).await;
    assert_eq!(live.max.load(Ordering::SeqCst), 1);
    assert!(info.counters.skipped >= 1);
    let t = ticks(&info);
    // The tick right after the first was buffered, then fired.
    assert_eq!(t[1] - t[0], 1_000, "{t:?}");
    assert!(t.windows(2).all(|w| w[0] < w[1]));
}

#[tokio::test(start_paused = true)]
async fn cancel_previous_cancels_the_running_one_then_starts() {
    let (sched, live) = scheduler(None);
    sched
        .schedule(every("c", "1s", Overlap::CancelPrevious))
        .unwrap();
    let info = until(&sched, "c", |i| {
        i.history.len() >= 3
            && i.history[1..]
                .iter()
                .all(|r| r.outcome == Some(TaskState::Cancelled))
    })
    .await;
    // The newest run is live; every earlier one was cancelled for it.
    assert_eq!(info.history[0].outcome, None);
    let _ = live;
}

#[tokio::test(start_paused = true)]
async fn trigger_runs_now_outside_the_ticks() {
    let (sched, _) = scheduler(Some(Duration::from_millis(10)));
    sched.schedule(every("t", "1h", Overlap::Skip)).unwrap();
    let api: &dyn Api = &sched;
    let fired = api.trigger_schedule("t".into()).await.unwrap();
    assert_eq!(fired.kind, FireKind::Trigger);
    let outcome = sched.wait(fired.task.unwrap()).await.unwrap();
    assert_eq!(outcome.state, TaskState::Succeeded);
    let info = until(&sched, "t", |i| i.history[0].outcome.is_some()).await;
    assert_eq!(info.counters.fires, 1);
    assert_eq!(info.state.last_fired, None);
}

#[tokio::test(start_paused = true)]
async fn backfill_fires_past_ticks_by_the_overlap_policy() {
    let (sched, _) = scheduler(None);
    let info = sched.schedule(every("a", "1m", Overlap::Allow)).unwrap();
    sched.schedule(every("s", "1m", Overlap::Skip)).unwrap();
    let first = info.next_fires[0].0 - 10 * 60_000;
    let range = BackfillRange::new(Millis(first), Millis(first + 4 * 60_000)).unwrap();
    let report = sched.backfill_schedule("a", range).unwrap();
    assert_eq!(report.fired.len(), 5);
    assert!(report
        .fired
        .iter()
        .all(|r| r.kind == FireKind::Backfill && r.task.is_some()));
    let report = sched.backfill_schedule("s", range).unwrap();
    assert_eq!((report.fired.len(), report.skipped.len()), (1, 4));
}

#[tokio::test(start_paused = true)]
async fn a_paused_schedule_fires_nothing_and_resumes_at_the_next_tick() {
    let (sched, _) = scheduler(Some(Duration::from_millis(10)));
    sched.schedule(every("p", "1s", Overlap::Allow)).unwrap();
    let paused = sched.pause_schedule("p", true).unwrap();
    assert!(paused.paused && paused.next_fires.is_empty());
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    assert!(sched.get_schedule("p").unwrap().history.is_empty());
    let resumed = sched.pause_schedule("p", false).unwrap();
    assert!(resumed.counters.missed >= 3, "{:?}", resumed.counters);
    let info = until(&sched, "p", |i| !i.history.is_empty()).await;
    assert!(info.history[0].tick >= resumed.next_fires[0]);
    sched.delete_schedule("p").unwrap();
    assert!(sched.list_schedules().is_empty());
}

#[tokio::test(start_paused = true)]
async fn bad_requests_answer_their_code_and_change_nothing() {
    let (sched, _) = scheduler(Some(Duration::from_millis(10)));
    sched.schedule(every("a", "1m", Overlap::Allow)).unwrap();
    let api: &dyn Api = &sched;
    let before = serde_json::to_string(&sched.list_schedules()).unwrap();
    let spec = |json: serde_json::Value| serde_json::from_value::<ScheduleSpec>(json).unwrap();
    let cases = [
        (
            spec(serde_json::json!({"name": "a", "every": "5m"})),
            ErrorCode::ALREADY_EXISTS,
        ),
        (
            spec(serde_json::json!({"name": "b", "cron": "61 * * * *"})),
            ErrorCode::INVALID_ARGUMENT,
        ),
        (
            spec(serde_json::json!({"name": "b", "cron": "@daily", "tz": "Mars/Base"})),
            ErrorCode::INVALID_ARGUMENT,
        ),
        (
            spec(serde_json::json!({"name": "b", "every": "0s"})),
            ErrorCode::INVALID_ARGUMENT,
        ),
        (
            spec(serde_json::json!({"name": "b", "every": "500ms"})),
            ErrorCode::INVALID_ARGUMENT,
        ),
        (
            spec(serde_json::json!({"name": "b", "cron": "0 0 30 2 *"})),
            ErrorCode::INVALID_ARGUMENT,
        ),
    ];
    for (s, code) in cases {
        let e = api.create_schedule(s.clone()).await.unwrap_err();
        assert_eq!(e.code, code, "{s:?}: {}", e.message);
        assert_eq!(
            serde_json::to_string(&sched.list_schedules()).unwrap(),
            before
        );
    }
    for e in [
        api.get_schedule("zz".into()).await.unwrap_err(),
        api.pause_schedule("zz".into()).await.unwrap_err(),
        api.resume_schedule("zz".into()).await.unwrap_err(),
        api.delete_schedule("zz".into()).await.unwrap_err(),
        api.trigger_schedule("zz".into()).await.unwrap_err(),
    ] {
        assert_eq!(e.code, ErrorCode::NOT_FOUND, "{}", e.message);
    }
    // The limit on schedules.
    let small = Scheduler::builder().max_schedules(1).build().unwrap();
    small.schedule(every("one", "1m", Overlap::Allow)).unwrap();
    let e = small
        .schedule(every("two", "1m", Overlap::Allow))
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::RESOURCE_EXHAUSTED);
    assert_eq!(small.list_schedules().len(), 1);
    let future = BackfillRange::new(Millis(0), Millis(u64::MAX / 2)).unwrap();
    let e = api.backfill_schedule("a".into(), future).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::INVALID_ARGUMENT);
    assert_eq!(
        serde_json::to_string(&sched.list_schedules()).unwrap(),
        before
    );
}
