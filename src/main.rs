//! The `cronoq` binary: parse arguments, set up tracing, run the command,
//! map errors to exit codes (2) printed as `error: … [CODE]`.

use std::process::ExitCode;

use clap::Parser;

/// jemalloc, not the system allocator: a server's work is many small
/// allocations freed on another thread than made them (a submission
/// decoded by one task, admitted and dropped by the driver). With glibc's
/// allocator a takeover that admits 200,000 waiting tasks spent half its
/// time in `malloc`/`free` and took about 280 ms; with jemalloc about
/// 125 ms (docs/benchmarks.md). The library (embedded, Python) leaves the
/// choice to whoever links it.
#[cfg(all(unix, feature = "jemalloc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

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
