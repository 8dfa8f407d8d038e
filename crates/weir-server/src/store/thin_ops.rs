//! The volume store's thin operations: create, delete and resize of thin
//! volumes, snapshots (take, list, delete), rollback, linked clones, flatten, and
//! the consistency check. Each changes the catalog in memory, persists it once,
//! and only then lets I/O see the new layers (or removes files nothing uses).

use std::io;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use weir_thin::check::{LayerInfo, check};
use weir_thin::{Chain, Layer, merge_into};

use super::*;
use crate::thin::{LayerRecord, SnapshotRecord};
use descriptors::PER_LAYER;

fn store_io(e: StoreError) -> io::Error {
    io::Error::other(e.to_string())
}

fn now_unix_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// One thin pool's check.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ThinPoolCheck {
    pub pool: String,
    pub layers: usize,
    pub stored_grains: u64,
    pub zero_grains: u64,
    pub orphan_files: Vec<String>,
    pub problems: Vec<String>,
}

/// A thin pool as `weir volume check` found it in the catalog.
pub struct PoolToCheck {
    pool: String,
    dir: PathBuf,
    infos: Vec<LayerInfo>,
    /// The catalog's own problems (layers nothing references, tops missing).
    problems: Vec<String>,
}

/// A check of the thin pools taken from the catalog
/// ([`VolumeStore::check_thin_begin`]), to run without the store's lock.
pub struct ThinCheck {
    volumes: Vec<(String, Arc<OpenVolume>)>,
    pools: Vec<PoolToCheck>,
    /// The newest layer then: files of later ones are not orphans.
    newest_layer: u64,
}

/// What [`ThinCheck::run`] found, for [`VolumeStore::check_thin_finish`].
pub struct CheckedPools {
    pools: Vec<(PoolToCheck, weir_thin::check::CheckReport)>,
    newest_layer: u64,
}

impl ThinCheck {
    /// Flushes every volume not deleted since (what was acknowledged is in the
    /// maps read), then
    /// checks each pool's layers and files.
    pub fn run(self) -> Result<CheckedPools, StoreError> {
        for (name, v) in self.volumes.iter().filter(|(_, v)| !v.is_deleted()) {
            v.backend
                .flush()
                .map_err(|e| io_err(format!("flushing volume {name:?}"), e))?;
        }
        let pools = self.pools.into_iter().map(|p| {
            let report = check(&p.dir, &p.infos, weir_thin::GRAIN_BYTES);
            (p, report)
        });
        Ok(CheckedPools {
            pools: pools.collect(),
            newest_layer: self.newest_layer,
        })
    }
}

/// The layer a file name (`<id>.map`, `<id>.data`) belongs to.
fn layer_of_file(name: &str) -> Option<u64> {
    name.split_once('.')?.0.parse().ok()
}

/// Space of one thin volume.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ThinSpace {
    pub pool: String,
    pub volume: String,
    /// Bytes stored in the volume's own top layer.
    pub exclusive_bytes: u64,
}

/// A flatten between its steps: the chain whose lower layers are copied into
/// its top (see [`VolumeStore::flatten_begin`]).
pub struct FlattenPlan {
    volume: String,
    top: u64,
    chain: Arc<Chain>,
}

impl FlattenPlan {
    /// The copy, without the store's lock (it may take minutes).
    pub fn copy(&self) -> io::Result<()> {
        let own = self.chain.top();
        for below in &self.chain.layers[1..] {
            merge_into(own, below)?;
        }
        Ok(())
    }
}

/// What [`VolumeStore::flatten_begin`] leaves to do.
pub enum Flatten {
    /// Nothing (an RBD volume: librbd flattened it).
    Done(VolumeRecord),
    Copy(FlattenPlan),
}

/// A snapshot deletion between its steps: the snapshot's grains its only child
/// still reads are copied into the child (see [`VolumeStore::delete_snapshot_begin`]).
pub struct MergePlan {
    snapshot: SnapshotRecord,
    child: u64,
    parent: Arc<Layer>,
    below: Arc<Layer>,
}

impl MergePlan {
    /// The merge, without the store's lock.
    pub fn copy(&self) -> io::Result<()> {
        merge_into(&self.below, &self.parent).map(drop)
    }
}

/// What [`VolumeStore::delete_snapshot_begin`] leaves to do.
pub enum DeleteSnapshot {
    /// Nothing: the snapshot is deleted (no layer was built on it, or RBD).
    Done(SnapshotRecord),
    Merge(MergePlan),
}

impl VolumeStore {
    /// Refuses a change to `volume`'s layers while a copy runs on them without
    /// the store's lock (flatten, a snapshot's merge).
    pub(super) fn check_not_busy(&self, volume: &str) -> Result<(), StoreError> {
        match self.busy.get(volume) {
            Some(what) => Err(StoreError::Conflict(format!(
                "volume {volume:?} is {what}: try again when that finishes"
            ))),
            None => Ok(()),
        }
    }

    pub(super) fn thin_dir_of(&self, pool: &str) -> PathBuf {
        thin_dir(&self.pool_dir(pool))
    }

    pub(super) fn thin_volume(&self, name: &str) -> Result<Arc<ThinVolume>, StoreError> {
        self.open
            .get(name)
            .and_then(|o| o.thin.clone())
            .ok_or_else(|| StoreError::NotFound(format!("no open thin volume named {name:?}")))
    }

    /// The volume `name` if it is thin, with its top layer.
    pub(super) fn thin_record(&self, name: &str) -> Result<(VolumeRecord, u64), StoreError> {
        let v = self.volume(name)?;
        match v.layer {
            Some(top) => Ok((v, top)),
            None if self.rbd_pool(&v.pool).is_some() => Err(StoreError::Invalid(format!(
                "volume {name:?} is in pool {:?}, whose backend is \"rbd\": this needs a thin \
                 volume (RBD volumes have RBD snapshots and clones, docs/RBD.md)",
                v.pool
            ))),
            None => Err(StoreError::Invalid(format!(
                "volume {name:?} is in pool {:?}, whose format is \"file\": snapshots and \
                 clones need a pool with format = \"thin\"",
                v.pool
            ))),
        }
    }

    pub(super) fn open_chain(&mut self, pool: &str, top: u64) -> Result<Chain, StoreError> {
        let dir = self.thin_dir_of(pool);
        create_dirs(&dir).map_err(|e| io_err(format!("creating {}", dir.display()), e))?;
        self.thin
            .chain(&self.meta.thin, &dir, top)
            .map_err(|e| io_err(format!("opening layer {top} of pool {pool:?}"), e))
    }

    pub(super) fn open_thin(
        &mut self,
        r: &VolumeRecord,
        top: u64,
    ) -> Result<Arc<OpenVolume>, StoreError> {
        let chain = self.open_chain(&r.pool, top)?;
        let volume = Arc::new(ThinVolume::new(
            chain,
            r.size_bytes,
            true,
            self.thin.cache(&r.pool),
        ));
        Ok(Arc::new(OpenVolume {
            id: VolumeId(r.id),
            name: r.name.clone(),
            pool: r.pool.clone(),
            backend: self.stack(
                &r.pool,
                Some(r),
                Arc::new(ThinBackend {
                    volume: volume.clone(),
                }),
            ),
            thin: Some(volume),
            deleted: AtomicBool::new(false),
        }))
    }

    /// Opens a snapshot's read-only export (`volume@snapshot`).
    pub(super) fn open_snapshot(&mut self, s: &SnapshotRecord) -> Result<(), StoreError> {
        let v = self.volume(&s.volume)?;
        let chain = self.open_chain(&v.pool, s.layer)?;
        chain.top().freeze();
        let volume = Arc::new(ThinVolume::new(
            chain,
            s.size_bytes,
            false,
            self.thin.cache(&v.pool),
        ));
        let name = s.export_name();
        self.open.insert(
            name.clone(),
            Arc::new(OpenVolume {
                id: VolumeId(v.id),
                name,
                pool: v.pool.clone(),
                backend: self.stack(
                    &v.pool,
                    None,
                    Arc::new(ThinBackend {
                        volume: volume.clone(),
                    }),
                ),
                thin: Some(volume),
                deleted: AtomicBool::new(false),
            }),
        );
        Ok(())
    }

    /// A snapshot as an export: its volume's access groups and policy, read-only.
    pub(super) fn snapshot_export(
        &self,
        volume: &str,
        snap: &str,
    ) -> Result<VolumeRecord, StoreError> {
        let s = self
            .meta
            .thin
            .snapshot(volume, snap)
            .or_else(|| self.rbd_snapshot(volume, snap))
            .ok_or_else(|| StoreError::NotFound(format!("no snapshot named {volume}@{snap}")))?;
        let v = self.volume(volume)?;
        Ok(VolumeRecord {
            name: s.export_name(),
            size_bytes: s.size_bytes,
            read_only: true,
            description: format!("snapshot {:?} of volume {volume:?}", s.name),
            layer: None,
            origin: None,
            ..v
        })
    }

    /// Drops layers nothing references from the catalog (not yet persisted).
    pub(super) fn collect_layers(&mut self) -> Result<Vec<LayerRecord>, StoreError> {
        let tops: Vec<u64> = self.meta.volumes.iter().filter_map(|r| r.layer).collect();
        Ok(self.meta.thin.collect_garbage(&tops))
    }

    /// Removes the files of layers already dropped from the persisted catalog.
    pub(super) fn remove_layer_files(&mut self, removed: &[LayerRecord]) {
        for l in removed {
            self.thin.forget(l.id);
            let dir = self.thin_dir_of(&l.pool);
            if let Err(e) = Layer::remove_files(&dir, l.id) {
                tracing::warn!("removing layer {} of pool {:?}: {e}", l.id, l.pool);
            }
        }
    }

    /// Removes layer files the catalog does not know (a crash between a catalog
    /// update and the removal of the files it freed).
    pub(super) fn remove_orphan_layers(&self) {
        for p in self.pools.iter().filter(|p| p.format == PoolFormat::Thin) {
            let dir = self.thin_dir_of(&p.name);
            let known = self.meta.thin.layers.iter().map(|l| l.id).collect();
            for f in weir_thin::check::orphans(&dir, &known) {
                tracing::info!("pool {:?}: removing orphan layer file {f}", p.name);
                let _ = std::fs::remove_file(dir.join(f));
            }
        }
    }

    /// Sets every open thin volume's chain from the catalog (after a merge).
    fn rebuild_chains(&mut self) -> Result<(), StoreError> {
        let mut tops: Vec<(String, String, u64)> = Vec::new();
        for r in &self.meta.volumes {
            if let Some(t) = r.layer {
                tops.push((r.name.clone(), r.pool.clone(), t));
            }
        }
        for s in &self.meta.thin.snapshots {
            let pool = self.volume(&s.volume)?.pool;
            tops.push((s.export_name(), pool, s.layer));
        }
        for (name, pool, top) in tops {
            let chain = self.open_chain(&pool, top)?;
            if let Ok(v) = self.thin_volume(&name) {
                v.set_chain(chain);
            }
        }
        Ok(())
    }

    pub(super) fn create_thin(
        &mut self,
        mut record: VolumeRecord,
    ) -> Result<VolumeRecord, StoreError> {
        self.check_descriptors(&format!("volume {:?}", record.name), PER_LAYER)?;
        let before = self.meta.clone();
        let top = self
            .meta
            .thin
            .new_layer(&record.pool, None, record.size_bytes);
        record.layer = Some(top);
        self.meta.next_volume_id += 1;
        self.meta.volumes.push(record.clone());
        let opened = self
            .open_thin(&record, top)
            .and_then(|v| self.persist().map(|()| v));
        match opened {
            Ok(v) => {
                self.open.insert(record.name.clone(), v);
            }
            Err(e) => {
                self.meta = before;
                self.thin.forget(top);
                return Err(e);
            }
        }
        Ok(record)
    }

    pub(super) fn delete_thin(
        &mut self,
        record: VolumeRecord,
    ) -> Result<(VolumeRecord, Option<Arc<OpenVolume>>), StoreError> {
        let snaps: Vec<String> = self
            .meta
            .thin
            .snapshots
            .iter()
            .filter(|s| s.volume == record.name)
            .map(|s| s.export_name())
            .collect();
        if !snaps.is_empty() {
            return Err(StoreError::Conflict(format!(
                "volume {:?} has snapshots {snaps:?}: delete them first",
                record.name
            )));
        }
        let before = self.meta.clone();
        self.meta.volumes.retain(|r| r.name != record.name);
        let removed = self.collect_layers()?;
        if let Err(e) = self.persist() {
            self.meta = before;
            return Err(e);
        }
        let open = self.open.remove(&record.name);
        if let Some(v) = &open {
            v.deleted.store(true, Ordering::Release);
        }
        self.remove_layer_files(&removed);
        Ok((record, open))
    }

    pub(super) fn resize_thin(
        &mut self,
        record: VolumeRecord,
        size: u64,
    ) -> Result<VolumeRecord, StoreError> {
        let top = record.layer.expect("thin");
        let volume = self.thin_volume(&record.name)?;
        let before = self.meta.clone();
        for l in self.meta.thin.layers.iter_mut().filter(|l| l.id == top) {
            l.size_bytes = size;
        }
        let r = self.update(&record.name, |r| r.size_bytes = size);
        if r.is_err() {
            self.meta = before;
            return r;
        }
        volume.resize(size);
        r
    }

    /// Takes a snapshot of a thin volume: writes acknowledged before it are in it,
    /// writes after are not (the volume's writes pause while it is recorded).
    pub fn snapshot(&mut self, volume: &str, name: &str) -> Result<SnapshotRecord, StoreError> {
        validate_name("snapshot", name).map_err(StoreError::Invalid)?;
        if self.is_rbd_volume(volume) {
            return self.snapshot_rbd(volume, name);
        }
        let (v, top) = self.thin_record(volume)?;
        self.check_not_busy(volume)?;
        if self.meta.thin.snapshot(volume, name).is_some() {
            return Err(StoreError::Conflict(format!(
                "snapshot {volume}@{name} already exists"
            )));
        }
        let tv = self.thin_volume(volume)?;
        let before = self.meta.clone();
        let new_top = self.meta.thin.new_layer(&v.pool, Some(top), v.size_bytes);
        let snap = SnapshotRecord {
            volume: volume.to_string(),
            name: name.to_string(),
            layer: top,
            size_bytes: v.size_bytes,
            created_unix_s: now_unix_s(),
        };
        self.meta.thin.snapshots.push(snap.clone());
        if let Some(r) = self.meta.volumes.iter_mut().find(|r| r.name == volume) {
            r.layer = Some(new_top);
        }
        if let Err(e) = self.check_descriptors(&format!("snapshot {volume}@{name}"), 0) {
            self.meta = before;
            return Err(e);
        }
        let dir = self.thin_dir_of(&v.pool);
        let rec = self.meta.thin.layer(new_top).cloned().expect("just added");
        let frozen = self
            .thin
            .layer(&dir, &rec)
            .and_then(|layer| tv.freeze_top_with(layer, || self.persist().map_err(store_io)));
        if let Err(e) = frozen {
            self.meta = before;
            self.thin.forget(new_top);
            return Err(io_err(format!("snapshot {volume}@{name}"), e));
        }
        self.open_snapshot(&snap)?;
        Ok(snap)
    }

    /// Snapshots of `volume`, or of every volume; oldest first.
    pub fn snapshots(&self, volume: Option<&str>) -> Result<Vec<SnapshotRecord>, StoreError> {
        if let Some(v) = volume {
            self.volume(v)?;
        }
        Ok(self
            .meta
            .thin
            .snapshots
            .iter()
            .chain(&self.meta.rbd_snapshots)
            .filter(|s| volume.is_none_or(|v| s.volume == v))
            .cloned()
            .collect())
    }

    /// Volumes and snapshots that read through layer `id`.
    fn dependents(&self, id: u64) -> Vec<String> {
        let reads_through = |top: u64| self.meta.thin.lineage(top).contains(&id);
        let vols = self
            .meta
            .volumes
            .iter()
            .filter(|r| r.layer.is_some_and(reads_through))
            .map(|r| r.name.clone());
        let snaps = self
            .meta
            .thin
            .snapshots
            .iter()
            .filter(|s| s.layer != id && reads_through(s.layer))
            .map(|s| s.export_name());
        vols.chain(snaps).collect()
    }

    /// Deletes a snapshot, first step (the server's `ServerState::delete_snapshot`
    /// runs the three). With one layer built on it (the volume's later state), its
    /// grains that layer still reads are merged into it first — the merge returned
    /// here, to run without the store's lock; with several (linked clones, or a
    /// rollback's new branch) it is refused. Checks; when a layer is built on the
    /// snapshot, marks the volume busy (see [`VolumeStore::flatten_begin`]); else
    /// deletes at once.
    pub fn delete_snapshot_begin(
        &mut self,
        volume: &str,
        name: &str,
    ) -> Result<DeleteSnapshot, StoreError> {
        if self.is_rbd_volume(volume) {
            return self
                .delete_snapshot_rbd(volume, name)
                .map(DeleteSnapshot::Done);
        }
        self.check_not_busy(volume)?;
        let s = self.deletable_snapshot(volume, name)?;
        let [child] = self.meta.thin.children(s.layer)[..] else {
            return self.drop_snapshot(&s).map(DeleteSnapshot::Done);
        };
        let pool = self.volume(&s.volume)?.pool;
        let dir = self.thin_dir_of(&pool);
        let rec = |id| self.meta.thin.layer(id).cloned().expect("catalog layer");
        let (parent_rec, child_rec) = (rec(s.layer), rec(child));
        let mut open =
            |rec: &LayerRecord| self.thin.layer(&dir, rec).map_err(|e| io_err("merge", e));
        let (parent, below) = (open(&parent_rec)?, open(&child_rec)?);
        self.busy
            .insert(volume.to_string(), "merging a deleted snapshot");
        Ok(DeleteSnapshot::Merge(MergePlan {
            snapshot: s,
            child,
            parent,
            below,
        }))
    }

    /// A snapshot deletion's last step: unmarks the volume and, when the merge
    /// succeeded and the layer built on the snapshot is still the one merged into
    /// (or none is left), deletes the snapshot.
    pub fn delete_snapshot_finish(
        &mut self,
        plan: MergePlan,
        merged: io::Result<()>,
    ) -> Result<SnapshotRecord, StoreError> {
        let MergePlan {
            snapshot, child, ..
        } = plan;
        self.busy.remove(&snapshot.volume);
        merged.map_err(|e| io_err(format!("merging {}", snapshot.export_name()), e))?;
        let s = self.deletable_snapshot(&snapshot.volume, &snapshot.name)?;
        if s.layer != snapshot.layer {
            // A replication collapse moved the snapshot onto the layer below while
            // its old layer was merged: that layer's own grains were not copied,
            // so dropping it now would lose them.
            return Err(StoreError::Conflict(format!(
                "snapshot {} moved to another layer while it was merged (a replication \
                 merge): try again",
                s.export_name()
            )));
        }
        match self.meta.thin.children(s.layer)[..] {
            [] => {}
            [c] if c == child => {}
            _ => {
                return Err(StoreError::Conflict(format!(
                    "snapshot {} gained a layer built on it while it was merged: try again",
                    s.export_name()
                )));
            }
        }
        self.drop_snapshot(&s)
    }

    /// The snapshot `volume@name` if it may be deleted: it exists, replication does
    /// not hold it, and at most one layer is built on it.
    fn deletable_snapshot(&self, volume: &str, name: &str) -> Result<SnapshotRecord, StoreError> {
        let s = self
            .meta
            .thin
            .snapshot(volume, name)
            .cloned()
            .ok_or_else(|| StoreError::NotFound(format!("no snapshot named {volume}@{name}")))?;
        self.replication_hold(volume, name)?;
        let children = self.meta.thin.children(s.layer);
        if children.len() > 1 {
            return Err(StoreError::Conflict(format!(
                "snapshot {volume}@{name} has {} branches built on it (read by {:?}): delete or \
                 flatten its clones first",
                children.len(),
                self.dependents(s.layer)
            )));
        }
        Ok(s)
    }

    /// Removes a snapshot from the catalog, its only child (already holding what
    /// it read from it) now reading from the snapshot's parent; its layer goes when
    /// nothing else references it.
    fn drop_snapshot(&mut self, s: &SnapshotRecord) -> Result<SnapshotRecord, StoreError> {
        let before = self.meta.clone();
        let grandparent = self.meta.thin.layer(s.layer).and_then(|l| l.parent);
        for child in self.meta.thin.children(s.layer) {
            for l in self.meta.thin.layers.iter_mut().filter(|l| l.id == child) {
                l.parent = grandparent;
            }
        }
        self.meta.thin.snapshots.retain(|x| x != s);
        let removed = self.collect_layers()?;
        if let Err(e) = self.persist() {
            self.meta = before;
            return Err(e);
        }
        if let Some(v) = self.open.remove(&s.export_name()) {
            v.deleted.store(true, Ordering::Release);
        }
        self.rebuild_chains()?;
        self.remove_layer_files(&removed);
        Ok(s.clone())
    }

    /// Returns a volume to a snapshot's content and size (writes since are gone).
    pub fn rollback(&mut self, volume: &str, snapshot: &str) -> Result<VolumeRecord, StoreError> {
        if self.is_rbd_volume(volume) {
            return self.rollback_rbd(volume, snapshot);
        }
        let (v, _) = self.thin_record(volume)?;
        self.check_not_busy(volume)?;
        let s = self
            .meta
            .thin
            .snapshot(volume, snapshot)
            .cloned()
            .ok_or_else(|| {
                StoreError::NotFound(format!("no snapshot named {volume}@{snapshot}"))
            })?;
        let tv = self.thin_volume(volume)?;
        let before = self.meta.clone();
        let new_top = self
            .meta
            .thin
            .new_layer(&v.pool, Some(s.layer), s.size_bytes);
        for r in self.meta.volumes.iter_mut().filter(|r| r.name == volume) {
            r.layer = Some(new_top);
            r.size_bytes = s.size_bytes;
        }
        let removed = self.collect_layers()?;
        // Counted with the old top gone (a rollback adds one layer at most).
        if let Err(e) = self.check_descriptors(&format!("rollback of {volume:?}"), 0) {
            self.meta = before;
            return Err(e);
        }
        let swapped = self.open_chain(&v.pool, new_top).and_then(|chain| {
            tv.replace_with(chain, s.size_bytes, || self.persist().map_err(store_io))
                .map_err(|e| io_err(format!("rollback of {volume:?}"), e))
        });
        if let Err(e) = swapped {
            self.meta = before;
            self.thin.forget(new_top);
            return Err(e);
        }
        self.remove_layer_files(&removed);
        self.drop_cached(&v.pool, volume);
        self.volume(volume)
    }

    /// Linked clones of a snapshot: new writable volumes reading through it,
    /// with the source volume's policy (unless `policy`) and access groups.
    pub fn clone_snapshot(
        &mut self,
        volume: &str,
        snapshot: &str,
        names: &[String],
        policy: Option<&str>,
    ) -> Result<Vec<VolumeRecord>, StoreError> {
        if self.is_rbd_volume(volume) {
            return self.clone_rbd(volume, snapshot, names, policy);
        }
        let s = self
            .meta
            .thin
            .snapshot(volume, snapshot)
            .cloned()
            .ok_or_else(|| {
                StoreError::NotFound(format!("no snapshot named {volume}@{snapshot}"))
            })?;
        let v = self.volume(volume)?;
        let policy = match policy {
            Some(p) => self.policy(p)?.name,
            None => v.policy.clone(),
        };
        self.check_new_names(names)?;
        let before = self.meta.clone();
        let mut records = Vec::with_capacity(names.len());
        for name in names {
            let layer = self
                .meta
                .thin
                .new_layer(&v.pool, Some(s.layer), s.size_bytes);
            self.meta.next_volume_id += 1;
            let r = VolumeRecord {
                id: self.meta.next_volume_id,
                name: name.clone(),
                pool: v.pool.clone(),
                size_bytes: s.size_bytes,
                policy: policy.clone(),
                access_groups: v.access_groups.clone(),
                read_only: false,
                description: String::new(),
                layer: Some(layer),
                origin: Some(s.export_name()),
                cache: v.cache,
                exclusive_lease: None,
            };
            self.meta.volumes.push(r.clone());
            records.push(r);
        }
        let checked = self.check_descriptors(&format!("clones of {volume}@{snapshot}"), 0);
        if let Err(e) = checked.and_then(|()| self.persist()) {
            self.meta = before;
            return Err(e);
        }
        for r in &records {
            let opened = self.open_thin(r, r.layer.expect("thin"))?;
            self.open.insert(r.name.clone(), opened);
        }
        Ok(records)
    }

    pub(super) fn check_new_names(&self, names: &[String]) -> Result<(), StoreError> {
        if names.is_empty() {
            return Err(StoreError::Invalid("no clone names given".into()));
        }
        let mut seen = std::collections::HashSet::new();
        for n in names {
            validate_name("volume", n).map_err(StoreError::Invalid)?;
            if !seen.insert(n) || self.meta.volumes.iter().any(|r| &r.name == n) {
                return Err(StoreError::Conflict(format!("volume {n:?} already exists")));
            }
        }
        Ok(())
    }

    /// Makes a volume independent of every layer below its top (a clone of its
    /// snapshot, its own snapshots), first step (the server's
    /// `ServerState::flatten_volume` runs the three): what it reads from them is to
    /// be copied into its top. Checks, marks the volume busy (its layers keep
    /// still: no snapshot, rollback, resize, delete or replication cycle until
    /// [`VolumeStore::flatten_finish`]), and returns the copy to make — which
    /// needs no lock: it only fills grains the top does not own, under their
    /// stripe locks, with what the top reads through to anyway.
    pub fn flatten_begin(&mut self, volume: &str) -> Result<Flatten, StoreError> {
        if self.is_rbd_volume(volume) {
            return self.flatten_rbd(volume).map(Flatten::Done);
        }
        self.check_not_busy(volume)?;
        let (_, top) = self.thin_record(volume)?;
        let chain = self.thin_volume(volume)?.chain();
        if chain.layers.len() == 1 {
            return Err(StoreError::Invalid(format!(
                "volume {volume:?} reads from no other layer: nothing to flatten"
            )));
        }
        self.busy.insert(volume.to_string(), "being flattened");
        Ok(Flatten::Copy(FlattenPlan {
            volume: volume.to_string(),
            top,
            chain,
        }))
    }

    /// A flatten's last step: unmarks the volume and, when the copy succeeded,
    /// records the top as independent.
    pub fn flatten_finish(
        &mut self,
        plan: FlattenPlan,
        copied: io::Result<()>,
    ) -> Result<VolumeRecord, StoreError> {
        let FlattenPlan { volume, top, chain } = plan;
        self.busy.remove(&volume);
        copied.map_err(|e| io_err(format!("flattening {volume:?}"), e))?;
        let (v, now_top) = self.thin_record(&volume)?;
        if now_top != top {
            debug_assert!(false, "a busy volume keeps its top layer");
            return Err(StoreError::Conflict(format!(
                "volume {volume:?} changed while it was flattened: try again"
            )));
        }
        let tv = self.thin_volume(&volume)?;
        let own = chain.top().clone();
        let before = self.meta.clone();
        for l in self.meta.thin.layers.iter_mut().filter(|l| l.id == top) {
            l.parent = None;
        }
        for r in self.meta.volumes.iter_mut().filter(|r| r.name == volume) {
            r.origin = None;
        }
        let removed = self.collect_layers()?;
        let swapped = tv.replace_with(Chain { layers: vec![own] }, v.size_bytes, || {
            self.persist().map_err(store_io)
        });
        if let Err(e) = swapped {
            self.meta = before;
            return Err(io_err(format!("flattening {volume:?}"), e));
        }
        self.remove_layer_files(&removed);
        self.volume(&volume)
    }

    /// Commits every thin volume, then verifies every thin pool's layers against
    /// the catalog (maps, files, parent chains, references).
    /// What `weir volume check` reads of the catalog (under the store's lock; the
    /// check itself, [`ThinCheck::run`], goes without it: reading every map of a
    /// pool of thousands of layers took seconds, in which no client could open a
    /// volume).
    pub fn check_thin_begin(&self) -> ThinCheck {
        let mut garbage = self.meta.thin.clone();
        let tops: Vec<u64> = self.meta.volumes.iter().filter_map(|r| r.layer).collect();
        let leaked = garbage.collect_garbage(&tops);
        let mut pools = Vec::new();
        for p in self.pools.iter().filter(|p| p.format == PoolFormat::Thin) {
            let layers = self.meta.thin.layers.iter().filter(|l| l.pool == p.name);
            let infos = layers
                .map(|l| LayerInfo {
                    id: l.id,
                    parent: l.parent,
                    grains: l.size_bytes.div_ceil(weir_thin::GRAIN_BYTES),
                })
                .collect();
            let mut problems: Vec<String> = leaked
                .iter()
                .filter(|l| l.pool == p.name)
                .map(|l| format!("layer {}: nothing references it", l.id))
                .collect();
            for t in &tops {
                if self.meta.thin.layer(*t).is_none() {
                    problems.push(format!("a volume's top layer {t} is not in the catalog"));
                }
            }
            pools.push(PoolToCheck {
                pool: p.name.clone(),
                dir: self.thin_dir_of(&p.name),
                infos,
                problems,
            });
        }
        let mut volumes: Vec<_> = self
            .open
            .iter()
            .map(|(n, v)| (n.clone(), v.clone()))
            .collect();
        volumes.sort_by(|a, b| a.0.cmp(&b.0));
        ThinCheck {
            volumes,
            pools,
            newest_layer: self
                .meta
                .thin
                .layers
                .iter()
                .map(|l| l.id)
                .max()
                .unwrap_or(0),
        }
    }

    /// The check's result as the catalog stands now: a layer removed while it ran
    /// (a clone or snapshot deleted) is no problem, nor are the files of layers
    /// created meanwhile.
    pub fn check_thin_finish(&self, ran: CheckedPools) -> Vec<ThinPoolCheck> {
        let known = |id: u64| self.meta.thin.layer(id).is_some();
        let newest = ran.newest_layer;
        ran.pools
            .into_iter()
            .map(|(p, r)| {
                let mut problems = p.problems;
                let layers = r.layer_problems.into_iter().filter(|(id, _)| known(*id));
                problems.extend(r.problems);
                problems.extend(layers.map(|(id, e)| format!("layer {id}: {e}")));
                let orphan_files = r
                    .orphan_files
                    .into_iter()
                    .filter(|f| layer_of_file(f).is_some_and(|id| id <= newest && !known(id)))
                    .collect();
                ThinPoolCheck {
                    pool: p.pool,
                    layers: r.layers,
                    stored_grains: r.stored_grains,
                    zero_grains: r.zero_grains,
                    orphan_files,
                    problems,
                }
            })
            .collect()
    }

    /// Space of every thin volume (exclusive: in its own top layer).
    pub fn thin_space(&self) -> Vec<ThinSpace> {
        let mut out: Vec<ThinSpace> = self
            .meta
            .volumes
            .iter()
            .filter_map(|r| {
                let tv = self.thin_volume(&r.name).ok()?;
                Some(ThinSpace {
                    pool: r.pool.clone(),
                    volume: r.name.clone(),
                    exclusive_bytes: tv.chain().top().stored_bytes(),
                })
            })
            .collect();
        out.sort_by(|a, b| a.volume.cmp(&b.volume));
        out
    }

    /// The clone-aware caches: pool, counters, grain size.
    pub fn thin_cache_stats(&self) -> Vec<(String, weir_model::ReadCacheStats, u64)> {
        self.pools
            .iter()
            .filter_map(|p| {
                let c = self.thin.cache(&p.name)?;
                Some((p.name.clone(), c.stats(), weir_thin::GRAIN_BYTES))
            })
            .collect()
    }

    /// Bytes read from thin layers' data files, per thin pool.
    pub fn thin_backing_read_bytes(&self) -> BTreeMap<String, u64> {
        self.pools
            .iter()
            .filter(|p| p.format == PoolFormat::Thin)
            .map(|p| {
                (
                    p.name.clone(),
                    self.thin.backing_read_bytes(&self.meta.thin, &p.name),
                )
            })
            .collect()
    }

    /// Bytes stored in frozen layers (snapshots, images under clones) per pool.
    pub fn thin_shared_bytes(&mut self) -> BTreeMap<String, u64> {
        let tops: std::collections::HashSet<u64> =
            self.meta.volumes.iter().filter_map(|r| r.layer).collect();
        let mut out = BTreeMap::new();
        for l in self.meta.thin.layers.clone() {
            if tops.contains(&l.id) {
                continue;
            }
            let dir = self.thin_dir_of(&l.pool);
            if let Ok(layer) = self.thin.layer(&dir, &l) {
                *out.entry(l.pool.clone()).or_insert(0) += layer.stored_bytes();
            }
        }
        out
    }
}
