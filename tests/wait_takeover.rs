//! `cronoq submit --wait` rides out a gap with no leader (issue 20, finding
//! 4), against real processes: a nats-server, `cronoq server`s, a worker
//! and the CLI. Before, a wait whose first lookup found no server (a
//! takeover under way) exited 2 within milliseconds (`no cronoq server is
//! answering on cronoq.api.task … [UNAVAILABLE]`), although its task was
//! in the stream and later succeeded; and given `--http` beside `--nats`,
//! the wait went over NATS anyway.
//!
//! Deterministic: the gap is not a race with a kill. The only server is
//! killed before the CLI starts, so every lookup the wait makes finds no
//! server until the test starts a new one, which happens only after the
//! CLI has said it is waiting (`task N` on stderr).

mod procs;

use std::process::Stdio;
use std::time::Duration;

use cronoq::core::{PoolName, TaskId, TaskState};
use cronoq::TaskStatus;
use procs::{Cluster, Proc, DEADLINE};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

/// `cronoq submit … --wait <payload>` running, once it has said which
/// task it waits for.
async fn start_waiting(args: &[&str]) -> (Child, TaskId) {
    let mut cmd = Command::from(procs::command(procs::cronoq_binary()));
    cmd.arg("submit")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env("CRONOQ_LOG", "cronoq=debug")
        .kill_on_drop(true);
    let mut child = cmd.spawn().expect("starting cronoq submit");
    let stderr = child.stderr.take().expect("piped stderr");
    let mut lines = BufReader::new(stderr).lines();
    let id = tokio::time::timeout(DEADLINE, async {
        loop {
            let line = lines
                .next_line()
                .await
                .expect("reading stderr")
                .expect("cronoq submit ended before it said `task N`");
            if let Some(id) = line.strip_prefix("task ") {
                return TaskId(id.trim().parse().expect("a task id"));
            }
        }
    })
    .await
    .expect("`task N` within the deadline");
    // Keep draining stderr, so the CLI never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, id)
}

/// Its exit code and stdout.
async fn finished(child: Child) -> (Option<i32>, String) {
    let out = tokio::time::timeout(DEADLINE, child.wait_with_output())
        .await
        .expect("cronoq submit --wait ended within the deadline")
        .expect("waiting for cronoq submit");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[tokio::test]
async fn a_wait_started_while_no_server_leads_ends_with_the_tasks_success() {
    let mut c = Cluster::start(&[("w1", "", 2)]).await;
    let nats = c.nats.url();
    // No server at all: every lookup of the waits below finds nobody.
    c.server.kill9();
    let next_http = format!("127.0.0.1:{}", procs::free_port());
    let (over_nats, first) = start_waiting(&["--nats", &nats, "--wait", "first"]).await;
    let (over_http, second) = start_waiting(&[
        "--nats",
        &nats,
        "--http",
        &format!("http://{next_http}"),
        "--wait",
        "second",
    ])
    .await;
    // The submissions are in the stream; now a server takes over.
    let mut cmd = procs::command(procs::cronoq_binary());
    let config = c.dir.path().join("next.toml");
    std::fs::write(&config, procs::SERVER_CONFIG).unwrap();
    cmd.arg("server")
        .arg("--config")
        .arg(&config)
        .args(["--nats", &nats, "--http", &next_http, "--id", "next"])
        .env("CRONOQ_LOG", "info,cronoq=debug,async_nats=warn");
    let _next = Proc::spawn("cronoq server", cmd, &c.dir.path().join("next.log"));

    let (code, stdout) = finished(over_nats).await;
    assert_eq!(code, Some(0), "the NATS wait: {stdout}");
    assert_eq!(stdout, "first on [] by w1");
    let (code, stdout) = finished(over_http).await;
    assert_eq!(code, Some(0), "the HTTP wait: {stdout}");
    assert_eq!(stdout, "second on [] by w1");
    assert_eq!(c.status(first).await.state, TaskState::Succeeded);
    assert_eq!(c.status(second).await.state, TaskState::Succeeded);
}

/// A stand-in HTTP API that answers every request with `status`, counting
/// them: enough to see where `submit --wait` looks.
async fn http_stand_in(
    status: TaskStatus,
) -> (String, tokio::sync::mpsc::UnboundedReceiver<String>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (seen, requests) = tokio::sync::mpsc::unbounded_channel();
    let body = serde_json::to_string(&status).unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let (seen, body) = (seen.clone(), body.clone());
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let line = String::from_utf8_lossy(&head)
                    .lines()
                    .next()
                    .unwrap_or("")
                    .to_string();
                let _ = seen.send(line);
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
                     connection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
            });
        }
    });
    (url, requests)
}

#[tokio::test]
async fn given_http_the_wait_goes_over_http() {
    let mut c = Cluster::start(&[]).await;
    let nats = c.nats.url();
    // No cronoq server on NATS: a wait over NATS could not end well.
    c.server.kill9();
    let done = TaskStatus {
        id: TaskId(1),
        pool: PoolName::default(),
        state: TaskState::Succeeded,
        reason: None,
        reason_key: None,
        attempts: Vec::new(),
        output: Some("answered over http".into()),
        output_base64: None,
        error: None,
        deadline_missed: false,
        schedule: None,
        scheduled_at: None,
        output_size: None,
    };
    let (http, mut requests) = http_stand_in(done).await;
    let (child, id) = start_waiting(&["--nats", &nats, "--http", &http, "--wait", "x"]).await;
    let (code, stdout) = finished(child).await;
    assert_eq!(code, Some(0), "{stdout}");
    assert_eq!(stdout, "answered over http");
    let first = tokio::time::timeout(Duration::from_secs(1), requests.recv())
        .await
        .ok()
        .flatten();
    assert_eq!(
        first.as_deref(),
        Some(&*format!("GET /v1/tasks/{id} HTTP/1.1"))
    );
}
