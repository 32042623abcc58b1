//! Integration tests of the embedded `Scheduler` through its public API:
//! label placement, retries, panics, attempt timeouts, cancel, capacity
//! changes, fixed starts, input validation, idempotency keys, task status
//! and the snapshot. Time-dependent tests run under paused tokio time.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use cronoq::core::{Demand, ErrorCode, GroupSnapshot, PoolSnapshot, Snapshot, WaitReason};
use cronoq::embedded::Error;
use cronoq::{
    Labels, Outcome, PoolConfig, Scheduler, Task, TaskContext, TaskError, TaskHandle, TaskId,
    TaskState,
};
use tokio::sync::Semaphore;
use tokio::time::Instant;

const POOL: &str = "inference";

// ---- harness ---------------------------------------------------------------

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs.iter().copied().collect()
}

fn gpu(value: &str) -> Labels {
    labels(&[("gpu", value)])
}

/// Named gates an executor waits at; opening one before anyone waits is
/// remembered.
#[derive(Clone, Default)]
struct Gates(Arc<Mutex<HashMap<String, Arc<Semaphore>>>>);

impl Gates {
    fn gate(&self, name: &str) -> Arc<Semaphore> {
        self.0
            .lock()
            .unwrap()
            .entry(name.to_string())
            .or_insert_with(|| Arc::new(Semaphore::new(0)))
            .clone()
    }

    fn open(&self, name: &str) {
        self.gate(name).add_permits(1);
    }

    async fn pass(&self, name: &str) {
        self.gate(name).acquire().await.unwrap().forget();
    }
}

/// Every attempt an executor saw, in start order, with its payload text and
/// the tokio instant it started.
#[derive(Clone, Default)]
struct Starts(Arc<Mutex<Vec<(String, TaskContext, Instant)>>>);

impl Starts {
    fn record(&self, payload: &Bytes, ctx: &TaskContext) {
        self.0.lock().unwrap().push((
            String::from_utf8_lossy(payload).into_owned(),
            ctx.clone(),
            Instant::now(),
        ));
    }

    fn count(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    fn names(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .map(|(n, _, _)| n.clone())
            .collect()
    }

    fn started(&self, name: &str) -> bool {
        self.names().iter().any(|n| n == name)
    }

    /// The context of the latest attempt of `name`.
    fn ctx(&self, name: &str) -> TaskContext {
        self.0
            .lock()
            .unwrap()
            .iter()
            .rev()
            .find(|(n, _, _)| n == name)
            .map(|(_, c, _)| c.clone())
            .unwrap_or_else(|| panic!("{name} never started"))
    }

    fn at(&self, name: &str) -> Instant {
        self.0
            .lock()
            .unwrap()
            .iter()
            .find(|(n, _, _)| n == name)
            .map(|(_, _, at)| *at)
            .unwrap_or_else(|| panic!("{name} never started"))
    }
}

/// Installs an executor on `pool` whose attempts wait at the gate named by
/// their payload, then return their group's labels as text.
fn gated(sched: &Scheduler, pool: &str) -> (Gates, Starts) {
    let (gates, starts) = (Gates::default(), Starts::default());
    let (g, s) = (gates.clone(), starts.clone());
    sched
        .executor(pool, move |ctx: TaskContext, payload: Bytes| {
            s.record(&payload, &ctx);
            let g = g.clone();
            async move {
                g.pass(&String::from_utf8_lossy(&payload)).await;
                Ok(Bytes::from(ctx.group.to_string()))
            }
        })
        .unwrap();
    (gates, starts)
}

/// Sets a flag when dropped: shows that an aborted executor future is gone.
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

async fn submit(sched: &Scheduler, task: Task) -> TaskHandle {
    sched.submit(task).await.expect("submit accepted")
}

/// Waits for the outcome; fails (rather than hangs) after an hour of
/// virtual time.
async fn finish(handle: TaskHandle) -> Outcome {
    tokio::time::timeout(Duration::from_secs(3600), handle.wait())
        .await
        .expect("task finished within an hour")
        .expect("outcome delivered")
}

/// Lets spawned tasks run until `cond` holds, without moving the clock.
async fn settle(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..10_000 {
        if cond() {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("never happened (clock frozen): {what}");
}

/// Polls `cond` every 10 ms of (paused) time for at most an hour.
async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..360_000 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("never happened within an hour: {what}");
}

/// The error of a refused submit (`TaskHandle` is not `Debug`, so no
/// `unwrap_err`).
fn refused(result: Result<TaskHandle, Error>) -> Error {
    match result {
        Ok(h) => panic!("task {} was accepted", h.id()),
        Err(e) => e,
    }
}

fn pool_of<'a>(snap: &'a Snapshot, pool: &str) -> &'a PoolSnapshot {
    snap.pools
        .iter()
        .find(|p| p.name.as_str() == pool)
        .unwrap_or_else(|| panic!("no pool {pool} in {snap:?}"))
}

fn group_of<'a>(snap: &'a Snapshot, pool: &str, labels: &Labels) -> &'a GroupSnapshot {
    pool_of(snap, pool)
        .groups
        .iter()
        .find(|g| &g.labels == labels)
        .unwrap_or_else(|| panic!("no group {{{labels}}} in {snap:?}"))
}

fn busy(sched: &Scheduler) -> u64 {
    pool_of(&sched.snapshot(), POOL).busy
}

fn state(sched: &Scheduler, id: TaskId) -> TaskState {
    sched.task(id).expect("task known").state
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

/// A scheduler with `slots` unlabeled slots in [`POOL`] and a gated executor.
fn gated_scheduler(slots: u32) -> (Scheduler, Gates, Starts) {
    let sched = Scheduler::new();
    sched.set_capacity(POOL, slots).unwrap();
    let (gates, starts) = gated(&sched, POOL);
    (sched, gates, starts)
}

// ---- placement ---------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn unlabeled_task_prefers_unlabeled_group_then_takes_any_free_slot() {
    let sched = Scheduler::new();
    sched.set_group_capacity(POOL, gpu("a100"), 1).unwrap();
    sched.set_capacity(POOL, 1).unwrap();
    let (gates, starts) = gated(&sched, POOL);

    let first = submit(&sched, Task::new("first").pool(POOL)).await;
    settle("first starts", || starts.started("first")).await;
    assert_eq!(starts.ctx("first").group, Labels::new());
    assert_eq!(starts.ctx("first").pool.as_str(), POOL);
    assert_eq!(starts.ctx("first").attempt, 1);
    let snap = sched.snapshot();
    assert_eq!(group_of(&snap, POOL, &Labels::new()).busy, 1);
    assert_eq!(group_of(&snap, POOL, &gpu("a100")).busy, 0);

    // The unlabeled group is full: an unlabeled task takes the GPU slot
    // rather than wait.
    let second = submit(&sched, Task::new("second").pool(POOL)).await;
    settle("second starts", || starts.started("second")).await;
    assert_eq!(starts.ctx("second").group, gpu("a100"));

    gates.open("first");
    gates.open("second");
    let (a, b) = (finish(first).await, finish(second).await);
    assert!(a.is_success() && b.is_success());
    assert_eq!(a.group(), Some(&Labels::new()));
    assert_eq!(a.output.as_deref(), Some(&b""[..]));
    assert_eq!(b.group(), Some(&gpu("a100")));
    assert_eq!(b.output.as_deref(), Some(&b"gpu=a100"[..]));
}

#[tokio::test(start_paused = true)]
async fn labeled_task_runs_only_in_a_matching_group() {
    let sched = Scheduler::new();
    sched.set_capacity(POOL, 2).unwrap();
    sched.set_group_capacity(POOL, gpu("h100"), 1).unwrap();
    let eu_a100 = labels(&[("gpu", "a100"), ("zone", "eu")]);
    sched.set_group_capacity(POOL, eu_a100.clone(), 1).unwrap();
    let (gates, starts) = gated(&sched, POOL);

    // A group carrying more labels than required matches.
    let a = submit(&sched, Task::new("a").pool(POOL).label("gpu", "a100")).await;
    settle("a starts", || starts.started("a")).await;
    assert_eq!(starts.ctx("a").group, eu_a100);

    // Its only matching group is busy: b waits although the unlabeled and
    // the h100 groups have free slots.
    let b = submit(&sched, Task::new("b").pool(POOL).label("gpu", "a100")).await;
    let c = submit(&sched, Task::new("c").pool(POOL).label_text("gpu=h100")).await;
    settle("c starts", || starts.started("c")).await;
    assert_eq!(starts.ctx("c").group, gpu("h100"));
    assert!(!starts.started("b"));
    let status = sched.task(b.id()).unwrap();
    assert_eq!(status.state, TaskState::Queued);
    assert_eq!(status.reason, Some(WaitReason::GroupsFull));
    let snap = sched.snapshot();
    assert_eq!(group_of(&snap, POOL, &Labels::new()).busy, 0);
    assert_eq!(
        pool_of(&snap, POOL).demand,
        vec![Demand {
            labels: gpu("a100"),
            waiting: 1,
            reason: Some(WaitReason::GroupsFull),
        }]
    );

    gates.open("a");
    settle("b starts", || starts.started("b")).await;
    assert_eq!(starts.ctx("b").group, eu_a100);
    gates.open("b");
    gates.open("c");
    assert_eq!(finish(a).await.group(), Some(&eu_a100));
    assert_eq!(finish(b).await.group(), Some(&eu_a100));
    assert_eq!(finish(c).await.group(), Some(&gpu("h100")));
}

#[tokio::test(start_paused = true)]
async fn task_for_labels_nobody_has_waits_until_a_matching_group_appears() {
    let (sched, gates, starts) = gated_scheduler(1);
    let tpu = labels(&[("tpu", "v5")]);

    let h = submit(&sched, Task::new("t").pool(POOL).labels(&tpu)).await;
    let status = sched.task(h.id()).unwrap();
    assert_eq!(status.state, TaskState::Queued);
    assert_eq!(status.reason, Some(WaitReason::NoGroupMatches));
    assert!(status.attempts.is_empty());
    let snap = sched.snapshot();
    let pool = pool_of(&snap, POOL);
    assert_eq!(pool.waiting, 1);
    assert_eq!(pool.busy, 0);
    assert_eq!(
        pool.demand,
        vec![Demand {
            labels: tpu.clone(),
            waiting: 1,
            reason: Some(WaitReason::NoGroupMatches),
        }]
    );
    assert_eq!(pool.autoscale.desired, 1);

    // Never dropped, however long it waits.
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert_eq!(state(&sched, h.id()), TaskState::Queued);
    assert_eq!(starts.count(), 0);

    sched.set_group_capacity(POOL, tpu.clone(), 1).unwrap();
    settle("t starts", || starts.started("t")).await;
    assert_eq!(starts.ctx("t").group, tpu);
    assert!(pool_of(&sched.snapshot(), POOL).demand.is_empty());
    gates.open("t");
    let out = finish(h).await;
    assert!(out.is_success());
    assert_eq!(out.group(), Some(&tpu));
}

#[tokio::test(start_paused = true)]
async fn freed_labeled_slot_goes_to_labeled_waiter_before_unlabeled_one() {
    let sched = Scheduler::new();
    sched.set_group_capacity(POOL, gpu("a100"), 1).unwrap();
    let (gates, starts) = gated(&sched, POOL);

    let x = submit(&sched, Task::new("x").pool(POOL).label("gpu", "a100")).await;
    settle("x starts", || starts.started("x")).await;
    let cpu = submit(&sched, Task::new("cpu").pool(POOL)).await;
    let need = submit(&sched, Task::new("need").pool(POOL).label("gpu", "a100")).await;

    gates.open("x");
    settle("need starts", || starts.started("need")).await;
    assert!(!starts.started("cpu"), "rule 5(b): need before order");
    gates.open("need");
    gates.open("cpu");
    for h in [x, need, cpu] {
        assert!(finish(h).await.is_success());
    }
    assert_eq!(starts.names(), ["x", "need", "cpu"]);
}

#[tokio::test(start_paused = true)]
async fn waiters_run_by_priority_then_submission_order() {
    let (sched, gates, starts) = gated_scheduler(1);
    let mut handles = vec![submit(&sched, Task::new("first").pool(POOL)).await];
    settle("first starts", || starts.started("first")).await;
    for (name, priority) in [("low", 0), ("high", 5), ("mid", 1), ("low2", 0)] {
        let task = Task::new(name).pool(POOL).priority(priority);
        handles.push(submit(&sched, task).await);
        gates.open(name);
    }
    gates.open("first");
    for h in handles {
        assert!(finish(h).await.is_success());
    }
    assert_eq!(starts.names(), ["first", "high", "mid", "low", "low2"]);
}

#[tokio::test(start_paused = true)]
async fn deadline_never_cancels_but_a_late_finish_is_counted() {
    let sched = Scheduler::new();
    sched.set_capacity(POOL, 1).unwrap();
    sched
        .executor(POOL, |_ctx: TaskContext, p: Bytes| async move { Ok(p) })
        .unwrap();
    let late = Task::new("late")
        .pool(POOL)
        .deadline(SystemTime::now() - Duration::from_secs(1));
    let out = finish(submit(&sched, late).await).await;
    assert_eq!(out.state, TaskState::Succeeded);
    assert!(out.deadline_missed);
    assert!(sched.task(out.id).unwrap().deadline_missed);
    let on_time = Task::new("on time")
        .pool(POOL)
        .deadline(SystemTime::now() + Duration::from_secs(3600));
    let out = finish(submit(&sched, on_time).await).await;
    assert!(!out.deadline_missed);
    assert_eq!(pool_of(&sched.snapshot(), POOL).deadline_missed, 1);
}

// ---- attempts: errors, panics, timeouts ---------------------------------------

#[tokio::test(start_paused = true)]
async fn executor_error_is_retried_with_backoff_until_max_attempts() {
    let sched = Scheduler::new();
    sched.set_capacity(POOL, 1).unwrap();
    let starts = Starts::default();
    let s = starts.clone();
    sched
        .executor(POOL, move |ctx: TaskContext, payload: Bytes| {
            s.record(&payload, &ctx);
            async move {
                if ctx.attempt == 1 {
                    // Any std error converts into a retryable TaskError.
                    Err(std::io::Error::other("disk full"))?;
                }
                Err(TaskError::retryable(format!("boom {}", ctx.attempt)))
            }
        })
        .unwrap();

    let t0 = Instant::now();
    let task = Task::new("t")
        .pool(POOL)
        .max_attempts(4)
        .backoff(Duration::from_secs(1), Duration::from_secs(3));
    let out = finish(submit(&sched, task).await).await;
    assert_eq!(out.state, TaskState::Failed);
    assert!(!out.is_success());
    assert_eq!(out.attempts.len(), 4);
    assert_eq!(out.error.as_deref(), Some("boom 4"));
    assert_eq!(out.output, None);
    for (i, a) in out.attempts.iter().enumerate() {
        assert_eq!(a.attempt, i as u32 + 1);
        assert_eq!(a.outcome.as_deref(), Some("failed"));
        assert!(a.ended_at.is_some());
    }
    assert_eq!(out.attempts[0].error.as_deref(), Some("disk full"));
    // Backoff 1 s, 2 s, then capped at 3 s.
    let gaps: Vec<u64> = out
        .attempts
        .windows(2)
        .map(|w| w[1].started_at.0 - w[0].ended_at.unwrap().0)
        .collect();
    for (gap, want) in gaps.iter().zip([1000, 2000, 3000]) {
        assert!(
            (want..want + 20).contains(gap),
            "gaps {gaps:?}, want ~{want}"
        );
    }
    let elapsed = Instant::now() - t0;
    assert!(elapsed >= Duration::from_secs(6), "{elapsed:?}");
    assert_eq!(starts.count(), 4);
    assert_eq!(busy(&sched), 0);
}

#[tokio::test(start_paused = true)]
async fn permanent_error_fails_at_once() {
    let sched = Scheduler::new();
    sched.set_capacity(POOL, 1).unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    sched
        .executor(POOL, move |_ctx: TaskContext, _payload: Bytes| {
            c.fetch_add(1, Ordering::SeqCst);
            async move { Err(TaskError::permanent("bad payload")) }
        })
        .unwrap();
    let out = finish(submit(&sched, Task::new("t").pool(POOL).max_attempts(5)).await).await;
    assert_eq!(out.state, TaskState::Failed);
    assert_eq!(out.attempts.len(), 1);
    assert_eq!(out.error.as_deref(), Some("bad payload"));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn panicking_executor_is_a_failed_attempt_and_the_scheduler_keeps_working() {
    let sched = Scheduler::new();
    sched.set_capacity(POOL, 1).unwrap();
    sched
        .executor(POOL, |ctx: TaskContext, payload: Bytes| async move {
            if payload == "panic" && ctx.attempt == 1 {
                panic!("kaboom");
            }
            Ok(Bytes::from(format!("ok on attempt {}", ctx.attempt)))
        })
        .unwrap();

    let task = Task::new("panic")
        .pool(POOL)
        .backoff(Duration::from_millis(100), Duration::from_secs(1));
    let out = finish(submit(&sched, task).await).await;
    assert!(out.is_success(), "{out:?}");
    assert_eq!(out.attempts.len(), 2);
    assert_eq!(out.attempts[0].outcome.as_deref(), Some("failed"));
    let err = out.attempts[0].error.as_deref().unwrap();
    assert!(err.contains("kaboom"), "{err}");
    assert_eq!(out.output.as_deref(), Some(&b"ok on attempt 2"[..]));

    // The slot came back and the next task runs normally.
    assert_eq!(busy(&sched), 0);
    let out = finish(submit(&sched, Task::new("next").pool(POOL)).await).await;
    assert!(out.is_success());
    assert_eq!(out.attempts.len(), 1);
}

/// A panic in the executor call itself (before it returns a future) is a
/// failed attempt too, and the queued tasks behind it still run: one tokio
/// task runs attempt after attempt on a busy slot, and must survive it.
#[tokio::test(start_paused = true)]
async fn executor_panicking_before_its_future_is_a_failed_attempt() {
    let sched = Scheduler::new();
    sched.set_capacity(POOL, 1).unwrap();
    sched
        .executor(POOL, |ctx: TaskContext, payload: Bytes| {
            if payload == "panic" && ctx.attempt == 1 {
                panic!("kaboom before the future");
            }
            async move { Ok(payload) }
        })
        .unwrap();
    let first = submit(&sched, Task::new("a").pool(POOL)).await;
    let panics = submit(
        &sched,
        Task::new("panic")
            .pool(POOL)
            .backoff(Duration::from_millis(100), Duration::from_secs(1)),
    )
    .await;
    let last = submit(&sched, Task::new("b").pool(POOL)).await;
    assert!(finish(first).await.is_success());
    let out = finish(panics).await;
    assert!(out.is_success(), "{out:?}");
    assert_eq!(out.attempts[0].outcome.as_deref(), Some("failed"));
    assert!(out.attempts[0]
        .error
        .as_deref()
        .unwrap()
        .contains("kaboom before the future"));
    assert!(finish(last).await.is_success());
    assert_eq!(busy(&sched), 0);
}

/// Instant attempts run back to back in one tokio task; it yields to the
/// runtime now and then, so on a single-threaded runtime another task still
/// gets to run while thousands of them go through.
#[tokio::test(flavor = "current_thread")]
async fn a_long_run_of_instant_attempts_does_not_starve_other_tasks() {
    let sched = Scheduler::new();
    sched.set_capacity(POOL, 0).unwrap();
    let ran = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let r = ran.clone();
    sched
        .executor(POOL, move |_ctx: TaskContext, _payload: Bytes| {
            r.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async { Ok(Bytes::new()) }
        })
        .unwrap();
    // Queued behind a pool with no slot, then one slot opens: one tokio
    // task runs them all, attempt after attempt.
    let mut handles = Vec::new();
    for _ in 0..5_000 {
        handles.push(sched.submit(Task::new("x").pool(POOL)).await.unwrap());
    }
    sched.set_capacity(POOL, 1).unwrap();
    let seen_at = tokio::spawn({
        let ran = ran.clone();
        async move { ran.load(std::sync::atomic::Ordering::SeqCst) }
    });
    let before_done = seen_at.await.unwrap();
    for h in handles {
        assert!(h.wait().await.unwrap().is_success());
    }
    assert!(
        before_done < 5_000,
        "the other task ran only after {before_done} attempts"
    );
}

/// An attempt that finishes at its first poll is done when `submit`
/// returns; one that awaits something goes on in its own tokio task, and
/// is woken by what it awaits (not by the first poll's stand-in waker).
#[tokio::test(flavor = "current_thread")]
async fn a_submission_polls_its_attempt_once_and_pending_ones_go_on_elsewhere() {
    let sched = Scheduler::new();
    sched.set_capacity(POOL, 2).unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let gate = Arc::new(std::sync::Mutex::new(Some(rx)));
    sched
        .executor(POOL, move |_ctx: TaskContext, payload: Bytes| {
            let gate = gate.clone();
            async move {
                if payload == "wait" {
                    let rx = gate.lock().unwrap().take().unwrap();
                    rx.await.unwrap();
                }
                Ok(payload)
            }
        })
        .unwrap();
    let instant = sched.submit(Task::new("now").pool(POOL)).await.unwrap();
    let st = sched.task(instant.id()).unwrap();
    assert_eq!(st.state, cronoq::core::TaskState::Succeeded, "{st:?}");
    let waiting = sched.submit(Task::new("wait").pool(POOL)).await.unwrap();
    assert_eq!(busy(&sched), 1);
    tx.send(()).unwrap();
    let out = waiting.wait().await.unwrap();
    assert_eq!(out.output.as_deref(), Some(&b"wait"[..]));
    assert_eq!(busy(&sched), 0);
}

/// With `eager_start(false)` no executor code runs inside `submit`: the
/// attempt is still running when `submit` returns (on a single-threaded
/// runtime nothing else ran yet), and finishes in its own tokio task.
#[tokio::test(flavor = "current_thread")]
async fn without_eager_start_submit_runs_no_executor_code() {
    let sched = Scheduler::builder().eager_start(false).build().unwrap();
    sched.set_capacity(POOL, 1).unwrap();
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let c = calls.clone();
    sched
        .executor(POOL, move |_ctx: TaskContext, payload: Bytes| {
            c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async move { Ok(payload) }
        })
        .unwrap();
    let handle = sched.submit(Task::new("x").pool(POOL)).await.unwrap();
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 0);
    assert_eq!(busy(&sched), 1);
    assert!(handle.wait().await.unwrap().is_success());
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(busy(&sched), 0);
}

/// With eager start, `submit` polls the task's first attempt itself and,
/// when that finishes the task, hands the outcome over with no slot. What
/// else can reach the task meanwhile still lands on every waiter: a cancel
/// of the task from inside that first poll (the outcome goes to the
/// submitting call, with nothing retained to fall back on), whether the
/// attempt then returns or stays pending; and a keyed resubmission and a
/// wait by id made from inside it.
#[tokio::test]
async fn what_reaches_a_task_during_its_eager_first_poll_reaches_every_waiter() {
    let sched = Scheduler::builder().retain_finished(0).build().unwrap();
    sched.set_capacity(POOL, 2).unwrap();
    let inside: Arc<Mutex<Vec<TaskHandle>>> = Arc::default();
    let waits = Arc::new(Mutex::new(Vec::new()));
    let (s, seen, w) = (sched.clone(), inside.clone(), waits.clone());
    sched
        .executor(POOL, move |ctx: TaskContext, payload: Bytes| {
            let (s, seen, w) = (s.clone(), seen.clone(), w.clone());
            async move {
                match &payload[..] {
                    b"cancel-then-return" => s.cancel(ctx.task_id).unwrap(),
                    b"cancel-then-hang" => {
                        s.cancel(ctx.task_id).unwrap();
                        std::future::pending::<()>().await;
                    }
                    b"keyed" => {
                        let again = Task::new("again").pool(POOL).idempotency_key("k");
                        seen.lock().unwrap().push(s.submit_now(again).unwrap());
                        // Polled once here, so it waits from inside.
                        let by_id = s.clone();
                        let mut wait = Box::pin(async move { by_id.wait(ctx.task_id).await });
                        std::future::poll_fn(|cx| {
                            assert!(wait.as_mut().poll(cx).is_pending());
                            std::task::Poll::Ready(())
                        })
                        .await;
                        w.lock().unwrap().push(wait);
                    }
                    _ => {}
                }
                Ok(payload)
            }
        })
        .unwrap();

    for what in ["cancel-then-return", "cancel-then-hang"] {
        let handle = sched.submit(Task::new(what).pool(POOL)).await.unwrap();
        let out = handle.wait().await.unwrap();
        assert_eq!(out.state, TaskState::Cancelled, "{what}");
    }
    let first = sched
        .submit(Task::new("keyed").pool(POOL).idempotency_key("k"))
        .await
        .unwrap();
    let again = inside.lock().unwrap().pop().expect("resubmitted inside");
    assert_eq!(again.id(), first.id());
    let by_id = waits.lock().unwrap().pop().expect("waited inside");
    for out in [
        first.wait().await.unwrap(),
        again.wait().await.unwrap(),
        by_id.await.unwrap(),
    ] {
        assert_eq!(out.state, TaskState::Succeeded);
        assert_eq!(out.output.as_deref(), Some(&b"keyed"[..]));
    }
    assert_eq!(busy(&sched), 0);
}

#[tokio::test(start_paused = true)]
async fn attempt_timeout_counts_as_lost_and_is_retried() {
    let sched = Scheduler::new();
    sched.set_capacity(POOL, 1).unwrap();
    let dropped = Arc::new(AtomicBool::new(false));
    let d = dropped.clone();
    sched
        .executor(POOL, move |ctx: TaskContext, _payload: Bytes| {
            let guard = SetOnDrop(d.clone());
            async move {
                if ctx.attempt == 1 {
                    let _guard = guard;
                    std::future::pending::<()>().await;
                }
                Ok(Bytes::from("done"))
            }
        })
        .unwrap();

    let task = Task::new("t")
        .pool(POOL)
        .attempt_timeout(Duration::from_secs(5))
        .backoff(Duration::from_secs(1), Duration::from_secs(1));
    let out = finish(submit(&sched, task).await).await;
    assert!(out.is_success(), "{out:?}");
    assert_eq!(out.attempts.len(), 2);
    let first = &out.attempts[0];
    assert_eq!(first.outcome.as_deref(), Some("lost"));
    let ran = first.ended_at.unwrap().0 - first.started_at.0;
    assert!((5000..5020).contains(&ran), "ran {ran} ms");
    let gap = out.attempts[1].started_at.0 - first.ended_at.unwrap().0;
    assert!((1000..1020).contains(&gap), "backoff {gap} ms");
    assert!(dropped.load(Ordering::SeqCst), "timed-out attempt aborted");
    assert_eq!(busy(&sched), 0);
}

#[tokio::test(start_paused = true)]
async fn attempt_timeout_on_every_attempt_fails_the_task() {
    let sched = Scheduler::new();
    sched.set_capacity(POOL, 1).unwrap();
    sched
        .executor(POOL, |_ctx: TaskContext, _payload: Bytes| async move {
            std::future::pending::<Result<Bytes, TaskError>>().await
        })
        .unwrap();
    let task = Task::new("t")
        .pool(POOL)
        .max_attempts(2)
        .attempt_timeout(Duration::from_secs(1))
        .backoff(Duration::from_millis(10), Duration::from_millis(10));
    let out = finish(submit(&sched, task).await).await;
    assert_eq!(out.state, TaskState::Failed);
    assert_eq!(out.attempts.len(), 2);
    assert!(out
        .attempts
        .iter()
        .all(|a| a.outcome.as_deref() == Some("lost")));
    assert_eq!(busy(&sched), 0);
}

#[tokio::test(start_paused = true)]
async fn each_attempt_is_placed_afresh() {
    let sched = Scheduler::new();
    sched.set_capacity(POOL, 1).unwrap();
    sched.set_group_capacity(POOL, gpu("a100"), 1).unwrap();
    let gates = Gates::default();
    let starts = Starts::default();
    let (g, s) = (gates.clone(), starts.clone());
    sched
        .executor(POOL, move |ctx: TaskContext, payload: Bytes| {
            s.record(&payload, &ctx);
            let g = g.clone();
            async move {
                if payload == "flaky" && ctx.attempt == 1 {
                    return Err(TaskError::retryable("first try fails"));
                }
                g.pass(&String::from_utf8_lossy(&payload)).await;
                Ok(Bytes::from(ctx.group.to_string()))
            }
        })
        .unwrap();

    let flaky = Task::new("flaky")
        .pool(POOL)
        .backoff(Duration::from_secs(10), Duration::from_secs(10));
    let h = submit(&sched, flaky).await;
    settle("flaky attempt 1 failed", || {
        sched.task(h.id()).unwrap().reason == Some(WaitReason::Backoff)
    })
    .await;
    assert_eq!(starts.ctx("flaky").group, Labels::new());
    // While it backs off, another task takes the unlabeled slot.
    let hog = submit(&sched, Task::new("hog").pool(POOL)).await;
    settle("hog starts", || starts.started("hog")).await;
    assert_eq!(starts.ctx("hog").group, Labels::new());

    gates.open("flaky");
    let out = finish(h).await;
    assert!(out.is_success());
    assert_eq!(out.attempts[0].group, Labels::new());
    assert_eq!(out.attempts[1].group, gpu("a100"));
    gates.open("hog");
    assert!(finish(hog).await.is_success());
}

// ---- cancel ------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn cancel_of_a_waiting_task_ends_it_at_once() {
    let (sched, gates, starts) = gated_scheduler(1);
    let a = submit(&sched, Task::new("a").pool(POOL)).await;
    let b = submit(&sched, Task::new("b").pool(POOL)).await;
    let b_id = b.id();
    assert_eq!(state(&sched, b_id), TaskState::Queued);

    sched.cancel(b_id).unwrap();
    let out = finish(b).await;
    assert_eq!(out.state, TaskState::Cancelled);
    assert!(out.attempts.is_empty());
    assert_eq!(state(&sched, b_id), TaskState::Cancelled);
    let snap = sched.snapshot();
    assert_eq!(pool_of(&snap, POOL).waiting, 0);
    assert!(pool_of(&snap, POOL).demand.is_empty());

    // Cancelling again, or an unknown task, is refused.
    let again = sched.cancel(b_id).unwrap_err();
    assert_eq!(again.code(), ErrorCode::FAILED_PRECONDITION);
    let unknown = sched.cancel(TaskId(999_999)).unwrap_err();
    assert_eq!(unknown.code(), ErrorCode::NOT_FOUND);

    gates.open("a");
    assert!(finish(a).await.is_success());
    assert!(!starts.started("b"));
}

#[tokio::test(start_paused = true)]
async fn cancel_of_a_running_task_aborts_it_and_frees_the_slot() {
    let sched = Scheduler::new();
    sched.set_capacity(POOL, 1).unwrap();
    let dropped = Arc::new(AtomicBool::new(false));
    let reached_end = Arc::new(AtomicBool::new(false));
    let starts = Starts::default();
    let (d, e, s) = (dropped.clone(), reached_end.clone(), starts.clone());
    sched
        .executor(POOL, move |ctx: TaskContext, payload: Bytes| {
            s.record(&payload, &ctx);
            let guard = SetOnDrop(d.clone());
            let e = e.clone();
            async move {
                if payload == "forever" {
                    let _guard = guard;
                    tokio::time::sleep(Duration::from_secs(3600 * 24)).await;
                    e.store(true, Ordering::SeqCst);
                }
                Ok(payload)
            }
        })
        .unwrap();

    let running = submit(&sched, Task::new("forever").pool(POOL)).await;
    let next = submit(&sched, Task::new("next").pool(POOL)).await;
    let id = running.id();
    settle("forever starts", || starts.started("forever")).await;
    assert_eq!(state(&sched, id), TaskState::Running);
    assert_eq!(state(&sched, next.id()), TaskState::Queued);

    sched.cancel(id).unwrap();
    let out = finish(running).await;
    assert_eq!(out.state, TaskState::Cancelled);
    assert_eq!(out.attempts.len(), 1);
    assert_eq!(out.attempts[0].outcome.as_deref(), Some("cancelled"));
    assert!(out.attempts[0].ended_at.is_some());
    settle("executor aborted", || dropped.load(Ordering::SeqCst)).await;
    assert!(!reached_end.load(Ordering::SeqCst));
    assert_eq!(
        sched.cancel(id).unwrap_err().code(),
        ErrorCode::FAILED_PRECONDITION
    );

    // The slot came back: the queued task runs, and afterwards busy is 0.
    let out = finish(next).await;
    assert!(out.is_success());
    assert_eq!(out.output.as_deref(), Some(&b"next"[..]));
    assert_eq!(busy(&sched), 0);
    let out = finish(submit(&sched, Task::new("after").pool(POOL)).await).await;
    assert!(out.is_success());
}

#[tokio::test(start_paused = true)]
async fn cancel_of_a_running_task_with_nothing_waiting_returns_busy_to_zero() {
    let (sched, gates, starts) = gated_scheduler(1);
    let h = submit(&sched, Task::new("held").pool(POOL)).await;
    settle("held starts", || starts.started("held")).await;
    assert_eq!(busy(&sched), 1);
    sched.cancel(h.id()).unwrap();
    assert_eq!(finish(h).await.state, TaskState::Cancelled);
    settle("slot freed", || busy(&sched) == 0).await;
    let snap = sched.snapshot();
    assert_eq!(group_of(&snap, POOL, &Labels::new()).busy, 0);

    let h = submit(&sched, Task::new("n").pool(POOL)).await;
    gates.open("n");
    assert!(finish(h).await.is_success());
}

#[tokio::test(start_paused = true)]
async fn cancel_of_a_task_in_backoff_or_before_its_fixed_start() {
    let sched = Scheduler::new();
    sched.set_capacity(POOL, 1).unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    sched
        .executor(POOL, move |_ctx: TaskContext, _payload: Bytes| {
            c.fetch_add(1, Ordering::SeqCst);
            async move { Err(TaskError::retryable("nope")) }
        })
        .unwrap();

    let retrying = submit(
        &sched,
        Task::new("r")
            .pool(POOL)
            .backoff(Duration::from_secs(10), Duration::from_secs(10)),
    )
    .await;
    let id = retrying.id();
    settle("first attempt failed", || {
        sched.task(id).unwrap().reason == Some(WaitReason::Backoff)
    })
    .await;
    sched.cancel(id).unwrap();
    let out = finish(retrying).await;
    assert_eq!(out.state, TaskState::Cancelled);
    assert_eq!(out.attempts.len(), 1);
    assert_eq!(out.attempts[0].outcome.as_deref(), Some("failed"));

    let start_at = SystemTime::now() + Duration::from_secs(60);
    let fixed = submit(
        &sched,
        Task::new("f")
            .pool(POOL)
            .start_at(start_at, Duration::from_secs(1)),
    )
    .await;
    assert_eq!(pool_of(&sched.snapshot(), POOL).scheduled, 1);
    sched.cancel(fixed.id()).unwrap();
    assert_eq!(finish(fixed).await.state, TaskState::Cancelled);
    assert_eq!(pool_of(&sched.snapshot(), POOL).scheduled, 0);

    // Nothing runs later: no retry, no fixed start.
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

// ---- capacity ----------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn shrinking_capacity_below_busy_lets_attempts_finish_and_starts_nothing_new() {
    let (sched, gates, starts) = gated_scheduler(3);
    let mut handles = Vec::new();
    for name in ["a", "b", "c", "d"] {
        handles.push(submit(&sched, Task::new(name).pool(POOL)).await);
    }
    settle("three start", || starts.count() == 3).await;
    let d = handles[3].id();
    assert_eq!(state(&sched, d), TaskState::Queued);

    sched.set_capacity(POOL, 1).unwrap();
    let snap = sched.snapshot();
    let g = group_of(&snap, POOL, &Labels::new());
    assert_eq!((g.capacity, g.busy), (1, 3));
    assert_eq!(pool_of(&snap, POOL).capacity, 1);

    gates.open("a");
    settle("a frees its slot", || busy(&sched) == 2).await;
    assert_eq!(state(&sched, d), TaskState::Queued);
    gates.open("b");
    settle("b frees its slot", || busy(&sched) == 1).await;
    assert_eq!(state(&sched, d), TaskState::Queued);
    assert!(!starts.started("d"));

    gates.open("c");
    settle("d starts once busy < capacity", || starts.started("d")).await;
    assert_eq!(busy(&sched), 1);
    gates.open("d");
    for h in handles {
        assert!(finish(h).await.is_success());
    }
    assert_eq!(busy(&sched), 0);
}

#[tokio::test(start_paused = true)]
async fn zero_capacity_group_leaves_the_snapshot() {
    let (sched, _gates, _starts) = gated_scheduler(2);
    sched.set_group_capacity(POOL, gpu("a100"), 1).unwrap();
    assert_eq!(pool_of(&sched.snapshot(), POOL).groups.len(), 2);
    sched.set_group_capacity(POOL, gpu("a100"), 0).unwrap();
    let snap = sched.snapshot();
    let groups: Vec<_> = pool_of(&snap, POOL)
        .groups
        .iter()
        .map(|g| g.labels.clone())
        .collect();
    assert_eq!(groups, vec![Labels::new()]);
}

// ---- fixed starts ------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn fixed_start_task_starts_at_start_at_not_before() {
    let (sched, gates, starts) = gated_scheduler(1);
    let t0 = Instant::now();
    let start_at = SystemTime::now() + Duration::from_secs(60);
    let h = submit(
        &sched,
        Task::new("fixed")
            .pool(POOL)
            .start_at(start_at, Duration::from_secs(5)),
    )
    .await;
    let status = sched.task(h.id()).unwrap();
    assert_eq!(status.state, TaskState::Scheduled);
    assert_eq!(status.reason, Some(WaitReason::Scheduled));
    assert_eq!(pool_of(&sched.snapshot(), POOL).scheduled, 1);

    tokio::time::sleep(Duration::from_secs(59)).await;
    assert!(!starts.started("fixed"), "started before start_at");
    assert_eq!(state(&sched, h.id()), TaskState::Scheduled);

    eventually("fixed starts", || starts.started("fixed")).await;
    let waited = starts.at("fixed") - t0;
    assert!(
        waited >= Duration::from_secs(60) && waited < Duration::from_secs(61),
        "started after {waited:?}"
    );
    gates.open("fixed");
    let out = finish(h).await;
    assert!(out.is_success());
    assert!(out.attempts[0].started_at.0 >= unix_ms(start_at));
    assert_eq!(pool_of(&sched.snapshot(), POOL).scheduled, 0);
}

#[tokio::test(start_paused = true)]
async fn fixed_start_without_a_slot_through_its_tolerance_is_missed() {
    let (sched, _gates, starts) = gated_scheduler(0);
    let t0 = Instant::now();
    let start_at = SystemTime::now() + Duration::from_secs(10);
    let h = submit(
        &sched,
        Task::new("fixed")
            .pool(POOL)
            .start_at(start_at, Duration::from_secs(2)),
    )
    .await;
    let id = h.id();

    tokio::time::sleep(Duration::from_secs(11)).await;
    let status = sched.task(id).unwrap();
    assert_eq!(status.state, TaskState::Queued, "past start_at, waiting");
    assert_eq!(status.reason, Some(WaitReason::NoGroupMatches));

    let out = finish(h).await;
    assert_eq!(out.state, TaskState::Missed);
    assert!(out.attempts.is_empty());
    let waited = Instant::now() - t0;
    assert!(waited >= Duration::from_secs(12), "missed after {waited:?}");
    assert_eq!(starts.count(), 0);
    assert_eq!(state(&sched, id), TaskState::Missed);
    // No capacity and no task left: the pool is idle and forgotten.
    let snap = sched.snapshot();
    assert!(
        snap.pools.iter().all(|p| p.name.as_str() != POOL),
        "{snap:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn fixed_start_in_the_past_beyond_tolerance_is_missed_at_once() {
    let (sched, _gates, starts) = gated_scheduler(1);
    let start_at = SystemTime::now() - Duration::from_secs(10);
    let h = submit(
        &sched,
        Task::new("late")
            .pool(POOL)
            .start_at(start_at, Duration::from_secs(1)),
    )
    .await;
    let out = finish(h).await;
    assert_eq!(out.state, TaskState::Missed);
    assert_eq!(starts.count(), 0);
}

#[tokio::test(start_paused = true)]
async fn due_reservation_holds_a_slot_except_for_backfill() {
    let (sched, gates, starts) = gated_scheduler(1);
    let start_at = SystemTime::now() + Duration::from_secs(60);
    let fixed = submit(
        &sched,
        Task::new("fixed")
            .pool(POOL)
            .start_at(start_at, Duration::from_secs(5)),
    )
    .await;
    // The default reservation lead is 30 s.
    tokio::time::sleep(Duration::from_secs(31)).await;
    let snap = sched.snapshot();
    assert_eq!(pool_of(&snap, POOL).reserved, 1);

    let plain = submit(&sched, Task::new("plain").pool(POOL)).await;
    let status = sched.task(plain.id()).unwrap();
    assert_eq!(status.state, TaskState::Queued);
    assert_eq!(status.reason, Some(WaitReason::HeldForReservation));
    // Ends (by its estimate) before start_at: may use the held slot.
    let short = submit(
        &sched,
        Task::new("short")
            .pool(POOL)
            .est_runtime(Duration::from_secs(10)),
    )
    .await;
    settle("short backfills", || starts.started("short")).await;
    let pool = pool_of(&sched.snapshot(), POOL).clone();
    assert_eq!((pool.busy, pool.waiting, pool.reserved), (1, 1, 1));
    assert_eq!(
        pool.autoscale.desired, 3,
        "busy + waiting + due reservation"
    );
    gates.open("short");
    assert!(finish(short).await.is_success());
    assert_eq!(state(&sched, plain.id()), TaskState::Queued);

    eventually("fixed starts", || starts.started("fixed")).await;
    assert!(!starts.started("plain"));
    gates.open("fixed");
    gates.open("plain");
    assert!(finish(fixed).await.attempts[0].started_at.0 >= unix_ms(start_at));
    assert!(finish(plain).await.is_success());
    assert_eq!(starts.names(), ["short", "fixed", "plain"]);
}

// ---- refused requests --------------------------------------------------------

#[tokio::test]
async fn submit_to_a_pool_without_executor_is_refused_and_changes_nothing() {
    let sched = Scheduler::new();
    sched.set_capacity(POOL, 1).unwrap();
    sched.set_capacity("other", 1).unwrap();
    sched
        .executor("other", |_ctx: TaskContext, p: Bytes| async move { Ok(p) })
        .unwrap();
    let before = sched.snapshot();

    for pool in [POOL, "nowhere"] {
        let err = refused(sched.submit(Task::new("x").pool(pool)).await);
        assert_eq!(err.code(), ErrorCode::FAILED_PRECONDITION, "{err}");
        assert!(matches!(err, Error::NoExecutor(_)), "{err:?}");
        assert_eq!(sched.snapshot(), before);
    }
    // The default pool has no executor either.
    let err = refused(sched.submit(Task::new("x")).await);
    assert_eq!(err.code(), ErrorCode::FAILED_PRECONDITION);
    assert_eq!(sched.snapshot(), before);
    assert!(sched.task(TaskId(1)).is_none());
}

#[tokio::test]
async fn bad_task_input_is_refused_with_invalid_argument_and_changes_nothing() {
    let sched = Scheduler::builder().max_payload_bytes(16).build().unwrap();
    sched.set_capacity(POOL, 1).unwrap();
    sched
        .executor(POOL, |_ctx: TaskContext, p: Bytes| async move { Ok(p) })
        .unwrap();
    let before = sched.snapshot();

    let bad = [
        ("empty pool name", Task::new("x").pool("")),
        ("pool name with a dot", Task::new("x").pool("in.ference")),
        (
            "label without =",
            Task::new("x").pool(POOL).label_text("gpu"),
        ),
        (
            "label without name",
            Task::new("x").pool(POOL).label_text("=x"),
        ),
        (
            "one name, two values",
            Task::new("x")
                .pool(POOL)
                .label("gpu", "a100")
                .label("gpu", "h100"),
        ),
        (
            "empty label value",
            Task::new("x").pool(POOL).label("gpu", ""),
        ),
        (
            "label value with a space",
            Task::new("x").pool(POOL).label("gpu", "a 100"),
        ),
        ("payload of 17 bytes", Task::new("x".repeat(17)).pool(POOL)),
        ("max_attempts 0", Task::new("x").pool(POOL).max_attempts(0)),
        (
            "zero attempt timeout",
            Task::new("x").pool(POOL).attempt_timeout(Duration::ZERO),
        ),
        (
            "backoff initial above max",
            Task::new("x")
                .pool(POOL)
                .backoff(Duration::from_secs(2), Duration::from_secs(1)),
        ),
    ];
    for (what, task) in bad {
        let err = refused(sched.submit(task).await);
        assert_eq!(err.code(), ErrorCode::INVALID_ARGUMENT, "{what}: {err}");
        assert_eq!(sched.snapshot(), before, "{what} changed the snapshot");
    }
    assert!(sched.task(TaskId(1)).is_none());

    // The limits are inclusive: 16 bytes and one attempt are fine.
    let out = sched
        .submit(
            Task::new("x".repeat(16))
                .pool(POOL)
                .max_attempts(1)
                .idempotency_key("k"),
        )
        .await
        .unwrap()
        .wait()
        .await
        .unwrap();
    assert!(out.is_success());
    // A keyed resubmission is checked too, though it never reaches the core
    // (its key finds the task).
    let again = Task::new("x")
        .pool(POOL)
        .idempotency_key("k")
        .labels(&labels(&[("gpu", "")]));
    let err = refused(sched.submit(again).await);
    assert_eq!(err.code(), ErrorCode::INVALID_ARGUMENT, "{err}");
}

#[tokio::test]
async fn bad_capacity_and_pool_settings_are_refused_and_change_nothing() {
    let sched = Scheduler::new();
    sched.set_capacity(POOL, 1).unwrap();
    let before = sched.snapshot();

    let bad_labels = [
        ("empty value", labels(&[("gpu", "")])),
        ("empty name", labels(&[("", "x")])),
        ("two values", labels(&[("gpu", "a100"), ("gpu", "h100")])),
        ("space in name", labels(&[("g pu", "a100")])),
        ("comma in value", labels(&[("gpu", "a,b")])),
        ("long name", labels(&[(&"n".repeat(65), "x")])),
    ];
    for (what, bad) in bad_labels {
        for pool in [POOL, "fresh"] {
            let err = sched.set_group_capacity(pool, bad.clone(), 2).unwrap_err();
            assert_eq!(err.code(), ErrorCode::INVALID_ARGUMENT, "{what}: {err}");
            assert_eq!(sched.snapshot(), before, "{what} changed the snapshot");
        }
    }
    for pool in ["", "a.b", "a b", &"p".repeat(65)] {
        let err = sched.set_capacity(pool, 1).unwrap_err();
        assert_eq!(err.code(), ErrorCode::INVALID_ARGUMENT, "{pool:?}");
        let err = sched
            .executor(pool, |_ctx: TaskContext, p: Bytes| async move { Ok(p) })
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::INVALID_ARGUMENT, "{pool:?}");
        assert_eq!(sched.snapshot(), before);
    }
    let zero_attempts = PoolConfig {
        max_attempts: 0,
        ..PoolConfig::default()
    };
    let err = sched.configure_pool(POOL, zero_attempts).unwrap_err();
    assert_eq!(err.code(), ErrorCode::INVALID_ARGUMENT);
    let inverted = PoolConfig {
        autoscale_min: 5,
        autoscale_max: 1,
        ..PoolConfig::default()
    };
    assert_eq!(
        sched
            .configure_pool("fresh", inverted.clone())
            .unwrap_err()
            .code(),
        ErrorCode::INVALID_ARGUMENT
    );
    assert_eq!(sched.snapshot(), before);
    let err = Scheduler::builder()
        .pool(POOL, inverted)
        .build()
        .expect_err("bad pool setting refused");
    assert_eq!(err.code(), ErrorCode::INVALID_ARGUMENT);
}

// ---- idempotency -------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn same_idempotency_key_while_live_returns_the_same_task() {
    let (sched, gates, starts) = gated_scheduler(1);
    let first = submit(&sched, Task::new("k").pool(POOL).idempotency_key("job-1")).await;
    settle("k starts", || starts.started("k")).await;
    let again = submit(&sched, Task::new("k").pool(POOL).idempotency_key("job-1")).await;
    assert_eq!(again.id(), first.id());
    let other = submit(&sched, Task::new("o").pool(POOL).idempotency_key("job-2")).await;
    assert_ne!(other.id(), first.id());
    let snap = sched.snapshot();
    assert_eq!(
        (pool_of(&snap, POOL).busy, pool_of(&snap, POOL).waiting),
        (1, 1)
    );

    gates.open("k");
    let (a, b) = (finish(first).await, finish(again).await);
    assert!(a.is_success());
    assert_eq!(a, b);
    assert_eq!(starts.names().iter().filter(|n| *n == "k").count(), 1);

    // Finished and retained: still the same task, never a second run (as
    // the server does; both keep these records in `ledger`).
    gates.open("o");
    finish(other).await;
    let later = submit(&sched, Task::new("k").pool(POOL).idempotency_key("job-1")).await;
    assert_eq!(later.id(), a.id);
    assert_eq!(finish(later).await, a);
    assert_eq!(starts.names().iter().filter(|n| *n == "k").count(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_key_is_free_again_once_its_task_leaves_the_retained_outcomes() {
    let sched = Scheduler::builder().retain_finished(1).build().unwrap();
    sched.set_capacity(POOL, 1).unwrap();
    sched
        .executor(POOL, |_ctx: TaskContext, p: Bytes| async move { Ok(p) })
        .unwrap();
    let first = submit(&sched, Task::new("a").pool(POOL).idempotency_key("job-1")).await;
    let first_id = first.id();
    assert!(finish(first).await.is_success());
    let other = submit(&sched, Task::new("b").pool(POOL)).await;
    assert!(finish(other).await.is_success());
    let later = submit(&sched, Task::new("c").pool(POOL).idempotency_key("job-1")).await;
    assert_ne!(later.id(), first_id);
    assert_eq!(finish(later).await.output.unwrap(), "c");
}

// ---- task status and wait ----------------------------------------------------

#[tokio::test(start_paused = true)]
async fn task_status_follows_a_task_from_queued_to_finished() {
    let sched = Scheduler::new();
    sched.set_capacity(POOL, 1).unwrap();
    let gates = Gates::default();
    let starts = Starts::default();
    let (g, s) = (gates.clone(), starts.clone());
    sched
        .executor(POOL, move |ctx: TaskContext, payload: Bytes| {
            s.record(&payload, &ctx);
            let g = g.clone();
            async move {
                let name = format!("{}#{}", String::from_utf8_lossy(&payload), ctx.attempt);
                g.pass(&name).await;
                if payload == "b" && ctx.attempt == 1 {
                    return Err(TaskError::retryable("try again"));
                }
                Ok(Bytes::from(name))
            }
        })
        .unwrap();

    let a = submit(&sched, Task::new("a").pool(POOL)).await;
    let b = submit(
        &sched,
        Task::new("b")
            .pool(POOL)
            .backoff(Duration::from_secs(1), Duration::from_secs(1)),
    )
    .await;
    let id = b.id();
    settle("a starts", || starts.started("a")).await;

    // Queued behind a.
    let st = sched.task(id).unwrap();
    assert_eq!((st.id, st.pool.as_str()), (id, POOL));
    assert_eq!(st.state, TaskState::Queued);
    assert_eq!(st.reason, Some(WaitReason::GroupsFull));
    assert!(st.attempts.is_empty());
    assert_eq!(st.output, None);

    // Running its first attempt.
    gates.open("a#1");
    settle("b starts", || starts.started("b")).await;
    let st = sched.task(id).unwrap();
    assert_eq!(st.state, TaskState::Running);
    assert_eq!(st.reason, None);
    assert_eq!(st.attempts.len(), 1);
    assert_eq!(st.attempts[0].attempt, 1);
    assert_eq!(st.attempts[0].group, Labels::new());
    assert_eq!(st.attempts[0].ended_at, None);
    assert_eq!(st.attempts[0].outcome, None);

    // Backing off after a failure.
    gates.open("b#1");
    settle("b#1 fails", || {
        sched.task(id).unwrap().reason == Some(WaitReason::Backoff)
    })
    .await;
    let st = sched.task(id).unwrap();
    assert_eq!(st.state, TaskState::Queued);
    assert_eq!(st.attempts.len(), 1);
    assert_eq!(st.attempts[0].outcome.as_deref(), Some("failed"));
    assert_eq!(st.error.as_deref(), Some("try again"));

    // Second attempt, then done.
    gates.open("b#2");
    let waited = tokio::time::timeout(Duration::from_secs(60), sched.wait(id))
        .await
        .unwrap()
        .unwrap();
    assert!(waited.is_success());
    assert_eq!(waited.output.as_deref(), Some(&b"b#2"[..]));
    assert_eq!(finish(b).await, waited);
    let st = sched.task(id).unwrap();
    assert_eq!(st.state, TaskState::Succeeded);
    assert_eq!(st.reason, None);
    assert_eq!(st.attempts.len(), 2);
    assert_eq!(st.attempts[1].outcome.as_deref(), Some("succeeded"));
    assert_eq!(st.output.as_deref(), Some("b#2"));
    // wait() after the fact answers at once.
    assert_eq!(sched.wait(id).await.unwrap(), waited);
    assert!(finish(a).await.is_success());

    let err = sched.wait(TaskId(424_242)).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::NOT_FOUND);
    assert!(sched.task(TaskId(424_242)).is_none());
}

#[tokio::test]
async fn finished_tasks_are_forgotten_beyond_retain_finished() {
    let sched = Scheduler::builder().retain_finished(1).build().unwrap();
    sched.set_capacity(POOL, 1).unwrap();
    sched
        .executor(POOL, |_ctx: TaskContext, p: Bytes| async move { Ok(p) })
        .unwrap();
    let first = finish(submit(&sched, Task::new("1").pool(POOL)).await).await;
    assert!(sched.task(first.id).is_some());
    let second = finish(submit(&sched, Task::new("2").pool(POOL)).await).await;
    assert!(sched.task(first.id).is_none());
    assert_eq!(
        sched.wait(first.id).await.unwrap_err().code(),
        ErrorCode::NOT_FOUND
    );
    assert_eq!(sched.wait(second.id).await.unwrap(), second);
}

// ---- snapshot ----------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn snapshot_shows_groups_busy_demand_and_autoscale() {
    let sched = Scheduler::builder()
        .pool(
            POOL,
            PoolConfig {
                autoscale_min: 1,
                autoscale_max: 7,
                ..PoolConfig::default()
            },
        )
        .build()
        .unwrap();
    let (gates, starts) = gated(&sched, POOL);
    let eu_a100 = labels(&[("gpu", "a100"), ("zone", "eu")]);
    // Set out of preference order: the snapshot sorts least specialized first.
    sched.set_group_capacity(POOL, eu_a100.clone(), 1).unwrap();
    sched.set_group_capacity(POOL, gpu("a100"), 1).unwrap();
    sched.set_capacity(POOL, 2).unwrap();

    let snap = sched.snapshot();
    let pool = pool_of(&snap, POOL);
    assert_eq!((pool.capacity, pool.busy, pool.waiting), (4, 0, 0));
    assert_eq!(pool.autoscale.desired, 1, "clamped up to min");
    assert_eq!((pool.autoscale.min, pool.autoscale.max), (1, 7));

    // Four unlabeled tasks fill the groups least specialized first; a fifth
    // waits, and so do two tasks for labels nobody has.
    let mut handles = Vec::new();
    for name in ["u1", "u2", "u3", "u4", "u5"] {
        handles.push(submit(&sched, Task::new(name).pool(POOL)).await);
    }
    for name in ["t1", "t2"] {
        handles.push(submit(&sched, Task::new(name).pool(POOL).label("tpu", "v5")).await);
    }
    settle("four start", || starts.count() == 4).await;
    assert_eq!(starts.ctx("u3").group, gpu("a100"));
    assert_eq!(starts.ctx("u4").group, eu_a100);

    let snap = sched.snapshot();
    let pool = pool_of(&snap, POOL);
    let groups: Vec<_> = pool
        .groups
        .iter()
        .map(|g| (g.labels.clone(), g.capacity, g.busy, g.workers))
        .collect();
    assert_eq!(
        groups,
        vec![
            (Labels::new(), 2, 2, 0),
            (gpu("a100"), 1, 1, 0),
            (eu_a100.clone(), 1, 1, 0),
        ]
    );
    assert_eq!((pool.capacity, pool.busy, pool.waiting), (4, 4, 3));
    assert_eq!(
        pool.demand,
        vec![
            Demand {
                labels: Labels::new(),
                waiting: 1,
                reason: Some(WaitReason::GroupsFull),
            },
            Demand {
                labels: labels(&[("tpu", "v5")]),
                waiting: 2,
                reason: Some(WaitReason::NoGroupMatches),
            },
        ]
    );
    assert_eq!(pool.autoscale.desired, 7, "4 busy + 3 waiting");

    // One more waiter: desired is clamped to max.
    handles.push(submit(&sched, Task::new("u6").pool(POOL)).await);
    assert_eq!(pool_of(&sched.snapshot(), POOL).autoscale.desired, 7);
    assert!(snap.to_table().contains("gpu=a100,zone=eu"));

    // Drain everything: the tpu tasks get a group, every gate opens.
    sched
        .set_group_capacity(POOL, labels(&[("tpu", "v5")]), 1)
        .unwrap();
    for name in ["u1", "u2", "u3", "u4", "u5", "u6", "t1", "t2"] {
        gates.open(name);
    }
    for h in handles {
        assert!(finish(h).await.is_success());
    }
    let snap = sched.snapshot();
    let pool = pool_of(&snap, POOL);
    assert_eq!((pool.busy, pool.waiting), (0, 0));
    assert!(pool.demand.is_empty());
    assert_eq!(pool.autoscale.desired, 1);
    assert!(pool.groups.iter().all(|g| g.busy == 0));
}

// ---- shutdown ----------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn dropping_the_scheduler_ends_waits_for_tasks_that_cannot_run() {
    let sched = Scheduler::new();
    sched.set_capacity(POOL, 1).unwrap();
    sched
        .executor(POOL, |_ctx: TaskContext, p: Bytes| async move { Ok(p) })
        .unwrap();
    let stuck = submit(&sched, Task::new("stuck").pool(POOL).label("tpu", "v5")).await;
    // One handle already waiting (its waker kept with the task) when the
    // scheduler goes, one polled only after.
    let waiting = submit(&sched, Task::new("waiting").pool(POOL).label("tpu", "v5")).await;
    let start = tokio::time::Instant::now();
    let waiting = tokio::spawn(tokio::time::timeout(
        Duration::from_secs(3600),
        waiting.wait(),
    ));
    tokio::task::yield_now().await;
    drop(sched);
    let err = tokio::time::timeout(Duration::from_secs(3600), stuck.wait())
        .await
        .expect("wait ends once the scheduler is gone")
        .expect_err("no outcome for a task that never ran");
    assert!(matches!(err, Error::Closed), "{err:?}");
    assert_eq!(err.code(), ErrorCode::UNAVAILABLE);
    let err = waiting
        .await
        .expect("joined")
        .expect("a waiting handle is woken when the scheduler goes")
        .expect_err("no outcome for a task that never ran");
    assert!(matches!(err, Error::Closed), "{err:?}");
    // Woken when the scheduler's state went (its timer loop holds it up
    // to a second longer), not found by its timeout's last poll: virtual
    // time moves only when every task is idle.
    assert!(
        start.elapsed() <= Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
}

#[tokio::test]
async fn snapshot_lists_pools_by_name() {
    let sched = Scheduler::new();
    sched.set_capacity("zeta", 1).unwrap();
    sched.set_capacity("alpha", 1).unwrap();
    let names: Vec<_> = sched
        .snapshot()
        .pools
        .iter()
        .map(|p| p.name.to_string())
        .collect();
    assert_eq!(names, ["alpha", "zeta"]);
}
