//! The server's configuration (SPEC §7): a TOML file, then `CRONOQ_*` env
//! vars and flags over it (clap gives flag > env; [`ServerConfig::apply`]
//! puts both over the file).
//!
//! Unknown keys are refused, so a typo is an error rather than a silently
//! ignored setting. `[auth]` is kept here in the types of the auth layer
//! ([`crate::auth::AuthSection`]), which enforces it.

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

use crate::core::{
    Backoff, FairnessWeight, FleetConfig, Millis, OnMiss, PoolConfig, PoolName, Preemption,
    QuotaConfig, Rejection,
};

/// `[auth]` and its credentials belong to [`crate::auth`], which reads them.
pub use crate::auth::{AuthSection, InlineSecret, NkeySection, TokenSection};

fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(d)?;
    crate::wire::parse_duration(&text).map_err(serde::de::Error::custom)
}

fn opt_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    duration(d).map(Some)
}

/// The whole file.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// `[server]`.
    #[serde(default)]
    pub server: ServerSection,
    /// `[[pools]]`.
    #[serde(default)]
    pub pools: Vec<PoolSection>,
    /// `[auth]`.
    #[serde(default)]
    pub auth: AuthSection,
    /// `[telemetry]`: OpenTelemetry export (off unless an endpoint is set
    /// here or in `OTEL_EXPORTER_OTLP_ENDPOINT`; the `OTEL_*` env wins).
    #[serde(default)]
    pub telemetry: crate::telemetry::TelemetryConfig,
}

/// `[server]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSection {
    /// NATS URL.
    #[serde(default = "default_nats")]
    pub nats_url: String,
    /// HTTP listen address.
    #[serde(default = "default_http")]
    pub http_addr: String,
    /// Subject prefix.
    #[serde(default = "default_prefix")]
    pub subject_prefix: String,
    /// A worker silent this long is removed; its attempts are lost.
    #[serde(default = "default_worker_timeout", deserialize_with = "duration")]
    pub worker_timeout: Duration,
    /// A lease not renewed this long is lost.
    #[serde(default = "default_lease_ttl", deserialize_with = "duration")]
    pub lease_ttl: Duration,
    /// Largest accepted payload in bytes.
    #[serde(default = "default_max_payload")]
    pub max_payload_bytes: usize,
    /// How long finished tasks' results are kept (JetStream KV max age).
    /// The bucket is the journal too: the leader writes an unfinished
    /// task's record again every third of this, so that it never expires.
    #[serde(default = "default_results_ttl", deserialize_with = "duration")]
    pub results_ttl: Duration,
    /// This server's id (default: host name and process id).
    #[serde(default)]
    pub id: Option<String>,
    /// Accept workers and submissions for pools no `[[pools]]` declares
    /// (created on first use, forgotten once idle). True by default, as
    /// `cronoq dev` needs; production should list its pools and set false.
    #[serde(default = "default_true")]
    pub allow_undeclared_pools: bool,
    /// Pools held at once, declared ones included (`RESOURCE_EXHAUSTED`).
    #[serde(default = "default_max_pools")]
    pub max_pools: usize,
    /// Workers registered at once (`RESOURCE_EXHAUSTED`).
    #[serde(default = "default_max_workers")]
    pub max_workers: usize,
    /// Schedules held at once (`RESOURCE_EXHAUSTED`).
    #[serde(default = "default_max_schedules")]
    pub max_schedules: usize,
    /// Unfinished tasks per pool (`RESOURCE_EXHAUSTED`).
    #[serde(default = "default_max_tasks_per_pool")]
    pub max_tasks_per_pool: u64,
    /// Replicas of cronoq's streams and buckets (1, or 3 on a 3-node
    /// JetStream cluster; see `deploy/nats/`). Applies when they are
    /// created.
    #[serde(default = "default_replicas")]
    pub replicas: usize,
    /// A follower takes over when the leader has not renewed its record
    /// for this long; a leader that could not renew for this long stops
    /// acting. Failover after a crash takes about this long.
    #[serde(default = "default_election_timeout", deserialize_with = "duration")]
    pub election_timeout: Duration,
    /// Write the journal in atomic batches, one fence check per group
    /// commit (nats-server ≥ 2.12; the results stream gets `allow_atomic`),
    /// instead of one fenced write per record. Default: on when
    /// `replicas > 1`, off on a single replica
    /// ([`ServerSection::journal_in_batches`]). On a replicated stream
    /// nats-server admits one write checking a given subject at a time
    /// (10164), and every journal write checks the leader subject: record
    /// by record, the journal goes one replication round trip at a time
    /// (measured on 3 nodes: 240 tasks/s against 660–810 in batches). On a
    /// single node (file storage) nats-server stages every batch in a file
    /// store of its own, which costs more than the checks it saves (3–5×
    /// slower in `cargo bench --bench distributed`).
    #[serde(default)]
    pub journal_batches: Option<bool>,
    /// Stand by warm: follow the journal (the results bucket) while not
    /// leading, so a takeover reads the records of unfinished tasks from
    /// memory (default). `false`: a takeover reads each one from the
    /// stream's leader, which is slower with many unfinished tasks but
    /// keeps no copy of the journal in a standby's memory (about a record
    /// per unfinished task and a mark per finished one still stored).
    #[serde(default = "default_true")]
    pub warm_standby: bool,
    /// The log instance this server's leadership writes (its streams are
    /// `<P>_LOG_<LOG>` and `<P>_SNAP_<LOG>`; one per set of pools, later).
    #[serde(default = "default_log")]
    pub log: String,
    /// A snapshot of the log state is stored after this many entries…
    #[serde(default = "default_snapshot_entries")]
    pub snapshot_entries: u64,
    /// …or this long after the last one, whichever comes first.
    #[serde(default = "default_snapshot_interval", deserialize_with = "duration")]
    pub snapshot_interval: Duration,
    /// The environment variable holding the servers' storage key (at
    /// least 32 characters, the same on every server): the leader seals
    /// what it stores with it and every server refuses stored values not
    /// sealed with it ([`super::seal`]). Unset: nothing is sealed (a
    /// warning at start when `[auth] required = true`).
    #[serde(default)]
    pub storage_key_env: Option<String>,
    /// Which task events the leader publishes on `P.events.<task_id>`:
    /// `"finished"` (default: the terminal event that waiting clients
    /// listen for), `"all"` (also `queued`, `scheduled` and `running`:
    /// two more NATS messages per task for whoever watches them) or
    /// `"none"` (waiting clients then find a result by looking it up
    /// every couple of seconds).
    #[serde(default)]
    pub events: Events,
    /// HTTP: the longest wait for a request head (also closes a keep-alive
    /// connection idle this long); see [`crate::http::HttpLimits`].
    #[serde(default = "default_http_header_timeout", deserialize_with = "duration")]
    pub http_header_timeout: Duration,
    /// HTTP: a connection with no byte moving this long is closed.
    #[serde(default = "default_http_idle_timeout", deserialize_with = "duration")]
    pub http_idle_timeout: Duration,
    /// HTTP: connections open at once; one more displaces the connection
    /// idle longest (or one whose request body is still arriving), or is
    /// answered 503 and closed when all are in a request.
    #[serde(default = "default_http_max_connections")]
    pub http_max_connections: usize,
    /// HTTP: the `Host` names the API answers besides IP addresses and
    /// `localhost` (DNS rebinding; `"name"` or `"name:port"`, `"*"` for
    /// any); see [`crate::http::origin`]. Empty (the default) with
    /// `[auth] required = true`: any `Host`.
    #[serde(default)]
    pub http_allowed_hosts: Vec<String>,
    /// NATS credentials: a `.creds` file (user JWT and seed) or a file
    /// holding an nkey user seed (`SU…`); none: no credentials.
    #[serde(default)]
    pub nats_creds: Option<std::path::PathBuf>,
    /// The inbox prefix of this server's NATS connections (replaces
    /// `_INBOX`; `deploy/nats/auth.conf` gives the server `_INBOX.server`).
    #[serde(default)]
    pub nats_inbox_prefix: Option<String>,
}

fn default_replicas() -> usize {
    1
}
fn default_election_timeout() -> Duration {
    Duration::from_millis(750)
}
fn default_true() -> bool {
    true
}
fn default_max_pools() -> usize {
    1_000
}
fn default_max_workers() -> usize {
    10_000
}
fn default_max_schedules() -> usize {
    crate::schedule::DEFAULT_MAX_SCHEDULES
}
fn default_max_tasks_per_pool() -> u64 {
    1_000_000
}
fn default_http_header_timeout() -> Duration {
    crate::http::HttpLimits::default().header_timeout
}
fn default_http_idle_timeout() -> Duration {
    crate::http::HttpLimits::default().idle_timeout
}
fn default_http_max_connections() -> usize {
    crate::http::HttpLimits::default().max_connections
}

fn default_nats() -> String {
    "nats://127.0.0.1:4222".into()
}
fn default_http() -> String {
    "127.0.0.1:7070".into()
}
fn default_prefix() -> String {
    "cronoq".into()
}
fn default_worker_timeout() -> Duration {
    Duration::from_secs(5)
}
fn default_lease_ttl() -> Duration {
    Duration::from_secs(10)
}
fn default_max_payload() -> usize {
    1 << 20
}
fn default_log() -> String {
    "main".into()
}

fn default_snapshot_entries() -> u64 {
    10_000
}

fn default_snapshot_interval() -> Duration {
    Duration::from_secs(60)
}

fn default_results_ttl() -> Duration {
    Duration::from_secs(24 * 3600)
}

/// `[server] events`: which task events are published.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Events {
    /// Every state change.
    All,
    /// Only the terminal one (succeeded, failed, cancelled, missed).
    #[default]
    Finished,
    /// None.
    None,
}

impl Events {
    /// Whether an event announcing `state` goes out.
    pub fn announces(self, state: crate::core::TaskState) -> bool {
        match self {
            Events::All => true,
            Events::Finished => state.is_terminal(),
            Events::None => false,
        }
    }
}

impl ServerSection {
    /// Whether the journal goes in atomic batches: `journal_batches` if
    /// set, else when the streams are replicated.
    pub fn journal_in_batches(&self) -> bool {
        self.journal_batches.unwrap_or(self.replicas > 1)
    }
}

impl Default for ServerSection {
    fn default() -> Self {
        ServerSection {
            nats_url: default_nats(),
            http_addr: default_http(),
            subject_prefix: default_prefix(),
            worker_timeout: default_worker_timeout(),
            lease_ttl: default_lease_ttl(),
            max_payload_bytes: default_max_payload(),
            results_ttl: default_results_ttl(),
            id: None,
            replicas: default_replicas(),
            journal_batches: None,
            warm_standby: true,
            log: default_log(),
            snapshot_entries: default_snapshot_entries(),
            snapshot_interval: default_snapshot_interval(),
            storage_key_env: None,
            events: Events::default(),
            election_timeout: default_election_timeout(),
            allow_undeclared_pools: default_true(),
            max_pools: default_max_pools(),
            max_workers: default_max_workers(),
            max_schedules: default_max_schedules(),
            max_tasks_per_pool: default_max_tasks_per_pool(),
            http_header_timeout: default_http_header_timeout(),
            http_idle_timeout: default_http_idle_timeout(),
            http_max_connections: default_http_max_connections(),
            http_allowed_hosts: Vec::new(),
            nats_creds: None,
            nats_inbox_prefix: None,
        }
    }
}

/// `autoscale = { min, max }`.
#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AutoscaleSection {
    /// Lower bound.
    #[serde(default)]
    pub min: u32,
    /// Upper bound.
    #[serde(default = "max_u32")]
    pub max: u32,
}

fn max_u32() -> u32 {
    u32::MAX
}

/// `[[pools]]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolSection {
    /// Pool name.
    pub name: String,
    /// Default attempts per task.
    pub max_attempts: Option<u32>,
    /// Urgency window before deadlines.
    #[serde(default, deserialize_with = "opt_duration")]
    pub urgency_window: Option<Duration>,
    /// Passes over an unlabeled waiter before it goes first.
    pub max_bypass: Option<u32>,
    /// How long before a fixed start its slot is held.
    #[serde(default, deserialize_with = "opt_duration")]
    pub reservation_lead: Option<Duration>,
    /// `skip` or `run`.
    pub on_miss: Option<OnMiss>,
    /// Autoscaling bounds.
    pub autoscale: Option<AutoscaleSection>,
    /// First retry delay.
    #[serde(default, deserialize_with = "opt_duration")]
    pub backoff_initial: Option<Duration>,
    /// Longest retry delay.
    #[serde(default, deserialize_with = "opt_duration")]
    pub backoff_max: Option<Duration>,
    /// Fleets autoscaled separately, one per label set:
    /// `fleets = [{ labels = { gpu = "a100" }, min = 0, max = 8, slots_per_worker = 2 }]`
    /// (or `[[pools.fleets]]` tables). See `GET /v1/autoscale`.
    #[serde(default)]
    pub fleets: Vec<FleetConfig>,
    /// Weights of fairness keys (SPEC §9): `[[pools.fairness]]` tables of
    /// `key` and `weight` (1 to 1,000). With auth on, the only weights.
    #[serde(default)]
    pub fairness: Vec<FairnessWeight>,
    /// Quotas of fairness keys: `[[pools.quotas]]` tables of `key`,
    /// `labels` (`{}`: the whole pool) and `max_running`.
    #[serde(default)]
    pub quotas: Vec<QuotaConfig>,
    /// `off` (default) or `priority`: an eligible waiter with no free slot
    /// revokes a running attempt of a preemptible, lower-priority task.
    pub preemption: Option<Preemption>,
    /// How long a preempted remote attempt's command has between SIGTERM
    /// and SIGKILL (default 30 s).
    #[serde(default, deserialize_with = "opt_duration")]
    pub preemption_grace: Option<Duration>,
}

impl PoolSection {
    /// The pool name and its core settings.
    pub fn to_core(&self) -> Result<(PoolName, PoolConfig), Rejection> {
        let name = PoolName::new(&self.name)?;
        let d = PoolConfig::default();
        let ms = |o: Option<Duration>, dflt: Millis| o.map(Millis::from_duration).unwrap_or(dflt);
        let config = PoolConfig {
            max_attempts: self.max_attempts.unwrap_or(d.max_attempts),
            urgency_window: ms(self.urgency_window, d.urgency_window),
            max_bypass: self.max_bypass.unwrap_or(d.max_bypass),
            reservation_lead: ms(self.reservation_lead, d.reservation_lead),
            on_miss: self.on_miss.unwrap_or(d.on_miss),
            autoscale_min: self.autoscale.map_or(d.autoscale_min, |a| a.min),
            autoscale_max: self.autoscale.map_or(d.autoscale_max, |a| a.max),
            backoff: Backoff {
                initial: ms(self.backoff_initial, d.backoff.initial),
                max: ms(self.backoff_max, d.backoff.max),
            },
            fleets: self.fleets.clone(),
            fairness: self.fairness.clone(),
            quotas: self.quotas.clone(),
            preemption: self.preemption.unwrap_or(d.preemption),
            preemption_grace: ms(self.preemption_grace, d.preemption_grace),
        };
        config.validate().map_err(|e| match e {
            Rejection::InvalidArgument(m) => {
                Rejection::InvalidArgument(format!("config: pool {name}: {m}"))
            }
            other => other,
        })?;
        Ok((name, config))
    }
}

impl ServerSection {
    /// How this server logs in to NATS (`nats_creds`, `nats_inbox_prefix`).
    pub fn nats_login(&self) -> crate::wire::NatsLogin {
        let mut login = crate::wire::NatsLogin::new();
        if let Some(path) = &self.nats_creds {
            login = login.creds(path);
        }
        if let Some(prefix) = &self.nats_inbox_prefix {
            login = login.inbox_prefix(prefix);
        }
        login
    }

    /// The core's limits from these settings.
    pub fn limits(&self) -> crate::core::Limits {
        crate::core::Limits {
            max_pools: self.max_pools,
            max_tasks_per_pool: self.max_tasks_per_pool,
            allow_undeclared_pools: self.allow_undeclared_pools,
        }
    }
}

impl ServerConfig {
    /// Parses TOML text and checks every pool.
    pub fn parse(text: &str) -> Result<ServerConfig, Rejection> {
        let config: ServerConfig =
            toml::from_str(text).map_err(|e| Rejection::InvalidArgument(format!("config: {e}")))?;
        config.check()?;
        Ok(config)
    }

    /// Reads and parses a file.
    pub fn load(path: &Path) -> Result<ServerConfig, Rejection> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            Rejection::InvalidArgument(format!("reading config {}: {e}", path.display()))
        })?;
        ServerConfig::parse(&text)
    }

    /// Flags and env vars (already merged by clap) over the file.
    pub fn apply(
        &mut self,
        nats: Option<String>,
        http: Option<String>,
        id: Option<String>,
        prefix: Option<String>,
    ) {
        if let Some(n) = nats {
            self.server.nats_url = n;
        }
        if let Some(h) = http {
            self.server.http_addr = h;
        }
        if let Some(i) = id {
            self.server.id = Some(i);
        }
        if let Some(p) = prefix {
            self.server.subject_prefix = p;
        }
    }

    /// The credentials `[auth]` allows, tokens read from the environment
    /// (refuses an unusable `[auth]`; see [`crate::auth::Authenticator::from_config`]).
    pub fn authenticator(&self) -> Result<crate::auth::Authenticator, crate::wire::WireError> {
        crate::auth::Authenticator::from_config(&self.auth, &|var| std::env::var(var).ok())
    }

    /// The servers' storage key (`[server] storage_key_env`, read from
    /// the environment); none when unset.
    pub fn seal(&self) -> Result<super::seal::Seal, crate::wire::WireError> {
        super::seal::Seal::from_env(self.server.storage_key_env.as_deref(), &|var| {
            std::env::var(var).ok()
        })
    }

    /// The `Host` names the HTTP API answers ([`crate::http::AllowedHosts`]):
    /// `http_allowed_hosts`; when it is empty and `[auth] required`, any
    /// (every `/v1` call then needs a Bearer token a rebound page lacks).
    pub fn allowed_hosts(&self) -> Result<crate::http::AllowedHosts, Rejection> {
        if self.server.http_allowed_hosts.is_empty() && self.auth.required {
            return Ok(crate::http::AllowedHosts::any());
        }
        crate::http::AllowedHosts::new(&self.server.http_allowed_hosts)
            .map_err(|e| Rejection::InvalidArgument(format!("config: {e}")))
    }

    /// Checks what serde cannot.
    pub fn check(&self) -> Result<(), Rejection> {
        self.allowed_hosts()?;
        crate::wire::Subjects::new(&self.server.subject_prefix)?;
        if let Some(prefix) = &self.server.nats_inbox_prefix {
            crate::wire::check_inbox_prefix(prefix).map_err(|e| {
                Rejection::InvalidArgument(format!("config: nats_inbox_prefix: {e}"))
            })?;
        }
        let mut seen = std::collections::BTreeSet::new();
        for pool in &self.pools {
            let (name, _) = pool.to_core()?;
            if !seen.insert(name.clone()) {
                return Err(Rejection::InvalidArgument(format!(
                    "config: pool {name} is listed twice"
                )));
            }
        }
        if self.pools.len() > self.server.max_pools {
            return Err(Rejection::InvalidArgument(format!(
                "config: {} pools are declared but max_pools is {}",
                self.pools.len(),
                self.server.max_pools
            )));
        }
        if self.server.max_payload_bytes == 0 {
            return Err(Rejection::InvalidArgument(
                "config: max_payload_bytes must be positive".into(),
            ));
        }
        if !(1..=5).contains(&self.server.replicas) {
            return Err(Rejection::InvalidArgument(
                "config: replicas must be between 1 and 5".into(),
            ));
        }
        let log = &self.server.log;
        if log.is_empty()
            || log.len() > 32
            || !log
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        {
            return Err(Rejection::InvalidArgument(format!(
                "config: log {log:?} must be 1-32 characters of a-z, 0-9 and _"
            )));
        }
        if self.server.snapshot_entries == 0 || self.server.snapshot_interval.is_zero() {
            return Err(Rejection::InvalidArgument(
                "config: snapshot_entries and snapshot_interval must be positive".into(),
            ));
        }
        if self.server.election_timeout < Duration::from_millis(100) {
            return Err(Rejection::InvalidArgument(
                "config: election_timeout must be at least 100ms".into(),
            ));
        }
        // The journal and the leader record live in the results bucket:
        // its records are written again every third of this (a sane rate
        // needs ≥ 1 s), and the leader record every quarter of
        // election_timeout — well within, or it would expire between
        // renewals and leaders would change for nothing.
        let ttl = self.server.results_ttl;
        let floor = Duration::from_secs(1).max(self.server.election_timeout * 2);
        if !ttl.is_zero() && ttl < floor {
            return Err(Rejection::InvalidArgument(format!(
                "config: results_ttl must be at least 1s and twice election_timeout ({}), or 0s \
                 to keep results for good",
                humantime::format_duration(floor)
            )));
        }
        if self.server.worker_timeout.is_zero() || self.server.lease_ttl.is_zero() {
            return Err(Rejection::InvalidArgument(
                "config: worker_timeout and lease_ttl must be positive".into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_example_parses() {
        let text = r#"
[server]
nats_url = "nats://127.0.0.1:4222"
http_addr = "127.0.0.1:7070"
subject_prefix = "cronoq"
worker_timeout = "5s"

[[pools]]
name = "inference"
max_attempts = 3
urgency_window = "60s"
max_bypass = 32
reservation_lead = "30s"
on_miss = "skip"
autoscale = { min = 0, max = 50 }

[auth]
required = true

[[auth.tokens]]
token_env = "CRONOQ_GPU_WORKER_TOKEN"
role = "worker"
pools = ["inference"]
labels = ["gpu=a100", "zone=eu"]

[[auth.nkeys]]
public_key = "UABC"
role = "worker"
pools = ["inference"]
labels = ["gpu=h100"]
"#;
        let c = ServerConfig::parse(text).unwrap();
        assert_eq!(c.server.worker_timeout, Duration::from_secs(5));
        let (name, pool) = c.pools[0].to_core().unwrap();
        assert_eq!(name.as_str(), "inference");
        assert_eq!(pool.autoscale_max, 50);
        assert_eq!(pool.urgency_window, Millis(60_000));
        assert!(c.auth.required);
    }

    /// Atomic batches by default exactly where they pay: replicated streams.
    #[test]
    fn the_journal_goes_in_batches_by_default_only_when_replicated() {
        let parse = |text: &str| ServerConfig::parse(text).unwrap().server;
        assert!(!parse("").journal_in_batches());
        assert!(parse("[server]\nreplicas = 3\n").journal_in_batches());
        assert!(!parse("[server]\nreplicas = 3\njournal_batches = false\n").journal_in_batches());
        assert!(parse("[server]\njournal_batches = true\n").journal_in_batches());
    }

    #[test]
    fn only_terminal_events_go_out_unless_asked() {
        let parse = |text: &str| ServerConfig::parse(text).unwrap().server.events;
        assert_eq!(parse(""), Events::Finished);
        assert_eq!(parse("[server]\nevents = \"all\""), Events::All);
        assert_eq!(parse("[server]\nevents = \"none\""), Events::None);
    }

    #[test]
    fn fleets_parse_inline_or_as_tables() {
        let inline = r#"
[[pools]]
name = "inference"
fleets = [{ labels = {}, max = 4 }, { labels = { gpu = "a100" }, min = 1, max = 8, slots_per_worker = 2 }]
"#;
        let tables = r#"
[[pools]]
name = "inference"
[[pools.fleets]]
max = 4
[[pools.fleets]]
labels = { gpu = "a100" }
min = 1
max = 8
slots_per_worker = 2
"#;
        for text in [inline, tables] {
            let (_, pool) = ServerConfig::parse(text).unwrap().pools[0]
                .to_core()
                .unwrap();
            assert_eq!(
                pool.fleets,
                [
                    FleetConfig {
                        labels: crate::core::Labels::new(),
                        min: 0,
                        max: 4,
                        slots_per_worker: 1
                    },
                    FleetConfig {
                        labels: crate::core::Labels::from([("gpu", "a100")]),
                        min: 1,
                        max: 8,
                        slots_per_worker: 2
                    },
                ]
            );
        }
    }

    #[test]
    fn bad_fleets_are_refused_with_the_pool_and_fleet_named() {
        for (fleets, why) in [
            (
                "{ labels = { gpu = \"a100\" }, min = 9, max = 8 }",
                "fleet gpu=a100: min 9 is above max 8",
            ),
            (
                "{ labels = { gpu = \"a100\" }, max = 8, slots_per_worker = 0 }",
                "fleet gpu=a100: slots_per_worker must be at least 1",
            ),
            (
                "{ labels = { \"gpu!\" = \"a100\" }, max = 8 }",
                "labels: label name",
            ),
            (
                "{ labels = { gpu = \"a 100\" }, max = 8 }",
                "labels: label value",
            ),
            (
                "{ max = 1 }, { labels = {}, max = 2 }",
                "fleet (unlabeled) is declared twice",
            ),
            ("{ labels = { gpu = 1 }, max = 8 }", "invalid type"),
            ("{ labels = { gpu = \"a100\" } }", "missing field `max`"),
            ("{ max = 8, slots = 2 }", "unknown field `slots`"),
        ] {
            let text = format!("[[pools]]\nname = \"inference\"\nfleets = [{fleets}]\n");
            let e = ServerConfig::parse(&text).unwrap_err();
            assert_eq!(e.code(), crate::core::ErrorCode::INVALID_ARGUMENT, "{text}");
            let message = e.to_string();
            assert!(message.starts_with("config: "), "{message}");
            assert!(message.contains(why), "{text}: {message}");
        }
        let many: Vec<String> = (0..=crate::core::MAX_FLEETS)
            .map(|i| format!("{{ labels = {{ n = \"{i}\" }}, max = 1 }}"))
            .collect();
        let text = format!("[[pools]]\nname = \"p\"\nfleets = [{}]\n", many.join(", "));
        let e = ServerConfig::parse(&text).unwrap_err();
        assert!(e.to_string().contains("at most 64 per pool"), "{e}");
    }

    #[test]
    fn bad_configs_are_refused() {
        for text in [
            "[server]\nworker_timout = \"5s\"",
            "[server]\nworker_timeout = \"soon\"",
            "[[pools]]\nname = \"a.b\"",
            "[[pools]]\nname = \"a\"\nmax_attempts = 0",
            "[[pools]]\nname = \"a\"\n[[pools]]\nname = \"a\"",
            "[[pools]]\nname = \"a\"\non_miss = \"later\"",
            "[server]\nsubject_prefix = \"a.b\"",
            "[server]\nevents = \"some\"",
            "[server]\nresults_ttl = \"500ms\"",
            "[server]\nresults_ttl = \"5s\"\nelection_timeout = \"3s\"",
        ] {
            let e = ServerConfig::parse(text).unwrap_err();
            assert_eq!(e.code(), crate::core::ErrorCode::INVALID_ARGUMENT, "{text}");
        }
    }
}
