//! The JSON of the schedule API (issue 23): what `POST /v1/schedules`
//! reads ([`CreateScheduleRequest`], a [`ScheduleSpec`] with its task
//! options), what `GET /v1/schedules` and `GET /v1/schedules/{name}` answer
//! ([`ScheduleEntry`], [`ScheduleInfo`]), and the bodies of `trigger` and
//! `backfill`. Every shell answers with these types: the embedded
//! scheduler, the leader, and the remote client over NATS.
//!
//! Instants are milliseconds since the Unix epoch ([`Millis`], a JSON
//! number), as in the rest of the API; [`BackfillRequest`] takes RFC 3339
//! text because people type it.

use serde::{Deserialize, Serialize};

use crate::core::{excerpt, ErrorCode, Millis};
use crate::schedule::{Entry, Overlap, ScheduleSpec, ScheduleState};
pub use crate::schedule::{
    FireKind, FireRecord, MissedTicks, ScheduleCounters, MAX_BACKFILL_TICKS,
};
use crate::wire::WireError;

/// `POST /v1/schedules`: the schedule as users give it (name, `cron` or
/// `every`, `tz`, `overlap`, `catchup_window`, `jitter`, `paused`, and the
/// task options under `task`). Unknown fields are refused.
pub type CreateScheduleRequest = ScheduleSpec;

/// How many fire instants [`ScheduleInfo::next_fires`] lists.
pub const NEXT_FIRES: usize = 5;

/// `GET /v1/schedules/{name}`: everything about one schedule.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduleInfo {
    /// The schedule as created (with `paused` as it is now).
    pub spec: ScheduleSpec,
    /// The firing state: decided through, last fired, active, buffered.
    pub state: ScheduleState,
    /// Whether it is paused.
    pub paused: bool,
    /// The credential that created it and owns its tasks (`None`
    /// embedded or without credentials).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// When it was created.
    pub created_at: Millis,
    /// The next [`NEXT_FIRES`] fire instants (tick plus jitter); empty
    /// while paused.
    pub next_fires: Vec<Millis>,
    /// The most recent runs, newest first (bounded).
    pub history: Vec<FireRecord>,
    /// The most recent ticks skipped by the overlap policy, newest first
    /// (bounded).
    pub skipped: Vec<Millis>,
    /// The most recent ranges of missed ticks, newest first (bounded).
    pub missed: Vec<MissedTicks>,
    /// Counters.
    pub counters: ScheduleCounters,
}

/// One line of `GET /v1/schedules`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduleEntry {
    /// The name.
    pub name: String,
    /// The cron expression, if a cron schedule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
    /// The interval, if an interval schedule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every: Option<String>,
    /// The zone of `cron`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tz: Option<String>,
    /// The overlap policy.
    pub overlap: Overlap,
    /// The pool its tasks go to.
    pub pool: String,
    /// Whether it is paused.
    pub paused: bool,
    /// Its owner, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// The next fire instant (`None` while paused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_fire: Option<Millis>,
    /// The most recent run, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last: Option<FireRecord>,
    /// Counters.
    pub counters: ScheduleCounters,
}

impl ScheduleInfo {
    /// The answer for one schedule of a [`crate::schedule::Book`].
    pub fn of(entry: &Entry) -> ScheduleInfo {
        ScheduleInfo {
            spec: entry.spec.clone(),
            state: entry.state,
            paused: entry.schedule.paused,
            owner: entry.owner.clone(),
            created_at: entry.created_at,
            next_fires: entry.next_fires(NEXT_FIRES),
            history: entry.history().rev().cloned().collect(),
            skipped: entry.skipped().rev().copied().collect(),
            missed: entry.missed().rev().copied().collect(),
            counters: entry.counters,
        }
    }
}

impl ScheduleEntry {
    /// The list line of one schedule of a [`crate::schedule::Book`].
    pub fn of(entry: &Entry) -> ScheduleEntry {
        ScheduleEntry {
            name: entry.schedule.name.clone(),
            cron: entry.spec.cron.clone(),
            every: entry.spec.every.clone(),
            tz: entry.spec.tz.clone(),
            overlap: entry.schedule.overlap,
            pool: entry.schedule.template.pool.as_str().to_string(),
            paused: entry.schedule.paused,
            owner: entry.owner.clone(),
            next_fire: entry.next_fire(),
            last: entry.history().next_back().cloned(),
            counters: entry.counters,
        }
    }
}

/// `POST /v1/schedules/{name}/backfill`: fire each tick in `from..=to`
/// (RFC 3339), obeying the overlap policy.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BackfillRequest {
    /// The first instant of the range (RFC 3339).
    pub from: String,
    /// The last instant of the range, inclusive (RFC 3339).
    pub to: String,
}

/// A parsed backfill range: every tick `t` with `from <= t <= to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackfillRange {
    /// First instant, inclusive.
    pub from: Millis,
    /// Last instant, inclusive.
    pub to: Millis,
}

impl BackfillRequest {
    /// The range, or `INVALID_ARGUMENT` naming the bad field.
    ///
    /// ```
    /// use cronoq::api::BackfillRequest;
    /// let r = BackfillRequest { from: "2026-01-01T00:00:00Z".into(), to: "2026-01-01T01:00:00Z".into() };
    /// assert_eq!(r.range().unwrap().to.0 - r.range().unwrap().from.0, 3_600_000);
    /// assert!(BackfillRequest { from: "soon".into(), to: "later".into() }.range().is_err());
    /// let offset = BackfillRequest { from: "2026-01-01T01:00:00+01:00".into(), to: "2026-01-01T01:00:00Z".into() };
    /// assert_eq!(offset.range().unwrap().to.0 - offset.range().unwrap().from.0, 3_600_000);
    /// ```
    pub fn range(&self) -> Result<BackfillRange, WireError> {
        let at = |field: &str, text: &str| {
            crate::task::parse_rfc3339(text)
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(Millis::from_duration)
                .ok_or_else(|| {
                    WireError::new(
                        ErrorCode::INVALID_ARGUMENT,
                        format!(
                            "{field} {} is not an RFC 3339 time (2026-12-02T16:00:00Z)",
                            excerpt(text)
                        ),
                    )
                })
        };
        BackfillRange::new(at("from", &self.from)?, at("to", &self.to)?)
    }
}

impl BackfillRange {
    /// A range; `INVALID_ARGUMENT` if `from` is after `to`.
    pub fn new(from: Millis, to: Millis) -> Result<BackfillRange, WireError> {
        if from > to {
            return Err(WireError::new(
                ErrorCode::INVALID_ARGUMENT,
                "backfill range is empty: from is after to",
            ));
        }
        Ok(BackfillRange { from, to })
    }
}

/// What a backfill did: the runs it started and the ticks it skipped.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackfillReport {
    /// Runs started, in tick order.
    pub fired: Vec<FireRecord>,
    /// Ticks the overlap policy skipped.
    pub skipped: Vec<Millis>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{TaskId, TaskState};
    use crate::schedule::MissReason;

    #[test]
    fn info_round_trips_through_json() {
        let info = ScheduleInfo {
            spec: serde_json::from_str(r#"{"name":"a","every":"1m"}"#).unwrap(),
            state: ScheduleState::new(Millis(5)),
            paused: false,
            owner: Some("ops".into()),
            created_at: Millis(5),
            next_fires: vec![Millis(60_000)],
            history: vec![FireRecord {
                tick: Millis(60_000),
                fired_at: Millis(60_001),
                kind: FireKind::Tick,
                task: Some(TaskId(3)),
                outcome: Some(TaskState::Succeeded),
                error: None,
            }],
            skipped: vec![],
            missed: vec![MissedTicks {
                first: Millis(1),
                until: Millis(2),
                reason: MissReason::TooLate,
                ticks: 1,
            }],
            counters: ScheduleCounters {
                fires: 1,
                skipped: 0,
                missed: 1,
            },
        };
        let json = serde_json::to_string(&info).unwrap();
        assert_eq!(serde_json::from_str::<ScheduleInfo>(&json).unwrap(), info);
    }

    #[test]
    fn a_backfill_range_must_not_run_backwards() {
        let r = BackfillRequest {
            from: "2026-01-02T00:00:00Z".into(),
            to: "2026-01-01T00:00:00Z".into(),
        };
        let e = r.range().unwrap_err();
        assert_eq!(e.code, ErrorCode::INVALID_ARGUMENT);
        let e = BackfillRequest {
            from: "x".into(),
            to: "2026-01-01T00:00:00Z".into(),
        }
        .range()
        .unwrap_err();
        assert!(e.message.contains("from \"x\""), "{}", e.message);
    }
}
