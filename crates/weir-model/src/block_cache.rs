//! A fixed-capacity block cache index (which blocks are resident, in which order they
//! leave), shared by the host flash cache, the clone-aware array cache and the hybrid
//! array's flash tier.
//!
//! Entries live in a slab (intrusive doubly linked lists, 32 bytes each) found through
//! an open-addressed table of 8-byte slots (slab index and a 32-bit hash tag, linear
//! probing, at most half full); both grow with the resident set up to the capacity,
//! so once the cache is full, inserts, hits and evictions do not allocate. Memory: 48
//! to 64 bytes per resident block (a full cache whose capacity is just over a power
//! of two is at the low end). A key is stored once, in the slab: a std `HashMap<u128,
//! u32>` beside the slab took 32-byte buckets at a load of 44-87 % on top of it, and
//! its doubling growth left the slab up to half empty — about 130 bytes per block
//! measured (the simulated VDI power-on's 8.4 M-block array cache: 1.06 GB).
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

/// Aligned to its size, so an entry never straddles two cache lines (a large `Vec`
/// from the system allocator starts 16 bytes into a page: half the entries did, and
/// a lookup plus relink then missed twice).
#[derive(Clone, Copy, Debug)]
#[repr(align(32))]
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
    index: SlotIndex,
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
        let entries = Vec::with_capacity(initial);
        crate::huge_pages::advise_vec(&entries);
        Self {
            entries,
            index: SlotIndex::new(capacity),
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
        self.index.len
    }

    pub fn is_empty(&self) -> bool {
        self.index.len == 0
    }

    /// Most keys resident at once.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    pub fn contains(&self, key: u128) -> bool {
        self.index.find(&self.entries, key).is_some()
    }

    /// Starts loading the memory a lookup of `key` reads first (its home slot in the
    /// index): call it some work ahead of `touch` / `insert`. A hint only.
    pub fn prefetch(&self, key: u128) {
        self.index.prefetch_home(key);
    }

    /// Records an access; returns whether the key was resident.
    pub fn touch(&mut self, key: u128) -> bool {
        let Some(i) = self.index.find(&self.entries, key) else {
            return false;
        };
        self.access(i);
        true
    }

    /// Makes `key` resident (an access if it already is). Returns the evicted key.
    pub fn insert(&mut self, key: u128) -> Option<u128> {
        self.insert_slot(key).and_then(|(_, evicted)| evicted)
    }

    /// The slot of a resident key, recording an access. A key's slot (its
    /// entry's index, below the capacity) stays the same while it is resident,
    /// and no two resident keys share one: a cache that keeps data can store a
    /// key's block at its slot.
    pub fn touch_slot(&mut self, key: u128) -> Option<u32> {
        let i = self.index.find(&self.entries, key)?;
        self.access(i);
        Some(i)
    }

    /// The slot of a resident key, without an access.
    pub fn slot_of(&self, key: u128) -> Option<u32> {
        self.index.find(&self.entries, key)
    }

    /// As [`BlockCache::insert`], and the key's slot (`None`: capacity 0). The
    /// evicted key's slot is the new key's.
    pub fn insert_slot(&mut self, key: u128) -> Option<(u32, Option<u128>)> {
        if let Some(i) = self.index.find(&self.entries, key) {
            self.access(i);
            return Some((i, None));
        }
        if self.capacity == 0 {
            return None;
        }
        let mut evicted = None;
        let i = if let Some(i) = self.free.pop() {
            i
        } else if (self.entries.len() as u32) < self.capacity {
            if self.entries.len() == self.entries.capacity() {
                // Grow by doubling, but never past the capacity.
                let more = self
                    .entries
                    .len()
                    .min(self.capacity as usize - self.entries.len());
                self.entries.reserve_exact(more.max(1));
                crate::huge_pages::advise_vec(&self.entries);
            }
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
            self.index.remove(&self.entries, old);
            evicted = Some(old);
            victim
        };
        self.entries[i as usize].key = key;
        let list = match self.policy {
            CachePolicy::Lru => PROTECTED,
            CachePolicy::Slru => PROBATION,
        };
        self.push_front(i, list);
        self.index.insert(&self.entries, key, i);
        if evicted.is_some() {
            self.prefetch_next_eviction();
        }
        Some((i, evicted))
    }

    /// Starts loading what the next eviction reads: the next victim's home slot and
    /// its predecessor in the list (the next victim's own entry was just written by
    /// `unlink`). Without this, an insert into a full cache waits on three DRAM
    /// misses; the next insert of a new key is usually far enough ahead for the
    /// loads to land.
    fn prefetch_next_eviction(&self) {
        let v = self.victim();
        if let Some(e) = self.entries.get(v as usize) {
            self.index.prefetch_home(e.key);
            if let Some(p) = self.entries.get(e.prev as usize) {
                crate::prefetch::read(p);
            }
        }
    }

    /// Drops `key`; returns whether it was resident.
    pub fn remove(&mut self, key: u128) -> bool {
        let Some(i) = self.index.remove(&self.entries, key) else {
            return false;
        };
        self.unlink(i);
        self.free.push(i);
        true
    }

    /// The key that would leave next (without removing it).
    pub fn peek_victim(&self) -> Option<u128> {
        if self.is_empty() {
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

/// Where each resident key's entry is: an open-addressed table (linear probing,
/// deletion by backward shift, so no tombstones) of slots holding a slab index + 1
/// (0: empty) in the low half and the top 32 bits of the key's hash in the high half.
/// The high half is a tag, so a probe past another key rarely reads that key's entry,
/// and it holds the home slot (the hash's top bits), so moving a slot (backward-shift
/// deletes, growth) never reads the slab: those reads were DRAM misses, one per slot
/// of the probe run behind a deleted key. The key itself lives only in the slab. At
/// most half full: a lookup reads about 1.5 slots.
#[derive(Clone, Debug)]
struct SlotIndex {
    slots: Vec<u64>,
    /// `slots.len() - 1` (a power of two minus one), or 0 while empty.
    mask: usize,
    /// 64 - log2(slots.len()): a hash's top bits pick the home slot.
    shift: u32,
    len: u32,
    /// Slots needed for the whole capacity at half load.
    max_slots: usize,
}

impl SlotIndex {
    const MIN_SLOTS: usize = 16;

    fn new(capacity: u32) -> Self {
        let max_slots = (capacity as usize * 2)
            .next_power_of_two()
            .max(Self::MIN_SLOTS);
        let mut index = SlotIndex {
            slots: Vec::new(),
            mask: 0,
            shift: 64,
            len: 0,
            max_slots,
        };
        let initial = (capacity.min(1 << 16) as usize * 2).next_power_of_two();
        index.resize(initial.clamp(Self::MIN_SLOTS, max_slots));
        index
    }

    fn hash(key: u128) -> u64 {
        use std::hash::Hasher;
        let mut h = KeyHasher::default();
        h.write_u128(key);
        h.finish()
    }

    /// The hash's top half, in the slot's high half (its top bits pick the home slot).
    fn tag(hash: u64) -> u64 {
        hash & 0xFFFF_FFFF_0000_0000
    }

    fn home(&self, hash: u64) -> usize {
        (hash >> self.shift) as usize
    }

    /// Home slot of the key held in an occupied slot (from its tag: the table never
    /// has more than 2^32 slots, so the home bits are all in the tag).
    fn home_of_slot(&self, slot: u64) -> usize {
        self.home(slot & 0xFFFF_FFFF_0000_0000)
    }

    /// Starts loading the cache line of `key`'s home slot (a hint: no effect on
    /// results).
    fn prefetch_home(&self, key: u128) {
        if let Some(p) = self.slots.get(self.home(Self::hash(key))) {
            crate::prefetch::read(p);
        }
    }

    fn find(&self, entries: &[Entry], key: u128) -> Option<u32> {
        self.find_slot(entries, key)
            .map(|s| (self.slots[s] as u32) - 1)
    }

    fn find_slot(&self, entries: &[Entry], key: u128) -> Option<usize> {
        let hash = Self::hash(key);
        let tag = Self::tag(hash);
        let mut s = self.home(hash);
        loop {
            let slot = self.slots[s];
            if slot == 0 {
                return None;
            }
            if slot & 0xFFFF_FFFF_0000_0000 == tag && entries[(slot as u32 - 1) as usize].key == key
            {
                return Some(s);
            }
            s = (s + 1) & self.mask;
        }
    }

    /// Adds a key known not to be present, whose entry is `entries[i]`.
    fn insert(&mut self, entries: &[Entry], key: u128, i: u32) {
        debug_assert_eq!(entries[i as usize].key, key);
        if (self.len as usize + 1) * 2 > self.slots.len() {
            self.grow();
        }
        self.place(Self::hash(key), i);
        self.len += 1;
    }

    fn place(&mut self, hash: u64, i: u32) {
        let mut s = self.home(hash);
        while self.slots[s] != 0 {
            s = (s + 1) & self.mask;
        }
        self.slots[s] = Self::tag(hash) | (i as u64 + 1);
    }

    /// Removes a key; returns its slab index.
    fn remove(&mut self, entries: &[Entry], key: u128) -> Option<u32> {
        let mut hole = self.find_slot(entries, key)?;
        let i = (self.slots[hole] as u32) - 1;
        self.slots[hole] = 0;
        self.len -= 1;
        // Backward shift: pull later members of the probe run into the hole when
        // their home is not between the hole and them.
        let mut s = (hole + 1) & self.mask;
        while self.slots[s] != 0 {
            let home = self.home_of_slot(self.slots[s]);
            if (s.wrapping_sub(home) & self.mask) >= (s.wrapping_sub(hole) & self.mask) {
                self.slots[hole] = self.slots[s];
                self.slots[s] = 0;
                hole = s;
            }
            s = (s + 1) & self.mask;
        }
        Some(i)
    }

    fn grow(&mut self) {
        let new_len = (self.slots.len() * 2).min(self.max_slots);
        assert!(
            new_len > self.slots.len(),
            "slot index full at its capacity"
        );
        let old = std::mem::take(&mut self.slots);
        self.resize(new_len);
        for slot in old.into_iter().filter(|&s| s != 0) {
            // The tag is the hash's top half: all `place` reads of it.
            self.place(slot & 0xFFFF_FFFF_0000_0000, (slot as u32) - 1);
        }
    }

    fn resize(&mut self, slots: usize) {
        assert!(slots.is_power_of_two() && self.slots.is_empty());
        // The home slot is read back from the tag (the hash's top 32 bits).
        assert!(slots <= 1 << 32, "slot index of {slots} slots");
        self.slots = vec![0; slots];
        crate::huge_pages::advise_vec(&self.slots);
        self.mask = slots - 1;
        self.shift = 64 - slots.trailing_zeros();
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

    proptest::proptest! {
        /// The index agrees with a set kept from what the cache reports (evictions,
        /// removals), through growth and backward-shift deletes; the slab never
        /// grows past the capacity.
        #[test]
        fn index_matches_a_model_set(
            capacity in 0u32..300,
            slru in proptest::bool::ANY,
            ops in proptest::collection::vec((0u8..4, 0u128..600), 1..3000),
        ) {
            let policy = if slru { CachePolicy::Slru } else { CachePolicy::Lru };
            let mut c = BlockCache::new(capacity, policy);
            let mut model = std::collections::HashSet::new();
            for (op, k) in ops {
                // Spread keys over both halves of the u128.
                let key = k.wrapping_mul(0x1_0000_0001) << (k % 3 * 40);
                match op {
                    0 | 1 => {
                        if let Some(old) = c.insert(key) {
                            proptest::prop_assert!(model.remove(&old), "evicted {old} not resident");
                        }
                        if capacity > 0 {
                            model.insert(key);
                        }
                    }
                    2 => proptest::prop_assert_eq!(c.remove(key), model.remove(&key)),
                    _ => proptest::prop_assert_eq!(c.touch(key), model.contains(&key)),
                }
                proptest::prop_assert_eq!(c.len() as usize, model.len());
                proptest::prop_assert!(c.len() <= capacity);
                proptest::prop_assert!(c.entries.len() <= capacity as usize);
            }
            for k in 0u128..600 {
                let key = k.wrapping_mul(0x1_0000_0001) << (k % 3 * 40);
                proptest::prop_assert_eq!(c.contains(key), model.contains(&key));
            }
        }
    }

    #[test]
    fn a_full_cache_takes_at_most_64_bytes_a_block() {
        for capacity in [1000u32, 1 << 15, (1 << 15) + 1, 100_000] {
            let mut c = BlockCache::new(capacity, CachePolicy::Slru);
            for k in 0..capacity as u128 * 2 {
                c.insert(k * 7919);
            }
            let bytes =
                c.entries.capacity() * std::mem::size_of::<Entry>() + c.index.slots.capacity() * 8;
            let per_block = bytes as f64 / capacity as f64;
            assert!(
                per_block <= 64.5,
                "{capacity}: {per_block:.1} bytes a block"
            );
            assert_eq!(std::mem::size_of::<Entry>(), 32);
        }
    }

    #[test]
    fn zero_capacity_holds_nothing() {
        let mut c = BlockCache::new(0, CachePolicy::Slru);
        assert_eq!(c.insert(1), None);
        assert!(!c.contains(1));
        assert_eq!(c.peek_victim(), None);
    }
}
