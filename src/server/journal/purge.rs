//! The purger: drops finished submissions from the submit stream below the oldest unfinished one, once a second.

use crate::server::*;

/// Once a second, purges the submissions of finished tasks whose results
/// are stored: everything below the driver's floor and below every result
/// still being written. One request, however many tasks finished —
/// deleting messages one by one costs nats-server milliseconds each.
pub(in crate::server) async fn purge(
    stream: stream::Stream,
    floor: watch::Receiver<u64>,
    pending: Pending,
) {
    let mut purged_below = 1u64;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        let floor = *floor.borrow();
        let oldest_pending = pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .first()
            .copied();
        let bound = oldest_pending.map_or(floor, |p| p.min(floor));
        if bound <= purged_below {
            continue;
        }
        match stream.purge().sequence(bound).await {
            Ok(_) => purged_below = bound,
            Err(e) => {
                tracing::debug!(below = bound, error = %e, "purging finished submissions failed")
            }
        }
    }
}
