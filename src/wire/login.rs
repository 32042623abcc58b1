//! How a cronoq process logs in to NATS: a credentials file and a private
//! inbox prefix. One helper for `cronoq server`, `cronoq worker` and the
//! clients (`--nats-creds`, `--nats-inbox-prefix`; `[server] nats_creds`,
//! `nats_inbox_prefix`; [`crate::client::ClientOptions::nats_creds`]).
//!
//! The file is either
//! - a NATS `.creds` file (a user JWT and its nkey seed, as `nsc` writes
//!   it): the connection presents the JWT and signs the server's nonce
//!   (`ConnectOptions::jwt`, as `ConnectOptions::credentials_file` does);
//! - or a file holding only an nkey user seed (`SU…`, as `cronoq keygen
//!   --seed-file` writes it): an nkey user of a nats-server config file
//!   (`ConnectOptions::nkey`).
//!
//! The inbox prefix replaces `_INBOX`, so replies to this process arrive
//! under `<prefix>.…` only; with `deploy/nats/auth.conf` each user may
//! subscribe to its own prefix alone, so nobody reads another's replies.
//!
//! A missing, unreadable or malformed file, or a malformed prefix, is
//! `INVALID_ARGUMENT` before anything connects. The seed is never logged
//! nor quoted in an error.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::core::Rejection;

/// How long a lost connection waits before its `attempts`-th reconnect:
/// none for the first two, then doubling from 2 ms, at most
/// [`RECONNECT_MAX_DELAY`]. async-nats's default doubles up to 4 s, so a
/// connection that failed a dozen times while nats-server restarted (in
/// half a second) could wait seconds more after it was back: past a
/// worker's lease (a leader's replies held back, attempts lost on a live
/// worker; `tests/chaos.rs` saw a 5.6 s gap after a 620 ms restart). A
/// refused connect to a server that is down costs it little; every
/// process of a cronoq deployment retries at most 4 times a second.
pub fn reconnect_delay(attempts: usize) -> std::time::Duration {
    let ms = match attempts {
        0 | 1 => 0,
        n => 1u64 << (n - 1).min(16),
    };
    std::time::Duration::from_millis(ms).min(RECONNECT_MAX_DELAY)
}

/// The longest wait between two reconnects (see [`reconnect_delay`]).
pub const RECONNECT_MAX_DELAY: std::time::Duration = std::time::Duration::from_millis(250);

/// The longest inbox prefix accepted.
const MAX_INBOX_PREFIX: usize = 128;

/// Where a process finds its NATS credentials and which inbox prefix it
/// uses; both optional (none: an anonymous connection with `_INBOX`).
///
/// ```
/// use cronoq::wire::NatsLogin;
/// let login = NatsLogin::new().inbox_prefix("_INBOX.reader");
/// assert!(login.load().is_ok());
/// let bad = NatsLogin::new().creds("/nonexistent/cronoq.creds");
/// assert_eq!(bad.load().unwrap_err().code(), cronoq::core::ErrorCode::INVALID_ARGUMENT);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NatsLogin {
    creds: Option<PathBuf>,
    inbox_prefix: Option<String>,
}

/// A [`NatsLogin`] read and checked: ready to configure connections (the
/// server reconnects with it until NATS answers; the file is read once).
#[derive(Clone)]
pub struct LoadedLogin {
    auth: Option<Auth>,
    inbox_prefix: Option<String>,
}

#[derive(Clone)]
enum Auth {
    /// A `.creds` file: the user JWT and the key that signs the nonce.
    Jwt {
        jwt: String,
        key: Arc<nkeys::KeyPair>,
    },
    /// An nkey user seed.
    Seed(String),
}

impl fmt::Debug for LoadedLogin {
    // The seed stays out of logs and panics.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let auth = match &self.auth {
            None => "none",
            Some(Auth::Jwt { .. }) => "user JWT (creds file)",
            Some(Auth::Seed(_)) => "nkey",
        };
        f.debug_struct("LoadedLogin")
            .field("auth", &auth)
            .field("inbox_prefix", &self.inbox_prefix)
            .finish()
    }
}

impl NatsLogin {
    /// No credentials, the default inbox prefix.
    pub fn new() -> NatsLogin {
        NatsLogin::default()
    }

    /// The credentials file: a `.creds` file or an nkey user seed file.
    pub fn creds(mut self, path: impl Into<PathBuf>) -> NatsLogin {
        self.creds = Some(path.into());
        self
    }

    /// The inbox prefix (replaces `_INBOX`): subject tokens separated by
    /// dots, no wildcards, e.g. `_INBOX.submitter`.
    pub fn inbox_prefix(mut self, prefix: impl Into<String>) -> NatsLogin {
        self.inbox_prefix = Some(prefix.into());
        self
    }

    /// The credentials file, if any.
    pub fn creds_path(&self) -> Option<&Path> {
        self.creds.as_deref()
    }

    /// The inbox prefix, if any.
    pub fn inbox(&self) -> Option<&str> {
        self.inbox_prefix.as_deref()
    }

    /// Reads and checks the file and the prefix (`INVALID_ARGUMENT`).
    pub fn load(&self) -> Result<LoadedLogin, Rejection> {
        if let Some(prefix) = &self.inbox_prefix {
            check_inbox_prefix(prefix)?;
        }
        let auth = self.creds.as_deref().map(read_creds).transpose()?;
        Ok(LoadedLogin {
            auth,
            inbox_prefix: self.inbox_prefix.clone(),
        })
    }
}

impl LoadedLogin {
    /// Fresh connect options that log in this way, reconnecting as
    /// [`reconnect_delay`] says.
    pub fn options(&self) -> async_nats::ConnectOptions {
        let mut options =
            async_nats::ConnectOptions::new().reconnect_delay_callback(reconnect_delay);
        if let Some(prefix) = &self.inbox_prefix {
            options = options.custom_inbox_prefix(prefix);
        }
        match &self.auth {
            None => options,
            Some(Auth::Seed(seed)) => options.nkey(seed.clone()),
            Some(Auth::Jwt { jwt, key }) => {
                let key = key.clone();
                options.jwt(jwt.clone(), move |nonce| {
                    let key = key.clone();
                    async move {
                        key.sign(&nonce)
                            .map_err(|e| async_nats::AuthError::new(e.to_string()))
                    }
                })
            }
        }
    }

    /// Whether a credential is presented.
    pub fn has_credentials(&self) -> bool {
        self.auth.is_some()
    }
}

/// Checks an inbox prefix: 1-128 characters, dot-separated non-empty
/// tokens of printable ASCII without `*` or `>`.
pub fn check_inbox_prefix(prefix: &str) -> Result<(), Rejection> {
    let ok = !prefix.is_empty()
        && prefix.len() <= MAX_INBOX_PREFIX
        && prefix.split('.').all(|token| {
            !token.is_empty()
                && token
                    .bytes()
                    .all(|b| b.is_ascii_graphic() && b != b'*' && b != b'>')
        });
    if ok {
        Ok(())
    } else {
        Err(Rejection::InvalidArgument(format!(
            "NATS inbox prefix {} must be 1-{MAX_INBOX_PREFIX} characters of dot-separated \
             subject tokens without wildcards (e.g. _INBOX.submitter)",
            crate::core::excerpt(prefix)
        )))
    }
}

fn read_creds(path: &Path) -> Result<Auth, Rejection> {
    let shown = path.display();
    let invalid =
        |why: String| Rejection::InvalidArgument(format!("NATS credentials file {shown}: {why}"));
    let text =
        std::fs::read_to_string(path).map_err(|e| invalid(format!("cannot read it: {e}")))?;
    if text.contains("BEGIN NATS USER JWT") {
        let (jwt, seed) = decorated_blocks(&text).ok_or_else(|| {
            invalid(
                "a creds file must hold a user JWT block followed by a user nkey seed block".into(),
            )
        })?;
        if jwt.split('.').count() != 3 {
            return Err(invalid("its user JWT is malformed".into()));
        }
        let key = user_key(seed).map_err(invalid)?;
        return Ok(Auth::Jwt {
            jwt: jwt.to_string(),
            key: Arc::new(key),
        });
    }
    let seed = text.trim();
    if seed.is_empty() || seed.contains(char::is_whitespace) {
        return Err(invalid(
            "it is neither a NATS creds file (-----BEGIN NATS USER JWT-----…) nor a file \
             holding only an nkey user seed (SU…, as `cronoq keygen --seed-file` writes)"
                .into(),
        ));
    }
    user_key(seed).map_err(invalid)?;
    Ok(Auth::Seed(seed.to_string()))
}

/// The key pair of a user seed (`SU…`), or why not.
fn user_key(seed: &str) -> Result<nkeys::KeyPair, String> {
    let key =
        nkeys::KeyPair::from_seed(seed).map_err(|e| format!("its nkey seed is not valid ({e})"))?;
    if key.key_pair_type() != nkeys::KeyPairType::User {
        return Err(format!(
            "its nkey seed is a {:?} seed; NATS users log in with a user seed (SU…)",
            key.key_pair_type()
        ));
    }
    Ok(key)
}

/// The first two values of `-----BEGIN …-----` / `------END …------`
/// blocks: the JWT and the seed of a creds file.
fn decorated_blocks(text: &str) -> Option<(&str, &str)> {
    let mut values = Vec::new();
    let mut lines = text.lines().map(str::trim);
    while let Some(line) = lines.next() {
        if line.starts_with("---") && line.contains("BEGIN") {
            let value = lines.by_ref().find(|l| !l.is_empty())?;
            if value.starts_with("---") {
                return None;
            }
            values.push(value);
            if values.len() == 2 {
                return Some((values[0], values[1]));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::ErrorCode;

    fn file(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn seeds_creds_and_refusals() {
        let dir = tempfile::tempdir().unwrap();
        let user = nkeys::KeyPair::new_user();
        let seed = user.seed().unwrap();
        let seed_file = file(dir.path(), "worker.nk", &format!("{seed}\n"));
        let loaded = NatsLogin::new().creds(&seed_file).load().unwrap();
        assert!(loaded.has_credentials());
        assert!(
            !format!("{loaded:?}").contains(&seed),
            "the seed is not shown"
        );

        let creds = format!(
            "-----BEGIN NATS USER JWT-----\neyJhbGciOiJlZDI1NTE5In0.eyJzdWIiOiJVIn0.c2ln\n------END NATS USER JWT------\n\n\
             ************************* IMPORTANT *************************\n\n\
             -----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n"
        );
        let creds_file = file(dir.path(), "user.creds", &creds);
        assert!(NatsLogin::new().creds(&creds_file).load().is_ok());

        let account_seed = nkeys::KeyPair::new_account().seed().unwrap();
        let cases = [
            ("missing", None, "cannot read it"),
            ("empty", Some(String::new()), "neither"),
            ("garbage", Some("password123".into()), "not valid"),
            ("two words", Some(format!("seed: {seed}")), "neither"),
            ("account", Some(account_seed.clone()), "user seed"),
            (
                "creds without seed",
                Some(
                    "-----BEGIN NATS USER JWT-----\na.b.c\n------END NATS USER JWT------\n".into(),
                ),
                "JWT block followed",
            ),
            (
                "creds with a bad jwt",
                Some(creds.replace("eyJhbGciOiJlZDI1NTE5In0.eyJzdWIiOiJVIn0.c2ln", "nojwt")),
                "JWT is malformed",
            ),
        ];
        for (name, text, needle) in cases {
            let path = match &text {
                Some(t) => file(dir.path(), name, t),
                None => dir.path().join(name),
            };
            let err = NatsLogin::new().creds(&path).load().unwrap_err();
            assert_eq!(err.code(), ErrorCode::INVALID_ARGUMENT, "{name}");
            let message = err.to_string();
            assert!(message.contains(needle), "{name}: {message}");
            assert!(
                message.contains(&path.display().to_string()),
                "{name}: {message}"
            );
            assert!(!message.contains(&seed) && !message.contains(&account_seed));
        }
    }

    #[test]
    fn reconnects_wait_at_most_a_quarter_second() {
        use std::time::Duration;
        let waits: Vec<Duration> = (0..12).map(reconnect_delay).collect();
        assert_eq!(waits[..4], [0, 0, 2, 4].map(Duration::from_millis));
        assert!(waits.windows(2).all(|w| w[0] <= w[1]));
        // async-nats's own would be 2 s and 4 s by now.
        for attempts in [12, 13, 40, usize::MAX] {
            assert_eq!(reconnect_delay(attempts), RECONNECT_MAX_DELAY);
        }
    }

    #[test]
    fn inbox_prefixes() {
        for ok in ["_INBOX", "_INBOX.submitter", "_INBOX.worker.gpu-a100-1"] {
            assert!(check_inbox_prefix(ok).is_ok(), "{ok}");
            assert!(NatsLogin::new().inbox_prefix(ok).load().is_ok());
        }
        let long = "a".repeat(MAX_INBOX_PREFIX + 1);
        for bad in ["", ".a", "a.", "a..b", "a.*", "a.>", "a b", long.as_str()] {
            let err = NatsLogin::new().inbox_prefix(bad).load().unwrap_err();
            assert_eq!(err.code(), ErrorCode::INVALID_ARGUMENT, "{bad:?}");
        }
    }
}
