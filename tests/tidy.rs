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

// ---------------------------------------------------------------------------
// Layers (STYLE §1, §6; ARCHITECTURE.md "Dependencies point one way").
//
// Lowest first; a module may name only modules of layers below its own:
//
//   core::model                         ids, names, labels, specs, codes
//   core::fair                          fairness and concurrency keys (data)
//   core::{autoscale, ids, queue, timers}
//   core::groups
//   core                                Core (mod.rs, placement, snapshot, check)
//   task, metrics, nats, test_nats      the task builder; counters; NATS helpers
//   schedule, telemetry                 pure schedule rules; OTLP export (spans from records)
//   wire                                MessagePack, subjects, headers, NatsLogin
//   auth                                credentials, proofs ([auth] config)
//   ledger                              per-task records beside the core
//   api                                 the Api trait, SubmitRequest
//   embedded, client, worker            the shells
//   http                                routes over any Arc<dyn Api>
//   server                              the NATS leader (serves http)
//   cli                                 (and main.rs, which is outside the graph)
//
// The module graph is read from the source: every `use crate::…` tree
// (nested braces over several lines), every `crate::x::…` path in code, and
// `super::`/`self::` paths resolved to the module they name (following
// inline `mod x { … }` blocks). Comments, doc comments and literals are
// skipped. A node is a top-level module, except in `core`, where each
// submodule is a node; an item `core/mod.rs` re-exports counts as an edge
// to the submodule that defines it. Edges go strictly down, so there is no
// upward edge and no cycle; `lib.rs` (re-exports) is not a node.
// ---------------------------------------------------------------------------

/// The layers, lowest first: an edge `a → b` is allowed only when `b`'s
/// layer is below `a`'s (one layer's modules do not name each other).
const LAYERS: &[&[&str]] = &[
    &["core::model"],
    &["core::spec"],
    &["core::fair"],
    &[
        "core::autoscale",
        "core::ids",
        "core::queue",
        "core::timers",
    ],
    &["core::groups"],
    &["core"],
    &["task", "metrics", "nats", "test_nats"],
    &["schedule", "telemetry"],
    &["wire"],
    &["auth"],
    &["ledger"],
    &["api"],
    &["embedded", "client", "worker"],
    &["http"],
    &["server"],
    &["cli"],
];

/// The files of `core` that hold `impl Core` blocks (and the snapshot
/// types they build): one node with `core/mod.rs`, the top of `core`.
const CORE_ITSELF: &[&str] = &[
    "placement",
    "snapshot",
    "check",
    "waiting",
    "running",
    "sharing",
];

/// Edges against the layers that are known, by file: (file, module it
/// names, why). Each must still occur (else remove it). Empty is the goal.
const KNOWN_EXCEPTIONS: &[(&str, &str, &str)] = &[];

/// One token of Rust source, with its 1-based line.
#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Punct(char),
    PathSep,
}

/// Splits Rust source into identifiers and punctuation; comments, string,
/// char and number literals and lifetimes are dropped.
fn tokenize(src: &str) -> Vec<(Tok, usize)> {
    let c: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    let count_lines = |from: usize, to: usize| c[from..to].iter().filter(|&&x| x == '\n').count();
    while i < c.len() {
        let ch = c[i];
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && c.get(i + 1) == Some(&'/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && c.get(i + 1) == Some(&'*') {
            let (start, mut depth) = (i, 0);
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            line += count_lines(start, i.min(c.len()));
        } else if ch == '"'
            || ((ch == 'r' || ch == 'b') && raw_or_byte_string_start(&c, i).is_some())
        {
            let start = i;
            let (hashes, raw) = if ch == '"' {
                (0, false)
            } else {
                raw_or_byte_string_start(&c, i).unwrap()
            };
            // Move to the opening quote.
            while c[i] != '"' {
                i += 1;
            }
            i += 1;
            loop {
                if i >= c.len() {
                    break;
                }
                if !raw && c[i] == '\\' {
                    i += 2;
                    continue;
                }
                if c[i] == '"' && (0..hashes).all(|h| c.get(i + 1 + h) == Some(&'#')) {
                    i += 1 + hashes;
                    break;
                }
                i += 1;
            }
            line += count_lines(start, i.min(c.len()));
        } else if ch == '\'' {
            // A char literal ('a', '\n', '\u{1F600}') or a lifetime ('a).
            if c.get(i + 1) == Some(&'\\') {
                i += 2;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if c.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
                while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                    i += 1;
                }
            }
        } else if ch.is_alphabetic() || ch == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            let word: String = c[start..i].iter().collect();
            // `b'x'` byte literals.
            if word == "b" && c.get(i) == Some(&'\'') {
                continue;
            }
            out.push((Tok::Ident(word.trim_start_matches("r#").to_string()), line));
        } else if ch.is_ascii_digit() {
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_' || c[i] == '.') {
                if c[i] == '.' && !c.get(i + 1).is_some_and(|d| d.is_ascii_digit()) {
                    break;
                }
                i += 1;
            }
        } else if ch == ':' && c.get(i + 1) == Some(&':') {
            out.push((Tok::PathSep, line));
            i += 2;
        } else {
            out.push((Tok::Punct(ch), line));
            i += 1;
        }
    }
    out
}

/// At `i`, the start of `r"…"`, `r#"…"#`, `b"…"`, `br#"…"#`: the number of
/// `#`s and whether it is raw.
fn raw_or_byte_string_start(c: &[char], i: usize) -> Option<(usize, bool)> {
    if i > 0 && (c[i - 1].is_alphanumeric() || c[i - 1] == '_') {
        return None;
    }
    let mut j = i;
    if c.get(j) == Some(&'b') {
        j += 1;
    }
    let raw = c.get(j) == Some(&'r');
    if raw {
        j += 1;
    }
    let mut hashes = 0;
    while raw && c.get(j) == Some(&'#') {
        hashes += 1;
        j += 1;
    }
    (j > i && c.get(j) == Some(&'"')).then_some((hashes, raw))
}

/// The module path a source file defines: `src/core/model.rs` → `core::model`,
/// `src/http/mod.rs` → `http`.
fn module_of(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    parts.remove(0); // "src"
    let last = parts.pop().unwrap();
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" {
        parts.push(stem.to_string());
    }
    parts
}

/// A `crate::`-rooted path named in a file, resolved, with its line.
struct Named {
    path: Vec<String>,
    line: usize,
}

/// Every path into the crate that `tokens` name, from `use` trees and paths
/// in code, resolved against the module `here` (inline `mod x { … }` blocks
/// are followed for `super::` and `self::`).
fn crate_paths(tokens: &[(Tok, usize)], here: &[String]) -> Vec<Named> {
    let ident = |k: usize| match tokens.get(k) {
        Some((Tok::Ident(s), _)) => Some(s.as_str()),
        _ => None,
    };
    let is = |k: usize, t: Tok| tokens.get(k).is_some_and(|(x, _)| *x == t);
    let mut out = Vec::new();
    // Inline modules: (name, brace depth at which it closes).
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut k = 0;
    while k < tokens.len() {
        let module: Vec<String> = here
            .iter()
            .cloned()
            .chain(inline.iter().map(|(n, _)| n.clone()))
            .collect();
        match &tokens[k].0 {
            Tok::Punct('{') => {
                depth += 1;
                k += 1;
            }
            Tok::Punct('}') => {
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
                k += 1;
            }
            Tok::Ident(w) if w == "mod" && ident(k + 1).is_some() && is(k + 2, Tok::Punct('{')) => {
                inline.push((ident(k + 1).unwrap().to_string(), depth + 1));
                k += 2;
            }
            Tok::Ident(w) if w == "use" => {
                let mut end = k + 1;
                while end < tokens.len() && !is(end, Tok::Punct(';')) {
                    end += 1;
                }
                use_tree(&tokens[k + 1..end], &[], &module, &mut out);
                k = end;
            }
            Tok::Ident(w)
                if (w == "crate" || w == "super" || w == "self")
                    && is(k + 1, Tok::PathSep)
                    && !(k > 0 && is(k - 1, Tok::PathSep)) =>
            {
                let line = tokens[k].1;
                let mut segs = vec![w.clone()];
                let mut j = k + 1;
                while is(j, Tok::PathSep) && ident(j + 1).is_some() {
                    segs.push(ident(j + 1).unwrap().to_string());
                    j += 2;
                }
                if let Some(path) = resolve(&segs, &module) {
                    out.push(Named { path, line });
                }
                k = j;
            }
            _ => k += 1,
        }
    }
    out
}

/// Walks one `use` tree (`a::b::{c, d::{self, e as f}, *}`), pushing each
/// path it names that starts at `crate`, `super` or `self`.
fn use_tree(toks: &[(Tok, usize)], prefix: &[String], here: &[String], out: &mut Vec<Named>) {
    let mut segs: Vec<String> = Vec::new();
    // `self` in a group, or a glob: the path so far is named itself.
    let mut whole = false;
    let mut line = toks.first().map_or(0, |t| t.1);
    let emit = |segs: &mut Vec<String>, whole: &mut bool, line: usize, out: &mut Vec<Named>| {
        if !segs.is_empty() || *whole {
            let full: Vec<String> = prefix.iter().cloned().chain(segs.drain(..)).collect();
            if let Some(path) = resolve(&full, here) {
                out.push(Named { path, line });
            }
        }
        *whole = false;
    };
    let mut k = 0;
    while k < toks.len() {
        match &toks[k].0 {
            Tok::Ident(w) if w == "as" => k += 2,
            Tok::Ident(w) if w == "self" && segs.is_empty() && !prefix.is_empty() => {
                whole = true;
                line = toks[k].1;
                k += 1;
            }
            Tok::Ident(w) => {
                if segs.is_empty() {
                    line = toks[k].1;
                }
                segs.push(w.clone());
                k += 1;
            }
            Tok::Punct('*') => {
                whole = true;
                k += 1;
            }
            Tok::Punct(',') => {
                emit(&mut segs, &mut whole, line, out);
                k += 1;
            }
            Tok::Punct('{') => {
                let (start, mut depth) = (k + 1, 1);
                let mut j = start;
                while j < toks.len() && depth > 0 {
                    match toks[j].0 {
                        Tok::Punct('{') => depth += 1,
                        Tok::Punct('}') => depth -= 1,
                        _ => {}
                    }
                    j += 1;
                }
                let inner: Vec<String> = prefix.iter().cloned().chain(segs.drain(..)).collect();
                use_tree(&toks[start..j - 1], &inner, here, out);
                k = j;
            }
            _ => k += 1,
        }
    }
    emit(&mut segs, &mut whole, line, out);
}

/// `crate::a::b` → `[a, b]`; `super::x` and `self::x` against `here`;
/// anything else (a dependency, `std`) → `None`.
fn resolve(segs: &[String], here: &[String]) -> Option<Vec<String>> {
    let mut base: Vec<String> = here.to_vec();
    let mut rest = segs;
    match segs.first()?.as_str() {
        "crate" | "$crate" => {
            base.clear();
            rest = &segs[1..];
        }
        "super" | "self" => {
            while let Some(s) = rest.first() {
                match s.as_str() {
                    "super" => {
                        base.pop()?;
                    }
                    "self" => {}
                    _ => break,
                }
                rest = &rest[1..];
            }
        }
        _ => return None,
    }
    base.extend(rest.iter().cloned());
    Some(base)
}

/// The graph's node for a resolved path: the top-level module, or for
/// `core` the submodule (items re-exported by `core/mod.rs` are looked up
/// in `core_items`, the names each core submodule defines).
fn node_of(path: &[String], core_items: &[(String, String)]) -> Option<String> {
    let top = path.first()?;
    if top != "core" {
        return Some(top.clone());
    }
    let sub = match path.get(1) {
        None => return Some("core".into()),
        Some(second) if core_items.iter().any(|(m, _)| m == second) => second,
        Some(second) => match core_items.iter().find(|(_, item)| item == second) {
            Some((m, _)) => m,
            None => return Some("core".into()),
        },
    };
    Some(if CORE_ITSELF.contains(&sub.as_str()) {
        "core".into()
    } else {
        format!("core::{sub}")
    })
}

/// The names each `src/core/*.rs` file defines at its top level, as
/// (submodule, item); every submodule appears at least once (item "").
fn core_items() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for path in rust_files("src/core") {
        let module = module_of(Path::new(&relative(&path)));
        if module.len() != 2 {
            continue;
        }
        let name = module[1].clone();
        out.push((name.clone(), String::new()));
        let text = std::fs::read_to_string(&path).expect("readable source");
        let toks = tokenize(&text);
        let mut depth = 0;
        for (k, (t, _)) in toks.iter().enumerate() {
            match t {
                Tok::Punct('{') => depth += 1,
                Tok::Punct('}') => depth -= 1,
                Tok::Ident(w)
                    if depth == 0
                        && matches!(
                            w.as_str(),
                            "struct" | "enum" | "fn" | "type" | "trait" | "const" | "static"
                        ) =>
                {
                    if let Some((Tok::Ident(item), _)) = toks.get(k + 1) {
                        out.push((name.clone(), item.clone()));
                    }
                }
                _ => {}
            }
        }
    }
    out
}

/// Every edge between two nodes of the module graph, with where it is named.
fn module_edges() -> Vec<(String, String, String)> {
    let items = core_items();
    let mut edges = Vec::new();
    for path in rust_files("src") {
        let rel = relative(&path);
        let module = module_of(Path::new(&rel));
        // lib.rs is the crate root (re-exports only), main.rs the binary.
        let Some(from) = node_of(&module, &items) else {
            continue;
        };
        if from == "lib" || from == "main" {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("readable source");
        for named in crate_paths(&tokenize(&text), &module) {
            let Some(to) = node_of(&named.path, &items) else {
                continue;
            };
            if to != from {
                edges.push((from.clone(), to, format!("{rel}:{}", named.line)));
            }
        }
    }
    edges
}

fn rank(node: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&node))
}

#[test]
fn module_dependencies_point_down() {
    let edges = module_edges();
    assert!(edges.len() > 50, "too few edges found: {}", edges.len());
    let mut bad = Vec::new();
    let mut used = vec![false; KNOWN_EXCEPTIONS.len()];
    for (from, to, at) in &edges {
        if let Some(i) = KNOWN_EXCEPTIONS
            .iter()
            .position(|(file, t, _)| t == to && at.starts_with(&format!("{file}:")))
        {
            used[i] = true;
            continue;
        }
        match (rank(from), rank(to)) {
            (Some(a), Some(b)) if b < a => {}
            (None, _) => bad.push(format!("{at}: {from} is in no layer of LAYERS")),
            (_, None) => bad.push(format!("{at}: {to} is in no layer of LAYERS")),
            (Some(a), Some(b)) if a == b => bad.push(format!(
                "{at}: {from} → {to}: one layer, so they may not name each other"
            )),
            _ => bad.push(format!("{at}: {from} → {to} points up")),
        }
    }
    for (i, (file, to, _)) in KNOWN_EXCEPTIONS.iter().enumerate() {
        if !used[i] {
            bad.push(format!(
                "KNOWN_EXCEPTIONS: {file} no longer names {to}: remove the exception"
            ));
        }
    }
    let nodes: Vec<String> = edges.iter().map(|(from, _, _)| from.clone()).collect();
    for name in LAYERS.iter().flat_map(|l| l.iter()) {
        if !nodes.iter().any(|n| n == name) && !edges.iter().any(|(_, to, _)| to == name) {
            bad.push(format!("LAYERS: no module {name}: remove it"));
        }
    }
    bad.sort();
    bad.dedup();
    assert!(
        bad.is_empty(),
        "module edges against the layers at the top of tests/tidy.rs (move the item \
         down, or the code that needs it up):\n  {}",
        bad.join("\n  ")
    );
}

#[test]
fn anyhow_stays_in_cli_and_messagepack_in_wire() {
    // (crate, where it may be named)
    let allowed: [(&str, &[&str]); 3] = [
        ("anyhow", &["src/cli/", "src/main.rs"]),
        ("rmp_serde", &["src/wire/"]),
        ("rmp", &["src/wire/"]),
    ];
    let mut hits = Vec::new();
    for path in rust_files("src") {
        let rel = relative(&path);
        let text = std::fs::read_to_string(&path).expect("readable source");
        for (tok, line) in tokenize(&text) {
            let Tok::Ident(word) = tok else { continue };
            for (krate, places) in allowed {
                if word == krate && !places.iter().any(|p| rel.starts_with(p)) {
                    hits.push(format!(
                        "{rel}:{line}: {krate} (only in {})",
                        places.join(", ")
                    ));
                }
            }
        }
    }
    assert!(
        hits.is_empty(),
        "anyhow belongs to cli and main.rs, MessagePack to wire:\n  {}",
        hits.join("\n  ")
    );
}

/// `cargo test --test tidy -- --ignored --nocapture print_module_graph`:
/// the module graph as the layers test reads it, one edge a line.
#[test]
#[ignore]
fn print_module_graph() {
    let mut seen = std::collections::BTreeMap::<(String, String), Vec<String>>::new();
    for (from, to, at) in module_edges() {
        seen.entry((from, to)).or_default().push(at);
    }
    for ((from, to), at) in seen {
        println!("{from} → {to}  ({} uses, first {})", at.len(), at[0]);
    }
}
