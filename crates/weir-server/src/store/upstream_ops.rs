//! The volume store's upstream pools (gateway mode, `crate::upstream`): a
//! volume is an export of the pool's upstream NBD server, of the volume's name
//! or its configured `export`. The volume must exist upstream and its size is
//! the export's: a declared size (configuration, `volume create --size`) must
//! match it. Deleting a volume only forgets the mapping (the upstream export and
//! its data stay); resizing is refused (resize the export upstream, then restart
//! the gateway). Nothing is stored locally but the metadata record.

use super::*;
use crate::flash_cache::VolumeCache;
use crate::upstream::{LeasePolicy, UpstreamBackend};

impl VolumeStore {
    /// The pool's configuration if it is an upstream pool.
    pub(crate) fn upstream_pool(&self, pool: &str) -> Option<&PoolConfig> {
        self.pools
            .iter()
            .find(|p| p.name == pool && p.upstream.is_some())
    }

    /// Connects a volume of an upstream pool to its export. `known_size`: the
    /// size to serve when the upstream cannot be reached now.
    fn connect_upstream(
        &self,
        name: &str,
        pool: &PoolConfig,
        known_size: Option<u64>,
        cache: VolumeCache,
    ) -> Result<Arc<UpstreamBackend>, StoreError> {
        let lease = if pool.flash_cache.is_none()
            || pool.upstream_exclusive == crate::config::UpstreamExclusive::Assume
        {
            LeasePolicy::Assume
        } else if cache == VolumeCache::Flash {
            LeasePolicy::Ask
        } else {
            LeasePolicy::Later
        };
        let target = self
            .upstream_targets
            .get(&pool.name)
            .ok_or_else(|| StoreError::Invalid(format!("pool {:?} has no upstream", pool.name)))?;
        let export = self.upstream_exports.get(name).map_or(name, String::as_str);
        UpstreamBackend::open(
            target,
            export,
            pool.upstream_connections,
            std::time::Duration::from_secs(pool.upstream_timeout_s.into()),
            known_size,
            lease,
        )
        .map_err(|e| StoreError::Invalid(format!("volume {name:?}: {e}")))
    }

    /// At start: connects every volume of an upstream pool and takes its size
    /// from the upstream (a size the configuration declares must match).
    pub(super) fn open_upstreams(
        &self,
        records: &mut [VolumeRecord],
        config: &WeirConfig,
    ) -> Result<HashMap<String, Arc<UpstreamBackend>>, StoreError> {
        let mut open = HashMap::new();
        for r in records.iter_mut() {
            let Some(pool) = self.upstream_pool(&r.pool) else {
                continue;
            };
            let b = self.connect_upstream(&r.name, pool, Some(r.size_bytes), r.cache)?;
            let declared = config
                .volumes
                .iter()
                .find(|v| v.name == r.name)
                .map_or(0, |v| v.size.0);
            if declared != 0 && declared != b.size_bytes() {
                return Err(StoreError::Invalid(format!(
                    "volume {:?}: size = {declared} declared, but upstream export {:?} on {} \
                     has {} bytes (in an upstream pool the size comes from the upstream: omit \
                     size or make it match)",
                    r.name,
                    b.export(),
                    b.target(),
                    b.size_bytes()
                )));
            }
            r.size_bytes = b.size_bytes();
            open.insert(r.name.clone(), b);
        }
        Ok(open)
    }

    /// An open volume over an upstream backend.
    pub(super) fn upstream_volume(
        &mut self,
        r: &VolumeRecord,
        backend: Arc<UpstreamBackend>,
    ) -> Arc<OpenVolume> {
        self.upstreams.insert(r.name.clone(), backend.clone());
        Arc::new(OpenVolume {
            id: VolumeId(r.id),
            name: r.name.clone(),
            pool: r.pool.clone(),
            backend: self.stack(&r.pool, Some(r), backend),
            thin: None,
            deleted: AtomicBool::new(false),
        })
    }

    /// `volume create` in an upstream pool: the export must exist upstream;
    /// `size_bytes` 0 takes its size, another size must match it.
    pub(super) fn create_upstream(
        &mut self,
        mut record: VolumeRecord,
    ) -> Result<VolumeRecord, StoreError> {
        let pool = self.upstream_pool(&record.pool).cloned().ok_or_else(|| {
            StoreError::Invalid(format!("pool {:?} has no upstream", record.pool))
        })?;
        let b = self.connect_upstream(&record.name, &pool, None, record.cache)?;
        if record.size_bytes != 0 && record.size_bytes != b.size_bytes() {
            return Err(StoreError::Invalid(format!(
                "volume {:?}: size {} requested, but upstream export {:?} on {} has {} bytes \
                 (in an upstream pool the size comes from the upstream)",
                record.name,
                record.size_bytes,
                b.export(),
                b.target(),
                b.size_bytes()
            )));
        }
        record.size_bytes = b.size_bytes();
        self.check_record(&record)?;
        let volume = self.upstream_volume(&record, b);
        self.meta.next_volume_id += 1;
        self.meta.volumes.push(record.clone());
        if let Err(e) = self.persist() {
            self.meta.volumes.pop();
            return Err(e);
        }
        self.open.insert(record.name.clone(), volume);
        Ok(record)
    }

    /// Forgets an upstream volume (its export and data stay upstream).
    pub(super) fn delete_upstream(
        &mut self,
        record: VolumeRecord,
    ) -> Result<(VolumeRecord, Option<Arc<OpenVolume>>), StoreError> {
        self.meta.volumes.retain(|r| r.name != record.name);
        self.persist()?;
        self.upstreams.remove(&record.name);
        let open = self.open.remove(&record.name);
        if let Some(v) = &open {
            v.deleted.store(true, Ordering::Release);
        }
        Ok((record, open))
    }

    /// What an upstream volume may promise its clients (none for other volumes).
    pub fn upstream_limits(&self, name: &str) -> Option<crate::upstream::UpstreamLimits> {
        self.upstreams.get(name).map(|b| b.limits())
    }

    /// Every upstream volume's counters, by name.
    pub fn upstream_snapshots(&self) -> Vec<(String, crate::upstream::UpstreamSnapshot)> {
        self.upstreams
            .iter()
            .map(|(n, b)| (n.clone(), b.snapshot()))
            .collect()
    }
}

/// Each upstream pool's target (`PoolConfig::upstream_target`: the URL parsed,
/// certificate files read), by pool name.
pub(super) fn upstream_targets(
    pools: &[PoolConfig],
) -> Result<HashMap<String, crate::upstream::UpstreamTarget>, StoreError> {
    let mut targets = HashMap::new();
    for p in pools {
        let target = p
            .upstream_target()
            .map_err(|e| StoreError::Invalid(format!("pool {:?}: {e}", p.name)))?;
        if let Some(t) = target {
            targets.insert(p.name.clone(), t);
        }
    }
    Ok(targets)
}
