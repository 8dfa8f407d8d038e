//! Thin pools (`format = "thin"`): volumes as weir-thin layer chains, and the
//! catalog of layers and snapshots that the volume store keeps in its metadata
//! file beside the volumes (so a snapshot, a clone or a rollback is one atomic
//! metadata update).
//!
//! Reference rules (what keeps a layer alive): a volume's top layer, a
//! snapshot's layer and a layer's children. A layer nothing references is
//! removed (metadata first, files after; files of layers the metadata does not
//! know are removed at start, so a crash in between leaks nothing).

use std::collections::{HashMap, HashSet};
use std::io;
use std::os::unix::io::RawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use weir_nbd::Extent;
use weir_nbd::consts::{STATE_HOLE, STATE_ZERO};
use weir_thin::{Chain, GrainCache, Layer, ThinVolume};

use crate::backend::Backend;

/// One layer in the catalog.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerRecord {
    pub id: u64,
    pub pool: String,
    #[serde(default)]
    pub parent: Option<u64>,
    /// Grains = size / grain size.
    pub size_bytes: u64,
}

/// A snapshot: a read-only, point-in-time layer of a volume, exported over NBD
/// as `<volume>@<name>`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRecord {
    pub volume: String,
    pub name: String,
    pub layer: u64,
    pub size_bytes: u64,
    pub created_unix_s: u64,
}

impl SnapshotRecord {
    pub fn export_name(&self) -> String {
        format!("{}@{}", self.volume, self.name)
    }
}

/// Thin metadata, stored in the volume store's metadata file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThinMeta {
    #[serde(default)]
    pub next_layer_id: u64,
    #[serde(default)]
    pub layers: Vec<LayerRecord>,
    #[serde(default)]
    pub snapshots: Vec<SnapshotRecord>,
}

impl ThinMeta {
    /// Layer `id` (the records are kept in id order: found by bisection, as every
    /// step of every chain looks one up).
    pub fn layer(&self, id: u64) -> Option<&LayerRecord> {
        let at = self.layers.binary_search_by_key(&id, |l| l.id).ok()?;
        Some(&self.layers[at])
    }

    /// Puts the records in id order (as [`ThinMeta::new_layer`] adds them; a
    /// catalog written by hand may not be).
    pub fn sort(&mut self) {
        self.layers.sort_by_key(|l| l.id);
        let newest = self.layers.last().map_or(0, |l| l.id);
        self.next_layer_id = self.next_layer_id.max(newest);
    }

    /// A new layer record (not yet persisted).
    pub fn new_layer(&mut self, pool: &str, parent: Option<u64>, size_bytes: u64) -> u64 {
        self.next_layer_id += 1;
        let id = self.next_layer_id;
        assert!(
            self.layers.last().is_none_or(|l| l.id < id),
            "layer ids in order"
        );
        self.layers.push(LayerRecord {
            id,
            pool: pool.to_string(),
            parent,
            size_bytes,
        });
        id
    }

    /// Layers whose parent is `id`.
    pub fn children(&self, id: u64) -> Vec<u64> {
        self.layers
            .iter()
            .filter(|l| l.parent == Some(id))
            .map(|l| l.id)
            .collect()
    }

    /// `id` and its ancestors, top first.
    pub fn lineage(&self, id: u64) -> Vec<u64> {
        let mut out = vec![id];
        let mut at = self.layer(id).and_then(|l| l.parent);
        while let Some(p) = at {
            // Longer than the catalog: a layer came twice.
            assert!(
                out.len() < self.layers.len(),
                "layer {p}: parent chain loops"
            );
            out.push(p);
            at = self.layer(p).and_then(|l| l.parent);
        }
        out
    }

    pub fn snapshot(&self, volume: &str, name: &str) -> Option<&SnapshotRecord> {
        self.snapshots
            .iter()
            .find(|s| s.volume == volume && s.name == name)
    }

    /// Layers that nothing (a volume top in `tops`, a snapshot, a child) keeps,
    /// removed from the catalog; repeated until none is left (a removed layer
    /// may have been its parent's last child).
    pub fn collect_garbage(&mut self, tops: &[u64]) -> Vec<LayerRecord> {
        let mut removed = Vec::new();
        loop {
            let kept: HashSet<u64> = (tops.iter().copied())
                .chain(self.snapshots.iter().map(|s| s.layer))
                .chain(self.layers.iter().filter_map(|l| l.parent))
                .collect();
            if self.layers.iter().all(|l| kept.contains(&l.id)) {
                return removed;
            }
            self.layers.retain(|l| {
                let keep = kept.contains(&l.id);
                if !keep {
                    removed.push(l.clone());
                }
                keep
            });
        }
    }
}

/// Open layers and the clone-aware caches of the thin pools.
#[derive(Default)]
pub struct ThinState {
    layers: HashMap<u64, Arc<Layer>>,
    caches: HashMap<String, Arc<GrainCache>>,
}

pub fn thin_dir(pool_dir: &Path) -> PathBuf {
    pool_dir.join("thin")
}

impl ThinState {
    pub fn set_cache(&mut self, pool: &str, size_bytes: u64) {
        if size_bytes > 0 {
            self.caches.insert(
                pool.to_string(),
                Arc::new(GrainCache::new(size_bytes, weir_thin::GRAIN_BYTES)),
            );
        }
    }

    pub fn cache(&self, pool: &str) -> Option<Arc<GrainCache>> {
        self.caches.get(pool).cloned()
    }

    /// The open layer `r`, opening it on first use.
    pub fn layer(&mut self, dir: &Path, r: &LayerRecord) -> io::Result<Arc<Layer>> {
        if let Some(l) = self.layers.get(&r.id) {
            return Ok(l.clone());
        }
        let grains = r.size_bytes.div_ceil(weir_thin::GRAIN_BYTES);
        let layer = Arc::new(Layer::open(dir, r.id, grains, weir_thin::GRAIN_BYTES)?);
        self.layers.insert(r.id, layer.clone());
        Ok(layer)
    }

    /// Whether layer `id` is open and so are its files (two descriptors).
    pub fn has_files(&self, id: u64) -> bool {
        self.layers.get(&id).is_some_and(|l| l.has_files())
    }

    /// Bytes read from the data files of the open layers of `pool` (with the
    /// clone-aware cache: its misses; without: every read of a shared grain).
    pub fn backing_read_bytes(&self, meta: &ThinMeta, pool: &str) -> u64 {
        self.layers
            .iter()
            .filter(|(id, _)| meta.layer(**id).is_some_and(|l| l.pool == pool))
            .map(|(_, l)| {
                l.counters
                    .read_bytes
                    .load(std::sync::atomic::Ordering::Relaxed)
            })
            .sum()
    }

    pub fn forget(&mut self, id: u64) {
        self.layers.remove(&id);
    }

    /// The chain of layer `top` (top first); every layer below the top is frozen.
    pub fn chain(&mut self, meta: &ThinMeta, dir: &Path, top: u64) -> io::Result<Chain> {
        let mut layers = Vec::new();
        for (i, id) in meta.lineage(top).into_iter().enumerate() {
            let r = meta.layer(id).ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("layer {id} is not in the catalog"),
                )
            })?;
            let l = self.layer(dir, r)?;
            if i > 0 {
                l.freeze();
            }
            layers.push(l);
        }
        Ok(Chain { layers })
    }
}

/// A thin volume (or a snapshot's read-only view) as a backend.
pub struct ThinBackend {
    pub volume: Arc<ThinVolume>,
}

/// Most extents one BLOCK_STATUS reply carries.
const MAX_EXTENTS: usize = 1024;

impl Backend for ThinBackend {
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.volume.read(offset, buf)
    }
    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.volume.write(offset, data, false)
    }
    fn flush(&self) -> io::Result<()> {
        self.volume.flush()
    }
    fn read_nowait(&self, offset: u64, buf: &mut [u8]) -> io::Result<bool> {
        self.volume.read_nowait(offset, buf)
    }
    fn write_nowait(&self, offset: u64, data: &[u8]) -> io::Result<bool> {
        // Page-cache writes to grains the volume owns; a first write (copy-up,
        // allocation) goes to a blocking thread.
        self.volume.write_owned(offset, data)
    }
    fn cached_source(&self, _offset: u64, _length: u64) -> Option<RawFd> {
        None
    }
    fn trim(&self, offset: u64, length: u64) -> io::Result<()> {
        self.volume.trim(offset, length, false)
    }
    fn write_zeroes(
        &self,
        offset: u64,
        length: u64,
        _may_punch: bool,
        _fast_only: bool,
    ) -> io::Result<()> {
        // Whole grains become holes or zero markers (map updates); only the
        // partial grains at the ends are written, so it is always fast.
        self.volume.write_zeroes(offset, length, false)
    }
    fn block_status(&self, offset: u64, length: u64) -> io::Result<Vec<Extent>> {
        let mut out = Vec::new();
        for e in self.volume.block_status(offset, length, MAX_EXTENTS)? {
            let flags = if e.allocated {
                0
            } else {
                STATE_HOLE | STATE_ZERO
            };
            let mut left = e.length;
            while left > 0 {
                let n = left.min(u32::MAX as u64 & !(weir_thin::GRAIN_BYTES - 1));
                out.push(Extent {
                    length: n as u32,
                    flags,
                });
                left -= n;
            }
        }
        Ok(out)
    }
    fn cache(&self, _offset: u64, _length: u64) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_collection_follows_references() {
        let mut m = ThinMeta::default();
        let base = m.new_layer("p", None, 1 << 20);
        let top = m.new_layer("p", Some(base), 1 << 20);
        let clone = m.new_layer("p", Some(base), 1 << 20);
        m.snapshots.push(SnapshotRecord {
            volume: "v".into(),
            name: "s".into(),
            layer: base,
            size_bytes: 1 << 20,
            created_unix_s: 0,
        });
        assert!(m.collect_garbage(&[top, clone]).is_empty());
        assert_eq!(m.lineage(clone), vec![clone, base]);
        // The clone goes: its layer is garbage, the base stays (snapshot, child).
        let gone = m.collect_garbage(&[top]);
        assert_eq!(gone.iter().map(|l| l.id).collect::<Vec<_>>(), vec![clone]);
        // The snapshot and the volume go: everything goes.
        m.snapshots.clear();
        let gone = m.collect_garbage(&[]);
        assert_eq!(gone.len(), 2);
        assert!(m.layers.is_empty());
    }

    /// Layers are found by bisection, so the catalog is put in id order when it
    /// is read (one edited by hand may not be), and new ids follow the newest.
    #[test]
    fn a_catalog_out_of_order_is_sorted_and_new_ids_follow_the_newest() {
        let record = |id, parent| LayerRecord {
            id,
            pool: "p".into(),
            parent,
            size_bytes: 1 << 20,
        };
        let mut m = ThinMeta {
            next_layer_id: 2,
            layers: vec![record(9, Some(4)), record(1, None), record(4, Some(1))],
            snapshots: Vec::new(),
        };
        m.sort();
        assert_eq!(m.lineage(9), vec![9, 4, 1]);
        assert!(m.layer(2).is_none());
        assert_eq!(m.new_layer("p", Some(9), 1 << 20), 10);
        assert_eq!(m.lineage(10), vec![10, 9, 4, 1]);
    }
}
