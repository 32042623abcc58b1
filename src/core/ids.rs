//! The index from [`TaskId`] to a task's slab slot.
//!
//! Every event that names a task starts with this lookup, so it is on the
//! path of every placement decision. Shells hand out ids that mostly rise
//! (the embedded scheduler counts up; the server uses the submit stream's
//! sequence), so most live ids fall in one window: a deque of slots indexed
//! by `id - base` costs one cache miss per lookup and 4 bytes per id, where
//! a hash map costs two misses and 16–32 bytes.
//!
//! Ids that do not fit the window go to a hash map beside it:
//!
//! * an id below `base`, or more than [`MAX_GAP`] past the window's end
//!   (the window never pads a large gap);
//! * ids still live when the window grows sparse: once it holds more than
//!   four times as many slots as live ids (a few old tasks, say with a
//!   fixed start next week, pin its front), the front is moved into the map
//!   until the window is at most half empty, so memory stays proportional
//!   to live tasks. Each moved or dropped slot was paid for by the insert
//!   that made it, so the cost is amortized O(1).
//!
//! The front of the window is always live (emptied slots at the front are
//! dropped at once), and an empty window forgets its base.

use std::collections::VecDeque;

use rustc_hash::FxHashMap;

use super::model::TaskId;

/// The largest run of unused ids the window pads to admit a new id.
const MAX_GAP: u64 = 64;
/// Windows shorter than this are never compacted.
#[cfg(not(test))]
const MIN_COMPACT: usize = 1024;
#[cfg(test)]
const MIN_COMPACT: usize = 16;
/// Marks an unused slot of the window.
const EMPTY: u32 = u32::MAX;

#[derive(Debug, Default)]
pub(crate) struct IdIndex {
    /// Id of `window[0]`.
    base: u64,
    /// Slab slot of ids `base..base + window.len()`, or [`EMPTY`].
    window: VecDeque<u32>,
    /// Live entries in `window`.
    in_window: usize,
    /// Live ids outside the window.
    others: FxHashMap<TaskId, u32>,
}

impl IdIndex {
    /// Room for `additional` more ids in the window.
    pub(crate) fn reserve(&mut self, additional: usize) {
        self.window.reserve(additional);
    }

    pub(crate) fn len(&self) -> usize {
        self.in_window + self.others.len()
    }

    fn offset(&self, id: TaskId) -> Option<usize> {
        let off = id.0.checked_sub(self.base)?;
        (off < self.window.len() as u64).then_some(off as usize)
    }

    pub(crate) fn get(&self, id: TaskId) -> Option<u32> {
        if let Some(off) = self.offset(id) {
            let slot = self.window[off];
            if slot != EMPTY {
                return Some(slot);
            }
        }
        if self.others.is_empty() {
            return None;
        }
        self.others.get(&id).copied()
    }

    pub(crate) fn contains(&self, id: TaskId) -> bool {
        self.get(id).is_some()
    }

    /// Adds `id`, which must not be present.
    pub(crate) fn insert(&mut self, id: TaskId, slot: u32) {
        debug_assert!(slot != EMPTY);
        debug_assert!(!self.contains(id), "id {id} indexed twice");
        if self.window.is_empty() {
            self.base = id.0;
        }
        match id.0.checked_sub(self.base) {
            Some(off) if off < self.window.len() as u64 => {
                // A slot padded earlier (or emptied behind the front).
                self.window[off as usize] = slot;
                self.in_window += 1;
            }
            Some(off) if off - self.window.len() as u64 <= MAX_GAP => {
                let gap = (off - self.window.len() as u64) as usize;
                self.window.extend(std::iter::repeat(EMPTY).take(gap));
                self.window.push_back(slot);
                self.in_window += 1;
            }
            _ => {
                self.others.insert(id, slot);
            }
        }
    }

    /// Removes `id`; returns its slot if it was present.
    pub(crate) fn remove(&mut self, id: TaskId) -> Option<u32> {
        if let Some(off) = self.offset(id) {
            let slot = std::mem::replace(&mut self.window[off], EMPTY);
            if slot != EMPTY {
                self.in_window -= 1;
                if off == 0 {
                    self.trim_front();
                }
                if self.window.len() >= MIN_COMPACT && self.window.len() > 4 * self.in_window {
                    self.compact();
                }
                return Some(slot);
            }
        }
        if self.others.is_empty() {
            return None;
        }
        self.others.remove(&id)
    }

    fn trim_front(&mut self) {
        while self.window.front() == Some(&EMPTY) {
            self.window.pop_front();
            self.base += 1;
        }
        if self.window.is_empty() {
            self.base = 0;
        }
    }

    /// Moves the front of a sparse window into `others` until at most half
    /// of the window is empty.
    fn compact(&mut self) {
        while self.window.len() > 2 * self.in_window {
            let Some(slot) = self.window.pop_front() else {
                break;
            };
            if slot != EMPTY {
                self.others.insert(TaskId(self.base), slot);
                self.in_window -= 1;
            }
            self.base += 1;
        }
        self.trim_front();
        self.window.shrink_to(self.window.len() * 2);
    }

    /// Every `(id, slot)`, in no particular order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (TaskId, u32)> + '_ {
        let base = self.base;
        self.window
            .iter()
            .enumerate()
            .filter(|&(_, &slot)| slot != EMPTY)
            .map(move |(off, &slot)| (TaskId(base + off as u64), slot))
            .chain(self.others.iter().map(|(&id, &slot)| (id, slot)))
    }

    /// Internal consistency, for `check_invariants`.
    pub(crate) fn check(&self) -> Result<(), String> {
        let live = self.window.iter().filter(|&&s| s != EMPTY).count();
        if live != self.in_window {
            return Err(format!(
                "id window counts {} live ids, holds {live}",
                self.in_window
            ));
        }
        if self.window.front() == Some(&EMPTY) {
            return Err("id window starts with an empty slot".into());
        }
        for &id in self.others.keys() {
            if self.offset(id).is_some_and(|off| self.window[off] != EMPTY) {
                return Err(format!("id {id} indexed twice"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[test]
    fn rising_ids_stay_in_the_window() {
        let mut ix = IdIndex::default();
        for i in 0..10_000u64 {
            ix.insert(TaskId(100 + i), i as u32);
        }
        assert!(ix.others.is_empty());
        assert_eq!(ix.get(TaskId(150)), Some(50));
        assert_eq!(ix.remove(TaskId(100)), Some(0));
        assert_eq!(ix.base, 101);
        assert_eq!(ix.get(TaskId(100)), None);
        ix.check().unwrap();
    }

    #[test]
    fn a_straggler_does_not_pin_the_window() {
        let mut ix = IdIndex::default();
        ix.insert(TaskId(0), 0);
        for round in 0..100u64 {
            for i in 1..=1000u64 {
                ix.insert(TaskId(round * 1000 + i), 1);
            }
            for i in 1..=1000u64 {
                ix.remove(TaskId(round * 1000 + i));
            }
        }
        assert_eq!(ix.len(), 1);
        assert!(ix.window.len() < 2 * MIN_COMPACT, "{}", ix.window.len());
        assert_eq!(ix.get(TaskId(0)), Some(0));
        ix.check().unwrap();
    }

    proptest! {
        /// The index answers like a hash map, whatever the order of ids.
        #[test]
        fn behaves_like_a_map(ops in prop::collection::vec((0u8..4, 0u64..1000), 1..1000)) {
            let mut ix = IdIndex::default();
            let mut model: HashMap<u64, u32> = HashMap::new();
            let mut next = 0u64;
            for (i, (op, x)) in ops.into_iter().enumerate() {
                let id = match op {
                    // Mostly rising ids, as shells hand out.
                    0 | 1 => { next += 1 + x % 3; next }
                    // Any id at all.
                    _ => x * 7,
                };
                if op == 3 || model.contains_key(&id) {
                    prop_assert_eq!(ix.remove(TaskId(id)), model.remove(&id));
                } else {
                    ix.insert(TaskId(id), i as u32);
                    model.insert(id, i as u32);
                }
                prop_assert_eq!(ix.len(), model.len());
                prop_assert_eq!(ix.get(TaskId(x)), model.get(&x).copied());
                prop_assert!(ix.check().is_ok(), "{:?}", ix.check());
            }
            let mut all: Vec<(u64, u32)> = ix.iter().map(|(id, s)| (id.0, s)).collect();
            all.sort_unstable();
            let mut want: Vec<(u64, u32)> = model.into_iter().collect();
            want.sort_unstable();
            prop_assert_eq!(all, want);
        }
    }
}
