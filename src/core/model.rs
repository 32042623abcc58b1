//! The core's vocabulary: ids, names, labels, time and the stable error
//! codes shared by every boundary (task specs, pool settings and states
//! are in `spec.rs`).
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

    /// A wall-clock instant as ms since the Unix epoch (0 before it). A
    /// conversion: the core reads no clock, its shells pass the time in.
    pub fn since_epoch(t: std::time::SystemTime) -> Millis {
        Millis::from_duration(t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default())
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
