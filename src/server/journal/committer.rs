//! The committer: stores each turn's records (task records, start records, atomic batches), keeping one task's records in order, and announces a turn only when it and every earlier turn are stored.

use crate::server::*;

/// A task's record to store (a live task's attempts, or a finished
/// task's result); a refused submission's dead letter to write first.
pub(in crate::server) struct Persisted {
    pub(in crate::server) seq: u64,
    pub(in crate::server) record: wire::TaskRecord,
    pub(in crate::server) dead_letter: Option<WireError>,
}

/// What one driver turn produced: records to store, then what to announce.
#[derive(Default)]
pub(in crate::server) struct Turn {
    /// The driver's turn number ([`driver::Driver::turn`]).
    pub(in crate::server) number: u64,
    pub(in crate::server) writes: Vec<Persisted>,
    /// Start records, by slot.
    pub(in crate::server) starts: Vec<(u32, wire::StartRecords)>,
    pub(in crate::server) announce: Vec<Output>,
}

/// The most records being written at once; the driver's turns queue up
/// behind them.
pub(in crate::server) const MAX_IN_FLIGHT: usize = 4096;

/// The most atomic batches being written at once. While one is under way
/// the driver's turns queue up, and the next batch takes every queued
/// record (group commit): the busier the journal, the larger its batches.
/// One: a replicated stream admits one fenced write per subject at a time
/// (10164) anyway.
pub(in crate::server) const MAX_BATCHES_IN_FLIGHT: usize = 1;

/// Where the committer stores and announces: shared by its two stages and
/// every write.
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
    /// A turn is announced only while the leadership may act: its writes
    /// may have been stored just before a pause, and a lease or reply sent
    /// after it would come from a deposed leader.
    pub(in crate::server) tenure: Tenure,
}

/// One record's write: done with `true` once stored, `false` if fenced out.
pub(in crate::server) type Stored = futures_util::future::Shared<oneshot::Receiver<bool>>;

/// A new write's completion: the sender to finish it, the future to wait on.
pub(in crate::server) fn stored() -> (oneshot::Sender<bool>, Stored) {
    let (done_tx, done_rx) = oneshot::channel();
    (done_tx, futures_util::FutureExt::shared(done_rx))
}

/// An atomic batch being gathered by the committer.
pub(in crate::server) struct Gathered {
    pub(in crate::server) records: Vec<(u64, Bytes)>,
    /// The earlier writes of its tasks, to wait for first.
    pub(in crate::server) before: Vec<Stored>,
    pub(in crate::server) done_tx: oneshot::Sender<bool>,
    pub(in crate::server) done: Stored,
}

impl Gathered {
    pub(in crate::server) fn new() -> Gathered {
        let (done_tx, done) = stored();
        Gathered {
            records: Vec::new(),
            before: Vec::new(),
            done_tx,
            done,
        }
    }

    /// The batch's write (once the earlier writes of its tasks are
    /// stored), for the committer's writer.
    pub(in crate::server) fn write(
        self,
        ctx: &Arc<CommitCtx>,
        permit: tokio::sync::OwnedSemaphorePermit,
    ) -> WriteFuture {
        let ctx = ctx.clone();
        Box::pin(async move {
            for before in self.before {
                if !matches!(before.await, Ok(true)) {
                    return; // fenced out: done_tx drops, nothing more stored
                }
            }
            let ok = store_batch(&ctx, self.records).await;
            drop(permit);
            let _ = self.done_tx.send(ok);
        })
    }
}

/// The journal's group commit, pipelined. Stage one takes the driver's
/// turns in order, as many as are queued at once, and starts writing their
/// records at once (fenced on the leader subject; the latest record per
/// task only; a record waits for the previous write of its task, so one
/// task's records land in the order they were made): in atomic batches of
/// up to [`journal::MAX_BATCH`] records, one fence check each, at most
/// [`MAX_BATCHES_IN_FLIGHT`] at once; or, where NATS cannot, one fenced
/// write per record, up to [`MAX_IN_FLIGHT`]. Stage two waits, turn
/// after turn, until every record of a turn — and of the turns before it —
/// is stored, and only then announces what the turn produced, in order:
/// leases, revokes, events, replies. So a worker never holds a lease whose
/// attempt is not journaled, and nobody hears "succeeded" (nor gets an
/// outcome acknowledged) before the result is stored; yet the writes of
/// later turns are already under way (throughput is not one round trip
/// per turn). Fenced out (a successor leads): stops, announcing nothing
/// more.
pub(in crate::server) async fn commit(mut turns: mpsc::UnboundedReceiver<Turn>, ctx: CommitCtx) {
    let ctx = Arc::new(ctx);
    let (staged_tx, mut staged_rx) =
        mpsc::unbounded_channel::<(Vec<(u64, bool, Stored)>, Vec<Output>, u64)>();
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT));
    let batch_slots = Arc::new(tokio::sync::Semaphore::new(MAX_BATCHES_IN_FLIGHT));
    // The writes under way (records, start records, atomic batches),
    // polled together here: a tokio task per write would cost a
    // scheduling, and often a thread wake-up, each.
    let (write_tx, mut write_rx) = mpsc::unbounded_channel::<WriteFuture>();
    let writer = async {
        let mut under_way = futures_util::stream::FuturesUnordered::new();
        loop {
            tokio::select! {
                Some(()) = under_way.next(), if !under_way.is_empty() => {}
                write = write_rx.recv() => match write {
                    Some(write) => under_way.push(write),
                    // The launcher is gone: so is the commit.
                    None => std::future::pending::<()>().await,
                },
            }
        }
    };
    let launcher = {
        let ctx = ctx.clone();
        let slots = slots.clone();
        async move {
            let mut last_write: rustc_hash::FxHashMap<u64, Stored> = Default::default();
            while let Some(first) = turns.recv().await {
                let atomic = ctx.results.atomic.load(Ordering::Relaxed);
                // Waiting here for a batch to finish lets the turns queue.
                let mut batch_slot = if atomic {
                    match batch_slots.clone().acquire_owned().await {
                        Ok(permit) => Some(permit),
                        Err(_) => return,
                    }
                } else {
                    None
                };
                let (mut writes, mut announce) = (first.writes, first.announce);
                let (mut starts, mut number) = (first.starts, first.number);
                while writes.len() < MAX_IN_FLIGHT {
                    match turns.try_recv() {
                        Ok(turn) => {
                            writes.extend(turn.writes);
                            starts.extend(turn.starts);
                            announce.extend(turn.announce);
                            number = number.max(turn.number);
                        }
                        Err(_) => break,
                    }
                }
                // The latest record of each task stands for the ones before it.
                let mut latest: rustc_hash::FxHashMap<u64, usize> = Default::default();
                for (i, w) in writes.iter().enumerate() {
                    latest.insert(w.seq, i);
                }
                last_write.retain(|_, w| w.peek().is_none());
                let mut stored_now = Vec::with_capacity(latest.len() + starts.len());
                // Start records: a slot is written again only once the
                // writes covering its entries are stored (the driver
                // waits for `Input::Stored`), so nothing to wait for.
                for (slot, record) in starts {
                    let Ok(permit) = slots.clone().acquire_owned().await else {
                        return;
                    };
                    let (done_tx, done) = stored();
                    stored_now.push((0, false, done));
                    let ctx = ctx.clone();
                    // Encoded here, as task records are (`Encoded`).
                    let key = wire::start_key(slot);
                    let body = ctx.seal.seal(&key, wire::encode(&record).into());
                    let write = async move {
                        let ok = put_counted(&ctx, &key, &body).await;
                        drop(permit);
                        let _ = done_tx.send(ok);
                    };
                    if write_tx.send(Box::pin(write)).is_err() {
                        return;
                    }
                }
                let mut batch = Gathered::new();
                for (i, write) in writes.into_iter().enumerate() {
                    if latest.get(&write.seq) != Some(&i) && write.dead_letter.is_none() {
                        continue;
                    }
                    let terminal = write.record.state.is_terminal();
                    if atomic && write.dead_letter.is_none() {
                        if batch.records.len() == journal::MAX_BATCH {
                            let Some(permit) = batch_slot.take() else {
                                return;
                            };
                            let full = std::mem::replace(&mut batch, Gathered::new());
                            if write_tx.send(full.write(&ctx, permit)).is_err() {
                                return;
                            }
                            batch_slot = match batch_slots.clone().acquire_owned().await {
                                Ok(permit) => Some(permit),
                                Err(_) => return,
                            };
                        }
                        if let Some(before) = last_write.insert(write.seq, batch.done.clone()) {
                            batch.before.push(before);
                        }
                        stored_now.push((write.seq, terminal, batch.done.clone()));
                        let body = ctx
                            .seal
                            .seal(&write.seq.to_string(), wire::encode(&write.record).into());
                        batch.records.push((write.seq, body));
                        continue;
                    }
                    let Ok(permit) = slots.clone().acquire_owned().await else {
                        return;
                    };
                    let (done_tx, done) = stored();
                    let before = last_write.insert(write.seq, done.clone());
                    stored_now.push((write.seq, terminal, done));
                    let ctx = ctx.clone();
                    // Encoded here: the future keeps the bytes, not the record.
                    let encoded = Encoded::of(write, &ctx.seal);
                    let write = async move {
                        if let Some(before) = before {
                            if !matches!(before.await, Ok(true)) {
                                return; // fenced out: done_tx drops, nothing more stored
                            }
                        }
                        let ok = store_record(&ctx, encoded).await;
                        drop(permit);
                        let _ = done_tx.send(ok);
                    };
                    if write_tx.send(Box::pin(write)).is_err() {
                        return;
                    }
                }
                if let Some(permit) = batch_slot {
                    if batch.records.is_empty() {
                        // Nobody waits on an empty batch's `done`.
                        drop(permit);
                    } else {
                        if write_tx.send(batch.write(&ctx, permit)).is_err() {
                            return;
                        }
                    }
                }
                if staged_tx.send((stored_now, announce, number)).is_err() {
                    return;
                }
            }
        }
    };
    let releaser = async {
        while let Some((stored, announce, number)) = staged_rx.recv().await {
            let mut terminal = Vec::new();
            for (seq, is_terminal, done) in stored {
                if !matches!(done.await, Ok(true)) {
                    return;
                }
                if is_terminal {
                    terminal.push(seq);
                }
            }
            if !ctx.tenure.valid() {
                tracing::warn!("leadership not renewed in time: announcing nothing more");
                return;
            }
            {
                let mut pending = ctx.pending.lock().unwrap_or_else(|e| e.into_inner());
                for seq in terminal {
                    pending.remove(&seq);
                }
            }
            let mut leases = Vec::new();
            // The leases of this turn for each worker that takes them
            // together: one message, sent where the first of them stood
            // (so never after a revoke that follows one of them).
            let mut together: HashMap<String, Vec<Bytes>> = HashMap::new();
            for output in &announce {
                if let Output::Lease {
                    subject,
                    body,
                    together: true,
                    ..
                } = output
                {
                    together
                        .entry(subject.clone())
                        .or_default()
                        .push(body.clone());
                }
            }
            for output in announce {
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
                        match grouped.then(|| together.remove(&subject)) {
                            None => (subject, body),
                            // Sent with the first of its worker's.
                            Some(None) => continue,
                            Some(Some(group)) if group.len() == 1 => (subject, body),
                            // `P.worker.<id>.lease` → `P.worker.<id>.leases`.
                            Some(Some(group)) => {
                                (format!("{subject}s"), wire::leases_body(&group).into())
                            }
                        }
                    }
                    Output::Reply(reply) => {
                        reply();
                        continue;
                    }
                    Output::Persist { .. }
                    | Output::PersistStarts { .. }
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
        }
    };
    tokio::select! {
        () = launcher => {}
        () = releaser => {}
        () = writer => {}
    }
}

/// One record write under way in the committer.
pub(in crate::server) type WriteFuture =
    std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

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
pub(in crate::server) async fn store_batch(ctx: &CommitCtx, records: Vec<(u64, Bytes)>) -> bool {
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
                for (seq, body) in &records {
                    if !put_retrying(ctx, *seq, body).await {
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

/// One fenced record write, retried while NATS is away; `false` if fenced
/// out.
pub(in crate::server) async fn put_retrying(ctx: &CommitCtx, seq: u64, body: &Bytes) -> bool {
    put_key_retrying(ctx, &seq.to_string(), body).await
}

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
