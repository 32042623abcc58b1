//! The committer: the shell of the journal pipeline (`pipeline.rs`). Stores each turn's records (task records, start records, atomic batches) as the pipeline allows and announces each turn it releases.

use crate::server::*;

use super::acks::{Acks, Key, Retry, Sending, ACK_SWEEP};
use rustc_hash::FxHashMap;

use super::pipeline::{self, Limits, Pipeline, Released, WriteId};

/// A task's record to store (a live task's attempts, or a finished
/// task's result); a refused submission's dead letter to write first.
pub(in crate::server) struct Persisted {
    pub(in crate::server) seq: u64,
    pub(in crate::server) record: wire::TaskRecord,
    pub(in crate::server) dead_letter: Option<WireError>,
}

/// What one journal record write stores.
// Task records are nearly every item: boxing them would cost an
// allocation per record written.
#[allow(clippy::large_enum_variant)]
pub(in crate::server) enum Item {
    /// A task's record under its sequence.
    Task(Persisted),
    /// The starts of a turn under a start-record slot (`s.<n>`).
    Starts(u32, wire::StartRecords),
    /// The small results of a turn under a result batch's key
    /// (`r.<epoch>.<n>`).
    Results(u64, wire::ResultRecords),
    /// A schedule's record (`sched.<name>`, JSON); `None`: deleted.
    Schedule(String, Option<Box<crate::schedule::StoredSchedule>>),
}

impl Item {
    /// The pipeline's record of it (a task's order, a result, a dead
    /// letter written by itself).
    pub(in crate::server) fn record(self) -> pipeline::Record<Item> {
        match &self {
            Item::Task(p) => pipeline::Record {
                task: Some(p.seq),
                terminal: p.record.state.is_terminal(),
                finished: Vec::new(),
                alone: p.dead_letter.is_some(),
                body: self,
            },
            Item::Results(_, records) => pipeline::Record {
                task: None,
                terminal: false,
                finished: records.results.iter().map(|r| r.id.0).collect(),
                alone: false,
                body: self,
            },
            Item::Starts(..) | Item::Schedule(..) => pipeline::Record {
                task: None,
                terminal: false,
                finished: Vec::new(),
                alone: false,
                body: self,
            },
        }
    }
}

/// What one driver turn produced: records to store, then what to announce.
pub(in crate::server) type Turn = pipeline::Turn<Item, Output>;

/// The most records being written at once; the driver's turns queue up
/// behind them.
pub(in crate::server) const MAX_IN_FLIGHT: usize = 4096;

/// The most atomic batches being written at once. While one is under way
/// the driver's turns queue up, and the next batch takes every queued
/// record (group commit): the busier the journal, the larger its batches.
/// One: a replicated stream admits one fenced write per subject at a time
/// (10164) anyway.
pub(in crate::server) const MAX_BATCHES_IN_FLIGHT: usize = 1;

/// Where the committer stores and announces.
pub(in crate::server) struct CommitCtx {
    pub(in crate::server) client: async_nats::Client,
    /// The driver's inputs: which leases went out, and when.
    pub(in crate::server) inputs: mpsc::Sender<Input>,
    pub(in crate::server) results: Fenced,
    pub(in crate::server) pending: Pending,
    pub(in crate::server) js: jetstream::Context,
    pub(in crate::server) submit_stream: stream::Stream,
    pub(in crate::server) subjects: Subjects,
    /// Signs leases and revokes with the worker's session (auth on).
    pub(in crate::server) guard: Arc<Guard>,
    /// Seals every record written (the servers' storage key).
    pub(in crate::server) seal: seal::Seal,
    /// Where each result batch's results are (lookups).
    pub(in crate::server) index: result_index::ResultIndex,
    /// A turn is announced only while the leadership may act: its writes
    /// may have been stored just before a pause, and a lease or reply sent
    /// after it would come from a deposed leader.
    pub(in crate::server) tenure: Tenure,
    /// Local callers waiting on replies (closed when the committer stops).
    pub(in crate::server) replies: Replies,
    /// Wall-clock ms since which writes are under way and none was stored
    /// (0: none under way): `/readyz` is 503 past a bound.
    pub(in crate::server) waiting_since: Arc<AtomicU64>,
    /// Where finished tasks' spans go (telemetry on).
    pub(in crate::server) telemetry: Option<crate::telemetry::Telemetry>,
}

/// The journal's group commit, pipelined; the ordering is the pure
/// [`Pipeline`]'s (`pipeline.rs`), this is its shell. It takes the
/// driver's turns in order, as many as are queued at once, and starts the
/// writes the pipeline allows (fenced on the leader subject; one task's
/// records in the order they were made): atomic batches of up to
/// [`journal::MAX_BATCH`] records, one fence check each, at most
/// [`MAX_BATCHES_IN_FLIGHT`] at once; or, where NATS cannot, one fenced
/// write per record, up to [`MAX_IN_FLIGHT`]. As writes are stored, it
/// announces each turn the pipeline releases — once its records and every
/// earlier turn's are stored — in order: leases, revokes, events, replies.
/// So a worker never holds a lease whose attempt is not journaled, and
/// nobody hears "succeeded" (nor gets an outcome acknowledged) before the
/// result is stored; yet the writes of later turns are already under way.
/// The writes under way are polled together here (one
/// `FuturesUnordered`): a tokio task per write would cost a scheduling,
/// and often a thread wake-up, each. Fenced out (a successor leads): stops,
/// announcing nothing more.
pub(in crate::server) async fn commit(mut turns: mpsc::UnboundedReceiver<Turn>, ctx: CommitCtx) {
    let ctx = Arc::new(ctx);
    let mut pipeline: Pipeline<Item, Output> = Pipeline::new(Limits {
        max_records: MAX_IN_FLIGHT,
        max_batches: MAX_BATCHES_IN_FLIGHT,
        max_batch: journal::MAX_BATCH,
    });
    let mut under_way = futures_util::stream::FuturesUnordered::<WriteFuture>::new();
    // Records written on their own take their acknowledgements here.
    let mut acks = Acks::open(&ctx.results).await;
    let mut sweep = tokio::time::interval(ACK_SWEEP);
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    'commit: loop {
        let atomic = ctx.results.atomic.load(Ordering::Relaxed);
        let waiting = acks.as_ref().is_some_and(Acks::waiting);
        let mut writes = Vec::new();
        let mut stored_now = false;
        tokio::select! {
            Some((id, stored)) = under_way.next(), if !under_way.is_empty() => {
                if !stored {
                    break; // fenced out
                }
                stored_now = true;
                writes = pipeline.stored(id);
            }
            ack = next_ack(&mut acks) => match (ack, acks.as_mut()) {
                (Some(ack), Some(inbox)) => match inbox.acked(&ctx.results, &ack) {
                    Some(Ok(id)) => {
                        stored_now = true;
                        writes = pipeline.stored(id);
                    }
                    Some(Err(retry)) => under_way.push(write_fully(&ctx, retry)),
                    None => {}
                },
                // The subscription ended: every write the full way.
                (_, inbox) => {
                    for retry in inbox.map(|i| i.overdue(&ctx.results, None)).unwrap_or_default() {
                        under_way.push(write_fully(&ctx, retry));
                    }
                    acks = None;
                }
            },
            _ = sweep.tick(), if waiting => {
                if let Some(inbox) = acks.as_mut() {
                    for retry in inbox.overdue(&ctx.results, Some(std::time::Instant::now())) {
                        under_way.push(write_fully(&ctx, retry));
                    }
                }
            }
            turn = turns.recv(), if pipeline.accepting(atomic) => {
                // The driver is gone: so is the commit.
                let Some(first) = turn else { break };
                let mut records = first.records.len();
                let mut group = vec![first];
                while records < MAX_IN_FLIGHT {
                    match turns.try_recv() {
                        Ok(turn) => {
                            records += turn.records.len();
                            group.push(turn);
                        }
                        Err(_) => break,
                    }
                }
                writes = pipeline.push(group, atomic);
            }
        }
        for write in writes {
            match start_write(&ctx, &mut acks, write).await {
                Some(Started::Future(future)) => under_way.push(future),
                Some(Started::Sent) => {}
                None => break 'commit, // fenced out
            }
        }
        while let Some(released) = pipeline.release() {
            if !announce(&ctx, released).await {
                break 'commit;
            }
        }
        let busy = !under_way.is_empty() || acks.as_ref().is_some_and(Acks::waiting);
        note_progress(&ctx.waiting_since, busy, stored_now);
    }
    // Fenced out or stopped: the replies of turns never announced will
    // not come.
    ctx.replies.close();
}

/// Keeps `waiting_since` (wall-clock ms): 0 while no write is under way;
/// otherwise when the journal last made progress (a write stored), or
/// began to wait.
fn note_progress(waiting_since: &AtomicU64, busy: bool, stored: bool) {
    let since = waiting_since.load(Ordering::Relaxed);
    let now = crate::server::wall_now().0.max(1);
    match (busy, stored, since) {
        (false, _, 0) => {}
        (false, _, _) => waiting_since.store(0, Ordering::Relaxed),
        (true, true, _) | (true, false, 0) => waiting_since.store(now, Ordering::Relaxed),
        (true, false, _) => {}
    }
}

/// The next acknowledgement on the inbox; never, without one.
async fn next_ack(acks: &mut Option<Acks>) -> Option<async_nats::Message> {
    match acks {
        Some(acks) => acks.next().await,
        None => std::future::pending().await,
    }
}

/// How a write the pipeline allowed was started.
enum Started {
    /// Under way as a future of its own.
    Future(WriteFuture),
    /// Published; its acknowledgement comes to the inbox.
    Sent,
}

/// Starts one write the pipeline allowed: a record on its own goes through
/// the inbox ([`Acks`]) when there is one, anything else as a future of
/// its own. `None`: fenced out.
async fn start_write(
    ctx: &Arc<CommitCtx>,
    acks: &mut Option<Acks>,
    write: pipeline::Write<Item>,
) -> Option<Started> {
    let id = write.id;
    if write.batch {
        // Encoded here: the future keeps the bytes, not the records.
        let records: Vec<(Key, Bytes)> = write
            .records
            .into_iter()
            .filter_map(|r| match r.body {
                Item::Task(p) => Some((
                    Key::Task(p.seq),
                    ctx.seal
                        .seal(&p.seq.to_string(), wire::encode(&p.record).into()),
                )),
                Item::Results(n, records) => {
                    let key = results_key(ctx, n, &records);
                    let body = ctx.seal.seal(&key, wire::encode(&records).into());
                    Some((Key::Named(key), body))
                }
                Item::Starts(..) | Item::Schedule(..) => None,
            })
            .collect();
        let ctx = ctx.clone();
        return Some(Started::Future(Box::pin(async move {
            (id, store_batch(&ctx, records).await)
        })));
    }
    let Some(record) = write.records.into_iter().next() else {
        return Some(Started::Future(Box::pin(async move { (id, true) })));
    };
    let (key, body): (Key, Bytes) = match record.body {
        Item::Task(p) if p.dead_letter.is_some() => {
            let encoded = Encoded::of(p, &ctx.seal);
            let ctx = ctx.clone();
            return Some(Started::Future(Box::pin(async move {
                (id, store_record(&ctx, encoded).await)
            })));
        }
        Item::Task(p) => (Key::Task(p.seq), wire::encode(&p.record).into()),
        Item::Starts(slot, starts) => (Key::Slot(slot), wire::encode(&starts).into()),
        Item::Results(n, records) => {
            let key = results_key(ctx, n, &records);
            (Key::Named(key), wire::encode(&records).into())
        }
        Item::Schedule(name, stored) => {
            // MessagePack: the template's payload as bytes, not a JSON
            // array of numbers four times its size (issue 34). Records
            // stored as JSON before are still read
            // ([`crate::server::takeover::read_schedules`]).
            let body = wire::encode(&stored);
            (Key::Named(schedule_key(&name)), body.into())
        }
    };
    let retry = match acks {
        Some(acks) => match acks.send(&ctx.results, &ctx.seal, id, key, body).await {
            Sending::Sent => return Some(Started::Sent),
            Sending::Fenced => return None,
            Sending::Retry(retry) => retry,
        },
        None => {
            let body = ctx.seal.seal(&key.to_string(), body);
            (id, key, body)
        }
    };
    Some(Started::Future(write_fully(ctx, retry)))
}

/// The key of this leadership's result batch `n`, indexed as it is
/// written: a lookup reaches for it only once the leader no longer
/// retains the results, long after.
fn results_key(ctx: &CommitCtx, n: u64, records: &wire::ResultRecords) -> String {
    let key = wire::result_key(ctx.results.epoch, n);
    let ids = records.results.iter().map(|r| r.id.0).collect();
    ctx.index.add(&key, records.written_at, ids);
    key
}

/// A record write the full way (`put_counted`: errors told apart, retried
/// while NATS is away) as a future of its own.
fn write_fully(ctx: &Arc<CommitCtx>, (id, key, body): Retry) -> WriteFuture {
    let ctx = ctx.clone();
    Box::pin(async move { (id, put_counted(&ctx, &key.to_string(), &body).await) })
}

/// Announces a turn the pipeline released: its terminal tasks' submissions
/// may be purged, then its leases (those for one worker together),
/// revokes, events and replies go out, then the driver hears which leases
/// went and that the turn is stored. `false`: the leadership may no
/// longer act, and nothing more is announced.
async fn announce(ctx: &CommitCtx, released: Released<Output>) -> bool {
    let Released {
        number,
        mut announce,
        terminal,
    } = released;
    if !ctx.tenure.valid() {
        tracing::warn!("leadership not renewed in time: announcing nothing more");
        return false;
    }
    if !terminal.is_empty() {
        let mut pending = ctx.pending.lock().unwrap_or_else(|e| e.into_inner());
        for seq in terminal {
            pending.remove(&seq);
        }
    }
    let mut leases = Vec::new();
    // The leases of this turn for each worker that takes them together:
    // one message, sent where the first of them stood (so never after a
    // revoke that follows one of them). By index: no subject or body
    // copied.
    let mut groups: FxHashMap<usize, Vec<usize>> = FxHashMap::default();
    {
        let mut first: FxHashMap<&str, usize> = FxHashMap::default();
        for (i, output) in announce.iter().enumerate() {
            if let Output::Lease {
                subject,
                together: true,
                ..
            } = output
            {
                let head = *first.entry(subject.as_str()).or_insert(i);
                groups.entry(head).or_default().push(i);
            }
        }
    }
    for i in 0..announce.len() {
        // A placeholder that costs nothing: each output is taken once.
        let output = std::mem::replace(&mut announce[i], Output::Discard { seq: 0 });
        let (subject, body) = match output {
            Output::Publish { subject, body } => (subject, body),
            Output::Lease {
                subject,
                body,
                task,
                attempt,
                together: grouped,
            } => {
                leases.push((task, attempt));
                if !grouped {
                    (subject, body)
                } else {
                    match groups.remove(&i) {
                        // Sent with the first of its worker's.
                        None => continue,
                        Some(group) if group.len() == 1 => (subject, body),
                        Some(group) => {
                            let mut bodies = Vec::with_capacity(group.len());
                            bodies.push(body);
                            for &j in &group[1..] {
                                if let Output::Lease { body, .. } = &mut announce[j] {
                                    bodies.push(std::mem::take(body));
                                }
                            }
                            // `P.worker.<id>.lease` → `P.worker.<id>.leases`.
                            (format!("{subject}s"), wire::leases_body(&bodies).into())
                        }
                    }
                }
            }
            Output::Reply { id, reply } => {
                ctx.replies.send(id, reply);
                continue;
            }
            Output::Fire {
                name,
                tick,
                kind,
                task,
            } => {
                tokio::spawn(publish_fire(
                    ctx.js.clone(),
                    ctx.subjects.clone(),
                    ctx.seal.clone(),
                    ctx.inputs.clone(),
                    (name, tick, kind),
                    task,
                ));
                continue;
            }
            // Once the turn is stored: a task whose end was never stored
            // (a leader deposed meanwhile) is traced by its successor.
            Output::Trace(trace) => {
                if let Some(telemetry) = &ctx.telemetry {
                    telemetry.task(*trace);
                }
                continue;
            }
            Output::Persist { .. }
            | Output::PersistStarts { .. }
            | Output::PersistResults { .. }
            | Output::PersistSchedule { .. }
            | Output::Discard { .. } => continue,
        };
        let sent = match ctx.guard.sign_to_worker(&subject, &body) {
            Some(headers) => {
                ctx.client
                    .publish_with_headers(subject, headers, body)
                    .await
            }
            None => ctx.client.publish(subject, body).await,
        };
        if let Err(e) = sent {
            tracing::warn!(error = %e, "publish failed");
        }
    }
    if !leases.is_empty() {
        // Full: the leases keep the time to live counted from the
        // decision (as before), nothing worse.
        let _ = ctx.inputs.try_send(Input::LeasesSent(leases));
    }
    // Full: a later one says as much (slots wait a little longer).
    let _ = ctx.inputs.try_send(Input::Stored(number));
    true
}

/// The results bucket's key of a schedule's record.
pub(in crate::server) fn schedule_key(name: &str) -> String {
    format!("sched.{name}")
}

/// Publishes a schedule's fire to the submit stream under its tick's id
/// (`Nats-Msg-Id`, [`crate::server::fires::fire_submission`]): a second
/// publish of the tick (a successor deciding it again) is answered with
/// the first one's sequence — taken only once the message stored there is
/// read back and found to be a fire of the same tick
/// ([`crate::server::fires::is_own_fire`]), so no message that merely
/// holds the id becomes the tick's run. The answer goes back to the
/// driver; a full input queue makes it wait, never drop it.
async fn publish_fire(
    js: jetstream::Context,
    subjects: Subjects,
    seal: seal::Seal,
    inputs: mpsc::Sender<Input>,
    (name, tick, kind): (String, Millis, crate::schedule::FireKind),
    task: Box<Task>,
) {
    let result = async {
        let owner = task.owner.as_deref();
        let (subject, headers, body) = crate::server::fires::fire_submission(
            &subjects,
            &seal,
            &task,
            (&name, tick),
            owner,
            crate::server::wall_now(),
        )?;
        let ack = js
            .publish_with_headers(subject.clone(), headers, body)
            .await
            .map_err(|e| unavailable(format!("publishing the fire: {e}")))?
            .await
            .map_err(|e| unavailable(format!("fire not acknowledged: {e}")))?;
        if ack.duplicate {
            let stored = js
                .get_stream(subjects.submit_stream())
                .await
                .map_err(|e| unavailable(format!("reading the tick's earlier fire: {e}")))?
                .get_raw_message(ack.sequence)
                .await
                .map_err(|e| unavailable(format!("reading the tick's earlier fire: {e}")))?;
            let at = Millis((stored.time.unix_timestamp_nanos() / 1_000_000).max(0) as u64);
            let own = crate::server::fires::is_own_fire(
                &seal,
                &subject,
                (&name, tick),
                &stored.subject,
                Some(&stored.headers),
                &stored.payload,
                at,
            );
            if !own {
                tracing::warn!(schedule = %name, tick = tick.0, seq = ack.sequence,
                    "a fire's id is held by a message that is not the tick's fire");
                return Err(crate::server::fires::tick_taken());
            }
        }
        Ok(ack.sequence)
    }
    .await;
    let _ = inputs
        .send(Input::FirePublished {
            name,
            tick,
            kind,
            result,
        })
        .await;
}

/// One write under way in the committer: its id, and whether it was
/// stored (`false`: fenced out).
pub(in crate::server) type WriteFuture =
    std::pin::Pin<Box<dyn std::future::Future<Output = (WriteId, bool)> + Send>>;

/// Stores one record (a refused submission's dead letter first), retrying
/// while NATS is away; `false` if fenced out — a successor leads and will
/// finish the task itself (the submission stays pending: this server
/// purges nothing past it).
pub(in crate::server) async fn store_record(ctx: &CommitCtx, write: Encoded) -> bool {
    let Encoded {
        seq,
        body,
        dead_letter,
    } = write;
    if let Some(dead_letter) = dead_letter {
        let (pool, reason) = *dead_letter;
        let max_payload = ctx.client.server_info().max_payload;
        // Boxed: the rare path would otherwise make every record's write
        // future as large as its own.
        Box::pin(dead_letter_copy(
            &ctx.js,
            &ctx.submit_stream,
            &ctx.subjects,
            seq,
            &pool,
            &reason,
            max_payload,
        ))
        .await;
    }
    put_counted(ctx, &seq.to_string(), &body).await
}

/// A record write as the committer keeps it while under way: the encoded
/// record, and (rarely) the pool and reason of a dead letter to copy first.
pub(in crate::server) struct Encoded {
    pub(in crate::server) seq: u64,
    pub(in crate::server) body: Bytes,
    pub(in crate::server) dead_letter: Option<Box<(PoolName, WireError)>>,
}

impl Encoded {
    pub(in crate::server) fn of(write: Persisted, seal: &seal::Seal) -> Encoded {
        Encoded {
            seq: write.seq,
            body: seal.seal(&write.seq.to_string(), wire::encode(&write.record).into()),
            dead_letter: write
                .dead_letter
                .map(|reason| Box::new((write.record.pool, reason))),
        }
    }
}

/// One fenced write under `key` ([`put_key_retrying`]), counted in the
/// `cronoq_journal_pending_records` gauge while under way.
pub(in crate::server) async fn put_counted(ctx: &CommitCtx, key: &str, body: &Bytes) -> bool {
    let in_flight = &ctx.results.pending_records;
    in_flight.fetch_add(1, Ordering::Relaxed);
    let stored = put_key_retrying(ctx, key, body).await;
    in_flight.fetch_sub(1, Ordering::Relaxed);
    stored
}

/// Stores a batch of records (none with a dead letter), retrying while
/// NATS is away; `false` if fenced out. Should the stream stop allowing
/// atomic batches, one record after another.
pub(in crate::server) async fn store_batch(ctx: &CommitCtx, records: Vec<(Key, Bytes)>) -> bool {
    let mut delay = Duration::from_millis(100);
    let in_flight = &ctx.results.pending_records;
    let n = records.len() as u64;
    in_flight.fetch_add(n, Ordering::Relaxed);
    let stored = loop {
        match ctx.results.put_batch(&records).await {
            Ok(stored) => break stored,
            Err(journal::BatchError::Disabled) => {
                tracing::warn!(
                    "the results stream no longer allows atomic batches; writing record by record"
                );
                let mut stored = true;
                for (key, body) in &records {
                    if !put_key_retrying(ctx, &key.to_string(), body).await {
                        stored = false;
                        break;
                    }
                }
                break stored;
            }
            Err(journal::BatchError::Failed(e)) => {
                tracing::warn!(records = n, error = %e, "storing a batch of task records failed; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(JOURNAL_RETRY_MAX);
            }
        }
    };
    in_flight.fetch_sub(n, Ordering::Relaxed);
    stored
}

/// The longest pause between two tries of a journal write: once NATS is
/// back (a restart), writes resume within it.
pub(in crate::server) const JOURNAL_RETRY_MAX: Duration = Duration::from_secs(1);

/// One fenced write under `key`, retried while NATS is away; `false` if
/// fenced out.
pub(in crate::server) async fn put_key_retrying(ctx: &CommitCtx, key: &str, body: &Bytes) -> bool {
    let mut delay = Duration::from_millis(100);
    loop {
        match ctx.results.put(key, body.clone()).await {
            Ok(stored) => return stored,
            Err(e) => {
                tracing::warn!(key, error = %e, "storing a journal record failed; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(JOURNAL_RETRY_MAX);
            }
        }
    }
}

#[cfg(test)]
mod progress_tests {
    use super::*;

    /// The bookkeeping behind `/readyz`'s "journal stalled" (issue 34).
    #[test]
    fn the_journal_waits_from_its_first_write_until_one_is_stored() {
        let since = AtomicU64::new(0);
        note_progress(&since, false, false);
        assert_eq!(since.load(Ordering::Relaxed), 0, "idle");
        note_progress(&since, true, false);
        assert!(since.load(Ordering::Relaxed) > 0, "began to wait");
        since.store(1, Ordering::Relaxed);
        note_progress(&since, true, false);
        assert_eq!(since.load(Ordering::Relaxed), 1, "still waiting: unchanged");
        note_progress(&since, true, true);
        assert!(since.load(Ordering::Relaxed) > 1, "progress");
        note_progress(&since, false, true);
        assert_eq!(since.load(Ordering::Relaxed), 0, "idle again");
    }
}
