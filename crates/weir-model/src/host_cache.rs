//! Host-side flash read cache (ioTurbine-like): a PCIe flash card in the host caches
//! reads of the volumes it is enabled for, write-through.
//!
//! Placement in a simulated path: between the host and its link. For each read of a
//! volume the driver calls [`HostFlashCache::lookup`]:
//! * [`HostCacheLookup::Bypass`]: the volume is not cached; send the read on as usual.
//! * [`HostCacheLookup::Hit`]: every block is resident; submit the read to the cache
//!   (it is a [`Component`]: the flash card's timing, ioDrive2 by default) and complete
//!   the host request when the cache completes it. Nothing goes to the array.
//! * [`HostCacheLookup::Miss`]: read from the array as usual; when that read completes,
//!   call [`HostFlashCache::fill_on_read_completion`] with the ticket (the cache writes
//!   the blocks to flash in the background; the host read is not delayed by it).
//! * [`HostCacheLookup::Partial`]: some blocks resident. The simplest faithful use:
//!   read `[miss_offset_bytes, +miss_size_bytes)` from the array and the rest from the
//!   flash (submit the whole request to the cache), complete when both are done, then
//!   fill with the ticket. Treating it as a miss is also correct, just slower.
//!
//! Every write of a cached volume must be reported with [`HostFlashCache::on_write`]
//! (write-through: the write itself still goes to the array and completes when the
//! array acknowledges it). Resident blocks the write covers are updated in flash
//! ([`HostWriteMode::Update`], default) or dropped ([`HostWriteMode::Invalidate`]), and
//! any fill still in flight for those blocks is cancelled, so a read that raced with a
//! write can never put the older data in the cache.
//!
//! Granularity: `block_bytes` (4 KiB default); a read fills only the blocks it covers
//! completely, a block is a hit only if resident. Replacement: [`CachePolicy::Slru`]
//! (scan-resistant) by default, or [`CachePolicy::Lru`].

use serde::{Deserialize, Serialize};

use crate::block_cache::{BlockCache, CachePolicy};
use crate::error::ModelError;
use crate::ssd::{Ssd, SsdSpec};
use crate::{Completion, Component, DeviceIo, IoDir, Nanos};

/// What a write does to resident blocks it covers.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HostWriteMode {
    /// Write the new data to flash too (resident blocks stay valid; costs a flash write).
    #[default]
    Update,
    /// Drop resident blocks the write touches.
    Invalidate,
}

fn default_block_bytes() -> u32 {
    4096
}

/// Host flash cache description (TOML: `{ capacity_gib = 400 }` style keys below).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostCacheSpec {
    /// Cache capacity, bytes (at most the flash device's capacity).
    pub capacity_bytes: u64,
    /// Cache block, bytes (power of two, 512 B – 1 MiB).
    #[serde(default = "default_block_bytes")]
    pub block_bytes: u32,
    #[serde(default)]
    pub policy: CachePolicy,
    #[serde(default)]
    pub write_mode: HostWriteMode,
    /// Also insert blocks a write fully covers that were not resident.
    #[serde(default)]
    pub populate_on_write: bool,
    /// The flash card (default: Fusion-io ioDrive2 785 GB, as in seed 000).
    #[serde(default = "SsdSpec::iodrive2")]
    pub flash: SsdSpec,
}

impl HostCacheSpec {
    /// An ioTurbine-like cache of `capacity_bytes` on an ioDrive2, 4 KiB blocks, SLRU,
    /// write-update.
    pub fn iodrive2(capacity_bytes: u64) -> Self {
        Self {
            capacity_bytes,
            block_bytes: 4096,
            policy: CachePolicy::Slru,
            write_mode: HostWriteMode::Update,
            populate_on_write: false,
            flash: SsdSpec::iodrive2(),
        }
    }

    pub fn validate(&self) -> Result<(), ModelError> {
        check_block_bytes("host cache", self.block_bytes)?;
        self.flash.validate()?;
        if self.capacity_bytes > self.flash.capacity_bytes {
            return Err(ModelError::InvalidField {
                what: "host cache",
                field: "capacity_bytes",
                value: self.capacity_bytes.to_string(),
                reason: "exceeds the flash device's capacity_bytes",
            });
        }
        blocks_u32("host cache", self.capacity_bytes, self.block_bytes)?;
        Ok(())
    }
}

pub(crate) fn check_block_bytes(what: &'static str, block_bytes: u32) -> Result<(), ModelError> {
    if !block_bytes.is_power_of_two() || !(512..=(1 << 20)).contains(&block_bytes) {
        return Err(ModelError::InvalidField {
            what,
            field: "block_bytes",
            value: block_bytes.to_string(),
            reason: "must be a power of two in 512..=1048576",
        });
    }
    Ok(())
}

pub(crate) fn blocks_u32(what: &'static str, bytes: u64, block: u32) -> Result<u32, ModelError> {
    let n = bytes / block as u64;
    if n >= u32::MAX as u64 {
        return Err(ModelError::InvalidField {
            what,
            field: "capacity_bytes",
            value: bytes.to_string(),
            reason: "too many cache blocks (at most 2^32 - 2)",
        });
    }
    Ok(n as u32)
}

/// Handle for the fill of one missed read.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct FillTicket {
    slot: u32,
    generation: u32,
}

/// Outcome of [`HostFlashCache::lookup`].
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum HostCacheLookup {
    /// The volume is not cached (or the read is empty).
    Bypass,
    /// All blocks resident: serve from flash.
    Hit,
    /// Nothing resident: read from the array, then fill with the ticket.
    Miss { fill: FillTicket },
    /// Some blocks resident. The missing ones lie within
    /// `[miss_offset_bytes, miss_offset_bytes + miss_size_bytes)` (clipped to the read).
    Partial {
        hit_bytes: u64,
        miss_offset_bytes: u64,
        miss_size_bytes: u32,
        fill: FillTicket,
    },
}

/// Counters of a host cache.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct HostCacheStats {
    /// Reads of cached volumes looked up.
    pub lookups: u64,
    /// Reads served entirely from flash.
    pub read_hits: u64,
    pub read_partial: u64,
    pub read_misses: u64,
    /// Bytes of looked-up reads resident / not resident.
    pub hit_bytes: u64,
    pub miss_bytes: u64,
    /// Blocks inserted by read fills and by writes.
    pub filled_blocks: u64,
    /// Fills dropped because a write overlapped them while the read was in flight.
    pub fills_cancelled: u64,
    pub write_updated_blocks: u64,
    pub write_invalidated_blocks: u64,
    pub evicted_blocks: u64,
    /// Writes reported for cached volumes.
    pub writes: u64,
    /// Flash device traffic (hits read, fills and updates written).
    pub flash_reads: u64,
    pub flash_read_bytes: u64,
    pub flash_writes: u64,
    pub flash_write_bytes: u64,
}

impl HostCacheStats {
    /// Share of looked-up bytes that were resident.
    pub fn byte_hit_ratio(&self) -> f64 {
        let t = self.hit_bytes + self.miss_bytes;
        if t == 0 {
            0.0
        } else {
            self.hit_bytes as f64 / t as f64
        }
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct VolumeState {
    enabled: bool,
    /// Bumped on disable: older entries of the volume become unreachable.
    epoch: u32,
    /// Fills in flight for this volume.
    pending: u32,
}

#[derive(Clone, Copy, Debug)]
struct PendingFill {
    volume: u32,
    epoch: u32,
    first_block: u64,
    end_block: u64,
    generation: u32,
    live: bool,
    cancelled: bool,
}

/// Largest volume id accepted (volume state is a dense table).
pub const MAX_CACHED_VOLUME: u32 = (1 << 24) - 1;

/// Token of the cache's own background flash writes (never reported).
const INTERNAL: u64 = u64::MAX;

/// ioTurbine-like host flash read cache: index + flash device timing.
#[derive(Clone, Debug)]
pub struct HostFlashCache {
    spec: HostCacheSpec,
    block_shift: u32,
    index: BlockCache,
    volumes: Vec<VolumeState>,
    pending: Vec<PendingFill>,
    free_pending: Vec<u32>,
    live_pending: u32,
    flash: Ssd,
    /// Caller tokens of flash operations in flight, by flash token.
    tokens: Vec<u64>,
    free_tokens: Vec<u32>,
    scratch: Vec<Completion>,
    stats: HostCacheStats,
}

impl HostFlashCache {
    pub fn new(spec: &HostCacheSpec) -> Result<Self, ModelError> {
        spec.validate()?;
        let blocks = blocks_u32("host cache", spec.capacity_bytes, spec.block_bytes)?;
        Ok(Self {
            block_shift: spec.block_bytes.trailing_zeros(),
            index: BlockCache::new(blocks, spec.policy),
            volumes: Vec::new(),
            pending: Vec::new(),
            free_pending: Vec::new(),
            live_pending: 0,
            flash: Ssd::new(&spec.flash)?,
            tokens: Vec::new(),
            free_tokens: Vec::new(),
            scratch: Vec::new(),
            stats: HostCacheStats::default(),
            spec: spec.clone(),
        })
    }

    pub fn spec(&self) -> &HostCacheSpec {
        &self.spec
    }

    pub fn stats(&self) -> HostCacheStats {
        self.stats
    }

    /// Resident bytes.
    pub fn resident_bytes(&self) -> u64 {
        self.index.len() as u64 * self.spec.block_bytes as u64
    }

    /// Opts `volume` in (idempotent).
    pub fn enable_volume(&mut self, volume: u32) -> Result<(), ModelError> {
        if volume > MAX_CACHED_VOLUME {
            return Err(ModelError::InvalidField {
                what: "host cache",
                field: "volume",
                value: volume.to_string(),
                reason: "volume ids above 16777215 are not supported",
            });
        }
        if self.volumes.len() <= volume as usize {
            self.volumes
                .resize(volume as usize + 1, VolumeState::default());
        }
        self.volumes[volume as usize].enabled = true;
        Ok(())
    }

    /// Opts `volume` out; its cached blocks are dropped (lazily, by replacement) and
    /// its fills in flight are cancelled.
    pub fn disable_volume(&mut self, volume: u32) {
        if let Some(v) = self.volumes.get_mut(volume as usize)
            && v.enabled
        {
            v.enabled = false;
            v.epoch = v.epoch.wrapping_add(1);
            self.cancel_overlapping(volume, 0, u64::MAX);
        }
    }

    pub fn is_enabled(&self, volume: u32) -> bool {
        self.volumes.get(volume as usize).is_some_and(|v| v.enabled)
    }

    fn key(&self, volume: u32, block: u64) -> u128 {
        let epoch = self.volumes[volume as usize].epoch;
        ((volume as u128) << 96) | ((epoch as u128) << 64) | block as u128
    }

    /// Looks a read up (counts it, refreshes the recency of resident blocks).
    pub fn lookup(&mut self, volume: u32, offset_bytes: u64, size_bytes: u32) -> HostCacheLookup {
        if size_bytes == 0 || !self.is_enabled(volume) {
            return HostCacheLookup::Bypass;
        }
        self.stats.lookups += 1;
        let bs = self.spec.block_bytes as u64;
        let end = offset_bytes.saturating_add(size_bytes as u64);
        let first = offset_bytes >> self.block_shift;
        let last = (end - 1) >> self.block_shift;
        let mut hit_bytes = 0u64;
        let mut miss_first = u64::MAX;
        let mut miss_last = 0;
        for b in first..=last {
            let lo = (b * bs).max(offset_bytes);
            let hi = ((b + 1) * bs).min(end);
            let key = self.key(volume, b);
            if self.index.touch(key) {
                hit_bytes += hi - lo;
            } else {
                miss_first = miss_first.min(b);
                miss_last = b;
            }
        }
        let total = end - offset_bytes;
        self.stats.hit_bytes += hit_bytes;
        self.stats.miss_bytes += total - hit_bytes;
        if hit_bytes == total {
            self.stats.read_hits += 1;
            return HostCacheLookup::Hit;
        }
        let fill = self.new_fill(volume, offset_bytes, end);
        if hit_bytes == 0 {
            self.stats.read_misses += 1;
            return HostCacheLookup::Miss { fill };
        }
        self.stats.read_partial += 1;
        let m_lo = (miss_first * bs).max(offset_bytes);
        let m_hi = ((miss_last + 1) * bs).min(end);
        HostCacheLookup::Partial {
            hit_bytes,
            miss_offset_bytes: m_lo,
            miss_size_bytes: (m_hi - m_lo) as u32,
            fill,
        }
    }

    /// Blocks fully inside `[offset, end)`.
    fn covered_blocks(&self, offset: u64, end: u64) -> (u64, u64) {
        let bs = self.spec.block_bytes as u64;
        (offset.div_ceil(bs), end / bs)
    }

    fn new_fill(&mut self, volume: u32, offset: u64, end: u64) -> FillTicket {
        let (first_block, end_block) = self.covered_blocks(offset, end);
        let epoch = self.volumes[volume as usize].epoch;
        let slot = match self.free_pending.pop() {
            Some(s) => s,
            None => {
                self.pending.push(PendingFill {
                    volume,
                    epoch,
                    first_block,
                    end_block,
                    generation: 0,
                    live: false,
                    cancelled: false,
                });
                (self.pending.len() - 1) as u32
            }
        };
        let p = &mut self.pending[slot as usize];
        let generation = p.generation.wrapping_add(1);
        *p = PendingFill {
            volume,
            epoch,
            first_block,
            end_block,
            generation,
            live: true,
            cancelled: false,
        };
        self.live_pending += 1;
        self.volumes[volume as usize].pending += 1;
        FillTicket { slot, generation }
    }

    fn take_fill(&mut self, ticket: FillTicket) -> Option<PendingFill> {
        let p = self.pending.get_mut(ticket.slot as usize)?;
        if !p.live || p.generation != ticket.generation {
            return None;
        }
        p.live = false;
        let p = *p;
        self.free_pending.push(ticket.slot);
        self.live_pending -= 1;
        if let Some(v) = self.volumes.get_mut(p.volume as usize) {
            v.pending -= 1;
        }
        Some(p)
    }

    /// The array read of a missed lookup completed at `now`: inserts the blocks it
    /// fully covers (unless a write overlapped them meanwhile or the volume was
    /// disabled) and writes them to flash in the background. Returns the number of
    /// blocks inserted. An unknown or already used ticket is ignored (returns 0).
    pub fn fill_on_read_completion(&mut self, now: Nanos, ticket: FillTicket) -> u32 {
        let Some(p) = self.take_fill(ticket) else {
            return 0;
        };
        let v = self.volumes[p.volume as usize];
        if p.cancelled || !v.enabled || v.epoch != p.epoch {
            self.stats.fills_cancelled += 1;
            return 0;
        }
        let mut inserted = 0u32;
        for b in p.first_block..p.end_block {
            let key = self.key(p.volume, b);
            if self.index.contains(key) {
                continue;
            }
            if self.index.insert(key).is_some() {
                self.stats.evicted_blocks += 1;
            }
            inserted += 1;
        }
        self.stats.filled_blocks += inserted as u64;
        if inserted > 0 {
            let bytes = inserted as u64 * self.spec.block_bytes as u64;
            self.flash_write(now, p.first_block << self.block_shift, bytes);
        }
        inserted
    }

    /// Forgets a fill whose array read failed.
    pub fn cancel_fill(&mut self, ticket: FillTicket) {
        self.take_fill(ticket);
    }

    /// A write to `volume` was sent to the array (write-through). Updates or drops the
    /// resident blocks it covers and cancels overlapping fills in flight. Writes of
    /// volumes that are not cached are ignored.
    pub fn on_write(&mut self, now: Nanos, volume: u32, offset_bytes: u64, size_bytes: u32) {
        if size_bytes == 0 || !self.is_enabled(volume) {
            return;
        }
        self.stats.writes += 1;
        let bs = self.spec.block_bytes as u64;
        let end = offset_bytes.saturating_add(size_bytes as u64);
        let first = offset_bytes >> self.block_shift;
        let last = (end - 1) >> self.block_shift;
        if self.volumes[volume as usize].pending > 0 {
            self.cancel_overlapping(volume, first, last + 1);
        }
        let mut flash_bytes = 0u64;
        for b in first..=last {
            let key = self.key(volume, b);
            let lo = (b * bs).max(offset_bytes);
            let hi = ((b + 1) * bs).min(end);
            match self.spec.write_mode {
                HostWriteMode::Invalidate => {
                    if self.index.remove(key) {
                        self.stats.write_invalidated_blocks += 1;
                    }
                }
                HostWriteMode::Update => {
                    if self.index.contains(key) {
                        // Recency is not refreshed by a write (a read cache).
                        self.stats.write_updated_blocks += 1;
                        flash_bytes += hi - lo;
                    } else if self.spec.populate_on_write && hi - lo == bs {
                        if self.index.insert(key).is_some() {
                            self.stats.evicted_blocks += 1;
                        }
                        self.stats.filled_blocks += 1;
                        flash_bytes += bs;
                    }
                }
            }
        }
        if flash_bytes > 0 {
            self.flash_write(now, offset_bytes, flash_bytes);
        }
    }

    fn cancel_overlapping(&mut self, volume: u32, first: u64, end: u64) {
        if self.live_pending == 0 {
            return;
        }
        for p in &mut self.pending {
            if p.live && p.volume == volume && p.first_block < end && first < p.end_block {
                p.cancelled = true;
            }
        }
    }

    /// Whether block `offset_bytes / block_bytes` of `volume` is resident.
    pub fn is_resident(&self, volume: u32, offset_bytes: u64) -> bool {
        self.is_enabled(volume)
            && self
                .index
                .contains(self.key(volume, offset_bytes >> self.block_shift))
    }

    fn flash_write(&mut self, now: Nanos, offset: u64, bytes: u64) {
        let mut left = bytes;
        let mut off = offset;
        while left > 0 {
            let n = left.min(1 << 20);
            self.stats.flash_writes += 1;
            self.stats.flash_write_bytes += n;
            self.flash.submit(
                now,
                DeviceIo {
                    offset_bytes: off,
                    size_bytes: n as u32,
                    dir: IoDir::Write,
                },
                INTERNAL,
            );
            left -= n;
            off += n;
        }
    }
}

/// The flash device: the driver submits reads that hit (`token` is returned in the
/// completion). Background fill/update writes share the device and are not reported.
impl Component for HostFlashCache {
    fn submit(&mut self, now: Nanos, io: DeviceIo, token: u64) {
        let slot = match self.free_tokens.pop() {
            Some(s) => {
                self.tokens[s as usize] = token;
                s
            }
            None => {
                self.tokens.push(token);
                (self.tokens.len() - 1) as u32
            }
        };
        match io.dir {
            IoDir::Read => {
                self.stats.flash_reads += 1;
                self.stats.flash_read_bytes += io.size_bytes as u64;
            }
            IoDir::Write => {
                self.stats.flash_writes += 1;
                self.stats.flash_write_bytes += io.size_bytes as u64;
            }
        }
        self.flash.submit(now, io, slot as u64);
    }

    fn next_event_ns(&self) -> Option<Nanos> {
        self.flash.next_event_ns()
    }

    fn advance(&mut self, now: Nanos, done: &mut Vec<Completion>) {
        let mut scratch = std::mem::take(&mut self.scratch);
        self.flash.advance(now, &mut scratch);
        for c in scratch.drain(..) {
            if c.token == INTERNAL {
                continue;
            }
            let slot = c.token as u32;
            done.push(Completion {
                token: self.tokens[slot as usize],
                at_ns: c.at_ns,
            });
            self.free_tokens.push(slot);
        }
        self.scratch = scratch;
    }

    fn busy_ns(&self) -> Nanos {
        self.flash.busy_ns()
    }
}
