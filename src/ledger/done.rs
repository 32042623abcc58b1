//! A finished task as the ledger retains it ([`Done`]): compact, the usual
//! single attempt inline and everything rarer behind one box, so that the
//! ring of retained outcomes and the waiter's channel move few bytes per
//! task; and the ring's entries ([`Retained`]).

use bytes::Bytes;

use super::Run;
use crate::core::{Labels, Millis, PoolName, TaskId, TaskState};
use crate::task::{AttemptRecord, Outcome};

/// A retained outcome, kept by value in the ring: no allocation of its own
/// in the usual case, so retaining and evicting a task costs no
/// malloc/free. The ring is written at every finish and read at every
/// eviction, 10,000 entries behind (beyond the L2 cache): an entry is kept
/// to 96 bytes, the usual single attempt inline and everything rarer
/// (errors, keys, workers, schedules, several attempts) behind one box.
/// An [`Outcome`] is built from it when someone reads it.
pub(crate) struct Done {
    pub(super) id: TaskId,
    pool: PoolName,
    output: Option<Bytes>,
    /// The group of the single attempt kept inline; `None` when the task
    /// made no attempt, or when its attempts are in `rest`.
    group: Option<Labels>,
    started_at: Millis,
    /// [`NOT_ENDED`] for an attempt without an end.
    ended_at: u64,
    attempt: u32,
    state: TaskState,
    /// The inline attempt's outcome, as [`outcome_code`] gives it.
    outcome: u8,
    deadline_missed: bool,
    rest: Option<Box<Rest>>,
}

// Fewer bytes copied in and evicted per finished task: keep it so.
const _: () = assert!(std::mem::size_of::<Retained>() <= 96);

/// `ended_at` of an attempt that has none.
const NOT_ENDED: u64 = u64::MAX;

/// What few retained tasks have.
#[derive(Default)]
struct Rest {
    error: Option<String>,
    /// The key it held (binds a resubmission to it while retained).
    key: Option<String>,
    /// Every attempt, when they are not the usual single one kept inline.
    attempts: Option<Vec<AttemptRecord>>,
    schedule: Option<(String, Millis)>,
}

/// The outcomes cronoq names, by code (0: none).
const OUTCOMES: [&str; 5] = ["succeeded", "failed", "lost", "cancelled", "preempted"];

/// The code of an attempt's outcome kept inline, or `None` when it cannot
/// be (a name cronoq did not give).
fn outcome_code(outcome: &Option<std::borrow::Cow<'static, str>>) -> Option<u8> {
    match outcome {
        None => Some(0),
        Some(name) => OUTCOMES
            .iter()
            .position(|n| *n == name.as_ref())
            .map(|i| i as u8 + 1),
    }
}

impl Done {
    /// The retained form of `outcome`, with the key it held.
    pub(super) fn of(outcome: &Outcome, key: Option<String>) -> Done {
        let mut rest = Rest {
            error: outcome.error.clone(),
            key,
            attempts: None,
            schedule: outcome.schedule.clone(),
        };
        let mut done = Done {
            id: outcome.id,
            pool: outcome.pool.clone(),
            output: outcome.output.clone(),
            group: None,
            started_at: Millis::ZERO,
            ended_at: NOT_ENDED,
            attempt: 0,
            state: outcome.state,
            outcome: 0,
            deadline_missed: outcome.deadline_missed,
            rest: None,
        };
        match &outcome.attempts[..] {
            [] => {}
            [a] if a.worker.is_none() && a.credential.is_none() && a.error.is_none() => {
                match outcome_code(&a.outcome) {
                    Some(code) => {
                        done.group = Some(a.group.clone());
                        done.started_at = a.started_at;
                        done.ended_at = a.ended_at.map_or(NOT_ENDED, |m| m.0);
                        done.attempt = a.attempt;
                        done.outcome = code;
                    }
                    None => rest.attempts = Some(outcome.attempts.clone()),
                }
            }
            all => rest.attempts = Some(all.to_vec()),
        }
        let has_rest = rest.error.is_some()
            || rest.key.is_some()
            || rest.attempts.is_some()
            || rest.schedule.is_some();
        if has_rest {
            done.rest = Some(Box::new(rest));
        }
        done
    }

    /// The retained form of a finished task's run record, moved out of
    /// it: the usual single attempt leaves the record's attempt list
    /// empty with its room kept, for the next task that reuses the record.
    pub(super) fn from_run<R>(
        id: TaskId,
        pool: PoolName,
        state: TaskState,
        deadline_missed: bool,
        run: &mut Run<R>,
    ) -> Done {
        let output = if state == TaskState::Succeeded {
            run.output.take()
        } else {
            None
        };
        let mut done = Done {
            id,
            pool,
            output,
            group: None,
            started_at: Millis::ZERO,
            ended_at: NOT_ENDED,
            attempt: 0,
            state,
            outcome: 0,
            deadline_missed,
            rest: None,
        };
        let mut rest = Rest {
            error: run.error.take(),
            key: run.key.take(),
            attempts: None,
            schedule: run.schedule.take().map(|s| *s),
        };
        let simple = match &run.attempts[..] {
            [a] if a.worker.is_none() && a.credential.is_none() && a.error.is_none() => {
                outcome_code(&a.outcome)
            }
            _ => None,
        };
        match (simple, run.attempts.pop()) {
            (Some(code), Some(a)) => {
                done.group = Some(a.group);
                done.started_at = a.started_at;
                done.ended_at = a.ended_at.map_or(NOT_ENDED, |m| m.0);
                done.attempt = a.attempt;
                done.outcome = code;
            }
            (_, Some(a)) => {
                run.attempts.push(a);
                rest.attempts = Some(std::mem::take(&mut run.attempts));
            }
            (_, None) => {}
        }
        if rest.error.is_some()
            || rest.key.is_some()
            || rest.attempts.is_some()
            || rest.schedule.is_some()
        {
            done.rest = Some(Box::new(rest));
        }
        done
    }

    /// A copy for a waiter: everything but the key.
    pub fn copy(&self) -> Done {
        let rest = self.rest.as_deref().and_then(|r| {
            let copy = Rest {
                error: r.error.clone(),
                key: None,
                attempts: r.attempts.clone(),
                schedule: r.schedule.clone(),
            };
            let any = copy.error.is_some() || copy.attempts.is_some() || copy.schedule.is_some();
            any.then(|| Box::new(copy))
        });
        Done {
            id: self.id,
            pool: self.pool.clone(),
            output: self.output.clone(),
            group: self.group.clone(),
            rest,
            ..*self
        }
    }

    pub(super) fn key(&self) -> Option<&str> {
        self.rest.as_ref()?.key.as_deref()
    }

    fn attempts(&self) -> Vec<AttemptRecord> {
        if let Some(all) = self.rest.as_ref().and_then(|r| r.attempts.as_ref()) {
            return all.clone();
        }
        self.group
            .as_ref()
            .map(|g| vec![self.inline_attempt(g.clone())])
            .unwrap_or_default()
    }

    /// The single attempt kept inline, in `group`.
    fn inline_attempt(&self, group: Labels) -> AttemptRecord {
        AttemptRecord {
            attempt: self.attempt,
            group,
            worker: None,
            credential: None,
            started_at: self.started_at,
            ended_at: (self.ended_at != NOT_ENDED).then_some(Millis(self.ended_at)),
            outcome: match self.outcome {
                0 => None,
                code => Some(std::borrow::Cow::Borrowed(OUTCOMES[code as usize - 1])),
            },
            error: None,
        }
    }

    /// The outcome, moved out (a waiter's copy becomes what it waited
    /// for).
    pub fn into_outcome(mut self) -> Outcome {
        let rest = self.rest.take().map(|r| *r).unwrap_or_default();
        let attempts = match (rest.attempts, self.group.take()) {
            (Some(all), _) => all,
            (None, Some(group)) => vec![self.inline_attempt(group)],
            (None, None) => Vec::new(),
        };
        Outcome {
            id: self.id,
            pool: self.pool,
            state: self.state,
            output: self.output,
            error: rest.error,
            attempts,
            deadline_missed: self.deadline_missed,
            schedule: rest.schedule,
        }
    }

    /// The outcome as [`Scheduler::wait`](crate::Scheduler::wait) and
    /// `task` show it.
    pub fn to_outcome(&self) -> Outcome {
        let rest = self.rest.as_deref();
        Outcome {
            id: self.id,
            pool: self.pool.clone(),
            state: self.state,
            output: self.output.clone(),
            error: rest.and_then(|r| r.error.clone()),
            attempts: self.attempts(),
            deadline_missed: self.deadline_missed,
            schedule: rest.and_then(|r| r.schedule.clone()),
        }
    }
}

/// An entry of the ring of retained outcomes.
pub(super) enum Retained {
    /// A finished task (and the key it held).
    Task(Done),
    /// A resubmission that stands for an earlier entry of the ring.
    Alias(TaskId),
    /// A task recorded again since (its newer entry stands).
    Replaced,
}
