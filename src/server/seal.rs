//! Storage that cannot be forged: the leader seals what it stores in
//! JetStream (journal records, start records, the leader record) with the
//! servers' shared storage key, and every reader — a successor taking
//! over, a warm standby, a lookup of a finished task, a follower watching
//! the leader subject — ignores (and logs, and counts) what is unsealed or
//! sealed under another key. So on a NATS where anyone may write the
//! results bucket, a forged result, a record that marks a queued task
//! succeeded, or a leader record naming "evil" changes nothing a server
//! does; they only stop being readable.
//!
//! The key comes from `[server] storage_key_env` (the name of an
//! environment variable holding at least 32 characters, the same on every
//! server). Without it nothing is sealed and everything is read as before;
//! `cronoq server` warns when it runs with `[auth] required = true` and no
//! storage key.
//!
//! A sealed value is `CQS1`, a 32-byte HMAC-SHA256, then the body, the
//! MAC taken over the value's KV key and the body: a sealed record cannot
//! be moved to another task's key. (Someone who can write the bucket can
//! still put back an older sealed value of the same key, or delete one:
//! only NATS permissions stop that — see SECURITY.md.) A MessagePack
//! record never starts with `C` (0x43 is a positive integer, not a map),
//! so sealed and unsealed values are told apart. The leader record is
//! JSON, read by workers too: its seal is a field, `seal`, over its other
//! fields.

use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use crate::core::{ErrorCode, Millis};
use crate::wire::WireError;

type HmacSha256 = Hmac<Sha256>;

/// What a sealed value starts with.
const MAGIC: &[u8; 4] = b"CQS1";
const MAC_LEN: usize = 32;

/// The shortest storage key accepted.
pub const MIN_STORAGE_KEY_LEN: usize = 32;

/// Values refused as unsealed or forged since the process started (the
/// `cronoq_storage_refused_total` counter).
static REFUSED: AtomicU64 = AtomicU64::new(0);

/// How many stored values were refused as unsealed or forged.
pub fn refused_total() -> u64 {
    REFUSED.load(Ordering::Relaxed)
}

/// Why a stored value was not taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// A storage key is set and the value carries no seal.
    Unsealed,
    /// Its seal is not the storage key's (forged, or another key's).
    Forged,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Refused::Unsealed => "not sealed with the servers' storage key",
            Refused::Forged => "sealed under another key (forged)",
        })
    }
}

/// The servers' storage key, or none.
#[derive(Clone, Default)]
pub struct Seal {
    key: Option<[u8; 32]>,
}

impl std::fmt::Debug for Seal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.key.is_some() {
            "Seal(key set)"
        } else {
            "Seal(none)"
        })
    }
}

impl Seal {
    /// No storage key: nothing sealed, everything read.
    pub fn none() -> Seal {
        Seal::default()
    }

    /// A storage key from its secret (at least [`MIN_STORAGE_KEY_LEN`]
    /// characters).
    pub fn from_secret(secret: &str) -> Result<Seal, WireError> {
        if secret.len() < MIN_STORAGE_KEY_LEN {
            return Err(WireError::new(
                ErrorCode::INVALID_ARGUMENT,
                format!(
                    "the storage key is shorter than {MIN_STORAGE_KEY_LEN} characters (openssl rand -hex 32 makes one)"
                ),
            ));
        }
        let digest = Sha256::digest(format!("cronoq-storage-key-v1\n{secret}").as_bytes());
        Ok(Seal {
            key: Some(digest.into()),
        })
    }

    /// From `[server] storage_key_env`, read through `env`.
    pub fn from_env(
        var: Option<&str>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Seal, WireError> {
        let Some(var) = var else {
            return Ok(Seal::none());
        };
        let secret = env(var).unwrap_or_default();
        if secret.is_empty() {
            return Err(WireError::new(
                ErrorCode::INVALID_ARGUMENT,
                format!("[server] storage_key_env: env var {var} is not set"),
            ));
        }
        Seal::from_secret(&secret)
    }

    /// Whether a storage key is set.
    pub fn is_set(&self) -> bool {
        self.key.is_some()
    }

    fn mac(key: &[u8; 32], what: &str, body: &[u8]) -> [u8; MAC_LEN] {
        let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes any key length");
        mac.update(b"cronoq-store-v1\n");
        mac.update(what.as_bytes());
        mac.update(b"\n");
        mac.update(body);
        mac.finalize().into_bytes().into()
    }

    /// The value to store under KV key `kv_key`.
    pub fn seal(&self, kv_key: &str, body: Bytes) -> Bytes {
        let Some(key) = &self.key else {
            return body;
        };
        let mut out = Vec::with_capacity(MAGIC.len() + MAC_LEN + body.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&Seal::mac(key, kv_key, &body));
        out.extend_from_slice(&body);
        out.into()
    }

    /// The body of a value read under `kv_key`, if it may be taken: with
    /// a key set, only when sealed with it (a refusal is counted; the
    /// caller logs it and treats the value as absent).
    pub fn open<'a>(&self, kv_key: &str, stored: &'a [u8]) -> Result<&'a [u8], Refused> {
        let sealed = stored.len() >= MAGIC.len() + MAC_LEN && stored.starts_with(MAGIC);
        let Some(key) = &self.key else {
            // No key here: a sealed value cannot be checked, only read.
            return Ok(if sealed {
                &stored[MAGIC.len() + MAC_LEN..]
            } else {
                stored
            });
        };
        let refused = |why| {
            REFUSED.fetch_add(1, Ordering::Relaxed);
            Err(why)
        };
        if !sealed {
            return refused(Refused::Unsealed);
        }
        let (mac, body) = stored[MAGIC.len()..].split_at(MAC_LEN);
        let expected = Seal::mac(key, kv_key, body);
        if !bool::from(subtle::ConstantTimeEq::ct_eq(&expected[..], mac)) {
            return refused(Refused::Forged);
        }
        Ok(body)
    }

    /// The seal of a leader record's fields (hex), `None` without a key.
    pub fn leader_seal(
        &self,
        id: &str,
        instance: &str,
        (epoch, renewal): (u64, u64),
        resigned: bool,
        http: &str,
    ) -> Option<String> {
        let key = self.key.as_ref()?;
        let mut text = format!("{id}\n{instance}\n{epoch}\n{resigned}\n{http}");
        // Records of servers before the count have none (the same text).
        if renewal > 0 {
            text.push_str(&format!("\n{renewal}"));
        }
        let mac = Seal::mac(key, "_leader", text.as_bytes());
        Some(crate::auth::hex(&mac))
    }

    /// Whether a leader record's `seal` is right (always, without a key);
    /// a wrong one is counted.
    pub fn leader_ok(
        &self,
        seal: Option<&str>,
        id: &str,
        instance: &str,
        epoch: (u64, u64),
        resigned: bool,
        http: &str,
    ) -> bool {
        let Some(expected) = self.leader_seal(id, instance, epoch, resigned, http) else {
            return true;
        };
        let ok = seal.is_some_and(|s| {
            bool::from(subtle::ConstantTimeEq::ct_eq(
                s.as_bytes(),
                expected.as_bytes(),
            ))
        });
        if !ok {
            REFUSED.fetch_add(1, Ordering::Relaxed);
        }
        ok
    }
}

/// What the seal of a schedule fire the leader publishes covers: the
/// subject, `Nats-Msg-Id`, the owner it names, the schedule and tick,
/// when it was sealed and the body.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Fire<'a> {
    pub(crate) subject: &'a str,
    pub(crate) msg_id: &'a str,
    pub(crate) owner: Option<&'a str>,
    pub(crate) schedule: Option<(&'a str, Millis)>,
    pub(crate) sealed_at: Millis,
    pub(crate) body: &'a [u8],
}

impl Seal {
    /// The MAC of a fire: its own domain tag (never a stored value's), each
    /// field length-prefixed, an absent field told from an empty one.
    fn fire_mac(key: &[u8; 32], fire: &Fire<'_>) -> [u8; MAC_LEN] {
        let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes any key length");
        mac.update(b"cronoq-fire-v1\n");
        let mut field = |bytes: Option<&[u8]>| match bytes {
            None => mac.update(&[0]),
            Some(b) => {
                mac.update(&[1]);
                mac.update(&(b.len() as u64).to_be_bytes());
                mac.update(b);
            }
        };
        field(Some(fire.subject.as_bytes()));
        field(Some(fire.msg_id.as_bytes()));
        field(fire.owner.map(str::as_bytes));
        field(fire.schedule.map(|(name, _)| name.as_bytes()));
        field(
            fire.schedule
                .map(|(_, at)| at.0.to_be_bytes())
                .as_ref()
                .map(|b| &b[..]),
        );
        field(Some(&fire.sealed_at.0.to_be_bytes()));
        field(Some(fire.body));
        mac.finalize().into_bytes().into()
    }

    /// The `Nats-Msg-Id` (and idempotency key) of the fire whose
    /// schedule-given key is `key` (`schedule:<name>:<tick ms>`): the key
    /// then 32 hex digits of an HMAC of it under the storage key (its own
    /// domain tag), so the same tick gets the same id from every leader
    /// while nobody without the key can compute it — a client can no
    /// longer claim a tick's id before the leader fires it (issue 34).
    /// `None` without a storage key.
    pub(crate) fn fire_id(&self, key: &str) -> Option<String> {
        let mut mac =
            HmacSha256::new_from_slice(self.key.as_ref()?).expect("HMAC takes any key length");
        mac.update(b"cronoq-fire-id-v1\n");
        mac.update(key.as_bytes());
        let mac: [u8; MAC_LEN] = mac.finalize().into_bytes().into();
        Some(format!("{key}:{}", crate::auth::hex(&mac[..16])))
    }

    /// The seal of a fire (hex), `None` without a storage key.
    pub(crate) fn fire_seal(&self, fire: &Fire<'_>) -> Option<String> {
        let mac = Seal::fire_mac(self.key.as_ref()?, fire);
        Some(crate::auth::hex(&mac))
    }

    /// Whether `seal` is this key's seal of `fire` (constant-time);
    /// never without a storage key.
    pub(crate) fn fire_ok(&self, seal: &str, fire: &Fire<'_>) -> bool {
        self.fire_seal(fire).is_some_and(|expected| {
            bool::from(subtle::ConstantTimeEq::ct_eq(
                seal.as_bytes(),
                expected.as_bytes(),
            ))
        })
    }
}

/// Logs a refused value (`what`: which kind of record).
pub(crate) fn log_refused(what: &str, kv_key: &str, why: Refused) {
    tracing::warn!(key = kv_key, why = %why, "{what} ignored: {why}");
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn a_sealed_value_opens_under_its_key_only() {
        let seal = Seal::from_secret(SECRET).unwrap();
        let other = Seal::from_secret(&format!("{SECRET}x")).unwrap();
        let body = Bytes::from_static(b"\x82record");
        let stored = seal.seal("7", body.clone());
        assert_eq!(seal.open("7", &stored).unwrap(), &body[..]);
        assert_eq!(other.open("7", &stored), Err(Refused::Forged));
        assert_eq!(
            seal.open("8", &stored),
            Err(Refused::Forged),
            "moved to another key"
        );
        assert_eq!(seal.open("7", &body), Err(Refused::Unsealed));
        let mut tampered = stored.to_vec();
        *tampered.last_mut().unwrap() ^= 1;
        assert_eq!(seal.open("7", &tampered), Err(Refused::Forged));
        // Without a key: everything is read, sealed or not.
        assert_eq!(Seal::none().open("7", &stored).unwrap(), &body[..]);
        assert_eq!(Seal::none().open("7", &body).unwrap(), &body[..]);
        assert_eq!(Seal::none().seal("7", body.clone()), body);
    }

    #[test]
    fn a_leader_record_seal_covers_its_fields() {
        let seal = Seal::from_secret(SECRET).unwrap();
        let s = seal.leader_seal("s1", "i", (5, 0), false, "h");
        assert!(seal.leader_ok(s.as_deref(), "s1", "i", (5, 0), false, "h"));
        assert!(!seal.leader_ok(s.as_deref(), "evil", "i", (5, 0), false, "h"));
        assert!(!seal.leader_ok(s.as_deref(), "s1", "i", (99_999_999, 0), false, "h"));
        assert!(!seal.leader_ok(None, "s1", "i", (5, 0), false, "h"));
        assert!(Seal::none().leader_ok(None, "evil", "", (1, 0), false, ""));
    }

    /// A fire's seal covers every field the leader takes from it: change
    /// any, or seal under another key, and it no longer verifies.
    #[test]
    fn a_fire_seal_covers_every_field() {
        let seal = Seal::from_secret(SECRET).unwrap();
        let other = Seal::from_secret(&format!("{SECRET}x")).unwrap();
        let fire = Fire {
            subject: "cronoq.submit.default",
            msg_id: "schedule:nightly:1000",
            owner: Some("token:OPS"),
            schedule: Some(("nightly", Millis(1000))),
            sealed_at: Millis(5000),
            body: b"\x81body",
        };
        let good = seal.fire_seal(&fire).unwrap();
        assert!(seal.fire_ok(&good, &fire));
        assert!(!other.fire_ok(&good, &fire), "another key");
        assert!(!seal.fire_ok(&other.fire_seal(&fire).unwrap(), &fire));
        assert!(
            !Seal::none().fire_ok(&good, &fire),
            "no key: nothing verifies"
        );
        assert_eq!(Seal::none().fire_seal(&fire), None);
        let tampered = [
            Fire {
                subject: "cronoq.submit.gpu",
                ..fire
            },
            Fire {
                msg_id: "schedule:nightly:2000",
                ..fire
            },
            Fire {
                owner: Some("token:EVIL"),
                ..fire
            },
            Fire {
                owner: None,
                ..fire
            },
            Fire {
                schedule: Some(("other", Millis(1000))),
                ..fire
            },
            Fire {
                schedule: Some(("nightly", Millis(2000))),
                ..fire
            },
            Fire {
                schedule: None,
                ..fire
            },
            Fire {
                sealed_at: Millis(5001),
                ..fire
            },
            Fire {
                body: b"\x81bodz",
                ..fire
            },
        ];
        for (i, t) in tampered.iter().enumerate() {
            assert!(!seal.fire_ok(&good, t), "tampered field {i} verified");
        }
        assert!(!seal.fire_ok("", &fire));
        assert!(!seal.fire_ok(&good[..63], &fire));
        // Not a stored value's MAC: the domains differ.
        assert_ne!(
            good,
            seal.leader_seal("s1", "i", (5, 0), false, "h").unwrap(),
        );
    }

    #[test]
    fn a_short_or_unset_key_is_refused() {
        assert!(Seal::from_secret("short").is_err());
        let env = |_: &str| None;
        assert!(Seal::from_env(Some("UNSET"), &env).is_err());
        assert!(!Seal::from_env(None, &env).unwrap().is_set());
    }
}
