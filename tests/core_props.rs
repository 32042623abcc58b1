//! Property tests of the core: random event sequences, then the safety
//! rules of STYLE §4 after every event.
//!
//! A `Model` keeps what a shell would learn from the actions alone (live
//! attempts, their groups, the capacity it set, the `Finished` it saw) and
//! checks it against the core's own views: `check_invariants` (rule 4 and
//! the indexes), starts only on matching groups with a free slot, never two
//! live attempts of a task, every task either live or finished exactly once,
//! no `Finished` that a deadline alone caused, snapshot numbers that agree
//! with the action stream. Two focused properties follow: rule 2 (a task that
//! starts on arrival takes the least specialized free matching group) and
//! rule 5 (c) (equal waiters of a single-group pool start in submission
//! order).

mod common;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use common::{pool, render};
use cronoq::core::{
    Action, AttemptOutcome, Backoff, Core, ErrorCode, Event, FixedStart, FleetConfig, GroupId,
    Labels, Millis, OnMiss, PoolConfig, TaskId, TaskSpec, TaskState, TaskView, WaitReason,
};
use proptest::prelude::*;

const POOLS: [&str; 2] = ["a", "b"];

// ---- generated events ---------------------------------------------------------

#[derive(Clone, Debug)]
struct SubmitOp {
    pool: usize,
    required: Labels,
    priority: i32,
    deadline: Option<u64>,
    /// Offset of `start_at` from now (may be in the past) and tolerance.
    fixed: Option<(i64, u64)>,
    est_runtime: Option<u64>,
    max_attempts: Option<u32>,
    backoff: Option<(u64, u64)>,
    timeout: Option<u64>,
}

#[derive(Clone, Debug)]
enum Op {
    Capacity {
        pool: usize,
        labels: Labels,
        slots: u32,
    },
    Configure {
        pool: usize,
        config: PoolConfig,
    },
    Submit(Box<SubmitOp>),
    /// End the `pick`-th live attempt.
    End {
        pick: usize,
        outcome: AttemptOutcome,
    },
    /// Report an attempt that is not live for the `pick`-th task.
    Stale {
        pick: usize,
        ahead: bool,
    },
    /// Cancel the `pick`-th submitted task (finished ones too).
    Cancel {
        pick: usize,
    },
    /// Acknowledge the `pick`-th live attempt.
    Ack {
        pick: usize,
    },
    /// Submit the `pick`-th submitted task's id again.
    Duplicate {
        pick: usize,
    },
    /// A malformed label set.
    BadCapacity {
        pool: usize,
    },
    /// A task that asks for no attempt at all.
    BadSubmit,
    /// Move the clock; with `tick` also tell the core, otherwise the next
    /// event finds the timers due (as when input beats the wakeup).
    Advance {
        ms: u64,
        tick: bool,
    },
}

/// 0–3 labels: each name present with probability `p`, one value each.
fn label_set(p: f64) -> impl Strategy<Value = Labels> {
    (
        prop::option::weighted(p, 0..2usize),
        prop::option::weighted(p, 0..2usize),
        prop::option::weighted(p, 0..1usize),
    )
        .prop_map(|(gpu, zone, disk)| {
            let mut labels = Labels::new();
            if let Some(i) = gpu {
                labels.insert("gpu", ["a100", "h100"][i]);
            }
            if let Some(i) = zone {
                labels.insert("zone", ["eu", "us"][i]);
            }
            if let Some(i) = disk {
                labels.insert("disk", ["ssd"][i]);
            }
            labels
        })
}

fn outcome() -> impl Strategy<Value = AttemptOutcome> {
    prop_oneof![
        4 => Just(AttemptOutcome::Succeeded),
        3 => Just(AttemptOutcome::Failed { retryable: true }),
        1 => Just(AttemptOutcome::Failed { retryable: false }),
        2 => Just(AttemptOutcome::Lost),
        1 => Just(AttemptOutcome::Cancelled),
    ]
}

fn pool_config() -> impl Strategy<Value = PoolConfig> {
    (
        1..4u32,
        0..3_000u64,
        0..4u32,
        0..3_000u64,
        any::<bool>(),
        (0..3u32, 0..6u32),
        (0..300u64, 0..600u64),
        prop::collection::vec((label_set(0.4), 0..2u32, 0..4u32, 1..4u32), 0..4),
    )
        .prop_map(
            |(
                max_attempts,
                urgency,
                max_bypass,
                lead,
                run,
                (min, extra),
                (initial, more),
                fleets,
            )| {
                let mut declared: Vec<FleetConfig> = Vec::new();
                for (labels, min, extra, slots_per_worker) in fleets {
                    if declared.iter().all(|f| f.labels != labels) {
                        declared.push(FleetConfig {
                            labels,
                            min,
                            max: min + extra,
                            slots_per_worker,
                        });
                    }
                }
                PoolConfig {
                    max_attempts,
                    urgency_window: Millis(urgency),
                    max_bypass,
                    reservation_lead: Millis(lead),
                    on_miss: if run { OnMiss::Run } else { OnMiss::Skip },
                    autoscale_min: min,
                    autoscale_max: min + extra,
                    backoff: Backoff {
                        initial: Millis(initial),
                        max: Millis(initial + more),
                    },
                    fleets: declared,
                    ..PoolConfig::default()
                }
            },
        )
}

fn submit_op() -> impl Strategy<Value = SubmitOp> {
    (
        0..POOLS.len(),
        label_set(0.25),
        -1..=1i32,
        prop::option::weighted(0.3, 0..4_000u64),
        prop::option::weighted(0.2, (-1_000..4_000i64, 0..2_000u64)),
        prop::option::weighted(0.2, 0..3_000u64),
        prop::option::of(1..=3u32),
        prop::option::of((0..300u64, 0..600u64)),
        prop::option::weighted(0.2, 1..2_000u64),
    )
        .prop_map(
            |(
                pool,
                required,
                priority,
                deadline,
                fixed,
                est_runtime,
                max_attempts,
                backoff,
                timeout,
            )| {
                SubmitOp {
                    pool,
                    required,
                    priority,
                    deadline,
                    fixed,
                    est_runtime,
                    max_attempts,
                    backoff,
                    timeout,
                }
            },
        )
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        30 => submit_op().prop_map(|s| Op::Submit(Box::new(s))),
        20 => (any::<usize>(), outcome()).prop_map(|(pick, outcome)| Op::End { pick, outcome }),
        15 => (0..1_500u64, any::<bool>()).prop_map(|(ms, tick)| Op::Advance { ms, tick }),
        10 => (0..POOLS.len(), label_set(0.4), 0..4u32)
            .prop_map(|(pool, labels, slots)| Op::Capacity { pool, labels, slots }),
        6 => any::<usize>().prop_map(|pick| Op::Cancel { pick }),
        3 => (any::<usize>(), any::<bool>()).prop_map(|(pick, ahead)| Op::Stale { pick, ahead }),
        3 => (0..POOLS.len(), pool_config()).prop_map(|(pool, config)| Op::Configure { pool, config }),
        2 => any::<usize>().prop_map(|pick| Op::Ack { pick }),
        2 => any::<usize>().prop_map(|pick| Op::Duplicate { pick }),
        1 => (0..POOLS.len()).prop_map(|pool| Op::BadCapacity { pool }),
        1 => Just(Op::BadSubmit),
    ]
}

// ---- the model --------------------------------------------------------------------

#[derive(Clone, Debug)]
struct TaskInfo {
    pool: usize,
    required: Labels,
    deadline: Option<u64>,
    fixed: bool,
    /// Attempts started, as seen in Start actions.
    started: u32,
    /// Finished actions seen.
    finished: u32,
}

#[derive(Default)]
struct Model {
    core: Core,
    /// The fleets each pool declares (its last accepted configuration).
    fleets: [Vec<FleetConfig>; POOLS.len()],
    now: u64,
    next_id: u64,
    tasks: BTreeMap<u64, TaskInfo>,
    /// Live attempts: task → (attempt, group).
    live: BTreeMap<u64, (u32, GroupId)>,
    /// Capacity set per (pool, labels), and the order groups appeared in.
    capacity: HashMap<(usize, Labels), u32>,
    created: Vec<(usize, Labels)>,
}

impl Model {
    fn busy(&self, group: GroupId) -> u32 {
        self.live.values().filter(|(_, g)| *g == group).count() as u32
    }

    fn group_key(&self, group: GroupId) -> (usize, Labels) {
        let pool = POOLS
            .iter()
            .position(|p| *p == self.core.group_pool(group).as_str())
            .expect("known pool");
        (pool, self.core.group_labels(group).clone())
    }

    /// Free slots per group of `pool`, from the model's own bookkeeping.
    fn free_groups(&self, pool: usize) -> Vec<(Labels, u32, usize)> {
        let busy: HashMap<(usize, Labels), u32> =
            self.live.values().fold(HashMap::new(), |mut acc, (_, g)| {
                *acc.entry(self.group_key(*g)).or_default() += 1;
                acc
            });
        self.created
            .iter()
            .enumerate()
            .filter(|(_, (p, _))| *p == pool)
            .filter_map(|(order, key)| {
                let cap = self.capacity[key];
                let used = busy.get(key).copied().unwrap_or(0);
                (cap > used).then(|| (key.1.clone(), cap - used, order))
            })
            .collect()
    }

    fn views(&self) -> Vec<Option<TaskView>> {
        self.tasks
            .keys()
            .map(|&id| self.core.task(TaskId(id)))
            .collect()
    }

    fn ids(&self) -> Vec<u64> {
        self.tasks.keys().copied().collect()
    }

    fn apply(&mut self, op: &Op) {
        let event = match op {
            Op::Capacity {
                pool: p,
                labels,
                slots,
            } => Event::CapacitySet {
                pool: pool(POOLS[*p]),
                labels: labels.clone(),
                slots: *slots,
            },
            Op::Configure { pool: p, config } => Event::PoolConfigured {
                pool: pool(POOLS[*p]),
                config: config.clone(),
            },
            Op::Submit(s) => {
                let id = self.next_id;
                let mut spec = TaskSpec::new(TaskId(id), pool(POOLS[s.pool]));
                spec.required = s.required.clone();
                spec.priority = s.priority;
                spec.deadline = s.deadline.map(|d| Millis(self.now + d));
                spec.fixed_start = s.fixed.map(|(offset, tolerance)| FixedStart {
                    start_at: Millis(self.now.saturating_add_signed(offset)),
                    tolerance: Millis(tolerance),
                });
                spec.est_runtime = s.est_runtime.map(Millis);
                spec.max_attempts = s.max_attempts;
                spec.backoff = s.backoff.map(|(initial, more)| Backoff {
                    initial: Millis(initial),
                    max: Millis(initial + more),
                });
                spec.attempt_timeout = s.timeout.map(Millis);
                Event::Submitted(spec)
            }
            Op::End { pick, outcome } => {
                if self.live.is_empty() {
                    return;
                }
                let (&task, &(attempt, _)) = self.live.iter().nth(pick % self.live.len()).unwrap();
                Event::AttemptEnded {
                    task: TaskId(task),
                    attempt,
                    outcome: *outcome,
                }
            }
            Op::Ack { pick } => {
                if self.live.is_empty() {
                    return;
                }
                let (&task, &(attempt, _)) = self.live.iter().nth(pick % self.live.len()).unwrap();
                Event::AttemptStarted {
                    task: TaskId(task),
                    attempt,
                }
            }
            Op::Stale { pick, ahead } => {
                let ids = self.ids();
                let task = if ids.is_empty() {
                    1_000_000
                } else {
                    ids[pick % ids.len()]
                };
                let known = self.tasks.get(&task).map_or(0, |t| t.started);
                let attempt = match self.live.get(&task) {
                    Some(&(live, _)) if *ahead => live + 1,
                    Some(&(live, _)) => live - 1,
                    None if *ahead => known + 1,
                    None => known,
                };
                Event::AttemptEnded {
                    task: TaskId(task),
                    attempt,
                    outcome: AttemptOutcome::Succeeded,
                }
            }
            Op::Cancel { pick } => {
                let ids = self.ids();
                let task = if ids.is_empty() {
                    1_000_000
                } else {
                    ids[pick % ids.len()]
                };
                Event::CancelRequested(TaskId(task))
            }
            Op::Duplicate { pick } => {
                let live: Vec<u64> = self
                    .ids()
                    .into_iter()
                    .filter(|&id| self.core.task(TaskId(id)).is_some())
                    .collect();
                if live.is_empty() {
                    return;
                }
                let id = live[pick % live.len()];
                Event::Submitted(TaskSpec::new(TaskId(id), pool(POOLS[0])))
            }
            Op::BadCapacity { pool: p } => Event::CapacitySet {
                pool: pool(POOLS[*p]),
                labels: Labels::from([("gpu", "a100"), ("gpu", "h100")]),
                slots: 1,
            },
            Op::BadSubmit => {
                let mut spec = TaskSpec::new(TaskId(self.next_id), pool(POOLS[0]));
                spec.max_attempts = Some(0);
                Event::Submitted(spec)
            }
            Op::Advance { ms, tick } => {
                self.now += ms;
                if !tick {
                    return;
                }
                Event::Tick
            }
        };
        self.feed(event);
    }

    /// What the core must answer, judged from the views before the event.
    fn expected_rejection(&self, event: &Event) -> Option<ErrorCode> {
        let view = |id: &TaskId| self.core.task(*id);
        match event {
            Event::CapacitySet { labels, .. } if labels.validate().is_err() => {
                Some(ErrorCode::INVALID_ARGUMENT)
            }
            Event::Submitted(spec) if spec.validate().is_err() => Some(ErrorCode::INVALID_ARGUMENT),
            Event::Submitted(spec) if view(&spec.id).is_some() => Some(ErrorCode::ALREADY_EXISTS),
            Event::CancelRequested(id) => match view(id) {
                None => Some(ErrorCode::NOT_FOUND),
                Some(v) if v.state == TaskState::Cancelled => Some(ErrorCode::FAILED_PRECONDITION),
                Some(_) => None,
            },
            Event::AttemptEnded { task, attempt, .. } | Event::AttemptStarted { task, attempt } => {
                match view(task) {
                    None => Some(ErrorCode::NOT_FOUND),
                    Some(_) if self.live.get(&task.0).map(|l| l.0) == Some(*attempt) => None,
                    Some(_) => Some(ErrorCode::FAILED_PRECONDITION),
                }
            }
            _ => None,
        }
    }

    fn feed(&mut self, event: Event) {
        let expected = self.expected_rejection(&event);
        let before = self.core.snapshot();
        let wakeup = self.core.next_wakeup();
        let views = self.views();
        let result = self.core.handle(Millis(self.now), event.clone());
        let actions = match (result, expected) {
            (Err(e), Some(code)) => {
                assert_eq!(e.code(), code, "{event:?} refused with the wrong code: {e}");
                assert_eq!(
                    self.core.snapshot(),
                    before,
                    "refused {event:?} changed the core"
                );
                assert_eq!(self.core.next_wakeup(), wakeup);
                assert_eq!(self.views(), views, "refused {event:?} changed a task");
                return;
            }
            (Err(e), None) => panic!("{event:?} refused at {}: {e}", self.now),
            (Ok(actions), Some(code)) => panic!("{event:?} accepted, expected {code}: {actions:?}"),
            (Ok(actions), None) => actions,
        };
        let rendered: Vec<String> = actions.iter().map(|a| render(&self.core, a)).collect();
        let context = format!("at {} after {event:?} -> {rendered:?}", self.now);

        if let Err(broken) = self.core.check_invariants() {
            panic!("invariant broken {context}: {broken}");
        }

        // The event itself.
        // The attempt this event ends; timers due at `now` fire before the
        // event, so a timeout Revoke of it may still come in this batch.
        let mut ended: Option<(u64, (u32, GroupId))> = None;
        // Likewise a start fired by a timer used the capacity before a resize.
        let mut resized: Option<((usize, Labels), u32)> = None;
        match &event {
            Event::PoolConfigured { pool, config } => {
                let p = POOLS.iter().position(|x| *x == pool.as_str()).unwrap();
                self.fleets[p] = config.fleets.clone();
            }
            Event::Submitted(spec) => {
                self.next_id += 1;
                self.tasks.insert(
                    spec.id.0,
                    TaskInfo {
                        pool: POOLS.iter().position(|p| *p == spec.pool.as_str()).unwrap(),
                        required: spec.required.clone(),
                        deadline: spec.deadline.map(|d| d.0),
                        fixed: spec.fixed_start.is_some(),
                        started: 0,
                        finished: 0,
                    },
                );
            }
            Event::CapacitySet {
                pool: name,
                labels,
                slots,
            } => {
                let p = POOLS.iter().position(|x| *x == name.as_str()).unwrap();
                let key = (p, labels.clone());
                if !self.capacity.contains_key(&key) {
                    self.created.push(key.clone());
                }
                let old = self.capacity.insert(key.clone(), *slots).unwrap_or(0);
                resized = Some((key, old));
            }
            Event::AttemptEnded { task, .. } => {
                ended = self.live.remove(&task.0).map(|l| (task.0, l));
            }
            _ => {}
        }
        let named = match &event {
            Event::CancelRequested(id) | Event::AttemptEnded { task: id, .. } => Some(id.0),
            _ => None,
        };
        let submitted = match &event {
            Event::Submitted(spec) => Some(spec.id.0),
            _ => None,
        };

        for action in &actions {
            match *action {
                Action::Start {
                    task,
                    attempt,
                    group,
                } => {
                    let info = self
                        .tasks
                        .get(&task.0)
                        .expect("start of a known task")
                        .clone();
                    assert!(
                        !self.live.contains_key(&task.0),
                        "two live attempts of t{task} {context}"
                    );
                    assert_eq!(attempt, info.started + 1, "attempt numbering {context}");
                    let (gpool, glabels) = self.group_key(group);
                    assert_eq!(gpool, info.pool, "start in another pool {context}");
                    assert!(
                        glabels.satisfies(&info.required),
                        "t{task} needs {} but starts on {glabels} {context}",
                        info.required
                    );
                    let key = (gpool, glabels.clone());
                    let cap = match &resized {
                        Some((k, old)) if *k == key => Some(self.capacity[&key].max(*old)),
                        _ => self.capacity.get(&key).copied(),
                    };
                    let busy = self.busy(group);
                    assert!(
                        busy < cap.unwrap_or(0),
                        "start on {glabels} with busy {busy} of {cap:?} {context}"
                    );
                    if submitted == Some(task.0) {
                        // Rule 2: the best free matching group by the model's count.
                        let best = self
                            .free_groups(info.pool)
                            .into_iter()
                            .filter(|(labels, _, _)| labels.satisfies(&info.required))
                            .min_by_key(|(labels, free, order)| {
                                (labels.len(), Reverse(*free), *order)
                            })
                            .map(|(labels, _, _)| labels);
                        assert_eq!(best, Some(glabels), "rule 2 {context}");
                    }
                    self.tasks.get_mut(&task.0).unwrap().started = attempt;
                    self.live.insert(task.0, (attempt, group));
                }
                Action::Revoke {
                    task,
                    attempt,
                    group,
                    ..
                } => {
                    assert!(
                        self.live.get(&task.0) == Some(&(attempt, group))
                            || ended == Some((task.0, (attempt, group))),
                        "revoke of an attempt that is not live {context}"
                    );
                }
                Action::Preempted { .. } => panic!("preemption is off {context}"),
                Action::RetryAt { task, attempt, at } => {
                    assert_eq!(
                        ended.map(|e| e.0),
                        Some(task.0),
                        "retry without an ended attempt {context}"
                    );
                    assert_eq!(attempt, self.tasks[&task.0].started + 1, "{context}");
                    assert!(at.0 >= self.now, "retry in the past {context}");
                }
                Action::Finished {
                    task,
                    state,
                    attempts,
                    deadline_missed,
                    ..
                } => {
                    let info = self.tasks.get_mut(&task.0).expect("finish of a known task");
                    info.finished += 1;
                    assert_eq!(info.finished, 1, "t{task} finished twice {context}");
                    assert_eq!(attempts, info.started, "{context}");
                    assert_eq!(
                        deadline_missed,
                        info.deadline.is_some_and(|d| self.now > d),
                        "deadline_missed {context}"
                    );
                    match state {
                        // Only time can miss a fixed start, and only before it ran.
                        TaskState::Missed => {
                            assert!(info.fixed && attempts == 0, "missed {context}")
                        }
                        // Everything else needs an event naming the task:
                        // a deadline alone never finishes anything.
                        TaskState::Cancelled | TaskState::Succeeded | TaskState::Failed => {
                            assert_eq!(named, Some(task.0), "finish nobody asked for {context}")
                        }
                        other => panic!("finish in state {other} {context}"),
                    }
                }
            }
        }

        // The core forgets a group with no capacity and no busy slot; one
        // that comes back later counts as a new group (rule 2's tie-break).
        let busy_keys: Vec<(usize, Labels)> = self
            .live
            .values()
            .map(|(_, g)| self.group_key(*g))
            .collect();
        let capacity = &self.capacity;
        let idle: Vec<(usize, Labels)> = self
            .created
            .iter()
            .filter(|k| capacity[*k] == 0 && !busy_keys.contains(k))
            .cloned()
            .collect();
        for key in idle {
            self.capacity.remove(&key);
            self.created.retain(|k| *k != key);
        }

        self.check_views(&context);
        if let Some(at) = self.core.next_wakeup() {
            assert!(at.0 > self.now, "wakeup {at} not in the future {context}");
        }
    }

    /// Every task live or finished exactly once; the core's views agree with
    /// the action stream.
    fn check_views(&self, context: &str) {
        let mut waiting = [0u64; POOLS.len()];
        let mut scheduled = [0u64; POOLS.len()];
        let mut waiting_tasks: Vec<(usize, Labels)> = Vec::new();
        for (&id, info) in &self.tasks {
            let view = self.core.task(TaskId(id));
            let live = self.live.get(&id);
            match (info.finished, &view) {
                (0, Some(v)) => assert!(
                    matches!(
                        v.state,
                        TaskState::Scheduled | TaskState::Queued | TaskState::Running
                    ),
                    "t{id} unfinished but {} {context}",
                    v.state
                ),
                (0, None) => panic!("t{id} vanished without a Finished {context}"),
                (1, None) => {}
                (1, Some(v)) => assert!(
                    v.state == TaskState::Cancelled && live.is_some(),
                    "t{id} finished but still {} {context}",
                    v.state
                ),
                (n, _) => panic!("t{id} finished {n} times {context}"),
            }
            let Some(v) = view else {
                assert!(live.is_none(), "forgotten t{id} holds a slot {context}");
                continue;
            };
            match v.state {
                TaskState::Running | TaskState::Cancelled => {
                    let (attempt, group) = *live.unwrap_or_else(|| {
                        panic!("t{id} runs an attempt no Start announced {context}")
                    });
                    assert_eq!(v.attempts, attempt, "{context}");
                    assert_eq!(v.group.as_ref(), Some(self.core.group_labels(group)));
                    assert_eq!(v.reason, None);
                }
                TaskState::Queued => {
                    assert!(live.is_none(), "queued t{id} holds a slot {context}");
                    if v.reason != Some(WaitReason::Backoff) {
                        waiting[info.pool] += 1;
                        waiting_tasks.push((info.pool, info.required.clone()));
                    }
                }
                TaskState::Scheduled => {
                    assert_eq!(v.reason, Some(WaitReason::Scheduled));
                    scheduled[info.pool] += 1;
                }
                other => panic!("live t{id} in state {other} {context}"),
            }
        }
        let snapshot = self.core.snapshot();
        for pool_snapshot in &snapshot.pools {
            let p = POOLS
                .iter()
                .position(|x| *x == pool_snapshot.name.as_str())
                .unwrap();
            assert_eq!(pool_snapshot.waiting, waiting[p], "waiting {context}");
            assert_eq!(pool_snapshot.scheduled, scheduled[p], "scheduled {context}");
            let a = &pool_snapshot.autoscale;
            assert!(
                a.min <= a.desired && a.desired <= a.max,
                "autoscale {context}"
            );
            let demand: u64 = pool_snapshot.demand.iter().map(|d| d.waiting).sum();
            assert_eq!(demand, pool_snapshot.waiting, "demand {context}");
            self.check_fleets(p, pool_snapshot, &waiting_tasks, context);
            let (mut capacity, mut busy) = (0u64, 0u64);
            for g in &pool_snapshot.groups {
                let key = (p, g.labels.clone());
                assert_eq!(Some(&g.capacity), self.capacity.get(&key), "{context}");
                let used = self
                    .live
                    .values()
                    .filter(|(_, gid)| self.group_key(*gid) == key)
                    .count() as u32;
                assert_eq!(g.busy, used, "busy of {} {context}", g.labels);
                capacity += u64::from(g.capacity);
                busy += u64::from(g.busy);
            }
            assert_eq!(
                (pool_snapshot.capacity, pool_snapshot.busy),
                (capacity, busy),
                "{context}"
            );
        }
    }
}

impl Model {
    /// The fleets' figures of pool `p` against an oracle written apart
    /// from the core's: each waiting task (its pool and required labels)
    /// counts once, toward the covering fleet with the fewest labels,
    /// first declared on a tie; busy and capacity are those of the group
    /// with the fleet's exact labels.
    fn check_fleets(
        &self,
        p: usize,
        snapshot: &cronoq::core::PoolSnapshot,
        waiting_tasks: &[(usize, Labels)],
        context: &str,
    ) {
        let fleets = &self.fleets[p];
        assert_eq!(snapshot.fleets.len(), fleets.len(), "fleets {context}");
        let mut expected = vec![0u64; fleets.len()];
        let mut uncovered = 0u64;
        for (_, required) in waiting_tasks.iter().filter(|(pool, _)| *pool == p) {
            let mut best: Option<usize> = None;
            for (i, fleet) in fleets.iter().enumerate() {
                let covers = required.iter().all(|(k, v)| fleet.labels.get(k) == Some(v));
                let fewer = match best {
                    None => true,
                    Some(b) => fleet.labels.len() < fleets[b].labels.len(),
                };
                if covers && fewer {
                    best = Some(i);
                }
            }
            match best {
                Some(i) => expected[i] += 1,
                None => uncovered += 1,
            }
        }
        for ((figures, fleet), waiting) in snapshot.fleets.iter().zip(fleets).zip(expected) {
            assert_eq!(figures.labels, fleet.labels, "fleet order {context}");
            assert_eq!(
                figures.waiting, waiting,
                "waiting of fleet {} {context}",
                fleet.labels
            );
            let capacity = self
                .capacity
                .get(&(p, fleet.labels.clone()))
                .copied()
                .unwrap_or(0);
            let busy = self
                .live
                .values()
                .filter(|(_, g)| self.group_key(*g) == (p, fleet.labels.clone()))
                .count() as u64;
            assert_eq!(
                (figures.capacity, figures.busy),
                (u64::from(capacity), busy),
                "{context}"
            );
            let slots = figures.busy + figures.waiting + figures.reserved;
            let want = slots.div_ceil(u64::from(fleet.slots_per_worker));
            let clamped = want.clamp(u64::from(fleet.min), u64::from(fleet.max));
            assert_eq!(
                figures.desired, clamped,
                "desired of fleet {} {context}",
                fleet.labels
            );
        }
        // No double count: the fleets' waiting plus the uncovered tasks
        // are the pool's waiting tasks.
        let counted: u64 = snapshot.fleets.iter().map(|f| f.waiting).sum();
        assert_eq!(counted + uncovered, snapshot.waiting, "{context}");
        if fleets.is_empty() {
            assert_eq!(snapshot.waiting_without_fleet, 0, "{context}");
        } else {
            // Plus due reservations no fleet covers, which the model
            // does not track.
            assert!(snapshot.waiting_without_fleet >= uncovered, "{context}");
        }
    }
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    /// The safety rules hold after every event of any sequence.
    #[test]
    fn random_events_keep_every_safety_rule(ops in prop::collection::vec(op(), 1..200)) {
        let mut model = Model::default();
        for op in &ops {
            model.apply(op);
        }
        // Drain: end every live attempt and move past every timer; the
        // rules must hold on the way out too.
        for _ in 0..400 {
            if let Some((&task, &(attempt, _))) = model.live.iter().next() {
                model.feed(Event::AttemptEnded {
                    task: TaskId(task),
                    attempt,
                    outcome: AttemptOutcome::Succeeded,
                });
            } else if let Some(at) = model.core.next_wakeup() {
                model.now = at.0;
                model.feed(Event::Tick);
            } else {
                break;
            }
        }
    }

    /// Rule 2 on arrival, on a fleet of many groups and few waiters.
    #[test]
    fn rule2_arrival_takes_least_specialized_free_matching_group(
        groups in prop::collection::vec((label_set(0.5), 1..4u32), 1..8),
        tasks in prop::collection::vec((label_set(0.2), any::<bool>()), 1..40),
    ) {
        let mut model = Model::default();
        for (labels, slots) in groups {
            model.apply(&Op::Capacity { pool: 0, labels, slots });
        }
        for (required, end_one) in tasks {
            model.apply(&Op::Submit(Box::new(SubmitOp {
                pool: 0,
                required,
                priority: 0,
                deadline: None,
                fixed: None,
                est_runtime: None,
                max_attempts: None,
                backoff: None,
                timeout: None,
            })));
            if end_one {
                model.apply(&Op::End { pick: 0, outcome: AttemptOutcome::Succeeded });
            }
        }
    }

    /// Rule 5 (c): among equally urgent unlabeled waiters of a pool with a
    /// single group, slots go out in submission order — retries included,
    /// since a retried task keeps its place.
    #[test]
    fn rule5c_single_group_starts_in_submission_order(
        ops in prop::collection::vec(
            prop_oneof![
                4 => Just(None),
                3 => (any::<usize>(), outcome()).prop_map(Some),
            ],
            1..150,
        ),
        slots in 1..4u32,
        grow in any::<bool>(),
    ) {
        let name = pool("solo");
        let mut core = Core::new();
        let mut now = 0u64;
        let mut next = 0u64;
        let mut live: BTreeMap<u64, u32> = BTreeMap::new();
        core.handle(Millis(now), Event::CapacitySet { pool: name.clone(), labels: Labels::new(), slots }).unwrap();
        for (step, op) in ops.into_iter().enumerate() {
            // Waiting tasks (not in backoff) before the event, by id = submission order.
            let waiting_before: BTreeSet<u64> = (0..next)
                .filter(|&id| core.task(TaskId(id)).is_some_and(|v| {
                    v.state == TaskState::Queued && v.reason != Some(WaitReason::Backoff)
                }))
                .collect();
            let event = match op {
                _ if grow && step == 75 => Event::CapacitySet {
                    pool: name.clone(),
                    labels: Labels::new(),
                    slots: slots + 2,
                },
                None => {
                    let mut spec = TaskSpec::new(TaskId(next), name.clone());
                    spec.backoff = Some(Backoff { initial: Millis(10), max: Millis(50) });
                    next += 1;
                    Event::Submitted(spec)
                }
                Some(_) if live.is_empty() => {
                    now += 20;
                    Event::Tick
                }
                Some((pick, outcome)) => {
                    let (&task, &attempt) = live.iter().nth(pick % live.len()).unwrap();
                    live.remove(&task);
                    Event::AttemptEnded { task: TaskId(task), attempt, outcome }
                }
            };
            let actions = core.handle(Millis(now), event).unwrap();
            prop_assert!(core.check_invariants().is_ok());
            let mut started_waiters = Vec::new();
            for action in &actions {
                if let Action::Start { task, attempt, .. } = action {
                    live.insert(task.0, *attempt);
                    if waiting_before.contains(&task.0) {
                        started_waiters.push(task.0);
                    }
                }
            }
            // In order, and nobody older left behind.
            prop_assert!(started_waiters.windows(2).all(|w| w[0] < w[1]), "{:?}", started_waiters);
            if let Some(&youngest) = started_waiters.last() {
                for &older in waiting_before.range(..youngest) {
                    prop_assert!(started_waiters.contains(&older), "t{} passed t{}", youngest, older);
                }
            }
        }
    }
}
