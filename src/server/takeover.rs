//! Reading the journal back at a takeover: a task's record from the stream leader, the start-record slots, the result batches, and the warm copy a standby kept.

use super::*;

/// Waits (at most [`warm::CATCH_UP_WAIT`]) for this process's copy of
/// the log to reach the log's end, so the takeover reads little itself;
/// without a follower (`warm_standby = false`), loads the newest snapshot
/// and the log after it. `true`: the copy was warm.
pub(super) async fn warm_journal(base: &Base) -> bool {
    if !base.config.server.warm_standby {
        tracing::info!("loading the log ([server] warm_standby = false)");
        if let Err(e) = base.warm.load(&base.log).await {
            tracing::warn!(error = %e, "loading the log failed; the takeover reads it");
        }
        return false;
    }
    let upto = match base.log.bounds().await {
        Ok((_, last)) => last,
        Err(e) => {
            tracing::warn!(error = %e, "log stream info");
            return false;
        }
    };
    let warm = base.warm.caught_up(upto, warm::CATCH_UP_WAIT).await;
    let (live, finished, keyed) = base.warm.len();
    let seen = base.warm.seen();
    if warm {
        tracing::info!(
            upto,
            live,
            finished,
            keyed,
            "reading the journal from the warm copy"
        );
    } else {
        tracing::warn!(
            upto,
            seen,
            "the warm copy of the log is behind; the takeover reads the rest"
        );
    }
    warm
}

/// The results bucket stream's last sequence (the journal's last
/// revision).
pub(super) async fn journal_last(base: &Base) -> Result<u64, String> {
    let name = format!("KV_{}", base.subjects.results_bucket());
    let mut stream = base.js.get_stream(&name).await.map_err(|e| e.to_string())?;
    let info = stream.info().await.map_err(|e| e.to_string())?;
    Ok(info.state.last_sequence)
}

/// The journal record of submission `seq`, if any. Retries while NATS
/// does not answer (a missing answer must not pass for "no record": the
/// task may have run, or finished); gives up after about 10 s.
///
/// Read from the stream's leader (`STREAM.MSG.GET`), not with a direct get:
/// a KV get is a direct get, which any replica of a replicated bucket may
/// answer, however far behind (nats-server#6557, no read-after-write) — a
/// takeover that missed a stored `succeeded` would run the task again.
pub(super) async fn journal_record(
    results: &kv::Store,
    seal: &seal::Seal,
    seq: u64,
) -> Result<Option<wire::TaskRecord>, String> {
    use async_nats::jetstream::stream::LastRawMessageErrorKind;
    // Written by block of ids since the log (`journal::lookups`); under
    // its own id by servers before.
    let in_block = read_retrying(|| block_record(results, seal, seq))
        .await
        .map_err(|e| format!("the lookup block of task {seq} could not be read: {e}"))?;
    if in_block.is_some() {
        return Ok(in_block);
    }
    let subject = format!("{}{seq}", results.prefix);
    let got = read_retrying(|| async {
        match results
            .stream
            .get_last_raw_message_by_subject(&subject)
            .await
        {
            Ok(m) => Ok((!kv_tombstone(Some(&m.headers))).then_some(m.payload)),
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(e.to_string()),
        }
    })
    .await
    .map_err(|e| format!("the journal record of task {seq} could not be read: {e}"))?;
    let key = seq.to_string();
    Ok(got.and_then(|bytes| {
        let body = seal
            .open(&key, &bytes)
            .map_err(|why| seal::log_refused("journal record", &key, why))
            .ok()?;
        match wire::TaskRecord::decode(body) {
            Ok(record) => Some(record),
            Err(e) => {
                tracing::warn!(seq, error = %e, "unreadable journal record ignored");
                None
            }
        }
    }))
}

/// Task `seq`'s record in the messages of its lookup block
/// ([`journal::lookups`]), read in order from the stream's leader (as
/// [`journal_record`] reads, for the same reason); a message not sealed
/// with the storage key, or not a block, is skipped.
pub(super) async fn block_record(
    results: &kv::Store,
    seal: &seal::Seal,
    seq: u64,
) -> Result<Option<wire::TaskRecord>, String> {
    use async_nats::jetstream::stream::RawMessageErrorKind;
    let filter = format!("{}{}", results.prefix, journal::lookups::filter(seq));
    let mut from = 1;
    loop {
        let message = match results
            .stream
            .raw_message_builder()
            .sequence(from)
            .next_by_subject(filter.as_str())
            .send()
            .await
        {
            Ok(m) => m,
            Err(e) if e.kind() == RawMessageErrorKind::NoMessageFound => return Ok(None),
            Err(e) => return Err(e.to_string()),
        };
        from = message.sequence + 1;
        let key = message
            .subject
            .as_str()
            .trim_start_matches(results.prefix.as_str());
        match seal.open(key, &message.payload) {
            Ok(body) => match journal::lookups::find(body, seq) {
                Ok(Some(record)) => return Ok(Some(record)),
                Ok(None) => {}
                Err(e) => tracing::warn!(key, error = %e, "a lookup block that is not one"),
            },
            Err(why) => seal::log_refused("lookup block", key, why),
        }
    }
}

/// Tries `read` while NATS does not answer: 12 tries, 50 ms apart at
/// first and doubling up to 2 s (about 10 s in all); the last error then.
pub(super) async fn read_retrying<T, F, Fut>(mut read: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let mut delay = Duration::from_millis(50);
    let mut last_error = String::new();
    for _ in 0..12 {
        match read().await {
            Ok(value) => return Ok(value),
            Err(e) => {
                tracing::debug!(error = %e, "reading the journal failed; retrying");
                last_error = e;
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(2));
            }
        }
    }
    Err(last_error)
}

/// A key-value message that deletes or purges its key.
pub(super) fn kv_tombstone(headers: Option<&async_nats::HeaderMap>) -> bool {
    headers
        .and_then(|h| h.get("KV-Operation"))
        .is_some_and(|op| op.as_str() == "DEL" || op.as_str() == "PURGE")
}

/// Finished tasks by submission sequence, with the record when it names
/// a key.
pub(super) type BatchedResults = rustc_hash::FxHashMap<u64, Option<Box<wire::TaskRecord>>>;

/// What the submit stream held when a leadership began.
pub(super) struct Startup {
    /// Its last sequence: submissions up to it may have journal records.
    pub(super) last: u64,
    /// The warm copy of the journal, caught up with this takeover (`None`:
    /// read the bucket).
    pub(super) warm: Option<warm::WarmJournal>,
    /// Tasks known finished beside the log (none since the log).
    pub(super) batched: Arc<BatchedResults>,
    /// When to tell the driver it has read them all (`None`: nothing to
    /// read).
    pub(super) catch_up_to: Option<u64>,
    /// What a standby's copy of the submit stream held, decoded (only with
    /// a warm copy of the journal): handed over before the stream is read
    /// on from after it.
    pub(super) copied: Option<warm_submits::Copied>,
    /// The keys of finished tasks were bound already (a successor
    /// prepared ahead, [`super::successor`]).
    pub(super) keys_bound: bool,
}
