//! Waiters of one required-label set, in rule 5 order.
//!
//! The order inside a queue is SPEC §2 rule 5 (a), then §9 (c) fair
//! share, then (d) submission order: an urgent task (its deadline is within
//! the pool's urgency window) comes before every non-urgent one, earliest
//! deadline first; otherwise higher priority first; among equals, the
//! lowest *virtual start tag* (below); then submission order. Rule 5 (b),
//! "need", compares heads of *different* queues and lives in
//! `placement.rs`.
//!
//! **Fair share at scale: start tags.** Start-time fair queuing as Goyal,
//! Vin and Cheng define it: a task joining the queues of a pool gets the
//! start tag `max(pool virtual time, its key's finish)`, and its key's
//! finish moves on by `1/weight` (`sharing.rs`); the pool's virtual time is
//! the largest tag started so far. Serving the lowest tag first gives each
//! busy key starts in proportion to its weight, and a key that was idle
//! comes back at the pool's virtual time, with no credit saved up. The tag
//! is fixed when the task joins, so no start ever reorders a queue: per
//! rank, each key's waiters are a sub-queue by `seq` (their tags rise with
//! it), and the keys present are an ordered set by the tag of their first
//! waiter, which changes only when that waiter leaves. Reading a head is
//! O(log) whatever the number of keys, reqsets or waiters; a key at its
//! quota is passed over as one entry, not task by task. Tasks of the
//! pool's unnamed key (no `fairness_key`) keep the deque of old, each with
//! its tag: a pool without keys orders exactly as before.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

use rustc_hash::FxHashMap;

use super::fair::NO_KEY;

/// The position of a waiter in its queue: rank, submission order and the
/// fairness key (whose sub-queue holds it). Its start tag is stored beside
/// it in the queue.
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

/// A queue's first waiter: its key, its task and its start tag.
pub(crate) type Head = (QueueKey, u32, u64);

/// The order of two waiters of one queue: rank, start tag, submission order.
pub(crate) fn order(head: &Head) -> (u64, Reverse<i32>, u64, u64) {
    (head.0.urgency, head.0.priority, head.2, head.0.seq)
}

/// Rule 5 (a) rank of a bucket: `(urgency, priority)` of [`QueueKey`].
type Rank = (u64, Reverse<i32>);

/// Marks a removed entry inside a bucket's deque (see [`WaitQueue`]).
const GONE: u32 = u32::MAX;

/// Waiters of one rank.
///
/// Named keys' waiters are split in two: each key's first waiter (by
/// `seq`) is in `firsts` and in the ordered set `keys`; the rest wait in
/// `more`. With many keys a key seldom has a second waiter in one bucket,
/// so taking the head — what nearly every start does — is a probe of
/// `firsts` and the leftmost path of `keys` (hot in cache), not a search
/// of a tree of every waiter.
#[derive(Default, Debug)]
struct Bucket {
    /// Tasks of the unnamed key: `(seq, task, tag)`, by `seq` (and so by
    /// tag: see `push`).
    plain: VecDeque<(u64, u32, u64)>,
    /// The first waiter here of each named key present: `key -> (tag,
    /// seq, task)`.
    firsts: FxHashMap<u32, (u64, u64, u32)>,
    /// The same first waiters, in fair order: `(tag, seq, key, task)`.
    keys: BTreeSet<(u64, u64, u32, u32)>,
    /// Named keys' other waiters: `(key, seq) -> (task, tag)`.
    more: BTreeMap<(u32, u64), (u32, u64)>,
}

impl Bucket {
    fn is_empty(&self) -> bool {
        self.plain.is_empty() && self.firsts.is_empty()
    }

    /// The first waiter whose key `allowed` lets through.
    fn head(&self, rank: Rank, allowed: &impl Fn(u32) -> bool) -> Option<Head> {
        let named = self
            .keys
            .iter()
            .find(|&&(_, _, k, _)| allowed(k))
            .map(|&(tag, seq, k, task)| (key_of(rank, seq, k), task, tag));
        let plain = if allowed(NO_KEY) {
            self.plain
                .front()
                .map(|&(seq, task, tag)| (key_of(rank, seq, NO_KEY), task, tag))
        } else {
            None
        };
        match (named, plain) {
            (Some(a), Some(b)) => Some(if order(&a) < order(&b) { a } else { b }),
            (a, b) => a.or(b),
        }
    }

    fn push_named(&mut self, fair: u32, seq: u64, task: u32, tag: u64) {
        match self.firsts.get(&fair).copied() {
            None => {
                self.firsts.insert(fair, (tag, seq, task));
                self.keys.insert((tag, seq, fair, task));
            }
            Some((first_tag, first, first_task)) if seq < first => {
                // Waiting again before the key's first waiter here.
                self.keys.remove(&(first_tag, first, fair, first_task));
                self.more.insert((fair, first), (first_task, first_tag));
                self.firsts.insert(fair, (tag, seq, task));
                self.keys.insert((tag, seq, fair, task));
            }
            Some(_) => {
                self.more.insert((fair, seq), (task, tag));
            }
        }
    }

    /// Removes a named key's waiter; if it was the key's first here, the
    /// key's next waiter (if any) takes its place.
    fn remove_named(&mut self, fair: u32, seq: u64) -> bool {
        let Some(&(tag, first, task)) = self.firsts.get(&fair) else {
            return false;
        };
        if seq != first {
            return self.more.remove(&(fair, seq)).is_some();
        }
        self.keys.remove(&(tag, seq, fair, task));
        let next = self
            .more
            .range((fair, seq)..=(fair, u64::MAX))
            .next()
            .map(|(&(_, next), &(task, tag))| (next, task, tag));
        match next {
            Some((next, task, tag)) => {
                self.more.remove(&(fair, next));
                self.firsts.insert(fair, (tag, next, task));
                self.keys.insert((tag, next, fair, task));
            }
            None => {
                self.firsts.remove(&fair);
            }
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
/// deque are always live. Tasks of named keys are per key by `seq`, their
/// keys ordered by their first waiter's tag (module docs, [`Bucket`]).
///
/// The head is cached: a freed slot compares the heads of several queues,
/// and reading them must not walk trees and deques spread over memory.
#[derive(Default, Debug)]
pub(crate) struct WaitQueue {
    head: Option<Head>,
    len: usize,
    buckets: BTreeMap<Rank, Bucket>,
}

impl WaitQueue {
    /// Queues `task` under `key` with start tag `tag`; returns the tag it
    /// got. A task of the unnamed key inserted before others (waiting
    /// again at its old place) gets a tag between its neighbours', so the
    /// key's tags keep rising with `seq`.
    pub(crate) fn push(&mut self, key: QueueKey, task: u32, tag: u64) -> u64 {
        let bucket = self.buckets.entry(key.rank()).or_default();
        self.len += 1;
        let mut tag = tag;
        if key.fair != NO_KEY {
            bucket.push_named(key.fair, key.seq, task, tag);
        } else {
            let plain = &mut bucket.plain;
            match plain.back() {
                None => plain.push_back((key.seq, task, tag)),
                Some(&(last, _, last_tag)) if last < key.seq => {
                    tag = tag.max(last_tag);
                    plain.push_back((key.seq, task, tag));
                }
                Some(_) => {
                    let i = match plain.binary_search_by_key(&key.seq, |&(s, _, _)| s) {
                        Ok(i) | Err(i) => i,
                    };
                    let live = |e: &(u64, u32, u64)| e.1 != GONE;
                    let before = plain.range(..i).rev().find(|e| live(e)).map(|e| e.2);
                    let after = plain
                        .range(i..)
                        .find(|e| live(e) && e.0 != key.seq)
                        .map(|e| e.2);
                    if let Some(after) = after {
                        tag = tag.min(after);
                    }
                    if let Some(before) = before {
                        tag = tag.max(before);
                    }
                    match plain.get(i) {
                        Some(e) if e.0 == key.seq => {
                            debug_assert_eq!(e.1, GONE, "queue key reused");
                            plain[i] = (key.seq, task, tag);
                        }
                        _ => plain.insert(i, (key.seq, task, tag)),
                    }
                }
            }
        }
        let new: Head = (key, task, tag);
        if self.head.map_or(true, |head| order(&new) < order(&head)) {
            self.head = Some(new);
        }
        tag
    }

    /// Removes `task`, queued under `key`. Returns whether it was there.
    pub(crate) fn remove(&mut self, key: &QueueKey, task: u32) -> bool {
        let was_head = self.head.is_some_and(|(k, t, _)| k == *key && t == task);
        let rank = key.rank();
        let Some(bucket) = self.buckets.get_mut(&rank) else {
            return false;
        };
        let found = if key.fair != NO_KEY {
            bucket.remove_named(key.fair, key.seq)
        } else if bucket
            .plain
            .front()
            .is_some_and(|e| (e.0, e.1) == (key.seq, task))
        {
            bucket.plain.pop_front();
            true
        } else if bucket
            .plain
            .back()
            .is_some_and(|e| (e.0, e.1) == (key.seq, task))
        {
            bucket.plain.pop_back();
            true
        } else {
            match bucket.plain.binary_search_by_key(&key.seq, |&(s, _, _)| s) {
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
        while bucket.plain.front().is_some_and(|e| e.1 == GONE) {
            bucket.plain.pop_front();
        }
        while bucket.plain.back().is_some_and(|e| e.1 == GONE) {
            bucket.plain.pop_back();
        }
        if was_head {
            // Usually the next head is in the same bucket.
            self.head = if bucket.is_empty() {
                self.buckets.remove(&rank);
                self.first_where(&|_| true)
            } else {
                bucket.head(rank, &|_| true)
            };
        } else if bucket.is_empty() {
            self.buckets.remove(&rank);
        }
        true
    }

    /// The first waiter.
    pub(crate) fn head(&self) -> Option<Head> {
        self.head
    }

    /// The first waiter whose fairness key `allowed` lets through (a key
    /// at its quota for the group in question is not).
    pub(crate) fn first_where(&self, allowed: &impl Fn(u32) -> bool) -> Option<Head> {
        self.buckets
            .iter()
            .find_map(|(&rank, bucket)| bucket.head(rank, allowed))
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
                .filter(|e| e.1 != GONE)
                .map(|e| e.1)
                .chain(b.firsts.values().map(|&(_, _, t)| t))
                .chain(b.more.values().map(|&(t, _)| t))
        })
    }

    /// Every waiter of the unnamed key with its key and tag, in queue
    /// order (tests).
    #[cfg(test)]
    pub(crate) fn iter(&self) -> impl Iterator<Item = (QueueKey, u32, u64)> + '_ {
        self.buckets.iter().flat_map(|(&rank, b)| {
            b.plain
                .iter()
                .filter(|e| e.1 != GONE)
                .map(move |&(seq, t, tag)| (key_of(rank, seq, NO_KEY), t, tag))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(deadline: Option<u64>, priority: i32, seq: u64) -> QueueKey {
        QueueKey::new(deadline, priority, seq, NO_KEY)
    }

    #[test]
    fn urgent_before_priority_before_submission_order() {
        let mut q = WaitQueue::default();
        q.push(plain(None, 0, 1), 1, 0);
        q.push(plain(None, 5, 2), 2, 0);
        q.push(plain(Some(900), 0, 3), 3, 0);
        q.push(plain(Some(100), -3, 4), 4, 0);
        q.push(plain(None, 0, 0), 5, 0);
        let order: Vec<u32> = q.iter().map(|(_, t, _)| t).collect();
        assert_eq!(order, vec![4, 3, 2, 5, 1]);
        assert_eq!(q.head().map(|h| h.1), Some(4));
    }

    #[test]
    fn removal_from_the_middle_and_reinsertion() {
        let mut q = WaitQueue::default();
        for seq in 0..5 {
            q.push(plain(None, 0, seq), seq as u32, 0);
        }
        assert!(q.remove(&plain(None, 0, 2), 2));
        assert!(!q.remove(&plain(None, 0, 2), 2));
        assert_eq!(q.len(), 4);
        q.push(plain(None, 0, 2), 7, 0);
        assert!(q.remove(&plain(None, 0, 0), 0));
        assert!(q.remove(&plain(None, 0, 1), 1));
        assert_eq!(q.head(), Some((plain(None, 0, 2), 7, 0)));
        assert!(q.remove(&plain(None, 0, 3), 3));
        assert!(q.remove(&plain(None, 0, 4), 4));
        assert!(q.remove(&plain(None, 0, 2), 7));
        assert!(q.is_empty());
        assert_eq!(q.head(), None);
        assert!(q.buckets.is_empty());
        q.push(plain(None, 0, 9), 9, 0);
        q.push(plain(None, 1, 10), 10, 0);
        assert_eq!(q.head(), Some((plain(None, 1, 10), 10, 0)));
        assert!(q.remove(&plain(None, 1, 10), 10));
        assert_eq!(q.head(), Some((plain(None, 0, 9), 9, 0)));
    }

    /// Keys 1 and 2 and the unnamed key in one rank: the head is the lowest
    /// tag (then `seq`); a key at its quota is passed over; a higher rank
    /// still comes first.
    #[test]
    fn the_head_is_the_lowest_start_tag_within_a_rank() {
        let mut q = WaitQueue::default();
        q.push(QueueKey::new(None, 0, 1, 1), 11, 0);
        q.push(QueueKey::new(None, 0, 2, 1), 12, 10);
        q.push(QueueKey::new(None, 0, 3, 2), 21, 5);
        q.push(plain(None, 0, 4), 31, 7);
        assert_eq!(q.head().map(|h| h.1), Some(11));
        assert!(q.remove(&QueueKey::new(None, 0, 1, 1), 11));
        assert_eq!(q.head().map(|h| h.1), Some(21), "key 1 is now at 10");
        assert_eq!(q.first_where(&|k| k != 2).map(|h| h.1), Some(31));
        assert_eq!(q.first_where(&|k| k == 1).map(|h| h.1), Some(12));
        q.push(QueueKey::new(None, 7, 5, 2), 22, 99);
        assert_eq!(
            q.head().map(|h| h.1),
            Some(22),
            "priority before fair share"
        );
        assert!(q.remove(&QueueKey::new(None, 7, 5, 2), 22));
        assert!(q.remove(&QueueKey::new(None, 0, 3, 2), 21));
        assert_eq!(q.head().map(|h| h.1), Some(31));
        for (key, task) in [(QueueKey::new(None, 0, 2, 1), 12), (plain(None, 0, 4), 31)] {
            assert!(q.remove(&key, task));
        }
        assert!(q.is_empty() && q.buckets.is_empty() && q.head().is_none());
    }

    /// A key's later waiters in one bucket follow its first in `seq`
    /// order, whether they leave from the middle or one waits again before
    /// the first.
    #[test]
    fn a_keys_waiters_follow_its_first_in_submission_order() {
        let mut q = WaitQueue::default();
        let key = |seq| QueueKey::new(None, 0, seq, 1);
        q.push(key(2), 2, 20);
        q.push(key(3), 3, 30);
        q.push(key(4), 4, 40);
        q.push(QueueKey::new(None, 0, 5, 2), 5, 25);
        assert!(q.remove(&key(3), 3), "from the middle");
        assert!(!q.remove(&key(3), 3));
        q.push(key(1), 1, 10);
        assert_eq!(q.head().map(|h| h.1), Some(1), "waiting again first");
        let mut order = Vec::new();
        while let Some((k, t, _)) = q.head() {
            order.push(t);
            assert!(q.remove(&k, t));
        }
        assert_eq!(order, [1, 2, 5, 4]);
        assert!(q.is_empty() && q.buckets.is_empty());
    }

    /// A task of the unnamed key waiting again at its old place gets a tag
    /// between its neighbours', so the key's tags rise with `seq`.
    #[test]
    fn a_retry_at_its_old_place_gets_a_tag_between_its_neighbours() {
        let mut q = WaitQueue::default();
        q.push(plain(None, 0, 1), 1, 10);
        q.push(plain(None, 0, 5), 5, 50);
        assert_eq!(q.push(plain(None, 0, 3), 3, 90), 50);
        assert_eq!(q.push(plain(None, 0, 2), 2, 0), 10);
        assert_eq!(q.push(plain(None, 0, 0), 9, 70), 10);
        let tags: Vec<u64> = q.iter().map(|e| e.2).collect();
        assert_eq!(tags, [10, 10, 10, 50, 50]);
        assert_eq!(q.head().map(|h| h.1), Some(9));
    }
}
