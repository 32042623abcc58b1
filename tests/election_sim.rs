//! Deterministic simulation of leader election and fencing (issue 8):
//! several servers run the real rules (`election::Standby` for followers,
//! `election::may_act` for leaders) against an in-memory leader subject
//! with compare-and-set writes, on a simulated clock, with random message
//! delays and random pauses (a `SIGSTOP` of any length, past the election
//! timeout too). After every step it checks:
//!
//! * **one actor**: at no instant do two servers both believe they may act
//!   as leader (lease, reply, write);
//! * **fencing**: a durable write (a result) is stored only if its writer
//!   owns the subject when it lands, and every stored write comes from the
//!   latest epoch at that moment;
//! * **epochs grow**: each takeover's epoch is larger than every earlier
//!   one;
//! * **liveness**: after the faults stop, some server leads and acts
//!   within a few timeouts.
//!
//! A failing seed prints itself; `CRONOQ_SIM_SEED=n` replays exactly that
//! run, `CRONOQ_SIM_SEEDS=n` runs more seeds (default 2,000).

use std::collections::BinaryHeap;

use cronoq::core::Millis;
use cronoq::server::election::{may_act, LeaderRecord, Observed, Standby};

const TIMEOUT: u64 = 750;
const RENEW_EVERY: u64 = TIMEOUT / 4;
const POLL: u64 = 50;

/// A small deterministic RNG (splitmix64).
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
}

/// The leader subject (and the stream's sequence counter).
#[derive(Default)]
struct Subject {
    next_seq: u64,
    last_seq: u64,
    record: Option<LeaderRecord>,
    max_epoch: u64,
}

#[derive(Clone, Debug)]
enum Role {
    Follower(Standby),
    /// epoch, the fence (last own sequence), when the last stored write
    /// was sent.
    Leader {
        epoch: u64,
        fence: u64,
        sent: u64,
    },
}

struct Server {
    id: String,
    role: Role,
    paused_until: u64,
    /// A write in flight (one at a time, as in the real loops).
    busy: bool,
}

#[derive(Debug, PartialEq, Eq)]
enum Kind {
    /// Poll (followers) or renew (leaders) or write a result (leaders).
    Tick(usize),
    /// A takeover or renewal lands on the subject: (server, expected,
    /// takeover?, sent at).
    Land(usize, u64, bool, u64),
    /// Its answer reaches the server: (server, stored seq or None, sent
    /// at, takeover?).
    Ack(usize, Option<u64>, u64, bool),
    /// A fenced result write lands: (server, expected fence, epoch).
    Result(usize, u64, u64),
    /// A follower's read reaches it: (server, what it saw).
    Seen(usize, u64, Option<LeaderRecord>),
}

#[derive(Debug, PartialEq, Eq)]
struct Event {
    at: u64,
    order: u64,
    kind: Kind,
}

impl Ord for Event {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (other.at, other.order).cmp(&(self.at, self.order))
    }
}
impl PartialOrd for Event {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

struct Sim {
    rng: Rng,
    now: u64,
    order: u64,
    events: BinaryHeap<Event>,
    subject: Subject,
    servers: Vec<Server>,
    faults_until: u64,
    stored_results: u64,
}

impl Sim {
    fn new(seed: u64, servers: usize) -> Sim {
        let mut sim = Sim {
            rng: Rng(seed),
            now: 0,
            order: 0,
            events: BinaryHeap::new(),
            subject: Subject::default(),
            servers: (0..servers)
                .map(|i| Server {
                    id: format!("s{i}"),
                    role: Role::Follower(Standby::default()),
                    paused_until: 0,
                    busy: false,
                })
                .collect(),
            faults_until: 20 * TIMEOUT,
            stored_results: 0,
        };
        for i in 0..servers {
            let at = sim.rng.below(POLL);
            sim.push(at, Kind::Tick(i));
        }
        sim
    }

    fn push(&mut self, at: u64, kind: Kind) {
        self.order += 1;
        self.events.push(Event {
            at,
            order: self.order,
            kind,
        });
    }

    /// A network delay: usually small, sometimes long while faults run.
    fn delay(&mut self) -> u64 {
        if self.now < self.faults_until && self.rng.below(20) == 0 {
            self.rng.below(2 * TIMEOUT)
        } else {
            self.rng.below(30)
        }
    }

    /// Whether server `i` may act now (a leader within its right to act).
    fn acts(&self, i: usize) -> bool {
        let s = &self.servers[i];
        match s.role {
            Role::Leader { sent, .. } => {
                self.now >= s.paused_until
                    && may_act(Millis(self.now), Millis(sent), Millis(TIMEOUT))
            }
            Role::Follower(_) => false,
        }
    }

    fn step(&mut self) -> Result<bool, String> {
        let Some(event) = self.events.pop() else {
            return Ok(false);
        };
        self.now = event.at;
        // A paused server handles nothing until it resumes.
        let target = match &event.kind {
            Kind::Tick(i) | Kind::Ack(i, ..) | Kind::Seen(i, ..) => Some(*i),
            _ => None,
        };
        if let Some(i) = target {
            if self.servers[i].paused_until > self.now {
                let at = self.servers[i].paused_until;
                self.push(at, event.kind);
                return Ok(true);
            }
        }
        match event.kind {
            Kind::Tick(i) => self.tick(i),
            Kind::Land(i, expected, takeover, sent) => {
                let stored = if self.subject.last_seq == expected {
                    self.subject.next_seq += 1;
                    let seq = self.subject.next_seq;
                    let epoch = match (&self.servers[i].role, takeover) {
                        (_, true) => seq,
                        (Role::Leader { epoch, .. }, false) => *epoch,
                        (Role::Follower(_), false) => seq,
                    };
                    if takeover {
                        if epoch <= self.subject.max_epoch {
                            return Err(format!("epoch {epoch} after {}", self.subject.max_epoch));
                        }
                        self.subject.max_epoch = epoch;
                    }
                    self.subject.last_seq = seq;
                    self.subject.record = Some(LeaderRecord {
                        id: self.servers[i].id.clone(),
                        http: String::new(),
                        epoch: if takeover { 0 } else { epoch },
                        resigned: false,
                        instance: self.servers[i].id.clone(),
                        renewal: 0,
                        seal: None,
                    });
                    Some(seq)
                } else {
                    None
                };
                let at = self.now + self.delay();
                self.push(at, Kind::Ack(i, stored, sent, takeover));
            }
            Kind::Ack(i, stored, sent, takeover) => {
                self.servers[i].busy = false;
                match (stored, takeover) {
                    (Some(seq), true) => {
                        self.servers[i].role = Role::Leader {
                            epoch: seq,
                            fence: seq,
                            sent,
                        };
                    }
                    (Some(seq), false) => {
                        if let Role::Leader { fence, sent: s, .. } = &mut self.servers[i].role {
                            *fence = seq;
                            *s = sent;
                        }
                    }
                    (None, true) => {
                        if let Role::Follower(standby) = &mut self.servers[i].role {
                            standby.lost_race();
                        }
                    }
                    // A renewal refused: someone took over; step down.
                    (None, false) => self.servers[i].role = Role::Follower(Standby::default()),
                }
            }
            Kind::Result(i, expected, epoch) => {
                if self.subject.last_seq == expected {
                    let owner = self.subject.record.as_ref().map(|r| r.id.clone());
                    if owner.as_deref() != Some(self.servers[i].id.as_str()) {
                        return Err(format!(
                            "result of {} stored while {owner:?} owns the subject",
                            self.servers[i].id
                        ));
                    }
                    if epoch != self.subject.max_epoch {
                        return Err(format!(
                            "result of epoch {epoch} stored under epoch {}",
                            self.subject.max_epoch
                        ));
                    }
                    self.stored_results += 1;
                }
            }
            Kind::Seen(i, seq, record) => {
                let now = Millis(self.now);
                let id = self.servers[i].id.clone();
                if let Role::Follower(standby) = &mut self.servers[i].role {
                    let observed = Observed { seq, record };
                    if let Some(expected) = standby.consider(now, Millis(TIMEOUT), &observed, &id) {
                        if !self.servers[i].busy {
                            self.servers[i].busy = true;
                            let at = self.now + self.delay();
                            let sent = self.now;
                            self.push(at, Kind::Land(i, expected, true, sent));
                        }
                    }
                }
            }
        }
        // One actor at a time.
        let acting: Vec<usize> = (0..self.servers.len()).filter(|&i| self.acts(i)).collect();
        if acting.len() > 1 {
            return Err(format!(
                "at {} ms servers {acting:?} both act as leader",
                self.now
            ));
        }
        Ok(true)
    }

    fn tick(&mut self, i: usize) {
        // Faults: pause this server for a while (past the timeout too).
        if self.now < self.faults_until && self.rng.below(40) == 0 {
            let pause = self.rng.below(3 * TIMEOUT);
            self.servers[i].paused_until = self.now + pause;
        }
        let next = match self.servers[i].role.clone() {
            Role::Follower(_) => {
                // The read sees the subject now; the answer arrives later.
                let (seq, record) = (self.subject.last_seq, self.subject.record.clone());
                let at = self.now + self.delay();
                self.push(at, Kind::Seen(i, seq, record));
                POLL
            }
            Role::Leader { epoch, fence, .. } => {
                if !self.acts(i) {
                    // Past its right to act: the driver stops; the
                    // election loop steps down.
                    self.servers[i].role = Role::Follower(Standby::default());
                    POLL
                } else {
                    if !self.servers[i].busy {
                        self.servers[i].busy = true;
                        let at = self.now + self.delay();
                        let sent = self.now;
                        self.push(at, Kind::Land(i, fence, false, sent));
                    }
                    // A result write, fenced on the subject.
                    let at = self.now + self.delay();
                    self.push(at, Kind::Result(i, fence, epoch));
                    RENEW_EVERY
                }
            }
        };
        let at = self.now + next;
        self.push(at, Kind::Tick(i));
    }
}

fn run(seed: u64) -> Result<(), String> {
    let servers = 2 + (seed % 3) as usize;
    let mut sim = Sim::new(seed, servers);
    let end = sim.faults_until + 10 * TIMEOUT;
    let mut led_after_faults = false;
    while sim.now < end {
        if !sim.step()? {
            break;
        }
        if sim.now > sim.faults_until + 4 * TIMEOUT && (0..sim.servers.len()).any(|i| sim.acts(i)) {
            led_after_faults = true;
        }
    }
    if !led_after_faults {
        return Err("no server led after the faults stopped".into());
    }
    if sim.stored_results == 0 {
        return Err("no result was ever stored".into());
    }
    Ok(())
}

#[test]
fn election_keeps_one_actor_and_fences_deposed_leaders() {
    if let Ok(seed) = std::env::var("CRONOQ_SIM_SEED") {
        let seed: u64 = seed.parse().expect("CRONOQ_SIM_SEED is a number");
        if let Err(e) = run(seed) {
            panic!("seed {seed}: {e}");
        }
        return;
    }
    let seeds: u64 = std::env::var("CRONOQ_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2_000);
    for seed in 0..seeds {
        if let Err(e) = run(seed) {
            panic!(
                "seed {seed}: {e} (replay: CRONOQ_SIM_SEED={seed} cargo test --test election_sim)"
            );
        }
    }
}
