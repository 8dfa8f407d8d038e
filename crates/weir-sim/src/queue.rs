//! A priority queue for a handful of entries: a ring kept sorted, earliest first.
//!
//! The engine's I/O-path events (component completions, host wake-ups, ticks) number a
//! few at a time (≈ 5 on average in the VDI week, 7 in the engine benchmark). A new
//! entry is usually the latest, so it settles in one or two steps from the back, and
//! the earliest pops off the front: cheaper than a binary heap's sift, which moves
//! the hole through every level on each pop.
//! Entries must be totally ordered and distinct (the engine's carry a sequence
//! number): equal entries would pop in an unspecified order.

use std::collections::VecDeque;

pub(crate) struct SortedQueue<E: Ord + Copy> {
    /// Sorted ascending: the earliest entry is first.
    entries: VecDeque<E>,
}

impl<E: Ord + Copy> SortedQueue<E> {
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        SortedQueue {
            entries: VecDeque::with_capacity(capacity),
        }
    }

    pub(crate) fn push(&mut self, e: E) {
        // Insertion step from the back (no memmove call for a few entries).
        let mut i = self.entries.len();
        self.entries.push_back(e);
        while i > 0 && self.entries[i - 1] > e {
            self.entries[i] = self.entries[i - 1];
            i -= 1;
        }
        self.entries[i] = e;
    }

    pub(crate) fn peek(&self) -> Option<&E> {
        self.entries.front()
    }

    pub(crate) fn pop(&mut self) -> Option<E> {
        self.entries.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;

    #[test]
    fn pops_in_the_order_of_a_binary_heap() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let mut q = SortedQueue::with_capacity(4);
        let mut heap = BinaryHeap::new();
        let mut seq = 0u64;
        let mut largest = 0;
        for round in 0..20_000 {
            // Phases of growth (to ~100 entries) and of draining (to empty), with many
            // equal times.
            let growing = (round / 200) % 2 == 0;
            for _ in 0..rng.random_range(0..=if growing { 2 } else { 1 }) {
                seq += 1;
                let e = (rng.random_range(0..50u64), seq);
                q.push(e);
                heap.push(Reverse(e));
            }
            largest = largest.max(heap.len());
            if !growing || rng.random_range(0..2) == 0 {
                let want = heap.pop().map(|Reverse(e)| e);
                assert_eq!(q.peek().copied(), want);
                assert_eq!(q.pop(), want);
            }
        }
        assert!(largest > 50, "the queue grew to {largest} only");
        while let Some(Reverse(e)) = heap.pop() {
            assert_eq!(q.pop(), Some(e));
        }
        assert_eq!(q.pop(), None);
    }
}
