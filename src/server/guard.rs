//! The leader's gate: every worker request, client request and submission
//! passes here before it reaches the driver (the rules and the proof
//! scheme are in [`crate::auth`]). With `[auth] required = false` it lets
//! everything through as [`Principal::anonymous`].
//!
//! Per leadership: a new leader starts with no sessions and no nonces;
//! workers register again on the new epoch and get new sessions.

use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use async_nats::HeaderMap;

use super::driver::Registrant;
use super::fires::{self, Claim};
use super::seal::Seal;
use crate::auth::{Authenticator, Challenges, Nonces, Principal, Sessions};
use crate::core::{ErrorCode, Millis, PoolName};
use crate::task::Task;
use crate::wire::{self, ChallengeReply, Register, SessionGrant, Subjects, WireError};

/// Credentials, nonces and sessions of one leadership.
pub(crate) struct Guard {
    auth: Arc<Authenticator>,
    /// Registration challenges (stateless; the nonces redeemed).
    challenges: Mutex<Challenges>,
    /// Client nonces seen.
    nonces: Mutex<Nonces>,
    sessions: Mutex<Sessions>,
    subjects: Subjects,
    /// The servers' storage key: verifies the leader's schedule fires
    /// ([`super::fires`]).
    seal: Seal,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Guard {
    /// A gate for one leadership; a worker id stays bound to its
    /// credential while its session was used within `hold`.
    pub(crate) fn new(auth: Arc<Authenticator>, subjects: Subjects, hold: Millis) -> Guard {
        Guard {
            auth,
            challenges: Mutex::new(Challenges::new()),
            nonces: Mutex::new(Nonces::default()),
            sessions: Mutex::new(Sessions::new(hold)),
            subjects,
            seal: Seal::none(),
        }
    }

    /// The gate with the servers' storage key, so sealed schedule fires
    /// are taken.
    pub(crate) fn with_seal(mut self, seal: Seal) -> Guard {
        self.seal = seal;
        self
    }

    /// Whether credentials are checked.
    pub(crate) fn required(&self) -> bool {
        self.auth.required()
    }

    /// A submission as the stream stored it (at `stored`): verified, the
    /// pool allowed, its owner set and its idempotency key scoped to the
    /// owner. A schedule fire sealed by the leader is taken as it is, its
    /// owner the sealed one; anything else that claims to be a fire (or
    /// comes on a fire subject) is refused `PERMISSION_DENIED` unless
    /// nothing could verify it (no storage key, auth off).
    pub(crate) fn submission(
        &self,
        subject: &str,
        headers: Option<&HeaderMap>,
        body: &[u8],
        stored: Millis,
        pool: &PoolName,
        mut task: Task,
    ) -> Result<Task, WireError> {
        let on_fire_subject = self.subjects.is_fire(subject);
        match fires::claim(
            &self.seal,
            subject,
            headers,
            body,
            task.schedule.as_ref(),
            stored,
        ) {
            // The fire subject carries fires only.
            Claim::None if on_fire_subject => return Err(fires::unverified_fire()),
            Claim::None => {}
            Claim::Sealed { owner } => {
                // A fire shares the pool as its owner's credential would.
                if let Some(p) = owner.as_deref().and_then(|o| self.auth.named(o)) {
                    if let Ok(key) = p.fairness_key(task.fairness_key_name()) {
                        task.fairness_under_auth(key);
                    }
                }
                task.owner = owner;
                return Ok(task);
            }
            Claim::Unverified if self.seal.is_set() || self.required() => {
                return Err(fires::unverified_fire());
            }
            // Nothing can be verified: kept as sent.
            Claim::Unverified => return Ok(task),
        }
        if !self.required() {
            return Ok(task);
        }
        let principal = self.auth.caller(subject, headers, body, stored)?;
        // Without it, JetStream would store a replayed copy as a new
        // submission, and within the nonce's time the copy would run again.
        let has_msg_id = headers
            .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
            .is_some_and(|v| !v.as_str().is_empty());
        if !has_msg_id {
            return Err(WireError::new(
                ErrorCode::UNAUTHENTICATED,
                "a signed submission must carry a Nats-Msg-Id (covered by its proof), so a replayed copy is dropped as a duplicate",
            ));
        }
        principal.may_submit(pool)?;
        // SPEC §9 with auth on: the key is the credential's (or one its
        // entry lists), and only `[[pools.fairness]]` weighs it.
        let key = principal.fairness_key(task.fairness_key_name())?;
        task.fairness_under_auth(key);
        task.idempotency_key = task.idempotency_key.map(|k| principal.scoped_key(&k));
        task.owner = Some(principal.name);
        Ok(task)
    }

    /// The submitter a stored submission's proof names, if it verifies (a
    /// sealed fire's owner for a fire).
    pub(crate) fn owner_of(
        &self,
        subject: &str,
        headers: Option<&HeaderMap>,
        body: &[u8],
        stored: Millis,
    ) -> Option<String> {
        if headers.is_some_and(|h| h.get(fires::FIRE_SEAL_HEADER).is_some()) {
            // A fire (rare): its owner is the sealed one, if it verifies.
            let schedule = wire::decode::<wire::Submit>(body)
                .ok()
                .and_then(|s| wire::schedule_fields(s.schedule, s.scheduled_at).ok())?;
            let claim = fires::claim(
                &self.seal,
                subject,
                headers,
                body,
                schedule.as_ref(),
                stored,
            );
            if let Claim::Sealed { owner } = claim {
                return owner;
            }
            // A fire header no seal verifies on, on a message a credential
            // signed: the signer is who sent it (issue 34, finding 10).
        }
        self.auth
            .caller(subject, headers, body, stored)
            .ok()
            .map(|p| p.name)
    }

    /// The caller of a client request (`P.api.*`), its nonce used up.
    pub(crate) fn client(
        &self,
        subject: &str,
        headers: Option<&HeaderMap>,
        body: &[u8],
        now: Millis,
    ) -> Result<Principal, WireError> {
        if !self.required() {
            return Ok(Principal::anonymous());
        }
        let (principal, nonce) = self.auth.verify(subject, headers, body)?;
        lock(&self.nonces).first_use(&nonce, now)?;
        Ok(principal)
    }

    /// A registration nonce (any worker may ask; with auth off too, so a
    /// worker with a credential hears that no session will come).
    pub(crate) fn challenge(
        &self,
        worker_id: &str,
        now: Millis,
    ) -> Result<ChallengeReply, WireError> {
        Ok(ChallengeReply {
            v: wire::PROTOCOL_VERSION,
            nonce: lock(&self.challenges).issue(worker_id, now),
        })
    }

    /// Checks a registration — the credential's proof over a nonce this
    /// leader issued, its role, pool and label claims, and that the id is
    /// not another credential's — and opens its session (`None`: auth
    /// off). The session opens before the driver sees the registration:
    /// the turn that registers the worker may lease to it at once, and
    /// that lease must already carry the session's proof; settle it with
    /// the driver's answer ([`Guard::settle_session`]).
    pub(crate) fn register(
        &self,
        subject: &str,
        headers: Option<&HeaderMap>,
        body: &[u8],
        r: &Register,
        now: Millis,
    ) -> Result<Option<(SessionGrant, Registrant)>, WireError> {
        if !self.required() {
            return Ok(None);
        }
        let (principal, nonce) = self.auth.verify(subject, headers, body)?;
        lock(&self.challenges).redeem(&nonce, &r.worker_id, &principal.name, now)?;
        principal.may_register(&r.pool, &r.labels)?;
        if r.xkey.is_none() {
            return Err(WireError::new(
                ErrorCode::INVALID_ARGUMENT,
                "a registration with a credential must carry an xkey for its session",
            ));
        }
        let grant = lock(&self.sessions).open(
            &r.worker_id,
            &principal,
            r.xkey.as_deref().unwrap_or_default(),
            now,
        )?;
        Ok(Some((
            SessionGrant {
                id: grant.id,
                sealed_key: grant.sealed_key.into(),
                server_xkey: grant.server_xkey,
            },
            Registrant::of(&principal),
        )))
    }

    /// Checks that a worker request proves `worker_id`'s session.
    pub(crate) fn worker(
        &self,
        worker_id: &str,
        subject: &str,
        headers: Option<&HeaderMap>,
        body: &[u8],
        now: Millis,
    ) -> Result<(), WireError> {
        if !self.required() {
            return Ok(());
        }
        lock(&self.sessions).verify(worker_id, subject, headers, body, now)
    }

    /// Settles the registration that opened `session_id` (see
    /// [`Sessions::settle`]).
    pub(crate) fn settle_session(&self, worker_id: &str, session_id: &str, accepted: bool) {
        lock(&self.sessions).settle(worker_id, session_id, accepted);
    }

    /// Forgets a worker's session (it deregistered).
    pub(crate) fn close(&self, worker_id: &str) {
        if self.required() {
            lock(&self.sessions).close(worker_id);
        }
    }

    /// The headers of a message to a worker (`P.worker.<id>.…`): signed
    /// with its session when auth is on; `None` otherwise.
    pub(crate) fn sign_to_worker(&self, subject: &str, body: &[u8]) -> Option<HeaderMap> {
        if !self.required() {
            return None;
        }
        let worker_id = self.subjects.worker_of(subject)?;
        let mut headers = HeaderMap::new();
        lock(&self.sessions)
            .sign(worker_id, subject, &mut headers, body, SystemTime::now())
            .then_some(headers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Registration nonces and client nonces are kept apart: a busy stream
    /// of signed client requests (more client nonces than registrations
    /// may have outstanding) does not lock workers out of registering.
    #[test]
    fn many_signed_client_requests_do_not_block_registrations() {
        let guard = Guard::new(
            Arc::new(Authenticator::disabled()),
            Subjects::new("cronoq").unwrap(),
            Millis(10_000),
        );
        let at = std::time::SystemTime::now();
        let now = Millis::since_epoch(at);
        for _ in 0..20_000 {
            let nonce = crate::auth::client_nonce(at);
            lock(&guard.nonces).first_use(&nonce, now).unwrap();
        }
        let reply = guard.challenge("w1", now).unwrap();
        lock(&guard.challenges)
            .redeem(&reply.nonce, "w1", "token:W", now)
            .unwrap();
    }
}
