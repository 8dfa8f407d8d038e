//! Replacement policies side by side, for trace-driven comparisons of the flash
//! read cache (issue 12): which blocks a policy keeps, not where they live.
//! Simulators only — the cache that serves reads is [`crate::FlashCache`] on
//! [`BlockCache`].
//!
//! * [`Replay`]: [`FlashCache`](crate::FlashCache)'s rules around any [`Policy`] —
//!   a read is a hit only if every block it touches is resident (each then gets
//!   an access); a miss fills the blocks it covered whole, unless it belongs to a
//!   sequential scan (`scan_bytes`, the same four streams per volume); a write
//!   drops the blocks it touches (write-through with invalidation), one longer
//!   than [`MAX_INVALIDATE_BLOCKS`] the volume's whole cache (an epoch in the
//!   key). A property test checks that it counts exactly what `FlashCache` counts
//!   with [`BlockCache`] as the policy.
//! * Policies: [`Block`] ([`BlockCache`] as it is: LRU or SLRU), [`Lru`] (exact),
//!   [`Arc`] (Megiddo & Modha, FAST 2003), [`S3Fifo`] (Yang et al., SOSP 2023, as
//!   libCacheSim's `S3FIFO.c`: small FIFO 10 %, ghost 90 %, promotion to main
//!   at two hits, main a FIFO-reinsertion with a 2-bit counter) and [`TwoQ`]
//!   (Johnson & Shasha, VLDB 1994, full version: A1in 25 %, A1out 50 %).
//!
//! Ghost entries (ARC's B1/B2, S3-FIFO's ghost FIFO, 2Q's A1out) hold keys, no
//! data; a write drops only resident blocks and leaves the key's history.

use serde::Serialize;

use crate::block_cache::{BlockCache, CachePolicy, FastMap};
use crate::flash_cache::MAX_INVALIDATE_BLOCKS;

/// A replacement policy over `capacity` resident keys.
pub trait Policy {
    fn name(&self) -> String;
    fn capacity(&self) -> u32;
    /// Resident keys.
    fn len(&self) -> u32;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Whether `key` is resident (no access recorded).
    fn contains(&self, key: u128) -> bool;
    /// An access to a resident key.
    fn hit(&mut self, key: u128);
    /// Makes a key that is not resident resident (evicting as needed).
    fn admit(&mut self, key: u128);
    /// Drops a resident key; whether it was resident.
    fn remove(&mut self, key: u128) -> bool;
}

/// Which policy, by name (the comparison tool's columns).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize)]
pub enum PolicyKind {
    /// `BlockCache` with `CachePolicy::Lru` (approximate: a hit among the most
    /// recent eighth does not move).
    BlockLru,
    /// `BlockCache` with `CachePolicy::Slru`: what the flash cache uses.
    BlockSlru,
    Lru,
    Arc,
    S3Fifo,
    TwoQ,
}

impl PolicyKind {
    pub const ALL: [PolicyKind; 6] = [
        PolicyKind::BlockLru,
        PolicyKind::BlockSlru,
        PolicyKind::Lru,
        PolicyKind::Arc,
        PolicyKind::S3Fifo,
        PolicyKind::TwoQ,
    ];

    pub fn label(self) -> &'static str {
        match self {
            PolicyKind::BlockLru => "LRU (BlockCache)",
            PolicyKind::BlockSlru => "SLRU (BlockCache)",
            PolicyKind::Lru => "LRU (exact)",
            PolicyKind::Arc => "ARC",
            PolicyKind::S3Fifo => "S3-FIFO",
            PolicyKind::TwoQ => "2Q",
        }
    }

    pub fn build(self, capacity: u32) -> Box<dyn Policy> {
        match self {
            PolicyKind::BlockLru => Box::new(Block::new(capacity, CachePolicy::Lru)),
            PolicyKind::BlockSlru => Box::new(Block::new(capacity, CachePolicy::Slru)),
            PolicyKind::Lru => Box::new(Lru::new(capacity)),
            PolicyKind::Arc => Box::new(Arc::new(capacity)),
            PolicyKind::S3Fifo => Box::new(S3Fifo::new(capacity)),
            PolicyKind::TwoQ => Box::new(TwoQ::new(capacity)),
        }
    }
}

impl<P: Policy + ?Sized> Policy for Box<P> {
    fn name(&self) -> String {
        (**self).name()
    }
    fn capacity(&self) -> u32 {
        (**self).capacity()
    }
    fn len(&self) -> u32 {
        (**self).len()
    }
    fn contains(&self, key: u128) -> bool {
        (**self).contains(key)
    }
    fn hit(&mut self, key: u128) {
        (**self).hit(key)
    }
    fn admit(&mut self, key: u128) {
        (**self).admit(key)
    }
    fn remove(&mut self, key: u128) -> bool {
        (**self).remove(key)
    }
}

// ---------------------------------------------------------------------------
// Intrusive lists over one slab, found through one map (key → node).

const NIL: u32 = u32::MAX;

#[derive(Clone, Copy, Debug)]
struct Node {
    key: u128,
    prev: u32,
    next: u32,
    list: u8,
    freq: u8,
}

/// `N` doubly linked lists; head = newest / most recent, tail = oldest.
#[derive(Clone, Debug)]
struct Lists<const N: usize> {
    nodes: Vec<Node>,
    free: Vec<u32>,
    head: [u32; N],
    tail: [u32; N],
    len: [u32; N],
    index: FastMap<u128, u32>,
}

impl<const N: usize> Lists<N> {
    fn new() -> Self {
        Lists {
            nodes: Vec::new(),
            free: Vec::new(),
            head: [NIL; N],
            tail: [NIL; N],
            len: [0; N],
            index: FastMap::default(),
        }
    }

    fn find(&self, key: u128) -> Option<u32> {
        self.index.get(&key).copied()
    }

    fn list_of(&self, key: u128) -> Option<usize> {
        self.find(key).map(|i| self.nodes[i as usize].list as usize)
    }

    fn len(&self, list: usize) -> u32 {
        self.len[list]
    }

    fn link_front(&mut self, i: u32, list: usize) {
        let old = self.head[list];
        {
            let n = &mut self.nodes[i as usize];
            n.prev = NIL;
            n.next = old;
            n.list = list as u8;
        }
        if old != NIL {
            self.nodes[old as usize].prev = i;
        } else {
            self.tail[list] = i;
        }
        self.head[list] = i;
        self.len[list] += 1;
    }

    fn unlink(&mut self, i: u32) {
        let Node {
            prev, next, list, ..
        } = self.nodes[i as usize];
        let list = list as usize;
        if prev != NIL {
            self.nodes[prev as usize].next = next;
        } else {
            self.head[list] = next;
        }
        if next != NIL {
            self.nodes[next as usize].prev = prev;
        } else {
            self.tail[list] = prev;
        }
        self.len[list] -= 1;
    }

    /// Adds a key not present at the head of `list`.
    fn push_front(&mut self, list: usize, key: u128) -> u32 {
        let node = Node {
            key,
            prev: NIL,
            next: NIL,
            list: list as u8,
            freq: 0,
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.nodes[i as usize] = node;
                i
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        };
        self.link_front(i, list);
        self.index.insert(key, i);
        i
    }

    /// Moves node `i` to the head of `list` (the same list or another).
    fn move_front(&mut self, i: u32, list: usize) {
        self.unlink(i);
        self.link_front(i, list);
    }

    /// The oldest node of `list`.
    fn tail(&self, list: usize) -> Option<u32> {
        let t = self.tail[list];
        (t != NIL).then_some(t)
    }

    /// Drops node `i`; its key.
    fn delete(&mut self, i: u32) -> u128 {
        self.unlink(i);
        let key = self.nodes[i as usize].key;
        self.index.remove(&key);
        self.free.push(i);
        key
    }

    /// Drops the oldest node of `list`; its key.
    fn pop_back(&mut self, list: usize) -> Option<u128> {
        let t = self.tail(list)?;
        Some(self.delete(t))
    }

    fn node(&mut self, i: u32) -> &mut Node {
        &mut self.nodes[i as usize]
    }
}

// ---------------------------------------------------------------------------

/// [`BlockCache`] as the flash cache has it.
#[derive(Clone, Debug)]
pub struct Block {
    cache: BlockCache,
    policy: CachePolicy,
}

impl Block {
    pub fn new(capacity: u32, policy: CachePolicy) -> Self {
        Block {
            cache: BlockCache::new(capacity, policy),
            policy,
        }
    }
}

impl Policy for Block {
    fn name(&self) -> String {
        format!("BlockCache {:?}", self.policy)
    }
    fn capacity(&self) -> u32 {
        self.cache.capacity()
    }
    fn len(&self) -> u32 {
        self.cache.len()
    }
    fn contains(&self, key: u128) -> bool {
        self.cache.contains(key)
    }
    fn hit(&mut self, key: u128) {
        self.cache.touch(key);
    }
    fn admit(&mut self, key: u128) {
        self.cache.insert(key);
    }
    fn remove(&mut self, key: u128) -> bool {
        self.cache.remove(key)
    }
}

/// Exact least-recently-used.
#[derive(Clone, Debug)]
pub struct Lru {
    lists: Lists<1>,
    capacity: u32,
}

impl Lru {
    pub fn new(capacity: u32) -> Self {
        Lru {
            lists: Lists::new(),
            capacity,
        }
    }
}

impl Policy for Lru {
    fn name(&self) -> String {
        "LRU".into()
    }
    fn capacity(&self) -> u32 {
        self.capacity
    }
    fn len(&self) -> u32 {
        self.lists.len(0)
    }
    fn contains(&self, key: u128) -> bool {
        self.lists.find(key).is_some()
    }
    fn hit(&mut self, key: u128) {
        if let Some(i) = self.lists.find(key) {
            self.lists.move_front(i, 0);
        }
    }
    fn admit(&mut self, key: u128) {
        if self.capacity == 0 || self.contains(key) {
            return;
        }
        if self.lists.len(0) >= self.capacity {
            self.lists.pop_back(0);
        }
        self.lists.push_front(0, key);
    }
    fn remove(&mut self, key: u128) -> bool {
        match self.lists.find(key) {
            Some(i) => {
                self.lists.delete(i);
                true
            }
            None => false,
        }
    }
}

/// Adaptive Replacement Cache (Megiddo & Modha, "ARC: A Self-Tuning, Low
/// Overhead Replacement Cache", FAST 2003, Fig. 4): T1 (seen once recently) and
/// T2 (seen at least twice) resident, B1 and B2 their ghosts; the target size `p`
/// of T1 grows on a B1 hit and shrinks on a B2 hit. A write's removal can leave
/// the cache below its capacity: then no REPLACE runs on admission (the free
/// place is used), as at start.
#[derive(Clone, Debug)]
pub struct Arc {
    lists: Lists<4>,
    capacity: u32,
    /// Target size of T1.
    p: f64,
}

const T1: usize = 0;
const T2: usize = 1;
const B1: usize = 2;
const B2: usize = 3;

impl Arc {
    pub fn new(capacity: u32) -> Self {
        Arc {
            lists: Lists::new(),
            capacity,
            p: 0.0,
        }
    }

    /// ARC's target size of T1 (tests).
    pub fn target_t1(&self) -> f64 {
        self.p
    }

    /// Sizes of T1, T2, B1, B2 (tests).
    pub fn sizes(&self) -> [u32; 4] {
        [T1, T2, B1, B2].map(|l| self.lists.len(l))
    }

    fn resident(&self) -> u32 {
        self.lists.len(T1) + self.lists.len(T2)
    }

    /// REPLACE(x, p): demote T1's or T2's LRU to its ghost list.
    fn replace(&mut self, in_b2: bool) {
        let t1 = self.lists.len(T1) as f64;
        let from_t1 = self.lists.len(T1) >= 1 && ((in_b2 && t1 == self.p) || t1 > self.p);
        let (from, to) = if (from_t1 || self.lists.len(T2) == 0) && self.lists.len(T1) > 0 {
            (T1, B1)
        } else {
            (T2, B2)
        };
        if let Some(t) = self.lists.tail(from) {
            self.lists.move_front(t, to);
        }
    }
}

impl Policy for Arc {
    fn name(&self) -> String {
        "ARC".into()
    }
    fn capacity(&self) -> u32 {
        self.capacity
    }
    fn len(&self) -> u32 {
        self.resident()
    }
    fn contains(&self, key: u128) -> bool {
        matches!(self.lists.list_of(key), Some(T1 | T2))
    }
    fn hit(&mut self, key: u128) {
        // Case I.
        if let Some(i) = self.lists.find(key)
            && matches!(self.lists.nodes[i as usize].list as usize, T1 | T2)
        {
            self.lists.move_front(i, T2);
        }
    }
    fn admit(&mut self, key: u128) {
        let c = self.capacity;
        if c == 0 {
            return;
        }
        let cf = c as f64;
        let full = |s: &Self| s.resident() >= c;
        match self.lists.find(key) {
            Some(i) if self.lists.nodes[i as usize].list as usize == B1 => {
                // Case II: B1 was too small a T1.
                let (b1, b2) = (self.lists.len(B1) as f64, self.lists.len(B2) as f64);
                self.p = (self.p + (b2 / b1).max(1.0)).min(cf);
                if full(self) {
                    self.replace(false);
                }
                self.lists.move_front(i, T2);
            }
            Some(i) if self.lists.nodes[i as usize].list as usize == B2 => {
                // Case III.
                let (b1, b2) = (self.lists.len(B1) as f64, self.lists.len(B2) as f64);
                self.p = (self.p - (b1 / b2).max(1.0)).max(0.0);
                if full(self) {
                    self.replace(true);
                }
                self.lists.move_front(i, T2);
            }
            Some(_) => {} // resident already
            None => {
                // Case IV.
                let (t1, t2) = (self.lists.len(T1), self.lists.len(T2));
                let (b1, b2) = (self.lists.len(B1), self.lists.len(B2));
                if t1 + b1 >= c {
                    if t1 < c {
                        self.lists.pop_back(B1);
                        if full(self) {
                            self.replace(false);
                        }
                    } else {
                        self.lists.pop_back(T1);
                    }
                } else if t1 + t2 + b1 + b2 >= c {
                    if t1 + t2 + b1 + b2 >= 2 * c {
                        self.lists.pop_back(B2);
                    }
                    if full(self) {
                        self.replace(false);
                    }
                }
                self.lists.push_front(T1, key);
            }
        }
    }
    fn remove(&mut self, key: u128) -> bool {
        match self.lists.find(key) {
            Some(i) if matches!(self.lists.nodes[i as usize].list as usize, T1 | T2) => {
                self.lists.delete(i);
                true
            }
            _ => false,
        }
    }
}

/// S3-FIFO (Yang et al., "FIFO queues are all you need for cache eviction",
/// SOSP 2023), as libCacheSim's `S3FIFO.c` with its defaults
/// (`small-size-ratio=0.10,ghost-size-ratio=0.90,move-to-main-threshold=2`): new
/// keys enter the small FIFO S (10 %) unless the ghost FIFO G remembers them (then
/// main, M); a hit adds one to the key's counter (2 bits). Leaving S, a key read
/// at least twice there moves to M, any other goes to G (keys only, 90 % of the
/// capacity). M is FIFO-reinsertion: a key with a count is reinserted with one
/// less, one without leaves. Eviction takes from M while M is over its 90 % or S
/// is empty, else from S. Before the first eviction a key finding S full goes to
/// M (libCacheSim's refinement of the paper's Algorithm 1).
#[derive(Clone, Debug)]
pub struct S3Fifo {
    lists: Lists<3>,
    capacity: u32,
    small_cap: u32,
    main_cap: u32,
    ghost_cap: u32,
    promote_at: u8,
    has_evicted: bool,
}

const SMALL: usize = 0;
const MAIN: usize = 1;
const GHOST: usize = 2;

impl S3Fifo {
    pub fn new(capacity: u32) -> Self {
        Self::with_threshold(capacity, 2)
    }

    /// With another small-to-main threshold (libCacheSim's
    /// `move-to-main-threshold`; the paper's blog suggests 1 for block I/O).
    pub fn with_threshold(capacity: u32, promote_at: u8) -> Self {
        let small_cap = (capacity / 10).max(1).min(capacity);
        S3Fifo {
            lists: Lists::new(),
            capacity,
            small_cap,
            main_cap: capacity - small_cap,
            ghost_cap: (capacity as u64 * 9 / 10) as u32,
            promote_at,
            has_evicted: false,
        }
    }

    /// Sizes of S, M, G (tests).
    pub fn sizes(&self) -> [u32; 3] {
        [SMALL, MAIN, GHOST].map(|l| self.lists.len(l))
    }

    fn resident(&self) -> u32 {
        self.lists.len(SMALL) + self.lists.len(MAIN)
    }

    fn evict(&mut self) {
        self.has_evicted = true;
        if self.lists.len(MAIN) > self.main_cap || self.lists.len(SMALL) == 0 {
            self.evict_main();
        } else {
            self.evict_small();
        }
    }

    fn evict_small(&mut self) {
        while let Some(t) = self.lists.tail(SMALL) {
            if self.lists.nodes[t as usize].freq >= self.promote_at {
                self.lists.move_front(t, MAIN);
                self.lists.node(t).freq = 0;
            } else {
                self.lists.move_front(t, GHOST);
                self.lists.node(t).freq = 0;
                while self.lists.len(GHOST) > self.ghost_cap {
                    self.lists.pop_back(GHOST);
                }
                return;
            }
        }
    }

    fn evict_main(&mut self) {
        while let Some(t) = self.lists.tail(MAIN) {
            let f = self.lists.nodes[t as usize].freq;
            if f >= 1 {
                self.lists.move_front(t, MAIN);
                self.lists.node(t).freq = f.min(3) - 1;
            } else {
                self.lists.delete(t);
                return;
            }
        }
    }
}

impl Policy for S3Fifo {
    fn name(&self) -> String {
        "S3-FIFO".into()
    }
    fn capacity(&self) -> u32 {
        self.capacity
    }
    fn len(&self) -> u32 {
        self.resident()
    }
    fn contains(&self, key: u128) -> bool {
        matches!(self.lists.list_of(key), Some(SMALL | MAIN))
    }
    fn hit(&mut self, key: u128) {
        if let Some(i) = self.lists.find(key) {
            let n = self.lists.node(i);
            if n.list as usize != GHOST {
                n.freq = (n.freq + 1).min(3);
            }
        }
    }
    fn admit(&mut self, key: u128) {
        if self.capacity == 0 {
            return;
        }
        let ghost = match self.lists.find(key) {
            Some(i) if self.lists.nodes[i as usize].list as usize == GHOST => {
                self.lists.delete(i);
                true
            }
            Some(_) => return,
            None => false,
        };
        while self.resident() >= self.capacity {
            self.evict();
        }
        let list = if ghost || (!self.has_evicted && self.lists.len(SMALL) >= self.small_cap) {
            MAIN
        } else {
            SMALL
        };
        self.lists.push_front(list, key);
    }
    fn remove(&mut self, key: u128) -> bool {
        match self.lists.find(key) {
            Some(i) if self.lists.nodes[i as usize].list as usize != GHOST => {
                self.lists.delete(i);
                true
            }
            _ => false,
        }
    }
}

/// 2Q, full version (Johnson & Shasha, VLDB 1994): new keys enter the FIFO A1in
/// (`Kin` = 25 % of the capacity); leaving it they are remembered in A1out (keys
/// only, `Kout` = 50 %); a key found in A1out enters Am (LRU). Hits in A1in do
/// nothing (correlated references).
#[derive(Clone, Debug)]
pub struct TwoQ {
    lists: Lists<3>,
    capacity: u32,
    k_in: u32,
    k_out: u32,
}

const A1IN: usize = 0;
const AM: usize = 1;
const A1OUT: usize = 2;

impl TwoQ {
    pub fn new(capacity: u32) -> Self {
        TwoQ {
            lists: Lists::new(),
            capacity,
            k_in: (capacity / 4).max(1),
            k_out: (capacity / 2).max(1),
        }
    }

    fn reclaim(&mut self) {
        if self.lists.len(A1IN) > self.k_in || self.lists.len(AM) == 0 {
            if let Some(t) = self.lists.tail(A1IN) {
                self.lists.move_front(t, A1OUT);
                while self.lists.len(A1OUT) > self.k_out {
                    self.lists.pop_back(A1OUT);
                }
            }
        } else {
            self.lists.pop_back(AM);
        }
    }
}

impl Policy for TwoQ {
    fn name(&self) -> String {
        "2Q".into()
    }
    fn capacity(&self) -> u32 {
        self.capacity
    }
    fn len(&self) -> u32 {
        self.lists.len(A1IN) + self.lists.len(AM)
    }
    fn contains(&self, key: u128) -> bool {
        matches!(self.lists.list_of(key), Some(A1IN | AM))
    }
    fn hit(&mut self, key: u128) {
        if let Some(i) = self.lists.find(key)
            && self.lists.nodes[i as usize].list as usize == AM
        {
            self.lists.move_front(i, AM);
        }
    }
    fn admit(&mut self, key: u128) {
        if self.capacity == 0 {
            return;
        }
        let remembered = match self.lists.find(key) {
            Some(i) if self.lists.nodes[i as usize].list as usize == A1OUT => {
                self.lists.delete(i);
                true
            }
            Some(_) => return,
            None => false,
        };
        if self.len() >= self.capacity {
            self.reclaim();
        }
        self.lists
            .push_front(if remembered { AM } else { A1IN }, key);
    }
    fn remove(&mut self, key: u128) -> bool {
        match self.lists.find(key) {
            Some(i) if self.lists.nodes[i as usize].list as usize != A1OUT => {
                self.lists.delete(i);
                true
            }
            _ => false,
        }
    }
}

// ---------------------------------------------------------------------------

/// One request of a block trace.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct TraceIo {
    pub volume: u32,
    pub offset: u64,
    pub length: u32,
    pub write: bool,
}

/// What a replay counted (reads, as [`crate::FlashCacheStats`] counts them).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ReplayStats {
    pub reads: u64,
    pub read_hits: u64,
    pub read_bytes: u64,
    pub hit_bytes: u64,
    /// Misses not admitted (sequential scans).
    pub scan_bypasses: u64,
    pub writes: u64,
    pub filled_blocks: u64,
    pub invalidated_blocks: u64,
}

impl ReplayStats {
    /// Reads served from the cache ÷ reads.
    pub fn hit_ratio(&self) -> f64 {
        ratio(self.read_hits, self.reads)
    }
    /// Bytes of those reads ÷ bytes read.
    pub fn byte_hit_ratio(&self) -> f64 {
        ratio(self.hit_bytes, self.read_bytes)
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

#[derive(Clone, Debug, Default)]
struct ReplayVolume {
    epoch: u32,
    scans: crate::flash_cache::ScanDetector,
}

/// The flash cache's read, fill, admission and invalidation rules around a
/// policy (see the module), requests applied one at a time (a fill completes
/// before the next request).
#[derive(Clone, Debug)]
pub struct Replay<P: Policy> {
    policy: P,
    shift: u32,
    scan_bytes: u64,
    volumes: Vec<ReplayVolume>,
    stats: ReplayStats,
    admitted: Vec<u128>,
}

impl<P: Policy> Replay<P> {
    /// `block_bytes`: a power of two; `scan_bytes`: the scan cutoff (0: admit all).
    pub fn new(policy: P, block_bytes: u32, scan_bytes: u64) -> Self {
        assert!(block_bytes.is_power_of_two());
        Replay {
            policy,
            shift: block_bytes.trailing_zeros(),
            scan_bytes,
            volumes: Vec::new(),
            stats: ReplayStats::default(),
            admitted: Vec::new(),
        }
    }

    pub fn policy(&self) -> &P {
        &self.policy
    }

    pub fn stats(&self) -> ReplayStats {
        self.stats
    }

    /// Zeroes the counters (after a warm-up), keeping the cache's contents.
    pub fn reset_stats(&mut self) {
        self.stats = ReplayStats::default();
    }

    fn key(volume: u32, epoch: u32, block: u64) -> u128 {
        ((volume as u128) << 96) | ((epoch as u128) << 64) | block as u128
    }

    fn volume(&mut self, volume: u32) -> &mut ReplayVolume {
        let v = volume as usize;
        if self.volumes.len() <= v {
            self.volumes.resize(v + 1, ReplayVolume::default());
        }
        &mut self.volumes[v]
    }

    pub fn apply(&mut self, io: &TraceIo) {
        if io.write {
            self.write(io.volume, io.offset, io.length as u64);
        } else {
            self.read(io.volume, io.offset, io.length as u64);
        }
    }

    pub fn read(&mut self, volume: u32, offset: u64, length: u64) {
        if length == 0 {
            return;
        }
        let scan = self.note_stream(volume, offset, length);
        let epoch = self.volume(volume).epoch;
        let first = offset >> self.shift;
        let end = (offset + length).div_ceil(1 << self.shift);
        self.stats.reads += 1;
        self.stats.read_bytes += length;
        if (first..end).all(|b| self.policy.contains(Self::key(volume, epoch, b))) {
            for b in first..end {
                self.policy.hit(Self::key(volume, epoch, b));
            }
            self.stats.read_hits += 1;
            self.stats.hit_bytes += length;
            return;
        }
        if scan {
            self.stats.scan_bypasses += 1;
            return;
        }
        let whole_first = offset.div_ceil(1 << self.shift);
        let whole_end = (offset + length) >> self.shift;
        if self.policy.capacity() == 0 {
            return;
        }
        let mut admitted = std::mem::take(&mut self.admitted);
        admitted.clear();
        for b in whole_first..whole_end {
            let key = Self::key(volume, epoch, b);
            if !self.policy.contains(key) {
                self.policy.admit(key);
                admitted.push(key);
            }
        }
        // A fill larger than the cache evicts its own first blocks.
        self.stats.filled_blocks += admitted
            .iter()
            .filter(|&&k| self.policy.contains(k))
            .count() as u64;
        self.admitted = admitted;
    }

    pub fn write(&mut self, volume: u32, offset: u64, length: u64) {
        self.stats.writes += 1;
        let first = offset >> self.shift;
        let end = (offset + length.max(1)).div_ceil(1 << self.shift);
        if end - first > MAX_INVALIDATE_BLOCKS {
            let v = self.volume(volume);
            v.epoch = v.epoch.wrapping_add(1);
            return;
        }
        let epoch = self.volume(volume).epoch;
        for b in first..end {
            if self.policy.remove(Self::key(volume, epoch, b)) {
                self.stats.invalidated_blocks += 1;
            }
        }
    }

    fn note_stream(&mut self, volume: u32, offset: u64, length: u64) -> bool {
        let scan_bytes = self.scan_bytes;
        self.volume(volume).scans.note(offset, length, scan_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flash_cache::{FlashCache, FlashCacheSpec, ReadPlan};

    fn all(capacity: u32) -> Vec<Box<dyn Policy>> {
        PolicyKind::ALL.iter().map(|k| k.build(capacity)).collect()
    }

    /// Hits of a key sequence, every miss admitted.
    fn run(p: &mut dyn Policy, keys: impl IntoIterator<Item = u128>) -> u64 {
        let mut hits = 0;
        for k in keys {
            if p.contains(k) {
                p.hit(k);
                hits += 1;
            } else {
                p.admit(k);
            }
            assert!(p.len() <= p.capacity(), "{} over capacity", p.name());
        }
        hits
    }

    #[test]
    fn a_loop_that_fits_hits_after_the_first_pass_for_every_policy() {
        for mut p in all(100) {
            let keys = (0..10).flat_map(|_| 0u128..100);
            let hits = run(p.as_mut(), keys);
            assert_eq!(hits, 900, "{}", p.name());
        }
    }

    #[test]
    fn lru_never_hits_a_loop_just_larger_than_the_cache() {
        // LRU evicts every key just before it comes back. So do SLRU (no key is
        // read twice while resident, so all stay in probation, an LRU) and ARC
        // (each key returns from B1 into T2, whose LRU end is again the next key
        // needed: ARC is not loop-resistant; LIRS and CLOCK-Pro were made for
        // that).
        let lru_like = [
            PolicyKind::Lru,
            PolicyKind::BlockLru,
            PolicyKind::BlockSlru,
            PolicyKind::Arc,
        ];
        for kind in lru_like {
            let mut p = kind.build(100);
            let hits = run(p.as_mut(), (0..20).flat_map(|_| 0u128..101));
            assert_eq!(hits, 0, "{}", p.name());
        }
        // The FIFO-based S3-FIFO and 2Q keep most of the loop (their FIFOs
        // do not reorder on a hit): 1,820 and 1,773 hits of 1,919 possible.
        for (kind, expect) in [(PolicyKind::S3Fifo, 1820), (PolicyKind::TwoQ, 1773)] {
            let mut p = kind.build(100);
            let hits = run(p.as_mut(), (0..20).flat_map(|_| 0u128..101));
            assert_eq!(hits, expect, "{}", p.name());
        }
    }

    #[test]
    fn s3fifo_filters_one_hit_wonders() {
        // A working set of 50 keys, read three times to begin with, then again
        // in every round among 100 keys read once: the one-hit wonders pass
        // through the small FIFO (10 %) to the ghost and never reach main, so
        // the working set stays. LRU, with 150 distinct keys a round through
        // 100 places, keeps none of it.
        let mut s3 = S3Fifo::new(100);
        let mut lru = Lru::new(100);
        for _ in 0..3 {
            run(&mut s3, 0u128..50);
            run(&mut lru, 0u128..50);
        }
        let mut next = 1_000_000u128;
        let (mut s3_hits, mut lru_hits) = (0, 0);
        for round in 0..100 {
            let mut keys: Vec<u128> = (0..50).collect();
            keys.extend((0..100).map(|_| {
                next += 1;
                next
            }));
            let (a, b) = (run(&mut s3, keys.clone()), run(&mut lru, keys));
            if round >= 2 {
                s3_hits += a;
                lru_hits += b;
            }
        }
        assert_eq!(s3_hits, 98 * 50);
        assert_eq!(lru_hits, 0);
        let [_, main, ghost] = s3.sizes();
        assert!(main >= 50 && ghost <= 90, "{main} {ghost}");
        assert!((0..50).all(|k| s3.contains(k)));
    }

    #[test]
    fn s3fifo_ghost_hit_goes_to_main() {
        let mut s3 = S3Fifo::new(10); // small 1, main 9, ghost 9
        // Before any eviction, a key finding S full goes to M: 0 in S, 1-9 in M.
        run(&mut s3, 0u128..10);
        assert_eq!(s3.sizes(), [1, 9, 0]);
        run(&mut s3, [100u128]); // S's 0 (never hit) goes to the ghost
        run(&mut s3, [101u128]); // and so does 100
        assert!(!s3.contains(0) && !s3.contains(100));
        assert_eq!(s3.sizes(), [1, 9, 2]);
        // Ghost hit: straight to main (the room it needs sends S's 101 to the
        // ghost).
        run(&mut s3, [100u128]);
        assert!(s3.contains(100) && !s3.contains(101));
        assert_eq!(s3.sizes(), [0, 10, 2]);
        // A key hit twice in S moves to M when it leaves S.
        run(&mut s3, [200u128, 200, 200]);
        run(&mut s3, [201u128]);
        assert!(s3.contains(200));
        assert_eq!(s3.sizes()[0], 1); // 201 only
    }

    #[test]
    fn arc_adapts_its_target_to_recency_and_frequency() {
        let c = 100;
        let mut arc = Arc::new(c);
        // Frequency: a set of 60 keys read twice (T2), then scans of new keys.
        run(&mut arc, (0..2).flat_map(|_| 0u128..60));
        assert_eq!(arc.sizes()[1], 60);
        let mut next = 10_000u128;
        for _ in 0..20 {
            run(
                &mut arc,
                (0..80).map(|_| {
                    next += 1;
                    next
                }),
            );
            run(&mut arc, 0u128..60);
        }
        // The scans only ever churned T1; the frequent set stayed resident.
        assert!((0..60).all(|k| arc.contains(k)));
        let p_after_scans = arc.target_t1();
        assert!(p_after_scans < 50.0, "p = {p_after_scans}");
        // Recency: now a loop of 90 keys re-read right after leaving T1 —
        // B1 hits grow p (T1's target) towards the capacity.
        let mut last_p = p_after_scans;
        for _ in 0..10 {
            run(&mut arc, 20_000u128..20_090);
            last_p = last_p.max(arc.target_t1());
        }
        assert!(
            last_p > p_after_scans + 20.0,
            "p {p_after_scans} -> {last_p}"
        );
        let [t1, t2, b1, b2] = arc.sizes();
        assert!(t1 + t2 <= c && t1 + b1 <= c && t1 + t2 + b1 + b2 <= 2 * c);
    }

    #[test]
    fn arc_invariants_hold_under_removals() {
        let mut arc = Arc::new(50);
        let mut x = 7u64;
        for _ in 0..20_000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let k = ((x >> 33) % 200) as u128;
            if (x >> 20).is_multiple_of(10) {
                arc.remove(k);
            } else if arc.contains(k) {
                arc.hit(k);
            } else {
                arc.admit(k);
            }
            let [t1, t2, b1, b2] = arc.sizes();
            assert!(t1 + t2 <= 50);
            assert!(t1 + b1 <= 50, "{t1} {b1}");
            assert!(t1 + t2 + b1 + b2 <= 100);
            assert!((0.0..=50.0).contains(&arc.target_t1()));
        }
    }

    #[test]
    fn two_q_keeps_keys_seen_again_after_a1in() {
        let mut q = TwoQ::new(8); // Kin 2, Kout 4
        run(&mut q, 0u128..8);
        run(&mut q, 8u128..11); // pushes 0, 1, 2 out of A1in into A1out
        assert!(!q.contains(0));
        run(&mut q, [0u128]); // remembered: into Am
        run(&mut q, 100u128..140); // a scan only churns A1in
        assert!(q.contains(0));
    }

    #[test]
    fn zero_capacity_holds_nothing() {
        for mut p in all(0) {
            assert_eq!(run(p.as_mut(), (0..3).flat_map(|_| 0u128..5)), 0);
            assert_eq!(p.len(), 0);
        }
    }

    proptest::proptest! {
        /// Every policy stays within its capacity and agrees with a model set on
        /// what is resident, through admissions, hits and removals.
        #[test]
        fn residency_matches_what_the_policies_report(
            capacity in 0u32..40,
            ops in proptest::collection::vec((0u8..5, 0u128..120), 1..2000),
        ) {
            for kind in PolicyKind::ALL {
                let mut p = kind.build(capacity);
                for &(op, k) in &ops {
                    match op {
                        0 => { p.remove(k); }
                        _ => {
                            if p.contains(k) {
                                p.hit(k);
                            } else {
                                p.admit(k);
                                proptest::prop_assert_eq!(p.contains(k), capacity > 0, "{:?}", kind);
                            }
                        }
                    }
                    proptest::prop_assert!(p.len() <= capacity, "{:?}", kind);
                }
                let resident = (0..120u128).filter(|&k| p.contains(k)).count() as u32;
                proptest::prop_assert_eq!(resident, p.len(), "{:?}", kind);
            }
        }

        /// The replay counts exactly what the flash cache counts, with its own
        /// BlockCache as the policy: reads, hits, bytes, scan bypasses, fills,
        /// invalidations (fills complete before the next request).
        #[test]
        fn replay_counts_what_flash_cache_counts(
            capacity in 0u32..64,
            slru in proptest::bool::ANY,
            ios in proptest::collection::vec((0u32..2, 0u64..200, 1u64..40, 0u8..8), 1..400),
        ) {
            let policy = if slru { CachePolicy::Slru } else { CachePolicy::Lru };
            let block = 4096u64;
            let scan = 16 * block;
            let mut fc = FlashCache::new(FlashCacheSpec {
                capacity_blocks: capacity,
                block_bytes: block as u32,
                policy,
                scan_bytes: scan,
            });
            fc.add_volume(true);
            fc.add_volume(true);
            let mut replay = Replay::new(Block::new(capacity, policy), block as u32, scan);
            let mut last_end = [0u64; 2];
            for (volume, at, len, kind) in ios {
                // Offsets in 512-byte sectors (partial blocks), some sequential.
                let offset = if kind == 7 { last_end[volume as usize] } else { at * 1024 };
                let length = len * 1536;
                let io = TraceIo { volume, offset, length: length as u32, write: kind == 0 };
                if io.write {
                    // Sometimes a huge TRIM (drops the volume).
                    let length = if at == 0 { (MAX_INVALIDATE_BLOCKS + 1) * block } else { length };
                    let w = fc.write_begin(volume, offset, length);
                    fc.write_end(w);
                    replay.write(volume, offset, length);
                } else {
                    last_end[volume as usize] = offset + length;
                    match fc.read(volume, offset, length) {
                        ReadPlan::Hit { slots, .. } => {
                            proptest::prop_assert!(fc.still_valid(volume, &slots));
                        }
                        ReadPlan::Miss { fill: Some(f) } => {
                            fc.fill_slots(f);
                            fc.filled(f, true);
                        }
                        _ => {}
                    }
                    replay.apply(&io);
                }
            }
            let f = fc.total_stats();
            let r = replay.stats();
            proptest::prop_assert_eq!(f.read_hits, r.read_hits);
            proptest::prop_assert_eq!(f.read_hits + f.read_misses, r.reads);
            proptest::prop_assert_eq!(f.hit_bytes, r.hit_bytes);
            proptest::prop_assert_eq!(f.hit_bytes + f.miss_bytes, r.read_bytes);
            proptest::prop_assert_eq!(f.scan_bypasses, r.scan_bypasses);
            proptest::prop_assert_eq!(f.filled_blocks, r.filled_blocks);
            proptest::prop_assert_eq!(f.invalidated_blocks, r.invalidated_blocks);
        }
    }
}
