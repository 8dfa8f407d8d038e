//! A priority queue for a handful of entries: a vector kept sorted, earliest last.
//!
//! The engine's I/O-path events (component completions, host wake-ups, ticks) number
//! about ten at a time in the VDI week. Most of them are far off (drive completions
//! milliseconds away, the sampling tick, the end) while a new entry is usually near
//! (a link's or a processor's microseconds), so it belongs among the earliest: kept
//! in descending order, it settles a step or two from the back, and the earliest
//! pops off the back. (Ascending, with the insertion stepping from the back, a push
//! stepped past 8.5 of 10.4 entries on average in `mon-power-on/sata`.) Cheaper than
//! a binary heap's sift, which moves the hole through every level on each pop.
//! Entries must be totally ordered and distinct (the engine's carry a sequence
//! number): equal entries would pop in an unspecified order.
//!
//! Also [`QuadHeap`], for the many worker wake-ups.

pub(crate) struct SortedQueue<E: Ord + Copy> {
    /// Sorted descending: the earliest entry is the last.
    entries: Vec<E>,
}

impl<E: Ord + Copy> SortedQueue<E> {
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        SortedQueue {
            entries: Vec::with_capacity(capacity.max(4)),
        }
    }

    #[inline]
    pub(crate) fn push(&mut self, e: E) {
        self.entries.push(e);
        // Insertion step from the back, past the entries earlier than `e` (no
        // memmove call for a few entries).
        let live = &mut self.entries[..];
        let mut i = live.len() - 1;
        while i > 0 && live[i - 1] < e {
            live[i] = live[i - 1];
            i -= 1;
        }
        live[i] = e;
    }

    pub(crate) fn peek(&self) -> Option<&E> {
        self.entries.last()
    }

    pub(crate) fn pop(&mut self) -> Option<E> {
        self.entries.pop()
    }
}

/// A 4-ary min-heap: for the engine's worker wake-ups (thousands, each pushed and
/// popped once). Half the levels of a binary heap, and a node's four children share
/// one or two cache lines, so a pop's sift-down takes half the dependent loads of
/// `std`'s `BinaryHeap` (which also sifts each hole to the bottom and back up).
/// Entries must be totally ordered and distinct, as for [`SortedQueue`]: then the
/// order of pops is that of any other priority queue.
pub(crate) struct QuadHeap<E: Ord + Copy> {
    heap: Vec<E>,
}

impl<E: Ord + Copy> QuadHeap<E> {
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        QuadHeap {
            heap: Vec::with_capacity(capacity),
        }
    }

    pub(crate) fn push(&mut self, e: E) {
        let mut i = self.heap.len();
        self.heap.push(e);
        while i > 0 {
            let parent = (i - 1) / 4;
            if self.heap[parent] <= e {
                break;
            }
            self.heap[i] = self.heap[parent];
            i = parent;
        }
        self.heap[i] = e;
    }

    pub(crate) fn peek(&self) -> Option<&E> {
        self.heap.first()
    }

    pub(crate) fn pop(&mut self) -> Option<E> {
        let last = self.heap.pop()?;
        let n = self.heap.len();
        if n == 0 {
            return Some(last);
        }
        let top = self.heap[0];
        // Sift `last` down from the root.
        let mut i = 0;
        loop {
            let first = 4 * i + 1;
            if first >= n {
                break;
            }
            let end = (first + 4).min(n);
            let mut m = first;
            for c in first + 1..end {
                if self.heap[c] < self.heap[m] {
                    m = c;
                }
            }
            if self.heap[m] >= last {
                break;
            }
            self.heap[i] = self.heap[m];
            i = m;
        }
        self.heap[i] = last;
        Some(top)
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

    #[test]
    fn quad_heap_pops_in_the_order_of_a_binary_heap() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let mut q = QuadHeap::with_capacity(4);
        let mut heap = BinaryHeap::new();
        let mut seq = 0u64;
        for round in 0..50_000 {
            let growing = (round / 2000) % 2 == 0;
            for _ in 0..rng.random_range(0..=if growing { 2 } else { 1 }) {
                seq += 1;
                let e = (rng.random_range(0..1000u64), seq);
                q.push(e);
                heap.push(Reverse(e));
            }
            if !growing || rng.random_range(0..2) == 0 {
                let want = heap.pop().map(|Reverse(e)| e);
                assert_eq!(q.peek().copied(), want);
                assert_eq!(q.pop(), want);
            }
        }
        while let Some(Reverse(e)) = heap.pop() {
            assert_eq!(q.pop(), Some(e));
        }
        assert_eq!(q.pop(), None);
    }
}
