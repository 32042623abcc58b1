//! The in-process [`Scheduler`]: the pure core behind one lock, a real
//! clock, and executors run as tokio tasks.
//!
//! Every operation locks the core, hands it `now` and the event, and
//! carries out the returned actions; the lock is never held across an
//! `.await` or while user code runs. One background tokio task sleeps
//! until [`crate::core::Core::next_wakeup`] and feeds `Tick`s.
//!
//! How attempts run:
//! - An attempt that `submit` starts (a slot was free) is polled once
//!   right there, after the lock is released ([`SchedulerBuilder::eager_start`],
//!   on by default). If it completes at that poll, its end is recorded at
//!   once: no tokio task, no hand-off to another thread. If not, it goes on
//!   in a tokio task of its own, which polls it again with its own waker.
//! - The tokio task that records an attempt's end goes on with the attempt
//!   that end started (the freed slot usually goes to the next waiter), so
//!   a busy slot runs attempt after attempt without a spawn each; it yields
//!   as tokio's cooperative budget asks. Other starts (capacity raised,
//!   timers, several starts at once) get tokio tasks of their own.
//! - A panic in the executor, in its call or in its future, is caught and
//!   counts as a failed (retryable) attempt; a revoked attempt (cancel or
//!   attempt timeout) is aborted at its next `.await`.
//!
//! The clock is tokio's, anchored to the wall clock when the scheduler is
//! built, so `#[tokio::test(start_paused = true)]` drives timers without
//! sleeping.
//!
//! Finished tasks are kept for [`SchedulerBuilder::retain_finished`] most
//! recent ones (default 10,000) so that [`Scheduler::task`] and
//! [`Scheduler::wait`] still answer after the fact.

use std::collections::VecDeque;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures_util::future::CatchUnwind;
use futures_util::future::{AbortHandle, Abortable};
use futures_util::FutureExt;
use rustc_hash::FxHashMap;
use tokio::sync::{oneshot, Notify};

use crate::core::{
    Action, AttemptOutcome, Core, ErrorCode, Event, Labels, Millis, PoolConfig, PoolName,
    Rejection, RevokeReason, Snapshot, TaskId, TaskState,
};
pub use crate::task::TaskContext;
use crate::task::{AttemptRecord, Outcome, Task, TaskError, TaskStatus};

/// An embedded scheduler error, with a stable [`ErrorCode`].
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The core refused the request (bad argument, unknown task, …).
    #[error(transparent)]
    Rejected(#[from] Rejection),
    /// A task was submitted to a pool that has no executor.
    #[error("pool {0} has no executor: call Scheduler::executor first")]
    NoExecutor(PoolName),
    /// The scheduler was dropped before the task finished.
    #[error("scheduler is gone")]
    Closed,
    /// The task finished too long ago: its result is no longer kept.
    #[error("task {0} is not known (finished tasks are kept for a while only)")]
    NotFound(TaskId),
}

impl Error {
    /// The stable code.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::Rejected(r) => r.code(),
            Error::NoExecutor(_) => ErrorCode::FAILED_PRECONDITION,
            Error::Closed => ErrorCode::UNAVAILABLE,
            Error::NotFound(_) => ErrorCode::NOT_FOUND,
        }
    }
}

type BoxFuture = Pin<Box<dyn Future<Output = Result<Bytes, TaskError>> + Send>>;
type ExecutorFn = Arc<dyn Fn(TaskContext, Bytes) -> BoxFuture + Send + Sync>;

/// Per live task, what the shell keeps beside the core's record.
struct Entry {
    payload: Bytes,
    waiter: Option<oneshot::Sender<Arc<Outcome>>>,
    run: Option<Box<RunInfo>>,
}

/// Allocated once the task first starts (or gets a second waiter).
#[derive(Default)]
struct RunInfo {
    attempts: Vec<AttemptRecord>,
    output: Option<Bytes>,
    error: Option<String>,
    abort: Option<(u32, AbortHandle)>,
    /// The attempt revoked for running past its timeout: it ends `lost`.
    timed_out: Option<u32>,
    more_waiters: Vec<oneshot::Sender<Arc<Outcome>>>,
    key: Option<String>,
    traceparent: Option<String>,
}

/// Live entries by id. The scheduler hands out ids in order and most tasks
/// finish roughly in order, so live ids mostly fall in a window
/// `[base, base + window.len())`: a deque indexed by `id - base`, with no
/// hashing and 8 bytes of overhead per entry. When finished tasks leave the
/// window more than half empty (a long-running task holds its front), the
/// oldest entries move to a map, so the window never keeps finished tasks
/// alive for long.
#[derive(Default)]
struct Entries {
    base: u64,
    window: VecDeque<Option<Entry>>,
    in_window: usize,
    far: FxHashMap<TaskId, Entry>,
}

impl Entries {
    /// Adds the entry of a new task; ids only grow.
    fn insert(&mut self, id: TaskId, entry: Entry) {
        if self.window.is_empty() {
            self.base = id.0;
        }
        let Some(at) = id.0.checked_sub(self.base) else {
            self.far.insert(id, entry);
            return;
        };
        let at = at as usize;
        while self.window.len() < at {
            self.window.push_back(None);
        }
        if at < self.window.len() {
            // An id below the window's end: not from the counter.
            match &mut self.window[at] {
                Some(_) => {
                    self.far.insert(id, entry);
                }
                slot => {
                    *slot = Some(entry);
                    self.in_window += 1;
                }
            }
            return;
        }
        self.window.push_back(Some(entry));
        self.in_window += 1;
    }

    fn index(&self, id: TaskId) -> Option<usize> {
        let at = usize::try_from(id.0.checked_sub(self.base)?).ok()?;
        (at < self.window.len() && self.window[at].is_some()).then_some(at)
    }

    fn get(&self, id: TaskId) -> Option<&Entry> {
        match self.index(id) {
            Some(at) => self.window[at].as_ref(),
            None => self.far.get(&id),
        }
    }

    fn get_mut(&mut self, id: TaskId) -> Option<&mut Entry> {
        match self.index(id) {
            Some(at) => self.window[at].as_mut(),
            None => self.far.get_mut(&id),
        }
    }

    /// The ids of the newest `limit` live entries, highest first. The
    /// window is at least half full (see `remove`), so this reads about
    /// `2 * limit` of its slots; the far map holds the few old entries.
    fn newest(&self, limit: usize) -> Vec<TaskId> {
        let mut ids: Vec<TaskId> = self
            .window
            .iter()
            .enumerate()
            .rev()
            .filter(|(_, e)| e.is_some())
            .take(limit)
            .map(|(at, _)| TaskId(self.base + at as u64))
            .collect();
        ids.extend(self.far.keys().copied());
        ids.sort_unstable_by(|a, b| b.cmp(a));
        ids.truncate(limit);
        ids
    }

    fn remove(&mut self, id: TaskId) -> Option<Entry> {
        let Some(at) = self.index(id) else {
            return self.far.remove(&id);
        };
        self.in_window -= 1;
        let entry = self.window[at].take();
        while self.window.front().is_some_and(Option::is_none) {
            self.window.pop_front();
            self.base += 1;
        }
        while self.window.len() > 64 && self.in_window * 2 < self.window.len() {
            if let Some(Some(old)) = self.window.pop_front() {
                self.in_window -= 1;
                self.far.insert(TaskId(self.base), old);
            }
            self.base += 1;
        }
        entry
    }
}

/// Zero, one or more items without allocating for zero or one.
enum Batch<T> {
    Empty,
    One(T),
    Many(Vec<T>),
}

impl<T> Batch<T> {
    fn push(&mut self, item: T) {
        *self = match std::mem::replace(self, Batch::Empty) {
            Batch::Empty => Batch::One(item),
            Batch::One(first) => Batch::Many(vec![first, item]),
            Batch::Many(mut all) => {
                all.push(item);
                Batch::Many(all)
            }
        };
    }

    /// The first item, and the rest.
    fn split_first(self) -> Option<(T, Batch<T>)> {
        match self {
            Batch::Empty => None,
            Batch::One(item) => Some((item, Batch::Empty)),
            Batch::Many(mut all) if !all.is_empty() => {
                let first = all.swap_remove(0);
                Some((first, Batch::Many(all)))
            }
            Batch::Many(_) => None,
        }
    }

    fn for_each(self, mut f: impl FnMut(T)) {
        match self {
            Batch::Empty => {}
            Batch::One(item) => f(item),
            Batch::Many(all) => all.into_iter().for_each(f),
        }
    }
}

type OutcomeTx = oneshot::Sender<Arc<Outcome>>;

/// What to do once the lock is released: attempts to spawn, outcomes to
/// hand to waiters (waking a waiter may take a while; not under the lock).
struct Work {
    jobs: Batch<Job>,
    outcomes: Batch<(Arc<Outcome>, Option<OutcomeTx>, Vec<OutcomeTx>)>,
}

struct State {
    core: Core,
    actions: Vec<Action>,
    entries: Entries,
    executors: FxHashMap<PoolName, ExecutorFn>,
    keys: FxHashMap<String, TaskId>,
    finished: FxHashMap<TaskId, Arc<Outcome>>,
    finished_order: VecDeque<TaskId>,
    next_id: u64,
    /// The wakeup the timer task sleeps toward.
    armed: Option<Millis>,
}

struct Clock {
    base: tokio::time::Instant,
    base_unix: u64,
}

impl Clock {
    fn now(&self) -> Millis {
        Millis(self.base_unix + self.base.elapsed().as_millis() as u64)
    }

    fn instant(&self, at: Millis) -> tokio::time::Instant {
        // Checked: a timer decades away sleeps "for ever", never panics.
        let after = Duration::from_millis(at.0.saturating_sub(self.base_unix));
        self.base
            .checked_add(after)
            .unwrap_or_else(|| self.base + Duration::from_secs(100 * 365 * 24 * 3600))
    }
}

struct Inner {
    state: Mutex<State>,
    wake: Notify,
    clock: Clock,
    max_payload_bytes: usize,
    retain_finished: usize,
    eager_start: bool,
}

/// A job to spawn once the lock is released.
struct Job {
    executor: ExecutorFn,
    ctx: TaskContext,
    payload: Bytes,
    registration: futures_util::future::AbortRegistration,
}

/// The embedded scheduler: cheap to clone, safe to share.
///
/// Must be built inside a tokio runtime.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), cronoq::embedded::Error> {
/// use bytes::Bytes;
/// use cronoq::{Labels, Scheduler, Task, TaskContext};
/// let sched = Scheduler::new();
/// sched.set_capacity("inference", 4)?;
/// sched.set_group_capacity("inference", Labels::from([("gpu", "a100")]), 2)?;
/// sched.executor("inference", |ctx: TaskContext, payload: Bytes| async move {
///     Ok(Bytes::from(format!("{} on [{}]", String::from_utf8_lossy(&payload), ctx.group)))
/// })?;
/// let handle = sched.submit(Task::new("job").pool("inference").label("gpu", "a100")).await?;
/// let outcome = handle.wait().await?;
/// assert_eq!(outcome.output.unwrap(), "job on [gpu=a100]");
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Scheduler {
    inner: Arc<Inner>,
}

/// Options of a [`Scheduler`].
#[derive(Debug)]
pub struct SchedulerBuilder {
    max_payload_bytes: usize,
    retain_finished: usize,
    eager_start: bool,
    pools: Vec<(String, PoolConfig)>,
}

impl Default for SchedulerBuilder {
    fn default() -> Self {
        SchedulerBuilder {
            max_payload_bytes: 1 << 20,
            retain_finished: 10_000,
            eager_start: true,
            pools: Vec::new(),
        }
    }
}

impl SchedulerBuilder {
    /// Largest accepted payload (default 1 MiB).
    pub fn max_payload_bytes(mut self, n: usize) -> Self {
        self.max_payload_bytes = n;
        self
    }

    /// How many finished tasks to remember for [`Scheduler::task`] (default 10,000).
    pub fn retain_finished(mut self, n: usize) -> Self {
        self.retain_finished = n;
        self
    }

    /// Whether `submit` polls the attempts it starts once, in the caller
    /// (default `true`). An attempt that completes at that first poll is
    /// recorded at once, with no tokio task and no hand-off to another
    /// thread: short executors run several times faster. The price: the
    /// executor's code up to its first pending `.await` runs inside
    /// `submit`, so a caller must not hold a lock across `submit` that the
    /// executor takes before it awaits, and CPU-heavy executors should do
    /// their work in `spawn_blocking` (as tokio asks of any async code).
    /// `false`: every attempt starts in a tokio task of its own.
    pub fn eager_start(mut self, eager: bool) -> Self {
        self.eager_start = eager;
        self
    }

    /// Settings of a pool.
    pub fn pool(mut self, name: impl Into<String>, config: PoolConfig) -> Self {
        self.pools.push((name.into(), config));
        self
    }

    /// Builds the scheduler and starts its timer task. Fails on a bad pool
    /// name or setting.
    pub fn build(self) -> Result<Scheduler, Error> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let inner = Arc::new(Inner {
            state: Mutex::new(State {
                core: Core::new(),
                actions: Vec::new(),
                entries: Entries::default(),
                executors: FxHashMap::default(),
                keys: FxHashMap::default(),
                finished: FxHashMap::default(),
                finished_order: VecDeque::new(),
                next_id: 1,
                armed: None,
            }),
            wake: Notify::new(),
            clock: Clock {
                base: tokio::time::Instant::now(),
                base_unix: now,
            },
            max_payload_bytes: self.max_payload_bytes,
            retain_finished: self.retain_finished,
            eager_start: self.eager_start,
        });
        let sched = Scheduler { inner };
        for (name, config) in self.pools {
            sched.configure_pool(&name, config)?;
        }
        tokio::spawn(timer_loop(Arc::downgrade(&sched.inner)));
        Ok(sched)
    }
}

impl Default for Scheduler {
    fn default() -> Self {
        Scheduler::new()
    }
}

impl Scheduler {
    /// A scheduler with default options. Panics outside a tokio runtime.
    pub fn new() -> Scheduler {
        SchedulerBuilder::default()
            .build()
            .expect("default options are valid")
    }

    /// Options first: `Scheduler::builder().max_payload_bytes(…).build()`.
    pub fn builder() -> SchedulerBuilder {
        SchedulerBuilder::default()
    }

    /// Settings of a pool (urgency window, max_bypass, on_miss, …).
    pub fn configure_pool(&self, pool: &str, config: PoolConfig) -> Result<(), Error> {
        let pool = PoolName::new(pool)?;
        self.inner.apply(Event::PoolConfigured { pool, config })
    }

    /// Slots of the pool's unlabeled group.
    pub fn set_capacity(&self, pool: &str, slots: u32) -> Result<(), Error> {
        self.set_group_capacity(pool, Labels::new(), slots)
    }

    /// Slots of the pool's group that carries exactly `labels`.
    pub fn set_group_capacity(&self, pool: &str, labels: Labels, slots: u32) -> Result<(), Error> {
        let pool = PoolName::new(pool)?;
        self.inner.apply(Event::CapacitySet {
            pool,
            labels,
            slots,
        })
    }

    /// The function that runs the pool's attempts. Replaces an earlier one.
    pub fn executor<F, Fut>(&self, pool: &str, f: F) -> Result<(), Error>
    where
        F: Fn(TaskContext, Bytes) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Bytes, TaskError>> + Send + 'static,
    {
        let pool = PoolName::new(pool)?;
        let f: ExecutorFn = Arc::new(move |ctx, payload| Box::pin(f(ctx, payload)));
        self.inner.lock().executors.insert(pool, f);
        Ok(())
    }

    /// Submits a task. Refused (changing nothing) on a bad argument or when
    /// the pool has no executor.
    pub async fn submit(&self, task: Task) -> Result<TaskHandle, Error> {
        self.submit_now(task)
    }

    /// [`Scheduler::submit`] without `.await`.
    pub fn submit_now(&self, task: Task) -> Result<TaskHandle, Error> {
        let inner = &self.inner;
        let now = inner.clock.now();
        let (rx, jobs) = {
            let mut st = inner.lock();
            let id = TaskId(st.next_id);
            // The pool's name as the executor map holds it: no allocation.
            let Some(pool) = st
                .executors
                .get_key_value(task.pool_name())
                .map(|(p, _)| p.clone())
            else {
                let spec = task.to_spec(id, inner.max_payload_bytes)?;
                return Err(Error::NoExecutor(spec.pool));
            };
            let spec = task.to_spec_in(id, inner.max_payload_bytes, pool.clone())?;
            if let Some(key) = task.key() {
                if let Some(&existing) = st.keys.get(key) {
                    let (tx, rx) = oneshot::channel();
                    add_waiter(
                        st.entries.get_mut(existing).expect("keyed task is live"),
                        tx,
                    );
                    return Ok(TaskHandle { id: existing, rx });
                }
            }
            inner.core_event(&mut st, now, Event::Submitted(spec))?;
            st.next_id += 1;
            let (tx, rx) = oneshot::channel();
            let mut entry = Entry {
                payload: task.payload.clone(),
                waiter: Some(tx),
                run: None,
            };
            if let Some(key) = task.key() {
                st.keys.insert(key.to_string(), id);
                entry.run.get_or_insert_with(Default::default).key = Some(key.to_string());
            }
            if let Some(tp) = task.trace_context() {
                entry.run.get_or_insert_with(Default::default).traceparent = Some(tp.to_string());
            }
            st.entries.insert(id, entry);
            let jobs = inner.carry_out(&mut st, now);
            ((id, rx), jobs)
        };
        inner.start_eagerly(jobs);
        Ok(TaskHandle { id: rx.0, rx: rx.1 })
    }

    /// Cancels a task: a waiting one ends at once, a running one is aborted.
    pub fn cancel(&self, id: TaskId) -> Result<(), Error> {
        let now = self.inner.clock.now();
        let jobs = {
            let mut st = self.inner.lock();
            if !st.core_knows(id) && st.finished.contains_key(&id) {
                return Err(Rejection::AlreadyFinished(id).into());
            }
            self.inner
                .core_event(&mut st, now, Event::CancelRequested(id))?;
            self.inner.carry_out(&mut st, now)
        };
        self.inner.spawn_all(jobs);
        Ok(())
    }

    /// Pools, groups, demand and the autoscaling signal now.
    pub fn snapshot(&self) -> Snapshot {
        self.inner.lock().core.snapshot()
    }

    /// A task's state, why it waits, and its attempts; also for recently
    /// finished tasks.
    pub fn task(&self, id: TaskId) -> Option<TaskStatus> {
        self.inner.lock().status(id)
    }

    /// The newest `limit` tasks, highest id first: live ones and the most
    /// recently finished of those kept ([`SchedulerBuilder::retain_finished`]),
    /// as [`TaskStatus::summary`]s. Costs O(`limit`) lookups, not a scan
    /// of every waiting task.
    pub fn recent_tasks(&self, limit: usize) -> Vec<TaskStatus> {
        let st = self.inner.lock();
        let finished = st.finished_order.iter().rev().copied();
        crate::task::newest_ids(st.entries.newest(limit).into_iter(), finished, limit)
            .into_iter()
            .filter_map(|id| st.status(id).map(TaskStatus::summary))
            .collect()
    }

    /// Waits for a task by id (live or recently finished).
    pub async fn wait(&self, id: TaskId) -> Result<Outcome, Error> {
        let rx = {
            let mut st = self.inner.lock();
            if let Some(done) = st.finished.get(&id) {
                return Ok((**done).clone());
            }
            let entry = st.entries.get_mut(id).ok_or(Error::NotFound(id))?;
            let (tx, rx) = oneshot::channel();
            add_waiter(entry, tx);
            rx
        };
        rx.await.map(|o| (*o).clone()).map_err(|_| Error::Closed)
    }
}

fn add_waiter(entry: &mut Entry, tx: oneshot::Sender<Arc<Outcome>>) {
    if entry.waiter.is_none() {
        entry.waiter = Some(tx);
    } else {
        entry
            .run
            .get_or_insert_with(Default::default)
            .more_waiters
            .push(tx);
    }
}

fn status_of_outcome(o: &Outcome) -> TaskStatus {
    TaskStatus {
        id: o.id,
        pool: o.pool.clone(),
        state: o.state,
        reason: None,
        attempts: o.attempts.clone(),
        output: o
            .output
            .as_ref()
            .map(|b| String::from_utf8_lossy(b).into_owned()),
        output_base64: crate::task::output_fields(o.output.as_deref()).1,
        error: o.error.clone(),
        deadline_missed: o.deadline_missed,
    }
}

impl State {
    fn core_knows(&self, id: TaskId) -> bool {
        self.core.task(id).is_some()
    }

    fn status(&self, id: TaskId) -> Option<TaskStatus> {
        if let Some(done) = self.finished.get(&id) {
            return Some(status_of_outcome(done));
        }
        let view = self.core.task(id)?;
        let run = self.entries.get(id).and_then(|e| e.run.as_deref());
        Some(TaskStatus::live(
            view,
            run.map(|r| r.attempts.clone()).unwrap_or_default(),
            run.and_then(|r| r.error.clone()),
        ))
    }
}

/// A submitted task: its id, and a way to wait for its outcome.
pub struct TaskHandle {
    id: TaskId,
    rx: oneshot::Receiver<Arc<Outcome>>,
}

impl TaskHandle {
    /// The task's id.
    pub fn id(&self) -> TaskId {
        self.id
    }

    /// Waits until the task finishes: succeeded, failed, cancelled or missed.
    ///
    /// Every waiter of a task (a keyed resubmission gets one too) hears its
    /// outcome; the only way to hear nothing is the scheduler being dropped
    /// first: [`Error::Closed`]. The handle holds no reference to the
    /// scheduler, so it never keeps a dropped one alive.
    pub async fn wait(self) -> Result<Outcome, Error> {
        match self.rx.await {
            Ok(o) => Ok(Arc::try_unwrap(o).unwrap_or_else(|o| (*o).clone())),
            Err(_) => Err(Error::Closed),
        }
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock happens only in our own code, never
        // in user code (executors run outside it); keep going with the data.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn apply(self: &Arc<Self>, event: Event) -> Result<(), Error> {
        let now = self.clock.now();
        let jobs = {
            let mut st = self.lock();
            self.core_event(&mut st, now, event)?;
            self.carry_out(&mut st, now)
        };
        self.spawn_all(jobs);
        Ok(())
    }

    fn core_event(&self, st: &mut State, now: Millis, event: Event) -> Result<(), Rejection> {
        let State { core, actions, .. } = st;
        core.handle_into(now, event, actions)
    }

    /// Carries out the actions the core returned; returns the attempts to
    /// spawn and the outcomes to deliver once the lock is released.
    fn carry_out(&self, st: &mut State, now: Millis) -> Work {
        let mut jobs = Batch::Empty;
        let mut outcomes = Batch::Empty;
        let actions = std::mem::take(&mut st.actions);
        for action in actions.iter() {
            match action {
                Action::Start {
                    task,
                    attempt,
                    group,
                } => {
                    let pool = st.core.group_pool(*group).clone();
                    let labels = st.core.group_labels(*group).clone();
                    let Some(executor) = st.executors.get(&pool).cloned() else {
                        continue;
                    };
                    let entry = st
                        .entries
                        .get_mut(*task)
                        .expect("started task has an entry");
                    let (abort, registration) = AbortHandle::new_pair();
                    let run = entry.run.get_or_insert_with(Default::default);
                    run.abort = Some((*attempt, abort));
                    // Most tasks make one attempt: no room for four.
                    run.attempts.reserve_exact(1);
                    run.attempts.push(AttemptRecord {
                        attempt: *attempt,
                        group: labels.clone(),
                        worker: None,
                        started_at: now,
                        ended_at: None,
                        outcome: None,
                        error: None,
                    });
                    tracing::debug!(task_id = %task, attempt, pool = %pool, group = %labels, "attempt started");
                    jobs.push(Job {
                        executor,
                        ctx: TaskContext {
                            task_id: *task,
                            attempt: *attempt,
                            pool,
                            group: labels,
                            traceparent: run.traceparent.clone(),
                        },
                        payload: entry.payload.clone(),
                        registration,
                    });
                }
                Action::Revoke {
                    task,
                    attempt,
                    reason,
                    ..
                } => {
                    tracing::debug!(task_id = %task, attempt, ?reason, "attempt revoked");
                    if let Some(run) = st.entries.get_mut(*task).and_then(|e| e.run.as_mut()) {
                        if *reason == RevokeReason::Timeout {
                            run.timed_out = Some(*attempt);
                        }
                        if let Some((a, handle)) = &run.abort {
                            if a == attempt {
                                handle.abort();
                            }
                        }
                    }
                }
                Action::RetryAt { task, attempt, at } => {
                    tracing::debug!(task_id = %task, attempt, at = at.0, "retry scheduled");
                }
                Action::Finished {
                    task,
                    pool,
                    state,
                    attempts: _,
                    deadline_missed,
                } => {
                    let Some(entry) = st.entries.remove(*task) else {
                        continue;
                    };
                    let mut run = entry.run.map(|b| *b).unwrap_or_default();
                    // A running task cancelled: its attempt is being aborted
                    // and will not report back to this entry; close it here.
                    for record in run.attempts.iter_mut().filter(|a| a.outcome.is_none()) {
                        record.ended_at = Some(now);
                        record.outcome = Some(AttemptOutcome::Cancelled.as_str().into());
                    }
                    if let Some(key) = run.key.take() {
                        st.keys.remove(&key);
                    }
                    let outcome = Arc::new(Outcome {
                        id: *task,
                        pool: pool.clone(),
                        state: *state,
                        output: run.output.take(),
                        error: run.error.take(),
                        attempts: std::mem::take(&mut run.attempts),
                        deadline_missed: *deadline_missed,
                    });
                    tracing::debug!(task_id = %task, state = %state, "task finished");
                    if self.retain_finished > 0 {
                        st.finished.insert(*task, outcome.clone());
                        st.finished_order.push_back(*task);
                        while st.finished_order.len() > self.retain_finished {
                            if let Some(old) = st.finished_order.pop_front() {
                                st.finished.remove(&old);
                            }
                        }
                    }
                    outcomes.push((outcome, entry.waiter, run.more_waiters));
                }
            }
        }
        st.actions = actions;
        st.actions.clear();
        let next = st.core.next_wakeup();
        if next.is_some() && (st.armed.is_none() || next < st.armed) {
            st.armed = next;
            self.wake.notify_one();
        }
        Work { jobs, outcomes }
    }

    /// Delivers outcomes and spawns attempts, outside the lock.
    fn spawn_all(self: &Arc<Self>, work: Work) {
        work.outcomes.for_each(|(outcome, waiter, more)| {
            for tx in waiter.into_iter().chain(more) {
                let _ = tx.send(outcome.clone());
            }
        });
        work.jobs.for_each(|job| {
            let inner = self.clone();
            tokio::spawn(async move {
                let (task, attempt, launched) = launch(job);
                run_attempts(inner, task, attempt, launched).await;
            });
        });
    }

    /// Starts the attempts a submission started, polling each once here:
    /// an attempt that finishes at its first poll (most short executors)
    /// is recorded at once, with no tokio task and no hand-off to another
    /// thread; one that does not goes on in a tokio task of its own (which
    /// polls it again with its own waker). Attempts that the recorded ends
    /// started go to tokio tasks, so a submission does a bounded amount of
    /// other work.
    fn start_eagerly(self: &Arc<Self>, work: Work) {
        if !self.eager_start {
            return self.spawn_all(work);
        }
        let Work { jobs, outcomes } = work;
        self.spawn_all(Work {
            jobs: Batch::Empty,
            outcomes,
        });
        jobs.for_each(|job| {
            let (task, attempt, launched) = launch(job);
            let result = match launched {
                Launched::Done(result) => result,
                Launched::Running(mut future) => match (&mut future).now_or_never() {
                    Some(result) => ended(result),
                    None => {
                        tokio::spawn(run_attempts(
                            self.clone(),
                            task,
                            attempt,
                            Launched::Running(future),
                        ));
                        return;
                    }
                },
            };
            let (outcome, output, error) = result;
            let more = self.attempt_ended(task, attempt, outcome, output, error);
            self.spawn_all(more);
        });
    }

    /// Records an attempt's end; returns what to do once the lock is
    /// released.
    fn attempt_ended(
        &self,
        task: TaskId,
        attempt: u32,
        outcome: AttemptOutcome,
        output: Option<Bytes>,
        error: Option<String>,
    ) -> Work {
        let now = self.clock.now();
        {
            let mut st = self.lock();
            if let Some(run) = st.entries.get_mut(task).and_then(|e| e.run.as_mut()) {
                // As the core counts it: an attempt stopped by its timeout
                // is lost, not cancelled (SPEC §2 rule 8).
                let recorded =
                    if outcome != AttemptOutcome::Succeeded && run.timed_out == Some(attempt) {
                        AttemptOutcome::Lost
                    } else {
                        outcome
                    };
                if let Some(record) = run.attempts.iter_mut().rev().find(|a| a.attempt == attempt) {
                    record.ended_at = Some(now);
                    record.outcome = Some(recorded.as_str().into());
                    record.error = error.clone();
                }
                if output.is_some() {
                    run.output = output;
                }
                if error.is_some() {
                    run.error = error;
                }
                run.abort = None;
            }
            if let Err(e) = self.core_event(
                &mut st,
                now,
                Event::AttemptEnded {
                    task,
                    attempt,
                    outcome,
                },
            ) {
                tracing::warn!(task_id = %task, attempt, error = %e, "attempt outcome refused");
            }
            self.carry_out(&mut st, now)
        }
    }

    fn tick(self: &Arc<Self>) {
        let now = self.clock.now();
        let jobs = {
            let mut st = self.lock();
            st.armed = None;
            if let Err(e) = self.core_event(&mut st, now, Event::Tick) {
                tracing::error!(error = %e, "tick refused");
            }
            let jobs = self.carry_out(&mut st, now);
            st.armed = st.core.next_wakeup();
            jobs
        };
        self.spawn_all(jobs);
    }
}

/// A started attempt's future: the executor's, panics caught, abortable.
/// `Unpin`, so it can be polled once where it starts and moved on.
type AttemptFuture = Abortable<CatchUnwind<AssertUnwindSafe<BoxFuture>>>;

/// How an attempt ended: outcome, output, error.
type Ended = (AttemptOutcome, Option<Bytes>, Option<String>);

/// An attempt as it starts: already over (the executor panicked before it
/// returned a future, or finished at its first poll), or running.
enum Launched {
    Done(Ended),
    Running(AttemptFuture),
}

/// Calls the executor for a `Start`.
fn launch(job: Job) -> (TaskId, u32, Launched) {
    let Job {
        executor,
        ctx,
        payload,
        registration,
    } = job;
    let (task, attempt) = (ctx.task_id, ctx.attempt);
    // The call itself may panic too, not only the future it returns.
    let launched = match std::panic::catch_unwind(AssertUnwindSafe(|| executor(ctx, payload))) {
        Ok(future) => Launched::Running(Abortable::new(
            AssertUnwindSafe(future).catch_unwind(),
            registration,
        )),
        Err(panic) => Launched::Done(panicked(&*panic)),
    };
    (task, attempt, launched)
}

fn panicked(panic: &(dyn std::any::Any + Send)) -> Ended {
    (
        AttemptOutcome::Failed { retryable: true },
        None,
        Some(format!(
            "executor panicked: {}",
            crate::task::panic_message(panic)
        )),
    )
}

/// What an attempt's future came to.
fn ended(
    result: Result<std::thread::Result<Result<Bytes, TaskError>>, futures_util::future::Aborted>,
) -> Ended {
    match result {
        Ok(Ok(Ok(output))) => (AttemptOutcome::Succeeded, Some(output), None),
        Ok(Ok(Err(e))) => (
            AttemptOutcome::Failed {
                retryable: e.is_retryable(),
            },
            None,
            Some(e.to_string()),
        ),
        Ok(Err(panic)) => panicked(&*panic),
        Err(_aborted) => (AttemptOutcome::Cancelled, None, None),
    }
}

/// Runs an attempt, records its end, and goes on with an attempt that end
/// started (the slot it freed is usually the one the next task takes), so
/// that a busy pool runs many attempts per tokio task: no spawn per
/// attempt. Other attempts that end started get tasks of their own. Yields
/// to the runtime as tokio's cooperative budget asks, so a long run of
/// instant attempts never starves other tasks.
async fn run_attempts(inner: Arc<Inner>, mut task: TaskId, mut attempt: u32, mut now: Launched) {
    loop {
        let mut result = match now {
            Launched::Done(result) => result,
            Launched::Running(future) => ended(future.await),
        };
        // Attempts that end at once (a panic before the future) are
        // reported in turn, without awaiting.
        loop {
            let (outcome, output, error) = result;
            let Work { jobs, outcomes } =
                inner.attempt_ended(task, attempt, outcome, output, error);
            let (next, rest) = match jobs.split_first() {
                Some((next, rest)) => (Some(next), rest),
                None => (None, Batch::Empty),
            };
            inner.spawn_all(Work {
                jobs: rest,
                outcomes,
            });
            let Some(next) = next else { return };
            let launched;
            (task, attempt, launched) = launch(next);
            match launched {
                Launched::Done(r) => result = r,
                running => {
                    now = running;
                    break;
                }
            }
        }
        tokio::task::consume_budget().await;
    }
}

/// Sleeps until the core's next wakeup (or until woken because it moved
/// earlier), then ticks. Ends when the scheduler is dropped.
async fn timer_loop(inner: Weak<Inner>) {
    loop {
        let (next, clock_at) = {
            let Some(inner) = inner.upgrade() else { return };
            let mut st = inner.lock();
            let next = st.core.next_wakeup();
            st.armed = next;
            (next, next.map(|at| inner.clock.instant(at)))
        };
        let woken = {
            let Some(strong) = inner.upgrade() else {
                return;
            };
            let notified = async move {
                strong.wake.notified().await;
            };
            match clock_at {
                Some(at) => tokio::select! {
                    _ = tokio::time::sleep_until(at) => false,
                    _ = notified => true,
                },
                None => {
                    // Nothing scheduled: wake up now and then to notice a
                    // dropped scheduler.
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_secs(1)) => false,
                        _ = notified => true,
                    }
                }
            }
        };
        let Some(inner) = inner.upgrade() else { return };
        if !woken || next.is_some_and(|at| inner.clock.now() >= at) {
            inner.tick();
        }
    }
}

impl TaskState {
    /// CLI exit status for a finished task: 0 succeeded, 1 otherwise.
    pub fn exit_code(self) -> i32 {
        i32::from(self != TaskState::Succeeded)
    }
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.inner.lock();
        f.debug_struct("Scheduler")
            .field("live_tasks", &st.core.live_tasks())
            .field("executors", &st.executors.len())
            .finish()
    }
}

impl std::fmt::Debug for TaskHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskHandle").field("id", &self.id).finish()
    }
}
