//! The submit consumer: reads the submit stream in order, decodes and checks each submission (credentials through the guard), and hands it, with its journal record at a takeover, to the driver.

use super::*;

/// A submission decoded and checked: everything the driver's input for it
/// holds but its journal record, which only a takeover can look up. The
/// same for a leader's consumer and a standby's copy
/// ([`super::warm_submits`]): decoding depends on the message alone, and
/// the credential check on the message, its stored time and the process's
/// `[auth]` and storage key — [`Guard::submission`] and
/// [`Guard::owner_of`] read no nonce or session of a leadership.
#[derive(Clone, Debug)]
pub(super) struct Decoded {
    pub(super) pool: PoolName,
    pub(super) task: Result<Task, WireError>,
    /// Refused with nobody to attribute it to ([`unattributed`]).
    pub(super) unattributed: bool,
}

impl Decoded {
    /// The driver's input for submission `seq` (with its journal record,
    /// if an earlier leadership wrote one).
    pub(super) fn into_input(self, seq: u64, journaled: Option<wire::TaskRecord>) -> Input {
        let Decoded {
            pool,
            task,
            unattributed,
        } = self;
        match (journaled, task) {
            (Some(record), task) => Input::Recovered {
                seq,
                pool,
                task,
                record,
            },
            (None, Err(error)) if unattributed => Input::Unattributed { seq, error },
            (None, task) => Input::Submitted { seq, pool, task },
        }
    }
}

/// Submission `seq` decoded and checked. Decoding is checked arithmetic
/// throughout; should anything in it still panic, that message fails alone
/// (refused) — the consumer goes on.
pub(super) fn decode(
    subjects: &Subjects,
    guard: &Guard,
    m: &async_nats::Message,
    seq: u64,
    published: SystemTime,
) -> Decoded {
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
            let task = task.map(|mut t| {
                t.stored_at = Some(stored);
                t
            });
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
    let unattributed = task
        .as_ref()
        .err()
        .is_some_and(|error| unattributed(guard, m, published, error));
    Decoded {
        pool,
        task,
        unattributed,
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

/// Reads the submit stream from its first message, forever (what a
/// standby's copy holds of it, `startup.copied`, from memory first);
/// recreates the consumer from the next sequence after errors and after
/// every reconnect (a NATS restart).
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
        batched,
        mut catch_up_to,
        copied,
        keys_bound,
    } = startup;
    if let (Some(warm), false) = (&warm, keys_bound) {
        let keyed = warm.keyed_finished(startup_last);
        if !bind_finished_keys(keyed, &results, &api.inner.seal, &inputs, &beat).await {
            return;
        }
    }
    let js = jetstream::new(client.clone());
    let stream_name = subjects.submit_stream();
    let mut taker = Taker {
        inputs: &inputs,
        staged: None,
    };
    let (subjects, guard) = (&subjects, &*api.inner.guard);
    // Borrowed by every lookup, never cloned per submission (a store
    // clone copies its whole stream configuration).
    let journaled = |seq| {
        known(
            &results,
            &warm,
            &batched,
            &api.inner.seal,
            startup_last,
            seq,
        )
    };
    let mut next_seq = 1u64;
    if let Some(copied) = copied {
        let taking = take_copied(&mut taker, &mut catch_up_to, copied, journaled, &beat);
        match beside_the_driver(taking).await {
            Some(next) => next_seq = next,
            None => return,
        }
    }
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
        let messages = match submissions_from(&stream, next_seq).await {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(error = %e, "retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        // The journal records of submissions older than this leadership
        // are read 128 at a time, in order (one round trip each would make
        // a takeover with many unfinished tasks slow).
        let mut messages = messages
            .map(|message| {
                let journaled = &journaled;
                async move {
                    let seq = message
                        .as_ref()
                        .ok()
                        .and_then(|m| m.info().ok())
                        .map_or(u64::MAX, |i| i.stream_sequence);
                    (message, journaled(seq).await)
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
            let decoded = || decode(subjects, guard, &message, seq, published);
            if !take(&mut taker, &mut catch_up_to, seq, record, decoded).await {
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
                    match journaled(seq).await {
                        Ok(record) => {
                            next_seq = seq + 1;
                            stalls = 0;
                            let decoded = || decode(subjects, guard, &message, seq, published);
                            if !take(&mut taker, &mut catch_up_to, seq, record, decoded).await {
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

/// The messages of an ordered consumer of the submit stream from
/// sequence `from` on.
pub(super) async fn submissions_from(
    stream: &stream::Stream,
    from: u64,
) -> Result<jetstream::consumer::pull::Ordered, String> {
    stream
        .create_consumer(crate::nats::ordered_from(from))
        .await
        .map_err(|e| format!("cannot create the submit consumer: {e}"))?
        .messages()
        .await
        .map_err(|e| format!("the submit consumer failed: {e}"))
}

/// What the consumer hands submissions to.
struct Taker<'a> {
    inputs: &'a mpsc::Sender<Input>,
    /// Inputs held back while a standby's copy is handed over, sent
    /// [`STAGED`] at a time in one [`Input::Batch`] (`None`: each input
    /// is sent alone). A channel hop per input kept both the consumer and
    /// the driver waiting on each other at a takeover.
    staged: Option<Vec<Input>>,
}

/// The inputs of one [`Input::Batch`] at a takeover.
const STAGED: usize = 1024;

impl Taker<'_> {
    /// Hands `input` to the driver, or stages it. False once the driver
    /// is gone.
    async fn hand(&mut self, input: Input) -> bool {
        match &mut self.staged {
            Some(staged) => {
                staged.push(input);
                staged.len() < STAGED || self.flush().await
            }
            None => self.inputs.send(input).await.is_ok(),
        }
    }

    /// Sends what is staged. False once the driver is gone.
    async fn flush(&mut self) -> bool {
        let batch = match &mut self.staged {
            Some(staged) if !staged.is_empty() => {
                std::mem::replace(staged, Vec::with_capacity(STAGED))
            }
            _ => return true,
        };
        self.inputs.send(Input::Batch(batch)).await.is_ok()
    }
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
            .map(|record| match record {
                None => warm::Known::None,
                Some(r) if r.state.is_terminal() => {
                    warm::Known::Finished(r.key.is_some().then(|| Box::new(r)))
                }
                Some(r) => warm::Known::Live(Box::new(r)),
            }),
    }
}

/// What the driver is handed for submission `seq`, given what the log
/// says of it (`known`): a
/// finished task whose record names a key binds that key again and is
/// not run; any other is handed with its record, if an earlier
/// leadership wrote one. `decoded` runs only for a task that is not
/// finished. The consumer and the failover simulation both call it.
pub(super) fn inputs_for(
    seq: u64,
    known: warm::Known,
    decoded: impl FnOnce() -> Decoded,
) -> Option<Input> {
    let journaled = match known {
        // Finished before, not yet purged: its key binds again
        // (a warm copy's keyed results were handed up front).
        warm::Known::Finished(Some(record)) => {
            return Some(Input::FinishedBefore {
                seq,
                record: *record,
            })
        }
        warm::Known::Finished(None) => return None,
        warm::Known::Live(record) => Some(*record),
        warm::Known::None => None,
    };
    Some(decoded().into_input(seq, journaled))
}

/// The input that binds the key of a finished task again (`record`, its
/// result as the log or the results bucket kept it), if it held one.
pub(super) fn finished_key(seq: u64, record: Option<wire::TaskRecord>) -> Option<Input> {
    record
        .filter(|r| r.state.is_terminal() && r.key.is_some())
        .map(|record| Input::FinishedBefore { seq, record })
}

/// Hands submission `seq` to the driver ([`inputs_for`]). False once the
/// driver is gone.
async fn take(
    to: &mut Taker<'_>,
    catch_up_to: &mut Option<u64>,
    seq: u64,
    record: warm::Known,
    decoded: impl FnOnce() -> Decoded,
) -> bool {
    if let Some(input) = inputs_for(seq, record, decoded) {
        if !to.hand(input).await {
            return false;
        }
    }
    if catch_up_to.is_some_and(|last| seq >= last) {
        return caught_up(to, catch_up_to, seq).await;
    }
    true
}

/// Tells the driver it has every submission of the takeover (`seq`, the
/// last, among them). False once the driver is gone.
async fn caught_up(to: &mut Taker<'_>, catch_up_to: &mut Option<u64>, seq: u64) -> bool {
    *catch_up_to = None;
    tracing::info!(seq, "the takeover's submissions handed to the driver");
    to.flush().await && to.inputs.send(Input::CaughtUp).await.is_ok()
}

/// Hands the driver the submissions a standby's copy held
/// ([`warm_submits::Copied`]), each with what `known` says of it, as
/// [`take`] would have from the stream; the sequence to read the stream
/// from next (`None`: the driver is gone). A journal record that cannot be
/// read stops it there: the stream is read from that submission on.
async fn take_copied<F, Fut>(
    to: &mut Taker<'_>,
    catch_up_to: &mut Option<u64>,
    copied: warm_submits::Copied,
    known: F,
    beat: &impl Fn(),
) -> Option<u64>
where
    F: Fn(u64) -> Fut,
    Fut: std::future::Future<Output = Result<warm::Known, String>>,
{
    let started = std::time::Instant::now();
    let held = copied.submissions.len();
    to.staged = Some(Vec::with_capacity(STAGED.min(held)));
    let stopped = 'copy: {
        for (seq, decoded) in copied.submissions {
            beat();
            match known(seq).await {
                Ok(record) => {
                    if !take(to, catch_up_to, seq, record, || decoded).await {
                        return None;
                    }
                }
                Err(e) => {
                    tracing::warn!(seq, error = %e, "reading the journal failed; reading the submit stream from there");
                    break 'copy Some(seq);
                }
            }
        }
        None
    };
    if !to.flush().await {
        return None;
    }
    to.staged = None;
    if stopped.is_some() {
        return stopped;
    }
    tracing::info!(
        held,
        seen = copied.seen,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "submissions taken from the standby's copy"
    );
    if catch_up_to.is_some_and(|last| copied.seen >= last)
        && !caught_up(to, catch_up_to, copied.seen).await
    {
        return None;
    }
    Some(copied.seen + 1)
}

/// Runs `handing` (handing a large copy over to the driver: CPU work of
/// its own while the driver admits what it was handed) keeping this
/// worker thread on a multi-threaded runtime, so the driver's task moves
/// to another instead of sharing one with it: tokio's scheduler tends to
/// wake a task on the thread that sent to it.
pub(super) async fn beside_the_driver<F: std::future::Future>(handing: F) -> F::Output {
    let handle = tokio::runtime::Handle::current();
    match handle.runtime_flavor() {
        tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(|| handle.block_on(handing))
        }
        _ => handing.await,
    }
}

/// What a standby hands a successor's driver before the election ends
/// ([`super::successor`]): the keys of finished tasks, then its copy of
/// the submit stream (`copied`), each submission with the warm journal's
/// record — what [`consume`] hands at a takeover whose submit stream ends
/// at `last`, without [`Input::CaughtUp`] (that comes at the takeover).
/// The last sequence handed over (`None`: the driver is gone).
pub(super) async fn hand_ahead(
    ctx: Ahead<'_>,
    last: u64,
    copied: warm_submits::Copied,
    inputs: &mpsc::Sender<Input>,
) -> Option<u64> {
    let Ahead {
        results,
        warm,
        seal,
    } = ctx;
    let keyed = warm.keyed_finished(last);
    if !bind_finished_keys(keyed, results, seal, inputs, &|| {}).await {
        return None;
    }
    let mut taker = Taker {
        inputs,
        staged: None,
    };
    let warm = Some(warm.clone());
    let batched = BatchedResults::default();
    let journaled = |seq| known(results, &warm, &batched, seal, last, seq);
    let next = take_copied(&mut taker, &mut None, copied, journaled, &|| {}).await?;
    Some(next - 1)
}

/// What [`hand_ahead`] reads from.
pub(super) struct Ahead<'a> {
    pub(super) results: &'a kv::Store,
    pub(super) warm: &'a warm::WarmJournal,
    pub(super) seal: &'a seal::Seal,
}

/// Submission `seq` read through the JetStream API (`STREAM.MSG.GET`, JSON
/// with the headers in base64) rather than delivered: its header block is
/// parsed here, forgivingly — a line without a colon continues the value
/// before it, a line break inside a value reads as a space, a header whose
/// name NATS would not take is left out (so a proof over it fails) — so
/// that no header can stop the consumer. `None`: no such message (purged).
pub(super) async fn read_raw(
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
            Ok(record) => {
                if let Some(input) = finished_key(seq, record) {
                    bound += 1;
                    if inputs.send(input).await.is_err() {
                        return false;
                    }
                }
            }
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

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use std::collections::BTreeMap;

    pub(in crate::server) fn decoded(name: &str) -> Decoded {
        Decoded {
            pool: PoolName::default(),
            task: Ok(Task::new(name.to_string())),
            unattributed: false,
        }
    }

    /// What `take_copied` hands the driver of a copy holding `held` up to
    /// `seen`, with the takeover's last submission at `last`: task 2 is
    /// finished, and the journal cannot be read for `fails`. The
    /// sequence it reads the stream from next, and the inputs (`s<seq>`
    /// for a submission, `caught up`).
    async fn hand_over(held: &[u64], seen: u64, last: u64, fails: u64) -> (u64, Vec<String>) {
        let (tx, mut rx) = mpsc::channel(100);
        let copied = warm_submits::Copied {
            submissions: held
                .iter()
                .map(|seq| (*seq, decoded(&format!("t{seq}"))))
                .collect::<BTreeMap<_, _>>(),
            seen,
        };
        let journal = |seq: u64| async move {
            match seq {
                _ if seq == fails => Err("no answer".to_string()),
                2 => Ok(warm::Known::Finished(None)),
                _ => Ok(warm::Known::None),
            }
        };
        let next = {
            let mut taker = Taker {
                inputs: &tx,
                staged: None,
            };
            take_copied(&mut taker, &mut Some(last), copied, journal, &|| {})
                .await
                .expect("the driver is there")
        };
        drop(tx);
        let mut inputs = Vec::new();
        let mut received = Vec::new();
        while let Some(input) = rx.recv().await {
            match input {
                Input::Batch(batch) => received.extend(batch),
                input => received.push(input),
            }
        }
        for input in received {
            inputs.push(match input {
                Input::Submitted { seq, task, .. } => {
                    let payload = task.unwrap().payload().to_vec();
                    assert_eq!(payload, format!("t{seq}").into_bytes());
                    format!("s{seq}")
                }
                Input::CaughtUp => "caught up".into(),
                other => panic!("{other:?}"),
            });
        }
        (next, inputs)
    }

    #[tokio::test]
    async fn a_whole_copy_is_handed_over_and_the_stream_read_after_it() {
        let (next, inputs) = hand_over(&[1, 2, 3, 4], 4, 4, 0).await;
        assert_eq!(next, 5);
        assert_eq!(inputs, ["s1", "s3", "s4", "caught up"]);
        // Its last submission purged: caught up all the same.
        let (next, inputs) = hand_over(&[1, 2, 3], 4, 4, 0).await;
        assert_eq!(next, 5);
        assert_eq!(inputs, ["s1", "s3", "caught up"]);
        // Beyond the takeover's last: caught up in order, then the newer.
        let (next, inputs) = hand_over(&[1, 3, 4, 5, 6], 6, 4, 0).await;
        assert_eq!(next, 7);
        assert_eq!(inputs, ["s1", "s3", "s4", "caught up", "s5", "s6"]);
    }

    #[tokio::test]
    async fn a_copy_that_is_behind_is_trusted_only_as_far_as_it_got() {
        // The stream held 5 at the takeover, the copy only up to 3: the
        // driver is not caught up until the stream's 4 and 5 are read.
        let (next, inputs) = hand_over(&[1, 2, 3], 3, 5, 0).await;
        assert_eq!(next, 4);
        assert_eq!(inputs, ["s1", "s3"]);
        // An empty copy: the stream from its start.
        let (next, inputs) = hand_over(&[], 0, 5, 0).await;
        assert_eq!((next, inputs.len()), (1, 0));
        // A record that cannot be read: never delivered as new; the
        // stream is read from there.
        let (next, inputs) = hand_over(&[1, 2, 3, 4], 4, 4, 3).await;
        assert_eq!(next, 3);
        assert_eq!(inputs, ["s1"]);
    }
}
