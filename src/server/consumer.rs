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
            let stored = Millis(
                published
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as u64),
            );
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
    let stored = Millis(
        published
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
    );
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
    let mut next_seq = 1u64;
    loop {
        beat();
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
                let seal = api.inner.seal.clone();
                async move {
                    let seq = message
                        .as_ref()
                        .ok()
                        .and_then(|m| m.info().ok())
                        .map(|i| i.stream_sequence);
                    let record = match seq {
                        Some(seq) if seq <= startup_last => match &warm {
                            Some(warm) => Ok(warm.known(seq)),
                            None => journal_record(&results, &seal, seq)
                                .await
                                .map(warm::Known::of),
                        },
                        _ => Ok(warm::Known::None),
                    };
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
            // Its journal record, if an earlier leadership wrote one,
            // with the start that follows it merged in.
            let journaled = match record {
                // Finished before, not yet purged: its key binds again
                // (a warm copy's keyed results were handed up front).
                warm::Known::Finished(Some(record)) => {
                    let input = Input::FinishedBefore {
                        seq,
                        record: *record,
                    };
                    if inputs.send(input).await.is_err() {
                        return;
                    }
                    None
                }
                warm::Known::Finished(None) => None,
                warm::Known::Live(record) => Some(starts.merge(TaskId(seq), Some(*record))),
                warm::Known::None => Some(starts.merge(TaskId(seq), None)),
            };
            let input = journaled.map(|(journaled, start_slot)| {
                submission_input(
                    &subjects,
                    &api.inner.guard,
                    &message.message,
                    seq,
                    published,
                    journaled,
                    start_slot,
                )
            });
            if let Some(input) = input {
                if inputs.send(input).await.is_err() {
                    return;
                }
            }
            if catch_up_to.is_some_and(|last| seq >= last) {
                catch_up_to = None;
                if inputs.send(Input::CaughtUp).await.is_err() {
                    return;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
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
