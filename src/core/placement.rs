//! Which group a task takes and which waiter a freed slot goes to
//! (SPEC §2 rules 1, 2, 5 and 7).
//!
//! Two questions, both answered without scanning the pool:
//!
//! * **a task arrives**: the first entry of its reqset's `free_groups` is the
//!   best matching group with a free slot (rule 2) — O(log groups);
//! * **a slot frees in group G**: compare the heads of the queues of the
//!   reqsets G satisfies (at most `2^labels(G)` of them) by urgency, need,
//!   fair share, then submission order (rule 5 and SPEC §9), after ready
//!   fixed-start tasks, which come first because the pool held a slot back
//!   for them (rule 7). Each head is O(log) to read whatever the number of
//!   fairness keys (`queue.rs`); in a pool with quotas, a key at its quota
//!   for G is passed over inside each queue; a winner whose concurrency
//!   key is full is parked and the choice made again.
//!
//! Reservations are per pool: a non-reserved task may take a slot only while
//! the pool's free slots exceed its due reservations, unless it declared an
//! estimated run time that ends before the earliest due `start_at`
//! (backfill).

use super::groups::{is_subset, FreeKey, GroupId};
use super::queue::{Head, QueueKey};
use super::sharing::quota_allows;
use super::Core;

/// Rule 5 (b): a task that requires labels sorts before one that requires
/// none.
fn need(labels_required: usize) -> u8 {
    u8::from(labels_required == 0)
}

/// The waiter a free slot goes to.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Waiter {
    pub task: u32,
    /// When it is the head of a queue: that reqset and its queue key, which
    /// let it leave the queue without waiting for its record to load.
    pub head: Option<(u32, QueueKey)>,
    /// Its start tag when it is the head of a queue (fair share).
    pub tag: u64,
}

impl Core {
    /// Whether the pool lets an ordinary (non-reserved) task take a slot,
    /// given `extra` slots about to be freed.
    pub(crate) fn pool_allows(&self, task: u32, extra: u64) -> bool {
        let rec = &self.tasks[task as usize];
        let pool = &self.groups.pools[rec.pool as usize];
        let due = pool.reservations.len() as u64;
        if pool.free + extra > due {
            return true;
        }
        self.can_backfill(task)
    }

    /// A task whose declared run time ends before the earliest due
    /// reservation may use a held slot.
    fn can_backfill(&self, task: u32) -> bool {
        let rec = &self.tasks[task as usize];
        let est_runtime = rec.est_runtime();
        if est_runtime == u64::MAX {
            return false;
        }
        let pool = &self.groups.pools[rec.pool as usize];
        match pool.reservations.first() {
            Some(&(start_at, _, _)) => self.now.0.saturating_add(est_runtime) <= start_at,
            None => true,
        }
    }

    /// The best group with a free slot for this task (rule 2), if any.
    pub(crate) fn best_free_group(&self, task: u32) -> Option<u32> {
        let r = self.tasks[task as usize].reqset;
        self.groups.reqsets[r as usize]
            .free_groups
            .first()
            .map(FreeKey::group)
    }

    /// The waiter that a free slot of group `g` goes to, counting `extra`
    /// slots about to be freed in the pool. Updates bypass counters of
    /// waiters passed over by rule 5 (b).
    pub(crate) fn choose_waiter(&mut self, g: u32, extra: u64) -> Option<Waiter> {
        let group = &self.groups.groups[g as usize];
        let pool = &self.groups.pools[group.pool as usize];

        // Rule 7: a fixed-start task past its start_at takes the slot held for it.
        let group_pairs = &self.groups.group_pairs[g as usize];
        for &(_, _, task) in &pool.ready_fixed {
            let r = self.tasks[task as usize].reqset;
            if is_subset(&self.groups.reqsets[r as usize].pairs, group_pairs)
                && self.eligible(task, g)
            {
                return Some(Waiter {
                    task,
                    head: None,
                    tag: 0,
                });
            }
        }

        let due = pool.reservations.len() as u64;
        if pool.free + extra <= due {
            // Every free slot is held: only a backfill candidate may run.
            let candidates: Vec<u32> = pool.backfill.iter().map(|&(_, t)| t).collect();
            return candidates
                .into_iter()
                .find(|&task| {
                    let r = self.tasks[task as usize].reqset;
                    is_subset(&self.groups.reqsets[r as usize].pairs, group_pairs)
                        && self.can_backfill(task)
                        && self.eligible(task, g)
                })
                .map(|task| Waiter {
                    task,
                    head: None,
                    tag: 0,
                });
        }

        // Rule 5: heads of every queue this group can serve.
        let max_bypass = pool.config.max_bypass;
        let quotas = pool.has_quotas;
        loop {
            let mut best: Option<(bool, Head, u8, u32)> = None;
            let mut unlabeled_head: Option<Head> = None;
            for &r in &self.groups.groups[g as usize].reqsets {
                let keys = &self.keys;
                let labels = &self.groups.groups[g as usize].labels;
                let set = &self.groups.reqsets[r as usize];
                let need = need(set.pairs.len());
                let head = if quotas {
                    set.queue.first_where(&|k| quota_allows(keys, k, labels))
                } else {
                    set.queue.head()
                };
                let Some(head) = head else {
                    continue;
                };
                let task = head.1;
                // Only the unlabeled head is ever passed over (below), so only
                // its record can show starvation: skip the others' records.
                let starved = need == 1 && self.tasks[task as usize].bypass > max_bypass;
                if need == 1 {
                    unlabeled_head = Some(head);
                }
                let rank = |(not_starved, (key, _, tag), need, _): &(bool, Head, u8, u32)| {
                    (
                        *not_starved,
                        key.urgency,
                        key.priority,
                        *need,
                        *tag,
                        key.seq,
                    )
                };
                let candidate = (!starved, head, need, r);
                if best.as_ref().map_or(true, |b| rank(&candidate) < rank(b)) {
                    best = Some(candidate);
                }
            }
            let (_, (winner_key, winner, winner_tag), winner_need, winner_set) = best?;
            let chosen = Waiter {
                task: winner,
                head: Some((winner_set, winner_key)),
                tag: winner_tag,
            };
            if !self.conc_allows_start(winner) {
                // Its concurrency key filled up while it waited: it waits
                // outside the queues, blocking nobody; choose again.
                self.take_chosen(chosen);
                self.park(winner);
                let c = self.tasks[winner as usize].conc_key();
                self.conc_dirty.push(c);
                continue;
            }
            // Rule 5 no-starvation: count how often the unlabeled head lost
            // only because of need.
            if let Some((key, task, tag)) = unlabeled_head {
                if task != winner
                    && winner_need == 0
                    && key.same_urgency(&winner_key)
                    && (tag, key.seq) < (winner_tag, winner_key.seq)
                {
                    self.tasks[task as usize].bypass += 1;
                }
            }
            return Some(chosen);
        }
    }

    /// The labels of a group, for the shell (`ctx.group`, leases).
    pub fn group_labels(&self, group: GroupId) -> &super::Labels {
        &self.groups.groups[group.0 as usize].labels
    }

    /// The pool of a group.
    pub fn group_pool(&self, group: GroupId) -> &super::PoolName {
        let p = self.groups.groups[group.0 as usize].pool;
        &self.groups.pools[p as usize].name
    }
}
