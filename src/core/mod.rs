//! The scheduler itself: a pure, sans-IO state machine.
//!
//! [`Core::handle`] takes `now` and an [`Event`] (a fact: a task was
//! submitted, capacity changed, an attempt ended, time passed) and returns
//! [`Action`]s (commands: start attempt N of task T in group G, revoke an
//! attempt, a retry is due at X, a task finished). It never reads a clock,
//! never sleeps, never does I/O and takes no randomness: the same events at
//! the same instants always give the same actions, which is what lets the
//! embedded scheduler, the NATS leader and a replaying standby share it.
//!
//! A shell drives it: wait for input or [`Core::next_wakeup`], call
//! `handle`, carry out the actions in order. A rejected event changes
//! nothing, not even the clock: argument checks and checks that depend on
//! state (unknown task, stale attempt) run before the timers due at `now`
//! fire, so no timer's action can be lost with the error. An accepted event
//! is applied after those timers, exactly as if an [`Event::Tick`] had come
//! first; if they made it moot (a fixed start missed at the very instant it
//! is cancelled), only their actions are returned.
//!
//! The core keeps only live tasks: once it emits [`Action::Finished`] the
//! task is forgotten (the shell keeps results), so memory follows the
//! number of waiting and running tasks.

mod autoscale;
mod check;
mod fair;
mod groups;
mod ids;
mod model;
mod placement;
mod queue;
mod running;
mod sharing;
mod snapshot;
mod spec;
mod timers;
mod waiting;

pub use autoscale::*;
pub use groups::GroupId;
pub use model::*;
pub use snapshot::*;
pub use spec::*;

use groups::Groups;
use ids::IdIndex;
use timers::Timers;

/// A fact the core learns about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// Settings of a pool (created if new).
    PoolConfigured {
        /// The pool.
        pool: PoolName,
        /// Its settings.
        config: PoolConfig,
    },
    /// The slots of the group of `pool` that carries exactly `labels`.
    CapacitySet {
        /// The pool.
        pool: PoolName,
        /// The group's exact label set.
        labels: Labels,
        /// Slots in all (0 removes the group from the snapshot once idle).
        slots: u32,
    },
    /// A task was accepted.
    Submitted(TaskSpec),
    /// Someone asked to cancel a task.
    CancelRequested(TaskId),
    /// The executor or worker acknowledged attempt `attempt`.
    AttemptStarted {
        /// The task.
        task: TaskId,
        /// The attempt.
        attempt: u32,
    },
    /// Attempt `attempt` of `task` ended.
    AttemptEnded {
        /// The task.
        task: TaskId,
        /// The attempt.
        attempt: u32,
        /// How it ended.
        outcome: AttemptOutcome,
    },
    /// Time passed: fire the timers due at `now`.
    Tick,
    /// Recovery after a leader change: a task the previous leader accepted,
    /// which has already made `attempts` attempts. With `running`, the last
    /// of them still runs (its worker re-attached) in the group of `pool`
    /// carrying exactly `running.labels`, whose capacity becomes
    /// `running.capacity` counting that attempt's slot: no `Start` is
    /// returned for it, and it ends with an `AttemptEnded` like any other.
    /// Without, the task waits for attempt `attempts + 1` (at most its last).
    Recovered {
        /// The task.
        spec: TaskSpec,
        /// Attempts made so far.
        attempts: u32,
        /// How many of them were preempted (they do not count toward
        /// `max_attempts`).
        preempted: u32,
        /// Where the last attempt still runs.
        running: Option<Resumed>,
    },
}

/// Where a recovered attempt still runs (see [`Event::Recovered`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resumed {
    /// The group's exact label set.
    pub labels: Labels,
    /// The group's capacity, the resumed attempt's slot included.
    pub capacity: u32,
}

/// Why an attempt is revoked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RevokeReason {
    /// The task was cancelled.
    Cancelled,
    /// The attempt ran past its timeout; it will count as lost.
    Timeout,
    /// A waiter of higher priority takes its slot (SPEC §9): the attempt
    /// ends `preempted`, does not count toward `max_attempts`, and its task
    /// waits again in its place.
    Preempted,
}

/// Why a task ended `cancelled` when nobody asked (SPEC §9 concurrency
/// policies); `None` in [`Action::Finished`] otherwise.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EndReason {
    /// A newer task of its concurrency key (`replace_waiting`) replaced it
    /// while it waited.
    Replaced,
    /// Its concurrency key's limit: `skip` found it full, or a newer task
    /// (`cancel_running`) cancelled it while it ran.
    Concurrency,
}

/// A command for the shell, to carry out in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Run attempt `attempt` of `task` on a slot of `group` (whose slot the
    /// core already counts as busy).
    Start {
        /// The task.
        task: TaskId,
        /// The attempt, from 1.
        attempt: u32,
        /// The group that runs it.
        group: GroupId,
    },
    /// Stop a running attempt. Its slot stays busy until the shell reports
    /// [`Event::AttemptEnded`] for it.
    Revoke {
        /// The task.
        task: TaskId,
        /// The attempt.
        attempt: u32,
        /// The group running it.
        group: GroupId,
        /// Why.
        reason: RevokeReason,
    },
    /// Attempt `attempt - 1` failed or was lost; attempt `attempt` will be
    /// placed at `at`.
    RetryAt {
        /// The task.
        task: TaskId,
        /// The next attempt.
        attempt: u32,
        /// When it becomes eligible.
        at: Millis,
    },
    /// The task reached a terminal state; the core forgets it.
    Finished {
        /// The task.
        task: TaskId,
        /// Its pool.
        pool: PoolName,
        /// `succeeded`, `failed`, `cancelled` or `missed`.
        state: TaskState,
        /// Attempts started.
        attempts: u32,
        /// It finished after its deadline.
        deadline_missed: bool,
        /// Why it was cancelled, when a concurrency policy did it.
        reason: Option<EndReason>,
    },
    /// A preempted attempt ended (SPEC §9): it does not count toward
    /// `max_attempts`, and the task waits again in its original place (or
    /// started again at once: a `Start` follows).
    Preempted {
        /// The task.
        task: TaskId,
        /// The attempt that was preempted.
        attempt: u32,
    },
}

/// Where a live task is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Slab slot unused.
    Free,
    /// Fixed start, reservation not yet due.
    Scheduled,
    /// Fixed start, reservation due, `start_at` not reached.
    Reserved,
    /// Fixed start past `start_at`, waiting for a matching slot.
    Ready,
    /// Waiting in its reqset's queue.
    Queued,
    /// Waiting for its concurrency key's limit, outside the queues.
    Parked,
    /// Waiting out backoff before the next attempt.
    Backoff,
    /// An attempt holds a slot.
    Running,
    /// Cancelled while running: the attempt still holds its slot.
    Draining,
}

const NONE: u64 = u64::MAX;

/// A live task: what placement reads, in one cache line. Options most
/// tasks do not use live in [`TaskExtra`], allocated only when needed.
#[derive(Clone, Debug)]
#[repr(align(64))]
struct TaskRec {
    id: TaskId,
    seq: u64,
    deadline: u64,
    extra: Option<Box<TaskExtra>>,
    pool: u32,
    reqset: u32,
    priority: i32,
    attempt: u32,
    max_attempts: u32,
    bypass: u32,
    group: u32,
    phase: Phase,
    urgent: bool,
    revoked: Option<RevokeReason>,
}

// One cache line per live task: keep it so.
const _: () = assert!(std::mem::size_of::<TaskRec>() == 64);

/// The rarely used part of a task's record. A task without one has no
/// fixed start, estimated run time or attempt timeout, no pending retry or
/// timeout instant, and the backoff its pool has now (when the pool's
/// backoff changes, tasks without one get one holding the old backoff).
#[derive(Clone, Debug)]
struct TaskExtra {
    fixed: Option<FixedStart>,
    est_runtime: u64,
    attempt_timeout: u64,
    /// The pending Retry or AttemptTimeout instant.
    timer_at: u64,
    backoff: Backoff,
    /// Its concurrency key (`fair::NO_KEY`: none) and limit.
    conc: u32,
    conc_limit: u32,
    preemptible: bool,
    /// Attempts that ended preempted (they do not count).
    preempted: u32,
    /// When the running attempt started, in starts of the core (orders
    /// `cancel_running` and preemption victims).
    started: u64,
    /// While its attempt is revoked for preemption: the slab index and
    /// `seq` of the task its slot is kept for.
    kept_for: Option<(u32, u64)>,
    /// A victim's slot is being kept for this task (it preempts no more).
    preempting: bool,
}

/// A task's fair-share part (SPEC §9): its named fairness key, its own
/// weight and its start tag. Kept in `Core::fair_parts`, beside the
/// records rather than in a [`TaskExtra`]: 16 bytes per task instead of a
/// boxed extra for every task that names a key, and a task that names
/// nothing else has no extra to allocate, free or miss in cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FairPart {
    /// Its start tag, once it has one (`NONE` before).
    tag: u64,
    /// Its named fairness key (`fair::NO_KEY`: the pool's unnamed one).
    fair: u32,
    /// Its own fairness weight.
    weight: u32,
}

/// The fair-share part of a task that names no key, with weight 1.
const PLAIN_FAIR: FairPart = FairPart {
    tag: NONE,
    fair: fair::NO_KEY,
    weight: 1,
};

impl TaskRec {
    fn fixed(&self) -> Option<FixedStart> {
        self.extra.as_ref().and_then(|x| x.fixed)
    }

    fn est_runtime(&self) -> u64 {
        self.extra.as_ref().map_or(NONE, |x| x.est_runtime)
    }

    fn attempt_timeout(&self) -> u64 {
        self.extra.as_ref().map_or(NONE, |x| x.attempt_timeout)
    }

    fn timer_at(&self) -> u64 {
        self.extra.as_ref().map_or(NONE, |x| x.timer_at)
    }

    fn start_at(&self) -> u64 {
        self.fixed().map_or(0, |f| f.start_at.0)
    }

    /// The extra record, created with `backoff` (the pool's) if missing.
    fn extra_mut(&mut self, backoff: Backoff) -> &mut TaskExtra {
        self.extra.get_or_insert_with(|| {
            Box::new(TaskExtra {
                fixed: None,
                est_runtime: NONE,
                attempt_timeout: NONE,
                timer_at: NONE,
                backoff,
                conc: fair::NO_KEY,
                conc_limit: 1,
                preemptible: true,
                preempted: 0,
                started: 0,
                kept_for: None,
                preempting: false,
            })
        })
    }

    /// Its concurrency key, or `fair::NO_KEY`.
    fn conc_key(&self) -> u32 {
        self.extra.as_ref().map_or(fair::NO_KEY, |x| x.conc)
    }

    /// Attempts that count toward `max_attempts` (preempted ones do not).
    fn counted_attempts(&self) -> u32 {
        self.attempt - self.extra.as_ref().map_or(0, |x| x.preempted)
    }
}

/// What [`Core::task`] tells about a live task.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TaskView {
    /// The task.
    pub id: TaskId,
    /// Its pool.
    pub pool: PoolName,
    /// Labels it requires.
    pub required: Labels,
    /// Its priority.
    pub priority: i32,
    /// `scheduled`, `queued` or `running` (a cancelled task whose attempt is
    /// still stopping shows `cancelled`).
    pub state: TaskState,
    /// Why it waits, when it does.
    pub reason: Option<WaitReason>,
    /// The key a `quota` or `concurrency` wait is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason_key: Option<String>,
    /// Attempts started so far.
    pub attempts: u32,
    /// The group of the live attempt.
    pub group: Option<Labels>,
    /// It counts as urgent (deadline within the urgency window).
    pub urgent: bool,
}

/// The scheduling core. See the module docs.
///
/// ```
/// use cronoq::core::*;
/// let mut core = Core::new();
/// let pool = PoolName::new("inference").unwrap();
/// core.handle(Millis(0), Event::CapacitySet { pool: pool.clone(), labels: Labels::new(), slots: 1 }).unwrap();
/// let actions = core.handle(Millis(0), Event::Submitted(TaskSpec::new(TaskId(1), pool))).unwrap();
/// assert!(matches!(actions[0], Action::Start { task: TaskId(1), attempt: 1, .. }));
/// ```
#[derive(Debug, Default)]
pub struct Core {
    now: Millis,
    next_seq: u64,
    groups: Groups,
    tasks: Vec<TaskRec>,
    free_slab: Vec<u32>,
    by_id: IdIndex,
    timers: Timers,
    /// Fairness and concurrency keys (SPEC §9).
    keys: fair::Keys,
    /// The fair-share part of each slab index: empty while no task has
    /// needed one (a core without keys or weights pays nothing), then as
    /// long as `tasks`.
    fair_parts: Vec<FairPart>,
    /// Concurrency keys whose parked tasks may have room (see `settle`).
    conc_dirty: Vec<u32>,
    /// Pools whose free slots may serve more waiters (see `settle`).
    refill: Vec<u32>,
    /// Groups, reqsets and pools that may have become idle (see `tidy`).
    tidy: Vec<Tidy>,
    limits: Limits,
}

/// Something that may be forgotten at the end of an event.
#[derive(Clone, Copy, Debug)]
enum Tidy {
    Group(u32),
    ReqSet(u32),
    Pool(u32),
}

/// Bounds on what one core holds. Beyond them an event is refused with
/// `RESOURCE_EXHAUSTED` (or `NOT_FOUND` for an undeclared pool) and changes
/// nothing. The defaults bound nothing but undeclared pools are allowed;
/// `cronoq server` sets its own from `[server]` (see the README's limits).
///
/// ```
/// use cronoq::core::*;
/// let mut core = Core::with_limits(Limits { max_pools: 1, ..Limits::default() });
/// let slots = |pool: &str| Event::CapacitySet { pool: PoolName::new(pool).unwrap(), labels: Labels::new(), slots: 1 };
/// core.handle(Millis(0), slots("a")).unwrap();
/// let refused = core.handle(Millis(0), slots("b")).unwrap_err();
/// assert_eq!(refused.code(), ErrorCode::RESOURCE_EXHAUSTED);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Pools held at once (declared ones included).
    pub max_pools: usize,
    /// Unfinished tasks (scheduled, waiting, in backoff or running) per pool.
    pub max_tasks_per_pool: u64,
    /// Whether a submission or capacity for a pool that no
    /// `PoolConfigured` declared is accepted (creating the pool until it
    /// is idle again); when false it is refused with `NOT_FOUND`.
    pub allow_undeclared_pools: bool,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_pools: usize::MAX,
            max_tasks_per_pool: u64::MAX,
            allow_undeclared_pools: true,
        }
    }
}

impl Core {
    /// An empty core: no pools, no tasks.
    pub fn new() -> Core {
        Core::default()
    }

    /// An empty core with these limits.
    pub fn with_limits(limits: Limits) -> Core {
        Core {
            limits,
            ..Core::default()
        }
    }

    /// Room for `additional` more live tasks, allocated now: a takeover
    /// that reads back many waiting tasks grows its slab once instead of
    /// copying it at each doubling (a slot is cache-line aligned, so the
    /// allocator cannot grow it in place).
    pub fn make_room(&mut self, additional: usize) {
        self.tasks
            .reserve(additional.saturating_sub(self.free_slab.len()));
        self.by_id.reserve(additional);
    }

    /// The limits in force.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Whether the core holds pool `name` now.
    pub fn has_pool(&self, name: &PoolName) -> bool {
        self.groups.find_pool(name).is_some()
    }

    /// The settings of pool `name`, if the core holds it.
    pub fn pool_config(&self, name: &PoolName) -> Option<&PoolConfig> {
        let p = self.groups.find_pool(name)?;
        Some(&self.groups.pools[p as usize].config)
    }

    /// Pools held now (forgotten idle pools not counted).
    pub fn pool_count(&self) -> usize {
        self.groups.pool_count()
    }

    /// The latest `now` handed in (time never runs backwards inside).
    pub fn now(&self) -> Millis {
        self.now
    }

    /// When the shell must call back with [`Event::Tick`], if ever.
    pub fn next_wakeup(&self) -> Option<Millis> {
        self.timers.next()
    }

    /// Live (not yet finished) tasks.
    pub fn live_tasks(&self) -> usize {
        self.by_id.len()
    }

    /// Applies one event at `now` and returns the actions to carry out.
    pub fn handle(&mut self, now: Millis, event: Event) -> Result<Vec<Action>, Rejection> {
        let mut out = Vec::new();
        self.handle_into(now, event, &mut out)?;
        Ok(out)
    }

    /// Like [`Core::handle`], appending to `out` (reuse it to avoid an
    /// allocation per event). On error nothing is appended.
    pub fn handle_into(
        &mut self,
        now: Millis,
        event: Event,
        out: &mut Vec<Action>,
    ) -> Result<(), Rejection> {
        check_arguments(&event)?;
        self.check_limits(self.now.max(now), &event)?;
        // Refuse before firing timers: their actions would be lost with the
        // error (a Start nobody carries out, a slot busy forever).
        let mut slot = self.check_state(&event)?;
        self.now = self.now.max(now);
        if self.fire_timers(out) {
            self.settle(out);
            match self.check_state(&event) {
                Ok(t) => slot = t,
                // Only a Miss timer can get here: it finished the task this
                // cancel names. Its Finished action stands; the event is moot.
                Err(_) => {
                    self.tidy();
                    return Ok(());
                }
            }
        }
        match event {
            Event::PoolConfigured { pool, config } => {
                let p = self.groups.pool(&pool);
                let old = self.groups.pools[p as usize].config.backoff;
                if old != config.backoff {
                    self.keep_backoff(p, old);
                }
                let pool = &mut self.groups.pools[p as usize];
                pool.config = config;
                pool.declared = true;
                self.apply_sharing_config(p);
            }
            Event::CapacitySet {
                pool,
                labels,
                slots,
            } => {
                let p = self.groups.pool(&pool);
                let g = self.groups.group(p, &labels);
                self.groups.set_capacity(g, slots);
                self.fill_group(g, out);
                self.refill_if_reserved(p);
                if slots == 0 {
                    self.tidy.push(Tidy::Group(g));
                    self.tidy.push(Tidy::Pool(p));
                }
            }
            Event::Submitted(spec) => self.admit(spec, out),
            Event::Recovered {
                spec,
                attempts,
                preempted,
                running,
            } => self.recover(spec, attempts, preempted, running, out),
            Event::CancelRequested(_) => self.cancel_with(slot.expect("checked"), None, out),
            Event::AttemptStarted { .. } => {}
            Event::AttemptEnded {
                task,
                attempt: _,
                outcome,
            } => self.attempt_ended(slot.expect("checked"), task, outcome, out),
            Event::Tick => {}
        }
        self.settle(out);
        self.tidy();
        Ok(())
    }

    /// Forgets what became idle during this event: groups with no
    /// capacity and no busy slot, reqsets no live task uses, undeclared
    /// pools with neither groups nor live tasks. Keeps memory bounded by
    /// what is in use, whatever names and labels went by.
    fn tidy(&mut self) {
        while let Some(item) = self.tidy.pop() {
            match item {
                Tidy::Group(g) => {
                    let group = &self.groups.groups[g as usize];
                    if group.pool != u32::MAX && group.capacity == 0 && group.busy == 0 {
                        let p = group.pool;
                        self.groups.forget_group(g);
                        self.tidy.push(Tidy::Pool(p));
                    }
                }
                Tidy::ReqSet(r) => {
                    let set = &self.groups.reqsets[r as usize];
                    if set.pool != u32::MAX
                        && set.live == 0
                        && !set.kept_idle
                        && self.groups.pools[set.pool as usize].reqsets[0] != r
                    {
                        // Kept for the next task with these labels; the
                        // oldest idle ones beyond the bounds are forgotten.
                        let entries = set.groups.len().min(u32::MAX as usize) as u32;
                        self.groups.reqsets[r as usize].kept_idle = true;
                        self.groups.idle_reqsets.push_back((r, entries));
                        self.groups.idle_entries += entries as usize;
                        let (max_kept, max_entries) = self.groups.idle_bounds();
                        while self.groups.idle_reqsets.len() > max_kept
                            || self.groups.idle_entries > max_entries
                        {
                            let Some((old, entries)) = self.groups.idle_reqsets.pop_front() else {
                                break;
                            };
                            self.groups.idle_entries -= entries as usize;
                            let set = &mut self.groups.reqsets[old as usize];
                            if !set.kept_idle {
                                continue; // forgotten with its pool since
                            }
                            set.kept_idle = false;
                            if set.pool != u32::MAX && set.live == 0 {
                                let p = set.pool;
                                self.groups.forget_reqset(old);
                                self.tidy.push(Tidy::Pool(p));
                            }
                        }
                    }
                }
                Tidy::Pool(p) => {
                    if self.groups.pools[p as usize].is_idle() {
                        self.keys.forget_unnamed(p);
                        self.groups.forget_pool(p);
                    }
                }
            }
        }
    }

    /// Refuses a submission or capacity the limits do not allow.
    fn check_limits(&self, now: Millis, event: &Event) -> Result<(), Rejection> {
        let (pool, creates) = match event {
            Event::Submitted(spec) | Event::Recovered { spec, .. } => (&spec.pool, true),
            Event::CapacitySet { pool, slots, .. } => (pool, *slots > 0),
            Event::PoolConfigured { pool, .. } => (pool, true),
            _ => return Ok(()),
        };
        let existing = self.groups.find_pool(pool);
        if let Event::Submitted(spec) | Event::Recovered { spec, .. } = event {
            let allow = self.limits.allow_undeclared_pools;
            check_admission(spec, now, existing.is_some(), allow)?;
        }
        if existing.is_none() && creates {
            let declaring = matches!(event, Event::PoolConfigured { .. });
            if !declaring && !self.limits.allow_undeclared_pools {
                return Err(Rejection::UnknownPool(pool.clone()));
            }
            if self.groups.pool_count() >= self.limits.max_pools {
                return Err(Rejection::ResourceExhausted(format!(
                    "{} pools are held, the limit",
                    self.groups.pool_count()
                )));
            }
        }
        if let Event::Submitted(_) | Event::Recovered { .. } = event {
            let live = existing.map_or(0, |p| self.groups.pools[p as usize].live);
            if live >= self.limits.max_tasks_per_pool {
                return Err(Rejection::ResourceExhausted(format!(
                    "pool {pool} holds {live} unfinished tasks, the limit"
                )));
            }
        }
        Ok(())
    }

    /// Rule 7 counts reservations per pool, so a change in one group can
    /// open slots of *other* groups: more free slots while reservations are
    /// due, or a reservation gone (fewer held slots, and a later earliest
    /// `start_at` for backfill). Such changes mark the pool; `settle` then
    /// offers every free slot of it to the waiters, until nothing moves.
    fn refill_if_reserved(&mut self, p: u32) {
        if !self.groups.pools[p as usize].reservations.is_empty() {
            self.refill.push(p);
        }
    }

    /// A task without a [`TaskExtra`] uses its pool's backoff; before that
    /// changes, give such tasks of pool `p` the backoff they were submitted
    /// under (O(tasks), on a rare event).
    fn keep_backoff(&mut self, p: u32, old: Backoff) {
        for rec in &mut self.tasks {
            if rec.phase != Phase::Free && rec.pool == p && rec.extra.is_none() {
                rec.extra_mut(old);
            }
        }
    }

    /// Offers what an event freed: slots of the pools marked for it, then
    /// room under the concurrency limits marked, until nothing moves.
    fn settle(&mut self, out: &mut Vec<Action>) {
        loop {
            if let Some(p) = self.refill.pop() {
                self.fill_pool(p, out);
            } else if let Some(c) = self.conc_dirty.pop() {
                if !self.keys.conc[c as usize].vacant {
                    self.unpark(c, out);
                }
            } else {
                break;
            }
        }
    }

    /// Refuses an event the state does not allow; returns the slab index of
    /// the task it names, if it names a live one.
    fn check_state(&self, event: &Event) -> Result<Option<u32>, Rejection> {
        match event {
            Event::Submitted(spec) if self.by_id.contains(spec.id) => {
                Err(Rejection::DuplicateTask(spec.id))
            }
            Event::Recovered { spec, .. } if self.by_id.contains(spec.id) => {
                Err(Rejection::DuplicateTask(spec.id))
            }
            Event::Recovered {
                spec,
                attempts,
                running: Some(running),
                ..
            } => {
                if *attempts == 0 {
                    return Err(Rejection::InvalidArgument(
                        "a running recovered attempt is attempt 1 or later".into(),
                    ));
                }
                let fits = spec
                    .required
                    .iter()
                    .all(|(k, v)| running.labels.get(k) == Some(v));
                if !fits {
                    return Err(Rejection::InvalidArgument(format!(
                        "task {} requires [{}], which group [{}] does not carry",
                        spec.id, spec.required, running.labels
                    )));
                }
                let busy = self
                    .groups
                    .find_pool(&spec.pool)
                    .and_then(|p| {
                        self.groups.pools[p as usize]
                            .group_by_labels
                            .get(&running.labels)
                    })
                    .map_or(0, |&g| self.groups.groups[g as usize].busy);
                if running.capacity <= busy {
                    return Err(Rejection::InvalidArgument(format!(
                        "capacity {} leaves no slot for the resumed attempt ({busy} busy)",
                        running.capacity
                    )));
                }
                Ok(None)
            }
            Event::CancelRequested(id) => match self.live(*id) {
                None => Err(Rejection::UnknownTask(*id)),
                Some((_, rec)) if rec.phase == Phase::Draining => {
                    Err(Rejection::AlreadyFinished(*id))
                }
                Some((t, _)) => Ok(Some(t)),
            },
            Event::AttemptStarted { task, attempt } | Event::AttemptEnded { task, attempt, .. } => {
                match self.live(*task) {
                    None => Err(Rejection::UnknownTask(*task)),
                    Some((t, rec))
                        if matches!(rec.phase, Phase::Running | Phase::Draining)
                            && rec.attempt == *attempt =>
                    {
                        Ok(Some(t))
                    }
                    Some(_) => Err(Rejection::StaleAttempt {
                        task: *task,
                        attempt: *attempt,
                    }),
                }
            }
            _ => Ok(None),
        }
    }

    fn live(&self, id: TaskId) -> Option<(u32, &TaskRec)> {
        self.by_id.get(id).map(|i| (i, &self.tasks[i as usize]))
    }

    // ---- views ------------------------------------------------------------

    /// Why a task of this reqset waits for a slot (not in backoff, not
    /// scheduled): nobody carries its labels, every matching slot is busy,
    /// or a free one is held for a due reservation (rule 4 allows no other
    /// free matching slot beside a waiter).
    pub(crate) fn waiting_reason(&self, reqset: u32) -> WaitReason {
        if !self.groups.reqset_has_capacity(reqset) {
            WaitReason::NoGroupMatches
        } else if !self.groups.reqsets[reqset as usize].free_groups.is_empty() {
            WaitReason::HeldForReservation
        } else {
            WaitReason::GroupsFull
        }
    }

    /// What the core knows of a live task; `None` once it finished.
    pub fn task(&self, id: TaskId) -> Option<TaskView> {
        let t = self.by_id.get(id)?;
        let rec = &self.tasks[t as usize];
        let set = &self.groups.reqsets[rec.reqset as usize];
        let mut reason_key = None;
        let mut waiting_reason = || match self.sharing_wait(t) {
            Some((reason, key)) => {
                reason_key = Some(key);
                reason
            }
            None => self.waiting_reason(rec.reqset),
        };
        let (state, reason) = match rec.phase {
            Phase::Scheduled | Phase::Reserved => {
                (TaskState::Scheduled, Some(WaitReason::Scheduled))
            }
            Phase::Ready | Phase::Queued | Phase::Parked => {
                (TaskState::Queued, Some(waiting_reason()))
            }
            Phase::Backoff => (TaskState::Queued, Some(WaitReason::Backoff)),
            Phase::Running => (TaskState::Running, None),
            Phase::Draining => (TaskState::Cancelled, None),
            Phase::Free => return None,
        };
        let group = matches!(rec.phase, Phase::Running | Phase::Draining)
            .then(|| self.groups.groups[rec.group as usize].labels.clone());
        Some(TaskView {
            id,
            pool: self.groups.pools[rec.pool as usize].name.clone(),
            required: set.labels.clone(),
            priority: rec.priority,
            state,
            reason,
            reason_key,
            attempts: rec.attempt,
            group,
            urgent: rec.urgent,
        })
    }
}

/// Checks that need no state: names, labels, options.
fn check_arguments(event: &Event) -> Result<(), Rejection> {
    match event {
        Event::PoolConfigured { config, .. } => config.validate(),
        Event::CapacitySet { labels, .. } => labels.validate(),
        Event::Submitted(spec) => spec.validate(),
        Event::Recovered { spec, running, .. } => {
            spec.validate()?;
            running.as_ref().map_or(Ok(()), |r| r.labels.validate())
        }
        _ => Ok(()),
    }
}

/// The checks of a submission that need no state but whether its pool is
/// known: its horizon ([`TaskSpec::check_horizon`]), then an undeclared
/// pool (`UnknownPool` unless `allow_undeclared_pools`). [`Core::handle`]
/// runs them on every submission; a shell that refuses a submission before
/// the core sees it (the leader's own `POST /v1/tasks`) calls this, not a
/// copy of it.
pub fn check_admission(
    spec: &TaskSpec,
    now: Millis,
    pool_known: bool,
    allow_undeclared_pools: bool,
) -> Result<(), Rejection> {
    spec.check_horizon(now)?;
    if !pool_known && !allow_undeclared_pools {
        return Err(Rejection::UnknownPool(spec.pool.clone()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Label sets used one task at a time, each task finished before the
    /// next: idle reqsets are kept up to the index budget, the oldest
    /// forgotten past it, and the accounting stays exact.
    #[test]
    fn idle_reqsets_are_kept_up_to_their_index_budget() {
        let pool = PoolName::new("p").unwrap();
        let common: Vec<(String, String)> = (0..10)
            .map(|i| (format!("c{i}"), "1".to_string()))
            .collect();
        // 100 groups carrying the ten common labels: each non-empty subset
        // of them is a label set matching every group (100 entries), with
        // room for 20,000 entries (the real budget is 1,048,576).
        const GROUPS: usize = 100;
        const BUDGET: usize = 20_000;
        let mut core = Core::new();
        core.groups.idle_bounds_set = Some((groups::MAX_IDLE_REQSETS, BUDGET));
        for g in 0..GROUPS {
            let mut pairs = common.clone();
            pairs.push(("id".to_string(), g.to_string()));
            core.handle(
                Millis(0),
                Event::CapacitySet {
                    pool: pool.clone(),
                    labels: Labels::from_iter(pairs),
                    slots: 1,
                },
            )
            .unwrap();
        }
        let kept_at_most = BUDGET / GROUPS;
        for n in 1..=(kept_at_most + 40) as u64 {
            let subset = common
                .iter()
                .enumerate()
                .filter(|(i, _)| n & (1 << i) != 0)
                .map(|(_, p)| p.clone());
            let mut spec = TaskSpec::new(TaskId(n), pool.clone());
            spec.required = Labels::from_iter(subset);
            let started = core.handle(Millis(0), Event::Submitted(spec)).unwrap();
            assert!(!started.is_empty(), "task {n} starts at once");
            core.handle(
                Millis(0),
                Event::AttemptEnded {
                    task: TaskId(n),
                    attempt: 1,
                    outcome: AttemptOutcome::Succeeded,
                },
            )
            .unwrap();
        }
        let g = &core.groups;
        assert!(g.idle_entries <= BUDGET, "{}", g.idle_entries);
        let kept = g.reqsets.iter().filter(|s| s.kept_idle).count();
        assert_eq!(kept, kept_at_most, "the budget holds this many");
        // The newest kept, the oldest forgotten.
        let newest = g.idle_reqsets.back().unwrap().0;
        assert!(g.reqsets[newest as usize].kept_idle);
        core.check_invariants().unwrap();
    }
}
