//! `cronoq server`: a scheduler server over NATS with the HTTP API.

use std::process::ExitCode;

use clap::Args;

use crate::core::ErrorCode;
use crate::server::ServerConfig;
use crate::wire::WireError;

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
    /// NATS credentials and inbox prefix (over `server.nats_creds` and
    /// `server.nats_inbox_prefix`).
    #[command(flatten)]
    pub login: super::NatsLoginArgs,
    /// Only check the configuration (the file with env vars and flags over
    /// it), print a summary and exit: 0 when the server would start with
    /// it, 2 with the error and its code otherwise. Connects to nothing.
    #[arg(long)]
    pub check_config: bool,
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
    if let Some(path) = &args.login.nats_creds {
        config.server.nats_creds = Some(path.clone());
    }
    if let Some(prefix) = &args.login.nats_inbox_prefix {
        config.server.nats_inbox_prefix = Some(prefix.clone());
    }
    config.check()?;
    Ok(config)
}

/// What the server refuses at start before it connects, beyond
/// [`ServerConfig::check`]: an unusable `[auth]` (as `crate::server::serve`
/// does: an unset token variable, an inline secret, …), a malformed NATS
/// server list or HTTP address. For `--check-config`.
fn check_startable(config: &ServerConfig) -> Result<(), WireError> {
    let s = &config.server;
    config.seal()?;
    let invalid = |m: String| WireError::new(ErrorCode::INVALID_ARGUMENT, format!("config: {m}"));
    let servers = crate::wire::server_list(&s.nats_url);
    if servers.is_empty() {
        return Err(invalid("nats_url is empty".into()));
    }
    for url in servers {
        url.parse::<async_nats::ServerAddr>()
            .map_err(|e| invalid(format!("nats_url {}: {e}", crate::core::excerpt(&url))))?;
    }
    let port = s.http_addr.rsplit_once(':').and_then(|(host, port)| {
        (!host.is_empty())
            .then(|| port.parse::<u16>().ok())
            .flatten()
    });
    if port.is_none() {
        return Err(invalid(format!(
            "http_addr {} is not HOST:PORT",
            crate::core::excerpt(&s.http_addr)
        )));
    }
    // The credentials file is read and checked, as the server would.
    s.nats_login()
        .load()
        .map_err(|e| WireError::new(e.code(), format!("config: {e}")))?;
    let auth = config
        .authenticator()
        .map_err(|e| WireError::new(e.code, format!("config: [auth]: {}", e.message)))?;
    telemetry_settings(config)?;
    if !auth.required() && (!config.auth.tokens.is_empty() || !config.auth.nkeys.is_empty()) {
        tracing::warn!("[auth] lists credentials but required = false: nothing is checked");
    }
    Ok(())
}

/// What `[telemetry]` and the `OTEL_*` env give the server (`None`: off),
/// refused as the server would refuse it.
fn telemetry_settings(
    config: &ServerConfig,
) -> Result<Option<crate::telemetry::ExportSettings>, WireError> {
    config
        .telemetry
        .resolve("cronoq-server", |key| std::env::var(key).ok())
        .map_err(|e| WireError::new(ErrorCode::INVALID_ARGUMENT, format!("config: {e}")))
}

/// `--check-config`: the summary of a valid configuration.
fn summary(args: &ServerArgs, config: &ServerConfig) -> String {
    let fleets: usize = config.pools.iter().map(|p| p.fleets.len()).sum();
    format!(
        "config ok: {}: {} pools, {} fleets, nats {}, http {}, replicas {}, telemetry {}, auth {}",
        args.config
            .as_ref()
            .map_or("(defaults)".to_string(), |p| p.display().to_string()),
        config.pools.len(),
        fleets,
        config.server.nats_url,
        config.server.http_addr,
        config.server.replicas,
        match telemetry_settings(config) {
            Ok(Some(t)) => format!("traces to {} as {}", t.traces_endpoint, t.service_name),
            _ => "off".to_string(),
        },
        if config.auth.required {
            format!(
                "required ({} tokens, {} nkeys)",
                config.auth.tokens.len(),
                config.auth.nkeys.len()
            )
        } else {
            "off".to_string()
        }
    )
}

/// Runs the server until SIGTERM/SIGINT (or, with `--check-config`, only
/// checks its configuration).
pub async fn run(args: ServerArgs) -> anyhow::Result<ExitCode> {
    let config = load_config(&args)?;
    if args.check_config {
        check_startable(&config)?;
        println!("{}", summary(&args, &config));
        return Ok(ExitCode::SUCCESS);
    }
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
