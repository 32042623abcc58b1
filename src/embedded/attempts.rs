//! How the embedded scheduler runs attempts: an executor's call and
//! future with panics caught and made abortable ([`launch`]), what a
//! future came to ([`ended`]), the loop that runs attempt after attempt
//! on one tokio task ([`run_attempts`]), what an end leaves to do once the
//! lock is released ([`Work`]), and the timer loop that ticks the core at
//! its next wakeup ([`timer_loop`]).

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::{Abortable, CatchUnwind};
use futures_util::FutureExt;

use super::{BoxFuture, Done, Inner, Job, OutcomeTx};
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

    /// Takes every item, first to last.
    pub(super) fn for_each(&mut self, mut f: impl FnMut(T)) {
        if let Some(first) = self.first.take() {
            f(first);
        }
        self.rest.drain(..).for_each(f);
    }
}

/// What to do once the lock is released: attempts to spawn, outcomes to
/// hand to waiters (waking a waiter may take a while; not under the lock).
/// A loop that runs attempt after attempt keeps one and refills it.
#[derive(Default)]
pub(super) struct Work {
    pub(super) jobs: Batch<Job>,
    pub(super) outcomes: Batch<(Done, Option<OutcomeTx>, Vec<OutcomeTx>)>,
}

/// A started attempt's future: the executor's, panics caught, abortable.
/// `Unpin`, so it can be polled once where it starts and moved on.
pub(super) type AttemptFuture = Abortable<CatchUnwind<AssertUnwindSafe<BoxFuture>>>;

/// How an attempt ended: outcome, output, error.
pub(super) type Ended = (AttemptOutcome, Option<Bytes>, Option<String>);

/// An attempt as it starts: already over (the executor panicked before it
/// returned a future, or finished at its first poll), or running.
pub(super) enum Launched {
    Done(Ended),
    Running(AttemptFuture),
}

/// Calls the executor for a `Start`.
pub(super) fn launch(job: Job) -> (TaskId, u32, Launched) {
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
pub(super) fn ended(
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
pub(super) async fn run_attempts(
    inner: Arc<Inner>,
    mut task: TaskId,
    mut attempt: u32,
    mut now: Launched,
) {
    // Refilled by each end: no moves of what it holds between calls.
    let mut work = Work::default();
    loop {
        let mut result = match now {
            Launched::Done(result) => result,
            Launched::Running(future) => ended(future.await),
        };
        // Attempts that end at once (a panic before the future) are
        // reported in turn, without awaiting.
        loop {
            inner.attempt_ended_into(task, attempt, result, &mut work);
            let next = work.jobs.first.take();
            inner.deliver(&mut work);
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
