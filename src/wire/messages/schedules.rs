//! The client API's schedule requests (`P.api.schedule_*`, issue 23) and
//! the page of the list's reply. Bodies are MessagePack maps with `v`, as
//! every request; the schedule travels as the JSON API's types
//! ([`ScheduleSpec`]; replies `crate::api::ScheduleInfo`, `FireRecord`,
//! `BackfillReport`), which MessagePack carries as they are: named maps,
//! so `deny_unknown_fields` and skipped fields behave as in JSON. A spec is
//! wrapped, not flattened: serde cannot flatten a struct that refuses
//! unknown fields.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::v;
use crate::core::Millis;
use crate::schedule::ScheduleSpec;

/// Create a schedule (request on `P.api.schedule_create`; reply
/// `ScheduleInfo`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CreateSchedule {
    /// Protocol version.
    #[serde(default = "v")]
    pub v: u16,
    /// The schedule, as `POST /v1/schedules` takes it.
    pub spec: ScheduleSpec,
}

impl CreateSchedule {
    /// The request for `spec`.
    pub fn new(spec: ScheduleSpec) -> CreateSchedule {
        CreateSchedule { v: v(), spec }
    }
}

/// One page of the schedules, by name (request on `P.api.schedule_list`;
/// reply [`ScheduleList`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ListSchedules {
    /// Protocol version.
    #[serde(default = "v")]
    pub v: u16,
    /// Only names after this one (the last name of the previous page).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
}

impl Default for ListSchedules {
    fn default() -> Self {
        ListSchedules::after(None)
    }
}

impl ListSchedules {
    /// The page after `after` (`None`: the first).
    pub fn after(after: Option<String>) -> ListSchedules {
        ListSchedules { v: v(), after }
    }
}

/// A page of the schedules (the reply to `P.api.schedule_list`), as many
/// as fit in one NATS message. `E` is `crate::api::ScheduleEntry` (the
/// wire sits below the API types, so it does not name them).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ScheduleList<E> {
    /// Schedules by name, after the request's `after`.
    pub schedules: Vec<E>,
    /// More follow: ask again after the last name of this page.
    #[serde(default)]
    pub more: bool,
}

/// One schedule by name: the request on `P.api.schedule_get`,
/// `schedule_pause`, `schedule_resume` (reply `ScheduleInfo`),
/// `schedule_delete` ([`super::Ack`]) and `schedule_trigger`
/// (`FireRecord`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ScheduleName {
    /// Protocol version.
    #[serde(default = "v")]
    pub v: u16,
    /// The schedule.
    pub name: String,
}

impl ScheduleName {
    /// The request for `name`.
    pub fn new(name: impl Into<String>) -> ScheduleName {
        ScheduleName {
            v: v(),
            name: name.into(),
        }
    }
}

/// Fire each tick in `from..=to` (request on `P.api.schedule_backfill`;
/// reply `BackfillReport`). Instants in ms since the epoch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct BackfillSchedule {
    /// Protocol version.
    #[serde(default = "v")]
    pub v: u16,
    /// The schedule.
    pub name: String,
    /// The first instant, inclusive.
    pub from: Millis,
    /// The last instant, inclusive.
    pub to: Millis,
}

impl BackfillSchedule {
    /// The request for `name` over `from..=to`.
    pub fn new(name: impl Into<String>, from: Millis, to: Millis) -> BackfillSchedule {
        BackfillSchedule {
            v: v(),
            name: name.into(),
            from,
            to,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::ErrorCode;
    use crate::wire::{decode_request, encode};

    #[test]
    fn schedule_requests_round_trip_through_messagepack() {
        let full: ScheduleSpec = serde_json::from_str(
            r#"{"name":"nightly","cron":"30 2 * * *","tz":"Europe/Berlin","overlap":"skip",
                "catchup_window":"10m","jitter":"5s","paused":true,
                "task":{"pool":"reports","labels":{"gpu":"a100"},"priority":3,"payload":"build",
                        "max_attempts":2,"attempt_timeout":"20m","deadline":"1h"}}"#,
        )
        .unwrap();
        let minimal: ScheduleSpec = serde_json::from_str(r#"{"name":"a","every":"1m"}"#).unwrap();
        for spec in [full, minimal] {
            let create = CreateSchedule::new(spec);
            assert_eq!(
                decode_request::<CreateSchedule>(&encode(&create)).unwrap(),
                create
            );
        }
        let backfill = BackfillSchedule::new("nightly", Millis(1), Millis(2));
        assert_eq!(
            decode_request::<BackfillSchedule>(&encode(&backfill)).unwrap(),
            backfill
        );
        for list in [
            ListSchedules::after(None),
            ListSchedules::after(Some("b".into())),
        ] {
            assert_eq!(
                decode_request::<ListSchedules>(&encode(&list)).unwrap(),
                list
            );
        }
    }

    #[test]
    fn a_spec_with_an_unknown_field_is_refused_as_invalid() {
        #[derive(Serialize)]
        struct Odd {
            v: u16,
            spec: serde_json::Value,
        }
        let odd = Odd {
            v: v(),
            spec: serde_json::json!({"name": "a", "every": "1m", "colour": "red"}),
        };
        let e = decode_request::<CreateSchedule>(&encode(&odd)).unwrap_err();
        assert_eq!(e.code, ErrorCode::INVALID_ARGUMENT);
        assert!(e.message.contains("colour"), "{}", e.message);
        let e = decode_request::<ScheduleName>(&encode(&ListSchedules::default())).unwrap_err();
        assert_eq!(e.code, ErrorCode::INVALID_ARGUMENT);
    }
}
