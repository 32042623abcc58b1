//! The simulation's workers: the real worker rules ([`Rules`]) decide which
//! lease to obey, which revoke to act on, what a registration stops and
//! the epoch; this file adds the timing (runs, renewals, reports — one at
//! a time or several in one request) and the network from the leader.

use tokio::sync::oneshot::error::TryRecvError;

use super::*;
use crate::core::Labels;
use crate::server::Waiting;
use crate::wire::{
    Ack, AttemptReport, AttemptReportsReply, AttemptResult, Heartbeat, HeartbeatReply, Lease,
    Register, RegisterReply, Renew, RenewReply, Revoke, RunningAttempt, PROTOCOL_VERSION,
};
use crate::worker::rules::{lease_lost, renew_every, renew_retry, LeaseVerdict, RevokeVerdict};

/// A request a worker waits on.
enum Wait {
    Register(Waiting<RegisterReply>),
    Heartbeat(Waiting<HeartbeatReply>),
    /// The run's key and lease epoch.
    Report((TaskId, u32), u64, Waiting<Ack>),
    /// Several runs' reports in one request (key, lease epoch each).
    Reports(Vec<((TaskId, u32), u64)>, Waiting<AttemptReportsReply>),
    /// A renewal of the run's lease (key, lease epoch).
    Renew((TaskId, u32), u64, Waiting<RenewReply>),
}

impl Wait {
    /// Whether it waits on the report of `key` under `epoch`.
    fn reports(&self, key: (TaskId, u32), epoch: u64) -> bool {
        match self {
            Wait::Report(k, e, _) => *k == key && *e == epoch,
            Wait::Reports(runs, _) => runs.contains(&(key, epoch)),
            _ => false,
        }
    }
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

pub(super) struct Worker {
    pub(super) id: String,
    slots: u32,
    registered: bool,
    labels: Labels,
    /// The real worker's rules (`crate::worker::rules`): which lease to
    /// obey, which revoke to act on, what a registration stops, the epoch.
    rules: Rules,
    /// The timing of what runs (the rules say what runs).
    runs: BTreeMap<(TaskId, u32), Run>,
    waiting: Vec<Wait>,
    pub(super) next_heartbeat: u64,
}

impl Worker {
    /// The run of `key` under `epoch` ended: gone if it is the current one.
    fn end_run(&mut self, key: (TaskId, u32), epoch: u64) {
        if self.rules.ended(key, epoch) {
            self.runs.remove(&key);
        }
    }

    /// The leader's answer to a report: taken, or refused for good — the
    /// run ended (as the real attempt tells its loop, with its lease
    /// epoch); `UNAVAILABLE`: reported again.
    fn reported(&mut self, key: (TaskId, u32), epoch: u64, refused: Option<&WireError>) {
        if refused.map_or(true, |e| e.code != crate::core::ErrorCode::UNAVAILABLE) {
            self.end_run(key, epoch);
        }
    }
}

use crate::wire::WireError;

/// Something on its way from the leader to a worker.
pub(super) struct Message {
    pub(super) at: u64,
    pub(super) worker: String,
    pub(super) body: Body,
}

#[derive(Clone)]
pub(super) enum Body {
    Lease(Lease),
    Revoke(Revoke),
}

impl World {
    /// A new worker with `labels`.
    pub(super) fn add_worker(&mut self, labels: Labels) {
        self.next_worker += 1;
        let slots = 1 + self.rng.below(3) as u32;
        self.workers.push(Worker {
            id: format!("w{}", self.next_worker),
            slots,
            registered: false,
            labels,
            rules: Rules::default(),
            runs: BTreeMap::new(),
            waiting: Vec::new(),
            next_heartbeat: self.now,
        });
    }

    pub(super) fn step_workers(&mut self) {
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
                self.counts.restarts += 1;
                true
            }
            _ => return,
        };
        assert!(
            !self.succeeded.contains(&lease.task_id.0),
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
        let budget = self.submissions[(lease.task_id.0 - 1) as usize].budget();
        assert!(
            lease.attempt <= budget,
            "attempt {} of task {} leased beyond its max_attempts {budget}",
            lease.attempt,
            lease.task_id
        );
        self.started.insert(key, worker.id.clone());
        self.counts.runs += 1;
        if lease.attempt > 1 {
            self.counts.reruns += 1;
        }
        // Some attempts outlive the records' max age, up to 3 times over
        // (and any attempt timeout); once faults stop, attempts are short.
        let done_at = if self.faults && self.rng.chance(20) {
            self.now + 40_000 + self.rng.below(60_000)
        } else if self.faults && self.rng.chance(100) {
            self.now + 500 + self.rng.below(1_500)
        } else {
            self.now + 20 + self.rng.below(200)
        };
        let fails = self.faults && self.rng.chance(50);
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

    /// The answers that came back to worker `w`.
    fn answers(&mut self, w: usize) -> bool {
        let now = self.now;
        let waiting = std::mem::take(&mut self.workers[w].waiting);
        let mut still = Vec::new();
        let mut register_again = false;
        let worker = &mut self.workers[w];
        for wait in waiting {
            match wait {
                Wait::Register(mut rx) => match rx.try_recv() {
                    Ok(Ok(reply)) => {
                        for k in worker.rules.registered(reply.epoch, &reply.adopted) {
                            worker.runs.remove(&k);
                        }
                        worker.registered = true;
                    }
                    Ok(Err(_)) | Err(TryRecvError::Closed) => {}
                    Err(TryRecvError::Empty) => still.push(Wait::Register(rx)),
                },
                Wait::Heartbeat(mut rx) => match rx.try_recv() {
                    Ok(Ok(reply)) if reply.registered => {
                        worker.rules.heard_epoch(reply.epoch);
                    }
                    Ok(Ok(_)) => register_again = true,
                    Ok(Err(_)) | Err(TryRecvError::Closed) => {}
                    Err(TryRecvError::Empty) => still.push(Wait::Heartbeat(rx)),
                },
                Wait::Renew(key, epoch, mut rx) => match rx.try_recv() {
                    Ok(Ok(reply)) => {
                        if let Some(run) = worker.runs.get_mut(&key) {
                            run.next_renew = now + renew_every(reply.ttl).0;
                        }
                    }
                    // The lease is gone: the attempt stops, reporting
                    // nothing (the leader counted it lost).
                    Ok(Err(e)) if lease_lost(&e.code) => {
                        let current = worker
                            .runs
                            .get(&key)
                            .is_some_and(|r| r.epoch == epoch && !r.reporting);
                        if current {
                            self.counts.renewals_lost += 1;
                            worker.end_run(key, epoch);
                        }
                    }
                    // Unanswered or refused otherwise: asked again soon.
                    Ok(Err(_)) | Err(TryRecvError::Closed) => {
                        if let Some(run) = worker.runs.get_mut(&key) {
                            if run.epoch == epoch {
                                run.next_renew = now + renew_retry(Millis(LEASE_TTL)).0;
                            }
                        }
                    }
                    Err(TryRecvError::Empty) => still.push(Wait::Renew(key, epoch, rx)),
                },
                Wait::Report(key, epoch, mut rx) => match rx.try_recv() {
                    Ok(Ok(_)) => worker.reported(key, epoch, None),
                    Ok(Err(e)) => worker.reported(key, epoch, Some(&e)),
                    Err(TryRecvError::Closed) => {}
                    Err(TryRecvError::Empty) => still.push(Wait::Report(key, epoch, rx)),
                },
                Wait::Reports(runs, mut rx) => match rx.try_recv() {
                    Ok(Ok(reply)) => {
                        for (i, (key, epoch)) in runs.into_iter().enumerate() {
                            let refused = reply.refused.get(i).and_then(|r| r.as_ref());
                            worker.reported(key, epoch, refused);
                        }
                    }
                    Ok(Err(e)) => {
                        for (key, epoch) in runs {
                            worker.reported(key, epoch, Some(&e));
                        }
                    }
                    Err(TryRecvError::Closed) => {}
                    Err(TryRecvError::Empty) => still.push(Wait::Reports(runs, rx)),
                },
            }
        }
        self.workers[w].waiting = still;
        register_again
    }

    fn step_worker(&mut self, w: usize) {
        let now = self.now;
        let register_again = self.answers(w);
        let worker = &self.workers[w];
        let (id, slots, labels) = (worker.id.clone(), worker.slots, worker.labels.clone());
        let running: Vec<RunningAttempt> = worker.rules.running();
        if !worker.registered || register_again {
            if worker
                .waiting
                .iter()
                .any(|x| matches!(x, Wait::Register(_)))
            {
                return;
            }
            let register = Register {
                lease_batches: false,
                v: 1,
                worker_id: id.clone(),
                pool: Self::pool(),
                labels,
                slots,
                xkey: None,
                instance: Some(id.clone()),
                running,
            };
            if let Some(rx) = self.request(|to| Input::Register(register, Default::default(), to)) {
                self.workers[w].waiting.push(Wait::Register(rx));
            }
            return;
        }
        if now >= worker.next_heartbeat {
            self.workers[w].next_heartbeat = now + HEARTBEAT_EVERY;
            let heartbeat = Heartbeat {
                v: 1,
                worker_id: id.clone(),
                free_slots: 0,
                running: running.clone(),
            };
            if let Some(rx) = self.request(|to| Input::Heartbeat(heartbeat, to)) {
                self.workers[w].waiting.push(Wait::Heartbeat(rx));
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
            if let Some(rx) = self.request(|to| Input::Renew(body, to)) {
                self.counts.renewals += 1;
                self.workers[w].waiting.push(Wait::Renew(key, epoch, rx));
            }
        }
        self.report(w, &id);
    }

    /// Finished runs report (again, until answered): one request each, or
    /// at times all of them in one.
    fn report(&mut self, w: usize, id: &str) {
        let now = self.now;
        let due: Vec<((TaskId, u32), u64, bool, bool)> = self.workers[w]
            .runs
            .iter()
            .filter(|(_, r)| r.done_at <= now)
            .map(|(k, r)| (*k, r.epoch, r.reporting && r.done_at == 0, r.fails))
            .collect();
        let mut reports = Vec::new();
        for (key, epoch, cancelled, fails) in due {
            let worker = &mut self.workers[w];
            if worker.waiting.iter().any(|x| x.reports(key, epoch)) {
                continue;
            }
            let run = worker.runs.get_mut(&key).expect("due");
            if !run.reporting && fails && !cancelled {
                self.counts.failures += 1;
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
                    output: bytes::Bytes::from("ok"),
                }
            };
            reports.push(AttemptReport {
                v: PROTOCOL_VERSION,
                worker_id: id.to_string(),
                task_id: key.0,
                attempt: key.1,
                epoch,
                result,
            });
        }
        if reports.len() > 1 && self.rng.chance(500) {
            self.counts.batched_reports += 1;
            let runs = reports
                .iter()
                .map(|r| ((r.task_id, r.attempt), r.epoch))
                .collect();
            if let Some(rx) = self.request(|to| Input::Outcomes(reports, to)) {
                self.workers[w].waiting.push(Wait::Reports(runs, rx));
            }
            return;
        }
        for report in reports {
            let (key, epoch) = ((report.task_id, report.attempt), report.epoch);
            if let Some(rx) = self.request(|to| Input::Outcome(report, to)) {
                self.workers[w].waiting.push(Wait::Report(key, epoch, rx));
            }
        }
    }
}
