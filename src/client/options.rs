//! [`ClientOptions`]: where and how a [`Client`] or [`HttpClient`]
//! connects (prefix, timeouts, payload limit, credentials, NATS login).

use std::fmt;
use std::time::Duration;

use super::{invalid, Client, Error, HttpClient, Refusals, DEFAULT_MAX_PAYLOAD_BYTES};
use crate::auth::Credential;
use crate::wire::{self, Subjects};

/// Options of a [`Client`] (and of an [`HttpClient`]).
///
/// ```no_run
/// # async fn f() -> Result<(), cronoq::client::Error> {
/// use std::time::Duration;
/// let client = cronoq::client::ClientOptions::new()
///     .prefix("cronoq")
///     .request_timeout(Duration::from_secs(5))
///     .connect("nats://127.0.0.1:4222")
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ClientOptions {
    pub(super) prefix: String,
    pub(super) nats_token: Option<String>,
    pub(super) credential: Option<Credential>,
    pub(super) request_timeout: Duration,
    pub(super) max_payload_bytes: usize,
    pub(super) wait_poll_interval: Option<Duration>,
    pub(super) login: wire::NatsLogin,
}

impl fmt::Debug for ClientOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientOptions")
            .field("prefix", &self.prefix)
            .field(
                "nats_token",
                &self.nats_token.as_ref().map(|_| "<redacted>"),
            )
            .field("credential", &self.credential)
            .field("request_timeout", &self.request_timeout)
            .field("max_payload_bytes", &self.max_payload_bytes)
            .field("wait_poll_interval", &self.wait_poll_interval)
            .field("login", &self.login)
            .finish()
    }
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            prefix: "cronoq".into(),
            nats_token: None,
            credential: None,
            request_timeout: Duration::from_secs(5),
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
            wait_poll_interval: None,
            login: wire::NatsLogin::new(),
        }
    }
}

impl ClientOptions {
    /// The defaults: prefix `cronoq`, no credential, 5 s requests, 1 MiB payloads.
    pub fn new() -> ClientOptions {
        ClientOptions::default()
    }

    /// The subject prefix of the installation (default `cronoq`).
    pub fn prefix(mut self, prefix: impl Into<String>) -> ClientOptions {
        self.prefix = prefix.into();
        self
    }

    /// The cronoq credential to act as: every request and submission
    /// proves it (see the module docs). Replaces any credential given
    /// before.
    ///
    /// ```
    /// use cronoq::auth::Credential;
    /// let options = cronoq::client::ClientOptions::new()
    ///     .credential(Credential::token("submitter-token-0123456789"));
    /// assert!(!format!("{options:?}").contains("submitter-token"));
    /// ```
    pub fn credential(mut self, credential: Credential) -> ClientOptions {
        self.credential = Some(credential);
        self
    }

    /// A cronoq token credential (`[[auth.tokens]]`): the same as
    /// `credential(Credential::token(token))`. Over HTTP it is the
    /// `Authorization: Bearer` token. Not the NATS connection token (that
    /// is [`ClientOptions::nats_token`]). Never logged.
    pub fn token(self, token: impl Into<String>) -> ClientOptions {
        self.credential(Credential::token(token))
    }

    /// The cronoq token credential held by env var `var` (what
    /// `--token-env` names); `INVALID_ARGUMENT` when it is unset or empty.
    ///
    /// ```
    /// let e = cronoq::client::ClientOptions::new()
    ///     .token_env("CRONOQ_DOCTEST_UNSET_VAR")
    ///     .unwrap_err();
    /// assert_eq!(e.code(), cronoq::core::ErrorCode::INVALID_ARGUMENT);
    /// ```
    pub fn token_env(self, var: &str) -> Result<ClientOptions, Error> {
        let credential = Credential::from_token_env(var).map_err(invalid)?;
        Ok(self.credential(credential))
    }

    /// The cronoq nkey credential of a user seed (`SU…`, as `cronoq keygen`
    /// prints it); `INVALID_ARGUMENT` when it is not one. NATS only: the
    /// HTTP API takes tokens.
    pub fn nkey_seed(self, seed: &str) -> Result<ClientOptions, Error> {
        let credential = Credential::nkey_seed(seed).map_err(invalid)?;
        Ok(self.credential(credential))
    }

    /// The cronoq nkey credential whose seed is in the file at `path`
    /// (what `--nkey-seed` names); `INVALID_ARGUMENT` when it cannot be
    /// read or holds no seed.
    pub fn nkey_seed_file(self, path: impl AsRef<std::path::Path>) -> Result<ClientOptions, Error> {
        let credential = Credential::from_seed_file(path.as_ref()).map_err(invalid)?;
        Ok(self.credential(credential))
    }

    /// The NATS connection token: what the NATS server asks of a
    /// connection (its `authorization { token }`), not a cronoq
    /// credential. Unused over HTTP. Never logged.
    pub fn nats_token(mut self, token: impl Into<String>) -> ClientOptions {
        self.nats_token = Some(token.into());
        self
    }

    /// NATS credentials: a `.creds` file (user JWT and seed) or a file
    /// holding an nkey user seed (`SU…`). Read when connecting; a missing
    /// or malformed file is `INVALID_ARGUMENT`, a login NATS refuses
    /// `UNAUTHENTICATED`. Over HTTP it is not used.
    pub fn nats_creds(mut self, path: impl Into<std::path::PathBuf>) -> ClientOptions {
        self.login = self.login.creds(path);
        self
    }

    /// The inbox prefix of the NATS connection (replaces `_INBOX`), where
    /// replies to this client arrive: with per-user inboxes
    /// (`deploy/nats/auth.conf`), the prefix this user may subscribe to,
    /// e.g. `_INBOX.submitter`.
    pub fn inbox_prefix(mut self, prefix: impl Into<String>) -> ClientOptions {
        self.login = self.login.inbox_prefix(prefix);
        self
    }

    /// Credentials and inbox prefix at once (replacing both).
    pub fn nats_login(mut self, login: wire::NatsLogin) -> ClientOptions {
        self.login = login;
        self
    }

    /// How long to wait for an answer (and for a connection).
    pub fn request_timeout(mut self, timeout: Duration) -> ClientOptions {
        self.request_timeout = timeout;
        self
    }

    /// The largest payload to send (the server's limit may be lower).
    pub fn max_payload_bytes(mut self, n: usize) -> ClientOptions {
        self.max_payload_bytes = n;
        self
    }

    /// How often `wait` looks the task up (default: every 2 s over NATS,
    /// beside the events; every 500 ms over HTTP).
    pub fn wait_poll_interval(mut self, interval: Duration) -> ClientOptions {
        self.wait_poll_interval = Some(interval);
        self
    }

    /// Connects to NATS at `url`.
    pub async fn connect(self, url: &str) -> Result<Client, Error> {
        let subjects = Subjects::new(&self.prefix)?;
        let refusals = Refusals::default();
        let recorder = refusals.clone();
        let mut options = self
            .login
            .load()?
            .options()
            .name("cronoq-client")
            .event_callback(move |event| {
                let recorder = recorder.clone();
                async move {
                    if let async_nats::Event::ServerError(e) = event {
                        tracing::warn!(error = %e, "nats-server reported an error on this connection");
                        recorder.record(e.to_string());
                    }
                }
            })
            .connection_timeout(self.request_timeout)
            .request_timeout(Some(self.request_timeout));
        if let Some(token) = &self.nats_token {
            options = options.token(token.clone());
        }
        let nats = options
            .connect(wire::server_list(url))
            .await
            .map_err(|source| Error::Connect {
                url: url.to_string(),
                source,
            })?;
        Ok(Client {
            nats,
            submit_stream: subjects.submit_stream().into(),
            subjects,
            url: url.to_string(),
            credential: self.credential,
            request_timeout: self.request_timeout,
            max_payload_bytes: self.max_payload_bytes,
            wait_poll_interval: self.wait_poll_interval.unwrap_or(Duration::from_secs(2)),
            inbox_prefix: self.login.inbox().unwrap_or("_INBOX").to_string(),
            refusals,
            server_max: Default::default(),
        })
    }

    /// An [`HttpClient`] for the HTTP API at `url` (`http://host:port`).
    pub fn http(self, url: &str) -> Result<HttpClient, Error> {
        HttpClient::with_options(url, self)
    }
}
