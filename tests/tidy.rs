//! Source hygiene that review alone would let slip (STYLE §1, §5): every
//! Rust file opens with a `//!` doc line, and the sans-IO core (and the
//! schedule rules beside it) name no runtime, transport or clock.

use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir` (relative to the crate root), sorted.
fn rust_files(dir: &str) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(&Path::new(env!("CARGO_MANIFEST_DIR")).join(dir), &mut out);
    out.sort();
    out
}

fn relative(path: &Path) -> String {
    path.strip_prefix(env!("CARGO_MANIFEST_DIR"))
        .unwrap_or(path)
        .display()
        .to_string()
}

#[test]
fn every_rust_file_starts_with_a_module_doc() {
    let mut missing = Vec::new();
    let mut seen = 0;
    for dir in ["src", "tests", "benches", "examples"] {
        for path in rust_files(dir) {
            seen += 1;
            let text = std::fs::read_to_string(&path).expect("readable source");
            if !text.starts_with("//!") {
                missing.push(relative(&path));
            }
        }
    }
    assert!(
        seen > 0,
        "no sources found under {}",
        env!("CARGO_MANIFEST_DIR")
    );
    assert!(
        missing.is_empty(),
        "these files do not start with a `//!` line saying what lives there:\n  {}",
        missing.join("\n  ")
    );
}

#[test]
fn core_is_sans_io() {
    const FORBIDDEN: [&str; 5] = [
        "tokio",
        "async_nats",
        "axum",
        "Instant::now",
        "SystemTime::now",
    ];
    // `schedule` holds the firing rules: as pure as the core.
    let mut hits = Vec::new();
    for dir in ["src/core", "src/schedule"] {
        let files = rust_files(dir);
        assert!(!files.is_empty(), "{dir} not found");
        for path in files {
            let text = std::fs::read_to_string(&path).expect("readable source");
            for (n, line) in text.lines().enumerate() {
                for word in FORBIDDEN {
                    if line.contains(word) {
                        hits.push(format!("{}:{}: {word}", relative(&path), n + 1));
                    }
                }
            }
        }
    }
    assert!(
        hits.is_empty(),
        "src/core and src/schedule must stay pure (no runtime, transport or clock):\n  {}",
        hits.join("\n  ")
    );
}
