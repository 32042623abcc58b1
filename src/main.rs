//! The `cronoq` binary: parse arguments, set up tracing, run the command,
//! map errors to exit codes (2) printed as `error: … [CODE]`.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = cronoq::cli::Cli::parse();
    // Long-running commands log what they do; one-shot client commands
    // print only their answer. CRONOQ_LOG (EnvFilter syntax) overrides.
    let default_filter = if cli.command.is_long_running() {
        "info,async_nats=warn"
    } else {
        "warn"
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("CRONOQ_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter)),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: starting the runtime: {e} [INTERNAL]");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(cronoq::cli::run(cli)) {
        Ok(code) => code,
        Err(e) => {
            let message = format!("{e:#}");
            match cronoq::cli::error_code(&e) {
                Some(code) if !message.contains(&format!("[{code}]")) => {
                    eprintln!("error: {message} [{code}]")
                }
                _ => eprintln!("error: {message}"),
            }
            ExitCode::from(2)
        }
    }
}
