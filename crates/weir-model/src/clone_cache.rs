//! Clone-aware array cache (seed 004's "virtual storage tiering": one cached copy of
//! a block shared by every clone of an image).
//!
//! Linked clones: an *image* region of the array's address space holds the golden
//! image; each *clone* region has the image's size. A block a clone has never written
//! is read from the image (the clone region's own copy does not exist: redirect on
//! write); once the clone writes it, the clone's own block is used from then on. The
//! per-clone written-block set is that redirect map.
//!
//! Two kinds of clone: a *full-size* clone ([`crate::Array::add_clone`]) occupies its
//! own image-sized region of the array and a written block lives at its own address;
//! a *thin* clone ([`crate::Array::add_thin_clone`]) is addressed beyond the array's
//! capacity (taking no space there) and the blocks it writes are allocated in write
//! order in a small delta area of the array, like a linked clone's delta disk — so
//! thousands of desktops fit on an array sized for their deltas, as in seed 004.
//!
//! The cache is keyed by *physical* block when `aware = true` (all clones share the
//! image's cached blocks) and by *logical* block (the clone's own address) when
//! `aware = false`, so each clone caches its own copy of the same image block: cache
//! pollution and a disk read per clone (Data ONTAP 8.0.1 vs 8.1 in seed 004).
//!
//! In the [`crate::Array`] (ArraySpec option `clone_cache = { size_mib, aware }`) this
//! cache replaces the controller's read cache for host reads: a hit returns at once
//! (plus the controller processing and transfer), a miss reads the missing blocks at
//! their physical locations; read completions and writes insert their blocks.
//! Controller read-ahead is off when a clone cache is configured.
//!
//! Limits: a write only partially covering a never-written clone block is redirected
//! without the copy-on-write read of the rest of the block (grains are block-sized,
//! 4 KiB by default, like WAFL's); writes into an image region while clones use it are
//! not propagated to unaware clones' cached copies (images are read-only in practice).

use serde::{Deserialize, Serialize};

use crate::block_cache::{CachePolicy, FastMap};
use crate::error::ModelError;
use crate::raid::{RaidLayout, RaidPlan};
use crate::read_cache::{Lookup, ReadCache};
use crate::{DeviceIo, IoDir};

fn yes() -> bool {
    true
}
fn default_block_bytes() -> u32 {
    4096
}

/// `clone_cache = { size_mib = 4096, aware = true }` in an [`crate::ArraySpec`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CloneCacheSpec {
    /// Cache size, MiB (controller memory + flash cache the seed's controllers had).
    pub size_mib: u64,
    /// Key by physical block (one copy per image block) instead of by clone block.
    #[serde(default = "yes")]
    pub aware: bool,
    /// Cache and redirect granularity, bytes (power of two).
    #[serde(default = "default_block_bytes")]
    pub block_bytes: u32,
    #[serde(default)]
    pub policy: CachePolicy,
}

impl CloneCacheSpec {
    pub fn validate(&self) -> Result<(), ModelError> {
        check_block_bytes("clone cache", self.block_bytes)?;
        blocks_u32(
            "clone cache",
            self.size_mib.saturating_mul(1 << 20),
            self.block_bytes,
        )?;
        Ok(())
    }
}

/// A golden image registered with [`crate::Array::add_image`].
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct ImageId(pub u32);

/// A linked clone registered with [`crate::Array::add_clone`].
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct CloneId(pub u32);

/// Counters of the clone-aware cache.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CloneCacheStats {
    pub read_lookups: u64,
    /// Reads whose every block was resident.
    pub read_hits: u64,
    pub block_hits: u64,
    pub block_misses: u64,
    /// Missed blocks read from an image on behalf of a clone (shared blocks).
    pub shared_block_misses: u64,
    /// First writes of clone blocks (redirects created).
    pub redirected_blocks: u64,
    pub evicted_blocks: u64,
    pub resident_blocks: u64,
    /// Blocks being read from the drives now (0 when the array is idle).
    pub inflight_blocks: u64,
}

#[derive(Clone, Debug)]
struct CloneRegion {
    base_block: u64,
    blocks: u64,
    image: u32,
    /// Blocks (relative to the clone's base) the clone has written, as 64-block
    /// bitmaps keyed by `block / 64`.
    written: FastMap<u64, u64>,
    written_blocks: u64,
    /// Thin clone: where written blocks live (allocated in write order).
    delta: Option<Delta>,
}

#[derive(Clone, Debug)]
struct Delta {
    base_block: u64,
    blocks: u64,
    /// Relative block → allocation index (location `base + index % blocks`).
    location: FastMap<u64, u64>,
}

/// Region owner tags (other values: clone index).
const IMAGE_REGION: u32 = u32::MAX;
const DELTA_REGION: u32 = u32::MAX - 1;

/// Per-request lookup memo: the region of the last block, and the written bitmap
/// word (index, bits) of the last block.
#[derive(Clone, Copy, Debug, Default)]
struct Hint {
    region: Option<usize>,
    word: Option<(u64, u64)>,
}

#[derive(Clone, Debug)]
pub(crate) struct CloneLayer {
    aware: bool,
    shift: u32,
    /// Residency, misses in flight and evictions: the model `weir serve`'s thin
    /// volumes drive too.
    cache: ReadCache,
    /// (base_block, blocks) of each image.
    images: Vec<(u64, u64)>,
    clones: Vec<CloneRegion>,
    /// Every region as (base_block, end_block, clone index or u32::MAX for an image),
    /// sorted by base.
    regions: Vec<(u64, u64, u32)>,
    stats: CloneCacheStats,
}

impl CloneLayer {
    pub(crate) fn new(spec: &CloneCacheSpec) -> Result<Self, ModelError> {
        spec.validate()?;
        let blocks = blocks_u32("clone cache", spec.size_mib << 20, spec.block_bytes)?;
        Ok(Self {
            aware: spec.aware,
            shift: spec.block_bytes.trailing_zeros(),
            cache: ReadCache::new(blocks, spec.policy),
            images: Vec::new(),
            clones: Vec::new(),
            regions: Vec::new(),
            stats: CloneCacheStats::default(),
        })
    }

    pub(crate) fn stats(&self) -> CloneCacheStats {
        let c = self.cache.stats();
        CloneCacheStats {
            resident_blocks: c.resident,
            inflight_blocks: c.in_flight,
            evicted_blocks: c.evictions,
            ..self.stats
        }
    }

    fn add_region(
        &mut self,
        base: u64,
        size: u64,
        capacity: u64,
        owner: u32,
    ) -> Result<(u64, u64), ModelError> {
        let bs = 1u64 << self.shift;
        let bad = |field: &'static str, value: u64, reason: &'static str| {
            Err(ModelError::InvalidField {
                what: "clone map region",
                field,
                value: value.to_string(),
                reason,
            })
        };
        if !base.is_multiple_of(bs) {
            return bad(
                "base_offset_bytes",
                base,
                "must be a multiple of block_bytes",
            );
        }
        if size == 0 || !size.is_multiple_of(bs) {
            return bad(
                "size_bytes",
                size,
                "must be a non-zero multiple of block_bytes",
            );
        }
        if base.checked_add(size).is_none_or(|e| e > capacity) {
            return bad(
                "size_bytes",
                size,
                "region ends beyond the array's capacity",
            );
        }
        let (b0, b1) = (base >> self.shift, (base + size) >> self.shift);
        let pos = self.regions.partition_point(|r| r.0 < b0);
        let overlaps_prev = pos > 0 && self.regions[pos - 1].1 > b0;
        let overlaps_next = pos < self.regions.len() && self.regions[pos].0 < b1;
        if overlaps_prev || overlaps_next {
            return bad(
                "base_offset_bytes",
                base,
                "overlaps a registered image or clone",
            );
        }
        self.regions.insert(pos, (b0, b1, owner));
        Ok((b0, b1 - b0))
    }

    pub(crate) fn add_image(
        &mut self,
        base: u64,
        size: u64,
        capacity: u64,
    ) -> Result<ImageId, ModelError> {
        let r = self.add_region(base, size, capacity, IMAGE_REGION)?;
        self.images.push(r);
        Ok(ImageId(self.images.len() as u32 - 1))
    }

    /// The size in blocks of a registered image.
    fn image_blocks(&self, image: ImageId) -> Result<u64, ModelError> {
        match self.images.get(image.0 as usize) {
            Some(&(_, blocks)) => Ok(blocks),
            None => Err(ModelError::InvalidField {
                what: "clone map",
                field: "image",
                value: image.0.to_string(),
                reason: "no such image",
            }),
        }
    }

    pub(crate) fn add_clone(
        &mut self,
        base: u64,
        size: u64,
        image: ImageId,
        capacity: u64,
    ) -> Result<CloneId, ModelError> {
        let image_blocks = self.image_blocks(image)?;
        if size >> self.shift != image_blocks {
            return Err(ModelError::InvalidField {
                what: "clone map",
                field: "size_bytes",
                value: size.to_string(),
                reason: "a clone must have its image's size",
            });
        }
        let id = self.clones.len() as u32;
        let (base_block, blocks) = self.add_region(base, size, capacity, id)?;
        self.clones.push(CloneRegion {
            base_block,
            blocks,
            image: image.0,
            written: FastMap::default(),
            written_blocks: 0,
            delta: None,
        });
        Ok(CloneId(id))
    }

    /// A thin linked clone: its logical blocks are addressed at
    /// `[virtual_base, virtual_base + image size)`, which must lie at or beyond the
    /// array's capacity (it takes no space there); blocks it writes are allocated in
    /// write order in `[delta_base, delta_base + delta_size)` of the array (wrapping
    /// when the clone writes more than its delta holds).
    pub(crate) fn add_thin_clone(
        &mut self,
        virtual_base: u64,
        image: ImageId,
        delta_base: u64,
        delta_size: u64,
        capacity: u64,
    ) -> Result<CloneId, ModelError> {
        let image_blocks = self.image_blocks(image)?;
        if virtual_base < capacity {
            return Err(ModelError::InvalidField {
                what: "clone map",
                field: "virtual_base_bytes",
                value: virtual_base.to_string(),
                reason: "a thin clone's addresses must lie at or beyond the array's capacity",
            });
        }
        let size = image_blocks << self.shift;
        let id = self.clones.len() as u32;
        let (delta_block, delta_blocks) =
            self.add_region(delta_base, delta_size, capacity, DELTA_REGION)?;
        let (base_block, blocks) = match self.add_region(virtual_base, size, u64::MAX, id) {
            Ok(r) => r,
            Err(e) => {
                // Undo the delta region: nothing is registered on error.
                let pos = self.regions.partition_point(|r| r.0 < delta_block);
                self.regions.remove(pos);
                return Err(e);
            }
        };
        self.clones.push(CloneRegion {
            base_block,
            blocks,
            image: image.0,
            written: FastMap::default(),
            written_blocks: 0,
            delta: Some(Delta {
                base_block: delta_block,
                blocks: delta_blocks,
                location: FastMap::default(),
            }),
        });
        Ok(CloneId(id))
    }

    /// Whether `offset` lies in a thin clone's (virtual) address range.
    pub(crate) fn is_thin_clone_address(&self, offset: u64) -> bool {
        self.region_of(offset >> self.shift).is_some_and(|r| {
            let owner = self.regions[r].2;
            owner < DELTA_REGION && self.clones[owner as usize].delta.is_some()
        })
    }

    /// The physical location of a write (call after [`Self::on_write`]): the first
    /// block's location, the rest assumed contiguous (true for a thin clone's new
    /// blocks, allocated in order).
    pub(crate) fn translate_write(&self, io: &DeviceIo) -> DeviceIo {
        let b = io.offset_bytes >> self.shift;
        let (phys, _, _) = self.map(b, &mut Hint::default());
        DeviceIo {
            offset_bytes: (phys << self.shift) + (io.offset_bytes - (b << self.shift)),
            ..*io
        }
    }

    /// Region index containing `block`.
    fn region_of(&self, block: u64) -> Option<usize> {
        let pos = self.regions.partition_point(|r| r.0 <= block);
        (pos > 0 && self.regions[pos - 1].1 > block).then_some(pos - 1)
    }

    /// (physical block, cache key, shared) of a logical block; `hint` caches the
    /// region and the last written-bitmap word of a request.
    fn map(&self, block: u64, hint: &mut Hint) -> (u64, u128, bool) {
        let r = match hint.region {
            Some(i) if self.regions[i].0 <= block && block < self.regions[i].1 => Some(i),
            _ => {
                hint.region = self.region_of(block);
                hint.word = None;
                hint.region
            }
        };
        let Some(r) = r else {
            return (block, block as u128, false);
        };
        let owner = self.regions[r].2;
        if owner >= DELTA_REGION {
            return (block, block as u128, false);
        }
        let c = &self.clones[owner as usize];
        let rel = block - c.base_block;
        let w = rel >> 6;
        let mask = match hint.word {
            Some((k, m)) if k == w => m,
            _ => {
                let m = if c.written.is_empty() {
                    0
                } else {
                    c.written.get(&w).copied().unwrap_or(0)
                };
                hint.word = Some((w, m));
                m
            }
        };
        if mask & (1 << (rel & 63)) != 0 {
            let Some(d) = &c.delta else {
                return (block, block as u128, false);
            };
            let idx = d.location.get(&rel).copied().unwrap_or(0);
            let phys = d.base_block + idx % d.blocks;
            let key = if self.aware { phys } else { block };
            return (phys, key as u128, false);
        }
        let phys = self.images[c.image as usize].0 + rel;
        let key = if self.aware { phys } else { block };
        (phys, key as u128, true)
    }

    fn blocks_of(&self, offset: u64, size: u32) -> (u64, u64) {
        let end = offset + size.max(1) as u64;
        (offset >> self.shift, (end - 1) >> self.shift)
    }

    /// Whether every block of a read is resident (refreshes recency up to the first
    /// miss; [`Self::plan_read_misses`] handles the rest of a miss).
    pub(crate) fn read_hit(&mut self, io: &DeviceIo) -> bool {
        self.stats.read_lookups += 1;
        let (first, last) = self.blocks_of(io.offset_bytes, io.size_bytes);
        let mut hint = Hint::default();
        for b in first..=last {
            let (_, key, _) = self.map(b, &mut hint);
            if !self.cache.touch(key) {
                return false;
            }
        }
        self.stats.read_hits += 1;
        self.stats.block_hits += last - first + 1;
        true
    }

    /// Plans the drive reads of the blocks of `io` (read by op `slot`) that are
    /// neither resident nor already being read, at their physical locations
    /// (contiguous physical runs merged); `deps` receives the other ops already
    /// reading some of its blocks (misses in flight are merged, as a controller does).
    pub(crate) fn plan_read_misses(
        &mut self,
        io: &DeviceIo,
        layout: &RaidLayout,
        plan: &mut RaidPlan,
        slot: u32,
        deps: &mut Vec<u32>,
    ) {
        plan.clear();
        deps.clear();
        let (first, last) = self.blocks_of(io.offset_bytes, io.size_bytes);
        let end = io.offset_bytes + io.size_bytes as u64;
        let mut hint = Hint::default();
        // Current run: physical start byte, length.
        let mut run: Option<(u64, u64)> = None;
        for b in first..=last {
            let (phys, key, shared) = self.map(b, &mut hint);
            let lookup = self.cache.lookup(key, slot);
            if lookup != Lookup::Miss {
                self.stats.block_hits += 1;
                if let Lookup::InFlight(r) = lookup
                    && !deps.contains(&r)
                {
                    deps.push(r);
                }
                if let Some((s, l)) = run.take() {
                    layout.plan_append(s, l as u32, IoDir::Read, plan);
                }
                continue;
            }
            self.stats.block_misses += 1;
            if shared {
                self.stats.shared_block_misses += 1;
            }
            let lo = (b << self.shift).max(io.offset_bytes);
            let hi = ((b + 1) << self.shift).min(end);
            let p_lo = (phys << self.shift) + (lo - (b << self.shift));
            match &mut run {
                Some((s, l)) if *s + *l == p_lo && *l + (hi - lo) <= u32::MAX as u64 => {
                    *l += hi - lo
                }
                _ => {
                    if let Some((s, l)) = run.take() {
                        layout.plan_append(s, l as u32, IoDir::Read, plan);
                    }
                    run = Some((p_lo, hi - lo));
                }
            }
        }
        if let Some((s, l)) = run {
            layout.plan_append(s, l as u32, IoDir::Read, plan);
        }
    }

    /// The drive reads of op `slot` finished: the blocks it read are now cached.
    pub(crate) fn fill(&mut self, slot: u32) {
        self.cache.fill(slot, |_| {});
    }

    /// A write: clone blocks are redirected to the clone's own space; the written
    /// blocks are cached under their (now own) address.
    pub(crate) fn on_write(&mut self, io: &DeviceIo) {
        let (first, last) = self.blocks_of(io.offset_bytes, io.size_bytes);
        let mut hint = Hint::default();
        for b in first..=last {
            let (_, mut key, shared) = self.map(b, &mut hint);
            if shared && let Some(r) = hint.region {
                let c = &mut self.clones[self.regions[r].2 as usize];
                let rel = b - c.base_block;
                let word = c.written.entry(rel >> 6).or_insert(0);
                *word |= 1 << (rel & 63);
                let word = *word;
                if let Some(d) = &mut c.delta {
                    d.location.insert(rel, c.written_blocks);
                }
                c.written_blocks += 1;
                hint.word = Some((rel >> 6, word));
                self.stats.redirected_blocks += 1;
                key = self.map(b, &mut hint).1;
            }
            self.cache.insert(key, |_| {});
        }
    }

    /// Blocks clone `clone` has written (its delta).
    pub(crate) fn clone_written_blocks(&self, clone: CloneId) -> Option<u64> {
        self.clones.get(clone.0 as usize).map(|c| c.written_blocks)
    }

    pub(crate) fn clone_blocks(&self, clone: CloneId) -> Option<u64> {
        self.clones.get(clone.0 as usize).map(|c| c.blocks)
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
