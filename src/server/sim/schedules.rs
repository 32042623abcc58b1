//! Schedules in the simulation (issue 23): in half the seeds a client
//! creates a schedule firing every second (its creation retried until a
//! leader answers it), and the world carries out the leader's fires as
//! the committer does — published to the submit stream under the tick's
//! key as `Nats-Msg-Id`, the stream answering a key it saw within its
//! duplicate window with the first sequence, the answer travelling back
//! to the leader (lost if it dies first). The real driver does the rest:
//! its book, the records it stores, what a successor reads back.
//!
//! The clock jumps now and then (a few seconds at once: an NTP step, a
//! stalled VM), and half the schedule seeds have a catch-up window of 2 s
//! (the others 1 h), so ticks also pass missed.
//!
//! In half the schedule seeds an **adversary** (issue 34) publishes, before
//! every tick, a task of its own under the id a client can compute for
//! the tick (`schedule:<name>:<tick ms>`) — what once suppressed or
//! replaced the tick. The world publishes fires with the real encoding
//! ([`fires::fire_submission`]: the id carries a MAC under the storage
//! key) and, when the stream answers a duplicate, reads back the stored
//! message and takes it only if the real check ([`fires::is_own_fire`])
//! says it is the tick's fire, as the committer does.
//!
//! Checked at the end: **every tick fired at most once** — no tick has two
//! submissions of its own (a second publish of a key past the stream's
//! window is a duplicate, which the driver must discard: the end check of
//! every submission holds it to that), none fired off the cadence — and
//! **none lost**: each tick from the first after the schedule's creation
//! to the last the final leader decided either fired or is counted missed
//! in the final record; with the 1 h window, every one of them fired.

use async_nats::HeaderMap;
use bytes::Bytes;

use super::*;
use crate::schedule::FireKind;
use crate::server::driver::{ScheduleOp, ScheduleReply};
use crate::server::fires;
use crate::server::seal::Seal;
use crate::server::Waiting;
use crate::wire::Subjects;

/// The schedule's name and interval.
pub(super) const NAME: &str = "beat";
const EVERY: u64 = 1_000;
/// How long the stream remembers a `Nats-Msg-Id` (120 s in `process.rs`;
/// here shorter than some elections, so both sides of it are taken).
const DEDUPE_WINDOW: u64 = 1_000;

/// What the world knows of the schedule.
#[derive(Default)]
pub(super) struct SimSchedule {
    /// This seed has one.
    pub(super) planned: bool,
    /// Its creation was answered (by this instant: the reply's `created_at`).
    created_at: Option<u64>,
    /// A creation on its way.
    creating: Option<Waiting<ScheduleReply>>,
    /// The stream's duplicate window: key → (sequence, stored at).
    msg_ids: BTreeMap<String, (u64, u64)>,
    /// A pause asked for at the end (faults off): no more fires.
    pub(super) pausing: bool,
    /// Its catch-up window is short (2 s): clock jumps make missed ticks.
    pub(super) short_window: bool,
    /// An adversary claims each tick's predictable id first.
    adversary: bool,
    /// The ticks it claimed.
    claimed: BTreeSet<u64>,
    /// The messages stored under an id, by sequence: subject, headers,
    /// body, stored at (what a duplicate answer is checked against).
    stored: BTreeMap<u64, (String, HeaderMap, Bytes, u64)>,
    /// The servers' storage key.
    seal: Seal,
}

impl SimSchedule {
    /// A seed's schedule: `planned` or not.
    pub(super) fn new(planned: bool, short_window: bool, adversary: bool) -> SimSchedule {
        SimSchedule {
            planned,
            short_window,
            adversary,
            seal: Seal::from_secret("the simulation's storage key, 32+ characters").expect("long"),
            ..SimSchedule::default()
        }
    }
}

impl World {
    /// Creates the schedule once a leader answers; pauses it at the end.
    pub(super) fn schedule_step(&mut self) {
        if !self.sched.planned || self.leader.is_none() {
            return;
        }
        if self.sched.pausing {
            if self.sched.created_at.is_some() {
                let leader = self.leader.as_mut().expect("leads");
                let (to, _) = leader.replies.open::<ScheduleReply>();
                let op = ScheduleOp::Pause(NAME.into(), true);
                leader
                    .driver
                    .handle(Millis(self.now), Input::Schedule(op, to));
            }
            return;
        }
        if self.sched.created_at.is_some() {
            return;
        }
        if let Some(waiting) = &mut self.sched.creating {
            match waiting.try_recv() {
                Ok(Ok(ScheduleReply::Info(info))) => {
                    self.sched.created_at = Some(info.created_at.0);
                    self.sched.creating = None;
                }
                // Created by an earlier try whose answer was lost.
                Ok(Err(e)) if e.code == crate::core::ErrorCode::ALREADY_EXISTS => {
                    let created = self
                        .truth
                        .state
                        .schedules()
                        .find(|s| s.spec.name == NAME)
                        .cloned();
                    let created = created.expect("it exists: its record is stored");
                    self.sched.created_at = Some(created.created_at.0);
                    self.sched.creating = None;
                }
                Ok(other) => {
                    assert!(
                        matches!(&other, Err(e) if e.code == crate::core::ErrorCode::UNAVAILABLE),
                        "creating the schedule: {other:?}"
                    );
                    self.sched.creating = None;
                }
                Err(tokio::sync::oneshot::error::TryRecvError::Empty) => {}
                // Its leader died: ask again.
                Err(_) => self.sched.creating = None,
            }
            return;
        }
        let window = if self.sched.short_window { "2s" } else { "1h" };
        let spec = serde_json::from_value(serde_json::json!({
            "name": NAME, "every": format!("{EVERY}ms"), "catchup_window": window,
            "task": {"pool": POOL, "payload": "tick"}
        }))
        .expect("a valid schedule");
        let op = ScheduleOp::Create {
            spec: Box::new(spec),
            owner: None,
        };
        self.sched.creating = self.request(|to| Input::Schedule(op, to));
    }

    /// The adversary's part: before each tick, a plain task of its own
    /// under the tick's predictable id, stored by the stream (and run by
    /// the leader as the ordinary task it is).
    pub(super) fn adversary_step(&mut self) {
        if !self.sched.adversary || self.sched.created_at.is_none() || self.sched.pausing {
            return;
        }
        let next = (self.now / EVERY + 1) * EVERY;
        if !self.sched.claimed.insert(next) {
            return;
        }
        let key = format!("schedule:{NAME}:{next}");
        let task = Task::new("forged").pool(POOL).idempotency_key(key.clone());
        let (subject, headers, body) =
            crate::wire::submission(&Subjects::default(), &task).expect("a plain task encodes");
        self.store_under_id(key, task, None, (subject, headers, body));
        self.counts.ticks_claimed += 1;
    }

    /// The stream stores a message under `Nats-Msg-Id` `key`: a submission
    /// (its task as the leader decodes it), the raw message kept for a
    /// later duplicate's check. Its sequence.
    fn store_under_id(
        &mut self,
        key: String,
        task: Task,
        duplicate_of: Option<u64>,
        (subject, headers, body): (String, HeaderMap, Bytes),
    ) -> u64 {
        self.submissions.push(Submission {
            task,
            duplicate_of,
            cancel_asked: false,
            cancel_acked: false,
            waits: false,
        });
        let seq = self.submissions.len() as u64;
        self.sched
            .stored
            .insert(seq, (subject, headers, body, self.now));
        self.sched.msg_ids.insert(key, (seq, self.now));
        seq
    }

    /// The committer's part: publishes a fire (the real encoding) under
    /// its id; a duplicate answer is taken only for a stored fire of the
    /// same tick (the real check); the stream's answer goes back to the
    /// leader like a request (lost with it).
    pub(super) fn publish_fire(&mut self, name: String, tick: Millis, kind: FireKind, task: Task) {
        let now = Millis(self.now);
        let subjects = Subjects::default();
        let (subject, headers, body) = fires::fire_submission(
            &subjects,
            &self.sched.seal,
            &task,
            (&name, tick),
            task.owner.as_deref(),
            now,
        )
        .expect("a fire encodes");
        let key = headers
            .get("Nats-Msg-Id")
            .expect("a fire has an id")
            .as_str()
            .to_string();
        let result = match self.sched.msg_ids.get(&key) {
            Some((seq, at)) if self.now < at + DEDUPE_WINDOW => {
                let (s, h, b, stored_at) = &self.sched.stored[seq];
                let own = fires::is_own_fire(
                    &self.sched.seal,
                    &subject,
                    (&name, tick),
                    s,
                    Some(h),
                    b,
                    Millis(*stored_at),
                );
                assert!(own, "tick {} answered with a message not its fire", tick.0);
                self.counts.fires_deduplicated += 1;
                Ok(*seq)
            }
            earlier => {
                let duplicate_of = earlier.map(|(seq, _)| *seq);
                if duplicate_of.is_some() {
                    self.counts.fires_past_window += 1;
                }
                // The task as the leader decodes it from the stream.
                let (_, decoded) = crate::wire::decode_submission(
                    &subjects,
                    &subject,
                    Some(&headers),
                    body.clone(),
                    std::time::UNIX_EPOCH,
                );
                let mut fired = decoded.expect("a fire decodes");
                fired.owner = task.owner.clone();
                Ok(self.store_under_id(key, fired, duplicate_of, (subject, headers, body)))
            }
        };
        self.counts.fires += 1;
        let Some(leader) = &mut self.leader else {
            return;
        };
        let at = self.now + self.rng.below(60);
        let input = Input::FirePublished {
            name,
            tick,
            kind,
            result,
        };
        leader.send_later(at, input);
    }

    /// Every tick from the first after creation to the last fired has one
    /// submission of its own; none fired off the cadence.
    pub(super) fn check_schedule(&mut self) {
        let Some(created_at) = self.sched.created_at else {
            return;
        };
        let mut ticks: BTreeMap<u64, u64> = BTreeMap::new();
        for (i, s) in self.submissions.iter().enumerate() {
            let Some((name, tick)) = &s.task.schedule else {
                continue;
            };
            assert_eq!(name, NAME);
            if s.duplicate_of.is_none() {
                let seq = i as u64 + 1;
                if let Some(first) = ticks.insert(tick.0, seq) {
                    panic!("tick {} fired as tasks {first} and {seq}", tick.0);
                }
            }
        }
        let first = (created_at / EVERY + 1) * EVERY;
        for tick in ticks.keys() {
            assert!(
                *tick >= first && (tick - first) % EVERY == 0,
                "tick {tick} is off the cadence"
            );
        }
        let leader = self.leader.as_ref().expect("a leader at the end");
        let entry = leader
            .driver
            .schedule_entry(NAME)
            .expect("the final leader holds the schedule");
        // Every run the history names is a fire of its own tick: never
        // the adversary's task that held the tick's predictable id.
        for r in entry.history() {
            if let Some(id) = r.task {
                let s = &self.submissions[(id.0 - 1) as usize];
                assert_eq!(
                    s.task.schedule,
                    Some((NAME.to_string(), r.tick)),
                    "tick {} recorded as run by task {id}, not its fire",
                    r.tick.0
                );
            }
        }
        let through = entry.state.decided_through.0;
        if through < first {
            return;
        }
        let decided = (through - first) / EVERY + 1;
        let fired = ticks.keys().filter(|t| **t <= through).count() as u64;
        let missed = entry.counters.missed;
        assert!(
            fired + missed >= decided,
            "ticks lost: {decided} decided through {through}, {fired} fired, {missed} missed"
        );
        if !self.sched.short_window {
            // Only the pause at the end passes ticks unfired.
            let last = *ticks.keys().next_back().unwrap_or(&first);
            let expected: Vec<u64> = (first..=last).step_by(EVERY as usize).collect();
            let fired: Vec<u64> = ticks.keys().copied().collect();
            assert_eq!(fired, expected, "ticks missing");
        }
        if missed > 0 {
            self.counts.missed_tick_seeds += 1;
        }
    }
}
