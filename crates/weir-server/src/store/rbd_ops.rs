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
//! - snapshots and clones are refused with a message (docs/RBD.md).

use super::*;
use crate::rbd::{RbdCluster, RbdImage, image_error};

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

    /// The cluster's size and free space for an RBD pool (`None`: not one, or
    /// the cluster did not answer).
    pub fn rbd_space(&self, pool: &str) -> Option<(u64, u64)> {
        self.rbd.clusters.get(pool)?.space().ok()
    }

    fn rbd_volume(&mut self, r: &VolumeRecord, image: Arc<RbdImage>) -> Arc<OpenVolume> {
        self.rbd.images.insert(r.name.clone(), image.clone());
        Arc::new(OpenVolume {
            id: VolumeId(r.id),
            name: r.name.clone(),
            pool: r.pool.clone(),
            backend: self.stack(&r.pool, image),
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
                     one with `rbd create --size {}B {pool}/{}`, or delete the volume",
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
        self.meta.volumes.retain(|r| r.name != record.name);
        self.persist()?;
        let open = self.open.remove(&record.name);
        if let Some(v) = &open {
            v.deleted.store(true, Ordering::Release);
        }
        if let Some(image) = self.rbd.images.remove(&record.name) {
            image.close();
        }
        cluster.remove_image(&record.name).map_err(|e| {
            StoreError::Io(format!(
                "volume {:?} is deleted from Weir, but {}",
                record.name,
                image_error("removing", &cluster.target().pool, &record.name, &e)
            ))
        })?;
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
