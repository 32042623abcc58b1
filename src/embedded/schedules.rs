//! The embedded shell of schedules (issue 23): the pure
//! [`Book`](crate::schedule::Book) behind its own lock, a timer loop that
//! sleeps until the book's next wakeup, and the scheduler's own
//! submission and cancel carrying out the book's orders.
//!
//! - **Started lazily**: the book and its loop exist from the first
//!   schedule call on; a scheduler that never schedules pays nothing but
//!   an empty-set check when a task finishes.
//! - **Fires** are submitted with `submit_id(.., eager: false)` and the tick's idempotency
//!   key, so a tick's task is found again rather than doubled (a backfill
//!   of a tick that fired, while its outcome is retained).
//! - **Run ends** come from the scheduler's own completion path: when a
//!   task fired by a schedule finishes, `carry_out` sends its id and state
//!   down a channel this loop reads; no task is polled.
//! - **One lock order**: the book's lock, then the scheduler's. Each fire
//!   is submitted and recorded as accepted under the book's lock, so a run
//!   that ends at once is seen as live when its end arrives. Fires never
//!   start eagerly: their attempts run in tokio tasks, so no executor code
//!   runs under the book's lock, and an executor may call the schedule
//!   methods at any point
//!   (`tests/embedded_schedules.rs::an_executor_may_call_the_schedule_methods_before_its_first_await`).

use std::sync::{Arc, Mutex, MutexGuard, Weak};
use tokio::sync::{mpsc, Notify};

use super::{Error, Inner, Scheduler};
use crate::api::{BackfillRange, BackfillReport, FireRecord, ScheduleEntry, ScheduleInfo};
use crate::core::{Millis, TaskId, TaskState};
use crate::schedule::{Book, BookError, FireKind, Order, ScheduleSpec};

/// The sender half of the run-end channel, held by the scheduler's state.
pub(super) type EndedTx = mpsc::UnboundedSender<(TaskId, TaskState)>;

/// The book and what wakes its loop.
pub(super) struct Schedules {
    book: Mutex<Book>,
    wake: Notify,
}

impl Schedules {
    fn lock(&self) -> MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Scheduler {
    /// The book, started (with its loop) on first use.
    fn schedules(&self) -> Arc<Schedules> {
        self.inner
            .schedules
            .get_or_init(|| {
                let (tx, rx) = mpsc::unbounded_channel();
                self.inner.lock().sched_ended = Some(tx);
                let s = Arc::new(Schedules {
                    book: Mutex::new(Book::new(self.inner.max_schedules)),
                    wake: Notify::new(),
                });
                tokio::spawn(schedule_loop(
                    Arc::downgrade(&self.inner),
                    Arc::downgrade(&s),
                    rx,
                ));
                s
            })
            .clone()
    }

    /// Creates a schedule: its first tick is the first after now. Refused,
    /// changing nothing, with `INVALID_ARGUMENT` (a bad expression, zone,
    /// interval or task option), `ALREADY_EXISTS` (the name is taken) or
    /// `RESOURCE_EXHAUSTED` ([`super::SchedulerBuilder::max_schedules`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use cronoq::schedule::ScheduleSpec;
    /// let s = cronoq::Scheduler::new();
    /// s.set_capacity("reports", 1).unwrap();
    /// s.executor("reports", |_ctx, p: bytes::Bytes| async move { Ok(p) }).unwrap();
    /// let spec: ScheduleSpec = serde_json::from_str(
    ///     r#"{"name": "nightly", "cron": "30 2 * * *", "tz": "Europe/Berlin", "task": {"pool": "reports"}}"#,
    /// ).unwrap();
    /// let info = s.schedule(spec).unwrap();
    /// assert_eq!(info.next_fires.len(), 5);
    /// # }
    /// ```
    pub fn schedule(&self, spec: ScheduleSpec) -> Result<ScheduleInfo, Error> {
        let s = self.schedules();
        let now = self.inner.clock.now();
        let mut book = s.lock();
        let info = ScheduleInfo::of(book.create(spec, None, now)?);
        s.wake.notify_one();
        Ok(info)
    }

    /// Every schedule, by name.
    pub fn list_schedules(&self) -> Vec<ScheduleEntry> {
        let s = self.schedules();
        let book = s.lock();
        book.iter().map(|(_, e)| ScheduleEntry::of(e)).collect()
    }

    /// One schedule (`NOT_FOUND`).
    pub fn get_schedule(&self, name: &str) -> Result<ScheduleInfo, Error> {
        let s = self.schedules();
        let book = s.lock();
        book.get(name)
            .map(ScheduleInfo::of)
            .ok_or_else(|| not_found(name))
    }

    /// Pauses (`true`) or resumes a schedule (`NOT_FOUND`); ticks passed
    /// while paused do not fire.
    pub fn pause_schedule(&self, name: &str, paused: bool) -> Result<ScheduleInfo, Error> {
        let s = self.schedules();
        let now = self.inner.clock.now();
        let mut book = s.lock();
        let orders = book.set_paused(name, paused, now)?;
        self.carry_out_orders(&mut book, orders, now);
        s.wake.notify_one();
        book.get(name)
            .map(ScheduleInfo::of)
            .ok_or_else(|| not_found(name))
    }

    /// Deletes a schedule (`NOT_FOUND`); its runs go on.
    pub fn delete_schedule(&self, name: &str) -> Result<(), Error> {
        let s = self.schedules();
        s.lock().delete(name)?;
        s.wake.notify_one();
        Ok(())
    }

    /// One run now, outside the tick sequence (`NOT_FOUND`).
    pub fn trigger_schedule(&self, name: &str) -> Result<FireRecord, Error> {
        let s = self.schedules();
        let now = self.inner.clock.now();
        let mut book = s.lock();
        let order = book.trigger(name, now)?;
        self.carry_out_orders(&mut book, vec![order], now);
        let record = book
            .get(name)
            .and_then(|e| e.history().next_back().cloned())
            .ok_or_else(|| not_found(name));
        record
    }

    /// Fires each tick in the range by the overlap policy (`NOT_FOUND`,
    /// `INVALID_ARGUMENT` for a range in the future or over 1,000 ticks).
    pub fn backfill_schedule(
        &self,
        name: &str,
        range: BackfillRange,
    ) -> Result<BackfillReport, Error> {
        let s = self.schedules();
        let now = self.inner.clock.now();
        let mut book = s.lock();
        let (orders, skipped) = book.backfill(name, range.from, range.to, now)?;
        let ticks: Vec<Millis> = orders
            .iter()
            .filter_map(|o| match o {
                Order::Fire { tick, .. } => Some(*tick),
                Order::Cancel { .. } => None,
            })
            .collect();
        self.carry_out_orders(&mut book, orders, now);
        let entry = book.get(name).ok_or_else(|| not_found(name))?;
        let fired = entry
            .history()
            .filter(|r| r.kind == FireKind::Backfill && r.fired_at == now)
            .filter(|r| ticks.contains(&r.tick))
            .cloned()
            .collect();
        Ok(BackfillReport { fired, skipped })
    }

    /// The schedule figures, once a schedule call started the book.
    pub(super) fn schedule_metrics(&self) -> Option<crate::metrics::ScheduleMetrics> {
        let s = self.inner.schedules.get()?;
        Some(s.lock().metrics())
    }

    /// Submits fires and cancels, answering the book; refused fires may
    /// free a buffered tick, whose fire is carried out too.
    fn carry_out_orders(&self, book: &mut Book, orders: Vec<Order>, now: Millis) {
        let mut queue = std::collections::VecDeque::from(orders);
        while let Some(order) = queue.pop_front() {
            match order {
                Order::Fire {
                    name,
                    tick,
                    kind,
                    task,
                } => match self.submit_id(*task, false) {
                    Ok(id) => {
                        // The fire lag ends now, not when the step began.
                        let accepted_at = self.inner.clock.now();
                        book.accepted(&name, tick, kind, id, accepted_at);
                        // The key found a task that already finished (a
                        // backfill of a tick that ran): it ends at once.
                        let state = self.task(id).map(|t| t.state);
                        if let Some(state) = state.filter(|s| s.is_terminal()) {
                            queue.extend(book.run_ended(id, state, now));
                        }
                    }
                    Err(e) => {
                        tracing::warn!(schedule = %name, tick = tick.0, error = %e, "schedule fire refused");
                        queue.extend(book.refused(&name, tick, kind, &e.to_string(), now));
                    }
                },
                Order::Cancel { task, key, .. } => {
                    let id = task.or_else(|| self.inner.lock().ledger.by_key(&key));
                    if let Some(id) = id {
                        // Already finished is fine: nothing to cancel.
                        let _ = self.cancel(id);
                    }
                }
            }
        }
    }
}

fn not_found(name: &str) -> Error {
    Error::Schedule(BookError {
        code: crate::core::ErrorCode::NOT_FOUND,
        message: format!("no schedule named {}", crate::core::excerpt(name)),
    })
}

/// Sleeps until the book's next wakeup, a change, or a run's end; steps
/// the book and carries out its orders. Ends with the scheduler.
async fn schedule_loop(
    inner: Weak<Inner>,
    schedules: Weak<Schedules>,
    mut ended: mpsc::UnboundedReceiver<(TaskId, TaskState)>,
) {
    loop {
        let (at, s) = {
            let (Some(inner), Some(s)) = (inner.upgrade(), schedules.upgrade()) else {
                return;
            };
            let next = s.lock().next_wakeup();
            // Wake now and then to notice a dropped scheduler.
            let cap = inner.clock.instant(inner.clock.now().plus(Millis(1_000)));
            (
                next.map(|n| inner.clock.instant(n))
                    .map_or(cap, |a| a.min(cap)),
                s,
            )
        };
        let mut ends = Vec::new();
        tokio::select! {
            _ = tokio::time::sleep_until(at) => {}
            _ = s.wake.notified() => {}
            got = ended.recv() => match got {
                Some(end) => ends.push(end),
                None => return,
            },
        }
        while let Ok(end) = ended.try_recv() {
            ends.push(end);
        }
        let Some(inner) = inner.upgrade() else { return };
        let sched = Scheduler { inner };
        let now = sched.inner.clock.now();
        let behind = {
            let mut book = s.lock();
            let mut orders = Vec::new();
            for (task, state) in ends {
                orders.extend(book.run_ended(task, state, now));
            }
            orders.extend(book.step(now));
            sched.carry_out_orders(&mut book, orders, now);
            book.next_wakeup().is_some_and(|w| w <= now)
        };
        drop(sched);
        if behind {
            // Let other tasks run between the steps of a large catch-up.
            tokio::task::yield_now().await;
        }
    }
}
