//! The decisions of a write-through flash read cache (ioTurbine's, in seed 000:
//! a flash device in the host caching the reads of chosen volumes in front of
//! shared storage): which reads are served from flash, which misses fill it,
//! where each block lives on the flash device, and when a block may no longer
//! be served. Pure: no data, no I/O, no clock. `weir serve`'s flash cache layer
//! drives it around a cache file; the request order it assumes is the one any
//! driver can keep.
//!
//! Blocks are `block_bytes` pieces of a volume, keyed by (volume, epoch, block)
//! and stored at a *slot* of the device (the [`BlockCache`] entry that holds
//! the key, so `capacity` blocks need `capacity` slots and no allocation map).
//!
//! A read asks [`FlashCache::read`]:
//! - [`ReadPlan::Hit`] — every block the read touches is valid: read them from
//!   their slots, then ask [`FlashCache::still_valid`] (a slot read while it was
//!   evicted or rewritten must not be used: read the backing store instead).
//! - [`ReadPlan::Miss`] — read the backing store. With a fill ticket, hand the
//!   data to [`FlashCache::fill_slots`]: the blocks the read covered whole get
//!   slots; write each to its slot, then report [`FlashCache::filled`]. Blocks
//!   become valid only then.
//!
//! Writes (WRITE, TRIM, WRITE_ZEROES) are write-through with invalidation:
//! [`FlashCache::write_begin`] before the write goes down drops every block it
//! touches and cancels fills that could carry older data; [`FlashCache::write_end`]
//! after it completed. A read that starts while an overlapping write is in
//! flight gets no fill (what it reads may predate the write), and a fill is
//! cancelled by any write that begins before it completes, so the cache never
//! holds data older than an acknowledged write.
//!
//! The one rule the driver keeps: a slot's data is written only while
//! [`FlashCache::slot_current`] says the slot still belongs to that fill, and
//! no two writes of one slot overlap (a lock per slot, or per group of slots,
//! held across the check and the write).
//!
//! Admission skips sequential scans: a read of `scan_bytes` or more, or one that
//! continues a run of sequential reads reaching `scan_bytes`, is served (hits
//! still count) but fills nothing, so a backup or a table scan does not flush
//! the working set from flash (nor wear it). Replacement is the [`BlockCache`]'s
//! (SLRU by default: scan-resistant on top of that).

use serde::Serialize;

use crate::block_cache::{BlockCache, CachePolicy};

/// A flash cache's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlashCacheSpec {
    /// Blocks the device holds.
    pub capacity_blocks: u32,
    /// Bytes per block (a power of two, 512 B to 1 MiB).
    pub block_bytes: u32,
    pub policy: CachePolicy,
    /// Reads at least this long, or continuing a sequential run this long, fill
    /// nothing (0: admit everything).
    pub scan_bytes: u64,
}

/// Most blocks a cache may have (its index takes 48-64 bytes of memory each).
pub const MAX_FLASH_CACHE_BLOCKS: u64 = 1 << 30;
/// The default block: the smallest read an OLTP or VDI guest issues, so a random
/// 4-8 KiB read fills exactly what it read.
pub const DEFAULT_FLASH_BLOCK_BYTES: u64 = 4096;
/// The default sequential-scan cutoff (bcache's `sequential_cutoff`).
pub const DEFAULT_SCAN_CUTOFF_BYTES: u64 = 4 << 20;

/// Largest range a write invalidates block by block; a longer one drops the
/// volume's whole cache (one epoch step), so a TRIM of a terabyte costs no more
/// than a small write.
pub const MAX_INVALIDATE_BLOCKS: u64 = 1 << 16;

/// Sequential streams tracked per volume for admission.
const STREAMS: usize = 4;

/// A volume's recent sequential runs (admission's scan detection): the end of
/// each of the last [`STREAMS`] runs and its length so far.
#[derive(Clone, Debug, Default)]
pub(crate) struct ScanDetector {
    streams: [(u64, u64); STREAMS],
    next: usize,
}

impl ScanDetector {
    /// Records a read; whether it is (part of) a scan of `scan_bytes` or more
    /// (0: never).
    pub(crate) fn note(&mut self, offset: u64, length: u64, scan_bytes: u64) -> bool {
        let run = match self
            .streams
            .iter_mut()
            .find(|(end, _)| *end == offset && *end > 0)
        {
            Some(s) => {
                s.0 = offset + length;
                s.1 = s.1.saturating_add(length);
                s.1
            }
            None => {
                let i = self.next;
                self.next = (i + 1) % STREAMS;
                self.streams[i] = (offset + length, length);
                length
            }
        };
        scan_bytes > 0 && run >= scan_bytes
    }
}

/// Counters of one volume (or, summed, of the cache).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FlashCacheStats {
    /// Reads served from flash.
    pub read_hits: u64,
    /// Reads that went to the backing store.
    pub read_misses: u64,
    /// Bytes of those reads.
    pub hit_bytes: u64,
    pub miss_bytes: u64,
    /// Misses not admitted (sequential scans).
    pub scan_bypasses: u64,
    /// Hits found stale after the read (slot evicted or rewritten meanwhile).
    pub hits_lost: u64,
    /// Blocks written to flash by fills.
    pub filled_blocks: u64,
    /// Fills dropped because a write overlapped them.
    pub fills_cancelled: u64,
    /// Blocks dropped by writes.
    pub invalidated_blocks: u64,
    /// Blocks evicted to make room.
    pub evicted_blocks: u64,
}

impl FlashCacheStats {
    fn add(&mut self, o: &FlashCacheStats) {
        self.read_hits += o.read_hits;
        self.read_misses += o.read_misses;
        self.hit_bytes += o.hit_bytes;
        self.miss_bytes += o.miss_bytes;
        self.scan_bypasses += o.scan_bypasses;
        self.hits_lost += o.hits_lost;
        self.filled_blocks += o.filled_blocks;
        self.fills_cancelled += o.fills_cancelled;
        self.invalidated_blocks += o.invalidated_blocks;
        self.evicted_blocks += o.evicted_blocks;
    }

    /// What these counters added since `earlier` (a copy taken before): a run's
    /// measured part after a warm-up.
    pub fn since(&self, earlier: &FlashCacheStats) -> FlashCacheStats {
        FlashCacheStats {
            read_hits: self.read_hits - earlier.read_hits,
            read_misses: self.read_misses - earlier.read_misses,
            hit_bytes: self.hit_bytes - earlier.hit_bytes,
            miss_bytes: self.miss_bytes - earlier.miss_bytes,
            scan_bypasses: self.scan_bypasses - earlier.scan_bypasses,
            hits_lost: self.hits_lost - earlier.hits_lost,
            filled_blocks: self.filled_blocks - earlier.filled_blocks,
            fills_cancelled: self.fills_cancelled - earlier.fills_cancelled,
            invalidated_blocks: self.invalidated_blocks - earlier.invalidated_blocks,
            evicted_blocks: self.evicted_blocks - earlier.evicted_blocks,
        }
    }

    /// Reads served from flash ÷ reads.
    pub fn hit_ratio(&self) -> f64 {
        let n = self.read_hits + self.read_misses;
        if n == 0 {
            0.0
        } else {
            self.read_hits as f64 / n as f64
        }
    }
}

/// A block's place on the device, as a read saw it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct SlotRef {
    pub slot: u32,
    generation: u32,
}

/// What [`FlashCache::read`] decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReadPlan {
    /// The volume is not cached: read the backing store.
    Bypass,
    /// Every block is on flash: block `first_block + i` at `slots[i]`.
    Hit {
        first_block: u64,
        slots: Vec<SlotRef>,
    },
    /// Read the backing store; with a ticket, fill the cache from the data.
    Miss { fill: Option<FillId> },
}

/// A fill in progress.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct FillId(u32);

/// A write in flight.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct WriteId(u32);

/// One block of a fill: write bytes `[offset_in_read, +block_bytes)` of the read's
/// data to `slot`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct FillSlot {
    pub block: u64,
    pub offset_in_read: u64,
    pub slot: SlotRef,
}

#[derive(Clone, Debug, Default)]
struct Volume {
    enabled: bool,
    epoch: u32,
    scans: ScanDetector,
    stats: FlashCacheStats,
}

#[derive(Clone, Copy, Debug)]
struct Range {
    volume: u32,
    first: u64,
    /// One past the last block.
    end: u64,
}

impl Range {
    fn overlaps(&self, o: &Range) -> bool {
        self.volume == o.volume && self.first < o.end && o.first < self.end
    }
}

#[derive(Clone, Debug)]
struct Fill {
    range: Range,
    read_offset: u64,
    epoch: u32,
    cancelled: bool,
    slots: Vec<(u64, SlotRef)>,
}

/// Most volumes (ids are dense indexes).
pub const MAX_FLASH_VOLUMES: u32 = 1 << 24;

/// A flash read cache's decisions (see the module).
#[derive(Clone, Debug)]
pub struct FlashCache {
    spec: FlashCacheSpec,
    shift: u32,
    index: BlockCache,
    /// Per slot: bumped whenever the slot changes hands or its data is dropped.
    generation: Vec<u32>,
    /// Per slot: its data is on the device (not being filled).
    valid: Vec<bool>,
    volumes: Vec<Volume>,
    fills: Vec<Option<Fill>>,
    free_fills: Vec<u32>,
    writes: Vec<Option<Range>>,
    free_writes: Vec<u32>,
}

impl FlashCache {
    pub fn new(spec: FlashCacheSpec) -> FlashCache {
        assert!(
            spec.block_bytes.is_power_of_two() && (512..=1 << 20).contains(&spec.block_bytes),
            "block_bytes must be a power of two in 512..=1 MiB"
        );
        FlashCache {
            shift: spec.block_bytes.trailing_zeros(),
            index: BlockCache::new(spec.capacity_blocks, spec.policy),
            generation: Vec::new(),
            valid: Vec::new(),
            volumes: Vec::new(),
            fills: Vec::new(),
            free_fills: Vec::new(),
            writes: Vec::new(),
            free_writes: Vec::new(),
            spec,
        }
    }

    pub fn spec(&self) -> &FlashCacheSpec {
        &self.spec
    }

    /// Blocks on flash (being filled included).
    pub fn resident_blocks(&self) -> u32 {
        self.index.len()
    }

    /// Adds a volume (cached or not); returns its id.
    pub fn add_volume(&mut self, enabled: bool) -> u32 {
        let id = self.volumes.len() as u32;
        assert!(id < MAX_FLASH_VOLUMES, "too many flash cache volumes");
        self.volumes.push(Volume {
            enabled,
            ..Volume::default()
        });
        id
    }

    /// Turns caching of `volume` on or off. Off drops its blocks (they age out)
    /// and cancels its fills; on starts it empty.
    pub fn set_enabled(&mut self, volume: u32, enabled: bool) {
        let v = &mut self.volumes[volume as usize];
        if v.enabled && !enabled {
            self.drop_volume(volume);
        }
        self.volumes[volume as usize].enabled = enabled;
    }

    pub fn is_enabled(&self, volume: u32) -> bool {
        self.volumes[volume as usize].enabled
    }

    /// The volume's data changed beneath the cache (a rollback, a resize):
    /// every block it had is dropped and its fills cancelled.
    pub fn drop_volume(&mut self, volume: u32) {
        let v = &mut self.volumes[volume as usize];
        v.epoch = v.epoch.wrapping_add(1);
        let all = Range {
            volume,
            first: 0,
            end: u64::MAX,
        };
        self.cancel_fills(&all);
    }

    pub fn stats(&self, volume: u32) -> FlashCacheStats {
        self.volumes[volume as usize].stats
    }

    /// Every volume's counters summed.
    pub fn total_stats(&self) -> FlashCacheStats {
        let mut t = FlashCacheStats::default();
        for v in &self.volumes {
            t.add(&v.stats);
        }
        t
    }

    fn key(&self, volume: u32, epoch: u32, block: u64) -> u128 {
        ((volume as u128) << 96) | ((epoch as u128) << 64) | block as u128
    }

    fn blocks(&self, offset: u64, length: u64) -> (u64, u64) {
        let first = offset >> self.shift;
        let end = (offset + length).div_ceil(self.spec.block_bytes as u64);
        (first, end)
    }

    /// Decides a read of `length` bytes at `offset` (`length` > 0).
    pub fn read(&mut self, volume: u32, offset: u64, length: u64) -> ReadPlan {
        if length == 0 || !self.volumes[volume as usize].enabled {
            return ReadPlan::Bypass;
        }
        let scan = self.note_stream(volume, offset, length);
        let epoch = self.volumes[volume as usize].epoch;
        let (first, end) = self.blocks(offset, length);
        if let Some(slots) = self.all_valid(volume, epoch, first, end) {
            let s = &mut self.volumes[volume as usize].stats;
            s.read_hits += 1;
            s.hit_bytes += length;
            return ReadPlan::Hit {
                first_block: first,
                slots,
            };
        }
        let s = &mut self.volumes[volume as usize].stats;
        s.read_misses += 1;
        s.miss_bytes += length;
        if scan {
            s.scan_bypasses += 1;
            return ReadPlan::Miss { fill: None };
        }
        // Whole blocks only: a partial block's other bytes were not read.
        let bs = self.spec.block_bytes as u64;
        let whole_first = offset.div_ceil(bs);
        let whole_end = (offset + length) >> self.shift;
        if whole_first >= whole_end {
            return ReadPlan::Miss { fill: None };
        }
        let range = Range {
            volume,
            first: whole_first,
            end: whole_end,
        };
        if self.writes.iter().flatten().any(|w| w.overlaps(&range)) {
            return ReadPlan::Miss { fill: None };
        }
        let fill = Fill {
            range,
            read_offset: offset,
            epoch,
            cancelled: false,
            slots: Vec::new(),
        };
        let id = match self.free_fills.pop() {
            Some(i) => {
                self.fills[i as usize] = Some(fill);
                i
            }
            None => {
                self.fills.push(Some(fill));
                (self.fills.len() - 1) as u32
            }
        };
        ReadPlan::Miss {
            fill: Some(FillId(id)),
        }
    }

    /// A read's slots if it is a hit now, without counting it or recording an
    /// access (a driver that may not be able to read the slots at once asks
    /// this, then [`FlashCache::confirm_hit`] once it has the data).
    pub fn peek_hit(&self, volume: u32, offset: u64, length: u64) -> Option<(u64, Vec<SlotRef>)> {
        let v = &self.volumes[volume as usize];
        if length == 0 || !v.enabled {
            return None;
        }
        let (first, end) = self.blocks(offset, length);
        let mut slots = Vec::with_capacity((end - first) as usize);
        for b in first..end {
            let slot = self.index.slot_of(self.key(volume, v.epoch, b))?;
            if !self.valid[slot as usize] {
                return None;
            }
            slots.push(SlotRef {
                slot,
                generation: self.generation[slot as usize],
            });
        }
        Some((first, slots))
    }

    /// A [`FlashCache::peek_hit`] read the slots: if they still held their
    /// blocks, the read counts as a hit (with its accesses) and `true`;
    /// otherwise nothing is recorded (read again through [`FlashCache::read`]).
    pub fn confirm_hit(
        &mut self,
        volume: u32,
        offset: u64,
        length: u64,
        slots: &[SlotRef],
    ) -> bool {
        if !slots
            .iter()
            .all(|s| self.slot_current(*s) && self.valid[s.slot as usize])
        {
            return false;
        }
        self.note_stream(volume, offset, length);
        let epoch = self.volumes[volume as usize].epoch;
        let (first, end) = self.blocks(offset, length);
        for b in first..end {
            self.index.touch_slot(self.key(volume, epoch, b));
        }
        let s = &mut self.volumes[volume as usize].stats;
        s.read_hits += 1;
        s.hit_bytes += length;
        true
    }

    /// The slots of blocks `first..end`, if every one is valid (an access each).
    fn all_valid(&mut self, volume: u32, epoch: u32, first: u64, end: u64) -> Option<Vec<SlotRef>> {
        let mut slots = Vec::with_capacity((end - first) as usize);
        for b in first..end {
            let slot = self.index.slot_of(self.key(volume, epoch, b))?;
            if !self.valid[slot as usize] {
                return None;
            }
            slots.push(SlotRef {
                slot,
                generation: self.generation[slot as usize],
            });
        }
        for b in first..end {
            self.index.touch_slot(self.key(volume, epoch, b));
        }
        Some(slots)
    }

    /// Records the read in the volume's streams; whether it is part of a scan.
    fn note_stream(&mut self, volume: u32, offset: u64, length: u64) -> bool {
        let scan_bytes = self.spec.scan_bytes;
        self.volumes[volume as usize]
            .scans
            .note(offset, length, scan_bytes)
    }

    /// After the backing-store read of a fill succeeded: the blocks to write to
    /// flash (none if the fill was cancelled). Each is reserved, not valid,
    /// until [`FlashCache::filled`].
    pub fn fill_slots(&mut self, fill: FillId) -> Vec<FillSlot> {
        let Some(f) = self.fills[fill.0 as usize].as_mut() else {
            return Vec::new();
        };
        if f.cancelled {
            return Vec::new();
        }
        let (range, epoch, read_offset) = (f.range, f.epoch, f.read_offset);
        let mut out = Vec::new();
        for b in range.first..range.end {
            let key = self.key(range.volume, epoch, b);
            if self.index.slot_of(key).is_some() {
                continue; // resident already (or another fill has it)
            }
            let Some(slot) = self.take_slot(key) else {
                break; // capacity 0
            };
            out.push(FillSlot {
                block: b,
                offset_in_read: (b << self.shift) - read_offset,
                slot,
            });
        }
        if let Some(f) = self.fills[fill.0 as usize].as_mut() {
            f.slots = out.iter().map(|s| (s.block, s.slot)).collect();
        }
        out
    }

    /// Makes the whole blocks of `[offset, offset + length)` of `volume` valid at
    /// once, as a long warm-up would have left them: a simulation's starting state
    /// (the server's cache starts empty and only fills). Counts no read and no
    /// fill, does not touch the scan detector; evicts as a fill does when full.
    pub fn warm(&mut self, volume: u32, offset: u64, length: u64) {
        if length == 0 || !self.volumes[volume as usize].enabled {
            return;
        }
        let epoch = self.volumes[volume as usize].epoch;
        let whole_first = offset.div_ceil(self.spec.block_bytes as u64);
        let whole_end = (offset + length) >> self.shift;
        for b in whole_first..whole_end {
            let key = self.key(volume, epoch, b);
            if self.index.slot_of(key).is_some() {
                continue;
            }
            let Some(slot) = self.take_slot(key) else {
                return; // capacity 0
            };
            self.valid[slot.slot as usize] = true;
        }
    }

    /// A slot for `key` (not resident), evicting when full: a new generation,
    /// not valid yet. None: capacity 0.
    fn take_slot(&mut self, key: u128) -> Option<SlotRef> {
        let (slot, evicted) = self.index.insert_slot(key)?;
        let s = slot as usize;
        if self.generation.len() <= s {
            self.generation.resize(s + 1, 0);
            self.valid.resize(s + 1, false);
        }
        self.generation[s] = self.generation[s].wrapping_add(1);
        self.valid[s] = false;
        if let Some(old) = evicted {
            let owner = (old >> 96) as usize;
            self.volumes[owner].stats.evicted_blocks += 1;
        }
        Some(SlotRef {
            slot,
            generation: self.generation[s],
        })
    }

    /// Whether `slot` still belongs to the fill or read that got it (check it,
    /// under the slot's lock, right before writing the slot).
    pub fn slot_current(&self, slot: SlotRef) -> bool {
        self.generation.get(slot.slot as usize) == Some(&slot.generation)
    }

    /// The fill ended: `ok` — its blocks are on flash and become valid (those
    /// still its own); not ok (the read or a flash write failed) — they are
    /// dropped. Ends the ticket either way.
    pub fn filled(&mut self, fill: FillId, ok: bool) {
        let Some(f) = self.fills[fill.0 as usize].take() else {
            return;
        };
        self.free_fills.push(fill.0);
        let mut stats = FlashCacheStats::default();
        for (block, slot) in f.slots {
            if !self.slot_current(slot) {
                continue;
            }
            if ok && !f.cancelled {
                self.valid[slot.slot as usize] = true;
                stats.filled_blocks += 1;
            } else {
                self.index.remove(self.key(f.range.volume, f.epoch, block));
                self.bump(slot.slot);
            }
        }
        if f.cancelled {
            stats.fills_cancelled += 1;
        }
        self.volumes[f.range.volume as usize].stats.add(&stats);
    }

    /// After reading hit slots: whether every one still held its block
    /// throughout (if not, the read must go to the backing store).
    pub fn still_valid(&mut self, volume: u32, slots: &[SlotRef]) -> bool {
        let ok = slots
            .iter()
            .all(|s| self.slot_current(*s) && self.valid[s.slot as usize]);
        if !ok {
            self.volumes[volume as usize].stats.hits_lost += 1;
        }
        ok
    }

    fn bump(&mut self, slot: u32) {
        let g = &mut self.generation[slot as usize];
        *g = g.wrapping_add(1);
        self.valid[slot as usize] = false;
    }

    /// A write (or TRIM, WRITE_ZEROES) of `length` bytes at `offset` is about
    /// to go down: its blocks are dropped, overlapping fills cancelled.
    pub fn write_begin(&mut self, volume: u32, offset: u64, length: u64) -> WriteId {
        let (first, end) = self.blocks(offset, length.max(1));
        let range = Range { volume, first, end };
        if self.volumes[volume as usize].enabled {
            if end - first > MAX_INVALIDATE_BLOCKS {
                self.drop_volume(volume);
            } else {
                let epoch = self.volumes[volume as usize].epoch;
                let mut dropped = 0;
                for b in first..end {
                    let key = self.key(volume, epoch, b);
                    if let Some(slot) = self.index.slot_of(key) {
                        self.index.remove(key);
                        self.bump(slot);
                        dropped += 1;
                    }
                }
                self.volumes[volume as usize].stats.invalidated_blocks += dropped;
                self.cancel_fills(&range);
            }
        }
        match self.free_writes.pop() {
            Some(i) => {
                self.writes[i as usize] = Some(range);
                WriteId(i)
            }
            None => {
                self.writes.push(Some(range));
                WriteId((self.writes.len() - 1) as u32)
            }
        }
    }

    /// The write completed (or failed).
    pub fn write_end(&mut self, write: WriteId) {
        if self.writes[write.0 as usize].take().is_some() {
            self.free_writes.push(write.0);
        }
    }

    fn cancel_fills(&mut self, range: &Range) {
        for f in self.fills.iter_mut().flatten() {
            if f.range.overlaps(range) {
                f.cancelled = true;
            }
        }
    }

    /// Fills and writes in flight (bounded by the driver's requests in flight).
    pub fn in_flight(&self) -> (usize, usize) {
        (
            self.fills.len() - self.free_fills.len(),
            self.writes.len() - self.free_writes.len(),
        )
    }
}
