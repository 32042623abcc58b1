//! SPEC §9 through the embedded `Scheduler`'s public API (issue 36): the
//! `Task` builders reach the core, preemption cancels the executor and
//! the attempt ends `preempted` without counting, each concurrency policy,
//! quotas and the wait reasons, and bad values refused with nothing
//! changed. Time-dependent tests run under paused tokio time; no test
//! sleeps to wait for a condition.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use cronoq::core::{ErrorCode, Labels, QuotaConfig, WaitReason};
use cronoq::{
    ConcurrencyPolicy, Outcome, PoolConfig, Preemption, Scheduler, Task, TaskContext, TaskHandle,
    TaskId, TaskState,
};
use tokio::sync::Semaphore;

const POOL: &str = "shared";

/// Named gates an executor waits at (opening one first is remembered),
/// and who started, in order.
#[derive(Clone, Default)]
struct Gates {
    gates: Arc<Mutex<HashMap<String, Arc<Semaphore>>>>,
    starts: Arc<Mutex<Vec<(String, u32)>>>,
}

impl Gates {
    fn gate(&self, name: &str) -> Arc<Semaphore> {
        self.gates
            .lock()
            .unwrap()
            .entry(name.to_string())
            .or_insert_with(|| Arc::new(Semaphore::new(0)))
            .clone()
    }

    fn open(&self, name: &str) {
        self.gate(name).add_permits(1);
    }

    fn started(&self, name: &str) -> usize {
        let starts = self.starts.lock().unwrap();
        starts.iter().filter(|(n, _)| n == name).count()
    }
}

/// Sets a flag when dropped: the executor's future was cancelled.
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

fn scheduler(slots: u32, config: PoolConfig) -> (Scheduler, Gates) {
    let sched = Scheduler::new();
    sched.configure_pool(POOL, config).unwrap();
    sched.set_capacity(POOL, slots).unwrap();
    let gates = Gates::default();
    let g = gates.clone();
    sched
        .executor(POOL, move |ctx: TaskContext, payload: Bytes| {
            let name = String::from_utf8_lossy(&payload).into_owned();
            g.starts.lock().unwrap().push((name.clone(), ctx.attempt));
            let gate = g.gate(&name);
            async move {
                gate.acquire().await.unwrap().forget();
                Ok(payload)
            }
        })
        .unwrap();
    (sched, gates)
}

async fn submit(sched: &Scheduler, task: Task) -> TaskHandle {
    sched
        .submit(task.pool(POOL))
        .await
        .expect("submit accepted")
}

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

fn status(sched: &Scheduler, id: TaskId) -> (TaskState, Option<WaitReason>) {
    let s = sched.task(id).expect("task known");
    (s.state, s.reason)
}

#[tokio::test(start_paused = true)]
async fn preemption_cancels_the_executor_and_the_attempt_does_not_count() {
    let sched = Scheduler::new();
    let config = PoolConfig {
        preemption: Preemption::Priority,
        ..PoolConfig::default()
    };
    sched.configure_pool(POOL, config).unwrap();
    sched.set_capacity(POOL, 1).unwrap();
    let cancelled = Arc::new(AtomicBool::new(false));
    let attempts = Arc::new(Mutex::new(Vec::new()));
    let (c, a) = (cancelled.clone(), attempts.clone());
    sched
        .executor(POOL, move |ctx: TaskContext, payload: Bytes| {
            a.lock().unwrap().push((payload.clone(), ctx.attempt));
            let guard = SetOnDrop(c.clone());
            async move {
                if payload == "low" && ctx.attempt == 1 {
                    let _guard = guard;
                    tokio::time::sleep(Duration::from_secs(24 * 3600)).await;
                }
                Ok(payload)
            }
        })
        .unwrap();
    // One attempt allowed: the preempted one must not use it up.
    let low = submit(&sched, Task::new("low").max_attempts(1)).await;
    settle("low starts", || attempts.lock().unwrap().len() == 1).await;
    let high = submit(&sched, Task::new("high").priority(5)).await;
    let high = finish(high).await;
    assert!(high.is_success());
    assert!(
        cancelled.load(Ordering::SeqCst),
        "the executor saw its cancellation"
    );
    let low = finish(low).await;
    assert!(low.is_success(), "{low:?}");
    let outcomes: Vec<_> = low.attempts.iter().map(|a| a.outcome.as_deref()).collect();
    assert_eq!(outcomes, [Some("preempted"), Some("succeeded")]);
    assert!(
        low.error.is_none(),
        "a preemption is no failure: {:?}",
        low.error
    );
}

#[tokio::test(start_paused = true)]
async fn a_task_that_is_not_preemptible_keeps_its_slot() {
    let config = PoolConfig {
        preemption: Preemption::Priority,
        ..PoolConfig::default()
    };
    let (sched, gates) = scheduler(1, config);
    let low = submit(&sched, Task::new("low").preemptible(false)).await;
    settle("low starts", || gates.started("low") == 1).await;
    let high = submit(&sched, Task::new("high").priority(5)).await;
    settle("high waits", || {
        status(&sched, high.id()) == (TaskState::Queued, Some(WaitReason::GroupsFull))
    })
    .await;
    assert_eq!(status(&sched, low.id()).0, TaskState::Running);
    gates.open("low");
    gates.open("high");
    assert!(finish(low).await.is_success());
    assert!(finish(high).await.is_success());
}

#[tokio::test(start_paused = true)]
async fn concurrency_queue_waits_with_reason_concurrency_and_blocks_nobody() {
    let (sched, gates) = scheduler(4, PoolConfig::default());
    let first = submit(&sched, Task::new("d1").concurrency_key("deploy")).await;
    let second = submit(&sched, Task::new("d2").concurrency_key("deploy")).await;
    let other = submit(&sched, Task::new("other")).await;
    settle("d1 and other start", || {
        gates.started("d1") == 1 && gates.started("other") == 1
    })
    .await;
    assert_eq!(
        status(&sched, second.id()),
        (TaskState::Queued, Some(WaitReason::Concurrency))
    );
    assert_eq!(
        sched.task(second.id()).unwrap().reason_key.as_deref(),
        Some("deploy")
    );
    let snap = sched.snapshot();
    let pool = snap.pools.iter().find(|p| p.name.as_str() == POOL).unwrap();
    let row = &pool.concurrency_keys[0];
    assert_eq!(
        (row.key.as_str(), row.running, row.waiting, row.limit),
        ("deploy", 1, 1, Some(1))
    );
    gates.open("d1");
    gates.open("d2");
    gates.open("other");
    assert!(finish(first).await.is_success());
    assert!(finish(second).await.is_success());
    assert!(finish(other).await.is_success());
}

#[tokio::test(start_paused = true)]
async fn concurrency_skip_cancels_the_newcomer_while_the_limit_is_full() {
    let (sched, gates) = scheduler(4, PoolConfig::default());
    let skip = |name: &str| {
        Task::new(name.to_string())
            .concurrency_key("nightly")
            .concurrency_policy(ConcurrencyPolicy::Skip)
    };
    let first = submit(&sched, skip("n1")).await;
    settle("n1 starts", || gates.started("n1") == 1).await;
    let second = finish(submit(&sched, skip("n2")).await).await;
    assert_eq!(second.state, TaskState::Cancelled);
    assert!(second.attempts.is_empty());
    gates.open("n1");
    assert!(finish(first).await.is_success());
}

#[tokio::test(start_paused = true)]
async fn concurrency_replace_waiting_cancels_the_older_waiter() {
    let (sched, gates) = scheduler(4, PoolConfig::default());
    let replace = |name: &str| {
        Task::new(name.to_string())
            .concurrency_key("build")
            .concurrency_policy(ConcurrencyPolicy::ReplaceWaiting)
    };
    let running = submit(&sched, replace("b1")).await;
    settle("b1 starts", || gates.started("b1") == 1).await;
    let older = submit(&sched, replace("b2")).await;
    let newer = submit(&sched, replace("b3")).await;
    assert_eq!(finish(older).await.state, TaskState::Cancelled);
    gates.open("b1");
    gates.open("b3");
    assert!(finish(running).await.is_success());
    assert!(finish(newer).await.is_success());
    assert_eq!(gates.started("b2"), 0);
}

#[tokio::test(start_paused = true)]
async fn concurrency_cancel_running_cancels_the_running_one() {
    let (sched, gates) = scheduler(4, PoolConfig::default());
    let cancel = |name: &str| {
        Task::new(name.to_string())
            .concurrency_key("deploy")
            .concurrency_policy(ConcurrencyPolicy::CancelRunning)
    };
    let old = submit(&sched, cancel("v1")).await;
    settle("v1 starts", || gates.started("v1") == 1).await;
    let new = submit(&sched, cancel("v2")).await;
    let old = finish(old).await;
    assert_eq!(old.state, TaskState::Cancelled);
    assert_eq!(old.attempts[0].outcome.as_deref(), Some("cancelled"));
    settle("v2 starts", || gates.started("v2") == 1).await;
    gates.open("v2");
    assert!(finish(new).await.is_success());
}

#[tokio::test(start_paused = true)]
async fn a_key_at_its_quota_waits_with_reason_quota_and_blocks_nobody() {
    let config = PoolConfig {
        quotas: vec![QuotaConfig {
            key: "team-b".into(),
            labels: Labels::new(),
            max_running: 1,
        }],
        ..PoolConfig::default()
    };
    let (sched, gates) = scheduler(4, config);
    let b1 = submit(&sched, Task::new("b1").fairness_key("team-b")).await;
    let b2 = submit(&sched, Task::new("b2").fairness_key("team-b")).await;
    let a1 = submit(&sched, Task::new("a1").fairness_key("team-a")).await;
    settle("b1 and a1 start", || {
        gates.started("b1") == 1 && gates.started("a1") == 1
    })
    .await;
    assert_eq!(
        status(&sched, b2.id()),
        (TaskState::Queued, Some(WaitReason::Quota))
    );
    // Why-waiting names the key; the snapshot and /metrics show the keys.
    let waiting = sched.task(b2.id()).unwrap();
    assert_eq!(waiting.reason_key.as_deref(), Some("team-b"));
    let snap = sched.snapshot();
    let pool = snap.pools.iter().find(|p| p.name.as_str() == POOL).unwrap();
    let b = pool
        .fairness_keys
        .iter()
        .find(|k| k.key == "team-b")
        .unwrap();
    assert_eq!((b.running, b.waiting, b.share_permille), (1, 1, 500));
    assert_eq!((b.quotas[0].held, b.quotas[0].max_running), (1, 1));
    let health = cronoq::api::Health {
        live: true,
        ready: true,
        detail: String::new(),
    };
    let text = cronoq::http::metrics_text(&snap, &health);
    assert!(
        text.contains(r#"cronoq_fairness_key_running{pool="shared",key="team-b"} 1"#),
        "{text}"
    );
    assert!(text.contains(r#"cronoq_fairness_key_share{pool="shared",key="team-a"} 0.5"#));
    for name in ["b1", "b2", "a1"] {
        gates.open(name);
    }
    for h in [b1, b2, a1] {
        assert!(finish(h).await.is_success());
    }
}

#[tokio::test(start_paused = true)]
async fn bad_sharing_values_are_invalid_argument_and_change_nothing() {
    let (sched, gates) = scheduler(1, PoolConfig::default());
    let bad = [
        Task::new("x").fairness_key(""),
        Task::new("x").fairness_key("k".repeat(65)),
        Task::new("x").fairness_weight(0),
        Task::new("x").fairness_weight(1001),
        Task::new("x").concurrency_key("c".repeat(129)),
        Task::new("x").concurrency_limit(0),
    ];
    for task in bad {
        match sched.submit(task.pool(POOL)).await {
            Ok(h) => panic!("task {} was accepted", h.id()),
            Err(e) => assert_eq!(e.code(), ErrorCode::INVALID_ARGUMENT, "{e}"),
        }
    }
    // Nothing changed: the next task is task 1.
    let ok = submit(&sched, Task::new("ok")).await;
    assert_eq!(ok.id(), TaskId(1));
    gates.open("ok");
    assert!(finish(ok).await.is_success());
}
