//! Client commands: `submit`, `snapshot`, `task`, `cancel`, over NATS
//! (`--nats`) or the HTTP API (`--http`); given both, NATS, except that
//! `submit --wait` then waits over HTTP.

use std::io::{IsTerminal as _, Read as _, Write as _};
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use clap::Args;

use super::{Connect, DEFAULT_HTTP_URL};
use crate::auth::Credential;
use crate::client::{self, ClientOptions, HttpClient};
use crate::core::{ErrorCode, Millis, Snapshot, TaskId, TaskState, WaitReason};
use crate::task::{BackoffRequest, SubmitRequest, Task, TaskStatus};
use crate::wire::WireError;

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
    /// Backoff between attempts: `INITIAL,MAX` (`1s,1m`).
    #[arg(long, value_name = "INITIAL,MAX")]
    pub backoff: Option<String>,
    /// De-duplicates resubmissions.
    #[arg(long)]
    pub idempotency_key: Option<String>,
    /// W3C trace context (`00-<trace id>-<parent id>-<flags>`): every
    /// attempt gets it (a worker's command as env `TRACEPARENT`).
    #[arg(long, env = "TRACEPARENT")]
    pub traceparent: Option<String>,
    /// Fairness key (SPEC §9): among keys with waiting tasks, a freed slot
    /// goes to the key furthest below its weighted share.
    #[arg(long, value_name = "K")]
    pub fairness_key: Option<String>,
    /// Weight of the fairness key, 1 to 1,000 (default 1).
    #[arg(long, value_name = "W")]
    pub fairness_weight: Option<String>,
    /// Concurrency key: tasks of the pool with the same key share a limit.
    #[arg(long, value_name = "K")]
    pub concurrency_key: Option<String>,
    /// At most N of the key's tasks run at once (default 1).
    #[arg(long, value_name = "N")]
    pub concurrency_limit: Option<String>,
    /// queue (default), replace_waiting, cancel_running or skip.
    #[arg(long, value_name = "P")]
    pub concurrency_policy: Option<String>,
    /// Never preempted by higher-priority work.
    #[arg(long)]
    pub not_preemptible: bool,
    /// Wait for the outcome and print the output (exit status = outcome);
    /// on a terminal, state changes are shown on stderr as they happen.
    /// Over HTTP when --http is given. A server that does not answer (a
    /// leader taking over) is asked again with backoff until the task ends.
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
    #[arg(long, conflicts_with = "watch")]
    pub json: bool,
    /// Redraw the table every second until interrupted.
    #[arg(long)]
    pub watch: bool,
    /// With --watch: stop after this many tables (for tests and scripts).
    #[arg(long, hide = true, requires = "watch", value_parser = clap::value_parser!(u64).range(1..))]
    pub watch_count: Option<u64>,
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
/// Given both, requests go over NATS and `submit --wait` waits over HTTP
/// (`NatsWaitingOverHttp`): `--http` names how to follow the task.
/// Boxed: they are large and there is one per command.
pub(super) enum Remote {
    Nats(Box<client::Client>),
    Http(Box<HttpClient>),
    NatsWaitingOverHttp(Box<client::Client>, Box<HttpClient>),
}

/// Client errors become [`WireError`]s, so `cli::error_code` finds the code.
fn wire(e: client::Error) -> anyhow::Error {
    WireError::from(e).into()
}

/// The credential `--token-env` or `--nkey-seed` names (see
/// [`super::credential_from`]); an nkey with `--http` (which takes Bearer
/// tokens only) is `INVALID_ARGUMENT` too.
fn credential_of(connect: &Connect) -> Result<Option<Credential>, WireError> {
    if connect.token_env.is_none() && connect.nkey_seed.is_some() && connect.nats.is_none() {
        return Err(WireError::new(
            ErrorCode::INVALID_ARGUMENT,
            "--nkey-seed needs --nats: the HTTP API takes a token (--token-env) as its Bearer credential",
        ));
    }
    super::credential_from(connect.token_env.as_deref(), connect.nkey_seed.as_deref())
}

impl Remote {
    pub(super) async fn connect(connect: &Connect) -> anyhow::Result<Remote> {
        let mut options = ClientOptions::new()
            .prefix(connect.prefix.clone())
            .nats_login(connect.login.login());
        if let Some(credential) = credential_of(connect)? {
            options = options.credential(credential);
        }
        match (&connect.nats, &connect.http) {
            (Some(url), None) => options
                .connect(url)
                .await
                .map(|c| Remote::Nats(Box::new(c)))
                .map_err(wire),
            (Some(url), Some(http)) => {
                let waiter = options.clone().http(http).map_err(wire)?;
                let nats = options.connect(url).await.map_err(wire)?;
                Ok(Remote::NatsWaitingOverHttp(
                    Box::new(nats),
                    Box::new(waiter),
                ))
            }
            (None, url) => options
                .http(url.as_deref().unwrap_or(DEFAULT_HTTP_URL))
                .map(|c| Remote::Http(Box::new(c)))
                .map_err(wire),
        }
    }

    async fn submit(&self, task: Task) -> anyhow::Result<TaskId> {
        match self {
            Remote::Nats(c) | Remote::NatsWaitingOverHttp(c, _) => c.submit(task).await,
            Remote::Http(c) => c.submit(task).await,
        }
        .map_err(wire)
    }

    async fn get(&self, id: TaskId) -> anyhow::Result<TaskStatus> {
        match self {
            Remote::Nats(c) | Remote::NatsWaitingOverHttp(c, _) => c.get(id).await,
            Remote::Http(c) => c.get(id).await,
        }
        .map_err(wire)
    }

    async fn cancel(&self, id: TaskId) -> anyhow::Result<()> {
        match self {
            Remote::Nats(c) | Remote::NatsWaitingOverHttp(c, _) => c.cancel(id).await,
            Remote::Http(c) => c.cancel(id).await,
        }
        .map_err(wire)
    }

    async fn snapshot(&self) -> anyhow::Result<Snapshot> {
        match self {
            Remote::Nats(c) | Remote::NatsWaitingOverHttp(c, _) => c.snapshot().await,
            Remote::Http(c) => c.snapshot().await,
        }
        .map_err(wire)
    }

    /// Waits for the task (over HTTP when `--http` is given), riding out
    /// a server that does not answer (see [`client::Client::wait`]).
    async fn wait(&self, id: TaskId) -> anyhow::Result<TaskStatus> {
        match self {
            Remote::Nats(c) => c.wait(id).await,
            Remote::Http(c) | Remote::NatsWaitingOverHttp(_, c) => c.wait(id).await,
        }
        .map_err(wire)
    }

    /// A lookup made while waiting: over HTTP when `--http` is given.
    async fn get_while_waiting(&self, id: TaskId) -> anyhow::Result<TaskStatus> {
        match self {
            Remote::Nats(c) => c.get(id).await,
            Remote::Http(c) | Remote::NatsWaitingOverHttp(_, c) => c.get(id).await,
        }
        .map_err(wire)
    }
}

/// The task the flags describe; `payload` already read. The flags fill a
/// [`SubmitRequest`] (the JSON of `POST /v1/tasks`), which becomes the task
/// through the one conversion every path shares, so a bad flag is refused
/// with the message HTTP, Python and plain publishes give.
fn task_of(args: &SubmitArgs, payload: Vec<u8>, now: SystemTime) -> anyhow::Result<Task> {
    let mut labels = crate::core::Labels::new();
    for item in &args.labels {
        labels.insert_parsed(item)?;
    }
    let req = SubmitRequest {
        pool: Some(args.pool.clone()),
        labels,
        priority: Some(args.priority),
        deadline: args.deadline.clone(),
        start_at: args.start_at.clone(),
        tolerance: args.tolerance.clone(),
        max_attempts: args.max_attempts,
        attempt_timeout: args.attempt_timeout.clone(),
        est_runtime: args.est_runtime.clone(),
        backoff: args
            .backoff
            .as_deref()
            .map(BackoffRequest::parse)
            .transpose()?,
        idempotency_key: args.idempotency_key.clone(),
        traceparent: args.traceparent.clone(),
        fairness_key: args.fairness_key.clone(),
        fairness_weight: args
            .fairness_weight
            .as_deref()
            .map(|w| crate::wire::parse_int("fairness_weight", w))
            .transpose()?,
        concurrency_key: args.concurrency_key.clone(),
        concurrency_limit: args
            .concurrency_limit
            .as_deref()
            .map(|n| crate::wire::parse_int("concurrency_limit", n))
            .transpose()?,
        concurrency_policy: args.concurrency_policy.clone(),
        preemptible: args.not_preemptible.then_some(false),
        ..SubmitRequest::default()
    };
    let mut options = req.into_options(now)?;
    options.payload = payload.into();
    Ok(options.into_task()?)
}

/// The payload argument's bytes: `-` reads stdin; absent means empty.
pub(super) fn read_payload(arg: Option<&str>) -> anyhow::Result<Vec<u8>> {
    Ok(match arg {
        Some("-") => {
            let mut buf = Vec::new();
            std::io::stdin()
                .read_to_end(&mut buf)
                .context("reading the payload from stdin")?;
            buf
        }
        Some(text) => text.as_bytes().to_vec(),
        None => Vec::new(),
    })
}

fn parse_id(text: &str) -> anyhow::Result<TaskId> {
    Ok(text.parse::<TaskId>()?)
}

/// Submits a task and prints its id. With `--wait`, prints the id to stderr,
/// waits, and prints the output bytes alone to stdout (exit 0 when it
/// succeeded; 1 when it failed, was cancelled or missed its start, with the
/// error on stderr).
pub async fn submit(args: SubmitArgs) -> anyhow::Result<ExitCode> {
    let payload = read_payload(args.payload.as_deref())?;
    let task = task_of(&args, payload, SystemTime::now())?;
    let remote = Remote::connect(&args.connect).await?;
    let id = remote.submit(task).await?;
    if !matches!(remote, Remote::Http(_)) && credential_of(&args.connect)?.is_none() {
        // No credential: the client does not confirm, so a server with
        // `[auth] required = true` would refuse the task after the stream
        // took it, silently. One lookup tells: it refuses us too.
        if let Err(e) = remote.get(id).await {
            if crate::cli::error_code(&e) == Some(ErrorCode::UNAUTHENTICATED) {
                return Err(e.context(format!(
                    "task {id} is refused: the server requires credentials"
                )));
            }
        }
    }
    if !args.wait {
        println!("{id}");
        return Ok(ExitCode::SUCCESS);
    }
    // With --wait, stdout holds the output bytes alone (binary-safe for
    // pipes); the id goes to stderr, and on a terminal each state change.
    eprintln!("task {id}");
    let status = if std::io::stderr().is_terminal() {
        wait_with_progress(&remote, id).await
    } else {
        remote.wait(id).await
    }
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

/// How often `submit --wait` looks at the task for progress lines.
const PROGRESS_POLL: Duration = Duration::from_millis(300);

/// Waits for the task like `Remote::wait`, printing a [`progress_line`] on
/// stderr whenever what it says changes (looked up every 300 ms).
async fn wait_with_progress(remote: &Remote, id: TaskId) -> anyhow::Result<TaskStatus> {
    let mut last = String::new();
    let mut show = |status: &TaskStatus| {
        let line = progress_line(status);
        if line != last {
            eprintln!("{line}");
            last = line;
        }
    };
    let wait = remote.wait(id);
    tokio::pin!(wait);
    let mut ticker = tokio::time::interval(PROGRESS_POLL);
    loop {
        tokio::select! {
            done = &mut wait => {
                let status = done?;
                show(&status);
                return Ok(status);
            }
            _ = ticker.tick() => {
                // A lookup that fails (not consumed yet, a leader taking
                // over) shows nothing; the wait decides.
                if let Ok(status) = remote.get_while_waiting(id).await {
                    show(&status);
                }
            }
        }
    }
}

/// What `submit --wait` says of a task's state on a terminal:
/// `task 7 queued: every matching slot is busy (groups_full)`, `task 7
/// running on group gpu=a100 (worker w1), attempt 1`, `task 7 succeeded
/// after 1 attempt`.
pub(crate) fn progress_line(s: &TaskStatus) -> String {
    let attempts = |n: usize| format!("{n} attempt{}", if n == 1 { "" } else { "s" });
    let group_text = |g: &crate::core::Labels| {
        if g.is_empty() {
            "(unlabeled)".to_string()
        } else {
            g.to_string()
        }
    };
    let id = s.id;
    match s.state {
        TaskState::Queued | TaskState::Scheduled => {
            let mut line = format!("task {id} {}", s.state.as_str());
            if let Some(reason) = s.reason {
                let why = match reason {
                    WaitReason::NoGroupMatches => "no worker carries the required labels",
                    WaitReason::GroupsFull => "every matching slot is busy",
                    WaitReason::HeldForReservation => "free slots are held for a fixed-start task",
                    WaitReason::Backoff => "waiting out the retry backoff",
                    WaitReason::Scheduled => "its fixed start is in the future",
                    WaitReason::Quota => "its fairness key holds its quota",
                    WaitReason::Concurrency => "its concurrency key is at its limit",
                };
                match &s.reason_key {
                    Some(key) => line.push_str(&format!(": {why} ({reason}: {key})")),
                    None => line.push_str(&format!(": {why} ({reason})")),
                }
            }
            if let Some(last) = s.attempts.last() {
                line.push_str(&format!(
                    "; attempt {} {}",
                    last.attempt,
                    last.outcome.as_deref().unwrap_or("ended")
                ));
                if let Some(e) = &last.error {
                    line.push_str(&format!(": {}", one_line(e)));
                }
            }
            line
        }
        TaskState::Running => match s.attempts.last() {
            Some(a) => {
                let mut line = format!("task {id} running on group {}", group_text(&a.group));
                if let Some(w) = &a.worker {
                    line.push_str(&format!(" (worker {w})"));
                }
                line.push_str(&format!(", attempt {}", a.attempt));
                line
            }
            None => format!("task {id} running"),
        },
        state => {
            let mut line = format!(
                "task {id} {} after {}",
                state.as_str(),
                attempts(s.attempts.len())
            );
            if let Some(a) = s.attempts.last() {
                line.push_str(&format!(" (last on group {}", group_text(&a.group)));
                if let Some(w) = &a.worker {
                    line.push_str(&format!(", worker {w}"));
                }
                line.push(')');
            }
            if state != TaskState::Succeeded {
                if let Some(e) = &s.error {
                    line.push_str(&format!(": {}", one_line(e)));
                }
            }
            line
        }
    }
}

/// The last line of a (multi-line) error, cut to 200 characters.
fn one_line(text: &str) -> String {
    let line = text.trim().lines().last().unwrap_or_default();
    match line.char_indices().nth(200) {
        Some((cut, _)) => format!("{}…", &line[..cut]),
        None => line.to_string(),
    }
}

/// One screen of `snapshot --watch`: on a terminal the screen is cleared
/// first (ANSI: cursor home, erase display); otherwise tables follow one
/// another under a dated rule.
pub(crate) fn watch_frame(body: &str, at: SystemTime, terminal: bool) -> String {
    let when = humantime::format_rfc3339_seconds(at);
    if terminal {
        format!("\x1b[H\x1b[2Jcronoq snapshot, every 1s ({when}); Ctrl-C stops\n\n{body}")
    } else {
        format!("--- {when}\n{body}")
    }
}

/// Prints the snapshot: a table, or pretty JSON; with `--watch` a table
/// every second.
pub async fn snapshot(args: SnapshotArgs) -> anyhow::Result<ExitCode> {
    let remote = Remote::connect(&args.connect).await?;
    if args.watch {
        let terminal = std::io::stdout().is_terminal();
        let mut ticker = tokio::time::interval(Duration::from_secs(1));
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut shown = 0u64;
        loop {
            ticker.tick().await;
            // A server that does not answer is shown, not fatal: it may be
            // restarting, or a leader taking over.
            let body = match remote.snapshot().await {
                Ok(snapshot) => snapshot.to_table(),
                Err(e) => format!("error: {e:#}\n"),
            };
            let mut out = std::io::stdout().lock();
            out.write_all(watch_frame(&body, SystemTime::now(), terminal).as_bytes())
                .and_then(|()| out.flush())
                .context("writing the table")?;
            shown += 1;
            if args.watch_count.is_some_and(|n| shown >= n) {
                return Ok(ExitCode::SUCCESS);
            }
        }
    }
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
        match &s.reason_key {
            Some(key) => write!(out, " ({}: {key})", reason.as_str()),
            None => write!(out, " ({})", reason.as_str()),
        }
        .ok();
    }
    if s.deadline_missed {
        out.push_str("  deadline missed");
    }
    if let (Some(name), Some(at)) = (&s.schedule, s.scheduled_at) {
        let _ = write!(
            out,
            "  schedule {name} tick {}",
            crate::task::rfc3339_utc(at)
        );
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
            super::super::Command::Submit(a) => *a,
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
    fn backoff_is_a_flag_and_a_bad_flag_is_refused_as_on_every_path() {
        let now = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000);
        let args = submit_args(&["--backoff", "1s,1m", "x"]);
        let task = task_of(&args, b"x".to_vec(), now).unwrap();
        assert_eq!(
            task.backoff,
            Some((
                std::time::Duration::from_secs(1),
                std::time::Duration::from_secs(60)
            ))
        );
        let args = submit_args(&["--tolerance", "5s", "x"]);
        let e = task_of(&args, Vec::new(), now).unwrap_err();
        assert_eq!(e.to_string(), "tolerance is given without start_at");
        assert_eq!(
            crate::cli::error_code(&e),
            Some(ErrorCode::INVALID_ARGUMENT)
        );
    }

    fn status(
        state: TaskState,
        reason: Option<WaitReason>,
        attempts: &[(&str, &str, Option<&str>)],
    ) -> TaskStatus {
        TaskStatus {
            id: TaskId(7),
            pool: crate::core::PoolName::default(),
            state,
            reason,
            reason_key: None,
            attempts: attempts
                .iter()
                .enumerate()
                .map(|(i, (group, worker, outcome))| crate::task::AttemptRecord {
                    attempt: i as u32 + 1,
                    group: crate::core::Labels::parse(group).unwrap(),
                    worker: Some(worker.to_string()).filter(|w| !w.is_empty()),
                    credential: None,
                    started_at: Millis(0),
                    ended_at: outcome.map(|_| Millis(1)),
                    outcome: outcome.map(|o| o.to_string().into()),
                    error: (*outcome == Some("failed")).then(|| "exit 3\ndisk full".to_string()),
                })
                .collect(),
            output: None,
            output_base64: None,
            error: None,
            deadline_missed: false,
            schedule: None,
            scheduled_at: None,
            output_size: None,
        }
    }

    #[test]
    fn progress_lines_say_what_happens_and_why() {
        use TaskState::*;
        let cases = [
            (
                status(Queued, Some(WaitReason::NoGroupMatches), &[]),
                "task 7 queued: no worker carries the required labels (no_group_matches)",
            ),
            (
                status(Queued, Some(WaitReason::GroupsFull), &[]),
                "task 7 queued: every matching slot is busy (groups_full)",
            ),
            (
                status(Scheduled, Some(WaitReason::Scheduled), &[]),
                "task 7 scheduled: its fixed start is in the future (scheduled)",
            ),
            (
                status(Running, None, &[("gpu=a100", "w1", None)]),
                "task 7 running on group gpu=a100 (worker w1), attempt 1",
            ),
            (
                status(Running, None, &[("", "", None)]),
                "task 7 running on group (unlabeled), attempt 1",
            ),
            (
                status(Queued, Some(WaitReason::Backoff), &[("", "w2", Some("failed"))]),
                "task 7 queued: waiting out the retry backoff (backoff); attempt 1 failed: disk full",
            ),
            (
                status(Succeeded, None, &[("", "w2", Some("failed")), ("gpu=a100", "w1", Some("succeeded"))]),
                "task 7 succeeded after 2 attempts (last on group gpu=a100, worker w1)",
            ),
            (
                TaskStatus {
                    error: Some("boom".into()),
                    ..status(Failed, None, &[("", "w2", Some("failed"))])
                },
                "task 7 failed after 1 attempt (last on group (unlabeled), worker w2): boom",
            ),
            (status(Cancelled, None, &[]), "task 7 cancelled after 0 attempts"),
        ];
        for (s, want) in cases {
            assert_eq!(progress_line(&s), want);
        }
    }

    #[test]
    fn a_watch_frame_clears_a_terminal_and_dates_a_pipe() {
        let at = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_800_000_000);
        let tty = watch_frame("pool p\n", at, true);
        assert!(tty.starts_with("\x1b[H\x1b[2J"), "{tty:?}");
        assert!(
            tty.ends_with("pool p\n") && tty.contains("2027-01-15T08:00:00Z"),
            "{tty:?}"
        );
        let pipe = watch_frame("pool p\n", at, false);
        assert_eq!(pipe, "--- 2027-01-15T08:00:00Z\npool p\n");
    }

    #[test]
    fn a_bad_traceparent_flag_is_an_invalid_argument() {
        let now = SystemTime::UNIX_EPOCH;
        let args = submit_args(&["--traceparent", "00-abc-def-01", "x"]);
        let e = task_of(&args, Vec::new(), now).unwrap_err();
        assert_eq!(
            super::super::error_code(&e),
            Some(crate::core::ErrorCode::INVALID_ARGUMENT)
        );
        let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let task = task_of(&submit_args(&["--traceparent", good]), Vec::new(), now).unwrap();
        assert_eq!(task.trace_context(), Some(good));
    }

    fn connect_args(argv: &[&str]) -> Connect {
        let mut full = vec!["cronoq", "task"];
        full.extend_from_slice(argv);
        full.push("1");
        match super::super::Cli::parse_from(full).command {
            super::super::Command::Task(a) => a.connect,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn credential_flags_are_read_before_connecting() {
        // No flag: anonymous.
        assert!(credential_of(&connect_args(&[])).unwrap().is_none());
        // A variable that is set (PATH is): its value is the token.
        let c = credential_of(&connect_args(&["--token-env", "PATH"]))
            .unwrap()
            .unwrap();
        let path = std::env::var("PATH").unwrap();
        assert_eq!(c.id(), crate::auth::token_id(&path));
        // An nkey seed file, over NATS.
        let dir = tempfile::tempdir().unwrap();
        let pair = nkeys::KeyPair::new_user();
        let seed_file = dir.path().join("seed");
        std::fs::write(&seed_file, format!("{}\n", pair.seed().unwrap())).unwrap();
        let seed = seed_file.to_str().unwrap();
        let c = credential_of(&connect_args(&[
            "--nats",
            "nats://x:1",
            "--nkey-seed",
            seed,
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(c.id(), pair.public_key());

        let garbage = dir.path().join("garbage");
        std::fs::write(&garbage, "not a seed").unwrap();
        let missing = dir.path().join("missing");
        let cases: [(Vec<&str>, &str); 5] = [
            (
                vec!["--token-env", "CRONOQ_TEST_SURELY_UNSET_TOKEN"],
                "--token-env names CRONOQ_TEST_SURELY_UNSET_TOKEN, which is not set",
            ),
            (
                vec![
                    "--nats",
                    "nats://x:1",
                    "--nkey-seed",
                    missing.to_str().unwrap(),
                ],
                "--nkey-seed: reading nkey seed",
            ),
            (
                vec![
                    "--nats",
                    "nats://x:1",
                    "--nkey-seed",
                    garbage.to_str().unwrap(),
                ],
                "--nkey-seed: not an nkey seed",
            ),
            (vec!["--nkey-seed", seed], "--nkey-seed needs --nats"),
            (
                vec![
                    "--nats",
                    "nats://x:1",
                    "--token-env",
                    "PATH",
                    "--nkey-seed",
                    seed,
                ],
                "give --token-env or --nkey-seed, not both",
            ),
        ];
        for (argv, want) in cases {
            let e = credential_of(&connect_args(&argv)).unwrap_err();
            assert_eq!(e.code, ErrorCode::INVALID_ARGUMENT, "{argv:?}");
            assert!(e.message.contains(want), "{argv:?}: {}", e.message);
            assert!(!e.message.contains(&pair.seed().unwrap()));
        }
    }

    #[tokio::test]
    async fn a_bad_credential_flag_fails_before_connecting() {
        // Port 1 has no server: had it tried to connect, this would be
        // UNAVAILABLE.
        let args = connect_args(&[
            "--nats",
            "nats://127.0.0.1:1",
            "--token-env",
            "CRONOQ_TEST_SURELY_UNSET_TOKEN",
        ]);
        let e = Remote::connect(&args).await.err().unwrap();
        assert_eq!(
            super::super::error_code(&e),
            Some(ErrorCode::INVALID_ARGUMENT),
            "{e:#}"
        );
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

    #[test]
    fn a_task_a_schedule_fired_names_its_schedule_and_tick() {
        let status: TaskStatus = serde_json::from_value(serde_json::json!({
            "id": 4, "pool": "default", "state": "queued", "attempts": [],
            "deadline_missed": false,
            "schedule": "poll", "scheduled_at": "2026-12-05T05:47:58Z"
        }))
        .unwrap();
        assert_eq!(
            status_text(&status),
            "task 4  pool default  state queued  schedule poll tick 2026-12-05T05:47:58Z\n"
        );
    }
}
