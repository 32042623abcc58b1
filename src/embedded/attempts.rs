//! How the embedded scheduler runs attempts: an executor's call and
//! future with panics caught and made stoppable ([`launch`], [`StopCell`]),
//! what a future came to ([`ended`]), the loop that runs attempt after
//! attempt on one tokio task ([`run_attempts`]), what an end leaves to do
//! once the lock is released ([`Work`]) and doing it (delivering outcomes,
//! spawning or eagerly polling attempts), and the timer loop that ticks the
//! core at its next wakeup ([`timer_loop`]).

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::CatchUnwind;
use futures_util::task::AtomicWaker;
use futures_util::FutureExt;

use super::waiter::HandleWaker;
use super::{BoxFuture, Done, ExecutorFn, Inner, Job, OutcomeTx};
use crate::core::{AttemptOutcome, TaskId};
use crate::task::TaskError;

/// Zero, one or more items without allocating for zero or one, filled in
/// place (each item is written once and moved out once).
pub(super) struct Batch<T> {
    pub(super) first: Option<T>,
    rest: Vec<T>,
}

impl<T> Default for Batch<T> {
    fn default() -> Self {
        Batch {
            first: None,
            rest: Vec::new(),
        }
    }
}

impl<T> Batch<T> {
    pub(super) fn push(&mut self, item: T) {
        if self.first.is_none() {
            self.first = Some(item);
        } else {
            self.rest.push(item);
        }
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &T> {
        self.first.iter().chain(&self.rest)
    }

    /// Takes every item, first to last.
    pub(super) fn for_each(&mut self, mut f: impl FnMut(T)) {
        if let Some(first) = self.first.take() {
            f(first);
        }
        if !self.rest.is_empty() {
            self.rest.drain(..).for_each(f);
        }
    }
}

/// What to do once the lock is released: attempts to spawn, outcomes to
/// send to waiters' slots, handles to wake (waking may take a while; not
/// under the lock). A loop that runs attempt after attempt keeps one and
/// refills it.
#[derive(Default)]
pub(super) struct Work {
    pub(super) jobs: Batch<Job>,
    /// Each with the slots to send it to (none: only freed here).
    pub(super) outcomes: Batch<(Done, Vec<OutcomeTx>)>,
    /// Handles whose outcome is in the state's `unclaimed` (woken when
    /// dropped).
    pub(super) wake: Batch<HandleWaker>,
    pub(super) reuse: Reuse,
    /// The task whose submitting call does this work and polls its first
    /// attempt: if that attempt finishes it, its outcome goes to `caught`
    /// (straight into the handle) instead of the state's `unclaimed`.
    pub(super) catch: Option<TaskId>,
    /// Boxed: the handle keeps it so, and a `Work` moved between calls
    /// stays small.
    pub(super) caught: Option<Box<Done>>,
}

/// What a runner keeps from one attempt for the next, so that a busy slot
/// allocates nothing and touches no count shared with other threads per
/// attempt: the executor it called last, and its last attempt's stop
/// switch (taken again once nothing else holds it).
#[derive(Default)]
pub(super) struct Reuse {
    pub(super) executor: Option<ExecutorFn>,
    pub(super) stop: Option<Arc<StopCell>>,
}

/// A running attempt's stop switch (a revoke: cancel or attempt timeout):
/// set under the lock, read by the attempt's future at each poll, which
/// then ends as cancelled.
#[derive(Default)]
pub(crate) struct StopCell {
    stopped: AtomicBool,
    waker: AtomicWaker,
}

impl StopCell {
    /// `spare` made ready for a new attempt if nothing else holds it (the
    /// ledger let go of it when the attempt's end was recorded), a new
    /// switch otherwise.
    pub(super) fn reuse(spare: &mut Option<Arc<StopCell>>) -> Arc<StopCell> {
        if let Some(mut cell) = spare.take() {
            if let Some(only) = Arc::get_mut(&mut cell) {
                *only = StopCell::default();
                return cell;
            }
        }
        Arc::new(StopCell::default())
    }

    /// Stops the attempt at its next poll.
    pub(super) fn stop(&self) {
        self.stopped.store(true, Ordering::Relaxed);
        self.waker.wake();
    }

    fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::Relaxed)
    }
}

/// The attempt was stopped.
#[derive(Debug)]
pub(super) struct Stopped;

/// A started attempt's future: the executor's, panics caught, stoppable.
/// `Unpin`, so it can be polled once where it starts and moved on.
pub(super) struct AttemptFuture {
    future: CatchUnwind<AssertUnwindSafe<BoxFuture>>,
    stop: Arc<StopCell>,
}

/// What an attempt's future comes to.
type Polled = Result<std::thread::Result<Result<Bytes, TaskError>>, Stopped>;

impl Future for AttemptFuture {
    type Output = Polled;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Polled> {
        let this = self.get_mut();
        if this.stop.is_stopped() {
            return Poll::Ready(Err(Stopped));
        }
        if let Poll::Ready(out) = this.future.poll_unpin(cx) {
            return Poll::Ready(Ok(out));
        }
        this.stop.waker.register(cx.waker());
        // A stop between the first check and the registration.
        if this.stop.is_stopped() {
            return Poll::Ready(Err(Stopped));
        }
        Poll::Pending
    }
}

impl AttemptFuture {
    /// Polls to the end; the stop switch goes back to `reuse`.
    async fn finish(mut self, reuse: &mut Reuse) -> Ended {
        let out = (&mut self).await;
        reuse.stop = Some(self.stop);
        ended(out)
    }
}

/// How an attempt ended: outcome, output, error.
pub(super) type Ended = (AttemptOutcome, Option<Bytes>, Option<String>);

/// An attempt as it starts: already over (the executor panicked before it
/// returned a future, or finished at its first poll), or running.
pub(super) enum Launched {
    Done(Ended),
    Running(AttemptFuture),
}

/// Calls the executor for a `Start` (the one in `reuse` when the job
/// names none).
pub(super) fn launch(job: Job, reuse: &mut Reuse) -> (TaskId, u32, Launched) {
    let Job {
        executor,
        ctx,
        payload,
        stop,
    } = job;
    if executor.is_some() {
        reuse.executor = executor;
    }
    let executor = reuse
        .executor
        .as_ref()
        .expect("a job without its executor goes to the runner that holds it");
    let (task, attempt) = (ctx.task_id, ctx.attempt);
    // The call itself may panic too, not only the future it returns.
    let launched = match std::panic::catch_unwind(AssertUnwindSafe(|| executor(ctx, payload))) {
        Ok(future) => Launched::Running(AttemptFuture {
            future: AssertUnwindSafe(future).catch_unwind(),
            stop,
        }),
        Err(panic) => {
            reuse.stop = Some(stop);
            Launched::Done(panicked(&*panic))
        }
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
pub(super) fn ended(result: Polled) -> Ended {
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
        Err(Stopped) => (AttemptOutcome::Cancelled, None, None),
    }
}

/// Runs an attempt, records its end, and goes on with an attempt that end
/// started (the slot it freed is usually the one the next task takes), so
/// that a busy pool runs many attempts per tokio task: no spawn per
/// attempt. Other attempts that end started get tasks of their own. Yields
/// to the runtime as tokio's cooperative budget asks, so a long run of
/// instant attempts never starves other tasks.
pub(super) async fn run_attempts(
    inner: Arc<Inner>,
    mut task: TaskId,
    mut attempt: u32,
    mut now: Launched,
    reuse: Reuse,
) {
    // Refilled by each end: no moves of what it holds between calls.
    let mut work = Work {
        reuse,
        ..Work::default()
    };
    loop {
        let mut result = match now {
            Launched::Done(result) => result,
            Launched::Running(future) => future.finish(&mut work.reuse).await,
        };
        // Attempts that end at once (a panic before the future) are
        // reported in turn, without awaiting.
        loop {
            inner.attempt_ended_into(task, attempt, result, &mut work);
            let next = work.jobs.first.take();
            inner.deliver(&mut work);
            let Some(next) = next else { return };
            let launched;
            (task, attempt, launched) = launch(next, &mut work.reuse);
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

impl Inner {
    /// Delivers outcomes and spawns attempts, outside the lock.
    pub(super) fn spawn_all(self: &Arc<Self>, mut work: Work) {
        self.deliver(&mut work);
    }

    /// [`Inner::spawn_all`], leaving `work` empty for reuse.
    pub(super) fn deliver(self: &Arc<Self>, work: &mut Work) {
        work.outcomes.for_each(|(outcome, mut slots)| {
            // Copies for all slots but the last, which gets it.
            if let Some(last) = slots.pop() {
                for tx in slots {
                    tx.send(outcome.copy());
                }
                last.send(outcome);
            }
        });
        work.wake.for_each(drop);
        let held = &work.reuse.executor;
        work.jobs.for_each(|mut job| {
            if job.executor.is_none() {
                job.executor = held.clone();
            }
            let inner = self.clone();
            tokio::spawn(async move {
                let mut reuse = Reuse::default();
                let (task, attempt, launched) = launch(job, &mut reuse);
                run_attempts(inner, task, attempt, launched, reuse).await;
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
    ///
    /// Returns the outcome of `work.catch` (the submitted task, whose
    /// attempt is among the jobs) when its first attempt finished it;
    /// otherwise its handle takes it from the state later.
    pub(super) fn start_eagerly(self: &Arc<Self>, mut work: Work) -> Option<Box<Done>> {
        let catch = work.catch.take();
        let mut caught = None;
        let mut jobs = std::mem::take(&mut work.jobs);
        let mut reuse = std::mem::take(&mut work.reuse);
        self.deliver(&mut work);
        jobs.for_each(|job| {
            let (task, attempt, launched) = launch(job, &mut reuse);
            let ours = catch == Some(task);
            let result = match launched {
                Launched::Done(result) => result,
                Launched::Running(mut future) => match (&mut future).now_or_never() {
                    Some(result) => {
                        reuse.stop = Some(future.stop);
                        ended(result)
                    }
                    None => {
                        // Goes on on another thread: the handle takes the
                        // outcome from the state.
                        let runner = Reuse {
                            executor: reuse.executor.clone(),
                            stop: None,
                        };
                        let running = Launched::Running(future);
                        tokio::spawn(run_attempts(self.clone(), task, attempt, running, runner));
                        return;
                    }
                },
            };
            let mut more = Work {
                reuse: std::mem::take(&mut reuse),
                catch: ours.then_some(task),
                ..Work::default()
            };
            self.attempt_ended_into(task, attempt, result, &mut more);
            if ours {
                caught = more.caught.take();
            }
            self.deliver(&mut more);
            reuse = more.reuse;
        });
        caught
    }
}

/// Sleeps until the core's next wakeup (or until woken because it moved
/// earlier), then ticks. Ends when the scheduler is dropped.
pub(super) async fn timer_loop(inner: Weak<Inner>) {
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
