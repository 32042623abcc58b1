//! The submit consumer: reads the submit stream in order, decodes and checks each submission (credentials through the guard), and hands it, with its journal record at a takeover, to the driver.

use super::*;

/// Reads the submit stream from its first message, forever; recreates the
/// consumer from the next sequence after errors and after every reconnect
/// (a NATS restart).
/// The driver's input for submission `seq` (with its journal record, if
/// an earlier leadership wrote one). Decoding is checked arithmetic
/// throughout; should anything in it still panic, that message fails alone
/// (refused) — the consumer goes on.
pub(super) fn submission_input(
    subjects: &Subjects,
    guard: &Guard,
    m: &async_nats::Message,
    seq: u64,
    published: SystemTime,
    journaled: Option<wire::TaskRecord>,
    start_slot: Option<u32>,
) -> Input {
    let decoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wire::decode_submission(
            subjects,
            m.subject.as_str(),
            m.headers.as_ref(),
            m.payload.clone(),
            published,
        )
    }));
    let (pool, task) = match decoded {
        // Checked after decoding: the proof covers what was sent, and a
        // refusal is recorded like any refused submission.
        Ok((pool, task)) => {
            let stored = Millis::since_epoch(published);
            let task = task.and_then(|t| {
                guard.submission(
                    m.subject.as_str(),
                    m.headers.as_ref(),
                    &m.payload,
                    stored,
                    &pool,
                    t,
                )
            });
            (pool, task)
        }
        Err(panic) => {
            let why = crate::task::panic_message(&*panic);
            tracing::error!(seq, panic = %why, "decoding a submission panicked; refusing it");
            (
                subjects
                    .pool_of_submit(m.subject.as_str())
                    .unwrap_or_default(),
                Err(WireError::new(
                    ErrorCode::INTERNAL,
                    format!("the submission could not be processed: {why}"),
                )),
            )
        }
    };
    match journaled {
        Some(record) => Input::Recovered {
            seq,
            pool,
            task,
            record,
            start_slot,
        },
        None => match task {
            Err(error) if unattributed(guard, m, published, &error) => {
                Input::Unattributed { seq, error }
            }
            task => Input::Submitted { seq, pool, task },
        },
    }
}

/// Whether a refused submission has nobody to attribute it to: auth is on
/// and no credential's proof verifies on it — the guard refused it
/// `UNAUTHENTICATED`, or it did not even decode and carries no proof that
/// verifies. Such refusals are counted, not recorded
/// ([`Input::Unattributed`]).
pub(super) fn unattributed(
    guard: &Guard,
    m: &async_nats::Message,
    published: SystemTime,
    error: &WireError,
) -> bool {
    if !guard.required() {
        return false;
    }
    if error.code == ErrorCode::UNAUTHENTICATED {
        return true;
    }
    // Checked only on this rare path: a proof is verified once otherwise.
    let stored = Millis::since_epoch(published);
    guard
        .owner_of(m.subject.as_str(), m.headers.as_ref(), &m.payload, stored)
        .is_none()
}

pub(super) async fn consume(
    client: async_nats::Client,
    stream: stream::Stream,
    subjects: Subjects,
    results: kv::Store,
    startup: Startup,
    inputs: mpsc::Sender<Input>,
    api: LeaderApi,
) {
    let beat = || {
        api.inner
            .consumer_beat
            .store(wall_now().0, Ordering::Relaxed)
    };
    let Startup {
        last: startup_last,
        warm,
        starts,
        batched,
        mut catch_up_to,
    } = startup;
    // Shared, not cloned per submission (a store clone copies its whole
    // stream configuration).
    let results = Arc::new(results);
    if let Some(warm) = &warm {
        let keyed = warm.keyed_finished(startup_last);
        if !bind_finished_keys(keyed, &results, &api.inner.seal, &inputs, &beat).await {
            return;
        }
    }
    let js = jetstream::new(client.clone());
    let stream_name = subjects.submit_stream();
    let taker = Taker {
        subjects: &subjects,
        guard: &api.inner.guard,
        starts: &starts,
        inputs: &inputs,
    };
    let mut next_seq = 1u64;
    let mut stalls = 0u32;
    loop {
        beat();
        let started_at = next_seq;
        // After a reconnect (a NATS restart) the ephemeral consumer may be
        // gone, and async-nats only notices when its 15 s idle heartbeat
        // is missed: new submissions would wait that long. So watch the
        // connection count and start over from `next_seq` at once.
        let connects = client.statistics().connects.load(Ordering::Relaxed);
        let mut reconnect_check = tokio::time::interval(Duration::from_millis(250));
        let consumer = stream
            .create_consumer(jetstream::consumer::pull::OrderedConfig {
                deliver_policy: jetstream::consumer::DeliverPolicy::ByStartSequence {
                    start_sequence: next_seq,
                },
                ..Default::default()
            })
            .await;
        let messages = match consumer {
            Ok(c) => match c.messages().await {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!(error = %e, "submit consumer failed; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
            },
            Err(e) => {
                tracing::warn!(error = %e, "cannot create the submit consumer; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        // The journal records of submissions older than this leadership
        // are read 128 at a time, in order (one round trip each would make
        // a takeover with many unfinished tasks slow).
        let mut messages = messages
            .map(|message| {
                let results = results.clone();
                let warm = warm.clone();
                let batched = batched.clone();
                let seal = api.inner.seal.clone();
                async move {
                    let seq = message
                        .as_ref()
                        .ok()
                        .and_then(|m| m.info().ok())
                        .map_or(u64::MAX, |i| i.stream_sequence);
                    let record = known(&results, &warm, &batched, &seal, startup_last, seq).await;
                    (message, record)
                }
            })
            .buffered(128);
        loop {
            beat();
            let message = tokio::select! {
                message = messages.next() => message,
                _ = reconnect_check.tick() => {
                    if client.statistics().connects.load(Ordering::Relaxed) != connects {
                        tracing::info!("reconnected to nats; recreating the submit consumer");
                        break;
                    }
                    continue;
                }
            };
            let Some((message, record)) = message else {
                break;
            };
            let message = match message {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!(error = %e, "submit consumer interrupted; resuming");
                    break;
                }
            };
            let record = match record {
                Ok(record) => record,
                Err(e) => {
                    // Never deliver it as new: it may have run, or finished.
                    tracing::warn!(error = %e, "reading the journal failed; resuming");
                    break;
                }
            };
            let (seq, published) = match message.info() {
                Ok(info) => (info.stream_sequence, SystemTime::from(info.published)),
                Err(e) => {
                    tracing::warn!(error = %e, "submission without metadata skipped");
                    continue;
                }
            };
            next_seq = seq + 1;
            if !take(
                &taker,
                &mut catch_up_to,
                &message.message,
                seq,
                published,
                record,
            )
            .await
            {
                return;
            }
        }
        // Reconnects that leave the consumer where it started, twice in a
        // row: the next submission may be one no NATS client can read (a
        // header line async-nats cannot parse resets the connection, and
        // the consumer would read it again, forever). Read it through the
        // JetStream API's JSON instead and take it like any other.
        stalls = if next_seq == started_at {
            stalls + 1
        } else {
            0
        };
        if stalls >= 2 {
            match read_raw(&js, &stream_name, next_seq).await {
                Ok(Some((message, published))) => {
                    tracing::warn!(
                        seq = next_seq,
                        "submission read through the API: its headers reset the connection"
                    );
                    let seq = next_seq;
                    match known(
                        &results,
                        &warm,
                        &batched,
                        &api.inner.seal,
                        startup_last,
                        seq,
                    )
                    .await
                    {
                        Ok(record) => {
                            next_seq = seq + 1;
                            stalls = 0;
                            if !take(&taker, &mut catch_up_to, &message, seq, published, record)
                                .await
                            {
                                return;
                            }
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "reading the journal failed; resuming")
                        }
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(seq = next_seq, error = %e, "reading a submission through the API failed")
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What the consumer hands submissions to.
struct Taker<'a> {
    subjects: &'a Subjects,
    guard: &'a Guard,
    starts: &'a wire::StartIndex,
    inputs: &'a mpsc::Sender<Input>,
}

/// What an earlier leadership journaled of submission `seq` (nothing for
/// one newer than this takeover).
async fn known(
    results: &kv::Store,
    warm: &Option<warm::WarmJournal>,
    batched: &BatchedResults,
    seal: &seal::Seal,
    startup_last: u64,
    seq: u64,
) -> Result<warm::Known, String> {
    if seq > startup_last {
        return Ok(warm::Known::None);
    }
    if let Some(record) = batched.get(&seq) {
        return Ok(warm::Known::Finished(record.clone()));
    }
    match warm {
        Some(warm) => Ok(warm.known(seq)),
        None => journal_record(results, seal, seq)
            .await
            .map(warm::Known::of),
    }
}

/// Hands submission `seq` to the driver, with its journal record if an
/// earlier leadership wrote one (the start that follows it merged in).
/// False once the driver is gone.
async fn take(
    to: &Taker<'_>,
    catch_up_to: &mut Option<u64>,
    message: &async_nats::Message,
    seq: u64,
    published: SystemTime,
    record: warm::Known,
) -> bool {
    let journaled = match record {
        // Finished before, not yet purged: its key binds again
        // (a warm copy's keyed results were handed up front).
        warm::Known::Finished(Some(record)) => {
            let input = Input::FinishedBefore {
                seq,
                record: *record,
            };
            if to.inputs.send(input).await.is_err() {
                return false;
            }
            None
        }
        warm::Known::Finished(None) => None,
        warm::Known::Live(record) => Some(to.starts.merge(TaskId(seq), Some(*record))),
        warm::Known::None => Some(to.starts.merge(TaskId(seq), None)),
    };
    if let Some((journaled, start_slot)) = journaled {
        let input = submission_input(
            to.subjects,
            to.guard,
            message,
            seq,
            published,
            journaled,
            start_slot,
        );
        if to.inputs.send(input).await.is_err() {
            return false;
        }
    }
    if catch_up_to.is_some_and(|last| seq >= last) {
        *catch_up_to = None;
        if to.inputs.send(Input::CaughtUp).await.is_err() {
            return false;
        }
    }
    true
}

/// Submission `seq` read through the JetStream API (`STREAM.MSG.GET`, JSON
/// with the headers in base64) rather than delivered: its header block is
/// parsed here, forgivingly — a line without a colon continues the value
/// before it, a line break inside a value reads as a space, a header whose
/// name NATS would not take is left out (so a proof over it fails) — so
/// that no header can stop the consumer. `None`: no such message (purged).
async fn read_raw(
    js: &jetstream::Context,
    stream: &str,
    seq: u64,
) -> Result<Option<(async_nats::Message, SystemTime)>, String> {
    use base64::Engine as _;
    let reply: serde_json::Value = js
        .request(
            format!("STREAM.MSG.GET.{stream}"),
            &serde_json::json!({ "seq": seq }),
        )
        .await
        .map_err(|e| e.to_string())?;
    if reply["error"]["err_code"].as_u64() == Some(10037) {
        return Ok(None);
    }
    let m = &reply["message"];
    let text = |k: &str| m[k].as_str().unwrap_or_default();
    let b64 = base64::engine::general_purpose::STANDARD;
    let payload = b64.decode(text("data")).map_err(|e| e.to_string())?;
    let headers = match m["hdrs"].as_str() {
        Some(h) => Some(parse_header_block(
            &b64.decode(h).map_err(|e| e.to_string())?,
        )),
        None => None,
    };
    let published = text("time")
        .parse::<jiff::Timestamp>()
        .map_err(|e| e.to_string())?;
    let message = async_nats::Message {
        subject: text("subject").into(),
        reply: None,
        payload: payload.into(),
        headers,
        status: None,
        description: None,
        length: 0,
    };
    Ok(Some((message, SystemTime::from(published))))
}

/// A NATS header block (`NATS/1.0` line, `Name: value` lines), read
/// without refusing anything (see [`read_raw`]).
fn parse_header_block(block: &[u8]) -> async_nats::HeaderMap {
    let text = String::from_utf8_lossy(block);
    let mut fields: Vec<(String, String)> = Vec::new();
    for line in text.split("\r\n").skip(1).filter(|l| !l.is_empty()) {
        match (line.split_once(':'), fields.last_mut()) {
            (Some((name, value)), _) => fields.push((name.trim().into(), value.trim().into())),
            (None, Some((_, value))) => {
                value.push(' ');
                value.push_str(line.trim());
            }
            (None, None) => {}
        }
    }
    let mut headers = async_nats::HeaderMap::new();
    for (name, value) in fields {
        if let Ok(name) = name.parse::<async_nats::HeaderName>() {
            headers.append(name, async_nats::HeaderValue::from_lossy(&value));
        }
    }
    headers
}

/// Hands the driver the result records of the finished tasks `keyed`
/// (oldest first; a warm copy's keyed results, up to the takeover's last
/// submission) before any submission, so their idempotency keys bind
/// again before a duplicate of one can arrive — also for tasks whose
/// submissions were purged. A record the copy did not keep whole is read
/// back (128 at a time); one that is gone (expired after `results_ttl`,
/// deleted) binds nothing. False once the driver is gone.
async fn bind_finished_keys(
    keyed: Vec<(u64, Option<Box<wire::TaskRecord>>)>,
    results: &kv::Store,
    seal: &seal::Seal,
    inputs: &mpsc::Sender<Input>,
    beat: &impl Fn(),
) -> bool {
    if keyed.is_empty() {
        return true;
    }
    let started = std::time::Instant::now();
    let asked = keyed.len();
    let read = keyed.iter().filter(|(_, kept)| kept.is_none()).count();
    let mut bound = 0usize;
    let mut records = futures_util::stream::iter(keyed)
        .map(|(seq, kept)| async move {
            let record = match kept {
                Some(record) => Ok(Some(*record)),
                None => journal_record(results, seal, seq).await,
            };
            (seq, record)
        })
        .buffered(128);
    while let Some((seq, record)) = records.next().await {
        beat();
        match record {
            Ok(Some(record)) if record.state.is_terminal() && record.key.is_some() => {
                bound += 1;
                if inputs
                    .send(Input::FinishedBefore { seq, record })
                    .await
                    .is_err()
                {
                    return false;
                }
            }
            Ok(_) => {}
            // Its key is not bound: a duplicate of it would run.
            Err(e) => {
                tracing::warn!(seq, error = %e, "a finished task's key could not be read back")
            }
        }
    }
    tracing::info!(
        asked,
        read,
        bound,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "keys of finished tasks bound again"
    );
    true
}
