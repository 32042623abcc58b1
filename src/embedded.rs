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

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use rustc_hash::FxHashMap;
use tokio::sync::Notify;

use crate::core::{
    Action, Core, ErrorCode, Event, Labels, Millis, PoolConfig, PoolName, Rejection, Snapshot,
    TaskId, TaskState,
};
use crate::ledger::{Done, Ledger};
pub use crate::task::TaskContext;
use crate::task::{Outcome, Task, TaskError, TaskStatus};

mod api_impl;
mod attempts;
mod schedules;
mod waiter;

use attempts::{timer_loop, Ended, StopCell, Work};

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
    /// A schedule request was refused (bad spec, taken name, none by that
    /// name, the limit).
    #[error(transparent)]
    Schedule(#[from] crate::schedule::BookError),
}

impl Error {
    /// The stable code.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::Rejected(r) => r.code(),
            Error::NoExecutor(_) => ErrorCode::FAILED_PRECONDITION,
            Error::Closed => ErrorCode::UNAVAILABLE,
            Error::NotFound(_) => ErrorCode::NOT_FOUND,
            Error::Schedule(e) => e.code.clone(),
        }
    }
}

type BoxFuture = Pin<Box<dyn Future<Output = Result<Bytes, TaskError>> + Send>>;
type ExecutorFn = Arc<dyn Fn(TaskContext, Bytes) -> BoxFuture + Send + Sync>;

/// A waiter's end: the outcome goes over in its compact form, and the
/// waiter's thread builds the [`Outcome`] (allocating its attempt list
/// there, where it is freed).
use waiter::{HandleWaker, OutcomeRx, OutcomeTx};

/// What the embedded shell keeps beside the ledger's record of a live
/// task: the waker of its [`TaskHandle`], while one waits (see `waiter`).
type Waiter = Option<HandleWaker>;

/// Kept once a task runs: the running attempt's stop switch, and waiters
/// other than its handle.
#[derive(Default)]
struct RunExtra {
    abort: Option<(u32, Arc<StopCell>)>,
    more_waiters: Vec<OutcomeTx>,
    /// The W3C trace context given at submit.
    traceparent: Option<String>,
    /// Telemetry on: when it was submitted and why its waits began.
    trace: Option<Box<TraceNotes>>,
}

/// What a task's spans need beyond the ledger's record (telemetry on).
#[derive(Default)]
struct TraceNotes {
    submitted_at: Millis,
    waits: Vec<(u32, crate::core::WaitReason)>,
}

type Entry = crate::ledger::Entry<Waiter, RunExtra>;

struct State {
    core: Core,
    actions: Vec<Action>,
    ledger: Ledger<Waiter, RunExtra>,
    executors: FxHashMap<PoolName, ExecutorFn>,
    next_id: u64,
    /// The wakeup the timer task sleeps toward.
    armed: Option<Millis>,
    /// Live tasks fired by schedules, and where their ends go.
    scheduled: rustc_hash::FxHashSet<TaskId>,
    sched_ended: Option<schedules::EndedTx>,
    /// The stop switch of an attempt whose end was recorded, for the next
    /// start that has none at hand (a submission's): no allocation per
    /// eagerly started attempt.
    spare_stop: Option<Arc<StopCell>>,
    /// Outcomes of finished tasks whose [`TaskHandle`] has not taken them
    /// yet (see `waiter`); a handle dropped first removes its own.
    unclaimed: FxHashMap<TaskId, Done>,
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
    eager_start: bool,
    schedules: std::sync::OnceLock<Arc<schedules::Schedules>>,
    max_schedules: usize,
    /// Where finished tasks' spans go, and this scheduler's salt for
    /// their ids (`telemetry::trace`).
    telemetry: Option<(crate::telemetry::Telemetry, crate::telemetry::TraceSalt)>,
}

/// Telemetry on: notes why task `task` waits again (a retry's backoff, a
/// preemption).
fn note_wait(st: &mut State, task: TaskId) {
    let Some(view) = st.core.task(task) else {
        return;
    };
    let Some(wait) = view.reason.map(|r| (view.attempts + 1, r)) else {
        return;
    };
    if let Some(entry) = st.ledger.get_mut(task) {
        if let Some(notes) = entry.run_extra().trace.as_mut() {
            notes.waits.push(wait);
        }
    }
}

/// A job to spawn once the lock is released.
struct Job {
    /// `None`: the one the runner that takes the job called last.
    executor: Option<ExecutorFn>,
    ctx: TaskContext,
    payload: Bytes,
    stop: Arc<StopCell>,
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
    max_schedules: usize,
    telemetry: Option<crate::telemetry::Telemetry>,
}

impl Default for SchedulerBuilder {
    fn default() -> Self {
        SchedulerBuilder {
            max_payload_bytes: 1 << 20,
            retain_finished: 10_000,
            eager_start: true,
            pools: Vec::new(),
            max_schedules: crate::schedule::DEFAULT_MAX_SCHEDULES,
            telemetry: None,
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

    /// The most schedules (default 10,000); past it, creating one answers
    /// `RESOURCE_EXHAUSTED`.
    pub fn max_schedules(mut self, n: usize) -> Self {
        self.max_schedules = n;
        self
    }

    /// Exports each finished task's spans (`cronoq.task`, `cronoq.queued`,
    /// `cronoq.attempt`) through `telemetry`, and hands executors their
    /// attempt span's traceparent as `ctx.traceparent`: their own spans
    /// hang under it. `None` (the default): nothing is traced.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// // Off unless OTEL_EXPORTER_OTLP_ENDPOINT (or …) is set.
    /// let telemetry = cronoq::telemetry::Telemetry::from_env("my-app")?;
    /// let sched = cronoq::Scheduler::builder().telemetry(telemetry.clone()).build()?;
    /// // … and before the process ends, what is queued goes out:
    /// if let Some(t) = telemetry { t.shutdown(std::time::Duration::from_secs(5)).await }
    /// # Ok(()) }
    /// ```
    pub fn telemetry(mut self, telemetry: Option<crate::telemetry::Telemetry>) -> Self {
        self.telemetry = telemetry;
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
        let now = Millis::since_epoch(SystemTime::now()).0;
        let inner = Arc::new(Inner {
            state: Mutex::new(State {
                core: Core::new(),
                actions: Vec::new(),
                ledger: Ledger::new(self.retain_finished),
                executors: FxHashMap::default(),
                next_id: 1,
                armed: None,
                scheduled: Default::default(),
                sched_ended: None,
                spare_stop: None,
                unclaimed: FxHashMap::default(),
            }),
            wake: Notify::new(),
            clock: Clock {
                base: tokio::time::Instant::now(),
                base_unix: now,
            },
            max_payload_bytes: self.max_payload_bytes,
            eager_start: self.eager_start,
            schedules: Default::default(),
            max_schedules: self.max_schedules,
            // A scheduler's task ids start at 1 each time: a random salt
            // keeps the traces of one run apart from the last's.
            telemetry: self
                .telemetry
                .map(|t| (t, crate::telemetry::TraceSalt(rand::random()))),
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
        self.submit_with(task, self.inner.eager_start)
    }

    /// Submits, starting what it starts eagerly (polled once right here)
    /// only when `eager`; otherwise every start runs in a tokio task, so no
    /// executor code runs on the caller's stack (the schedule shell submits
    /// under its book's lock).
    pub(crate) fn submit_with(&self, task: Task, eager: bool) -> Result<TaskHandle, Error> {
        self.submit_inner(task, eager, true)
    }

    /// Submits without a handle: nobody waits on the task's outcome here
    /// (the API's submit answers with the id; the schedule shell hears ends
    /// on its own channel), so nothing is kept for a waiter.
    pub(crate) fn submit_id(&self, task: Task, eager: bool) -> Result<TaskId, Error> {
        Ok(self.submit_inner(task, eager, false)?.id)
    }

    fn submit_inner(&self, task: Task, eager: bool, handle: bool) -> Result<TaskHandle, Error> {
        let inner = &self.inner;
        let now = inner.clock.now();
        let submitted = {
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
            // Validated by the core at `Submitted`; a keyed resubmission
            // that finds its task never gets there, so is checked here.
            let spec = task.spec_in(id, inner.max_payload_bytes, pool.clone())?;
            if let Some(key) = task.key() {
                spec.validate()?;
                if let Some(existing) = st.ledger.by_key(key) {
                    // The same task (live, or finished and retained).
                    if !handle {
                        return Ok(TaskHandle::detached(existing));
                    }
                    let (tx, rx) = waiter::channel();
                    match st.ledger.get_mut(existing) {
                        Some(entry) => add_waiter(entry, tx),
                        None => {
                            if let Some(done) = st.ledger.outcome_done(existing) {
                                tx.send(done);
                            }
                        }
                    }
                    return Ok(TaskHandle {
                        id: existing,
                        way: Way::Rx(rx),
                    });
                }
            }
            inner.core_event(&mut st, now, Event::Submitted(spec))?;
            st.next_id += 1;
            let waiter = handle.then(HandleWaker::unpolled);
            st.ledger
                .accept(id, &pool, task.payload.clone(), task.key(), waiter, now);
            st.ledger.set_schedule(id, task.schedule.clone());
            if task.schedule.is_some() && st.sched_ended.is_some() {
                st.scheduled.insert(id);
            }
            if let Some(tp) = task.trace_context() {
                if let Some(entry) = st.ledger.get_mut(id) {
                    entry.run_extra().traceparent = Some(tp.to_string());
                }
            }
            if inner.telemetry.is_some() {
                let wait = st.core.task(id).and_then(|v| v.reason).map(|r| (1, r));
                if let Some(entry) = st.ledger.get_mut(id) {
                    entry.run_extra().trace = Some(Box::new(TraceNotes {
                        submitted_at: now,
                        waits: wait.into_iter().collect(),
                    }));
                }
            }
            // Polled here, the task's first attempt may finish it before
            // this call returns: then the handle gets the outcome itself,
            // and it never goes through the state's `unclaimed`.
            let eager = eager && inner.eager_start;
            let mut work = Work {
                catch: (eager && handle).then_some(id),
                ..Work::default()
            };
            inner.carry_out_into(&mut st, now, &mut work);
            let caught = work.caught.take();
            if caught.is_some() || !work.jobs.iter().any(|job| job.ctx.task_id == id) {
                work.catch = None;
            }
            (id, caught, work, eager)
        };
        let (id, caught, work, eager) = submitted;
        let caught = if eager {
            let started = inner.start_eagerly(work);
            caught.or(started)
        } else {
            inner.spawn_all(work);
            caught
        };
        let way = match caught {
            Some(done) => Way::Rx(waiter::ready(done)),
            None if handle => Way::Claim(Arc::downgrade(inner)),
            None => Way::Taken,
        };
        Ok(TaskHandle { id, way })
    }

    /// Cancels a task: a waiting one ends at once, a running one is aborted.
    pub fn cancel(&self, id: TaskId) -> Result<(), Error> {
        let now = self.inner.clock.now();
        let jobs = {
            let mut st = self.inner.lock();
            if !st.core_knows(id) && st.ledger.is_finished(id) {
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
        st.ledger.recent(&st.core, limit)
    }

    /// Task counters and latency histograms per pool, since the scheduler
    /// started (what `/metrics` shows beside the snapshot).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let s = cronoq::Scheduler::new();
    /// s.set_capacity("p", 1).unwrap();
    /// s.executor("p", |_ctx, payload: bytes::Bytes| async move { Ok(payload) }).unwrap();
    /// s.submit(cronoq::Task::new("x").pool("p")).await.unwrap().wait().await.unwrap();
    /// let p = &s.metrics().pools[0];
    /// assert_eq!((p.submitted, p.started, p.succeeded), (1, 1, 1));
    /// # }
    /// ```
    pub fn metrics(&self) -> crate::metrics::MetricsSnapshot {
        let mut m = self.inner.lock().ledger.metrics();
        m.schedules = self.schedule_metrics();
        m
    }

    /// Waits for a task by id (live or recently finished).
    pub async fn wait(&self, id: TaskId) -> Result<Outcome, Error> {
        let rx = {
            let mut st = self.inner.lock();
            if let Some(done) = st.ledger.outcome(id) {
                return Ok(done);
            }
            let entry = st.ledger.get_mut(id).ok_or(Error::NotFound(id))?;
            let (tx, rx) = waiter::channel();
            add_waiter(entry, tx);
            rx
        };
        rx.await.map(Done::into_outcome).map_err(|_| Error::Closed)
    }
}

fn add_waiter(entry: &mut Entry, tx: OutcomeTx) {
    entry.run_extra().more_waiters.push(tx);
}

impl State {
    fn core_knows(&self, id: TaskId) -> bool {
        self.core.task(id).is_some()
    }

    fn status(&self, id: TaskId) -> Option<TaskStatus> {
        self.ledger.status(&self.core, id)
    }
}

/// A submitted task: its id, and a way to wait for its outcome.
pub struct TaskHandle {
    id: TaskId,
    way: Way,
}

/// How a handle gets its task's outcome.
enum Way {
    /// From a slot (a keyed resubmission's), or the outcome itself.
    Rx(OutcomeRx),
    /// Taken from the scheduler's state once the task finishes; its waker
    /// waits in the task's entry meanwhile (see `waiter`). Weak: a handle
    /// never keeps a dropped scheduler alive.
    Claim(std::sync::Weak<Inner>),
    /// Nothing more to take.
    Taken,
}

impl TaskHandle {
    /// A handle that waits for nothing (`submit_id`).
    fn detached(id: TaskId) -> TaskHandle {
        TaskHandle {
            id,
            way: Way::Taken,
        }
    }

    /// The task's id.
    pub fn id(&self) -> TaskId {
        self.id
    }

    /// Waits until the task finishes: succeeded, failed, cancelled or missed.
    ///
    /// Every waiter of a task (a keyed resubmission gets one too) hears its
    /// outcome; the only way to hear nothing is the scheduler being dropped
    /// first: [`Error::Closed`]. The handle holds only a weak reference to
    /// the scheduler, so it never keeps a dropped one alive.
    pub async fn wait(mut self) -> Result<Outcome, Error> {
        std::future::poll_fn(|cx| self.poll_done(cx))
            .await
            .map(Done::into_outcome)
            .map_err(|_| Error::Closed)
    }

    fn poll_done(&mut self, cx: &mut Context<'_>) -> Poll<Result<Done, waiter::Closed>> {
        let inner = match &mut self.way {
            Way::Rx(rx) => return Pin::new(rx).poll(cx),
            Way::Taken => return Poll::Ready(Err(waiter::Closed)),
            Way::Claim(inner) => inner.upgrade(),
        };
        let polled = match &inner {
            Some(inner) => {
                let mut st = inner.lock();
                match st.unclaimed.remove(&self.id) {
                    Some(done) => Poll::Ready(Ok(done)),
                    None => match st.ledger.get_mut(self.id) {
                        Some(entry) => {
                            entry
                                .extra
                                .get_or_insert_with(HandleWaker::unpolled)
                                .register(cx.waker());
                            Poll::Pending
                        }
                        // Not reached: a task with a handle leaves its
                        // outcome in `unclaimed`.
                        None => Poll::Ready(Err(waiter::Closed)),
                    },
                }
            }
            // The scheduler went away (its state's drop woke us).
            None => Poll::Ready(Err(waiter::Closed)),
        };
        if polled.is_ready() {
            self.way = Way::Taken;
        }
        polled
    }
}

impl Drop for TaskHandle {
    /// A handle dropped before its task's outcome: nothing is kept for it.
    fn drop(&mut self) {
        let Way::Claim(inner) = &self.way else { return };
        let Some(inner) = inner.upgrade() else { return };
        let unclaimed = {
            let mut st = inner.lock();
            let done = st.unclaimed.remove(&self.id);
            if done.is_none() {
                if let Some(entry) = st.ledger.get_mut(self.id) {
                    entry.extra = None;
                }
            }
            done
        };
        // Freed outside the lock.
        drop(unclaimed);
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
        let mut work = Work::default();
        self.carry_out_into(st, now, &mut work);
        work
    }

    /// [`Inner::carry_out`] into `work`.
    fn carry_out_into(&self, st: &mut State, now: Millis, work: &mut Work) {
        let Work {
            jobs,
            outcomes,
            wake,
            reuse,
            catch,
            caught,
        } = work;
        let mut actions = std::mem::take(&mut st.actions);
        for action in actions.drain(..) {
            match action {
                Action::Start {
                    task,
                    attempt,
                    group,
                } => {
                    let pool = st.core.group_pool(group).clone();
                    let labels = st.core.group_labels(group).clone();
                    let Some(found) = st.executors.get(&pool) else {
                        continue;
                    };
                    // No clone (and drop after the call) of the executor a
                    // runner already holds: its count is shared by threads.
                    let executor = match &reuse.executor {
                        Some(held) if Arc::ptr_eq(held, found) => None,
                        _ => Some(found.clone()),
                    };
                    let entry = st
                        .ledger
                        .started(task, attempt, labels.clone(), None, None, now)
                        .expect("started task has an entry");
                    let spare = match reuse.stop {
                        Some(_) => &mut reuse.stop,
                        None => &mut st.spare_stop,
                    };
                    let stop = StopCell::reuse(spare);
                    let run = entry.run_extra();
                    run.abort = Some((attempt, stop.clone()));
                    // Telemetry on: the attempt span's own, so the
                    // executor's spans hang under it.
                    let traceparent = match &self.telemetry {
                        Some((_, salt)) => crate::telemetry::TaskTraceIds::of(
                            run.traceparent.as_deref(),
                            *salt,
                            task,
                        )
                        .map(|ids| ids.attempt_traceparent(attempt))
                        .or_else(|| run.traceparent.clone()),
                        None => run.traceparent.clone(),
                    };
                    let schedule = entry.schedule().cloned();
                    tracing::debug!(task_id = %task, attempt, pool = %pool, group = %labels, "attempt started");
                    jobs.push(Job {
                        executor,
                        ctx: TaskContext {
                            task_id: task,
                            attempt,
                            pool,
                            group: labels,
                            traceparent,
                            schedule,
                        },
                        payload: entry.payload.clone(),
                        stop,
                    });
                }
                Action::Revoke {
                    task,
                    attempt,
                    reason,
                    ..
                } => {
                    tracing::debug!(task_id = %task, attempt, ?reason, "attempt revoked");
                    st.ledger.revoked(task, attempt, reason);
                    let run = st.ledger.get_mut(task).map(|e| e.run_extra());
                    if let Some((a, handle)) = run.and_then(|r| r.abort.as_ref()) {
                        if *a == attempt {
                            handle.stop();
                        }
                    }
                }
                Action::RetryAt { task, attempt, at } => {
                    tracing::debug!(task_id = %task, attempt, at = at.0, "retry scheduled");
                    if self.telemetry.is_some() {
                        note_wait(st, task);
                    }
                }
                Action::Preempted { task, attempt } => {
                    tracing::debug!(task_id = %task, attempt, "attempt preempted");
                    if self.telemetry.is_some() {
                        note_wait(st, task);
                    }
                }
                Action::Finished {
                    task,
                    pool,
                    state,
                    attempts: _,
                    deadline_missed,
                    reason: _,
                } => {
                    // A running task cancelled: its attempt is being aborted
                    // and will not report back; the ledger closes it.
                    let Some(done) = st
                        .ledger
                        .finish_done(task, pool, state, deadline_missed, now)
                    else {
                        continue;
                    };
                    tracing::debug!(task_id = %task, state = %state, "task finished");
                    if let Some((telemetry, salt)) = &self.telemetry {
                        let run = &done.run_extra;
                        if let Some(ids) = crate::telemetry::TaskTraceIds::of(
                            run.traceparent.as_deref(),
                            *salt,
                            task,
                        ) {
                            let outcome = done.outcome.to_outcome();
                            let notes = run.trace.as_deref();
                            let first = outcome.attempts.first().map_or(now, |a| a.started_at);
                            telemetry.task(crate::telemetry::TaskTrace {
                                ids,
                                pool: outcome.pool.clone(),
                                submitted_at: notes.map_or(first, |n| n.submitted_at.min(first)),
                                finished_at: now,
                                state,
                                error: outcome.error.clone(),
                                waits: notes.map(|n| n.waits.clone()).unwrap_or_default(),
                                schedule: outcome.schedule.as_ref().map(|(n, _)| n.clone()),
                                attempts: outcome.attempts,
                            });
                        }
                    }
                    if !st.scheduled.is_empty() && st.scheduled.remove(&task) {
                        if let Some(tx) = &st.sched_ended {
                            let _ = tx.send((task, state));
                        }
                    }
                    let more = done.run_extra.more_waiters;
                    let Some(handle) = done.extra else {
                        // Freed outside the lock, with copies for `more`.
                        outcomes.push((done.outcome, more));
                        continue;
                    };
                    if !more.is_empty() {
                        outcomes.push((done.outcome.copy(), more));
                    }
                    if *catch == Some(task) {
                        // The submitting call's own attempt finished it.
                        *caught = Some(Box::new(done.outcome));
                        *catch = None;
                    } else {
                        st.unclaimed.insert(task, done.outcome);
                        wake.push(handle);
                    }
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
    }

    /// Records an attempt's end; what to do once the lock is released
    /// goes into `work`.
    fn attempt_ended_into(&self, task: TaskId, attempt: u32, ended: Ended, work: &mut Work) {
        let (outcome, output, error) = ended;
        let now = self.clock.now();
        {
            let mut st = self.lock();
            // As the core counts it: an attempt stopped by its timeout is
            // lost, not cancelled (SPEC §2 rule 8); the ledger records so.
            let outcome = st.ledger.ended(task, attempt, outcome, output, error, now);
            if let Some(entry) = st.ledger.get_mut(task) {
                entry.run_extra().abort = None;
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
            self.carry_out_into(&mut st, now, work);
            // The submitted task's first attempt ended without finishing
            // it (a retry): its handle takes the outcome from the state.
            work.catch = None;
            if work.jobs.first.is_none() && st.spare_stop.is_none() {
                // The ended attempt's switch, held by the runner alone and
                // not taken by a start of this end (that runner goes on with
                // it): kept for a submission's start.
                st.spare_stop = work.reuse.stop.take();
            }
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

#[cfg(test)]
mod tests;
