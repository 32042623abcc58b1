//! Deterministic simulation of the leader through failures (issue 8,
//! issue 21): the real [`Driver`] — ledger, core, journal records,
//! re-attachment — as successive leaders, the real journal ordering
//! ([`Pipeline`], as the committer runs it) and the real worker rules
//! ([`Rules`]), on a simulated clock, against an in-memory journal standing
//! in for JetStream's contract (a write lands only if its writer's epoch is
//! the newest: the fence).
//!
//! By concern: this file holds the world, its faults and the test;
//! `leader.rs` the leaders (election, the consumer, the committer's
//! pipeline and what lands of it at a crash, pauses); `workers.rs` the
//! workers (leases, renewals, reports) and the network between them.
//!
//! Faults, at random: the leader crashes (its writes under way land or
//! not, a task's in order; a successor with a newer epoch reads the
//! submissions and the journal back after an election gap) or pauses past
//! the election timeout; a worker dies (its jobs with it; a new one
//! replaces it); requests are lost (and retried), duplicated and
//! reordered on their way to the leader; leases and revokes are delayed,
//! reordered and duplicated on their way to workers; leases are 2 s and
//! live by renewals, and expire when those stop; attempts fail (retryable)
//! or run past their `attempt_timeout`; clients cancel tasks (also before
//! the leader has read them) and submit duplicates under an idempotency
//! key; workers report several outcomes in one request. Some seeds write
//! the journal in atomic batches (replicated streams), the others record by
//! record with start records, each with its own limit on writes under way.
//!
//! A paused leader that resumes judges its right to act as the runner does
//! at the top of every turn ([`election::may_act`] on its last renewal;
//! [`Driver::step_down`] when it lapsed), is fed its timers and worker
//! requests, and must emit nothing.
//!
//! Checked after every step:
//! * the core's invariants (busy ≤ capacity among them);
//! * **one terminal state**: a task's stored terminal record never changes;
//! * **no re-run of a stored success**: no worker starts an attempt of a
//!   task whose success is in the journal;
//! * **one lease per attempt**: an attempt number of a task starts at most
//!   once, on one worker, and only under the epoch the worker follows;
//! * **announced means stored**: a cancel acknowledged finds the task's
//!   `cancelled` record in the journal.
//!
//! And at the end (faults stop, the system runs on): **no task lost**:
//! every submission has a stored terminal record — `succeeded`, or
//! `cancelled` if a cancel was asked for — or was discarded as a duplicate
//! of a key; and every fault path above was taken in some seed.
//!
//! `CRONOQ_SIM_SEED=n` replays one seed; `CRONOQ_SIM_SEEDS=n` runs more
//! (default 2,000; each seed runs a few thousand steps).

use std::collections::{BTreeMap, BTreeSet};

use super::driver::{Driver, Input, Settings};
use super::election;
use super::journal::pipeline::{Limits, Pipeline};
use crate::core::{Millis, PoolConfig, PoolName, TaskId, TaskState};
use crate::task::Task;
use crate::wire::{StartRecords, TaskRecord};
use crate::worker::rules::Rules;

mod leader;
mod schedules;
mod workers;

use leader::Leader;
use workers::{Message, Worker};

/// splitmix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn chance(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }
}

const POOL: &str = "p";
const LEASE_TTL: u64 = 2_000;
const HEARTBEAT_EVERY: u64 = 200;
/// The election timeout: a follower takes over after seeing no renewal
/// for this long; the leader renews at every step it runs.
const ELECTION_TIMEOUT: u64 = 1_000;

fn settings(group_starts: bool) -> Settings {
    // Attempts lost to crashes are retried; none is the last.
    let pool = PoolConfig {
        max_attempts: 1_000,
        ..PoolConfig::default()
    };
    Settings {
        server_id: "sim".into(),
        // Short: long attempts live by their renewals, and a lease whose
        // renewals stop (a dead worker, a paused leader) expires.
        lease_ttl: Millis(LEASE_TTL),
        worker_timeout: Millis(1_000),
        heartbeat_interval: Millis(HEARTBEAT_EVERY),
        max_payload_bytes: 1 << 16,
        max_reply_bytes: 1 << 20,
        max_record_bytes: 1 << 20,
        retain_finished: 100_000,
        pools: vec![(PoolName::new(POOL).unwrap(), pool)],
        max_workers: 1_000,
        limits: crate::core::Limits::default(),
        reattach_grace: Millis(1_000),
        events: crate::server::config::Events::All,
        record_refresh: Millis(RECORD_TTL / 3),
        group_starts: group_starts && std::env::var("SIM_NOGROUP").is_err(),
        group_results: std::env::var("SIM_NOGROUP").is_err(),
        max_schedules: crate::schedule::DEFAULT_MAX_SCHEDULES,
        schedules_refused: None,
        auth: Default::default(),
        // On: the failover simulation runs the trace notes and leases
        // through every crash (nothing may panic or linger).
        trace: Some(crate::telemetry::TraceSalt(7)),
    }
}

/// The bucket's max age (`results_ttl`) as the simulation keeps it: a
/// live task's record written longer ago is gone, as JetStream expires
/// it. (Finished tasks' results are kept: in the real system their
/// submissions are purged, so an expired result is never read back.)
/// Rewritten every third of it by whoever leads: a record expires only
/// if no leader runs a turn for two thirds of it (here 20 s of crashes
/// with gaps of up to 1.7 s, leaders dying before they read it back),
/// which the real `results_ttl` (24 h against seconds) makes remote.
const RECORD_TTL: u64 = 30_000;

/// The results bucket: records under task ids and start records under
/// slots (with when each was written), fenced by epoch.
#[derive(Default)]
struct Journal {
    records: BTreeMap<u64, (TaskRecord, u64)>,
    starts: BTreeMap<u32, (StartRecords, u64)>,
    /// Schedule records (`None`: deleted), with when each was written.
    schedules: BTreeMap<String, (Option<crate::schedule::StoredSchedule>, u64)>,
    /// The newest leader's epoch: older writers are refused.
    fence: u64,
    succeeded: BTreeSet<u64>,
}

/// What a journal write stores (the pipeline's record body).
#[derive(Clone, Debug, PartialEq)]
enum Write {
    Record(u64, TaskRecord),
    Starts(u32, StartRecords),
    Results(Vec<TaskRecord>),
    Schedule(String, Option<Box<crate::schedule::StoredSchedule>>),
}

/// How often each fault path was taken (summed over the seeds).
#[derive(Clone, Copy, Default, Debug)]
struct Counts {
    runs: u64,
    reruns: u64,
    /// Recovered tasks whose running attempt came from a start record.
    from_starts: u64,
    /// Start-record slots written again.
    slot_rewrites: u64,
    /// Results stored in a result batch (not under their task's own id).
    batched_results: u64,
    /// Paused leaders that resumed deposed (and emitted nothing).
    resumed_deposed: u64,
    /// Attempts a newer leader leased again to the worker running them
    /// (the worker's rules restart them).
    restarts: u64,
    /// Attempts that ended failed (retryable).
    failures: u64,
    /// Renewals sent, and those refused as lost (the run stopped).
    renewals: u64,
    renewals_lost: u64,
    /// Leases and revokes delivered twice.
    duplicates: u64,
    /// Worker requests delivered twice, and delivered after a later one.
    requests_duplicated: u64,
    requests_reordered: u64,
    /// Cancels asked for, acknowledged, and tasks that ended cancelled.
    cancels: u64,
    cancels_acked: u64,
    cancelled: u64,
    /// Cancels of tasks the leader had not read yet.
    cancels_on_arrival: u64,
    /// Duplicate submissions (same idempotency key) and those discarded.
    keyed_duplicates: u64,
    duplicates_discarded: u64,
    /// Several outcomes in one report.
    batched_reports: u64,
    /// Attempts stopped for their attempt timeout.
    timeouts: u64,
    /// Seeds whose journal went in atomic batches; writes that waited for
    /// room in the pipeline.
    batch_seeds: u64,
    writes_waited: u64,
    /// Writes that landed as a leader died, and those lost with it.
    landed_at_crash: u64,
    lost_at_crash: u64,
    /// Seeds with a schedule; its fires, those the stream answered with
    /// an earlier publish of the tick, and those published again past
    /// its duplicate window.
    schedule_seeds: u64,
    fires: u64,
    fires_deduplicated: u64,
    fires_past_window: u64,
    /// Ticks an adversary claimed first under their predictable id
    /// (`schedule:<name>:<tick>`, issue 34).
    ticks_claimed: u64,
    /// Clock jumps, and schedule seeds that ended with missed ticks.
    clock_jumps: u64,
    missed_tick_seeds: u64,
}

impl Counts {
    fn add(&mut self, o: &Counts) {
        macro_rules! sum {
            ($($f:ident),*) => { $(self.$f += o.$f;)* };
        }
        sum!(
            runs,
            reruns,
            from_starts,
            slot_rewrites,
            batched_results,
            resumed_deposed,
            restarts,
            failures,
            renewals,
            renewals_lost,
            duplicates,
            requests_duplicated,
            requests_reordered,
            cancels,
            cancels_acked,
            cancelled,
            cancels_on_arrival,
            keyed_duplicates,
            duplicates_discarded,
            batched_reports,
            timeouts,
            batch_seeds,
            writes_waited,
            landed_at_crash,
            lost_at_crash,
            schedule_seeds,
            fires,
            fires_deduplicated,
            fires_past_window,
            ticks_claimed,
            clock_jumps,
            missed_tick_seeds
        );
    }
}

/// A submission as the stream holds it, and what the simulation knows of it.
struct Submission {
    task: Task,
    /// The earlier submission whose idempotency key it repeats.
    duplicate_of: Option<u64>,
    /// A cancel was asked for (it may end cancelled or succeeded), and
    /// whether one was acknowledged (it must end cancelled).
    cancel_asked: bool,
    cancel_acked: bool,
}

struct World {
    rng: Rng,
    now: u64,
    /// Faults on (off at the end, when everything must finish).
    faults: bool,
    journal: Journal,
    leader: Option<Leader>,
    /// No leader until then (an election after a crash).
    election_at: u64,
    /// A leader paused (SIGSTOP) and when it resumes.
    paused: Option<(Leader, u64)>,
    next_epoch: u64,
    /// The journal: in atomic batches (replicated streams) or record by
    /// record with start records; the pipeline's limits.
    batches: bool,
    limits: Limits,
    submissions: Vec<Submission>,
    /// Submissions some leader discarded as duplicates of a key.
    discarded: BTreeSet<u64>,
    workers: Vec<Worker>,
    next_worker: u32,
    network: Vec<Message>,
    /// (task, attempt) → worker, for every attempt ever started.
    started: BTreeMap<(TaskId, u32), String>,
    counts: Counts,
    sched: schedules::SimSchedule,
}

impl World {
    fn new(seed: u64) -> World {
        let mut rng = Rng(seed);
        let batches = rng.chance(250);
        let scheduled = rng.chance(500);
        let short_window = rng.chance(500);
        let limits = Limits {
            max_records: 1 + rng.below(12) as usize,
            max_batches: 1,
            max_batch: 1 + rng.below(8) as usize,
        };
        let mut w = World {
            rng,
            now: 0,
            faults: true,
            journal: Journal::default(),
            leader: None,
            election_at: 0,
            paused: None,
            next_epoch: 1,
            batches,
            limits,
            submissions: Vec::new(),
            discarded: BTreeSet::new(),
            workers: Vec::new(),
            next_worker: 0,
            network: Vec::new(),
            started: BTreeMap::new(),
            counts: Counts {
                batch_seeds: u64::from(batches),
                schedule_seeds: u64::from(scheduled),
                ..Counts::default()
            },
            // Half the schedule seeds have an adversary (no draw of its
            // own: the other seeds' runs stay as they were).
            sched: schedules::SimSchedule::new(scheduled, short_window, seed % 2 == 0),
        };
        for _ in 0..3 {
            w.add_worker();
        }
        w
    }

    fn pool() -> PoolName {
        PoolName::new(POOL).unwrap()
    }

    /// A client submits a few tasks: some with an attempt timeout, some
    /// with an idempotency key, some repeating an earlier key (a duplicate
    /// the stream's window did not catch).
    fn submit(&mut self) {
        let n = 1 + self.rng.below(8);
        for _ in 0..n {
            let seq = self.submissions.len() as u64 + 1;
            let mut task = Task::new("x").pool(POOL);
            let mut duplicate_of = None;
            if self.rng.chance(100) {
                task = task.attempt_timeout(std::time::Duration::from_millis(
                    300 + self.rng.below(1_000),
                ));
            }
            // Only of a task not finished: a duplicate of a finished one
            // is the stream's to catch (its window), not the driver's.
            let unfinished: Vec<u64> = (1..seq)
                .rev()
                .take(40)
                .filter(|s| {
                    let s = &self.submissions[(*s - 1) as usize];
                    s.duplicate_of.is_none() && s.task.key().is_some()
                })
                .filter(|s| {
                    !self
                        .journal
                        .records
                        .get(s)
                        .is_some_and(|(r, _)| r.state.is_terminal())
                })
                .collect();
            if !unfinished.is_empty() && self.rng.chance(150) {
                let original = unfinished[self.rng.below(unfinished.len() as u64) as usize];
                task = task.idempotency_key(format!("k{original}"));
                duplicate_of = Some(original);
                self.counts.keyed_duplicates += 1;
            } else if self.rng.chance(200) {
                task = task.idempotency_key(format!("k{seq}"));
            }
            self.submissions.push(Submission {
                task,
                duplicate_of,
                cancel_asked: false,
                cancel_acked: false,
            });
        }
    }

    /// Whether submission `seq` is done: a terminal record stored, or
    /// discarded as a duplicate.
    fn done(&self, seq: u64) -> bool {
        let s = &self.submissions[(seq - 1) as usize];
        match self.journal.records.get(&seq) {
            Some((r, _)) if r.state == TaskState::Succeeded => true,
            Some((r, _)) if r.state == TaskState::Cancelled => s.cancel_asked,
            _ => s.duplicate_of.is_some() && self.discarded.contains(&seq),
        }
    }

    fn step(&mut self) {
        self.now += 5 + self.rng.below(40);
        if self.faults && self.sched.planned && self.rng.chance(2) {
            // The clock jumps (an NTP step, a stalled VM): every process
            // sees it at once.
            self.now += 1_500 + self.rng.below(3_000);
            self.counts.clock_jumps += 1;
        }
        if let Some(leader) = &mut self.leader {
            // A renewal at every step (stored: it leads).
            leader.renewed = self.now;
        }
        if self.paused.as_ref().is_some_and(|(_, at)| self.now >= *at) && self.leader.is_some() {
            self.resume();
        }
        if self.leader.is_none() && self.now >= self.election_at {
            self.elect();
            // Workers watch the leader record: they heartbeat at once.
            for w in &mut self.workers {
                w.next_heartbeat = self.now;
            }
        }
        if self.faults {
            if self.rng.chance(6) && self.submissions.len() < 400 {
                self.submit();
            }
            if self.rng.chance(5) {
                self.cancel();
            }
            if self.leader.is_some() && self.rng.chance(4) {
                self.crash();
            }
            if self.leader.is_some() && self.paused.is_none() && self.rng.chance(2) {
                self.pause();
            }
            if self.rng.chance(2) && !self.workers.is_empty() {
                // kill -9 of a worker: its jobs die with it.
                let w = self.rng.below(self.workers.len() as u64) as usize;
                self.workers.remove(w);
                self.add_worker();
            }
        }
        self.schedule_step();
        self.adversary_step();
        self.deliver();
        self.commit();
        self.deliver_requests();
        self.step_workers();
        self.commit();
        if let Some(leader) = &self.leader {
            if let Err(broken) = leader.driver.core_invariants() {
                panic!("core invariant broken: {broken}");
            }
        }
    }

    fn all_done(&self) -> bool {
        (1..=self.submissions.len() as u64).all(|seq| self.done(seq))
    }

    /// The end: every acknowledged cancel ended cancelled.
    fn check_end(&self) {
        for (i, s) in self.submissions.iter().enumerate() {
            let seq = i as u64 + 1;
            if s.cancel_acked {
                let state = self.stored_state(seq);
                assert!(
                    state == Some(TaskState::Cancelled),
                    "task {seq}: cancel acknowledged, ended {state:?}"
                );
            }
        }
    }
}

fn run(seed: u64) -> Counts {
    let mut world = World::new(seed);
    for _ in 0..2_000 {
        world.step();
    }
    // Faults stop; everything accepted must end (the schedule pauses, so
    // its fires end too).
    world.faults = false;
    world.sched.pausing = true;
    let mut steps = 0;
    while !world.all_done() {
        world.step();
        steps += 1;
        if steps > 20_000 {
            let missing: Vec<u64> = (1..=world.submissions.len() as u64)
                .filter(|s| !world.done(*s))
                .take(10)
                .collect();
            let states: Vec<String> = missing
                .iter()
                .map(|s| {
                    let live = world
                        .leader
                        .as_ref()
                        .and_then(|l| l.driver.status(TaskId(*s)))
                        .map_or("unknown".into(), |st| st.state.to_string());
                    let stored = world.journal.records.get(s).map(|(r, _)| r.state);
                    let rec = world.journal.records.get(s).map(|(r, _)| format!("{r:?}"));
                    let sub = &world.submissions[(*s - 1) as usize];
                    format!(
                        "{s}: {live}, stored {stored:?} {rec:?} dup {:?} cancel {}",
                        sub.duplicate_of, sub.cancel_asked
                    )
                })
                .collect();
            panic!("tasks never finished: {missing:?} {states:?}");
        }
    }
    world.check_end();
    // The schedule is judged by a leader's book: wait for one.
    while world.sched.planned && world.leader.is_none() {
        world.step();
    }
    world.check_schedule();
    world.counts
}

#[test]
fn failover_simulation() {
    let seeds: Vec<u64> = match std::env::var("CRONOQ_SIM_SEED") {
        Ok(s) => vec![s.parse().expect("CRONOQ_SIM_SEED")],
        Err(_) => {
            let n = std::env::var("CRONOQ_SIM_SEEDS")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(2_000);
            (0..n).collect()
        }
    };
    let mut total = Counts::default();
    let runs_of_seeds = seeds.len();
    for seed in seeds {
        match std::panic::catch_unwind(|| run(seed)) {
            Ok(counts) => total.add(&counts),
            Err(panic) => {
                eprintln!("failing seed: CRONOQ_SIM_SEED={seed}");
                std::panic::resume_unwind(panic);
            }
        }
    }
    eprintln!("{total:#?}");
    // Each fault path was taken somewhere across the seeds.
    if runs_of_seeds >= 1_000 {
        let t = total;
        for (what, n) in [
            ("a retry", t.reruns),
            ("a start record read back", t.from_starts),
            ("a start-record slot written again", t.slot_rewrites),
            ("a result stored in a result batch", t.batched_results),
            ("a paused leader resumed deposed", t.resumed_deposed),
            ("a failed attempt", t.failures),
            ("a renewal", t.renewals),
            ("a renewal refused as lost", t.renewals_lost),
            ("a duplicated lease or revoke", t.duplicates),
            ("a duplicated worker request", t.requests_duplicated),
            ("a reordered worker request", t.requests_reordered),
            ("a cancel", t.cancels),
            ("an acknowledged cancel", t.cancels_acked),
            ("a task ended cancelled", t.cancelled),
            (
                "a cancel before the leader read the task",
                t.cancels_on_arrival,
            ),
            ("a duplicate under an idempotency key", t.keyed_duplicates),
            (
                "a duplicate discarded by the driver",
                t.duplicates_discarded,
            ),
            ("several outcomes in one report", t.batched_reports),
            ("an attempt stopped for its timeout", t.timeouts),
            ("a journal in atomic batches", t.batch_seeds),
            ("a write waiting for room in the pipeline", t.writes_waited),
            ("a write landing as its leader died", t.landed_at_crash),
            ("a write lost with its leader", t.lost_at_crash),
            ("a schedule", t.schedule_seeds),
            (
                "a fire the stream answered with an earlier publish",
                t.fires_deduplicated,
            ),
            (
                "a fire published again past the stream's window",
                t.fires_past_window,
            ),
            ("a tick claimed first by an adversary", t.ticks_claimed),
            ("a clock jump", t.clock_jumps),
            (
                "a schedule that ended with missed ticks",
                t.missed_tick_seeds,
            ),
        ] {
            assert!(n > 0, "no seed exercised {what}");
        }
    }
}
