//! The clone-aware read cache of a pool's thin volumes: grains of read-only
//! (snapshot) layers, kept in memory by *physical* key — layer and slot — so a
//! golden image's grain is cached once for every clone that reads it, and read
//! from its data file once even when a boot storm of clones misses on it at the
//! same moment. Which grains stay, which leave and which misses wait for a read
//! already in flight is decided by [`weir_model::ReadCache`], the same model the
//! simulator's clone-aware array cache runs; this type only holds the data.
//!
//! Only frozen layers are cached: their grains never change, so the cache needs
//! no invalidation (a layer id is never reused, so a deleted layer's grains just
//! age out). The writable top of a volume is left to the kernel's page cache.
//! One exception: merging a frozen child *up* into its parent
//! ([`crate::commit_into`], replication) rewrites slots of a frozen layer that
//! only the child's readers could reach; it drops them with [`GrainCache::invalidate`].

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use weir_model::{CachePolicy, Lookup, ReadCache, ReadCacheStats};

use crate::layer::Layer;

struct Inner {
    model: ReadCache,
    data: HashMap<u128, Arc<[u8]>>,
    free_readers: Vec<u32>,
    next_reader: u32,
    /// Grains a partial read missed once (bounded FIFO): the next partial miss
    /// on one of them fills the cache.
    seen: std::collections::HashSet<u128>,
    seen_order: std::collections::VecDeque<u128>,
}

impl Inner {
    fn remember(&mut self, key: u128) {
        let cap = (self.model.capacity() as usize).max(1);
        while self.seen_order.len() >= cap {
            if let Some(old) = self.seen_order.pop_front() {
                self.seen.remove(&old);
            }
        }
        if self.seen.insert(key) {
            self.seen_order.push_back(key);
        }
    }

    fn reader(&mut self) -> u32 {
        self.free_readers.pop().unwrap_or_else(|| {
            self.next_reader += 1;
            self.next_reader - 1
        })
    }
}

pub struct GrainCache {
    inner: Mutex<Inner>,
    filled: Condvar,
    grain_bytes: u64,
}

fn key(layer: u64, slot: u32) -> u128 {
    ((layer as u128) << 32) | slot as u128
}

impl GrainCache {
    /// A cache of `size_bytes` (rounded down to whole grains).
    pub fn new(size_bytes: u64, grain_bytes: u64) -> GrainCache {
        let grains = (size_bytes / grain_bytes).min(u32::MAX as u64) as u32;
        GrainCache {
            inner: Mutex::new(Inner {
                // SLRU: a one-pass scan (a backup of one clone) cannot flush the
                // image's working set.
                model: ReadCache::new(grains, CachePolicy::Slru),
                data: HashMap::new(),
                free_readers: Vec::new(),
                next_reader: 0,
                seen: Default::default(),
                seen_order: Default::default(),
            }),
            filled: Condvar::new(),
            grain_bytes,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn stats(&self) -> ReadCacheStats {
        self.lock().model.stats()
    }

    /// Drops the cached copy of `layer`'s slot `slot`, if any (its data is
    /// about to change: a frozen layer merged into, see [`crate::commit_into`]).
    pub fn invalidate(&self, layer: u64, slot: u32) {
        let key = key(layer, slot);
        let mut g = self.lock();
        g.model.invalidate(key);
        g.data.remove(&key);
    }
    pub fn capacity_bytes(&self) -> u64 {
        self.lock().model.capacity() as u64 * self.grain_bytes
    }

    /// Serves part of `layer`'s slot `slot` only if it is resident (a hit, as
    /// [`Self::read`] counts it); false: nothing was done or counted.
    pub fn read_hit(&self, layer: &Layer, slot: u32, off: u64, buf: &mut [u8]) -> bool {
        let key = key(layer.id, slot);
        let mut g = self.lock();
        let Some(d) = g.data.get(&key).cloned() else {
            return false;
        };
        let reader = g.reader();
        let hit = g.model.lookup(key, reader) == Lookup::Hit;
        g.free_readers.push(reader);
        drop(g);
        if hit {
            buf.copy_from_slice(&d[off as usize..off as usize + buf.len()]);
        }
        hit
    }

    /// Reads part of `layer`'s slot `slot` through the cache.
    pub fn read(&self, layer: &Layer, slot: u32, off: u64, buf: &mut [u8]) -> io::Result<()> {
        let key = key(layer.id, slot);
        let mut g = self.lock();
        loop {
            let reader = g.reader();
            match g.model.lookup(key, reader) {
                Lookup::Hit => {
                    g.free_readers.push(reader);
                    let Some(d) = g.data.get(&key).cloned() else {
                        drop(g);
                        return layer.read_slot(slot, off, buf);
                    };
                    drop(g);
                    buf.copy_from_slice(&d[off as usize..off as usize + buf.len()]);
                    return Ok(());
                }
                Lookup::InFlight(_) => {
                    g.free_readers.push(reader);
                    g = self.filled.wait(g).unwrap_or_else(|p| p.into_inner());
                }
                Lookup::Miss if buf.len() as u64 == self.grain_bytes || g.seen.remove(&key) => {
                    return self.read_miss(g, reader, layer, slot, off, buf);
                }
                Lookup::Miss => {
                    // A first partial miss: read just the part (a 64 KiB fill for
                    // a 4 KiB random read thrashes the cache); a second one fills.
                    g.model.abort(reader);
                    g.free_readers.push(reader);
                    g.remember(key);
                    drop(g);
                    self.filled.notify_all();
                    return layer.read_slot(slot, off, buf);
                }
            }
        }
    }

    fn read_miss(
        &self,
        g: MutexGuard<'_, Inner>,
        reader: u32,
        layer: &Layer,
        slot: u32,
        off: u64,
        buf: &mut [u8],
    ) -> io::Result<()> {
        drop(g);
        let mut grain = vec![0u8; self.grain_bytes as usize];
        let r = layer.read_slot(slot, 0, &mut grain);
        let mut g = self.lock();
        match r {
            Ok(()) => {
                buf.copy_from_slice(&grain[off as usize..off as usize + buf.len()]);
                g.data.insert(key(layer.id, slot), grain.into());
                let mut evicted = Vec::new();
                g.model.fill(reader, |k| evicted.push(k));
                for k in evicted {
                    g.data.remove(&k);
                }
            }
            Err(_) => g.model.abort(reader),
        }
        g.free_readers.push(reader);
        drop(g);
        self.filled.notify_all();
        r
    }
}
