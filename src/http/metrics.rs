//! `GET /metrics`: the Prometheus text of a snapshot's gauges
//! ([`metrics_text`]) and of the counters and histograms
//! ([`counters_text`]).

use std::fmt::Write as _;

use super::openapi::{text_answer, Routes};
use super::{ApiState, HttpError};
use crate::api::Health;
use crate::core::{ErrorCode, Snapshot};
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};

/// The `/metrics` route, merged into [`super::router`].
pub(super) fn routes() -> Routes {
    Routes::new().get("/metrics", metrics, |op| {
        text_answer(
            op.summary("Prometheus metrics: the snapshot's gauges, then counters and histograms"),
            200,
            "text/plain; version=0.0.4",
            "the Prometheus text format",
        )
    })
}

async fn metrics(State(api): ApiState) -> Result<Response, HttpError> {
    // A follower asks the leader for the snapshot; with `[auth] required`
    // it has no credential of its own to ask with, and exports its health
    // alone (the leader exports the pools). Unready with no leader to ask:
    // its health alone too, so `cronoq_unready` says why.
    let snapshot = match api.snapshot().await {
        Ok(snapshot) => snapshot,
        Err(e)
            if e.code == ErrorCode::UNAUTHENTICATED
                || e.code == ErrorCode::PERMISSION_DENIED
                || (e.code == ErrorCode::UNAVAILABLE && !api.health().ready) =>
        {
            Snapshot::default()
        }
        Err(e) => return Err(e.into()),
    };
    let mut text = metrics_text(&snapshot, &api.health());
    // A remote client's Api has no counters: the gauges alone then.
    if let Ok(counted) = api.metrics().await {
        text.push_str(&counters_text(&counted));
    }
    // This process's own: the spans it exported or dropped (a leader's
    // are the task spans; all zero with telemetry off).
    text.push_str(&telemetry_text(&crate::telemetry::counters()));
    Ok((
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response())
}

/// Escapes a Prometheus label value: `\`, `"` and newlines.
///
/// ```
/// assert_eq!(cronoq::http::escape_label_value("a\"b\\c\nd"), r#"a\"b\\c\nd"#);
/// ```
pub fn escape_label_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// The span counters of this process's OpenTelemetry export
/// (docs/telemetry.md): exported, dropped because the bounded queue was
/// full (exporting never makes scheduling wait), and failed (the
/// collector refused or did not answer).
///
/// ```
/// let c = cronoq::telemetry::Counters { exported: 7, dropped: 2, failed: 0 };
/// let text = cronoq::http::telemetry_text(&c);
/// assert!(text.contains("cronoq_trace_spans_dropped_total 2\n"));
/// assert!(text.contains("# TYPE cronoq_trace_spans_exported_total counter"));
/// ```
pub fn telemetry_text(c: &crate::telemetry::Counters) -> String {
    let mut out = String::new();
    for (name, help, value) in [
        (
            "cronoq_trace_spans_exported_total",
            "Spans this process exported over OTLP.",
            c.exported,
        ),
        (
            "cronoq_trace_spans_dropped_total",
            "Spans this process dropped because its export queue was full.",
            c.dropped,
        ),
        (
            "cronoq_trace_spans_failed_total",
            "Spans in export requests the collector refused or did not answer.",
            c.failed,
        ),
    ] {
        Family::start(&mut out, name, "counter", help).sample(name, &[], value);
    }
    out
}

/// One metric family: `# HELP`, `# TYPE`, then its samples.
struct Family<'a> {
    out: &'a mut String,
}

impl Family<'_> {
    fn start<'a>(out: &'a mut String, name: &str, kind: &str, help: &str) -> Family<'a> {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        Family { out }
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: u64) {
        self.sample_text(name, labels, &value.to_string());
    }

    /// A histogram's `_bucket`, `_sum` and `_count` samples.
    fn histogram(
        &mut self,
        (bucket, sum, count): (&str, &str, &str),
        les: &[String],
        labels: &[(&str, &str)],
        h: &crate::metrics::Histogram,
    ) {
        for (le, n) in les.iter().zip(h.cumulative()) {
            let mut with_le = labels.to_vec();
            with_le.push(("le", le));
            self.sample(bucket, &with_le, n);
        }
        self.sample_text(sum, labels, &format!("{}", h.sum_ms as f64 / 1000.0));
        self.sample(count, labels, h.count);
    }

    fn sample_text(&mut self, name: &str, labels: &[(&str, &str)], value: &str) {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape_label_value(v));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
    }
}

/// The Prometheus text exposition of a snapshot: per-pool gauges (label
/// `pool`), per-group and per-demand gauges (labels `pool` and `labels`,
/// the label set as `k=v,k=v`, empty for the unlabeled group), readiness
/// and the leader's epoch.
///
/// ```
/// use cronoq::core::*;
/// let mut core = Core::new();
/// let pool = PoolName::new("p").unwrap();
/// core.handle(Millis(0), Event::CapacitySet { pool, labels: Labels::from([("gpu", "a100")]), slots: 2 }).unwrap();
/// let health = cronoq::api::Health { live: true, ready: true, detail: String::new() };
/// let text = cronoq::http::metrics_text(&core.snapshot(), &health);
/// assert!(text.contains(r#"cronoq_group_capacity{pool="p",labels="gpu=a100"} 2"#));
/// ```
pub fn metrics_text(snapshot: &Snapshot, health: &Health) -> String {
    let mut out = String::new();
    Family::start(
        &mut out,
        "cronoq_ready",
        "gauge",
        "1 when the server is ready (connected, and leading or following a known leader).",
    )
    .sample("cronoq_ready", &[], u64::from(health.ready));
    if !health.ready {
        Family::start(
            &mut out,
            "cronoq_unready",
            "gauge",
            "1 while the server is not ready, with the reason /readyz gives.",
        )
        .sample("cronoq_unready", &[("reason", &health.detail)], 1);
    }
    if let Some(leader) = &snapshot.leader {
        Family::start(
            &mut out,
            "cronoq_leader_epoch",
            "gauge",
            "The current leadership epoch.",
        )
        .sample(
            "cronoq_leader_epoch",
            &[("leader", &leader.id)],
            leader.epoch,
        );
    }

    type PoolValue = fn(&crate::core::PoolSnapshot) -> u64;
    let pool_gauges: [(&str, &str, &str, PoolValue); 9] = [
        ("cronoq_pool_capacity", "gauge", "Slots in the pool.", |p| {
            p.capacity
        }),
        (
            "cronoq_pool_busy",
            "gauge",
            "Slots running attempts.",
            |p| p.busy,
        ),
        (
            "cronoq_pool_waiting",
            "gauge",
            "Tasks waiting for a slot.",
            |p| p.waiting,
        ),
        (
            "cronoq_pool_scheduled",
            "gauge",
            "Fixed-start tasks whose start is in the future.",
            |p| p.scheduled,
        ),
        (
            "cronoq_pool_reserved",
            "gauge",
            "Slots held back for due reservations.",
            |p| p.reserved,
        ),
        (
            "cronoq_pool_desired",
            "gauge",
            "Slots the pool should have (the autoscaling signal).",
            |p| p.autoscale.desired,
        ),
        (
            "cronoq_pool_autoscale_min",
            "gauge",
            "Configured lower bound of the autoscaling signal.",
            |p| p.autoscale.min,
        ),
        (
            "cronoq_pool_autoscale_max",
            "gauge",
            "Configured upper bound of the autoscaling signal.",
            |p| p.autoscale.max,
        ),
        (
            "cronoq_pool_deadline_missed_total",
            "counter",
            "Tasks that finished after their deadline, since the scheduler started.",
            |p| p.deadline_missed,
        ),
    ];
    for (name, kind, help, value) in pool_gauges {
        let mut family = Family::start(&mut out, name, kind, help);
        for p in &snapshot.pools {
            family.sample(name, &[("pool", p.name.as_str())], value(p));
        }
    }

    let mut family = Family::start(
        &mut out,
        "cronoq_pool_workers",
        "gauge",
        "Remote workers registered in the pool.",
    );
    let mut per_pool: std::collections::HashMap<&str, u64> = std::collections::HashMap::new();
    for w in &snapshot.workers {
        *per_pool.entry(w.pool.as_str()).or_default() += 1;
    }
    for p in &snapshot.pools {
        let n = per_pool.get(p.name.as_str()).copied().unwrap_or(0);
        family.sample("cronoq_pool_workers", &[("pool", p.name.as_str())], n);
    }
    // Series per label set are bounded (the first MAX_LABEL_SET_SERIES of
    // each family, pools by name), so a flood of label sets cannot make a
    // scrape huge; what was left out is counted.
    let mut dropped = 0u64;

    let mut family = Family::start(
        &mut out,
        "cronoq_demand_waiting",
        "gauge",
        "Tasks waiting with exactly these required labels.",
    );
    let demand = snapshot
        .pools
        .iter()
        .flat_map(|p| p.demand.iter().map(move |d| (p, d)));
    for (n, (p, d)) in demand.enumerate() {
        if n >= MAX_LABEL_SET_SERIES {
            dropped += 1;
            continue;
        }
        {
            let labels = d.labels.to_string();
            family.sample(
                "cronoq_demand_waiting",
                &[("pool", p.name.as_str()), ("labels", &labels)],
                d.waiting,
            );
        }
    }

    type GroupValue = fn(&crate::core::GroupSnapshot) -> u32;
    let group_gauges: [(&str, &str, GroupValue); 3] = [
        ("cronoq_group_capacity", "Slots in the group.", |g| {
            g.capacity
        }),
        (
            "cronoq_group_busy",
            "Slots of the group running attempts.",
            |g| g.busy,
        ),
        (
            "cronoq_group_workers",
            "Remote workers in the group.",
            |g| g.workers,
        ),
    ];
    for (i, (name, help, value)) in group_gauges.into_iter().enumerate() {
        let mut family = Family::start(&mut out, name, "gauge", help);
        let groups = snapshot
            .pools
            .iter()
            .flat_map(|p| p.groups.iter().map(move |g| (p, g)));
        for (n, (p, g)) in groups.enumerate() {
            if n >= MAX_LABEL_SET_SERIES {
                dropped += u64::from(i == 0);
                continue;
            }
            let labels = g.labels.to_string();
            family.sample(
                name,
                &[("pool", p.name.as_str()), ("labels", &labels)],
                u64::from(value(g)),
            );
        }
    }
    // Fleets are declared in the configuration, so their series are
    // bounded by it (at most MAX_FLEETS per pool).
    type FleetValue = fn(&crate::core::FleetAutoscale) -> u64;
    let fleet_gauges: [(&str, &str, FleetValue); 3] = [
        (
            "cronoq_autoscale_desired",
            "Workers a declared fleet should have: ceil((busy + waiting + reserved) / slots_per_worker) within its min and max.",
            |f| f.desired,
        ),
        (
            "cronoq_autoscale_waiting",
            "Waiting tasks that count toward a declared fleet (each task toward one fleet).",
            |f| f.waiting,
        ),
        (
            "cronoq_autoscale_reserved",
            "Due fixed-start reservations that count toward a declared fleet.",
            |f| f.reserved,
        ),
    ];
    for (name, help, value) in fleet_gauges {
        let mut family = Family::start(&mut out, name, "gauge", help);
        for p in &snapshot.pools {
            for f in &p.fleets {
                let labels = f.labels.to_string();
                family.sample(
                    name,
                    &[("pool", p.name.as_str()), ("labels", &labels)],
                    value(f),
                );
            }
        }
    }
    let mut family = Family::start(
        &mut out,
        "cronoq_autoscale_waiting_without_fleet",
        "gauge",
        "Waiting tasks and due reservations of a pool that declares fleets but whose labels no fleet covers.",
    );
    for p in snapshot.pools.iter().filter(|p| !p.fleets.is_empty()) {
        family.sample(
            "cronoq_autoscale_waiting_without_fleet",
            &[("pool", p.name.as_str())],
            p.waiting_without_fleet,
        );
    }

    // SPEC §9: per fairness and concurrency key, as the snapshot lists
    // them (the busiest 1,000 of each pool, then `_other` for the rest).
    key_gauges::<crate::core::FairnessKeySnapshot>(
        &mut out,
        &snapshot.pools,
        |p| &p.fairness_keys,
        |k| &k.key,
        &[
            (
                "cronoq_fairness_key_running",
                "Slots a fairness key's running attempts hold (the busiest 1,000 keys of a pool, then key=\"_other\").",
                |k| k.running,
            ),
            (
                "cronoq_fairness_key_waiting",
                "A fairness key's tasks not running.",
                |k| k.waiting,
            ),
        ],
    );
    let mut family = Family::start(
        &mut out,
        "cronoq_fairness_key_share",
        "gauge",
        "A fairness key's share of its pool's busy slots (0 to 1).",
    );
    for p in &snapshot.pools {
        for k in &p.fairness_keys {
            let share = format!("{}", f64::from(k.share_permille) / 1000.0);
            family.sample_text(
                "cronoq_fairness_key_share",
                &[("pool", p.name.as_str()), ("key", &k.key)],
                &share,
            );
        }
    }
    key_gauges::<crate::core::ConcurrencyKeySnapshot>(
        &mut out,
        &snapshot.pools,
        |p| &p.concurrency_keys,
        |k| &k.key,
        &[
            (
                "cronoq_concurrency_key_running",
                "A concurrency key's running tasks (the busiest 1,000 keys of a pool, then key=\"_other\").",
                |k| u64::from(k.running),
            ),
            (
                "cronoq_concurrency_key_waiting",
                "A concurrency key's waiting tasks.",
                |k| k.waiting,
            ),
        ],
    );

    let mut family = Family::start(
        &mut out,
        "cronoq_metrics_label_sets_dropped",
        "gauge",
        "Label sets (demand rows and groups) left out of this scrape to bound its size.",
    );
    family.sample("cronoq_metrics_label_sets_dropped", &[], dropped);
    out
}

/// A gauge family per `(name, help, value)`, sampled for every key a
/// pool lists (`keys`: its fairness or its concurrency keys), labelled
/// with the pool and the key.
type KeyGauge<'a, K> = (&'a str, &'a str, fn(&K) -> u64);

fn key_gauges<K>(
    out: &mut String,
    pools: &[crate::core::PoolSnapshot],
    keys: impl Fn(&crate::core::PoolSnapshot) -> &Vec<K>,
    key: impl Fn(&K) -> &String,
    gauges: &[KeyGauge<'_, K>],
) {
    for (name, help, value) in gauges {
        let mut family = Family::start(out, name, "gauge", help);
        for p in pools {
            for k in keys(p) {
                family.sample(
                    name,
                    &[("pool", p.name.as_str()), ("key", key(k))],
                    value(k),
                );
            }
        }
    }
}

/// The bucket bounds as `le` labels: seconds, shortest form.
fn le_labels() -> Vec<String> {
    crate::metrics::BUCKETS_MS
        .iter()
        .map(|ms| format!("{}", *ms as f64 / 1000.0))
        .chain(std::iter::once("+Inf".to_string()))
        .collect()
}

/// The Prometheus text of the ledger's counters and histograms (label
/// `pool`, and `outcome` for finished tasks) and a server's election and
/// journal figures. Pools are bounded by [`crate::metrics::MAX_METRIC_POOLS`]
/// (the rest under `pool="_other"`).
///
/// ```
/// let mut p = cronoq::metrics::PoolMetrics::new("p");
/// p.succeeded = 3;
/// p.run.observe(cronoq::core::Millis(50));
/// let m = cronoq::metrics::MetricsSnapshot { pools: vec![p], server: None, schedules: None };
/// let text = cronoq::http::counters_text(&m);
/// assert!(text.contains(r#"cronoq_tasks_finished_total{pool="p",outcome="succeeded"} 3"#));
/// assert!(text.contains(r#"cronoq_run_seconds_bucket{pool="p",le="0.05"} 1"#));
/// assert!(text.contains(r#"cronoq_run_seconds_sum{pool="p"} 0.05"#));
/// ```
pub fn counters_text(m: &crate::metrics::MetricsSnapshot) -> String {
    use crate::metrics::{Histogram, PoolMetrics};
    let mut out = String::new();
    type Count = fn(&PoolMetrics) -> u64;
    let counters: [(&str, &str, Count); 5] = [
        (
            "cronoq_tasks_submitted_total",
            "Tasks submitted (accepted, or refused and dead-lettered).",
            |p| p.submitted,
        ),
        (
            "cronoq_attempts_started_total",
            "Attempts started, first attempts and retries.",
            |p| p.started,
        ),
        (
            "cronoq_attempts_retried_total",
            "Attempts started after an earlier attempt of the same task.",
            |p| p.retried,
        ),
        (
            "cronoq_attempts_lost_total",
            "Attempts lost: worker gone, lease expired, or stopped for the attempt timeout.",
            |p| p.lost,
        ),
        (
            "cronoq_tasks_dead_lettered_total",
            "Submissions refused (malformed, over a limit) and copied to the dead-letter stream.",
            |p| p.dead_lettered,
        ),
    ];
    for (name, help, value) in counters {
        let mut family = Family::start(&mut out, name, "counter", help);
        for p in &m.pools {
            family.sample(name, &[("pool", &p.pool)], value(p));
        }
    }
    let name = "cronoq_tasks_finished_total";
    let mut family = Family::start(
        &mut out,
        name,
        "counter",
        "Tasks finished, by outcome (succeeded, failed, cancelled, missed).",
    );
    for p in &m.pools {
        for (outcome, n) in [
            ("succeeded", p.succeeded),
            ("failed", p.failed),
            ("cancelled", p.cancelled),
            ("missed", p.missed),
        ] {
            family.sample(name, &[("pool", &p.pool), ("outcome", outcome)], n);
        }
    }
    let les = le_labels();
    type Hist = fn(&PoolMetrics) -> &Histogram;
    let histograms: [(&str, &str, Hist); 2] = [
        (
            "cronoq_queue_wait_seconds",
            "Time from submit to the first attempt's start.",
            |p| &p.queue_wait,
        ),
        (
            "cronoq_run_seconds",
            "Time from an attempt's start to its end.",
            |p| &p.run,
        ),
    ];
    for (name, help, hist) in histograms {
        let mut family = Family::start(&mut out, name, "histogram", help);
        let (bucket, sum, count) = (
            format!("{name}_bucket"),
            format!("{name}_sum"),
            format!("{name}_count"),
        );
        for p in &m.pools {
            family.histogram((&bucket, &sum, &count), &les, &[("pool", &p.pool)], hist(p));
        }
    }
    if let Some(sched) = &m.schedules {
        schedules_text(&mut out, sched, &les);
    }
    if let Some(s) = &m.server {
        Family::start(
            &mut out,
            "cronoq_leader_takeovers_total",
            "counter",
            "Times this server process took the lead.",
        )
        .sample("cronoq_leader_takeovers_total", &[], s.takeovers);
        Family::start(
            &mut out,
            "cronoq_journal_pending_records",
            "gauge",
            "Journal records (task results) being written and not yet acknowledged by JetStream.",
        )
        .sample("cronoq_journal_pending_records", &[], s.journal_pending);
        Family::start(
            &mut out,
            "cronoq_storage_refused_total",
            "counter",
            "Stored values refused as not sealed with the servers' storage key (forged, or another deployment's).",
        )
        .sample("cronoq_storage_refused_total", &[], s.storage_refused);
        let name = "cronoq_submissions_refused_unattributed_total";
        let mut family = Family::start(
            &mut out,
            name,
            "counter",
            "Submissions dropped unrecorded because no credential's proof verifies on them, by code.",
        );
        for (code, count) in &s.refused_unattributed {
            family.sample(name, &[("code", code)], *count);
        }
    }
    out
}

/// The most schedules named in one scrape (by name); the others are
/// summed under `schedule="_other"`.
pub const MAX_METRIC_SCHEDULES: usize = 1_000;

/// Per-schedule counters (label `schedule`) and the fire lag histogram.
fn schedules_text(out: &mut String, m: &crate::metrics::ScheduleMetrics, les: &[String]) {
    use crate::metrics::ScheduleFigures;
    let mut named: Vec<&ScheduleFigures> = m.schedules.iter().collect();
    named.sort_by(|a, b| a.schedule.cmp(&b.schedule));
    let rest = named.split_off(named.len().min(MAX_METRIC_SCHEDULES));
    let other = (!rest.is_empty()).then(|| {
        rest.iter().fold(
            ScheduleFigures {
                schedule: "_other".into(),
                ..ScheduleFigures::default()
            },
            |mut sum, f| {
                sum.fires += f.fires;
                sum.skipped += f.skipped;
                sum.missed += f.missed;
                sum
            },
        )
    });
    type Count = fn(&ScheduleFigures) -> u64;
    let counters: [(&str, &str, Count); 3] = [
        (
            "cronoq_schedule_fires_total",
            "Runs a schedule started (ticks, triggers, backfills).",
            |f| f.fires,
        ),
        (
            "cronoq_schedule_ticks_skipped_total",
            "Ticks a schedule's overlap policy skipped.",
            |f| f.skipped,
        ),
        (
            "cronoq_schedule_ticks_missed_total",
            "Ticks a schedule missed (older than its catch-up window, or paused).",
            |f| f.missed,
        ),
    ];
    for (name, help, value) in counters {
        let mut family = Family::start(out, name, "counter", help);
        for f in named.iter().copied().chain(other.as_ref()) {
            family.sample(name, &[("schedule", &f.schedule)], value(f));
        }
    }
    let name = "cronoq_schedule_fire_lag_seconds";
    Family::start(
        out,
        name,
        "histogram",
        "Time from a schedule's tick to its task accepted.",
    )
    .histogram(
        (
            "cronoq_schedule_fire_lag_seconds_bucket",
            "cronoq_schedule_fire_lag_seconds_sum",
            "cronoq_schedule_fire_lag_seconds_count",
        ),
        les,
        &[],
        &m.fire_lag,
    );
}

/// The most series per label set (per family) one scrape carries.
pub const MAX_LABEL_SET_SERIES: usize = 1_000;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{MetricsSnapshot, ScheduleFigures, ScheduleMetrics};

    #[test]
    fn schedules_are_counted_by_name_up_to_a_bound_and_their_fire_lag_is_a_histogram() {
        let mut m = ScheduleMetrics::default();
        for i in 0..MAX_METRIC_SCHEDULES + 2 {
            m.schedules.push(ScheduleFigures {
                schedule: format!("s{i:05}"),
                fires: 2,
                skipped: 1,
                missed: 0,
            });
        }
        m.fire_lag.observe(crate::core::Millis(40));
        let text = counters_text(&MetricsSnapshot {
            pools: Vec::new(),
            server: None,
            schedules: Some(m),
        });
        assert!(text.contains(r#"cronoq_schedule_fires_total{schedule="s00000"} 2"#));
        assert!(text.contains(r#"cronoq_schedule_ticks_skipped_total{schedule="s00999"} 1"#));
        assert!(!text.contains(r#"schedule="s01000""#), "past the bound");
        assert!(text.contains(r#"cronoq_schedule_fires_total{schedule="_other"} 4"#));
        assert!(text.contains(r#"cronoq_schedule_fire_lag_seconds_bucket{le="0.05"} 1"#));
        assert!(text.contains("cronoq_schedule_fire_lag_seconds_count 1"));
    }
}
