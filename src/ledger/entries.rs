//! Live entries by id: a window over rising ids with a map beside it for
//! the ids that fall outside (see [`Entries`]).

use std::collections::VecDeque;

use rustc_hash::FxHashMap;

use crate::core::TaskId;

/// Live entries by id. The scheduler hands out ids in order and most tasks
/// finish roughly in order, so live ids mostly fall in a window
/// `[base, base + window.len())`: a deque indexed by `id - base`, with no
/// hashing and 8 bytes of overhead per entry. When finished tasks leave the
/// window more than half empty (a long-running task holds its front), the
/// oldest entries move to a map, so the window never keeps finished tasks
/// alive for long.
pub(crate) struct Entries<T> {
    base: u64,
    window: VecDeque<Option<T>>,
    in_window: usize,
    far: FxHashMap<TaskId, T>,
    /// No id above this is in `far`: a new id (past the window, the usual
    /// miss) costs no hash probe.
    far_max: u64,
}

impl<T> Default for Entries<T> {
    fn default() -> Self {
        Entries {
            base: 0,
            window: VecDeque::new(),
            in_window: 0,
            far: FxHashMap::default(),
            far_max: 0,
        }
    }
}

impl<T> Entries<T> {
    /// Room for `additional` more entries in the window.
    pub(crate) fn reserve(&mut self, additional: usize) {
        self.window.reserve(additional);
    }

    /// Adds the entry of a new task; ids only grow.
    pub(crate) fn insert(&mut self, id: TaskId, entry: T) {
        if self.window.is_empty() {
            self.base = id.0;
        }
        let Some(at) = id.0.checked_sub(self.base) else {
            self.put_far(id, entry);
            return;
        };
        let at = at as usize;
        while self.window.len() < at {
            self.window.push_back(None);
        }
        if at < self.window.len() {
            // An id below the window's end: not from the counter.
            match &mut self.window[at] {
                Some(_) => {
                    self.put_far(id, entry);
                }
                slot => {
                    *slot = Some(entry);
                    self.in_window += 1;
                }
            }
            return;
        }
        self.window.push_back(Some(entry));
        self.in_window += 1;
    }

    fn put_far(&mut self, id: TaskId, entry: T) {
        self.far_max = self.far_max.max(id.0);
        self.far.insert(id, entry);
    }

    fn may_be_far(&self, id: TaskId) -> bool {
        id.0 <= self.far_max && !self.far.is_empty()
    }

    fn index(&self, id: TaskId) -> Option<usize> {
        let at = usize::try_from(id.0.checked_sub(self.base)?).ok()?;
        (at < self.window.len() && self.window[at].is_some()).then_some(at)
    }

    pub(crate) fn get(&self, id: TaskId) -> Option<&T> {
        match self.index(id) {
            Some(at) => self.window[at].as_ref(),
            None if !self.may_be_far(id) => None,
            None => self.far.get(&id),
        }
    }

    pub(crate) fn get_mut(&mut self, id: TaskId) -> Option<&mut T> {
        match self.index(id) {
            Some(at) => self.window[at].as_mut(),
            None if !self.may_be_far(id) => None,
            None => self.far.get_mut(&id),
        }
    }

    /// The ids of the newest `limit` live entries, highest first. The
    /// window is at least half full (see `remove`), so this reads about
    /// `2 * limit` of its slots; the far map holds the few old entries.
    pub(crate) fn newest(&self, limit: usize) -> Vec<TaskId> {
        let mut ids: Vec<TaskId> = self
            .window
            .iter()
            .enumerate()
            .rev()
            .filter(|(_, e)| e.is_some())
            .take(limit)
            .map(|(at, _)| TaskId(self.base + at as u64))
            .collect();
        ids.extend(self.far.keys().copied());
        ids.sort_unstable_by(|a, b| b.cmp(a));
        ids.truncate(limit);
        ids
    }

    pub(crate) fn remove(&mut self, id: TaskId) -> Option<T> {
        let Some(at) = self.index(id) else {
            if !self.may_be_far(id) {
                return None;
            }
            return self.far.remove(&id);
        };
        self.in_window -= 1;
        let entry = self.window[at].take();
        while self.window.front().is_some_and(Option::is_none) {
            self.window.pop_front();
            self.base += 1;
        }
        while self.window.len() > 64 && self.in_window * 2 < self.window.len() {
            if let Some(Some(old)) = self.window.pop_front() {
                self.in_window -= 1;
                self.put_far(TaskId(self.base), old);
            }
            self.base += 1;
        }
        entry
    }
}
