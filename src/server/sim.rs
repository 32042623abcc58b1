//! Deterministic simulation of the leader's driver through failures
//! (issue 8): the real [`Driver`] — ledger, core, journal records,
//! re-attachment — as successive leaders, with workers, on a simulated
//! clock, against an in-memory journal standing in for JetStream's
//! contract (a write lands only if its writer's epoch is the newest: the
//! fence; turns commit in order, records before announcements).
//!
//! Faults, at random: the leader crashes (its uncommitted turn is lost; a
//! successor with a newer epoch reads the submissions and the journal back
//! after an election gap), a worker dies (its jobs with it; it is replaced
//! by a new one), worker requests are lost (and retried), leases and
//! revokes are delayed, reordered and duplicated. Every task succeeds when
//! it runs, so every accepted task must end `succeeded`.
//!
//! A leader may also *pause* (SIGSTOP, a stalled VM) past the election
//! timeout: a successor takes over, and when the paused one resumes it
//! judges its right to act as the runner does at the top of every turn
//! ([`election::may_act`] on its last renewal; [`Driver::step_down`] when
//! it lapsed) and is then fed what the runner would feed it — its timers
//! (every worker looks silent to it), worker requests — and must emit
//! nothing: no lease, no event, no reply, no record.
//!
//! Checked after every step:
//! * the core's invariants (busy ≤ capacity among them);
//! * **one terminal state**: a task's stored terminal record never changes;
//! * **no re-run of a stored success**: no worker starts an attempt of a
//!   task whose success is in the journal;
//! * **one lease per attempt**: an attempt number of a task starts at most
//!   once, on one worker, and only under the epoch the worker follows.
//!
//! And at the end (faults stop, the system runs on): **no task lost**:
//! every submission has a stored `succeeded` record.
//!
//! `CRONOQ_SIM_SEED=n` replays one seed; `CRONOQ_SIM_SEEDS=n` runs more
//! (default 2,000; each seed runs a few thousand steps).

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use tokio::sync::oneshot;

use super::driver::{Driver, Input, Output, Responder, Settings};
use super::election;
use crate::core::{Labels, Millis, PoolConfig, PoolName, TaskId, TaskState};
use crate::task::Task;
use crate::wire::{
    self, Ack, AttemptReport, AttemptResult, Heartbeat, HeartbeatReply, Lease, Register,
    RegisterReply, Renew, RenewReply, Revoke, RunningAttempt, StartIndex, StartRecords, Subjects,
    TaskRecord, WireError,
};
use crate::worker::rules::{lease_lost, renew_every, LeaseVerdict, RevokeVerdict, Rules};

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

fn settings() -> Settings {
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
        group_starts: std::env::var("SIM_NOGROUP").is_err(),
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
    /// The newest leader's epoch: older writers are refused.
    fence: u64,
    succeeded: BTreeSet<u64>,
}

struct Leader {
    driver: Driver,
    epoch: u64,
    /// When its last renewal was sent (it renews at every step it runs).
    renewed: u64,
    /// Submissions handed to the driver so far.
    delivered: u64,
    /// The start records as read at takeover.
    starts: StartIndex,
    /// Turns whose writes are under way, oldest first: the committer
    /// pipelines them (a turn's records may land in any order, one task's
    /// in order; its announcements wait for all of them and the turns
    /// before).
    pipeline: std::collections::VecDeque<Pending>,
}

/// A turn being committed.
struct Pending {
    number: u64,
    writes: Vec<Write>,
    announce: Vec<Output>,
}

enum Write {
    Record(u64, TaskRecord),
    Starts(u32, StartRecords),
}

/// A request a worker waits on.
enum Waiting {
    Register(oneshot::Receiver<Result<RegisterReply, WireError>>),
    Heartbeat(oneshot::Receiver<Result<HeartbeatReply, WireError>>),
    /// The run's key and lease epoch.
    Report(
        (TaskId, u32),
        u64,
        oneshot::Receiver<Result<Ack, WireError>>,
    ),
    /// A renewal of the run's lease (key, lease epoch).
    Renew(
        (TaskId, u32),
        u64,
        oneshot::Receiver<Result<RenewReply, WireError>>,
    ),
}

struct Run {
    /// The epoch of the lease it runs under.
    epoch: u64,
    /// It ends failed (retryable) rather than succeeded.
    fails: bool,
    /// When its lease is renewed next (as `Attempt::renew_until_lost`).
    next_renew: u64,
    done_at: u64,
    /// Finished: reporting until acknowledged (or stale).
    reporting: bool,
}

struct Worker {
    id: String,
    slots: u32,
    registered: bool,
    /// The real worker's rules (`crate::worker::rules`): which lease to
    /// obey, which revoke to act on, what a registration stops, the epoch.
    rules: Rules,
    /// The timing of what runs (the rules say what runs).
    runs: BTreeMap<(TaskId, u32), Run>,
    waiting: Vec<Waiting>,
    next_heartbeat: u64,
}

impl Worker {
    /// The run of `key` under `epoch` ended: gone if it is the current one.
    fn end_run(&mut self, key: (TaskId, u32), epoch: u64) {
        if self.rules.ended(key, epoch) {
            self.runs.remove(&key);
        }
    }
}

/// Something on its way from the leader to a worker.
struct Message {
    at: u64,
    worker: String,
    body: Body,
}

enum Body {
    Lease(Lease),
    Revoke(Revoke),
}

struct World {
    rng: Rng,
    now: u64,
    journal: Journal,
    leader: Option<Leader>,
    /// No leader until then (an election after a crash).
    election_at: u64,
    /// A leader paused (SIGSTOP) and when it resumes.
    paused: Option<(Leader, u64)>,
    /// Paused leaders that resumed deposed (and emitted nothing).
    resumed_deposed: u64,
    next_epoch: u64,
    submissions: Vec<Task>,
    workers: Vec<Worker>,
    next_worker: u32,
    network: Vec<Message>,
    /// (task, attempt) → worker, for every attempt ever started.
    started: BTreeMap<(TaskId, u32), String>,
    runs: u64,
    reruns: u64,
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
    /// Recovered tasks whose running attempt came from a start record.
    from_starts: u64,
    /// Start-record slots written again.
    slot_rewrites: u64,
}

impl World {
    fn new(seed: u64) -> World {
        let mut w = World {
            rng: Rng(seed),
            now: 0,
            journal: Journal::default(),
            leader: None,
            election_at: 0,
            paused: None,
            resumed_deposed: 0,
            next_epoch: 1,
            submissions: Vec::new(),
            workers: Vec::new(),
            next_worker: 0,
            network: Vec::new(),
            started: BTreeMap::new(),
            runs: 0,
            reruns: 0,
            restarts: 0,
            failures: 0,
            renewals: 0,
            renewals_lost: 0,
            duplicates: 0,
            from_starts: 0,
            slot_rewrites: 0,
        };
        for _ in 0..3 {
            w.add_worker();
        }
        w
    }

    fn add_worker(&mut self) {
        self.next_worker += 1;
        let slots = 1 + self.rng.below(3) as u32;
        self.workers.push(Worker {
            id: format!("w{}", self.next_worker),
            slots,
            registered: false,
            rules: Rules::default(),
            runs: BTreeMap::new(),
            waiting: Vec::new(),
            next_heartbeat: self.now,
        });
    }

    fn pool() -> PoolName {
        PoolName::new(POOL).unwrap()
    }

    /// A successor takes over: a newer epoch fences the old one out, then
    /// it reads every submission back with its journal record.
    fn elect(&mut self) {
        let epoch = self.next_epoch;
        self.next_epoch += 1;
        self.journal.fence = epoch;
        let mut driver = Driver::new(Subjects::default(), epoch, settings(), Millis(self.now));
        if !self.submissions.is_empty() {
            driver.catch_up_first();
        }
        let mut starts = StartIndex::default();
        for (slot, (records, at)) in &self.journal.starts {
            if self.now < at + RECORD_TTL {
                starts.set(*slot, Some(records.clone()));
            }
        }
        self.leader = Some(Leader {
            driver,
            epoch,
            renewed: self.now,
            delivered: 0,
            starts,
            pipeline: Default::default(),
        });
    }

    /// The consumer: hands the driver a few more submissions.
    fn deliver(&mut self) {
        let Some(leader) = &mut self.leader else {
            return;
        };
        let total = self.submissions.len() as u64;
        let batch = 1 + self.rng.below(20);
        while leader.delivered < total && batch > 0 {
            let seq = leader.delivered + 1;
            leader.delivered = seq;
            let task = self.submissions[(seq - 1) as usize].clone();
            let now = self.now;
            let record =
                self.journal.records.get(&seq).and_then(|(r, at)| {
                    (r.state.is_terminal() || now < at + RECORD_TTL).then_some(r)
                });
            let input = match record {
                Some(r) if r.state.is_terminal() => None,
                record => match leader.starts.merge(TaskId(seq), record.cloned()) {
                    (Some(record), start_slot) => Some(Input::Recovered {
                        // (Counted below.)
                        seq,
                        pool: Self::pool(),
                        task: Ok(task),
                        record,
                        start_slot,
                    }),
                    (None, _) => Some(Input::Submitted {
                        seq,
                        pool: Self::pool(),
                        task: Ok(task),
                    }),
                },
            };
            if let Some(input) = input {
                if let Input::Recovered {
                    start_slot: Some(_),
                    ..
                } = &input
                {
                    self.from_starts += 1;
                }
                leader.driver.handle(Millis(self.now), input);
            }
            if seq == total {
                leader.driver.handle(Millis(self.now), Input::CaughtUp);
            }
            if self.rng.chance(300) {
                break;
            }
        }
    }

    /// One driver turn handed to the committer; then, at random, the
    /// oldest turns under way complete (records stored, fenced; then what
    /// they announce; then the driver hears they are stored).
    fn commit(&mut self) {
        let Some(leader) = &mut self.leader else {
            return;
        };
        leader.driver.housekeeping(Millis(self.now));
        let outputs = leader.driver.take_outputs();
        let mut turn = Pending {
            number: leader.driver.turn(),
            writes: Vec::new(),
            announce: Vec::new(),
        };
        for output in outputs {
            match output {
                Output::Persist { seq, record, .. } => turn.writes.push(Write::Record(seq, record)),
                Output::PersistStarts { slot, record } => {
                    turn.writes.push(Write::Starts(slot, record))
                }
                Output::Discard { .. } => {}
                other => turn.announce.push(other),
            }
        }
        leader.pipeline.push_back(turn);
        if self.rng.chance(3) {
            // Crash with turns in flight.
            self.crash();
            return;
        }
        let complete = if leader.pipeline.len() > 4 || self.rng.chance(600) {
            leader.pipeline.len()
        } else {
            0
        };
        for _ in 0..complete {
            self.complete_turn();
        }
    }

    /// Stores a write of the leader of `epoch` (the fence refuses a
    /// deposed one's).
    fn store(&mut self, epoch: u64, write: Write) {
        assert_eq!(epoch, self.journal.fence, "a deposed leader acted");
        match write {
            Write::Record(seq, record) => {
                if let Some((old, _)) = self.journal.records.get(&seq) {
                    if old.state.is_terminal() {
                        assert_eq!(old, &record, "task {seq}: a terminal record was rewritten");
                    }
                }
                if record.state == TaskState::Succeeded {
                    self.journal.succeeded.insert(seq);
                }
                self.journal.records.insert(seq, (record, self.now));
            }
            Write::Starts(slot, record) => {
                if self.journal.starts.contains_key(&slot) {
                    self.slot_rewrites += 1;
                }
                self.journal.starts.insert(slot, (record, self.now));
            }
        }
    }

    /// The oldest turn under way completes.
    fn complete_turn(&mut self) {
        let Some(leader) = &mut self.leader else {
            return;
        };
        let Some(turn) = leader.pipeline.pop_front() else {
            return;
        };
        let epoch = leader.epoch;
        for write in turn.writes {
            self.store(epoch, write);
        }
        let mut sent = Vec::new();
        for output in turn.announce {
            if let Output::Lease { task, attempt, .. } = &output {
                sent.push((*task, *attempt));
            }
            match output {
                Output::Reply(reply) => reply(),
                Output::Publish { subject, body } | Output::Lease { subject, body, .. } => {
                    let worker = subject.split('.').nth(2).unwrap_or_default().to_string();
                    let body = if subject.ends_with(".lease") {
                        Body::Lease(wire::decode(&body).expect("lease"))
                    } else if subject.ends_with(".revoke") {
                        Body::Revoke(wire::decode(&body).expect("revoke"))
                    } else {
                        continue; // task events
                    };
                    let copies = if self.rng.chance(30) { 2 } else { 1 };
                    self.duplicates += copies - 1;
                    for _ in 0..copies {
                        let at = self.now + self.rng.below(150);
                        self.network.push(Message {
                            at,
                            worker: worker.clone(),
                            body: match &body {
                                Body::Lease(l) => Body::Lease(l.clone()),
                                Body::Revoke(r) => Body::Revoke(r.clone()),
                            },
                        });
                    }
                }
                Output::Persist { .. } | Output::PersistStarts { .. } | Output::Discard { .. } => {}
            }
        }
        if let Some(leader) = &mut self.leader {
            if !sent.is_empty() {
                leader
                    .driver
                    .handle(Millis(self.now), Input::LeasesSent(sent));
            }
            // Sometimes lost (a full channel): a later one says as much.
            if !self.rng.chance(200) {
                leader
                    .driver
                    .handle(Millis(self.now), Input::Stored(turn.number));
            }
        }
    }

    /// The leader dies. Of the writes under way some landed, in any order
    /// across keys (each is its own publish), in order for one task (a
    /// record waits for the task's previous one); none of those turns was
    /// announced.
    fn crash(&mut self) {
        if let Some(leader) = self.leader.take() {
            self.land_some(leader);
        }
        self.leader = None;
        self.election_at = self.now + 200 + self.rng.below(1_500);
    }

    /// Of a stopped leader's writes under way some land, in any order
    /// across keys, in order for one task; none of those turns is
    /// announced.
    fn land_some(&mut self, mut leader: Leader) -> Leader {
        {
            let mut blocked = BTreeSet::new();
            for turn in std::mem::take(&mut leader.pipeline) {
                for write in turn.writes {
                    let lands = self.rng.chance(500);
                    match &write {
                        Write::Record(seq, _) if blocked.contains(seq) => continue,
                        Write::Record(seq, _) if !lands => {
                            blocked.insert(*seq);
                            continue;
                        }
                        _ if !lands => continue,
                        _ => {}
                    }
                    self.store(leader.epoch, write);
                }
            }
        }
        leader
    }

    /// The leader stops (SIGSTOP) for longer than the election timeout,
    /// its turns under way with it: a follower takes over once the
    /// leader's last renewal is `ELECTION_TIMEOUT` old.
    fn pause(&mut self) {
        let Some(leader) = self.leader.take() else {
            return;
        };
        let resume_at = self.now + ELECTION_TIMEOUT + 100 + self.rng.below(1_500);
        self.election_at = leader.renewed + ELECTION_TIMEOUT;
        // Its writes under way land or not before the successor's epoch
        // (NATS had them before the pause); their turns are never
        // announced (below).
        let leader = self.land_some(leader);
        self.paused = Some((leader, resume_at));
    }

    /// The paused leader resumes. A successor leads by now (its epoch
    /// fences the paused one's writes). The resumed process runs what its
    /// runner runs: the right to act judged at the top of the turn, then
    /// its timers and whatever requests reached it — and must emit nothing.
    fn resume(&mut self) {
        let Some((mut old, _)) = self.paused.take() else {
            return;
        };
        assert!(self.journal.fence > old.epoch, "no successor took over");
        if !election::may_act(
            Millis(self.now),
            Millis(old.renewed),
            Millis(ELECTION_TIMEOUT),
        ) {
            old.driver.step_down();
        }
        let now = Millis(self.now);
        old.driver.housekeeping(now);
        for w in &self.workers {
            let (tx, _rx) = oneshot::channel();
            let heartbeat = Heartbeat {
                v: 1,
                worker_id: w.id.clone(),
                free_slots: 0,
                running: Vec::new(),
            };
            old.driver
                .handle(now, Input::Heartbeat(heartbeat, Responder::Local(tx)));
        }
        let emitted = old.driver.take_outputs();
        assert!(
            emitted.is_empty(),
            "a deposed leader (epoch {}, successor {}) emitted {:?}",
            old.epoch,
            self.journal.fence,
            emitted
        );
        assert!(old.driver.deposed());
        self.resumed_deposed += 1;
    }

    fn request(&mut self, make: impl FnOnce() -> Input) -> bool {
        // Lost on the way: the worker times out and asks again.
        if self.rng.chance(20) {
            return false;
        }
        match &mut self.leader {
            Some(leader) => {
                leader.driver.handle(Millis(self.now), make());
                true
            }
            None => false,
        }
    }

    fn step_workers(&mut self) {
        // Messages due now, in random order among themselves.
        let mut due = Vec::new();
        let mut i = 0;
        while i < self.network.len() {
            if self.network[i].at <= self.now {
                due.push(self.network.swap_remove(i));
            } else {
                i += 1;
            }
        }
        for m in due {
            let Some(w) = self.workers.iter().position(|w| w.id == m.worker) else {
                continue; // a dead worker
            };
            match m.body {
                Body::Lease(lease) => self.on_lease(w, lease),
                Body::Revoke(revoke) => {
                    let worker = &mut self.workers[w];
                    let key = (revoke.task_id, revoke.attempt);
                    if worker.rules.revoke(key, revoke.epoch) == RevokeVerdict::Stop {
                        if let Some(run) = worker.runs.get_mut(&key) {
                            if !run.reporting {
                                // Stopped: reports cancelled.
                                run.reporting = true;
                                run.done_at = 0;
                            }
                        }
                    }
                }
            }
        }
        for w in 0..self.workers.len() {
            self.step_worker(w);
        }
    }

    fn on_lease(&mut self, w: usize, lease: Lease) {
        let worker = &mut self.workers[w];
        let key = (lease.task_id, lease.attempt);
        let restart = match worker.rules.lease(key, lease.epoch, false) {
            LeaseVerdict::Start => false,
            LeaseVerdict::Restart { .. } => {
                // The same attempt leased again by a newer leader, on the
                // same worker: the old run stops and reports nothing.
                worker.runs.remove(&key);
                self.restarts += 1;
                true
            }
            _ => return,
        };
        assert!(
            !self.journal.succeeded.contains(&lease.task_id.0),
            "task {} ran again (attempt {}) after its success was stored",
            lease.task_id,
            lease.attempt
        );
        if let Some(other) = self
            .started
            .get(&key)
            .filter(|o| !restart || **o != worker.id)
        {
            panic!(
                "attempt {} of task {} started twice: on {other} and on {}",
                lease.attempt, lease.task_id, worker.id
            );
        }
        self.started.insert(key, worker.id.clone());
        self.runs += 1;
        if lease.attempt > 1 {
            self.reruns += 1;
        }
        // Some attempts outlive the records' max age, up to 3 times over.
        let done_at = if self.rng.chance(20) {
            self.now + 40_000 + self.rng.below(60_000)
        } else {
            self.now + 20 + self.rng.below(400)
        };
        let fails = self.rng.chance(50);
        worker.runs.insert(
            key,
            Run {
                epoch: lease.epoch,
                fails,
                next_renew: self.now + renew_every(lease.ttl).0,
                done_at,
                reporting: false,
            },
        );
    }

    fn step_worker(&mut self, w: usize) {
        let now = self.now;
        // Answers that came back.
        let waiting = std::mem::take(&mut self.workers[w].waiting);
        let mut still = Vec::new();
        let mut register_again = false;
        for waiting in waiting {
            match waiting {
                Waiting::Register(mut rx) => match rx.try_recv() {
                    Ok(Ok(reply)) => {
                        let worker = &mut self.workers[w];
                        for k in worker.rules.registered(reply.epoch, &reply.adopted) {
                            worker.runs.remove(&k);
                        }
                        worker.registered = true;
                    }
                    Ok(Err(_)) | Err(oneshot::error::TryRecvError::Closed) => {}
                    Err(oneshot::error::TryRecvError::Empty) => still.push(Waiting::Register(rx)),
                },
                Waiting::Heartbeat(mut rx) => match rx.try_recv() {
                    Ok(Ok(reply)) if reply.registered => {
                        self.workers[w].rules.heard_epoch(reply.epoch);
                    }
                    Ok(Ok(_)) => register_again = true,
                    Ok(Err(_)) | Err(oneshot::error::TryRecvError::Closed) => {}
                    Err(oneshot::error::TryRecvError::Empty) => still.push(Waiting::Heartbeat(rx)),
                },
                Waiting::Renew(key, epoch, mut rx) => match rx.try_recv() {
                    Ok(Ok(reply)) => {
                        if let Some(run) = self.workers[w].runs.get_mut(&key) {
                            run.next_renew = now + renew_every(reply.ttl).0;
                        }
                    }
                    // The lease is gone: the attempt stops, reporting
                    // nothing (the leader counted it lost).
                    Ok(Err(e)) if lease_lost(&e.code) => {
                        let worker = &mut self.workers[w];
                        let current = worker
                            .runs
                            .get(&key)
                            .is_some_and(|r| r.epoch == epoch && !r.reporting);
                        if current {
                            self.renewals_lost += 1;
                            worker.end_run(key, epoch);
                        }
                    }
                    Ok(Err(_)) | Err(oneshot::error::TryRecvError::Closed) => {}
                    Err(oneshot::error::TryRecvError::Empty) => {
                        still.push(Waiting::Renew(key, epoch, rx))
                    }
                },
                Waiting::Report(key, epoch, mut rx) => match rx.try_recv() {
                    // Taken, or refused for good: the run ended (as the
                    // real attempt tells its loop, with its lease epoch).
                    Ok(Ok(_)) => self.workers[w].end_run(key, epoch),
                    Ok(Err(e)) if e.code != crate::core::ErrorCode::UNAVAILABLE => {
                        self.workers[w].end_run(key, epoch)
                    }
                    Ok(Err(_)) | Err(oneshot::error::TryRecvError::Closed) => {}
                    Err(oneshot::error::TryRecvError::Empty) => {
                        still.push(Waiting::Report(key, epoch, rx))
                    }
                },
            }
        }
        self.workers[w].waiting = still;
        let worker = &self.workers[w];
        let (id, slots) = (worker.id.clone(), worker.slots);
        let running: Vec<RunningAttempt> = worker.rules.running();
        if !worker.registered || register_again {
            if worker
                .waiting
                .iter()
                .any(|x| matches!(x, Waiting::Register(_)))
            {
                return;
            }
            let (tx, rx) = oneshot::channel();
            let register = Register {
                lease_batches: false,
                v: 1,
                worker_id: id.clone(),
                pool: Self::pool(),
                labels: Labels::new(),
                slots,
                xkey: None,
                instance: Some(id.clone()),
                running,
            };
            if self.request(|| Input::Register(register, Default::default(), Responder::Local(tx)))
            {
                self.workers[w].waiting.push(Waiting::Register(rx));
            }
            return;
        }
        if now >= worker.next_heartbeat {
            self.workers[w].next_heartbeat = now + HEARTBEAT_EVERY;
            let (tx, rx) = oneshot::channel();
            let heartbeat = Heartbeat {
                v: 1,
                worker_id: id.clone(),
                free_slots: 0,
                running: running.clone(),
            };
            if self.request(|| Input::Heartbeat(heartbeat, Responder::Local(tx))) {
                self.workers[w].waiting.push(Waiting::Heartbeat(rx));
            }
        }
        // Running attempts renew their leases.
        let renew: Vec<((TaskId, u32), u64)> = self.workers[w]
            .runs
            .iter()
            .filter(|(_, r)| !r.reporting && r.done_at > now && r.next_renew <= now)
            .map(|(k, r)| (*k, r.epoch))
            .collect();
        for (key, epoch) in renew {
            if let Some(run) = self.workers[w].runs.get_mut(&key) {
                run.next_renew = now + renew_every(Millis(LEASE_TTL)).0;
            }
            let body = Renew {
                v: 1,
                worker_id: id.clone(),
                task_id: key.0,
                attempt: key.1,
                epoch,
            };
            let (tx, rx) = oneshot::channel();
            if self.request(|| Input::Renew(body, Responder::Local(tx))) {
                self.renewals += 1;
                self.workers[w].waiting.push(Waiting::Renew(key, epoch, rx));
            }
        }
        // Finished runs report (again, until answered).
        let due: Vec<((TaskId, u32), u64, bool, bool)> = self.workers[w]
            .runs
            .iter()
            .filter(|(_, r)| r.done_at <= now)
            .map(|(k, r)| (*k, r.epoch, r.reporting && r.done_at == 0, r.fails))
            .collect();
        for (key, epoch, cancelled, fails) in due {
            let worker = &mut self.workers[w];
            if worker
                .waiting
                .iter()
                .any(|x| matches!(x, Waiting::Report(k, e, _) if *k == key && *e == epoch))
            {
                continue;
            }
            let run = worker.runs.get_mut(&key).expect("due");
            if !run.reporting && fails && !cancelled {
                self.failures += 1;
            }
            run.reporting = true;
            let result = if cancelled {
                AttemptResult::Cancelled
            } else if fails {
                AttemptResult::Failed {
                    error: "boom".into(),
                    retryable: true,
                }
            } else {
                AttemptResult::Succeeded {
                    output: Bytes::from("ok"),
                }
            };
            let report = AttemptReport {
                v: 1,
                worker_id: id.clone(),
                task_id: key.0,
                attempt: key.1,
                epoch,
                result,
            };
            let (tx, rx) = oneshot::channel();
            if self.request(|| Input::Outcome(report, Responder::Local(tx))) {
                self.workers[w]
                    .waiting
                    .push(Waiting::Report(key, epoch, rx));
            }
        }
    }

    fn step(&mut self, faults: bool) {
        self.now += 5 + self.rng.below(40);
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
        if faults {
            if self.rng.chance(6) && self.submissions.len() < 400 {
                let n = 1 + self.rng.below(8);
                for _ in 0..n {
                    self.submissions.push(Task::new("x").pool(POOL));
                }
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
        self.deliver();
        self.commit();
        self.step_workers();
        self.commit();
        if let Some(leader) = &self.leader {
            if let Err(broken) = leader.driver.core_invariants() {
                panic!("core invariant broken: {broken}");
            }
        }
    }

    fn all_succeeded(&self) -> bool {
        (1..=self.submissions.len() as u64).all(|seq| self.journal.succeeded.contains(&seq))
    }
}

fn run(seed: u64) -> [u64; 10] {
    let mut world = World::new(seed);
    for _ in 0..2_000 {
        world.step(true);
    }
    // Faults stop; everything accepted must end, and succeed.
    let mut steps = 0;
    while !world.all_succeeded() {
        world.step(false);
        steps += 1;
        if steps > 20_000 {
            let missing: Vec<u64> = (1..=world.submissions.len() as u64)
                .filter(|s| !world.journal.succeeded.contains(s))
                .take(10)
                .collect();
            let states: Vec<String> = missing
                .iter()
                .map(|s| {
                    world
                        .leader
                        .as_ref()
                        .and_then(|l| l.driver.status(TaskId(*s)))
                        .map_or("unknown".into(), |st| format!("{s}: {}", st.state))
                })
                .collect();
            panic!("tasks never succeeded: {missing:?} {states:?}");
        }
    }
    [
        world.runs,
        world.reruns,
        world.from_starts,
        world.slot_rewrites,
        world.resumed_deposed,
        world.restarts,
        world.failures,
        world.renewals,
        world.renewals_lost,
        world.duplicates,
    ]
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
    let mut total = [0u64; 10];
    let runs_of_seeds = seeds.len();
    for seed in seeds {
        let result = std::panic::catch_unwind(|| run(seed));
        match result {
            Ok(counts) => {
                for (t, c) in total.iter_mut().zip(counts) {
                    *t += c;
                }
            }
            Err(panic) => {
                eprintln!("failing seed: CRONOQ_SIM_SEED={seed}");
                std::panic::resume_unwind(panic);
            }
        }
    }
    let [runs, reruns, from_starts, slot_rewrites, resumed_deposed, restarts, failures, renewals, renewals_lost, duplicates] =
        total;
    eprintln!(
        "{runs} attempts started, {reruns} of them retries (crashes, lost workers); \
         {from_starts} running attempts recovered from start records, \
         {slot_rewrites} start-record slots written again; \
         {resumed_deposed} paused leaders resumed deposed, emitting nothing; \
         {restarts} attempts restarted by their worker's rules under a newer lease; \
         {failures} failed attempts, {renewals} renewals ({renewals_lost} refused: lease lost), \
         {duplicates} duplicated leases or revokes"
    );
    // Each fault path was taken somewhere across the seeds.
    if runs_of_seeds >= 1_000 {
        for (what, n) in [
            ("a retry", reruns),
            ("a start record read back", from_starts),
            ("a failed attempt", failures),
            ("a renewal", renewals),
            ("a renewal refused as lost", renewals_lost),
            ("a duplicated message", duplicates),
        ] {
            assert!(n > 0, "no seed exercised {what}");
        }
    }
    assert!(
        resumed_deposed > 0 || runs_of_seeds < 100,
        "no paused leader resumed"
    );
}
