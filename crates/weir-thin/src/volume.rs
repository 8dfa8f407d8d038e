//! A thin volume: a chain of layers, the writable top first. Reads walk the
//! chain down to the first layer that has the grain; a write to a grain the top
//! does not hold copies it up (the rest of the grain from below) into a new slot
//! of the top — redirect on write, as qcow2 backing files and RBD clones do.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard};

use crate::cache::GrainCache;
use crate::layer::Layer;
use crate::map::Entry;

/// The layers a volume reads through, top (writable, for a volume) first.
pub struct Chain {
    pub layers: Vec<Arc<Layer>>,
}

impl Chain {
    pub fn top(&self) -> &Arc<Layer> {
        &self.layers[0]
    }
}

/// One extent of [`ThinVolume::block_status`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub length: u64,
    /// Stored somewhere in the chain (else a hole that reads as zeroes).
    pub allocated: bool,
}

pub struct ThinVolume {
    chain: RwLock<Arc<Chain>>,
    size: AtomicU64,
    grain_bytes: u64,
    writable: AtomicBool,
    cache: Option<Arc<GrainCache>>,
}

/// One grain's part of a request: grain number, offset in the grain, bytes.
fn pieces(offset: u64, length: u64, grain: u64) -> impl Iterator<Item = (u64, u64, u64)> {
    let end = offset + length;
    let mut at = offset;
    std::iter::from_fn(move || {
        if at >= end {
            return None;
        }
        let g = at / grain;
        let off = at % grain;
        let n = (grain - off).min(end - at);
        at += n;
        Some((g, off, n))
    })
}

impl ThinVolume {
    pub fn new(chain: Chain, size: u64, writable: bool, cache: Option<Arc<GrainCache>>) -> Self {
        assert!(!chain.layers.is_empty());
        let grain_bytes = chain.top().grain_bytes();
        assert!(chain.layers.iter().all(|l| l.grain_bytes() == grain_bytes));
        ThinVolume {
            chain: RwLock::new(Arc::new(chain)),
            size: AtomicU64::new(size),
            grain_bytes,
            writable: AtomicBool::new(writable),
            cache,
        }
    }

    pub fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }
    pub fn grain_bytes(&self) -> u64 {
        self.grain_bytes
    }
    pub fn chain(&self) -> Arc<Chain> {
        self.read_chain().clone()
    }
    fn read_chain(&self) -> RwLockReadGuard<'_, Arc<Chain>> {
        self.chain.read().unwrap_or_else(|p| p.into_inner())
    }

    fn check_range(&self, offset: u64, length: u64) -> io::Result<()> {
        match offset.checked_add(length) {
            Some(end) if end <= self.size() => Ok(()),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "range {offset}+{length} beyond the volume's {} bytes",
                    self.size()
                ),
            )),
        }
    }

    fn check_writable(&self) -> io::Result<()> {
        if self.writable.load(Ordering::Acquire) {
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "read-only (a snapshot)",
            ))
        }
    }

    pub fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.check_range(offset, buf.len() as u64)?;
        let chain = self.chain();
        let mut done = 0usize;
        for (g, off, n) in pieces(offset, buf.len() as u64, self.grain_bytes) {
            let part = &mut buf[done..done + n as usize];
            self.read_grain(&chain.layers, g, off, part)?;
            done += n as usize;
        }
        Ok(())
    }

    /// [`Self::read`] if it can be done without blocking: every grain a hole, a
    /// cache hit or in the page cache. `Ok(false)`: call [`Self::read`] (on a
    /// thread that may block). Used to skip a thread hand-off on the common path.
    pub fn read_nowait(&self, offset: u64, buf: &mut [u8]) -> io::Result<bool> {
        if self.check_range(offset, buf.len() as u64).is_err() {
            return Ok(false);
        }
        let chain = self.chain();
        let mut done = 0usize;
        for (g, off, n) in pieces(offset, buf.len() as u64, self.grain_bytes) {
            let part = &mut buf[done..done + n as usize];
            if !self.read_grain_nowait(&chain.layers, g, off, part)? {
                return Ok(false);
            }
            done += n as usize;
        }
        Ok(true)
    }

    fn read_grain_nowait(
        &self,
        layers: &[Arc<Layer>],
        g: u64,
        off: u64,
        buf: &mut [u8],
    ) -> io::Result<bool> {
        let found = Self::with_grain(layers, g, |layer, s| match &self.cache {
            Some(c) if layer.is_frozen() => Ok(c.read_hit(layer, s, off, buf)),
            _ => layer.read_slot_nowait(s, off, buf),
        });
        found.unwrap_or_else(|| {
            buf.fill(0);
            Ok(true)
        })
    }

    /// [`Self::write`] (not FUA) if every grain it touches is already the top's
    /// own (no copy-up, no allocation: a page-cache write); `Ok(false)`: call
    /// [`Self::write`].
    pub fn write_owned(&self, offset: u64, data: &[u8]) -> io::Result<bool> {
        if !self.writable.load(Ordering::Acquire)
            || self.check_range(offset, data.len() as u64).is_err()
        {
            return Ok(false);
        }
        let chain = self.read_chain();
        let top = chain.top();
        let map = top.map();
        let owned = |(g, _, _): (u64, u64, u64)| matches!(map.get(g), Entry::Slot(_));
        if !pieces(offset, data.len() as u64, self.grain_bytes).all(owned) {
            return Ok(false);
        }
        let mut done = 0usize;
        for (g, off, n) in pieces(offset, data.len() as u64, self.grain_bytes) {
            let Entry::Slot(s) = map.get(g) else {
                unreachable!("checked under the same lock")
            };
            top.write_slot(s, off, &data[done..done + n as usize])?;
            done += n as usize;
        }
        Ok(true)
    }

    /// Reads part of grain `g` through `layers` (zeroes where none has it).
    fn read_grain(
        &self,
        layers: &[Arc<Layer>],
        g: u64,
        off: u64,
        buf: &mut [u8],
    ) -> io::Result<()> {
        let found = Self::with_grain(layers, g, |layer, s| match &self.cache {
            Some(c) if layer.is_frozen() => c.read(layer, s, off, buf),
            _ => layer.read_slot(s, off, buf),
        });
        found.unwrap_or_else(|| {
            buf.fill(0);
            Ok(())
        })
    }

    /// Reads grain `g` whole through `layers`, bypassing the cache.
    fn read_uncached(layers: &[Arc<Layer>], g: u64, buf: &mut [u8]) -> io::Result<()> {
        let found = Self::with_grain(layers, g, |layer, s| layer.read_slot(s, 0, buf));
        found.unwrap_or_else(|| {
            buf.fill(0);
            Ok(())
        })
    }

    /// Does any layer of `layers` hold data for grain `g` (before a zero marker)?
    fn has_data(layers: &[Arc<Layer>], g: u64) -> bool {
        Self::with_grain(layers, g, |_, _| ()).is_some()
    }

    /// The walk down the chain for grain `g`: `found(layer, slot)` runs for the
    /// first layer that stores it, with that layer's map read-locked (its slot
    /// cannot be freed and reused meanwhile); `None` when the grain reads as
    /// zeroes (a zero marker, or no layer has it).
    fn with_grain<R>(
        layers: &[Arc<Layer>],
        g: u64,
        found: impl FnOnce(&Arc<Layer>, u32) -> R,
    ) -> Option<R> {
        for layer in layers {
            let map = layer.map();
            match map.get(g) {
                Entry::Unmapped => continue,
                Entry::Zero => return None,
                Entry::Slot(s) => return Some(found(layer, s)),
            }
        }
        None
    }

    /// Writes `data` at `offset`; `fua`: durable before returning.
    pub fn write(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
        self.check_writable()?;
        self.check_range(offset, data.len() as u64)?;
        // Held for the whole write: a snapshot waits for writes in progress.
        let chain = self.read_chain();
        let mut commit = fua;
        let mut done = 0usize;
        for (g, off, n) in pieces(offset, data.len() as u64, self.grain_bytes) {
            commit |= self.write_grain(&chain, g, off, &data[done..done + n as usize])?;
            done += n as usize;
        }
        if commit {
            chain.top().commit()?;
        }
        Ok(())
    }

    /// Returns true when the top layer asks for a commit.
    fn write_grain(&self, chain: &Chain, g: u64, off: u64, data: &[u8]) -> io::Result<bool> {
        let top = chain.top();
        {
            let map = top.map();
            if let Entry::Slot(s) = map.get(g) {
                top.write_slot(s, off, data)?;
                return Ok(false);
            }
        }
        let _first_write = top.stripe(g);
        let current = {
            let map = top.map();
            let e = map.get(g);
            if let Entry::Slot(s) = e {
                top.write_slot(s, off, data)?;
                return Ok(false);
            }
            e
        };
        let full;
        let grain: &[u8] = if data.len() as u64 == self.grain_bytes {
            data
        } else {
            let mut g_buf = vec![0u8; self.grain_bytes as usize];
            if current == Entry::Unmapped {
                // A one-time read: straight from the layer, not through the cache.
                Self::read_uncached(&chain.layers[1..], g, &mut g_buf)?;
            }
            g_buf[off as usize..off as usize + data.len()].copy_from_slice(data);
            full = g_buf;
            &full
        };
        let slot = top.allocate()?;
        if let Err(e) = top.write_slot(slot, 0, grain) {
            top.release(slot);
            return Err(e);
        }
        Ok(top.set_entry(g, Entry::Slot(slot)))
    }

    /// Zeroes a range: whole grains become holes (or zero markers over a
    /// parent's data), partial ones are written with zeroes where they hold data.
    pub fn write_zeroes(&self, offset: u64, length: u64, fua: bool) -> io::Result<()> {
        self.zero_range(offset, length, true, fua)
    }

    /// Discards whole grains of a range (they read as zeroes afterwards); parts of
    /// grains are left as they are (TRIM is advisory).
    pub fn trim(&self, offset: u64, length: u64, fua: bool) -> io::Result<()> {
        self.zero_range(offset, length, false, fua)
    }

    fn zero_range(&self, offset: u64, length: u64, partial: bool, fua: bool) -> io::Result<()> {
        self.check_writable()?;
        self.check_range(offset, length)?;
        let chain = self.read_chain();
        let mut commit = fua;
        for (g, off, n) in pieces(offset, length, self.grain_bytes) {
            if n == self.grain_bytes {
                commit |= self.zero_grain(&chain, g);
            } else if partial && Self::has_data(&chain.layers, g) {
                let zeroes = vec![0u8; n as usize];
                commit |= self.write_grain(&chain, g, off, &zeroes)?;
            }
        }
        if commit {
            chain.top().commit()?;
        }
        Ok(())
    }

    fn zero_grain(&self, chain: &Chain, g: u64) -> bool {
        let top = chain.top();
        let _first_write = top.stripe(g);
        let current = top.map().get(g);
        let target = if Self::has_data(&chain.layers[1..], g) {
            Entry::Zero
        } else {
            Entry::Unmapped
        };
        if current == target {
            return false;
        }
        top.set_entry(g, target)
    }

    /// Makes every completed write durable.
    pub fn flush(&self) -> io::Result<()> {
        self.chain().top().commit()
    }

    /// Allocation from `offset`: runs of grains stored somewhere in the chain or
    /// not (holes read as zeroes); at most `max_extents`, covering at least one byte.
    pub fn block_status(
        &self,
        offset: u64,
        length: u64,
        max_extents: usize,
    ) -> io::Result<Vec<Extent>> {
        self.check_range(offset, length)?;
        let chain = self.chain();
        let mut out: Vec<Extent> = Vec::new();
        for (g, _, n) in pieces(offset, length, self.grain_bytes) {
            let allocated = Self::has_data(&chain.layers, g);
            if let Some(e) = out.last_mut()
                && e.allocated == allocated
            {
                e.length += n;
            } else if out.len() == max_extents {
                break;
            } else {
                out.push(Extent {
                    length: n,
                    allocated,
                });
            }
        }
        Ok(out)
    }

    /// Snapshot: commits the top, makes it read-only and puts `new_top` (empty,
    /// a child of the old top) above it. Writes in progress finish first; writes
    /// after go to `new_top`. Returns the frozen layer.
    pub fn freeze_top(&self, new_top: Arc<Layer>) -> io::Result<Arc<Layer>> {
        self.freeze_top_with(new_top, || Ok(()))
    }

    /// [`Self::freeze_top`], calling `record` (which makes the new chain the
    /// durable one, e.g. persists the catalog) after the old top is committed and
    /// before any write can reach `new_top`; an error leaves the chain as it was.
    pub fn freeze_top_with(
        &self,
        new_top: Arc<Layer>,
        record: impl FnOnce() -> io::Result<()>,
    ) -> io::Result<Arc<Layer>> {
        let mut guard = self.chain.write().unwrap_or_else(|p| p.into_inner());
        let old = guard.top().clone();
        old.commit()?;
        record()?;
        old.freeze();
        let mut layers = vec![new_top];
        layers.extend(guard.layers.iter().cloned());
        *guard = Arc::new(Chain { layers });
        Ok(old)
    }

    /// Replaces the chain (a merged snapshot), once writes in progress finished.
    pub fn set_chain(&self, chain: Chain) {
        assert!(!chain.layers.is_empty());
        *self.chain.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(chain);
    }

    /// Replaces chain and size (rollback, flatten) once writes in progress have
    /// finished, calling `record` first (under the same exclusion: no write
    /// reaches the new chain before it is durable); an error changes nothing.
    pub fn replace_with(
        &self,
        chain: Chain,
        size: u64,
        record: impl FnOnce() -> io::Result<()>,
    ) -> io::Result<()> {
        assert!(!chain.layers.is_empty());
        let mut guard = self.chain.write().unwrap_or_else(|p| p.into_inner());
        guard.top().commit()?;
        record()?;
        chain.top().resize(size.div_ceil(self.grain_bytes));
        *guard = Arc::new(chain);
        self.size.store(size, Ordering::Release);
        Ok(())
    }

    /// Grows or shrinks the volume (grains past a new end are dropped from the top).
    pub fn resize(&self, size: u64) {
        let chain = self.chain.write().unwrap_or_else(|p| p.into_inner());
        chain.top().resize(size.div_ceil(self.grain_bytes));
        self.size.store(size, Ordering::Release);
    }

    pub fn set_writable(&self, writable: bool) {
        self.writable.store(writable, Ordering::Release);
    }
}

/// Copies into `child` every grain of `parent` that `child` does not hold (so
/// what reads through `child` is unchanged), then commits `child`. Used to merge
/// a deleted snapshot into its only child and to flatten a clone.
pub fn merge_into(child: &Layer, parent: &Layer) -> io::Result<u64> {
    let grain_bytes = child.grain_bytes();
    let entries: Vec<(u64, Entry)> = parent.map().iter().collect();
    let mut buf = vec![0u8; grain_bytes as usize];
    let mut copied = 0;
    for (g, e) in entries {
        if g >= child.map().grains() {
            continue;
        }
        let _first_write = child.stripe(g);
        if child.map().get(g) != Entry::Unmapped {
            continue;
        }
        let commit = match e {
            Entry::Unmapped => continue,
            Entry::Zero => child.set_entry(g, Entry::Zero),
            Entry::Slot(s) => {
                parent.read_slot(s, 0, &mut buf)?;
                let slot = child.allocate()?;
                if let Err(err) = child.write_slot(slot, 0, &buf) {
                    child.release(slot);
                    return Err(err);
                }
                copied += 1;
                child.set_entry(g, Entry::Slot(slot))
            }
        };
        if commit {
            child.commit()?;
        }
    }
    child.commit()?;
    Ok(copied)
}
