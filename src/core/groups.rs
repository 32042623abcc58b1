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
//!
//! **Bounded memory.** Nothing here is kept for ever: a group with no
//! capacity and no busy slot, a reqset no live task uses, and a pool that
//! was never configured and has neither groups nor live tasks are
//! *forgotten* ([`Groups::forget_group`], [`Groups::forget_reqset`],
//! [`Groups::forget_pool`]); their slots go on free lists and are reused.
//! Idle reqsets are forgotten lazily: those that became idle last are kept
//! ([`Groups::idle_reqsets`]), up to [`MAX_IDLE_REQSETS`] of them and
//! [`IDLE_INDEX_BUDGET`] group entries in their indexes, so a label set
//! used by one task after another is not rebuilt for each (a rebuild reads
//! every group of the pool: 27 µs per submit with 10,000 groups, when the
//! bound was 256 reqsets and `cargo bench --bench core_placement` cycles
//! through 1,000).
//! Label pairs are interned per pool, so they leave with their pool. A
//! group's place among equally preferred groups is its creation number
//! (`Group::created`), not its (reused) index.

use std::collections::{BTreeSet, VecDeque};

use rustc_hash::FxHashMap;
use smallvec::SmallVec;

use super::model::{Labels, PoolName};
use super::queue::WaitQueue;
use super::spec::PoolConfig;

/// How many reqsets with no live task are kept (per core) before the oldest
/// is forgotten: a label set that comes back (one task at a time, each
/// finishing before the next arrives) finds its reqset and its index
/// entries instead of rebuilding them per task.
pub(crate) const MAX_IDLE_REQSETS: usize = 4_096;

/// The most group entries the indexes of idle reqsets may hold together
/// (each up to 20 bytes: its place in `ReqSet::groups` and in
/// `free_groups`): about 20 MB at most, whatever label sets went by.
pub(crate) const IDLE_INDEX_BUDGET: usize = 1 << 20;

/// A group's handle, unique across pools of one core.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct GroupId(pub u32);

/// Preference order among free groups (SPEC §2 rule 2): fewest labels, then
/// most free slots, then the group that appeared first (its creation
/// number), then its index — packed into one integer, high field first, so
/// that the order is one 128-bit comparison (each attempt moves its group
/// in every reqset the group serves, twice: a tuple of four fields compared
/// field by field was 8 % of the embedded bench).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct FreeKey(u128);

impl FreeKey {
    pub(crate) fn new(labels: u32, free: u32, created: u32, group: u32) -> FreeKey {
        // More free slots first: the complement ascends as `free` descends.
        let fewer_free_first = u32::MAX - free;
        FreeKey(
            u128::from(labels) << 96
                | u128::from(fewer_free_first) << 64
                | u128::from(created) << 32
                | u128::from(group),
        )
    }

    /// The group's index.
    pub(crate) fn group(&self) -> u32 {
        self.0 as u32
    }
}

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
    /// Creation number: the tie-break among equally preferred groups.
    pub created: u32,
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
        FreeKey::new(self.labels.len() as u32, self.free(), self.created, id)
    }

    fn vacant() -> Group {
        Group {
            capacity: 0,
            busy: 0,
            pool: u32::MAX,
            created: 0,
            labels: Labels::new(),
            reqsets: SmallVec::new(),
        }
    }
}

/// The matching groups of a reqset that have a free slot, best first.
///
/// Every busy-slot change of a group moves it in this order, in each
/// reqset it serves: twice per attempt. Most reqsets match a handful of
/// groups, so they are kept in a sorted vector (a binary search and a
/// shift of a few bytes, no allocation, one cache line); past
/// [`FreeGroups::SMALL`] entries, a B-tree keeps each move O(log n).
#[derive(Debug)]
pub(crate) enum FreeGroups {
    Small(Vec<FreeKey>),
    Large(BTreeSet<FreeKey>),
}

impl Default for FreeGroups {
    fn default() -> Self {
        FreeGroups::Small(Vec::new())
    }
}

impl FreeGroups {
    /// The most entries kept in the sorted vector.
    const SMALL: usize = 64;

    pub(crate) fn first(&self) -> Option<&FreeKey> {
        match self {
            FreeGroups::Small(v) => v.first(),
            FreeGroups::Large(s) => s.first(),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        match self {
            FreeGroups::Small(v) => v.is_empty(),
            FreeGroups::Large(s) => s.is_empty(),
        }
    }

    /// Best first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &FreeKey> + '_ {
        let (small, large) = match self {
            FreeGroups::Small(v) => (Some(v.iter()), None),
            FreeGroups::Large(s) => (None, Some(s.iter())),
        };
        small
            .into_iter()
            .flatten()
            .chain(large.into_iter().flatten())
    }

    pub(crate) fn insert(&mut self, key: FreeKey) {
        match self {
            FreeGroups::Small(v) => {
                if let Err(at) = v.binary_search(&key) {
                    if v.len() < Self::SMALL {
                        v.insert(at, key);
                    } else {
                        let mut set: BTreeSet<FreeKey> = v.drain(..).collect();
                        set.insert(key);
                        *self = FreeGroups::Large(set);
                    }
                }
            }
            FreeGroups::Large(s) => {
                s.insert(key);
            }
        }
    }

    /// `remove(old)` then `insert(new)`; in the vector the entry moves to
    /// its new place without shifting the rest twice.
    pub(crate) fn replace(&mut self, old: &FreeKey, new: FreeKey) {
        let FreeGroups::Small(v) = self else {
            self.remove(old);
            return self.insert(new);
        };
        let Ok(mut at) = v.binary_search(old) else {
            return self.insert(new);
        };
        v[at] = new;
        while at > 0 && v[at - 1] > new {
            v.swap(at - 1, at);
            at -= 1;
        }
        while at + 1 < v.len() && v[at + 1] < new {
            v.swap(at, at + 1);
            at += 1;
        }
        if (at > 0 && v[at - 1] == new) || (at + 1 < v.len() && v[at + 1] == new) {
            v.remove(at); // `new` was there already
        }
    }

    pub(crate) fn remove(&mut self, key: &FreeKey) {
        match self {
            FreeGroups::Small(v) => {
                if let Ok(at) = v.binary_search(key) {
                    v.remove(at);
                }
            }
            FreeGroups::Large(s) => {
                s.remove(key);
                if s.len() < Self::SMALL / 2 {
                    *self = FreeGroups::Small(std::mem::take(s).into_iter().collect());
                }
            }
        }
    }
}

#[derive(Debug)]
pub(crate) struct ReqSet {
    pub labels: Labels,
    pub pairs: Vec<u32>,
    /// Matching groups (global ids), in creation order.
    pub groups: Vec<u32>,
    /// Matching groups with a free slot, best first.
    pub free_groups: FreeGroups,
    pub queue: WaitQueue,
    /// Live tasks that require exactly these labels.
    pub live: u64,
    /// Its pool.
    pub pool: u32,
    /// In [`Groups::idle_reqsets`]: kept, though it may have no live task.
    pub kept_idle: bool,
}

impl ReqSet {
    fn new(pool: u32, labels: Labels, pairs: Vec<u32>) -> ReqSet {
        ReqSet {
            pool,
            labels,
            pairs,
            groups: Vec::new(),
            free_groups: FreeGroups::default(),
            queue: WaitQueue::default(),
            live: 0,
            kept_idle: false,
        }
    }
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
    /// Live (unfinished) tasks of the pool, in any phase.
    pub live: u64,
    /// Configured (`PoolConfigured`): never forgotten.
    pub declared: bool,
    /// A free slot of `Groups::pools`, to be reused.
    pub vacant: bool,
    /// Label pairs interned for this pool's groups and reqsets.
    pair_ids: FxHashMap<(String, String), u32>,
    /// Finished tasks that ended after their deadline.
    pub deadline_missed: u64,
    /// The pool's virtual time: the largest start tag started (SPEC §9,
    /// `queue.rs`).
    pub vt: u64,
    /// Some `[[pools.quotas]]` entry is declared.
    pub has_quotas: bool,
    /// Running attempts that may be preempted (pools with `preemption =
    /// "priority"`): `(priority, latest start first, task)`.
    pub preemptible: BTreeSet<(i32, std::cmp::Reverse<u64>, u32)>,
}

impl Pool {
    fn new(name: PoolName) -> Pool {
        Pool {
            name,
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
            vt: 0,
            has_quotas: false,
            preemptible: BTreeSet::new(),
            live: 0,
            declared: false,
            vacant: false,
            pair_ids: FxHashMap::default(),
        }
    }

    /// Nothing keeps this pool: not configured, no group, no live task.
    pub(crate) fn is_idle(&self) -> bool {
        !self.vacant && !self.declared && self.live == 0 && self.groups.is_empty()
    }
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
    /// Reqsets that lost their last live task, oldest first, each with the
    /// group entries its index held then, kept for the next task that
    /// requires the same labels (at most [`MAX_IDLE_REQSETS`] and
    /// [`IDLE_INDEX_BUDGET`] entries; entries of reqsets used again or
    /// forgotten since are skipped when they come out).
    pub idle_reqsets: VecDeque<(u32, u32)>,
    /// The sum of the entries counted in `idle_reqsets`.
    pub idle_entries: usize,
    /// Bounds other than ([`MAX_IDLE_REQSETS`], [`IDLE_INDEX_BUDGET`]):
    /// smaller ones let a test reach them cheaply.
    pub idle_bounds_set: Option<(usize, usize)>,
    vacant_pools: Vec<u32>,
    vacant_groups: Vec<u32>,
    vacant_reqsets: Vec<u32>,
    groups_created: u32,
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
    /// How many idle reqsets are kept, and how many group entries their
    /// indexes may hold together.
    pub(crate) fn idle_bounds(&self) -> (usize, usize) {
        self.idle_bounds_set
            .unwrap_or((MAX_IDLE_REQSETS, IDLE_INDEX_BUDGET))
    }

    fn intern(&mut self, p: u32, labels: &Labels) -> Vec<u32> {
        let ids = &mut self.pools[p as usize].pair_ids;
        let mut pairs: Vec<u32> = labels
            .iter()
            .map(|(k, v)| {
                let next = ids.len() as u32;
                *ids.entry((k.to_string(), v.to_string())).or_insert(next)
            })
            .collect();
        pairs.sort_unstable();
        pairs
    }

    /// Pools in use (not vacant).
    pub(crate) fn live_pools(&self) -> impl Iterator<Item = (u32, &Pool)> {
        self.pools
            .iter()
            .enumerate()
            .filter(|(_, p)| !p.vacant)
            .map(|(i, p)| (i as u32, p))
    }

    /// How many pools are in use.
    pub(crate) fn pool_count(&self) -> usize {
        self.pool_by_name.len()
    }

    /// The pool's index, if it exists.
    pub(crate) fn find_pool(&self, name: &PoolName) -> Option<u32> {
        self.pool_by_name.get(name).copied()
    }

    /// The pool's index, creating it with default settings if new. A new
    /// pool starts with the empty reqset, so every group indexes it.
    pub(crate) fn pool(&mut self, name: &PoolName) -> u32 {
        if let Some(&p) = self.pool_by_name.get(name) {
            return p;
        }
        let pool = Pool::new(name.clone());
        let p = match self.vacant_pools.pop() {
            Some(p) => {
                self.pools[p as usize] = pool;
                p
            }
            None => {
                self.pools.push(pool);
                (self.pools.len() - 1) as u32
            }
        };
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
        let pairs = self.intern(p, labels);
        let r = match self.vacant_reqsets.pop() {
            Some(r) => r,
            None => {
                self.reqsets
                    .push(ReqSet::new(u32::MAX, Labels::new(), Vec::new()));
                (self.reqsets.len() - 1) as u32
            }
        };
        let mut set = ReqSet::new(p, labels.clone(), pairs);
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
        self.reqsets[r as usize] = set;
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
        let pairs = self.intern(p, labels);
        let g = match self.vacant_groups.pop() {
            Some(g) => g,
            None => {
                self.groups.push(Group::vacant());
                self.group_pairs.push(Box::new([]));
                (self.groups.len() - 1) as u32
            }
        };
        let mut group = Group {
            pool: p,
            created: self.groups_created,
            labels: labels.clone(),
            capacity: 0,
            busy: 0,
            reqsets: SmallVec::new(),
        };
        self.groups_created = self.groups_created.wrapping_add(1);
        for &r in &self.pools[p as usize].reqsets {
            let set = &mut self.reqsets[r as usize];
            if is_subset(&set.pairs, &pairs) {
                set.groups.push(g);
                group.reqsets.push(r);
            }
        }
        self.groups[g as usize] = group;
        self.group_pairs[g as usize] = pairs.into_boxed_slice();
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
            match (old_free > 0, new_free > 0) {
                (true, true) => set.free_groups.replace(&old_key, new_key),
                (true, false) => set.free_groups.remove(&old_key),
                (false, true) => set.free_groups.insert(new_key),
                (false, false) => {}
            }
        }
        let pool = &mut self.pools[group.pool as usize];
        pool.free = pool.free + u64::from(new_free) - u64::from(old_free);
    }

    /// Forgets group `g`, which must have no capacity and no busy slot.
    /// O(its reqsets × their groups + the pool's groups).
    pub(crate) fn forget_group(&mut self, g: u32) {
        let group = std::mem::replace(&mut self.groups[g as usize], Group::vacant());
        debug_assert!(group.capacity == 0 && group.busy == 0);
        for &r in &group.reqsets {
            self.reqsets[r as usize].groups.retain(|&x| x != g);
        }
        self.group_pairs[g as usize] = Box::new([]);
        let pool = &mut self.pools[group.pool as usize];
        pool.groups.retain(|&x| x != g);
        pool.group_by_labels.remove(&group.labels);
        self.vacant_groups.push(g);
    }

    /// Forgets reqset `r`, which no live task may use; the pool's empty
    /// reqset stays while the pool does. O(its groups × their reqsets).
    pub(crate) fn forget_reqset(&mut self, r: u32) {
        let set = std::mem::replace(
            &mut self.reqsets[r as usize],
            ReqSet::new(u32::MAX, Labels::new(), Vec::new()),
        );
        debug_assert!(set.live == 0 && set.queue.is_empty());
        for &g in &set.groups {
            self.groups[g as usize].reqsets.retain(|x| *x != r);
        }
        let pool = &mut self.pools[set.pool as usize];
        pool.reqsets.retain(|&x| x != r);
        pool.reqset_by_labels.remove(&set.labels);
        self.vacant_reqsets.push(r);
    }

    /// Forgets pool `p`, which must be idle ([`Pool::is_idle`]).
    pub(crate) fn forget_pool(&mut self, p: u32) {
        let pool = std::mem::replace(&mut self.pools[p as usize], Pool::new(PoolName::default()));
        debug_assert!(pool.live == 0 && pool.groups.is_empty());
        for &r in &pool.reqsets {
            self.reqsets[r as usize] = ReqSet::new(u32::MAX, Labels::new(), Vec::new());
            self.vacant_reqsets.push(r);
        }
        self.pool_by_name.remove(&pool.name);
        self.pools[p as usize].vacant = true;
        self.vacant_pools.push(p);
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

    proptest::proptest! {
        #[test]
        fn a_free_key_orders_as_fewest_labels_most_free_first_created_index(
            a in proptest::array::uniform4(proptest::prelude::any::<u32>()),
            b in proptest::array::uniform4(proptest::prelude::any::<u32>()),
        ) {
            use std::cmp::Reverse;
            let tuple = |k: [u32; 4]| (k[0], Reverse(k[1]), k[2], k[3]);
            let packed = |k: [u32; 4]| FreeKey::new(k[0], k[1], k[2], k[3]);
            proptest::prop_assert_eq!(packed(a).cmp(&packed(b)), tuple(a).cmp(&tuple(b)));
            proptest::prop_assert_eq!(packed(a).group(), a[3]);
        }
    }

    #[test]
    fn free_groups_keep_the_order_of_a_btree_through_moves_and_growth() {
        // A fixed pseudo-random walk of inserts, removes and moves over up
        // to 100 groups: past 64 it turns into a B-tree and back.
        let mut free = FreeGroups::default();
        let mut model = BTreeSet::new();
        let mut x: u64 = 7;
        let mut next = |n: u64| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) % n
        };
        let key = |g: u64, f: u64| FreeKey::new(0, f as u32, g as u32, g as u32);
        let mut slots = [0u64; 100];
        for _ in 0..20_000 {
            let g = next(100) as usize;
            let old = slots[g];
            let new = next(4);
            match (old > 0, new > 0) {
                (true, true) => free.replace(&key(g as u64, old), key(g as u64, new)),
                (true, false) => free.remove(&key(g as u64, old)),
                (false, true) => free.insert(key(g as u64, new)),
                (false, false) => {}
            }
            if old > 0 {
                model.remove(&key(g as u64, old));
            }
            if new > 0 {
                model.insert(key(g as u64, new));
            }
            slots[g] = new;
            assert!(free.iter().eq(model.iter()));
            assert_eq!(free.first(), model.first());
        }
    }
}
