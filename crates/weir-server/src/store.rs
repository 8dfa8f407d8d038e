//! The volume store: volumes are sparse files in pool directories; metadata
//! (volumes, sizes, policies, access groups) lives in `<data_dir>/weir-meta.json`,
//! replaced crash-safely (write a temporary file, fsync it, rename it over the
//! old one, fsync the directory) when its content changes — not at every start,
//! so a server stopped on a full file system starts again. Files are created
//! 0600 and directories 0700 (volumes hold tenants' data).
//!
//! On start the metadata file is loaded, then the configuration is merged in.
//! The rule (decided for issue 3): the configuration is the floor of what
//! exists, the metadata file holds everything done since.
//! - Policies and access groups the configuration declares are (re)created with
//!   the configuration's definition on every start: the file wins over an API
//!   change or deletion of a declared one (edit the file to change those).
//!   Policies and groups created through the API persist untouched.
//! - Volumes the configuration declares are created when missing. For one that
//!   exists, the last change wins (issue 14): the metadata keeps what the file
//!   said at the last start, so a value the file has changed since (size,
//!   policy, access groups, read-only, description) is applied, logged as a diff
//!   (target `weir_audit`), while a value changed through the API since is kept,
//!   logged as kept. A file that shrinks a volume below its size or moves it to
//!   another pool is refused with a message (no shrinking, no moves). Volumes
//!   created through the API persist; a declared volume deleted through the API
//!   comes back (empty) on the next start while the file still declares it.

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde::{Deserialize, Serialize};
use weir_qos::{Policy, PolicyCatalog, VolumeId};

use crate::access::{GroupRule, Peer, allowed};
use crate::backend::{Backend, FileBackend};
use crate::config::{
    AccessGroupConfig, DEFAULT_POOL, PoolConfig, PoolFormat, WeirConfig, validate_description,
    validate_name,
};
use crate::flash_cache::{FlashCacheDevice, VolumeCache};
use crate::thin::{ThinBackend, ThinMeta, ThinState, thin_dir};
use weir_thin::ThinVolume;

mod descriptors;
mod rbd_ops;
mod repl_ops;
mod thin_ops;
mod upstream_ops;
pub use rbd_ops::TakeOver;
pub use thin_ops::{
    CheckedPools, DeleteSnapshot, Flatten, FlattenPlan, MergePlan, ThinCheck, ThinPoolCheck,
    ThinSpace,
};

/// Mode of the files the store creates (volumes, metadata).
pub const FILE_MODE: u32 = 0o600;
/// Mode of the directories the store creates (data dir, pools).
pub const DIR_MODE: u32 = 0o700;

/// A file an older version created readable by others becomes [`FILE_MODE`]
/// (only a regular file of the data directory: not what a symlink points to).
fn make_private(file: &File, path: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::PermissionsExt;
    let own = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_file());
    let mode = file
        .metadata()
        .map_err(|e| io_err(path.display(), e))?
        .permissions()
        .mode();
    if own && mode & 0o077 != 0 {
        file.set_permissions(std::fs::Permissions::from_mode(FILE_MODE))
            .map_err(|e| io_err(format!("chmod 600 {}", path.display()), e))?;
    }
    Ok(())
}

/// `mkdir -p` with [`DIR_MODE`] for the directories it creates.
pub(crate) fn create_dirs(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(dir)
}

pub const META_FILE: &str = "weir-meta.json";
const META_VERSION: u32 = 1;

/// A volume's metadata (also the admin API's view of a volume).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeRecord {
    pub id: u32,
    pub name: String,
    pub pool: String,
    pub size_bytes: u64,
    pub policy: String,
    /// Access groups whose hosts may reach the volume; empty: every host.
    #[serde(default)]
    pub access_groups: Vec<String>,
    #[serde(default)]
    pub read_only: bool,
    #[serde(default)]
    pub description: String,
    /// Thin pools: the volume's top layer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer: Option<u64>,
    /// A linked clone: the snapshot it was cloned from (`volume@snapshot`), until
    /// it is flattened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
    /// `flash`: reads go through the pool's flash cache (crate::flash_cache).
    #[serde(default)]
    pub cache: VolumeCache,
    /// Who holds the volume's exclusive-writer lease now (crate::lease): filled by the
    /// admin API's GET answers, never stored in the catalog.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclusive_lease: Option<LeaseHolder>,
}

/// The client holding a volume's exclusive-writer lease (`weir:exclusive`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseHolder {
    /// The holder's address as the storage server sees it.
    pub holder: String,
    /// Its connections holding the lease.
    pub connections: u32,
}

/// What the admin API needs to create a volume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeCreate {
    pub name: String,
    pub size_bytes: u64,
    pub policy: String,
    #[serde(default)]
    pub pool: Option<String>,
    #[serde(default)]
    pub access_groups: Vec<String>,
    #[serde(default)]
    pub read_only: bool,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub cache: VolumeCache,
}

/// A partial change of a volume's attributes (absent fields stay as they are).
/// Takes effect for connections opened afterwards.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeUpdate {
    #[serde(default)]
    pub access_groups: Option<Vec<String>>,
    #[serde(default)]
    pub read_only: Option<bool>,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub cache: Option<VolumeCache>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct Meta {
    version: u32,
    next_volume_id: u32,
    volumes: Vec<VolumeRecord>,
    policies: Vec<Policy>,
    access_groups: Vec<AccessGroupConfig>,
    /// Layers and snapshots of thin pools.
    #[serde(default)]
    thin: ThinMeta,
    /// Snapshots of volumes in RBD pools (RBD snapshots; `layer` unused, 0).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    rbd_snapshots: Vec<crate::thin::SnapshotRecord>,
    /// Asynchronous replications (`crate::replicate`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    replications: Vec<crate::replicate::ReplicationRecord>,
    /// What the configuration said of each declared volume at the last start.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    declared: BTreeMap<String, DeclaredVolume>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Io(String),
    /// A resource of the server (its open-files limit) has no room for what was
    /// asked; nothing was changed.
    #[error("{0}")]
    Exhausted(String),
}

/// Descriptions set through the API follow the configuration's rule (older
/// metadata is not refused at start: the NBD layer sanitises what it sends).
fn check_description(r: &VolumeRecord) -> Result<(), StoreError> {
    validate_description(&r.description)
        .map_err(|e| StoreError::Invalid(format!("volume {:?}: description {e}", r.name)))
}

fn io_err(what: impl std::fmt::Display, e: std::io::Error) -> StoreError {
    StoreError::Io(format!("{what}: {e}"))
}

/// An open volume, shared by every session that uses it.
pub struct OpenVolume {
    pub id: VolumeId,
    pub name: String,
    pub pool: String,
    pub backend: Arc<dyn Backend>,
    /// Thin pools: the volume (or snapshot view) behind `backend`.
    pub thin: Option<Arc<ThinVolume>>,
    /// Set when the volume is deleted: its sessions fail further requests.
    pub deleted: AtomicBool,
}

impl OpenVolume {
    pub fn is_deleted(&self) -> bool {
        self.deleted.load(Ordering::Acquire)
    }
}

/// What the configuration file said of a volume at the last start (kept in the
/// metadata to tell an edit of the file from a change made through the API).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DeclaredVolume {
    size_bytes: u64,
    policy: String,
    access_groups: Vec<String>,
    read_only: bool,
    description: String,
    #[serde(default)]
    cache: VolumeCache,
}

impl DeclaredVolume {
    fn of(v: &crate::config::VolumeConfig) -> DeclaredVolume {
        DeclaredVolume {
            size_bytes: v.size.0,
            policy: v.policy.clone(),
            access_groups: v.access_groups.clone(),
            read_only: v.read_only,
            description: v.description.clone(),
            cache: v.cache,
        }
    }
}

/// The metadata file's bytes as read (None if there is none yet) and its contents
/// (empty for a new data directory); a version this build does not read is refused.
fn load_meta(path: &Path) -> Result<(Option<Vec<u8>>, Meta), StoreError> {
    let on_disk = match std::fs::read(path) {
        Ok(bytes) => Some(bytes),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(io_err(path.display(), e)),
    };
    let mut meta = match &on_disk {
        Some(bytes) => serde_json::from_slice::<Meta>(bytes)
            .map_err(|e| StoreError::Invalid(format!("{}: {e}", path.display())))?,
        None => Meta {
            version: META_VERSION,
            ..Meta::default()
        },
    };
    if meta.version != META_VERSION {
        return Err(StoreError::Invalid(format!(
            "{}: metadata version {} is not supported (expected {META_VERSION})",
            path.display(),
            meta.version
        )));
    }
    meta.thin.sort();
    Ok((on_disk, meta))
}

/// With no metadata file, a data directory whose pools hold files is not new:
/// its catalog was lost (deleted, not restored). Starting afresh would take the
/// files for orphans (thin layers deleted at start) or hand them to new volumes
/// of the same ids (another volume's data read by a new one), so it is refused.
fn refuse_orphaned_pools(data_dir: &Path, meta_path: &Path) -> Result<(), StoreError> {
    let pools = data_dir.join("pools");
    let mut files = Vec::new();
    collect_files(&pools, 4, &mut files);
    let Some(first) = files.first() else {
        return Ok(());
    };
    let more = match files.len() {
        1 => String::new(),
        n if n >= FILES_LISTED => format!(" and {} or more others", n - 1),
        n => format!(" and {} others", n - 1),
    };
    Err(StoreError::Invalid(format!(
        "{} is missing, but {} holds volume files ({}{more}): without the catalog nothing \
         says which volume they belong to. Restore {META_FILE} from a backup, or move {} \
         away to start with no volumes",
        meta_path.display(),
        pools.display(),
        first.display(),
        pools.display()
    )))
}

/// How many files [`refuse_orphaned_pools`] looks for at most.
const FILES_LISTED: usize = 1000;

/// Regular files below `dir` (at most `depth` levels, [`FILES_LISTED`] files).
fn collect_files(dir: &Path, depth: u32, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        if out.len() >= FILES_LISTED {
            return;
        }
        match e.file_type() {
            Ok(t) if t.is_file() => out.push(e.path()),
            Ok(t) if t.is_dir() && depth > 1 => collect_files(&e.path(), depth - 1, out),
            _ => {}
        }
    }
}

/// The configuration's volumes into the metadata: a known one merged by
/// [`apply_declared`], a new one recorded with the next id; then what the file
/// declares now is remembered for the next start.
fn merge_declared_volumes(meta: &mut Meta, config: &WeirConfig) -> Result<(), StoreError> {
    for v in &config.volumes {
        let last = meta.declared.get(&v.name);
        if let Some(r) = meta.volumes.iter_mut().find(|r| r.name == v.name) {
            apply_declared(r, v, last)?;
        } else {
            meta.next_volume_id += 1;
            meta.volumes.push(VolumeRecord {
                id: meta.next_volume_id,
                name: v.name.clone(),
                pool: v.pool.clone(),
                size_bytes: v.size.0,
                policy: v.policy.clone(),
                access_groups: v.access_groups.clone(),
                read_only: v.read_only,
                description: v.description.clone(),
                layer: None,
                origin: None,
                cache: v.cache,
                exclusive_lease: None,
            });
        }
    }
    meta.declared = config
        .volumes
        .iter()
        .map(|v| (v.name.clone(), DeclaredVolume::of(v)))
        .collect();
    Ok(())
}

/// Merges a declared volume's configuration into its stored record (the rule is
/// at the top of this module): a value the file changed since the last start is
/// applied and logged as a diff; a value changed through the API while the file
/// stayed the same is kept, with a note saying so. A size below the stored one
/// and a pool change are refused with a message.
fn apply_declared(
    r: &mut VolumeRecord,
    v: &crate::config::VolumeConfig,
    last: Option<&DeclaredVolume>,
) -> Result<(), StoreError> {
    if v.pool != r.pool {
        return Err(StoreError::Invalid(format!(
            "volume {:?}: the configuration says pool {:?} but the volume is in pool {:?} (volumes do not move between pools: set pool = {:?})",
            r.name, v.pool, r.pool, r.pool
        )));
    }
    let now = DeclaredVolume::of(v);
    let stored = DeclaredVolume {
        size_bytes: r.size_bytes,
        policy: r.policy.clone(),
        access_groups: r.access_groups.clone(),
        read_only: r.read_only,
        description: r.description.clone(),
        cache: r.cache,
    };
    // No record of the file's last values (metadata of an older version): the
    // file counts as unchanged.
    let last = last.unwrap_or(&now);
    if now.size_bytes != last.size_bytes && now.size_bytes < r.size_bytes {
        return Err(StoreError::Invalid(format!(
            "volume {:?}: the configuration now says size {} bytes but the volume is {} bytes; volumes never shrink (that would cut off data): set size to at least {} bytes",
            r.name, now.size_bytes, r.size_bytes, r.size_bytes
        )));
    }
    let mut applied = Vec::new();
    let mut kept = Vec::new();
    let mut field = |name: &str, new: String, old_file: String, have: String| {
        if new == have {
            return false;
        }
        if new != old_file {
            applied.push(format!("{name} {have} -> {new}"));
            true
        } else {
            kept.push(format!("{name} {have} (the file says {new})"));
            false
        }
    };
    // No size in the file (an upstream pool's volume: the upstream's size) is
    // nothing to apply or keep.
    if now.size_bytes != 0
        && field(
            "size",
            now.size_bytes.to_string(),
            last.size_bytes.to_string(),
            stored.size_bytes.to_string(),
        )
    {
        r.size_bytes = now.size_bytes;
    }
    if field(
        "policy",
        format!("{:?}", now.policy),
        format!("{:?}", last.policy),
        format!("{:?}", stored.policy),
    ) {
        r.policy = now.policy.clone();
    }
    if field(
        "access_groups",
        format!("{:?}", now.access_groups),
        format!("{:?}", last.access_groups),
        format!("{:?}", stored.access_groups),
    ) {
        r.access_groups = now.access_groups.clone();
    }
    if field(
        "read_only",
        now.read_only.to_string(),
        last.read_only.to_string(),
        stored.read_only.to_string(),
    ) {
        r.read_only = now.read_only;
    }
    if field(
        "description",
        format!("{:?}", now.description),
        format!("{:?}", last.description),
        format!("{:?}", stored.description),
    ) {
        r.description = now.description.clone();
    }
    if field(
        "cache",
        now.cache.name().into(),
        last.cache.name().into(),
        stored.cache.name().into(),
    ) {
        r.cache = now.cache;
    }
    if !applied.is_empty() {
        tracing::info!(target: crate::admin::AUDIT_TARGET, "config: volume {:?}: applied {}", r.name, applied.join(", "));
    }
    if !kept.is_empty() {
        tracing::info!(
            target: crate::admin::AUDIT_TARGET,
            "config: volume {:?}: keeping {} set through the admin API (the file's value is applied when the file changes it)",
            r.name,
            kept.join(", ")
        );
    }
    Ok(())
}

pub struct VolumeStore {
    data_dir: PathBuf,
    meta: Meta,
    catalog: PolicyCatalog,
    pools: Vec<PoolConfig>,
    groups: HashMap<String, GroupRule>,
    /// Open volumes and snapshot exports (`volume@snapshot`), by export name.
    open: HashMap<String, Arc<OpenVolume>>,
    thin: ThinState,
    /// Upstream pools: the export of each volume the configuration maps
    /// (`export = …`); others are the export of their name.
    upstream_exports: HashMap<String, String>,
    /// Upstream pools: each pool's target, TLS settings read once (every volume
    /// of the pool shares one rustls configuration).
    upstream_targets: HashMap<String, crate::upstream::UpstreamTarget>,
    /// RBD pools: clusters and open images.
    rbd: rbd_ops::RbdState,
    /// Volumes whose layers a copy outside the lock works on, and what it is.
    busy: HashMap<String, &'static str>,
    /// Upstream pools: each volume's backend (its counters for /metrics).
    upstreams: BTreeMap<String, Arc<crate::upstream::UpstreamBackend>>,
    /// Pools with a flash cache: its file and decisions, by pool name.
    flash: HashMap<String, Arc<FlashCacheDevice>>,
    /// Hybrid pools: the flash tier's files and placement, by pool name.
    tiers: HashMap<String, Arc<crate::tier::TierDevice>>,
    /// Descriptors the volumes and thin layers may hold at most (the server's
    /// share of its open-files limit; `None`: not limited).
    descriptor_cap: Option<u64>,
}

impl VolumeStore {
    /// Opens (creating if needed) the data directory and every volume file.
    pub fn open(config: &WeirConfig) -> Result<VolumeStore, StoreError> {
        let data_dir = config.data_dir.clone();
        if data_dir.exists() && !data_dir.is_dir() {
            return Err(StoreError::Invalid(format!(
                "data_dir {} exists and is not a directory",
                data_dir.display()
            )));
        }
        create_dirs(&data_dir)
            .map_err(|e| io_err(format!("creating {}", data_dir.display()), e))?;
        let meta_path = data_dir.join(META_FILE);
        let (on_disk, mut meta) = load_meta(&meta_path)?;
        if on_disk.is_none() {
            refuse_orphaned_pools(&data_dir, &meta_path)?;
        }
        // Merge the configuration.
        for p in &config.policies {
            meta.policies.retain(|q| q.name != p.name);
            meta.policies.push(p.clone());
        }
        for g in &config.access_groups {
            meta.access_groups.retain(|q| q.name != g.name);
            meta.access_groups.push(g.clone());
        }
        let mut store = VolumeStore {
            data_dir,
            meta: Meta::default(),
            catalog: PolicyCatalog::new(),
            pools: config.pools.clone(),
            groups: HashMap::new(),
            open: HashMap::new(),
            thin: ThinState::default(),
            upstream_exports: config
                .volumes
                .iter()
                .filter_map(|v| Some((v.name.clone(), v.export.clone()?)))
                .collect(),
            upstream_targets: upstream_ops::upstream_targets(&config.pools)?,
            rbd: rbd_ops::RbdState::default(),
            busy: HashMap::new(),
            upstreams: BTreeMap::new(),
            flash: HashMap::new(),
            tiers: HashMap::new(),
            descriptor_cap: None,
        };
        store.open_pool_devices(config)?;
        store.connect_rbd_pools()?;
        // Volumes that existed before this start (an RBD volume's image must).
        let known: std::collections::HashSet<String> =
            meta.volumes.iter().map(|r| r.name.clone()).collect();
        for p in &config.pools {
            if p.format == PoolFormat::Thin {
                store.thin.set_cache(&p.name, p.clone_cache.0);
            }
        }
        for p in &meta.policies {
            store
                .catalog
                .insert(p.clone())
                .map_err(|e| StoreError::Invalid(format!("policy {:?}: {e}", p.name)))?;
        }
        for g in &meta.access_groups {
            let rule = GroupRule::parse(g)
                .map_err(|e| StoreError::Invalid(format!("access group {:?}: {e}", g.name)))?;
            store.groups.insert(g.name.clone(), rule);
        }
        merge_declared_volumes(&mut meta, config)?;
        let mut upstream = store.open_upstreams(&mut meta.volumes, config)?;
        for r in &meta.volumes {
            store.check_record(r)?;
            // A declared size grown in the file: the thin top layer grows with it.
            if let Some(top) = r.layer {
                for l in meta.thin.layers.iter_mut().filter(|l| l.id == top) {
                    l.size_bytes = l.size_bytes.max(r.size_bytes);
                }
            }
        }
        for r in &mut meta.volumes {
            if store.is_thin(&r.pool) && r.layer.is_none() {
                r.layer = Some(meta.thin.new_layer(&r.pool, None, r.size_bytes));
            }
        }
        store.meta = meta;
        for (pool, t) in &store.tiers {
            let live = store.meta.volumes.iter().filter(|r| &r.pool == pool);
            let dropped = t.keep_volumes(&live.map(|r| r.id).collect());
            if dropped > 0 {
                tracing::info!("pool {pool:?}: {dropped} flash extents of deleted volumes dropped");
            }
        }
        store.collect_layers()?;
        store.open_volumes(&mut upstream, &known)?;
        store.merge_replication_config(&config.replications)?;
        for snap in store.meta.thin.snapshots.clone() {
            store.open_snapshot(&snap)?;
        }
        for snap in store.meta.rbd_snapshots.clone() {
            store.open_rbd_snapshot(&snap)?;
        }
        if on_disk.as_deref() != Some(store.meta_bytes()?.as_slice()) {
            store.persist()?;
        } else {
            let f = File::open(&meta_path).map_err(|e| io_err(meta_path.display(), e))?;
            make_private(&f, &meta_path)?;
        }
        store.remove_orphan_layers();
        Ok(store)
    }

    /// The pools' flash caches and flash tiers.
    fn open_pool_devices(&mut self, config: &WeirConfig) -> Result<(), StoreError> {
        for p in &config.pools {
            let invalid = |e| StoreError::Invalid(format!("pool {:?}: {e}", p.name));
            if let Some(fc) = &p.flash_cache {
                let dev = FlashCacheDevice::open(&p.name, fc).map_err(invalid)?;
                self.flash.insert(p.name.clone(), dev);
            }
            if let Some(t) = &p.tier {
                let dev = crate::tier::TierDevice::open(&p.name, t, &self.pool_dir(&p.name))
                    .map_err(invalid)?;
                self.tiers.insert(p.name.clone(), dev);
            }
        }
        Ok(())
    }

    /// Every volume of the metadata: on its upstream (already connected), its RBD
    /// image (which must exist if the volume did before this start; its size is
    /// the image's), or its file.
    fn open_volumes(
        &mut self,
        upstream: &mut HashMap<String, Arc<crate::upstream::UpstreamBackend>>,
        known: &std::collections::HashSet<String>,
    ) -> Result<(), StoreError> {
        for r in self.meta.volumes.clone() {
            let volume = match upstream.remove(&r.name) {
                Some(b) => self.upstream_volume(&r, b),
                None if self.rbd_pool(&r.pool).is_some() => {
                    let (volume, size) = self.open_rbd(&r, known.contains(&r.name))?;
                    for m in self.meta.volumes.iter_mut().filter(|m| m.name == r.name) {
                        m.size_bytes = size;
                    }
                    volume
                }
                None => self.open_file(&r, true)?,
            };
            self.open.insert(r.name.clone(), volume);
        }
        Ok(())
    }

    /// `cache = "flash"` needs a pool with a flash cache.
    fn check_cache(&self, r: &VolumeRecord) -> Result<(), StoreError> {
        if r.cache == VolumeCache::Flash && !self.flash.contains_key(&r.pool) {
            return Err(StoreError::Invalid(format!(
                "volume {:?}: cache = \"flash\" needs a flash cache on pool {:?} (flash_cache = {{ dir = …, size = … }})",
                r.name, r.pool
            )));
        }
        Ok(())
    }

    fn check_record(&self, r: &VolumeRecord) -> Result<(), StoreError> {
        validate_name("volume", &r.name).map_err(StoreError::Invalid)?;
        self.check_cache(r)?;
        if !self.pools.iter().any(|p| p.name == r.pool) {
            return Err(StoreError::Invalid(format!(
                "volume {:?}: no pool named {:?}",
                r.name, r.pool
            )));
        }
        self.catalog
            .get(&r.policy)
            .map_err(|e| StoreError::Invalid(format!("volume {:?}: {e}", r.name)))?;
        for g in &r.access_groups {
            if !self.groups.contains_key(g) {
                return Err(StoreError::Invalid(format!(
                    "volume {:?}: no access group named {g:?}",
                    r.name
                )));
            }
        }
        if r.size_bytes == 0 {
            return Err(StoreError::Invalid(format!(
                "volume {:?}: size must be more than 0",
                r.name
            )));
        }
        if r.size_bytes > i64::MAX as u64 {
            return Err(StoreError::Invalid(format!(
                "volume {:?}: size must be at most {} bytes (8 EiB: a file offset), not {}",
                r.name,
                i64::MAX,
                r.size_bytes
            )));
        }
        Ok(())
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }
    pub fn pool_dir(&self, pool: &str) -> PathBuf {
        self.data_dir.join("pools").join(pool)
    }
    fn volume_path(&self, r: &VolumeRecord) -> PathBuf {
        self.pool_dir(&r.pool).join(format!("{}.img", r.name))
    }
    pub fn pools(&self) -> &[PoolConfig] {
        &self.pools
    }
    /// A volume's backend stack over its bottom backend (`crate::stack`).
    /// `volume`: the volume's record (`None`: a snapshot view, never cached).
    pub(crate) fn stack(
        &self,
        pool: &str,
        volume: Option<&VolumeRecord>,
        bottom: Arc<dyn Backend>,
    ) -> Arc<dyn Backend> {
        let cache = volume.and_then(|r| Some((self.flash.get(pool)?, r.name.as_str(), r.cache)));
        let tier = volume.and_then(|r| Some((self.tiers.get(pool)?, r.id, r.name.as_str())));
        crate::stack::build(
            self.pools.iter().find(|p| p.name == pool),
            cache,
            tier,
            bottom,
        )
    }

    /// A hybrid pool's tier (`None`: the pool has none).
    pub fn tier(&self, pool: &str) -> Option<&Arc<crate::tier::TierDevice>> {
        self.tiers.get(pool)
    }

    /// Every hybrid pool's tier counters (metrics).
    pub fn tier_snapshots(&self) -> Vec<crate::tier::TierSnapshot> {
        let mut all: Vec<_> = self.tiers.values().map(|d| d.snapshot()).collect();
        all.sort_by(|a, b| a.pool.cmp(&b.pool));
        all
    }

    /// Every pool's flash cache counters (metrics).
    pub fn flash_cache_snapshots(&self) -> Vec<crate::flash_cache::FlashCacheSnapshot> {
        let mut all: Vec<_> = self.flash.values().map(|d| d.snapshot()).collect();
        all.sort_by(|a, b| a.pool.cmp(&b.pool));
        all
    }

    /// The volume's data changed beneath its stack: its cached blocks go.
    pub(crate) fn drop_cached(&self, pool: &str, volume: &str) {
        if let Some(dev) = self.flash.get(pool) {
            dev.drop_volume(volume);
        }
    }

    pub(crate) fn is_thin(&self, pool: &str) -> bool {
        self.pools
            .iter()
            .any(|p| p.name == pool && p.format == PoolFormat::Thin)
    }

    fn open_file(
        &mut self,
        r: &VolumeRecord,
        allow_existing: bool,
    ) -> Result<Arc<OpenVolume>, StoreError> {
        use std::os::unix::fs::OpenOptionsExt;
        if let Some(top) = r.layer {
            return self.open_thin(r, top);
        }
        let dir = self.pool_dir(&r.pool);
        create_dirs(&dir).map_err(|e| io_err(format!("creating {}", dir.display()), e))?;
        let path = self.volume_path(r);
        let mut opts = OpenOptions::new();
        opts.read(true).write(true).mode(FILE_MODE);
        if allow_existing {
            opts.create(true);
        } else {
            opts.create_new(true);
        }
        let file = opts.open(&path).map_err(|e| io_err(path.display(), e))?;
        let sized = (|| {
            make_private(&file, &path)?;
            let len = file
                .metadata()
                .map_err(|e| io_err(path.display(), e))?
                .len();
            if len < r.size_bytes {
                file.set_len(r.size_bytes).map_err(|e| match e.raw_os_error() {
                    // The request, not the server, is at fault: a 400, not a 500.
                    Some(libc::EFBIG) | Some(libc::EINVAL) => StoreError::Invalid(format!(
                        "volume {:?}: the pool's file system cannot hold a file of {} bytes ({e})",
                        r.name, r.size_bytes
                    )),
                    _ => io_err(format!("sizing {}", path.display()), e),
                })?;
            }
            Ok(())
        })();
        if let Err(e) = sized {
            // A file this call created (a new volume) is not left behind: it
            // would refuse every later create of the name, and no volume owns it.
            if !allow_existing {
                let _ = std::fs::remove_file(&path);
            }
            return Err(e);
        }
        let pool = self.pools.iter().find(|p| p.name == r.pool);
        let direct_io = pool.is_some_and(|p| p.direct_io);
        let backend = if direct_io {
            match OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_DIRECT)
                .open(&path)
            {
                Ok(direct) => FileBackend::with_direct(file, direct),
                Err(e) => {
                    tracing::warn!(
                        "volume {:?}: O_DIRECT unavailable ({e}); using buffered I/O",
                        r.name
                    );
                    FileBackend::new(file)
                }
            }
        } else {
            FileBackend::new(file)
        };
        Ok(Arc::new(OpenVolume {
            id: VolumeId(r.id),
            name: r.name.clone(),
            pool: r.pool.clone(),
            backend: self.stack(&r.pool, Some(r), Arc::new(backend)),
            thin: None,
            deleted: AtomicBool::new(false),
        }))
    }

    fn meta_bytes(&self) -> Result<Vec<u8>, StoreError> {
        serde_json::to_vec_pretty(&self.meta).map_err(|e| StoreError::Io(e.to_string()))
    }

    /// Writes the metadata crash-safely.
    fn persist(&self) -> Result<(), StoreError> {
        use std::os::unix::fs::OpenOptionsExt;
        let path = self.data_dir.join(META_FILE);
        let tmp = self.data_dir.join(format!("{META_FILE}.tmp"));
        let bytes = self.meta_bytes()?;
        let written = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(FILE_MODE)
            .open(&tmp)
            .and_then(|mut f| {
                f.write_all(&bytes)?;
                f.sync_all()
            });
        if let Err(e) = written {
            // A full disk: no half-written copy is left beside the metadata.
            let _ = std::fs::remove_file(&tmp);
            return Err(io_err(tmp.display(), e));
        }
        std::fs::rename(&tmp, &path).map_err(|e| io_err(path.display(), e))?;
        let dir = File::open(&self.data_dir).map_err(|e| io_err(self.data_dir.display(), e))?;
        dir.sync_all()
            .map_err(|e| io_err(self.data_dir.display(), e))?;
        Ok(())
    }

    /// Volumes, by name (snapshot exports are not volumes: see [`Self::snapshots`]).
    pub fn list(&self) -> Vec<VolumeRecord> {
        let mut v = self.meta.volumes.clone();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    /// A volume, or a snapshot export (`volume@snapshot`, read-only) by its name.
    pub fn get(&self, name: &str) -> Result<VolumeRecord, StoreError> {
        if let Some((volume, snap)) = name.split_once('@') {
            return self.snapshot_export(volume, snap);
        }
        self.meta
            .volumes
            .iter()
            .find(|r| r.name == name)
            .cloned()
            .ok_or_else(|| StoreError::NotFound(format!("no volume named {name:?}")))
    }

    /// A volume (not a snapshot export) by name.
    pub fn volume(&self, name: &str) -> Result<VolumeRecord, StoreError> {
        self.meta
            .volumes
            .iter()
            .find(|r| r.name == name)
            .cloned()
            .ok_or_else(|| StoreError::NotFound(format!("no volume named {name:?}")))
    }

    pub fn open_volume(&self, name: &str) -> Option<Arc<OpenVolume>> {
        self.open.get(name).cloned()
    }

    /// Whether `peer` (address, TLS identity) may see and open the volume.
    pub fn may_access(&self, r: &VolumeRecord, peer: Peer<'_>) -> bool {
        if r.access_groups.is_empty() {
            return allowed(None, peer);
        }
        let groups: Vec<&GroupRule> = r
            .access_groups
            .iter()
            .filter_map(|g| self.groups.get(g))
            .collect();
        allowed(Some(&groups), peer)
    }

    /// Volumes and snapshot exports `peer` may see and open, by name.
    pub fn visible_to(&self, peer: Peer<'_>) -> Vec<VolumeRecord> {
        let snaps = self
            .meta
            .thin
            .snapshots
            .iter()
            .chain(&self.meta.rbd_snapshots)
            .filter_map(|s| self.snapshot_export(&s.volume, &s.name).ok());
        let mut all: Vec<VolumeRecord> = self.list().into_iter().chain(snaps).collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all.retain(|r| self.may_access(r, peer));
        all
    }

    pub fn create(&mut self, req: VolumeCreate) -> Result<VolumeRecord, StoreError> {
        if self.meta.volumes.iter().any(|r| r.name == req.name) {
            return Err(StoreError::Conflict(format!(
                "volume {:?} already exists",
                req.name
            )));
        }
        let record = VolumeRecord {
            id: self.meta.next_volume_id + 1,
            name: req.name,
            pool: req.pool.unwrap_or_else(|| DEFAULT_POOL.to_string()),
            size_bytes: req.size_bytes,
            policy: req.policy,
            access_groups: req.access_groups,
            read_only: req.read_only,
            description: req.description,
            layer: None,
            origin: None,
            cache: req.cache,
            exclusive_lease: None,
        };
        if self.upstream_pool(&record.pool).is_none() {
            self.check_record(&record)?;
        }
        self.check_cache(&record)?;
        check_description(&record)?;
        if self.is_thin(&record.pool) {
            return self.create_thin(record);
        }
        if self.upstream_pool(&record.pool).is_some() {
            return self.create_upstream(record);
        }
        if self.rbd_pool(&record.pool).is_some() {
            return self.create_rbd(record);
        }
        self.check_descriptors(&format!("volume {:?}", record.name), 1)?;
        let volume = self.open_file(&record, false).map_err(|e| match e {
            StoreError::Io(m) if m.contains("exists") => StoreError::Conflict(format!(
                "a file for volume {:?} already exists in its pool",
                record.name
            )),
            other => other,
        })?;
        self.meta.next_volume_id += 1;
        self.meta.volumes.push(record.clone());
        if let Err(e) = self.persist() {
            self.meta.volumes.pop();
            let _ = std::fs::remove_file(self.volume_path(&record));
            return Err(e);
        }
        self.open.insert(record.name.clone(), volume);
        Ok(record)
    }

    /// Deletes a volume: metadata first, then the file. Open sessions see
    /// `OpenVolume::is_deleted` and fail further requests.
    pub fn delete(
        &mut self,
        name: &str,
    ) -> Result<(VolumeRecord, Option<Arc<OpenVolume>>), StoreError> {
        let deleted = self.delete_volume(name)?;
        self.drop_cached(&deleted.0.pool, name);
        if let Some(t) = self.tiers.get(&deleted.0.pool) {
            t.drop_volume(deleted.0.id);
        }
        Ok(deleted)
    }

    fn delete_volume(
        &mut self,
        name: &str,
    ) -> Result<(VolumeRecord, Option<Arc<OpenVolume>>), StoreError> {
        let record = self.volume(name)?;
        self.check_not_busy(name)?;
        if record.layer.is_some() {
            return self.delete_thin(record);
        }
        if self.upstream_pool(&record.pool).is_some() {
            return self.delete_upstream(record);
        }
        if self.rbd_pool(&record.pool).is_some() {
            return self.delete_rbd(record);
        }
        self.meta.volumes.retain(|r| r.name != name);
        self.persist()?;
        let open = self.open.remove(name);
        if let Some(v) = &open {
            v.deleted.store(true, Ordering::Release);
        }
        let path = self.volume_path(&record);
        std::fs::remove_file(&path).map_err(|e| io_err(path.display(), e))?;
        Ok((record, open))
    }

    /// Grows a volume (shrinking is refused: it would destroy data).
    pub fn resize(&mut self, name: &str, size_bytes: u64) -> Result<VolumeRecord, StoreError> {
        let record = self.volume(name)?;
        self.check_not_busy(name)?;
        // The same bounds as a new volume's (a size past a file offset's range
        // failed as an I/O error, 500).
        self.check_record(&VolumeRecord {
            size_bytes,
            ..record.clone()
        })?;
        if size_bytes < record.size_bytes {
            return Err(StoreError::Invalid(format!(
                "volume {name:?} is {} bytes; volumes can only grow, not shrink to {size_bytes}",
                record.size_bytes
            )));
        }
        if record.layer.is_some() {
            return self.resize_thin(record, size_bytes);
        }
        if let Some(p) = self.upstream_pool(&record.pool) {
            return Err(StoreError::Invalid(format!(
                "volume {name:?} is in pool {:?}, whose volumes are exports of {}: resize the \
                 export there, then restart this server (it takes the upstream's size)",
                p.name,
                p.upstream.as_deref().unwrap_or_default()
            )));
        }
        if self.rbd_pool(&record.pool).is_some() {
            return self.resize_rbd(record, size_bytes);
        }
        let path = self.volume_path(&record);
        let f = OpenOptions::new()
            .write(true)
            .open(&path)
            .map_err(|e| io_err(path.display(), e))?;
        let grown = f
            .set_len(size_bytes)
            .and_then(|()| f.sync_all())
            .map_err(|e| io_err(path.display(), e))
            .and_then(|()| self.update(name, |r| r.size_bytes = size_bytes));
        if grown.is_err() {
            // The metadata keeps the old size (a full disk refuses its rewrite):
            // so does the file. Nothing past it was visible, so nothing is lost.
            if let Err(e) = f.set_len(record.size_bytes) {
                tracing::warn!("volume {name:?}: restoring its file's size: {e}");
            }
        }
        grown
    }

    /// Changes access groups, read-only flag or description.
    pub fn update_volume(
        &mut self,
        name: &str,
        change: VolumeUpdate,
    ) -> Result<VolumeRecord, StoreError> {
        let mut candidate = self.get(name)?;
        if let Some(g) = change.access_groups {
            candidate.access_groups = g;
        }
        if let Some(ro) = change.read_only {
            candidate.read_only = ro;
        }
        if let Some(d) = change.description {
            candidate.description = d;
        }
        if let Some(c) = change.cache {
            candidate.cache = c;
        }
        self.check_record(&candidate)?;
        check_description(&candidate)?;
        let cache = candidate.cache;
        let r = self.update(name, |r| *r = candidate)?;
        if let Some(dev) = self.flash.get(&r.pool) {
            dev.set_cache(name, cache);
        }
        if cache == VolumeCache::Flash
            && let Some(up) = self.upstreams.get(name)
        {
            // Cached from now on: its upstream connections take the lease.
            up.ask_lease();
        }
        Ok(r)
    }

    /// Sets the volume's policy; returns the record and the policy to apply.
    pub fn set_policy(
        &mut self,
        name: &str,
        policy: &str,
    ) -> Result<(VolumeRecord, Policy), StoreError> {
        let p = self
            .catalog
            .get(policy)
            .map_err(|e| StoreError::Invalid(e.to_string()))?
            .clone();
        let r = self.update(name, |r| r.policy = p.name.clone())?;
        Ok((r, p))
    }

    fn update(
        &mut self,
        name: &str,
        f: impl FnOnce(&mut VolumeRecord),
    ) -> Result<VolumeRecord, StoreError> {
        let Some(i) = self.meta.volumes.iter().position(|r| r.name == name) else {
            return Err(StoreError::NotFound(format!("no volume named {name:?}")));
        };
        let before = self.meta.volumes[i].clone();
        f(&mut self.meta.volumes[i]);
        if let Err(e) = self.persist() {
            self.meta.volumes[i] = before;
            return Err(e);
        }
        Ok(self.meta.volumes[i].clone())
    }

    pub fn policy(&self, name: &str) -> Result<Policy, StoreError> {
        self.catalog
            .get(name)
            .cloned()
            .map_err(|e| StoreError::NotFound(e.to_string()))
    }

    pub fn access_groups(&self) -> Vec<AccessGroupConfig> {
        let mut g = self.meta.access_groups.clone();
        g.sort_by(|a, b| a.name.cmp(&b.name));
        g
    }

    pub fn access_group(&self, name: &str) -> Result<AccessGroupConfig, StoreError> {
        self.meta
            .access_groups
            .iter()
            .find(|g| g.name == name)
            .cloned()
            .ok_or_else(|| StoreError::NotFound(format!("no access group named {name:?}")))
    }

    /// Creates or replaces an access group (replacing changes who may open the
    /// volumes that name it from the next connection on).
    pub fn put_access_group(
        &mut self,
        group: AccessGroupConfig,
    ) -> Result<AccessGroupConfig, StoreError> {
        validate_name("access group", &group.name).map_err(StoreError::Invalid)?;
        let rule = GroupRule::parse_new(&group).map_err(StoreError::Invalid)?;
        let before = self.meta.access_groups.clone();
        self.meta.access_groups.retain(|g| g.name != group.name);
        self.meta.access_groups.push(group.clone());
        if let Err(e) = self.persist() {
            self.meta.access_groups = before;
            return Err(e);
        }
        self.groups.insert(group.name.clone(), rule);
        Ok(group)
    }

    pub fn delete_access_group(&mut self, name: &str) -> Result<AccessGroupConfig, StoreError> {
        let group = self.access_group(name)?;
        let users: Vec<&str> = self
            .meta
            .volumes
            .iter()
            .filter(|r| r.access_groups.iter().any(|g| g == name))
            .map(|r| r.name.as_str())
            .collect();
        if !users.is_empty() {
            return Err(StoreError::Conflict(format!(
                "access group {name:?} is used by volumes {users:?}"
            )));
        }
        self.meta.access_groups.retain(|g| g.name != name);
        self.persist()?;
        self.groups.remove(name);
        Ok(group)
    }

    pub fn policies(&self) -> Vec<Policy> {
        self.catalog.iter().cloned().collect()
    }

    pub fn create_policy(&mut self, policy: Policy) -> Result<Policy, StoreError> {
        if self.catalog.get(&policy.name).is_ok() {
            return Err(StoreError::Conflict(format!(
                "policy {:?} already exists",
                policy.name
            )));
        }
        self.catalog
            .insert(policy.clone())
            .map_err(|e| StoreError::Invalid(e.to_string()))?;
        self.meta.policies.push(policy.clone());
        if let Err(e) = self.persist() {
            self.meta.policies.pop();
            let _ = self.catalog.remove(&policy.name);
            return Err(e);
        }
        Ok(policy)
    }

    /// Replaces a user-defined policy (built-ins are refused: create one); returns
    /// it and the volumes that use it, whose schedulers must follow.
    pub fn update_policy(
        &mut self,
        policy: Policy,
    ) -> Result<(Policy, Vec<VolumeRecord>), StoreError> {
        let old = self.policy(&policy.name)?;
        if PolicyCatalog::is_builtin(&policy.name) {
            return Err(StoreError::Conflict(format!(
                "policy {:?} is built in and cannot be changed (create one of your own and `weir volume set-policy` to it)",
                policy.name
            )));
        }
        self.catalog
            .insert(policy.clone())
            .map_err(|e| StoreError::Invalid(e.to_string()))?;
        let before = self.meta.policies.clone();
        self.meta.policies.retain(|p| p.name != policy.name);
        self.meta.policies.push(policy.clone());
        if let Err(e) = self.persist() {
            self.meta.policies = before;
            let _ = self.catalog.insert(old);
            return Err(e);
        }
        let users = self
            .meta
            .volumes
            .iter()
            .filter(|r| r.policy == policy.name)
            .cloned()
            .collect();
        Ok((policy, users))
    }

    pub fn delete_policy(&mut self, name: &str) -> Result<Policy, StoreError> {
        let canonical = self.policy(name)?.name;
        if PolicyCatalog::is_builtin(name) {
            return Err(StoreError::Conflict(format!(
                "policy {name:?} is built in and cannot be deleted"
            )));
        }
        let users: Vec<&str> = self
            .meta
            .volumes
            .iter()
            .filter(|r| r.policy == canonical)
            .map(|r| r.name.as_str())
            .collect();
        if !users.is_empty() {
            return Err(StoreError::Conflict(format!(
                "policy {name:?} is used by volumes {users:?}"
            )));
        }
        let removed = self
            .catalog
            .remove(&canonical)
            .map_err(|e| StoreError::Conflict(e.to_string()))?;
        self.meta.policies.retain(|p| p.name != canonical);
        self.persist()?;
        Ok(removed)
    }

    /// Every volume's policy, for building the schedulers.
    pub fn volume_policies(&self) -> Vec<(VolumeRecord, Policy)> {
        self.list()
            .into_iter()
            .map(|r| {
                let p = self
                    .catalog
                    .get(&r.policy)
                    .cloned()
                    .unwrap_or_else(|_| Policy::best_effort(&r.policy));
                (r, p)
            })
            .collect()
    }

    /// Flushes every volume (shutdown).
    pub fn sync_all(&self) -> Result<(), StoreError> {
        let by_name: BTreeMap<_, _> = self.open.iter().collect();
        for (name, v) in by_name {
            v.backend
                .flush()
                .map_err(|e| io_err(format!("flushing volume {name:?}"), e))?;
        }
        Ok(())
    }
}
