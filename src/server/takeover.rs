//! Reading the journal back at a takeover: a task's record from the stream leader, the start-record slots, the result batches, and the warm copy a standby kept.

use super::*;

/// This process's warm copy of the journal once it has seen everything
/// the bucket held at this takeover (our own takeover write included, so
/// every write of the deposed leader too); `None` if it does not catch up
/// within [`warm::CATCH_UP_WAIT`]: the takeover then reads the bucket.
pub(super) async fn warm_journal(base: &Base) -> Option<warm::WarmJournal> {
    if !base.config.server.warm_standby {
        tracing::info!("reading the journal from the bucket ([server] warm_standby = false)");
        return None;
    }
    let upto = match journal_last(base).await {
        Ok(upto) => upto,
        Err(e) => {
            tracing::warn!(error = %e, "journal stream info; reading the journal cold");
            return None;
        }
    };
    if base.warm.caught_up(upto, warm::CATCH_UP_WAIT).await {
        let (live, finished, keyed) = base.warm.len();
        tracing::info!(
            upto,
            live,
            finished,
            keyed,
            indexed_results = base.index.len(),
            "reading the journal from the warm copy"
        );
        Some(base.warm.clone())
    } else {
        tracing::warn!(
            upto,
            seen = base.warm.seen(),
            "the warm copy of the journal is behind; reading the journal cold"
        );
        None
    }
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

/// The tasks finished in result batches (`r.<epoch>.<n>`), as a takeover
/// without a warm copy reads them: by submission sequence, with the record
/// when it names a key (it binds again).
pub(super) type BatchedResults = rustc_hash::FxHashMap<u64, Option<Box<wire::TaskRecord>>>;

/// Every result batch of the results bucket at this takeover, read from
/// the stream's leader like the start records, and indexed for lookups:
/// the tasks in them numbered `from..=upto` (the submissions still in the
/// stream) are finished, whatever their own keys hold. Retries while NATS
/// does not answer; an error after about 10 s (taking over without them
/// could run a finished task again).
pub(super) async fn read_results(
    results: &kv::Store,
    seal: &seal::Seal,
    index: &result_index::ResultIndex,
    from: u64,
    upto: u64,
) -> Result<BatchedResults, Error> {
    let read = read_retrying(|| async {
        let mut finished = BatchedResults::default();
        read_keys(results, "r.>", |key, value| {
            let Some(value) = value.filter(|_| wire::is_result_key(key)) else {
                return;
            };
            let Some(batch) = warm::open_result_batch(seal, index, key, value) else {
                return;
            };
            for record in batch.results {
                let seq = record.id.0;
                if record.state.is_terminal() && (from..=upto).contains(&seq) {
                    finished.insert(seq, record.key.is_some().then(|| Box::new(record)));
                }
            }
        })
        .await?;
        Ok(finished)
    })
    .await
    .map_err(|e| Error::Nats {
        context: "reading the journal's result batches".into(),
        source: e.into(),
    })?;
    tracing::info!(finished = read.len(), "result batches read");
    Ok(read)
}

/// What the submit stream held when a leadership began.
pub(super) struct Startup {
    /// Its last sequence: submissions up to it may have journal records.
    pub(super) last: u64,
    /// The warm copy of the journal, caught up with this takeover (`None`:
    /// read the bucket).
    pub(super) warm: Option<warm::WarmJournal>,
    /// The start records ([`wire::StartRecords`]) the bucket held.
    pub(super) starts: Arc<wire::StartIndex>,
    /// Without a warm copy: the tasks the bucket's result batches finish.
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

/// Every start record (`s.<n>`) of the results bucket at this takeover,
/// read from the stream's leader (an ordered consumer, last message per
/// key). Retries while NATS does not answer; an error after about 10 s
/// (taking over without them could run an attempt that still runs
/// again).
pub(super) async fn read_starts(
    results: &kv::Store,
    seal: &seal::Seal,
) -> Result<wire::StartIndex, Error> {
    let index = read_retrying(|| read_starts_once(results, seal))
        .await
        .map_err(|e| Error::Nats {
            context: "reading the journal's start records".into(),
            source: e.into(),
        })?;
    tracing::info!(slots = index.len(), "start records read");
    Ok(index)
}

pub(super) async fn read_starts_once(
    results: &kv::Store,
    seal: &seal::Seal,
) -> Result<wire::StartIndex, String> {
    let mut index = wire::StartIndex::default();
    read_keys(results, "s.>", |key, value| {
        let Some(slot) = wire::parse_start_key(key) else {
            return;
        };
        let Some(value) = value else {
            return index.set(slot, None);
        };
        match seal.open(key, value) {
            Err(why) => {
                seal::log_refused("start record", key, why);
                index.set(slot, None);
            }
            Ok(body) => match wire::decode::<wire::StartRecords>(body) {
                Ok(records) => index.set(slot, Some(records)),
                Err(e) => tracing::warn!(slot, error = %e, "unreadable start record ignored"),
            },
        }
    })
    .await?;
    Ok(index)
}

/// A schedule record as stored: MessagePack, or JSON (`{…}` or `null`)
/// as leaders before issue 34 wrote it.
fn decode_schedule_record(body: &[u8]) -> Result<Option<crate::schedule::StoredSchedule>, String> {
    if body.first() == Some(&b'{') || body == b"null" {
        serde_json::from_slice(body).map_err(|e| e.to_string())
    } else {
        wire::decode(body).map_err(|e| e.message)
    }
}

/// Every schedule record (`sched.<name>`) of the results bucket, read
/// from the stream's leader like the start records; deleted, unsealed and
/// unreadable ones are left out (and logged).
pub(super) async fn read_schedules(
    results: &kv::Store,
    seal: &seal::Seal,
) -> Result<Vec<crate::schedule::StoredSchedule>, Error> {
    let read = read_retrying(|| async {
        let mut found = Vec::new();
        read_keys(results, "sched.>", |key, value| {
            let Some(value) = value else { return };
            let body = match seal.open(key, value) {
                Ok(body) => body,
                Err(why) => return seal::log_refused("schedule record", key, why),
            };
            match decode_schedule_record(body) {
                Ok(Some(stored)) => found.push(stored),
                Ok(None) => {}
                Err(e) => tracing::warn!(key, error = %e, "unreadable schedule record ignored"),
            }
        })
        .await?;
        Ok(found)
    })
    .await
    .map_err(|e| Error::Nats {
        context: "reading the schedule records".into(),
        source: e.into(),
    })?;
    tracing::info!(schedules = read.len(), "schedule records read");
    Ok(read)
}

/// Hands `each` the last value of every key of the results bucket under
/// `filter` (`None`: deleted), read from the stream's leader with an
/// ordered consumer.
async fn read_keys(
    results: &kv::Store,
    filter: &str,
    mut each: impl FnMut(&str, Option<&[u8]>),
) -> Result<(), String> {
    let mut consumer = results
        .stream
        .create_consumer(jetstream::consumer::pull::OrderedConfig {
            filter_subject: format!("{}{filter}", results.prefix),
            deliver_policy: jetstream::consumer::DeliverPolicy::LastPerSubject,
            ..Default::default()
        })
        .await
        .map_err(|e| e.to_string())?;
    let pending = consumer
        .info()
        .await
        .map_err(|e| e.to_string())?
        .num_pending;
    if pending == 0 {
        return Ok(());
    }
    let mut messages = consumer.messages().await.map_err(|e| e.to_string())?;
    let mut read = 0u64;
    while read < pending {
        let message = tokio::time::timeout(Duration::from_secs(5), messages.next())
            .await
            .map_err(|_| "timed out".to_string())?
            .ok_or("the consumer ended")?
            .map_err(|e| e.to_string())?;
        read += 1;
        let info = message.info().map_err(|e| e.to_string())?;
        let left = info.pending;
        let key = message
            .subject
            .as_str()
            .strip_prefix(results.prefix.as_str())
            .unwrap_or_default();
        let tombstone = kv_tombstone(message.headers.as_ref());
        each(key, (!tombstone).then_some(&message.payload[..]));
        if left == 0 {
            break;
        }
    }
    Ok(())
}
