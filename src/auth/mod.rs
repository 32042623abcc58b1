//! Credentials: who may claim which labels, submit, read, cancel, and
//! speak the worker protocol (SPEC §7; the threat model is in
//! `SECURITY.md`).
//!
//! A NATS message carries no trustworthy sender (JetStream drops
//! `Nats-Request-Info` when it stores a message), so every message that
//! needs an identity carries a **proof** in its `Cronoq-Auth` header:
//!
//! ```text
//! Cronoq-Auth: v1 <scheme> <id> <nonce> <proof, base64url>
//! ```
//!
//! over the subject, the nonce, every header a receiver reads (the
//! `Cronoq-*` ones and [`COVERED_HEADERS`]) and the body
//! ([`signing_input`]), so a proof cannot be moved to another subject,
//! body or set of options. No secret ever travels:
//!
//! | scheme | id | proof | used by |
//! |---|---|---|---|
//! | `token` | [`token_id`] of the token | HMAC-SHA256 keyed with the token | clients, workers registering |
//! | `nkey` | the nkey's public key (`U…`) | its Ed25519 signature | clients, workers registering |
//! | `session` | a session id | HMAC-SHA256 keyed with the session key | a registered worker, and the leader's leases and revokes to it |
//!
//! Nonces stop replays: a worker registers over a nonce the leader issued
//! moments before for that worker id ([`Challenges`]: stateless, used
//! once); a client's nonce is `<unix ms>.<random>`, refused when more than
//! [`CLOCK_SKEW`] away from the leader's clock (for a submission: from the
//! time the stream stored it) or seen before. A signed submission must
//! carry a `Nats-Msg-Id` (covered), so JetStream's duplicate window drops a
//! replayed one. A session message's nonce is `<unix ms>.<count>`, and
//! each side takes a count once ([`ReplayWindow`]).
//!
//! A registration opens a **session** bound to (credential, worker id).
//! Its key is random, sealed to a curve key the worker made for this
//! registration (nkeys' xkeys), so only that worker learns it even on a
//! NATS where others can listen. Heartbeats, renewals, outcomes and
//! deregistration prove the session; the leader signs leases and revokes
//! with it, so a forged lease is not obeyed. The per-attempt secret the
//! spec asks of a lease is derived, never sent: an outcome is accepted only
//! under the session of the worker the attempt was leased to. Sessions
//! live in the leader's memory: a new leader issues new ones when workers
//! re-register (they do on every new epoch).
//!
//! With `[auth] required = false` (the default, and `cronoq dev`), nothing
//! is checked: every caller is [`Principal::anonymous`].
//!
//! By concern: this file holds roles, principals and what they may do;
//! `proof.rs` proofs, credentials and client nonces; `authenticator.rs`
//! the credentials `[auth]` allows; `nonces.rs` the nonces seen and the
//! registration challenges; `sessions.rs` worker sessions on both sides;
//! `config.rs` the `[auth]` section.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use async_nats::HeaderMap;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use nkeys::{KeyPair, XKey};
use rand::RngCore;
use sha2::{Digest, Sha256};

use crate::core::{ErrorCode, Labels, Millis, PoolName};
use crate::wire::WireError;

mod authenticator;
mod config;
mod nonces;
mod proof;
mod sessions;

pub use authenticator::*;
pub use config::{AuthSection, InlineSecret, NkeySection, TokenSection};
pub use nonces::*;
pub use proof::*;
pub use sessions::*;

/// The header that carries a proof (a wire name, defined in `wire`).
pub use crate::wire::AUTH_HEADER;

/// How far a client's nonce time may be from the leader's clock.
pub const CLOCK_SKEW: Millis = Millis(60_000);

/// How long a registration nonce stays valid.
pub const NONCE_TTL: Millis = Millis(30_000);

/// The most client nonces remembered (each for 2 × [`CLOCK_SKEW`]): about
/// 2,500 signed client requests a second, sustained, and some 50 MB at
/// most; beyond it requests are refused `RESOURCE_EXHAUSTED` until older
/// nonces expire.
pub const MAX_SEEN_NONCES: usize = 300_000;

/// The shortest token accepted in the config.
pub const MIN_TOKEN_LEN: usize = 16;

type HmacSha256 = Hmac<Sha256>;

fn unauthenticated(message: impl Into<String>) -> WireError {
    WireError::new(ErrorCode::UNAUTHENTICATED, message)
}

fn denied(message: impl Into<String>) -> WireError {
    WireError::new(ErrorCode::PERMISSION_DENIED, message)
}

fn invalid(message: impl Into<String>) -> WireError {
    WireError::new(ErrorCode::INVALID_ARGUMENT, message)
}

/// What a credential may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// Registers workers (claiming only its labels, in its pools).
    Worker,
    /// Submits, reads, and cancels its own tasks.
    Submitter,
    /// Reads tasks and snapshots.
    Reader,
    /// Everything.
    Admin,
}

impl FromStr for Role {
    type Err = WireError;
    fn from_str(s: &str) -> Result<Role, WireError> {
        match s {
            "worker" => Ok(Role::Worker),
            "submitter" => Ok(Role::Submitter),
            "reader" => Ok(Role::Reader),
            "admin" => Ok(Role::Admin),
            other => Err(invalid(format!(
                "role {other:?} must be worker, submitter, reader or admin"
            ))),
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Worker => "worker",
            Role::Submitter => "submitter",
            Role::Reader => "reader",
            Role::Admin => "admin",
        })
    }
}

/// One allowed label claim: `name=value`, or `name=*` for any value.
#[derive(Clone, Debug, PartialEq, Eq)]
struct LabelRule {
    name: String,
    value: Option<String>,
}

/// Who is calling, and what the credential allows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    /// `token:<token_env>`, `nkey:<public key>`, or `anonymous`: the owner
    /// recorded on tasks it submits. Never a secret.
    pub name: String,
    /// Its role.
    pub role: Role,
    /// Pools it may use; empty: all.
    pools: Vec<PoolName>,
    /// Labels a worker with it may claim; `None`: any (anonymous only).
    labels: Option<Vec<LabelRule>>,
    /// The most workers it may have registered at once.
    pub max_workers: u32,
    /// The most slots its workers may offer together.
    pub max_slots: u64,
    /// The fairness keys its submissions may carry (SPEC §9): the first is
    /// the default; empty: any (anonymous only).
    fairness: Vec<String>,
}

/// A credential's `max_workers` unless its config says otherwise: one
/// credential must not fill the server's `max_workers` with silent workers.
pub const DEFAULT_MAX_WORKERS_PER_CREDENTIAL: u32 = 1_000;

/// A credential's `max_slots` unless its config says otherwise: what its
/// workers' messages may make the leader do (revokes for attempts a
/// heartbeat lists, at most a worker's slots an interval) is bounded by it.
pub const DEFAULT_MAX_SLOTS_PER_CREDENTIAL: u64 = 10_000;

impl Principal {
    /// Everyone, when auth is off: may do anything.
    pub fn anonymous() -> Principal {
        Principal {
            name: "anonymous".into(),
            role: Role::Admin,
            pools: Vec::new(),
            labels: None,
            max_workers: u32::MAX,
            max_slots: u64::MAX,
            fairness: Vec::new(),
        }
    }

    /// The fairness key a submission of it carries (SPEC §9): the one it
    /// `asked` for if its config entry lists it (`name`, `fairness_keys`),
    /// else `PERMISSION_DENIED`; none asked: its name. Anonymous keeps what
    /// was asked.
    pub fn fairness_key(&self, asked: Option<&str>) -> Result<Option<String>, WireError> {
        let Some(default) = self.fairness.first() else {
            return Ok(asked.map(str::to_string));
        };
        match asked {
            None => Ok(Some(default.clone())),
            Some(key) if self.fairness.iter().any(|k| k == key) => Ok(Some(key.to_string())),
            Some(key) => Err(denied(format!(
                "credential {} may not use the fairness key {}; its config entry lists {}",
                self.name,
                crate::core::excerpt(key),
                self.fairness.join(", ")
            ))),
        }
    }

    fn in_pool(&self, pool: &PoolName) -> Result<(), WireError> {
        if self.pools.is_empty() || self.pools.contains(pool) {
            Ok(())
        } else {
            Err(denied(format!(
                "credential {} may not use pool {pool}",
                self.name
            )))
        }
    }

    /// Whether it may see `pool` at all (snapshots are filtered by it).
    pub fn sees_pool(&self, pool: &PoolName) -> bool {
        self.pools.is_empty() || self.pools.contains(pool)
    }

    fn role_in(&self, roles: &[Role], what: &str) -> Result<(), WireError> {
        if roles.contains(&self.role) {
            Ok(())
        } else {
            Err(denied(format!(
                "credential {} has role {}, which may not {what}",
                self.name, self.role
            )))
        }
    }

    /// May it submit to `pool`? (submitter, admin)
    pub fn may_submit(&self, pool: &PoolName) -> Result<(), WireError> {
        self.role_in(&[Role::Submitter, Role::Admin], "submit tasks")?;
        self.in_pool(pool)
    }

    /// May it read tasks and snapshots (of `pool`)? (reader, submitter, admin)
    pub fn may_read(&self, pool: Option<&PoolName>) -> Result<(), WireError> {
        self.role_in(&[Role::Reader, Role::Submitter, Role::Admin], "read tasks")?;
        pool.map_or(Ok(()), |p| self.in_pool(p))
    }

    /// May it create, change or delete a schedule (whose tasks go to
    /// `pool`)? (admin, or a submitter allowed the pool)
    pub fn may_schedule(&self, pool: Option<&PoolName>) -> Result<(), WireError> {
        self.role_in(&[Role::Submitter, Role::Admin], "manage schedules")?;
        pool.map_or(Ok(()), |p| self.in_pool(p))
    }

    /// May it trigger, backfill, pause, resume or delete a schedule of
    /// `pool` created by `owner`? The rule of tasks (issue 34): an admin
    /// may change any schedule of its pools, a submitter only its own —
    /// the tasks a schedule starts are its owner's, and only their owner
    /// (or an admin) may cancel them, so only they may start or stop them.
    pub fn may_change_schedule(
        &self,
        pool: &PoolName,
        owner: Option<&str>,
    ) -> Result<(), WireError> {
        self.may_schedule(Some(pool))?;
        self.owns(
            owner,
            "did not create this schedule: only its creator or an admin may change it",
        )
    }

    /// Whether it is `owner`, or an admin (`why`: the refusal's words).
    fn owns(&self, owner: Option<&str>, why: &str) -> Result<(), WireError> {
        if self.role == Role::Admin || owner == Some(self.name.as_str()) {
            Ok(())
        } else {
            Err(denied(format!("credential {} {why}", self.name)))
        }
    }

    /// May its role cancel tasks at all? (submitter, admin)
    pub fn may_cancel_some(&self) -> Result<(), WireError> {
        self.role_in(&[Role::Submitter, Role::Admin], "cancel tasks")
    }

    /// May it cancel a task of `pool` submitted by `owner`? An admin may
    /// cancel any task of its pools; a submitter only its own.
    pub fn may_cancel(&self, pool: &PoolName, owner: Option<&str>) -> Result<(), WireError> {
        self.role_in(&[Role::Submitter, Role::Admin], "cancel tasks")?;
        self.in_pool(pool)?;
        self.owns(
            owner,
            "did not submit this task: only its submitter or an admin may cancel it",
        )
    }

    /// May it register a worker in `pool` claiming `labels`? (worker, admin)
    pub fn may_register(&self, pool: &PoolName, labels: &Labels) -> Result<(), WireError> {
        self.role_in(&[Role::Worker, Role::Admin], "register workers")?;
        self.in_pool(pool)?;
        let Some(rules) = &self.labels else {
            return Ok(());
        };
        for (name, value) in labels.iter() {
            let allowed = rules
                .iter()
                .any(|r| r.name == name && r.value.as_deref().map_or(true, |v| v == value));
            if !allowed {
                return Err(denied(format!(
                    "credential {} may not claim the label {name}={value}",
                    self.name
                )));
            }
        }
        Ok(())
    }

    /// The idempotency key as the ledger keeps it: scoped to the owner, so
    /// one credential's key never finds another's task.
    pub fn scoped_key(&self, key: &str) -> String {
        if self.name == "anonymous" {
            key.to_string()
        } else {
            format!("{}\n{key}", self.name)
        }
    }
}

#[cfg(test)]
mod tests;
