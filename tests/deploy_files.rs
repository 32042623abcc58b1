//! `cronoq server --check-config` (a valid config exits 0 with a summary;
//! every bad one exits 2 with the error and its code, and connects to
//! nothing), the server configs shipped under `deploy/` pass it, the
//! Grafana dashboard queries only metrics that `/metrics` exports (or that
//! its description lists as pending), and the container images the
//! repository builds are the ones the Kubernetes base names, at the
//! crate's version. `scripts/check-deploy` validates the rest of `deploy/`
//! with external tools (hadolint for the Containerfiles).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use cronoq::api::Health;
use cronoq::core::{
    Core, Event, FleetConfig, Labels, LeaderInfo, Millis, PoolConfig, PoolName, WorkerInfo,
};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `cronoq server --check-config ARGS` with no `CRONOQ_*` variable of the
/// test's environment leaking in.
fn check_config(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cronoq"));
    for (key, _) in std::env::vars() {
        if key.starts_with("CRONOQ_") {
            cmd.env_remove(key);
        }
    }
    cmd.args(["server", "--check-config"])
        .args(args)
        .envs(env.iter().copied());
    cmd.output().expect("running cronoq server --check-config")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn write(dir: &Path, name: &str, content: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, content).unwrap();
    path.display().to_string()
}

#[test]
fn check_config_accepts_a_valid_config_and_says_what_it_holds() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "ok.toml",
        r#"
[server]
nats_url = "nats://a:4222, nats://b:4222"
[[pools]]
name = "inference"
fleets = [{ labels = { gpu = "a100" }, max = 8, slots_per_worker = 2 }, { max = 3 }]
[[pools]]
name = "batch"
"#,
    );
    let out = check_config(&["--config", &path], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.starts_with(&format!(
            "config ok: {path}: 2 pools, 2 fleets, nats nats://a:4222"
        )),
        "{stdout}"
    );
    // No file: the defaults are valid too; CRONOQ_CONFIG names a file.
    let out = check_config(&[], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("(defaults)"));
    let out = check_config(&[], &[("CRONOQ_CONFIG", &path)]);
    assert!(text(&out.stdout).contains("2 pools, 2 fleets"), "{out:?}");
}

#[test]
fn check_config_says_where_traces_go_and_refuses_what_cannot_export() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "traced.toml",
        "[telemetry]\nendpoint = \"http://collector:4318\"\nservice_name = \"cronoq-eu\"\n",
    );
    let otel = |out: &mut Command| {
        for (key, _) in std::env::vars() {
            if key.starts_with("OTEL_") {
                out.env_remove(key);
            }
        }
    };
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_cronoq"));
        otel(&mut cmd);
        cmd.env_remove("CRONOQ_CONFIG")
            .args(["server", "--check-config"])
            .args(args)
            .envs(env.iter().copied())
            .output()
            .unwrap()
    };
    let out = run(&[], &[]);
    assert!(text(&out.stdout).contains("telemetry off"), "{out:?}");
    let out = run(&["--config", &path], &[]);
    assert!(
        text(&out.stdout)
            .contains("telemetry traces to http://collector:4318/v1/traces as cronoq-eu"),
        "{out:?}"
    );
    // The env wins over the file.
    let out = run(&["--config", &path], &[("OTEL_SERVICE_NAME", "from-env")]);
    assert!(text(&out.stdout).contains("as from-env"), "{out:?}");
    let out = run(
        &["--config", &path],
        &[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")],
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        text(&out.stderr).contains("grpc is not supported"),
        "{out:?}"
    );
    assert!(text(&out.stderr).contains("[INVALID_ARGUMENT]"), "{out:?}");
    let bad = write(dir.path(), "bad.toml", "[telemetry]\nendpont = \"x\"\n");
    let out = run(&["--config", &bad], &[]);
    assert_eq!(out.status.code(), Some(2), "a typo is refused: {out:?}");
}

#[test]
fn check_config_refuses_each_bad_config_with_its_code() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, &[&str], &str, &str); 12] = [
        (
            "[[pools]]\nname = \"p\"\nfleets = [{ labels = { gpu = \"a100\" }, min = 9, max = 8 }]",
            &[],
            "INVALID_ARGUMENT",
            "pool p: fleet gpu=a100: min 9 is above max 8",
        ),
        (
            "[[pools]]\nname = \"p\"\nfleets = [{ max = 8, slots_per_worker = 0 }]",
            &[],
            "INVALID_ARGUMENT",
            "slots_per_worker must be at least 1",
        ),
        (
            "[[pools]]\nname = \"p\"\nfleets = [{ labels = { \"gpu!\" = \"x\" }, max = 1 }]",
            &[],
            "INVALID_ARGUMENT",
            "label name",
        ),
        (
            "[server]\nworker_timout = \"5s\"",
            &[],
            "INVALID_ARGUMENT",
            "unknown field",
        ),
        (
            "[server]\nreplicas = 7",
            &[],
            "INVALID_ARGUMENT",
            "replicas must be between 1 and 5",
        ),
        (
            "[server]\nhttp_addr = \"7070\"",
            &[],
            "INVALID_ARGUMENT",
            "http_addr",
        ),
        (
            "[server]\nnats_url = \"nats://a:b:c\"",
            &[],
            "INVALID_ARGUMENT",
            "nats_url",
        ),
        ("", &["--http", "no-port"], "INVALID_ARGUMENT", "http_addr"),
        ("", &["--prefix", "a.b"], "INVALID_ARGUMENT", "prefix"),
        (
            "[auth]\nrequired = true",
            &[],
            "INVALID_ARGUMENT",
            "nobody could use the server",
        ),
        (
            "[auth]\nrequired = true\n[[auth.tokens]]\ntoken_env = \"CRONOQ_TEST_UNSET_TOKEN\"\nrole = \"admin\"",
            &[],
            "INVALID_ARGUMENT",
            "CRONOQ_TEST_UNSET_TOKEN is not set",
        ),
        (
            "[auth]\nrequired = true\n[[auth.tokens]]\ntoken_env = \"X\"\ntoken = \"inline-secret-0123456789\"\nrole = \"admin\"",
            &[],
            "INVALID_ARGUMENT",
            "inline token",
        ),
    ];
    for (i, (config, flags, code, why)) in cases.iter().enumerate() {
        let path = write(dir.path(), &format!("bad-{i}.toml"), config);
        let mut args = vec!["--config", path.as_str()];
        args.extend_from_slice(flags);
        let out = check_config(&args, &[]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{config} {flags:?}: {stderr}");
        assert!(text(&out.stdout).is_empty(), "{config}");
        assert!(stderr.starts_with("error: "), "{stderr}");
        assert!(
            stderr.trim_end().ends_with(&format!("[{code}]")),
            "{config}: {stderr}"
        );
        assert!(stderr.contains(why), "{config}: {stderr}");
        assert!(!stderr.contains("inline-secret"), "a secret in: {stderr}");
    }
    let missing = dir.path().join("missing.toml").display().to_string();
    let out = check_config(&["--config", &missing], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("reading config"), "{out:?}");
}

/// The TOML of the `cronoq.toml` key of a ConfigMap manifest (a block
/// scalar, `cronoq.toml: |`, indented under it).
fn configmap_toml(manifest: &str) -> String {
    let mut lines = manifest
        .lines()
        .skip_while(|l| l.trim() != "cronoq.toml: |");
    let key = lines.next().expect("a cronoq.toml: | key");
    let key_indent = key.len() - key.trim_start().len();
    let body: Vec<&str> = lines
        .take_while(|l| l.trim().is_empty() || l.len() - l.trim_start().len() > key_indent)
        .collect();
    let indent = body
        .iter()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.len() - l.trim_start().len())
        .min()
        .unwrap_or(0);
    body.iter()
        .map(|l| l.get(indent..).unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_shipped_server_configs_pass_check_config() {
    let dir = tempfile::tempdir().unwrap();
    let manifest =
        std::fs::read_to_string(root().join("deploy/kubernetes/base/server-config.yaml")).unwrap();
    let kubernetes = write(dir.path(), "k8s.toml", &configmap_toml(&manifest));
    let systemd = root()
        .join("deploy/systemd/cronoq.toml")
        .display()
        .to_string();
    for (path, fleets) in [(kubernetes, 2), (systemd, 2)] {
        // Both run with auth on and a storage key: every token variable
        // their [auth] names, and the storage key's, gets a stand-in (the
        // Secrets, or server.env, in production).
        let config = std::fs::read_to_string(&path).unwrap();
        assert!(
            config.contains("storage_key_env = "),
            "{path}: the servers seal what they store"
        );
        let tokens: Vec<(String, String)> = config
            .lines()
            .filter_map(|l| {
                let l = l.trim();
                l.strip_prefix("token_env = \"")
                    .or_else(|| l.strip_prefix("storage_key_env = \""))
            })
            .filter_map(|rest| rest.split('"').next())
            .map(|var| (var.to_string(), format!("a-stand-in-token-for-{var}")))
            .collect();
        assert!(tokens.len() >= 3, "{path}: auth with a token per role");
        let env: Vec<(&str, &str)> = tokens
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let out = check_config(&["--config", &path], &[]);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{path}: unset tokens must be refused"
        );
        assert!(
            text(&out.stderr).contains("is not set"),
            "{}",
            text(&out.stderr)
        );
        let out = check_config(&["--config", &path], &env);
        assert_eq!(out.status.code(), Some(0), "{path}: {}", text(&out.stderr));
        assert!(
            text(&out.stdout).contains("auth required"),
            "{}",
            text(&out.stdout)
        );
        assert!(
            text(&out.stdout).contains(&format!("1 pools, {fleets} fleets")),
            "{path}: {}",
            text(&out.stdout)
        );
    }
}

/// Every metric family `/metrics` can export: a snapshot with a leader,
/// a worker, groups, demand and fleets.
fn exported_families() -> BTreeSet<String> {
    let mut core = Core::new();
    let pool = PoolName::new("p").unwrap();
    let config = PoolConfig {
        fleets: vec![FleetConfig {
            labels: Labels::new(),
            min: 0,
            max: 2,
            slots_per_worker: 1,
        }],
        ..PoolConfig::default()
    };
    core.handle(
        Millis(0),
        Event::PoolConfigured {
            pool: pool.clone(),
            config,
        },
    )
    .unwrap();
    core.handle(
        Millis(0),
        Event::CapacitySet {
            pool: pool.clone(),
            labels: Labels::new(),
            slots: 1,
        },
    )
    .unwrap();
    let mut snapshot = core.snapshot();
    snapshot.leader = Some(LeaderInfo {
        id: "s1".into(),
        epoch: 3,
    });
    snapshot.workers.push(WorkerInfo {
        id: "w1".into(),
        pool,
        labels: Labels::new(),
        slots: 1,
        busy: 0,
        last_seen: Millis(0),
        draining: false,
    });
    let health = Health {
        live: true,
        ready: true,
        detail: String::new(),
    };
    let mut pool = cronoq::metrics::PoolMetrics::new("p");
    pool.succeeded = 1;
    let counted = cronoq::metrics::MetricsSnapshot {
        pools: vec![pool],
        server: Some(cronoq::metrics::ServerMetrics::default()),
        schedules: None,
    };
    let text =
        cronoq::http::metrics_text(&snapshot, &health) + &cronoq::http::counters_text(&counted);
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| l.split(' ').next().unwrap().to_string())
        .collect()
}

/// The `cronoq_*` names in a PromQL expression.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while let Some(at) = expr[i..].find("cronoq_") {
        let start = i + at;
        let mut end = start;
        while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
            end += 1;
        }
        names.push(expr[start..end].to_string());
        i = end;
    }
    names
}

#[test]
fn the_dashboard_queries_only_exported_or_announced_metrics() {
    let text = std::fs::read_to_string(root().join("deploy/grafana/cronoq.json")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    let description = dashboard["description"].as_str().unwrap();
    let exported = exported_families();
    assert!(
        exported.contains("cronoq_autoscale_desired"),
        "{exported:?}"
    );
    let mut queried = BTreeSet::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            for name in metric_names(target["expr"].as_str().unwrap()) {
                // A histogram's series: NAME_bucket / _sum / _count.
                let family = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| name.strip_suffix(s))
                    .filter(|f| {
                        !exported.contains(&name)
                            && (exported.contains(*f) || description.contains(*f))
                    })
                    .map_or(name.clone(), str::to_string);
                if !exported.contains(&family) {
                    assert!(
                        description.contains(&family),
                        "panel {:?} queries {family}, which /metrics does not export and the description does not announce",
                        panel["title"]
                    );
                    assert!(
                        panel["description"]
                            .as_str()
                            .unwrap_or("")
                            .contains("Needs the task counters"),
                        "panel {:?} shows a pending metric without saying so",
                        panel["title"]
                    );
                }
                queried.insert(family);
            }
        }
    }
    // The panels cover the fleets, pools, groups and the leader.
    for family in [
        "cronoq_autoscale_desired",
        "cronoq_autoscale_waiting_without_fleet",
        "cronoq_pool_capacity",
        "cronoq_group_busy",
        "cronoq_leader_epoch",
        "cronoq_tasks_submitted_total",
        "cronoq_tasks_finished_total",
        "cronoq_attempts_retried_total",
        "cronoq_attempts_lost_total",
        "cronoq_tasks_dead_lettered_total",
        "cronoq_queue_wait_seconds",
        "cronoq_run_seconds",
    ] {
        assert!(queried.contains(family), "no panel shows {family}");
        assert!(exported.contains(family), "{family} is not exported");
    }
}

/// The `newTag` the kustomization's `images:` gives `name` (its
/// `- name: …` entries, each with a `newTag: "…"` line).
fn kustomize_tag(kustomization: &str, name: &str) -> Option<String> {
    let mut lines = kustomization
        .lines()
        .skip_while(|l| l.trim_end() != "images:")
        .map(str::trim);
    lines.find(|l| *l == format!("- name: {name}"))?;
    let line = lines
        .take_while(|l| !l.starts_with("- "))
        .find(|l| l.starts_with("newTag:"))?;
    Some(line["newTag:".len()..].trim().trim_matches('"').to_owned())
}

/// The images the repository builds are the ones the Kubernetes base
/// names, at the crate's version: `Containerfile` (labelled and documented
/// as `cronoq:<version>`) is `cronoq` in the base, the worker example
/// (`deploy/containers/worker.Containerfile`, built `FROM` that tag) is
/// `cronoq-worker`; both run the binary where the cronoq image puts it, as
/// the user the manifests run as. A version bump must move all of them.
#[test]
fn the_container_images_are_the_ones_the_kustomize_base_names() {
    let version = env!("CARGO_PKG_VERSION");
    let read = |path: &str| std::fs::read_to_string(root().join(path)).unwrap();
    let cronoq = read("Containerfile");
    let worker = read("deploy/containers/worker.Containerfile");
    let kustomization = read("deploy/kubernetes/base/kustomization.yaml");
    let production = read("docs/production.md");

    assert!(cronoq.contains("org.opencontainers.image.title=\"cronoq\""));
    assert!(
        cronoq.contains(&format!("org.opencontainers.image.version=\"{version}\"")),
        "Containerfile: the image's version label is not {version}"
    );
    for (file, text, tag) in [
        ("Containerfile", &cronoq, format!("cronoq:{version}")),
        (
            "worker.Containerfile",
            &worker,
            format!("cronoq-worker:{version}"),
        ),
        (
            "docs/production.md",
            &production,
            format!("cronoq:{version}"),
        ),
        (
            "docs/production.md",
            &production,
            format!("cronoq-worker:{version}"),
        ),
    ] {
        assert!(
            text.contains(&format!("-t {tag}")),
            "{file}: no build command tagging {tag}"
        );
    }
    assert!(
        worker.contains(&format!("ARG CRONOQ_IMAGE=cronoq:{version}")),
        "worker.Containerfile does not start from cronoq:{version}"
    );
    for name in ["cronoq", "cronoq-worker"] {
        assert_eq!(
            kustomize_tag(&kustomization, name).as_deref(),
            Some(version),
            "deploy/kubernetes/base/kustomization.yaml: the tag of {name}"
        );
    }
    assert!(read("deploy/kubernetes/base/server-deployment.yaml").contains("image: cronoq\n"));
    for manifest in ["worker-cpu.yaml", "worker-gpu-a100.yaml"] {
        let text = read(&format!("deploy/kubernetes/base/{manifest}"));
        assert!(text.contains("image: cronoq-worker\n"), "{manifest}");
        assert!(
            text.contains("args: [\"worker\""),
            "{manifest}: args for the cronoq entrypoint"
        );
    }

    // The manifests pass only arguments: the entrypoint is the binary.
    let binary = "/usr/local/bin/cronoq";
    assert!(cronoq.contains(&format!("COPY --from=build /out/cronoq {binary}\n")));
    assert!(worker.contains(&format!("COPY --from=cronoq {binary} {binary}\n")));
    for (file, text) in [
        ("Containerfile", &cronoq),
        ("worker.Containerfile", &worker),
    ] {
        assert!(
            text.contains(&format!("ENTRYPOINT [\"{binary}\"]\n")),
            "{file}: entrypoint"
        );
        let user = text.lines().rfind(|l| l.starts_with("USER "));
        assert_eq!(
            user,
            Some("USER 65532:65532"),
            "{file}: the user the manifests run as"
        );
    }
    for manifest in [
        "server-deployment.yaml",
        "worker-cpu.yaml",
        "worker-gpu-a100.yaml",
    ] {
        let text = read(&format!("deploy/kubernetes/base/{manifest}"));
        assert!(text.contains("runAsUser: 65532\n"), "{manifest}: runAsUser");
    }
}
