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
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    use tracing_subscriber::Layer as _;
    let cli = cronoq::cli::Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: starting the runtime: {e} [INTERNAL]");
            return ExitCode::from(2);
        }
    };
    // Off unless configured; started before the subscriber, which exports
    // the worker's spans through its layer.
    let telemetry = {
        let _inside = runtime.enter();
        cronoq::cli::telemetry(&cli)
    };
    let telemetry = match telemetry {
        Ok(t) => t,
        Err(e) => return report(e),
    };
    // Long-running commands log what they do; one-shot client commands
    // print only their answer. CRONOQ_LOG (EnvFilter syntax) overrides.
    let default_filter = if cli.command.is_long_running() {
        "info,async_nats=warn"
    } else {
        "warn"
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("CRONOQ_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter))
        // The spans made for export only (an attempt, its command) would
        // prefix every log line inside them; the lines name the task anyway.
        .add_directive(
            format!("{}=off", cronoq::telemetry::TARGET)
                .parse()
                .expect("a valid directive"),
        );
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_filter(filter),
        )
        .with(telemetry.as_ref().map(|t| t.layer()))
        .init();
    let result = runtime.block_on(cronoq::cli::run(cli));
    if let Some(telemetry) = telemetry {
        // What is still queued goes out before the process ends.
        runtime.block_on(telemetry.shutdown(std::time::Duration::from_secs(5)));
    }
    match result {
        Ok(code) => code,
        Err(e) => report(e),
    }
}

/// Prints `error: … [CODE]` and exits 2.
fn report(e: anyhow::Error) -> ExitCode {
    let message = format!("{e:#}");
    match cronoq::cli::error_code(&e) {
        Some(code) if !message.contains(&format!("[{code}]")) => {
            eprintln!("error: {message} [{code}]")
        }
        _ => eprintln!("error: {message}"),
    }
    ExitCode::from(2)
}
