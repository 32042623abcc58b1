//! The driver's loop: feeds it inputs and timers with their time, checks the leadership may act first, and hands each turn's outputs to the committer.

use super::*;

/// Results being stored: their submissions must not be purged yet.
pub(super) type Pending = Arc<std::sync::Mutex<BTreeSet<u64>>>;

/// The driver loop: one input at a time (then whatever else is queued),
/// housekeeping when the next deadline is due (at least once a second), the
/// turn's outputs handed to the committer in order.
// Each argument is one channel or handle the loop owns; a struct around
// them would only rename the list.
#[allow(clippy::too_many_arguments)]
pub(super) async fn drive(
    mut driver: Driver,
    mut inputs: mpsc::Receiver<Input>,
    commit: mpsc::UnboundedSender<Turn>,
    pending: Pending,
    floor: watch::Sender<u64>,
    beat: &AtomicU64,
    consumed: &AtomicU64,
    tenure: Tenure,
) {
    // Every deadline (the core's timers, lease expiries, silent workers,
    // the re-attach grace) is in `next_wakeup`; the loop also turns once a
    // second so `/readyz` sees it beat.
    let housekeeping_every = Millis(1_000);
    let mut last_housekeeping = wall_now();
    loop {
        let now = wall_now();
        beat.store(now.0, Ordering::Relaxed);
        let due = driver
            .next_wakeup()
            .map_or(last_housekeeping.plus(housekeeping_every), |w| {
                w.min(last_housekeeping.plus(housekeeping_every))
            });
        let wait = Duration::from_millis(due.0.saturating_sub(now.0));
        tokio::select! {
            input = inputs.recv() => {
                let Some(input) = input else { return };
                // The right to act is judged before every input: a pause
                // (SIGSTOP, a stalled VM) can fall between any two.
                if !tenure.check(&mut driver) {
                    return;
                }
                handle_guarded(&mut driver, wall_now(), input);
                for _ in 0..1024 {
                    match inputs.try_recv() {
                        Ok(input) => {
                            if !tenure.check(&mut driver) {
                                return;
                            }
                            handle_guarded(&mut driver, wall_now(), input)
                        }
                        Err(_) => break,
                    }
                }
            }
            _ = tokio::time::sleep(wait) => {}
        }
        // Before the timers too: a leader resumed after a pause past the
        // election timeout finds every worker silent and every lease
        // expired, and must not act on that (a successor leads).
        if !tenure.check(&mut driver) {
            return;
        }
        let now = wall_now();
        if now >= last_housekeeping.plus(housekeeping_every)
            || driver.next_wakeup().is_some_and(|w| w <= now)
        {
            let turn =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| driver.housekeeping(now)));
            if let Err(panic) = turn {
                let why = crate::task::panic_message(&*panic);
                tracing::error!(panic = %why, "housekeeping panicked; going on");
            }
            last_housekeeping = now;
        }
        if !tenure.check(&mut driver) {
            return;
        }
        let mut turn = Turn::default();
        for output in driver.take_outputs() {
            match output {
                Output::Persist {
                    seq,
                    record,
                    dead_letter,
                } => {
                    if record.state.is_terminal() {
                        // Marked before the floor can pass it (below).
                        pending
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .insert(seq);
                    }
                    turn.records.push(
                        Item::Task(Persisted {
                            seq,
                            record,
                            dead_letter,
                        })
                        .record(),
                    );
                }
                Output::PersistStarts { slot, record } => {
                    turn.records.push(Item::Starts(slot, record).record())
                }
                Output::PersistSchedule { name, stored } => {
                    turn.records.push(Item::Schedule(name, stored).record())
                }
                // A discarded duplicate has no result: the purge takes it.
                Output::Discard { .. } => {}
                announce => turn.announce.push(announce),
            }
        }
        turn.number = driver.turn();
        if !(turn.records.is_empty() && turn.announce.is_empty()) && commit.send(turn).is_err() {
            // The committer stopped: fenced out, a successor leads.
            return;
        }
        let _ = floor.send_if_modified(|f| {
            let new = driver.purge_floor();
            std::mem::replace(f, new) != new
        });
        consumed.store(driver.consumed_below(), Ordering::Relaxed);
    }
}

/// Hands one input to the driver. A panic (a bug: every input is checked)
/// is caught and logged with the submission's sequence; a submission that
/// caused one is refused, so a restart does not meet it again, and the
/// loop goes on.
pub(super) fn handle_guarded(driver: &mut Driver, now: Millis, input: Input) {
    let submitted = match &input {
        Input::Submitted { seq, pool, .. } | Input::Recovered { seq, pool, .. } => {
            Some((*seq, pool.clone()))
        }
        _ => None,
    };
    let turn = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| driver.handle(now, input)));
    if let Err(panic) = turn {
        let why = crate::task::panic_message(&*panic);
        match submitted {
            Some((seq, pool)) => {
                tracing::error!(seq, panic = %why, "a submission panicked the driver; refusing it");
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    driver.refuse_submission(
                        now,
                        TaskId(seq),
                        pool,
                        WireError::new(
                            ErrorCode::INTERNAL,
                            format!("the submission could not be processed: {why}"),
                        ),
                    )
                }));
            }
            None => tracing::error!(panic = %why, "an input panicked the driver; going on"),
        }
    }
}
