//! Server assembly: shared state, listeners, graceful shutdown.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use weir_nbd::{ErrorCode, NbdError};
use weir_qos::{CongestionConfig, GateConfig, Policy, SchedulerConfig, VolumeId};

use crate::access::canonical;
use crate::config::WeirConfig;
use crate::connections::{
    AcceptBackoff, Admission, ConnectionLimits, DataBudgets, RateLimited, WARN_EVERY,
    fit_to_fd_limit, suppressed_note,
};
use crate::device::EmulatedDevice;
use crate::metrics::Metrics;
use crate::qos::{PoolGauges, QosPool};
use crate::session::Pool;
use crate::store::{DeleteSnapshot, Flatten, StoreError, VolumeCreate, VolumeRecord, VolumeStore};
use crate::thin::SnapshotRecord;

/// Everything sessions and the admin API share.
pub struct ServerState {
    store: Mutex<VolumeStore>,
    pools: HashMap<String, Arc<Pool>>,
    pub metrics: Metrics,
    pub started: Instant,
    /// Longest busy poll of a connection waiting on its client (`busy_poll_us`).
    pub busy_poll: Duration,
    /// Which clients large page-cache READs go to with `sendfile(2)`.
    pub zero_copy_reads: crate::config::ZeroCopyReads,
    /// The connection caps (`max_connections`, `max_connections_per_host`).
    pub limits: Arc<ConnectionLimits>,
    /// `idle_timeout_s` (`None`: off).
    pub idle_timeout: Option<Duration>,
    /// `tcp_keepalive_s` (`None`: off).
    pub tcp_keepalive: Option<Duration>,
    /// NBD over TLS: the policy and the rustls acceptor.
    pub tls: crate::tls::NbdTls,
    /// The bound NBD and admin addresses (set once the listeners are bound).
    pub addrs: std::sync::OnceLock<(SocketAddr, SocketAddr)>,
    /// The admin API's token and request checks.
    pub admin_guard: Arc<crate::admin_auth::AdminGuard>,
    /// The admin API's connection cap (`admin_max_connections`, or fewer when the
    /// open-files limit is short: `connections::fit_to_fd_limit`).
    pub admin_connections: usize,
    /// … per client address (`admin_max_connections_per_host`, at most the cap).
    pub admin_connections_per_host: usize,
    /// Asynchronous replication of thin volumes (tasks start with [`run`]).
    pub replication: crate::replicate::Replicator,
    /// History and the last second of every volume (the sampler starts with [`run`]).
    pub recorder: crate::sampler::Recorder,
    /// Exclusive-writer leases of caching clients (`weir:exclusive=TOKEN`).
    pub leases: Arc<crate::lease::Leases>,
}

impl ServerState {
    pub fn new(config: &WeirConfig) -> anyhow::Result<ServerState> {
        let tls = crate::tls::NbdTls::from_config(config)?;
        let store = VolumeStore::open(config)
            .with_context(|| format!("opening data dir {}", config.data_dir.display()))?;
        let admin_guard =
            crate::admin_auth::AdminGuard::open(&config.data_dir, &config.admin_hosts)
                .context("the admin token in the data directory")?;
        let epoch = Instant::now();
        let mut pools = HashMap::new();
        for p in store.pools() {
            let mut scheduler = SchedulerConfig {
                trim_cost_factor: p.trim_cost_factor,
                zero_cost_factor: p.zero_cost_factor,
                ..SchedulerConfig::default()
            };
            if let Some(c) = p.cost_unit_bytes {
                scheduler.cost_unit_bytes = c;
            }
            let gate = GateConfig {
                scheduler,
                max_in_flight: p.max_in_flight,
                depth: p.depth.clone(),
            };
            let device = match &p.device {
                None => None,
                Some(array) => Some(Arc::new(EmulatedDevice::new(array, epoch).map_err(
                    |e| anyhow::anyhow!("pool {:?}: device = {:?}: {e}", p.name, array.label()),
                )?)),
            };
            pools.insert(
                p.name.clone(),
                Arc::new(
                    QosPool::new(&p.name, gate, epoch, device)
                        .with_congestion(p.congestion.clone().unwrap_or(CongestionConfig {
                            enabled: false,
                            ..CongestionConfig::default()
                        }))
                        .with_gateway_window(p.gateway_congestion.clone())
                        .with_gateway_stats(gateway_stats(&store, p)?)
                        .with_qos(p.qos),
                ),
            );
        }
        for (r, policy) in store.volume_policies() {
            if let Some(pool) = pools.get(&r.pool) {
                pool.add_volume(VolumeId(r.id), policy);
            }
        }
        // Hybrid pools: migration I/O goes through the pool's gate.
        for (name, pool) in &pools {
            if let Some(tier) = store.tier(name) {
                pool.add_volume(
                    crate::tier::TIER_VOLUME,
                    crate::tier::background_policy(tier.config()),
                );
                tier.start(Arc::new(pool.clone()));
            }
        }
        // After the volumes are open: what is open now counts against the limit,
        // and so do the files of thin layers not written yet.
        let mut store = store;
        let fds = fit_to_fd_limit(
            config.max_connections.into(),
            config.admin_max_connections as usize,
            store
                .descriptors_needed()
                .saturating_sub(store.descriptors_open()),
        );
        store.set_descriptor_room(fds.store_room);
        Ok(ServerState {
            store: Mutex::new(store),
            pools,
            metrics: Metrics::default(),
            started: epoch,
            busy_poll: Duration::from_micros(config.busy_poll_us.into()),
            zero_copy_reads: config.zero_copy_reads,
            admin_connections: fds.admin_connections,
            admin_connections_per_host: (config.admin_max_connections_per_host as usize)
                .min(fds.admin_connections),
            limits: ConnectionLimits::new(
                fds.connections as usize,
                config.max_connections_per_host as usize,
                DataBudgets {
                    total_bytes: (config.max_buffered_mib as usize) << 20,
                    per_host_bytes: (config.max_buffered_mib_per_host as usize) << 20,
                },
            ),
            idle_timeout: (config.idle_timeout_s > 0)
                .then(|| Duration::from_secs(config.idle_timeout_s.into())),
            tcp_keepalive: (config.tcp_keepalive_s > 0)
                .then(|| Duration::from_secs(config.tcp_keepalive_s.into())),
            tls,
            admin_guard: Arc::new(admin_guard),
            addrs: std::sync::OnceLock::new(),
            replication: Default::default(),
            recorder: crate::sampler::Recorder::open(&config.data_dir),
            leases: crate::lease::Leases::open(&config.data_dir)
                .context("the lease record in the data directory")?,
        })
    }

    pub fn store(&self) -> MutexGuard<'_, VolumeStore> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn pool(&self, name: &str) -> Option<Arc<Pool>> {
        self.pools.get(name).cloned()
    }

    /// Every pool's gate now (depth limit, in flight, queued), by pool name.
    pub fn pool_gauges(&self) -> BTreeMap<String, PoolGauges> {
        self.pools
            .iter()
            .map(|(name, p)| (name.clone(), p.gauges()))
            .collect()
    }

    pub fn create_volume(&self, req: VolumeCreate) -> Result<VolumeRecord, StoreError> {
        let mut store = self.store();
        let r = store.create(req)?;
        let policy = store.policy(&r.policy)?;
        if let Some(pool) = self.pools.get(&r.pool) {
            pool.add_volume(VolumeId(r.id), policy);
        }
        warn_if_overcommitted(&store, &r.pool);
        Ok(r)
    }

    /// Grows a volume; warns when its pool is then overcommitted.
    pub fn resize_volume(&self, name: &str, size_bytes: u64) -> Result<VolumeRecord, StoreError> {
        let mut store = self.store();
        let r = store.resize(name, size_bytes)?;
        warn_if_overcommitted(&store, &r.pool);
        Ok(r)
    }

    /// Replaces a user-defined policy; every volume that uses it follows at once
    /// (queued and new I/O).
    pub fn update_policy(&self, policy: Policy) -> Result<Policy, StoreError> {
        let (p, users) = self.store().update_policy(policy)?;
        for r in users {
            if let Some(pool) = self.pools.get(&r.pool) {
                pool.set_policy(VolumeId(r.id), p.clone());
            }
        }
        Ok(p)
    }

    /// Which server this is (`GET /v1/server`).
    pub fn server_info(&self) -> crate::admin::ServerInfo {
        let (nbd, admin) = self
            .addrs
            .get()
            .map(|(n, a)| (n.to_string(), a.to_string()))
            .unwrap_or_default();
        crate::admin::ServerInfo {
            version: env!("CARGO_PKG_VERSION").to_string(),
            commit: crate::metrics::build_commit().to_string(),
            hostname: hostname(),
            nbd_listen: nbd,
            admin_listen: admin,
            uptime_seconds: self.started.elapsed().as_secs_f64(),
            volumes: self.store().list().len(),
        }
    }

    /// Flattens a volume; the copy runs without the store's lock (the volume is
    /// busy meanwhile: its snapshots, rollback, resize and deletion wait).
    pub fn flatten_volume(&self, name: &str) -> Result<VolumeRecord, StoreError> {
        // (Bound first: a guard in the `match` would live through the copy.)
        let begun = self.store().flatten_begin(name)?;
        match begun {
            Flatten::Done(r) => Ok(r),
            Flatten::Copy(plan) => {
                let copied = plan.copy();
                self.store().flatten_finish(plan, copied)
            }
        }
    }

    /// Checks every thin pool (`weir volume check`); reading the layers runs
    /// without the store's lock (as [`ServerState::flatten_volume`]).
    pub fn check_thin(&self) -> Result<Vec<crate::store::ThinPoolCheck>, StoreError> {
        let plan = self.store().check_thin_begin();
        let ran = plan.run()?;
        Ok(self.store().check_thin_finish(ran))
    }

    /// Deletes a snapshot; merging it into the layer built on it runs without the
    /// store's lock (as [`ServerState::flatten_volume`]).
    pub fn delete_snapshot(&self, volume: &str, name: &str) -> Result<SnapshotRecord, StoreError> {
        let begun = self.store().delete_snapshot_begin(volume, name)?;
        match begun {
            DeleteSnapshot::Done(s) => Ok(s),
            DeleteSnapshot::Merge(plan) => {
                let merged = plan.copy();
                self.store().delete_snapshot_finish(plan, merged)
            }
        }
    }

    pub fn delete_volume(&self, name: &str) -> Result<VolumeRecord, StoreError> {
        let (r, _open) = self.store().delete(name)?;
        if let Some(pool) = self.pools.get(&r.pool) {
            for work in pool.remove_volume(VolumeId(r.id)) {
                work.fail(NbdError::new(ErrorCode::Io, "volume was deleted"));
            }
        }
        self.metrics.forget_volume(name);
        // A lease (or writers) of the deleted volume must not hold a new one of
        // the same name.
        self.leases.volume_deleted(name);
        Ok(r)
    }

    /// Returns a volume to a snapshot, refused while a caching gateway holds
    /// its exclusive lease: that gateway's cache would keep serving the data
    /// written since (the lease promises it nobody else changes the volume).
    /// A lease taken while the rollback ran is broken after it.
    pub fn rollback_volume(&self, name: &str, snapshot: &str) -> Result<VolumeRecord, StoreError> {
        let leased = |leases: &crate::lease::Leases| {
            leases.holders().into_iter().find(|(v, _, _)| v == name)
        };
        if let Some((_, holder, _)) = leased(&self.leases) {
            return Err(StoreError::Conflict(format!(
                "volume {name:?} is leased by the caching gateway at {holder}, whose cache \
                 would keep serving what the rollback takes back: break the lease first \
                 (weir volume break-lease {name})"
            )));
        }
        let r = self.store().rollback(name, snapshot)?;
        if leased(&self.leases).is_some() {
            self.leases.break_lease(name);
        }
        Ok(r)
    }

    /// Linked clones of a snapshot, each under its policy in its pool's gate.
    pub fn clone_snapshot(
        &self,
        volume: &str,
        snapshot: &str,
        names: &[String],
        policy: Option<&str>,
    ) -> Result<Vec<VolumeRecord>, StoreError> {
        let mut store = self.store();
        let records = store.clone_snapshot(volume, snapshot, names, policy)?;
        for r in &records {
            let policy = store.policy(&r.policy)?;
            if let Some(pool) = self.pools.get(&r.pool) {
                pool.add_volume(VolumeId(r.id), policy);
            }
        }
        if let Some(r) = records.first() {
            warn_if_overcommitted(&store, &r.pool);
        }
        Ok(records)
    }

    /// Prometheus text for upstream pools (gateway mode): per volume, the
    /// upstream's reconnects, retried requests, requests failed unreachable, and
    /// connections alive of those configured.
    pub fn upstream_metrics(&self) -> String {
        use std::fmt::Write as _;
        let rows = self.store().upstream_snapshots();
        if rows.is_empty() {
            return String::new();
        }
        type Field = fn(&crate::upstream::UpstreamSnapshot) -> u64;
        let families: [(&str, &str, &str, Field); 5] = [
            (
                "weir_volume_upstream_reconnects_total",
                "counter",
                "Connections to the upstream opened again after a loss.",
                |u| u.reconnects,
            ),
            (
                "weir_volume_upstream_retries_total",
                "counter",
                "Requests sent to the upstream again after their connection was lost.",
                |u| u.retries,
            ),
            (
                "weir_volume_upstream_unreachable_total",
                "counter",
                "Requests failed because the upstream was unreachable or silent past upstream_timeout_s.",
                |u| u.unreachable,
            ),
            (
                "weir_volume_upstream_connections_alive",
                "gauge",
                "Connections to the upstream alive now.",
                |u| u.connections_alive as u64,
            ),
            (
                "weir_volume_upstream_connections",
                "gauge",
                "Connections to the upstream configured (upstream_connections).",
                |u| u.connections as u64,
            ),
        ];
        let mut out = String::new();
        for (name, kind, help, field) in families {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for (volume, u) in &rows {
                let v = crate::metrics::escape(volume);
                let _ = writeln!(out, "{name}{{volume=\"{v}\"}} {}", field(u));
            }
        }
        out
    }

    /// Prometheus text for hybrid pools: per pool what the flash tier holds and
    /// what moved; per volume the reads flash and disk served.
    pub fn tier_metrics(&self) -> String {
        use std::fmt::Write as _;
        let pools = self.store().tier_snapshots();
        if pools.is_empty() {
            return String::new();
        }
        type F = fn(&crate::tier::TierSnapshot) -> u64;
        let families: [(&str, &str, &str, F); 10] = [
            (
                "weir_pool_tier_capacity_bytes",
                "gauge",
                "Size of the pool's flash tier.",
                |p| p.capacity_bytes,
            ),
            (
                "weir_pool_tier_resident_bytes",
                "gauge",
                "Extents on the flash tier, bytes.",
                |p| p.resident_bytes,
            ),
            (
                "weir_pool_tier_dirty_bytes",
                "gauge",
                "Extents on flash newer than their disk copy, bytes.",
                |p| p.dirty_bytes,
            ),
            (
                "weir_pool_tier_promotions_total",
                "counter",
                "Extents copied disk to flash.",
                |p| p.promotions,
            ),
            (
                "weir_pool_tier_demotions_total",
                "counter",
                "Extents dropped from flash to make room.",
                |p| p.demotions,
            ),
            (
                "weir_pool_tier_destages_total",
                "counter",
                "Dirty extents copied flash to disk.",
                |p| p.destages,
            ),
            (
                "weir_pool_tier_landings_total",
                "counter",
                "Whole-extent writes that landed on flash.",
                |p| p.landings,
            ),
            (
                "weir_pool_tier_moves_cancelled_total",
                "counter",
                "Moves that did not take effect (a write raced them, or the copy failed).",
                |p| p.moves_cancelled,
            ),
            (
                "weir_pool_tier_migration_bytes_total",
                "counter",
                "Extent bytes moved by the migrator.",
                |p| p.migrated_bytes,
            ),
            (
                "weir_pool_tier_errors_total",
                "counter",
                "Migration and journal errors.",
                |p| p.errors,
            ),
        ];
        let mut out = String::new();
        for (name, kind, help, field) in families {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for p in &pools {
                let pool = crate::metrics::escape(&p.pool);
                let _ = writeln!(out, "{name}{{pool=\"{pool}\"}} {}", field(p));
            }
        }
        for (name, help, flash) in [
            (
                "weir_volume_tier_flash_reads_total",
                "Reads (extent pieces) served by the flash tier.",
                true,
            ),
            (
                "weir_volume_tier_disk_reads_total",
                "Reads (extent pieces) served by the disk tier.",
                false,
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for p in &pools {
                for (volume, f, d) in &p.volumes {
                    let (v, pool) = (
                        crate::metrics::escape(volume),
                        crate::metrics::escape(&p.pool),
                    );
                    let n = if flash { f } else { d };
                    let _ = writeln!(out, "{name}{{volume=\"{v}\",pool=\"{pool}\"}} {n}");
                }
            }
        }
        let name = "weir_volume_tier_flash_read_ratio";
        let _ = writeln!(
            out,
            "# HELP {name} Share of the volume's reads served by flash since start.\n# TYPE {name} gauge"
        );
        for p in &pools {
            for (volume, f, d) in &p.volumes {
                let (v, pool) = (
                    crate::metrics::escape(volume),
                    crate::metrics::escape(&p.pool),
                );
                let ratio = *f as f64 / (f + d).max(1) as f64;
                let _ = writeln!(out, "{name}{{volume=\"{v}\",pool=\"{pool}\"}} {ratio}");
            }
        }
        out
    }

    /// Prometheus text for pools with a flash cache: per volume its hits,
    /// misses, bytes, scans not admitted, fills and drops; per pool the cache's
    /// capacity, bytes resident and device errors.
    pub fn flash_cache_metrics(&self) -> String {
        use std::fmt::Write as _;
        let pools = self.store().flash_cache_snapshots();
        if pools.is_empty() {
            return String::new();
        }
        type Field = fn(&weir_model::FlashCacheStats) -> u64;
        let volume_families: [(&str, &str, Field); 9] = [
            (
                "weir_volume_flash_cache_hits_total",
                "Reads served from the flash cache.",
                |s| s.read_hits,
            ),
            (
                "weir_volume_flash_cache_misses_total",
                "Reads of a cached volume that went to its backend.",
                |s| s.read_misses,
            ),
            (
                "weir_volume_flash_cache_hit_bytes_total",
                "Bytes of reads served from the flash cache.",
                |s| s.hit_bytes,
            ),
            (
                "weir_volume_flash_cache_miss_bytes_total",
                "Bytes of reads that missed the flash cache.",
                |s| s.miss_bytes,
            ),
            (
                "weir_volume_flash_cache_scan_bypasses_total",
                "Misses not admitted to the cache (sequential scans).",
                |s| s.scan_bypasses,
            ),
            (
                "weir_volume_flash_cache_filled_blocks_total",
                "Blocks written to the flash cache by read misses.",
                |s| s.filled_blocks,
            ),
            (
                "weir_volume_flash_cache_invalidated_blocks_total",
                "Cached blocks dropped by writes, trims and zeroes.",
                |s| s.invalidated_blocks,
            ),
            (
                "weir_volume_flash_cache_evicted_blocks_total",
                "Cached blocks evicted to make room.",
                |s| s.evicted_blocks,
            ),
            (
                "weir_volume_flash_cache_fills_cancelled_total",
                "Fills dropped because a write overlapped them.",
                |s| s.fills_cancelled,
            ),
        ];
        let mut out = String::new();
        for (name, help, field) in volume_families {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} counter");
            for p in &pools {
                for (volume, st) in &p.volumes {
                    let v = crate::metrics::escape(volume);
                    let pool = crate::metrics::escape(&p.pool);
                    let _ = writeln!(
                        out,
                        "{name}{{volume=\"{v}\",pool=\"{pool}\"}} {}",
                        field(st)
                    );
                }
            }
        }
        type PoolField = fn(&crate::flash_cache::FlashCacheSnapshot) -> u64;
        let pool_families: [(&str, &str, &str, PoolField); 5] = [
            (
                "weir_pool_flash_cache_capacity_bytes",
                "gauge",
                "Size of the pool's flash cache.",
                |p| p.capacity_bytes,
            ),
            (
                "weir_pool_flash_cache_resident_bytes",
                "gauge",
                "Bytes held in the pool's flash cache.",
                |p| p.resident_bytes,
            ),
            (
                "weir_pool_flash_cache_errors_total",
                "counter",
                "Cache file reads and writes that failed (served from the backend instead).",
                |p| p.errors,
            ),
            (
                "weir_pool_flash_cache_unowned_reads_total",
                "counter",
                "Reads sent through the cache without it, its upstream export's exclusive lease not held or not confirmed within a second.",
                |p| p.unowned_reads,
            ),
            (
                "weir_pool_flash_cache_lease_drops_total",
                "counter",
                "Times a volume's cached blocks were dropped because its upstream lease was granted anew (it may have been lost in between).",
                |p| p.lease_drops,
            ),
        ];
        for (name, kind, help, field) in pool_families {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for p in &pools {
                let pool = crate::metrics::escape(&p.pool);
                let _ = writeln!(out, "{name}{{pool=\"{pool}\"}} {}", field(p));
            }
        }
        out
    }

    /// Prometheus text for the volume store's open files: those its volumes and
    /// thin layers hold once written, and its share of the open-files limit.
    pub fn descriptor_metrics(&self) -> String {
        let store = self.store();
        let (needed, cap) = (store.descriptors_needed(), store.descriptor_cap());
        drop(store);
        let mut out = format!(
            "# HELP weir_volume_files_needed Open files the volumes, snapshots and thin layers hold once written (two per written or writable thin layer, one per file volume).\n\
             # TYPE weir_volume_files_needed gauge\n\
             weir_volume_files_needed {needed}\n"
        );
        if let Some(cap) = cap {
            out.push_str(&format!(
                "# HELP weir_volume_files_max The volumes' share of the open-files limit: a create, snapshot, clone or rollback past it is refused.\n\
                 # TYPE weir_volume_files_max gauge\n\
                 weir_volume_files_max {cap}\n"
            ));
        }
        out
    }

    /// Prometheus text for thin pools: space per volume and pool, and the
    /// clone-aware cache's counters.
    pub fn thin_metrics(&self) -> String {
        use std::fmt::Write as _;
        let mut store = self.store();
        let space = store.thin_space();
        if space.is_empty() && store.snapshots(None).map(|s| s.is_empty()).unwrap_or(true) {
            return String::new();
        }
        let shared = store.thin_shared_bytes();
        let caches = store.thin_cache_stats();
        let backing = store.thin_backing_read_bytes();
        drop(store);
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# HELP weir_volume_exclusive_bytes Bytes stored in a thin volume's own layer (not shared)."
        );
        let _ = writeln!(out, "# TYPE weir_volume_exclusive_bytes gauge");
        for v in &space {
            let _ = writeln!(
                out,
                "weir_volume_exclusive_bytes{{volume=\"{}\",pool=\"{}\"}} {}",
                v.volume, v.pool, v.exclusive_bytes
            );
        }
        let mut exclusive: BTreeMap<&str, u64> = BTreeMap::new();
        for v in &space {
            *exclusive.entry(&v.pool).or_insert(0) += v.exclusive_bytes;
        }
        let _ = writeln!(
            out,
            "# HELP weir_pool_shared_bytes Bytes stored in a thin pool's read-only layers (snapshots, images under clones)."
        );
        let _ = writeln!(out, "# TYPE weir_pool_shared_bytes gauge");
        for (pool, b) in &shared {
            let _ = writeln!(out, "weir_pool_shared_bytes{{pool=\"{pool}\"}} {b}");
        }
        let _ = writeln!(
            out,
            "# HELP weir_pool_used_bytes Bytes stored in a thin pool (exclusive + shared)."
        );
        let _ = writeln!(out, "# TYPE weir_pool_used_bytes gauge");
        let pools: std::collections::BTreeSet<&str> = exclusive
            .keys()
            .copied()
            .chain(shared.keys().map(String::as_str))
            .collect();
        for pool in pools {
            let used =
                exclusive.get(pool).copied().unwrap_or(0) + shared.get(pool).copied().unwrap_or(0);
            let _ = writeln!(out, "weir_pool_used_bytes{{pool=\"{pool}\"}} {used}");
        }
        for (name, help, get) in [
            (
                "hits",
                "Clone-aware cache lookups served from memory.",
                (|c: &weir_model::ReadCacheStats| c.hits) as fn(&weir_model::ReadCacheStats) -> u64,
            ),
            (
                "misses",
                "Clone-aware cache lookups read from the pool.",
                |c| c.misses,
            ),
            (
                "merged",
                "Clone-aware cache misses that waited for a read already in flight.",
                |c| c.merged,
            ),
            (
                "evictions",
                "Grains evicted from the clone-aware cache.",
                |c| c.evictions,
            ),
        ] {
            let _ = writeln!(out, "# HELP weir_clone_cache_{name}_total {help}");
            let _ = writeln!(out, "# TYPE weir_clone_cache_{name}_total counter");
            for (pool, c, _) in &caches {
                let _ = writeln!(
                    out,
                    "weir_clone_cache_{name}_total{{pool=\"{pool}\"}} {}",
                    get(c)
                );
            }
        }
        let _ = writeln!(
            out,
            "# HELP weir_thin_read_bytes_total Bytes read from a thin pool's layer files."
        );
        let _ = writeln!(out, "# TYPE weir_thin_read_bytes_total counter");
        for (pool, b) in &backing {
            let _ = writeln!(out, "weir_thin_read_bytes_total{{pool=\"{pool}\"}} {b}");
        }
        let _ = writeln!(
            out,
            "# HELP weir_clone_cache_bytes Bytes of grains in the clone-aware cache."
        );
        let _ = writeln!(out, "# TYPE weir_clone_cache_bytes gauge");
        for (pool, c, grain) in &caches {
            let _ = writeln!(
                out,
                "weir_clone_cache_bytes{{pool=\"{pool}\"}} {}",
                c.resident * grain
            );
        }
        out
    }

    /// Changes a volume's policy; queued and future requests follow it at once.
    pub fn set_volume_policy(&self, name: &str, policy: &str) -> Result<VolumeRecord, StoreError> {
        let (r, p): (VolumeRecord, Policy) = self.store().set_policy(name, policy)?;
        if let Some(pool) = self.pools.get(&r.pool) {
            pool.set_policy(VolumeId(r.id), p);
        }
        Ok(r)
    }

    /// Every pool's gate and host windows (the admin API's `/v1/pools`).
    pub fn pool_reports(&self) -> Vec<crate::admin::PoolStatsReport> {
        let mut v: Vec<_> = self
            .pools
            .iter()
            .map(|(name, p)| crate::admin::PoolStatsReport {
                name: name.clone(),
                qos: p.qos_enabled(),
                device: p.device().map(|d| d.label.clone()),
                gauges: p.gauges(),
                host_windows: p
                    .host_windows()
                    .into_iter()
                    .map(|h| crate::admin::HostWindowReport {
                        client: h.client.0,
                        window: h.window,
                        host_shares: h.host_shares,
                        in_gate: h.in_gate,
                        waiting: h.waiting,
                    })
                    .collect(),
                gateway_latency_ms: p.gateway_window().and_then(|w| w.latency_ms),
            })
            .collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    /// Every volume with its policy and scheduler counts (`/metrics`).
    pub fn volume_views(&self) -> Vec<crate::metrics::VolumeView> {
        let pairs = self.store().volume_policies();
        pairs
            .into_iter()
            .map(|(record, policy)| {
                let sched = self
                    .pools
                    .get(&record.pool)
                    .and_then(|p| p.volume_stats(VolumeId(record.id)))
                    .unwrap_or_default();
                crate::metrics::VolumeView {
                    record,
                    policy: Some(policy),
                    sched,
                }
            })
            .collect()
    }
}

/// Logs a warning when `pool` promises more than its file system can still hold.
/// The pool's shared gateway statistics (`gateway_stats_volume`): the volume must
/// be one of this pool's, open, and hold every slot.
fn gateway_stats(
    store: &VolumeStore,
    p: &crate::config::PoolConfig,
) -> anyhow::Result<Option<crate::qos::SharedStats>> {
    use crate::datastore_stats::{STATS_BYTES, StatsMerge};
    let (Some(name), Some(id)) = (&p.gateway_stats_volume, p.gateway_id) else {
        return Ok(None);
    };
    let what = || format!("pool {:?}: gateway_stats_volume = {name:?}", p.name);
    let record = store.volume(name).with_context(what)?;
    if record.pool != p.name {
        anyhow::bail!("{}: that volume is in pool {:?}", what(), record.pool);
    }
    if record.size_bytes < STATS_BYTES {
        anyhow::bail!(
            "{}: {} bytes, the stats need {STATS_BYTES}",
            what(),
            record.size_bytes
        );
    }
    store.share_writes(name).with_context(what)?;
    let open = store
        .open_volume(name)
        .with_context(|| format!("{}: not open", what()))?;
    Ok(Some((StatsMerge::new(id), open.backend.clone())))
}

fn warn_if_overcommitted(store: &crate::store::VolumeStore, pool: &str) {
    if let Some(w) = crate::capacity::overcommit_warning(store, pool) {
        tracing::warn!("{w}");
    }
}

/// The machine's host name (`gethostname`), or "unknown".
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into buf.
    if unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// A server running in the background (tests, embedding). `weir serve` uses [`serve`].
pub struct RunningServer {
    nbd_addr: SocketAddr,
    admin_addr: SocketAddr,
    state: Arc<ServerState>,
    shutdown: watch::Sender<bool>,
    main: JoinHandle<anyhow::Result<()>>,
}

impl RunningServer {
    /// Binds both listeners (port 0 picks a free port) and starts serving;
    /// a listener systemd passed (socket activation, [`crate::systemd`]) is used
    /// instead of binding its address.
    pub async fn start(config: WeirConfig) -> anyhow::Result<RunningServer> {
        let inherited = crate::systemd::inherited_listeners()?;
        let state = Arc::new(ServerState::new(&config)?);
        let nbd = match inherited.nbd {
            Some(l) => TcpListener::from_std(l).context("the NBD socket systemd passed")?,
            None => TcpListener::bind(config.listen)
                .await
                .with_context(|| format!("binding NBD listener {}", config.listen))?,
        };
        let admin = match inherited.admin {
            Some(l) => TcpListener::from_std(l).context("the admin socket systemd passed")?,
            None => TcpListener::bind(config.admin_listen)
                .await
                .with_context(|| format!("binding admin listener {}", config.admin_listen))?,
        };
        let nbd_addr = nbd.local_addr()?;
        let admin_addr = admin.local_addr()?;
        let _ = state.addrs.set((nbd_addr, admin_addr));
        let (shutdown, rx) = watch::channel(false);
        let main = tokio::spawn(run(state.clone(), nbd, admin, rx));
        tracing::info!(%nbd_addr, %admin_addr, "weir serving");
        Ok(RunningServer {
            nbd_addr,
            admin_addr,
            state,
            shutdown,
            main,
        })
    }

    pub fn nbd_addr(&self) -> SocketAddr {
        self.nbd_addr
    }
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_addr
    }
    pub fn state(&self) -> &Arc<ServerState> {
        &self.state
    }
    /// The admin API's bearer token (also in `<data_dir>/admin-token`).
    pub fn admin_token(&self) -> &str {
        self.state.admin_guard.token()
    }
    /// An admin API client with the token.
    pub fn admin_client(&self) -> crate::admin::Client {
        crate::admin::Client::new(self.admin_addr).with_token(self.admin_token())
    }

    /// Stops accepting, lets every connection finish its in-flight requests,
    /// flushes every volume, and returns.
    pub async fn shutdown(self) -> anyhow::Result<()> {
        let _ = self.shutdown.send(true);
        self.main.await.context("server task panicked")?
    }
}

async fn run(
    state: Arc<ServerState>,
    nbd: TcpListener,
    admin: TcpListener,
    mut shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    // Timed wake-ups (limits): one thread per pool, for a timer finer than the
    // runtime's 1 ms (see `qos`).
    let runtime = tokio::runtime::Handle::current();
    let dispatchers: Vec<_> = state
        .pools
        .values()
        .filter(|p| p.qos_enabled())
        .map(|p| p.start_dispatcher(runtime.clone()))
        .collect();
    let tasks: Vec<JoinHandle<()>> = state
        .pools
        .values()
        .filter(|p| p.has_congestion_control())
        .map(|p| tokio::spawn(p.clone().run_congestion_control()))
        .collect();
    // Emulated devices: one driver thread each, for the same reason.
    let device_drivers: Vec<_> = state
        .pools
        .values()
        .filter_map(|p| p.device())
        .map(|d| d.start())
        .collect();
    let admin_task = crate::admin::spawn(state.clone(), admin, shutdown.clone());
    state.replication.start(&state);
    let sampler = crate::sampler::start(state.clone());
    let mut sessions = JoinSet::new();
    let mut acceptor = Acceptor::new(state.clone(), shutdown.clone());
    loop {
        let failed = tokio::select! {
            accepted = nbd.accept() => match accepted {
                Ok((stream, peer)) => {
                    acceptor.accepted(stream, peer, &mut sessions);
                    None
                }
                Err(e) => Some(e),
            },
            _ = shutdown.wait_for(|s| *s) => break,
            Some(_) = sessions.join_next(), if !sessions.is_empty() => None,
        };
        if let Some(e) = failed {
            acceptor.failed(e).await;
        }
    }
    drop(nbd);
    // Requests held back by QoS (limits) could delay the exit indefinitely: run
    // them now, past the gate, until every session is done.
    let mut waiting = RateLimited::new(WARN_EVERY);
    let _ = waiting.allow(std::time::Instant::now());
    loop {
        for pool in state.pools.values() {
            for work in pool.take_queued() {
                work.execute_now(pool);
            }
        }
        tokio::select! {
            joined = sessions.join_next() => if joined.is_none() { break },
            _ = tokio::time::sleep(std::time::Duration::from_millis(100)) => {}
        }
        if waiting.allow(std::time::Instant::now()).is_some() {
            tracing::warn!(
                "stopping: {} connections still wait for requests in progress (a backend \
                 not answering?); a second SIGINT or SIGTERM exits at once",
                sessions.len()
            );
        }
    }
    let _ = admin_task.await;
    // Cycles in progress stop here and resume at the next start.
    state.replication.shutdown().await;
    drop(sampler);
    drop(dispatchers);
    drop(device_drivers);
    for t in tasks {
        t.abort();
    }
    // On a blocking thread: a volume's flush may wait for a reply from an
    // upstream NBD server, which (in tests, a gateway and its upstream in one
    // process) this runtime's workers may be the ones to send.
    let synced = tokio::task::spawn_blocking(move || state.store().sync_all()).await;
    synced
        .map_err(|e| anyhow::anyhow!("flushing volumes: {e}"))?
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    tracing::info!("weir stopped cleanly");
    Ok(())
}

/// The accept loop's side of admitting connections: caps, refusals, back-off
/// after errors, warnings at a bounded rate.
struct Acceptor {
    state: Arc<ServerState>,
    shutdown: watch::Receiver<bool>,
    backoff: AcceptBackoff,
    accept_warnings: RateLimited,
    refusal_warnings: RateLimited,
}

impl Acceptor {
    fn new(state: Arc<ServerState>, shutdown: watch::Receiver<bool>) -> Acceptor {
        Acceptor {
            state,
            shutdown,
            backoff: AcceptBackoff::default(),
            accept_warnings: RateLimited::new(WARN_EVERY),
            refusal_warnings: RateLimited::new(WARN_EVERY),
        }
    }

    /// A new connection: served, refused with the reason, or closed at once.
    fn accepted(
        &mut self,
        stream: tokio::net::TcpStream,
        peer: SocketAddr,
        sessions: &mut JoinSet<()>,
    ) {
        self.backoff.succeeded();
        let reason = match self.state.limits.admit(canonical(peer.ip())) {
            Admission::Admitted(slot) => {
                let session = crate::session::run_session(
                    self.state.clone(),
                    stream,
                    peer,
                    self.shutdown.clone(),
                    slot,
                );
                sessions.spawn(session);
                return;
            }
            Admission::Refuse(slot, reason) => {
                tokio::spawn(crate::connections::refuse(stream, reason.clone(), slot));
                reason
            }
            Admission::Close => "too many connections being refused; closed".to_string(),
        };
        if let Some(n) = self.refusal_warnings.allow(Instant::now()) {
            let note = suppressed_note(n);
            tracing::warn!(%peer, "connection refused: {reason}{note}");
        }
    }

    /// `accept` failed (a full descriptor table, …): warn at a bounded rate and
    /// pause, longer while it keeps failing.
    async fn failed(&mut self, e: std::io::Error) {
        let pause = self.backoff.failed();
        if let Some(n) = self.accept_warnings.allow(Instant::now()) {
            let note = suppressed_note(n);
            tracing::warn!("accept failed: {e}; retrying in {pause:?}{note}");
        }
        tokio::time::sleep(pause).await;
    }
}

/// SIGINT, SIGTERM and SIGHUP, caught from the moment this returns. SIGHUP
/// (a closed terminal or ssh session; weir has no configuration reload) stops
/// the server cleanly too, instead of killing it without a sync.
pub struct StopSignals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
}

impl StopSignals {
    /// Installs the handlers. Call it before the listeners are bound: a signal
    /// that arrives between binding and handling would kill the process without
    /// the clean stop (no new connections, in-flight requests answered, data
    /// synced); caught early, it stops the server as soon as it is up.
    pub fn install() -> std::io::Result<StopSignals> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(StopSignals {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
            hangup: signal(SignalKind::hangup())?,
        })
    }

    /// Waits for any of the signals (returns at once if one came since
    /// `install`); its name.
    pub async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.interrupt.recv() => "SIGINT",
            _ = self.terminate.recv() => "SIGTERM",
            _ = self.hangup.recv() => "SIGHUP (weir has no configuration reload: it stops)",
        }
    }
}

/// Runs the server until SIGINT, SIGTERM or SIGHUP, then shuts down gracefully.
pub async fn serve(config: WeirConfig) -> anyhow::Result<()> {
    let mut signals = StopSignals::install()?;
    let server = RunningServer::start(config).await?;
    let signal = signals.recv().await;
    tracing::info!("{signal} received, shutting down");
    server.shutdown().await
}
