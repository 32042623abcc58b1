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

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use async_nats::HeaderMap;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use nkeys::{KeyPair, XKey};
use rand::RngCore;
use sha2::{Digest, Sha256};

use crate::core::{ErrorCode, Labels, Millis, PoolName};
use crate::wire::WireError;

mod config;
pub use config::{AuthSection, InlineSecret, NkeySection, TokenSection};

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

    /// May its role cancel tasks at all? (submitter, admin)
    pub fn may_cancel_some(&self) -> Result<(), WireError> {
        self.role_in(&[Role::Submitter, Role::Admin], "cancel tasks")
    }

    /// May it cancel a task of `pool` submitted by `owner`? An admin may
    /// cancel any task of its pools; a submitter only its own.
    pub fn may_cancel(&self, pool: &PoolName, owner: Option<&str>) -> Result<(), WireError> {
        self.role_in(&[Role::Submitter, Role::Admin], "cancel tasks")?;
        self.in_pool(pool)?;
        if self.role == Role::Admin || owner == Some(self.name.as_str()) {
            Ok(())
        } else {
            Err(denied(format!(
                "credential {} did not submit this task: only its submitter or an admin may cancel it",
                self.name
            )))
        }
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

/// The id of a token as it appears in proofs: 16 hex digits of its
/// SHA-256; it identifies the token without revealing it.
pub fn token_id(token: &str) -> String {
    let digest = Sha256::digest(format!("cronoq-token-id\n{token}").as_bytes());
    hex(&digest[..8])
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The headers besides `Cronoq-*` that a receiver reads, so a proof
/// covers them: changing one would change the message's meaning
/// (`Content-Type` picks MessagePack or a plain publish, the trace
/// context is carried into the task, `Nats-Msg-Id` de-duplicates).
pub const COVERED_HEADERS: [&str; 4] = ["nats-msg-id", "content-type", "traceparent", "tracestate"];

/// What a proof covers: scheme, id, nonce, subject, the `Cronoq-*`
/// headers but `Cronoq-Auth` and the [`COVERED_HEADERS`] (sorted by
/// name), the body.
pub fn signing_input(
    scheme: &str,
    id: &str,
    nonce: &str,
    subject: &str,
    headers: Option<&HeaderMap>,
    body: &[u8],
) -> Vec<u8> {
    let mut out = format!("cronoq-auth-v1\n{scheme}\n{id}\n{nonce}\n{subject}\n").into_bytes();
    if let Some(headers) = headers {
        let mut covered: Vec<(String, String)> = Vec::new();
        for (name, values) in headers.iter() {
            let name = name.to_string();
            let lower = name.to_ascii_lowercase();
            if (lower.starts_with("cronoq-") && lower != "cronoq-auth")
                || COVERED_HEADERS.contains(&lower.as_str())
            {
                for v in values {
                    covered.push((lower.clone(), v.as_str().to_string()));
                }
            }
        }
        covered.sort();
        for (name, value) in covered {
            out.extend_from_slice(format!("{name}:{value}\n").as_bytes());
        }
    }
    out.push(b'\n');
    out.extend_from_slice(body);
    out
}

fn hmac_sign(key: &[u8], input: &[u8]) -> Vec<u8> {
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(input);
    mac.finalize().into_bytes().to_vec()
}

/// Constant-time check of an HMAC-SHA256 proof.
fn hmac_verify(key: &[u8], input: &[u8], proof: &[u8]) -> bool {
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(input);
    mac.verify_slice(proof).is_ok()
}

/// A fresh client nonce: `<unix ms>.<16 random hex digits>`.
pub fn client_nonce(now: SystemTime) -> String {
    let ms = now
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    format!("{ms}.{}", hex(&random_bytes::<8>()))
}

fn random_bytes<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    bytes
}

/// The time in a client nonce.
fn nonce_time(nonce: &str) -> Option<Millis> {
    let (ms, rest) = nonce.split_once('.')?;
    if rest.is_empty() || rest.len() > 64 {
        return None;
    }
    ms.parse().ok().map(Millis)
}

/// A parsed `Cronoq-Auth` header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Proof {
    /// `token`, `nkey` or `session`.
    pub scheme: String,
    /// Token id, public key or session id.
    pub id: String,
    /// The nonce it was made over.
    pub nonce: String,
    /// The HMAC or signature.
    pub proof: Vec<u8>,
}

impl Proof {
    /// The proof a message carries; `None` without the header.
    pub fn of(headers: Option<&HeaderMap>) -> Result<Option<Proof>, WireError> {
        let Some(value) = headers.and_then(|h| h.get(AUTH_HEADER)) else {
            return Ok(None);
        };
        let text = value.as_str();
        let bad = || unauthenticated(format!("malformed {AUTH_HEADER} header"));
        if text.len() > 1024 {
            return Err(bad());
        }
        let mut parts = text.split(' ');
        let (Some("v1"), Some(scheme), Some(id), Some(nonce), Some(proof), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(bad());
        };
        if id.is_empty() || nonce.is_empty() {
            return Err(bad());
        }
        let proof = B64.decode(proof).map_err(|_| bad())?;
        Ok(Some(Proof {
            scheme: scheme.to_string(),
            id: id.to_string(),
            nonce: nonce.to_string(),
            proof,
        }))
    }

    fn header(scheme: &str, id: &str, nonce: &str, proof: &[u8]) -> String {
        format!("v1 {scheme} {id} {nonce} {}", B64.encode(proof))
    }
}

/// A caller's secret: a token or an nkey seed. Its `Debug` shows no secret.
#[derive(Clone)]
pub enum Credential {
    /// A shared token (the server reads the same from its environment).
    Token(Arc<str>),
    /// An nkey pair (the server knows the public key).
    Nkey(Arc<KeyPair>),
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Credential::Token(t) => write!(f, "Token({})", token_id(t)),
            Credential::Nkey(k) => write!(f, "Nkey({})", k.public_key()),
        }
    }
}

impl Credential {
    /// A token credential.
    pub fn token(token: impl Into<String>) -> Credential {
        Credential::Token(Arc::from(token.into()))
    }

    /// An nkey credential from a user seed (`SU…`).
    pub fn nkey_seed(seed: &str) -> Result<Credential, WireError> {
        let pair = KeyPair::from_seed(seed.trim())
            .map_err(|e| invalid(format!("not an nkey seed: {e}")))?;
        Ok(Credential::Nkey(Arc::new(pair)))
    }

    /// The token in env var `var`.
    pub fn from_token_env(var: &str) -> Result<Credential, WireError> {
        match std::env::var(var) {
            Ok(t) if !t.is_empty() => Ok(Credential::token(t)),
            _ => Err(invalid(format!("env var {var} (the token) is not set"))),
        }
    }

    /// The nkey seed in file `path`.
    pub fn from_seed_file(path: &std::path::Path) -> Result<Credential, WireError> {
        let seed = std::fs::read_to_string(path)
            .map_err(|e| invalid(format!("reading nkey seed {}: {e}", path.display())))?;
        Credential::nkey_seed(&seed)
    }

    fn scheme(&self) -> &'static str {
        match self {
            Credential::Token(_) => "token",
            Credential::Nkey(_) => "nkey",
        }
    }

    /// The id in its proofs: the token id or the public key.
    pub fn id(&self) -> String {
        match self {
            Credential::Token(t) => token_id(t),
            Credential::Nkey(k) => k.public_key(),
        }
    }

    fn sign(&self, input: &[u8]) -> Vec<u8> {
        match self {
            Credential::Token(t) => hmac_sign(t.as_bytes(), input),
            Credential::Nkey(k) => k.sign(input).unwrap_or_default(),
        }
    }

    /// Adds a `Cronoq-Auth` proof over (`nonce`, `subject`, `headers`, `body`).
    pub fn sign_message(&self, nonce: &str, subject: &str, headers: &mut HeaderMap, body: &[u8]) {
        let id = self.id();
        let input = signing_input(self.scheme(), &id, nonce, subject, Some(headers), body);
        let proof = self.sign(&input);
        headers.insert(
            AUTH_HEADER,
            Proof::header(self.scheme(), &id, nonce, &proof).as_str(),
        );
    }

    /// The `Nats-Msg-Id` of a submission with idempotency key `key`:
    /// derived from the credential, so another credential cannot take the
    /// key first in JetStream's duplicate window.
    pub fn msg_id(&self, key: &str) -> String {
        let proof = self.sign(format!("cronoq-idempotency-key\n{key}").as_bytes());
        format!("k-{}", hex(&Sha256::digest(&proof)[..16]))
    }
}

/// The credentials the server accepts, from `[auth]`.
#[derive(Clone, Default)]
pub struct Authenticator {
    required: bool,
    /// By token id: the token and what it may do.
    tokens: HashMap<String, (Arc<str>, Principal)>,
    /// By public key.
    nkeys: HashMap<String, Principal>,
}

impl fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Authenticator")
            .field("required", &self.required)
            .field("tokens", &self.tokens.len())
            .field("nkeys", &self.nkeys.len())
            .finish()
    }
}

fn grants(
    at: &str,
    role: &str,
    pools: &[String],
    labels: &[String],
) -> Result<(Role, Vec<PoolName>, Vec<LabelRule>), WireError> {
    let role: Role = role
        .parse()
        .map_err(|e: WireError| invalid(format!("{at}: {}", e.message)))?;
    let mut pool_names = Vec::new();
    for p in pools {
        if p == "*" {
            pool_names.clear();
            break;
        }
        pool_names.push(PoolName::new(p).map_err(|e| invalid(format!("{at}: pools: {e}")))?);
    }
    let mut rules = Vec::new();
    for l in labels {
        let (name, value) = l
            .split_once('=')
            .ok_or_else(|| invalid(format!("{at}: label {l:?} must be name=value or name=*")))?;
        let value = if value == "*" {
            None
        } else {
            Labels::parse(l).map_err(|e| invalid(format!("{at}: label {l:?}: {e}")))?;
            Some(value.to_string())
        };
        rules.push(LabelRule {
            name: name.to_string(),
            value,
        });
    }
    Ok((role, pool_names, rules))
}

impl Authenticator {
    /// Auth off: everyone is [`Principal::anonymous`].
    pub fn disabled() -> Authenticator {
        Authenticator::default()
    }

    /// From `[auth]`, reading tokens through `env` (`std::env::var` in
    /// the server). Refuses an inline secret, an unset or short token, a
    /// token listed twice, a bad key, role, pool or label, and
    /// `required = true` with no credential at all.
    pub fn from_config(
        config: &AuthSection,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Authenticator, WireError> {
        let mut auth = Authenticator {
            required: config.required,
            ..Authenticator::default()
        };
        for (i, t) in config.tokens.iter().enumerate() {
            let at = format!("[[auth.tokens]] #{} ({})", i + 1, t.token_env);
            if t.token.is_some() {
                return Err(invalid(format!(
                    "{at}: an inline token is refused: secrets come only from the environment; put it in the env var named by token_env"
                )));
            }
            let token = env(&t.token_env).unwrap_or_default();
            if token.is_empty() {
                return Err(invalid(format!("{at}: env var {} is not set", t.token_env)));
            }
            if token.len() < MIN_TOKEN_LEN {
                return Err(invalid(format!(
                    "{at}: the token in {} is shorter than {MIN_TOKEN_LEN} characters",
                    t.token_env
                )));
            }
            let (role, pools, labels) = grants(&at, &t.role, &t.pools, &t.labels)?;
            let id = token_id(&token);
            let principal = Principal {
                name: format!("token:{}", t.token_env),
                role,
                pools,
                labels: Some(labels),
                max_workers: t.max_workers.unwrap_or(DEFAULT_MAX_WORKERS_PER_CREDENTIAL),
                max_slots: t.max_slots.unwrap_or(DEFAULT_MAX_SLOTS_PER_CREDENTIAL),
            };
            if auth
                .tokens
                .insert(id, (Arc::from(token), principal))
                .is_some()
            {
                return Err(invalid(format!(
                    "{at}: the same token is listed twice (give each credential its own token)"
                )));
            }
        }
        for (i, k) in config.nkeys.iter().enumerate() {
            let at = format!("[[auth.nkeys]] #{}", i + 1);
            if k.seed.is_some() {
                return Err(invalid(format!(
                    "{at}: an inline seed is refused: the server needs only public_key; the seed stays with the worker"
                )));
            }
            let pair = KeyPair::from_public_key(&k.public_key)
                .map_err(|e| invalid(format!("{at}: public_key: {e}")))?;
            if !k.public_key.starts_with('U') {
                return Err(invalid(format!(
                    "{at}: public_key must be a user nkey (U…); `cronoq keygen` prints one"
                )));
            }
            let (role, pools, labels) = grants(&at, &k.role, &k.pools, &k.labels)?;
            let principal = Principal {
                name: format!("nkey:{}", pair.public_key()),
                role,
                pools,
                labels: Some(labels),
                max_workers: k.max_workers.unwrap_or(DEFAULT_MAX_WORKERS_PER_CREDENTIAL),
                max_slots: k.max_slots.unwrap_or(DEFAULT_MAX_SLOTS_PER_CREDENTIAL),
            };
            if auth.nkeys.insert(pair.public_key(), principal).is_some() {
                return Err(invalid(format!("{at}: {} is listed twice", k.public_key)));
            }
        }
        if auth.required && auth.tokens.is_empty() && auth.nkeys.is_empty() {
            return Err(invalid(
                "[auth] required = true but no [[auth.tokens]] or [[auth.nkeys]]: nobody could use the server",
            ));
        }
        Ok(auth)
    }

    /// Whether credentials are checked.
    pub fn required(&self) -> bool {
        self.required
    }

    /// The principal of a `token` or `nkey` proof over this message, and
    /// its nonce. Does not look at the nonce's freshness.
    pub fn verify(
        &self,
        subject: &str,
        headers: Option<&HeaderMap>,
        body: &[u8],
    ) -> Result<(Principal, String), WireError> {
        let proof = Proof::of(headers)?.ok_or_else(|| {
            unauthenticated(format!(
                "credentials required: this server has [auth] required = true (CLI: --token-env VAR or --nkey-seed FILE; HTTP: Authorization: Bearer <token>; no {AUTH_HEADER} header came)"
            ))
        })?;
        let input = signing_input(
            &proof.scheme,
            &proof.id,
            &proof.nonce,
            subject,
            headers,
            body,
        );
        let unknown = || unauthenticated("unknown or invalid credential");
        let principal = match proof.scheme.as_str() {
            "token" => {
                let (token, principal) = self.tokens.get(&proof.id).ok_or_else(unknown)?;
                if !hmac_verify(token.as_bytes(), &input, &proof.proof) {
                    return Err(unknown());
                }
                principal.clone()
            }
            "nkey" => {
                let principal = self.nkeys.get(&proof.id).ok_or_else(unknown)?;
                let pair = KeyPair::from_public_key(&proof.id).map_err(|_| unknown())?;
                pair.verify(&input, &proof.proof).map_err(|_| unknown())?;
                principal.clone()
            }
            other => {
                return Err(unauthenticated(format!(
                    "{AUTH_HEADER} scheme {other:?} is not a client credential"
                )))
            }
        };
        Ok((principal, proof.nonce))
    }

    /// The caller of a client request or a submission, its nonce's time
    /// checked against `at` (now, or when the stream stored it):
    /// anonymous when auth is off.
    pub fn caller(
        &self,
        subject: &str,
        headers: Option<&HeaderMap>,
        body: &[u8],
        at: Millis,
    ) -> Result<Principal, WireError> {
        if !self.required {
            return Ok(Principal::anonymous());
        }
        let (principal, nonce) = self.verify(subject, headers, body)?;
        check_nonce_time(&nonce, at)?;
        Ok(principal)
    }
}

/// Refuses a client nonce whose time is more than [`CLOCK_SKEW`] from `at`.
pub fn check_nonce_time(nonce: &str, at: Millis) -> Result<(), WireError> {
    let t = nonce_time(nonce).ok_or_else(|| {
        unauthenticated("the proof's nonce must be <unix ms>.<random> for this message")
    })?;
    if t.0.abs_diff(at.0) > CLOCK_SKEW.0 {
        return Err(unauthenticated(format!(
            "the proof was made {} ms away from the server's time (more than {} ms): check the clock, or this is a replay",
            t.0.abs_diff(at.0),
            CLOCK_SKEW.0
        )));
    }
    Ok(())
}

/// The client nonces a leader has seen lately (each remembered until it
/// could no longer pass the time check), at most [`MAX_SEEN_NONCES`].
#[derive(Debug, Default)]
pub struct Nonces {
    live: HashMap<String, Millis>,
    order: VecDeque<(Millis, String)>,
}

impl Nonces {
    fn expire(&mut self, now: Millis) {
        while let Some((until, _)) = self.order.front() {
            if *until > now {
                break;
            }
            let (until, nonce) = self.order.pop_front().expect("front exists");
            if self.live.get(&nonce) == Some(&until) {
                self.live.remove(&nonce);
            }
        }
    }

    /// A client nonce seen for the first time (and fresh); remembered
    /// until it could no longer pass the time check.
    pub fn first_use(&mut self, nonce: &str, now: Millis) -> Result<(), WireError> {
        check_nonce_time(nonce, now)?;
        self.expire(now);
        if self.live.contains_key(nonce) {
            return Err(unauthenticated("this proof was used before (a replay)"));
        }
        if self.live.len() >= MAX_SEEN_NONCES {
            return Err(WireError::new(
                ErrorCode::RESOURCE_EXHAUSTED,
                "too many requests; retry in a few seconds",
            ));
        }
        let until = now.plus(CLOCK_SKEW).plus(CLOCK_SKEW);
        self.live.insert(nonce.to_string(), until);
        self.order.push_back((until, nonce.to_string()));
        Ok(())
    }
}

/// The most registrations one credential may make within [`NONCE_TTL`]:
/// a further one is refused `RESOURCE_EXHAUSTED` for that credential
/// alone.
pub const MAX_REGISTRATIONS_PER_CREDENTIAL: usize = 4096;

/// Registration challenges. A challenge keeps no state: its nonce is
/// `n<unix ms>.<random>.<mac>`, the MAC (keyed with this leadership's
/// secret) binding the time and the worker id it was asked for. So any
/// number of challenges, under any number of worker ids, costs the leader
/// nothing to remember and locks nobody out. A nonce is used once: a
/// registration that verifies (which takes a credential) records it until
/// it expires, at most [`MAX_REGISTRATIONS_PER_CREDENTIAL`] per credential.
pub struct Challenges {
    key: [u8; 32],
    /// Per credential: the nonces it redeemed, with when they expire.
    used: HashMap<String, VecDeque<(Millis, String)>>,
    /// Every nonce redeemed and not yet expired (at most the sum of the
    /// above).
    redeemed: std::collections::HashSet<String>,
}

impl fmt::Debug for Challenges {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Challenges")
            .field("credentials", &self.used.len())
            .finish()
    }
}

impl Default for Challenges {
    fn default() -> Self {
        Challenges::new()
    }
}

impl Challenges {
    /// Challenges under a fresh secret (one per leadership).
    pub fn new() -> Challenges {
        Challenges {
            key: random_bytes::<32>(),
            used: HashMap::new(),
            redeemed: std::collections::HashSet::new(),
        }
    }

    fn mac(&self, worker_id: &str, issued: &str, random: &str) -> String {
        let input = format!("cronoq-challenge\n{worker_id}\n{issued}\n{random}");
        hex(&hmac_sign(&self.key, input.as_bytes())[..16])
    }

    /// A fresh registration nonce for `worker_id`, valid once for
    /// [`NONCE_TTL`].
    pub fn issue(&self, worker_id: &str, now: Millis) -> String {
        let issued = now.0.to_string();
        let random = hex(&random_bytes::<8>());
        let mac = self.mac(worker_id, &issued, &random);
        format!("n{issued}.{random}.{mac}")
    }

    /// Uses up a nonce this leadership issued for `worker_id`, in a
    /// registration by `credential` (whose proof has verified).
    pub fn redeem(
        &mut self,
        nonce: &str,
        worker_id: &str,
        credential: &str,
        now: Millis,
    ) -> Result<(), WireError> {
        // Not UNAUTHENTICATED: a new leader does not know the old one's
        // nonces, and the worker should just ask again.
        let unknown = || {
            WireError::new(
                ErrorCode::FAILED_PRECONDITION,
                "unknown, used or expired registration nonce (ask for a new challenge)",
            )
        };
        let mut parts = nonce.strip_prefix('n').unwrap_or("").split('.');
        let (Some(issued), Some(random), Some(mac), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(unknown());
        };
        let expected = self.mac(worker_id, issued, random);
        if !bool::from(subtle::ConstantTimeEq::ct_eq(
            expected.as_bytes(),
            mac.as_bytes(),
        )) {
            return Err(unknown());
        }
        let issued = Millis(issued.parse().map_err(|_| unknown())?);
        let until = issued.plus(NONCE_TTL);
        if until <= now || issued.0 > now.0.saturating_add(CLOCK_SKEW.0) {
            return Err(unknown());
        }
        for used in self.used.values_mut() {
            while used.front().is_some_and(|(u, _)| *u <= now) {
                if let Some((_, gone)) = used.pop_front() {
                    self.redeemed.remove(&gone);
                }
            }
        }
        self.used.retain(|_, u| !u.is_empty());
        if self.redeemed.contains(nonce) {
            return Err(unknown());
        }
        let used = self.used.entry(credential.to_string()).or_default();
        if used.len() >= MAX_REGISTRATIONS_PER_CREDENTIAL {
            return Err(WireError::new(
                ErrorCode::RESOURCE_EXHAUSTED,
                format!(
                    "credential {credential} registered {} workers in the last {} s; retry in a few seconds",
                    used.len(),
                    NONCE_TTL.0 / 1000
                ),
            ));
        }
        used.push_back((until, nonce.to_string()));
        self.redeemed.insert(nonce.to_string());
        Ok(())
    }
}

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

struct Session {
    worker_id: String,
    principal: String,
    key: [u8; 32],
    last_used: Millis,
    /// The count of the last message the leader signed to the worker.
    sent: u64,
    /// The counts of the worker's messages taken.
    received: ReplayWindow,
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
    newest: u64,
    /// Bit `n % REPLAY_WINDOW` set: count `n` (within the window) was taken.
    seen: Box<[u64; (REPLAY_WINDOW / 64) as usize]>,
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
    fn bit(n: u64) -> (usize, u64) {
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
fn session_count(nonce: &str) -> Option<u64> {
    let (_, count) = nonce.split_once('.')?;
    if count.is_empty() || count.len() > 20 || !count.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    count.parse().ok()
}

/// The leader's worker sessions (one per worker id).
pub struct Sessions {
    by_id: HashMap<String, Session>,
    by_worker: HashMap<String, String>,
    /// The session an unsettled registration replaced, by worker id.
    replaced: HashMap<String, String>,
    xkey: XKey,
    /// A worker id stays bound to its credential while its session was
    /// used within this (the worker timeout).
    hold: Millis,
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
    fn may_bind(
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
    fn forget_idle(&mut self, now: Millis) {
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

fn session_sign(
    id: &str,
    key: &[u8; 32],
    now: SystemTime,
    count: u64,
    subject: &str,
    headers: &mut HeaderMap,
    body: &[u8],
) {
    let ms = now
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
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
    xkey: XKey,
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
    id: String,
    key: [u8; 32],
    /// The count of the last message this worker signed (shared by its
    /// clones: every task of the worker counts on).
    sent: Arc<AtomicU64>,
    /// The counts of the leader's messages taken.
    received: Arc<Mutex<ReplayWindow>>,
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
        let now = Millis(
            now.duration_since(UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        );
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

#[cfg(test)]
mod tests;
