//! The hybrid tier: a pool's `tier = { flash_dir = …, flash_size = … }` puts a
//! flash file in front of the pool's volume files (the disk tier). Hot extents
//! are promoted to flash, cold ones demoted, dirty ones destaged, in the
//! background and through the pool's QoS gate; whole-extent writes land on flash.
//!
//! Which extent lives where and what moves next are [`weir_model::Placement`]'s
//! decisions (the state machine the simulator's `HybridArray` runs); this layer
//! holds the files and does the I/O around it.
//!
//! **Data.** A volume's whole address space is in its pool file (as without a
//! tier). The flash file `<flash_dir>/<pool>.weir-tier` has one slot per extent;
//! an extent on flash is read and written there, and its pool-file copy is stale
//! while it is dirty.
//!
//! **Durability (the FLUSH contract across moves).** The placement's records go
//! to an append-only journal `<flash_dir>/<pool>.weir-tier-map` (written with
//! `write(2)` as they happen, so a killed process loses none; synced on FLUSH), in
//! this order:
//! 1. a promotion's or landing's data is written to its slot and the flash file
//!    synced *before* its `Map` record is appended, so a durable `Map` never
//!    points at a slot holding something else;
//! 2. a destage's data is written to the pool file and synced before its
//!    `Clean` record;
//! 3. a demoted extent's `Unmap` is appended when it is demoted, and its slot is
//!    reused only after the journal is synced;
//! 4. FLUSH (and FUA) syncs the flash file, the pool file, then the journal.
//!
//! A write to an extent being promoted waits for the promotion; a write during a
//! destage leaves the extent dirty; no move starts while host I/O it could
//! overtake is in flight on its extent (the placement's rules). The journal is
//! compacted (rewritten as the current map, then renamed) when it grows past
//! four records per slot; at start it is replayed, so placement survives restarts
//! and crashes (warm after restart).
//!
//! **Timing.** `flash_device` and `disk_device` are emulated devices (as a pool's
//! `device`, `crate::device`): an I/O of a tier completes no earlier than its
//! model says, migrations included.
//!
//! **QoS.** Migration I/O is charged to a background volume of the pool's gate
//! ([`TIER_VOLUME`], [`background_policy`]: non-critical, lowest shares, limited
//! to `2 × migration_mbps`, a read and a write per move), so the scheduler
//! orders it after volumes with reservations or latency targets and the depth
//! controller counts it. Not a gate *class* (`Gate::submit_in_class`): classes
//! bound separate devices, and a full class parks the scheduler's next release,
//! which would hold host I/O behind migration.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use weir_model::{ArrayRef, IoDir, Move, Placement, PlacementSpec, Record, Route};
use weir_nbd::Extent;
use weir_qos::{IoKind, Policy, ServiceLevel, Shares, VolumeId};

use crate::backend::Backend;
use crate::config::ByteSize;
use crate::device::{DeviceDriver, EmulatedDevice};

/// A pool's `tier = { … }`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TierConfig {
    /// Directory on the flash device: `<pool>.weir-tier` and `<pool>.weir-tier-map`.
    pub flash_dir: PathBuf,
    /// Flash capacity (the flash file's size).
    pub flash_size: ByteSize,
    /// Unit of placement (default 1 MiB).
    #[serde(default = "default_extent")]
    pub extent: ByteSize,
    /// Emulated flash device (a `weir_model` array preset or table).
    #[serde(default)]
    pub flash_device: Option<ArrayRef>,
    /// Emulated disk device for the pool's files.
    #[serde(default)]
    pub disk_device: Option<ArrayRef>,
    /// Heat at which an extent is promoted (each read or write adds 1).
    #[serde(default = "default_promote_heat")]
    pub promote_heat: f64,
    /// Heat halves every this many seconds.
    #[serde(default = "default_half_life_s")]
    pub half_life_s: f64,
    /// Extents moved per second at most, in MB/s of extent data.
    #[serde(default = "default_migration_mbps")]
    pub migration_mbps: f64,
    /// Moves in flight at once (each a read of one tier and a write of the
    /// other; their flash syncs are shared).
    #[serde(default = "default_moves_in_flight")]
    pub moves_in_flight: u32,
    /// Dirty data on flash above which extents are destaged (default a quarter
    /// of `flash_size`).
    #[serde(default)]
    pub dirty_max: Option<ByteSize>,
}

fn default_extent() -> ByteSize {
    ByteSize(1 << 20)
}
fn default_promote_heat() -> f64 {
    3.0
}
fn default_half_life_s() -> f64 {
    60.0
}
fn default_migration_mbps() -> f64 {
    200.0
}
fn default_moves_in_flight() -> u32 {
    4
}
/// Most moves in flight (one migrator thread each).
pub const MAX_MOVES_IN_FLIGHT: u32 = 64;

/// Most slots a flash file may have (the placement keeps ~100 bytes per slot).
pub const MAX_SLOTS: u64 = 1 << 24;
/// Promotion candidates queued at most.
const MAX_QUEUE: usize = 4096;
/// The gate volume migration I/O is charged to (store ids count up from 1).
pub const TIER_VOLUME: VolumeId = VolumeId(u32::MAX);
/// Bits of an extent key that hold the extent index (the rest: the volume id).
const INDEX_BITS: u32 = 40;

impl TierConfig {
    pub fn validate(&self) -> Result<(), String> {
        let e = self.extent.0;
        if !e.is_power_of_two() || !(64 << 10..=64 << 20).contains(&e) {
            return Err(format!(
                "tier.extent must be a power of two from 64 KiB to 64 MiB, got {e}"
            ));
        }
        let slots = self.flash_size.0 / e;
        if !(1..=MAX_SLOTS).contains(&slots) {
            return Err(format!(
                "tier.flash_size must hold 1 to {MAX_SLOTS} extents of {e} bytes, got {slots}"
            ));
        }
        if self.flash_dir.as_os_str().is_empty() {
            return Err("tier.flash_dir is empty".into());
        }
        if !(1..=MAX_MOVES_IN_FLIGHT).contains(&self.moves_in_flight) {
            return Err(format!(
                "tier.moves_in_flight must be 1 to {MAX_MOVES_IN_FLIGHT}, got {}",
                self.moves_in_flight
            ));
        }
        for (key, v, max) in [
            ("promote_heat", self.promote_heat, 1e9),
            ("half_life_s", self.half_life_s, 1e9),
            ("migration_mbps", self.migration_mbps, 100_000.0),
        ] {
            if !(v.is_finite() && v > 0.0 && v <= max) {
                return Err(format!(
                    "tier.{key} must be more than 0 and at most {max}, got {v}"
                ));
            }
        }
        Ok(())
    }

    fn placement_spec(&self) -> PlacementSpec {
        let slots = (self.flash_size.0 / self.extent.0) as u32;
        let dirty = self.dirty_max.map_or(self.flash_size.0 / 4, |d| d.0);
        PlacementSpec {
            slots,
            extent_bytes: self.extent.0,
            promote_heat: self.promote_heat,
            half_life_ns: self.half_life_s * 1e9,
            max_queue: MAX_QUEUE,
            dirty_limit: (dirty / self.extent.0).min(slots as u64) as u32,
        }
    }
}

/// The gate policy of migration I/O: non-critical, the lowest shares, at most
/// `2 × migration_mbps` (each move reads and writes its extent) and at least
/// `migration_mbps` reserved. Without the reservation the moves starve: shares
/// split the gate by bytes, so beside a 4 KiB flood the lowest shares leave
/// 1 MiB moves a few per second (measured: 2 promotions/s beside 5,000 IOPS).
/// Latency targets stay protected by the adaptive depth, which bounds what the
/// reservation may keep at the device too.
pub fn background_policy(config: &TierConfig) -> Policy {
    Policy {
        service_level: Some(ServiceLevel::NonCritical),
        reservation_mbps: Some(config.migration_mbps),
        limit_mbps: Some(2.0 * config.migration_mbps),
        shares: Shares::new(Shares::MIN_CUSTOM).expect("the minimum is valid"),
        ..Policy::best_effort("weir-tier-migration")
    }
}

/// Runs a background I/O once the pool's gate releases it (in pieces under its
/// limit): `io(offset, length)` for each piece (the session layer implements it).
pub trait BackgroundQos: Send + Sync {
    fn run(
        &self,
        volume: VolumeId,
        kind: IoKind,
        offset: u64,
        length: u32,
        io: &mut dyn FnMut(u64, u32) -> io::Result<()>,
    ) -> io::Result<()>;
}

/// A pool's tier counters now (metrics).
#[derive(Clone, Debug, Default)]
pub struct TierSnapshot {
    pub pool: String,
    pub capacity_bytes: u64,
    pub resident_bytes: u64,
    pub dirty_bytes: u64,
    pub promotions: u64,
    pub demotions: u64,
    pub destages: u64,
    pub landings: u64,
    pub moves_cancelled: u64,
    pub migrated_bytes: u64,
    pub errors: u64,
    /// Per volume: (name, reads served by flash, reads served by disk).
    pub volumes: Vec<(String, u64, u64)>,
}

#[derive(Default)]
struct VolumeReads {
    flash: AtomicU64,
    disk: AtomicU64,
}

struct TierVolume {
    name: String,
    below: Weak<dyn Backend>,
    reads: Arc<VolumeReads>,
}

/// One pool's flash file, journal and placement.
pub struct TierDevice {
    pool: String,
    config: TierConfig,
    shift: u32,
    flash: File,
    model: Mutex<Placement>,
    /// Notified when a move ends (writes waiting for a promotion retry).
    moved: Condvar,
    journal: Mutex<Journal>,
    volumes: Mutex<HashMap<u32, TierVolume>>,
    flash_dev: Option<Arc<EmulatedDevice>>,
    disk_dev: Option<Arc<EmulatedDevice>>,
    drivers: Mutex<Vec<DeviceDriver>>,
    qos: OnceLock<Arc<dyn BackgroundQos>>,
    stop: Arc<AtomicBool>,
    epoch: Instant,
    /// When the migrators' next move may start (`migration_mbps`).
    pace: Mutex<Instant>,
    flash_sync: GroupSync,
    migrated: AtomicU64,
    errors: AtomicU64,
}

/// Group commit of a file's fsync: callers whose writes completed before a
/// sync began share that sync instead of each issuing their own.
#[derive(Default)]
struct GroupSync {
    /// Bumped by each caller once its writes are complete.
    written: AtomicU64,
    /// Under the lock (one sync at a time): the highest `written` value a
    /// successful sync covers, and the highest one a failed sync covered.
    state: Mutex<SyncState>,
}

#[derive(Default)]
struct SyncState {
    synced: u64,
    failed: u64,
}

impl GroupSync {
    /// Makes every write that completed before this call durable.
    ///
    /// A caller whose writes a failed sync covered fails too, whatever later
    /// syncs report: after a failed fsync the kernel may have dropped those
    /// pages and cleared the error, so a later success proves nothing for them
    /// (PostgreSQL's "fsyncgate"). Callers of writes made before an earlier
    /// successful sync may be failed with them: conservative, and only after a
    /// real error of the device.
    fn sync(&self, file: &File) -> io::Result<()> {
        let mine = self.written.fetch_add(1, Ordering::AcqRel) + 1;
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.failed >= mine {
            return Err(io::Error::other(
                "an earlier sync of these writes failed (they may be lost)",
            ));
        }
        if st.synced >= mine {
            return Ok(()); // a sync that began after our writes covered them
        }
        // Every ticket up to `upto` was taken after its writes completed, so
        // before this sync begins.
        let upto = self.written.load(Ordering::Acquire);
        match file.sync_data() {
            Ok(()) => {
                st.synced = upto;
                Ok(())
            }
            Err(e) => {
                st.failed = upto;
                Err(e)
            }
        }
    }
}

impl TierDevice {
    /// Opens the pool's flash file and journal (replaying it: the placement of
    /// the last run), and starts the emulated devices. `pool_dir`: the pool's
    /// directory of volume files, which the journal is bound to ([`tier_id`]).
    pub fn open(
        pool: &str,
        config: &TierConfig,
        pool_dir: &Path,
    ) -> Result<Arc<TierDevice>, String> {
        config.validate()?;
        let dir = &config.flash_dir;
        crate::store::create_dirs(dir)
            .map_err(|e| format!("tier.flash_dir {}: {e}", dir.display()))?;
        let journal_path = dir.join(format!("{pool}.weir-tier-map"));
        let id = tier_id(pool_dir, &journal_path)?;
        let spec = config.placement_spec();
        let flash = open_locked(&dir.join(format!("{pool}.weir-tier")))?;
        let size = spec.slots as u64 * spec.extent_bytes;
        if flash.metadata().map_err(|e| e.to_string())?.len() < size {
            flash
                .set_len(size)
                .map_err(|e| format!("tier flash file: {e}"))?;
        }
        let (journal, records) = Journal::open(&journal_path, &spec, id)?;
        let model = Placement::restore(spec, records)
            .map_err(|e| format!("tier journal of pool {pool:?}: {e}"))?;
        let emulate = |a: &Option<ArrayRef>| -> Result<Option<Arc<EmulatedDevice>>, String> {
            a.as_ref()
                .map(|a| EmulatedDevice::new(a, Instant::now()).map(Arc::new))
                .transpose()
        };
        let (flash_dev, disk_dev) = (
            emulate(&config.flash_device)?,
            emulate(&config.disk_device)?,
        );
        let drivers = [&flash_dev, &disk_dev]
            .into_iter()
            .flatten()
            .map(|d| d.start())
            .collect();
        let dev = Arc::new(TierDevice {
            pool: pool.to_string(),
            shift: config.extent.0.trailing_zeros(),
            config: config.clone(),
            flash,
            model: Mutex::new(model),
            moved: Condvar::new(),
            journal: Mutex::new(journal),
            volumes: Mutex::new(HashMap::new()),
            flash_dev,
            disk_dev,
            drivers: Mutex::new(drivers),
            qos: OnceLock::new(),
            stop: Arc::new(AtomicBool::new(false)),
            epoch: Instant::now(),
            pace: Mutex::new(Instant::now()),
            flash_sync: GroupSync::default(),
            migrated: AtomicU64::new(0),
            errors: AtomicU64::new(0),
        });
        // A fresh journal: the replayed map only (drops a torn tail).
        dev.with_model(|p, _| dev.compact(p));
        Ok(dev)
    }

    pub fn config(&self) -> &TierConfig {
        &self.config
    }

    fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    fn lock_model(&self) -> MutexGuard<'_, Placement> {
        self.model.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_journal(&self) -> MutexGuard<'_, Journal> {
        self.journal.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the placement, then appends the records it produced to the
    /// journal under the same lock (so the journal's order is the placement's).
    fn with_model<T>(&self, f: impl FnOnce(&mut Placement, u64) -> T) -> T {
        let mut p = self.lock_model();
        let t = f(&mut p, self.now());
        self.journal_records(&mut p);
        t
    }

    fn journal_records(&self, p: &mut Placement) {
        if !p.has_records() {
            return;
        }
        let records = p.take_records();
        let mut j = self.lock_journal();
        j.append(&records);
        if j.records > 4 * p.spec().slots as u64 + 1024 {
            drop(j);
            self.compact(p);
        }
    }

    fn compact(&self, p: &Placement) {
        let mut j = self.lock_journal();
        if let Err(e) = j.rewrite(&p.resident()) {
            self.errors.fetch_add(1, Ordering::Relaxed);
            tracing::error!("tier journal of pool {:?}: compaction: {e}", self.pool);
        }
    }

    /// The key of a volume's extent.
    fn key(&self, volume: u32, offset: u64) -> u64 {
        let index = offset >> self.shift;
        assert!(
            index < 1 << INDEX_BITS,
            "offset {offset} beyond the tier's keys"
        );
        (volume as u64) << INDEX_BITS | index
    }

    /// The inverse of [`Self::key`]: the extent's volume and first byte.
    fn place(&self, key: u64) -> (u32, u64) {
        let index = key & ((1 << INDEX_BITS) - 1);
        ((key >> INDEX_BITS) as u32, index << self.shift)
    }

    /// Wraps a volume's stack in the tier layer; `id`: the volume's store id.
    pub fn wrap(
        self: &Arc<Self>,
        id: u32,
        name: &str,
        below: Arc<dyn Backend>,
    ) -> Arc<dyn Backend> {
        assert!(VolumeId(id) != TIER_VOLUME);
        let reads = Arc::new(VolumeReads::default());
        self.volumes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                id,
                TierVolume {
                    name: name.to_string(),
                    below: Arc::downgrade(&below),
                    reads: reads.clone(),
                },
            );
        Arc::new(TierLayer {
            dev: self.clone(),
            volume: id,
            below,
            reads,
        })
    }

    /// A deleted volume: its extents leave flash (dirty data is discarded).
    pub fn drop_volume(&self, id: u32) {
        self.volumes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
        self.drop_extents(|v| v == id);
    }

    /// At start, with the catalog's volumes of this pool: the extents of any
    /// other volume leave flash (one deleted by a process killed between the
    /// catalog's write and [`TierDevice::drop_volume`]; volume ids are never
    /// reused, so they would only hold slots). Returns how many.
    pub fn keep_volumes(&self, live: &std::collections::HashSet<u32>) -> usize {
        self.drop_extents(|v| !live.contains(&v))
    }

    fn drop_extents(&self, gone: impl Fn(u32) -> bool) -> usize {
        let released = self.with_model(|p, _| p.drop_where(|k| gone((k >> INDEX_BITS) as u32)));
        let n = released.len();
        self.release(released);
        n
    }

    /// Syncs the journal (the `Unmap`s are durable), then frees the slots.
    fn release(&self, moves: Vec<Move>) {
        if moves.is_empty() {
            return;
        }
        if let Err(e) = self.sync_journal() {
            self.errors.fetch_add(1, Ordering::Relaxed);
            tracing::error!("tier journal of pool {:?}: {e}", self.pool);
            return; // the slots stay unusable rather than reused unsafely
        }
        self.with_model(|p, _| {
            for m in moves {
                if let Move::Release { slot } = m {
                    p.released(slot);
                }
            }
        });
        self.moved.notify_all();
    }

    pub fn snapshot(&self) -> TierSnapshot {
        let s = self.lock_model().stats();
        let e = self.config.extent.0;
        let mut volumes: Vec<_> = self
            .volumes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .map(|v| {
                let r = &v.reads;
                (
                    v.name.clone(),
                    r.flash.load(Ordering::Relaxed),
                    r.disk.load(Ordering::Relaxed),
                )
            })
            .collect();
        volumes.sort();
        TierSnapshot {
            pool: self.pool.clone(),
            capacity_bytes: self.config.placement_spec().slots as u64 * e,
            resident_bytes: s.resident * e,
            dirty_bytes: s.dirty * e,
            promotions: s.promotions,
            demotions: s.demotions,
            destages: s.destages,
            landings: s.landings,
            moves_cancelled: s.moves_cancelled,
            migrated_bytes: self.migrated.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            volumes,
        }
    }

    /// Performs `f` (the real I/O) while the tier's emulated device serves it.
    fn timed<T>(
        dev: &Option<Arc<EmulatedDevice>>,
        at: u64,
        len: usize,
        dir: IoDir,
        f: impl FnOnce() -> io::Result<T>,
    ) -> io::Result<T> {
        let done = dev.as_ref().map(|d| d.submit_blocking(at, len as u32, dir));
        let r = f();
        if let Some(d) = done {
            d.wait();
        }
        r
    }

    fn flash_at(&self, slot: u32, within: u64) -> u64 {
        ((slot as u64) << self.shift) + within
    }

    fn flash_read(&self, slot: u32, within: u64, buf: &mut [u8]) -> io::Result<()> {
        let at = self.flash_at(slot, within);
        Self::timed(&self.flash_dev, at, buf.len(), IoDir::Read, || {
            self.flash.read_exact_at(buf, at)
        })
    }

    fn flash_write(&self, slot: u32, within: u64, data: &[u8]) -> io::Result<()> {
        let at = self.flash_at(slot, within);
        Self::timed(&self.flash_dev, at, data.len(), IoDir::Write, || {
            self.flash.write_all_at(data, at)
        })
    }

    fn flash_zero(&self, slot: u32, within: u64, len: u64) -> io::Result<()> {
        let at = self.flash_at(slot, within);
        // SAFETY: fallocate on a descriptor this device owns.
        let r = unsafe {
            libc::fallocate(
                self.flash.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                at as libc::off_t,
                len as libc::off_t,
            )
        };
        if r == 0 {
            return Ok(());
        }
        let zeros = vec![0u8; len as usize];
        self.flash.write_all_at(&zeros, at)
    }

    fn disk<T>(
        &self,
        volume: u32,
        offset: u64,
        len: usize,
        dir: IoDir,
        f: impl FnOnce() -> io::Result<T>,
    ) -> io::Result<T> {
        let at = self
            .disk_dev
            .as_ref()
            .map_or(0, |d| d.volume_base(volume).wrapping_add(offset));
        Self::timed(&self.disk_dev, at, len, dir, f)
    }

    /// A host write's route for `key`, waiting while the extent is promoted.
    fn route_write(&self, key: u64, whole: bool) -> Route {
        let mut p = self.lock_model();
        loop {
            let r = p.write(self.now(), key, whole);
            if r != Route::Wait {
                self.journal_records(&mut p);
                return r;
            }
            p = self
                .moved
                .wait_timeout(p, Duration::from_millis(50))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Everything written before this call is durable: flash, then the pool
    /// file (`below`), then the journal.
    fn flush(&self, below: &dyn Backend) -> io::Result<()> {
        self.sync_flash()?;
        below.flush()?;
        self.sync_journal()
    }

    /// Syncs the journal; one whose append failed (a full flash directory) is
    /// first rewritten from the map, so FLUSH works again once there is room
    /// (it used to wait for the next compaction, ≈ 1,150 records away).
    fn sync_journal(&self) -> io::Result<()> {
        let failed = self.lock_journal().failed.is_some();
        if failed {
            let p = self.lock_model();
            self.compact(&p);
        }
        self.lock_journal().sync()
    }
}

fn open_locked(path: &Path) -> Result<File, String> {
    crate::flash_cache::open_exclusive(path).map_err(|e| format!("tier {e}"))
}

/// The migrators: `moves_in_flight` threads, each performing the placement's
/// moves one at a time through the pool's gate, paced together at
/// `migration_mbps`. They run until the device is dropped.
impl TierDevice {
    /// Starts the migrators with the pool's gate (once).
    pub fn start(self: &Arc<Self>, qos: Arc<dyn BackgroundQos>) {
        if self.qos.set(qos).is_err() {
            return;
        }
        // Completing a move at the gate may release (and start) clients' requests
        // on these threads, which spawn on the server's runtime.
        let runtime = tokio::runtime::Handle::try_current().ok();
        for i in 0..self.config.moves_in_flight {
            let weak = Arc::downgrade(self);
            let stop = self.stop.clone();
            let runtime = runtime.clone();
            std::thread::Builder::new()
                .name(format!("weir-tier-{}-{i}", self.pool))
                .spawn(move || {
                    let _in_runtime = runtime.as_ref().map(|r| r.enter());
                    while !stop.load(Ordering::Acquire) {
                        let Some(dev) = weak.upgrade() else { return };
                        dev.migrate_once();
                    }
                })
                .expect("spawning the tier's migrator");
        }
    }

    /// Waits for this move's turn under `migration_mbps` (shared by the
    /// migrators: moves start at most one extent per budget apart).
    fn pace(&self) {
        let bytes = self.config.extent.0 as f64;
        let budget = Duration::from_secs_f64(bytes / (self.config.migration_mbps * 1e6));
        let start = {
            let mut next = self.pace.lock().unwrap_or_else(|e| e.into_inner());
            let start = (*next).max(Instant::now());
            *next = start + budget;
            start
        };
        if let Some(wait) = start.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }

    /// Makes the flash file's completed writes durable (shared with
    /// concurrent callers).
    fn sync_flash(&self) -> io::Result<()> {
        self.flash_sync.sync(&self.flash)
    }

    fn migrate_once(&self) {
        let next = self.with_model(|p, now| p.next_move(now));
        let Some(m) = next else {
            let p = self.lock_model();
            let _ = self.moved.wait_timeout(p, Duration::from_millis(20));
            return;
        };
        if !matches!(m, Move::Release { .. }) {
            self.pace();
        }
        match m {
            Move::Release { .. } => return self.release(vec![m]),
            Move::Promote { key, slot, seq } => {
                let ok = self
                    .promote(key, slot)
                    .map_err(|e| self.failed("promotion", e));
                self.with_model(|p, _| p.promote_done(key, slot, seq, ok.is_ok()));
            }
            Move::Destage { key, slot, seq } => {
                let ok = self
                    .destage(key, slot)
                    .map_err(|e| self.failed("destage", e));
                self.with_model(|p, _| p.destage_done(key, seq, ok.is_ok()));
            }
        }
        self.moved.notify_all();
        self.migrated
            .fetch_add(self.config.extent.0, Ordering::Relaxed);
    }

    fn failed(&self, what: &str, e: io::Error) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        tracing::warn!("tier of pool {:?}: {what}: {e}", self.pool);
    }

    fn below(&self, volume: u32) -> io::Result<Arc<dyn Backend>> {
        let v = self.volumes.lock().unwrap_or_else(|e| e.into_inner());
        v.get(&volume)
            .and_then(|v| v.below.upgrade())
            .ok_or_else(|| io::Error::other(format!("volume {volume} is not open")))
    }

    /// Runs one I/O of a move through the gate: `f(offset within the extent, part)`.
    fn gated(
        &self,
        kind: IoKind,
        base: u64,
        buf_len: usize,
        f: &mut dyn FnMut(usize, usize) -> io::Result<()>,
    ) -> io::Result<()> {
        let mut io = |offset: u64, length: u32| f((offset - base) as usize, length as usize);
        match self.qos.get() {
            Some(q) => q.run(TIER_VOLUME, kind, base, buf_len as u32, &mut io),
            None => io(base, buf_len as u32),
        }
    }

    /// Disk → flash, then the flash file synced (before the `Map` record).
    fn promote(&self, key: u64, slot: u32) -> io::Result<()> {
        let (volume, base) = self.place(key);
        let below = self.below(volume)?;
        let mut buf = vec![0u8; self.config.extent.0 as usize];
        let len = buf.len();
        self.gated(IoKind::Read, base, len, &mut |at, n| {
            let part = &mut buf[at..at + n];
            let off = base + at as u64;
            self.disk(volume, off, n, IoDir::Read, || below.read(off, part))
        })?;
        self.gated(IoKind::Write, base, len, &mut |at, n| {
            self.flash_write(slot, at as u64, &buf[at..at + n])
        })?;
        self.sync_flash()
    }

    /// Flash → disk, then the pool file synced (before the `Clean` record).
    fn destage(&self, key: u64, slot: u32) -> io::Result<()> {
        let (volume, base) = self.place(key);
        let below = self.below(volume)?;
        let mut buf = vec![0u8; self.config.extent.0 as usize];
        let len = buf.len();
        self.gated(IoKind::Read, base, len, &mut |at, n| {
            self.flash_read(slot, at as u64, &mut buf[at..at + n])
        })?;
        self.gated(IoKind::Write, base, len, &mut |at, n| {
            let off = base + at as u64;
            let part = &buf[at..at + n];
            self.disk(volume, off, n, IoDir::Write, || below.write(off, part))
        })?;
        below.flush()
    }
}

impl Drop for TierDevice {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.drivers
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }
}

/// One volume's view of its pool's tier.
struct TierLayer {
    dev: Arc<TierDevice>,
    volume: u32,
    below: Arc<dyn Backend>,
    reads: Arc<VolumeReads>,
}

impl TierLayer {
    /// The extent pieces of `[offset, offset + len)`: (start, end, key).
    fn pieces(&self, offset: u64, len: u64) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
        let e = self.dev.config.extent.0;
        let end = offset + len;
        let mut at = offset;
        std::iter::from_fn(move || {
            if at >= end {
                return None;
            }
            let hi = ((at / e) + 1) * e;
            let piece = (at, hi.min(end), self.dev.key(self.volume, at));
            at = piece.1;
            Some(piece)
        })
    }

    fn within(&self, at: u64) -> u64 {
        at & (self.dev.config.extent.0 - 1)
    }

    fn read_piece(&self, lo: u64, key: u64, part: &mut [u8]) -> io::Result<()> {
        let route = self.dev.with_model(|p, now| p.read(now, key));
        let r = match route {
            Route::Flash { slot } => {
                self.reads.flash.fetch_add(1, Ordering::Relaxed);
                self.dev.flash_read(slot, self.within(lo), part)
            }
            _ => {
                self.reads.disk.fetch_add(1, Ordering::Relaxed);
                let len = part.len();
                self.dev.disk(self.volume, lo, len, IoDir::Read, || {
                    self.below.read(lo, part)
                })
            }
        };
        self.dev.with_model(|p, _| p.read_done(key, route));
        r
    }

    fn write_piece(&self, lo: u64, key: u64, data: &[u8]) -> io::Result<()> {
        let mut whole = data.len() as u64 == self.dev.config.extent.0;
        loop {
            let route = self.dev.route_write(key, whole);
            let r = match route {
                Route::Flash { slot } => self.dev.flash_write(slot, self.within(lo), data),
                Route::Disk => self
                    .dev
                    .disk(self.volume, lo, data.len(), IoDir::Write, || {
                        self.below.write(lo, data)
                    }),
                Route::Land { slot, seq } => {
                    let r = self
                        .dev
                        .flash_write(slot, 0, data)
                        .and_then(|_| self.dev.sync_flash());
                    if self
                        .dev
                        .with_model(|p, _| p.land_done(key, slot, seq, r.is_ok()))
                    {
                        return Ok(());
                    }
                    whole = false; // raced or failed: route it again, not landing
                    continue;
                }
                Route::Wait => unreachable!("route_write waits"),
            };
            self.dev.with_model(|p, _| p.write_done(key, route));
            return r;
        }
    }

    /// TRIM or WRITE_ZEROES, extent by extent: zeroes on flash, `disk` below.
    fn zero_range(
        &self,
        offset: u64,
        length: u64,
        timed: bool,
        disk: impl Fn(u64, u64) -> io::Result<()>,
    ) -> io::Result<()> {
        for (lo, hi, key) in self.pieces(offset, length) {
            let route = self.dev.route_write(key, false);
            let (dev, at) = match route {
                Route::Flash { slot } => (
                    &self.dev.flash_dev,
                    self.dev.flash_at(slot, self.within(lo)),
                ),
                _ => (&self.dev.disk_dev, lo),
            };
            // TRIM costs the emulated devices nothing (as `crate::device`).
            let dev = if timed { dev } else { &None };
            let at = match (route, dev) {
                (Route::Disk, Some(d)) => d.volume_base(self.volume).wrapping_add(at),
                _ => at,
            };
            let r = TierDevice::timed(dev, at, (hi - lo) as usize, IoDir::Write, || match route {
                Route::Flash { slot } => self.dev.flash_zero(slot, self.within(lo), hi - lo),
                _ => disk(lo, hi - lo),
            });
            self.dev.with_model(|p, _| p.write_done(key, route));
            r?;
        }
        Ok(())
    }
}

impl Backend for TierLayer {
    fn ownership(&self) -> crate::backend::Ownership {
        self.below.ownership()
    }
    fn confirm_ownership(&self) -> crate::backend::Ownership {
        self.below.confirm_ownership()
    }
    // No `start_async`, `*_nowait` or `cached_source`: every I/O must be routed.
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        for (lo, hi, key) in self.pieces(offset, buf.len() as u64) {
            let part = &mut buf[(lo - offset) as usize..(hi - offset) as usize];
            self.read_piece(lo, key, part)?;
        }
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        for (lo, hi, key) in self.pieces(offset, data.len() as u64) {
            self.write_piece(
                lo,
                key,
                &data[(lo - offset) as usize..(hi - offset) as usize],
            )?;
        }
        Ok(())
    }

    fn write_fua(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.write(offset, data)?;
        self.flush()
    }

    fn flush(&self) -> io::Result<()> {
        self.dev.flush(&*self.below)
    }

    fn trim(&self, offset: u64, length: u64) -> io::Result<()> {
        self.zero_range(offset, length, false, |lo, n| self.below.trim(lo, n))
    }

    fn write_zeroes(
        &self,
        offset: u64,
        length: u64,
        may_punch: bool,
        fast_only: bool,
    ) -> io::Result<()> {
        self.zero_range(offset, length, true, |lo, n| {
            self.below.write_zeroes(lo, n, may_punch, fast_only)
        })
    }

    /// Extents on flash are data (their pool-file copy may be stale); the rest
    /// as the layer below says.
    fn block_status(&self, offset: u64, length: u64) -> io::Result<Vec<Extent>> {
        let mut out: Vec<Extent> = Vec::new();
        for (lo, hi, key) in self.pieces(offset, length) {
            let on_flash = self.dev.lock_model().slot_of(key).is_some();
            let part = if on_flash {
                vec![Extent {
                    length: (hi - lo) as u32,
                    flags: 0,
                }]
            } else {
                self.below.block_status(lo, hi - lo)?
            };
            for x in part {
                match out.last_mut() {
                    Some(last) if last.flags == x.flags => last.length += x.length,
                    _ => out.push(x),
                }
            }
        }
        Ok(out)
    }

    fn cache(&self, offset: u64, length: u64) -> io::Result<()> {
        self.below.cache(offset, length)
    }
}

/// The identity binding a pool's flash tier to its volume files: a random
/// number kept in `<pool_dir>/.weir-tier-id` and in the journal's header. The
/// journal keys extents by volume id, so a flash directory must never be used
/// with another data directory (or one wiped and made again): its extents would
/// be served to the new volumes of the same ids. Refused, with the way out,
/// when the two disagree or one of them is missing while the other exists —
/// the flash may hold the only copy of acknowledged writes, so nothing is
/// dropped without the operator's word.
fn tier_id(pool_dir: &Path, journal: &Path) -> Result<u64, String> {
    let id_path = pool_dir.join(".weir-tier-id");
    let journal_id = match std::fs::read(journal) {
        Ok(b) if b.len() >= HEADER => Some(u64::from_le_bytes(b[24..32].try_into().unwrap())),
        Ok(_) => None,
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(format!("{}: {e}", journal.display())),
    };
    let pool_id = match std::fs::read_to_string(&id_path) {
        Ok(t) => Some(
            u64::from_str_radix(t.trim(), 16)
                .map_err(|_| format!("{}: not a tier id (16 hex digits)", id_path.display()))?,
        ),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(format!("{}: {e}", id_path.display())),
    };
    match (pool_id, journal_id) {
        (Some(p), Some(j)) if p == j => Ok(p),
        (Some(_), Some(_)) | (None, Some(_)) => Err(format!(
            "the flash tier journal {} belongs to another data directory (or to one \
             that was removed): its extents are not this pool's volumes. Point \
             tier.flash_dir at this pool's flash directory, or delete {} and the \
             {} flash file to start the tier empty",
            journal.display(),
            journal.display(),
            journal.with_extension("").display(),
        )),
        (Some(_), None) => Err(format!(
            "the pool's flash tier journal {} is missing (a new or wrong \
             tier.flash_dir?): writes that were only on the old flash would be lost. \
             Point tier.flash_dir at the old flash directory, or delete {} to start \
             the tier empty",
            journal.display(),
            id_path.display(),
        )),
        (None, None) => {
            crate::store::create_dirs(pool_dir)
                .map_err(|e| format!("{}: {e}", pool_dir.display()))?;
            // std's hasher keys come from the OS's randomness: a random id without
            // a dependency.
            use std::hash::{BuildHasher, Hasher};
            let id = std::collections::hash_map::RandomState::new()
                .build_hasher()
                .finish()
                | 1;
            replace_durably(&id_path, format!("{id:016x}\n").as_bytes())
                .map_err(|e| format!("{}: {e}", id_path.display()))?;
            Ok(id)
        }
    }
}

/// Replaces `path` by a file holding `bytes`, crash-safely: a temporary file
/// (0600) written and synced, renamed over it, the directory synced. Returns
/// the new file, open.
fn replace_durably(path: &Path, bytes: &[u8]) -> io::Result<File> {
    let tmp = path.with_extension("tmp");
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all_at(bytes, 0)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        File::open(dir)?.sync_all()?;
    }
    Ok(f)
}

/// The placement journal: a header, then fixed-size records with a checksum
/// (a torn tail after a crash is detected and dropped).
struct Journal {
    path: PathBuf,
    file: File,
    header: [u8; HEADER],
    /// Records in the file.
    records: u64,
    /// A failed append since the last sync: the next sync fails with it.
    failed: Option<String>,
}

const HEADER: usize = 32;
const RECORD: usize = 24;
const MAGIC: &[u8; 8] = b"WEIRTIR1";

fn checksum(bytes: &[u8]) -> u64 {
    // FNV-1a, 64-bit.
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

fn encode(r: &Record) -> [u8; RECORD] {
    let (kind, key, slot) = match *r {
        Record::Map {
            key,
            slot,
            dirty: false,
        } => (1u8, key, slot),
        Record::Map {
            key,
            slot,
            dirty: true,
        } => (2, key, slot),
        Record::Unmap { key, slot } => (3, key, slot),
        Record::Dirty { key } => (4, key, 0),
        Record::Clean { key } => (5, key, 0),
    };
    let mut b = [0u8; RECORD];
    b[0] = kind;
    b[4..8].copy_from_slice(&slot.to_le_bytes());
    b[8..16].copy_from_slice(&key.to_le_bytes());
    let sum = checksum(&b[..16]);
    b[16..].copy_from_slice(&sum.to_le_bytes());
    b
}

fn decode(b: &[u8]) -> Option<Record> {
    if u64::from_le_bytes(b[16..24].try_into().ok()?) != checksum(&b[..16]) {
        return None;
    }
    let slot = u32::from_le_bytes(b[4..8].try_into().ok()?);
    let key = u64::from_le_bytes(b[8..16].try_into().ok()?);
    Some(match b[0] {
        1 | 2 => Record::Map {
            key,
            slot,
            dirty: b[0] == 2,
        },
        3 => Record::Unmap { key, slot },
        4 => Record::Dirty { key },
        5 => Record::Clean { key },
        _ => return None,
    })
}

/// A journal with valid records after its first bad one: a torn tail after a
/// crash can look so (pages of the last unsynced appends reach the disk out of
/// order), and so can damage in the middle, which drops what the later records
/// say (dirty extents read from disk). The records stop at the bad one either
/// way; the journal is kept beside as `.damaged-<unix time>` (the compaction at
/// start would replace it) and the operator told, loudly.
fn keep_damaged(path: &Path, bytes: &[u8], good: usize) {
    let after = bytes[HEADER..]
        .chunks_exact(RECORD)
        .skip(good + 1)
        .filter(|r| decode(r).is_some())
        .count();
    if after == 0 {
        return;
    }
    let unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let copy = path.with_extension(format!("weir-tier-map.damaged-{unix}"));
    let kept = match std::fs::write(&copy, bytes) {
        Ok(()) => format!("kept as {}", copy.display()),
        Err(e) => format!("not kept ({}: {e})", copy.display()),
    };
    tracing::error!(
        "tier journal {}: record {} is damaged and {after} valid records follow it; the map \
         stops at it (a torn tail after a crash looks so too, but if the server stopped \
         cleanly, extents those records placed or marked dirty are read from the disk \
         tier: check the volumes). The journal is {kept}",
        path.display(),
        good + 1
    );
}

impl Journal {
    /// Opens (or creates) the journal; its records up to the first torn one.
    /// A journal written for another extent size or slot count is refused: its
    /// slots would not be where it says.
    fn open(path: &Path, spec: &PlacementSpec, id: u64) -> Result<(Journal, Vec<Record>), String> {
        let mut header = [0u8; HEADER];
        header[..8].copy_from_slice(MAGIC);
        header[8..16].copy_from_slice(&spec.extent_bytes.to_le_bytes());
        header[16..24].copy_from_slice(&(spec.slots as u64).to_le_bytes());
        header[24..32].copy_from_slice(&id.to_le_bytes());
        let file = open_locked(path)?;
        let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut records = Vec::new();
        if bytes.len() >= HEADER {
            if bytes[..8] != header[..8] {
                return Err(format!(
                    "{}: not a tier journal (its first bytes are damaged or another file is \
                     in its place): the flash file's map cannot be read; restore the journal, \
                     or move the flash directory's files away to start the tier empty (dirty \
                     extents on flash are then lost)",
                    path.display()
                ));
            }
            if bytes[..HEADER] != header {
                return Err(format!(
                    "{}: written for another tier.extent or tier.flash_size (the flash \
                     file may hold data not on disk: restore the settings it was written with)",
                    path.display()
                ));
            }
            records = bytes[HEADER..]
                .chunks_exact(RECORD)
                .map_while(decode)
                .collect();
            keep_damaged(path, &bytes, records.len());
        }
        let journal = Journal {
            path: path.to_path_buf(),
            file,
            header,
            records: records.len() as u64,
            failed: None,
        };
        Ok((journal, records))
    }

    fn append(&mut self, records: &[Record]) {
        let bytes: Vec<u8> = records.iter().flat_map(encode).collect();
        let at = HEADER as u64 + self.records * RECORD as u64;
        match self.file.write_all_at(&bytes, at) {
            Ok(()) => self.records += records.len() as u64,
            Err(e) => {
                // Once per failure (every append fails until a rewrite succeeds).
                if self.failed.is_none() {
                    tracing::error!(
                        "tier journal {}: {e} (FLUSH fails until the journal is rewritten, \
                         tried at each FLUSH)",
                        self.path.display()
                    );
                }
                self.failed.get_or_insert(e.to_string());
            }
        }
    }

    fn sync(&mut self) -> io::Result<()> {
        if let Some(e) = &self.failed {
            return Err(io::Error::other(format!("tier journal: {e}")));
        }
        self.file.sync_data()
    }

    /// Replaces the journal by the map `resident` (a new file renamed over it).
    fn rewrite(&mut self, resident: &[(u64, u32, bool)]) -> io::Result<()> {
        let mut bytes = self.header.to_vec();
        for &(key, slot, dirty) in resident {
            bytes.extend(encode(&Record::Map { key, slot, dirty }));
        }
        let f = replace_durably(&self.path, &bytes)?;
        // SAFETY: flock on a descriptor we own (the renamed file is the journal now).
        unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        self.file = f;
        self.records = resident.len() as u64;
        self.failed = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::FileBackend;

    const EXT: u64 = 64 << 10;

    struct Fixture {
        dir: PathBuf,
        config: TierConfig,
        bottom: Arc<dyn Backend>,
    }

    impl Fixture {
        fn new(name: &str, flash_extents: u64) -> Fixture {
            let dir = std::env::temp_dir().join(format!("weir-tier-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let f = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(dir.join("vol.img"))
                .unwrap();
            f.set_len(64 * EXT).unwrap();
            Fixture {
                config: TierConfig {
                    flash_dir: dir.join("flash"),
                    flash_size: ByteSize(flash_extents * EXT),
                    extent: ByteSize(EXT),
                    flash_device: None,
                    disk_device: None,
                    promote_heat: 1.5,
                    half_life_s: 60.0,
                    migration_mbps: 10_000.0,
                    moves_in_flight: 2,
                    dirty_max: None,
                },
                bottom: Arc::new(FileBackend::new(f)),
                dir,
            }
        }

        fn open(&self) -> (Arc<TierDevice>, Arc<dyn Backend>) {
            let dev = TierDevice::open("p", &self.config, &self.dir).unwrap();
            let layer = dev.wrap(1, "v", self.bottom.clone());
            (dev, layer)
        }
    }

    impl Drop for Fixture {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    fn pattern(seed: u8, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| seed.wrapping_add((i / 512) as u8))
            .collect()
    }

    fn read(b: &dyn Backend, offset: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        b.read(offset, &mut buf).unwrap();
        buf
    }

    /// Reads extent `e` until it is hot, then runs the migrator until idle.
    fn promote(dev: &TierDevice, layer: &dyn Backend, e: u64) {
        for _ in 0..4 {
            read(layer, e * EXT, 4096);
        }
        settle(dev);
        assert!(
            dev.lock_model().slot_of(dev.key(1, e * EXT)).is_some(),
            "extent {e} promoted"
        );
    }

    fn settle(dev: &TierDevice) {
        for _ in 0..64 {
            if !dev.lock_model().wants_move() {
                return;
            }
            dev.migrate_once();
        }
    }

    #[test]
    fn data_reads_back_through_promotion_write_destage_and_demotion() {
        let fx = Fixture::new("moves", 1);
        let (dev, layer) = fx.open();
        // Across an extent boundary, before any move.
        let a = pattern(1, 3 * 4096);
        layer.write(EXT - 4096, &a).unwrap();
        assert_eq!(read(&*layer, EXT - 4096, a.len()), a);
        promote(&dev, &*layer, 0);
        assert_eq!(read(&*layer, EXT - 4096, a.len()), a, "after the promotion");
        // A write to the resident extent goes to flash: the pool file is stale.
        let b = pattern(7, 4096);
        layer.write(8192, &b).unwrap();
        assert_eq!(read(&*layer, 8192, 4096), b);
        assert_ne!(
            read(&*fx.bottom, 8192, 4096),
            b,
            "written to flash, not disk"
        );
        assert_eq!(dev.snapshot().dirty_bytes, EXT);
        // A hotter extent takes the only slot: extent 0 is destaged, then demoted.
        for _ in 0..3 {
            promote_try(&dev, &*layer, 5);
        }
        assert!(
            dev.lock_model().slot_of(dev.key(1, 0)).is_none(),
            "extent 0 demoted"
        );
        assert_eq!(read(&*fx.bottom, 8192, 4096), b, "destaged before demotion");
        assert_eq!(read(&*layer, 8192, 4096), b);
        assert_eq!(read(&*layer, EXT - 4096, a.len()), a);
        let s = dev.snapshot();
        assert!(
            s.promotions >= 2 && s.demotions == 1 && s.destages == 1,
            "{s:?}"
        );
    }

    fn promote_try(dev: &TierDevice, layer: &dyn Backend, e: u64) {
        for _ in 0..8 {
            read(layer, e * EXT, 4096);
        }
        settle(dev);
    }

    #[test]
    fn trim_zeroes_and_block_status_on_both_tiers() {
        let fx = Fixture::new("zero", 4);
        let (dev, layer) = fx.open();
        layer.write(0, &pattern(3, 2 * EXT as usize)).unwrap();
        promote(&dev, &*layer, 0);
        layer
            .write_zeroes(4096, 2 * EXT - 8192, true, false)
            .unwrap();
        let all = read(&*layer, 0, 2 * EXT as usize);
        assert_eq!(&all[..4096], &pattern(3, 4096)[..]);
        assert!(all[4096..(2 * EXT - 4096) as usize].iter().all(|&b| b == 0));
        layer.trim(EXT, EXT).unwrap();
        // Resident extent 0 reads as data; the rest as the file says.
        let st = layer.block_status(0, 4 * EXT).unwrap();
        assert_eq!(st[0].flags, 0);
        assert!(st[0].length as u64 >= EXT);
        assert_eq!(st.iter().map(|x| x.length as u64).sum::<u64>(), 4 * EXT);
        layer.trim(0, EXT).unwrap();
        assert!(
            read(&*layer, 0, 4096).iter().all(|&b| b == 0)
                || read(&*layer, 0, 4096) == pattern(3, 4096)
        );
    }

    #[test]
    fn whole_extent_writes_land_on_flash() {
        let fx = Fixture::new("land", 2);
        let (dev, layer) = fx.open();
        let d = pattern(9, EXT as usize);
        layer.write(3 * EXT, &d).unwrap();
        assert!(dev.lock_model().slot_of(dev.key(1, 3 * EXT)).is_some());
        assert_eq!(dev.snapshot().landings, 1);
        assert_eq!(read(&*layer, 3 * EXT, EXT as usize), d);
    }

    #[test]
    fn placement_and_dirty_data_survive_a_restart() {
        let fx = Fixture::new("restart", 2);
        let b = pattern(5, 4096);
        {
            let (dev, layer) = fx.open();
            promote(&dev, &*layer, 2);
            layer.write(2 * EXT + 4096, &b).unwrap();
            layer.flush().unwrap();
        }
        let (dev, layer) = fx.open();
        let key = dev.key(1, 2 * EXT);
        assert!(
            dev.lock_model().slot_of(key).is_some(),
            "warm after restart"
        );
        assert!(dev.lock_model().is_dirty(key), "still dirty");
        assert_eq!(read(&*layer, 2 * EXT + 4096, 4096), b);
        assert_ne!(read(&*fx.bottom, 2 * EXT + 4096, 4096), b);
    }

    #[test]
    fn extents_of_volumes_gone_from_the_catalog_leave_flash_at_start() {
        let fx = Fixture::new("gone", 2);
        {
            let (dev, layer) = fx.open();
            promote(&dev, &*layer, 1);
            layer.write(EXT, &pattern(7, 4096)).unwrap();
            layer.flush().unwrap();
        }
        let (dev, _layer) = fx.open();
        let key = dev.key(1, EXT);
        assert_eq!(dev.keep_volumes(&[1].into()), 0, "volume 1 is live");
        assert!(dev.lock_model().slot_of(key).is_some());
        assert_eq!(dev.keep_volumes(&[2].into()), 1);
        assert_eq!(dev.lock_model().slot_of(key), None);
        assert_eq!(dev.lock_model().stats().resident, 0);
        // The slot is free again (its Unmap synced) and the journal says so.
        drop(dev);
        drop(_layer);
        let (dev, _layer) = fx.open();
        assert_eq!(dev.lock_model().slot_of(key), None, "durably unmapped");
        let free = dev.lock_model().resident();
        assert!(free.is_empty(), "{free:?}");
    }

    #[test]
    fn a_torn_journal_tail_is_dropped_and_another_geometry_refused() {
        let fx = Fixture::new("torn", 2);
        {
            let (dev, layer) = fx.open();
            promote(&dev, &*layer, 1);
        }
        let path = fx.config.flash_dir.join("p.weir-tier-map");
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.extend([1, 2, 3]);
        std::fs::write(&path, &bytes).unwrap();
        let (dev, layer) = fx.open();
        assert!(dev.lock_model().slot_of(dev.key(1, EXT)).is_some());
        drop((dev, layer));
        let mut other = fx.config.clone();
        other.flash_size = ByteSize(4 * EXT);
        let err = TierDevice::open("p", &other, &fx.dir).err().unwrap();
        assert!(
            err.contains("another tier.extent or tier.flash_size"),
            "{err}"
        );
        // A damaged magic is said as such, not as other settings (session 30).
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[0] ^= 0xFF;
        std::fs::write(&path, &bytes).unwrap();
        let err = TierDevice::open("p", &fx.config, &fx.dir).err().unwrap();
        assert!(err.contains("not a tier journal"), "{err}");
    }

    /// A damaged record with valid ones after it (not a torn tail's shape
    /// alone): the journal is kept beside as `.damaged-…` before the start's
    /// compaction replaces it (session 30: the evidence was gone).
    #[test]
    fn a_journal_damaged_in_the_middle_is_kept_beside() {
        let fx = Fixture::new("mid", 2);
        {
            let (dev, layer) = fx.open();
            promote(&dev, &*layer, 0);
            promote(&dev, &*layer, 1);
            layer.flush().unwrap();
        }
        let path = fx.config.flash_dir.join("p.weir-tier-map");
        let mut bytes = std::fs::read(&path).unwrap();
        assert!(bytes.len() >= HEADER + 2 * RECORD, "{} bytes", bytes.len());
        bytes[HEADER + 20] ^= 0xFF; // the first record's checksum
        std::fs::write(&path, &bytes).unwrap();
        let (_dev, _layer) = fx.open();
        let kept: Vec<_> = std::fs::read_dir(&fx.config.flash_dir)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().contains(".damaged-"))
            .collect();
        assert_eq!(kept.len(), 1, "{kept:?}");
        assert_eq!(std::fs::read(kept[0].path()).unwrap(), bytes);
    }

    /// A failed journal append (a full flash directory) no longer fails every
    /// FLUSH until a compaction ≈ 1,150 records away: the next FLUSH rewrites
    /// the journal from the map once there is room (session 30).
    #[test]
    fn a_failed_journal_append_heals_at_the_next_flush() {
        let fx = Fixture::new("heal", 2);
        let (dev, layer) = fx.open();
        promote(&dev, &*layer, 1);
        dev.lock_journal().failed = Some("No space left on device".into());
        layer.flush().expect("the FLUSH rewrites the journal");
        assert!(dev.lock_journal().failed.is_none());
        drop((dev, layer));
        let (dev, _layer) = fx.open();
        assert!(
            dev.lock_model().slot_of(dev.key(1, EXT)).is_some(),
            "map kept"
        );
    }

    #[test]
    fn a_flash_dir_serves_only_the_data_dir_it_was_made_with() {
        let fx = Fixture::new("bound", 2);
        let secret = pattern(7, EXT as usize);
        {
            let (dev, layer) = fx.open();
            layer.write(EXT, &secret).unwrap();
            promote(&dev, &*layer, 1);
            layer.flush().unwrap();
        }
        // The same flash dir under a new (wiped, made again) data directory:
        // volume 1 there must never read the old volume 1's extent.
        let fresh = fx.dir.join("fresh-pool");
        let err = TierDevice::open("p", &fx.config, &fresh).err().unwrap();
        assert!(err.contains("belongs to another data directory"), "{err}");
        assert!(!fresh.join(".weir-tier-id").exists());
        // The pool's own directory with its journal gone: refused too.
        let journal = fx.config.flash_dir.join("p.weir-tier-map");
        let kept = std::fs::read(&journal).unwrap();
        std::fs::remove_file(&journal).unwrap();
        let err = TierDevice::open("p", &fx.config, &fx.dir).err().unwrap();
        assert!(err.contains("is missing"), "{err}");
        // Put back, it opens with the extent on flash; the way out of the
        // first refusal (deleting the journal and flash file) starts empty.
        std::fs::write(&journal, &kept).unwrap();
        let (dev, layer) = fx.open();
        assert!(dev.lock_model().slot_of(dev.key(1, EXT)).is_some());
        assert_eq!(read(&*layer, EXT, EXT as usize), secret);
        drop((dev, layer));
        std::fs::remove_file(&journal).unwrap();
        std::fs::remove_file(fx.config.flash_dir.join("p.weir-tier")).unwrap();
        let dev = TierDevice::open("p", &fx.config, &fresh).unwrap();
        assert!(dev.lock_model().slot_of(dev.key(1, EXT)).is_none());
    }

    #[test]
    fn settings_are_refused_with_their_key() {
        let fx = Fixture::new("config", 2);
        let mut pool = crate::config::default_pools().remove(0);
        pool.tier = Some(fx.config.clone());
        assert!(crate::stack::validate_pool(&pool).is_ok());
        pool.device = Some(ArrayRef::Preset("ssd-raid5x8".into()));
        assert_eq!(crate::stack::validate_pool(&pool).unwrap_err().0, "device");
        pool.device = None;
        let mut bad = fx.config.clone();
        bad.extent = ByteSize(1000);
        pool.tier = Some(bad);
        let (key, msg) = crate::stack::validate_pool(&pool).unwrap_err();
        assert_eq!(key, "tier");
        assert!(msg.contains("tier.extent"), "{msg}");
        for moves in [0, MAX_MOVES_IN_FLIGHT + 1] {
            let mut bad = fx.config.clone();
            bad.moves_in_flight = moves;
            pool.tier = Some(bad);
            let (key, msg) = crate::stack::validate_pool(&pool).unwrap_err();
            assert_eq!(key, "tier");
            assert!(msg.contains("tier.moves_in_flight"), "{msg}");
        }
    }

    #[test]
    fn a_group_sync_covers_writes_completed_before_it() {
        let fx = Fixture::new("group-sync", 2);
        let f = File::create(fx.dir.join("g")).unwrap();
        let g = GroupSync::default();
        let synced = |g: &GroupSync| g.state.lock().unwrap().synced;
        g.sync(&f).unwrap();
        assert_eq!(synced(&g), 1);
        // Two callers whose writes completed: the second sync covers both.
        g.written.fetch_add(1, Ordering::AcqRel);
        g.sync(&f).unwrap();
        assert_eq!(synced(&g), 3);
        // Already covered: no new sync, nothing moves.
        g.state.lock().unwrap().synced = 10;
        g.sync(&f).unwrap();
        assert_eq!(synced(&g), 10);
        assert_eq!(g.written.load(Ordering::Acquire), 4);
        // A sync that fails (EINVAL: a pipe cannot be synced) fails every
        // caller it covered, even once a later sync succeeds.
        let (pipe, _w) = std::io::pipe().unwrap();
        let pipe = File::from(std::os::fd::OwnedFd::from(pipe));
        let g = GroupSync::default();
        g.written.fetch_add(2, Ordering::AcqRel); // two writers, not yet synced
        assert!(g.sync(&pipe).is_err());
        assert_eq!(g.state.lock().unwrap().failed, 3);
        g.sync(&f).unwrap(); // a later writer: its own sync succeeds
        g.written.store(1, Ordering::Release); // a late caller of the failed range
        assert!(g.sync(&f).is_err(), "covered by the failed sync");
    }
}
