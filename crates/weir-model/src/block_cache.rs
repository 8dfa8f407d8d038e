//! A fixed-capacity block cache index (which blocks are resident, in which order they
//! leave), shared by the host flash cache, the clone-aware array cache and the hybrid
//! array's flash tier.
//!
//! Entries live in a slab (intrusive doubly linked lists) indexed by a hash map; both
//! grow with the resident set up to the capacity, so once the cache is full, inserts,
//! hits and evictions do not allocate. Memory: about 56 bytes per resident block.
//!
//! Two replacement policies:
//! * [`CachePolicy::Lru`]: least recently used leaves first (approximately: a block
//!   already among the most recent eighth of the cache is not moved on a hit).
//! * [`CachePolicy::Slru`] (default): segmented LRU, scan-resistant. A new block enters a
//!   *probation* segment; a second access moves it to the *protected* segment (at most
//!   80 % of the capacity; its overflow falls back to probation). Eviction takes the
//!   probation segment's LRU first, so a one-pass scan (backup, table scan) only
//!   churns probation and cannot flush the re-used working set.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

/// Replacement policy of a block cache.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CachePolicy {
    /// Plain least-recently-used.
    Lru,
    /// Segmented LRU (probation + protected), scan-resistant.
    #[default]
    Slru,
}

/// Multiplicative hasher for integer keys (SipHash costs more than the cache logic).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(26) ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    fn write_u128(&mut self, n: u128) {
        self.write_u64(n as u64);
        self.write_u64((n >> 64) as u64);
    }
}

pub(crate) type FastMap<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<KeyHasher>>;

const NIL: u32 = u32::MAX;
const FREE: u8 = 0;
const PROBATION: u8 = 1;
const PROTECTED: u8 = 2;

#[derive(Clone, Copy, Debug)]
struct Entry {
    key: u128,
    prev: u32,
    next: u32,
    /// Value of `protected_pushes` when last moved to the protected head.
    pushed_at: u32,
    list: u8,
}

#[derive(Clone, Copy, Debug)]
struct List {
    /// Most recently used.
    head: u32,
    /// Least recently used.
    tail: u32,
    len: u32,
}

impl List {
    const EMPTY: List = List {
        head: NIL,
        tail: NIL,
        len: 0,
    };
}

/// Fixed-capacity resident-set index with LRU or SLRU replacement. Keys are the
/// caller's (volume, block) encodings; the index keeps no data, only which keys are
/// resident and in which order they leave.
#[derive(Clone, Debug)]
pub struct BlockCache {
    entries: Vec<Entry>,
    map: FastMap<u128, u32>,
    /// Index 1: probation, 2: protected (index 0 unused).
    lists: [List; 3],
    free: Vec<u32>,
    capacity: u32,
    protected_cap: u32,
    policy: CachePolicy,
    /// Pushes to the protected head so far.
    protected_pushes: u32,
    /// An access to a protected entry pushed within the last `lazy_window` pushes
    /// leaves it in place (it is already among the most recent): saves the relinking
    /// memory traffic; recency error at most 1/8 of the capacity.
    lazy_window: u32,
}

impl BlockCache {
    /// `capacity` entries (0 is allowed: nothing is ever resident).
    pub fn new(capacity: u32, policy: CachePolicy) -> Self {
        // Tables grow with the resident set (a 785 GB cache of 4 KiB blocks would be
        // ~10 GB of index if reserved up front); once full, nothing allocates.
        let initial = capacity.min(1 << 16) as usize;
        let mut map = FastMap::default();
        map.reserve(initial);
        Self {
            entries: Vec::with_capacity(initial),
            map,
            lists: [List::EMPTY; 3],
            free: Vec::new(),
            capacity,
            protected_cap: (capacity as u64 * 4 / 5) as u32,
            policy,
            protected_pushes: 0,
            lazy_window: capacity / 8,
        }
    }

    /// Resident keys.
    pub fn len(&self) -> u32 {
        self.map.len() as u32
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Most keys resident at once.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    pub fn contains(&self, key: u128) -> bool {
        self.map.contains_key(&key)
    }

    /// Records an access; returns whether the key was resident.
    pub fn touch(&mut self, key: u128) -> bool {
        let Some(&i) = self.map.get(&key) else {
            return false;
        };
        self.access(i);
        true
    }

    /// Makes `key` resident (an access if it already is). Returns the evicted key.
    pub fn insert(&mut self, key: u128) -> Option<u128> {
        if let Some(&i) = self.map.get(&key) {
            self.access(i);
            return None;
        }
        if self.capacity == 0 {
            return None;
        }
        let mut evicted = None;
        let i = if let Some(i) = self.free.pop() {
            i
        } else if (self.entries.len() as u32) < self.capacity {
            self.entries.push(Entry {
                key,
                prev: NIL,
                next: NIL,
                pushed_at: 0,
                list: FREE,
            });
            (self.entries.len() - 1) as u32
        } else {
            let victim = self.victim();
            let old = self.entries[victim as usize].key;
            self.unlink(victim);
            self.map.remove(&old);
            evicted = Some(old);
            victim
        };
        self.entries[i as usize].key = key;
        let list = match self.policy {
            CachePolicy::Lru => PROTECTED,
            CachePolicy::Slru => PROBATION,
        };
        self.push_front(i, list);
        self.map.insert(key, i);
        evicted
    }

    /// Drops `key`; returns whether it was resident.
    pub fn remove(&mut self, key: u128) -> bool {
        let Some(i) = self.map.remove(&key) else {
            return false;
        };
        self.unlink(i);
        self.free.push(i);
        true
    }

    /// The key that would leave next (without removing it).
    pub fn peek_victim(&self) -> Option<u128> {
        if self.map.is_empty() {
            return None;
        }
        Some(self.entries[self.victim() as usize].key)
    }

    fn victim(&self) -> u32 {
        if self.lists[PROBATION as usize].tail != NIL {
            self.lists[PROBATION as usize].tail
        } else {
            self.lists[PROTECTED as usize].tail
        }
    }

    fn access(&mut self, i: u32) {
        let e = &self.entries[i as usize];
        let list = e.list;
        if list == PROTECTED && self.protected_pushes.wrapping_sub(e.pushed_at) < self.lazy_window {
            return;
        }
        self.unlink(i);
        self.push_front(i, PROTECTED);
        if list == PROBATION && self.lists[PROTECTED as usize].len > self.protected_cap.max(1) {
            // Protected overflow: its LRU gets a second chance in probation.
            let t = self.lists[PROTECTED as usize].tail;
            self.unlink(t);
            self.push_front(t, PROBATION);
        }
    }

    fn push_front(&mut self, i: u32, list: u8) {
        let l = &mut self.lists[list as usize];
        let old = l.head;
        l.head = i;
        if old == NIL {
            l.tail = i;
        }
        l.len += 1;
        if old != NIL {
            self.entries[old as usize].prev = i;
        }
        if list == PROTECTED {
            self.protected_pushes = self.protected_pushes.wrapping_add(1);
        }
        let pushes = self.protected_pushes;
        let e = &mut self.entries[i as usize];
        e.prev = NIL;
        e.next = old;
        e.list = list;
        e.pushed_at = pushes;
    }

    fn unlink(&mut self, i: u32) {
        let Entry {
            prev, next, list, ..
        } = self.entries[i as usize];
        if list == FREE {
            return;
        }
        if prev != NIL {
            self.entries[prev as usize].next = next;
        } else {
            self.lists[list as usize].head = next;
        }
        if next != NIL {
            self.entries[next as usize].prev = prev;
        } else {
            self.lists[list as usize].tail = prev;
        }
        self.lists[list as usize].len -= 1;
        let e = &mut self.entries[i as usize];
        e.list = FREE;
        e.prev = NIL;
        e.next = NIL;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lru_evicts_least_recent() {
        let mut c = BlockCache::new(3, CachePolicy::Lru);
        for k in 0..3 {
            assert_eq!(c.insert(k), None);
        }
        assert!(c.touch(0));
        assert_eq!(c.insert(3), Some(1));
        assert!(c.contains(0) && !c.contains(1));
        assert!(c.remove(2));
        assert_eq!(c.len(), 2);
        assert_eq!(c.insert(4), None);
        assert_eq!(c.len(), 3);
    }

    #[test]
    fn slru_resists_a_scan() {
        let mut c = BlockCache::new(100, CachePolicy::Slru);
        // Working set of 50 blocks, each used twice (protected).
        for _ in 0..2 {
            for k in 0..50 {
                c.insert(k);
            }
        }
        // A one-pass scan of 1,000 other blocks.
        for k in 1000..2000 {
            c.insert(k);
        }
        assert!(
            (0..50).all(|k| c.contains(k)),
            "scan flushed the working set"
        );
        let mut lru = BlockCache::new(100, CachePolicy::Lru);
        for _ in 0..2 {
            for k in 0..50 {
                lru.insert(k);
            }
        }
        for k in 1000..2000 {
            lru.insert(k);
        }
        assert!((0..50).all(|k| !lru.contains(k)));
    }

    #[test]
    fn zero_capacity_holds_nothing() {
        let mut c = BlockCache::new(0, CachePolicy::Slru);
        assert_eq!(c.insert(1), None);
        assert!(!c.contains(1));
        assert_eq!(c.peek_victim(), None);
    }
}
