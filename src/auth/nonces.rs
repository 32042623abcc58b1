//! Nonces: the client nonces a leader has seen ([`Nonces`]), and registration challenges that keep no state ([`Challenges`]).

use super::*;

/// The client nonces a leader has seen lately (each remembered until it
/// could no longer pass the time check), at most [`MAX_SEEN_NONCES`].
#[derive(Debug, Default)]
pub struct Nonces {
    pub(super) live: HashMap<String, Millis>,
    pub(super) order: VecDeque<(Millis, String)>,
}

impl Nonces {
    pub(super) fn expire(&mut self, now: Millis) {
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
    pub(super) key: [u8; 32],
    /// Per credential: the nonces it redeemed, with when they expire.
    pub(super) used: HashMap<String, VecDeque<(Millis, String)>>,
    /// Every nonce redeemed and not yet expired (at most the sum of the
    /// above).
    pub(super) redeemed: std::collections::HashSet<String>,
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

    pub(super) fn mac(&self, worker_id: &str, issued: &str, random: &str) -> String {
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
