//! Waiters of one required-label set, in urgency order.
//!
//! The order inside a queue is SPEC §2 rule 5 (a) then (c): an urgent task
//! (its deadline is within the pool's urgency window) comes before every
//! non-urgent one, earliest deadline first; otherwise higher priority first;
//! then submission order. Rule 5 (b), "need", compares heads of *different*
//! queues and lives in `placement.rs`.

use std::cmp::Reverse;
use std::collections::{BTreeMap, VecDeque};

/// The position of a waiter in its queue. Smaller runs first.
///
/// `urgency` is the deadline for an urgent task and `u64::MAX` otherwise, so
/// urgent tasks sort first, earliest deadline first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct QueueKey {
    pub urgency: u64,
    pub priority: Reverse<i32>,
    pub seq: u64,
}

impl QueueKey {
    pub(crate) fn new(urgent_deadline: Option<u64>, priority: i32, seq: u64) -> QueueKey {
        QueueKey {
            urgency: urgent_deadline.unwrap_or(u64::MAX),
            priority: Reverse(priority),
            seq,
        }
    }

    /// Equal on rule 5 (a): same urgency class and deadline, same priority.
    pub(crate) fn same_urgency(&self, other: &QueueKey) -> bool {
        self.urgency == other.urgency && self.priority == other.priority
    }
}

/// Rule 5 (a) rank of a bucket: `(urgency, priority)` of [`QueueKey`].
type Rank = (u64, Reverse<i32>);

/// Marks a removed entry inside a bucket (see [`WaitQueue`]).
const GONE: u32 = u32::MAX;

/// Waiting tasks (slab indices) of one required-label set.
///
/// Waiters are kept in buckets of equal rule 5 (a) rank — `(urgency,
/// priority)` — each a deque sorted by `seq`. A new task has the largest
/// `seq` so far and goes to the back of its bucket in O(1); the head is the
/// front of the first bucket. A task that waits again after a failed
/// attempt keeps its old `seq` and is inserted at its sorted place. A waiter
/// removed from the middle of a bucket is only marked [`GONE`] (found by
/// binary search on `seq`); marks are dropped once they reach either end,
/// so the front and back of every bucket are always live.
///
/// The head is cached: a freed slot compares the heads of several queues,
/// and reading them must not walk trees and deques spread over memory.
#[derive(Default, Debug)]
pub(crate) struct WaitQueue {
    head: Option<(QueueKey, u32)>,
    len: usize,
    buckets: BTreeMap<Rank, VecDeque<(u64, u32)>>,
}

impl WaitQueue {
    pub(crate) fn push(&mut self, key: QueueKey, task: u32) {
        if self.head.map_or(true, |(head, _)| key < head) {
            self.head = Some((key, task));
        }
        let bucket = self.buckets.entry((key.urgency, key.priority)).or_default();
        self.len += 1;
        match bucket.back() {
            None => bucket.push_back((key.seq, task)),
            Some(&(last, _)) if last < key.seq => bucket.push_back((key.seq, task)),
            Some(_) => match bucket.binary_search_by_key(&key.seq, |&(s, _)| s) {
                Ok(i) => {
                    debug_assert_eq!(bucket[i].1, GONE, "queue key reused");
                    bucket[i].1 = task;
                }
                Err(i) => bucket.insert(i, (key.seq, task)),
            },
        }
    }

    /// Removes `task`, queued under `key`. Returns whether it was there.
    pub(crate) fn remove(&mut self, key: &QueueKey, task: u32) -> bool {
        if self.head == Some((*key, task)) {
            self.pop_head();
            return true;
        }
        let rank = (key.urgency, key.priority);
        let Some(bucket) = self.buckets.get_mut(&rank) else {
            return false;
        };
        let found = if bucket.front() == Some(&(key.seq, task)) {
            bucket.pop_front();
            true
        } else if bucket.back() == Some(&(key.seq, task)) {
            bucket.pop_back();
            true
        } else {
            match bucket.binary_search_by_key(&key.seq, |&(s, _)| s) {
                Ok(i) if bucket[i].1 == task => {
                    bucket[i].1 = GONE;
                    true
                }
                _ => false,
            }
        };
        if !found {
            return false;
        }
        self.len -= 1;
        while bucket.front().is_some_and(|&(_, t)| t == GONE) {
            bucket.pop_front();
        }
        while bucket.back().is_some_and(|&(_, t)| t == GONE) {
            bucket.pop_back();
        }
        if bucket.is_empty() {
            self.buckets.remove(&rank);
        }
        if self.head == Some((*key, task)) {
            self.head = self.first();
        }
        true
    }

    /// Removes the head (what a freed slot usually takes): the front of
    /// the first bucket, found without a search, and the next head read
    /// from the same bucket.
    fn pop_head(&mut self) {
        let Some(mut first) = self.buckets.first_entry() else {
            return;
        };
        let (urgency, priority) = *first.key();
        let bucket = first.get_mut();
        bucket.pop_front();
        self.len -= 1;
        while bucket.front().is_some_and(|&(_, t)| t == GONE) {
            bucket.pop_front();
        }
        self.head = match bucket.front() {
            Some(&(seq, task)) => Some((
                QueueKey {
                    urgency,
                    priority,
                    seq,
                },
                task,
            )),
            None => {
                first.remove();
                self.first()
            }
        };
    }

    pub(crate) fn head(&self) -> Option<(QueueKey, u32)> {
        self.head
    }

    fn first(&self) -> Option<(QueueKey, u32)> {
        let (&(urgency, priority), bucket) = self.buckets.first_key_value()?;
        let &(seq, task) = bucket.front()?;
        Some((
            QueueKey {
                urgency,
                priority,
                seq,
            },
            task,
        ))
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[cfg(test)]
    pub(crate) fn iter(&self) -> impl Iterator<Item = (QueueKey, u32)> + '_ {
        self.buckets.iter().flat_map(|(&(urgency, priority), b)| {
            b.iter().filter(|&&(_, t)| t != GONE).map(move |&(seq, t)| {
                (
                    QueueKey {
                        urgency,
                        priority,
                        seq,
                    },
                    t,
                )
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urgent_before_priority_before_submission_order() {
        let mut q = WaitQueue::default();
        q.push(QueueKey::new(None, 0, 1), 1);
        q.push(QueueKey::new(None, 5, 2), 2);
        q.push(QueueKey::new(Some(900), 0, 3), 3);
        q.push(QueueKey::new(Some(100), -3, 4), 4);
        q.push(QueueKey::new(None, 0, 0), 5);
        let order: Vec<u32> = q.iter().map(|(_, t)| t).collect();
        assert_eq!(order, vec![4, 3, 2, 5, 1]);
    }

    #[test]
    fn removal_from_the_middle_and_reinsertion() {
        let mut q = WaitQueue::default();
        for seq in 0..5 {
            q.push(QueueKey::new(None, 0, seq), seq as u32);
        }
        assert!(q.remove(&QueueKey::new(None, 0, 2), 2));
        assert!(!q.remove(&QueueKey::new(None, 0, 2), 2));
        assert_eq!(q.len(), 4);
        q.push(QueueKey::new(None, 0, 2), 7);
        assert!(q.remove(&QueueKey::new(None, 0, 0), 0));
        assert!(q.remove(&QueueKey::new(None, 0, 1), 1));
        assert_eq!(q.head(), Some((QueueKey::new(None, 0, 2), 7)));
        assert!(q.remove(&QueueKey::new(None, 0, 3), 3));
        assert!(q.remove(&QueueKey::new(None, 0, 4), 4));
        assert!(q.remove(&QueueKey::new(None, 0, 2), 7));
        assert!(q.is_empty());
        assert_eq!(q.head(), None);
        assert!(q.buckets.is_empty());
        q.push(QueueKey::new(None, 0, 9), 9);
        q.push(QueueKey::new(None, 1, 10), 10);
        assert_eq!(q.head(), Some((QueueKey::new(None, 1, 10), 10)));
        assert!(q.remove(&QueueKey::new(None, 1, 10), 10));
        assert_eq!(q.head(), Some((QueueKey::new(None, 0, 9), 9)));
    }
}
