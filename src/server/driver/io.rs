//! The driver's inputs and outputs (what the runner feeds it and carries out), who registered a worker, and the timing and limits it runs under.

use super::*;

/// Where a reply goes: a NATS reply subject, or a local caller (HTTP)
/// named by a request id. Plain data: the shell keeps id → caller
/// ([`crate::server::Replies`]), so inputs can be recorded and replayed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Responder {
    /// Publish the encoded reply here (if the request had a reply subject).
    Nats(Option<String>),
    /// Hand the result to the local caller waiting on this request id.
    Local(RequestId),
}

/// A local caller's request, as the shell numbers them.
pub(crate) type RequestId = u64;

/// A reply to a local caller ([`Output::Reply`]): one variant per kind of
/// answer the driver gives.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Reply {
    Register(Result<RegisterReply, WireError>),
    Heartbeat(Result<HeartbeatReply, WireError>),
    Ack(Result<Ack, WireError>),
    Renew(Result<RenewReply, WireError>),
    Reports(Result<wire::AttemptReportsReply, WireError>),
    Task(Result<Option<TaskStatus>, WireError>),
    Owner(Result<Option<(PoolName, Option<String>)>, WireError>),
    Snapshot(Result<Snapshot, WireError>),
    Tasks(Result<wire::TaskList, WireError>),
    Metrics(Result<crate::metrics::MetricsSnapshot, WireError>),
    Schedule(Result<ScheduleReply, WireError>),
}

/// A type the driver answers with: how it goes into a [`Reply`] and
/// comes out again.
pub(crate) trait Replied: Sized {
    fn wrap(result: Result<Self, WireError>) -> Reply;
    /// `None`: the reply is of another kind (a caller asked for the wrong one).
    fn unwrap(reply: Reply) -> Option<Result<Self, WireError>>;
}

macro_rules! replied {
    ($($ty:ty => $variant:ident),* $(,)?) => {$(
        impl Replied for $ty {
            fn wrap(result: Result<Self, WireError>) -> Reply {
                Reply::$variant(result)
            }
            fn unwrap(reply: Reply) -> Option<Result<Self, WireError>> {
                match reply {
                    Reply::$variant(result) => Some(result),
                    _ => None,
                }
            }
        }
    )*};
}

replied! {
    RegisterReply => Register,
    HeartbeatReply => Heartbeat,
    Ack => Ack,
    RenewReply => Renew,
    wire::AttemptReportsReply => Reports,
    Option<TaskStatus> => Task,
    Option<(PoolName, Option<String>)> => Owner,
    Snapshot => Snapshot,
    wire::TaskList => Tasks,
    crate::metrics::MetricsSnapshot => Metrics,
    ScheduleReply => Schedule,
}

/// What the driver keeps per live task beside the ledger's record.
#[derive(Clone, Debug, Default)]
pub(crate) struct TaskExtra {
    /// The W3C trace context the submission carried.
    pub(crate) traceparent: Option<String>,
    /// The credential that submitted it (auth on).
    pub(crate) owner: Option<String>,
}

/// Something the driver must react to. Plain data: a run's inputs can be
/// recorded and replayed into a fresh driver, which gives the same outputs.
#[derive(Clone, Debug)]
pub(crate) enum Input {
    /// A message of the submit stream, decoded (or refused) by the consumer.
    Submitted {
        seq: u64,
        pool: PoolName,
        task: Result<Task, WireError>,
    },
    /// A submission whose task an earlier leadership started: its journal
    /// record says which attempts ran, and which one may still run.
    Recovered {
        seq: u64,
        pool: PoolName,
        task: Result<Task, WireError>,
        record: TaskRecord,
    },
    /// A submission no credential's proof verifies on (auth on): nobody to
    /// attribute it to, so it is counted and dropped, not recorded.
    Unattributed {
        seq: u64,
        error: WireError,
    },
    /// The consumer delivered every submission stored before this
    /// leadership began: the journal is read.
    CaughtUp,
    /// A registration, with who made it (auth on) and what that
    /// credential may hold.
    Register(Register, Registrant, Responder),
    Heartbeat(Heartbeat, Responder),
    Deregister(Deregister, Responder),
    Renew(Renew, Responder),
    Outcome(AttemptReport, Responder),
    /// Several outcomes in one request: each taken as `Outcome` would take
    /// it, one reply for all.
    Outcomes(Vec<AttemptReport>, Responder),
    Cancel(TaskId, Responder),
    /// A cancel for a task accepted by the stream but not consumed yet.
    CancelOnArrival(TaskId),
    GetTask(TaskId, Responder),
    /// A live task's pool and submitter (`None`: not live here).
    Owner(TaskId, Responder),
    Snapshot(Responder),
    /// The newest live and recently finished tasks (a checked limit).
    RecentTasks(usize, Responder),
    /// The ledger's counters and histograms.
    Metrics(Responder),
    /// These leases were published just now (their turn's records were
    /// stored): their time to live runs from here, not from the decision
    /// (a journal write held up by a NATS restart would eat it).
    LeasesSent(Vec<(TaskId, u32)>),
    /// A schedule request ([`ScheduleOp`]).
    Schedule(ScheduleOp, Responder),
    /// The submit stream's answer to a fire ([`Output::Fire`]): the
    /// task's sequence (also when the stream found the tick's key already
    /// published), or why it was not taken.
    FirePublished {
        name: String,
        tick: Millis,
        kind: crate::schedule::FireKind,
        result: Result<u64, WireError>,
    },
    /// A task an earlier leadership finished, from its result record
    /// (which names its idempotency key): its key binds to it again.
    FinishedBefore {
        seq: u64,
        record: TaskRecord,
    },
    /// Several inputs handed over at once, taken in order as if each came
    /// alone: a takeover's submissions from a standby's copy, so that
    /// hundreds of thousands of them cost no channel hop each.
    Batch(Vec<Input>),
}

/// Who registered a worker: its credential and that credential's bounds
/// (from `[[auth.tokens]]`/`[[auth.nkeys]]`). `Default`: auth off, no
/// bound but the server's `max_workers`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Registrant {
    /// The credential's name (`token:<env>`, `nkey:<key>`); journaled
    /// with each attempt its workers start, so after a leader change only
    /// this credential may re-attach the attempt or report its outcome.
    pub credential: Option<String>,
    /// The most workers it may have registered at once.
    pub max_workers: u32,
    /// The most slots all its workers together may offer.
    pub max_slots: u64,
}

impl Registrant {
    /// A credential's registrant.
    pub(crate) fn of(principal: &crate::auth::Principal) -> Registrant {
        Registrant {
            credential: Some(principal.name.clone()),
            max_workers: principal.max_workers,
            max_slots: principal.max_slots,
        }
    }
}

/// Something the runner must do. Writes (`Persist`) and announcements
/// (`Publish`, `Reply`) of one turn are carried out in that order: nobody
/// hears of a state change before it is stored.
#[derive(Clone, PartialEq)]
pub(crate) enum Output {
    /// Publish on core NATS.
    Publish { subject: String, body: Bytes },
    /// Publish a lease; then tell the driver ([`Input::LeasesSent`]).
    /// `together`: its worker takes the leases of one turn in one
    /// message (`P.worker.<id>.leases`), which the runner builds.
    Lease {
        subject: String,
        body: Bytes,
        task: TaskId,
        attempt: u32,
        together: bool,
    },
    /// Store a task's record under its sequence in the results bucket (the
    /// journal): a live task's attempts so far, or a finished task's result
    /// (then its submission may be purged). A refused submission is first
    /// copied to the dead-letter stream with its reason.
    Persist {
        seq: u64,
        record: TaskRecord,
        dead_letter: Option<WireError>,
    },
    /// Drop a submission that duplicated another task (no result kept).
    Discard { seq: u64 },
    /// Hand a result to the local caller waiting on request `id`.
    Reply { id: RequestId, reply: Reply },
    /// Publish a schedule's fire to the submit stream under the tick's
    /// key, once the turn is stored; then tell the driver
    /// ([`Input::FirePublished`]).
    Fire {
        name: String,
        tick: Millis,
        kind: crate::schedule::FireKind,
        task: Box<Task>,
    },
    /// Store a schedule's record (`sched.<name>`); `None`: it was deleted.
    PersistSchedule {
        name: String,
        stored: Option<Box<crate::schedule::StoredSchedule>>,
    },
    /// A finished task's life, for its spans (telemetry on): handed to
    /// the exporter once the turn is stored.
    Trace(Box<crate::telemetry::TaskTrace>),
}

impl std::fmt::Debug for Output {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Output::Publish { subject, body } => {
                write!(f, "Publish({subject}, {} bytes)", body.len())
            }
            Output::Lease { task, attempt, .. } => write!(f, "Lease({task}#{attempt})"),
            Output::Persist { seq, record, .. } => write!(f, "Persist({seq}, {})", record.state),
            Output::Discard { seq } => write!(f, "Discard({seq})"),
            Output::Reply { id, reply } => write!(f, "Reply({id}, {reply:?})"),
            Output::Fire { name, tick, .. } => write!(f, "Fire({name}@{})", tick.0),
            Output::PersistSchedule { name, stored } => {
                write!(f, "PersistSchedule({name}, {})", stored.is_some())
            }
            Output::Trace(trace) => write!(f, "Trace({})", trace.ids.task()),
        }
    }
}

/// Timing and limits.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    pub server_id: String,
    pub lease_ttl: Millis,
    pub worker_timeout: Millis,
    pub heartbeat_interval: Millis,
    pub max_payload_bytes: usize,
    /// The largest reply that fits in one NATS message.
    pub max_reply_bytes: usize,
    /// The largest journal record (the NATS message limit less the fence
    /// headers): larger ones are cut ([`TaskRecord::fit`]).
    pub max_record_bytes: usize,
    pub retain_finished: usize,
    pub pools: Vec<(PoolName, PoolConfig)>,
    pub max_workers: usize,
    pub limits: crate::core::Limits,
    /// After a leader change, how long an attempt the journal says runs
    /// waits for its worker to register again before it counts as lost.
    pub reattach_grace: Millis,
    /// Which task events go out (`[server] events`).
    pub events: crate::server::config::Events,
    /// The most schedules (`[server] max_schedules`).
    pub max_schedules: usize,
    /// Why schedules cannot be created here, if they cannot (credentials
    /// required and no storage key to attribute fires with).
    pub schedules_refused: Option<String>,
    /// The credentials as configured now: a schedule's fire is checked
    /// against its owner's current rights before it goes out.
    pub auth: std::sync::Arc<crate::auth::Authenticator>,
    /// Telemetry on: leases carry their attempt span's traceparent and
    /// finished tasks come out as [`Output::Trace`], with ids salted so.
    pub trace: Option<crate::telemetry::TraceSalt>,
}
