//! The worker protocol's messages: registration (challenge, session),
//! heartbeats, leases and their batches, renewals, outcome reports,
//! revokes and deregistration.

use bytes::Bytes;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::core::{Labels, Millis, PoolName, RevokeReason, TaskId};

use super::{v, WireError};

/// Asks the leader for a registration nonce (request on
/// `P.w.<worker_id>.challenge`; only when auth is on).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Challenge {
    /// Protocol version.
    #[serde(default = "v")]
    pub v: u16,
}

impl Default for Challenge {
    fn default() -> Self {
        Challenge { v: v() }
    }
}

/// A registration nonce: sign the `Register` over it, within 30 s, once.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ChallengeReply {
    /// Protocol version.
    #[serde(default = "v")]
    pub v: u16,
    /// The nonce to put in the registration's `Cronoq-Auth` proof.
    pub nonce: String,
}

/// A worker session the leader opened at registration (auth on): the
/// worker proves it on every later request, and checks the leader's
/// leases and revokes with it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SessionGrant {
    /// The session id (in `Cronoq-Auth: v1 session <id> …`).
    pub id: String,
    /// The 32-byte session key, sealed to the registration's `xkey`.
    #[schemars(with = "Vec<u8>")]
    pub sealed_key: Bytes,
    /// The leader's curve public key (`X…`) that sealed it.
    pub server_xkey: String,
}

/// A worker joins a pool (request on `P.w.<worker_id>.register`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Register {
    /// Protocol version.
    #[serde(default = "v")]
    pub v: u16,
    /// Unique worker id (one subject token).
    pub worker_id: String,
    /// The pool it serves.
    pub pool: PoolName,
    /// Its labels: it joins the group with exactly these.
    #[serde(default)]
    pub labels: Labels,
    /// Attempts it runs at once.
    pub slots: u32,
    /// A curve public key (`X…`) made for this registration: when auth is
    /// on, the leader seals the session key to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xkey: Option<String>,
    /// A value unique to this worker process: a registration of an id
    /// that another live instance holds is refused (`ALREADY_EXISTS`),
    /// one from the same instance is idempotent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// Attempts it still runs (registering again with a new leader): the
    /// leader re-attaches those its journal says this worker runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub running: Vec<RunningAttempt>,
    /// It takes several leases in one message (`Leases` on
    /// `P.worker.<worker_id>.leases`); without, one `Lease` per message.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub lease_batches: bool,
}

/// The leader accepted a registration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RegisterReply {
    /// Protocol version.
    #[serde(default = "v")]
    pub v: u16,
    /// The leader's epoch; leases of other epochs are ignored.
    pub epoch: u64,
    /// How often to heartbeat.
    pub heartbeat_interval: Millis,
    /// Silence after which the leader removes the worker.
    pub worker_timeout: Millis,
    /// A lease not renewed within this is lost.
    pub lease_ttl: Millis,
    /// Of the attempts the registration listed, those the leader counts as
    /// running here (their renewals and reports are accepted under their
    /// old epoch); the worker stops the others at once.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub adopted: Vec<RunningAttempt>,
    /// The worker's session, when auth is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<SessionGrant>,
}

/// An attempt a worker is running.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RunningAttempt {
    /// The task.
    pub task_id: TaskId,
    /// The attempt.
    pub attempt: u32,
}

/// A worker is alive (request on `P.w.<worker_id>.heartbeat`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Heartbeat {
    /// Protocol version.
    #[serde(default = "v")]
    pub v: u16,
    /// The worker.
    pub worker_id: String,
    /// Slots not running anything.
    pub free_slots: u32,
    /// What it runs.
    #[serde(default)]
    pub running: Vec<RunningAttempt>,
}

/// The leader's answer to a heartbeat.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct HeartbeatReply {
    /// Protocol version.
    #[serde(default = "v")]
    pub v: u16,
    /// The leader's epoch.
    pub epoch: u64,
    /// False: the leader does not know this worker (it was removed, or a
    /// new leader took over): register again.
    pub registered: bool,
}

/// A worker leaves (request on `P.w.<worker_id>.deregister`).
///
/// With `drain` the leader stops leasing to it but lets its running
/// attempts finish; without, the worker is removed at once and whatever
/// it still runs counts as lost (and is retried elsewhere).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Deregister {
    /// Protocol version.
    #[serde(default = "v")]
    pub v: u16,
    /// The worker.
    pub worker_id: String,
    /// Stop new leases only; the final deregister follows.
    #[serde(default)]
    pub drain: bool,
}

/// A bare acknowledgement.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Ack {
    /// Protocol version.
    #[serde(default = "v")]
    pub v: u16,
}

impl Default for Ack {
    fn default() -> Self {
        Ack { v: v() }
    }
}

/// Run this attempt (leader → `P.worker.<id>.lease`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Lease {
    /// Protocol version.
    #[serde(default = "v")]
    pub v: u16,
    /// The task.
    pub task_id: TaskId,
    /// The attempt, from 1.
    pub attempt: u32,
    /// The pool.
    pub pool: PoolName,
    /// The group (the worker's labels).
    pub group: Labels,
    /// The payload.
    #[schemars(with = "Vec<u8>")]
    pub payload: Bytes,
    /// Renew before this runs out.
    pub ttl: Millis,
    /// The leader's epoch.
    pub epoch: u64,
    /// The W3C trace context of the attempt: with the leader's telemetry
    /// on, its attempt span (a child of the submitter's, or a root of
    /// the task's own trace); otherwise the one the task was submitted
    /// with, if any (older leaders send none; older workers ignore it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// The schedule that fired the task, if one did (older leaders send
    /// none; older workers ignore it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<String>,
    /// The tick it was fired for, ms since the epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduled_at: Option<Millis>,
}

/// Keep my lease (request on `P.w.<worker_id>.renew`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Renew {
    /// Protocol version.
    #[serde(default = "v")]
    pub v: u16,
    /// The worker.
    pub worker_id: String,
    /// The task.
    pub task_id: TaskId,
    /// The attempt.
    pub attempt: u32,
    /// The epoch of the lease.
    pub epoch: u64,
}

/// A renewed lease.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RenewReply {
    /// Protocol version.
    #[serde(default = "v")]
    pub v: u16,
    /// The lease now runs this much longer.
    pub ttl: Millis,
}

/// How an attempt ended, as the worker saw it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AttemptResult {
    /// The handler returned output.
    Succeeded {
        /// The output.
        #[schemars(with = "Vec<u8>")]
        output: Bytes,
    },
    /// The handler failed.
    Failed {
        /// The error.
        error: String,
        /// Whether another attempt may help.
        retryable: bool,
    },
    /// The worker stopped it after a revoke.
    Cancelled,
}

/// An attempt ended (request on `P.w.<worker_id>.outcome`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct AttemptReport {
    /// Protocol version.
    #[serde(default = "v")]
    pub v: u16,
    /// The worker.
    pub worker_id: String,
    /// The task.
    pub task_id: TaskId,
    /// The attempt.
    pub attempt: u32,
    /// The epoch of the lease.
    pub epoch: u64,
    /// How it ended.
    pub result: AttemptResult,
}

/// Several leases for one worker in one message (leader →
/// `P.worker.<worker_id>.leases`), sent to a worker that registered with
/// `lease_batches`: the leases one turn of the leader gave it. Each is
/// taken as if it came alone.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Leases {
    /// Protocol version.
    #[serde(default = "v")]
    pub v: u16,
    /// The leases, in the order the leader decided them.
    pub leases: Vec<Lease>,
}

/// The MessagePack body of a [`Leases`] holding these encoded [`Lease`]s
/// as they are (each is a MessagePack value of its own): no decoding and
/// encoding again.
pub fn leases_body(leases: &[bytes::Bytes]) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + leases.iter().map(|l| l.len()).sum::<usize>());
    // Writing to a Vec cannot fail.
    let _ = rmp::encode::write_map_len(&mut out, 2);
    let _ = rmp::encode::write_str(&mut out, "v");
    let _ = rmp::encode::write_uint(&mut out, u64::from(crate::wire::PROTOCOL_VERSION));
    let _ = rmp::encode::write_str(&mut out, "leases");
    let _ = rmp::encode::write_array_len(&mut out, u32::try_from(leases.len()).unwrap_or(u32::MAX));
    for lease in leases {
        out.extend_from_slice(lease);
    }
    out
}

/// Attempts that ended, reported in one request (on
/// `P.w.<worker_id>.outcomes`): a worker sends what ended while its
/// earlier reports were on the way, so a busy worker sends one report
/// and hears one reply for many attempts. Each report is taken as if it
/// came alone; the reply says, in the same order, which were refused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct AttemptReports {
    /// Protocol version.
    #[serde(default = "v")]
    pub v: u16,
    /// The worker (each report's `worker_id` must be the same).
    pub worker_id: String,
    /// At most [`MAX_REPORTS`] reports.
    pub reports: Vec<AttemptReport>,
}

/// The most reports in one [`AttemptReports`].
pub const MAX_REPORTS: usize = 4096;

/// The answer to [`AttemptReports`], sent once every accepted outcome is
/// stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct AttemptReportsReply {
    /// Protocol version.
    #[serde(default = "v")]
    pub v: u16,
    /// One entry per report, in order: `null` if it was taken (as the
    /// `Ack` of `outcome`), else why it was refused (as the error of
    /// `outcome`: `FAILED_PRECONDITION` for a stale attempt, …).
    pub refused: Vec<Option<WireError>>,
}

/// Stop this attempt (leader → `P.worker.<id>.revoke`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Revoke {
    /// Protocol version.
    #[serde(default = "v")]
    pub v: u16,
    /// The task.
    pub task_id: TaskId,
    /// The attempt.
    pub attempt: u32,
    /// The leader's epoch.
    pub epoch: u64,
    /// Why.
    pub reason: RevokeReason,
    /// For a preempted attempt (SPEC §9): how long its handler has to stop
    /// after it is asked to (a command gets SIGTERM, then SIGKILL once
    /// this passed); the pool's `preemption_grace`. Absent: stop at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace: Option<Millis>,
}
