//! Self-checks of the core's indexes, of SPEC §2 rule 4 as §9 restates it
//! (no *eligible* waiting task beside a free slot of a matching group), and
//! of the counts behind fair shares, quotas and concurrency limits, for
//! tests.
//!
//! [`Core::check_invariants`] recomputes every derived number from scratch
//! and compares; it is O(tasks + groups × reqsets) and meant for property
//! tests and simulations, not for production paths.

use std::collections::BTreeSet;

use super::groups::is_subset;
use super::{Core, Phase};

impl Core {
    /// Recomputes every index and total and checks rule 4 (no eligible
    /// waiting task beside a free slot of a matching group, except slots
    /// held for a due reservation). Returns the first violation found.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.check_keys()?;
        let g = &self.groups;
        for (pi, pool) in g.live_pools() {
            let pi = pi as usize;
            let (mut cap, mut busy, mut free) = (0u64, 0u64, 0u64);
            for &gi in &pool.groups {
                let group = &g.groups[gi as usize];
                cap += u64::from(group.capacity);
                busy += u64::from(group.busy);
                free += u64::from(group.free());
                let holders = self
                    .tasks
                    .iter()
                    .filter(|t| {
                        matches!(t.phase, Phase::Running | Phase::Draining) && t.group == gi
                    })
                    .count() as u32;
                if holders != group.busy {
                    return Err(format!(
                        "group {} of pool {}: busy {} but {} attempts hold it",
                        group.labels, pool.name, group.busy, holders
                    ));
                }
                for &ri in &pool.reqsets {
                    let set = &g.reqsets[ri as usize];
                    let matches = is_subset(&set.pairs, &g.group_pairs[gi as usize]);
                    if matches != group.reqsets.contains(&ri) || matches != set.groups.contains(&gi)
                    {
                        return Err(format!(
                            "match index wrong for group {} / reqset {}",
                            group.labels, set.labels
                        ));
                    }
                    let indexed = set.free_groups.iter().any(|k| k.group() == gi);
                    if indexed != (matches && group.free() > 0) {
                        return Err(format!(
                            "free index wrong for group {} / reqset {}",
                            group.labels, set.labels
                        ));
                    }
                }
            }
            if (cap, busy, free) != (pool.capacity, pool.busy, pool.free) {
                return Err(format!(
                    "pool {} totals (capacity, busy, free) = {:?}, recomputed {:?}",
                    pool.name,
                    (pool.capacity, pool.busy, pool.free),
                    (cap, busy, free)
                ));
            }
            let queued: usize = pool
                .reqsets
                .iter()
                .map(|&r| g.reqsets[r as usize].queue.len())
                .sum();
            let parked = self
                .tasks
                .iter()
                .filter(|t| t.pool as usize == pi && t.phase == Phase::Parked)
                .count();
            if (queued + parked) as u64 + pool.ready_fixed.len() as u64 != pool.waiting {
                return Err(format!(
                    "pool {} waiting count {} is wrong",
                    pool.name, pool.waiting
                ));
            }
            let in_phase = |phases: &[Phase]| {
                self.tasks
                    .iter()
                    .filter(|t| t.pool as usize == pi && phases.contains(&t.phase))
                    .count() as u64
            };
            if in_phase(&[Phase::Scheduled, Phase::Reserved]) != pool.scheduled {
                return Err(format!("pool {} scheduled count is wrong", pool.name));
            }
            if in_phase(&[Phase::Reserved, Phase::Ready]) != pool.reservations.len() as u64 {
                return Err(format!("pool {} reservation count is wrong", pool.name));
            }
            // Rule 4.
            let held = pool.free <= pool.reservations.len() as u64;
            for &gi in &pool.groups {
                let group = &g.groups[gi as usize];
                if group.free() == 0 {
                    continue;
                }
                for &(_, _, t) in &pool.ready_fixed {
                    let r = self.tasks[t as usize].reqset;
                    if is_subset(&g.reqsets[r as usize].pairs, &g.group_pairs[gi as usize])
                        && self.eligible(t, gi)
                    {
                        return Err(format!(
                            "fixed-start task {} waits beside a free slot of group {}",
                            self.tasks[t as usize].id, group.labels
                        ));
                    }
                }
                if !held {
                    for &ri in &group.reqsets {
                        let queue = &g.reqsets[ri as usize].queue;
                        if let Some(t) = queue.tasks().find(|&t| self.eligible(t, gi)) {
                            return Err(format!(
                                "task {} waits beside a free slot of group {} in pool {}",
                                self.tasks[t as usize].id, group.labels, pool.name
                            ));
                        }
                    }
                }
                if held {
                    for &(_, t) in &pool.backfill {
                        let r = self.tasks[t as usize].reqset;
                        if is_subset(&g.reqsets[r as usize].pairs, &g.group_pairs[gi as usize])
                            && self.pool_allows(t, 0)
                            && self.eligible(t, gi)
                        {
                            return Err(format!(
                                "backfill task {} waits beside a free slot of group {}",
                                self.tasks[t as usize].id, group.labels
                            ));
                        }
                    }
                }
            }
        }
        for (_, pool) in g.live_pools() {
            let live = self
                .tasks
                .iter()
                .filter(|t| t.phase != Phase::Free && g.pools[t.pool as usize].name == pool.name)
                .count() as u64;
            if live != pool.live {
                return Err(format!(
                    "pool {} live count {} is wrong",
                    pool.name, pool.live
                ));
            }
            if pool.is_idle() {
                return Err(format!("pool {} is idle but not forgotten", pool.name));
            }
            for &gi in &pool.groups {
                let group = &g.groups[gi as usize];
                if group.capacity == 0 && group.busy == 0 {
                    return Err(format!(
                        "idle group {} of pool {} is not forgotten",
                        group.labels, pool.name
                    ));
                }
            }
            for &ri in pool.reqsets.iter().skip(1) {
                let set = &g.reqsets[ri as usize];
                let users = self
                    .tasks
                    .iter()
                    .filter(|t| t.phase != Phase::Free && t.reqset == ri)
                    .count() as u64;
                // One no task uses is kept only while in the idle list.
                if users != set.live || (users == 0 && !set.kept_idle) {
                    return Err(format!(
                        "reqset {} of pool {}: live {} but {} tasks use it",
                        set.labels, pool.name, set.live, users
                    ));
                }
            }
        }
        let kept = g.reqsets.iter().filter(|s| s.kept_idle).count();
        let listed = g
            .reqsets
            .iter()
            .enumerate()
            .filter(|(r, s)| s.kept_idle && g.idle_reqsets.iter().any(|&(x, _)| x == *r as u32))
            .count();
        let entries: usize = g.idle_reqsets.iter().map(|&(_, n)| n as usize).sum();
        let (max_kept, max_entries) = g.idle_bounds();
        if kept != listed
            || g.idle_reqsets.len() > max_kept
            || entries != g.idle_entries
            || entries > max_entries
        {
            return Err(format!(
                "{kept} reqsets kept idle, {listed} of them listed, {} in the idle list \
                 holding {entries} group entries (counted {})",
                g.idle_reqsets.len(),
                g.idle_entries
            ));
        }
        if g.pool_count() != g.live_pools().count() {
            return Err("pool name index does not match the pools in use".into());
        }
        let live = self.tasks.iter().filter(|t| t.phase != Phase::Free).count();
        if live != self.by_id.len() {
            return Err(format!(
                "{} live records but {} ids",
                live,
                self.by_id.len()
            ));
        }
        self.by_id.check()?;
        for (id, t) in self.by_id.iter() {
            if self.tasks[t as usize].id != id || self.tasks[t as usize].phase == Phase::Free {
                return Err(format!("id index wrong for task {id}"));
            }
        }
        Ok(())
    }

    /// The counts of SPEC §9 against the tasks: per fairness key its
    /// running and live tasks and the slots each quota counts; per
    /// concurrency key its running,
    /// queued and parked tasks, and that a parked task has no room (its
    /// key's running and queued tasks reach its limit). No key lingers
    /// unused.
    fn check_keys(&self) -> Result<(), String> {
        let live = |t: &&super::TaskRec| t.phase != Phase::Free;
        for (k, key) in self.keys.live_fair() {
            let mine: Vec<(u32, &super::TaskRec)> = self
                .tasks
                .iter()
                .enumerate()
                .filter(|(_, t)| live(t) && t.pool == key.pool)
                .map(|(i, t)| (i as u32, t))
                .filter(|&(i, _)| self.fair_of(i) == k)
                .collect();
            let holding: Vec<u32> = mine
                .iter()
                .filter(|(_, t)| matches!(t.phase, Phase::Running | Phase::Draining))
                .map(|(_, t)| t.group)
                .collect();
            let named = !key.name.is_empty();
            let users = mine.len() as u64;
            // Only named keys count (`slot_taken`).
            if named && (holding.len() as u64 != key.running || users != key.live) {
                return Err(format!(
                    "fairness key {:?}: running {} live {}, but {} running, {users} live tasks",
                    key.name,
                    key.running,
                    key.live,
                    holding.len()
                ));
            }
            if named && users == 0 {
                return Err(format!("fairness key {:?} is unused but kept", key.name));
            }
            for q in &key.quotas {
                let held = holding
                    .iter()
                    .filter(|&&g| {
                        super::sharing::carries(&self.groups.groups[g as usize].labels, &q.labels)
                    })
                    .count() as u32;
                if held != q.held {
                    return Err(format!(
                        "quota of {:?} on [{}] counts {} slots, {held} held",
                        key.name, q.labels, q.held
                    ));
                }
            }
        }
        for (c, conc) in self.keys.live_conc() {
            let mine: Vec<(u32, &super::TaskRec)> = self
                .tasks
                .iter()
                .enumerate()
                .filter(|(_, t)| live(t) && t.conc_key() == c)
                .map(|(i, t)| (i as u32, t))
                .collect();
            let in_phase = |phases: &[Phase]| {
                mine.iter()
                    .filter(|(_, t)| phases.contains(&t.phase))
                    .map(|&(i, _)| i)
                    .collect::<BTreeSet<u32>>()
            };
            let running = in_phase(&[Phase::Running, Phase::Draining]);
            let queued = in_phase(&[Phase::Queued]);
            let parked = in_phase(&[Phase::Parked]);
            let listed_queued: BTreeSet<u32> = conc.queued_tasks.iter().map(|&(_, t)| t).collect();
            let listed_running: BTreeSet<u32> =
                conc.running_tasks.iter().map(|&(_, t)| t).collect();
            let listed_parked: BTreeSet<u32> =
                conc.parked.values().flatten().map(|&(_, _, t)| t).collect();
            if running.len() as u32 != conc.running
                || queued.len() as u32 != conc.queued
                || running != listed_running
                || queued != listed_queued
                || parked != listed_parked
                || conc.parked_len() != parked.len()
                || mine.len() as u64 != conc.live
            {
                return Err(format!(
                    "concurrency key {:?}: counts running {} queued {} parked {} live {}, \
                     tasks running {} queued {} parked {} live {}",
                    conc.name,
                    conc.running,
                    conc.queued,
                    conc.parked_len(),
                    conc.live,
                    running.len(),
                    queued.len(),
                    parked.len(),
                    mine.len()
                ));
            }
            if mine.is_empty() && conc.running == 0 {
                return Err(format!(
                    "concurrency key {:?} is unused but kept",
                    conc.name
                ));
            }
            for (&limit, set) in &conc.parked {
                if conc.running + conc.queued < limit {
                    return Err(format!(
                        "concurrency key {:?}: a task of limit {limit} is parked with {} running \
                         and {} queued ({:?})",
                        conc.name,
                        conc.running,
                        conc.queued,
                        set.first()
                    ));
                }
            }
        }
        if self.keys.named_fair_count()
            != self
                .keys
                .live_fair()
                .filter(|(_, k)| !k.name.is_empty())
                .count()
            || self.keys.conc_count() != self.keys.live_conc().count()
        {
            return Err("key name indexes do not match the keys in use".into());
        }
        Ok(())
    }
}
