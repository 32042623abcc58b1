//! `cronoq schedule …`: schedules from the command line. For now
//! `schedule preview`, which prints the next fire instants of a cron
//! expression or an interval without a server — the same
//! `ScheduleSpec::validate` and `Cadence::next_after` a leader uses, so
//! what it prints is what a schedule will do (before jitter).

use std::process::ExitCode;

use clap::{Args, Subcommand};

use crate::core::{excerpt, Millis, Rejection};
use crate::schedule::ScheduleSpec;

/// The most instants `preview` prints.
pub const MAX_PREVIEW_COUNT: u64 = 1_000;

/// `cronoq schedule` arguments.
#[derive(Debug, Args)]
pub struct ScheduleArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: ScheduleCommand,
}

/// The `cronoq schedule` subcommands.
#[derive(Debug, Subcommand)]
pub enum ScheduleCommand {
    /// Print the next fire instants (RFC 3339, UTC), one a line; no server.
    Preview(PreviewArgs),
}

/// `cronoq schedule preview` arguments. Exactly one of `--cron`, `--every`.
#[derive(Debug, Args)]
pub struct PreviewArgs {
    /// A cron expression: 5 fields, 6 with seconds first, or
    /// @hourly/@daily/@weekly/@monthly/@yearly.
    #[arg(long, value_name = "EXPR", allow_hyphen_values = true)]
    pub cron: Option<String>,
    /// An interval (`30s`, `5m`): ticks on its multiples since the Unix
    /// epoch.
    #[arg(long, value_name = "DUR")]
    pub every: Option<String>,
    /// The IANA time zone the cron expression is read in (default UTC).
    #[arg(long, value_name = "ZONE")]
    pub tz: Option<String>,
    /// Print the fires strictly after this RFC 3339 instant (default now).
    #[arg(long, value_name = "T", allow_hyphen_values = true)]
    pub from: Option<String>,
    /// How many fires to print (1–1000).
    #[arg(long, value_name = "N", default_value_t = 5)]
    pub count: u64,
    /// Print a JSON array of RFC 3339 strings instead.
    #[arg(long)]
    pub json: bool,
}

/// Runs a `cronoq schedule` subcommand.
pub fn run(args: ScheduleArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        ScheduleCommand::Preview(args) => preview(args),
    }
}

fn preview(args: PreviewArgs) -> anyhow::Result<ExitCode> {
    let lines = preview_lines(&args, now())?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&lines)?);
    } else {
        for line in lines {
            println!("{line}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The instants `preview` prints, checked in full before anything is
/// printed (a refusal prints nothing on stdout).
fn preview_lines(args: &PreviewArgs, now: Millis) -> Result<Vec<String>, Rejection> {
    let spec = ScheduleSpec {
        name: "preview".into(),
        cron: args.cron.clone(),
        every: args.every.clone(),
        tz: args.tz.clone(),
        ..ScheduleSpec::default()
    };
    let schedule = spec.validate()?;
    if !(1..=MAX_PREVIEW_COUNT).contains(&args.count) {
        return Err(Rejection::InvalidArgument(format!(
            "--count {} is out of range (1 to {MAX_PREVIEW_COUNT})",
            args.count
        )));
    }
    let from = match &args.from {
        Some(text) => parse_instant(text)?,
        None => now,
    };
    let count = usize::try_from(args.count).unwrap_or(usize::MAX);
    Ok(schedule
        .cadence
        .ticks_after(from, count)
        .into_iter()
        .map(rfc3339)
        .collect())
}

/// An RFC 3339 instant (`2026-03-29T00:00:00Z`, `…+02:00`) at or after the
/// Unix epoch.
fn parse_instant(text: &str) -> Result<Millis, Rejection> {
    let bad = || {
        Rejection::InvalidArgument(format!(
            "--from {} is not an RFC 3339 instant (want e.g. 2026-03-29T00:00:00Z)",
            excerpt(text)
        ))
    };
    let t: jiff::Timestamp = text.trim().parse().map_err(|_| bad())?;
    u64::try_from(t.as_millisecond())
        .map(Millis)
        .map_err(|_| Rejection::InvalidArgument(format!("--from {} is before 1970", excerpt(text))))
}

/// `2026-03-29T01:00:00Z` (milliseconds shown only when not zero).
fn rfc3339(t: Millis) -> String {
    match i64::try_from(t.0)
        .ok()
        .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
    {
        Some(ts) => ts.to_string(),
        None => format!("{}ms", t.0),
    }
}

/// The wall clock, read here in the shell (the schedule rules read none).
fn now() -> Millis {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(Millis::from_duration)
        .unwrap_or(Millis::ZERO)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(cron: Option<&str>, every: Option<&str>, from: &str, count: u64) -> PreviewArgs {
        PreviewArgs {
            cron: cron.map(String::from),
            every: every.map(String::from),
            tz: None,
            from: Some(from.into()),
            count,
            json: false,
        }
    }

    #[test]
    fn preview_lists_the_next_fires_strictly_after_from() {
        let a = args(Some("*/15 * * * *"), None, "2026-03-29T00:00:00Z", 3);
        assert_eq!(
            preview_lines(&a, Millis::ZERO).unwrap(),
            [
                "2026-03-29T00:15:00Z",
                "2026-03-29T00:30:00Z",
                "2026-03-29T00:45:00Z"
            ]
        );
        let a = args(None, Some("90s"), "2026-03-29T00:00:00+01:00", 2);
        assert_eq!(
            preview_lines(&a, Millis::ZERO).unwrap(),
            ["2026-03-28T23:01:30Z", "2026-03-28T23:03:00Z"]
        );
    }

    #[test]
    fn preview_refuses_a_bad_count_and_a_bad_from() {
        let e = preview_lines(
            &args(Some("@daily"), None, "2026-01-01T00:00:00Z", 0),
            Millis::ZERO,
        );
        assert!(e
            .unwrap_err()
            .to_string()
            .contains("--count 0 is out of range"));
        let e = preview_lines(&args(Some("@daily"), None, "yesterday", 1), Millis::ZERO);
        assert!(e
            .unwrap_err()
            .to_string()
            .contains("--from \"yesterday\" is not an RFC 3339"));
    }
}
