//! The `cronoq` command line (SPEC §6): clap definitions and dispatch.
//! With `main.rs`, the only users of `anyhow`.
//!
//! Every flag reads an env var too (`--nats` ↔ `CRONOQ_NATS`, …); a flag
//! wins over its env var, which wins over the config file. Data goes to
//! stdout, diagnostics to stderr; exit 0 ok, 1 a negative answer (the task
//! failed), 2 an error.

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use crate::core::ErrorCode;

mod client_cmds;
mod dev;
mod keygen;
mod schedule_cmd;
mod server_cmd;
mod worker_cmd;

/// The default NATS URL.
pub const DEFAULT_NATS: &str = "nats://127.0.0.1:4222";
/// The default HTTP URL for clients.
pub const DEFAULT_HTTP_URL: &str = "http://127.0.0.1:7070";

/// cronoq: a task scheduler for fleets of workers that differ.
#[derive(Debug, Parser)]
#[command(name = "cronoq", version, about, propagate_version = true)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a scheduler server (leader candidate) over NATS.
    Server(server_cmd::ServerArgs),
    /// Run a worker that executes CMD once per attempt.
    Worker(worker_cmd::WorkerArgs),
    /// Submit a task.
    Submit(Box<client_cmds::SubmitArgs>),
    /// Show pools, groups, demand and workers.
    Snapshot(client_cmds::SnapshotArgs),
    /// Show one task.
    Task(client_cmds::TaskArgs),
    /// Cancel a task.
    Cancel(client_cmds::CancelArgs),
    /// Print a new nkey pair for a worker credential.
    Keygen(keygen::KeygenArgs),
    /// Start a local setup for a first try: nats-server, a server, two workers.
    Dev(dev::DevArgs),
    /// Schedules: create, list, show, pause, resume, delete, trigger,
    /// backfill; preview when a cron expression or interval fires.
    Schedule(schedule_cmd::ScheduleArgs),
}

impl Command {
    /// Server, worker and dev run until stopped; the rest answer and exit.
    pub fn is_long_running(&self) -> bool {
        matches!(
            self,
            Command::Server(_) | Command::Worker(_) | Command::Dev(_)
        )
    }
}

/// How a client reaches cronoq: NATS, or the HTTP API. Given both, NATS
/// (and `submit --wait` waits over HTTP).
#[derive(Debug, Clone, Args)]
pub struct Connect {
    /// NATS URL.
    #[arg(long, env = "CRONOQ_NATS")]
    pub nats: Option<String>,
    /// HTTP API URL.
    #[arg(long, env = "CRONOQ_HTTP")]
    pub http: Option<String>,
    /// Subject prefix.
    #[arg(long, env = "CRONOQ_PREFIX", default_value = "cronoq")]
    pub prefix: String,
    /// Name of the env var that holds the cronoq token to act as (an
    /// `[[auth.tokens]]` credential; over --http, the Bearer token).
    #[arg(long, env = "CRONOQ_TOKEN_ENV", value_name = "VAR")]
    pub token_env: Option<String>,
    /// File holding the nkey seed to act as (an `[[auth.nkeys]]`
    /// credential; NATS only).
    #[arg(long, env = "CRONOQ_NKEY_SEED", value_name = "FILE")]
    pub nkey_seed: Option<std::path::PathBuf>,
    /// NATS credentials and inbox prefix.
    #[command(flatten)]
    pub login: NatsLoginArgs,
}

/// How a command logs in to NATS (`deploy/nats/auth.conf`): the same two
/// flags on `server`, `worker` and the client commands.
#[derive(Debug, Clone, Default, Args)]
pub struct NatsLoginArgs {
    /// NATS credentials: a .creds file (user JWT and seed) or a file
    /// holding an nkey user seed (SU…, `cronoq keygen --seed-file`).
    #[arg(long, env = "CRONOQ_NATS_CREDS", value_name = "FILE")]
    pub nats_creds: Option<std::path::PathBuf>,
    /// Inbox prefix for NATS replies (replaces _INBOX), e.g.
    /// _INBOX.submitter: the one the NATS user may subscribe to.
    #[arg(long, env = "CRONOQ_NATS_INBOX_PREFIX", value_name = "PREFIX")]
    pub nats_inbox_prefix: Option<String>,
}

impl NatsLoginArgs {
    /// The login these flags describe (checked when it is loaded).
    pub fn login(&self) -> crate::wire::NatsLogin {
        let mut login = crate::wire::NatsLogin::new();
        if let Some(path) = &self.nats_creds {
            login = login.creds(path);
        }
        if let Some(prefix) = &self.nats_inbox_prefix {
            login = login.inbox_prefix(prefix);
        }
        login
    }
}

/// The exporter a command runs with, started (inside a tokio runtime):
/// `cronoq worker`'s (and `cronoq dev`'s, for its demo workers), whose
/// spans are `tracing` spans that `main` exports through
/// [`crate::telemetry::Telemetry::layer`]. `cronoq server` starts its own
/// from its config (it exports task spans, not `tracing` ones); other
/// commands export nothing.
pub fn telemetry(cli: &Cli) -> anyhow::Result<Option<crate::telemetry::Telemetry>> {
    match &cli.command {
        Command::Worker(args) => worker_cmd::telemetry(args),
        Command::Dev(_) => crate::telemetry::Telemetry::from_env("cronoq-dev")
            .map_err(|e| anyhow::Error::new(crate::wire::WireError::new(e.code(), e.to_string()))),
        _ => Ok(None),
    }
}

/// Runs the parsed command.
pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Server(args) => server_cmd::run(args).await,
        Command::Worker(args) => worker_cmd::run(args).await,
        Command::Submit(args) => client_cmds::submit(*args).await,
        Command::Snapshot(args) => client_cmds::snapshot(args).await,
        Command::Task(args) => client_cmds::task(args).await,
        Command::Cancel(args) => client_cmds::cancel(args).await,
        Command::Keygen(args) => keygen::run(args),
        Command::Dev(args) => dev::run(args).await,
        Command::Schedule(args) => schedule_cmd::run(args).await,
    }
}

/// The stable code behind an error, if one of ours is in its chain.
pub fn error_code(error: &anyhow::Error) -> Option<ErrorCode> {
    for cause in error.chain() {
        if let Some(e) = cause.downcast_ref::<crate::wire::WireError>() {
            return Some(e.code.clone());
        }
        if let Some(e) = cause.downcast_ref::<crate::embedded::Error>() {
            return Some(e.code());
        }
        if let Some(e) = cause.downcast_ref::<crate::core::Rejection>() {
            return Some(e.code());
        }
    }
    None
}

/// The credential `--token-env` or `--nkey-seed` names, read now (before
/// connecting), for the client commands and `cronoq worker` alike: an unset
/// or empty variable, an unreadable or invalid seed, or both flags are
/// `INVALID_ARGUMENT`. The message never holds the secret.
fn credential_from(
    token_env: Option<&str>,
    nkey_seed: Option<&std::path::Path>,
) -> Result<Option<crate::auth::Credential>, crate::wire::WireError> {
    use crate::auth::Credential;
    let invalid =
        |message: String| crate::wire::WireError::new(ErrorCode::INVALID_ARGUMENT, message);
    match (token_env, nkey_seed) {
        (Some(_), Some(_)) => Err(invalid(
            "give --token-env or --nkey-seed, not both (CRONOQ_TOKEN_ENV, CRONOQ_NKEY_SEED)".into(),
        )),
        (Some(var), None) => match std::env::var(var) {
            Ok(token) if !token.is_empty() => Ok(Some(Credential::token(token))),
            Ok(_) => Err(invalid(format!("--token-env names {var}, which is empty"))),
            Err(_) => Err(invalid(format!(
                "--token-env names {var}, which is not set"
            ))),
        },
        (None, Some(path)) => Credential::from_seed_file(path)
            .map(Some)
            .map_err(|e| invalid(format!("--nkey-seed: {}", e.message))),
        (None, None) => Ok(None),
    }
}
