//! Client commands: `submit`, `snapshot`, `task`, `cancel`, over NATS
//! (`--nats`) or the HTTP API (`--http`); given both, NATS.

use std::io::{Read as _, Write as _};
use std::process::ExitCode;
use std::time::SystemTime;

use anyhow::Context as _;
use clap::Args;

use super::{Connect, DEFAULT_HTTP_URL};
use crate::client::{self, ClientOptions, HttpClient};
use crate::core::{Millis, Snapshot, TaskId, TaskState};
use crate::task::{Task, TaskStatus};
use crate::wire::{parse_duration, parse_time, WireError};

/// `cronoq submit` arguments.
#[derive(Debug, Args)]
pub struct SubmitArgs {
    #[command(flatten)]
    pub connect: Connect,
    /// The pool.
    #[arg(long, default_value = "default")]
    pub pool: String,
    /// A required label, `name=value`; repeat for more.
    #[arg(long = "label", value_name = "K=V")]
    pub labels: Vec<String>,
    /// Higher runs first.
    #[arg(long, default_value_t = 0, allow_hyphen_values = true)]
    pub priority: i32,
    /// Deadline: RFC 3339 time or a duration from now (`30s`).
    #[arg(long)]
    pub deadline: Option<String>,
    /// Fixed start: RFC 3339 time or a duration from now.
    #[arg(long)]
    pub start_at: Option<String>,
    /// How late a fixed start may start (`30s`).
    #[arg(long)]
    pub tolerance: Option<String>,
    /// Attempts in all.
    #[arg(long)]
    pub max_attempts: Option<u32>,
    /// Longest run of one attempt (`5m`).
    #[arg(long)]
    pub attempt_timeout: Option<String>,
    /// Declared run time (`10s`).
    #[arg(long)]
    pub est_runtime: Option<String>,
    /// De-duplicates resubmissions.
    #[arg(long)]
    pub idempotency_key: Option<String>,
    /// Wait for the outcome and print the output (exit status = outcome).
    #[arg(long)]
    pub wait: bool,
    /// The payload; `-` reads stdin; absent means empty.
    pub payload: Option<String>,
}

/// `cronoq snapshot` arguments.
#[derive(Debug, Args)]
pub struct SnapshotArgs {
    #[command(flatten)]
    pub connect: Connect,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `cronoq task` arguments.
#[derive(Debug, Args)]
pub struct TaskArgs {
    #[command(flatten)]
    pub connect: Connect,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// The task id.
    pub id: String,
}

/// `cronoq cancel` arguments.
#[derive(Debug, Args)]
pub struct CancelArgs {
    #[command(flatten)]
    pub connect: Connect,
    /// The task id.
    pub id: String,
}

/// A connected client: NATS when `--nats` is given, else the HTTP API.
enum Remote {
    Nats(client::Client),
    Http(HttpClient),
}

/// Client errors become [`WireError`]s, so `cli::error_code` finds the code.
fn wire(e: client::Error) -> anyhow::Error {
    WireError::from(e).into()
}

impl Remote {
    async fn connect(connect: &Connect) -> anyhow::Result<Remote> {
        let mut options = ClientOptions::new().prefix(connect.prefix.clone());
        if let Some(var) = &connect.token_env {
            let token = std::env::var(var).map_err(|_| {
                WireError::new(
                    crate::core::ErrorCode::INVALID_ARGUMENT,
                    format!("--token-env names {var}, which is not set"),
                )
            })?;
            options = options.token(token);
        }
        match (&connect.nats, &connect.http) {
            (Some(url), _) => options.connect(url).await.map(Remote::Nats).map_err(wire),
            (None, url) => options
                .http(url.as_deref().unwrap_or(DEFAULT_HTTP_URL))
                .map(Remote::Http)
                .map_err(wire),
        }
    }

    async fn submit(&self, task: Task) -> anyhow::Result<TaskId> {
        match self {
            Remote::Nats(c) => c.submit(task).await,
            Remote::Http(c) => c.submit(task).await,
        }
        .map_err(wire)
    }

    async fn get(&self, id: TaskId) -> anyhow::Result<TaskStatus> {
        match self {
            Remote::Nats(c) => c.get(id).await,
            Remote::Http(c) => c.get(id).await,
        }
        .map_err(wire)
    }

    async fn cancel(&self, id: TaskId) -> anyhow::Result<()> {
        match self {
            Remote::Nats(c) => c.cancel(id).await,
            Remote::Http(c) => c.cancel(id).await,
        }
        .map_err(wire)
    }

    async fn snapshot(&self) -> anyhow::Result<Snapshot> {
        match self {
            Remote::Nats(c) => c.snapshot().await,
            Remote::Http(c) => c.snapshot().await,
        }
        .map_err(wire)
    }

    async fn wait(&self, id: TaskId) -> anyhow::Result<TaskStatus> {
        match self {
            Remote::Nats(c) => c.wait(id).await,
            Remote::Http(c) => c.wait(id).await,
        }
        .map_err(wire)
    }
}

/// The task the flags describe; `payload` already read.
fn task_of(args: &SubmitArgs, payload: Vec<u8>, now: SystemTime) -> anyhow::Result<Task> {
    let mut task = Task::new(payload)
        .pool(args.pool.clone())
        .priority(args.priority);
    for item in &args.labels {
        task = task.label_text(item);
    }
    if let Some(d) = &args.deadline {
        task = task.deadline(parse_time(d, now).context("--deadline")?);
    }
    let tolerance = args
        .tolerance
        .as_deref()
        .map(parse_duration)
        .transpose()
        .context("--tolerance")?;
    match (&args.start_at, tolerance) {
        (Some(s), tolerance) => {
            let at = parse_time(s, now).context("--start-at")?;
            task = task.start_at(at, tolerance.unwrap_or_default());
        }
        (None, Some(_)) => {
            return Err(crate::core::Rejection::InvalidArgument(
                "--tolerance needs --start-at".into(),
            )
            .into())
        }
        (None, None) => {}
    }
    if let Some(n) = args.max_attempts {
        task = task.max_attempts(n);
    }
    if let Some(t) = &args.attempt_timeout {
        task = task.attempt_timeout(parse_duration(t).context("--attempt-timeout")?);
    }
    if let Some(e) = &args.est_runtime {
        task = task.est_runtime(parse_duration(e).context("--est-runtime")?);
    }
    if let Some(k) = &args.idempotency_key {
        task = task.idempotency_key(k.clone());
    }
    Ok(task)
}

fn parse_id(text: &str) -> anyhow::Result<TaskId> {
    Ok(text.parse::<TaskId>()?)
}

/// Submits a task and prints its id. With `--wait`, prints the id to stderr,
/// waits, and prints the output bytes alone to stdout (exit 0 when it
/// succeeded; 1 when it failed, was cancelled or missed its start, with the
/// error on stderr).
pub async fn submit(args: SubmitArgs) -> anyhow::Result<ExitCode> {
    let payload = match args.payload.as_deref() {
        Some("-") => {
            let mut buf = Vec::new();
            std::io::stdin()
                .read_to_end(&mut buf)
                .context("reading the payload from stdin")?;
            buf
        }
        Some(text) => text.as_bytes().to_vec(),
        None => Vec::new(),
    };
    let task = task_of(&args, payload, SystemTime::now())?;
    let remote = Remote::connect(&args.connect).await?;
    let id = remote.submit(task).await?;
    if !args.wait {
        println!("{id}");
        return Ok(ExitCode::SUCCESS);
    }
    // With --wait, stdout holds the output bytes alone (binary-safe for
    // pipes); the id goes to stderr.
    eprintln!("task {id}");
    let status = remote
        .wait(id)
        .await
        .with_context(|| format!("waiting for task {id}"))?;
    if status.state == TaskState::Succeeded {
        let mut out = std::io::stdout().lock();
        out.write_all(&status.output_bytes().unwrap_or_default())
            .and_then(|()| out.flush())
            .context("writing the output")?;
        Ok(ExitCode::SUCCESS)
    } else {
        match &status.error {
            Some(e) => eprintln!("task {id} {}: {e}", status.state.as_str()),
            None => eprintln!("task {id} {}", status.state.as_str()),
        }
        Ok(ExitCode::from(1))
    }
}

/// Prints the snapshot: a table, or pretty JSON.
pub async fn snapshot(args: SnapshotArgs) -> anyhow::Result<ExitCode> {
    let remote = Remote::connect(&args.connect).await?;
    let snapshot = remote.snapshot().await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&snapshot)?);
    } else {
        print!("{}", snapshot.to_table());
    }
    Ok(ExitCode::SUCCESS)
}

/// Prints a task: readable text, or pretty JSON.
pub async fn task(args: TaskArgs) -> anyhow::Result<ExitCode> {
    let id = parse_id(&args.id)?;
    let remote = Remote::connect(&args.connect).await?;
    let status = remote.get(id).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&status)?);
    } else {
        print!("{}", status_text(&status));
    }
    Ok(ExitCode::SUCCESS)
}

/// Cancels a task.
pub async fn cancel(args: CancelArgs) -> anyhow::Result<ExitCode> {
    let id = parse_id(&args.id)?;
    let remote = Remote::connect(&args.connect).await?;
    remote.cancel(id).await?;
    println!("cancelled {id}");
    Ok(ExitCode::SUCCESS)
}

fn time_text(at: Millis) -> String {
    let t = SystemTime::UNIX_EPOCH + at.to_duration();
    humantime::format_rfc3339_millis(t).to_string()
}

/// `cronoq task` without `--json`.
fn status_text(s: &TaskStatus) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = write!(
        out,
        "task {}  pool {}  state {}",
        s.id,
        s.pool,
        s.state.as_str()
    );
    if let Some(reason) = s.reason {
        let _ = write!(out, " ({})", reason.as_str());
    }
    if s.deadline_missed {
        out.push_str("  deadline missed");
    }
    out.push('\n');
    for a in &s.attempts {
        let group = if a.group.is_empty() {
            "(unlabeled)".to_string()
        } else {
            a.group.to_string()
        };
        let _ = write!(out, "  attempt {}  group {group}", a.attempt);
        if let Some(w) = &a.worker {
            let _ = write!(out, "  worker {w}");
        }
        let _ = write!(out, "  started {}", time_text(a.started_at));
        if let Some(end) = a.ended_at {
            let _ = write!(out, "  ended {}", time_text(end));
        }
        let _ = write!(out, "  {}", a.outcome.as_deref().unwrap_or("running"));
        if let Some(e) = &a.error {
            let _ = write!(out, ": {e}");
        }
        out.push('\n');
    }
    if let Some(output) = &s.output {
        let _ = writeln!(out, "output: {output}");
    }
    if let Some(e) = &s.error {
        let _ = writeln!(out, "error: {e}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn submit_args(argv: &[&str]) -> SubmitArgs {
        let mut full = vec!["cronoq", "submit"];
        full.extend_from_slice(argv);
        match super::super::Cli::parse_from(full).command {
            super::super::Command::Submit(a) => a,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn flags_become_a_task() {
        let now = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000);
        let args = submit_args(&[
            "--pool",
            "gpu",
            "--label",
            "gpu=a100",
            "--priority",
            "-3",
            "--deadline",
            "30s",
            "--start-at",
            "1m",
            "--tolerance",
            "5s",
            "--max-attempts",
            "2",
            "x",
        ]);
        let task = task_of(&args, b"x".to_vec(), now).unwrap();
        assert_eq!(task.pool_name(), "gpu");
        assert_eq!(task.required_labels().to_string(), "gpu=a100");
        assert_eq!(task.priority, -3);
        assert_eq!(
            task.deadline,
            Some(now + std::time::Duration::from_secs(30))
        );
        assert_eq!(
            task.start_at,
            Some(now + std::time::Duration::from_secs(60))
        );
        assert!(task.to_spec(TaskId(1), 1 << 20).is_ok());
    }

    #[test]
    fn bad_flags_are_invalid_arguments() {
        let now = SystemTime::UNIX_EPOCH;
        for argv in [
            &["--deadline", "tomorrow"][..],
            &["--tolerance", "5s"][..],
            &["--attempt-timeout", "soon"][..],
        ] {
            let e = task_of(&submit_args(argv), Vec::new(), now).unwrap_err();
            assert_eq!(
                super::super::error_code(&e),
                Some(crate::core::ErrorCode::INVALID_ARGUMENT),
                "{argv:?}"
            );
        }
        let e = parse_id("x1").unwrap_err();
        assert_eq!(
            super::super::error_code(&e),
            Some(crate::core::ErrorCode::INVALID_ARGUMENT)
        );
    }
}
