//! Small helpers around an `async_nats::Client` shared by the server, the
//! worker and the client.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The NATS server's `max_payload`, read at most once a second: each
/// `Client::server_info()` copies the server's whole INFO (a dozen strings),
/// too much to do for every message on a hot path. A reconnect to a server
/// with another limit is seen within the second.
#[derive(Debug, Default)]
pub(crate) struct MaxPayload {
    read: Mutex<Option<(Instant, usize)>>,
}

/// How long a read `max_payload` is used before it is read again.
const MAX_PAYLOAD_FOR: Duration = Duration::from_secs(1);

impl MaxPayload {
    /// The limit in bytes (0 before the client has heard the server's INFO).
    pub(crate) fn get(&self, client: &async_nats::Client) -> usize {
        let now = Instant::now();
        let mut read = self.read.lock().unwrap_or_else(|e| e.into_inner());
        match *read {
            Some((at, value)) if now.duration_since(at) < MAX_PAYLOAD_FOR => value,
            _ => {
                let value = client.server_info().max_payload;
                *read = Some((now, value));
                value
            }
        }
    }
}
