//! Block caches of the simulated stack (host flash read cache, array flash cache):
//! which blocks are cached, nothing else. Replacement is CLOCK (second chance), the
//! usual approximation of LRU in storage controllers.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Keys are already well mixed (or block numbers): a multiply is hash enough.
#[derive(Default)]
pub(crate) struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ *b as u64).wrapping_mul(0x0000_0100_0000_01B3);
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = (x ^ (x >> 29)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type KeyMap = HashMap<u64, u32, BuildHasherDefault<KeyHasher>>;

pub(crate) struct BlockCache {
    pub block_bytes: u64,
    capacity: usize,
    map: KeyMap,
    slots: Vec<(u64, bool)>,
    hand: usize,
    pub hits: u64,
    pub misses: u64,
}

impl BlockCache {
    pub(crate) fn new(size_bytes: u64, block_bytes: u64) -> BlockCache {
        let capacity = (size_bytes / block_bytes.max(1)).clamp(1, 1 << 28) as usize;
        BlockCache {
            block_bytes: block_bytes.max(4096),
            capacity,
            map: KeyMap::with_capacity_and_hasher(capacity.min(1 << 20), Default::default()),
            slots: Vec::with_capacity(capacity.min(1 << 20)),
            hand: 0,
            hits: 0,
            misses: 0,
        }
    }

    /// True when every key is cached (and marks them referenced).
    pub(crate) fn lookup(&mut self, keys: &[u64]) -> bool {
        let mut all = true;
        for k in keys {
            match self.map.get(k) {
                Some(&i) => self.slots[i as usize].1 = true,
                None => all = false,
            }
        }
        if all {
            self.hits += 1;
        } else {
            self.misses += 1;
        }
        all
    }

    pub(crate) fn insert(&mut self, keys: &[u64]) {
        for &k in keys {
            if let Some(&i) = self.map.get(&k) {
                self.slots[i as usize].1 = true;
                continue;
            }
            if self.slots.len() < self.capacity {
                self.map.insert(k, self.slots.len() as u32);
                self.slots.push((k, false));
                continue;
            }
            // CLOCK: skip (and clear) referenced slots.
            loop {
                let h = self.hand;
                self.hand = (self.hand + 1) % self.slots.len();
                if self.slots[h].1 {
                    self.slots[h].1 = false;
                } else {
                    self.map.remove(&self.slots[h].0);
                    self.slots[h] = (k, false);
                    self.map.insert(k, h as u32);
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hits_after_fill_and_evicts_at_capacity() {
        let mut c = BlockCache::new(4 * 65536, 65536);
        assert!(!c.lookup(&[1, 2]));
        c.insert(&[1, 2]);
        assert!(c.lookup(&[1, 2]));
        c.insert(&[3, 4, 5, 6]);
        // Capacity 4: some of 1..6 were evicted, 4 remain.
        let present = (1..=6).filter(|k| c.map.contains_key(k)).count();
        assert_eq!(present, 4);
        assert_eq!(c.hits, 1);
        assert_eq!(c.misses, 1);
    }
}
