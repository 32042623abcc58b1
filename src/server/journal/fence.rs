//! Results writes fenced on the leader subject ([`Fenced`]): a write succeeds only while this server's leadership holds the subject.

use crate::server::*;

/// Results writes fenced on the leader subject.
pub(in crate::server) struct Fenced {
    pub(in crate::server) js: jetstream::Context,
    pub(in crate::server) bucket: String,
    pub(in crate::server) subject: String,
    pub(in crate::server) fence: Arc<AtomicU64>,
    pub(in crate::server) lost: watch::Sender<Option<String>>,
    pub(in crate::server) election: election::Election,
    pub(in crate::server) epoch: u64,
    /// Records being written, not yet acknowledged (the
    /// `cronoq_journal_pending_records` gauge).
    pub(in crate::server) pending_records: Arc<AtomicU64>,
    /// Atomic batches ([`journal`]): the stream allows them. Turned off if
    /// the stream stops allowing them.
    pub(in crate::server) atomic: AtomicBool,
    /// The most records per atomic batch (lowered if NATS refuses ours).
    pub(in crate::server) batch_max: AtomicUsize,
    /// Atomic batches started, for their ids.
    pub(in crate::server) batches: AtomicU64,
    /// For the staged (unacknowledged) messages of a batch.
    pub(in crate::server) client: async_nats::Client,
}

impl Fenced {
    /// Stores `body` under `key` if this server still leads. `Ok(false)`:
    /// refused, a successor took over (and `lost` is set).
    pub(in crate::server) async fn put(&self, key: &str, body: Bytes) -> Result<bool, String> {
        loop {
            let expected = self.fence.load(Ordering::SeqCst);
            if expected == 0 {
                return Ok(false);
            }
            let headers = election::fence_headers(&self.subject, expected);
            let sent = self
                .js
                .publish_with_headers(format!("$KV.{}.{key}", self.bucket), headers, body.clone())
                .await
                .map_err(|e| e.to_string())?;
            match sent.await {
                Ok(_) => return Ok(true),
                // Replicated stream: another fenced write (a renewal, a
                // result) was in flight. Not an answer about leadership.
                Err(e) if election::is_busy(&e) => {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    continue;
                }
                Err(e)
                    if e.kind()
                        == async_nats::jetstream::context::PublishErrorKind::WrongLastSequence =>
                {
                    if self.refused(expected).await {
                        continue;
                    }
                    return Ok(false);
                }
                Err(e) => return Err(e.to_string()),
            }
        }
    }

    /// A write expecting `expected` on the leader subject was refused:
    /// `true` if it is still ours to retry (with the fence as it is now),
    /// `false` if someone else wrote the subject (and `lost` is set).
    pub(in crate::server) async fn refused(&self, expected: u64) -> bool {
        // A renewal moved the fence meanwhile: try again with the new one.
        // Unchanged: someone else wrote it.
        if self.fence.load(Ordering::SeqCst) != expected {
            return true;
        }
        // Our own renewal, stored before its acknowledgement reached the
        // renewal loop: still ours.
        // Boxed: rare, and its read of the leader key would otherwise
        // make every record write's future as large as its own.
        if Box::pin(self.election.reclaim_fence(self.epoch, expected)).await {
            return true;
        }
        let _ = self.lost.send(Some(
            "a result write was fenced out: another server leads".into(),
        ));
        false
    }
}
