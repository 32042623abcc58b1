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

/// How long an ordered consumer's pull request waits; its idle heartbeat
/// is half of it. async-nats's default is 30 s with a 15 s heartbeat, and
/// it recreates the consumer after two missed heartbeats: a leader whose
/// submit consumer (R1, on one node) died with its node would not see a
/// submission for 30 s (tests/nats_cluster.rs
/// `cronoq_on_a_three_node_cluster_survives_losing_a_node`). At 2 s it is
/// recreated within about 4 s, for one pull request every 2 s when idle.
pub(crate) const ORDERED_PULL_EXPIRES: Duration = Duration::from_secs(2);

/// An ordered pull consumer from stream sequence `start` on, its pulls
/// short enough that a lost consumer is noticed in seconds
/// ([`ORDERED_PULL_EXPIRES`]).
pub(crate) fn ordered_from(start: u64) -> async_nats::jetstream::consumer::pull::OrderedConfig {
    async_nats::jetstream::consumer::pull::OrderedConfig {
        deliver_policy: async_nats::jetstream::consumer::DeliverPolicy::ByStartSequence {
            start_sequence: start,
        },
        max_expires: ORDERED_PULL_EXPIRES,
        ..Default::default()
    }
}
