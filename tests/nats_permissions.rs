//! NATS-level permissions (issue 9, deliverable 4): a real `nats-server`
//! runs with the shipped `deploy/nats/auth.conf` (the test's config only
//! adds a port and a store dir and includes that file; the users' public
//! keys come from the environment, as in production). `cronoq server`,
//! `cronoq worker` and the clients log in with their nkey seed files and
//! private inbox prefixes, a task runs end to end, and then plain NATS
//! connections logged in as the other users show what NATS refuses:
//!
//! - a worker's credential cannot subscribe to another worker's leases
//!   (nats-server reports the violation, and a lease published there
//!   reaches the permitted worker but not it), cannot publish another
//!   worker's outcomes (the violation, and a listener sees only its own
//!   subject), cannot submit (the violation, and the next accepted task
//!   takes the very next stream sequence), cannot use the JetStream API;
//! - a reader cannot submit or cancel (a held task stays running until the
//!   submitter cancels it) but can look up and snapshot, and cannot read
//!   another user's inbox;
//! - an anonymous connection and an unknown key are refused
//!   (`UNAUTHENTICATED` from the CLI); a missing or malformed credentials
//!   file is `INVALID_ARGUMENT` before anything connects.
//!
//! Every refusal is checked against a positive control (the same action
//! by the permitted user works). Nothing waits on the clock for a verdict:
//! violations are awaited as events, absence of delivery is judged after
//! a later message on the same connection has arrived (NATS keeps one
//! publisher's order to one connection).

mod auth_kit;
mod procs;

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use async_nats::ConnectErrorKind;
use cronoq::client::{Client, ClientOptions};
use cronoq::core::{ErrorCode, TaskId, TaskState};
use cronoq::Task;
use futures_util::{FutureExt as _, StreamExt as _};
use procs::{eventually, free_port, nats_server_binary, Proc, DEADLINE, WORKER_SCRIPT};
use tokio::sync::mpsc;

/// The worker ids `deploy/nats/auth.conf` has users for.
const GPU: &str = "gpu-a100-1";
const CPU: &str = "cpu-1";

/// One NATS user of `auth.conf`: the env var naming its public key, its
/// seed file and its inbox prefix.
struct User {
    env: &'static str,
    public: String,
    seed_file: PathBuf,
    inbox: &'static str,
}

/// The users of `auth.conf`, with fresh keys.
struct Users {
    server: User,
    submitter: User,
    reader: User,
    gpu: User,
    cpu: User,
}

impl Users {
    fn new(dir: &Path) -> Users {
        let user = |env: &'static str, inbox: &'static str| {
            let key = nkeys::KeyPair::new_user();
            let seed_file = dir.join(format!("{}.nk", env.to_lowercase()));
            std::fs::write(&seed_file, format!("{}\n", key.seed().unwrap())).unwrap();
            User {
                env,
                public: key.public_key(),
                seed_file,
                inbox,
            }
        };
        Users {
            server: user("CRONOQ_NATS_SERVER_NKEY", "_INBOX.server"),
            submitter: user("CRONOQ_NATS_SUBMITTER_NKEY", "_INBOX.submitter"),
            reader: user("CRONOQ_NATS_READER_NKEY", "_INBOX.reader"),
            gpu: user(
                "CRONOQ_NATS_WORKER_GPU_A100_1_NKEY",
                "_INBOX.worker.gpu-a100-1",
            ),
            cpu: user("CRONOQ_NATS_WORKER_CPU_1_NKEY", "_INBOX.worker.cpu-1"),
        }
    }

    fn all(&self) -> [&User; 5] {
        [
            &self.server,
            &self.submitter,
            &self.reader,
            &self.gpu,
            &self.cpu,
        ]
    }
}

/// The shipped NATS config directory.
fn deploy_nats() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/nats")
}

/// `nats-server` with `deploy/nats/auth.conf` on a free loopback port;
/// `Proc` kills it by PID on drop.
fn start_nats(dir: &Path, users: &Users) -> (Proc, String) {
    // nats-server resolves `include` relative to the including file: a
    // link to the real file sits next to the test's config.
    let auth = dir.join("auth.conf");
    std::os::unix::fs::symlink(deploy_nats().join("auth.conf"), &auth)
        .expect("linking deploy/nats/auth.conf");
    let name = format!("perm-{}", std::process::id());
    for attempt in 0..5 {
        let port = free_port();
        let conf = dir.join("nats.conf");
        std::fs::write(
            &conf,
            format!(
                "server_name: {name}\nlisten: 127.0.0.1:{port}\n\
                 jetstream {{ store_dir: {:?} }}\ninclude ./auth.conf\n",
                dir.join(format!("store-{attempt}")).display().to_string()
            ),
        )
        .unwrap();
        let mut cmd = procs::command(nats_server_binary());
        cmd.arg("-c").arg(&conf);
        for user in users.all() {
            cmd.env(user.env, &user.public);
        }
        let mut proc = Proc::spawn("nats-server", cmd, &dir.join("nats.log"));
        let until = Instant::now() + DEADLINE;
        while Instant::now() < until && proc.exited().is_none() {
            if let Ok(stream) = TcpStream::connect(("127.0.0.1", port)) {
                use std::io::BufRead as _;
                let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
                let mut info = String::new();
                let _ = std::io::BufReader::new(stream).read_line(&mut info);
                if info.contains(&format!("\"server_name\":\"{name}\"")) {
                    return (proc, format!("nats://127.0.0.1:{port}"));
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("nats-server did not start:\n{}", proc.log_tail(20));
    }
    panic!("nats-server with deploy/nats/auth.conf did not start");
}

/// The server config: the tests' short timeouts, the server's NATS login.
fn server_config(nats: &str, http: SocketAddr, users: &Users) -> String {
    format!(
        r#"
[server]
nats_url = "{nats}"
http_addr = "{http}"
nats_creds = {:?}
nats_inbox_prefix = "{}"
worker_timeout = "2s"
lease_ttl = "3s"
election_timeout = "3s"

[[pools]]
name = "default"
backoff_initial = "100ms"
backoff_max = "1s"
"#,
        users.server.seed_file.display().to_string(),
        users.server.inbox
    )
}

/// `cronoq server` with its credentials from the config file; waits until
/// it leads (over HTTP, which NATS permissions do not cover).
async fn start_server(dir: &Path, nats: &str, users: &Users) -> Proc {
    for _ in 0..5 {
        let http: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let config = dir.join("cronoq.toml");
        std::fs::write(&config, server_config(nats, http, users)).unwrap();
        let mut cmd = procs::command(procs::cronoq_binary());
        cmd.args(["server", "--id", "srv-1", "--config"])
            .arg(&config)
            .env("CRONOQ_LOG", "info,cronoq=debug,async_nats=warn");
        let mut proc = Proc::spawn("cronoq server", cmd, &dir.join("server.log"));
        let api = ClientOptions::new()
            .request_timeout(Duration::from_secs(2))
            .http(&format!("http://{http}"))
            .unwrap();
        let until = Instant::now() + DEADLINE;
        while Instant::now() < until && proc.exited().is_none() {
            if let Ok(snap) = api.snapshot().await {
                if snap.leader.is_some_and(|l| l.id == "srv-1") {
                    return proc;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        eprintln!("cronoq server did not lead:\n{}", proc.log_tail(30));
    }
    panic!("cronoq server did not start with its NATS credentials");
}

/// `cronoq worker --id gpu-a100-1` with its credentials as flags.
fn start_worker(dir: &Path, nats: &str, user: &User) -> Proc {
    let mut cmd = procs::command(procs::cronoq_binary());
    cmd.args(["worker", "--nats", nats, "--pool", "default", "--id", GPU])
        .args(["--label", "gpu=a100", "--slots", "2", "--grace", "10m"])
        .arg("--nats-creds")
        .arg(&user.seed_file)
        .args(["--nats-inbox-prefix", user.inbox])
        .args(["--", "sh", "-c", WORKER_SCRIPT])
        .env("TEST_DIR", dir)
        .env("TEST_WORKER", GPU)
        .env("CRONOQ_LOG", "info,cronoq=debug,async_nats=warn");
    Proc::spawn("cronoq worker", cmd, &dir.join("worker.log"))
}

/// A cronoq client logged in as `user`.
async fn client(nats: &str, user: &User) -> Client {
    ClientOptions::new()
        .nats_creds(&user.seed_file)
        .inbox_prefix(user.inbox)
        .request_timeout(Duration::from_secs(3))
        .wait_poll_interval(Duration::from_millis(200))
        .connect(nats)
        .await
        .unwrap_or_else(|e| panic!("client as {}: {e}", user.env))
}

/// A plain NATS connection logged in as one user, with the errors
/// nats-server reports on it.
struct Probe {
    who: &'static str,
    nats: async_nats::Client,
    errors: mpsc::UnboundedReceiver<String>,
}

impl Probe {
    async fn login(url: &str, user: &User) -> Probe {
        let seed = std::fs::read_to_string(&user.seed_file).unwrap();
        let (tx, errors) = mpsc::unbounded_channel();
        let nats = async_nats::ConnectOptions::with_nkey(seed.trim().to_string())
            .custom_inbox_prefix(user.inbox)
            .event_callback(move |event| {
                let tx = tx.clone();
                async move {
                    if let async_nats::Event::ServerError(e) = event {
                        let _ = tx.send(e.to_string());
                    }
                }
            })
            .connect(url)
            .await
            .unwrap_or_else(|e| panic!("connecting as {}: {e}", user.env));
        Probe {
            who: user.env,
            nats,
            errors,
        }
    }

    /// Waits for nats-server's `Permissions Violation for <what> to
    /// "<subject>"` on this connection.
    async fn violation(&mut self, what: &str, subject: &str) {
        self.nats.flush().await.expect("flush");
        let wanted = format!("permissions violation for {what} to \"{subject}\"").to_lowercase();
        let mut seen = Vec::new();
        let found = tokio::time::timeout(DEADLINE, async {
            while let Some(e) = self.errors.recv().await {
                if e.to_lowercase().contains(&wanted) {
                    return true;
                }
                seen.push(e);
            }
            false
        })
        .await;
        assert!(
            found == Ok(true),
            "{}: no violation {wanted:?} reported; other errors: {seen:?}",
            self.who
        );
    }

    /// No error reported so far on this connection (after a round trip).
    async fn no_violation(&mut self) {
        self.nats.flush().await.expect("flush");
        let mut seen = Vec::new();
        while let Ok(e) = self.errors.try_recv() {
            seen.push(e);
        }
        assert!(seen.is_empty(), "{}: unexpected errors {seen:?}", self.who);
    }

    async fn subscribe(&self, subject: &str) -> async_nats::Subscriber {
        let sub = self
            .nats
            .subscribe(subject.to_string())
            .await
            .expect("subscribe");
        self.nats.flush().await.expect("flush");
        sub
    }

    async fn publish(&self, subject: &str, body: &'static str) {
        self.nats
            .publish(subject.to_string(), body.into())
            .await
            .expect("publish");
        self.nats.flush().await.expect("flush");
    }
}

/// The next message of `sub`, within the deadline.
async fn next(sub: &mut async_nats::Subscriber, what: &str) -> async_nats::Message {
    tokio::time::timeout(DEADLINE, sub.next())
        .await
        .unwrap_or_else(|_| panic!("{what}: nothing arrived within {DEADLINE:?}"))
        .unwrap_or_else(|| panic!("{what}: subscription closed"))
}

/// Nothing was delivered to `sub` (it may have been closed by the refusal).
fn nothing_delivered(sub: &mut async_nats::Subscriber, what: &str) {
    if let Some(Some(m)) = sub.next().now_or_never() {
        panic!("{what}: a message reached a refused subscription: {m:?}");
    }
}

/// `cronoq ARGS` with extra env vars; exit code, stdout, stderr.
async fn cli(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let mut cmd = tokio::process::Command::from(procs::command(procs::cronoq_binary()));
    cmd.args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let out = tokio::time::timeout(DEADLINE, cmd.output())
        .await
        .unwrap_or_else(|_| panic!("cronoq {args:?} did not end within {DEADLINE:?}"))
        .expect("running cronoq");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Waits until the task's state is `state`.
async fn task_state(client: &Client, id: TaskId, state: TaskState) {
    eventually(&format!("task {id} to be {}", state.as_str()), || async {
        let status = client.get(id).await.map_err(|e| e.to_string())?;
        if status.state == state {
            Ok(())
        } else {
            Err(procs::describe(&status))
        }
    })
    .await;
}

#[tokio::test]
async fn deploy_nats_permissions_hold_end_to_end() {
    let dir = tempfile::Builder::new()
        .prefix("cronoq-natsperm-")
        .disable_cleanup(std::env::var_os("TEST_KEEP_DIRS").is_some())
        .tempdir()
        .unwrap();
    let dir = dir.path();
    let users = Users::new(dir);
    let (_nats, url) = start_nats(dir, &users);
    let _server = start_server(dir, &url, &users).await;
    let _worker = start_worker(dir, &url, &users.gpu);
    let submitter = client(&url, &users.submitter).await;
    let reader = client(&url, &users.reader).await;

    // The worker registers through its own subjects, cronoq.w.<id>.<verb>
    // (auth.conf allows it nothing else): a worker build that still sends
    // cronoq.api.register is refused here, and its log says so.
    eventually("worker gpu-a100-1 to register", || async {
        let snap = reader.snapshot().await.map_err(|e| e.to_string())?;
        if snap.workers.iter().any(|w| w.id == GPU) {
            Ok(())
        } else {
            Err(snap.to_table())
        }
    })
    .await;

    // A task end to end: submitted, leased, run, reported, waited for.
    let first = submitter
        .submit(Task::new("hello").label("gpu", "a100"))
        .await
        .expect("the submitter submits");
    let done = submitter.wait(first).await.expect("waiting as submitter");
    assert_eq!(
        done.state,
        TaskState::Succeeded,
        "{}",
        procs::describe(&done)
    );
    assert_eq!(
        done.output.as_deref(),
        Some("hello on [gpu=a100] by gpu-a100-1")
    );
    // The CLI, with its login from the environment.
    let submitter_env = [
        (
            "CRONOQ_NATS_CREDS",
            users.submitter.seed_file.to_str().unwrap(),
        ),
        ("CRONOQ_NATS_INBOX_PREFIX", users.submitter.inbox),
    ];
    let (code, stdout, stderr) = cli(
        &[
            "submit", "--nats", &url, "--label", "gpu=a100", "--wait", "cli",
        ],
        &submitter_env,
    )
    .await;
    assert_eq!(code, Some(0), "cronoq submit --wait: {stderr}");
    assert_eq!(stdout.trim(), "cli on [gpu=a100] by gpu-a100-1");
    let last_id = first.0 + 1;

    let mut server = Probe::login(&url, &users.server).await;
    let mut gpu = Probe::login(&url, &users.gpu).await;
    let mut cpu = Probe::login(&url, &users.cpu).await;

    // A worker credential cannot read another worker's leases.
    let mut cpu_leases = cpu.subscribe("cronoq.worker.cpu-1.lease").await;
    let mut stolen_leases = gpu.subscribe("cronoq.worker.cpu-1.lease").await;
    gpu.violation("subscription", "cronoq.worker.cpu-1.lease")
        .await;
    let mut gpu_own = gpu.subscribe("cronoq.worker.gpu-a100-1.probe").await;
    // A lease, then a probe on gpu-a100-1's own subject, until the probe
    // arrives: a client may still be settling after the refusal (the probe
    // of a first round can be lost then), and each round publishes the
    // lease before its probe.
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        server.publish("cronoq.worker.cpu-1.lease", "lease").await;
        server
            .publish("cronoq.worker.gpu-a100-1.probe", "after")
            .await;
        if tokio::time::timeout(Duration::from_secs(1), gpu_own.next())
            .await
            .is_ok_and(|m| m.is_some())
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "gpu-a100-1's own subject: nothing arrived within {DEADLINE:?}"
        );
    }
    assert_eq!(
        next(&mut cpu_leases, "cpu-1's own lease subject")
            .await
            .payload,
        "lease"
    );
    // Each lease was published before its probe: had one reached
    // gpu-a100-1's connection, it would be there by now.
    nothing_delivered(&mut stolen_leases, "gpu-a100-1 on cpu-1's leases");

    // … cannot speak for another worker: its outcome never leaves.
    let mut cpu_requests = server.subscribe("cronoq.w.cpu-1.>").await;
    let mut gpu_requests = server.subscribe("cronoq.w.gpu-a100-1.probe").await;
    gpu.publish("cronoq.w.cpu-1.outcome", "forged").await;
    gpu.violation("publish", "cronoq.w.cpu-1.outcome").await;
    gpu.publish("cronoq.w.cpu-1.deregister", "forged").await;
    gpu.violation("publish", "cronoq.w.cpu-1.deregister").await;
    gpu.publish("cronoq.w.gpu-a100-1.probe", "own").await;
    next(&mut gpu_requests, "gpu-a100-1's own request subject").await;
    nothing_delivered(&mut cpu_requests, "gpu-a100-1 forging cpu-1's requests");
    // The permitted worker's publish does reach it.
    cpu.publish("cronoq.w.cpu-1.outcome", "real").await;
    assert_eq!(
        next(&mut cpu_requests, "cpu-1's own outcome").await.payload,
        "real"
    );
    cpu.no_violation().await;

    // … cannot submit, nor reach the JetStream API (results, streams).
    gpu.publish("cronoq.submit.default", "stolen").await;
    gpu.violation("publish", "cronoq.submit.default").await;
    gpu.publish("$JS.API.STREAM.INFO.CRONOQ_SUBMIT", "").await;
    gpu.violation("publish", "$JS.API.STREAM.INFO.CRONOQ_SUBMIT")
        .await;

    // A reader cannot submit either; the next accepted submission takes
    // the next stream sequence, so neither refused one was stored.
    let mut reader_probe = Probe::login(&url, &users.reader).await;
    reader_probe
        .publish("cronoq.submit.default", "stolen")
        .await;
    reader_probe
        .violation("publish", "cronoq.submit.default")
        .await;
    // Nor can a submitter publish on the fire subject, where only the
    // leader publishes schedule fires (issue 34).
    let mut submitter_probe = Probe::login(&url, &users.submitter).await;
    submitter_probe
        .publish("cronoq.submit.default.fire", "stolen")
        .await;
    submitter_probe
        .violation("publish", "cronoq.submit.default.fire")
        .await;
    let held = submitter
        .submit(Task::new("held hold=go").label("gpu", "a100"))
        .await
        .expect("the submitter submits again");
    assert_eq!(held.0, last_id + 1, "a refused submission was stored");
    let refused = reader
        .submit(Task::new("reader"))
        .await
        .expect_err("a reader's submit is refused");
    assert_eq!(refused.code(), ErrorCode::PERMISSION_DENIED, "{refused}");
    assert!(refused.to_string().contains("may not publish"), "{refused}");

    // A reader cannot cancel: the running task stays running until the
    // submitter cancels it.
    task_state(&reader, held, TaskState::Running).await;
    let refused = reader
        .cancel(held)
        .await
        .expect_err("a reader's cancel is refused");
    assert_eq!(refused.code(), ErrorCode::PERMISSION_DENIED, "{refused}");
    reader_probe
        .nats
        .publish_with_reply("cronoq.api.cancel", "_INBOX.reader.x", "".into())
        .await
        .unwrap();
    reader_probe.violation("publish", "cronoq.api.cancel").await;
    assert_eq!(reader.get(held).await.unwrap().state, TaskState::Running);
    submitter.cancel(held).await.expect("the submitter cancels");
    task_state(&reader, held, TaskState::Cancelled).await;

    // Nobody reads another user's replies.
    let _theirs = reader_probe.subscribe("_INBOX.submitter.>").await;
    reader_probe
        .violation("subscription", "_INBOX.submitter.>")
        .await;
    let _default = gpu.subscribe("_INBOX.>").await;
    gpu.violation("subscription", "_INBOX.>").await;
    // A client left on the default inbox is told why nothing answers it.
    let default_inbox = ClientOptions::new()
        .nats_creds(&users.submitter.seed_file)
        .request_timeout(Duration::from_secs(3))
        .connect(&url)
        .await
        .expect("the submitter connects");
    let refused = default_inbox
        .snapshot()
        .await
        .expect_err("no replies without the user's inbox prefix");
    assert_eq!(refused.code(), ErrorCode::PERMISSION_DENIED, "{refused}");
    assert!(
        refused.to_string().contains("--nats-inbox-prefix"),
        "{refused}"
    );

    // No login, or an unknown key: refused.
    let anonymous = async_nats::connect(&url)
        .await
        .expect_err("an anonymous connection is refused");
    assert_eq!(anonymous.kind(), ConnectErrorKind::AuthorizationViolation);
    let stranger = dir.join("stranger.nk");
    std::fs::write(&stranger, nkeys::KeyPair::new_user().seed().unwrap()).unwrap();
    let refused = ClientOptions::new()
        .nats_creds(&stranger)
        .connect(&url)
        .await
        .expect_err("an unknown key is refused");
    assert_eq!(refused.code(), ErrorCode::UNAUTHENTICATED, "{refused}");
    let (code, _, stderr) = cli(&["snapshot", "--nats", &url], &[]).await;
    assert_eq!(code, Some(2));
    assert!(stderr.contains("[UNAUTHENTICATED]"), "{stderr}");
    // A worker whose key NATS does not know exits the same way (it does
    // not retry forever).
    let (code, _, stderr) = cli(
        &[
            "worker",
            "--nats",
            &url,
            "--id",
            CPU,
            "--nats-creds",
            stranger.to_str().unwrap(),
            "--",
            "true",
        ],
        &[],
    )
    .await;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("[UNAUTHENTICATED]"), "{stderr}");

    // A credentials file that is missing or not one: refused before
    // connecting, with its code.
    let not_creds = dir.join("not-creds");
    std::fs::write(&not_creds, "hunter2\n").unwrap();
    for (file, why) in [
        (dir.join("missing.nk"), "cannot read it"),
        (not_creds, "not valid"),
    ] {
        let file = file.to_str().unwrap();
        let (code, _, stderr) =
            cli(&["task", "--nats", &url, "--nats-creds", file, "1"], &[]).await;
        assert_eq!(code, Some(2), "{stderr}");
        assert!(
            stderr.contains("[INVALID_ARGUMENT]") && stderr.contains(why),
            "{stderr}"
        );
        assert!(
            !stderr.contains("hunter2"),
            "the file's content is not shown: {stderr}"
        );
        let (code, _, stderr) = cli(
            &[
                "worker",
                "--nats",
                &url,
                "--id",
                CPU,
                "--nats-creds",
                file,
                "--",
                "true",
            ],
            &[],
        )
        .await;
        assert_eq!(code, Some(2), "{stderr}");
        assert!(stderr.contains("[INVALID_ARGUMENT]"), "{stderr}");
    }
    let bad_config = dir.join("bad.toml");
    std::fs::write(
        &bad_config,
        "[server]\nnats_creds = \"/nonexistent/server.nk\"\n",
    )
    .unwrap();
    let (code, _, stderr) = cli(
        &[
            "server",
            "--check-config",
            "--config",
            bad_config.to_str().unwrap(),
        ],
        &[],
    )
    .await;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("[INVALID_ARGUMENT]") && stderr.contains("/nonexistent/server.nk"),
        "{stderr}"
    );

    // The permitted users saw no violation of their own all along.
    server.no_violation().await;
}

/// Issue 20 finding 1, through the shipped permissions: with `[auth]
/// required = true` on top of `deploy/nats/auth.conf`, the NATS user of
/// worker gpu-a100-1 holding that fleet's worker token registers its own
/// id with all the slots the credential may hold and sends the heaviest
/// heartbeat flood it can (30 signed heartbeats of 30,000 made-up
/// attempts, each about a NATS message, as fast as its connection takes
/// them; `tests/hostile_auth.rs` sends 60 on an open NATS). Every message is within its permissions (no violation); the
/// leader answers with at most the worker's slots in revokes per
/// heartbeat interval and keeps its leadership: the worker's next
/// heartbeat is answered by the same epoch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_credentials_heartbeat_flood_through_the_shipped_permissions_keeps_the_leader() {
    const WORKER_TOKEN: &str = "gpu-fleet-worker-token-0123456789";
    const ADMIN_TOKEN: &str = "admin-token-for-the-flood-test-0123";
    let dir = tempfile::Builder::new()
        .prefix("cronoq-natsperm-flood-")
        .disable_cleanup(std::env::var_os("TEST_KEEP_DIRS").is_some())
        .tempdir()
        .unwrap();
    let dir = dir.path();
    let users = Users::new(dir);
    let (_nats, url) = start_nats(dir, &users);
    let http: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let config = dir.join("cronoq.toml");
    std::fs::write(
        &config,
        format!(
            "{}\n[auth]\nrequired = true\n\n[[auth.tokens]]\ntoken_env = \"T_GPU\"\nrole = \"worker\"\npools = [\"default\"]\nlabels = [\"gpu=a100\"]\n\n[[auth.tokens]]\ntoken_env = \"T_ADMIN\"\nrole = \"admin\"\n",
            // Long: the test's own debug build sends the flood, slower
            // than a heartbeat interval on a busy machine.
            server_config(&url, http, &users).replace("worker_timeout = \"2s\"", "worker_timeout = \"60s\"")
        ),
    )
    .unwrap();
    let mut cmd = procs::command(procs::cronoq_binary());
    cmd.args(["server", "--id", "srv-1", "--config"])
        .arg(&config)
        .env("T_GPU", WORKER_TOKEN)
        .env("T_ADMIN", ADMIN_TOKEN)
        .env("CRONOQ_LOG", "info,cronoq=debug,async_nats=warn");
    let _server = Proc::spawn("cronoq server", cmd, &dir.join("server.log"));
    let admin = ClientOptions::new()
        .token(ADMIN_TOKEN)
        .request_timeout(Duration::from_secs(2))
        .http(&format!("http://{http}"))
        .unwrap();
    let leader = eventually("the server to lead", || async {
        let snap = admin.snapshot().await.map_err(|e| e.to_string())?;
        snap.leader.ok_or_else(|| "no leader yet".to_string())
    })
    .await;

    let mut gpu = Probe::login(&url, &users.gpu).await;
    let subjects = cronoq::wire::Subjects::default();
    let credential = cronoq::auth::Credential::token(WORKER_TOKEN);
    let e = auth_kit::register_on(
        &gpu.nats,
        &subjects,
        "default",
        &credential,
        GPU,
        "gpu=a100",
        100_000,
        &[],
    )
    .await
    .err()
    .expect("more slots than the credential may hold");
    assert_eq!(e.code, ErrorCode::RESOURCE_EXHAUSTED, "{e}");
    let (session, reply) = auth_kit::register_on(
        &gpu.nats,
        &subjects,
        "default",
        &credential,
        GPU,
        "gpu=a100",
        10_000,
        &[],
    )
    .await
    .expect("registered within max_slots");
    let interval = Duration::from_millis(reply.heartbeat_interval.0);
    let mut revokes = gpu.subscribe(&subjects.revoke(GPU)).await;
    let started = Instant::now();
    auth_kit::heartbeat_flood(
        &gpu.nats,
        &subjects,
        &session,
        GPU,
        "_INBOX.worker.gpu-a100-1.flood",
        30,
        30_000,
    )
    .await;
    gpu.no_violation().await;
    // The leader took every heartbeat: the next one is answered, by the
    // same epoch, for a registered worker.
    let subject = subjects.worker_api(GPU, "heartbeat");
    let body = cronoq::wire::encode(&cronoq::wire::Heartbeat {
        v: cronoq::wire::PROTOCOL_VERSION,
        worker_id: GPU.into(),
        free_slots: 10_000,
        running: Vec::new(),
    });
    let mut headers = async_nats::HeaderMap::new();
    session.0.sign(&subject, &mut headers, &body);
    let answer = tokio::time::timeout(
        DEADLINE,
        gpu.nats.request_with_headers(subject, headers, body.into()),
    )
    .await
    .expect("the leader answers after the flood")
    .expect("a reply");
    let elapsed = started.elapsed();
    match cronoq::wire::decode::<cronoq::wire::Reply<cronoq::wire::HeartbeatReply>>(&answer.payload)
        .unwrap()
    {
        cronoq::wire::Reply::Ok(r) => {
            assert!(r.registered, "the worker was dropped");
            assert_eq!(r.epoch, leader.epoch, "leadership changed hands");
        }
        cronoq::wire::Reply::Error(e) => panic!("{e}"),
    }
    let snap = admin.snapshot().await.unwrap();
    assert_eq!(
        snap.leader.map(|l| (l.id, l.epoch)),
        Some((leader.id, leader.epoch))
    );
    let mut seen = 0u64;
    while let Ok(Some(_)) = tokio::time::timeout(Duration::from_millis(500), revokes.next()).await {
        seen += 1;
    }
    let intervals = elapsed.as_millis() as u64 / interval.as_millis().max(1) as u64 + 2;
    assert!(
        seen <= 10_000 * intervals,
        "{seen} revokes in {elapsed:?} ({intervals} intervals of {interval:?})"
    );
}
