//! Hearing how a submission ended up: the leader's verdict on a fresh
//! submission ([`CONFIRM_FOR`]), and waiting for a task to finish by
//! events with polling as a fallback ([`wait_by_polling`]).

use std::future::Future;
use std::time::{Duration, Instant};

use super::{Error, NOT_FOUND_GRACE};
use crate::api::Api;
use crate::core::{ErrorCode, TaskId};
use crate::task::TaskStatus;
use crate::wire::{self, WireError};

/// Waits until the leader has taken submission `id` from the stream (for
/// up to [`CONFIRM_FOR`], asking `api`) and returns its refusal with its
/// code, if it refused it: what a `cronoq server` does before answering
/// an unsigned submission, so a limit only the leader knows (`max_pools`:
/// `RESOURCE_EXHAUSTED`, …) is not answered with an id. A lookup that
/// fails (no leader at the moment) or a leader that has not taken it in
/// time leaves it accepted, as it is: durable in the stream.
pub(crate) async fn leaders_verdict(api: &dyn Api, id: TaskId) -> Result<(), WireError> {
    let started = Instant::now();
    let mut pause = Duration::from_millis(5);
    loop {
        match api.task(id).await {
            Ok(status) if just_accepted(&status) => {}
            Ok(status) => return refusal_of(&status).map_or(Ok(()), Err),
            Err(e) if e.code == ErrorCode::NOT_FOUND => {}
            Err(e) => {
                tracing::debug!(task_id = %id, error = %e, "submission not confirmed; answering it as accepted");
                return Ok(());
            }
        }
        if started.elapsed() >= CONFIRM_FOR {
            return Ok(());
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(250));
    }
}

/// How long [`super::Client::submit`] with a credential waits for the leader to
/// take a submission (and check it) before returning it as accepted.
pub const CONFIRM_FOR: Duration = Duration::from_secs(5);

/// What the leader answers for a task the stream holds and it has not
/// taken yet: queued, with no reason (a task it has taken and that waits
/// always has one) and no attempt.
pub(super) fn just_accepted(status: &TaskStatus) -> bool {
    status.state == crate::core::TaskState::Queued
        && status.reason.is_none()
        && status.attempts.is_empty()
}

/// The refusal a task's status records when the leader refused its
/// submission (`submission refused: <message> [CODE]`, as the driver
/// writes it): for its credential (`UNAUTHENTICATED`,
/// `PERMISSION_DENIED`) or for anything else only the leader knows (a
/// limit: `RESOURCE_EXHAUSTED`; a payload over its limit:
/// `INVALID_ARGUMENT`; an undeclared pool: `NOT_FOUND`), with that code.
pub(super) fn refusal_of(status: &TaskStatus) -> Option<WireError> {
    if status.state != crate::core::TaskState::Failed || !status.attempts.is_empty() {
        return None;
    }
    let text = status
        .error
        .as_deref()?
        .strip_prefix("submission refused: ")?;
    let (message, code) = text.strip_suffix(']')?.rsplit_once(" [")?;
    if code.is_empty() || !code.chars().all(|c| c.is_ascii_uppercase() || c == '_') {
        return None;
    }
    let code = ErrorCode(code.to_string().into());
    Some(WireError::new(
        code,
        format!("task {} refused by the leader: {message}", status.id),
    ))
}

/// When a wait looks its task up next: every `interval` while the server
/// answers; after an `UNAVAILABLE`, sooner at first and then less often
/// (from [`Pace::FIRST_RETRY`], doubling up to `interval`), so a takeover
/// is noticed quickly without a tight loop while nobody answers.
pub(super) struct Pace {
    interval: Duration,
    next: Duration,
}

impl Pace {
    const FIRST_RETRY: Duration = Duration::from_millis(50);

    pub(super) fn new(interval: Duration) -> Pace {
        Pace {
            interval,
            next: interval,
        }
    }

    pub(super) fn pause(&self) -> Duration {
        self.next
    }

    /// One lookup of a wait: a finished task ends it (`Some`); a live one,
    /// one not known yet (for [`NOT_FOUND_GRACE`] from `started`) and a
    /// server that does not answer go on (`None`); any other error ends
    /// it.
    pub(super) fn look(
        &mut self,
        r: Result<TaskStatus, Error>,
        started: Instant,
    ) -> Result<Option<TaskStatus>, Error> {
        match r {
            Ok(status) if status.state.is_terminal() => Ok(Some(status)),
            Ok(_) => {
                self.next = self.interval;
                Ok(None)
            }
            Err(e) if e.code() == ErrorCode::UNAVAILABLE => {
                self.next = if self.next >= self.interval {
                    Pace::FIRST_RETRY.min(self.interval)
                } else {
                    (self.next * 2).min(self.interval)
                };
                tracing::debug!(error = %e, retry_in_ms = self.next.as_millis() as u64, "no answer while waiting; trying again");
                Ok(None)
            }
            Err(e) if e.code() == ErrorCode::NOT_FOUND && started.elapsed() < NOT_FOUND_GRACE => {
                self.next = self.interval;
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }
}

/// Waits by looking the task up every `interval` (what the HTTP client
/// does), riding out a server that does not answer like [`Client::wait`].
pub(crate) async fn wait_by_polling<F, Fut>(
    interval: Duration,
    mut get: F,
) -> Result<TaskStatus, Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<TaskStatus, Error>>,
{
    let started = Instant::now();
    let mut pace = Pace::new(interval);
    loop {
        if let Some(done) = pace.look(get().await, started)? {
            return Ok(done);
        }
        tokio::time::sleep(pace.pause()).await;
    }
}

/// A final status made from the terminal event alone (when the server
/// cannot be asked): events carry no output or error text, so neither has
/// one.
pub(super) fn status_of_event(event: &wire::TaskEvent) -> TaskStatus {
    TaskStatus::bare(event.task_id, event.pool.clone(), event.state)
}
