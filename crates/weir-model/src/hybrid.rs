//! Hybrid flash + disk array (seed 000's ioControl: PCIe flash in front of a disk
//! RAID, "dynamic data placement").
//!
//! The address space is the disk tier's ([`Array`], any [`ArraySpec`]); the flash tier
//! (`flash_devices` PCIe flash cards, `flash_capacity_bytes` for placement) holds
//! copies of hot *extents* (`extent_bytes`, 1 MiB default). Flash and disk capacity
//! are sized separately.
//!
//! * **Heat**: every host request adds 1 to the heat of each extent it touches; heat
//!   decays exponentially with half-life `heat_half_life_ms`.
//! * **Promotion**: an extent not on flash whose heat reaches `promote_heat` is queued;
//!   the migrator copies it disk → flash (disk read of the extent, flash write). If
//!   the flash tier is full, the least recently used resident extent is demoted first,
//!   but only if it is colder than the candidate: a clean one is dropped, a dirty one
//!   is written back to disk first (flash read, disk write) and dropped once clean.
//! * **Migration bandwidth**: promotions, write-backs and destages share a budget of
//!   `migration_mbps` (an operation of `n` bytes holds the migrator for
//!   `n / migration_mbps`; at most 16 in flight), so migration cannot starve host
//!   I/O. Destages and promotions take turns, destages first while the write log is
//!   at least half full.
//! * **Reads**: served by flash if every extent they touch is resident, else by disk.
//! * **Writes land on flash**: a write whose extents are all resident is written to
//!   flash (the extent becomes dirty); otherwise it is appended to a flash write log
//!   (`write_log_bytes`) and acknowledged at flash latency, then destaged to disk by
//!   the migrator; when the log is full, the write goes to the disk tier directly.
//!
//! Which extents are on flash, heat, the promotion queue, demotion and write-back
//! decisions are [`crate::Placement`]'s (the state machine `weir serve`'s hybrid
//! tier runs); this component adds the devices, the write log and the migration
//! budget. A write to an extent being promoted goes to the write log (the model has
//! no data for it to race; the server's tier makes such a write wait).
//!
//! Approximations (timing model, no data): a read of a block still in the write log
//! is served by the tier its extent is in (disk) rather than the log; flash space of
//! the write log is not taken from the placement capacity.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::array::{Array, ArraySpec, ControllerRef, DriveRef, DriveSpec, PolicyOverride};
use crate::controller::{BatteryState, IoPolicy, ReadPolicy, WritePolicy};
use crate::error::{ModelError, check_between, check_positive};
use crate::hdd::HddSpec;
use crate::placement::{Move, Placement, PlacementSpec, Route};
use crate::raid::RaidSpec;
use crate::ssd::{Ssd, SsdSpec};
use crate::{Completion, Component, DeviceIo, IoDir, Nanos};

fn default_extent_bytes() -> u64 {
    1 << 20
}
fn default_promote_heat() -> f64 {
    3.0
}
fn default_half_life_ms() -> f64 {
    60_000.0
}
fn default_migration_mbps() -> f64 {
    200.0
}
fn default_write_log_bytes() -> u64 {
    4 << 30
}

/// A hybrid array description:
///
/// ```toml
/// disk = { controller = "pcie-gen2", drive = "sata-7200", raid = { level = 10, drives = 16, stripe_element_bytes = 65536 } }
/// flash_devices = 2
/// flash_capacity_bytes = 2_400_000_000_000
/// # optional: flash = { ...SsdSpec... }, extent_bytes, promote_heat,
/// # heat_half_life_ms, migration_mbps, write_log_bytes
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HybridSpec {
    /// The disk tier.
    pub disk: ArraySpec,
    /// One flash card (default ioDrive2).
    #[serde(default = "SsdSpec::iodrive2")]
    pub flash: SsdSpec,
    pub flash_devices: u32,
    /// Flash capacity used for data placement, bytes (≤ devices × card capacity).
    pub flash_capacity_bytes: u64,
    #[serde(default = "default_extent_bytes")]
    pub extent_bytes: u64,
    #[serde(default = "default_promote_heat")]
    pub promote_heat: f64,
    #[serde(default = "default_half_life_ms")]
    pub heat_half_life_ms: f64,
    #[serde(default = "default_migration_mbps")]
    pub migration_mbps: f64,
    #[serde(default = "default_write_log_bytes")]
    pub write_log_bytes: u64,
}

/// Names accepted by [`HybridSpec::preset`].
pub const HYBRID_PRESETS: &[&str] = &["iocontrol-n5-150"];

impl HybridSpec {
    /// `iocontrol-n5-150`: seed 000's Fusion ioControl n5-150 — 2.4 TB of ioMemory
    /// flash and 16 × Toshiba MG03SCA300 (3 TB, 7,200 rpm SAS-2, 64 MB buffer; 48 TB
    /// raw). Not in the seed, our assumptions: the flash is two ioDrive2-class cards
    /// of 1.2 TB (ioDrive2 timing), the disks are in RAID 10 with 64 KiB strips behind
    /// a PCIe Gen2-class controller with battery-backed write-back cache, the drives
    /// use the 7,200 rpm SATA mechanics preset with a 3 TB capacity.
    pub fn preset(name: &str) -> Result<Self, ModelError> {
        match name {
            "iocontrol-n5-150" => {
                let drive = HddSpec {
                    capacity_bytes: 3_000_000_000_000,
                    ..HddSpec::sata_7200()
                };
                let flash = SsdSpec {
                    capacity_bytes: 1_200_000_000_000,
                    ..SsdSpec::iodrive2()
                };
                Ok(Self {
                    disk: ArraySpec {
                        controller: ControllerRef::Preset("pcie-gen2".into()),
                        raid: RaidSpec::new(10, 16, 64 << 10),
                        drive: DriveRef::Custom(DriveSpec::Hdd(drive)),
                        policy: PolicyOverride {
                            write_policy: Some(WritePolicy::WriteBack),
                            read_policy: Some(ReadPolicy::NoReadAhead),
                            io_policy: Some(IoPolicy::Cached),
                            battery: Some(BatteryState::Good),
                            disk_cache: Some(false),
                        },
                        clone_cache: None,
                    },
                    flash,
                    flash_devices: 2,
                    flash_capacity_bytes: 2_400_000_000_000,
                    extent_bytes: default_extent_bytes(),
                    promote_heat: default_promote_heat(),
                    heat_half_life_ms: default_half_life_ms(),
                    migration_mbps: default_migration_mbps(),
                    write_log_bytes: default_write_log_bytes(),
                })
            }
            _ => Err(ModelError::UnknownPreset {
                kind: "hybrid array",
                name: name.to_string(),
                known: HYBRID_PRESETS.join(", "),
            }),
        }
    }

    pub fn validate(&self) -> Result<(), ModelError> {
        const W: &str = "hybrid array";
        let bad = |field, value: String, reason| {
            Err(ModelError::InvalidField {
                what: W,
                field,
                value,
                reason,
            })
        };
        self.flash.validate()?;
        if self.flash_devices == 0 || self.flash_devices > 64 {
            return bad(
                "flash_devices",
                self.flash_devices.to_string(),
                "must be in 1..=64",
            );
        }
        if !self.extent_bytes.is_power_of_two() || !(4096..=(1 << 30)).contains(&self.extent_bytes)
        {
            return bad(
                "extent_bytes",
                self.extent_bytes.to_string(),
                "must be a power of two in 4096..=2^30",
            );
        }
        let flash_total = self
            .flash
            .capacity_bytes
            .saturating_mul(self.flash_devices as u64);
        if self.flash_capacity_bytes > flash_total {
            return bad(
                "flash_capacity_bytes",
                self.flash_capacity_bytes.to_string(),
                "exceeds flash_devices × flash.capacity_bytes",
            );
        }
        if self.flash_capacity_bytes / self.extent_bytes >= u32::MAX as u64 {
            return bad(
                "flash_capacity_bytes",
                self.flash_capacity_bytes.to_string(),
                "too many extents (at most 2^32 - 2)",
            );
        }
        check_positive(W, "promote_heat", self.promote_heat)?;
        let ms = "must be 1e-3-1e9 ms";
        check_between(
            W,
            "heat_half_life_ms",
            self.heat_half_life_ms,
            (1e-3, 1e9),
            ms,
        )?;
        let mbps = "must be 1e-3-1e9 MB/s";
        check_between(W, "migration_mbps", self.migration_mbps, (1e-3, 1e9), mbps)?;
        Ok(())
    }
}

/// Counters of a hybrid array.
#[derive(Copy, Clone, Debug, Default, PartialEq, Serialize)]
pub struct HybridStats {
    pub host_reads: u64,
    pub host_writes: u64,
    pub host_read_bytes: u64,
    pub host_write_bytes: u64,
    /// Host reads served by the flash tier / the disk tier.
    pub flash_reads: u64,
    pub disk_reads: u64,
    /// Host writes to resident extents / to the write log / to the disk tier.
    pub flash_writes: u64,
    pub log_writes: u64,
    pub disk_writes: u64,
    /// Sums of host read latency by tier (means: see the methods).
    pub flash_read_latency_ns: u64,
    pub disk_read_latency_ns: u64,
    pub promotions: u64,
    pub demotions: u64,
    /// Dirty extents written back to disk before demotion.
    pub write_backs: u64,
    pub destaged_bytes: u64,
    /// Bytes moved by the migrator (promotions + write-backs + destages).
    pub migrated_bytes: u64,
    pub resident_extents: u64,
}

impl HybridStats {
    /// Share of host reads served by flash.
    pub fn flash_read_ratio(&self) -> f64 {
        let n = self.flash_reads + self.disk_reads;
        if n == 0 {
            0.0
        } else {
            self.flash_reads as f64 / n as f64
        }
    }
    pub fn mean_flash_read_latency_ms(&self) -> f64 {
        self.flash_read_latency_ns as f64 / self.flash_reads.max(1) as f64 / 1e6
    }
    pub fn mean_disk_read_latency_ms(&self) -> f64 {
        self.disk_read_latency_ns as f64 / self.disk_reads.max(1) as f64 / 1e6
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OpKind {
    HostFlashRead,
    HostDiskRead,
    HostFlashWrite,
    HostLogWrite,
    HostDiskWrite,
    /// Disk read of the extent, then flash write.
    Promote {
        extent: u64,
        slot: u32,
        seq: u32,
    },
    /// Flash read of the extent, then disk write.
    WriteBack {
        extent: u64,
        seq: u32,
    },
    Destage,
}

#[derive(Clone, Copy, Debug)]
struct Op {
    kind: OpKind,
    token: u64,
    start_ns: Nanos,
    /// Phase: 0 first device op, 1 second.
    phase: u8,
    bytes: u64,
}

/// Flash tier + disk tier with dynamic data placement, one [`Component`].
#[derive(Clone, Debug)]
pub struct HybridArray {
    spec: HybridSpec,
    disk: Array,
    flash: Vec<Ssd>,
    extent_shift: u32,
    /// Which extents are on flash, and what to move next (shared with the
    /// server's tier layer).
    placement: Placement,
    destage_queue: VecDeque<(u64, u32)>,
    log_bytes: u64,
    migrator_free_ns: Nanos,
    migrations_in_flight: u32,
    destage_turn: bool,
    /// Next append position of the write log on each card.
    log_cursor: Vec<u64>,
    log_turn: u64,
    ns_per_migrated_byte: f64,
    ops: Vec<Op>,
    free_ops: Vec<u32>,
    scratch: Vec<Completion>,
    stats: HybridStats,
}

/// Migrations in flight at most (the bandwidth budget is the real bound).
const MAX_MIGRATIONS: u32 = 16;

impl HybridArray {
    pub fn new(spec: &HybridSpec, seed: u64) -> Result<Self, ModelError> {
        spec.validate()?;
        let disk = Array::new(&spec.disk, seed)?;
        let mut flash = Vec::with_capacity(spec.flash_devices as usize);
        for _ in 0..spec.flash_devices {
            flash.push(Ssd::new(&spec.flash)?);
        }
        Ok(Self {
            extent_shift: spec.extent_bytes.trailing_zeros(),
            placement: Placement::new(Self::placement_spec(spec)),
            destage_queue: VecDeque::new(),
            log_bytes: 0,
            migrator_free_ns: 0,
            migrations_in_flight: 0,
            destage_turn: false,
            log_cursor: vec![0; spec.flash_devices as usize],
            log_turn: 0,
            ns_per_migrated_byte: 1e3 / spec.migration_mbps,
            ops: Vec::new(),
            free_ops: Vec::new(),
            scratch: Vec::new(),
            stats: HybridStats::default(),
            disk,
            flash,
            spec: spec.clone(),
        })
    }

    /// The placement's parameters: promotion and demotion as the spec says;
    /// dirty extents are written back only to make room (the write log has its
    /// own destage); the promotion queue is practically unbounded.
    fn placement_spec(spec: &HybridSpec) -> PlacementSpec {
        PlacementSpec {
            slots: (spec.flash_capacity_bytes / spec.extent_bytes) as u32,
            extent_bytes: spec.extent_bytes,
            promote_heat: spec.promote_heat,
            half_life_ns: spec.heat_half_life_ms * 1e6,
            max_queue: 1 << 20,
            dirty_limit: u32::MAX,
        }
    }

    pub fn from_preset(name: &str, seed: u64) -> Result<Self, ModelError> {
        Self::new(&HybridSpec::preset(name)?, seed)
    }

    pub fn spec(&self) -> &HybridSpec {
        &self.spec
    }

    /// Usable capacity (the disk tier's); offsets wrap modulo this.
    pub fn capacity_bytes(&self) -> u64 {
        self.disk.capacity_bytes()
    }

    /// The disk tier (its own counters, drive statistics).
    pub fn disk(&self) -> &Array {
        &self.disk
    }

    pub fn stats(&self) -> HybridStats {
        let p = self.placement.stats();
        HybridStats {
            resident_extents: p.resident,
            promotions: p.promotions,
            demotions: p.demotions,
            write_backs: p.destages,
            ..self.stats
        }
    }

    /// Whether the extent holding `offset_bytes` is on flash.
    pub fn is_on_flash(&self, offset_bytes: u64) -> bool {
        let e = (offset_bytes % self.capacity_bytes()) >> self.extent_shift;
        self.placement.slot_of(e).is_some()
    }

    /// Bytes in the flash write log not yet destaged.
    pub fn write_log_bytes(&self) -> u64 {
        self.log_bytes
    }

    fn alloc_op(&mut self, kind: OpKind, token: u64, now: Nanos, bytes: u64) -> u32 {
        let op = Op {
            kind,
            token,
            start_ns: now,
            phase: 0,
            bytes,
        };
        match self.free_ops.pop() {
            Some(s) => {
                self.ops[s as usize] = op;
                s
            }
            None => {
                self.ops.push(op);
                (self.ops.len() - 1) as u32
            }
        }
    }

    /// Flash device and device offset of `offset` within slot `slot`.
    fn flash_loc(&self, slot: u32, within: u64) -> (usize, u64) {
        let n = self.flash.len() as u64;
        let dev = (slot as u64 % n) as usize;
        (dev, (slot as u64 / n) * self.spec.extent_bytes + within)
    }

    fn flash_submit(
        &mut self,
        dev: usize,
        now: Nanos,
        offset: u64,
        size: u32,
        dir: IoDir,
        op: u32,
    ) {
        self.flash[dev].submit(
            now,
            DeviceIo {
                offset_bytes: offset,
                size_bytes: size,
                dir,
            },
            op as u64,
        );
    }

    fn disk_submit(&mut self, now: Nanos, offset: u64, size: u32, dir: IoDir, op: u32) {
        self.disk.submit(
            now,
            DeviceIo {
                offset_bytes: offset,
                size_bytes: size,
                dir,
            },
            op as u64,
        );
    }

    /// Starts migrations while the budget allows.
    fn kick_migrator(&mut self, now: Nanos) {
        while self.migrations_in_flight < MAX_MIGRATIONS && now >= self.migrator_free_ns {
            if !self.start_one_migration(now) {
                break;
            }
        }
    }

    /// Next time the migrator could start something (for `next_event_ns`).
    fn migrator_wakeup(&self) -> Option<Nanos> {
        let work = !self.destage_queue.is_empty() || self.placement.wants_move();
        (work && self.migrations_in_flight < MAX_MIGRATIONS).then_some(self.migrator_free_ns)
    }

    fn charge_migrator(&mut self, now: Nanos, bytes: u64) {
        self.migrator_free_ns =
            now.max(self.migrator_free_ns) + (bytes as f64 * self.ns_per_migrated_byte) as Nanos;
        self.migrations_in_flight += 1;
        self.stats.migrated_bytes += bytes;
    }

    /// Destages and promotions take turns; destaging goes first while the write log
    /// is at least half full (it bounds write acceptance).
    fn start_one_migration(&mut self, now: Nanos) -> bool {
        self.destage_turn = !self.destage_turn;
        let log_pressure = self.log_bytes * 2 >= self.spec.write_log_bytes;
        let destage_first = log_pressure || self.destage_turn;
        if destage_first && self.start_destage(now) {
            return true;
        }
        if self.start_promotion(now) {
            return true;
        }
        !destage_first && self.start_destage(now)
    }

    fn start_destage(&mut self, now: Nanos) -> bool {
        let Some((off, size)) = self.destage_queue.pop_front() else {
            return false;
        };
        let op = self.alloc_op(OpKind::Destage, 0, now, size as u64);
        self.charge_migrator(now, size as u64);
        self.disk_submit(now, off, size, IoDir::Write, op);
        true
    }

    /// Starts the placement's next move (a demoted clean extent's slot is free
    /// at once: the model keeps no records to make durable).
    fn start_promotion(&mut self, now: Nanos) -> bool {
        loop {
            let bytes = self.spec.extent_bytes;
            match self.placement.next_move(now) {
                None => return false,
                Some(Move::Release { slot }) => self.placement.released(slot),
                Some(Move::Promote { key, slot, seq }) => {
                    let kind = OpKind::Promote {
                        extent: key,
                        slot,
                        seq,
                    };
                    let op = self.alloc_op(kind, 0, now, bytes);
                    self.charge_migrator(now, bytes);
                    let off = key << self.extent_shift;
                    self.disk_submit(now, off, bytes as u32, IoDir::Read, op);
                    return true;
                }
                Some(Move::Destage { key, slot, seq }) => {
                    let kind = OpKind::WriteBack { extent: key, seq };
                    let op = self.alloc_op(kind, 0, now, bytes);
                    self.charge_migrator(now, bytes);
                    let (dev, off) = self.flash_loc(slot, 0);
                    self.flash_submit(dev, now, off, bytes as u32, IoDir::Read, op);
                    return true;
                }
            }
        }
    }

    /// Routes a host I/O of extents `e0..=e1` through the placement (heat,
    /// promotion queue, dirty marks): `Some(slot)` when it is one extent on flash.
    /// The model times I/O but keeps no data, so each extent's I/O is reported
    /// done at once (no move waits for it).
    fn route(&mut self, now: Nanos, dir: IoDir, e0: u64, e1: u64) -> Option<u32> {
        let mut slot = None;
        for e in e0..=e1 {
            let r = match dir {
                IoDir::Read => self.placement.read(now, e),
                IoDir::Write => self.placement.write(now, e, false),
            };
            slot = match r {
                Route::Flash { slot } => Some(slot),
                _ => None,
            };
            match (dir, r) {
                (IoDir::Read, _) => self.placement.read_done(e, r),
                // Timing only: a write to an extent being promoted goes to the
                // write log (no data to race the copy).
                (IoDir::Write, Route::Wait) => {}
                (IoDir::Write, _) => self.placement.write_done(e, r),
            }
        }
        slot.filter(|_| e0 == e1)
    }

    fn host_done(&mut self, slot: u32, t: Nanos, done: &mut Vec<Completion>) {
        let op = self.ops[slot as usize];
        match op.kind {
            OpKind::HostFlashRead => self.stats.flash_read_latency_ns += t - op.start_ns,
            OpKind::HostDiskRead => self.stats.disk_read_latency_ns += t - op.start_ns,
            _ => {}
        }
        done.push(Completion {
            token: op.token,
            at_ns: t,
        });
        self.free_ops.push(slot);
    }

    fn on_device_done(&mut self, slot: u32, t: Nanos, done: &mut Vec<Completion>) {
        let op = self.ops[slot as usize];
        match op.kind {
            OpKind::HostFlashRead
            | OpKind::HostDiskRead
            | OpKind::HostFlashWrite
            | OpKind::HostDiskWrite
            | OpKind::HostLogWrite => self.host_done(slot, t, done),
            OpKind::Destage => {
                self.log_bytes -= op.bytes;
                self.stats.destaged_bytes += op.bytes;
                self.migrations_in_flight -= 1;
                self.free_ops.push(slot);
            }
            OpKind::Promote {
                extent,
                slot: fslot,
                seq,
            } => {
                if op.phase == 0 {
                    self.ops[slot as usize].phase = 1;
                    let (dev, off) = self.flash_loc(fslot, 0);
                    self.flash_submit(dev, t, off, op.bytes as u32, IoDir::Write, slot);
                    return;
                }
                self.placement.promote_done(extent, fslot, seq, true);
                self.migrations_in_flight -= 1;
                self.free_ops.push(slot);
            }
            OpKind::WriteBack { extent, seq } => {
                if op.phase == 0 {
                    self.ops[slot as usize].phase = 1;
                    self.disk_submit(
                        t,
                        extent << self.extent_shift,
                        op.bytes as u32,
                        IoDir::Write,
                        slot,
                    );
                    return;
                }
                self.placement.destage_done(extent, seq, true);
                self.migrations_in_flight -= 1;
                self.free_ops.push(slot);
            }
        }
    }
}

impl Component for HybridArray {
    fn submit(&mut self, now: Nanos, io: DeviceIo, token: u64) {
        let cap = self.capacity_bytes();
        let offset = io.offset_bytes % cap;
        let end = offset + io.size_bytes.max(1) as u64;
        let (e0, e1) = (offset >> self.extent_shift, (end - 1) >> self.extent_shift);
        let on_flash = self.route(now, io.dir, e0, e1);
        let bytes = io.size_bytes as u64;
        match io.dir {
            IoDir::Read => {
                self.stats.host_reads += 1;
                self.stats.host_read_bytes += bytes;
                if let Some(s) = on_flash {
                    self.stats.flash_reads += 1;
                    let (dev, off) = self.flash_loc(s, offset - (e0 << self.extent_shift));
                    let op = self.alloc_op(OpKind::HostFlashRead, token, now, bytes);
                    self.flash_submit(dev, now, off, io.size_bytes, IoDir::Read, op);
                } else {
                    self.stats.disk_reads += 1;
                    let op = self.alloc_op(OpKind::HostDiskRead, token, now, bytes);
                    self.disk_submit(now, offset, io.size_bytes, IoDir::Read, op);
                }
            }
            IoDir::Write => {
                self.stats.host_writes += 1;
                self.stats.host_write_bytes += bytes;
                if let Some(s) = on_flash {
                    self.stats.flash_writes += 1;
                    let (dev, off) = self.flash_loc(s, offset - (e0 << self.extent_shift));
                    let op = self.alloc_op(OpKind::HostFlashWrite, token, now, bytes);
                    self.flash_submit(dev, now, off, io.size_bytes, IoDir::Write, op);
                } else if self.log_bytes + bytes <= self.spec.write_log_bytes {
                    self.stats.log_writes += 1;
                    self.log_bytes += bytes;
                    self.destage_queue.push_back((offset, io.size_bytes));
                    // The log is appended sequentially on each card (cards taken in
                    // turn), in a region at the end of the card.
                    let n = self.flash.len() as u64;
                    let dev = (self.log_turn % n) as usize;
                    self.log_turn += 1;
                    let per_dev_log = (self.spec.write_log_bytes / n).max(1 << 20);
                    let base = self.spec.flash.capacity_bytes.saturating_sub(per_dev_log);
                    if self.log_cursor[dev] + bytes > per_dev_log {
                        self.log_cursor[dev] = 0;
                    }
                    let log_off = base + self.log_cursor[dev];
                    self.log_cursor[dev] += bytes;
                    let op = self.alloc_op(OpKind::HostLogWrite, token, now, bytes);
                    self.flash_submit(dev, now, log_off, io.size_bytes, IoDir::Write, op);
                } else {
                    self.stats.disk_writes += 1;
                    let op = self.alloc_op(OpKind::HostDiskWrite, token, now, bytes);
                    self.disk_submit(now, offset, io.size_bytes, IoDir::Write, op);
                }
            }
        }
        self.kick_migrator(now);
    }

    fn next_event_ns(&self) -> Option<Nanos> {
        let mut t = self.disk.next_event_ns();
        for f in &self.flash {
            if let Some(x) = f.next_event_ns() {
                t = Some(t.map_or(x, |y| y.min(x)));
            }
        }
        if let Some(x) = self.migrator_wakeup() {
            t = Some(t.map_or(x, |y| y.min(x)));
        }
        t
    }

    fn advance(&mut self, now: Nanos, done: &mut Vec<Completion>) {
        loop {
            // Earliest source: 0 = disk, 1.. = flash card, usize::MAX = migrator.
            let mut best: Option<(Nanos, usize)> = self.disk.next_event_ns().map(|t| (t, 0));
            for (i, f) in self.flash.iter().enumerate() {
                if let Some(t) = f.next_event_ns()
                    && best.is_none_or(|(b, _)| t < b)
                {
                    best = Some((t, i + 1));
                }
            }
            if let Some(t) = self.migrator_wakeup()
                && best.is_none_or(|(b, _)| t < b)
            {
                best = Some((t, usize::MAX));
            }
            let Some((t, src)) = best else { break };
            if t > now {
                break;
            }
            let mut scratch = std::mem::take(&mut self.scratch);
            match src {
                usize::MAX => self.kick_migrator(t),
                0 => {
                    self.disk.advance(t, &mut scratch);
                    for c in scratch.drain(..) {
                        self.on_device_done(c.token as u32, c.at_ns, done);
                    }
                    self.kick_migrator(t);
                }
                i => {
                    self.flash[i - 1].advance(t, &mut scratch);
                    for c in scratch.drain(..) {
                        self.on_device_done(c.token as u32, c.at_ns, done);
                    }
                    self.kick_migrator(t);
                }
            }
            self.scratch = scratch;
        }
    }

    fn busy_ns(&self) -> Nanos {
        self.disk.busy_ns()
    }
}
