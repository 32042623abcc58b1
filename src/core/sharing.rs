//! Sharing a fleet (SPEC §9): what fairness keys, quotas, concurrency
//! limits and preemption change in a task's way to a slot.
//!
//! `impl Core`, split from `mod.rs` by concern; the data lives in
//! `fair.rs`, the fair order in `queue.rs`, the choice of a waiter in
//! `placement.rs`.
//!
//! * **Fair share**: a task joining the queues (or starting at once) gets
//!   the start tag `max(pool virtual time, its key's finish)` and moves its
//!   key's finish on by `1/weight` (`start_tag`); a start moves the pool's
//!   virtual time up to its tag. The lowest tag goes first (`queue.rs`),
//!   so busy keys share slots by weight and an idle key earns no burst.
//! * **Eligibility**: a task may take a slot of group G only while its key
//!   holds fewer slots than each of its quotas whose labels G carries
//!   (`quota_allows`), and while fewer than its `concurrency_limit` tasks
//!   of its concurrency key run (`conc_allows_start`). A key at a quota is
//!   passed over in the queues (it blocks nobody); a task whose
//!   concurrency key is full is *parked* outside the queues, and leaves
//!   the park (best priority, then submission order, among those whose
//!   limit has room) when a task of its key stops running or waiting.
//!   A task enters the queues only while the key's running plus queued
//!   tasks are fewer than its limit, so the key's tasks already let in
//!   keep their turn.
//! * **Concurrency policies** at admission (`admit`): `replace_waiting`,
//!   `cancel_running`, `skip`.
//! * **Preemption** (`maybe_preempt`): see its docs for the victim and the
//!   anti-thrashing rule.

use std::cmp::Reverse;

use super::fair::{vt_step, Keys, Quota, NO_KEY};
use super::groups::{is_subset, FreeKey};
use super::{
    Action, ConcurrencyPolicy, Core, EndReason, FairPart, GroupId, Labels, Phase, Preemption,
    RevokeReason, TaskSpec, TaskState, WaitReason, PLAIN_FAIR,
};

/// A task preempted this many times is not chosen again (anti-thrashing):
/// however many higher-priority tasks arrive, it loses at most this many
/// attempts' work, and then runs to its end.
pub const MAX_PREEMPTIONS: u32 = 3;

impl Core {
    // ---- keys -------------------------------------------------------------

    /// The fairness key whose virtual time task `t` uses: its own, or its
    /// pool's unnamed one.
    pub(super) fn fair_of(&self, t: u32) -> u32 {
        match self.fair_key_of(t) {
            NO_KEY => self.keys.unnamed_of(self.tasks[t as usize].pool),
            k => k,
        }
    }

    /// The fair-share part of task `t`.
    pub(super) fn fair_part(&self, t: u32) -> FairPart {
        self.fair_parts
            .get(t as usize)
            .copied()
            .unwrap_or(PLAIN_FAIR)
    }

    /// The named fairness key of task `t`, or `NO_KEY`.
    pub(super) fn fair_key_of(&self, t: u32) -> u32 {
        self.fair_part(t).fair
    }

    /// Sets the fair-share part of slab index `t` (a new record's): the
    /// table is made as long as the slab the first time a task needs it,
    /// and from then on every record written gets its part.
    pub(super) fn set_fair_part(&mut self, t: u32, part: FairPart) {
        if part == PLAIN_FAIR && self.fair_parts.is_empty() {
            return;
        }
        if self.fair_parts.len() < self.tasks.len() {
            self.fair_parts.resize(self.tasks.len(), PLAIN_FAIR);
        }
        self.fair_parts[t as usize] = part;
    }

    /// Interns a spec's keys in pool `p`, counting the task as a user:
    /// `(fairness key, concurrency key)`, `NO_KEY` where it names none.
    pub(super) fn intern_keys(&mut self, p: u32, spec: &TaskSpec) -> (u32, u32) {
        self.keys.unnamed(p);
        let fair = match &spec.fairness_key {
            Some(name) => {
                let known = self.keys.find_fair(p, name).is_some();
                let k = self.keys.fair_key(p, name);
                if !known {
                    self.configure_key(k);
                }
                self.keys.fair[k as usize].live += 1;
                k
            }
            None => NO_KEY,
        };
        let conc = match &spec.concurrency_key {
            Some(name) => {
                let c = self.keys.conc_key(p, name);
                self.keys.conc[c as usize].live += 1;
                c
            }
            None => NO_KEY,
        };
        (fair, conc)
    }

    /// A task no longer uses its keys (it is forgotten).
    pub(super) fn release_keys(&mut self, fair: u32, conc: u32) {
        if fair != NO_KEY {
            self.keys.fair[fair as usize].live -= 1;
            self.keys.forget_fair_if_unused(fair);
        }
        if conc != NO_KEY {
            self.keys.conc[conc as usize].live -= 1;
            self.keys.forget_conc_if_unused(conc);
        }
    }

    /// Gives named key `k` the weight and quotas its pool's config lists.
    fn configure_key(&mut self, k: u32) {
        let key = &self.keys.fair[k as usize];
        let config = &self.groups.pools[key.pool as usize].config;
        let weight = config
            .fairness
            .iter()
            .find(|f| *f.key == *key.name)
            .map_or(0, |f| f.weight);
        let quotas = config
            .quotas
            .iter()
            .filter(|q| *q.key == *key.name)
            .map(|q| Quota {
                labels: q.labels.clone(),
                max_running: q.max_running,
                held: 0,
            })
            .collect();
        let key = &mut self.keys.fair[k as usize];
        key.weight = weight;
        key.quotas = quotas;
    }

    /// Pool `p`'s config changed: weights and quotas of its keys anew, the
    /// slots each quota counts recounted from the running attempts (O(live
    /// tasks), on a rare event), and every free slot offered again.
    pub(super) fn apply_sharing_config(&mut self, p: u32) {
        let pool = &mut self.groups.pools[p as usize];
        pool.has_quotas = !pool.config.quotas.is_empty();
        let keys: Vec<u32> = self
            .keys
            .live_fair()
            .filter(|(_, k)| k.pool == p && !k.name.is_empty())
            .map(|(i, _)| i)
            .collect();
        for &k in &keys {
            self.configure_key(k);
        }
        for t in 0..self.tasks.len() {
            let rec = &self.tasks[t];
            if rec.pool == p && matches!(rec.phase, Phase::Running | Phase::Draining) {
                let (k, g) = (self.fair_key_of(t as u32), rec.group);
                if k != NO_KEY {
                    let labels = &self.groups.groups[g as usize].labels;
                    for q in &mut self.keys.fair[k as usize].quotas {
                        if carries(labels, &q.labels) {
                            q.held += 1;
                        }
                    }
                }
            }
        }
        self.refill.push(p);
    }

    // ---- eligibility ------------------------------------------------------

    /// Whether named key `k` (`NO_KEY`: none) may take a slot of group `g`
    /// under its quotas.
    pub(super) fn quota_allows(&self, k: u32, g: u32) -> bool {
        quota_allows(&self.keys, k, &self.groups.groups[g as usize].labels)
    }

    /// Whether fewer than `t`'s limit of its concurrency key's tasks run.
    pub(super) fn conc_allows_start(&self, t: u32) -> bool {
        let rec = &self.tasks[t as usize];
        match rec.extra.as_deref() {
            Some(x) if x.conc != NO_KEY => self.keys.conc[x.conc as usize].running < x.conc_limit,
            _ => true,
        }
    }

    /// Whether `t` may join the queues: its key's running and queued tasks
    /// are fewer than its limit.
    fn conc_admits(&self, t: u32) -> bool {
        let rec = &self.tasks[t as usize];
        match rec.extra.as_deref() {
            Some(x) if x.conc != NO_KEY => {
                let c = &self.keys.conc[x.conc as usize];
                c.running.saturating_add(c.queued) < x.conc_limit
            }
            _ => true,
        }
    }

    /// Whether `t` may take a slot of `g` now (quota and concurrency).
    pub(super) fn eligible(&self, t: u32, g: u32) -> bool {
        self.quota_allows(self.fair_key_of(t), g) && self.conc_allows_start(t)
    }

    /// The best free group for `t` (rule 2) that its quotas allow.
    pub(super) fn best_free_group_for(&self, t: u32) -> Option<u32> {
        let rec = &self.tasks[t as usize];
        let k = self.fair_key_of(t);
        if k == NO_KEY || self.keys.fair[k as usize].quotas.is_empty() {
            return self.best_free_group(t);
        }
        self.groups.reqsets[rec.reqset as usize]
            .free_groups
            .iter()
            .map(FreeKey::group)
            .find(|&g| self.quota_allows(k, g))
    }

    /// Why a waiting task waits, when §9 is the reason: `(reason, key)`.
    pub(super) fn sharing_wait(&self, t: u32) -> Option<(WaitReason, String)> {
        let rec = &self.tasks[t as usize];
        if rec.phase == Phase::Parked {
            let c = rec.conc_key();
            return Some((
                WaitReason::Concurrency,
                self.keys.conc[c as usize].name.to_string(),
            ));
        }
        let k = self.fair_key_of(t);
        if k == NO_KEY {
            return None;
        }
        let key = &self.keys.fair[k as usize];
        let set = &self.groups.reqsets[rec.reqset as usize];
        let blocked = key.quotas.iter().any(|q| {
            q.held >= q.max_running
                && set.groups.iter().any(|&g| {
                    let group = &self.groups.groups[g as usize];
                    group.capacity > 0 && carries(&group.labels, &q.labels)
                })
        });
        blocked.then(|| (WaitReason::Quota, key.name.to_string()))
    }

    // ---- the queues -------------------------------------------------------

    /// The start tag of `t`, which joins the queues or starts at once: a
    /// named key's task keeps the tag it got first (a retry waits again
    /// in its place); otherwise `max(pool virtual time, key's finish)`,
    /// and the key's finish moves on by `1/weight`. A task of the unnamed
    /// key waiting again is not charged again (its queue places it between
    /// its neighbours).
    pub(super) fn start_tag(&mut self, t: u32) -> u64 {
        let k = self.fair_of(t);
        let part = self.fair_part(t);
        let rec = &self.tasks[t as usize];
        let vt = self.groups.pools[rec.pool as usize].vt;
        let named = part.fair != NO_KEY;
        if named && part.tag != super::NONE {
            return part.tag;
        }
        if !named && rec.attempt > 0 {
            return vt;
        }
        let key = &mut self.keys.fair[k as usize];
        let weight = if key.weight > 0 {
            key.weight
        } else {
            part.weight
        };
        let tag = vt.max(key.finish);
        key.finish = tag.saturating_add(vt_step(weight));
        if named {
            self.fair_parts[t as usize].tag = tag;
        }
        tag
    }

    /// A task with start tag `tag` starts: the pool's virtual time follows.
    pub(super) fn tag_started(&mut self, p: u32, tag: u64) {
        let pool = &mut self.groups.pools[p as usize];
        pool.vt = pool.vt.max(tag);
    }

    /// `t` joined a queue: its concurrency key counts it.
    pub(super) fn joined_queue(&mut self, t: u32) {
        let rec = &self.tasks[t as usize];
        let (seq, c) = (rec.seq, rec.conc_key());
        if c != NO_KEY {
            let conc = &mut self.keys.conc[c as usize];
            conc.queued += 1;
            conc.queued_tasks.insert((seq, t));
        }
    }

    /// `t` left the queues, to start or not (then a parked task of its
    /// concurrency key may take its turn, in `settle`).
    pub(super) fn left_queue(&mut self, t: u32, to_start: bool) {
        let rec = &self.tasks[t as usize];
        let (seq, c) = (rec.seq, rec.conc_key());
        if c != NO_KEY {
            let conc = &mut self.keys.conc[c as usize];
            conc.queued -= 1;
            conc.queued_tasks.remove(&(seq, t));
            if !to_start {
                self.conc_dirty.push(c);
            }
        }
    }

    /// Where a parked `t` is kept: its pool, concurrency key and limit,
    /// and its order there (submission, priority).
    fn park_place(&self, t: u32) -> (u32, u32, u32, u64, i32) {
        let rec = &self.tasks[t as usize];
        let x = rec
            .extra
            .as_deref()
            .expect("a parked task has a concurrency key");
        (rec.pool, x.conc, x.conc_limit, rec.seq, rec.priority)
    }

    /// Parks `t` (out of every queue already) until its concurrency key
    /// has room.
    pub(super) fn park(&mut self, t: u32) {
        self.tasks[t as usize].phase = Phase::Parked;
        let (p, c, limit, seq, priority) = self.park_place(t);
        self.groups.pools[p as usize].waiting += 1;
        self.keys.conc[c as usize]
            .parked
            .entry(limit)
            .or_default()
            .insert((Reverse(priority), seq, t));
    }

    /// Takes a parked task out of the park.
    pub(super) fn unpark_one(&mut self, t: u32) {
        let (p, c, limit, seq, priority) = self.park_place(t);
        let conc = &mut self.keys.conc[c as usize];
        if let Some(set) = conc.parked.get_mut(&limit) {
            set.remove(&(Reverse(priority), seq, t));
            if set.is_empty() {
                conc.parked.remove(&limit);
            }
        }
        self.groups.pools[p as usize].waiting -= 1;
    }

    /// Lets parked tasks of concurrency key `c` into the queues (or onto
    /// free slots) while their limits have room.
    pub(super) fn unpark(&mut self, c: u32, out: &mut Vec<Action>) {
        while let Some((_, (_, _, t))) = self.keys.conc[c as usize].next_to_unpark() {
            self.unpark_one(t);
            self.enqueue_or_start(t, out);
        }
    }

    /// Places a task that may run now, queues it, or parks it: a task
    /// whose concurrency key is full waits outside the queues; one that
    /// finds no free slot its quotas allow waits in its queue, and may
    /// preempt.
    pub(super) fn enqueue_or_start(&mut self, t: u32, out: &mut Vec<Action>) {
        if !self.conc_admits(t) {
            self.park(t);
            return;
        }
        if self.pool_allows(t, 0) {
            if let Some(g) = self.best_free_group_for(t) {
                let tag = self.start_tag(t);
                self.tag_started(self.tasks[t as usize].pool, tag);
                self.start(t, g, false, out);
                return;
            }
        }
        self.enqueue(t);
        self.maybe_preempt(t, out);
    }

    // ---- slots ------------------------------------------------------------

    /// An attempt of `t` takes a slot of `g` (`rec.group` is set): its keys
    /// count it.
    pub(super) fn slot_taken(&mut self, t: u32, g: u32) {
        let k = self.fair_key_of(t);
        let stamp = self.keys.next_start;
        self.keys.next_start += 1;
        let rec = &mut self.tasks[t as usize];
        let (p, priority) = (rec.pool, rec.priority);
        let c = rec.conc_key();
        let preemption = self.groups.pools[p as usize].config.preemption == Preemption::Priority;
        if c != NO_KEY || preemption {
            let backoff = self.groups.pools[p as usize].config.backoff;
            rec.extra_mut(backoff).started = stamp;
        }
        let victim = preemption
            && rec
                .extra
                .as_deref()
                .is_some_and(|x| x.preemptible && x.preempted < MAX_PREEMPTIONS);
        let pool = &mut self.groups.pools[p as usize];
        if victim {
            pool.preemptible.insert((priority, Reverse(stamp), t));
        }
        // Only named keys count their slots (quotas name keys); a pool
        // without keys pays nothing here.
        if k != NO_KEY {
            let key = &mut self.keys.fair[k as usize];
            key.running += 1;
            if !key.quotas.is_empty() {
                let labels = &self.groups.groups[g as usize].labels;
                for q in &mut key.quotas {
                    if carries(labels, &q.labels) {
                        q.held += 1;
                    }
                }
            }
        }
        if c != NO_KEY {
            let conc = &mut self.keys.conc[c as usize];
            conc.running += 1;
            conc.running_tasks.insert((stamp, t));
        }
    }

    /// The attempt of `t` gives its slot up (before the task finishes or
    /// waits again): its keys stop counting it; a quota or a concurrency
    /// limit with room again lets waiters in (in `settle`).
    pub(super) fn slot_left(&mut self, t: u32) {
        let k = self.fair_key_of(t);
        let rec = &self.tasks[t as usize];
        let (p, g, priority, c) = (rec.pool, rec.group, rec.priority, rec.conc_key());
        let started = rec.extra.as_deref().map_or(0, |x| x.started);
        let pool = &mut self.groups.pools[p as usize];
        if !pool.preemptible.is_empty() {
            pool.preemptible.remove(&(priority, Reverse(started), t));
        }
        if k != NO_KEY {
            let key = &mut self.keys.fair[k as usize];
            key.running -= 1;
            if !key.quotas.is_empty() {
                let labels = &self.groups.groups[g as usize].labels;
                for q in &mut key.quotas {
                    if carries(labels, &q.labels) {
                        q.held -= 1;
                    }
                }
                // Slots this key's quota kept from its waiters may be free.
                self.refill.push(p);
            }
        }
        if c != NO_KEY {
            let conc = &mut self.keys.conc[c as usize];
            conc.running -= 1;
            conc.running_tasks.remove(&(started, t));
            self.conc_dirty.push(c);
        }
    }

    // ---- admission --------------------------------------------------------

    /// A submission (not a recovery): its concurrency policy first, then
    /// the task's way to a slot.
    pub(super) fn admit(&mut self, spec: TaskSpec, out: &mut Vec<Action>) {
        let Some(name) = spec.concurrency_key.as_deref() else {
            return self.submit(spec, 0, out);
        };
        let p = self.groups.pool(&spec.pool);
        let c = self.keys.conc_key(p, name);
        let limit = spec.concurrency_limit;
        match spec.concurrency_policy {
            ConcurrencyPolicy::Queue => {}
            ConcurrencyPolicy::ReplaceWaiting => {
                let conc = &self.keys.conc[c as usize];
                let mut older: Vec<u32> = conc.queued_tasks.iter().map(|&(_, t)| t).collect();
                older.extend(conc.parked.values().flatten().map(|&(_, _, t)| t));
                for t in older {
                    self.cancel_with(t, Some(EndReason::Replaced), out);
                }
            }
            ConcurrencyPolicy::CancelRunning => {
                let running: Vec<u32> = self.keys.conc[c as usize]
                    .running_tasks
                    .iter()
                    .map(|&(_, t)| t)
                    .filter(|&t| self.tasks[t as usize].phase == Phase::Running)
                    .collect();
                let beyond = running.len().saturating_sub(limit as usize - 1);
                for &t in &running[..beyond] {
                    self.cancel_with(t, Some(EndReason::Concurrency), out);
                }
            }
            ConcurrencyPolicy::Skip => {
                let conc = &self.keys.conc[c as usize];
                if conc.running.saturating_add(conc.queued) >= limit {
                    let t = self.insert(spec, 0);
                    self.finish_with(t, TaskState::Cancelled, Some(EndReason::Concurrency), out);
                    return;
                }
            }
        }
        // The key may have been made for this task alone: the task's own
        // interning finds it, and it is forgotten with its last user.
        self.submit(spec, 0, out);
    }

    // ---- preemption -------------------------------------------------------

    /// `t` was queued with no free slot it may take. In a pool with
    /// `preemption = "priority"`, it preempts one running attempt: of a
    /// preemptible task of strictly lower priority, in a group matching
    /// `t` that `t`'s quotas allow, the lowest priority first, then the
    /// latest started. The attempt is revoked (`Preempted`) and its slot
    /// kept for `t`; `t` preempts nothing more while it waits for it.
    ///
    /// Anti-thrashing: a task preempted [`MAX_PREEMPTIONS`] times is not
    /// chosen again, and only strictly lower priorities are preempted, so
    /// two tasks never take turns preempting each other.
    pub(super) fn maybe_preempt(&mut self, t: u32, out: &mut Vec<Action>) {
        let rec = &self.tasks[t as usize];
        let p = rec.pool;
        let pool = &self.groups.pools[p as usize];
        if pool.config.preemption != Preemption::Priority
            || pool.preemptible.is_empty()
            || rec.extra.as_deref().is_some_and(|x| x.preempting)
            || !pool.reservations.is_empty()
        {
            return;
        }
        let (priority, k) = (rec.priority, self.fair_key_of(t));
        let pairs = &self.groups.reqsets[rec.reqset as usize].pairs;
        let victim = pool
            .preemptible
            .iter()
            .take_while(|&&(vp, _, _)| vp < priority)
            .map(|&(_, _, v)| v)
            .find(|&v| {
                let victim = &self.tasks[v as usize];
                let g = victim.group;
                victim.phase == Phase::Running
                    && victim.revoked.is_none()
                    && is_subset(pairs, &self.groups.group_pairs[g as usize])
                    && self.quota_allows(k, g)
            });
        let Some(v) = victim else {
            return;
        };
        let seq = self.tasks[t as usize].seq;
        let backoff = self.groups.pools[p as usize].config.backoff;
        self.tasks[t as usize].extra_mut(backoff).preempting = true;
        let victim = &mut self.tasks[v as usize];
        let stamp = victim.extra.as_deref().map_or(0, |x| x.started);
        self.groups.pools[p as usize]
            .preemptible
            .remove(&(victim.priority, Reverse(stamp), v));
        victim.revoked = Some(RevokeReason::Preempted);
        victim.extra_mut(backoff).kept_for = Some((t, seq));
        out.push(Action::Revoke {
            task: victim.id,
            attempt: victim.attempt,
            group: GroupId(victim.group),
            reason: RevokeReason::Preempted,
        });
    }

    /// A preempted attempt of `t` ended (its slot still busy): the task
    /// waits again in its place, and the slot goes to the task it was
    /// kept for if that one still waits and may take it.
    pub(super) fn preempted_attempt_ended(&mut self, t: u32, out: &mut Vec<Action>) {
        let backoff = self.groups.pools[self.tasks[t as usize].pool as usize]
            .config
            .backoff;
        let rec = &mut self.tasks[t as usize];
        let g = rec.group;
        let x = rec.extra_mut(backoff);
        x.preempted += 1;
        let kept_for = x.kept_for.take();
        out.push(Action::Preempted {
            task: rec.id,
            attempt: rec.attempt,
        });
        rec.phase = Phase::Backoff; // between a slot and a queue
        rec.group = u32::MAX;
        rec.revoked = None;
        self.enqueue_or_start(t, out);
        if let Some((k, seq)) = kept_for {
            let keeper = &self.tasks[k as usize];
            if keeper.seq == seq && keeper.phase == Phase::Queued && self.eligible(k, g) {
                self.take_waiter(k);
                self.start(k, g, true, out);
                return;
            }
            if keeper.seq == seq {
                if let Some(x) = self.tasks[k as usize].extra.as_deref_mut() {
                    x.preempting = false;
                }
            }
        }
        self.release_slot(g, out);
    }
}

/// Whether named key `k` (`NO_KEY`: none) may take a slot of a group
/// carrying `labels` under its quotas.
pub(super) fn quota_allows(keys: &Keys, k: u32, labels: &Labels) -> bool {
    k == NO_KEY
        || keys.fair[k as usize]
            .quotas
            .iter()
            .all(|q| q.held < q.max_running || !carries(labels, &q.labels))
}

/// Whether a group's `labels` carry every pair of `required`.
pub(super) fn carries(labels: &Labels, required: &Labels) -> bool {
    required.iter().all(|(k, v)| labels.get(k) == Some(v))
}
