//! The volume store's side of asynchronous replication (`crate::replicate`):
//! replication records in the catalog, a cycle's snapshot and the layers that
//! changed since the last replicated one, the cursor of a cycle in progress,
//! recording a finished cycle (the previous base snapshot released), and
//! collapsing the layer a released snapshot leaves behind. Each call holds the
//! store only for catalog work and local layer lookups, never across network
//! I/O; data copies (shipping, [`weir_thin::commit_into`]) run outside it.

use std::collections::HashSet;

use weir_thin::Layer;

use super::*;
use crate::config::ReplicationConfig;
use crate::replicate::{
    Changed, Collapse, CyclePlan, NbdUrl, PendingCycle, ReplicatedPoint, ReplicationRecord,
    SNAPSHOT_PREFIX, now_unix_ms, parse_every,
};
use crate::thin::{LayerRecord, SnapshotRecord};

impl VolumeStore {
    /// The replication of `volume`, if it has one.
    pub fn replication(&self, volume: &str) -> Option<ReplicationRecord> {
        self.meta
            .replications
            .iter()
            .find(|r| r.volume == volume)
            .cloned()
    }

    /// Every replication, by volume name.
    pub fn replications(&self) -> Vec<ReplicationRecord> {
        let mut v = self.meta.replications.clone();
        v.sort_by(|a, b| a.volume.cmp(&b.volume));
        v
    }

    fn replication_mut(&mut self, volume: &str) -> Option<&mut ReplicationRecord> {
        self.meta
            .replications
            .iter_mut()
            .find(|r| r.volume == volume)
    }

    /// Creates the replication of a thin volume to `to`, or changes the interval
    /// of its existing one to the same target. Returns the record and whether it
    /// is new.
    pub fn put_replication(
        &mut self,
        volume: &str,
        to: &NbdUrl,
        every_seconds: Option<u64>,
        overwrite: bool,
    ) -> Result<(ReplicationRecord, bool), StoreError> {
        self.thin_record(volume)?;
        let target = to.to_string();
        let before = self.meta.replications.clone();
        let created = match self.replication_mut(volume) {
            Some(r) if r.target != target => {
                return Err(StoreError::Conflict(format!(
                    "volume {volume:?} already replicates to {}: stop that first \
                     (weir volume replicate {volume} --stop; the next one starts with a full copy)",
                    r.target
                )));
            }
            Some(r) => {
                if every_seconds.is_some() {
                    r.every_seconds = every_seconds;
                }
                r.target_checked |= overwrite;
                false
            }
            None => {
                self.meta.replications.push(ReplicationRecord {
                    volume: volume.to_string(),
                    target,
                    every_seconds,
                    created_unix_ms: now_unix_ms(),
                    next_seq: 1,
                    last: None,
                    pending: None,
                    target_checked: overwrite,
                });
                true
            }
        };
        if let Err(e) = self.persist() {
            self.meta.replications = before;
            return Err(e);
        }
        Ok((self.replication(volume).expect("just put"), created))
    }

    /// A replication's target was found without data: its first full copy may
    /// write over it from now on (also after an interruption).
    pub fn replication_target_checked(&mut self, volume: &str) -> Result<(), StoreError> {
        let before = self.meta.replications.clone();
        let Some(r) = self.replication_mut(volume) else {
            return Err(StoreError::NotFound(format!(
                "volume {volume:?} is not replicated"
            )));
        };
        r.target_checked = true;
        if let Err(e) = self.persist() {
            self.meta.replications = before;
            return Err(e);
        }
        Ok(())
    }

    /// Ends the replication of `volume`: its record goes and so do the names of
    /// its snapshots (the last replicated one, a cycle's in progress). Their
    /// layers stay while the volume reads through them; collapse them with
    /// [`Self::replication_collapse_next`].
    pub fn remove_replication(&mut self, volume: &str) -> Result<ReplicationRecord, StoreError> {
        let r = self
            .replication(volume)
            .ok_or_else(|| StoreError::NotFound(format!("volume {volume:?} is not replicated")))?;
        let before = self.meta.clone();
        self.meta.replications.retain(|x| x.volume != volume);
        let names: Vec<String> = r
            .last
            .iter()
            .map(|l| l.snapshot.clone())
            .chain(r.pending.iter().map(|p| p.snapshot.clone()))
            .collect();
        self.meta
            .thin
            .snapshots
            .retain(|s| !(s.volume == volume && names.contains(&s.name)));
        let removed = self.collect_layers()?;
        if let Err(e) = self.persist() {
            self.meta = before;
            return Err(e);
        }
        for n in &names {
            if let Some(v) = self.open.remove(&format!("{volume}@{n}")) {
                v.deleted.store(true, Ordering::Release);
            }
        }
        self.remove_layer_files(&removed);
        Ok(r)
    }

    /// Refuses to delete a snapshot a replication stands on.
    pub(super) fn replication_hold(&self, volume: &str, snapshot: &str) -> Result<(), StoreError> {
        let Some(r) = self.meta.replications.iter().find(|r| r.volume == volume) else {
            return Ok(());
        };
        let held = r.last.as_ref().is_some_and(|l| l.snapshot == snapshot)
            || r.pending.as_ref().is_some_and(|p| p.snapshot == snapshot);
        if held {
            return Err(StoreError::Conflict(format!(
                "snapshot {volume}@{snapshot} belongs to the replication to {}: it goes by itself \
                 after the next cycle, or stop the replication (weir volume replicate {volume} --stop)",
                r.target
            )));
        }
        Ok(())
    }

    /// Starts a cycle: resumes the snapshot of an unfinished one, or takes a new
    /// snapshot `repl-<n>` (recorded as the cycle in progress in the same catalog
    /// write), and lists what to ship (the layers that changed since the last
    /// replicated snapshot, or everything).
    pub fn replication_begin(&mut self, volume: &str) -> Result<CyclePlan, StoreError> {
        let rec = self
            .replication(volume)
            .ok_or_else(|| StoreError::NotFound(format!("volume {volume:?} is not replicated")))?;
        let (v, _) = self.thin_record(volume)?;
        self.check_not_busy(volume)?;
        let target = NbdUrl::parse(&rec.target).map_err(StoreError::Invalid)?;
        let resumed = rec
            .pending
            .clone()
            .and_then(|p| Some((self.meta.thin.snapshot(volume, &p.snapshot)?.clone(), p)));
        let (snapshot, pending, resumed) = match resumed {
            Some((s, p)) => (s, p, true),
            None => {
                let mut seq = rec.next_seq;
                let name = loop {
                    let n = format!("{SNAPSHOT_PREFIX}{seq}");
                    seq += 1;
                    if self.meta.thin.snapshot(volume, &n).is_none() {
                        break n;
                    }
                };
                let pending = PendingCycle {
                    snapshot: name.clone(),
                    taken_unix_ms: now_unix_ms(),
                    cursor_bytes: 0,
                };
                // Recorded in memory first: the snapshot's catalog write carries it.
                let before = self.meta.replications.clone();
                let r = self.replication_mut(volume).expect("checked");
                r.next_seq = seq;
                r.pending = Some(pending.clone());
                match self.snapshot(volume, &name) {
                    Ok(s) => (s, pending, false),
                    Err(e) => {
                        self.meta.replications = before;
                        return Err(e);
                    }
                }
            }
        };
        let base = rec
            .last
            .as_ref()
            .and_then(|l| self.meta.thin.snapshot(volume, &l.snapshot).cloned());
        let chain = self.open_chain(&v.pool, snapshot.layer)?.layers;
        let changed = match &base {
            None => Changed::Full,
            Some(b) => self.changed_layers(&v.pool, b, &snapshot)?,
        };
        Ok(CyclePlan {
            volume: volume.to_string(),
            target,
            snapshot,
            taken_unix_ms: pending.taken_unix_ms,
            resumed,
            cursor_bytes: pending.cursor_bytes,
            base: base.map(|b| b.export_name()),
            chain,
            changed,
        })
    }

    /// The layers whose grains may differ between snapshots `old` and `new`:
    /// those above their nearest common layer on either side. No common layer
    /// (a flatten in between): everything.
    fn changed_layers(
        &mut self,
        pool: &str,
        old: &SnapshotRecord,
        new: &SnapshotRecord,
    ) -> Result<Changed, StoreError> {
        let lin_new = self.meta.thin.lineage(new.layer);
        let lin_old = self.meta.thin.lineage(old.layer);
        let Some(common) = lin_new.iter().copied().find(|l| lin_old.contains(l)) else {
            return Ok(Changed::Full);
        };
        let above = |lin: &[u64]| -> Vec<u64> {
            lin.iter().copied().take_while(|&l| l != common).collect()
        };
        let mut ids = above(&lin_new);
        for id in above(&lin_old) {
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
        let dir = self.thin_dir_of(pool);
        let mut layers = Vec::with_capacity(ids.len());
        for id in ids {
            let r = self
                .meta
                .thin
                .layer(id)
                .cloned()
                .ok_or_else(|| StoreError::Io(format!("layer {id} is not in the catalog")))?;
            layers.push(
                self.thin
                    .layer(&dir, &r)
                    .map_err(|e| io_err(format!("opening layer {id}"), e))?,
            );
        }
        Ok(Changed::Layers {
            layers,
            old_size_bytes: old.size_bytes,
        })
    }

    /// Records how far a cycle's data is known to be on the target (flushed):
    /// a resumed cycle starts there.
    pub fn replication_checkpoint(
        &mut self,
        volume: &str,
        snapshot: &str,
        cursor_bytes: u64,
    ) -> Result<(), StoreError> {
        let Some(r) = self.replication_mut(volume) else {
            return Ok(());
        };
        let Some(p) = r.pending.as_mut().filter(|p| p.snapshot == snapshot) else {
            return Ok(());
        };
        let old = p.cursor_bytes;
        p.cursor_bytes = cursor_bytes;
        if let Err(e) = self.persist() {
            if let Some(p) = self
                .replication_mut(volume)
                .and_then(|r| r.pending.as_mut())
            {
                p.cursor_bytes = old;
            }
            return Err(e);
        }
        Ok(())
    }

    /// A cycle's snapshot is on the target (flushed): it becomes the last
    /// replicated one and the previous one loses its name (its layer is then
    /// collapsed by [`Self::replication_collapse_next`]).
    pub fn replication_finish(
        &mut self,
        volume: &str,
        snapshot: &str,
    ) -> Result<ReplicatedPoint, StoreError> {
        let r = self.replication(volume).ok_or_else(|| {
            StoreError::NotFound(format!("volume {volume:?} is no longer replicated"))
        })?;
        let p = r
            .pending
            .clone()
            .filter(|p| p.snapshot == snapshot)
            .ok_or_else(|| {
                StoreError::Conflict(format!(
                    "{volume}@{snapshot} is not the replication's cycle in progress"
                ))
            })?;
        let point = ReplicatedPoint {
            snapshot: p.snapshot,
            taken_unix_ms: p.taken_unix_ms,
        };
        let before = self.meta.clone();
        let old = r.last.filter(|l| l.snapshot != snapshot);
        {
            let r = self.replication_mut(volume).expect("checked");
            r.last = Some(point.clone());
            r.pending = None;
        }
        if let Some(o) = &old {
            self.meta
                .thin
                .snapshots
                .retain(|s| !(s.volume == volume && s.name == o.snapshot));
        }
        let removed = self.collect_layers()?;
        if let Err(e) = self.persist() {
            self.meta = before;
            return Err(e);
        }
        if let Some(o) = &old
            && let Some(v) = self.open.remove(&format!("{volume}@{}", o.snapshot))
        {
            v.deleted.store(true, Ordering::Release);
        }
        self.remove_layer_files(&removed);
        Ok(point)
    }

    /// A layer of `volume`'s chain that nothing names (no snapshot, no volume's
    /// top) whose only child is frozen: the child can be merged up into it and
    /// dropped (what a released replication snapshot leaves).
    pub fn replication_collapse_next(
        &mut self,
        volume: &str,
    ) -> Result<Option<Collapse>, StoreError> {
        let Some(top) = self.volume(volume)?.layer else {
            return Ok(None);
        };
        if self.check_not_busy(volume).is_err() {
            // Left for after the next cycle.
            return Ok(None);
        }
        let lineage = self.meta.thin.lineage(top);
        let Some((parent, child)) = lineage
            .windows(2)
            .map(|w| (w[1], w[0]))
            .find(|&(p, c)| self.collapsible(p, c))
        else {
            return Ok(None);
        };
        let rec = |id| self.meta.thin.layer(id).cloned().expect("in the lineage");
        let (pr, cr) = (rec(parent), rec(child));
        let dir = self.thin_dir_of(&pr.pool);
        let open = |s: &mut Self, r: &LayerRecord| -> Result<Arc<Layer>, StoreError> {
            s.thin
                .layer(&dir, r)
                .map_err(|e| io_err(format!("opening layer {}", r.id), e))
        };
        let parent_layer = open(self, &pr)?;
        let child_layer = open(self, &cr)?;
        Ok(Some(Collapse {
            parent,
            child,
            parent_is_base: pr.parent.is_none(),
            parent_layer,
            child_layer,
            cache: self.thin.cache(&pr.pool),
        }))
    }

    /// Whether `child` can be merged up into `parent` and dropped.
    fn collapsible(&self, parent: u64, child: u64) -> bool {
        let thin = &self.meta.thin;
        let tops: HashSet<u64> = self.meta.volumes.iter().filter_map(|r| r.layer).collect();
        thin.layer(child).is_some_and(|c| c.parent == Some(parent))
            && thin.layer(parent).is_some()
            && !tops.contains(&parent)
            && !tops.contains(&child)
            && !thin.snapshots.iter().any(|s| s.layer == parent)
            && thin.children(parent) == [child]
    }

    /// After [`weir_thin::commit_into`] merged `c.child` into `c.parent`:
    /// everything that referenced the child references the parent, the child
    /// goes. Returns false (nothing changed) when the catalog moved on meanwhile
    /// so that the merge may no longer stand in for the child.
    pub fn replication_relabel(&mut self, c: &Collapse) -> Result<bool, StoreError> {
        if !self.collapsible(c.parent, c.child) {
            return Ok(false);
        }
        // The open volumes and snapshot views that read through the child.
        let mut affected: Vec<(String, String, u64)> = Vec::new();
        for r in &self.meta.volumes {
            if let Some(t) = r.layer
                && self.meta.thin.lineage(t).contains(&c.child)
            {
                affected.push((r.name.clone(), r.pool.clone(), t));
            }
        }
        for snap in &self.meta.thin.snapshots {
            if self.meta.thin.lineage(snap.layer).contains(&c.child) {
                let pool = self.volume(&snap.volume)?.pool;
                let top = if snap.layer == c.child {
                    c.parent
                } else {
                    snap.layer
                };
                affected.push((snap.export_name(), pool, top));
            }
        }
        let before = self.meta.clone();
        let thin = &mut self.meta.thin;
        let child = thin.layer(c.child).cloned().expect("collapsible");
        for s in thin.snapshots.iter_mut().filter(|s| s.layer == c.child) {
            s.layer = c.parent;
        }
        for l in thin.layers.iter_mut() {
            if l.parent == Some(c.child) {
                l.parent = Some(c.parent);
            }
            if l.id == c.parent {
                l.size_bytes = child.size_bytes;
            }
        }
        thin.layers.retain(|l| l.id != c.child);
        let mut removed = self.collect_layers()?;
        if let Err(e) = self.persist() {
            self.meta = before;
            return Err(e);
        }
        for (name, pool, top) in affected {
            let chain = self.open_chain(&pool, top)?;
            if let Ok(v) = self.thin_volume(&name) {
                v.set_chain(chain);
            }
        }
        removed.push(child);
        self.remove_layer_files(&removed);
        Ok(true)
    }

    /// Merges `[[replications]]` of the configuration into the catalog (at
    /// start, before snapshots are opened): declared ones are created, or take
    /// the file's interval; a changed target starts over (its snapshots are
    /// released, the next cycle is a full copy).
    pub(super) fn merge_replication_config(
        &mut self,
        configs: &[ReplicationConfig],
    ) -> Result<(), StoreError> {
        for (i, c) in configs.iter().enumerate() {
            let here =
                |e: String| StoreError::Invalid(format!("replications[{i}] ({:?}): {e}", c.volume));
            self.thin_record(&c.volume)
                .map_err(|e| here(e.to_string()))?;
            let target = NbdUrl::parse(&c.to).map_err(here)?.to_string();
            let every = parse_every(&c.every).map_err(here)?;
            let existing = self.replication(&c.volume);
            match existing {
                Some(r) if r.target == target => {
                    let r = self.replication_mut(&c.volume).expect("exists");
                    r.every_seconds = Some(every);
                    r.target_checked |= c.overwrite;
                }
                other => {
                    if let Some(old) = other {
                        tracing::warn!(
                            "volume {:?}: replication target changed from {} to {target}: \
                             starting over with a full copy",
                            c.volume,
                            old.target
                        );
                        let names: Vec<String> = old
                            .last
                            .iter()
                            .map(|l| l.snapshot.clone())
                            .chain(old.pending.iter().map(|p| p.snapshot.clone()))
                            .collect();
                        self.meta
                            .thin
                            .snapshots
                            .retain(|s| !(s.volume == c.volume && names.contains(&s.name)));
                        self.meta.replications.retain(|r| r.volume != c.volume);
                    }
                    self.meta.replications.push(ReplicationRecord {
                        volume: c.volume.clone(),
                        target,
                        every_seconds: Some(every),
                        created_unix_ms: now_unix_ms(),
                        next_seq: 1,
                        last: None,
                        pending: None,
                        target_checked: c.overwrite,
                    });
                }
            }
        }
        // Replications of volumes that no longer exist go.
        let names: HashSet<String> = self.meta.volumes.iter().map(|v| v.name.clone()).collect();
        self.meta.replications.retain(|r| names.contains(&r.volume));
        self.collect_layers()?;
        Ok(())
    }
}
