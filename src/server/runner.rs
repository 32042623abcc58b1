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
    pending_results: Pending,
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
    // One timer for the loop's life, moved only when the deadline does: a
    // fresh one per turn cost a timer entry registered and dropped each
    // time, and a turn with inputs queued needs none.
    let sleep = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(sleep);
    let mut armed: Option<Millis> = None;
    // Each turn's outputs, in a buffer kept from turn to turn.
    let mut outputs: Vec<Output> = Vec::new();
    loop {
        // Before every turn: a pause (SIGSTOP, a stalled VM, renewals
        // that cannot be stored) can fall between any two.
        tenure.wait(&mut driver).await;
        let now = wall_now();
        beat.store(now.0, Ordering::Relaxed);
        let input = match inputs.try_recv() {
            Ok(input) => Some(input),
            Err(mpsc::error::TryRecvError::Disconnected) => return,
            Err(mpsc::error::TryRecvError::Empty) => {
                let due = driver
                    .next_wakeup()
                    .map_or(last_housekeeping.plus(housekeeping_every), |w| {
                        w.min(last_housekeeping.plus(housekeeping_every))
                    });
                if armed != Some(due) {
                    let wait = Duration::from_millis(due.0.saturating_sub(now.0));
                    sleep.as_mut().reset(tokio::time::Instant::now() + wait);
                    armed = Some(due);
                }
                tokio::select! {
                    input = inputs.recv() => match input {
                        Some(input) => Some(input),
                        None => return,
                    },
                    _ = &mut sleep => {
                        // Spent: the next wait sets it again.
                        armed = None;
                        None
                    }
                }
            }
        };
        if let Some(input) = input {
            // The right to act is judged before every input: a pause
            // (SIGSTOP, a stalled VM) can fall between any two.
            feed(&mut driver, &tenure, input).await;
            for _ in 0..1024 {
                match inputs.try_recv() {
                    Ok(input) => feed(&mut driver, &tenure, input).await,
                    Err(_) => break,
                }
            }
        }
        // Before the timers too: a leader resumed after a pause past the
        // election timeout finds every worker silent and every lease
        // expired, and must not act on that (a successor leads).
        tenure.wait(&mut driver).await;
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
        tenure.wait(&mut driver).await;
        driver.take_outputs_into(&mut outputs);
        // Locked once a turn, if any result is stored: marked before the
        // floor can pass them (below).
        let mut pending = None::<std::sync::MutexGuard<'_, BTreeSet<u64>>>;
        let turn = turn_of(outputs.drain(..), |seq| {
            pending
                .get_or_insert_with(|| pending_results.lock().unwrap_or_else(|e| e.into_inner()))
                .insert(seq);
        });
        drop(pending);
        if !turn.is_empty() && commit.send(turn).is_err() {
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

/// Hands `input` to the driver, the right to act judged first (waited
/// for while it lapsed); a batch's inputs in order, judged and stamped
/// once for the batch (handed over at one moment, they only fill the
/// driver's memory: what the driver sends is judged again before the
/// turn's outputs go out).
async fn feed(driver: &mut Driver, tenure: &Tenure, input: Input) {
    tenure.wait(driver).await;
    let now = wall_now();
    match input {
        Input::Batch(inputs) => {
            for input in inputs {
                handle_guarded(driver, now, input);
            }
        }
        input => handle_guarded(driver, now, input),
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
