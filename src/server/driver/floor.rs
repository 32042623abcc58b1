//! The submit-stream sequences of unfinished tasks, for the purge floor:
//! the oldest of them bounds what the stream may drop.

use std::collections::{BTreeSet, VecDeque};

/// Sequences of tasks that were live when added, oldest first. A task's
/// end removes nothing here: [`LiveSeqs::first`] skips sequences no longer
/// live (asking the ledger), and a sweep now and then drops the rest. Tasks
/// come in stream order, so adding is a push at the back, not an ordered
/// insert per task (a `BTreeSet<u64>` was a sixth of admitting a task at a
/// takeover).
#[derive(Default)]
pub(super) struct LiveSeqs {
    /// Rising sequences.
    rising: VecDeque<u64>,
    /// Those that came below the back of `rising` (out of stream order).
    odd: BTreeSet<u64>,
    /// The length after the last sweep: the next sweep waits until as
    /// many more came again, so each costs O(1) per sequence added.
    swept_to: usize,
}

/// Added sequences beyond those live before a sweep is worth its scan.
const SWEEP_SLACK: usize = 1024;

impl LiveSeqs {
    /// `seq`'s task is live now; `live` says which still are (for a sweep).
    pub(super) fn insert(&mut self, seq: u64, live: impl Fn(u64) -> bool) {
        match self.rising.back() {
            Some(&back) if seq <= back => {
                self.odd.insert(seq);
            }
            _ => self.rising.push_back(seq),
        }
        if self.rising.len() + self.odd.len() > 2 * self.swept_to + SWEEP_SLACK {
            self.rising.retain(|&s| live(s));
            self.odd.retain(|&s| live(s));
            self.swept_to = self.rising.len() + self.odd.len();
        }
    }

    /// The oldest sequence whose task is live (`live` says so), dropping
    /// the older ones that are not.
    pub(super) fn first(&mut self, live: impl Fn(u64) -> bool) -> Option<u64> {
        while let Some(&front) = self.rising.front() {
            if live(front) {
                break;
            }
            self.rising.pop_front();
        }
        while let Some(&front) = self.odd.first() {
            if live(front) {
                break;
            }
            self.odd.pop_first();
        }
        match (self.rising.front(), self.odd.first()) {
            (Some(&a), Some(&b)) => Some(a.min(b)),
            (a, b) => a.or(b).copied(),
        }
    }

    #[cfg(test)]
    pub(super) fn held(&self) -> usize {
        self.rising.len() + self.odd.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::cell::RefCell;

    proptest! {
        /// The first live sequence is the oldest live one whatever order
        /// tasks come and end in, and what is held stays within twice the
        /// most tasks live at once, plus the slack.
        #[test]
        fn first_is_the_oldest_live_and_held_stays_bounded(
            ops in proptest::collection::vec((0u8..10, 0u64..5_000), 1..3_000)
        ) {
            let live: RefCell<BTreeSet<u64>> = RefCell::default();
            let mut seqs = LiveSeqs::default();
            let mut next = 10_000u64;
            let mut peak = 0usize;
            for (op, n) in ops {
                match op {
                    0..=5 => {
                        next += 1;
                        live.borrow_mut().insert(next);
                        seqs.insert(next, |s| live.borrow().contains(&s));
                    }
                    6 => {
                        if live.borrow_mut().insert(n) {
                            seqs.insert(n, |s| live.borrow().contains(&s));
                        }
                    }
                    _ => {
                        let held: Vec<u64> = live.borrow().iter().copied().collect();
                        if !held.is_empty() {
                            live.borrow_mut().remove(&held[n as usize % held.len()]);
                        }
                    }
                }
                peak = peak.max(live.borrow().len());
                let oldest = live.borrow().first().copied();
                prop_assert_eq!(seqs.first(|s| live.borrow().contains(&s)), oldest);
                prop_assert!(seqs.held() <= 2 * peak + SWEEP_SLACK + 1);
            }
        }
    }
}
