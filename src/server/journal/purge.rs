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

/// The results bucket's max age, brought to `results_ttl` first if it
/// has another (a bucket keeps the one it was created with, or the one an
/// earlier leader set). The bucket only serves lookups of finished tasks
/// now; nothing recovery reads expires. Read and written as the stream's
/// JSON config, so that fields async-nats does not know stay as they are.
/// Returns the max age the bucket has, whatever the update did.
pub(in crate::server) async fn results_max_age(
    js: &jetstream::Context,
    stream: &str,
    results_ttl: Duration,
) -> Duration {
    let wanted = u64::try_from(results_ttl.as_nanos()).unwrap_or(u64::MAX);
    let info: Result<serde_json::Value, _> = js.request(format!("STREAM.INFO.{stream}"), &()).await;
    let config = match info
        .map_err(|e| e.to_string())
        .and_then(api_ok)
        .and_then(|info| info.get("config").cloned().ok_or("no config".into()))
    {
        Ok(config) => config,
        Err(e) => {
            tracing::warn!(stream, error = %e, "cannot read the results bucket's max age");
            return results_ttl;
        }
    };
    let nanos = |config: &serde_json::Value| config.get("max_age").and_then(|v| v.as_u64());
    let was = nanos(&config).unwrap_or(0);
    if was == wanted {
        return results_ttl;
    }
    let mut updated = config;
    updated["max_age"] = serde_json::Value::from(wanted);
    let answer: Result<serde_json::Value, _> = js
        .request(format!("STREAM.UPDATE.{stream}"), &updated)
        .await;
    match answer.map_err(|e| e.to_string()).and_then(api_ok) {
        Ok(info) => {
            let now = info.get("config").and_then(nanos).unwrap_or(was);
            tracing::info!(
                was_ms = was / 1_000_000,
                now_ms = now / 1_000_000,
                "results bucket max age updated to results_ttl"
            );
            Duration::from_nanos(now)
        }
        Err(e) => {
            tracing::warn!(stream, error = %e, max_age_ms = was / 1_000_000,
                "cannot update the results bucket's max age; keeping it");
            Duration::from_nanos(was)
        }
    }
}

/// A JetStream API answer, or its error as text.
fn api_ok(answer: serde_json::Value) -> Result<serde_json::Value, String> {
    match answer.get("error") {
        Some(error) => Err(error.to_string()),
        None => Ok(answer),
    }
}
