//! `cronoq schedule …`: schedules from the command line.
//!
//! `create`, `list`, `get`, `pause`, `resume`, `delete`, `trigger` and
//! `backfill` ask a server (over `--http`, the default, or `--nats`, with
//! the same connection and credential flags and env vars as `submit`);
//! `create` takes `submit`'s task options (its [`SubmitArgs`], flattened)
//! and refuses the ones a schedule has no use for. Every command prints
//! text, or with `--json` the API's JSON ([`crate::api`]'s schedule
//! types). `preview` prints the next fire instants of a cron expression
//! or an interval without a server — the same `ScheduleSpec::validate`
//! and `Cadence::next_after` a leader uses, so what it prints is what a
//! schedule will do (before jitter).

use std::fmt::Write as _;
use std::process::ExitCode;

use clap::{Args, Subcommand};

use super::client_cmds::{read_payload, Remote, SubmitArgs};
use super::Connect;
use crate::api::{Api, BackfillReport, BackfillRequest, FireRecord, ScheduleEntry, ScheduleInfo};
use crate::core::{excerpt, Labels, Millis, Rejection};
use crate::schedule::{Overlap, ScheduleSpec, TaskTemplate};

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
    /// Create a schedule: one task per tick, with `submit`'s task options.
    Create(Box<CreateArgs>),
    /// List the schedules: cadence, next fire, last run, paused.
    List(ListArgs),
    /// Show a schedule: the next 5 fires, recent runs (tick → task,
    /// outcome), skipped and missed ticks.
    Get(NameArgs),
    /// Pause a schedule: its ticks pass without runs (recorded as missed).
    Pause(NameArgs),
    /// Resume a paused schedule from now.
    Resume(NameArgs),
    /// Delete a schedule (its running tasks go on).
    Delete(NameArgs),
    /// Run a schedule's task once now, outside the tick sequence; prints
    /// the task id.
    Trigger(NameArgs),
    /// Fire each tick from --from to --to (inclusive), obeying the
    /// overlap policy.
    Backfill(BackfillArgs),
    /// Print the next fire instants (RFC 3339, UTC), one a line; no server.
    Preview(PreviewArgs),
}

/// `cronoq schedule create` arguments: the schedule, then `submit`'s task
/// options and payload (`--start-at`, `--tolerance`, `--est-runtime`,
/// `--idempotency-key` and `--wait` are refused: a tick is the start, and
/// the tick keys its task; `--traceparent` is not used: each run starts
/// its own trace).
#[derive(Debug, Args)]
pub struct CreateArgs {
    /// The schedule's name: 1–64 of letters, digits, `_` and `-`.
    pub name: String,
    #[command(flatten)]
    pub cadence: CadenceArgs,
    /// What a tick does while the previous run is queued or running.
    #[arg(long, value_name = "POLICY",
          value_parser = ["allow", "skip", "buffer_one", "cancel_previous"])]
    pub overlap: Option<String>,
    /// How old a tick missed while no leader ran may be and still fire
    /// (default 1m, at most 1d).
    #[arg(long, value_name = "DUR")]
    pub catchup_window: Option<String>,
    /// Delay each fire by up to this much (same delay for the same tick).
    #[arg(long, value_name = "DUR")]
    pub jitter: Option<String>,
    /// Create it paused.
    #[arg(long)]
    pub paused: bool,
    /// Print the schedule as JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// The task each tick submits (`--deadline` is a duration counted
    /// from the tick) and how to connect.
    #[command(flatten)]
    pub task: SubmitArgs,
}

/// `cronoq schedule list` arguments.
#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub connect: Connect,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of the commands that name one schedule.
#[derive(Debug, Args)]
pub struct NameArgs {
    #[command(flatten)]
    pub connect: Connect,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// The schedule's name.
    pub name: String,
}

/// `cronoq schedule backfill` arguments.
#[derive(Debug, Args)]
pub struct BackfillArgs {
    #[command(flatten)]
    pub connect: Connect,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// The first instant of the range (RFC 3339).
    #[arg(long, value_name = "T", allow_hyphen_values = true)]
    pub from: String,
    /// The last instant of the range, inclusive (RFC 3339).
    #[arg(long, value_name = "T", allow_hyphen_values = true)]
    pub to: String,
    /// The schedule's name.
    pub name: String,
}

/// When a schedule ticks: exactly one of `--cron`, `--every` (shared by
/// `create` and `preview`).
#[derive(Debug, Clone, Args)]
pub struct CadenceArgs {
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
}

/// `cronoq schedule preview` arguments.
#[derive(Debug, Args)]
pub struct PreviewArgs {
    #[command(flatten)]
    pub cadence: CadenceArgs,
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
pub async fn run(args: ScheduleArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        ScheduleCommand::Create(args) => create(*args).await,
        ScheduleCommand::List(args) => list(args).await,
        ScheduleCommand::Get(args) => {
            let api = connect(&args.connect).await?;
            let info = api.get_schedule(args.name).await?;
            show(&info, args.json, info_text)
        }
        ScheduleCommand::Pause(args) => set_paused(args, true).await,
        ScheduleCommand::Resume(args) => set_paused(args, false).await,
        ScheduleCommand::Delete(args) => {
            let api = connect(&args.connect).await?;
            api.delete_schedule(args.name.clone()).await?;
            let deleted = serde_json::json!({ "deleted": args.name });
            show(&deleted, args.json, |_| format!("deleted {}\n", args.name))
        }
        ScheduleCommand::Trigger(args) => trigger(args).await,
        ScheduleCommand::Backfill(args) => backfill(args).await,
        ScheduleCommand::Preview(args) => preview(args),
    }
}

/// `pause` (`paused`) or `resume`: `paused NAME` / `resumed NAME`.
async fn set_paused(args: NameArgs, paused: bool) -> anyhow::Result<ExitCode> {
    let api = connect(&args.connect).await?;
    let name = args.name.clone();
    let info = if paused {
        api.pause_schedule(name).await?
    } else {
        api.resume_schedule(name).await?
    };
    let done = if paused { "paused" } else { "resumed" };
    show(&info, args.json, |_| format!("{done} {}\n", args.name))
}

/// The server the connection flags name, as an [`Api`]: the same
/// connection (and credential checks before connecting) as `submit`.
async fn connect(connect: &Connect) -> anyhow::Result<Box<dyn Api>> {
    Ok(match Remote::connect(connect).await? {
        Remote::Nats(c) | Remote::NatsWaitingOverHttp(c, _) => c,
        Remote::Http(c) => c,
    })
}

/// Prints `value` as pretty JSON, or as `text` makes it.
fn show<T: serde::Serialize>(
    value: &T,
    json: bool,
    text: impl FnOnce(&T) -> String,
) -> anyhow::Result<ExitCode> {
    if json {
        println!("{}", serde_json::to_string_pretty(value)?);
    } else {
        print!("{}", text(value));
    }
    Ok(ExitCode::SUCCESS)
}

async fn create(args: CreateArgs) -> anyhow::Result<ExitCode> {
    let payload = read_payload(args.task.payload.as_deref())?;
    let spec = spec_of(&args, payload)?;
    // Checked here too, so bad input is refused before connecting.
    spec.validate()?;
    let api = connect(&args.task.connect).await?;
    let info = api.create_schedule(spec).await?;
    show(&info, args.json, info_text)
}

async fn list(args: ListArgs) -> anyhow::Result<ExitCode> {
    let api = connect(&args.connect).await?;
    let entries = api.list_schedules().await?;
    show(&entries, args.json, |e| list_text(e))
}

/// Prints the id of the task a trigger started (exit 0), or why its
/// submission was refused (stderr, exit 1).
async fn trigger(args: NameArgs) -> anyhow::Result<ExitCode> {
    let api = connect(&args.connect).await?;
    let fire = api.trigger_schedule(args.name.clone()).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&fire)?);
    } else if let Some(task) = fire.task {
        println!("{task}");
    }
    match &fire.error {
        Some(e) => {
            eprintln!("{}: the triggered run was refused: {e}", args.name);
            Ok(ExitCode::from(1))
        }
        None => Ok(ExitCode::SUCCESS),
    }
}

async fn backfill(args: BackfillArgs) -> anyhow::Result<ExitCode> {
    let range = BackfillRequest {
        from: args.from.clone(),
        to: args.to.clone(),
    }
    .range()?;
    let api = connect(&args.connect).await?;
    let report = api.backfill_schedule(args.name.clone(), range).await?;
    show(&report, args.json, backfill_text)
}

/// The [`ScheduleSpec`] `create`'s flags describe; `payload` already read.
fn spec_of(args: &CreateArgs, payload: Vec<u8>) -> Result<ScheduleSpec, Rejection> {
    let task = &args.task;
    let refused = [
        (
            task.start_at.is_some(),
            "--start-at",
            "each tick is the start",
        ),
        (
            task.tolerance.is_some(),
            "--tolerance",
            "each tick is the start",
        ),
        (
            task.est_runtime.is_some(),
            "--est-runtime",
            "a schedule's tasks declare no run time",
        ),
        (
            task.idempotency_key.is_some(),
            "--idempotency-key",
            "each tick's task is keyed by the schedule and the tick",
        ),
        (
            task.wait,
            "--wait",
            "follow its runs with `cronoq schedule get`",
        ),
    ];
    if let Some((_, flag, why)) = refused.iter().find(|(given, _, _)| *given) {
        return Err(Rejection::InvalidArgument(format!(
            "{flag} does not apply to a schedule: {why}"
        )));
    }
    if let Some(d) = &task.deadline {
        if humantime::parse_duration(d.trim()).is_err() && crate::task::parse_rfc3339(d).is_some() {
            return Err(Rejection::InvalidArgument(format!(
                "--deadline {} is a time: a schedule's deadline is a duration counted from each tick (10m)",
                excerpt(d)
            )));
        }
    }
    let mut labels = Labels::new();
    for item in &task.labels {
        labels.insert_parsed(item)?;
    }
    labels.validate()?;
    let overlap = match args.overlap.as_deref() {
        None | Some("allow") => Overlap::Allow,
        Some("skip") => Overlap::Skip,
        Some("buffer_one") => Overlap::BufferOne,
        Some("cancel_previous") => Overlap::CancelPrevious,
        Some(other) => {
            return Err(Rejection::InvalidArgument(format!(
                "--overlap {} is not allow, skip, buffer_one or cancel_previous",
                excerpt(other)
            )))
        }
    };
    Ok(ScheduleSpec {
        name: args.name.clone(),
        cron: args.cadence.cron.clone(),
        every: args.cadence.every.clone(),
        tz: args.cadence.tz.clone(),
        overlap,
        catchup_window: args.catchup_window.clone(),
        jitter: args.jitter.clone(),
        paused: args.paused,
        task: TaskTemplate {
            pool: Some(task.pool.clone()),
            labels,
            priority: task.priority,
            payload: payload.into(),
            max_attempts: task.max_attempts,
            attempt_timeout: task.attempt_timeout.clone(),
            deadline: task.deadline.clone(),
        },
    })
}

/// A serde name (`buffer_one`, `too_late`, `succeeded`).
fn name_of<T: serde::Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => "?".into(),
    }
}

/// `cron "30 2 * * *" Europe/Berlin`, `every 5m`.
fn cadence_text(cron: Option<&str>, every: Option<&str>, tz: Option<&str>) -> String {
    match (cron, every) {
        (Some(expr), _) => format!("cron {expr:?} {}", tz.unwrap_or("UTC")),
        (None, Some(every)) => format!("every {every}"),
        (None, None) => "-".into(),
    }
}

/// `task 17 succeeded`, `task 18 running`, `refused: …` (and the kind
/// when it was not a tick).
fn fire_text(fire: &FireRecord) -> String {
    let mut out = String::new();
    match (fire.task, &fire.error) {
        (Some(task), _) => {
            let outcome = fire.outcome.map_or("queued or running", |o| o.as_str());
            let _ = write!(out, "task {task} {outcome}");
        }
        (None, Some(e)) => {
            let _ = write!(out, "refused: {e}");
        }
        (None, None) => out.push_str("no task"),
    }
    if fire.kind != crate::api::FireKind::Tick {
        let _ = write!(out, " ({})", name_of(&fire.kind));
    }
    out
}

/// `cronoq schedule get` without `--json`.
fn info_text(info: &ScheduleInfo) -> String {
    let spec = &info.spec;
    let mut out = String::new();
    let _ = write!(
        out,
        "schedule {}  {}  overlap {}  pool {}",
        spec.name,
        cadence_text(
            spec.cron.as_deref(),
            spec.every.as_deref(),
            spec.tz.as_deref()
        ),
        name_of(&spec.overlap),
        spec.task.pool.as_deref().unwrap_or("default"),
    );
    if info.paused {
        out.push_str("  paused");
    }
    out.push('\n');
    if let Some(owner) = &info.owner {
        let _ = writeln!(out, "owner {owner}");
    }
    let c = &info.counters;
    let _ = writeln!(
        out,
        "created {}  fires {}  skipped {}  missed {}",
        rfc3339(info.created_at),
        c.fires,
        c.skipped,
        c.missed
    );
    if info.next_fires.is_empty() {
        out.push_str("next fires: none (paused)\n");
    } else {
        out.push_str("next fires:\n");
        for t in &info.next_fires {
            let _ = writeln!(out, "  {}", rfc3339(*t));
        }
    }
    if !info.history.is_empty() {
        out.push_str("last fires (tick → task, outcome):\n");
        for fire in &info.history {
            let _ = writeln!(out, "  {} → {}", rfc3339(fire.tick), fire_text(fire));
        }
    }
    if !info.skipped.is_empty() {
        out.push_str("skipped ticks (overlap):\n");
        for t in &info.skipped {
            let _ = writeln!(out, "  {}", rfc3339(*t));
        }
    }
    if !info.missed.is_empty() {
        out.push_str("missed ticks:\n");
        for m in &info.missed {
            let _ = writeln!(
                out,
                "  {} … before {}  {} tick{} ({})",
                rfc3339(m.first),
                rfc3339(m.until),
                m.ticks,
                if m.ticks == 1 { "" } else { "s" },
                name_of(&m.reason)
            );
        }
    }
    out
}

/// `cronoq schedule list` without `--json`: one row a schedule.
fn list_text(entries: &[ScheduleEntry]) -> String {
    if entries.is_empty() {
        return "no schedules\n".into();
    }
    let header = [
        "NAME",
        "CADENCE",
        "OVERLAP",
        "POOL",
        "NEXT FIRE",
        "LAST RUN",
        "STATE",
    ];
    let rows: Vec<[String; 7]> = entries
        .iter()
        .map(|e| {
            [
                e.name.clone(),
                cadence_text(e.cron.as_deref(), e.every.as_deref(), e.tz.as_deref()),
                name_of(&e.overlap),
                e.pool.clone(),
                e.next_fire.map_or("-".into(), rfc3339),
                e.last.as_ref().map_or("-".into(), |f| {
                    format!("{} → {}", rfc3339(f.tick), fire_text(f))
                }),
                if e.paused { "paused" } else { "active" }.into(),
            ]
        })
        .collect();
    let mut widths = header.map(|h| h.chars().count());
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &[String]| {
        let mut text = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == cells.len() {
                text.push_str(cell);
            } else {
                let pad = w - cell.chars().count();
                let _ = write!(text, "{cell}{}  ", " ".repeat(pad));
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(&header.map(String::from));
    for row in &rows {
        line(row);
    }
    out
}

/// `cronoq schedule backfill` without `--json`.
fn backfill_text(report: &BackfillReport) -> String {
    let mut out = String::new();
    for fire in &report.fired {
        let _ = writeln!(out, "{} → {}", rfc3339(fire.tick), fire_text(fire));
    }
    for t in &report.skipped {
        let _ = writeln!(out, "{} skipped (overlap)", rfc3339(*t));
    }
    if out.is_empty() {
        out.push_str("no ticks in the range\n");
    }
    out
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
        cron: args.cadence.cron.clone(),
        every: args.cadence.every.clone(),
        tz: args.cadence.tz.clone(),
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
    Millis::since_epoch(std::time::SystemTime::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(cron: Option<&str>, every: Option<&str>, from: &str, count: u64) -> PreviewArgs {
        PreviewArgs {
            cadence: CadenceArgs {
                cron: cron.map(String::from),
                every: every.map(String::from),
                tz: None,
            },
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

    fn create_args(argv: &[&str]) -> CreateArgs {
        use clap::Parser;
        let mut full = vec!["cronoq", "schedule", "create"];
        full.extend_from_slice(argv);
        match crate::cli::Cli::parse_from(full).command {
            crate::cli::Command::Schedule(ScheduleArgs {
                command: ScheduleCommand::Create(args),
            }) => *args,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn create_flags_become_a_schedule_with_submits_task_options() {
        let args = create_args(&[
            "nightly",
            "--cron",
            "30 2 * * *",
            "--tz",
            "Europe/Berlin",
            "--overlap",
            "buffer_one",
            "--catchup-window",
            "10m",
            "--jitter",
            "5s",
            "--paused",
            "--pool",
            "reports",
            "--label",
            "gpu=a100",
            "--label",
            "zone=eu",
            "--priority",
            "-2",
            "--max-attempts",
            "3",
            "--attempt-timeout",
            "1h",
            "--deadline",
            "2h",
            "build",
        ]);
        let spec = spec_of(&args, b"build".to_vec()).unwrap();
        let want: ScheduleSpec = serde_json::from_value(serde_json::json!({
            "name": "nightly", "cron": "30 2 * * *", "tz": "Europe/Berlin",
            "overlap": "buffer_one", "catchup_window": "10m", "jitter": "5s", "paused": true,
            "task": {"pool": "reports", "labels": {"gpu": "a100", "zone": "eu"}, "priority": -2,
                     "payload": "build", "max_attempts": 3, "attempt_timeout": "1h",
                     "deadline": "2h"}
        }))
        .unwrap();
        assert_eq!(spec, want);
        assert!(spec.validate().is_ok());
        // The defaults: allow, pool `default`, empty payload.
        let spec = spec_of(&create_args(&["tick", "--every", "1m"]), Vec::new()).unwrap();
        assert_eq!(spec.overlap, Overlap::Allow);
        assert_eq!(spec.task.pool.as_deref(), Some("default"));
        assert!(spec.task.payload.is_empty() && !spec.paused);
    }

    #[test]
    fn create_refuses_what_a_schedule_has_no_use_for() {
        let cases: [(&[&str], &str); 7] = [
            (
                &["--start-at", "1m"],
                "--start-at does not apply to a schedule",
            ),
            (&["--tolerance", "5s"], "--tolerance does not apply"),
            (&["--est-runtime", "5s"], "--est-runtime does not apply"),
            (
                &["--idempotency-key", "k"],
                "--idempotency-key does not apply",
            ),
            (&["--wait"], "--wait does not apply"),
            (
                &["--deadline", "2026-01-01T00:00:00Z"],
                "a schedule's deadline is a duration counted from each tick",
            ),
            (&["--label", "gpu"], "gpu"),
        ];
        for (extra, want) in cases {
            let mut argv = vec!["s", "--every", "1m"];
            argv.extend_from_slice(extra);
            let e = spec_of(&create_args(&argv), Vec::new()).unwrap_err();
            assert_eq!(
                e.code(),
                crate::core::ErrorCode::INVALID_ARGUMENT,
                "{argv:?}"
            );
            assert!(e.to_string().contains(want), "{argv:?}: {e}");
        }
    }

    fn fire(tick: u64, task: Option<u64>, outcome: Option<crate::core::TaskState>) -> FireRecord {
        FireRecord {
            tick: Millis(tick),
            fired_at: Millis(tick + 5),
            kind: crate::api::FireKind::Tick,
            task: task.map(crate::core::TaskId),
            outcome,
            error: None,
        }
    }

    #[test]
    fn get_shows_next_fires_runs_skipped_and_missed_ticks() {
        use crate::api::{MissedTicks, ScheduleCounters};
        let spec: ScheduleSpec = serde_json::from_str(
            r#"{"name":"etl","every":"1m","overlap":"skip","task":{"pool":"p"}}"#,
        )
        .unwrap();
        let info = ScheduleInfo {
            spec,
            state: crate::schedule::ScheduleState::new(Millis(0)),
            paused: false,
            owner: Some("ops".into()),
            created_at: Millis(0),
            next_fires: vec![Millis(240_000), Millis(300_000)],
            history: vec![
                fire(180_000, Some(9), None),
                fire(60_000, Some(7), Some(crate::core::TaskState::Succeeded)),
            ],
            skipped: vec![Millis(120_000)],
            missed: vec![MissedTicks {
                first: Millis(1_000_000),
                until: Millis(1_180_000),
                reason: crate::schedule::MissReason::TooLate,
                ticks: 3,
            }],
            counters: ScheduleCounters {
                fires: 2,
                skipped: 1,
                missed: 3,
            },
        };
        let text = info_text(&info);
        for want in [
            "schedule etl  every 1m  overlap skip  pool p\n",
            "owner ops\n",
            "fires 2  skipped 1  missed 3",
            "next fires:\n  1970-01-01T00:04:00Z\n  1970-01-01T00:05:00Z\n",
            "  1970-01-01T00:03:00Z → task 9 queued or running\n",
            "  1970-01-01T00:01:00Z → task 7 succeeded\n",
            "skipped ticks (overlap):\n  1970-01-01T00:02:00Z\n",
            "  1970-01-01T00:16:40Z … before 1970-01-01T00:19:40Z  3 ticks (too_late)\n",
        ] {
            assert!(text.contains(want), "{want:?} not in\n{text}");
        }
        let entry = ScheduleEntry {
            name: "etl".into(),
            cron: None,
            every: Some("1m".into()),
            tz: None,
            overlap: Overlap::Skip,
            pool: "p".into(),
            paused: true,
            owner: None,
            next_fire: None,
            last: Some(fire(60_000, Some(7), Some(crate::core::TaskState::Failed))),
            counters: ScheduleCounters::default(),
        };
        let table = list_text(&[entry]);
        let lines: Vec<&str> = table.lines().collect();
        assert!(
            lines[0].starts_with("NAME  CADENCE   OVERLAP  POOL  NEXT FIRE"),
            "{table}"
        );
        assert!(
            lines[1].starts_with("etl   every 1m  skip     p     -")
                && lines[1].ends_with("1970-01-01T00:01:00Z → task 7 failed  paused"),
            "{table}"
        );
        assert_eq!(list_text(&[]), "no schedules\n");
    }
}
