//! What the embedded scheduler keeps for waiters, seen from inside: a
//! handle's outcome waits in the state only while the handle can take it.

use super::*;

const POOL: &str = "p";

/// A scheduler whose pool holds every task until `set_capacity`.
fn held() -> Scheduler {
    let sched = Scheduler::new();
    sched.set_capacity(POOL, 0).unwrap();
    sched
        .executor(POOL, |_ctx, payload: Bytes| async move { Ok(payload) })
        .unwrap();
    sched
}

/// Outcomes waiting for a handle, and live tasks with a handle's waker.
fn kept(sched: &Scheduler, ids: &[TaskId]) -> (usize, usize) {
    let mut st = sched.inner.lock();
    let wakers = ids
        .iter()
        .filter(|id| st.ledger.get_mut(**id).is_some_and(|e| e.extra.is_some()))
        .count();
    (st.unclaimed.len(), wakers)
}

async fn settle(sched: &Scheduler, ids: &[TaskId]) {
    for _ in 0..1000 {
        if ids
            .iter()
            .all(|id| sched.task(*id).is_some_and(|t| t.state.is_terminal()))
        {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("tasks did not finish");
}

#[tokio::test]
async fn a_handle_dropped_before_its_outcome_leaves_nothing_for_it() {
    let sched = held();
    let handles: Vec<TaskHandle> = (0..6)
        .map(|i| {
            sched
                .submit_now(Task::new(format!("t{i}")).pool(POOL))
                .unwrap()
        })
        .collect();
    let ids: Vec<TaskId> = handles.iter().map(TaskHandle::id).collect();
    assert_eq!(
        kept(&sched, &ids),
        (0, 6),
        "each waiting task keeps its handle's waker"
    );
    let mut handles = handles.into_iter();
    // Two dropped while their tasks wait, two kept, two dropped after
    // their tasks finished (their outcomes were left for them).
    drop(handles.next());
    drop(handles.next());
    let kept_handles: Vec<TaskHandle> = handles.by_ref().take(2).collect();
    let late: Vec<TaskHandle> = handles.collect();
    assert_eq!(kept(&sched, &ids), (0, 4));
    sched.set_capacity(POOL, 8).unwrap();
    settle(&sched, &ids).await;
    assert_eq!(
        kept(&sched, &ids),
        (4, 0),
        "outcomes only for the handles still held"
    );
    drop(late);
    assert_eq!(kept(&sched, &ids), (2, 0));
    for handle in kept_handles {
        let outcome = handle.wait().await.unwrap();
        assert_eq!(outcome.state, TaskState::Succeeded);
    }
    assert_eq!(kept(&sched, &ids), (0, 0));
    // The dropped handles' tasks ran and are retained like any other.
    for id in &ids {
        assert_eq!(sched.task(*id).unwrap().state, TaskState::Succeeded);
    }
}

#[tokio::test]
async fn a_submission_without_a_handle_keeps_nothing_for_a_waiter() {
    let sched = held();
    let ids: Vec<TaskId> = (0..3)
        .map(|i| {
            sched
                .submit_id(Task::new(format!("t{i}")).pool(POOL), true)
                .unwrap()
        })
        .collect();
    assert_eq!(kept(&sched, &ids), (0, 0));
    // A waiter by id still hears the outcome.
    let by_id = {
        let sched = sched.clone();
        let id = ids[0];
        tokio::spawn(async move { sched.wait(id).await })
    };
    tokio::task::yield_now().await;
    sched.set_capacity(POOL, 8).unwrap();
    settle(&sched, &ids).await;
    assert_eq!(kept(&sched, &ids), (0, 0));
    assert_eq!(by_id.await.unwrap().unwrap().state, TaskState::Succeeded);
}

#[tokio::test(start_paused = true)]
async fn a_handle_polled_while_its_task_waits_is_woken_by_the_finish() {
    let sched = held();
    let handle = sched.submit_now(Task::new("t").pool(POOL)).unwrap();
    let id = handle.id();
    // Virtual time: it moves only when every task is idle, which a
    // handle nobody wakes would be (a timeout polls it once more then).
    let start = tokio::time::Instant::now();
    let wait = tokio::time::timeout(std::time::Duration::from_secs(3600), handle.wait());
    let waiter = tokio::spawn(wait);
    tokio::task::yield_now().await;
    assert_eq!(kept(&sched, &[id]), (0, 1));
    sched.set_capacity(POOL, 1).unwrap();
    let outcome = waiter.await.unwrap().expect("woken").unwrap();
    assert_eq!(
        start.elapsed(),
        std::time::Duration::ZERO,
        "woken by the finish"
    );
    assert_eq!((outcome.id, outcome.state), (id, TaskState::Succeeded));
    assert_eq!(kept(&sched, &[id]), (0, 0));
}

#[tokio::test]
async fn with_telemetry_a_finished_tasks_spans_go_out_and_executors_see_their_attempt_span() {
    use crate::telemetry::tests::{settings, Capture};
    let capture = Capture::default();
    let telemetry =
        crate::telemetry::Telemetry::with_exporter(capture.clone(), settings(64)).unwrap();
    let sched = Scheduler::builder()
        .telemetry(Some(telemetry.clone()))
        .pool(
            POOL,
            PoolConfig {
                backoff: crate::core::Backoff {
                    initial: Millis(1),
                    max: Millis(1),
                },
                ..PoolConfig::default()
            },
        )
        .build()
        .unwrap();
    sched.set_capacity(POOL, 1).unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    sched
        .executor(POOL, move |ctx: TaskContext, _payload: Bytes| {
            record.lock().unwrap().push(ctx.traceparent.clone());
            async move {
                if ctx.attempt == 1 {
                    Err(crate::task::TaskError::retryable("first fails"))
                } else {
                    Ok(Bytes::new())
                }
            }
        })
        .unwrap();
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let handle = sched
        .submit(Task::new("x").pool(POOL).traceparent(tp))
        .await
        .unwrap();
    assert_eq!(handle.wait().await.unwrap().state, TaskState::Succeeded);
    telemetry.shutdown(Duration::from_secs(5)).await;
    let spans = capture.spans.lock().unwrap();
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_ref()).collect();
    assert_eq!(
        names,
        [
            "cronoq.task",
            "cronoq.queued",
            "cronoq.queued",
            "cronoq.attempt",
            "cronoq.attempt"
        ]
    );
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2);
    for (attempt, span) in seen.iter().zip(&spans[3..]) {
        let expected = format!(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-{:016x}-01",
            span.span_context.span_id()
        );
        assert_eq!(attempt.as_deref(), Some(&*expected));
    }
    assert_eq!(
        format!("{:016x}", spans[0].parent_span_id),
        "00f067aa0ba902b7"
    );
}

#[tokio::test]
async fn without_telemetry_executors_see_the_submitters_traceparent() {
    let sched = Scheduler::new();
    sched.set_capacity(POOL, 1).unwrap();
    sched
        .executor(POOL, |ctx: TaskContext, _payload: Bytes| async move {
            Ok(Bytes::from(ctx.traceparent.unwrap_or_default()))
        })
        .unwrap();
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let handle = sched
        .submit(Task::new("x").pool(POOL).traceparent(tp))
        .await
        .unwrap();
    assert_eq!(handle.wait().await.unwrap().output.unwrap(), tp);
}
