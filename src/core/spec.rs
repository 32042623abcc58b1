//! What a task and a pool are asked to be, and what becomes of them: pool
//! settings (backoff, misses), fleets, task specs with their fixed starts,
//! and the states of tasks and attempts.
//!
//! Plain data plus validation, like [`super::model`], whose names, labels,
//! time and errors it uses.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::model::{Labels, Millis, PoolName, Rejection, TaskId, MAX_HORIZON};

/// Exponential backoff between attempts: `initial * 2^(n-1)`, capped at `max`.
/// No jitter: the core takes no randomness it was not given.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Backoff {
    /// Delay before the second attempt.
    pub initial: Millis,
    /// The longest delay.
    pub max: Millis,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Millis(1_000),
            max: Millis(60_000),
        }
    }
}

impl Backoff {
    /// The delay after attempt `attempt` (1-based) failed.
    ///
    /// ```
    /// use cronoq::core::{Backoff, Millis};
    /// let b = Backoff { initial: Millis(100), max: Millis(1_000) };
    /// assert_eq!(b.delay_after(1), Millis(100));
    /// assert_eq!(b.delay_after(3), Millis(400));
    /// assert_eq!(b.delay_after(30), Millis(1_000));
    /// ```
    pub fn delay_after(&self, attempt: u32) -> Millis {
        let shift = attempt.saturating_sub(1).min(40);
        Millis(self.initial.0.saturating_mul(1u64 << shift).min(self.max.0))
    }
}

/// What to do with a fixed-start task that could not start by
/// `start_at + tolerance`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnMiss {
    /// End the task as `missed`.
    #[default]
    Skip,
    /// Give up the reservation and let the task wait as an ordinary task.
    Run,
}

/// Pool-wide settings (SPEC §7 `[[pools]]`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolConfig {
    /// Attempts a task gets when it names no `max_attempts`.
    pub max_attempts: u32,
    /// A task with a deadline becomes urgent this long before it.
    pub urgency_window: Millis,
    /// How often an unlabeled waiter may be passed over by a labeled one
    /// before it takes the next slot it matches.
    pub max_bypass: u32,
    /// How long before `start_at` a fixed-start task holds back a slot.
    pub reservation_lead: Millis,
    /// What a missed fixed start does.
    pub on_miss: OnMiss,
    /// Lower bound of the autoscaling signal.
    pub autoscale_min: u32,
    /// Upper bound of the autoscaling signal.
    pub autoscale_max: u32,
    /// Backoff when a task names none.
    pub backoff: Backoff,
    /// Fleets to autoscale separately, one per label set
    /// ([`super::autoscale`]); none by default.
    #[serde(default)]
    pub fleets: Vec<FleetConfig>,
    /// Weights of fairness keys (`[[pools.fairness]]`, SPEC §9): a listed
    /// key's weight is this one, whatever its tasks carry.
    #[serde(default)]
    pub fairness: Vec<FairnessWeight>,
    /// Quotas of fairness keys (`[[pools.quotas]]`, SPEC §9).
    #[serde(default)]
    pub quotas: Vec<QuotaConfig>,
    /// Whether an eligible waiter may preempt lower-priority work.
    #[serde(default)]
    pub preemption: Preemption,
    /// How long a preempted remote attempt has between SIGTERM and SIGKILL
    /// (the shells' business; the core only carries it).
    #[serde(default = "default_preemption_grace")]
    pub preemption_grace: Millis,
}

fn default_preemption_grace() -> Millis {
    Millis(30_000)
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            max_attempts: 3,
            urgency_window: Millis(60_000),
            max_bypass: 32,
            reservation_lead: Millis(30_000),
            on_miss: OnMiss::Skip,
            autoscale_min: 0,
            autoscale_max: u32::MAX,
            backoff: Backoff::default(),
            fleets: Vec::new(),
            fairness: Vec::new(),
            quotas: Vec::new(),
            preemption: Preemption::Off,
            preemption_grace: default_preemption_grace(),
        }
    }
}

impl PoolConfig {
    /// Refuses settings that cannot work.
    pub fn validate(&self) -> Result<(), Rejection> {
        if self.max_attempts == 0 {
            return Err(Rejection::InvalidArgument(
                "max_attempts must be at least 1".into(),
            ));
        }
        if self.autoscale_min > self.autoscale_max {
            return Err(Rejection::InvalidArgument(format!(
                "autoscale min {} is above max {}",
                self.autoscale_min, self.autoscale_max
            )));
        }
        // The same rule as a task's own backoff (TaskSpec::validate).
        if self.backoff.initial > self.backoff.max {
            return Err(Rejection::InvalidArgument(
                "backoff initial delay is above its max".into(),
            ));
        }
        validate_fleets(&self.fleets)?;
        self.validate_sharing()
    }

    /// The SPEC §9 settings: weights and quotas of valid keys, each key
    /// weighted once, bounded lists, a grace within the horizon.
    fn validate_sharing(&self) -> Result<(), Rejection> {
        if self.fairness.len() > MAX_FAIRNESS_ENTRIES {
            return Err(Rejection::InvalidArgument(format!(
                "{} fairness weights are declared; at most {MAX_FAIRNESS_ENTRIES} per pool",
                self.fairness.len()
            )));
        }
        let mut seen = std::collections::HashSet::new();
        for entry in &self.fairness {
            check_fairness_key(&entry.key)?;
            check_fairness_weight(entry.weight)?;
            if !seen.insert(entry.key.as_str()) {
                return Err(Rejection::InvalidArgument(format!(
                    "fairness key {:?} is weighted twice",
                    entry.key
                )));
            }
        }
        if self.quotas.len() > MAX_QUOTAS {
            return Err(Rejection::InvalidArgument(format!(
                "{} quotas are declared; at most {MAX_QUOTAS} per pool",
                self.quotas.len()
            )));
        }
        for quota in &self.quotas {
            check_fairness_key(&quota.key)?;
            quota.labels.validate().map_err(|e| {
                Rejection::InvalidArgument(format!("quota of {:?}: labels: {e}", quota.key))
            })?;
        }
        if self.preemption_grace > MAX_HORIZON {
            return Err(Rejection::InvalidArgument(
                "preemption_grace is longer than the limit of 10 years".into(),
            ));
        }
        Ok(())
    }
}

/// The most `[[pools.fairness]]` entries of one pool.
pub const MAX_FAIRNESS_ENTRIES: usize = 10_000;
/// The most `[[pools.quotas]]` entries of one pool.
pub const MAX_QUOTAS: usize = 1_000;
/// The longest fairness key, in bytes.
pub const MAX_FAIRNESS_KEY_LEN: usize = 64;
/// The longest concurrency key, in bytes.
pub const MAX_CONCURRENCY_KEY_LEN: usize = 128;
/// The largest fairness weight.
pub const MAX_FAIRNESS_WEIGHT: u32 = 1_000;

/// One `[[pools.fairness]]` entry: the weight of a fairness key.
///
/// ```
/// use cronoq::core::{FairnessWeight, PoolConfig};
/// let config = PoolConfig { fairness: vec![FairnessWeight { key: "team-a".into(), weight: 3 }], ..PoolConfig::default() };
/// assert!(config.validate().is_ok());
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FairnessWeight {
    /// The fairness key.
    pub key: String,
    /// Its weight: its share of contended slots is proportional to it.
    pub weight: u32,
}

/// One `[[pools.quotas]]` entry: the key's tasks hold at most
/// `max_running` slots of the groups that carry `labels` (`{}`: any group).
///
/// ```
/// use cronoq::core::{Labels, PoolConfig, QuotaConfig};
/// let quota = QuotaConfig { key: "team-b".into(), labels: Labels::from([("gpu", "a100")]), max_running: 8 };
/// assert!(PoolConfig { quotas: vec![quota], ..PoolConfig::default() }.validate().is_ok());
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuotaConfig {
    /// The fairness key it bounds.
    pub key: String,
    /// The labels a group must carry for its slots to count.
    #[serde(default)]
    pub labels: Labels,
    /// The most slots the key's tasks hold in such groups at once (0: none).
    pub max_running: u32,
}

/// Whether a pool preempts (SPEC §9).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Preemption {
    /// Never.
    #[default]
    Off,
    /// An eligible waiter with no free matching slot revokes a running
    /// attempt of a preemptible task of strictly lower priority.
    Priority,
}

/// What a task with a concurrency key does when it is admitted (SPEC §9).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConcurrencyPolicy {
    /// Wait until fewer than its limit of the key's tasks run.
    #[default]
    Queue,
    /// Cancel the key's older tasks still waiting (reason `replaced`).
    ReplaceWaiting,
    /// Cancel the key's running tasks beyond `limit - 1`, oldest first.
    CancelRunning,
    /// End the new task `cancelled` if the limit is full.
    Skip,
}

impl ConcurrencyPolicy {
    /// The lowercase name used in config, over HTTP and in the CLI.
    pub fn as_str(self) -> &'static str {
        match self {
            ConcurrencyPolicy::Queue => "queue",
            ConcurrencyPolicy::ReplaceWaiting => "replace_waiting",
            ConcurrencyPolicy::CancelRunning => "cancel_running",
            ConcurrencyPolicy::Skip => "skip",
        }
    }

    /// The policy named `text` (`queue`, `replace_waiting`,
    /// `cancel_running`, `skip`); anything else is `INVALID_ARGUMENT`.
    ///
    /// ```
    /// use cronoq::core::ConcurrencyPolicy;
    /// assert_eq!(ConcurrencyPolicy::parse("cancel_running").unwrap(), ConcurrencyPolicy::CancelRunning);
    /// assert!(ConcurrencyPolicy::parse("cancel-running").is_err());
    /// ```
    pub fn parse(text: &str) -> Result<ConcurrencyPolicy, Rejection> {
        let all = [
            ConcurrencyPolicy::Queue,
            ConcurrencyPolicy::ReplaceWaiting,
            ConcurrencyPolicy::CancelRunning,
            ConcurrencyPolicy::Skip,
        ];
        all.into_iter()
            .find(|p| p.as_str() == text.trim())
            .ok_or_else(|| {
                Rejection::InvalidArgument(format!(
                    "concurrency_policy {} is not one of queue, replace_waiting, cancel_running, skip",
                    super::model::excerpt(text)
                ))
            })
    }
}

impl std::str::FromStr for ConcurrencyPolicy {
    type Err = Rejection;
    fn from_str(text: &str) -> Result<ConcurrencyPolicy, Rejection> {
        ConcurrencyPolicy::parse(text)
    }
}

/// A fairness key: 1 to 64 bytes, no control character.
///
/// ```
/// use cronoq::core::check_fairness_key;
/// assert!(check_fairness_key("team-a").is_ok());
/// assert!(check_fairness_key("").is_err());
/// assert!(check_fairness_key(&"k".repeat(65)).is_err());
/// assert!(check_fairness_key("a\nb").is_err());
/// ```
pub fn check_fairness_key(key: &str) -> Result<(), Rejection> {
    check_key_text("fairness_key", key, MAX_FAIRNESS_KEY_LEN)
}

/// A concurrency key: 1 to 128 bytes, no control character.
pub fn check_concurrency_key(key: &str) -> Result<(), Rejection> {
    check_key_text("concurrency_key", key, MAX_CONCURRENCY_KEY_LEN)
}

fn check_key_text(what: &str, key: &str, max: usize) -> Result<(), Rejection> {
    if key.is_empty() {
        return Err(Rejection::InvalidArgument(format!("{what} is empty")));
    }
    if key.len() > max {
        return Err(Rejection::InvalidArgument(format!(
            "{what} of {} bytes is above the limit of {max} bytes",
            key.len()
        )));
    }
    if key.chars().any(char::is_control) {
        return Err(Rejection::InvalidArgument(format!(
            "{what} {key:?} holds a control character"
        )));
    }
    Ok(())
}

/// A fairness weight: 1 to 1,000.
pub fn check_fairness_weight(weight: u32) -> Result<(), Rejection> {
    if weight == 0 || weight > MAX_FAIRNESS_WEIGHT {
        return Err(Rejection::InvalidArgument(format!(
            "fairness_weight {weight} is outside 1..={MAX_FAIRNESS_WEIGHT}"
        )));
    }
    Ok(())
}

/// A fixed start: run at `start_at`, at the latest by `start_at + tolerance`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FixedStart {
    /// When the task should start.
    pub start_at: Millis,
    /// How late it may still start.
    pub tolerance: Millis,
}

/// Everything the core needs to know about a task. The payload stays with
/// the shell: the core never sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskSpec {
    /// Unique id, assigned by the shell.
    pub id: TaskId,
    /// The pool the task runs in.
    pub pool: PoolName,
    /// Labels a group must carry for the task to run there.
    pub required: Labels,
    /// Higher runs first.
    pub priority: i32,
    /// The task becomes urgent `urgency_window` before this; never cancels.
    pub deadline: Option<Millis>,
    /// A fixed start with tolerance.
    pub fixed_start: Option<FixedStart>,
    /// A declared run time; lets the task backfill slots held for a
    /// reservation that starts after it would end.
    pub est_runtime: Option<Millis>,
    /// Attempts in all, or the pool's default.
    pub max_attempts: Option<u32>,
    /// Backoff between attempts, or the pool's default.
    pub backoff: Option<Backoff>,
    /// An attempt running longer than this is revoked and counts as lost.
    pub attempt_timeout: Option<Millis>,
    /// Its fairness key (SPEC §9); none: the pool's unnamed key, which
    /// every task without one shares (so the order is rule 5's alone).
    #[serde(default)]
    pub fairness_key: Option<String>,
    /// Its weight, 1 to 1,000, unless `[[pools.fairness]]` weights the key.
    #[serde(default = "one")]
    pub fairness_weight: u32,
    /// Tasks of a pool with the same concurrency key share a limit.
    #[serde(default)]
    pub concurrency_key: Option<String>,
    /// At most this many of the key's tasks run while this one starts.
    #[serde(default = "one")]
    pub concurrency_limit: u32,
    /// What admission does when the key's limit is full.
    #[serde(default)]
    pub concurrency_policy: ConcurrencyPolicy,
    /// Whether a higher-priority waiter may preempt its attempt.
    #[serde(default = "yes")]
    pub preemptible: bool,
}

fn yes() -> bool {
    true
}

impl TaskSpec {
    /// A spec with every option at its default.
    pub fn new(id: TaskId, pool: PoolName) -> TaskSpec {
        TaskSpec {
            id,
            pool,
            required: Labels::new(),
            priority: 0,
            deadline: None,
            fixed_start: None,
            est_runtime: None,
            max_attempts: None,
            backoff: None,
            attempt_timeout: None,
            fairness_key: None,
            fairness_weight: 1,
            concurrency_key: None,
            concurrency_limit: 1,
            concurrency_policy: ConcurrencyPolicy::Queue,
            preemptible: true,
        }
    }

    /// Refuses malformed specs.
    pub fn validate(&self) -> Result<(), Rejection> {
        self.required.validate()?;
        if self.max_attempts == Some(0) {
            return Err(Rejection::InvalidArgument(
                "max_attempts must be at least 1".into(),
            ));
        }
        if self.attempt_timeout == Some(Millis::ZERO) {
            return Err(Rejection::InvalidArgument(
                "attempt_timeout must be positive".into(),
            ));
        }
        if let Some(b) = self.backoff {
            if b.initial > b.max {
                return Err(Rejection::InvalidArgument(
                    "backoff initial delay is above its max".into(),
                ));
            }
        }
        if let Some(key) = &self.fairness_key {
            check_fairness_key(key)?;
        }
        check_fairness_weight(self.fairness_weight)?;
        if let Some(key) = &self.concurrency_key {
            check_concurrency_key(key)?;
        }
        if self.concurrency_limit == 0 {
            return Err(Rejection::InvalidArgument(
                "concurrency_limit must be at least 1".into(),
            ));
        }
        let spans = [
            ("tolerance", self.fixed_start.map(|f| f.tolerance)),
            ("est_runtime", self.est_runtime),
            ("attempt_timeout", self.attempt_timeout),
            ("backoff max", self.backoff.map(|b| b.max)),
        ];
        for (what, span) in spans {
            if span.is_some_and(|s| s > MAX_HORIZON) {
                return Err(Rejection::InvalidArgument(format!(
                    "{what} is longer than the limit of 10 years"
                )));
            }
        }
        Ok(())
    }

    /// Refuses a deadline or fixed start more than [`MAX_HORIZON`] after
    /// `now` (so `start_at + tolerance` and every timer stay far from
    /// overflow).
    pub fn check_horizon(&self, now: Millis) -> Result<(), Rejection> {
        let limit = now.plus(MAX_HORIZON);
        let times = [
            ("deadline", self.deadline),
            ("start_at", self.fixed_start.map(|f| f.start_at)),
        ];
        for (what, time) in times {
            if time.is_some_and(|t| t > limit) {
                return Err(Rejection::InvalidArgument(format!(
                    "{what} is more than 10 years ahead"
                )));
            }
        }
        Ok(())
    }
}

/// How one attempt ended, as reported by a shell.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptOutcome {
    /// The handler returned output.
    Succeeded,
    /// The handler returned an error.
    Failed {
        /// Whether another attempt may help.
        retryable: bool,
    },
    /// The attempt vanished: worker gone, lease expired, timeout.
    Lost,
    /// The attempt stopped because it was revoked (cancel).
    Cancelled,
}

impl AttemptOutcome {
    /// The lowercase name shown in attempt records.
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptOutcome::Succeeded => "succeeded",
            AttemptOutcome::Failed { .. } => "failed",
            AttemptOutcome::Lost => "lost",
            AttemptOutcome::Cancelled => "cancelled",
        }
    }
}

/// A task's state (SPEC §1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    /// Fixed start in the future.
    Scheduled,
    /// Waiting for a slot (or for its retry backoff to pass).
    Queued,
    /// An attempt holds a slot.
    Running,
    /// An attempt succeeded.
    Succeeded,
    /// The last attempt failed (or a non-retryable failure).
    Failed,
    /// Cancelled before it succeeded or failed.
    Cancelled,
    /// A fixed-start task that could not start within its tolerance.
    Missed,
}

impl TaskState {
    /// Whether the state is final.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskState::Succeeded | TaskState::Failed | TaskState::Cancelled | TaskState::Missed
        )
    }

    /// The lowercase name used on the wire, over HTTP and in the CLI.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Scheduled => "scheduled",
            TaskState::Queued => "queued",
            TaskState::Running => "running",
            TaskState::Succeeded => "succeeded",
            TaskState::Failed => "failed",
            TaskState::Cancelled => "cancelled",
            TaskState::Missed => "missed",
        }
    }
}

impl fmt::Display for TaskState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

/// Why a task that is not running waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitReason {
    /// No group of the pool carries the required labels.
    NoGroupMatches,
    /// Matching groups exist but every slot is busy.
    GroupsFull,
    /// A matching slot is free but held back for a due reservation.
    HeldForReservation,
    /// Waiting out the backoff before the next attempt.
    Backoff,
    /// Fixed start in the future.
    Scheduled,
    /// Its fairness key holds its quota of the slots it could use (SPEC §9).
    Quota,
    /// Its concurrency key's limit is reached (SPEC §9).
    Concurrency,
}

impl WaitReason {
    /// The lowercase name used over HTTP.
    pub fn as_str(self) -> &'static str {
        match self {
            WaitReason::NoGroupMatches => "no_group_matches",
            WaitReason::GroupsFull => "groups_full",
            WaitReason::HeldForReservation => "held_for_reservation",
            WaitReason::Backoff => "backoff",
            WaitReason::Scheduled => "scheduled",
            WaitReason::Quota => "quota",
            WaitReason::Concurrency => "concurrency",
        }
    }
}

impl fmt::Display for WaitReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

/// The most fleets one pool may declare (each is a metric series).
pub const MAX_FLEETS: usize = 64;

/// One declared fleet (config: `fleets = [{ labels = { gpu = "a100" },
/// min = 0, max = 8, slots_per_worker = 2 }]`). Bounds are in workers.
///
/// ```
/// use cronoq::core::{FleetConfig, Labels};
/// let fleet = FleetConfig { labels: Labels::from([("gpu", "a100")]), min: 0, max: 8, slots_per_worker: 2 };
/// assert!(fleet.validate().is_ok());
/// assert!(FleetConfig { min: 9, ..fleet.clone() }.validate().is_err());
/// assert!(FleetConfig { slots_per_worker: 0, ..fleet }.validate().is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetConfig {
    /// The exact label set of the fleet's workers (empty: unlabeled).
    #[serde(default)]
    pub labels: Labels,
    /// Fewest workers.
    #[serde(default)]
    pub min: u32,
    /// Most workers.
    pub max: u32,
    /// Slots each worker of the fleet offers (`cronoq worker --slots`).
    #[serde(default = "one")]
    pub slots_per_worker: u32,
}

fn one() -> u32 {
    1
}

impl FleetConfig {
    /// Refuses a fleet that cannot work: malformed labels, `min > max`,
    /// `slots_per_worker` 0 (`INVALID_ARGUMENT`).
    pub fn validate(&self) -> Result<(), Rejection> {
        let label_text = if self.labels.is_empty() {
            "(unlabeled)".to_string()
        } else {
            self.labels.to_string()
        };
        self.labels
            .validate()
            .map_err(|e| Rejection::InvalidArgument(format!("fleet {label_text}: labels: {e}")))?;
        if self.min > self.max {
            return Err(Rejection::InvalidArgument(format!(
                "fleet {label_text}: min {} is above max {}",
                self.min, self.max
            )));
        }
        if self.slots_per_worker == 0 {
            return Err(Rejection::InvalidArgument(format!(
                "fleet {label_text}: slots_per_worker must be at least 1"
            )));
        }
        Ok(())
    }
}

/// Checks every fleet of a pool, that no label set is declared twice and
/// that there are at most [`MAX_FLEETS`].
///
/// ```
/// use cronoq::core::{validate_fleets, FleetConfig, Labels};
/// let cpu = FleetConfig { labels: Labels::new(), min: 0, max: 4, slots_per_worker: 1 };
/// assert!(validate_fleets(&[cpu.clone()]).is_ok());
/// assert!(validate_fleets(&[cpu.clone(), cpu]).is_err());
/// ```
pub fn validate_fleets(fleets: &[FleetConfig]) -> Result<(), Rejection> {
    if fleets.len() > MAX_FLEETS {
        return Err(Rejection::InvalidArgument(format!(
            "{} fleets are declared; at most {MAX_FLEETS} per pool",
            fleets.len()
        )));
    }
    for (i, fleet) in fleets.iter().enumerate() {
        fleet.validate()?;
        if fleets[..i].iter().any(|f| f.labels == fleet.labels) {
            return Err(Rejection::InvalidArgument(format!(
                "fleet {} is declared twice",
                if fleet.labels.is_empty() {
                    "(unlabeled)".to_string()
                } else {
                    fleet.labels.to_string()
                }
            )));
        }
    }
    Ok(())
}
