//! Waiters of one required-label set, in urgency order.
//!
//! The order inside a queue is SPEC §2 rule 5 (a) then (c): an urgent task
//! (its deadline is within the pool's urgency window) comes before every
//! non-urgent one, earliest deadline first; otherwise higher priority first;
//! then submission order. Rule 5 (b), "need", compares heads of *different*
//! queues and lives in `placement.rs`.

use std::cmp::Reverse;
use std::collections::BTreeMap;

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

/// Waiting tasks (slab indices) of one required-label set.
#[derive(Default, Debug)]
pub(crate) struct WaitQueue {
    entries: BTreeMap<QueueKey, u32>,
}

impl WaitQueue {
    pub(crate) fn push(&mut self, key: QueueKey, task: u32) {
        let previous = self.entries.insert(key, task);
        debug_assert!(previous.is_none(), "queue key reused");
    }

    pub(crate) fn remove(&mut self, key: &QueueKey) -> Option<u32> {
        self.entries.remove(key)
    }

    pub(crate) fn head(&self) -> Option<(QueueKey, u32)> {
        self.entries.first_key_value().map(|(k, v)| (*k, *v))
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    #[cfg(test)]
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&QueueKey, &u32)> {
        self.entries.iter()
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
        let order: Vec<u32> = q.iter().map(|(_, t)| *t).collect();
        assert_eq!(order, vec![4, 3, 2, 5, 1]);
    }
}
