//! Open files as a bounded resource of the volume store.
//!
//! A file volume keeps one descriptor open; a thin layer two (its map and data
//! files) from its first write to its removal. A volume's top layer opens them
//! at its first write after a snapshot, clone, rollback or creation, so the
//! store counts every top as holding them; a read-only layer never written (a
//! snapshot of a volume unchanged since the last one) holds none. The server
//! gives the store what its open-files limit leaves after NBD and admin
//! connections and a spare ([`crate::connections::fit_to_fd_limit`]); an
//! operation that would need more is refused before anything changes. (Before,
//! snapshots were taken past the limit and the volume's next write, the first to
//! open its new top's files, failed with EIO: `EMFILE`.)

use std::collections::HashSet;

use super::{StoreError, VolumeRecord, VolumeStore};

/// Descriptors a thin layer holds once written: its map file and data file.
pub const PER_LAYER: u64 = 2;

impl VolumeStore {
    /// Descriptors the store holds once every volume is written.
    pub fn descriptors_needed(&self) -> u64 {
        let tops: HashSet<u64> = self.meta.volumes.iter().filter_map(|r| r.layer).collect();
        let layers = self.meta.thin.layers.iter();
        let held = layers.filter(|l| tops.contains(&l.id) || self.thin.has_files(l.id));
        PER_LAYER * held.count() as u64 + self.file_volumes()
    }

    /// Descriptors the store holds now.
    pub fn descriptors_open(&self) -> u64 {
        let layers = self.meta.thin.layers.iter();
        let held = layers.filter(|l| self.thin.has_files(l.id));
        PER_LAYER * held.count() as u64 + self.file_volumes()
    }

    /// The store may hold `extra` descriptors more than it needs now (the
    /// server's room after connections); beyond, operations are refused.
    pub fn set_descriptor_room(&mut self, extra: u64) {
        self.descriptor_cap = Some(self.descriptors_needed().saturating_add(extra));
    }

    /// The most descriptors the store may hold, if limited.
    pub fn descriptor_cap(&self) -> Option<u64> {
        self.descriptor_cap
    }

    /// Refuses `what` when the store, with `more` descriptors (and the catalog
    /// as it stands), would need more than its share of the open-files limit.
    pub(super) fn check_descriptors(&self, what: &str, more: u64) -> Result<(), StoreError> {
        let Some(cap) = self.descriptor_cap else {
            return Ok(());
        };
        let need = self.descriptors_needed().saturating_add(more);
        if need <= cap {
            return Ok(());
        }
        Err(StoreError::Exhausted(format!(
            "{what}: no room in the server's open-files limit: volumes would hold {need} open \
             files of the {cap} left to them after connections (two per thin layer written \
             or writable: each volume's top and each snapshot taken after writes; one per \
             file volume); raise the limit (ulimit -n, systemd LimitNOFILE) and restart, or \
             delete snapshots, clones or volumes"
        )))
    }

    fn file_volumes(&self) -> u64 {
        self.meta
            .volumes
            .iter()
            .filter(|r| self.holds_file(r))
            .count() as u64
    }

    /// A volume kept open as one file of its pool (not thin, RBD or upstream).
    fn holds_file(&self, r: &VolumeRecord) -> bool {
        r.layer.is_none()
            && self.upstream_pool(&r.pool).is_none()
            && self.rbd_pool(&r.pool).is_none()
    }
}
