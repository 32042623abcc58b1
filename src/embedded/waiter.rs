//! A waiter's slot: where the runner that finishes a task leaves its
//! outcome for the [`TaskHandle`](super::TaskHandle) (or
//! [`Scheduler::wait`](super::Scheduler::wait)) waiting on it — a one-shot
//! channel like tokio's, with one addition: [`OutcomeTx::prefetch`].
//!
//! Why not tokio's oneshot: when tasks queue, a slot is allocated at submit
//! and filled when the task finishes, often a million tasks later, so the
//! send misses the cache on every line of it (a fifth of a runner's time in
//! the queued bench). Here the runner that starts a task's attempt asks for
//! the slot's lines then, under the lock but without waiting for them; by
//! the time the attempt ends and its outcome is sent, they are in cache.
//!
//! Most short tasks need no slot at all: with eager start, `submit` polls
//! the task's first attempt itself, and when that finishes the task the
//! handle is given the outcome ([`ready`]). Until then the task's first
//! waiter is a placeholder ([`OutcomeTx::SUBMITTER`]); a submission that
//! leaves the attempt running (or waiting, or retrying) puts a slot in its
//! place before it returns. A slot costs an allocation that lives until
//! the handle is awaited, and atomic operations on both sides; at a
//! million handles held, the fresh pages it took were a tenth of the
//! eager bench's time.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use super::Done;

/// A new slot: its sending end (kept with the task) and its receiving end
/// (the waiter's).
pub(super) fn channel() -> (OutcomeTx, OutcomeRx) {
    let slot = Arc::new(Slot(Mutex::new(State::Empty)));
    (
        OutcomeTx {
            slot: Some(slot.clone()),
        },
        OutcomeRx(Rx::Slot(slot)),
    )
}

/// A receiving end that has its outcome already: no slot, nothing shared.
pub(super) fn ready(done: Done) -> OutcomeRx {
    OutcomeRx(Rx::Ready(Some(Box::new(done))))
}

struct Slot(Mutex<State>);

enum State {
    Empty,
    /// The receiver waits: wake it when the outcome comes.
    Waiting(Waker),
    Sent(Done),
    /// The outcome was taken.
    Taken,
    /// The sender went away without an outcome (the scheduler was dropped).
    Closed,
}

impl Slot {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics while holding it; keep going with the data anyway.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Puts `next` in the slot; wakes a waiting receiver (outside the lock).
    fn set(&self, next: State) {
        let before = std::mem::replace(&mut *self.lock(), next);
        if let State::Waiting(waker) = before {
            waker.wake();
        }
    }
}

/// The sending end: kept with a live task, consumed by [`OutcomeTx::send`].
/// Dropped unsent (the scheduler went away), its receiver hears `Closed`.
pub(super) struct OutcomeTx {
    /// `None` once sent, and in [`OutcomeTx::SUBMITTER`] (so that a
    /// ledger entry keeps 8 bytes for its first waiter).
    slot: Option<Arc<Slot>>,
}

impl OutcomeTx {
    /// No slot yet: the submitting call, which polls the task's first
    /// attempt itself, takes the outcome if that attempt finishes the task,
    /// or puts a slot in its place before it returns
    /// (`Scheduler::submit_with`). Sending to it does nothing.
    pub(super) const SUBMITTER: OutcomeTx = OutcomeTx { slot: None };

    /// Leaves the outcome for the receiver (kept if it is gone: freed with
    /// the slot).
    pub(super) fn send(mut self, done: Done) {
        if let Some(slot) = self.slot.take() {
            slot.set(State::Sent(done));
        }
    }

    /// Whether this is [`OutcomeTx::SUBMITTER`], not a slot.
    pub(super) fn is_submitter(&self) -> bool {
        self.slot.is_none()
    }

    /// Asks the CPU for the slot's memory without waiting for it (a hint:
    /// nothing changes, nothing can fault), so that a send a while later
    /// finds it in cache.
    pub(super) fn prefetch(&self) {
        if let Some(slot) = &self.slot {
            // The slot and the counts before it, wherever the allocation
            // falls across cache lines.
            let counts = 2 * std::mem::size_of::<usize>();
            let size = counts + std::mem::size_of::<Slot>();
            let start = Arc::as_ptr(slot).cast::<u8>().wrapping_sub(counts);
            let mut at = 0;
            while at < size {
                prefetch_line(start.wrapping_add(at));
                at += 64;
            }
            prefetch_line(start.wrapping_add(size - 1));
        }
    }
}

impl Drop for OutcomeTx {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            slot.set(State::Closed);
        }
    }
}

/// The sender went away without an outcome.
#[derive(Debug)]
pub(super) struct Closed;

/// The receiving end: a future of the outcome.
pub(super) struct OutcomeRx(Rx);

enum Rx {
    Slot(Arc<Slot>),
    /// The outcome, there from the start ([`ready`]); `None` once taken.
    Ready(Option<Box<Done>>),
}

impl Future for OutcomeRx {
    type Output = Result<Done, Closed>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<Done, Closed>> {
        let slot = match &mut self.get_mut().0 {
            Rx::Slot(slot) => slot,
            Rx::Ready(done) => return Poll::Ready(done.take().map(|d| *d).ok_or(Closed)),
        };
        let mut state = slot.lock();
        match std::mem::replace(&mut *state, State::Taken) {
            State::Sent(done) => Poll::Ready(Ok(done)),
            State::Closed | State::Taken => {
                *state = State::Closed;
                Poll::Ready(Err(Closed))
            }
            State::Waiting(waker) if waker.will_wake(cx.waker()) => {
                *state = State::Waiting(waker);
                Poll::Pending
            }
            State::Empty | State::Waiting(_) => {
                *state = State::Waiting(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

/// Loads the cache line at `at` without waiting for it.
#[inline]
fn prefetch_line(at: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is only a hint to the cache: it reads nothing the
    // program sees and never faults, whatever the address; SSE, which it
    // needs, is part of every x86_64 target.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(at.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{PoolName, TaskId, TaskState};
    use crate::task::Outcome;
    use futures_util::FutureExt;

    fn done(id: u64) -> Done {
        let outcome = Outcome {
            id: TaskId(id),
            pool: PoolName::new("p").expect("valid pool"),
            state: TaskState::Succeeded,
            output: None,
            error: None,
            attempts: Vec::new(),
            deadline_missed: false,
            schedule: None,
        };
        // A refused submission's outcome, as the ledger retains it.
        let mut ledger = crate::ledger::Ledger::<(), ()>::new(1);
        ledger.record_outcome(&outcome, None);
        ledger.outcome_done(TaskId(id)).expect("retained")
    }

    #[test]
    fn an_outcome_sent_first_is_there_at_the_first_poll() {
        let (tx, rx) = channel();
        tx.prefetch();
        tx.send(done(1));
        let got = rx.now_or_never().expect("ready").expect("sent");
        assert_eq!(got.into_outcome().id, TaskId(1));
    }

    #[tokio::test]
    async fn a_waiting_receiver_is_woken_by_the_send() {
        let (tx, rx) = channel();
        let waiter = tokio::spawn(rx);
        tokio::task::yield_now().await;
        tx.send(done(2));
        let got = waiter.await.expect("joined").expect("sent");
        assert_eq!(got.into_outcome().id, TaskId(2));
    }

    #[tokio::test]
    async fn a_sender_dropped_unsent_closes_the_slot() {
        let (tx, rx) = channel();
        let waiter = tokio::spawn(rx);
        tokio::task::yield_now().await;
        drop(tx);
        assert!(waiter.await.expect("joined").is_err());
        let (tx, rx) = channel();
        drop(tx);
        assert!(rx.now_or_never().expect("ready").is_err());
    }

    #[test]
    fn a_ready_receiver_has_its_outcome_at_the_first_poll_and_only_once() {
        let mut rx = ready(done(4));
        let got = (&mut rx).now_or_never().expect("ready").expect("there");
        assert_eq!(got.into_outcome().id, TaskId(4));
        assert!((&mut rx).now_or_never().expect("ready").is_err());
    }

    #[test]
    fn the_submitters_placeholder_is_no_slot_and_sending_to_it_does_nothing() {
        let tx = OutcomeTx::SUBMITTER;
        assert!(tx.is_submitter());
        tx.prefetch();
        tx.send(done(5));
        let (tx, _rx) = channel();
        assert!(!tx.is_submitter());
    }

    #[test]
    fn a_send_to_a_receiver_gone_is_dropped_quietly() {
        let (tx, rx) = channel();
        drop(rx);
        tx.send(done(3));
    }
}
