//! Who a worker is: generated worker ids and the credentials presented at
//! registration (a token, or an nkey signature over the registration's
//! identity fields). Verifying them is the auth layer's business, not this
//! file's.

use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;

use crate::core::{Labels, Millis, PoolName, Rejection};
use crate::wire::Credentials;

/// The longest host part of a generated id, so that the whole id stays
/// within the 64 characters of a worker id.
const MAX_HOST_LEN: usize = 40;

/// A fresh worker id: `<hostname>-<pid>-<4 random hex>`, the host name
/// cut at its first dot and reduced to `A-Z a-z 0-9 _ -`.
///
/// ```
/// let id = cronoq::worker::generate_worker_id();
/// assert!(cronoq::wire::validate_worker_id(&id).is_ok());
/// assert!(id.contains(&format!("-{}-", std::process::id())));
/// ```
pub fn generate_worker_id() -> String {
    compose_worker_id(&hostname(), std::process::id(), random_u16())
}

pub(super) fn compose_worker_id(host: &str, pid: u32, random: u16) -> String {
    let host = sanitize_host(host);
    format!("{host}-{pid}-{random:04x}")
}

fn sanitize_host(host: &str) -> String {
    let short = host.trim().split('.').next().unwrap_or_default();
    let mut clean: String = short
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .take(MAX_HOST_LEN)
        .collect();
    while clean.ends_with('-') {
        clean.pop();
    }
    if clean.is_empty() {
        "worker".to_string()
    } else {
        clean
    }
}

fn hostname() -> String {
    for path in ["/proc/sys/kernel/hostname", "/etc/hostname"] {
        if let Ok(name) = std::fs::read_to_string(path) {
            if !name.trim().is_empty() {
                return name.trim().to_string();
            }
        }
    }
    std::env::var("HOSTNAME")
        .or_else(|_| std::env::var("COMPUTERNAME"))
        .unwrap_or_default()
}

/// 16 random bits from the standard library's per-process hasher keys,
/// mixed with the clock; enough to tell two workers of one host apart.
fn random_u16() -> u16 {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    let h = hasher.finish();
    (h ^ (h >> 16) ^ (h >> 32) ^ (h >> 48)) as u16
}

/// The bytes a worker signs with its nkey at registration:
/// `{worker_id}|{pool}|{labels}|{signed_at_ms}`, labels as `k=v,k=v`
/// sorted by name (empty for no labels).
///
/// ```
/// use cronoq::core::{Labels, Millis, PoolName};
/// let input = cronoq::worker::signing_input(
///     "w1",
///     &PoolName::new("inference").unwrap(),
///     &Labels::from([("zone", "eu"), ("gpu", "a100")]),
///     Millis(1_700_000_000_000),
/// );
/// assert_eq!(input, "w1|inference|gpu=a100,zone=eu|1700000000000");
/// ```
pub fn signing_input(
    worker_id: &str,
    pool: &PoolName,
    labels: &Labels,
    signed_at: Millis,
) -> String {
    format!("{worker_id}|{pool}|{labels}|{}", signed_at.0)
}

/// The credentials for one registration; a fresh signature each time so
/// the leader may refuse old ones.
pub(super) fn credentials(
    token: Option<&str>,
    signer: Option<&Arc<nkeys::KeyPair>>,
    worker_id: &str,
    pool: &PoolName,
    labels: &Labels,
    now: SystemTime,
) -> Result<Option<Credentials>, Rejection> {
    if token.is_none() && signer.is_none() {
        return Ok(None);
    }
    let mut credentials = Credentials {
        token: token.map(str::to_string),
        ..Credentials::default()
    };
    if let Some(signer) = signer {
        let signed_at = Millis::from_duration(now.duration_since(UNIX_EPOCH).unwrap_or_default());
        let input = signing_input(worker_id, pool, labels, signed_at);
        let signature = signer
            .sign(input.as_bytes())
            .map_err(|e| Rejection::InvalidArgument(format!("signing with the nkey: {e}")))?;
        credentials.nkey = Some(signer.public_key());
        credentials.signature = Some(Bytes::from(signature));
        credentials.signed_at = Some(signed_at);
    }
    Ok(Some(credentials))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::validate_worker_id;

    #[test]
    fn generated_ids_are_valid_subject_tokens() {
        assert_eq!(
            compose_worker_id("gpu-box.example.com", 42, 0xab),
            "gpu-box-42-00ab"
        );
        assert_eq!(compose_worker_id("my box!", 7, 0xffff), "my-box-7-ffff");
        assert_eq!(compose_worker_id("", 7, 1), "worker-7-0001");
        assert_eq!(compose_worker_id("???", 7, 1), "worker-7-0001");
        let long = "h".repeat(100);
        let id = compose_worker_id(&long, u32::MAX, u16::MAX);
        assert!(validate_worker_id(&id).is_ok(), "{id}");
        let id = generate_worker_id();
        assert!(validate_worker_id(&id).is_ok(), "{id}");
        assert_ne!(generate_worker_id(), generate_worker_id());
    }

    #[test]
    fn signature_covers_identity_fields() {
        let pair = Arc::new(nkeys::KeyPair::new_user());
        let pool = PoolName::new("inference").unwrap();
        let labels = Labels::from([("gpu", "a100")]);
        let now = UNIX_EPOCH + std::time::Duration::from_millis(1_234);
        let c = credentials(Some("t0k"), Some(&pair), "w1", &pool, &labels, now)
            .unwrap()
            .unwrap();
        assert_eq!(c.token.as_deref(), Some("t0k"));
        assert_eq!(c.signed_at, Some(Millis(1_234)));
        let public = nkeys::KeyPair::from_public_key(c.nkey.as_deref().unwrap()).unwrap();
        let signature = c.signature.unwrap();
        public
            .verify(b"w1|inference|gpu=a100|1234", &signature)
            .unwrap();
        assert!(public
            .verify(b"w1|inference|gpu=h100|1234", &signature)
            .is_err());

        assert_eq!(
            credentials(None, None, "w1", &pool, &labels, now).unwrap(),
            None
        );
        let token_only = credentials(Some("t"), None, "w1", &pool, &labels, now)
            .unwrap()
            .unwrap();
        assert_eq!(token_only.nkey, None);
        assert_eq!(token_only.signature, None);
    }
}
