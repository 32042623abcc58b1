//! The simulation's leaders: election and takeover (the log read to its
//! end, the takeover entry appended where it ended, fenced), the consumer
//! (what the log says of each submission, handed over by the consumer's
//! own [`inputs_for`]), the committer (the runner's [`turn_of`], the group
//! commit's [`group`], the [`Announcer`], appends pipelined over the
//! simulated log), snapshots and the submit stream's purge, pauses, and
//! the requests on their way to the leader.

use super::log::{Appender, Next};
use super::*;
use crate::server::consumer::{finished_key, inputs_for, Decoded};
use crate::server::driver::{Output, Responder};
use crate::server::journal::{group, turn_of, Announcer, Queued, Turn};
use crate::server::warm::Known;
use crate::server::{Replies, Waiting};
use crate::wire::{self, Ack, Heartbeat, Subjects};
use workers::Body;

pub(super) struct Leader {
    /// The server it runs on.
    pub(super) server: usize,
    pub(super) driver: Driver,
    pub(super) epoch: u64,
    /// When its last renewal was sent (it renews at every step it runs).
    pub(super) renewed: u64,
    /// The next submission the consumer hands over.
    pub(super) next_seq: u64,
    /// The submit stream's last sequence at the takeover: what the log
    /// may know of.
    startup_last: u64,
    catch_up_to: Option<u64>,
    appender: Appender,
    announcer: Announcer,
    /// Turns waiting for room among the entries under way.
    queued: Vec<Turn>,
    /// Results being stored: their submissions must not be purged yet.
    pending: BTreeSet<u64>,
    since_snapshot: u64,
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
    /// A server wins the election and takes over: its copy of the log read
    /// to the end (loaded from the snapshot first when it follows nothing,
    /// `warm_standby = false`), then its takeover entry appended there —
    /// refused if the deposed leader's last appends landed meanwhile (read
    /// on, then again). Its driver is handed the schedules, the keys of
    /// finished tasks, then the submissions with what the log says of each.
    pub(super) fn elect(&mut self) {
        let busy = self.paused.as_ref().map(|(l, _)| l.server);
        let candidates: Vec<usize> = (0..self.servers.len())
            .filter(|s| Some(*s) != busy)
            .collect();
        let server = candidates[self.rng.below(candidates.len() as u64) as usize];
        let epoch = self.next_epoch;
        self.next_epoch += 1;
        if !self.warm_standby || !self.servers[server].loaded {
            self.counts.cold_takeovers += 1;
            self.load(server);
        }
        let appended = loop {
            self.follow(server, u64::MAX);
            if !self.servers[server].loaded {
                self.load(server);
                continue;
            }
            // The deposed leader's appends on their way may land first.
            if self.rng.chance(300) {
                if let Some((old, _)) = &mut self.paused {
                    if old.appender.arrive(&mut self.log, false, false) == Some(true) {
                        self.counts.takeovers_fenced += 1;
                        self.sync_truth();
                    }
                }
            }
            let journal = &self.servers[server].journal;
            let read = journal.seen();
            match Appender::take_over(
                &mut self.log,
                &self.seal,
                self.max_message,
                epoch,
                read,
                &format!("s{server}"),
            ) {
                Ok(appended) => break appended,
                Err(_) => {
                    assert!(
                        self.log.last > read,
                        "the takeover cannot append: its copy read past the log ({read} > {})",
                        self.log.last
                    );
                }
            }
        };
        let (appender, at, entry) = appended;
        self.sync_truth();
        let journal = self.servers[server].journal.clone();
        journal.apply_stored(at, &entry);
        self.check_state(&journal, "a takeover's copy");
        let startup_last = self.submissions.len() as u64;
        let messages = (startup_last + 1).saturating_sub(self.submit_first);
        let mut driver = Driver::new(Subjects::default(), epoch, settings(), Millis(self.now));
        if messages > 0 {
            driver.catch_up_first(messages as usize);
        }
        driver.restore_schedules(journal.schedules());
        for (seq, record) in journal.keyed_finished(startup_last) {
            if let Some(input) = finished_key(seq, record.map(|r| *r)) {
                driver.handle(Millis(self.now), input);
            }
        }
        // The scenario: a finished task whose submission is still
        // in the stream and whose result the bucket no longer holds.
        for seq in self.submit_first..=startup_last {
            let finished = self
                .records
                .get(&seq)
                .is_some_and(|r| r.state.is_terminal());
            if finished && !self.result_kept(seq) {
                self.counts.expired_results_at_takeover += 1;
            }
        }
        self.leader = Some(Leader {
            server,
            driver,
            epoch,
            renewed: self.now,
            next_seq: self.submit_first,
            startup_last,
            catch_up_to: (messages > 0).then_some(startup_last),
            appender,
            announcer: Announcer::default(),
            queued: Vec::new(),
            pending: BTreeSet::new(),
            since_snapshot: 0,
            replies: Replies::default(),
            inbox: Vec::new(),
            sent: 0,
            last_delivered: 0,
            cancels: Vec::new(),
        });
    }

    /// The consumer: hands the driver a few more submissions, each with
    /// what the log says of it.
    pub(super) fn deliver(&mut self) {
        let Some(leader) = &mut self.leader else {
            return;
        };
        let journal = self.servers[leader.server].journal.clone();
        let total = self.submissions.len() as u64;
        let batch = 1 + self.rng.below(20);
        let mut handed = 0;
        while leader.next_seq <= total && handed < batch {
            let seq = leader.next_seq;
            leader.next_seq = seq + 1;
            handed += 1;
            let known = if seq > leader.startup_last {
                Known::None
            } else {
                journal.known(seq)
            };
            let task = self.submissions[(seq - 1) as usize].task.clone();
            let decoded = || Decoded {
                pool: Self::pool(),
                task: Ok(task),
                unattributed: false,
            };
            if let Some(input) = inputs_for(seq, known, decoded) {
                leader.driver.handle(Millis(self.now), input);
            }
            if leader.catch_up_to.is_some_and(|last| seq >= last) {
                leader.catch_up_to = None;
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
        if seq >= leader.next_seq {
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

    /// One driver turn to the committer (the runner's [`turn_of`]); the
    /// turns queued go out as one entry when there is room; then, at
    /// random, the leader dies with appends under way, or some of them
    /// reach the log, and each entry known stored is applied and its
    /// turns announced; now and then a snapshot, and the submit stream's
    /// purge.
    pub(super) fn commit(&mut self) {
        let Some(leader) = &mut self.leader else {
            return;
        };
        leader.driver.housekeeping(Millis(self.now));
        let outputs = leader.driver.take_outputs();
        for output in &outputs {
            if let Output::Discard { seq } = output {
                self.counts.duplicates_discarded += 1;
                self.discarded.insert(*seq);
            }
        }
        let pending = &mut leader.pending;
        let turn = turn_of(outputs.into_iter(), |seq| {
            pending.insert(seq);
        });
        if !turn.is_empty() {
            leader.queued.push(turn);
        }
        self.take_turns();
        if self.rng.chance(3) {
            // Crash with appends under way.
            self.crash();
            return;
        }
        let flying = self.leader.as_ref().map_or(0, |l| l.appender.flying());
        let arrive = if flying > 8 || self.rng.chance(600) {
            flying
        } else {
            0
        };
        for _ in 0..arrive {
            self.arrive_one();
        }
        self.sync_truth();
        self.drain_stored();
        self.snapshot();
        if self.rng.chance(40) {
            self.purge_submissions();
        }
    }

    /// The oldest piece of the leader's on its way reaches the log (or is
    /// lost; its answer lost at times).
    fn arrive_one(&mut self) {
        let Some(leader) = &mut self.leader else {
            return;
        };
        let lost = self.rng.chance(15);
        let answered = !self.rng.chance(30);
        match leader.appender.arrive(&mut self.log, lost, answered) {
            Some(true) if !answered => self.counts.acks_lost += 1,
            Some(false) if lost => self.counts.pieces_lost += 1,
            Some(false) => self.counts.pieces_refused += 1,
            _ => {}
        }
    }

    /// As the committer does: the queued turns go out together as one
    /// entry (a group commit) while fewer than the limit are under way.
    fn take_turns(&mut self) {
        let Some(leader) = &mut self.leader else {
            return;
        };
        if leader.queued.is_empty() {
            return;
        }
        if leader.appender.pending() >= self.in_flight {
            // The next turns wait for room.
            self.counts.writes_waited += 1;
            return;
        }
        let g = group(std::mem::take(&mut leader.queued));
        self.counts.dead_letters += g.dead_letters.len() as u64;
        if !g.items.is_empty() {
            leader.appender.send(g.items);
        }
        if let Some(now) = leader.announcer.push(g.queued) {
            self.announce_group(now);
        }
    }

    /// Every entry now known stored, in order: applied to the leader's
    /// copy, its turns announced. Fenced out (a deposed leader's piece
    /// landed where this one's should be): the leadership ends.
    fn drain_stored(&mut self) {
        loop {
            let Some(leader) = &mut self.leader else {
                return;
            };
            match leader.appender.next_stored(
                &self.log,
                &mut self.counts.read_back,
                &mut self.counts.strays_skipped,
            ) {
                Next::Stored(seq, entry) => {
                    if entry.items.len() > 1 {
                        self.counts.grouped_entries += 1;
                    }
                    self.servers[leader.server]
                        .journal
                        .apply_stored(seq, &entry);
                    leader.since_snapshot += 1;
                    for q in leader.announcer.stored() {
                        self.announce_group(q);
                    }
                    self.take_turns();
                }
                Next::Waiting => break,
                Next::Fenced => {
                    // It stops leading and stands by; another election.
                    self.counts.leaders_fenced += 1;
                    self.leader = None;
                    self.election_at = self.now + 200 + self.rng.below(1_500);
                    return;
                }
            }
        }
        self.check_cancels();
    }

    /// Announces a stored group commit: its results written to the
    /// results bucket (lookups only), then each turn's leases, revokes,
    /// replies and fires; the driver hears which leases went out.
    fn announce_group(&mut self, q: Queued) {
        for (seq, _) in &q.results {
            self.results.insert(*seq, self.now);
        }
        for released in q.turns {
            let leader = self.leader.as_mut().expect("leads");
            for seq in &released.terminal {
                leader.pending.remove(seq);
            }
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
                        // Announced means stored: the log holds the
                        // attempt, which a successor reads back.
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
        }
    }

    /// Whether the log holds attempt `attempt` of task `seq`.
    fn journaled(&self, seq: u64, attempt: u32) -> bool {
        self.records
            .get(&seq)
            .is_some_and(|r| r.attempts.iter().any(|a| a.attempt == attempt))
    }

    /// Every `snapshot_every` entries the leader stores a snapshot of its
    /// copy (only stored entries are applied to it), pruned below the
    /// submit stream's first message, then truncates the log below it.
    /// With the mutation on, the snapshot holds the entries under way too
    /// (written before they are stored): the simulation must catch it.
    fn snapshot(&mut self) {
        let Some(leader) = &mut self.leader else {
            return;
        };
        if leader.since_snapshot < self.snapshot_every {
            return;
        }
        leader.since_snapshot = 0;
        let journal = &self.servers[leader.server].journal;
        journal.prune_below(self.submit_first);
        let (at, bytes) = if self.snapshot_unstored {
            let mut state = journal.with_reader(|r| r.state.clone());
            for (seq, entry) in leader.appender.unstored() {
                state.apply(seq, &entry);
            }
            (state.applied(), state.snapshot())
        } else {
            journal.snapshot()
        };
        self.counts.snapshots += 1;
        self.log.store_snapshot(at, bytes);
        self.sync_truth();
        self.log.purge_below(at + 1);
    }

    /// The purger: the submit stream loses everything below the driver's
    /// floor and below every result still being stored.
    fn purge_submissions(&mut self) {
        let Some(leader) = &mut self.leader else {
            return;
        };
        let floor = leader.driver.purge_floor();
        let bound = leader.pending.first().map_or(floor, |p| (*p).min(floor));
        if bound > self.submit_first {
            self.submit_first = bound;
            self.counts.submit_purges += 1;
        }
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
        let of = |s: u64| self.records.get(&s).map(|r| r.state);
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

    /// The leader dies. Of its pieces on their way a prefix reaches the
    /// log (pipelined on one connection: in order); none of its turns is
    /// announced. Its process restarts and loads the log again.
    pub(super) fn crash(&mut self) {
        if let Some(mut leader) = self.leader.take() {
            let flying = leader.appender.flying();
            let reach = self.rng.below(flying as u64 + 1);
            for i in 0..flying as u64 {
                let stored = leader.appender.arrive(&mut self.log, i >= reach, false);
                if stored == Some(true) {
                    self.counts.landed_at_crash += 1;
                } else {
                    self.counts.lost_at_crash += 1;
                }
            }
            self.sync_truth();
            self.servers[leader.server].loaded = false;
        }
        self.election_at = self.now + 200 + self.rng.below(1_500);
    }

    /// The leader stops (SIGSTOP) for longer than the election timeout:
    /// a follower takes over once the leader's last renewal is
    /// `ELECTION_TIMEOUT` old. Of its pieces on their way some reach the
    /// log before it stops; the others wait in the network, to arrive
    /// before or after the successor's takeover entry.
    pub(super) fn pause(&mut self) {
        let Some(mut leader) = self.leader.take() else {
            return;
        };
        let resume_at = self.now + ELECTION_TIMEOUT + 100 + self.rng.below(1_500);
        self.election_at = leader.renewed + ELECTION_TIMEOUT;
        let flying = leader.appender.flying() as u64;
        for _ in 0..self.rng.below(flying + 1) {
            leader.appender.arrive(&mut self.log, false, true);
        }
        self.sync_truth();
        self.paused = Some((leader, resume_at));
    }

    /// The paused leader resumes. A successor leads by now: its pieces
    /// still on their way are refused (the log moved), and the resumed
    /// process runs what its runner runs — the right to act judged at the
    /// top of the turn, then its timers and whatever requests reached it —
    /// and must emit nothing. It stands by again.
    pub(super) fn resume(&mut self) {
        let Some((mut old, _)) = self.paused.take() else {
            return;
        };
        assert!(self.next_epoch - 1 > old.epoch, "no successor took over");
        while let Some(stored) = old.appender.arrive(&mut self.log, false, true) {
            if stored {
                // Lined up behind a piece of its own that was lost: lands,
                // and every reader drops it (an older epoch).
                self.counts.deposed_pieces_landed += 1;
            } else {
                self.counts.deposed_appends_refused += 1;
            }
        }
        self.sync_truth();
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
            self.next_epoch - 1,
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
