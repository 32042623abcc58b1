//! The snapshot: pools, groups, demand and the autoscaling signal, as plain
//! serializable data (the JSON of `GET /v1/snapshot`, SPEC §5).
//!
//! The core fills `pools`; a distributed shell adds `leader`, `workers` and
//! each group's worker count.

use serde::{Deserialize, Serialize};

use super::autoscale::{fleet_figures, AutoscaleAnswer, FleetAutoscale, ReqsetDemand};
use super::model::{Labels, Millis, PoolName};
use super::spec::WaitReason;
use super::Core;

/// The whole scheduler at one instant.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// The leader, in distributed mode.
    pub leader: Option<LeaderInfo>,
    /// Every pool, by name.
    pub pools: Vec<PoolSnapshot>,
    /// Remote workers, in distributed mode.
    pub workers: Vec<WorkerInfo>,
    /// Lists were cut to fit one message (or a pool's demand past
    /// [`MAX_DEMAND_ROWS`] label sets): the totals are whole, the lists not.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}

/// The most demand rows (required label sets) a pool lists, largest first.
pub const MAX_DEMAND_ROWS: usize = 256;

/// The most fairness keys, and the most concurrency keys, a pool lists
/// (SPEC §9), busiest (running + waiting) first; the rest are summed in one
/// more row named [`OTHER_KEYS`], so totals stay whole (and `/metrics`,
/// which exports these rows, stays bounded).
pub const MAX_KEY_ROWS: usize = 1_000;

/// The key of the row that sums the keys past [`MAX_KEY_ROWS`].
pub const OTHER_KEYS: &str = "_other";

impl Snapshot {
    /// Cuts lists until `size(self) <= max_bytes`: workers first, then each
    /// pool's demand, then its groups, then pools; sets `truncated`.
    /// Totals (capacity, busy, waiting) stay exact.
    ///
    /// ```
    /// use cronoq::core::*;
    /// let mut snap = Snapshot::default();
    /// for i in 0..100 {
    ///     snap.workers.push(WorkerInfo { id: format!("w{i}"), pool: PoolName::default(),
    ///         labels: Labels::new(), slots: 1, busy: 0, last_seen: Millis(0), draining: false });
    /// }
    /// snap.trim_to(500, |s| serde_json::to_vec(s).unwrap().len());
    /// assert!(snap.truncated && serde_json::to_vec(&snap).unwrap().len() <= 500);
    /// ```
    pub fn trim_to(&mut self, max_bytes: usize, size: impl Fn(&Snapshot) -> usize) {
        if size(self) <= max_bytes {
            return;
        }
        self.truncated = true;
        while !self.workers.is_empty() && size(self) > max_bytes {
            let keep = self.workers.len() / 2;
            self.workers.truncate(keep);
        }
        loop {
            if size(self) <= max_bytes {
                return;
            }
            let mut cut = false;
            for pool in &mut self.pools {
                if !pool.fairness_keys.is_empty() || !pool.concurrency_keys.is_empty() {
                    pool.fairness_keys.truncate(pool.fairness_keys.len() / 2);
                    pool.concurrency_keys
                        .truncate(pool.concurrency_keys.len() / 2);
                    cut = true;
                } else if !pool.demand.is_empty() {
                    pool.demand.truncate(pool.demand.len() / 2);
                    cut = true;
                } else if !pool.groups.is_empty() {
                    pool.groups.truncate(pool.groups.len() / 2);
                    cut = true;
                }
            }
            if !cut {
                break;
            }
        }
        while !self.pools.is_empty() && size(self) > max_bytes {
            let keep = self.pools.len() / 2;
            self.pools.truncate(keep);
        }
    }
}

/// Who leads, in distributed mode.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaderInfo {
    /// The leader's server id.
    pub id: String,
    /// Its leadership epoch.
    pub epoch: u64,
}

/// One remote worker.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerInfo {
    /// Worker id.
    pub id: String,
    /// Its pool.
    pub pool: PoolName,
    /// Its labels.
    pub labels: Labels,
    /// Its slots.
    pub slots: u32,
    /// Slots running attempts.
    pub busy: u32,
    /// Last heartbeat, ms since the Unix epoch.
    pub last_seen: Millis,
    /// It is draining: it takes no new leases and leaves once its running
    /// attempts end (`slots` is then 0).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub draining: bool,
}

/// One pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolSnapshot {
    /// Pool name.
    pub name: PoolName,
    /// Sum of its groups' capacity.
    pub capacity: u64,
    /// Slots running attempts.
    pub busy: u64,
    /// Tasks waiting for a slot (including fixed-start tasks past `start_at`).
    pub waiting: u64,
    /// Fixed-start tasks whose `start_at` is in the future.
    pub scheduled: u64,
    /// Slots held back for due reservations.
    pub reserved: u64,
    /// Tasks that finished after their deadline, since start.
    pub deadline_missed: u64,
    /// The autoscaling signal (SPEC §2 rule 10).
    pub autoscale: Autoscale,
    /// Waiting tasks per required label set.
    pub demand: Vec<Demand>,
    /// Groups with capacity or running attempts, least specialized first.
    pub groups: Vec<GroupSnapshot>,
    /// The declared fleets' autoscaling figures, in declaration order
    /// (counted from every waiting task, never from the capped `demand`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fleets: Vec<FleetAutoscale>,
    /// Waiting tasks and due reservations no declared fleet covers (0
    /// when the pool declares no fleet).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub waiting_without_fleet: u64,
    /// Its busiest fairness keys (SPEC §9), at most [`MAX_KEY_ROWS`],
    /// busiest first, then an [`OTHER_KEYS`] row summing the rest; none
    /// when no task names a key.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fairness_keys: Vec<FairnessKeySnapshot>,
    /// Its busiest concurrency keys, at most [`MAX_KEY_ROWS`], busiest
    /// first, then an [`OTHER_KEYS`] row summing the rest.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub concurrency_keys: Vec<ConcurrencyKeySnapshot>,
}

/// One fairness key of a pool (SPEC §9).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FairnessKeySnapshot {
    /// The key.
    pub key: String,
    /// Slots its running attempts hold.
    pub running: u64,
    /// Its tasks not running (waiting, in backoff or before a fixed start).
    pub waiting: u64,
    /// The weight `[[pools.fairness]]` gives it; absent: each task's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    /// Its share of the pool's busy slots, in thousandths.
    pub share_permille: u32,
    /// Its quotas: how many slots it holds of each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub quotas: Vec<QuotaSnapshot>,
}

/// One quota of a fairness key, and what the key holds of it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotaSnapshot {
    /// The labels a group carries for its slots to count (`{}`: all).
    pub labels: Labels,
    /// The most slots the key may hold in such groups.
    pub max_running: u32,
    /// Slots it holds there now.
    pub held: u32,
}

/// One concurrency key of a pool (SPEC §9).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConcurrencyKeySnapshot {
    /// The key.
    pub key: String,
    /// Its tasks running.
    pub running: u32,
    /// Its tasks waiting (for a slot, or for the limit).
    pub waiting: u64,
    /// The lowest limit among its tasks waiting for the limit (each task
    /// is held to its own); absent when none waits for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// `desired = clamp(busy + waiting + due reservations not yet started, min, max)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Autoscale {
    /// Slots the pool should have.
    pub desired: u64,
    /// Configured lower bound.
    pub min: u64,
    /// Configured upper bound.
    pub max: u64,
}

/// Waiting demand for one required label set.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Demand {
    /// The required labels (empty: any group).
    pub labels: Labels,
    /// Tasks waiting with exactly these requirements.
    pub waiting: u64,
    /// Why they wait (`no_group_matches`, `groups_full` or
    /// `held_for_reservation`), as `GET /v1/tasks/{id}` says of each.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<WaitReason>,
}

/// One label group of a pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupSnapshot {
    /// The group's exact label set.
    pub labels: Labels,
    /// Slots.
    pub capacity: u32,
    /// Slots running attempts.
    pub busy: u32,
    /// Remote workers in the group (0 in embedded mode).
    pub workers: u32,
}

impl Core {
    /// The pools, groups, demand and autoscaling signal now.
    pub fn snapshot(&self) -> Snapshot {
        let mut truncated = false;
        let mut pools: Vec<PoolSnapshot> = self
            .groups
            .live_pools()
            .map(|(p, pool)| {
                let mut groups: Vec<GroupSnapshot> = pool
                    .groups
                    .iter()
                    .map(|&g| &self.groups.groups[g as usize])
                    .filter(|g| g.capacity > 0 || g.busy > 0)
                    .map(|g| GroupSnapshot {
                        labels: g.labels.clone(),
                        capacity: g.capacity,
                        busy: g.busy,
                        workers: 0,
                    })
                    .collect();
                groups
                    .sort_by(|a, b| (a.labels.len(), &a.labels).cmp(&(b.labels.len(), &b.labels)));
                let mut demand: Vec<Demand> = pool
                    .reqsets
                    .iter()
                    .filter(|&&r| !self.groups.reqsets[r as usize].queue.is_empty())
                    .map(|&r| Demand {
                        labels: self.groups.reqsets[r as usize].labels.clone(),
                        waiting: self.groups.reqsets[r as usize].queue.len() as u64,
                        reason: Some(self.waiting_reason(r)),
                    })
                    .collect();
                let ready: Vec<_> = pool.ready_fixed.iter().collect();
                for &&(_, _, t) in &ready {
                    let reqset = self.tasks[t as usize].reqset;
                    let labels = &self.groups.reqsets[reqset as usize].labels;
                    match demand.iter_mut().find(|d| &d.labels == labels) {
                        Some(d) => d.waiting += 1,
                        None => demand.push(Demand {
                            labels: labels.clone(),
                            waiting: 1,
                            reason: Some(self.waiting_reason(reqset)),
                        }),
                    }
                }
                let figures = self.fleet_figures(pool, &demand);
                if demand.len() > MAX_DEMAND_ROWS {
                    demand.sort_by_key(|d| std::cmp::Reverse(d.waiting));
                    demand.truncate(MAX_DEMAND_ROWS);
                    truncated = true;
                }
                demand
                    .sort_by(|a, b| (a.labels.len(), &a.labels).cmp(&(b.labels.len(), &b.labels)));
                let (fairness_keys, concurrency_keys, cut) = self.key_rows(p, pool.busy);
                truncated |= cut;
                let reserved = pool.reservations.len() as u64;
                let not_ready = reserved - pool.ready_fixed.len() as u64;
                let (min, max) = (
                    u64::from(pool.config.autoscale_min),
                    u64::from(pool.config.autoscale_max),
                );
                PoolSnapshot {
                    name: pool.name.clone(),
                    capacity: pool.capacity,
                    busy: pool.busy,
                    waiting: pool.waiting,
                    scheduled: pool.scheduled,
                    reserved,
                    deadline_missed: pool.deadline_missed,
                    autoscale: Autoscale {
                        desired: (pool.busy + pool.waiting + not_ready).clamp(min, max),
                        min,
                        max,
                    },
                    demand,
                    groups,
                    fleets: figures.fleets,
                    waiting_without_fleet: figures.waiting_without_fleet,
                    fairness_keys,
                    concurrency_keys,
                }
            })
            .collect();
        pools.sort_by(|a, b| a.name.cmp(&b.name));
        Snapshot {
            leader: None,
            pools,
            workers: Vec::new(),
            truncated,
        }
    }
}

impl Core {
    /// The fairness and concurrency key rows of pool `p` (whose attempts
    /// hold `busy` slots), each list busiest first and cut to
    /// [`MAX_KEY_ROWS`]; and whether one was cut.
    fn key_rows(
        &self,
        p: u32,
        busy: u64,
    ) -> (Vec<FairnessKeySnapshot>, Vec<ConcurrencyKeySnapshot>, bool) {
        let mut fair: Vec<FairnessKeySnapshot> = self
            .keys
            .fair
            .iter()
            .filter(|k| !k.vacant && k.pool == p && !k.name.is_empty() && k.live + k.running > 0)
            .map(|k| FairnessKeySnapshot {
                key: k.name.to_string(),
                running: k.running,
                waiting: k.live.saturating_sub(k.running),
                weight: (k.weight > 0).then_some(k.weight),
                share_permille: (k.running * 1000).checked_div(busy).unwrap_or(0) as u32,
                quotas: k
                    .quotas
                    .iter()
                    .map(|q| QuotaSnapshot {
                        labels: q.labels.clone(),
                        max_running: q.max_running,
                        held: q.held,
                    })
                    .collect(),
            })
            .collect();
        let mut conc: Vec<ConcurrencyKeySnapshot> = self
            .keys
            .conc
            .iter()
            .filter(|k| !k.vacant && k.pool == p && k.live + u64::from(k.running) > 0)
            .map(|k| ConcurrencyKeySnapshot {
                key: k.name.to_string(),
                running: k.running,
                waiting: u64::from(k.queued) + k.parked_len() as u64,
                limit: k
                    .parked
                    .iter()
                    .find(|(_, set)| !set.is_empty())
                    .map(|(&l, _)| l),
            })
            .collect();
        let cut = fair.len() > MAX_KEY_ROWS || conc.len() > MAX_KEY_ROWS;
        fair.sort_by(|a, b| (b.running + b.waiting, &a.key).cmp(&(a.running + a.waiting, &b.key)));
        if fair.len() > MAX_KEY_ROWS {
            let rest = fair.split_off(MAX_KEY_ROWS);
            let (running, waiting) = rest
                .iter()
                .fold((0, 0), |(r, w), k| (r + k.running, w + k.waiting));
            fair.push(FairnessKeySnapshot {
                key: OTHER_KEYS.into(),
                running,
                waiting,
                weight: None,
                share_permille: (running * 1000).checked_div(busy).unwrap_or(0) as u32,
                quotas: Vec::new(),
            });
        }
        conc.sort_by(|a, b| {
            (u64::from(b.running) + b.waiting, &a.key)
                .cmp(&(u64::from(a.running) + a.waiting, &b.key))
        });
        if conc.len() > MAX_KEY_ROWS {
            let rest = conc.split_off(MAX_KEY_ROWS);
            conc.push(ConcurrencyKeySnapshot {
                key: OTHER_KEYS.into(),
                running: rest.iter().map(|k| k.running).sum(),
                waiting: rest.iter().map(|k| k.waiting).sum(),
                limit: None,
            });
        }
        (fair, conc, cut)
    }

    /// The fleets' figures of `pool` from `demand` (every reqset with
    /// waiting tasks, before the snapshot caps it) and the due
    /// reservations that have not reached `start_at`.
    fn fleet_figures(
        &self,
        pool: &super::groups::Pool,
        demand: &[Demand],
    ) -> super::autoscale::FleetFigures {
        let fleets = &pool.config.fleets;
        if fleets.is_empty() {
            return Default::default();
        }
        let mut rows: Vec<(&Labels, u64, u64)> =
            demand.iter().map(|d| (&d.labels, d.waiting, 0)).collect();
        let mut row_of: rustc_hash::FxHashMap<&Labels, usize> =
            rows.iter().enumerate().map(|(i, r)| (r.0, i)).collect();
        for entry @ &(_, _, t) in &pool.reservations {
            if pool.ready_fixed.contains(entry) {
                continue;
            }
            let labels = &self.groups.reqsets[self.tasks[t as usize].reqset as usize].labels;
            match row_of.get(labels) {
                Some(&i) => rows[i].2 += 1,
                None => {
                    row_of.insert(labels, rows.len());
                    rows.push((labels, 0, 1));
                }
            }
        }
        fleet_figures(
            fleets,
            rows.iter()
                .map(|(required, waiting, reserved)| ReqsetDemand {
                    required,
                    waiting: *waiting,
                    reserved: *reserved,
                }),
            |labels| match pool.group_by_labels.get(labels) {
                Some(&g) => {
                    let g = &self.groups.groups[g as usize];
                    (u64::from(g.capacity), u64::from(g.busy))
                }
                None => (0, 0),
            },
        )
    }
}

impl Snapshot {
    /// A readable table of pools and groups, as `cronoq snapshot` prints it.
    ///
    /// ```
    /// use cronoq::core::*;
    /// let mut core = Core::new();
    /// let pool = PoolName::new("p").unwrap();
    /// core.handle(Millis(0), Event::CapacitySet { pool, labels: Labels::from([("gpu", "a100")]), slots: 2 }).unwrap();
    /// assert!(core.snapshot().to_table().contains("gpu=a100"));
    /// ```
    pub fn to_table(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        if let Some(l) = &self.leader {
            let _ = writeln!(s, "leader {} (epoch {})", l.id, l.epoch);
        }
        if self.pools.is_empty() {
            s.push_str("no pools\n");
        }
        for p in &self.pools {
            let _ = writeln!(
                s,
                "pool {}  capacity {}  busy {}  waiting {}  scheduled {}  reserved {}  desired {} [{}..{}]",
                p.name,
                p.capacity,
                p.busy,
                p.waiting,
                p.scheduled,
                p.reserved,
                p.autoscale.desired,
                p.autoscale.min,
                if p.autoscale.max == u64::from(u32::MAX) {
                    "∞".to_string()
                } else {
                    p.autoscale.max.to_string()
                }
            );
            let width = p
                .groups
                .iter()
                .map(|g| label_text(&g.labels).len())
                .chain(p.demand.iter().map(|d| label_text(&d.labels).len()))
                .max()
                .unwrap_or(0)
                .max(12);
            let _ = writeln!(
                s,
                "  {:<width$}  {:>8}  {:>5}  {:>7}",
                "GROUP", "CAPACITY", "BUSY", "WORKERS"
            );
            for g in &p.groups {
                let _ = writeln!(
                    s,
                    "  {:<width$}  {:>8}  {:>5}  {:>7}",
                    label_text(&g.labels),
                    g.capacity,
                    g.busy,
                    g.workers
                );
            }
            if !p.demand.is_empty() {
                let _ = writeln!(s, "  {:<width$}  {:>8}", "WAITING FOR", "TASKS");
                for d in &p.demand {
                    let _ = writeln!(s, "  {:<width$}  {:>8}", label_text(&d.labels), d.waiting);
                }
            }
        }
        if !self.workers.is_empty() {
            let _ = writeln!(
                s,
                "{:<24}  {:<12}  {:<24}  {:>5}  {:>4}",
                "WORKER", "POOL", "LABELS", "SLOTS", "BUSY"
            );
            for w in &self.workers {
                let _ = writeln!(
                    s,
                    "{:<24}  {:<12}  {:<24}  {:>5}  {:>4}",
                    w.id,
                    w.pool,
                    label_text(&w.labels),
                    w.slots,
                    w.busy
                );
            }
        }
        s
    }
}

fn label_text(labels: &Labels) -> String {
    if labels.is_empty() {
        "(unlabeled)".to_string()
    } else {
        labels.to_string()
    }
}

/// The autoscaling answer for the fleet `labels` of `pool`, read from a
/// snapshot. Always an answer: a pool or label set the snapshot does not
/// know is idle (all zero), and an undeclared label set gets
/// `declared: false`, desired 0 and the busy/capacity of its group.
///
/// ```
/// use cronoq::core::*;
/// let mut core = Core::new();
/// let pool = PoolName::new("p").unwrap();
/// let gpu = Labels::from([("gpu", "a100")]);
/// let mut config = PoolConfig::default();
/// config.fleets = vec![FleetConfig { labels: gpu.clone(), min: 0, max: 8, slots_per_worker: 2 }];
/// core.handle(Millis(0), Event::PoolConfigured { pool: pool.clone(), config }).unwrap();
/// let idle = answer(&core.snapshot(), &pool, &gpu);
/// assert!(idle.declared && idle.desired == 0 && idle.max == 8);
/// let unknown = answer(&core.snapshot(), &pool, &Labels::from([("gpu", "h100")]));
/// assert!(!unknown.declared && unknown.desired == 0);
/// ```
pub fn answer(snapshot: &Snapshot, pool: &PoolName, labels: &Labels) -> AutoscaleAnswer {
    let mut answer = AutoscaleAnswer {
        pool: pool.clone(),
        labels: labels.clone(),
        declared: false,
        desired: 0,
        waiting: 0,
        reserved: 0,
        busy: 0,
        capacity: 0,
        min: 0,
        max: 0,
        slots_per_worker: 0,
    };
    let Some(p) = snapshot.pools.iter().find(|p| &p.name == pool) else {
        return answer;
    };
    if let Some(f) = p.fleets.iter().find(|f| &f.labels == labels) {
        answer.declared = true;
        answer.desired = f.desired;
        answer.waiting = f.waiting;
        answer.reserved = f.reserved;
        answer.busy = f.busy;
        answer.capacity = f.capacity;
        answer.min = f.min;
        answer.max = f.max;
        answer.slots_per_worker = f.slots_per_worker;
    } else if let Some(g) = p.groups.iter().find(|g| &g.labels == labels) {
        answer.busy = u64::from(g.busy);
        answer.capacity = u64::from(g.capacity);
    }
    answer
}
