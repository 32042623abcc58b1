//! The simulation's leaders: election, the consumer, the committer (the
//! real [`Pipeline`] over an in-memory journal; what lands of it when a
//! leader dies), pauses, and the requests on their way to the leader.

use super::*;
use crate::server::driver::{Output, Responder};
use crate::server::journal::pipeline::{Record, Turn, Write as PipelineWrite};
use crate::server::{Replies, Waiting};
use crate::wire::{self, Ack, Heartbeat, StartIndex, Subjects};
use workers::Body;

pub(super) struct Leader {
    pub(super) driver: Driver,
    pub(super) epoch: u64,
    /// When its last renewal was sent (it renews at every step it runs).
    pub(super) renewed: u64,
    /// Submissions handed to the driver so far.
    delivered: u64,
    /// The start records as read at takeover.
    starts: StartIndex,
    /// The committer's ordering: which writes may start, which turns may
    /// be announced.
    pipeline: Pipeline<Write, Output>,
    /// Writes the pipeline started (landing in any order).
    under_way: Vec<PipelineWrite<Write>>,
    /// Turns waiting for the pipeline to take them.
    queued: Vec<Turn<Write, Output>>,
    /// Local callers (workers, clients) waiting on its replies; dropped
    /// with it, so they hear nothing more.
    pub(super) replies: Replies,
    /// Requests on their way to it: (when they arrive, sent order, input).
    inbox: Vec<(u64, u64, Input)>,
    sent: u64,
    /// The newest sent-order number delivered so far.
    last_delivered: u64,
    /// Cancels asked for, waiting for their acknowledgement.
    cancels: Vec<(u64, Waiting<Ack>)>,
}

impl Leader {
    /// An input on its way to the leader, arriving at `at` (lost if the
    /// leader dies first), like a request.
    pub(super) fn send_later(&mut self, at: u64, input: Input) {
        self.sent += 1;
        self.inbox.push((at, self.sent, input));
    }
}

impl World {
    /// A successor takes over: a newer epoch fences the old one out, then
    /// it reads every submission back with its journal record.
    pub(super) fn elect(&mut self) {
        let epoch = self.next_epoch;
        self.next_epoch += 1;
        self.journal.fence = epoch;
        let mut driver = Driver::new(
            Subjects::default(),
            epoch,
            settings(!self.batches),
            Millis(self.now),
        );
        if !self.submissions.is_empty() {
            driver.catch_up_first(self.submissions.len());
        }
        driver.restore_schedules(self.stored_schedules());
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
            pipeline: Pipeline::new(self.limits),
            under_way: Vec::new(),
            queued: Vec::new(),
            replies: Replies::default(),
            inbox: Vec::new(),
            sent: 0,
            last_delivered: 0,
            cancels: Vec::new(),
        });
    }

    /// The consumer: hands the driver a few more submissions.
    pub(super) fn deliver(&mut self) {
        let Some(leader) = &mut self.leader else {
            return;
        };
        let total = self.submissions.len() as u64;
        let batch = 1 + self.rng.below(20);
        while leader.delivered < total && batch > 0 {
            let seq = leader.delivered + 1;
            leader.delivered = seq;
            let task = self.submissions[(seq - 1) as usize].task.clone();
            let now = self.now;
            let record =
                self.journal.records.get(&seq).and_then(|(r, at)| {
                    (r.state.is_terminal() || now < at + RECORD_TTL).then_some(r)
                });
            let input = match record {
                // Finished: its key stays bound to it (a duplicate further
                // on is that task), as the consumer hands it over.
                Some(r) if r.state.is_terminal() => Input::Recovered {
                    seq,
                    pool: Self::pool(),
                    task: Ok(task),
                    record: r.clone(),
                    start_slot: None,
                },
                record => match leader.starts.merge(TaskId(seq), record.cloned()) {
                    (Some(record), start_slot) => {
                        if start_slot.is_some() {
                            self.counts.from_starts += 1;
                        }
                        Input::Recovered {
                            seq,
                            pool: Self::pool(),
                            task: Ok(task),
                            record,
                            start_slot,
                        }
                    }
                    (None, _) => Input::Submitted {
                        seq,
                        pool: Self::pool(),
                        task: Ok(task),
                    },
                },
            };
            leader.driver.handle(Millis(self.now), input);
            if seq == total {
                leader.driver.handle(Millis(self.now), Input::CaughtUp);
            }
            if self.rng.chance(300) {
                break;
            }
        }
    }

    /// A client cancels a task: one the leader has read (answered once
    /// stored), or one it has not (cancelled when it arrives, as the
    /// leader's API does for a task the stream holds).
    pub(super) fn cancel(&mut self) {
        if self.submissions.is_empty() {
            return;
        }
        let seq = 1 + self.rng.below(self.submissions.len() as u64);
        if self.leader.is_none() {
            return;
        }
        // A duplicate's id stands for the task that holds its key: the
        // original, as every leader knows the key of a task whose
        // submission it reads back, finished or not (seed 244: one that
        // skipped a finished original ran the duplicates the leader before
        // had discarded, and a cancel acknowledged for one was followed by
        // another run of the key). Any of them may end cancelled.
        for other in self.same_key(seq) {
            self.submissions[(other - 1) as usize].cancel_asked = true;
        }
        self.counts.cancels += 1;
        let leader = self.leader.as_mut().expect("leads");
        if seq > leader.delivered {
            self.counts.cancels_on_arrival += 1;
            leader
                .driver
                .handle(Millis(self.now), Input::CancelOnArrival(TaskId(seq)));
            return;
        }
        let (to, waiting) = leader.replies.open::<Ack>();
        leader
            .driver
            .handle(Millis(self.now), Input::Cancel(TaskId(seq), to));
        leader.cancels.push((seq, waiting));
    }

    /// One driver turn handed to the pipeline; then, at random, some
    /// writes under way land (fenced), and every turn the pipeline then
    /// releases is announced (the driver hears its leases went out and
    /// that it is stored).
    pub(super) fn commit(&mut self) {
        let Some(leader) = &mut self.leader else {
            return;
        };
        leader.driver.housekeeping(Millis(self.now));
        let mut turn: Turn<Write, Output> = Turn::default();
        for output in leader.driver.take_outputs() {
            match output {
                Output::Persist { seq, record, .. } => turn.records.push(Record {
                    task: Some(seq),
                    terminal: record.state.is_terminal(),
                    finished: Vec::new(),
                    alone: false,
                    body: Write::Record(seq, record),
                }),
                Output::PersistStarts { slot, record } => turn.records.push(Record {
                    task: None,
                    terminal: false,
                    finished: Vec::new(),
                    alone: false,
                    body: Write::Starts(slot, record),
                }),
                Output::PersistResults { record, .. } => turn.records.push(Record {
                    task: None,
                    terminal: false,
                    finished: record.results.iter().map(|r| r.id.0).collect(),
                    alone: false,
                    body: Write::Results(record.results),
                }),
                Output::Discard { seq } => {
                    self.counts.duplicates_discarded += 1;
                    self.discarded.insert(seq);
                }
                Output::PersistSchedule { name, stored } => turn.records.push(Record {
                    task: None,
                    terminal: false,
                    finished: Vec::new(),
                    alone: false,
                    body: Write::Schedule(name, stored),
                }),
                other => turn.announce.push(other),
            }
        }
        turn.number = leader.driver.turn();
        leader.queued.push(turn);
        self.take_turns();
        if self.rng.chance(3) {
            // Crash with writes under way.
            self.crash();
            return;
        }
        let under_way = self.leader.as_ref().map_or(0, |l| l.under_way.len());
        let lands = if under_way > 8 || self.rng.chance(600) {
            under_way
        } else {
            0
        };
        for _ in 0..lands {
            self.land_one();
        }
        self.release();
    }

    /// As the committer does: the queued turns go into the pipeline
    /// together (a group commit) once it takes turns again.
    fn take_turns(&mut self) {
        let Some(leader) = &mut self.leader else {
            return;
        };
        if leader.queued.is_empty() || !leader.pipeline.accepting(self.batches) {
            return;
        }
        let group = std::mem::take(&mut leader.queued);
        let started = leader.pipeline.push(group, self.batches);
        leader.under_way.extend(started);
        if !leader.pipeline.accepting(self.batches) {
            // Writes wait for room: the next turns queue.
            self.counts.writes_waited += 1;
        }
    }

    /// One write under way, at random, lands.
    fn land_one(&mut self) {
        let Some(leader) = &mut self.leader else {
            return;
        };
        if leader.under_way.is_empty() {
            return;
        }
        let i = self.rng.below(leader.under_way.len() as u64) as usize;
        let write = leader.under_way.swap_remove(i);
        let (epoch, id) = (leader.epoch, write.id);
        for record in write.records {
            self.store(epoch, record.body);
        }
        let leader = self.leader.as_mut().expect("leads");
        let next = leader.pipeline.stored(id);
        leader.under_way.extend(next);
        self.take_turns();
    }

    /// Announces every turn the pipeline releases.
    fn release(&mut self) {
        loop {
            let Some(leader) = &mut self.leader else {
                return;
            };
            let Some(released) = leader.pipeline.release() else {
                break;
            };
            let _ = leader;
            let mut sent = Vec::new();
            for output in released.announce {
                match output {
                    Output::Reply { id, reply } => {
                        let leader = self.leader.as_ref().expect("leads");
                        leader.replies.send(id, reply)
                    }
                    Output::Lease {
                        subject,
                        body,
                        task,
                        attempt,
                        ..
                    } => {
                        // Announced means journaled: a successor reads
                        // this attempt back.
                        assert!(
                            self.journaled(task.0, attempt),
                            "task {task}: attempt {attempt} leased before its start was stored"
                        );
                        sent.push((task, attempt));
                        self.send_to_worker(&subject, &body);
                    }
                    Output::Publish { subject, body } => self.send_to_worker(&subject, &body),
                    // The committer's part: published under its tick's key.
                    Output::Fire {
                        name,
                        tick,
                        kind,
                        task,
                    } => self.publish_fire(name, tick, kind, *task),
                    Output::Trace(_)
                    | Output::Persist { .. }
                    | Output::PersistStarts { .. }
                    | Output::PersistResults { .. }
                    | Output::PersistSchedule { .. }
                    | Output::Discard { .. } => {}
                }
            }
            let leader = self.leader.as_mut().expect("leads");
            if !sent.is_empty() {
                leader
                    .driver
                    .handle(Millis(self.now), Input::LeasesSent(sent));
            }
            // Sometimes lost (a full channel): a later one says as much.
            if !self.rng.chance(200) {
                leader
                    .driver
                    .handle(Millis(self.now), Input::Stored(released.number));
            }
        }
        self.check_cancels();
    }

    /// Whether a successor would read attempt `attempt` of task `seq`
    /// back: its record with the start records that follow it merged in.
    fn journaled(&self, seq: u64, attempt: u32) -> bool {
        let mut starts = StartIndex::default();
        for (slot, (records, _)) in &self.journal.starts {
            if records.starts.iter().any(|s| s.id.0 == seq) {
                starts.set(*slot, Some(records.clone()));
            }
        }
        let record = self.journal.records.get(&seq).map(|(r, _)| r.clone());
        starts
            .merge(TaskId(seq), record)
            .0
            .is_some_and(|r| r.attempts.iter().any(|a| a.attempt == attempt))
    }

    /// Acknowledged cancels: announced only once stored, so the journal
    /// holds the task's end.
    fn check_cancels(&mut self) {
        let Some(leader) = &mut self.leader else {
            return;
        };
        let mut still = Vec::new();
        let cancels = std::mem::take(&mut leader.cancels);
        for (seq, mut waiting) in cancels {
            match waiting.try_recv() {
                Ok(Ok(_)) => {
                    self.counts.cancels_acked += 1;
                    self.submissions[(seq - 1) as usize].cancel_acked = true;
                    let state = self.stored_state(seq);
                    // Announced means stored: the task's end is in the
                    // journal (cancelled, or a success stored first).
                    assert!(
                        state.is_some_and(|s| s.is_terminal()),
                        "task {seq}: cancel acknowledged before its end was stored ({state:?})"
                    );
                }
                Ok(Err(_)) | Err(tokio::sync::oneshot::error::TryRecvError::Closed) => {}
                Err(tokio::sync::oneshot::error::TryRecvError::Empty) => still.push((seq, waiting)),
            }
        }
        if let Some(leader) = &mut self.leader {
            leader.cancels = still;
        }
    }

    /// The stored state of task `seq`, or of its original if it is a
    /// duplicate some leader discarded (its id stands for the original).
    pub(super) fn stored_state(&self, seq: u64) -> Option<TaskState> {
        let of = |s: u64| self.journal.records.get(&s).map(|(r, _)| r.state);
        of(seq).or_else(|| {
            if !self.discarded.contains(&seq) {
                return None;
            }
            self.same_key(seq)
                .into_iter()
                .find_map(|s| of(s).filter(|state| *state == TaskState::Cancelled || s != seq))
        })
    }

    /// The submissions under the same idempotency key as `seq` (itself too).
    fn same_key(&self, seq: u64) -> Vec<u64> {
        let Some(key) = self.submissions[(seq - 1) as usize].task.key() else {
            return vec![seq];
        };
        (1..=self.submissions.len() as u64)
            .filter(|s| self.submissions[(*s - 1) as usize].task.key() == Some(key))
            .collect()
    }

    /// A lease or revoke on its way to its worker: delayed, sometimes
    /// twice; task events are not simulated.
    fn send_to_worker(&mut self, subject: &str, body: &bytes::Bytes) {
        let worker = subject.split('.').nth(2).unwrap_or_default().to_string();
        let body = if subject.ends_with(".lease") {
            Body::Lease(wire::decode(body).expect("lease"))
        } else if subject.ends_with(".revoke") {
            Body::Revoke(wire::decode(body).expect("revoke"))
        } else {
            return; // task events and NATS replies
        };
        let copies = if self.rng.chance(30) { 2 } else { 1 };
        self.counts.duplicates += copies - 1;
        for _ in 0..copies {
            let at = self.now + self.rng.below(150);
            self.network.push(Message {
                at,
                worker: worker.clone(),
                body: body.clone(),
            });
        }
    }

    /// Stores a write of the leader of `epoch` (the fence refuses a
    /// deposed one's).
    fn store(&mut self, epoch: u64, write: Write) {
        assert_eq!(epoch, self.journal.fence, "a deposed leader acted");
        match write {
            Write::Record(seq, record) => self.store_record(seq, record),
            Write::Results(results) => {
                for record in results {
                    let seq = record.id.0;
                    // Only a task with no record of its own (or one the
                    // bucket's max age has expired) has its result in a
                    // batch: nothing under its id can contradict it.
                    if let Some((old, at)) = self.journal.records.get(&seq) {
                        assert!(
                            self.now >= at + RECORD_TTL,
                            "task {seq}: result batched beside its own record {old:?}"
                        );
                    }
                    assert!(
                        record.state.is_terminal(),
                        "task {seq}: a live record in a result batch"
                    );
                    self.counts.batched_results += 1;
                    self.store_record(seq, record);
                }
            }
            Write::Starts(slot, record) => {
                if self.journal.starts.contains_key(&slot) {
                    self.counts.slot_rewrites += 1;
                }
                self.journal.starts.insert(slot, (record, self.now));
            }
            Write::Schedule(name, stored) => {
                self.journal
                    .schedules
                    .insert(name, (stored.map(|s| *s), self.now));
            }
        }
    }

    /// Stores task `seq`'s record (its own, or from a result batch).
    fn store_record(&mut self, seq: u64, record: TaskRecord) {
        if let Some((old, _)) = self.journal.records.get(&seq) {
            if old.state.is_terminal() {
                assert_eq!(old, &record, "task {seq}: a terminal record was rewritten");
            }
        }
        match record.state {
            TaskState::Succeeded => {
                self.journal.succeeded.insert(seq);
            }
            TaskState::Cancelled => self.counts.cancelled += 1,
            _ => {}
        }
        let timed_out = record
            .attempts
            .iter()
            .filter(|a| a.error.as_deref() == Some(crate::ledger::TIMEOUT))
            .count() as u64;
        let before = self.journal.records.get(&seq).map_or(0, |(r, _)| {
            r.attempts
                .iter()
                .filter(|a| a.error.as_deref() == Some(crate::ledger::TIMEOUT))
                .count() as u64
        });
        self.counts.timeouts += timed_out.saturating_sub(before);
        self.journal.records.insert(seq, (record, self.now));
    }

    /// The leader dies.
    pub(super) fn crash(&mut self) {
        if let Some(leader) = self.leader.take() {
            self.land_some(leader);
        }
        self.election_at = self.now + 200 + self.rng.below(1_500);
    }

    /// Of a stopped leader's writes under way some land, in any order
    /// (an atomic batch whole or not at all); a write the pipeline holds
    /// back for an earlier one of its task starts only if that one landed
    /// (so one task's land in order). None of its turns is announced.
    fn land_some(&mut self, mut leader: Leader) -> Leader {
        while !leader.under_way.is_empty() {
            let i = self.rng.below(leader.under_way.len() as u64) as usize;
            let write = leader.under_way.swap_remove(i);
            if !self.rng.chance(500) {
                self.counts.lost_at_crash += 1;
                continue;
            }
            self.counts.landed_at_crash += 1;
            let id = write.id;
            for record in write.records {
                self.store(leader.epoch, record.body);
            }
            let next = leader.pipeline.stored(id);
            leader.under_way.extend(next);
        }
        leader
    }

    /// The leader stops (SIGSTOP) for longer than the election timeout,
    /// its writes under way with it: a follower takes over once the
    /// leader's last renewal is `ELECTION_TIMEOUT` old.
    pub(super) fn pause(&mut self) {
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
    pub(super) fn resume(&mut self) {
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
            let (to, _waiting) = old.replies.open::<wire::HeartbeatReply>();
            let heartbeat = Heartbeat {
                v: 1,
                worker_id: w.id.clone(),
                free_slots: 0,
                running: Vec::new(),
            };
            old.driver.handle(now, Input::Heartbeat(heartbeat, to));
        }
        for (_, _, input) in std::mem::take(&mut old.inbox) {
            old.driver.handle(now, input);
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
        self.counts.resumed_deposed += 1;
    }

    /// A worker's request to the leader: lost at times (the worker asks
    /// again), on its way for a while (so requests overtake each other),
    /// now and then delivered twice. `None`: no leader to send it to.
    pub(super) fn request<T>(
        &mut self,
        make: impl FnOnce(Responder) -> Input,
    ) -> Option<Waiting<T>> {
        // Lost on the way: the worker times out and asks again.
        if self.rng.chance(20) {
            return None;
        }
        let leader = self.leader.as_mut()?;
        let (to, waiting) = leader.replies.open::<T>();
        let input = make(to);
        let copies = if self.rng.chance(20) { 2 } else { 1 };
        for _ in 0..copies {
            leader.sent += 1;
            let at = self.now + self.rng.below(60);
            leader.inbox.push((at, leader.sent, input.clone()));
        }
        self.counts.requests_duplicated += copies - 1;
        Some(waiting)
    }

    /// The requests that reached the leader by now, in random order.
    pub(super) fn deliver_requests(&mut self) {
        let Some(leader) = &mut self.leader else {
            return;
        };
        let mut due = Vec::new();
        let mut i = 0;
        while i < leader.inbox.len() {
            if leader.inbox[i].0 <= self.now {
                due.push(leader.inbox.swap_remove(i));
            } else {
                i += 1;
            }
        }
        for (_, sent, input) in due {
            if sent < leader.last_delivered {
                self.counts.requests_reordered += 1;
            }
            leader.last_delivered = leader.last_delivered.max(sent);
            leader.driver.handle(Millis(self.now), input);
        }
    }
}
