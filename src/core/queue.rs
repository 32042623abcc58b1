//! Waiters of one required-label set, in rule 5 order.
//!
//! The order inside a queue is SPEC §2 rule 5 (a), then §9 (c) fair
//! share, then (d) submission order: an urgent task (its deadline is within
//! the pool's urgency window) comes before every non-urgent one, earliest
//! deadline first; otherwise higher priority first; among equals, the task
//! whose fairness key has the lowest virtual time (`fair.rs`); then
//! submission order. Rule 5 (b), "need", compares heads of *different*
//! queues and lives in `placement.rs`.
//!
//! **Fair share at scale.** Within a bucket of equal rule 5 (a) rank, each
//! fairness key has its own sub-queue (by `seq`), and the keys present are
//! kept in an ordered set by `(virtual time, key)`. A start moves only its
//! own key's virtual time, and virtual times only grow, so an entry of the
//! set is refreshed lazily: when it reaches the front with a virtual time
//! older than its key's, it is moved back to its key's current one (one
//! B-tree step) and the front is read again. Reading a head is then
//! O(log keys in the bucket) and needs no pass over keys or tasks,
//! whatever the number of keys, reqsets or waiters. A key equal on virtual
//! time goes by its id (the order keys first appeared in). Tasks of the
//! pool's unnamed key (no `fairness_key`) keep the deque of old: a pool
//! without keys pays nothing for the rest.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

use rustc_hash::FxHashMap;

use super::fair::NO_KEY;

/// The position of a waiter in its queue, less the fair share (which is
/// its key's virtual time, read when compared).
///
/// `urgency` is the deadline for an urgent task and `u64::MAX` otherwise, so
/// urgent tasks sort first, earliest deadline first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct QueueKey {
    pub urgency: u64,
    pub priority: Reverse<i32>,
    pub seq: u64,
    /// The task's fairness key, [`NO_KEY`] for the pool's unnamed one.
    pub fair: u32,
}

impl QueueKey {
    pub(crate) fn new(
        urgent_deadline: Option<u64>,
        priority: i32,
        seq: u64,
        fair: u32,
    ) -> QueueKey {
        QueueKey {
            urgency: urgent_deadline.unwrap_or(u64::MAX),
            priority: Reverse(priority),
            seq,
            fair,
        }
    }

    /// Equal on rule 5 (a): same urgency class and deadline, same priority.
    pub(crate) fn same_urgency(&self, other: &QueueKey) -> bool {
        self.urgency == other.urgency && self.priority == other.priority
    }

    fn rank(&self) -> Rank {
        (self.urgency, self.priority)
    }
}

/// A queue's first waiter: its key, its task, and its fairness key's
/// virtual time when read.
pub(crate) type Head = (QueueKey, u32, u64);

/// The order of two waiters: rank, virtual time, submission order.
fn order(head: &Head) -> (u64, Reverse<i32>, u64, u64) {
    (head.0.urgency, head.0.priority, head.2, head.0.seq)
}

/// Rule 5 (a) rank of a bucket: `(urgency, priority)` of [`QueueKey`].
type Rank = (u64, Reverse<i32>);

/// Marks a removed entry inside a bucket's deque (see [`WaitQueue`]).
const GONE: u32 = u32::MAX;

/// Waiters of one rank.
#[derive(Default, Debug)]
struct Bucket {
    /// Tasks of the unnamed key, by `seq`.
    plain: VecDeque<(u64, u32)>,
    /// Tasks of named keys, by key then `seq`.
    named: BTreeMap<(u32, u64), u32>,
    /// Named keys present, by the virtual time they were placed with.
    keys: BTreeSet<(u64, u32)>,
    /// The virtual time each present key's entry in `keys` carries.
    placed: FxHashMap<u32, u64>,
}

impl Bucket {
    fn is_empty(&self) -> bool {
        self.plain.is_empty() && self.named.is_empty()
    }

    /// The first waiter of a key `allowed` lets through, refreshing stale
    /// entries of `keys` on the way.
    fn head(
        &mut self,
        rank: Rank,
        vt: &impl Fn(u32) -> u64,
        allowed: &impl Fn(u32) -> bool,
    ) -> Option<Head> {
        let named = loop {
            let Some((stored, k)) = self.keys.iter().copied().find(|&(_, k)| allowed(k)) else {
                break None;
            };
            let current = vt(k);
            if stored != current {
                debug_assert!(stored < current, "virtual time ran backwards");
                self.keys.remove(&(stored, k));
                self.keys.insert((current, k));
                self.placed.insert(k, current);
                continue;
            }
            let (&(_, seq), &task) = self
                .named
                .range((k, 0)..)
                .next()
                .expect("a placed key has waiters");
            break Some((key_of(rank, seq, k), task, current));
        };
        let plain = if allowed(NO_KEY) {
            self.plain
                .front()
                .map(|&(seq, task)| (key_of(rank, seq, NO_KEY), task, vt(NO_KEY)))
        } else {
            None
        };
        match (named, plain) {
            (Some(a), Some(b)) => Some(if order(&a) < order(&b) { a } else { b }),
            (a, b) => a.or(b),
        }
    }

    /// Removes a named key's waiter; drops the key's entry if it was its last.
    fn remove_named(&mut self, fair: u32, seq: u64) -> bool {
        if self.named.remove(&(fair, seq)).is_none() {
            return false;
        }
        let more = self
            .named
            .range((fair, 0)..=(fair, u64::MAX))
            .next()
            .is_some();
        if !more {
            let stored = self.placed.remove(&fair).expect("a present key is placed");
            self.keys.remove(&(stored, fair));
        }
        true
    }
}

fn key_of(rank: Rank, seq: u64, fair: u32) -> QueueKey {
    QueueKey {
        urgency: rank.0,
        priority: rank.1,
        seq,
        fair,
    }
}

/// Waiting tasks (slab indices) of one required-label set.
///
/// Waiters are kept in buckets of equal rule 5 (a) rank — `(urgency,
/// priority)`. Tasks of the unnamed key are a deque sorted by `seq`: a new
/// task has the largest `seq` so far and goes to the back in O(1); a task
/// that waits again after a failed attempt keeps its old `seq` and is
/// inserted at its sorted place. A waiter removed from the middle of a
/// deque is only marked [`GONE`] (found by binary search on `seq`); marks
/// are dropped once they reach either end, so the front and back of every
/// deque are always live. Tasks of named keys are in a B-tree by key and
/// `seq`, their keys ordered by virtual time (module docs).
///
/// The head is cached: a freed slot compares the heads of several queues,
/// and reading them must not walk trees and deques spread over memory. A
/// cached head whose key's virtual time moved since is read again.
#[derive(Default, Debug)]
pub(crate) struct WaitQueue {
    head: Option<Head>,
    len: usize,
    /// Waiters of named keys.
    named_len: usize,
    buckets: BTreeMap<Rank, Bucket>,
}

impl WaitQueue {
    pub(crate) fn push(&mut self, key: QueueKey, task: u32, vt: &impl Fn(u32) -> u64) {
        let bucket = self.buckets.entry(key.rank()).or_default();
        self.len += 1;
        if key.fair != NO_KEY {
            self.named_len += 1;
            bucket.named.insert((key.fair, key.seq), task);
            if let std::collections::hash_map::Entry::Vacant(e) = bucket.placed.entry(key.fair) {
                let current = vt(key.fair);
                e.insert(current);
                bucket.keys.insert((current, key.fair));
            }
        } else {
            match bucket.plain.back() {
                None => bucket.plain.push_back((key.seq, task)),
                Some(&(last, _)) if last < key.seq => bucket.plain.push_back((key.seq, task)),
                Some(_) => match bucket.plain.binary_search_by_key(&key.seq, |&(s, _)| s) {
                    Ok(i) => {
                        debug_assert_eq!(bucket.plain[i].1, GONE, "queue key reused");
                        bucket.plain[i].1 = task;
                    }
                    Err(i) => bucket.plain.insert(i, (key.seq, task)),
                },
            }
        }
        let new: Head = (key, task, vt(key.fair));
        let better = match self.head {
            None => true,
            // One key: rank and submission order alone (its cached virtual
            // time may be old).
            Some(head) if self.named_len == 0 => {
                (key.urgency, key.priority, key.seq) < (head.0.urgency, head.0.priority, head.0.seq)
            }
            // A cached head that went stale is no larger than the true
            // first waiter, so beating it is beating every waiter; if the
            // new one does not, `head` reads the queue again.
            Some(head) => order(&new) < order(&head),
        };
        if better {
            self.head = Some(new);
        }
    }

    /// Removes `task`, queued under `key`. Returns whether it was there.
    pub(crate) fn remove(&mut self, key: &QueueKey, task: u32, vt: &impl Fn(u32) -> u64) -> bool {
        let was_head = self.head.is_some_and(|(k, t, _)| k == *key && t == task);
        if was_head && self.named_len == 0 {
            self.pop_plain_head(vt);
            return true;
        }
        let rank = key.rank();
        let Some(bucket) = self.buckets.get_mut(&rank) else {
            return false;
        };
        let found = if key.fair != NO_KEY {
            bucket.remove_named(key.fair, key.seq)
        } else if bucket.plain.front() == Some(&(key.seq, task)) {
            bucket.plain.pop_front();
            true
        } else if bucket.plain.back() == Some(&(key.seq, task)) {
            bucket.plain.pop_back();
            true
        } else {
            match bucket.plain.binary_search_by_key(&key.seq, |&(s, _)| s) {
                Ok(i) if bucket.plain[i].1 == task => {
                    bucket.plain[i].1 = GONE;
                    true
                }
                _ => false,
            }
        };
        if !found {
            return false;
        }
        self.len -= 1;
        if key.fair != NO_KEY {
            self.named_len -= 1;
        }
        while bucket.plain.front().is_some_and(|&(_, t)| t == GONE) {
            bucket.plain.pop_front();
        }
        while bucket.plain.back().is_some_and(|&(_, t)| t == GONE) {
            bucket.plain.pop_back();
        }
        if bucket.is_empty() {
            self.buckets.remove(&rank);
        }
        // The last named waiter gone: the cached head, which may have gone
        // stale meanwhile, must be right for the one-key fast paths.
        if was_head || (key.fair != NO_KEY && self.named_len == 0) {
            self.head = self.first_where(vt, &|_| true);
        }
        true
    }

    /// Removes the head of a queue of the unnamed key alone (what a freed
    /// slot usually takes): the front of the first bucket, found without a
    /// search, and the next head read from the same bucket.
    fn pop_plain_head(&mut self, vt: &impl Fn(u32) -> u64) {
        let Some(mut first) = self.buckets.first_entry() else {
            return;
        };
        let rank = *first.key();
        let bucket = first.get_mut();
        bucket.plain.pop_front();
        self.len -= 1;
        while bucket.plain.front().is_some_and(|&(_, t)| t == GONE) {
            bucket.plain.pop_front();
        }
        self.head = match bucket.plain.front() {
            Some(&(seq, task)) => Some((key_of(rank, seq, NO_KEY), task, vt(NO_KEY))),
            None => {
                first.remove();
                self.first_where(vt, &|_| true)
            }
        };
    }

    /// The first waiter, its key's virtual time as of now.
    pub(crate) fn head(&mut self, vt: &impl Fn(u32) -> u64) -> Option<Head> {
        let (key, task, stored) = self.head?;
        let current = vt(key.fair);
        if stored == current {
            return self.head;
        }
        if self.named_len == 0 {
            // One key: its virtual time orders nothing here.
            self.head = Some((key, task, current));
        } else {
            self.head = self.first_where(vt, &|_| true);
        }
        self.head
    }

    /// The first waiter whose fairness key `allowed` lets through (a key
    /// at its quota for the group in question is not).
    pub(crate) fn first_where(
        &mut self,
        vt: &impl Fn(u32) -> u64,
        allowed: &impl Fn(u32) -> bool,
    ) -> Option<Head> {
        for (&rank, bucket) in self.buckets.iter_mut() {
            if let Some(head) = bucket.head(rank, vt, allowed) {
                return Some(head);
            }
        }
        None
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every waiter, in no particular order (for checks and views).
    pub(crate) fn tasks(&self) -> impl Iterator<Item = u32> + '_ {
        self.buckets.values().flat_map(|b| {
            b.plain
                .iter()
                .filter(|&&(_, t)| t != GONE)
                .map(|&(_, t)| t)
                .chain(b.named.values().copied())
        })
    }

    /// Every waiter of the unnamed key with its key, in queue order (tests).
    #[cfg(test)]
    pub(crate) fn iter(&self) -> impl Iterator<Item = (QueueKey, u32)> + '_ {
        self.buckets.iter().flat_map(|(&rank, b)| {
            b.plain
                .iter()
                .filter(|&&(_, t)| t != GONE)
                .map(move |&(seq, t)| (key_of(rank, seq, NO_KEY), t))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(deadline: Option<u64>, priority: i32, seq: u64) -> QueueKey {
        QueueKey::new(deadline, priority, seq, NO_KEY)
    }

    const ONE_KEY: fn(u32) -> u64 = |_| 0;

    #[test]
    fn urgent_before_priority_before_submission_order() {
        let mut q = WaitQueue::default();
        let vt = ONE_KEY;
        q.push(plain(None, 0, 1), 1, &vt);
        q.push(plain(None, 5, 2), 2, &vt);
        q.push(plain(Some(900), 0, 3), 3, &vt);
        q.push(plain(Some(100), -3, 4), 4, &vt);
        q.push(plain(None, 0, 0), 5, &vt);
        let order: Vec<u32> = q.iter().map(|(_, t)| t).collect();
        assert_eq!(order, vec![4, 3, 2, 5, 1]);
        assert_eq!(q.head(&vt).map(|h| h.1), Some(4));
    }

    #[test]
    fn removal_from_the_middle_and_reinsertion() {
        let mut q = WaitQueue::default();
        let vt = ONE_KEY;
        for seq in 0..5 {
            q.push(plain(None, 0, seq), seq as u32, &vt);
        }
        assert!(q.remove(&plain(None, 0, 2), 2, &vt));
        assert!(!q.remove(&plain(None, 0, 2), 2, &vt));
        assert_eq!(q.len(), 4);
        q.push(plain(None, 0, 2), 7, &vt);
        assert!(q.remove(&plain(None, 0, 0), 0, &vt));
        assert!(q.remove(&plain(None, 0, 1), 1, &vt));
        assert_eq!(q.head(&vt), Some((plain(None, 0, 2), 7, 0)));
        assert!(q.remove(&plain(None, 0, 3), 3, &vt));
        assert!(q.remove(&plain(None, 0, 4), 4, &vt));
        assert!(q.remove(&plain(None, 0, 2), 7, &vt));
        assert!(q.is_empty());
        assert_eq!(q.head(&vt), None);
        assert!(q.buckets.is_empty());
        q.push(plain(None, 0, 9), 9, &vt);
        q.push(plain(None, 1, 10), 10, &vt);
        assert_eq!(q.head(&vt), Some((plain(None, 1, 10), 10, 0)));
        assert!(q.remove(&plain(None, 1, 10), 10, &vt));
        assert_eq!(q.head(&vt), Some((plain(None, 0, 9), 9, 0)));
    }

    /// Keys 1 and 2 and the unnamed key in one rank: the head follows the
    /// lowest virtual time, refreshed lazily as the times move; a key at
    /// its quota is passed over; a higher rank still comes first.
    #[test]
    fn the_head_follows_the_lowest_virtual_time_within_a_rank() {
        use std::cell::RefCell;
        let times = RefCell::new([0u64; 3]); // key 1, key 2, unnamed
        let vt = |k: u32| times.borrow()[if k == NO_KEY { 2 } else { k as usize - 1 }];
        let mut q = WaitQueue::default();
        q.push(QueueKey::new(None, 0, 1, 1), 11, &vt);
        q.push(QueueKey::new(None, 0, 2, 1), 12, &vt);
        q.push(QueueKey::new(None, 0, 3, 2), 21, &vt);
        q.push(plain(None, 0, 4), 31, &vt);
        assert_eq!(
            q.head(&vt).map(|h| h.1),
            Some(11),
            "all at 0: submission order"
        );
        times.borrow_mut()[0] = 5; // key 1 started
        assert_eq!(q.head(&vt).map(|h| h.1), Some(21));
        times.borrow_mut()[1] = 5; // key 2 started
        assert_eq!(
            q.head(&vt).map(|h| h.1),
            Some(31),
            "the unnamed key is lowest"
        );
        times.borrow_mut()[2] = 9;
        assert_eq!(
            q.head(&vt).map(|h| h.1),
            Some(11),
            "keys 1 and 2 tie: key 1's task is older"
        );
        let not_key_1 = |k: u32| k != 1;
        assert_eq!(q.first_where(&vt, &not_key_1).map(|h| h.1), Some(21));
        assert!(q.remove(&QueueKey::new(None, 0, 1, 1), 11, &vt));
        assert_eq!(q.head(&vt).map(|h| h.1), Some(12));
        q.push(QueueKey::new(None, 7, 5, 2), 22, &vt);
        assert_eq!(
            q.head(&vt).map(|h| h.1),
            Some(22),
            "priority before fair share"
        );
        for (key, task) in [
            (QueueKey::new(None, 7, 5, 2), 22),
            (QueueKey::new(None, 0, 2, 1), 12),
        ] {
            assert!(q.remove(&key, task, &vt));
        }
        assert!(q.remove(&QueueKey::new(None, 0, 3, 2), 21, &vt));
        assert!(q.remove(&plain(None, 0, 4), 31, &vt));
        assert!(q.is_empty() && q.buckets.is_empty() && q.head(&vt).is_none());
    }

    /// The one key's virtual time moves between pushes (every start moves
    /// it): a task waiting again at its old place still becomes the head,
    /// in a queue of that key alone and once the last named waiter left.
    #[test]
    fn a_retry_at_its_old_place_becomes_the_head_whatever_the_times() {
        use std::cell::Cell;
        let time = Cell::new(0u64);
        let vt = |_: u32| time.get();
        let mut q = WaitQueue::default();
        q.push(plain(None, 0, 5), 5, &vt);
        time.set(3);
        q.push(plain(None, 0, 2), 2, &vt);
        assert_eq!(q.head(&vt).map(|h| h.1), Some(2));
        assert!(q.remove(&plain(None, 0, 2), 2, &vt));
        assert_eq!(q.head(&vt).map(|h| h.1), Some(5));
        q.push(QueueKey::new(None, 0, 9, 1), 9, &vt);
        time.set(7);
        q.push(plain(None, 0, 1), 1, &vt);
        assert!(q.remove(&QueueKey::new(None, 0, 9, 1), 9, &vt));
        assert!(
            q.remove(&plain(None, 0, 1), 1, &vt),
            "the head, by the fast path"
        );
        assert_eq!(q.head(&vt).map(|h| h.1), Some(5));
        assert_eq!(q.len(), 1);
    }
}
