//! Subject names under a configurable prefix (default `cronoq`), and the
//! JetStream stream and bucket names derived from it.
//!
//! | subject | direction | body |
//! |---|---|---|
//! | `P.submit.<pool>` | client → stream | [`super::Submit`] or raw payload + `Cronoq-*` headers |
//! | `P.submit.<pool>.fire` | leader → stream | a schedule fire: [`super::Submit`], sealed |
//! | `P.w.<id>.challenge` | worker → leader (request, auth on) | [`super::Challenge`] → [`super::ChallengeReply`] |
//! | `P.w.<id>.register` | worker → leader (request) | [`super::Register`] → [`super::RegisterReply`] |
//! | `P.w.<id>.heartbeat` | worker → leader (request) | [`super::Heartbeat`] → [`super::HeartbeatReply`] |
//! | `P.w.<id>.deregister` | worker → leader (request) | [`super::Deregister`] → [`super::Ack`] |
//! | `P.w.<id>.renew` | worker → leader (request) | [`super::Renew`] → [`super::RenewReply`] |
//! | `P.w.<id>.outcome` | worker → leader (request) | [`super::AttemptReport`] → [`super::Ack`] |
//! | `P.w.<id>.outcomes` | worker → leader (request) | [`super::AttemptReports`] → [`super::AttemptReportsReply`] |
//! | `P.api.cancel` | client → leader (request) | [`super::Cancel`] → [`super::Ack`] |
//! | `P.api.task` | client → leader (request) | [`super::GetTask`] → `TaskStatus` |
//! | `P.api.snapshot` | client → leader (request) | [`super::GetSnapshot`] → `Snapshot` |
//! | `P.api.tasks` | client → leader (request) | [`super::ListTasks`] → [`super::TaskList`] |
//! | `P.api.schedule_create` | client → leader (request) | [`super::CreateSchedule`] → `ScheduleInfo` |
//! | `P.api.schedule_list` | client → leader (request) | [`super::ListSchedules`] → [`super::ScheduleList`] |
//! | `P.api.schedule_get`, `_pause`, `_resume` | client → leader (request) | [`super::ScheduleName`] → `ScheduleInfo` |
//! | `P.api.schedule_delete` | client → leader (request) | [`super::ScheduleName`] → [`super::Ack`] |
//! | `P.api.schedule_trigger` | client → leader (request) | [`super::ScheduleName`] → `FireRecord` |
//! | `P.api.schedule_backfill` | client → leader (request) | [`super::BackfillSchedule`] → `BackfillReport` |
//! | `P.worker.<id>.lease` | leader → worker | [`super::Lease`] |
//! | `P.worker.<id>.leases` | leader → worker | [`super::Leases`] |
//! | `P.worker.<id>.revoke` | leader → worker | [`super::Revoke`] |
//! | `P.events.<task_id>` | leader → anyone | [`super::TaskEvent`] |
//!
//! A worker speaks only under `P.w.<its id>.>` and hears only
//! `P.worker.<its id>.>`, so NATS permissions can tie a worker's NATS user
//! to its id (`deploy/nats/`); the leader checks that the id in the
//! subject is the body's `worker_id`.

use crate::core::{PoolName, Rejection, TaskId};

/// What ends a fire subject: `P.submit.<pool>.fire`.
const FIRE_SUFFIX: &str = ".fire";

/// The subjects of one cronoq installation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subjects {
    prefix: String,
}

impl Default for Subjects {
    fn default() -> Self {
        Subjects {
            prefix: "cronoq".into(),
        }
    }
}

impl Subjects {
    /// Subjects under `prefix`: one NATS token of `A-Z a-z 0-9 _ -`.
    pub fn new(prefix: &str) -> Result<Subjects, Rejection> {
        if prefix.is_empty()
            || prefix.len() > 32
            || !prefix
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return Err(Rejection::InvalidArgument(format!(
                "subject prefix {prefix:?} must be 1-32 characters of letters, digits, '_' and '-'"
            )));
        }
        Ok(Subjects {
            prefix: prefix.to_string(),
        })
    }

    /// The prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Where submissions to `pool` go.
    pub fn submit(&self, pool: &PoolName) -> String {
        join(&[&self.prefix, ".submit.", pool.as_str()])
    }

    /// Every submission subject (captured by the submit stream).
    pub fn submit_all(&self) -> String {
        join(&[&self.prefix, ".submit.>"])
    }

    /// Where the leader publishes the schedule fires of `pool`:
    /// `P.submit.<pool>.fire`, inside the submit stream but a subject no
    /// client is granted under `deploy/nats/auth.conf` (submitters may
    /// publish only `P.submit.<their pool>`), and one the leader takes
    /// only sealed fires from.
    pub fn fire(&self, pool: &PoolName) -> String {
        join(&[&self.prefix, ".submit.", pool.as_str(), FIRE_SUFFIX])
    }

    /// Whether `subject` is a fire subject ([`Subjects::fire`]).
    pub fn is_fire(&self, subject: &str) -> bool {
        subject
            .strip_prefix(&self.prefix)
            .and_then(|s| s.strip_prefix(".submit."))
            .and_then(|rest| rest.strip_suffix(FIRE_SUFFIX))
            .is_some_and(|pool| PoolName::new(pool).is_ok())
    }

    /// The pool named by a submission subject (a plain one, or a fire
    /// subject).
    pub fn pool_of_submit(&self, subject: &str) -> Result<PoolName, Rejection> {
        let rest = subject
            .strip_prefix(&self.prefix)
            .and_then(|s| s.strip_prefix(".submit."))
            .ok_or_else(|| {
                Rejection::InvalidArgument(format!("{subject} is not a submit subject"))
            })?;
        PoolName::new(rest.strip_suffix(FIRE_SUFFIX).unwrap_or(rest))
    }

    /// A leader API subject: `register`, `heartbeat`, …
    pub fn api(&self, verb: &str) -> String {
        join(&[&self.prefix, ".api.", verb])
    }

    /// A worker's request to the leader: `P.w.<worker_id>.<verb>`.
    pub fn worker_api(&self, worker_id: &str, verb: &str) -> String {
        join(&[&self.prefix, ".w.", worker_id, ".", verb])
    }

    /// Every worker request (the leader subscribes to it).
    pub fn worker_api_all(&self) -> String {
        join(&[&self.prefix, ".w.*.*"])
    }

    /// The worker id and verb of a worker request subject.
    pub fn parse_worker_api<'a>(&self, subject: &'a str) -> Option<(&'a str, &'a str)> {
        let rest = subject
            .strip_prefix(self.prefix.as_str())?
            .strip_prefix(".w.")?;
        let (id, verb) = rest.split_once('.')?;
        (!id.is_empty() && !verb.is_empty() && !verb.contains('.')).then_some((id, verb))
    }

    /// Leases for one worker.
    pub fn lease(&self, worker_id: &str) -> String {
        join(&[&self.prefix, ".worker.", worker_id, ".lease"])
    }

    /// Several leases in one message, for one worker.
    pub fn leases(&self, worker_id: &str) -> String {
        join(&[&self.prefix, ".worker.", worker_id, ".leases"])
    }

    /// Revocations for one worker.
    pub fn revoke(&self, worker_id: &str) -> String {
        join(&[&self.prefix, ".worker.", worker_id, ".revoke"])
    }

    /// The worker a `P.worker.<id>.…` subject addresses.
    pub fn worker_of<'a>(&self, subject: &'a str) -> Option<&'a str> {
        let rest = subject
            .strip_prefix(self.prefix.as_str())?
            .strip_prefix(".worker.")?;
        rest.split_once('.').map(|(id, _)| id)
    }

    /// Everything addressed to one worker.
    pub fn worker_all(&self, worker_id: &str) -> String {
        join(&[&self.prefix, ".worker.", worker_id, ".>"])
    }

    /// Lifecycle events of one task.
    pub fn events(&self, task: TaskId) -> String {
        use std::fmt::Write as _;
        // The prefix, `.events.`, up to 20 digits.
        let mut subject = String::with_capacity(self.prefix.len() + 28);
        subject.push_str(&self.prefix);
        subject.push_str(".events.");
        let _ = write!(subject, "{task}");
        subject
    }

    /// Lifecycle events of every task.
    pub fn events_all(&self) -> String {
        join(&[&self.prefix, ".events.>"])
    }

    /// Where a refused or unprocessable submission is copied, with the
    /// reason in `Cronoq-Dead-Letter-*` headers (`P.deadletter.<pool>`).
    pub fn dead_letter(&self, pool: &PoolName) -> String {
        join(&[&self.prefix, ".deadletter.", pool.as_str()])
    }

    /// Every dead-letter subject.
    pub fn dead_letter_all(&self) -> String {
        join(&[&self.prefix, ".deadletter.>"])
    }

    /// The JetStream stream of dead letters (7 days, 100,000 at most).
    pub fn dead_letter_stream(&self) -> String {
        format!("{}_DEADLETTER", self.upper())
    }

    /// The JetStream stream that holds accepted, unfinished submissions.
    pub fn submit_stream(&self) -> String {
        format!("{}_SUBMIT", self.upper())
    }

    /// The JetStream key-value bucket that keeps finished tasks' results.
    pub fn results_bucket(&self) -> String {
        format!("{}_RESULTS", self.upper())
    }

    /// The leader record: one subject of the results bucket's stream,
    /// written by compare-and-set (`server::election`). Workers listen to
    /// it to follow a new leader at once.
    pub fn leader(&self) -> String {
        format!("$KV.{}._leader", self.results_bucket())
    }

    /// The JetStream key-value bucket of leader state (the epoch counter).
    pub fn state_bucket(&self) -> String {
        format!("{}_STATE", self.upper())
    }

    fn upper(&self) -> String {
        self.prefix.to_uppercase().replace('-', "_")
    }
}

/// `parts` end to end, in one allocation of the right size (the subjects
/// are built per message on hot paths; `format!` costs several times
/// this).
fn join(parts: &[&str]) -> String {
    let mut out = String::with_capacity(parts.iter().map(|p| p.len()).sum());
    for part in parts {
        out.push_str(part);
    }
    out
}

/// A worker id: 1–64 characters of `A-Z a-z 0-9 _ -` (one subject token).
pub fn validate_worker_id(id: &str) -> Result<(), Rejection> {
    if id.is_empty()
        || id.len() > 64
        || !id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(Rejection::InvalidArgument(format!(
            "worker id {id:?} must be 1-64 characters of letters, digits, '_' and '-'"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_under_prefix() {
        let s = Subjects::new("cq").unwrap();
        let pool = PoolName::new("gpu-pool").unwrap();
        assert_eq!(s.submit(&pool), "cq.submit.gpu-pool");
        assert_eq!(s.pool_of_submit("cq.submit.gpu-pool").unwrap(), pool);
        assert!(s.pool_of_submit("cq.submit.a.b").is_err());
        assert_eq!(s.fire(&pool), "cq.submit.gpu-pool.fire");
        assert_eq!(s.pool_of_submit("cq.submit.gpu-pool.fire").unwrap(), pool);
        assert!(s.is_fire("cq.submit.gpu-pool.fire"));
        let fire_pool = PoolName::new("fire").unwrap();
        assert!(!s.is_fire(&s.submit(&fire_pool)), "a pool named fire");
        assert!(s.is_fire(&s.fire(&fire_pool)));
        assert!(!s.is_fire("cq.submit.gpu-pool"));
        assert!(!s.is_fire("cq.submit..fire"));
        assert_eq!(s.lease("w1"), "cq.worker.w1.lease");
        assert_eq!(s.submit_stream(), "CQ_SUBMIT");
        assert_eq!(s.leases("w1"), "cq.worker.w1.leases");
        assert_eq!(s.revoke("w1"), "cq.worker.w1.revoke");
        assert_eq!(s.worker_all("w1"), "cq.worker.w1.>");
        assert_eq!(s.worker_api("w1", "renew"), "cq.w.w1.renew");
        assert_eq!(s.worker_api_all(), "cq.w.*.*");
        assert_eq!(s.api("task"), "cq.api.task");
        assert_eq!(s.events(TaskId(42)), "cq.events.42");
        assert_eq!(s.events(TaskId(u64::MAX)), "cq.events.18446744073709551615");
        assert_eq!(s.events_all(), "cq.events.>");
        assert_eq!(s.submit_all(), "cq.submit.>");
        assert_eq!(s.dead_letter(&pool), "cq.deadletter.gpu-pool");
        assert_eq!(s.dead_letter_all(), "cq.deadletter.>");
        assert!(Subjects::new("a.b").is_err());
        assert!(validate_worker_id("w.1").is_err());
    }
}
