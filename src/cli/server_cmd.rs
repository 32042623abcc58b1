//! `cronoq server`: a scheduler server over NATS with the HTTP API.

use std::process::ExitCode;

use clap::Args;

use crate::server::ServerConfig;

/// `cronoq server` arguments.
#[derive(Debug, Args)]
pub struct ServerArgs {
    /// Config file (TOML, SPEC §7).
    #[arg(long, env = "CRONOQ_CONFIG")]
    pub config: Option<std::path::PathBuf>,
    /// NATS URL (over `server.nats_url`).
    #[arg(long, env = "CRONOQ_NATS")]
    pub nats: Option<String>,
    /// HTTP listen address (over `server.http_addr`).
    #[arg(long, env = "CRONOQ_HTTP")]
    pub http: Option<String>,
    /// This server's id (default: host name and process id).
    #[arg(long, env = "CRONOQ_ID")]
    pub id: Option<String>,
    /// Subject prefix (over `server.subject_prefix`).
    #[arg(long, env = "CRONOQ_PREFIX")]
    pub prefix: Option<String>,
}

/// The config file (if any) with env vars and flags over it.
pub fn load_config(args: &ServerArgs) -> anyhow::Result<ServerConfig> {
    let mut config = match &args.config {
        Some(path) => ServerConfig::load(path)?,
        None => ServerConfig::default(),
    };
    config.apply(
        args.nats.clone(),
        args.http.clone(),
        args.id.clone(),
        args.prefix.clone(),
    );
    config.check()?;
    Ok(config)
}

/// Runs the server until SIGTERM/SIGINT.
pub async fn run(args: ServerArgs) -> anyhow::Result<ExitCode> {
    let config = load_config(&args)?;
    crate::server::run(config, shutdown_signal())
        .await
        .map_err(|e| {
            let code = e.code();
            anyhow::Error::new(crate::wire::WireError::new(code, e.to_string()))
        })?;
    Ok(ExitCode::SUCCESS)
}

/// Resolves on SIGTERM or SIGINT (Ctrl-C).
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
