//! The flash read cache layer (ioTurbine's host-side cache, seed 000): a pool's
//! `flash_cache = { dir = …, size = … }` puts one cache file on a fast device,
//! and each volume with `cache = "flash"` reads through it.
//!
//! Which reads hit, which misses fill, where a block lives in the file and when
//! it may no longer be served are [`weir_model::FlashCache`]'s decisions (the
//! model the simulator's host cache runs); this layer holds the file and does
//! the I/O. Write-through with invalidation: a WRITE, TRIM or WRITE_ZEROES drops
//! the blocks it touches before it goes down and is acknowledged only when the
//! layer below acknowledged it, so the cache never holds data older than an
//! acknowledged write.
//!
//! The cache is volatile: the file is emptied at every start, so nothing in it
//! can be stale after a crash or after the backing data changed while the
//! server was down. Its data is not needed for durability (every write is on
//! the layer below), so FLUSH never touches it. A failing cache device never
//! fails a client's read: a flash read error reads the layer below instead,
//! a flash write error drops the fill (both counted in `errors`).
//!
//! Nobody may write the volume's backing data behind the cache. A local file is
//! the server's alone; an upstream export is kept so by its exclusive lease
//! (`crate::lease`): the layer asks the backend below ([`Backend::ownership`])
//! before every read, reads through without the cache while the lease is not
//! held or not confirmed within [`crate::lease::LEASE_FRESH`], and drops the
//! volume's blocks when the lease is granted anew (it may have been lost in
//! between). Data changed beneath it by the server itself (a rollback) drops
//! the volume's blocks.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};
use weir_model::{
    CachePolicy, FillId, FlashCache, FlashCacheSpec, FlashCacheStats, ReadPlan, SlotRef,
};
use weir_nbd::Extent;

use crate::backend::{Backend, Ownership};
use crate::config::ByteSize;

/// A pool's `flash_cache = { … }`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlashCacheConfig {
    /// Directory on the fast device; the cache file is `<pool>.weir-cache` in it.
    pub dir: PathBuf,
    /// Cache capacity (the file's size).
    pub size: ByteSize,
    /// Cache block: the unit read, filled and dropped (default 4 KiB: the
    /// smallest read an OLTP or VDI guest issues, so a random 4-8 KiB read fills
    /// exactly what it read).
    #[serde(default = "default_block")]
    pub block: ByteSize,
    /// Sequential-scan cutoff (bcache's `sequential_cutoff`, same default): a
    /// read this long, or continuing a sequential run this long, fills nothing.
    /// 0: admit everything.
    #[serde(default = "default_scan_cutoff")]
    pub scan_cutoff: ByteSize,
}

fn default_block() -> ByteSize {
    ByteSize(weir_model::DEFAULT_FLASH_BLOCK_BYTES)
}
fn default_scan_cutoff() -> ByteSize {
    ByteSize(weir_model::DEFAULT_SCAN_CUTOFF_BYTES)
}

/// Most blocks a cache may have (its index takes 48-64 bytes of memory each).
pub const MAX_BLOCKS: u64 = weir_model::MAX_FLASH_CACHE_BLOCKS;
/// Stripes of the slot locks (a slot is written under its stripe's lock).
const STRIPES: usize = 256;

impl FlashCacheConfig {
    pub fn validate(&self) -> Result<(), String> {
        let b = self.block.0;
        if !b.is_power_of_two() || !(4096..=1 << 20).contains(&b) {
            return Err(format!(
                "flash_cache.block must be a power of two from 4 KiB to 1 MiB, got {b}"
            ));
        }
        if self.size.0 < b {
            return Err(format!(
                "flash_cache.size ({}) must hold at least one block ({b})",
                self.size.0
            ));
        }
        if self.size.0 / b > MAX_BLOCKS {
            return Err(format!(
                "flash_cache: {} blocks of {b} bytes is more than {MAX_BLOCKS} (use a larger block)",
                self.size.0 / b
            ));
        }
        if self.dir.as_os_str().is_empty() {
            return Err("flash_cache.dir is empty".into());
        }
        Ok(())
    }
}

/// A volume's `cache`.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VolumeCache {
    /// Reads go to the volume's backend (the default).
    #[default]
    None,
    /// Reads go through the pool's flash cache.
    Flash,
}

impl VolumeCache {
    pub fn name(self) -> &'static str {
        match self {
            VolumeCache::None => "none",
            VolumeCache::Flash => "flash",
        }
    }
    pub fn parse(text: &str) -> Result<VolumeCache, String> {
        match text {
            "none" => Ok(VolumeCache::None),
            "flash" => Ok(VolumeCache::Flash),
            _ => Err(format!("cache must be \"none\" or \"flash\", not {text:?}")),
        }
    }
}

/// One pool's cache file and the decisions about it.
pub struct FlashCacheDevice {
    pool: String,
    path: PathBuf,
    file: File,
    nowait_reads: crate::backend::NowaitReads,
    block_bytes: u64,
    model: Mutex<FlashCache>,
    stripes: Vec<Mutex<()>>,
    /// The model's id of each volume (by name) that has a layer.
    volumes: Mutex<HashMap<String, u32>>,
    /// Cache file reads or writes that failed.
    pub errors: AtomicU64,
    /// Reads sent past the cache: the volume's backing data was not the
    /// server's alone then (its upstream lease not held or not confirmed).
    pub unowned_reads: AtomicU64,
    /// Volumes' blocks dropped because their lease was granted anew.
    pub lease_drops: AtomicU64,
}

/// A pool's cache counters now (metrics).
#[derive(Clone, Debug, Default)]
pub struct FlashCacheSnapshot {
    pub pool: String,
    pub capacity_bytes: u64,
    pub resident_bytes: u64,
    pub errors: u64,
    pub unowned_reads: u64,
    pub lease_drops: u64,
    /// Per volume with `cache = "flash"` (or that had it since the start).
    pub volumes: Vec<(String, FlashCacheStats)>,
}

impl FlashCacheDevice {
    /// Creates (or empties) the pool's cache file and locks it against a second
    /// server.
    pub fn open(pool: &str, config: &FlashCacheConfig) -> Result<Arc<FlashCacheDevice>, String> {
        config.validate()?;
        crate::store::create_dirs(&config.dir)
            .map_err(|e| format!("flash_cache.dir {}: {e}", config.dir.display()))?;
        let path = config.dir.join(format!("{pool}.weir-cache"));
        let file = open_exclusive(&path).map_err(|e| format!("flash cache {e}"))?;
        let blocks = config.size.0 / config.block.0;
        // Volatile: whatever an earlier run left is dropped (never trusted).
        file.set_len(0)
            .and_then(|_| file.set_len(blocks * config.block.0))
            .map_err(|e| format!("flash cache {}: {e}", path.display()))?;
        let model = FlashCache::new(FlashCacheSpec {
            capacity_blocks: blocks as u32,
            block_bytes: config.block.0 as u32,
            policy: CachePolicy::Slru,
            scan_bytes: config.scan_cutoff.0,
        });
        Ok(Arc::new(FlashCacheDevice {
            pool: pool.to_string(),
            path,
            file,
            nowait_reads: crate::backend::NowaitReads::new(),
            block_bytes: config.block.0,
            model: Mutex::new(model),
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            volumes: Mutex::new(HashMap::new()),
            errors: AtomicU64::new(0),
            unowned_reads: AtomicU64::new(0),
            lease_drops: AtomicU64::new(0),
        }))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn model(&self) -> MutexGuard<'_, FlashCache> {
        self.model.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn ids(&self) -> MutexGuard<'_, HashMap<String, u32>> {
        self.volumes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wraps a volume's stack in the cache layer (cached or not, so `cache` can
    /// be switched on later without reopening the volume).
    pub fn wrap(
        self: &Arc<Self>,
        volume: &str,
        cache: VolumeCache,
        inner: Arc<dyn Backend>,
    ) -> Arc<dyn Backend> {
        let enabled = cache == VolumeCache::Flash;
        let id = {
            let mut ids = self.ids();
            let mut model = self.model();
            match ids.get(volume) {
                // Reopened (a snapshot view swapped, a resize): what it held may
                // not be the volume's data now.
                Some(&id) => {
                    model.drop_volume(id);
                    model.set_enabled(id, enabled);
                    id
                }
                None => {
                    let id = model.add_volume(enabled);
                    ids.insert(volume.to_string(), id);
                    id
                }
            }
        };
        Arc::new(FlashCacheLayer {
            inner,
            dev: self.clone(),
            volume: id,
            generation: AtomicU64::new(UNSEEN),
        })
    }

    /// Switches a volume's caching (takes effect at once).
    pub fn set_cache(&self, volume: &str, cache: VolumeCache) {
        if let Some(&id) = self.ids().get(volume) {
            self.model().set_enabled(id, cache == VolumeCache::Flash);
        }
    }

    /// The volume's data changed beneath the cache (rollback, delete).
    pub fn drop_volume(&self, volume: &str) {
        if let Some(&id) = self.ids().get(volume) {
            self.model().drop_volume(id);
        }
    }

    pub fn snapshot(&self) -> FlashCacheSnapshot {
        let ids: Vec<(String, u32)> = self.ids().iter().map(|(n, &i)| (n.clone(), i)).collect();
        let model = self.model();
        let mut volumes: Vec<(String, FlashCacheStats)> = ids
            .into_iter()
            .filter(|(_, id)| {
                model.is_enabled(*id)
                    || model.stats(*id).read_hits + model.stats(*id).read_misses > 0
            })
            .map(|(n, id)| (n, model.stats(id)))
            .collect();
        volumes.sort_by(|a, b| a.0.cmp(&b.0));
        FlashCacheSnapshot {
            pool: self.pool.clone(),
            capacity_bytes: model.spec().capacity_blocks as u64 * self.block_bytes,
            resident_bytes: model.resident_blocks() as u64 * self.block_bytes,
            errors: self.errors.load(Ordering::Relaxed),
            unowned_reads: self.unowned_reads.load(Ordering::Relaxed),
            lease_drops: self.lease_drops.load(Ordering::Relaxed),
            volumes,
        }
    }

    /// Reads a hit's bytes from the cache file with `read(part, at)` (false:
    /// give up), one call per run of consecutive slots.
    fn read_hit_with(
        &self,
        first_block: u64,
        slots: &[SlotRef],
        offset: u64,
        buf: &mut [u8],
        mut read: impl FnMut(&mut [u8], u64) -> bool,
    ) -> bool {
        let bs = self.block_bytes;
        let end = offset + buf.len() as u64;
        let mut i = 0;
        while i < slots.len() {
            let mut j = i + 1;
            while j < slots.len() && slots[j].slot == slots[j - 1].slot + 1 {
                j += 1;
            }
            let lo = ((first_block + i as u64) * bs).max(offset);
            let hi = ((first_block + j as u64) * bs).min(end);
            let at = slots[i].slot as u64 * bs + (lo - (first_block + i as u64) * bs);
            if !read(&mut buf[(lo - offset) as usize..(hi - offset) as usize], at) {
                return false;
            }
            i = j;
        }
        true
    }

    /// Reads a hit's bytes from the cache file (a failed read is counted).
    fn read_hit(&self, first_block: u64, slots: &[SlotRef], offset: u64, buf: &mut [u8]) -> bool {
        self.read_hit_with(first_block, slots, offset, buf, |part, at| {
            match self.file.read_exact_at(part, at) {
                Ok(()) => true,
                Err(e) => {
                    self.errors.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!("flash cache {}: read: {e}", self.path.display());
                    false
                }
            }
        })
    }

    /// As [`FlashCacheDevice::read_hit`], only from the page cache (`false`:
    /// some of it would wait for the device).
    fn read_hit_nowait(
        &self,
        first_block: u64,
        slots: &[SlotRef],
        offset: u64,
        buf: &mut [u8],
    ) -> bool {
        self.read_hit_with(first_block, slots, offset, buf, |part, at| {
            self.nowait_reads.read(&self.file, part, at)
        })
    }

    /// Writes a miss's whole blocks to their slots and ends the fill.
    fn fill(&self, fill: FillId, data: &[u8]) {
        let slots = self.model().fill_slots(fill);
        let mut ok = true;
        for s in &slots {
            let _stripe = self.stripes[s.slot.slot as usize % STRIPES]
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if !self.model().slot_current(s.slot) {
                continue;
            }
            let from = s.offset_in_read as usize;
            let block = &data[from..from + self.block_bytes as usize];
            if self
                .file
                .write_all_at(block, s.slot.slot as u64 * self.block_bytes)
                .is_err()
            {
                self.errors.fetch_add(1, Ordering::Relaxed);
                ok = false;
                break;
            }
        }
        self.model().filled(fill, ok);
    }
}

/// One volume's view of its pool's cache.
struct FlashCacheLayer {
    inner: Arc<dyn Backend>,
    dev: Arc<FlashCacheDevice>,
    volume: u32,
    /// The backend's ownership generation the cached blocks belong to.
    generation: AtomicU64,
}

/// No generation seen yet.
const UNSEEN: u64 = u64::MAX;

impl FlashCacheLayer {
    /// Whether the cache may serve and keep this volume's data now (the backend
    /// below is the server's alone); a new generation drops what it kept.
    /// `count`: a "no" counts as an unowned read.
    fn owned(&self, count: bool) -> bool {
        self.owned_as(self.inner.ownership(), count)
    }

    /// [`Self::owned`] with the backend's answer given.
    fn owned_as(&self, ownership: Ownership, count: bool) -> bool {
        match ownership {
            Ownership::Unsure => {
                if count {
                    self.dev.unowned_reads.fetch_add(1, Ordering::Relaxed);
                }
                false
            }
            Ownership::Exclusive { generation } => {
                let seen = self.generation.swap(generation, Ordering::AcqRel);
                if seen != generation && seen != UNSEEN {
                    self.dev.model().drop_volume(self.volume);
                    self.dev.lease_drops.fetch_add(1, Ordering::Relaxed);
                }
                true
            }
        }
    }

    /// Runs a call that changes the volume's data, dropping the blocks it
    /// touches first.
    fn changing<T>(
        &self,
        offset: u64,
        length: u64,
        call: impl FnOnce() -> io::Result<T>,
    ) -> io::Result<T> {
        let w = self.dev.model().write_begin(self.volume, offset, length);
        let r = call();
        self.dev.model().write_end(w);
        r
    }
}

impl Backend for FlashCacheLayer {
    // No `start_async`, `write_nowait` or `cached_source`: every read and write
    // must pass through the cache's decisions. `read_nowait` serves hits whose
    // blocks are in the page cache without a blocking thread.
    fn read_nowait(&self, offset: u64, buf: &mut [u8]) -> io::Result<bool> {
        // Not owned: the blocking read counts it and reads through.
        if !self.owned(false) {
            return Ok(false);
        }
        let len = buf.len() as u64;
        let Some((first, slots)) = self.dev.model().peek_hit(self.volume, offset, len) else {
            return Ok(false);
        };
        if !self.dev.read_hit_nowait(first, &slots, offset, buf) {
            return Ok(false);
        }
        Ok(self
            .dev
            .model()
            .confirm_hit(self.volume, offset, len, &slots))
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        // A blocking caller: an idle volume's lapsed lease is confirmed (one
        // round trip) rather than its read sent past the cache.
        if !self.owned_as(self.inner.confirm_ownership(), true) {
            return self.inner.read(offset, buf);
        }
        let plan = self.dev.model().read(self.volume, offset, buf.len() as u64);
        match plan {
            ReadPlan::Bypass => self.inner.read(offset, buf),
            ReadPlan::Hit { first_block, slots } => {
                if self.dev.read_hit(first_block, &slots, offset, buf)
                    && self.dev.model().still_valid(self.volume, &slots)
                {
                    return Ok(());
                }
                self.inner.read(offset, buf)
            }
            ReadPlan::Miss { fill } => {
                let r = self.inner.read(offset, buf);
                if let Some(fill) = fill {
                    match r {
                        Ok(()) => self.dev.fill(fill, buf),
                        Err(_) => self.dev.model().filled(fill, false),
                    }
                }
                r
            }
        }
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.changing(offset, data.len() as u64, || self.inner.write(offset, data))
    }

    fn write_fua(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.changing(offset, data.len() as u64, || {
            self.inner.write_fua(offset, data)
        })
    }

    fn flush(&self) -> io::Result<()> {
        self.inner.flush()
    }

    fn trim(&self, offset: u64, length: u64) -> io::Result<()> {
        self.changing(offset, length, || self.inner.trim(offset, length))
    }

    fn write_zeroes(
        &self,
        offset: u64,
        length: u64,
        may_punch: bool,
        fast_only: bool,
    ) -> io::Result<()> {
        self.changing(offset, length, || {
            self.inner
                .write_zeroes(offset, length, may_punch, fast_only)
        })
    }

    fn block_status(&self, offset: u64, length: u64) -> io::Result<Vec<Extent>> {
        self.inner.block_status(offset, length)
    }

    fn ownership(&self) -> Ownership {
        self.inner.ownership()
    }

    fn confirm_ownership(&self) -> Ownership {
        self.inner.confirm_ownership()
    }

    fn cache(&self, offset: u64, length: u64) -> io::Result<()> {
        self.inner.cache(offset, length)
    }
}

/// Opens (creating, 0600) a file of a fast device's directory and locks it
/// against a second server (`flock`, non-blocking): the flash cache's and the
/// hybrid tier's files. Errors start with the path.
pub(crate) fn open_exclusive(path: &std::path::Path) -> Result<File, String> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    // SAFETY: flock on a descriptor this function owns.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(format!(
            "{}: in use by another process ({})",
            path.display(),
            io::Error::last_os_error()
        ));
    }
    Ok(file)
}
