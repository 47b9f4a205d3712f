//! The lock-free ready queue: one `SegQueue` per priority level, scanned from the highest,
//! FIFO within a level (the upstream order). Any number of threads may push and pop.

use crate::{Monotask, PRIORITY_LEVELS};
use crossbeam_queue::SegQueue;

/// Multi-producer multi-consumer priority queue of monotasks.
#[derive(Debug)]
pub struct ReadyQueue {
    levels: Vec<SegQueue<Monotask>>,
}

impl Default for ReadyQueue {
    fn default() -> Self {
        Self::new()
    }
}

impl ReadyQueue {
    /// An empty queue with [`PRIORITY_LEVELS`] levels.
    pub fn new() -> Self {
        Self {
            levels: (0..PRIORITY_LEVELS).map(|_| SegQueue::new()).collect(),
        }
    }

    /// Appends at the monotask's priority level (clamped to the highest level).
    pub fn push(&self, m: Monotask) {
        let l = (m.priority as usize).min(PRIORITY_LEVELS - 1);
        self.levels[l].push(m);
    }

    /// Pops the oldest monotask of the highest non-empty level.
    pub fn pop(&self) -> Option<Monotask> {
        self.levels.iter().rev().find_map(|q| q.pop())
    }

    /// Pops the oldest monotask of exactly `level`.
    pub fn pop_level(&self, level: usize) -> Option<Monotask> {
        self.levels.get(level).and_then(|q| q.pop())
    }

    /// Highest non-empty level (a snapshot: other threads may change it at once).
    pub fn highest_level(&self) -> Option<usize> {
        (0..PRIORITY_LEVELS)
            .rev()
            .find(|&l| !self.levels[l].is_empty())
    }

    /// Monotasks queued (a snapshot).
    pub fn len(&self) -> usize {
        self.levels.iter().map(|q| q.len()).sum()
    }

    /// Whether nothing is queued (a snapshot).
    pub fn is_empty(&self) -> bool {
        self.levels.iter().all(|q| q.is_empty())
    }
}
