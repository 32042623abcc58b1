//! The core's vocabulary: ids, names, labels, time, task specs, outcomes and
//! the stable error codes shared by every boundary.
//!
//! Everything here is plain data plus validation. Nothing reads a clock:
//! [`Millis`] values are handed in by the shells.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// A count of milliseconds. As an instant it counts from the Unix epoch; as
/// a span it is a plain duration. The core never reads a clock: every
/// instant it sees was handed to it.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Millis(pub u64);

impl Millis {
    /// The zero instant / the empty span.
    pub const ZERO: Millis = Millis(0);
    /// The far future: used as "never".
    pub const MAX: Millis = Millis(u64::MAX);

    /// `self + span`, saturating at [`Millis::MAX`].
    pub fn plus(self, span: Millis) -> Millis {
        Millis(self.0.saturating_add(span.0))
    }

    /// `self - span`, saturating at zero.
    pub fn minus(self, span: Millis) -> Millis {
        Millis(self.0.saturating_sub(span.0))
    }

    /// Milliseconds from a [`std::time::Duration`], saturating.
    pub fn from_duration(d: std::time::Duration) -> Millis {
        Millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    /// This span as a [`std::time::Duration`].
    pub fn to_duration(self) -> std::time::Duration {
        std::time::Duration::from_millis(self.0)
    }
}

impl fmt::Display for Millis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ms", self.0)
    }
}

/// A task's id, unique within one scheduler (assigned by the shell).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TaskId(pub u64);

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl std::str::FromStr for TaskId {
    type Err = Rejection;
    fn from_str(s: &str) -> Result<Self, Rejection> {
        s.trim()
            .parse::<u64>()
            .map(TaskId)
            .map_err(|_| Rejection::InvalidArgument(format!("task id {s:?} is not a number")))
    }
}

/// A stable error code, shared by the wire, HTTP and every error type.
///
/// A newtype over a string so that an older client still decodes a code
/// that a newer server invents. Clients branch on the code, never on the
/// message.
///
/// ```
/// use cronoq::core::ErrorCode;
/// assert_eq!(ErrorCode::INVALID_ARGUMENT.as_str(), "INVALID_ARGUMENT");
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ErrorCode(pub Cow<'static, str>);

impl ErrorCode {
    /// The request is malformed: a bad name, label, duration or size.
    pub const INVALID_ARGUMENT: ErrorCode = ErrorCode(Cow::Borrowed("INVALID_ARGUMENT"));
    /// No or unverifiable credentials.
    pub const UNAUTHENTICATED: ErrorCode = ErrorCode(Cow::Borrowed("UNAUTHENTICATED"));
    /// Credentials do not allow this.
    pub const PERMISSION_DENIED: ErrorCode = ErrorCode(Cow::Borrowed("PERMISSION_DENIED"));
    /// No such task, pool or worker.
    pub const NOT_FOUND: ErrorCode = ErrorCode(Cow::Borrowed("NOT_FOUND"));
    /// The thing exists already (a task id submitted twice).
    pub const ALREADY_EXISTS: ErrorCode = ErrorCode(Cow::Borrowed("ALREADY_EXISTS"));
    /// A server-side limit was hit (too many waiting tasks, a quota).
    pub const RESOURCE_EXHAUSTED: ErrorCode = ErrorCode(Cow::Borrowed("RESOURCE_EXHAUSTED"));
    /// The request is well formed but the state does not allow it
    /// (no executor for the pool, a stale attempt, a finished task).
    pub const FAILED_PRECONDITION: ErrorCode = ErrorCode(Cow::Borrowed("FAILED_PRECONDITION"));
    /// Try again later: no leader, NATS down, shutting down.
    pub const UNAVAILABLE: ErrorCode = ErrorCode(Cow::Borrowed("UNAVAILABLE"));
    /// A bug or an unexpected failure; details are in the log.
    pub const INTERNAL: ErrorCode = ErrorCode(Cow::Borrowed("INTERNAL"));

    /// Every code this version knows, in documentation order.
    pub const ALL: [ErrorCode; 9] = [
        Self::INVALID_ARGUMENT,
        Self::UNAUTHENTICATED,
        Self::PERMISSION_DENIED,
        Self::NOT_FOUND,
        Self::ALREADY_EXISTS,
        Self::RESOURCE_EXHAUSTED,
        Self::FAILED_PRECONDITION,
        Self::UNAVAILABLE,
        Self::INTERNAL,
    ];

    /// The code as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&self.0)
    }
}

/// Why the core refused an event. A refused event changes nothing.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    /// A malformed name, label set, duration or option.
    #[error("{0}")]
    InvalidArgument(String),
    /// A task with this id is already known.
    #[error("task {0} already exists")]
    DuplicateTask(TaskId),
    /// No live task with this id.
    #[error("task {0} not found")]
    UnknownTask(TaskId),
    /// An outcome or start for an attempt that is not the task's live one.
    #[error("attempt {attempt} of task {task} is not live")]
    StaleAttempt {
        /// The task.
        task: TaskId,
        /// The attempt that was reported.
        attempt: u32,
    },
    /// The task already reached a terminal state.
    #[error("task {0} has already finished")]
    AlreadyFinished(TaskId),
    /// A limit was reached: too many pools, tasks, labels; too long a key.
    #[error("{0}")]
    ResourceExhausted(String),
    /// The pool is not declared and undeclared pools are not allowed.
    #[error("pool {0} is not declared in the configuration")]
    UnknownPool(PoolName),
}

impl Rejection {
    /// The stable code for this rejection.
    pub fn code(&self) -> ErrorCode {
        match self {
            Rejection::InvalidArgument(_) => ErrorCode::INVALID_ARGUMENT,
            Rejection::DuplicateTask(_) => ErrorCode::ALREADY_EXISTS,
            Rejection::UnknownTask(_) | Rejection::UnknownPool(_) => ErrorCode::NOT_FOUND,
            Rejection::StaleAttempt { .. } | Rejection::AlreadyFinished(_) => {
                ErrorCode::FAILED_PRECONDITION
            }
            Rejection::ResourceExhausted(_) => ErrorCode::RESOURCE_EXHAUSTED,
        }
    }
}

/// The longest pool name, label name or label value accepted.
pub const MAX_NAME_LEN: usize = 64;

/// The most labels a worker may carry or a task may require
/// (`RESOURCE_EXHAUSTED` beyond).
pub const MAX_LABELS: usize = 16;

/// The longest idempotency key accepted, in bytes (`RESOURCE_EXHAUSTED`
/// beyond).
pub const MAX_KEY_LEN: usize = 256;

/// How far ahead a deadline or fixed start may lie, and the longest
/// duration (tolerance, run-time estimate, attempt timeout, backoff)
/// accepted: 10 years. Anything later is `INVALID_ARGUMENT`, so no time
/// computation downstream can overflow.
pub const MAX_HORIZON: Millis = Millis(10 * 366 * 24 * 3600 * 1000);

/// At most the first 64 characters of an offending value, for an error
/// message: a refusal never echoes a megabyte back.
///
/// ```
/// use cronoq::core::excerpt;
/// assert_eq!(excerpt("short"), "\"short\"");
/// assert!(excerpt(&"x".repeat(100_000)).len() < 120);
/// ```
pub fn excerpt(text: &str) -> String {
    const KEEP: usize = 64;
    if text.len() <= KEEP {
        return format!("{text:?}");
    }
    let mut end = KEEP;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{:?}… ({} bytes)", &text[..end], text.len())
}

/// A validated pool name: 1–64 characters of `A-Z a-z 0-9 _ -`.
///
/// Dots are refused because a pool name is one token of a NATS subject
/// (`cronoq.submit.<pool>`). Cheap to clone.
///
/// ```
/// use cronoq::core::PoolName;
/// assert!(PoolName::new("inference").is_ok());
/// assert!(PoolName::new("").is_err());
/// assert!(PoolName::new("a.b").is_err());
/// ```
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct PoolName(Arc<str>);

impl PoolName {
    /// The name of the pool a task uses when it names none.
    pub const DEFAULT: &'static str = "default";

    /// Validates and wraps a pool name.
    pub fn new(name: impl AsRef<str>) -> Result<PoolName, Rejection> {
        let name = name.as_ref();
        if name.is_empty() {
            return Err(Rejection::InvalidArgument("pool name is empty".into()));
        }
        if name.len() > MAX_NAME_LEN {
            return Err(Rejection::InvalidArgument(format!(
                "pool name {} is longer than {MAX_NAME_LEN} characters",
                excerpt(name)
            )));
        }
        if !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return Err(Rejection::InvalidArgument(format!(
                "pool name {} may only hold letters, digits, '_' and '-'",
                excerpt(name)
            )));
        }
        Ok(PoolName(Arc::from(name)))
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for PoolName {
    fn default() -> Self {
        PoolName(Arc::from(Self::DEFAULT))
    }
}

impl TryFrom<String> for PoolName {
    type Error = Rejection;
    fn try_from(s: String) -> Result<Self, Rejection> {
        PoolName::new(s)
    }
}

impl From<PoolName> for String {
    fn from(p: PoolName) -> String {
        p.0.to_string()
    }
}

/// Lets a map keyed by pool name be searched with a `&str` (the name's
/// hash and order are those of its text).
impl std::borrow::Borrow<str> for PoolName {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for PoolName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&self.0)
    }
}

impl fmt::Debug for PoolName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", &*self.0)
    }
}

/// A set of `name=value` labels, kept sorted by name. Cheap to clone.
///
/// Building one never fails; [`Labels::validate`] (called by every entry
/// point of the scheduler) refuses malformed sets: an empty or oversized
/// name or value, characters outside `A-Z a-z 0-9 _ - . /` (names) or
/// `A-Z a-z 0-9 _ - . : /` (values), and one name with two values.
///
/// ```
/// use cronoq::core::Labels;
/// let l = Labels::from([("zone", "eu"), ("gpu", "a100")]);
/// assert_eq!(l.to_string(), "gpu=a100,zone=eu");
/// assert!(l.validate().is_ok());
/// assert!(Labels::parse("gpu").is_err());
/// assert!(Labels::parse("=x").is_err());
/// assert!(Labels::parse("gpu=a100,gpu=h100").is_err());
/// ```
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Labels(Arc<Vec<(String, String)>>);

impl Labels {
    /// The empty label set (the unlabeled group, or a task that needs nothing).
    pub fn new() -> Labels {
        Labels::default()
    }

    /// Adds `name=value`, keeping the set sorted. A second value for the same
    /// name is kept too, so that [`Labels::validate`] can refuse it.
    pub fn insert(&mut self, name: impl Into<String>, value: impl Into<String>) {
        let pair = (name.into(), value.into());
        let v = Arc::make_mut(&mut self.0);
        let at = v.partition_point(|p| *p <= pair);
        if at > 0 && v[at - 1] == pair {
            return;
        }
        v.insert(at, pair);
    }

    /// Parses `k=v,k=v` (spaces around items are ignored; an empty string is
    /// the empty set) and validates the result.
    pub fn parse(text: &str) -> Result<Labels, Rejection> {
        let mut labels = Labels::new();
        for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            if labels.len() >= MAX_LABELS {
                return Err(too_many_labels());
            }
            labels.insert_parsed(item)?;
        }
        labels.validate()?;
        Ok(labels)
    }

    /// Parses one `name=value` item (as given to `--label`) and adds it.
    pub fn insert_parsed(&mut self, item: &str) -> Result<(), Rejection> {
        match item.split_once('=') {
            Some((k, v)) => {
                self.insert(k.trim(), v.trim());
                Ok(())
            }
            None => Err(Rejection::InvalidArgument(format!(
                "label {} is not of the form name=value",
                excerpt(item)
            ))),
        }
    }

    /// Checks every rule of a well-formed label set.
    pub fn validate(&self) -> Result<(), Rejection> {
        if self.0.len() > MAX_LABELS {
            return Err(too_many_labels());
        }
        let mut previous: Option<&str> = None;
        for (name, value) in self.0.iter() {
            check_token("label name", name, |b| {
                b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'/')
            })?;
            check_token("label value", value, |b| {
                b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':' | b'/')
            })
            .map_err(|e| match e {
                Rejection::InvalidArgument(m) => {
                    Rejection::InvalidArgument(format!("{m} (label {name:?})"))
                }
                other => other,
            })?;
            if previous == Some(name.as_str()) {
                return Err(Rejection::InvalidArgument(format!(
                    "label {name:?} is given two values"
                )));
            }
            previous = Some(name);
        }
        Ok(())
    }

    /// The pairs, sorted by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// How many labels.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// No labels at all.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The value of `name`, if present.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// `self ⊇ required`: every required `name=value` is present here.
    pub fn satisfies(&self, required: &Labels) -> bool {
        required.iter().all(|(k, v)| self.get(k) == Some(v))
    }
}

fn too_many_labels() -> Rejection {
    Rejection::ResourceExhausted(format!("more than {MAX_LABELS} labels"))
}

fn check_token(what: &str, token: &str, allowed: impl Fn(u8) -> bool) -> Result<(), Rejection> {
    if token.is_empty() {
        return Err(Rejection::InvalidArgument(format!("{what} is empty")));
    }
    if token.len() > MAX_NAME_LEN {
        return Err(Rejection::InvalidArgument(format!(
            "{what} {} is longer than {MAX_NAME_LEN} characters",
            excerpt(token)
        )));
    }
    if !token.bytes().all(allowed) {
        return Err(Rejection::InvalidArgument(format!(
            "{what} {} holds a character that is not allowed",
            excerpt(token)
        )));
    }
    Ok(())
}

impl<K: Into<String>, V: Into<String>, const N: usize> From<[(K, V); N]> for Labels {
    fn from(pairs: [(K, V); N]) -> Labels {
        pairs.into_iter().collect()
    }
}

impl<K: Into<String>, V: Into<String>> FromIterator<(K, V)> for Labels {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Labels {
        let mut labels = Labels::new();
        for (k, v) in iter {
            labels.insert(k, v);
        }
        labels
    }
}

impl fmt::Display for Labels {
    /// `k=v,k=v`; the empty set prints as the empty string.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (k, v)) in self.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{k}={v}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Labels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{{{self}}}")
    }
}

impl Serialize for Labels {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(self.len()))?;
        for (k, v) in self.iter() {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for Labels {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Labels, D::Error> {
        // Not validated here: every entry point validates (`to_spec`,
        // registration) and so answers with the right code for the value
        // (`RESOURCE_EXHAUSTED` for too many labels), the same on every path.
        let map = std::collections::BTreeMap::<String, String>::deserialize(d)?;
        Ok(map.into_iter().collect())
    }
}

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
        validate_fleets(&self.fleets)
    }
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
