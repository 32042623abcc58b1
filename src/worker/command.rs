//! Running an external command as the handler of one attempt, for
//! `cronoq worker … -- CMD`: payload on stdin, stdout is the output, exit 0
//! is success, anything else a retryable failure carrying the tail of
//! stderr. The attempt is described in `CRONOQ_TASK_ID`, `CRONOQ_ATTEMPT`,
//! `CRONOQ_POOL` and `CRONOQ_GROUP`; for a task a schedule fired,
//! `CRONOQ_SCHEDULE` and `CRONOQ_SCHEDULED_AT` (the tick, RFC 3339 UTC).
//! `TRACEPARENT` is the attempt's W3C trace context: the worker's attempt
//! span when the worker exports traces, else what its lease carried (the
//! leader's attempt span, or the submitter's traceparent). Each of these
//! is unset when the task has none, even if the worker's own environment
//! has it. The command runs inside a `cronoq.command` span (exported with
//! the worker's telemetry) that records its exit code.
//!
//! On Unix the command runs in a process group of its own: a Ctrl-C in the
//! worker's terminal does not reach it (the worker drains instead), and an
//! aborted attempt (revoked, lease lost, grace over) kills the whole group
//! when its future is dropped. A preempted attempt (SPEC §9) is asked to
//! stop first: the group gets SIGTERM ([`GentleStop`]), and SIGKILL only
//! when the pool's `preemption_grace` ran out and the future is dropped.

use std::process::{ExitStatus, Stdio};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use crate::task::{TaskContext, TaskError};

/// A request to stop an attempt's handler gently (SPEC §9 preemption):
/// the worker's session puts one in the attempt's task ([`GENTLE_STOP`]); a
/// handler that can stop gently ([`run_command`]) says it `listens`, and
/// gets `asked`. A handler that does not listen is aborted at once.
#[derive(Debug, Default)]
pub(crate) struct GentleStop {
    listening: std::sync::atomic::AtomicBool,
    asked: tokio::sync::Notify,
}

impl GentleStop {
    /// Whether the running handler stops gently when asked.
    pub(crate) fn listens(&self) -> bool {
        self.listening.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Asks the handler to stop (once; a handler not waiting yet finds
    /// the request when it does).
    pub(crate) fn ask(&self) {
        self.asked.notify_one();
    }
}

tokio::task_local! {
    /// The gentle stop of the attempt this task runs, if a worker runs it.
    pub(crate) static GENTLE_STOP: std::sync::Arc<GentleStop>;
}

/// How much of the end of stderr a failed attempt's error keeps.
pub const STDERR_TAIL_BYTES: usize = 2048;

/// The command is killed (SIGKILL) when the worker process dies, even by
/// `kill -9`, so a job never outlives its worker and overlaps its retry
/// elsewhere (`PR_SET_PDEATHSIG`). The signal follows the thread that
/// spawned the child: tokio spawns from a runtime worker thread, which
/// lives as long as the worker's runtime.
#[cfg(target_os = "linux")]
pub(crate) fn die_with_parent(cmd: &mut tokio::process::Command) {
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: only async-signal-safe calls (prctl, getppid) between fork
    // and exec, and no allocation.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The worker died before prctl took effect: do not run.
            if libc::getppid() != parent {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// Runs `command` (program and arguments) for one attempt.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use cronoq::core::{Labels, PoolName, TaskId};
/// use cronoq::TaskContext;
/// let ctx = TaskContext {
///     task_id: TaskId(1),
///     attempt: 1,
///     pool: PoolName::new("default").unwrap(),
///     group: Labels::new(),
///     traceparent: None,
///     schedule: None,
/// };
/// # #[cfg(unix)] {
/// let command = ["tr".to_string(), "a-z".to_string(), "A-Z".to_string()];
/// let output = cronoq::worker::run_command(&command, &ctx, "hi".into()).await.unwrap();
/// assert_eq!(output, "HI");
/// # }
/// # }
/// ```
pub async fn run_command(
    command: &[String],
    ctx: &TaskContext,
    payload: Bytes,
) -> Result<Bytes, TaskError> {
    use tracing::Instrument as _;
    let Some(program) = command.first() else {
        return Err(TaskError::permanent("no command to run"));
    };
    let span = tracing::info_span!(
        target: crate::telemetry::TARGET,
        "cronoq.command",
        process.executable.name = %program,
        process.exit.code = tracing::field::Empty,
    );
    let result = run(command, ctx, payload, &span)
        .instrument(span.clone())
        .await;
    if let Err(e) = &result {
        crate::telemetry::set_outcome(&span, "failed", Some(e.message()));
    }
    result
}

async fn run(
    command: &[String],
    ctx: &TaskContext,
    payload: Bytes,
    span: &tracing::Span,
) -> Result<Bytes, TaskError> {
    let Some((program, args)) = command.split_first() else {
        return Err(TaskError::permanent("no command to run"));
    };
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .env("CRONOQ_TASK_ID", ctx.task_id.to_string())
        .env("CRONOQ_ATTEMPT", ctx.attempt.to_string())
        .env("CRONOQ_POOL", ctx.pool.as_str())
        .env("CRONOQ_GROUP", ctx.group.to_string());
    // Only a well-formed value reaches the command (the leader checked it
    // at submit; a bad one would fail the spawn or mislead a tracer).
    match ctx
        .traceparent
        .as_deref()
        .filter(|tp| crate::task::check_traceparent(tp).is_ok())
    {
        Some(tp) => cmd.env("TRACEPARENT", tp),
        None => cmd.env_remove("TRACEPARENT"),
    };
    // Never inherited: a command sees a schedule only when its task has one.
    match &ctx.schedule {
        Some((name, at)) => cmd
            .env("CRONOQ_SCHEDULE", name)
            .env("CRONOQ_SCHEDULED_AT", crate::task::rfc3339_utc(*at)),
        None => cmd
            .env_remove("CRONOQ_SCHEDULE")
            .env_remove("CRONOQ_SCHEDULED_AT"),
    };
    #[cfg(unix)]
    cmd.process_group(0);
    #[cfg(target_os = "linux")]
    die_with_parent(&mut cmd);
    let mut child = cmd
        .spawn()
        .map_err(|e| TaskError::retryable(format!("starting {program}: {e}")))?;
    let mut group = GroupGuard::new(child.id());

    let stdin = child.stdin.take();
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let write = async move {
        if let Some(mut stdin) = stdin {
            // A command that does not read its stdin closes the pipe
            // early; its exit status decides, not the write.
            if let Err(e) = stdin.write_all(&payload).await {
                tracing::debug!(error = %e, "payload not fully written to command stdin");
            }
        }
    };
    let read_stdout = async move {
        let mut out = Vec::new();
        if let Some(mut stdout) = stdout {
            stdout.read_to_end(&mut out).await?;
        }
        Ok::<_, std::io::Error>(out)
    };
    let read_stderr = async move {
        match stderr {
            Some(stderr) => read_tail(stderr, STDERR_TAIL_BYTES).await,
            None => Ok((Vec::new(), false)),
        }
    };
    let pid = child.id();
    let run = async {
        let ((), out, err) = tokio::join!(write, read_stdout, read_stderr);
        (out, err, child.wait().await)
    };
    let gentle = GENTLE_STOP.try_with(std::sync::Arc::clone).ok();
    if let Some(g) = &gentle {
        g.listening
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }
    let terminate = async {
        match &gentle {
            Some(g) => g.asked.notified().await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(run);
    tokio::pin!(terminate);
    let mut terminated = false;
    let (out, err, status) = loop {
        tokio::select! {
            ended = &mut run => break ended,
            () = &mut terminate, if !terminated => {
                terminated = true;
                terminate_group(pid);
            }
        }
    };
    group.disarm();

    let status = status.map_err(|e| TaskError::retryable(format!("waiting for {program}: {e}")))?;
    if let Some(code) = status.code() {
        span.record("process.exit.code", code);
    }
    let out = out.map_err(|e| TaskError::retryable(format!("reading {program} stdout: {e}")))?;
    if status.success() {
        return Ok(Bytes::from(out));
    }
    let (tail, truncated) = err.unwrap_or_default();
    Err(TaskError::retryable(failure_message(
        program, status, &tail, truncated,
    )))
}

fn failure_message(program: &str, status: ExitStatus, tail: &[u8], truncated: bool) -> String {
    let text = String::from_utf8_lossy(tail);
    let text = text.trim();
    if text.is_empty() {
        return format!("{program} {}", describe(status));
    }
    if truncated {
        format!("…{text}")
    } else {
        text.to_string()
    }
}

fn describe(status: ExitStatus) -> String {
    if let Some(code) = status.code() {
        return format!("exited with status {code}");
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(signal) = status.signal() {
            return format!("was killed by signal {signal}");
        }
    }
    format!("ended with {status}")
}

/// Reads `reader` to its end, keeping only the last `keep` bytes; also
/// says whether anything was dropped.
async fn read_tail(
    mut reader: impl AsyncRead + Unpin,
    keep: usize,
) -> std::io::Result<(Vec<u8>, bool)> {
    let mut tail = Vec::with_capacity(keep * 2);
    let mut truncated = false;
    let mut chunk = [0u8; 4096];
    loop {
        let n = reader.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        tail.extend_from_slice(&chunk[..n]);
        if tail.len() > keep * 2 {
            tail.drain(..tail.len() - keep);
            truncated = true;
        }
    }
    if tail.len() > keep {
        tail.drain(..tail.len() - keep);
        truncated = true;
    }
    Ok((tail, truncated))
}

/// Sends SIGTERM to the command's process group (a preempted attempt: the
/// command may finish or save its work before the grace runs out).
fn terminate_group(pid: Option<u32>) {
    #[cfg(unix)]
    if let Some(pgid) = pid.and_then(|p| libc::pid_t::try_from(p).ok()) {
        tracing::debug!(pid = pgid, "asking the command to stop (SIGTERM)");
        // SAFETY: killpg only sends a signal, to the group the command
        // leads (process_group(0)), not yet reaped: `run` still waits.
        unsafe {
            libc::killpg(pgid, libc::SIGTERM);
        }
    }
    #[cfg(not(unix))]
    let _ = pid;
}

/// Kills the command's process group when dropped before the command was
/// reaped (the attempt was aborted), so that children of the command go
/// too; `kill_on_drop` alone reaches only the command itself. (`cronoq
/// dev` holds one for its nats-server, which may be a wrapper — a pyenv
/// shim, a pip console script — whose child is the real server.)
pub(crate) struct GroupGuard {
    #[cfg_attr(not(unix), allow(dead_code))]
    pgid: Option<u32>,
}

impl GroupGuard {
    /// A guard for the group `pid` leads (spawned with `process_group(0)`).
    pub(crate) fn new(pid: Option<u32>) -> GroupGuard {
        GroupGuard { pgid: pid }
    }

    fn disarm(&mut self) {
        self.pgid = None;
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        #[cfg(unix)]
        if let Some(pgid) = self.pgid.and_then(|p| libc::pid_t::try_from(p).ok()) {
            // SAFETY: killpg only sends a signal; the group is the one the
            // command leads (process_group(0)) and the command has not
            // been reaped yet, so its id still names that group.
            unsafe {
                libc::killpg(pgid, libc::SIGKILL);
            }
        }
    }
}

#[cfg(all(test, unix))]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::core::{Labels, PoolName, TaskId};

    fn ctx() -> TaskContext {
        TaskContext {
            task_id: TaskId(42),
            attempt: 3,
            pool: PoolName::new("inference").unwrap(),
            group: Labels::from([("zone", "eu"), ("gpu", "a100")]),
            traceparent: None,
            schedule: None,
        }
    }

    fn sh(script: &str) -> Vec<String> {
        vec!["sh".into(), "-c".into(), script.into()]
    }

    #[tokio::test]
    async fn payload_in_stdout_out() {
        let out = run_command(&sh("cat; echo noise >&2"), &ctx(), "hello".into())
            .await
            .unwrap();
        assert_eq!(out, "hello");
    }

    #[tokio::test]
    async fn non_zero_exit_fails_retryable_with_stderr() {
        let e = run_command(&sh("cat; echo err >&2; exit 3"), &ctx(), "x".into())
            .await
            .unwrap_err();
        assert!(e.is_retryable());
        assert_eq!(e.message(), "err");
    }

    #[tokio::test]
    async fn non_zero_exit_without_stderr_names_the_status() {
        let e = run_command(&sh("exit 3"), &ctx(), Bytes::new())
            .await
            .unwrap_err();
        assert_eq!(e.message(), "sh exited with status 3");
        let e = run_command(&sh("kill -9 $$"), &ctx(), Bytes::new())
            .await
            .unwrap_err();
        assert_eq!(e.message(), "sh was killed by signal 9");
    }

    #[tokio::test]
    async fn error_keeps_the_end_of_a_long_stderr() {
        let script = "i=0; while [ $i -lt 2000 ]; do echo line$i >&2; i=$((i+1)); done; exit 1";
        let e = run_command(&sh(script), &ctx(), Bytes::new())
            .await
            .unwrap_err();
        assert!(e.message().starts_with('…'), "{}", e.message());
        assert!(e.message().ends_with("line1999"), "{}", e.message());
        assert!(e.message().len() <= STDERR_TAIL_BYTES + '…'.len_utf8());
    }

    #[tokio::test]
    async fn attempt_is_described_in_env() {
        let out = run_command(
            &sh(r#"printf '%s|%s|%s|%s' "$CRONOQ_TASK_ID" "$CRONOQ_ATTEMPT" "$CRONOQ_POOL" "$CRONOQ_GROUP""#),
            &ctx(),
            Bytes::new(),
        )
        .await
        .unwrap();
        assert_eq!(out, "42|3|inference|gpu=a100,zone=eu");
        let mut unlabeled = ctx();
        unlabeled.group = Labels::new();
        let out = run_command(
            &sh(r#"printf '[%s]' "$CRONOQ_GROUP""#),
            &unlabeled,
            Bytes::new(),
        )
        .await
        .unwrap();
        assert_eq!(out, "[]");
    }

    #[tokio::test]
    async fn the_schedule_is_in_env_only_when_a_schedule_fired_the_task() {
        let script =
            sh(r#"printf '%s|%s' "${CRONOQ_SCHEDULE-unset}" "${CRONOQ_SCHEDULED_AT-unset}""#);
        let mut fired = ctx();
        fired.schedule = Some(("nightly".into(), crate::core::Millis(1_796_443_200_000)));
        let out = run_command(&script, &fired, Bytes::new()).await.unwrap();
        assert_eq!(out, "nightly|2026-12-05T04:00:00Z");
        let out = run_command(&script, &ctx(), Bytes::new()).await.unwrap();
        assert_eq!(out, "unset|unset");
    }

    #[tokio::test]
    async fn the_trace_context_is_in_env_only_when_the_task_has_one() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let mut traced = ctx();
        traced.traceparent = Some(tp.into());
        let script = sh(r#"printf '[%s]' "${TRACEPARENT-unset}""#);
        let out = run_command(&script, &traced, Bytes::new()).await.unwrap();
        assert_eq!(out, format!("[{tp}]"));
        // None, or a malformed one (never sent by a leader): unset.
        for traceparent in [None, Some("00-bad".to_string())] {
            let mut untraced = ctx();
            untraced.traceparent = traceparent;
            let out = run_command(&script, &untraced, Bytes::new()).await.unwrap();
            assert_eq!(out, "[unset]");
        }
    }

    #[tokio::test]
    async fn large_payload_does_not_deadlock() {
        let payload = Bytes::from(vec![b'a'; 1 << 20]);
        let out = run_command(&sh("cat"), &ctx(), payload.clone())
            .await
            .unwrap();
        assert_eq!(out.len(), payload.len());
        // A command that ignores stdin still succeeds.
        let out = run_command(&sh("echo done"), &ctx(), payload)
            .await
            .unwrap();
        assert_eq!(out, "done\n");
    }

    #[tokio::test]
    async fn missing_program_fails_retryable() {
        let e = run_command(
            &["/nonexistent/cronoq-cmd".to_string()],
            &ctx(),
            Bytes::new(),
        )
        .await
        .unwrap_err();
        assert!(e.is_retryable());
        assert!(e.message().starts_with("starting /nonexistent/cronoq-cmd"));
        let e = run_command(&[], &ctx(), Bytes::new()).await.unwrap_err();
        assert!(!e.is_retryable());
    }

    #[tokio::test]
    async fn dropping_the_attempt_kills_the_process_group() {
        let dir = tempfile::tempdir().unwrap();
        let pids = dir.path().join("pids");
        // The shell starts a background grandchild and waits on it.
        let script = format!("sleep 60 & echo $$ $! > {}; wait", pids.display());
        let command = sh(&script);
        let ctx = ctx();
        let run = tokio::spawn(async move { run_command(&command, &ctx, Bytes::new()).await });
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let text = loop {
            if let Ok(text) = std::fs::read_to_string(&pids) {
                if text.ends_with('\n') {
                    break text;
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "command did not start"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        let pids: Vec<libc::pid_t> = text
            .split_whitespace()
            .map(|p| p.parse().unwrap())
            .collect();
        run.abort();
        let _ = run.await;
        for pid in pids {
            loop {
                // Gone, or a zombie waiting for its reaper.
                let alive = unsafe { libc::kill(pid, 0) } == 0 && !is_zombie(pid);
                if !alive {
                    break;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "process {pid} survived"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }

    fn is_zombie(pid: libc::pid_t) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| {
                s.rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .starts_with('Z')
            })
            .unwrap_or(true)
    }
}
