//! A schedule as users give it ([`ScheduleSpec`], serde: JSON, TOML, the
//! CLI) and as the rest of the crate uses it once checked ([`Schedule`]).
//!
//! `ScheduleSpec::validate` is the one way from the first to the second:
//! every refusal is `INVALID_ARGUMENT` with a message naming the field and
//! the problem. Durations are text (`30s`, `5m`, `1h 30m`, humantime's
//! grammar) because people write them; the validated form holds
//! [`Millis`]. The task template reuses [`Task`]'s own validation (pool
//! name, labels, attempts, timeouts), so a template that validates makes
//! tasks that submit.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::cadence::Cadence;
use crate::core::{excerpt, Labels, Millis, PoolName, Rejection, TaskId, MAX_NAME_LEN};
use crate::task::Task;

/// The default catch-up window: 1 minute.
pub const DEFAULT_CATCHUP_WINDOW: Millis = Millis(60_000);

/// The longest catch-up window or jitter accepted: 1 day. Ticks older than
/// that are recorded as missed, never fired.
pub const MAX_WINDOW: Millis = Millis(24 * 3600 * 1000);

/// What to do when a tick comes while the schedule's previous run is
/// still queued or running.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Overlap {
    /// Start another run beside it.
    #[default]
    Allow,
    /// No new run; the tick is recorded as skipped.
    Skip,
    /// At most one run waits behind the running one; further ticks are
    /// skipped.
    BufferOne,
    /// Cancel the running one, then start.
    CancelPrevious,
}

/// The task each tick submits, as users give it: the options of
/// [`Task`], with durations as text and the deadline relative to the tick.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskTemplate {
    /// The pool (default `default`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// Labels the running group must carry.
    #[serde(default, skip_serializing_if = "Labels::is_empty")]
    pub labels: Labels,
    /// Higher runs first.
    #[serde(default)]
    pub priority: i32,
    /// The payload (text in JSON and TOML).
    #[serde(default)]
    pub payload: Bytes,
    /// Attempts in all (default: the pool's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    /// Longest run of one attempt (`30s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt_timeout: Option<String>,
    /// Urgency deadline, counted from the tick (`10m`: urgent by ten
    /// minutes after the scheduled instant).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<String>,
}

/// A schedule as users give it. Exactly one of `cron` and `every`.
///
/// ```
/// use cronoq::schedule::ScheduleSpec;
/// let spec: ScheduleSpec = serde_json::from_str(r#"{
///     "name": "nightly-report",
///     "cron": "30 2 * * *",
///     "tz": "Europe/Berlin",
///     "overlap": "skip",
///     "task": { "pool": "reports", "labels": { "gpu": "a100" }, "payload": "build" }
/// }"#).unwrap();
/// let schedule = spec.validate().unwrap();
/// assert_eq!(schedule.name, "nightly-report");
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleSpec {
    /// Unique name: 1–64 of `A-Z a-z 0-9 _ -` (like a pool name).
    pub name: String,
    /// A cron expression: 5 fields, 6 with seconds first, or `@daily` & co.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
    /// An interval (`30s`, `5m`): at least 1s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every: Option<String>,
    /// The IANA zone `cron` is read in (default `UTC`); not allowed with
    /// `every`, which ignores wall clocks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tz: Option<String>,
    /// What a tick does while the previous run is queued or running.
    #[serde(default)]
    pub overlap: Overlap,
    /// How old a tick missed while no leader ran may be and still fire
    /// (default `1m`, at most `1d`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catchup_window: Option<String>,
    /// The most a fire may be delayed after its tick (default none, at most
    /// `1d`); never past the next tick.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jitter: Option<String>,
    /// A paused schedule fires nothing; its ticks pass.
    #[serde(default)]
    pub paused: bool,
    /// The task each tick submits.
    #[serde(default)]
    pub task: TaskTemplate,
}

/// A validated schedule: what the firing rules and the shells use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    /// The name (checked).
    pub name: String,
    /// When it ticks.
    pub cadence: Cadence,
    /// The overlap policy.
    pub overlap: Overlap,
    /// Ticks later than this (plus the jitter) are missed, not fired.
    pub catchup_window: Millis,
    /// The most a fire is delayed after its tick.
    pub jitter: Millis,
    /// Fires nothing while set.
    pub paused: bool,
    /// The task template, checked.
    pub template: Template,
}

/// A validated task template.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Template {
    /// The pool.
    pub pool: PoolName,
    /// Required labels.
    pub labels: Labels,
    /// Priority.
    pub priority: i32,
    /// Payload.
    pub payload: Bytes,
    /// Attempts in all, or the pool's default.
    pub max_attempts: Option<u32>,
    /// Longest run of one attempt.
    pub attempt_timeout: Option<Millis>,
    /// Deadline, counted from the tick.
    pub deadline: Option<Millis>,
}

/// Checks a schedule name: 1–64 characters of `A-Z a-z 0-9 _ -` (it
/// appears in idempotency keys, subjects and URLs).
///
/// ```
/// use cronoq::schedule::check_schedule_name;
/// assert!(check_schedule_name("nightly-report").is_ok());
/// assert!(check_schedule_name("a.b").is_err());
/// assert!(check_schedule_name("").is_err());
/// ```
pub fn check_schedule_name(name: &str) -> Result<(), Rejection> {
    if name.is_empty() {
        return Err(Rejection::InvalidArgument("schedule name is empty".into()));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(Rejection::InvalidArgument(format!(
            "schedule name {} is longer than {MAX_NAME_LEN} characters",
            excerpt(name)
        )));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(Rejection::InvalidArgument(format!(
            "schedule name {} may only hold letters, digits, '_' and '-'",
            excerpt(name)
        )));
    }
    Ok(())
}

/// Parses a duration field (`30s`, `5m`, `1h 30m`), naming the field when
/// it is malformed.
pub fn parse_span(field: &str, text: &str) -> Result<Millis, Rejection> {
    humantime::parse_duration(text.trim())
        .map(Millis::from_duration)
        .map_err(|e| {
            Rejection::InvalidArgument(format!(
                "{field} {} is not a duration: {e} (want e.g. 30s, 5m, 1h)",
                excerpt(text)
            ))
        })
}

impl ScheduleSpec {
    /// Checks everything and builds the [`Schedule`]; the first problem is
    /// refused as `INVALID_ARGUMENT` naming the field.
    pub fn validate(&self) -> Result<Schedule, Rejection> {
        check_schedule_name(&self.name)?;
        let cadence = match (&self.cron, &self.every) {
            (Some(_), Some(_)) => {
                return Err(Rejection::InvalidArgument(
                    "give cron or every, not both".into(),
                ))
            }
            (None, None) => {
                return Err(Rejection::InvalidArgument(
                    "give cron (an expression) or every (an interval)".into(),
                ))
            }
            (Some(expr), None) => Cadence::cron(expr, self.tz.as_deref().unwrap_or("UTC"))?,
            (None, Some(every)) => {
                if self.tz.is_some() {
                    return Err(Rejection::InvalidArgument(
                        "tz applies to cron only: an interval ignores wall clocks".into(),
                    ));
                }
                Cadence::every(parse_span("every", every)?)?
            }
        };
        let window = |field: &str, text: &Option<String>, default: Millis| {
            let span = match text {
                Some(t) => parse_span(field, t)?,
                None => default,
            };
            if span > MAX_WINDOW {
                return Err(Rejection::InvalidArgument(format!(
                    "{field} is longer than the limit of 1 day"
                )));
            }
            Ok(span)
        };
        let catchup_window = window(
            "catchup_window",
            &self.catchup_window,
            DEFAULT_CATCHUP_WINDOW,
        )?;
        let jitter = window("jitter", &self.jitter, Millis::ZERO)?;
        let template = self.task.validate()?;
        Ok(Schedule {
            name: self.name.clone(),
            cadence,
            overlap: self.overlap,
            catchup_window,
            jitter,
            paused: self.paused,
            template,
        })
    }
}

impl TaskTemplate {
    /// Checks the template by building one task from it and running
    /// [`Task::to_spec`]'s checks (with no payload limit: the shell applies
    /// its own at submit).
    pub fn validate(&self) -> Result<Template, Rejection> {
        let pool = PoolName::new(self.pool.as_deref().unwrap_or(PoolName::DEFAULT))?;
        let attempt_timeout = self
            .attempt_timeout
            .as_deref()
            .map(|t| parse_span("task.attempt_timeout", t))
            .transpose()?;
        let deadline = self
            .deadline
            .as_deref()
            .map(|t| parse_span("task.deadline", t))
            .transpose()?;
        if deadline.is_some_and(|d| d > crate::core::MAX_HORIZON) {
            return Err(Rejection::InvalidArgument(
                "task.deadline is longer than the limit of 10 years".into(),
            ));
        }
        let template = Template {
            pool,
            labels: self.labels.clone(),
            priority: self.priority,
            payload: self.payload.clone(),
            max_attempts: self.max_attempts,
            attempt_timeout,
            deadline,
        };
        template
            .task_at("check", Millis::ZERO)
            .to_spec(TaskId(0), usize::MAX)?;
        Ok(template)
    }
}

impl Template {
    /// The task for the tick `tick` of schedule `name`: the template's
    /// options, the deadline counted from the tick, and the tick's
    /// idempotency key ([`super::schedule_key`]) so a second fire of the
    /// same tick (a successor leader replaying) finds the first task.
    pub fn task_at(&self, name: &str, tick: Millis) -> Task {
        let at = |m: Millis| std::time::UNIX_EPOCH + m.to_duration();
        let mut task = Task::new(self.payload.clone())
            .pool(self.pool.as_str())
            .labels(&self.labels)
            .priority(self.priority)
            .idempotency_key(super::schedule_key(name, tick));
        if let Some(n) = self.max_attempts {
            task = task.max_attempts(n);
        }
        if let Some(t) = self.attempt_timeout {
            task = task.attempt_timeout(t.to_duration());
        }
        if let Some(d) = self.deadline {
            task = task.deadline(at(tick.plus(d)));
        }
        task
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: &str) -> ScheduleSpec {
        serde_json::from_str(json).expect("spec parses")
    }

    fn refused(json: &str) -> String {
        let e = spec(json).validate().unwrap_err();
        assert_eq!(e.code(), crate::core::ErrorCode::INVALID_ARGUMENT, "{e}");
        e.to_string()
    }

    #[test]
    fn defaults_are_utc_allow_one_minute_no_jitter_unpaused() {
        let s = spec(r#"{"name":"a","cron":"@daily"}"#).validate().unwrap();
        assert_eq!(s.overlap, Overlap::Allow);
        assert_eq!(s.catchup_window, Millis(60_000));
        assert_eq!(s.jitter, Millis::ZERO);
        assert!(!s.paused);
        assert_eq!(s.template.pool.as_str(), "default");
        assert_eq!(s.cadence, Cadence::cron("@daily", "UTC").unwrap());
    }

    #[test]
    fn each_bad_field_is_refused_by_name() {
        let cases = [
            (r#"{"name":"","every":"1m"}"#, "schedule name is empty"),
            (
                r#"{"name":"a.b","every":"1m"}"#,
                "schedule name \"a.b\" may only hold",
            ),
            (r#"{"name":"a"}"#, "give cron (an expression) or every"),
            (r#"{"name":"a","cron":"@daily","every":"1m"}"#, "not both"),
            (r#"{"name":"a","every":"0s"}"#, "below the minimum of 1s"),
            (r#"{"name":"a","every":"500ms"}"#, "below the minimum of 1s"),
            (
                r#"{"name":"a","every":"soon"}"#,
                "every \"soon\" is not a duration",
            ),
            (
                r#"{"name":"a","every":"1m","tz":"UTC"}"#,
                "tz applies to cron only",
            ),
            (r#"{"name":"a","cron":"0 0 30 2 *"}"#, "never fires"),
            (
                r#"{"name":"a","cron":"61 * * * *"}"#,
                "invalid cron expression \"61 * * * *\"",
            ),
            (
                r#"{"name":"a","cron":"@daily","tz":"Europe/Nowhere"}"#,
                "unknown time zone",
            ),
            (
                r#"{"name":"a","every":"1m","catchup_window":"2d"}"#,
                "catchup_window is longer",
            ),
            (
                r#"{"name":"a","every":"1m","jitter":"x"}"#,
                "jitter \"x\" is not a duration",
            ),
            (
                r#"{"name":"a","every":"1m","task":{"pool":"a b"}}"#,
                "pool name \"a b\"",
            ),
            (
                r#"{"name":"a","every":"1m","task":{"max_attempts":0}}"#,
                "max_attempts must be at least 1",
            ),
            (
                r#"{"name":"a","every":"1m","task":{"attempt_timeout":"0s"}}"#,
                "attempt_timeout must be positive",
            ),
            (
                r#"{"name":"a","every":"1m","task":{"labels":{"gpu":""}}}"#,
                "label",
            ),
        ];
        for (json, want) in cases {
            let got = refused(json);
            assert!(
                got.contains(want),
                "{json}: {got:?} does not contain {want:?}"
            );
        }
    }

    #[test]
    fn unknown_fields_are_refused_when_parsing() {
        assert!(serde_json::from_str::<ScheduleSpec>(r#"{"name":"a","evry":"1m"}"#).is_err());
    }

    #[test]
    fn a_tick_makes_a_task_with_its_key_and_a_deadline_from_the_tick() {
        let s = spec(
            r#"{"name":"rep","every":"1h","task":{"pool":"p","payload":"x","priority":3,
                "max_attempts":2,"attempt_timeout":"30s","deadline":"10m"}}"#,
        )
        .validate()
        .unwrap();
        let tick = Millis(3_600_000);
        let task = s.template.task_at(&s.name, tick);
        assert_eq!(task.key(), Some("schedule:rep:3600000"));
        assert_eq!(task.pool_name(), "p");
        assert_eq!(task.payload().as_ref(), b"x");
        let spec = task.to_spec(TaskId(7), 1024).unwrap();
        assert_eq!(spec.deadline, Some(Millis(3_600_000 + 600_000)));
        assert_eq!(spec.priority, 3);
        assert_eq!(spec.max_attempts, Some(2));
        assert_eq!(spec.attempt_timeout, Some(Millis(30_000)));
    }

    #[test]
    fn a_spec_round_trips_through_json() {
        let s = spec(
            r#"{"name":"a","cron":"*/5 * * * *","tz":"America/New_York","overlap":"buffer_one",
                "catchup_window":"5m","jitter":"10s","paused":true,"task":{"labels":{"zone":"eu"}}}"#,
        );
        let again: ScheduleSpec =
            serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(again, s);
        let v = s.validate().unwrap();
        assert_eq!(v.overlap, Overlap::BufferOne);
        assert_eq!(v.jitter, Millis(10_000));
        assert!(v.paused);
    }
}
