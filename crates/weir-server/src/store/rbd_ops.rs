//! The volume store's RBD pools (`backend = "rbd"`, `crate::rbd`): each volume
//! is an RBD image of its name in the pool's RADOS pool. The store connects to
//! every RBD pool's cluster at start (a missing librbd, an unreachable cluster
//! or a missing RADOS pool stops the start with the reason).
//!
//! - `volume create` creates the image (an existing image of that name is
//!   refused: it may be another gateway's); a volume the configuration declares
//!   is created at its first start, or adopts an image of its name that
//!   already exists (how a second gateway serves an image, or a gateway whose
//!   data directory was lost gets its volumes back);
//! - at start an image smaller than the volume's size is grown, a larger one
//!   (grown with `rbd resize`) gives the volume its size; the image of a volume
//!   known before this start must exist (no silent empty replacement);
//! - `volume delete` forgets the volume, closes the image and removes it;
//! - `volume resize` resizes the image;
//! - `volume snapshot` takes an RBD snapshot (protected, so it can be cloned),
//!   exported read-only as `volume@snapshot` like a thin snapshot; `clone`
//!   makes layered RBD clones of it (their `origin` is the snapshot), `flatten`
//!   copies a clone's parent data into it (`rbd flatten`), `rollback` is
//!   `rbd snap rollback`, `delete-snapshot` unprotects and removes it (refused
//!   while clones read from it); a volume with snapshots is not deleted.

use super::*;
use crate::rbd::{RbdCluster, RbdImage, image_error};
use crate::thin::SnapshotRecord;

/// `POST /v1/volumes/{volume}/takeover`: what a failover did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TakeOver {
    pub volume: String,
    /// The lock owners broken (and blocklisted); empty: none but this gateway.
    pub fenced: Vec<String>,
}

/// Connected clusters and open images of the RBD pools.
#[derive(Default)]
pub(crate) struct RbdState {
    clusters: HashMap<String, Arc<RbdCluster>>,
    images: HashMap<String, Arc<RbdImage>>,
}

impl VolumeStore {
    /// The pool's configuration if it is an RBD pool.
    pub(crate) fn rbd_pool(&self, pool: &str) -> Option<&PoolConfig> {
        self.pools
            .iter()
            .find(|p| p.name == pool && p.backend == crate::config::PoolBackend::Rbd)
    }

    /// Connects every RBD pool's cluster (at start).
    pub(super) fn connect_rbd_pools(&mut self) -> Result<(), StoreError> {
        for p in self.pools.clone() {
            let Some(target) = p.rbd_target() else {
                continue;
            };
            let cluster = RbdCluster::connect(&target)
                .map_err(|e| StoreError::Invalid(format!("pool {:?}: {e}", p.name)))?;
            self.rbd.clusters.insert(p.name.clone(), cluster);
        }
        Ok(())
    }

    fn rbd_cluster(&self, pool: &str) -> Result<Arc<RbdCluster>, StoreError> {
        self.rbd.clusters.get(pool).cloned().ok_or_else(|| {
            StoreError::Invalid(format!("pool {pool:?} is not a connected RBD pool"))
        })
    }

    /// The cluster's size and free space for an RBD pool as last measured,
    /// waiting at most a second (`None`: not one, or never measured).
    pub fn rbd_space(&self, pool: &str) -> Option<(u64, u64)> {
        self.rbd.clusters.get(pool)?.space()
    }

    fn rbd_volume(&mut self, r: &VolumeRecord, image: Arc<RbdImage>) -> Arc<OpenVolume> {
        self.rbd.images.insert(r.name.clone(), image.clone());
        Arc::new(OpenVolume {
            id: VolumeId(r.id),
            name: r.name.clone(),
            pool: r.pool.clone(),
            backend: self.stack(&r.pool, Some(r), image),
            thin: None,
            deleted: AtomicBool::new(false),
        })
    }

    /// At start: opens (or, for a volume new in this start, creates) a volume's
    /// image; returns the volume and its size (the image's, when it is larger).
    pub(super) fn open_rbd(
        &mut self,
        r: &VolumeRecord,
        known: bool,
    ) -> Result<(Arc<OpenVolume>, u64), StoreError> {
        let cluster = self.rbd_cluster(&r.pool)?;
        let pool = cluster.target().pool.clone();
        let err = |what: &str, e: std::io::Error| {
            StoreError::Io(format!(
                "volume {:?}: {}",
                r.name,
                image_error(what, &pool, &r.name, &e)
            ))
        };
        let image = match cluster.open_image(&r.name) {
            Ok(i) => i,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) && !known => {
                cluster
                    .create_image(&r.name, r.size_bytes)
                    .map_err(|e| err("creating", e))?;
                tracing::info!(target: crate::admin::AUDIT_TARGET,
                    "config: volume {:?}: created RBD image {pool}/{} ({} bytes)", r.name, r.name, r.size_bytes);
                cluster.open_image(&r.name).map_err(|e| err("opening", e))?
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                return Err(StoreError::Invalid(format!(
                    "volume {:?}: its RBD image {pool}/{} is missing (removed outside Weir?); \
                     Weir does not replace it with an empty one: restore it, or create an empty \
                     one with `rbd create --size {}B {pool}/{}` (then `weir volume delete` it if unwanted)",
                    r.name, r.name, r.size_bytes, r.name
                )));
            }
            Err(e) => return Err(err("opening", e)),
        };
        let have = image.size().map_err(|e| err("sizing", e))?;
        let size = if have < r.size_bytes {
            image.resize(r.size_bytes).map_err(|e| err("growing", e))?;
            r.size_bytes
        } else {
            if have > r.size_bytes {
                tracing::info!(target: crate::admin::AUDIT_TARGET,
                    "volume {:?}: RBD image {pool}/{} is {have} bytes (grown outside Weir); the volume follows", r.name, r.name);
            }
            have
        };
        Ok((self.rbd_volume(r, image), size))
    }

    /// `volume create` in an RBD pool: a new image.
    pub(super) fn create_rbd(&mut self, record: VolumeRecord) -> Result<VolumeRecord, StoreError> {
        let cluster = self.rbd_cluster(&record.pool)?;
        let pool = cluster.target().pool.clone();
        cluster
            .create_image(&record.name, record.size_bytes)
            .map_err(|e| {
                let m = image_error("creating", &pool, &record.name, &e);
                if e.raw_os_error() == Some(libc::EEXIST) {
                    StoreError::Conflict(m)
                } else {
                    StoreError::Io(m)
                }
            })?;
        let image = match cluster.open_image(&record.name) {
            Ok(i) => i,
            Err(e) => {
                let _ = cluster.remove_image(&record.name);
                return Err(StoreError::Io(image_error(
                    "opening",
                    &pool,
                    &record.name,
                    &e,
                )));
            }
        };
        self.meta.next_volume_id += 1;
        self.meta.volumes.push(record.clone());
        if let Err(e) = self.persist() {
            self.meta.volumes.pop();
            image.close();
            let _ = cluster.remove_image(&record.name);
            return Err(e);
        }
        let volume = self.rbd_volume(&record, image);
        self.open.insert(record.name.clone(), volume);
        Ok(record)
    }

    /// Forgets a volume of an RBD pool, closes and removes its image.
    pub(super) fn delete_rbd(
        &mut self,
        record: VolumeRecord,
    ) -> Result<(VolumeRecord, Option<Arc<OpenVolume>>), StoreError> {
        let cluster = self.rbd_cluster(&record.pool)?;
        self.check_no_rbd_snapshots(&record.name)?;
        self.meta.volumes.retain(|r| r.name != record.name);
        self.persist()?;
        let open = self.open.remove(&record.name);
        if let Some(v) = &open {
            v.deleted.store(true, Ordering::Release);
        }
        let left = |what: &str, e: &std::io::Error| {
            StoreError::Io(format!(
                "volume {:?} is deleted from Weir, but {}",
                record.name,
                image_error(what, &cluster.target().pool, &record.name, e)
            ))
        };
        if let Some(image) = self.rbd.images.remove(&record.name) {
            image.close_bounded().map_err(|e| left("closing", &e))?;
        }
        cluster
            .remove_image(&record.name)
            .map_err(|e| left("removing", &e))?;
        Ok((record, open))
    }

    /// Grows a volume's image.
    pub(super) fn resize_rbd(
        &mut self,
        record: VolumeRecord,
        size_bytes: u64,
    ) -> Result<VolumeRecord, StoreError> {
        let image = self.rbd.images.get(&record.name).cloned().ok_or_else(|| {
            StoreError::Invalid(format!("volume {:?} has no open RBD image", record.name))
        })?;
        image.resize(size_bytes).map_err(|e| {
            let pool = self
                .rbd_cluster(&record.pool)
                .map(|c| c.target().pool.clone())
                .unwrap_or_default();
            StoreError::Io(image_error("resizing", &pool, &record.name, &e))
        })?;
        self.update(&record.name, |r| r.size_bytes = size_bytes)
    }
}

impl VolumeStore {
    /// Whether `volume` exists and is in an RBD pool.
    pub(super) fn is_rbd_volume(&self, volume: &str) -> bool {
        self.volume(volume)
            .is_ok_and(|r| self.rbd_pool(&r.pool).is_some())
    }

    /// Several gateways write `volume` at once (the gateway stats volume): off
    /// with its image's exclusive lock ([`RbdImage::share_writes`]). Nothing to do
    /// for a volume outside an RBD pool.
    pub fn share_writes(&self, volume: &str) -> Result<(), StoreError> {
        if !self.is_rbd_volume(volume) {
            return Ok(());
        }
        self.rbd_image(volume)?
            .share_writes()
            .map_err(|e| self.rbd_err("sharing writes to", volume, &e))
    }

    pub(super) fn rbd_snapshot(&self, volume: &str, snap: &str) -> Option<&SnapshotRecord> {
        self.meta
            .rbd_snapshots
            .iter()
            .find(|s| s.volume == volume && s.name == snap)
    }

    fn rbd_image(&self, volume: &str) -> Result<Arc<RbdImage>, StoreError> {
        self.rbd
            .images
            .get(volume)
            .cloned()
            .ok_or_else(|| StoreError::Invalid(format!("volume {volume:?} has no open RBD image")))
    }

    fn rbd_err(&self, what: &str, volume: &str, e: &std::io::Error) -> StoreError {
        let pool = self
            .volume(volume)
            .ok()
            .and_then(|r| self.rbd.clusters.get(&r.pool))
            .map(|c| c.target().pool.clone())
            .unwrap_or_default();
        let m = image_error(what, &pool, volume, e);
        match e.raw_os_error() {
            Some(libc::EEXIST) | Some(libc::EBUSY) | Some(libc::ENOTEMPTY) => {
                StoreError::Conflict(m)
            }
            _ => StoreError::Io(m),
        }
    }

    /// Opens a snapshot's read-only export (`volume@snapshot`).
    pub(super) fn open_rbd_snapshot(&mut self, s: &SnapshotRecord) -> Result<(), StoreError> {
        let v = self.volume(&s.volume)?;
        let cluster = self.rbd_cluster(&v.pool)?;
        let image = cluster.open_snapshot(&s.volume, &s.name).map_err(|e| {
            self.rbd_err(&format!("opening snapshot {:?} of", s.name), &s.volume, &e)
        })?;
        let name = s.export_name();
        self.rbd.images.insert(name.clone(), image.clone());
        let volume = Arc::new(OpenVolume {
            id: VolumeId(v.id),
            name: name.clone(),
            pool: v.pool.clone(),
            backend: self.stack(&v.pool, None, image),
            thin: None,
            deleted: AtomicBool::new(false),
        });
        self.open.insert(name, volume);
        Ok(())
    }

    /// `volume snapshot` of an RBD volume.
    pub(super) fn snapshot_rbd(
        &mut self,
        volume: &str,
        name: &str,
    ) -> Result<SnapshotRecord, StoreError> {
        let v = self.volume(volume)?;
        if self.rbd_snapshot(volume, name).is_some() {
            return Err(StoreError::Conflict(format!(
                "snapshot {volume}@{name} already exists"
            )));
        }
        let image = self.rbd_image(volume)?;
        image
            .snapshot(name)
            .map_err(|e| self.rbd_err(&format!("taking snapshot {name:?} of"), volume, &e))?;
        let snap = SnapshotRecord {
            volume: volume.to_string(),
            name: name.to_string(),
            layer: 0,
            size_bytes: v.size_bytes,
            created_unix_s: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
        };
        self.meta.rbd_snapshots.push(snap.clone());
        let opened = self.persist().and_then(|()| self.open_rbd_snapshot(&snap));
        if let Err(e) = opened {
            self.meta.rbd_snapshots.retain(|s| s != &snap);
            let _ = self.persist();
            let _ = image.remove_snapshot(name);
            return Err(e);
        }
        Ok(snap)
    }

    /// `volume delete-snapshot` of an RBD volume.
    pub(super) fn delete_snapshot_rbd(
        &mut self,
        volume: &str,
        name: &str,
    ) -> Result<SnapshotRecord, StoreError> {
        let s = self
            .rbd_snapshot(volume, name)
            .cloned()
            .ok_or_else(|| StoreError::NotFound(format!("no snapshot named {volume}@{name}")))?;
        let clones: Vec<&str> = self
            .meta
            .volumes
            .iter()
            .filter(|r| r.origin.as_deref() == Some(s.export_name().as_str()))
            .map(|r| r.name.as_str())
            .collect();
        if !clones.is_empty() {
            return Err(StoreError::Conflict(format!(
                "snapshot {volume}@{name} is read by clones {clones:?}: flatten or delete them first"
            )));
        }
        let export = s.export_name();
        if let Some(v) = self.open.remove(&export) {
            v.deleted.store(true, Ordering::Release);
        }
        if let Some(i) = self.rbd.images.remove(&export)
            && let Err(e) = i.close_bounded()
        {
            return Err(self.rbd_err(&format!("closing snapshot {name:?} of"), volume, &e));
        }
        let image = self.rbd_image(volume)?;
        if let Err(e) = image.remove_snapshot(name) {
            // Still there: export it again.
            let _ = self.open_rbd_snapshot(&s);
            return Err(self.rbd_err(&format!("removing snapshot {name:?} of"), volume, &e));
        }
        self.meta.rbd_snapshots.retain(|x| x != &s);
        self.persist()?;
        Ok(s)
    }

    /// `volume rollback` of an RBD volume: its data and size become the
    /// snapshot's.
    pub(super) fn rollback_rbd(
        &mut self,
        volume: &str,
        snapshot: &str,
    ) -> Result<VolumeRecord, StoreError> {
        let s = self
            .rbd_snapshot(volume, snapshot)
            .cloned()
            .ok_or_else(|| {
                StoreError::NotFound(format!("no snapshot named {volume}@{snapshot}"))
            })?;
        let image = self.rbd_image(volume)?;
        image
            .rollback(snapshot)
            .map_err(|e| self.rbd_err(&format!("rolling back to {snapshot:?}"), volume, &e))?;
        let size = image
            .size()
            .map_err(|e| self.rbd_err("sizing", volume, &e))?;
        tracing::debug!(
            "volume {volume:?} rolled back to {} ({size} bytes)",
            s.export_name()
        );
        let r = self.update(volume, |r| r.size_bytes = size)?;
        self.drop_cached(&r.pool, volume);
        Ok(r)
    }

    /// `volume clone` of an RBD volume's snapshot: layered RBD clones.
    pub(super) fn clone_rbd(
        &mut self,
        volume: &str,
        snapshot: &str,
        names: &[String],
        policy: Option<&str>,
    ) -> Result<Vec<VolumeRecord>, StoreError> {
        let s = self
            .rbd_snapshot(volume, snapshot)
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
        let cluster = self.rbd_cluster(&v.pool)?;
        let mut made: Vec<(VolumeRecord, Arc<RbdImage>)> = Vec::with_capacity(names.len());
        let undo = |made: &[(VolumeRecord, Arc<RbdImage>)]| {
            for (r, image) in made {
                image.close();
                let _ = cluster.remove_image(&r.name);
            }
        };
        for (i, name) in names.iter().enumerate() {
            let opened = cluster
                .clone_image(volume, snapshot, name)
                .and_then(|()| cluster.open_image(name));
            let image = match opened {
                Ok(image) => image,
                Err(e) => {
                    let _ = cluster.remove_image(name);
                    undo(&made);
                    return Err(self.rbd_err(&format!("cloning {volume}@{snapshot} to"), name, &e));
                }
            };
            let r = VolumeRecord {
                id: self.meta.next_volume_id + 1 + i as u32,
                name: name.clone(),
                pool: v.pool.clone(),
                size_bytes: s.size_bytes,
                policy: policy.clone(),
                access_groups: v.access_groups.clone(),
                read_only: false,
                description: String::new(),
                layer: None,
                origin: Some(s.export_name()),
                cache: v.cache,
                exclusive_lease: None,
            };
            made.push((r, image));
        }
        let before = self.meta.clone();
        for (r, _) in &made {
            self.meta.next_volume_id += 1;
            self.meta.volumes.push(r.clone());
        }
        if let Err(e) = self.persist() {
            self.meta = before;
            undo(&made);
            return Err(e);
        }
        let mut records = Vec::with_capacity(made.len());
        for (r, image) in made {
            let volume = self.rbd_volume(&r, image);
            self.open.insert(r.name.clone(), volume);
            records.push(r);
        }
        Ok(records)
    }

    /// `volume flatten` of an RBD clone.
    pub(super) fn flatten_rbd(&mut self, volume: &str) -> Result<VolumeRecord, StoreError> {
        let v = self.volume(volume)?;
        if v.origin.is_none() {
            return Err(StoreError::Invalid(format!(
                "volume {volume:?} is not a clone: nothing to flatten"
            )));
        }
        let image = self.rbd_image(volume)?;
        image
            .flatten()
            .map_err(|e| self.rbd_err("flattening", volume, &e))?;
        self.update(volume, |r| r.origin = None)
    }

    /// Refuses to delete a volume with snapshots (the image keeps them).
    pub(super) fn check_no_rbd_snapshots(&self, volume: &str) -> Result<(), StoreError> {
        let snaps: Vec<String> = self
            .meta
            .rbd_snapshots
            .iter()
            .filter(|s| s.volume == volume)
            .map(SnapshotRecord::export_name)
            .collect();
        if snaps.is_empty() {
            Ok(())
        } else {
            Err(StoreError::Conflict(format!(
                "volume {volume:?} has snapshots {snaps:?}: delete them first"
            )))
        }
    }
}

impl VolumeStore {
    /// Failover (`weir volume takeover`): breaks the RBD exclusive lock another
    /// gateway holds on the volume's image, fencing that gateway (blocklisted:
    /// it can write no more), so this one serves the volume at once instead of
    /// waiting for a dead gateway's watch to expire.
    pub fn take_over(&mut self, volume: &str) -> Result<TakeOver, StoreError> {
        let r = self.volume(volume)?;
        if self.rbd_pool(&r.pool).is_none() {
            return Err(StoreError::Invalid(format!(
                "volume {volume:?} is in pool {:?}: only volumes of RBD pools (backend = \"rbd\") \
                 have a lock another gateway can hold",
                r.pool
            )));
        }
        let image = self.rbd_image(volume)?;
        let fenced = image
            .take_over()
            .map_err(|e| self.rbd_err("taking over", volume, &e))?;
        tracing::warn!(target: crate::admin::AUDIT_TARGET,
            "volume {volume:?}: took over its RBD image's lock; fenced {fenced:?}");
        Ok(TakeOver {
            volume: volume.to_string(),
            fenced,
        })
    }
}
