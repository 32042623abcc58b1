//! The `[auth]` section of the server's config (SPEC §7): the credentials
//! and what each may claim, as the TOML gives them. Read here, below the
//! server, so that `auth` names nothing above it; `server::ServerConfig`
//! holds one.

use serde::Deserialize;

/// `[auth]`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthSection {
    /// False: anonymous access (dev only).
    #[serde(default)]
    pub required: bool,
    /// `[[auth.tokens]]`.
    #[serde(default)]
    pub tokens: Vec<TokenSection>,
    /// `[[auth.nkeys]]`.
    #[serde(default)]
    pub nkeys: Vec<NkeySection>,
}

/// A secret written into the config file: refused, and never printed.
#[derive(Clone, Deserialize)]
#[serde(transparent)]
pub struct InlineSecret(#[allow(dead_code)] String);

impl std::fmt::Debug for InlineSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// `[[auth.tokens]]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenSection {
    /// Env var holding the token (the token itself never sits in the file).
    pub token_env: String,
    /// An inline token: always refused (secrets come only from the
    /// environment); parsed so the refusal can say so.
    #[serde(default)]
    pub token: Option<InlineSecret>,
    /// `worker`, `submitter`, `reader` or `admin`.
    pub role: String,
    /// Pools it may use (empty or `"*"`: all).
    #[serde(default)]
    pub pools: Vec<String>,
    /// Labels a worker with it may claim: `name=value` or `name=*`
    /// (none when empty).
    #[serde(default)]
    pub labels: Vec<String>,
    /// The most workers it may have registered at once (default
    /// [`super::DEFAULT_MAX_WORKERS_PER_CREDENTIAL`]).
    #[serde(default)]
    pub max_workers: Option<u32>,
    /// The most slots its workers may offer together (default
    /// [`super::DEFAULT_MAX_SLOTS_PER_CREDENTIAL`]).
    #[serde(default)]
    pub max_slots: Option<u64>,
    /// Its name as a fairness key (SPEC §9): the key its submissions carry
    /// unless they name another (default: `token_env`).
    #[serde(default)]
    pub name: Option<String>,
    /// Other fairness keys its submissions may name (its `name` always).
    #[serde(default)]
    pub fairness_keys: Vec<String>,
}

/// `[[auth.nkeys]]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NkeySection {
    /// The public key (`U…`).
    pub public_key: String,
    /// An inline seed: always refused (the seed stays with the worker).
    #[serde(default)]
    pub seed: Option<InlineSecret>,
    /// Role.
    pub role: String,
    /// Pools.
    #[serde(default)]
    pub pools: Vec<String>,
    /// Labels it may claim.
    #[serde(default)]
    pub labels: Vec<String>,
    /// The most workers it may have registered at once (default
    /// [`super::DEFAULT_MAX_WORKERS_PER_CREDENTIAL`]).
    #[serde(default)]
    pub max_workers: Option<u32>,
    /// The most slots its workers may offer together (default
    /// [`super::DEFAULT_MAX_SLOTS_PER_CREDENTIAL`]).
    #[serde(default)]
    pub max_slots: Option<u64>,
    /// Its name as a fairness key (default: the public key).
    #[serde(default)]
    pub name: Option<String>,
    /// Other fairness keys its submissions may name.
    #[serde(default)]
    pub fairness_keys: Vec<String>,
}
