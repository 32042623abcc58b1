//! `cronoq worker … -- CMD`: a remote worker that runs CMD once per attempt
//! (payload on stdin, stdout = output, exit 0 = success; env
//! `CRONOQ_TASK_ID`, `CRONOQ_ATTEMPT`, `CRONOQ_POOL`, `CRONOQ_GROUP`).

use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;

use crate::wire::WireError;
use crate::worker::{run_command, Worker, WorkerOptions};

/// `cronoq worker` arguments.
#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// The pool to serve.
    #[arg(long, env = "CRONOQ_POOL", default_value = "default")]
    pub pool: String,
    /// A label of this worker, `name=value`; repeat for more.
    #[arg(long = "label", value_name = "K=V")]
    pub labels: Vec<String>,
    /// Attempts to run at once.
    #[arg(long, env = "CRONOQ_SLOTS", default_value_t = 1)]
    pub slots: u32,
    /// NATS URL.
    #[arg(long, env = "CRONOQ_NATS", default_value = super::DEFAULT_NATS)]
    pub nats: String,
    /// Subject prefix.
    #[arg(long, env = "CRONOQ_PREFIX", default_value = "cronoq")]
    pub prefix: String,
    /// Worker id (default: host name, process id and a random suffix).
    #[arg(long, env = "CRONOQ_WORKER_ID")]
    pub id: Option<String>,
    /// Name of the env var that holds this worker's token.
    #[arg(long, env = "CRONOQ_TOKEN_ENV")]
    pub token_env: Option<String>,
    /// File holding this worker's nkey seed.
    #[arg(long, env = "CRONOQ_NKEY_SEED")]
    pub nkey_seed: Option<std::path::PathBuf>,
    /// NATS credentials and inbox prefix.
    #[command(flatten)]
    pub login: super::NatsLoginArgs,
    /// A config file whose `[telemetry]` section this worker reads (other
    /// sections are ignored, so the servers' file can be shared); the
    /// `OTEL_*` env vars win over it.
    #[arg(long, env = "CRONOQ_CONFIG")]
    pub config: Option<std::path::PathBuf>,
    /// On SIGTERM/SIGINT, how long running attempts may take to finish.
    #[arg(long, env = "CRONOQ_GRACE", default_value = "30s", value_parser = humantime::parse_duration)]
    pub grace: std::time::Duration,
    /// The command to run per attempt, and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// Runs the worker until SIGTERM/SIGINT; exit 0 after a clean drain, 2
/// on an error (bad labels or credentials are refused before connecting).
pub async fn run(args: WorkerArgs) -> anyhow::Result<ExitCode> {
    let options = options(&args)?;
    let command: Arc<[String]> = args.command.into();
    let worker = Worker::new(options, move |ctx, payload| {
        let command = command.clone();
        async move { run_command(&command, &ctx, payload).await }
    });
    worker.run().await.map_err(WireError::from)?;
    Ok(ExitCode::SUCCESS)
}

/// The part of a config file a worker reads.
#[derive(serde::Deserialize)]
struct WorkerFile {
    #[serde(default)]
    telemetry: crate::telemetry::TelemetryConfig,
}

/// The worker's exporter as `--config`'s `[telemetry]` and the `OTEL_*`
/// env say (`None`: off); inside a tokio runtime. `main` installs its
/// layer: a worker's spans are `tracing` spans.
pub fn telemetry(args: &WorkerArgs) -> anyhow::Result<Option<crate::telemetry::Telemetry>> {
    use anyhow::Context as _;
    let config = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            toml::from_str::<WorkerFile>(&text)
                .with_context(|| format!("config {}", path.display()))?
                .telemetry
        }
        None => Default::default(),
    };
    crate::telemetry::Telemetry::start(&config, "cronoq-worker")
        .map_err(|e| anyhow::Error::new(WireError::new(e.code(), e.to_string())))
}

/// The worker options the arguments describe; secrets are read here.
fn options(args: &WorkerArgs) -> Result<WorkerOptions, WireError> {
    let mut options = WorkerOptions::new(&args.nats)
        .pool(&args.pool)
        .slots(args.slots)
        .prefix(&args.prefix)
        .grace(args.grace);
    if let Some(path) = &args.login.nats_creds {
        options = options.nats_creds(path);
    }
    if let Some(prefix) = &args.login.nats_inbox_prefix {
        options = options.nats_inbox_prefix(prefix);
    }
    for label in &args.labels {
        options = options.label_text(label);
    }
    if let Some(id) = &args.id {
        options = options.id(id);
    }
    if let Some(credential) =
        super::credential_from(args.token_env.as_deref(), args.nkey_seed.as_deref())?
    {
        options = options.credential(credential);
    }
    Ok(options)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;

    fn args(config: &std::path::Path) -> WorkerArgs {
        let config = config.to_str().unwrap();
        match crate::cli::Cli::try_parse_from([
            "cronoq", "worker", "--config", config, "--", "true",
        ])
        .unwrap()
        .command
        {
            crate::cli::Command::Worker(args) => args,
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn the_worker_reads_telemetry_from_its_config_and_nothing_else_there() {
        if std::env::vars().any(|(k, _)| k.starts_with("OTEL_")) {
            return; // this process's own env decides
        }
        let dir = tempfile::tempdir().unwrap();
        let shared = dir.path().join("shared.toml");
        // The servers' file: its other sections are not the worker's.
        std::fs::write(
            &shared,
            "[server]\nnats_url = \"nats://x:4222\"\n[telemetry]\nendpoint = \"http://127.0.0.1:9\"\n",
        )
        .unwrap();
        let telemetry = telemetry(&args(&shared)).unwrap().expect("configured");
        assert_eq!(telemetry.service_name(), "cronoq-worker");
        telemetry
            .shutdown(std::time::Duration::from_millis(100))
            .await;
        let plain = dir.path().join("plain.toml");
        std::fs::write(&plain, "[server]\nnats_url = \"nats://x:4222\"\n").unwrap();
        assert!(telemetry_is_off(&plain));
        let typo = dir.path().join("typo.toml");
        std::fs::write(&typo, "[telemetry]\nendpont = \"http://127.0.0.1:9\"\n").unwrap();
        assert!(super::telemetry(&args(&typo)).is_err(), "a typo is refused");
    }

    fn telemetry_is_off(path: &std::path::Path) -> bool {
        super::telemetry(&args(path)).unwrap().is_none()
    }
}
