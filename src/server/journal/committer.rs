//! The committer: appends each group of the driver's turns to the log as
//! one entry (`server::log_store`: pipelined, fenced by the log itself)
//! and announces each turn once its entry, and every earlier one, is
//! stored. Then it applies the entry to the leadership's copy of the log
//! state (the same function every standby applies it with), writes the
//! results it holds to the results bucket for lookups, and now and then
//! stores a snapshot of that state and truncates the log below it.

use rustc_hash::FxHashMap;

use crate::server::*;

use super::super::log_store::{Appender, LogError, LogStore};
use super::turns::{group, Announcer, Queued, Released, Turn};

/// The most entries being appended at once; the driver's turns queue up
/// behind them, and the next entry takes every queued turn (group
/// commit): the busier the log, the larger its entries.
pub(in crate::server) const MAX_ENTRIES_IN_FLIGHT: usize = 64;

/// The most items one entry takes from the queue (it is cut into messages
/// as large as NATS allows anyway).
const MAX_ITEMS_PER_ENTRY: usize = 4096;

/// When the leadership stores a snapshot of the log state.
#[derive(Clone, Copy, Debug)]
pub(in crate::server) struct SnapshotEvery {
    pub(in crate::server) entries: u64,
    pub(in crate::server) interval: Duration,
}

/// Where the committer stores and announces.
pub(in crate::server) struct CommitCtx {
    pub(in crate::server) client: async_nats::Client,
    /// The driver's inputs: which leases went out, and when.
    pub(in crate::server) inputs: mpsc::Sender<Input>,
    pub(in crate::server) pending: Pending,
    pub(in crate::server) js: jetstream::Context,
    pub(in crate::server) submit_stream: stream::Stream,
    pub(in crate::server) subjects: Subjects,
    /// Signs leases and revokes with the worker's session (auth on).
    pub(in crate::server) guard: Arc<Guard>,
    /// Seals every record written (the servers' storage key).
    pub(in crate::server) seal: seal::Seal,
    /// A turn is announced only while the leadership may act: its writes
    /// may have been stored just before a pause, and a lease or reply sent
    /// after it would come from a deposed leader.
    pub(in crate::server) tenure: Tenure,
    /// Local callers waiting on replies (closed when the committer stops).
    pub(in crate::server) replies: Replies,
    /// Wall-clock ms since which writes are under way and none was stored
    /// (0: none under way): `/readyz` is 503 past a bound.
    pub(in crate::server) waiting_since: Arc<AtomicU64>,
    /// Entries being appended (the `cronoq_journal_pending_records` gauge).
    pub(in crate::server) pending_records: Arc<AtomicU64>,
    /// Set when an append is refused: a successor leads.
    pub(in crate::server) lost: watch::Sender<Option<String>>,
    /// The log, for snapshots.
    pub(in crate::server) log: LogStore,
    /// This process's copy of the log state (applied as entries are
    /// stored; followed again once this leadership ends).
    pub(in crate::server) journal: warm::WarmJournal,
    /// The results bucket's subject prefix (`$KV.<bucket>.`): finished
    /// tasks' records for lookups, written after their entry is stored.
    pub(in crate::server) results_prefix: String,
    pub(in crate::server) snapshot_every: SnapshotEvery,
    /// Where finished tasks' spans go (telemetry on).
    pub(in crate::server) telemetry: Option<crate::telemetry::Telemetry>,
}

/// The journal's group commit, pipelined: it takes the driver's turns in
/// order, as many as are queued at once, appends their records as one
/// entry (up to [`MAX_ENTRIES_IN_FLIGHT`] under way), and announces each
/// turn — leases, revokes, events, replies — once its entry and every
/// earlier one are stored. So a worker never holds a lease whose attempt
/// is not in the log, and nobody hears "succeeded" (nor gets an outcome
/// acknowledged) before the result is stored. Fenced out (a successor
/// leads): stops, announcing nothing more.
pub(in crate::server) async fn commit(
    mut turns: mpsc::UnboundedReceiver<Turn>,
    ctx: CommitCtx,
    mut appender: Appender,
) {
    let ctx = Arc::new(ctx);
    let mut announcer = Announcer::default();
    let mut since_snapshot = 0u64;
    let mut last_snapshot = tokio::time::Instant::now();
    let mut snapshotting: Option<tokio::task::JoinHandle<()>> = None;
    'commit: loop {
        let mut stored_now = false;
        tokio::select! {
            stored = appender.next_stored(), if appender.pending() > 0 => {
                let (seq, entry) = match stored {
                    Ok(stored) => stored,
                    Err(e) => {
                        if matches!(e, LogError::Fenced) {
                            let _ = ctx.lost.send(Some(
                                "an append to the log was fenced out: another server leads".into(),
                            ));
                        }
                        tracing::warn!(error = %e, "the log refused an append; announcing nothing more");
                        break;
                    }
                };
                stored_now = true;
                ctx.journal.apply_stored(seq, &entry);
                since_snapshot += 1;
                // This entry's turns, then every turn queued behind it that
                // stores nothing.
                for q in announcer.stored() {
                    if !announce_group(&ctx, q, seq).await {
                        break 'commit;
                    }
                }
            }
            turn = turns.recv(), if appender.pending() < MAX_ENTRIES_IN_FLIGHT => {
                // The driver is gone: so is the commit.
                let Some(first) = turn else { break };
                let mut items = first.records.len();
                let mut taken = vec![first];
                while items < MAX_ITEMS_PER_ENTRY {
                    match turns.try_recv() {
                        Ok(turn) => {
                            items += turn.records.len();
                            taken.push(turn);
                        }
                        Err(_) => break,
                    }
                }
                let group = group(taken);
                for (seq, pool, reason) in &group.dead_letters {
                    copy_dead_letter(&ctx, *seq, pool, reason).await;
                }
                if !group.items.is_empty() {
                    if let Err(e) = appender.send(group.items).await {
                        tracing::warn!(error = %e, "appending to the log failed");
                        break;
                    }
                }
                if let Some(now) = announcer.push(group.queued) {
                    // It stores nothing, so it has no results to write.
                    if !announce_group(&ctx, now, 0).await {
                        break 'commit;
                    }
                }
            }
        }
        ctx.pending_records
            .store(appender.pending() as u64, Ordering::Relaxed);
        note_progress(&ctx.waiting_since, appender.pending() > 0, stored_now);
        let due = since_snapshot >= ctx.snapshot_every.entries
            || (since_snapshot > 0 && last_snapshot.elapsed() >= ctx.snapshot_every.interval);
        if due && snapshotting.as_ref().map_or(true, |s| s.is_finished()) {
            since_snapshot = 0;
            last_snapshot = tokio::time::Instant::now();
            snapshotting = Some(tokio::spawn(snapshot(ctx.clone())));
        }
    }
    // Fenced out or stopped: the replies of turns never announced will
    // not come.
    ctx.replies.close();
}

/// Stores a snapshot of the leadership's log state (only stored entries
/// are applied to it), pruned below the submit stream's first message,
/// then truncates the log below it.
async fn snapshot(ctx: Arc<CommitCtx>) {
    if let Ok(info) = ctx.submit_stream.clone().info().await {
        ctx.journal.prune_below(info.state.first_sequence);
    }
    let (at, bytes) = ctx.journal.snapshot();
    match ctx.log.write_snapshot(at, bytes).await {
        Ok(written) => tracing::debug!(
            at,
            bytes = written.bytes,
            took_ms = written.took.as_millis() as u64,
            "snapshot stored"
        ),
        Err(e) => tracing::warn!(at, error = %e, "storing a snapshot failed"),
    }
}

/// Announces a group commit stored as the log's entry `entry_seq`: its
/// results written for lookups, then each turn. `false`: the leadership
/// may no longer act.
async fn announce_group(ctx: &CommitCtx, q: Queued, entry_seq: u64) -> bool {
    write_results(ctx, entry_seq, q.results).await;
    for released in q.turns {
        if !announce(ctx, released).await {
            return false;
        }
    }
    true
}

/// Writes finished tasks' records to the results bucket for lookups
/// (`GET /v1/tasks/{id}` of a task the leader no longer retains), a
/// message per block of ids ([`lookups`](super::lookups)): after their
/// entry (`entry_seq`) is stored, not waited for, never read to decide
/// anything.
async fn write_results(ctx: &CommitCtx, entry_seq: u64, results: Vec<(u64, Vec<u8>)>) {
    if results.is_empty() {
        return;
    }
    // A core publish: the stream stores it, and no acknowledgement comes
    // back to wait for or to cost a message.
    for (key, body) in super::lookups::pack(entry_seq, results, ctx.log.max_message()) {
        let body = ctx.seal.seal(&key, body.into());
        let subject = format!("{}{key}", ctx.results_prefix);
        if let Err(e) = ctx.client.publish(subject, body).await {
            tracing::debug!(key, error = %e, "writing results for lookups failed");
        }
    }
}

/// Copies a refused submission to the dead-letter stream before its
/// record is appended.
async fn copy_dead_letter(ctx: &CommitCtx, seq: u64, pool: &PoolName, reason: &WireError) {
    let max_payload = ctx.client.server_info().max_payload;
    Box::pin(dead_letter_copy(
        &ctx.js,
        &ctx.submit_stream,
        &ctx.subjects,
        seq,
        pool,
        reason,
        max_payload,
    ))
    .await;
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

/// Announces a turn the pipeline released: its terminal tasks' submissions
/// may be purged, then its leases (those for one worker together),
/// revokes, events and replies go out, then the driver hears which leases
/// went and that the turn is stored. `false`: the leadership may no
/// longer act, and nothing more is announced.
async fn announce(ctx: &CommitCtx, released: Released) -> bool {
    let Released {
        mut announce,
        terminal,
    } = released;
    // Stored, but announced only while the leadership may act: after a
    // pause, once a renewal is stored again (else the leadership is
    // stopped, this task with it).
    ctx.tenure.wait_valid().await;
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
            Output::Persist { .. } | Output::PersistSchedule { .. } | Output::Discard { .. } => {
                continue
            }
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
    true
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
