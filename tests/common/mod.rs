//! The one harness every core test goes through: a [`Sim`] that wraps
//! [`Core`] with a clock, feeds it events and renders the actions as short
//! strings (`start t3#1 {gpu=a100}`), so an expected outcome is a one-line
//! list and an API change edits this file, not every test.
//!
//! Every accepted event is followed by [`Core::check_invariants`]. Nothing
//! here knows a placement rule: the tests state the rules.

#![allow(dead_code)]

use std::collections::HashMap;

use cronoq::core::{
    Action, AttemptOutcome, Backoff, ConcurrencyPolicy, Core, EndReason, Event, FixedStart, Labels,
    Millis, OnMiss, PoolConfig, PoolName, Rejection, RevokeReason, Snapshot, TaskId, TaskSpec,
    TaskView,
};

/// The outcome of an attempt that succeeded.
pub const OK: AttemptOutcome = AttemptOutcome::Succeeded;
/// A failure another attempt may fix.
pub const FAIL: AttemptOutcome = AttemptOutcome::Failed { retryable: true };
/// A failure no retry can fix.
pub const FATAL: AttemptOutcome = AttemptOutcome::Failed { retryable: false };
/// The attempt vanished.
pub const LOST: AttemptOutcome = AttemptOutcome::Lost;
/// The attempt stopped after a revoke.
pub const STOPPED: AttemptOutcome = AttemptOutcome::Cancelled;

/// No action at all.
pub const NOTHING: [&str; 0] = [];

/// Parses `k=v,k=v` without validating (bad input tests need bad sets).
pub fn labels(text: &str) -> Labels {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|item| {
            let (k, v) = item.split_once('=').unwrap_or((item, ""));
            (k.to_string(), v.to_string())
        })
        .collect()
}

/// A pool name that must be valid.
pub fn pool(name: &str) -> PoolName {
    PoolName::new(name).expect("test pool name")
}

/// A task spec under construction; see [`task`].
#[derive(Clone, Debug)]
pub struct TaskBuilder(pub TaskSpec);

/// Task `id` in pool `p` with every option at its default.
pub fn task(id: u64) -> TaskBuilder {
    TaskBuilder(TaskSpec::new(TaskId(id), pool("p")))
}

impl TaskBuilder {
    pub fn pool(mut self, name: &str) -> Self {
        self.0.pool = pool(name);
        self
    }
    pub fn labels(mut self, text: &str) -> Self {
        self.0.required = labels(text);
        self
    }
    pub fn priority(mut self, priority: i32) -> Self {
        self.0.priority = priority;
        self
    }
    pub fn deadline(mut self, at: u64) -> Self {
        self.0.deadline = Some(Millis(at));
        self
    }
    pub fn start_at(mut self, at: u64, tolerance: u64) -> Self {
        self.0.fixed_start = Some(FixedStart {
            start_at: Millis(at),
            tolerance: Millis(tolerance),
        });
        self
    }
    pub fn est(mut self, runtime: u64) -> Self {
        self.0.est_runtime = Some(Millis(runtime));
        self
    }
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.0.max_attempts = Some(n);
        self
    }
    pub fn backoff(mut self, initial: u64, max: u64) -> Self {
        self.0.backoff = Some(Backoff {
            initial: Millis(initial),
            max: Millis(max),
        });
        self
    }
    pub fn timeout(mut self, ms: u64) -> Self {
        self.0.attempt_timeout = Some(Millis(ms));
        self
    }
    /// Fairness key and weight (SPEC §9).
    pub fn fair(mut self, key: &str, weight: u32) -> Self {
        self.0.fairness_key = Some(key.to_string());
        self.0.fairness_weight = weight;
        self
    }
    /// Concurrency key, limit and policy (`queue`, `replace_waiting`,
    /// `cancel_running`, `skip`).
    pub fn conc(mut self, key: &str, limit: u32, policy: &str) -> Self {
        self.0.concurrency_key = Some(key.to_string());
        self.0.concurrency_limit = limit;
        self.0.concurrency_policy = match policy {
            "queue" => ConcurrencyPolicy::Queue,
            "replace_waiting" => ConcurrencyPolicy::ReplaceWaiting,
            "cancel_running" => ConcurrencyPolicy::CancelRunning,
            "skip" => ConcurrencyPolicy::Skip,
            other => panic!("unknown concurrency policy {other}"),
        };
        self
    }
    pub fn not_preemptible(mut self) -> Self {
        self.0.preemptible = false;
        self
    }
}

/// Renders one action as a short line, naming the group by its labels.
pub fn render(core: &Core, action: &Action) -> String {
    match action {
        Action::Start {
            task,
            attempt,
            group,
        } => format!("start t{task}#{attempt} {{{}}}", core.group_labels(*group)),
        Action::Revoke {
            task,
            attempt,
            group,
            reason,
        } => {
            let why = match reason {
                RevokeReason::Cancelled => "cancelled",
                RevokeReason::Timeout => "timeout",
                RevokeReason::Preempted => "preempted",
            };
            format!(
                "revoke t{task}#{attempt} {{{}}} {why}",
                core.group_labels(*group)
            )
        }
        Action::RetryAt { task, attempt, at } => format!("retry t{task}#{attempt} @{}", at.0),
        Action::Preempted { task, attempt } => format!("preempted t{task}#{attempt}"),
        Action::Finished {
            task,
            state,
            attempts,
            deadline_missed,
            reason,
            ..
        } => format!(
            "finish t{task} {state} attempts={attempts}{}{}",
            if *deadline_missed {
                " deadline_missed"
            } else {
                ""
            },
            match reason {
                Some(EndReason::Replaced) => " replaced",
                Some(EndReason::Concurrency) => " concurrency",
                None => "",
            }
        ),
    }
}

/// A core, a clock, and the live attempt of each task as seen in the actions.
pub struct Sim {
    pub core: Core,
    pub now: u64,
    live_attempt: HashMap<u64, u32>,
}

impl Default for Sim {
    fn default() -> Self {
        Sim::new()
    }
}

impl Sim {
    pub fn new() -> Sim {
        Sim {
            core: Core::new(),
            now: 0,
            live_attempt: HashMap::new(),
        }
    }

    /// Feeds one event at the current instant. Panics if it is rejected or
    /// if an invariant breaks; returns the rendered actions.
    pub fn step(&mut self, event: Event) -> Vec<String> {
        match self.try_step(event.clone()) {
            Ok(lines) => lines,
            Err(e) => panic!("event {event:?} rejected at {}: {e}", self.now),
        }
    }

    /// Feeds one event; a rejection must leave the views unchanged.
    pub fn try_step(&mut self, event: Event) -> Result<Vec<String>, Rejection> {
        let before = self.core.snapshot();
        let actions = match self.core.handle(Millis(self.now), event) {
            Ok(actions) => actions,
            Err(e) => {
                assert_eq!(self.core.snapshot(), before, "a rejection changed the core");
                return Err(e);
            }
        };
        if let Err(broken) = self.core.check_invariants() {
            panic!("invariant broken at {}: {broken}", self.now);
        }
        let lines: Vec<String> = actions.iter().map(|a| render(&self.core, a)).collect();
        for action in &actions {
            match action {
                Action::Start { task, attempt, .. } => {
                    self.live_attempt.insert(task.0, *attempt);
                }
                // A cancelled running task still has an attempt to end.
                Action::Finished { task, .. } if self.core.task(*task).is_none() => {
                    self.live_attempt.remove(&task.0);
                }
                _ => {}
            }
        }
        Ok(lines)
    }

    /// A task of an earlier leadership (`Event::Recovered`): `attempts`
    /// made; with `running` = (group labels, new capacity), the last runs.
    pub fn recover(
        &mut self,
        builder: TaskBuilder,
        attempts: u32,
        running: Option<(&str, u32)>,
    ) -> Result<Vec<String>, Rejection> {
        let id = builder.0.id.0;
        let lines = self.try_step(Event::Recovered {
            spec: builder.0,
            attempts,
            preempted: 0,
            running: running.map(|(group, capacity)| cronoq::core::Resumed {
                labels: labels(group),
                capacity,
            }),
        })?;
        if running.is_some() {
            self.live_attempt.insert(id, attempts);
        }
        Ok(lines)
    }

    /// Sets the settings of pool `name`, starting from the defaults.
    pub fn configure(&mut self, name: &str, change: impl FnOnce(&mut PoolConfig)) -> Vec<String> {
        let mut config = PoolConfig::default();
        change(&mut config);
        self.step(Event::PoolConfigured {
            pool: pool(name),
            config,
        })
    }

    /// Sets the slots of the group of `pool_name` with exactly `group_labels`.
    pub fn capacity(&mut self, pool_name: &str, group_labels: &str, slots: u32) -> Vec<String> {
        self.step(Event::CapacitySet {
            pool: pool(pool_name),
            labels: labels(group_labels),
            slots,
        })
    }

    pub fn submit(&mut self, builder: TaskBuilder) -> Vec<String> {
        self.step(Event::Submitted(builder.0))
    }

    /// Ends the live attempt of `task` (the last one started) with `outcome`.
    pub fn end(&mut self, task: u64, outcome: AttemptOutcome) -> Vec<String> {
        let attempt = *self
            .live_attempt
            .get(&task)
            .unwrap_or_else(|| panic!("t{task} has no live attempt"));
        self.step(Event::AttemptEnded {
            task: TaskId(task),
            attempt,
            outcome,
        })
    }

    /// Reports the end of a given attempt, which may be stale.
    pub fn end_attempt(
        &mut self,
        task: u64,
        attempt: u32,
        outcome: AttemptOutcome,
    ) -> Result<Vec<String>, Rejection> {
        self.try_step(Event::AttemptEnded {
            task: TaskId(task),
            attempt,
            outcome,
        })
    }

    pub fn cancel(&mut self, task: u64) -> Vec<String> {
        self.step(Event::CancelRequested(TaskId(task)))
    }

    /// Moves the clock forward by `ms` and ticks.
    pub fn advance(&mut self, ms: u64) -> Vec<String> {
        self.now += ms;
        self.step(Event::Tick)
    }

    /// Moves the clock to `at` and ticks.
    pub fn at(&mut self, at: u64) -> Vec<String> {
        assert!(at >= self.now, "time runs forward");
        self.now = at;
        self.step(Event::Tick)
    }

    pub fn view(&self, task: u64) -> Option<TaskView> {
        self.core.task(TaskId(task))
    }

    /// `state` or `state/reason` (`/key` for `quota` and `concurrency`)
    /// of a live task, `gone` once finished.
    pub fn state(&self, task: u64) -> String {
        match self.view(task) {
            None => "gone".into(),
            Some(v) => match (v.reason, v.reason_key) {
                (Some(r), Some(key)) => format!("{}/{}/{}", v.state, r, key),
                (Some(r), None) => format!("{}/{}", v.state, r),
                _ => v.state.to_string(),
            },
        }
    }

    pub fn snapshot(&self) -> Snapshot {
        self.core.snapshot()
    }

    /// `busy/capacity` of every group of a pool, least specialized first.
    pub fn groups(&self, pool_name: &str) -> Vec<String> {
        self.snapshot()
            .pools
            .iter()
            .find(|p| p.name.as_str() == pool_name)
            .map(|p| {
                p.groups
                    .iter()
                    .map(|g| format!("{{{}}} {}/{}", g.labels, g.busy, g.capacity))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Shorthand for a pool config that skips or runs missed fixed starts.
pub fn on_miss(policy: &str) -> OnMiss {
    match policy {
        "skip" => OnMiss::Skip,
        "run" => OnMiss::Run,
        other => panic!("unknown on_miss {other}"),
    }
}
