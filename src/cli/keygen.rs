//! `cronoq keygen`: a new nkey user pair for a worker credential. The seed
//! (secret) goes to a file or stdout; the public key to put in the server's
//! `[[auth.nkeys]]` goes to stdout.

use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

/// `cronoq keygen` arguments.
#[derive(Debug, Args)]
pub struct KeygenArgs {
    /// Write the seed to this file (mode 0600) instead of stdout.
    #[arg(long)]
    pub seed_file: Option<std::path::PathBuf>,
}

/// Prints a new pair.
pub fn run(args: KeygenArgs) -> anyhow::Result<ExitCode> {
    let pair = nkeys::KeyPair::new_user();
    let seed = pair.seed().context("reading the new seed")?;
    match args.seed_file {
        Some(path) => {
            write_secret(&path, &seed).with_context(|| format!("writing {}", path.display()))?;
            eprintln!("seed written to {}", path.display());
        }
        None => println!("seed: {seed}"),
    }
    println!("public_key: {}", pair.public_key());
    Ok(ExitCode::SUCCESS)
}

fn write_secret(path: &std::path::Path, seed: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options.open(path)?;
    writeln!(file, "{seed}")
}
