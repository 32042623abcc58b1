//! The credentials `[auth]` allows ([`Authenticator`]): read from the config and the environment, and who a proof names.

use super::*;

/// The credentials the server accepts, from `[auth]`.
#[derive(Clone, Default)]
pub struct Authenticator {
    pub(super) required: bool,
    /// By token id: the token and what it may do.
    pub(super) tokens: HashMap<String, (Arc<str>, Principal)>,
    /// By public key.
    pub(super) nkeys: HashMap<String, Principal>,
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

pub(super) fn grants(
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

/// The fairness keys of a credential entry: its `name` (default
/// `fallback`, its token env or public key) first, then `fairness_keys`,
/// each a valid fairness key.
pub(super) fn fairness_grant(
    at: &str,
    name: Option<&str>,
    fallback: &str,
    keys: &[String],
) -> Result<Vec<String>, WireError> {
    let mut all = vec![name.unwrap_or(fallback).to_string()];
    all.extend(keys.iter().cloned());
    for key in &all {
        crate::core::check_fairness_key(key).map_err(|e| invalid(format!("{at}: {e}")))?;
    }
    Ok(all)
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
            let fairness = fairness_grant(&at, t.name.as_deref(), &t.token_env, &t.fairness_keys)?;
            let id = token_id(&token);
            let principal = Principal {
                name: format!("token:{}", t.token_env),
                role,
                pools,
                labels: Some(labels),
                max_workers: t.max_workers.unwrap_or(DEFAULT_MAX_WORKERS_PER_CREDENTIAL),
                max_slots: t.max_slots.unwrap_or(DEFAULT_MAX_SLOTS_PER_CREDENTIAL),
                fairness,
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
            let fairness =
                fairness_grant(&at, k.name.as_deref(), &pair.public_key(), &k.fairness_keys)?;
            let principal = Principal {
                name: format!("nkey:{}", pair.public_key()),
                role,
                pools,
                labels: Some(labels),
                max_workers: k.max_workers.unwrap_or(DEFAULT_MAX_WORKERS_PER_CREDENTIAL),
                max_slots: k.max_slots.unwrap_or(DEFAULT_MAX_SLOTS_PER_CREDENTIAL),
                fairness,
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

    /// The credential named `name` as the config has it now (`token:<env>`
    /// or `nkey:<public key>`), if it still exists.
    pub fn named(&self, name: &str) -> Option<&Principal> {
        if let Some(key) = name.strip_prefix("nkey:") {
            return self.nkeys.get(key);
        }
        self.tokens
            .values()
            .map(|(_, p)| p)
            .find(|p| p.name == name)
    }

    /// May a schedule owned by `owner` fire a task into `pool` now? Its
    /// rights are the owner's current ones, checked at every fire, not
    /// only when the schedule was made (issue 34): a credential removed
    /// or narrowed in the config stops its schedules' fires at the next
    /// start of the leader. With auth off, always.
    pub fn may_fire(&self, owner: Option<&str>, pool: &PoolName) -> Result<(), WireError> {
        if !self.required {
            return Ok(());
        }
        let Some(owner) = owner else {
            return Err(denied(
                "the schedule has no owner, and credentials are required: it may not fire"
                    .to_string(),
            ));
        };
        let Some(principal) = self.named(owner) else {
            return Err(denied(format!(
                "the schedule's owner {owner} is no longer a credential of this server: it may not fire"
            )));
        };
        principal.may_submit(pool)
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
