//! When a schedule ticks: a [`Cadence`] is a cron expression read in an
//! IANA time zone, or a fixed interval. `next_after(t)` is the only
//! question it answers; it reads no clock.
//!
//! **Cron grammar** is croner's (`croner` crate): 5 fields, or 6 with
//! seconds first, and the nicknames `@hourly`, `@daily`, `@weekly`,
//! `@monthly`, `@yearly` (`@annually`). Day of month and day of week are
//! ORed when both are restricted, as Vixie cron does. A year field is
//! refused. An expression that never fires (`0 0 30 2 *`) is refused when
//! the cadence is built, not discovered at run time.
//!
//! **Daylight saving** follows Vixie/ISC cron and cronie, as croner
//! implements it with `jiff`'s zone rules (the tz database is compiled in,
//! so the answer does not depend on the machine's tzdata):
//! - a *fixed-time* expression (second, minute and hour each one number,
//!   e.g. `30 2 * * *`) whose time falls in the hour a spring-forward skips
//!   fires once, at the first instant after the jump; in a repeated
//!   fall-back hour it fires once, on the first pass;
//! - a *wildcard* expression (`*`, a step or a list in second, minute or
//!   hour: `*/15 * * * *`, `@hourly`) follows real time: ticks inside a
//!   skipped hour do not exist, and a repeated hour ticks on both passes
//!   (they are different instants, so different ticks).
//!
//! The reference table in `tests.rs` checks this on Europe/Berlin,
//! America/New_York, Australia/Lord_Howe (a 30-minute shift),
//! America/Sao_Paulo and Asia/Tehran (DST abolished in 2019 and 2022).
//!
//! **Intervals** ignore wall clocks and zones: the ticks of `every = D` are
//! the multiples of D since the Unix epoch (`every = 5m` ticks at :00, :05,
//! … UTC; `every = 1h` on the UTC hour). Anchoring to the epoch rather
//! than to the schedule's creation means every leader, before and after a
//! failover, computes the same ticks from nothing but the spec, and
//! re-creating a schedule does not shift them.

use std::fmt;

use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;
use jiff::tz::TimeZone;
use jiff::{Timestamp, Zoned};

use crate::core::{excerpt, Millis, Rejection, MAX_HORIZON};

/// The shortest interval accepted.
pub const MIN_EVERY: Millis = Millis(1_000);

/// When a schedule ticks: cron in a zone, or an interval.
///
/// ```
/// use cronoq::core::Millis;
/// use cronoq::schedule::Cadence;
/// let daily = Cadence::cron("0 3 * * *", "Europe/Berlin").unwrap();
/// // 2026-07-01T00:00:00Z → 03:00 CEST = 01:00Z the same day.
/// assert_eq!(daily.next_after(Millis(1_782_864_000_000)), Some(Millis(1_782_867_600_000)));
/// let every = Cadence::every(Millis(300_000)).unwrap();
/// assert_eq!(every.next_after(Millis(1)), Some(Millis(300_000)));
/// assert!(Cadence::cron("0 0 30 2 *", "UTC").is_err());
/// ```
#[derive(Clone)]
pub enum Cadence {
    /// A cron expression read in a time zone.
    Cron {
        /// The expression as given.
        expr: String,
        /// The parsed expression.
        cron: Box<Cron>,
        /// The zone's name as given (`UTC` by default).
        tz_name: String,
        /// The zone.
        tz: TimeZone,
    },
    /// Every `every`, on the multiples of it since the Unix epoch.
    Every(Millis),
}

impl Cadence {
    /// A cron cadence: `expr` (5 or 6 fields, or an `@` nickname) read in
    /// the IANA zone `tz`. Refuses a malformed expression, an unknown zone
    /// and an expression that never fires, as `INVALID_ARGUMENT`.
    pub fn cron(expr: &str, tz: &str) -> Result<Cadence, Rejection> {
        let zone = TimeZone::get(tz).map_err(|_| {
            Rejection::InvalidArgument(format!(
                "unknown time zone {} (want an IANA name such as Europe/Berlin or UTC)",
                excerpt(tz)
            ))
        })?;
        let trimmed = expr.trim();
        if trimmed.is_empty() {
            return Err(Rejection::InvalidArgument(
                "cron expression is empty".into(),
            ));
        }
        let parser = CronParser::builder()
            .seconds(Seconds::Optional)
            .year(Year::Disallowed)
            .build();
        let cron = parser.parse(trimmed).map_err(|e| {
            Rejection::InvalidArgument(format!(
                "invalid cron expression {}: {} (want 5 fields, 6 with seconds first, or \
                 @hourly/@daily/@weekly/@monthly/@yearly)",
                excerpt(expr),
                lowercase_message(&e.to_string())
            ))
        })?;
        let cadence = Cadence::Cron {
            expr: trimmed.to_string(),
            cron: Box::new(cron),
            tz_name: tz.to_string(),
            tz: zone,
        };
        // Without a year field, an expression that fires at all fires
        // within 28 years of any date (the Gregorian calendar's weekday
        // cycle for dates between 1901 and 2099); croner searches further.
        if cadence.next_after(NEVER_FIRES_PROBE).is_none() {
            return Err(Rejection::InvalidArgument(format!(
                "cron expression {} never fires",
                excerpt(expr)
            )));
        }
        Ok(cadence)
    }

    /// An interval cadence: ticks at the multiples of `every` since the
    /// Unix epoch. Refuses zero, sub-second and over-10-year intervals.
    pub fn every(every: Millis) -> Result<Cadence, Rejection> {
        if every < MIN_EVERY {
            return Err(Rejection::InvalidArgument(format!(
                "interval every = {} is below the minimum of 1s",
                humantime::format_duration(every.to_duration())
            )));
        }
        if every > MAX_HORIZON {
            return Err(Rejection::InvalidArgument(
                "interval every is longer than the limit of 10 years".into(),
            ));
        }
        Ok(Cadence::Every(every))
    }

    /// The first tick strictly after `t`, or `None` if there is none
    /// (croner searches up to the year 5000).
    pub fn next_after(&self, t: Millis) -> Option<Millis> {
        match self {
            Cadence::Every(every) => {
                let k = t.0 / every.0 + 1;
                k.checked_mul(every.0).map(Millis)
            }
            Cadence::Cron { cron, tz, .. } => {
                // Cron ticks fall on whole seconds: searching strictly after
                // the whole second at or before `t` finds the first tick
                // strictly after `t`. The search starts from the exact
                // instant (not a wall clock time), which tells croner which
                // pass of a repeated hour it is on.
                let secs = i64::try_from(t.0 / 1000).ok()?;
                let start = Zoned::new(Timestamp::from_second(secs).ok()?, tz.clone());
                let next = cron.find_next_occurrence(&start, false).ok()?;
                let ms = next.timestamp().as_millisecond();
                u64::try_from(ms).ok().map(Millis)
            }
        }
    }

    /// Up to `count` ticks strictly after `t`, in order.
    pub fn ticks_after(&self, t: Millis, count: usize) -> Vec<Millis> {
        let mut out = Vec::with_capacity(count.min(1024));
        let mut at = t;
        while out.len() < count {
            match self.next_after(at) {
                Some(next) => {
                    out.push(next);
                    at = next;
                }
                None => break,
            }
        }
        out
    }
}

/// Where the never-fires check searches from: 2000-01-01T00:00:00Z.
const NEVER_FIRES_PROBE: Millis = Millis(946_684_800_000);

/// croner's messages are sentences ("Invalid pattern: Pattern must …."):
/// as part of ours they lose the capital and the final period (STYLE §3).
fn lowercase_message(text: &str) -> String {
    let text = text.trim().trim_end_matches('.');
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => String::new(),
    }
}

impl fmt::Debug for Cadence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cadence::Cron { expr, tz_name, .. } => write!(f, "Cron({expr:?} in {tz_name})"),
            Cadence::Every(every) => write!(f, "Every({every})"),
        }
    }
}

impl PartialEq for Cadence {
    fn eq(&self, other: &Cadence) -> bool {
        match (self, other) {
            (
                Cadence::Cron {
                    expr: a,
                    tz_name: za,
                    ..
                },
                Cadence::Cron {
                    expr: b,
                    tz_name: zb,
                    ..
                },
            ) => a == b && za == zb,
            (Cadence::Every(a), Cadence::Every(b)) => a == b,
            _ => false,
        }
    }
}

impl Eq for Cadence {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interval_ticks_on_multiples_of_every_since_the_epoch() {
        let c = Cadence::every(Millis(30_000)).unwrap();
        assert_eq!(c.next_after(Millis(0)), Some(Millis(30_000)));
        assert_eq!(c.next_after(Millis(29_999)), Some(Millis(30_000)));
        assert_eq!(c.next_after(Millis(30_000)), Some(Millis(60_000)));
        assert_eq!(c.next_after(Millis(u64::MAX - 1)), None);
    }

    #[test]
    fn zero_and_sub_second_intervals_are_refused() {
        for ms in [0, 1, 999] {
            let e = Cadence::every(Millis(ms)).unwrap_err();
            assert!(e.to_string().contains("below the minimum of 1s"), "{e}");
        }
        assert!(Cadence::every(Millis(1_000)).is_ok());
    }

    #[test]
    fn cron_ticks_strictly_after_a_mid_second_instant() {
        let c = Cadence::cron("* * * * * *", "UTC").unwrap();
        assert_eq!(c.next_after(Millis(10_500)), Some(Millis(11_000)));
        assert_eq!(c.next_after(Millis(11_000)), Some(Millis(12_000)));
    }

    #[test]
    fn five_six_fields_and_nicknames_parse_seven_and_junk_do_not() {
        for ok in [
            "*/5 * * * *",
            "30 */5 * * * *",
            "@hourly",
            "@daily",
            "@weekly",
            "@monthly",
            "@yearly",
            "@annually",
            "0 9 * * MON-FRI",
        ] {
            assert!(Cadence::cron(ok, "UTC").is_ok(), "{ok}");
        }
        for bad in [
            "",
            "   ",
            "* * * *",
            "0 0 0 1 1 * 2030",
            "60 * * * *",
            "hello",
        ] {
            let e = Cadence::cron(bad, "UTC").unwrap_err();
            assert_eq!(e.code(), crate::core::ErrorCode::INVALID_ARGUMENT);
        }
    }

    #[test]
    fn an_expression_that_never_fires_is_refused() {
        let e = Cadence::cron("0 0 30 2 *", "UTC").unwrap_err();
        assert_eq!(e.to_string(), "cron expression \"0 0 30 2 *\" never fires");
        // February 29th fires (in leap years).
        assert!(Cadence::cron("0 0 29 2 *", "UTC").is_ok());
    }

    #[test]
    fn an_unknown_zone_is_refused_by_name() {
        let e = Cadence::cron("@daily", "Mars/Olympus_Mons").unwrap_err();
        assert!(
            e.to_string()
                .contains("unknown time zone \"Mars/Olympus_Mons\""),
            "{e}"
        );
    }

    #[test]
    fn interval_ignores_wall_clocks() {
        // Berlin springs forward on 2026-03-29 at 01:00Z; an hourly interval
        // knows nothing of it.
        let c = Cadence::every(Millis(3_600_000)).unwrap();
        let from = Millis(1_774_742_400_000); // 2026-03-29T00:00:00Z
        let ticks = c.ticks_after(from, 3);
        assert_eq!(
            ticks,
            vec![
                Millis(from.0 + 3_600_000),
                Millis(from.0 + 7_200_000),
                Millis(from.0 + 10_800_000)
            ]
        );
    }
}
