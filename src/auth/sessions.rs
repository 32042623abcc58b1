//! Worker sessions: the leader's ([`Sessions`]), bound to (credential, worker id), and the worker's ([`WorkerSession`]); every session message is counted and taken once ([`ReplayWindow`]).

use super::*;

/// Sessions kept before idle ones are forgotten.
pub const MAX_IDLE_SESSIONS: usize = 1024;

/// How many holds (worker timeouts) a session may stay idle once there are
/// more than [`MAX_IDLE_SESSIONS`].
pub const SESSION_IDLE_HOLDS: u64 = 10;

/// A session granted at registration, as the reply carries it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The session id.
    pub id: String,
    /// The session key, sealed to the worker's curve key.
    pub sealed_key: Vec<u8>,
    /// The leader's curve public key (to open it).
    pub server_xkey: String,
}

pub(super) struct Session {
    pub(super) worker_id: String,
    pub(super) principal: String,
    pub(super) key: [u8; 32],
    pub(super) last_used: Millis,
    /// The count of the last message the leader signed to the worker.
    pub(super) sent: u64,
    /// The counts of the worker's messages taken.
    pub(super) received: ReplayWindow,
}

/// How far behind the newest count a session message may arrive and
/// still be taken (once): messages of one session leave one process in
/// order but from several tasks, so a few overtake one another.
pub const REPLAY_WINDOW: u64 = 4096;

/// The counts taken from one sender of a session: every session message
/// carries a count (its nonce is `<unix ms>.<count>`, each side counting
/// from 1), and a count is taken once, and only while it is within
/// [`REPLAY_WINDOW`] of the newest. So a replayed heartbeat, outcome,
/// lease or revoke is refused however long ago the original came,
/// whatever else either side still remembers: its count was taken, or
/// has fallen behind the window.
#[derive(Clone)]
pub struct ReplayWindow {
    pub(super) newest: u64,
    /// Bit `n % REPLAY_WINDOW` set: count `n` (within the window) was taken.
    pub(super) seen: Box<[u64; (REPLAY_WINDOW / 64) as usize]>,
}

impl Default for ReplayWindow {
    fn default() -> Self {
        ReplayWindow {
            newest: 0,
            seen: Box::new([0; (REPLAY_WINDOW / 64) as usize]),
        }
    }
}

impl fmt::Debug for ReplayWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ReplayWindow(newest {})", self.newest)
    }
}

impl ReplayWindow {
    pub(super) fn bit(n: u64) -> (usize, u64) {
        let i = n % REPLAY_WINDOW;
        ((i / 64) as usize, 1u64 << (i % 64))
    }

    /// Takes count `n`: `false` if it was taken before, is 0, or is older
    /// than the window.
    pub fn take(&mut self, n: u64) -> bool {
        if n == 0 {
            return false;
        }
        if n > self.newest {
            if n - self.newest >= REPLAY_WINDOW {
                self.seen.fill(0);
            } else {
                for skipped in self.newest + 1..n {
                    let (word, mask) = Self::bit(skipped);
                    self.seen[word] &= !mask;
                }
            }
            self.newest = n;
            let (word, mask) = Self::bit(n);
            self.seen[word] |= mask;
            return true;
        }
        if self.newest - n >= REPLAY_WINDOW {
            return false;
        }
        let (word, mask) = Self::bit(n);
        if self.seen[word] & mask != 0 {
            return false;
        }
        self.seen[word] |= mask;
        true
    }
}

/// The count in a session nonce (`<unix ms>.<count>`).
pub(super) fn session_count(nonce: &str) -> Option<u64> {
    let (_, count) = nonce.split_once('.')?;
    if count.is_empty() || count.len() > 20 || !count.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    count.parse().ok()
}

/// The leader's worker sessions (one per worker id).
pub struct Sessions {
    pub(super) by_id: HashMap<String, Session>,
    pub(super) by_worker: HashMap<String, String>,
    /// The session an unsettled registration replaced, by worker id.
    pub(super) replaced: HashMap<String, String>,
    pub(super) xkey: XKey,
    /// A worker id stays bound to its credential while its session was
    /// used within this (the worker timeout).
    pub(super) hold: Millis,
}

impl fmt::Debug for Sessions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sessions")
            .field("sessions", &self.by_id.len())
            .finish()
    }
}

impl Sessions {
    /// No sessions; ids stay bound while used within `hold`.
    pub fn new(hold: Millis) -> Sessions {
        Sessions {
            by_id: HashMap::new(),
            by_worker: HashMap::new(),
            replaced: HashMap::new(),
            xkey: XKey::new(),
            hold,
        }
    }

    /// Refuses `PERMISSION_DENIED` when `worker_id` is bound to another
    /// credential's session, used within the hold.
    pub(super) fn may_bind(
        &self,
        worker_id: &str,
        principal: &Principal,
        now: Millis,
    ) -> Result<(), WireError> {
        match self
            .by_worker
            .get(worker_id)
            .and_then(|s| self.by_id.get(s))
        {
            Some(old)
                if old.principal != principal.name
                    && now.0 < old.last_used.0.saturating_add(self.hold.0) =>
            {
                Err(denied(format!(
                    "worker id {worker_id} is in use by another credential"
                )))
            }
            _ => Ok(()),
        }
    }

    /// Opens a session for `worker_id` registered by `principal`; the key
    /// sealed to `worker_xkey`. An id bound to another credential's live
    /// session is refused `PERMISSION_DENIED`; the same credential
    /// registering again replaces its session.
    pub fn open(
        &mut self,
        worker_id: &str,
        principal: &Principal,
        worker_xkey: &str,
        now: Millis,
    ) -> Result<Grant, WireError> {
        let recipient = XKey::from_public_key(worker_xkey)
            .map_err(|e| invalid(format!("the registration's xkey: {e}")))?;
        self.may_bind(worker_id, principal, now)?;
        self.forget_idle(now);
        let key = random_bytes::<32>();
        let sealed_key = self
            .xkey
            .seal(&key, &recipient)
            .map_err(|e| invalid(format!("sealing the session key: {e}")))?;
        let id = format!("s{}", hex(&random_bytes::<12>()));
        // The session it replaces stays valid until the registration is
        // settled (see `settle`): a refused registration must not cut off
        // the worker that holds the id.
        if let Some(old) = self.by_worker.insert(worker_id.to_string(), id.clone()) {
            if let Some(stale) = self.replaced.insert(worker_id.to_string(), old) {
                self.by_id.remove(&stale);
            }
        }
        self.by_id.insert(
            id.clone(),
            Session {
                worker_id: worker_id.to_string(),
                principal: principal.name.clone(),
                key,
                last_used: now,
                sent: 0,
                received: ReplayWindow::default(),
            },
        );
        Ok(Grant {
            id,
            sealed_key,
            server_xkey: self.xkey.public_key(),
        })
    }

    /// Checks that a message on `subject` from `worker_id` proves that
    /// worker's current session.
    pub fn verify(
        &mut self,
        worker_id: &str,
        subject: &str,
        headers: Option<&HeaderMap>,
        body: &[u8],
        now: Millis,
    ) -> Result<(), WireError> {
        let proof = Proof::of(headers)?.ok_or_else(|| {
            unauthenticated(format!(
                "no {AUTH_HEADER} header: register first and prove the session"
            ))
        })?;
        let stale = || unauthenticated("unknown or expired session: register again");
        if proof.scheme != "session" {
            return Err(stale());
        }
        let session = self.by_id.get_mut(&proof.id).ok_or_else(stale)?;
        if session.worker_id != worker_id {
            return Err(denied(format!(
                "this session belongs to another worker than {worker_id}"
            )));
        }
        let input = signing_input("session", &proof.id, &proof.nonce, subject, headers, body);
        if !hmac_verify(&session.key, &input, &proof.proof) {
            return Err(unauthenticated("invalid session proof"));
        }
        check_nonce_time(&proof.nonce, now)?;
        let count = session_count(&proof.nonce)
            .ok_or_else(|| unauthenticated("a session proof's nonce must be <unix ms>.<count>"))?;
        if !session.received.take(count) {
            return Err(unauthenticated(
                "this session message was taken before, or is too old (a replay)",
            ));
        }
        session.last_used = now;
        Ok(())
    }

    /// Signs a message to `worker_id` (a lease or revoke) with its session
    /// key; `false` when it has no session.
    pub fn sign(
        &mut self,
        worker_id: &str,
        subject: &str,
        headers: &mut HeaderMap,
        body: &[u8],
        now: SystemTime,
    ) -> bool {
        let Some(id) = self.by_worker.get(worker_id) else {
            return false;
        };
        let Some(session) = self.by_id.get_mut(id) else {
            return false;
        };
        session.sent += 1;
        session_sign(id, &session.key, now, session.sent, subject, headers, body);
        true
    }

    /// Forgets `worker_id`'s session (deregistered or removed).
    pub fn close(&mut self, worker_id: &str) {
        if let Some(id) = self.by_worker.remove(worker_id) {
            self.by_id.remove(&id);
        }
        if let Some(id) = self.replaced.remove(worker_id) {
            self.by_id.remove(&id);
        }
    }

    /// Forgets sessions idle for [`SESSION_IDLE_HOLDS`] holds (at least a
    /// minute), once there are more than [`MAX_IDLE_SESSIONS`]: workers
    /// that died without deregistering. A worker that was only silent
    /// that long has been removed by the leader anyway and registers again.
    pub(super) fn forget_idle(&mut self, now: Millis) {
        if self.by_id.len() <= MAX_IDLE_SESSIONS {
            return;
        }
        let idle = self.hold.0.saturating_mul(SESSION_IDLE_HOLDS).max(60_000);
        let gone: Vec<String> = self
            .by_id
            .values()
            .filter(|s| now.0 > s.last_used.0.saturating_add(idle))
            .map(|s| s.worker_id.clone())
            .collect();
        for worker_id in gone {
            self.close(&worker_id);
        }
    }

    /// Settles the registration that opened `session_id`: accepted, the
    /// session it replaced ends; refused, `session_id` ends and the one it
    /// replaced (if any) is `worker_id`'s again.
    pub fn settle(&mut self, worker_id: &str, session_id: &str, accepted: bool) {
        let replaced = self.replaced.remove(worker_id);
        if accepted {
            if let Some(old) = replaced {
                self.by_id.remove(&old);
            }
            return;
        }
        self.by_id.remove(session_id);
        if self.by_worker.get(worker_id).map(String::as_str) == Some(session_id) {
            match replaced.filter(|old| self.by_id.contains_key(old)) {
                Some(old) => {
                    self.by_worker.insert(worker_id.to_string(), old);
                }
                None => {
                    self.by_worker.remove(worker_id);
                }
            }
        }
    }

    /// How many sessions are open.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }
}

pub(super) fn session_sign(
    id: &str,
    key: &[u8; 32],
    now: SystemTime,
    count: u64,
    subject: &str,
    headers: &mut HeaderMap,
    body: &[u8],
) {
    let ms = Millis::since_epoch(now).0;
    let nonce = format!("{ms}.{count}");
    let input = signing_input("session", id, &nonce, subject, Some(headers), body);
    let proof = hmac_sign(key, &input);
    headers.insert(
        AUTH_HEADER,
        Proof::header("session", id, &nonce, &proof).as_str(),
    );
}

/// A worker's side of a session: the curve key it registers with, then
/// the session key the leader sealed to it.
pub struct WorkerKeys {
    pub(super) xkey: XKey,
}

impl fmt::Debug for WorkerKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "WorkerKeys({})", self.xkey.public_key())
    }
}

impl Default for WorkerKeys {
    fn default() -> Self {
        WorkerKeys::new()
    }
}

impl WorkerKeys {
    /// A fresh curve key for one registration.
    pub fn new() -> WorkerKeys {
        WorkerKeys { xkey: XKey::new() }
    }

    /// Its public key, sent in the registration.
    pub fn public_key(&self) -> String {
        self.xkey.public_key()
    }

    /// Opens a grant into the session it names.
    pub fn open(&self, grant: &Grant) -> Result<WorkerSession, WireError> {
        let sender = XKey::from_public_key(&grant.server_xkey)
            .map_err(|e| unauthenticated(format!("the leader's xkey: {e}")))?;
        let key = self
            .xkey
            .open(&grant.sealed_key, &sender)
            .map_err(|e| unauthenticated(format!("opening the session key: {e}")))?;
        let key: [u8; 32] = key
            .try_into()
            .map_err(|_| unauthenticated("the session key is not 32 bytes"))?;
        Ok(WorkerSession {
            id: grant.id.clone(),
            key,
            sent: Arc::new(AtomicU64::new(0)),
            received: Arc::new(Mutex::new(ReplayWindow::default())),
        })
    }
}

/// A registered worker's session: signs what it sends, checks what the
/// leader sends it.
#[derive(Clone)]
pub struct WorkerSession {
    pub(super) id: String,
    pub(super) key: [u8; 32],
    /// The count of the last message this worker signed (shared by its
    /// clones: every task of the worker counts on).
    pub(super) sent: Arc<AtomicU64>,
    /// The counts of the leader's messages taken.
    pub(super) received: Arc<Mutex<ReplayWindow>>,
}

impl fmt::Debug for WorkerSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "WorkerSession({})", self.id)
    }
}

impl WorkerSession {
    /// Adds the session proof to a message the worker sends.
    pub fn sign(&self, subject: &str, headers: &mut HeaderMap, body: &[u8]) {
        let count = self.sent.fetch_add(1, Ordering::Relaxed) + 1;
        session_sign(
            &self.id,
            &self.key,
            SystemTime::now(),
            count,
            subject,
            headers,
            body,
        );
    }

    /// Whether a lease or revoke came from the leader of this session, now
    /// (its time within [`CLOCK_SKEW`] of `now`), and for the first time:
    /// a captured lease published again is refused, however many attempts
    /// ran here since ([`ReplayWindow`]).
    pub fn verify(
        &self,
        subject: &str,
        headers: Option<&HeaderMap>,
        body: &[u8],
        now: SystemTime,
    ) -> bool {
        let Ok(Some(proof)) = Proof::of(headers) else {
            return false;
        };
        if proof.scheme != "session" || proof.id != self.id {
            return false;
        }
        let input = signing_input("session", &proof.id, &proof.nonce, subject, headers, body);
        if !hmac_verify(&self.key, &input, &proof.proof) {
            return false;
        }
        let now = Millis::since_epoch(now);
        if check_nonce_time(&proof.nonce, now).is_err() {
            return false;
        }
        let Some(count) = session_count(&proof.nonce) else {
            return false;
        };
        self.received
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take(count)
    }
}
