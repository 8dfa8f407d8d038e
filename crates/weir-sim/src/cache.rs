//! Request-level accounting around weir-model's block cache index
//! ([`weir_model::BlockCache`], LRU here) for the array's flash tier (`[array_cache]`:
//! clone-aware keys, write-back or write-through): it asks "is every block of this
//! request resident?" and counts one hit or miss per request. Which blocks are
//! resident and which leave first is weir-model's. (The hosts' flash read caches run
//! `weir serve`'s cache instead, weir-model's `FlashCache`: see `engine.rs`.)

use weir_model::{BlockCache as ModelCache, CachePolicy};

pub(crate) struct BlockCache {
    pub block_bytes: u64,
    index: ModelCache,
    pub hits: u64,
    pub misses: u64,
}

impl BlockCache {
    pub(crate) fn new(size_bytes: u64, block_bytes: u64) -> BlockCache {
        let block_bytes = block_bytes.max(4096);
        let capacity = (size_bytes / block_bytes).clamp(1, 1 << 28) as u32;
        BlockCache {
            block_bytes,
            // LRU: the replacement the simulator's caches always had (it used CLOCK,
            // LRU's usual approximation).
            index: ModelCache::new(capacity, CachePolicy::Lru),
            hits: 0,
            misses: 0,
        }
    }

    /// True when every key is resident (each resident key counts as an access).
    pub(crate) fn lookup(&mut self, keys: &[u64]) -> bool {
        let mut all = true;
        for &k in keys {
            all &= self.index.touch(k as u128);
        }
        if all {
            self.hits += 1;
        } else {
            self.misses += 1;
        }
        all
    }

    /// Starts loading the index memory a lookup of `key` reads first (a hint).
    pub(crate) fn prefetch(&self, key: u64) {
        self.index.prefetch(key as u128);
    }

    /// Makes every key resident (evicting the least recently used when full).
    pub(crate) fn insert(&mut self, keys: &[u64]) {
        for &k in keys {
            self.index.insert(k as u128);
        }
    }

    #[cfg(test)]
    fn resident(&self, key: u64) -> bool {
        self.index.contains(key as u128)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hits_after_fill_and_evicts_the_least_recent_at_capacity() {
        let mut c = BlockCache::new(4 * 65536, 65536);
        assert!(!c.lookup(&[1, 2]));
        c.insert(&[1, 2]);
        assert!(c.lookup(&[1, 2]));
        c.insert(&[3, 4]);
        // Full (capacity 4). Using 1 again makes 2 and 3 the least recent.
        assert!(c.lookup(&[1]));
        c.insert(&[5, 6]);
        let present: Vec<u64> = (1..=6).filter(|&k| c.resident(k)).collect();
        assert_eq!(present, vec![1, 4, 5, 6]);
        assert_eq!((c.hits, c.misses), (2, 1));
    }
}
