//! An indexed binary min-heap over volume slots: at most one entry per slot, with
//! O(log n) insert, key update and removal, and no allocation once the backing
//! vectors have grown to the number of slots.

const ABSENT: u32 = u32::MAX;

/// Min-heap of `(key, slot)`; ties on `key` are broken by the smaller slot so the
/// order is fully deterministic.
#[derive(Clone, Debug, Default)]
pub(crate) struct IndexedHeap {
    items: Vec<(u128, u32)>,
    /// `pos[slot]` is the slot's index in `items`, or `ABSENT`.
    pos: Vec<u32>,
}

impl IndexedHeap {
    /// Makes room for slots `0..slots`.
    pub(crate) fn ensure_slots(&mut self, slots: usize) {
        if self.pos.len() < slots {
            self.pos.resize(slots, ABSENT);
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.items.len()
    }

    pub(crate) fn peek(&self) -> Option<(u128, u32)> {
        self.items.first().copied()
    }

    #[cfg(test)]
    pub(crate) fn contains(&self, slot: u32) -> bool {
        self.pos.get(slot as usize).is_some_and(|&p| p != ABSENT)
    }

    /// Inserts `slot` with `key`, or moves it to `key` if already present.
    pub(crate) fn set(&mut self, slot: u32, key: u128) {
        self.ensure_slots(slot as usize + 1);
        let at = self.pos[slot as usize];
        if at == ABSENT {
            let i = self.items.len();
            self.items.push((key, slot));
            self.pos[slot as usize] = i as u32;
            self.sift_up(i);
        } else {
            let i = at as usize;
            let old = self.items[i].0;
            self.items[i].0 = key;
            if key < old {
                self.sift_up(i);
            } else if key > old {
                self.sift_down(i);
            }
        }
    }

    /// Removes `slot` if present.
    pub(crate) fn remove(&mut self, slot: u32) {
        let Some(&at) = self.pos.get(slot as usize) else {
            return;
        };
        if at == ABSENT {
            return;
        }
        self.pos[slot as usize] = ABSENT;
        let i = at as usize;
        let Some(last) = self.items.pop() else {
            return;
        };
        if i < self.items.len() {
            self.items[i] = last;
            self.pos[last.1 as usize] = i as u32;
            self.sift_up(i);
            self.sift_down(i);
        }
    }

    pub(crate) fn pop(&mut self) -> Option<(u128, u32)> {
        let top = self.peek()?;
        self.remove(top.1);
        Some(top)
    }

    fn sift_up(&mut self, mut i: usize) {
        let item = self.items[i];
        while i > 0 {
            let parent = (i - 1) / 2;
            if self.items[parent] <= item {
                break;
            }
            self.items[i] = self.items[parent];
            self.pos[self.items[i].1 as usize] = i as u32;
            i = parent;
        }
        self.items[i] = item;
        self.pos[item.1 as usize] = i as u32;
    }

    fn sift_down(&mut self, mut i: usize) {
        let n = self.items.len();
        let item = self.items[i];
        loop {
            let left = 2 * i + 1;
            if left >= n {
                break;
            }
            let right = left + 1;
            let child = if right < n && self.items[right] < self.items[left] {
                right
            } else {
                left
            };
            if self.items[child] >= item {
                break;
            }
            self.items[i] = self.items[child];
            self.pos[self.items[i].1 as usize] = i as u32;
            i = child;
        }
        self.items[i] = item;
        self.pos[item.1 as usize] = i as u32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn matches_a_sorted_reference_under_random_operations() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let mut heap = IndexedHeap::default();
        let mut reference: std::collections::BTreeMap<u32, u128> = Default::default();
        for _ in 0..20_000 {
            let slot = rng.random_range(0..64u32);
            match rng.random_range(0..4) {
                0 | 1 => {
                    let key = rng.random_range(0..1000u128);
                    heap.set(slot, key);
                    reference.insert(slot, key);
                }
                2 => {
                    heap.remove(slot);
                    reference.remove(&slot);
                }
                _ => {
                    let expected = reference.iter().map(|(&s, &k)| (k, s)).min();
                    assert_eq!(heap.pop(), expected);
                    if let Some((_, s)) = expected {
                        reference.remove(&s);
                    }
                }
            }
            assert_eq!(heap.len(), reference.len());
            assert_eq!(heap.contains(slot), reference.contains_key(&slot));
            assert_eq!(heap.peek(), reference.iter().map(|(&s, &k)| (k, s)).min());
        }
    }
}
