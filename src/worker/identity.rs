//! Who a worker is: generated worker ids. (Its credential and session are
//! in [`crate::auth`].)

use std::hash::{BuildHasher, Hasher};
use std::time::{SystemTime, UNIX_EPOCH};

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
}
