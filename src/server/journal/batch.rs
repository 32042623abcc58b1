//! Journal records in atomic batches: one fence check per batch.
//!
//! nats-server 2.12 added atomic batch publish (stream `allow_atomic`): the
//! messages of a batch carry `Nats-Batch-Id` and `Nats-Batch-Sequence`
//! (1, 2, …), the last also `Nats-Batch-Commit: 1`; the server stages them
//! and, at the commit, checks every message's conditions under the stream
//! lock and stores all of them or none. Only the commit is acknowledged.
//! So a group commit of n records costs one fence check and one PubAck
//! instead of n of each: the first message carries the fence
//! (`Nats-Expected-Last-Subject-Sequence[-Subject]` on the leader
//! subject), the others ride on it, and a deposed leader's batch is refused
//! whole. Rules taken from nats-server's `stream.go`
//! (`processJetStreamAtomicBatchMsg`) and `jetstream_batching.go`: at most
//! 1,000 messages per batch by default (`max_batch_size` lowers it: the
//! server answers 10199 and we halve ours), 50 batches being staged per
//! stream, 10 s of silence abandons a batch; the staged messages before the
//! commit need no reply subject (with one, each gets an empty ack).
//!
//! A KV put is a publish to `$KV.<bucket>.<key>` on stream `KV_<bucket>`,
//! so a batch of puts is a batch of publishes; the stored messages keep the
//! batch headers, which KV readers ignore.

use std::sync::atomic::Ordering;
use std::time::Duration;

use async_nats::jetstream::{self, context::PublishErrorKind};
use bytes::Bytes;

use super::acks::Key;
use crate::server::Fenced;

/// The most records in one batch: nats-server's default limit.
pub(in crate::server) const MAX_BATCH: usize = 1000;

/// Turns on atomic batch publish on the results bucket's stream
/// (`KV_<bucket>`) if nats-server can do it (≥ 2.12): `Ok(true)` once the
/// stream's config says `allow_atomic`. async-nats' `stream::Config` has no
/// such field (and would drop it on an update), so the stream's JSON config
/// is read and written through the JetStream API as it is.
pub(in crate::server) async fn enable_atomic(
    js: &jetstream::Context,
    server_version: &str,
    stream: &str,
) -> Result<bool, String> {
    if !version_at_least(server_version, (2, 12)) {
        return Ok(false);
    }
    let info: serde_json::Value = js
        .request(format!("STREAM.INFO.{stream}"), &())
        .await
        .map_err(|e| e.to_string())?;
    let mut config = api_ok(info)?
        .get("config")
        .cloned()
        .ok_or("the stream info has no config")?;
    if allows_atomic(&config) {
        return Ok(true);
    }
    config["allow_atomic"] = serde_json::Value::Bool(true);
    let updated: serde_json::Value = js
        .request(format!("STREAM.UPDATE.{stream}"), &config)
        .await
        .map_err(|e| e.to_string())?;
    let updated = api_ok(updated)?;
    Ok(updated.get("config").is_some_and(allows_atomic))
}

/// The results bucket's max age, brought to `results_ttl` first if it
/// has another (a bucket keeps the one it was created with, or the one an
/// earlier leader set). Read and written as the stream's JSON config, so
/// that fields async-nats does not know (`allow_atomic`) stay as they are.
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

fn allows_atomic(config: &serde_json::Value) -> bool {
    config.get("allow_atomic") == Some(&serde_json::Value::Bool(true))
}

/// A JetStream API answer, or its error as text.
fn api_ok(answer: serde_json::Value) -> Result<serde_json::Value, String> {
    match answer.get("error") {
        Some(error) => Err(error.to_string()),
        None => Ok(answer),
    }
}

/// `"2.12.0"`, `"v2.15.1-RC.2"` … ≥ `(major, minor)`.
fn version_at_least(version: &str, (major, minor): (u64, u64)) -> bool {
    let mut parts = version
        .trim_start_matches('v')
        .split(['.', '-'])
        .map(|p| p.parse::<u64>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(a), Some(b)) => (a, b) >= (major, minor),
        _ => false,
    }
}

/// How an atomic batch write failed.
pub(in crate::server) enum BatchError {
    /// The stream no longer allows atomic batches (its config was
    /// replaced): write record by record from now on.
    Disabled,
    /// NATS did not take it (away, restarting, too many batches staged):
    /// try again later.
    Failed(String),
}

impl Fenced {
    /// Stores `records` (key, body) if this server still leads, in
    /// atomic batches fenced on the leader subject. `Ok(false)`: refused, a
    /// successor took over (and `lost` is set).
    pub(in crate::server) async fn put_batch(
        &self,
        records: &[(Key, Bytes)],
    ) -> Result<bool, BatchError> {
        let mut rest = records;
        while !rest.is_empty() {
            let size = self.batch_max.load(Ordering::Relaxed).clamp(1, rest.len());
            let (chunk, after) = rest.split_at(size);
            match self.put_atomic(chunk).await? {
                Chunk::Stored => rest = after,
                Chunk::Fenced => return Ok(false),
                Chunk::TooLarge => {
                    // The server's `max_batch_size` is lower than ours.
                    let half = (size / 2).max(1);
                    self.batch_max.store(half, Ordering::Relaxed);
                    tracing::info!(
                        batch = half,
                        "nats-server limits atomic batches; smaller ones"
                    );
                }
            }
        }
        Ok(true)
    }

    /// One atomic batch: the records, the first fenced, the last the commit.
    async fn put_atomic(&self, records: &[(Key, Bytes)]) -> Result<Chunk, BatchError> {
        loop {
            let expected = self.fence.load(Ordering::SeqCst);
            if expected == 0 {
                return Ok(Chunk::Fenced);
            }
            let id = format!(
                "cq{}-{}",
                self.epoch,
                self.batches.fetch_add(1, Ordering::Relaxed)
            );
            let last = records.len();
            let mut ack = None;
            for (i, (key, body)) in records.iter().enumerate() {
                let n = i + 1;
                let mut headers = if n == 1 {
                    crate::server::election::fence_headers(&self.subject, expected)
                } else {
                    async_nats::HeaderMap::new()
                };
                headers.insert("Nats-Batch-Id", id.as_str());
                headers.insert("Nats-Batch-Sequence", n.to_string().as_str());
                let subject = format!("$KV.{}.{key}", self.bucket);
                if n == last {
                    headers.insert("Nats-Batch-Commit", "1");
                    let sent = self
                        .js
                        .publish_with_headers(subject, headers, body.clone())
                        .await
                        .map_err(|e| BatchError::Failed(e.to_string()))?;
                    ack = Some(sent);
                } else {
                    // Staged without a reply: only the commit is answered.
                    self.client
                        .publish_with_headers(subject, headers, body.clone())
                        .await
                        .map_err(|e| BatchError::Failed(e.to_string()))?;
                }
            }
            let Some(ack) = ack else {
                return Ok(Chunk::Stored); // no records
            };
            let e = match ack.await {
                Ok(_) => {
                    tracing::trace!(records = last, "journal batch stored");
                    return Ok(Chunk::Stored);
                }
                Err(e) => e,
            };
            let text = e.to_string();
            if text.contains("10174") {
                self.atomic.store(false, Ordering::Relaxed);
                return Err(BatchError::Disabled);
            }
            if text.contains("10199") {
                return Ok(Chunk::TooLarge);
            }
            if crate::server::election::is_busy(&e) {
                tokio::time::sleep(Duration::from_millis(2)).await;
                continue;
            }
            if e.kind() == PublishErrorKind::WrongLastSequence {
                match self.refused(expected).await {
                    true => continue,
                    false => return Ok(Chunk::Fenced),
                }
            }
            return Err(BatchError::Failed(text));
        }
    }
}

/// How one atomic batch went.
enum Chunk {
    Stored,
    Fenced,
    TooLarge,
}

#[cfg(test)]
mod tests {
    use super::version_at_least;

    #[test]
    fn versions_compare_by_major_and_minor() {
        assert!(version_at_least("2.12.0", (2, 12)));
        assert!(version_at_least("v2.15.1-RC.2", (2, 12)));
        assert!(version_at_least("3.0.0", (2, 12)));
        assert!(!version_at_least("2.11.9", (2, 12)));
        assert!(!version_at_least("2", (2, 12)));
        assert!(!version_at_least("", (2, 12)));
    }
}
