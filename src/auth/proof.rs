//! Proofs: what a proof covers ([`signing_input`]), the `Cronoq-Auth` header ([`Proof`]), a caller's secret ([`Credential`]), client nonces and their time.

use super::*;

/// The id of a token as it appears in proofs: 16 hex digits of its
/// SHA-256; it identifies the token without revealing it.
pub fn token_id(token: &str) -> String {
    let digest = Sha256::digest(format!("cronoq-token-id\n{token}").as_bytes());
    hex(&digest[..8])
}

/// Lower-case hex of `bytes`: one allocation, no formatting machinery
/// (it runs for every client nonce and every seal).
pub(crate) fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    push_hex(&mut out, bytes);
    out
}

/// Appends the lower-case hex of `bytes` to `out`.
pub(crate) fn push_hex(out: &mut String, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for &b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
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

pub(super) fn hmac_sign(key: &[u8], input: &[u8]) -> Vec<u8> {
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(input);
    mac.finalize().into_bytes().to_vec()
}

/// Constant-time check of an HMAC-SHA256 proof.
pub(super) fn hmac_verify(key: &[u8], input: &[u8], proof: &[u8]) -> bool {
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(input);
    mac.verify_slice(proof).is_ok()
}

/// A fresh client nonce: `<unix ms>.<16 random hex digits>`.
///
/// The random part comes from [`rand::rngs::ThreadRng`]: a ChaCha
/// CSPRNG per thread, seeded (and periodically reseeded) from the OS, so
/// a nonce stays unpredictable without a `getrandom` syscall per call.
pub fn client_nonce(now: SystemTime) -> String {
    use std::fmt::Write as _;
    let ms = Millis::since_epoch(now).0;
    let mut random = [0u8; 8];
    rand::thread_rng().fill_bytes(&mut random);
    // 13 digits of ms for centuries, the dot, 16 hex digits.
    let mut nonce = String::with_capacity(32);
    let _ = write!(nonce, "{ms}.");
    push_hex(&mut nonce, &random);
    nonce
}

pub(super) fn random_bytes<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    bytes
}

/// The time in a client nonce.
pub(super) fn nonce_time(nonce: &str) -> Option<Millis> {
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

    pub(super) fn header(scheme: &str, id: &str, nonce: &str, proof: &[u8]) -> String {
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

    pub(super) fn scheme(&self) -> &'static str {
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

    pub(super) fn sign(&self, input: &[u8]) -> Vec<u8> {
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
