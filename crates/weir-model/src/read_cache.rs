//! The clone-aware read cache's decisions, shared by the simulator's array (its
//! `clone_cache`) and `weir serve`'s thin volumes: one model, two clocks.
//!
//! Keys are *physical* block addresses chosen by the caller (an array block, or
//! a thin layer's slot), so a golden image's block read on behalf of any number
//! of clones is one key: cached once, and read from the backing store once even
//! when many clones miss on it at the same moment (a miss already being read
//! makes the others wait for that read instead of issuing their own, as a
//! controller merges misses in flight). The model holds no data and no clock:
//! callers ask [`ReadCache::lookup`], read what it calls a miss, then report
//! [`ReadCache::fill`] (or [`ReadCache::abort`] on an error) and drop the data of
//! the keys it says were evicted.

use serde::Serialize;

use crate::block_cache::{BlockCache, CachePolicy, FastMap};

/// What [`ReadCache::lookup`] decided for one key.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// Resident: serve it from the cache.
    Hit,
    /// Being read by reader `.0`: wait for that read.
    InFlight(u32),
    /// Not resident: this reader reads it, then calls `fill`.
    Miss,
}

/// Counters of a [`ReadCache`].
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ReadCacheStats {
    pub lookups: u64,
    pub hits: u64,
    /// Misses merged into a read already in flight.
    pub merged: u64,
    pub misses: u64,
    pub evictions: u64,
    pub resident: u64,
    pub in_flight: u64,
}

#[derive(Clone, Debug)]
pub struct ReadCache {
    index: BlockCache,
    /// Keys being read, → the reader reading them.
    inflight: FastMap<u128, u32>,
    /// Keys each reader (by id) has in `inflight` (allocations reused).
    owned: Vec<Vec<u128>>,
    stats: ReadCacheStats,
}

impl ReadCache {
    /// `capacity` blocks (0: nothing is ever resident, misses are still merged).
    pub fn new(capacity: u32, policy: CachePolicy) -> ReadCache {
        ReadCache {
            index: BlockCache::new(capacity, policy),
            inflight: FastMap::default(),
            owned: Vec::new(),
            stats: ReadCacheStats::default(),
        }
    }

    pub fn stats(&self) -> ReadCacheStats {
        ReadCacheStats {
            resident: self.index.len() as u64,
            in_flight: self.inflight.len() as u64,
            ..self.stats
        }
    }

    pub fn capacity(&self) -> u32 {
        self.index.capacity()
    }

    /// Whether `key` is resident now (an access: refreshes its recency).
    pub fn touch(&mut self, key: u128) -> bool {
        self.index.touch(key)
    }

    /// Looks `key` up for `reader` (a small id; a reader's misses are filled or
    /// aborted together). A miss registers `reader` as the one reading the key.
    pub fn lookup(&mut self, key: u128, reader: u32) -> Lookup {
        self.stats.lookups += 1;
        if !self.inflight.is_empty()
            && let Some(&r) = self.inflight.get(&key)
        {
            self.stats.merged += 1;
            return Lookup::InFlight(r);
        }
        if self.index.touch(key) {
            self.stats.hits += 1;
            return Lookup::Hit;
        }
        self.stats.misses += 1;
        self.inflight.insert(key, reader);
        if self.owned.len() <= reader as usize {
            self.owned.resize_with(reader as usize + 1, Vec::new);
        }
        self.owned[reader as usize].push(key);
        Lookup::Miss
    }

    /// `reader`'s reads finished: its keys become resident. Calls `evicted` with
    /// each key that left to make room (drop its data).
    pub fn fill(&mut self, reader: u32, mut evicted: impl FnMut(u128)) {
        let Some(keys) = self.owned.get_mut(reader as usize) else {
            return;
        };
        let mut keys = std::mem::take(keys);
        for &key in &keys {
            if self.inflight.get(&key) == Some(&reader) {
                self.inflight.remove(&key);
                if !self.index.contains(key)
                    && let Some(old) = self.index.insert(key)
                {
                    self.stats.evictions += 1;
                    evicted(old);
                }
            }
        }
        keys.clear();
        self.owned[reader as usize] = keys;
    }

    /// `reader`'s reads failed: nothing becomes resident; waiters read themselves.
    pub fn abort(&mut self, reader: u32) {
        let Some(keys) = self.owned.get_mut(reader as usize) else {
            return;
        };
        for key in keys.drain(..) {
            if self.inflight.get(&key) == Some(&reader) {
                self.inflight.remove(&key);
            }
        }
    }

    /// Makes `key` resident now (a write's data). Calls `evicted` as `fill` does.
    pub fn insert(&mut self, key: u128, mut evicted: impl FnMut(u128)) {
        if let Some(old) = self.index.insert(key) {
            self.stats.evictions += 1;
            evicted(old);
        }
    }

    /// Drops `key` (its data changed or its block was freed).
    pub fn invalidate(&mut self, key: u128) -> bool {
        self.index.remove(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concurrent_misses_on_one_key_read_once() {
        let mut c = ReadCache::new(4, CachePolicy::Lru);
        assert_eq!(c.lookup(7, 0), Lookup::Miss);
        assert_eq!(c.lookup(7, 1), Lookup::InFlight(0));
        assert_eq!(c.lookup(7, 2), Lookup::InFlight(0));
        c.fill(0, |_| panic!("nothing to evict"));
        assert_eq!(c.lookup(7, 1), Lookup::Hit);
        let s = c.stats();
        assert_eq!((s.misses, s.merged, s.hits, s.resident), (1, 2, 1, 1));
    }

    #[test]
    fn fill_evicts_and_abort_leaves_nothing() {
        let mut c = ReadCache::new(2, CachePolicy::Lru);
        for k in 0..3 {
            assert_eq!(c.lookup(k, 0), Lookup::Miss);
        }
        let mut out = Vec::new();
        c.fill(0, |k| out.push(k));
        assert_eq!(out, vec![0]);
        assert_eq!(c.lookup(9, 3), Lookup::Miss);
        c.abort(3);
        assert_eq!(c.lookup(9, 4), Lookup::Miss);
        assert_eq!(c.stats().evictions, 1);
    }
}
