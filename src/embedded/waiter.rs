//! How a waiter hears a task's outcome.
//!
//! A [`TaskHandle`](super::TaskHandle) needs nothing of its own while its
//! task waits: its task's ledger entry keeps the handle's waker
//! ([`HandleWaker`], 16 bytes inline), and the outcome, when the task
//! finishes, is left in the scheduler's state for the handle to take
//! (`State::unclaimed`). A million waiting tasks with their handles held
//! cost a million entries and nothing beside them; a slot per handle
//! (allocated at submit, holding a finished outcome inline) was 120 bytes
//! more per waiting task. Most short tasks do not even get that far: with
//! eager start, `submit` polls the task's first attempt itself, and when
//! that finishes the task the handle is given the outcome ([`ready`]).
//!
//! Every other waiter (a keyed resubmission, [`Scheduler::wait`]) gets a
//! slot: a one-shot channel like tokio's ([`channel`]), rare enough that
//! its allocation does not matter.
//!
//! [`Scheduler::wait`]: super::Scheduler::wait

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use futures_util::task::noop_waker;

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
pub(super) fn ready(done: Box<Done>) -> OutcomeRx {
    OutcomeRx(Rx::Ready(Some(done)))
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
    /// `None` once sent.
    slot: Option<Arc<Slot>>,
}

impl OutcomeTx {
    /// Leaves the outcome for the receiver (kept if it is gone: freed with
    /// the slot).
    pub(super) fn send(mut self, done: Done) {
        if let Some(slot) = self.slot.take() {
            slot.set(State::Sent(done));
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

/// A task handle's waker, kept in its task's ledger entry while the task
/// lives. Dropped, it wakes the handle: when the task finishes (its
/// outcome is then in the scheduler's state) and when the scheduler goes
/// away with the task still live (the handle then finds neither and hears
/// `Closed`), so a handle never waits for something that cannot come.
pub(super) struct HandleWaker(Waker);

impl HandleWaker {
    /// A handle that has not been polled yet.
    pub(super) fn unpolled() -> HandleWaker {
        HandleWaker(noop_waker())
    }

    /// Wakes `waker` instead from now on (no clone when it is the same).
    pub(super) fn register(&mut self, waker: &Waker) {
        if !self.0.will_wake(waker) {
            // The replaced waker is dropped, not woken.
            self.0 = waker.clone();
        }
    }
}

impl Drop for HandleWaker {
    fn drop(&mut self) {
        self.0.wake_by_ref();
    }
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
        let mut rx = ready(Box::new(done(4)));
        let got = (&mut rx).now_or_never().expect("ready").expect("there");
        assert_eq!(got.into_outcome().id, TaskId(4));
        assert!((&mut rx).now_or_never().expect("ready").is_err());
    }

    #[tokio::test]
    async fn a_handle_waker_wakes_its_handle_when_dropped_not_when_replaced() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::task::Wake;
        struct Count(AtomicUsize);
        impl Wake for Count {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let (first, second) = (
            Arc::new(Count(AtomicUsize::new(0))),
            Arc::new(Count(AtomicUsize::new(0))),
        );
        let mut waker = HandleWaker::unpolled();
        waker.register(&Waker::from(first.clone()));
        waker.register(&Waker::from(first.clone()));
        waker.register(&Waker::from(second.clone()));
        assert_eq!(first.0.load(Ordering::SeqCst), 0, "replaced, not woken");
        drop(waker);
        assert_eq!(
            second.0.load(Ordering::SeqCst),
            1,
            "woken once, when dropped"
        );
    }

    #[test]
    fn a_send_to_a_receiver_gone_is_dropped_quietly() {
        let (tx, rx) = channel();
        drop(rx);
        tx.send(done(3));
    }
}
