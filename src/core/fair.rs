//! Sharing a fleet (SPEC §9) as data: fairness keys with their virtual
//! time and quotas, and concurrency keys with their running counts and the
//! tasks parked on them. No placement decision lives here (that is
//! `placement.rs` and `sharing.rs`); this is what those decisions read.
//!
//! **Keys are interned.** A task names its keys as strings; the core turns
//! each into a small id (`u32`) once, on admission, and a task's record
//! keeps only the ids (in its `TaskExtra`, which tasks without keys do not
//! have). Every pool has one *unnamed* fairness key, shared by its tasks
//! that name none, so a pool without keys has exactly one key and rule 5
//! orders it as before. A key is forgotten when its last live task is
//! (the unnamed one with its pool), so memory follows the keys in use.
//!
//! **Virtual time** (start-time fair queuing, `queue.rs`): a task of key K
//! joining the queues gets the start tag `max(pool virtual time,
//! finish(K))`, and `finish(K)` moves on by [`VT_SCALE`]` / weight`; the
//! pool's virtual time is the largest tag started. A key that was idle
//! comes back at the pool's virtual time, so it earns no burst.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

use rustc_hash::FxHashMap;

use super::model::Labels;

/// No named key: the task uses its pool's unnamed fairness key, or has
/// no concurrency key.
pub(crate) const NO_KEY: u32 = u32::MAX;

/// One start of a task of weight 1 advances its key's virtual time by
/// this much (divisible by every weight up to 16, and by 1,000): at that
/// rate a key's virtual time saturates after 2.5 × 10¹⁰ starts.
pub(crate) const VT_SCALE: u64 = 720_720_000;

/// How far one start of a task of `weight` moves its key.
pub(crate) fn vt_step(weight: u32) -> u64 {
    VT_SCALE / u64::from(weight.max(1))
}

/// One quota of a fairness key (a `[[pools.quotas]]` entry).
#[derive(Clone, Debug)]
pub(crate) struct Quota {
    pub labels: Labels,
    pub max_running: u32,
    /// Slots the key's running attempts hold in groups carrying `labels`.
    pub held: u32,
}

/// A fairness key of one pool.
#[derive(Clone, Debug)]
pub(crate) struct FairKey {
    /// Empty for the pool's unnamed key.
    pub name: Box<str>,
    pub pool: u32,
    /// The start tag its next task would get, before the pool's virtual
    /// time is applied.
    pub finish: u64,
    /// Slots its running attempts hold.
    pub running: u64,
    /// Live tasks naming it (the unnamed key is kept with its pool).
    pub live: u64,
    /// The weight `[[pools.fairness]]` gives it, or 0 (each task's own).
    pub weight: u32,
    pub quotas: Vec<Quota>,
    /// A vacant slot of the table.
    pub vacant: bool,
}

/// A parked task's place: priority (highest first), submission order,
/// slab index.
pub(crate) type Parked = (Reverse<i32>, u64, u32);

/// A concurrency key of one pool.
#[derive(Clone, Debug, Default)]
pub(crate) struct ConcKey {
    pub name: Box<str>,
    pub pool: u32,
    /// Attempts of its tasks holding a slot (stopping ones included).
    pub running: u32,
    /// Its tasks in the placement queues: each may start, so together
    /// with `running` they are what a newcomer's limit is judged against.
    pub queued: u32,
    pub live: u64,
    /// Tasks waiting for the limit, by their limit, then priority (highest
    /// first), then submission order.
    pub parked: BTreeMap<u32, BTreeSet<Parked>>,
    /// Its queued tasks: `(seq, task)` (for `replace_waiting`).
    pub queued_tasks: BTreeSet<(u64, u32)>,
    /// Its running tasks, oldest start first: `(start stamp, task)` (for
    /// `cancel_running`).
    pub running_tasks: BTreeSet<(u64, u32)>,
    pub vacant: bool,
}

impl ConcKey {
    /// Parked tasks in all.
    pub(crate) fn parked_len(&self) -> usize {
        self.parked.values().map(BTreeSet::len).sum()
    }

    /// The best parked task whose limit exceeds what runs or is queued:
    /// `(limit, entry)`.
    pub(crate) fn next_to_unpark(&self) -> Option<(u32, Parked)> {
        let taken = self.running.saturating_add(self.queued);
        self.parked
            .range(taken.saturating_add(1)..)
            .filter_map(|(&limit, set)| set.first().map(|&e| (limit, e)))
            .min_by_key(|&(_, e)| e)
    }
}

/// Every fairness and concurrency key of one core.
#[derive(Debug, Default)]
pub(crate) struct Keys {
    pub fair: Vec<FairKey>,
    fair_by_name: FxHashMap<(u32, Box<str>), u32>,
    fair_vacant: Vec<u32>,
    /// The unnamed fairness key of each pool index (`NO_KEY` if none yet).
    unnamed: Vec<u32>,
    pub conc: Vec<ConcKey>,
    conc_by_name: FxHashMap<(u32, Box<str>), u32>,
    conc_vacant: Vec<u32>,
    /// Stamps running attempts of tasks with a concurrency key.
    pub next_start: u64,
}

impl Keys {
    /// The unnamed key of pool `p`, created if new.
    pub(crate) fn unnamed(&mut self, p: u32) -> u32 {
        if self.unnamed.len() <= p as usize {
            self.unnamed.resize(p as usize + 1, NO_KEY);
        }
        if self.unnamed[p as usize] == NO_KEY {
            let k = self.new_fair(p, "");
            self.unnamed[p as usize] = k;
        }
        self.unnamed[p as usize]
    }

    /// The unnamed key of pool `p`, if it has one.
    pub(crate) fn unnamed_of(&self, p: u32) -> u32 {
        self.unnamed.get(p as usize).copied().unwrap_or(NO_KEY)
    }

    /// The named fairness key `name` of pool `p`, if it exists.
    pub(crate) fn find_fair(&self, p: u32, name: &str) -> Option<u32> {
        self.fair_by_name.get(&(p, Box::from(name))).copied()
    }

    /// The named fairness key `name` of pool `p`, created if new.
    pub(crate) fn fair_key(&mut self, p: u32, name: &str) -> u32 {
        if let Some(k) = self.find_fair(p, name) {
            return k;
        }
        let k = self.new_fair(p, name);
        self.fair_by_name.insert((p, Box::from(name)), k);
        k
    }

    fn new_fair(&mut self, p: u32, name: &str) -> u32 {
        let key = FairKey {
            name: Box::from(name),
            pool: p,
            finish: 0,
            running: 0,
            live: 0,
            weight: 0,
            quotas: Vec::new(),
            vacant: false,
        };
        match self.fair_vacant.pop() {
            Some(k) => {
                self.fair[k as usize] = key;
                k
            }
            None => {
                self.fair.push(key);
                (self.fair.len() - 1) as u32
            }
        }
    }

    /// Forgets a named fairness key nobody uses any more.
    pub(crate) fn forget_fair_if_unused(&mut self, k: u32) {
        let key = &self.fair[k as usize];
        if key.live > 0 || key.running > 0 || key.name.is_empty() {
            return;
        }
        self.fair_by_name.remove(&(key.pool, key.name.clone()));
        self.fair[k as usize].vacant = true;
        self.fair_vacant.push(k);
    }

    /// Forgets pool `p`'s unnamed key (its pool is forgotten).
    pub(crate) fn forget_unnamed(&mut self, p: u32) {
        let k = self.unnamed_of(p);
        if k != NO_KEY {
            self.unnamed[p as usize] = NO_KEY;
            self.fair[k as usize].vacant = true;
            self.fair_vacant.push(k);
        }
    }

    /// The concurrency key `name` of pool `p`, created if new.
    pub(crate) fn conc_key(&mut self, p: u32, name: &str) -> u32 {
        if let Some(&c) = self.conc_by_name.get(&(p, Box::from(name))) {
            return c;
        }
        let key = ConcKey {
            name: Box::from(name),
            pool: p,
            ..ConcKey::default()
        };
        let c = match self.conc_vacant.pop() {
            Some(c) => {
                self.conc[c as usize] = key;
                c
            }
            None => {
                self.conc.push(key);
                (self.conc.len() - 1) as u32
            }
        };
        self.conc_by_name.insert((p, Box::from(name)), c);
        c
    }

    /// Forgets a concurrency key nobody uses any more.
    pub(crate) fn forget_conc_if_unused(&mut self, c: u32) {
        let key = &self.conc[c as usize];
        if key.live > 0 || key.running > 0 {
            return;
        }
        debug_assert!(key.queued == 0 && key.parked.is_empty());
        self.conc_by_name.remove(&(key.pool, key.name.clone()));
        self.conc[c as usize].vacant = true;
        self.conc_vacant.push(c);
    }

    /// Named fairness keys in use (not vacant), for checks and views.
    pub(crate) fn live_fair(&self) -> impl Iterator<Item = (u32, &FairKey)> {
        self.fair
            .iter()
            .enumerate()
            .filter(|(_, k)| !k.vacant)
            .map(|(i, k)| (i as u32, k))
    }

    /// Concurrency keys in use.
    pub(crate) fn live_conc(&self) -> impl Iterator<Item = (u32, &ConcKey)> {
        self.conc
            .iter()
            .enumerate()
            .filter(|(_, k)| !k.vacant)
            .map(|(i, k)| (i as u32, k))
    }

    /// How many named fairness keys the name index holds.
    pub(crate) fn named_fair_count(&self) -> usize {
        self.fair_by_name.len()
    }

    /// How many concurrency keys the name index holds.
    pub(crate) fn conc_count(&self) -> usize {
        self.conc_by_name.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_exact_for_the_usual_weights() {
        for w in [1, 2, 3, 4, 5, 8, 10, 16, 100, 1000] {
            assert_eq!(vt_step(w) * u64::from(w), VT_SCALE, "weight {w}");
        }
    }

    #[test]
    fn keys_are_interned_per_pool_and_forgotten_when_unused() {
        let mut keys = Keys::default();
        let a = keys.fair_key(0, "team-a");
        assert_eq!(keys.fair_key(0, "team-a"), a);
        let b = keys.fair_key(1, "team-a");
        assert_ne!(a, b, "pools do not share keys");
        let unnamed = keys.unnamed(0);
        assert_eq!(keys.unnamed(0), unnamed);
        assert_ne!(unnamed, a);
        keys.forget_fair_if_unused(a);
        assert_eq!(keys.find_fair(0, "team-a"), None);
        assert_eq!(keys.fair_key(0, "team-c"), a, "the slot is reused");
        keys.forget_fair_if_unused(unnamed);
        assert_eq!(
            keys.unnamed(0),
            unnamed,
            "the unnamed key stays with its pool"
        );
    }

    #[test]
    fn the_next_parked_task_is_the_best_whose_limit_has_room() {
        let mut c = ConcKey::default();
        c.parked.entry(1).or_default().insert((Reverse(0), 1, 10));
        c.parked.entry(3).or_default().insert((Reverse(0), 2, 20));
        c.running = 1;
        assert_eq!(c.next_to_unpark(), Some((3, (Reverse(0), 2, 20))));
        c.running = 0;
        assert_eq!(c.next_to_unpark(), Some((1, (Reverse(0), 1, 10))));
        c.queued = 3;
        assert_eq!(c.next_to_unpark(), None);
        assert_eq!(c.parked_len(), 2);
    }
}
