//! The driver's inputs and outputs (what the runner feeds it and carries out), who registered a worker, and the timing and limits it runs under.

use super::*;

/// Where a reply goes: a NATS reply subject, or a local caller (HTTP).
pub(crate) enum Responder<T> {
    /// Publish the encoded reply here (if the request had a reply subject).
    Nats(Option<String>),
    /// Hand the result to a local caller.
    Local(oneshot::Sender<Result<T, WireError>>),
}

/// What the driver keeps per live task beside the ledger's record.
#[derive(Clone, Debug, Default)]
pub(crate) struct TaskExtra {
    /// The W3C trace context the submission carried.
    pub(crate) traceparent: Option<String>,
    /// The credential that submitted it (auth on).
    pub(crate) owner: Option<String>,
}

/// Something the driver must react to.
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
        /// The start-record slot its running attempt was read from (the
        /// task's own record holds the attempts before it).
        start_slot: Option<u32>,
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
    Register(Register, Registrant, Responder<RegisterReply>),
    Heartbeat(Heartbeat, Responder<HeartbeatReply>),
    Deregister(Deregister, Responder<Ack>),
    Renew(Renew, Responder<RenewReply>),
    Outcome(AttemptReport, Responder<Ack>),
    /// Several outcomes in one request: each taken as `Outcome` would take
    /// it, one reply for all.
    Outcomes(Vec<AttemptReport>, Responder<wire::AttemptReportsReply>),
    Cancel(TaskId, Responder<Ack>),
    /// A cancel for a task accepted by the stream but not consumed yet.
    CancelOnArrival(TaskId),
    GetTask(TaskId, Responder<Option<TaskStatus>>),
    /// A live task's pool and submitter (`None`: not live here).
    Owner(TaskId, Responder<Option<(PoolName, Option<String>)>>),
    Snapshot(Responder<Snapshot>),
    /// The newest live and recently finished tasks (a checked limit).
    RecentTasks(usize, Responder<wire::TaskList>),
    /// The ledger's counters and histograms.
    Metrics(Responder<crate::metrics::MetricsSnapshot>),
    /// These leases were published just now (their turn's records were
    /// stored): their time to live runs from here, not from the decision
    /// (a journal write held up by a NATS restart would eat it).
    LeasesSent(Vec<(TaskId, u32)>),
    /// Every write of the turns up to this one ([`Driver::turn`]) is
    /// stored: start-record slots whose entries those writes covered may
    /// be written again.
    Stored(u64),
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
    /// Store the attempts this turn started together under the results
    /// bucket's key `s.<slot>` (`Settings::group_starts`): like `Persist`,
    /// before anything of the turn is announced.
    PersistStarts { slot: u32, record: StartRecords },
    /// Drop a submission that duplicated another task (no result kept).
    Discard { seq: u64 },
    /// Hand a result to a local caller (HTTP).
    Reply(Box<dyn FnOnce() + Send>),
}

impl std::fmt::Debug for Output {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Output::Publish { subject, body } => {
                write!(f, "Publish({subject}, {} bytes)", body.len())
            }
            Output::Lease { task, attempt, .. } => write!(f, "Lease({task}#{attempt})"),
            Output::Persist { seq, record, .. } => write!(f, "Persist({seq}, {})", record.state),
            Output::PersistStarts { slot, record } => {
                write!(f, "PersistStarts(s.{slot}, {} starts)", record.starts.len())
            }
            Output::Discard { seq } => write!(f, "Discard({seq})"),
            Output::Reply(_) => f.write_str("Reply"),
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
    /// A live task's journal record is written again this long after it
    /// was last written: the results bucket's max age (`results_ttl`)
    /// expires every message, the newest of a key included, so a record
    /// not rewritten would vanish under a long attempt or a long wait
    /// between attempts (a third of `results_ttl`).
    pub record_refresh: Millis,
    /// Journal the attempts a turn starts in one [`StartRecords`] write
    /// (a task's own record is written when the attempt ends) instead of
    /// one record per task.
    pub group_starts: bool,
}
