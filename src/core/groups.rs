//! Pools, label groups and required-label sets, with the indexes that keep
//! placement sub-linear.
//!
//! A **group** is the workers of a pool that carry one exact label set; the
//! core keeps its capacity and busy slots. A **required-label set** ("reqset")
//! is a distinct label set that some task required; it owns the queue of
//! tasks that wait for it. The two are joined by a bipartite index built
//! once, when a group or reqset first appears:
//!
//! * `Group::reqsets`: the reqsets the group satisfies (subsets of its
//!   labels, so at most `2^labels` of them), used when a slot frees;
//! * `ReqSet::free_groups`: the matching groups that have a free slot,
//!   ordered by preference (fewest labels, most free slots, oldest group),
//!   used when a task arrives.
//!
//! Every change of a group's free slots goes through [`Groups::set_busy`] or
//! [`Groups::set_capacity`], which keep both indexes and the pool totals
//! right.

use std::cmp::Reverse;
use std::collections::BTreeSet;

use rustc_hash::FxHashMap;
use smallvec::SmallVec;

use super::model::{Labels, PoolConfig, PoolName};
use super::queue::WaitQueue;

/// A group's handle, unique across pools of one core.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct GroupId(pub u32);

/// Preference order among free groups (SPEC §2 rule 2): fewest labels, then
/// most free slots, then the group that appeared first.
pub(crate) type FreeKey = (u32, Reverse<u32>, u32);

/// What a freed slot reads of its group, in one cache line: a group with
/// up to three labels lists its reqsets inline. Its interned label pairs,
/// read only when indexes are built and for fixed-start or backfill tasks,
/// live apart in [`Groups::group_pairs`].
#[derive(Debug)]
#[repr(align(64))]
pub(crate) struct Group {
    pub capacity: u32,
    pub busy: u32,
    pub pool: u32,
    pub labels: Labels,
    /// Reqsets (global indices) this group satisfies.
    pub reqsets: SmallVec<[u32; 8]>,
}

const _: () = assert!(std::mem::size_of::<Group>() == 64);

impl Group {
    pub(crate) fn free(&self) -> u32 {
        self.capacity.saturating_sub(self.busy)
    }

    fn free_key(&self, id: u32) -> FreeKey {
        (self.labels.len() as u32, Reverse(self.free()), id)
    }
}

#[derive(Debug)]
pub(crate) struct ReqSet {
    pub labels: Labels,
    pub pairs: Vec<u32>,
    /// Matching groups (global ids), in creation order.
    pub groups: Vec<u32>,
    /// Matching groups with a free slot, best first.
    pub free_groups: BTreeSet<FreeKey>,
    pub queue: WaitQueue,
}

#[derive(Debug)]
pub(crate) struct Pool {
    pub name: PoolName,
    pub config: PoolConfig,
    pub groups: Vec<u32>,
    pub group_by_labels: FxHashMap<Labels, u32>,
    pub reqsets: Vec<u32>,
    pub reqset_by_labels: FxHashMap<Labels, u32>,
    pub capacity: u64,
    pub busy: u64,
    pub free: u64,
    /// Tasks whose fixed start is due or past and that hold a slot back:
    /// `(start_at, seq, task)`.
    pub reservations: BTreeSet<(u64, u64, u32)>,
    /// Fixed-start tasks past `start_at` waiting for a matching slot:
    /// `(start_at, seq, task)`.
    pub ready_fixed: BTreeSet<(u64, u64, u32)>,
    /// Queued tasks that declared an estimated run time: `(seq, task)`.
    pub backfill: BTreeSet<(u64, u32)>,
    /// Tasks whose fixed start is in the future (including due ones).
    pub scheduled: u64,
    /// Queued tasks (including ready fixed-start ones).
    pub waiting: u64,
    /// Finished tasks that ended after their deadline.
    pub deadline_missed: u64,
}

/// Every pool, group and reqset of one core, plus label interning.
#[derive(Debug, Default)]
pub(crate) struct Groups {
    pub pools: Vec<Pool>,
    pub pool_by_name: FxHashMap<PoolName, u32>,
    pub groups: Vec<Group>,
    /// Interned label pairs of each group, sorted: for fast subset tests.
    pub group_pairs: Vec<Box<[u32]>>,
    pub reqsets: Vec<ReqSet>,
    pair_ids: FxHashMap<(String, String), u32>,
}

/// `needle ⊆ hay` for sorted slices.
pub(crate) fn is_subset(needle: &[u32], hay: &[u32]) -> bool {
    let mut h = hay.iter();
    'outer: for n in needle {
        for x in h.by_ref() {
            if x == n {
                continue 'outer;
            }
            if x > n {
                return false;
            }
        }
        return false;
    }
    true
}

impl Groups {
    fn intern(&mut self, labels: &Labels) -> Vec<u32> {
        let mut pairs: Vec<u32> = labels
            .iter()
            .map(|(k, v)| {
                let next = self.pair_ids.len() as u32;
                *self
                    .pair_ids
                    .entry((k.to_string(), v.to_string()))
                    .or_insert(next)
            })
            .collect();
        pairs.sort_unstable();
        pairs
    }

    /// The pool's index, creating it with default settings if new. A new
    /// pool starts with the empty reqset, so every group indexes it.
    pub(crate) fn pool(&mut self, name: &PoolName) -> u32 {
        if let Some(&p) = self.pool_by_name.get(name) {
            return p;
        }
        let p = self.pools.len() as u32;
        self.pools.push(Pool {
            name: name.clone(),
            config: PoolConfig::default(),
            groups: Vec::new(),
            group_by_labels: FxHashMap::default(),
            reqsets: Vec::new(),
            reqset_by_labels: FxHashMap::default(),
            capacity: 0,
            busy: 0,
            free: 0,
            reservations: BTreeSet::new(),
            ready_fixed: BTreeSet::new(),
            backfill: BTreeSet::new(),
            scheduled: 0,
            waiting: 0,
            deadline_missed: 0,
        });
        self.pool_by_name.insert(name.clone(), p);
        self.reqset(p, &Labels::new());
        p
    }

    /// The reqset for `labels` in pool `p`, creating and indexing it if new
    /// (O(groups of the pool), once per distinct label set).
    pub(crate) fn reqset(&mut self, p: u32, labels: &Labels) -> u32 {
        if let Some(&r) = self.pools[p as usize].reqset_by_labels.get(labels) {
            return r;
        }
        let pairs = self.intern(labels);
        let r = self.reqsets.len() as u32;
        let mut set = ReqSet {
            labels: labels.clone(),
            pairs,
            groups: Vec::new(),
            free_groups: BTreeSet::new(),
            queue: WaitQueue::default(),
        };
        for &g in &self.pools[p as usize].groups {
            let group = &mut self.groups[g as usize];
            if is_subset(&set.pairs, &self.group_pairs[g as usize]) {
                set.groups.push(g);
                group.reqsets.push(r);
                if group.free() > 0 {
                    set.free_groups.insert(group.free_key(g));
                }
            }
        }
        self.reqsets.push(set);
        let pool = &mut self.pools[p as usize];
        pool.reqsets.push(r);
        pool.reqset_by_labels.insert(labels.clone(), r);
        r
    }

    /// The group for `labels` in pool `p`, creating and indexing it (with no
    /// capacity) if new (O(reqsets of the pool), once per label set).
    pub(crate) fn group(&mut self, p: u32, labels: &Labels) -> u32 {
        if let Some(&g) = self.pools[p as usize].group_by_labels.get(labels) {
            return g;
        }
        let pairs = self.intern(labels);
        let g = self.groups.len() as u32;
        let mut group = Group {
            pool: p,
            labels: labels.clone(),
            capacity: 0,
            busy: 0,
            reqsets: SmallVec::new(),
        };
        for &r in &self.pools[p as usize].reqsets {
            let set = &mut self.reqsets[r as usize];
            if is_subset(&set.pairs, &pairs) {
                set.groups.push(g);
                group.reqsets.push(r);
            }
        }
        self.groups.push(group);
        self.group_pairs.push(pairs.into_boxed_slice());
        let pool = &mut self.pools[p as usize];
        pool.groups.push(g);
        pool.group_by_labels.insert(labels.clone(), g);
        g
    }

    /// Changes a group's busy count, keeping indexes and totals right.
    pub(crate) fn set_busy(&mut self, g: u32, busy: u32) {
        let old = self.groups[g as usize].busy;
        self.update(g, |group| group.busy = busy);
        let pool = &mut self.pools[self.groups[g as usize].pool as usize];
        pool.busy = pool.busy + u64::from(busy) - u64::from(old);
    }

    /// Changes a group's capacity, keeping indexes and totals right.
    pub(crate) fn set_capacity(&mut self, g: u32, capacity: u32) {
        let old = self.groups[g as usize].capacity;
        self.update(g, |group| group.capacity = capacity);
        let pool = &mut self.pools[self.groups[g as usize].pool as usize];
        pool.capacity = pool.capacity + u64::from(capacity) - u64::from(old);
    }

    fn update(&mut self, g: u32, change: impl FnOnce(&mut Group)) {
        let group = &mut self.groups[g as usize];
        let old_free = group.free();
        let old_key = group.free_key(g);
        change(group);
        let new_free = group.free();
        if new_free == old_free {
            return;
        }
        let new_key = group.free_key(g);
        for &r in &group.reqsets {
            let set = &mut self.reqsets[r as usize];
            if old_free > 0 {
                set.free_groups.remove(&old_key);
            }
            if new_free > 0 {
                set.free_groups.insert(new_key);
            }
        }
        let pool = &mut self.pools[group.pool as usize];
        pool.free = pool.free + u64::from(new_free) - u64::from(old_free);
    }

    /// Whether some group with capacity satisfies the reqset.
    pub(crate) fn reqset_has_capacity(&self, r: u32) -> bool {
        self.reqsets[r as usize]
            .groups
            .iter()
            .any(|&g| self.groups[g as usize].capacity > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subset_of_sorted_slices() {
        assert!(is_subset(&[], &[1, 2]));
        assert!(is_subset(&[2], &[1, 2, 3]));
        assert!(is_subset(&[1, 3], &[1, 2, 3]));
        assert!(!is_subset(&[4], &[1, 2, 3]));
        assert!(!is_subset(&[0], &[1, 2, 3]));
        assert!(!is_subset(&[1], &[]));
    }
}
