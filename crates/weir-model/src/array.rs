//! A storage array: controller (processor, host bandwidth, cache) + RAID + drives,
//! driven as one [`Component`].
//!
//! Request path. A host request first takes the controller processor
//! (`1 / max_iops` each, FIFO); a write's payload then crosses the host link
//! (`size / bandwidth`, FIFO, host→controller direction). Then:
//! * read: a hit in the controller cache (all 4 KiB chunks present) is returned at
//!   once; a miss is planned by the RAID layout and read from the drives; the payload
//!   crosses the host link controller→host (the other direction of the full-duplex
//!   link). With read-ahead, a detected sequential stream triggers a background
//!   prefetch of the next window into cache; reads that hit data still in flight wait
//!   for it.
//! * write, write-through: RAID plan (reads, then writes) on the drives, then ack.
//! * write, write-back: acknowledged once in cache if the dirty space allows it,
//!   otherwise it waits for destaging to free space (so sustained throughput is
//!   bounded by the drives). Dirty data is tracked per RAID row; a background
//!   destager writes full rows first (full-stripe writes: parity without reads) and
//!   other rows once they have aged `DESTAGE_DELAY_NS` or dirty space is above the
//!   high watermark, keeping up to `2 × drives` destage operations in flight.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::clone_cache::{CloneCacheSpec, CloneCacheStats, CloneId, CloneLayer, ImageId};
use crate::controller::{ControllerSpec, IoPolicy, ReadPolicy};
use crate::error::ModelError;
use crate::hdd::{DriveStats, Hdd, HddSpec};
use crate::raid::{DriveIo, RaidLayout, RaidPlan, RaidSpec};
use crate::ssd::{Ssd, SsdSpec};
use crate::{Completion, Component, DeviceIo, IoDir, Nanos, round_ns};

/// A member drive description.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum DriveSpec {
    Hdd(HddSpec),
    Ssd(SsdSpec),
}

impl DriveSpec {
    /// Named drive presets: `sas-15k` (Savvio 15K.3), `sas-15k-lff` (Cheetah 15K.7),
    /// `sas-10k` (Savvio 10K.5), `sata-7200`, `sata-ssd` (Intel 710), `pcie-flash`
    /// (ioDrive2), `ramsan-400` (a whole RAM SSD array, as one device).
    pub fn preset(name: &str) -> Result<Self, ModelError> {
        Ok(match name {
            "sas-15k" => Self::Hdd(HddSpec::savvio_15k3()),
            "sas-15k-lff" => Self::Hdd(HddSpec::cheetah_15k7()),
            "sas-10k" => Self::Hdd(HddSpec::savvio_10k5()),
            "sata-7200" => Self::Hdd(HddSpec::sata_7200()),
            "sata-ssd" => Self::Ssd(SsdSpec::intel_710()),
            "pcie-flash" => Self::Ssd(SsdSpec::iodrive2()),
            "ramsan-400" => Self::Ssd(SsdSpec::ramsan_400()),
            _ => {
                return Err(ModelError::UnknownPreset {
                    kind: "drive",
                    name: name.to_string(),
                    known:
                        "sas-15k, sas-15k-lff, sas-10k, sata-7200, sata-ssd, pcie-flash, ramsan-400"
                            .into(),
                });
            }
        })
    }

    pub fn capacity_bytes(&self) -> u64 {
        match self {
            Self::Hdd(h) => h.capacity_bytes,
            Self::Ssd(s) => s.capacity_bytes,
        }
    }

    pub fn validate(&self) -> Result<(), ModelError> {
        match self {
            Self::Hdd(h) => h.validate(),
            Self::Ssd(s) => s.validate(),
        }
    }
}

impl DriveRef {
    /// The drive this names (a preset) or describes (a table), not yet validated.
    pub fn spec(&self) -> Result<DriveSpec, ModelError> {
        match self {
            DriveRef::Preset(n) => DriveSpec::preset(n),
            DriveRef::Custom(d) => Ok(d.clone()),
        }
    }
}

/// A drive given by preset name or as a table (`kind = "hdd"|"ssd"` plus fields).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum DriveRef {
    Preset(String),
    Custom(DriveSpec),
}

/// A controller given by preset name (`pcie-gen2`, `pcie-gen3`) or as a table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ControllerRef {
    Preset(String),
    Custom(ControllerSpec),
}

/// Cache-policy overrides applied on top of the controller (and drive) description,
/// as an administrator changes them in the controller UI.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyOverride {
    pub write_policy: Option<crate::controller::WritePolicy>,
    pub read_policy: Option<ReadPolicy>,
    pub io_policy: Option<IoPolicy>,
    pub battery: Option<crate::controller::BatteryState>,
    /// Drive write cache ("disk cache policy"); HDDs only.
    pub disk_cache: Option<bool>,
}

impl PolicyOverride {
    fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// A whole array, deserializable from TOML:
///
/// ```toml
/// controller = "pcie-gen2"
/// drive = "sas-15k"
/// raid = { level = 5, drives = 24, stripe_element_bytes = 65536 }
/// policy = { write_policy = "write-back", read_policy = "no-read-ahead" }
/// clone_cache = { size_mib = 4096, aware = true }   # optional
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArraySpec {
    pub controller: ControllerRef,
    pub raid: RaidSpec,
    pub drive: DriveRef,
    #[serde(default, skip_serializing_if = "PolicyOverride::is_empty")]
    pub policy: PolicyOverride,
    /// Clone-aware (or unaware) read cache replacing the controller read cache; the
    /// images and clones are registered with [`Array::add_image`] / [`Array::add_clone`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clone_cache: Option<CloneCacheSpec>,
}

/// A whole array given by preset name ([`ARRAY_PRESETS`]) or as an [`ArraySpec`]
/// table, e.g. a server pool's emulated `device`:
///
/// ```toml
/// device = "15k-sas-raid5x24"
/// device = { controller = "pcie-gen2", drive = "sata-7200", raid = { level = 10, drives = 16, stripe_element_bytes = 65536 } }
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ArrayRef {
    Preset(String),
    Custom(ArraySpec),
}

impl ArrayRef {
    /// The array this names or describes, not yet validated.
    pub fn spec(&self) -> Result<ArraySpec, ModelError> {
        match self {
            ArrayRef::Preset(n) => ArraySpec::preset(n),
            ArrayRef::Custom(a) => Ok(a.clone()),
        }
    }

    /// A short name for reports: the preset, or e.g. `sata-7200 raid10x16`.
    pub fn label(&self) -> String {
        match self {
            ArrayRef::Preset(n) => n.clone(),
            ArrayRef::Custom(a) => {
                let drive = match &a.drive {
                    DriveRef::Preset(n) => n.as_str(),
                    DriveRef::Custom(_) => "custom",
                };
                format!("{drive} raid{}x{}", a.raid.level, a.raid.drives)
            }
        }
    }
}

/// Names accepted by [`ArraySpec::preset`].
pub const ARRAY_PRESETS: &[&str] = &[
    "15k-sas-raid5x24",
    "15k-sas-raid0x24",
    "15k-sas-raid10x24",
    "ssd-raid5x8",
];

impl ArraySpec {
    /// Whole-array presets, after the seed's Cisco C240 M3 + MegaRAID 9266-8i setups
    /// (64 KiB strips; cache settings as the seed lists for each RAID level):
    /// * `15k-sas-raid5x24`: 24 × 15K SAS RAID 5; write-back (BBU good), normal read,
    ///   cached I/O, disk cache enabled (the application-profile settings).
    /// * `15k-sas-raid0x24`: 24 × 15K SAS RAID 0; write-through, no read-ahead,
    ///   direct I/O, disk cache disabled (the raw-characterisation settings).
    /// * `15k-sas-raid10x24`: 24 × 15K SAS RAID 10; always read-ahead, write-through,
    ///   direct I/O, disk cache enabled (the streaming settings).
    /// * `ssd-raid5x8`: 8 × SATA SSD RAID 5; write-through, no read-ahead, direct I/O.
    pub fn preset(name: &str) -> Result<Self, ModelError> {
        use crate::controller::{BatteryState, WritePolicy};
        let mk = |level, drives, drive: &str, policy| Self {
            controller: ControllerRef::Preset("pcie-gen2".into()),
            raid: RaidSpec::new(level, drives, 64 << 10),
            drive: DriveRef::Preset(drive.into()),
            policy,
            clone_cache: None,
        };
        Ok(match name {
            "15k-sas-raid5x24" => mk(
                5,
                24,
                "sas-15k",
                PolicyOverride {
                    write_policy: Some(WritePolicy::WriteBack),
                    read_policy: Some(ReadPolicy::NoReadAhead),
                    io_policy: Some(IoPolicy::Cached),
                    battery: Some(BatteryState::Good),
                    disk_cache: Some(true),
                },
            ),
            "15k-sas-raid0x24" => mk(
                0,
                24,
                "sas-15k",
                PolicyOverride {
                    write_policy: Some(WritePolicy::WriteThrough),
                    read_policy: Some(ReadPolicy::NoReadAhead),
                    io_policy: Some(IoPolicy::Direct),
                    battery: Some(BatteryState::Good),
                    disk_cache: Some(false),
                },
            ),
            "15k-sas-raid10x24" => mk(
                10,
                24,
                "sas-15k",
                PolicyOverride {
                    write_policy: Some(WritePolicy::WriteThrough),
                    read_policy: Some(ReadPolicy::ReadAhead),
                    io_policy: Some(IoPolicy::Direct),
                    battery: Some(BatteryState::Good),
                    disk_cache: Some(true),
                },
            ),
            "ssd-raid5x8" => mk(
                5,
                8,
                "sata-ssd",
                PolicyOverride {
                    write_policy: Some(WritePolicy::WriteThrough),
                    read_policy: Some(ReadPolicy::NoReadAhead),
                    io_policy: Some(IoPolicy::Direct),
                    battery: Some(BatteryState::Good),
                    disk_cache: None,
                },
            ),
            _ => {
                return Err(ModelError::UnknownPreset {
                    kind: "array",
                    name: name.to_string(),
                    known: ARRAY_PRESETS.join(", "),
                });
            }
        })
    }

    /// The controller and drive descriptions with presets and overrides applied.
    pub fn resolve(&self) -> Result<(ControllerSpec, DriveSpec), ModelError> {
        let mut c = match &self.controller {
            ControllerRef::Preset(n) => ControllerSpec::preset(n)?,
            ControllerRef::Custom(c) => c.clone(),
        };
        let mut d = self.drive.spec()?;
        let p = &self.policy;
        if let Some(v) = p.write_policy {
            c.write_policy = v;
        }
        if let Some(v) = p.read_policy {
            c.read_policy = v;
        }
        if let Some(v) = p.io_policy {
            c.io_policy = v;
        }
        if let Some(v) = p.battery {
            c.battery = v;
        }
        if let (Some(v), DriveSpec::Hdd(h)) = (p.disk_cache, &mut d) {
            h.write_cache = v;
        }
        c.validate()?;
        d.validate()?;
        Ok((c, d))
    }
}

#[derive(Clone, Debug)]
pub(crate) enum Drive {
    Hdd(Box<Hdd>),
    Ssd(Box<Ssd>),
}

impl Drive {
    /// A drive as its spec describes it.
    pub(crate) fn new(spec: &DriveSpec) -> Result<Self, ModelError> {
        Ok(match spec {
            DriveSpec::Hdd(h) => Drive::Hdd(Box::new(Hdd::new(h)?)),
            DriveSpec::Ssd(s) => Drive::Ssd(Box::new(Ssd::new(s)?)),
        })
    }
    pub(crate) fn as_component(&mut self) -> &mut dyn Component {
        match self {
            Drive::Hdd(h) => h.as_mut(),
            Drive::Ssd(s) => s.as_mut(),
        }
    }
    pub(crate) fn next_event_ns(&self) -> Option<Nanos> {
        match self {
            Drive::Hdd(h) => h.next_event_ns(),
            Drive::Ssd(s) => s.next_event_ns(),
        }
    }
    pub(crate) fn stats(&self) -> DriveStats {
        match self {
            Drive::Hdd(h) => h.stats(),
            Drive::Ssd(s) => s.stats(),
        }
    }
}

/// Cache bookkeeping granularity.
const CHUNK_BYTES: u64 = 4096;
/// `ready_at` of a chunk whose prefetch is still in flight.
const PENDING: Nanos = Nanos::MAX;
/// Rows younger than this are not destaged unless full or above the watermark (lets
/// sequential writes fill whole rows).
const DESTAGE_DELAY_NS: Nanos = 20_000_000;
/// Dirty share of the dirty limit above which any row is destaged at once.
const HIGH_WATERMARK: f64 = 0.5;
/// Dirty ranges tracked per row before they are merged into their hull.
const MAX_RANGES: usize = 4;
const STREAMS: usize = 8;

/// 4-way set-associative tag store with LRU replacement within a set (a close
/// approximation of an LRU cache of the same size). A line covers 16 KiB with a
/// valid bit per 4 KiB chunk, so a small request touches one line (one memory
/// access); a line's `ready_at` tells when its data is in cache (`PENDING` while a
/// prefetch is in flight).
#[derive(Clone, Debug)]
struct ChunkCache {
    /// Sets of `WAYS` lines, each set on two whole cache lines of the host.
    sets: Vec<Set>,
    set_mask: u64,
    clock: u32,
}

#[derive(Clone, Copy, Debug)]
struct CacheLine {
    tag: u64,
    ready_at: Nanos,
    last_use: u32,
    valid: u8,
}

const WAYS: usize = 4;
const CHUNKS_PER_LINE: u64 = 4;

/// One set, aligned so that it spans two 64-byte cache lines of the host, not three
/// (a large `Vec` from the system allocator starts 16 bytes into a page).
#[derive(Clone, Copy, Debug)]
#[repr(align(64))]
struct Set([CacheLine; WAYS]);

impl ChunkCache {
    fn new(bytes: u64) -> Self {
        let lines = (bytes / (CHUNK_BYTES * CHUNKS_PER_LINE))
            .max(WAYS as u64)
            .next_power_of_two();
        // Keep the tag store at most 2^20 lines (16 GiB of cache).
        let lines = lines.min(1 << 20) as usize;
        // Huge pages asked for before the tag store is first written (random probes).
        let mut store = Vec::with_capacity(lines / WAYS);
        crate::huge_pages::advise_vec(&store);
        store.resize(
            lines / WAYS,
            Set([CacheLine {
                tag: u64::MAX,
                ready_at: 0,
                last_use: 0,
                valid: 0,
            }; WAYS]),
        );
        Self {
            sets: store,
            set_mask: (lines / WAYS) as u64 - 1,
            clock: 0,
        }
    }
    fn set(&self, tag: u64) -> usize {
        ((tag.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 24) & self.set_mask) as usize * WAYS
    }
    fn line(&self, i: usize) -> &CacheLine {
        &self.sets[i / WAYS].0[i % WAYS]
    }
    fn line_mut(&mut self, i: usize) -> &mut CacheLine {
        &mut self.sets[i / WAYS].0[i % WAYS]
    }
    fn find(&self, tag: u64) -> Option<usize> {
        let s = self.set(tag);
        (s..s + WAYS).find(|&i| self.line(i).tag == tag)
    }
    /// Starts loading the set of the first line `offset` falls in (a hint).
    fn prefetch(&self, offset: u64) {
        let set = &self.sets[self.set(offset / CHUNK_BYTES / CHUNKS_PER_LINE) / WAYS];
        crate::prefetch::read(&set.0[0]);
        crate::prefetch::read(&set.0[WAYS - 1]);
    }
    /// Calls `f(tag, valid-bit mask)` for each line a byte range touches.
    fn for_each_line(offset: u64, size: u32, mut f: impl FnMut(u64, u8)) {
        let first = offset / CHUNK_BYTES;
        let end = (offset + size.max(1) as u64).div_ceil(CHUNK_BYTES);
        let mut c = first;
        while c < end {
            let tag = c / CHUNKS_PER_LINE;
            let line_end = ((tag + 1) * CHUNKS_PER_LINE).min(end);
            let lo = c % CHUNKS_PER_LINE;
            let hi = line_end - tag * CHUNKS_PER_LINE;
            let mask = (((1u16 << hi) - 1) & !((1u16 << lo) - 1)) as u8;
            f(tag, mask);
            c = line_end;
        }
    }
    fn tick(&mut self) -> u32 {
        self.clock = self.clock.wrapping_add(1);
        self.clock
    }
    /// (all present, any still pending); touches the lines it finds.
    fn lookup(&mut self, offset: u64, size: u32, now: Nanos) -> (bool, bool) {
        let clock = self.tick();
        let (mut present, mut pending) = (true, false);
        Self::for_each_line(offset, size, |tag, mask| {
            if !present {
                return;
            }
            match self.find(tag) {
                Some(i) if self.line(i).valid & mask == mask => {
                    let line = self.line_mut(i);
                    line.last_use = clock;
                    pending |= line.ready_at > now;
                }
                _ => present = false,
            }
        });
        (present, present && pending)
    }
    fn insert(&mut self, offset: u64, size: u32, ready_at: Nanos) {
        let clock = self.tick();
        Self::for_each_line(offset, size, |tag, mask| {
            let i = match self.find(tag) {
                Some(i) => i,
                None => {
                    let s = self.set(tag);
                    let victim = (s..s + WAYS)
                        .max_by_key(|&i| clock.wrapping_sub(self.line(i).last_use))
                        .unwrap_or(s);
                    *self.line_mut(victim) = CacheLine {
                        tag,
                        ready_at: 0,
                        last_use: clock,
                        valid: 0,
                    };
                    victim
                }
            };
            let line = self.line_mut(i);
            line.valid |= mask;
            // Pending data makes the whole line wait; ready data never un-readies it.
            line.ready_at = if ready_at == PENDING || line.ready_at == PENDING {
                PENDING
            } else {
                line.ready_at.max(ready_at)
            };
            line.last_use = clock;
        });
    }
    /// Marks lines pending for this range as ready at `t`.
    fn complete(&mut self, offset: u64, size: u32, t: Nanos) {
        Self::for_each_line(offset, size, |tag, _| {
            if let Some(i) = self.find(tag)
                && self.line(i).ready_at == PENDING
            {
                self.line_mut(i).ready_at = t;
            }
        });
    }
}

/// Dirty rows by row number (only looked up, never iterated).
type RowMap = crate::block_cache::FastMap<u64, RowDirty>;

#[derive(Clone, Copy, Debug)]
struct RowDirty {
    ranges: [(u64, u64); MAX_RANGES],
    n: usize,
    bytes: u64,
    first_dirty_ns: Nanos,
    generation: u64,
}

impl RowDirty {
    /// Adds `[a, b)`; returns the growth of dirty bytes.
    fn add(&mut self, a: u64, b: u64) -> u64 {
        let before = self.bytes;
        let (mut a, mut b) = (a, b);
        // Merge with every overlapping/adjacent range.
        let mut i = 0;
        while i < self.n {
            let (x, y) = self.ranges[i];
            if x <= b && a <= y {
                a = a.min(x);
                b = b.max(y);
                self.ranges[i] = self.ranges[self.n - 1];
                self.n -= 1;
            } else {
                i += 1;
            }
        }
        if self.n == MAX_RANGES {
            // Too fragmented: merge into the nearest range's hull (over-estimates the
            // destage size, which a controller would fill by reading).
            let mut best = 0;
            let mut best_gap = u64::MAX;
            for (k, &(x, y)) in self.ranges[..self.n].iter().enumerate() {
                let gap = if y < a { a - y } else { x.saturating_sub(b) };
                if gap < best_gap {
                    best_gap = gap;
                    best = k;
                }
            }
            let (x, y) = self.ranges[best];
            a = a.min(x);
            b = b.max(y);
            self.ranges[best] = self.ranges[self.n - 1];
            self.n -= 1;
        }
        self.ranges[self.n] = (a, b);
        self.n += 1;
        self.bytes = self.ranges[..self.n].iter().map(|&(x, y)| y - x).sum();
        self.bytes - before
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OpKind {
    HostRead,
    HostWrite,
    Destage,
    Prefetch,
}

#[derive(Clone, Debug)]
struct Op {
    kind: OpKind,
    token: u64,
    io: DeviceIo,
    outstanding: u32,
    /// Phase-2 drive writes, issued when the phase-1 reads are done.
    writes: Vec<DriveIo>,
    /// Dirty bytes released when a destage completes.
    destage_bytes: u64,
    /// Clone cache: reads waiting for blocks this op is reading from the drives.
    waiters: Vec<u32>,
    /// Clone cache: ops whose drive reads this read waits for.
    deps: u32,
    /// Submitted with `submit_urgent`: its drive commands are urgent too.
    urgent: bool,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// Controller processing (and a write's payload transfer) done.
    CtrlReady,
    /// Host completion.
    HostDone,
    /// Re-examine the dirty rows (destage delay elapsed).
    DestageTimer,
    /// The drive-side link of a direction (0: to the drives, 1: from them) is free for
    /// the oldest drive command waiting for it.
    BackendFree(u8),
}

/// The controller's drive-side links, one per direction (SAS is full duplex): when
/// each is next free, and the drive commands waiting for it, oldest first.
#[derive(Clone, Debug)]
struct Backend {
    ns_per_byte: f64,
    free_ns: [Nanos; 2],
    /// The waiting commands; each one's op slot travels with its `BackendFree` event.
    waiting: [VecDeque<DriveIo>; 2],
}

impl Backend {
    fn new(mbps: f64) -> Self {
        Backend {
            ns_per_byte: 1e3 / mbps,
            free_ns: [0; 2],
            waiting: [VecDeque::new(), VecDeque::new()],
        }
    }

    fn lane(dir: IoDir) -> u8 {
        match dir {
            IoDir::Write => 0,
            IoDir::Read => 1,
        }
    }

    /// Books `d`'s bytes on its link. None: the link is free, start now; else the
    /// time it starts and its link (the command waits in order until then).
    fn claim(&mut self, t: Nanos, d: DriveIo) -> Option<(Nanos, u8)> {
        let lane = Self::lane(d.dir);
        let i = lane as usize;
        let start = t.max(self.free_ns[i]);
        self.free_ns[i] = start + round_ns(d.size_bytes as f64 * self.ns_per_byte);
        if start == t && self.waiting[i].is_empty() {
            return None;
        }
        self.waiting[i].push_back(d);
        Some((start, lane))
    }

    fn pop(&mut self, lane: u8) -> DriveIo {
        self.waiting[lane as usize]
            .pop_front()
            .expect("a backend event has a waiting command")
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct Stream {
    next_offset: u64,
    sequential_reads: u32,
    prefetched_until: u64,
    last_use: u64,
}

/// Host-level counters of an array.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ArrayStats {
    pub host_reads: u64,
    pub host_writes: u64,
    pub host_read_bytes: u64,
    pub host_write_bytes: u64,
    /// Reads served entirely from controller cache (incl. waits on a prefetch).
    pub read_cache_hits: u64,
    /// Writes acknowledged from cache (write-back).
    pub writes_cached: u64,
    /// Writes that had to wait for dirty space.
    pub write_stalls: u64,
    pub destage_ops: u64,
    pub prefetch_ops: u64,
    pub drive_reads: u64,
    pub drive_writes: u64,
}

/// Per-drive figures for reports.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct DriveReport {
    pub drive: u32,
    pub stats: DriveStats,
}

/// Controller + cache + RAID + drives as one pure queueing state machine.
#[derive(Clone, Debug)]
pub struct Array {
    controller: ControllerSpec,
    layout: RaidLayout,
    drives: Vec<Drive>,
    /// Cached `next_event_ns` of each drive (`Nanos::MAX` when idle).
    drive_next: Vec<Nanos>,
    /// Earliest entry of `drive_next` and its index.
    drive_min: (Nanos, usize),
    write_back: bool,
    cached_io: bool,
    read_ahead_after: Option<u32>,
    cpu_ns: Nanos,
    ns_per_byte: f64,
    cpu_free_ns: Nanos,
    bus_in_free_ns: Nanos,
    bus_out_free_ns: Nanos,
    backend: Option<Backend>,
    ops: Vec<Op>,
    free_ops: Vec<u32>,
    events: BinaryHeap<Reverse<(Nanos, u64, Event, u32)>>,
    event_seq: u64,
    plan: RaidPlan,
    drive_done: Vec<Completion>,
    cache: ChunkCache,
    dirty_limit: u64,
    dirty_bytes: u64,
    dirty_rows: RowMap,
    dirty_fifo: VecDeque<(u64, u64)>,
    full_rows: VecDeque<(u64, u64)>,
    next_generation: u64,
    destage_in_flight: u32,
    destage_max: u32,
    destage_timer_at: Option<Nanos>,
    stalled_writes: VecDeque<u32>,
    waiting_reads: Vec<u32>,
    streams: [Stream; STREAMS],
    stream_clock: u64,
    stats: ArrayStats,
    host_in_flight: usize,
    seed: u64,
    clone: Option<Box<CloneLayer>>,
    clone_deps: Vec<u32>,
}

impl Array {
    /// Builds the array. `seed` is recorded for reproducibility; the models are fully
    /// deterministic functions of the submitted requests (no random draws today).
    pub fn new(spec: &ArraySpec, seed: u64) -> Result<Self, ModelError> {
        let (controller, drive_spec) = spec.resolve()?;
        let layout = RaidLayout::new(&spec.raid, drive_spec.capacity_bytes())?;
        let mut drives = Vec::with_capacity(spec.raid.drives as usize);
        for _ in 0..spec.raid.drives {
            drives.push(Drive::new(&drive_spec)?);
        }
        let cache_bytes = controller.cache_mib as u64 * (1 << 20);
        let clone = match &spec.clone_cache {
            Some(c) => Some(Box::new(CloneLayer::new(c)?)),
            None => None,
        };
        let read_ahead_after = match controller.read_policy {
            _ if clone.is_some() => None,
            ReadPolicy::NoReadAhead => None,
            ReadPolicy::ReadAhead => Some(1),
            ReadPolicy::Adaptive => Some(2),
        };
        Ok(Self {
            write_back: controller.effective_write_back(),
            cached_io: controller.io_policy == IoPolicy::Cached,
            read_ahead_after,
            cpu_ns: (1e9 / controller.max_iops).round() as Nanos,
            ns_per_byte: 1e3 / controller.bandwidth_mbps,
            cpu_free_ns: 0,
            bus_in_free_ns: 0,
            bus_out_free_ns: 0,
            backend: controller.backend_mbps.map(Backend::new),
            ops: Vec::new(),
            free_ops: Vec::new(),
            events: BinaryHeap::new(),
            event_seq: 0,
            plan: RaidPlan::default(),
            drive_done: Vec::new(),
            cache: ChunkCache::new(cache_bytes),
            dirty_limit: (cache_bytes as f64 * controller.dirty_fraction) as u64,
            dirty_bytes: 0,
            dirty_rows: RowMap::default(),
            dirty_fifo: VecDeque::new(),
            full_rows: VecDeque::new(),
            next_generation: 0,
            destage_in_flight: 0,
            destage_max: 2 * spec.raid.drives,
            destage_timer_at: None,
            stalled_writes: VecDeque::new(),
            waiting_reads: Vec::new(),
            streams: [Stream::default(); STREAMS],
            stream_clock: 0,
            stats: ArrayStats::default(),
            host_in_flight: 0,
            seed,
            clone,
            clone_deps: Vec::new(),
            controller,
            layout,
            drive_next: vec![Nanos::MAX; drives.len()],
            drive_min: (Nanos::MAX, 0),
            drives,
        })
    }

    /// Array from a named preset (see [`ArraySpec::preset`]).
    pub fn from_preset(name: &str, seed: u64) -> Result<Self, ModelError> {
        Self::new(&ArraySpec::preset(name)?, seed)
    }

    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Usable capacity; request offsets wrap modulo this.
    pub fn capacity_bytes(&self) -> u64 {
        self.layout.capacity_bytes()
    }

    pub fn layout(&self) -> &RaidLayout {
        &self.layout
    }

    /// The effective controller description (presets and overrides applied).
    pub fn controller(&self) -> &ControllerSpec {
        &self.controller
    }

    /// Whether writes are acknowledged from cache (write-back in effect).
    pub fn write_back_in_effect(&self) -> bool {
        self.write_back
    }

    pub fn stats(&self) -> ArrayStats {
        self.stats
    }

    /// Host requests submitted and not yet completed.
    pub fn host_in_flight(&self) -> usize {
        self.host_in_flight
    }

    /// Dirty bytes in controller cache not yet destaged (incl. destages in flight).
    pub fn dirty_bytes(&self) -> u64 {
        self.dirty_bytes
    }

    /// Per-drive utilisation/IO counters.
    pub fn drive_stats(&self) -> Vec<DriveReport> {
        self.drives
            .iter()
            .enumerate()
            .map(|(i, d)| DriveReport {
                drive: i as u32,
                stats: d.stats(),
            })
            .collect()
    }

    /// Registers a golden image occupying `[base_offset_bytes, +size_bytes)` of the
    /// array (needs `clone_cache` in the spec; block-aligned, non-overlapping).
    pub fn add_image(
        &mut self,
        base_offset_bytes: u64,
        size_bytes: u64,
    ) -> Result<ImageId, ModelError> {
        let cap = self.layout.capacity_bytes();
        self.clone_layer()?
            .add_image(base_offset_bytes, size_bytes, cap)
    }

    /// Registers a linked clone of `image` at `[base_offset_bytes, +size_bytes)` (the
    /// image's size). Until the clone writes a block, reads of it go to the image.
    pub fn add_clone(
        &mut self,
        base_offset_bytes: u64,
        size_bytes: u64,
        image: ImageId,
    ) -> Result<CloneId, ModelError> {
        let cap = self.layout.capacity_bytes();
        self.clone_layer()?
            .add_clone(base_offset_bytes, size_bytes, image, cap)
    }

    /// Registers a thin linked clone of `image`: the clone is addressed at
    /// `[virtual_base_bytes, + image size)`, at or beyond [`Self::capacity_bytes`] (it
    /// takes no array space there); the blocks it writes are stored, in write order,
    /// in its delta area `[delta_base_bytes, + delta_size_bytes)` of the array (like a
    /// linked clone's delta disk; wraps if the clone writes more than it holds).
    pub fn add_thin_clone(
        &mut self,
        virtual_base_bytes: u64,
        image: ImageId,
        delta_base_bytes: u64,
        delta_size_bytes: u64,
    ) -> Result<CloneId, ModelError> {
        let cap = self.layout.capacity_bytes();
        self.clone_layer()?.add_thin_clone(
            virtual_base_bytes,
            image,
            delta_base_bytes,
            delta_size_bytes,
            cap,
        )
    }

    /// Counters of the clone cache (None without `clone_cache`).
    pub fn clone_cache_stats(&self) -> Option<CloneCacheStats> {
        self.clone.as_ref().map(|c| c.stats())
    }

    /// Blocks a clone has written (redirected to its own space), and its size in blocks.
    pub fn clone_delta_blocks(&self, clone: CloneId) -> Option<(u64, u64)> {
        let c = self.clone.as_ref()?;
        Some((c.clone_written_blocks(clone)?, c.clone_blocks(clone)?))
    }

    fn clone_layer(&mut self) -> Result<&mut CloneLayer, ModelError> {
        self.clone
            .as_deref_mut()
            .ok_or_else(|| ModelError::InvalidField {
                what: "array",
                field: "clone_cache",
                value: "none".into(),
                reason: "images and clones need `clone_cache` in the array spec",
            })
    }

    fn alloc_op(&mut self, kind: OpKind, token: u64, io: DeviceIo) -> u32 {
        let op = |writes: Vec<DriveIo>, waiters: Vec<u32>| Op {
            kind,
            token,
            io,
            outstanding: 0,
            writes,
            destage_bytes: 0,
            waiters,
            deps: 0,
            urgent: false,
        };
        match self.free_ops.pop() {
            Some(slot) => {
                let mut w = std::mem::take(&mut self.ops[slot as usize].writes);
                w.clear();
                let mut v = std::mem::take(&mut self.ops[slot as usize].waiters);
                v.clear();
                self.ops[slot as usize] = op(w, v);
                slot
            }
            None => {
                self.ops.push(op(Vec::new(), Vec::new()));
                (self.ops.len() - 1) as u32
            }
        }
    }

    fn free_op(&mut self, slot: u32) {
        self.free_ops.push(slot);
    }

    fn schedule(&mut self, at: Nanos, ev: Event, slot: u32) {
        self.event_seq += 1;
        self.events.push(Reverse((at, self.event_seq, ev, slot)));
    }

    /// Issue the scratch plan for `slot` at `t`: phase-1 reads now (writes kept for
    /// phase 2), or the writes at once if there are no reads. Returns false if the plan
    /// is empty.
    fn issue_plan(&mut self, slot: u32, t: Nanos) -> bool {
        let mut writes = std::mem::take(&mut self.ops[slot as usize].writes);
        writes.clear();
        let n = if self.plan.reads.is_empty() {
            for i in 0..self.plan.writes.len() {
                let d = self.plan.writes[i];
                self.submit_drive(t, d, slot);
            }
            self.plan.writes.len()
        } else {
            writes.extend_from_slice(&self.plan.writes);
            for i in 0..self.plan.reads.len() {
                let d = self.plan.reads[i];
                self.submit_drive(t, d, slot);
            }
            self.plan.reads.len()
        };
        let op = &mut self.ops[slot as usize];
        op.writes = writes;
        op.outstanding = n as u32;
        n > 0
    }

    /// A drive command starts when the drive-side link of its direction has carried
    /// the commands before it: at once while the link is free, else queued in order.
    /// Its own transfer overlaps the drive's positioning (a write's data follows the
    /// drive's transfer-ready, a read's precedes its status), so the link adds waiting,
    /// not a transfer time, to each command; a stream of them runs at the link's rate.
    fn submit_drive(&mut self, t: Nanos, d: DriveIo, slot: u32) {
        if let Some(b) = self.backend.as_mut()
            && let Some((start, lane)) = b.claim(t, d)
        {
            self.schedule(start, Event::BackendFree(lane), slot);
            return;
        }
        self.start_drive(t, d, slot);
    }

    fn start_drive(&mut self, t: Nanos, d: DriveIo, slot: u32) {
        match d.dir {
            IoDir::Read => self.stats.drive_reads += 1,
            IoDir::Write => self.stats.drive_writes += 1,
        }
        let io = DeviceIo {
            offset_bytes: d.offset_bytes,
            size_bytes: d.size_bytes,
            dir: d.dir,
        };
        let drive = self.drives[d.drive as usize].as_component();
        if self.ops[slot as usize].urgent {
            drive.submit_urgent(t, io, slot as u64);
        } else {
            drive.submit(t, io, slot as u64);
        }
        self.refresh_drive_next(d.drive as usize);
    }

    fn on_ctrl_ready(&mut self, slot: u32, t: Nanos) {
        let io = self.ops[slot as usize].io;
        let kind = self.ops[slot as usize].kind;
        match kind {
            OpKind::HostRead => {
                self.read_ahead(io, t);
                self.start_host_read(slot, t);
            }
            OpKind::HostWrite => {
                let io = match self.clone.as_deref_mut() {
                    Some(c) => {
                        c.on_write(&io);
                        let cap = self.layout.capacity_bytes();
                        let mut pio = c.translate_write(&io);
                        pio.offset_bytes %= cap;
                        self.ops[slot as usize].io = pio;
                        pio
                    }
                    None => io,
                };
                // A write larger than the whole dirty space goes straight to the drives
                // (as controllers bypass the cache for it) instead of waiting forever.
                if self.write_back && (io.size_bytes as u64) <= self.dirty_limit {
                    if self.stalled_writes.is_empty() && self.try_absorb(io, t) {
                        self.stats.writes_cached += 1;
                        self.schedule(t, Event::HostDone, slot);
                    } else {
                        self.stats.write_stalls += 1;
                        self.stalled_writes.push_back(slot);
                    }
                    self.kick_destage(t);
                } else {
                    self.layout.plan(&io, &mut self.plan);
                    if self.cached_io {
                        self.cache.insert(io.offset_bytes, io.size_bytes, t);
                    }
                    if !self.issue_plan(slot, t) {
                        self.schedule(t, Event::HostDone, slot);
                    }
                }
            }
            OpKind::Destage | OpKind::Prefetch => {}
        }
    }

    fn start_host_read(&mut self, slot: u32, t: Nanos) {
        let io = self.ops[slot as usize].io;
        if let Some(c) = self.clone.as_deref_mut() {
            if c.read_hit(&io) {
                self.stats.read_cache_hits += 1;
                self.finish_read(slot, t);
            } else {
                let mut deps = std::mem::take(&mut self.clone_deps);
                c.plan_read_misses(&io, &self.layout, &mut self.plan, slot, &mut deps);
                for &d in &deps {
                    self.ops[d as usize].waiters.push(slot);
                }
                self.ops[slot as usize].deps = deps.len() as u32;
                deps.clear();
                self.clone_deps = deps;
                if !self.issue_plan(slot, t) && self.ops[slot as usize].deps == 0 {
                    self.finish_read(slot, t);
                }
            }
            return;
        }
        match self.cache.lookup(io.offset_bytes, io.size_bytes, t) {
            (true, false) => {
                self.stats.read_cache_hits += 1;
                self.finish_read(slot, t);
            }
            (true, true) => self.waiting_reads.push(slot),
            _ => {
                self.layout.plan(&io, &mut self.plan);
                if !self.issue_plan(slot, t) {
                    self.finish_read(slot, t);
                }
            }
        }
    }

    /// Payload controller→host, then completion.
    fn finish_read(&mut self, slot: u32, t: Nanos) {
        let size = self.ops[slot as usize].io.size_bytes;
        let start = t.max(self.bus_out_free_ns);
        let done = start + round_ns(size as f64 * self.ns_per_byte);
        self.bus_out_free_ns = done;
        self.schedule(done, Event::HostDone, slot);
    }

    fn read_ahead(&mut self, io: DeviceIo, t: Nanos) {
        let Some(after) = self.read_ahead_after else {
            return;
        };
        self.stream_clock += 1;
        let end = io.offset_bytes + io.size_bytes as u64;
        let mut idx = None;
        for (i, s) in self.streams.iter().enumerate() {
            if s.last_use > 0 && s.next_offset == io.offset_bytes {
                idx = Some(i);
                break;
            }
        }
        let i = match idx {
            Some(i) => {
                let s = &mut self.streams[i];
                s.sequential_reads += 1;
                s.next_offset = end;
                i
            }
            None => {
                let mut lru = 0;
                for (i, s) in self.streams.iter().enumerate() {
                    if s.last_use < self.streams[lru].last_use {
                        lru = i;
                    }
                }
                self.streams[lru] = Stream {
                    next_offset: end,
                    sequential_reads: 0,
                    prefetched_until: end,
                    last_use: 0,
                };
                lru
            }
        };
        self.streams[i].last_use = self.stream_clock;
        let s = self.streams[i];
        if s.sequential_reads < after {
            return;
        }
        let window = self.controller.read_ahead_bytes as u64;
        let from = s.prefetched_until.max(end);
        let to = end + window;
        // Prefetch in half-window steps so the stream never runs dry.
        if to <= from || to - from < window / 2 {
            return;
        }
        let size = (to - from).min(u32::MAX as u64) as u32;
        self.streams[i].prefetched_until = from + size as u64;
        let pio = DeviceIo {
            offset_bytes: from,
            size_bytes: size,
            dir: IoDir::Read,
        };
        let slot = self.alloc_op(OpKind::Prefetch, 0, pio);
        self.cache.insert(from, size, PENDING);
        self.layout.plan(&pio, &mut self.plan);
        self.stats.prefetch_ops += 1;
        if !self.issue_plan(slot, t) {
            self.cache.complete(from, size, t);
            self.free_op(slot);
        }
    }

    /// Puts a write into cache if dirty space allows.
    fn try_absorb(&mut self, io: DeviceIo, t: Nanos) -> bool {
        let size = io.size_bytes as u64;
        if self.dirty_bytes + size > self.dirty_limit {
            return false;
        }
        if self.cached_io {
            self.cache.insert(io.offset_bytes, io.size_bytes, t);
        }
        let row_bytes = self.layout.row_bytes();
        let cap = self.layout.capacity_bytes();
        let mut l = io.offset_bytes % cap;
        let mut remaining = size;
        while remaining > 0 {
            let row = l / row_bytes;
            let a = l % row_bytes;
            let len = remaining.min(row_bytes - a).min(cap - l);
            let generation = self.next_generation;
            let entry = self.dirty_rows.entry(row).or_insert_with(|| RowDirty {
                ranges: [(0, 0); MAX_RANGES],
                n: 0,
                bytes: 0,
                first_dirty_ns: t,
                generation,
            });
            let fresh = entry.generation == generation;
            let grew = entry.add(a, a + len);
            let full = entry.bytes == row_bytes;
            let g = entry.generation;
            if fresh {
                self.next_generation += 1;
                self.dirty_fifo.push_back((row, g));
            }
            if full && grew > 0 {
                self.full_rows.push_back((row, g));
            }
            self.dirty_bytes += grew;
            remaining -= len;
            l = (l + len) % cap;
        }
        true
    }

    /// Starts destage operations while allowed.
    fn kick_destage(&mut self, t: Nanos) {
        while self.destage_in_flight < self.destage_max {
            let Some((row, dirty)) = self.pick_destage_row(t) else {
                break;
            };
            self.destage_row(row, dirty, t);
        }
    }

    fn pick_destage_row(&mut self, t: Nanos) -> Option<(u64, RowDirty)> {
        while let Some((row, g)) = self.full_rows.pop_front() {
            if let Some(r) = self.dirty_rows.get(&row)
                && r.generation == g
            {
                let r = *r;
                self.dirty_rows.remove(&row);
                return Some((row, r));
            }
        }
        let above = self.dirty_bytes as f64 >= HIGH_WATERMARK * self.dirty_limit as f64;
        while let Some(&(row, g)) = self.dirty_fifo.front() {
            let Some(r) = self.dirty_rows.get(&row).copied() else {
                self.dirty_fifo.pop_front();
                continue;
            };
            if r.generation != g {
                self.dirty_fifo.pop_front();
                continue;
            }
            let due = r.first_dirty_ns + DESTAGE_DELAY_NS;
            if above || t >= due {
                self.dirty_fifo.pop_front();
                self.dirty_rows.remove(&row);
                return Some((row, r));
            }
            if self.destage_timer_at.is_none_or(|at| at > due) {
                self.destage_timer_at = Some(due);
                self.schedule(due, Event::DestageTimer, 0);
            }
            return None;
        }
        None
    }

    fn destage_row(&mut self, row: u64, r: RowDirty, t: Nanos) {
        let row_start = row * self.layout.row_bytes();
        self.plan.clear();
        for &(a, b) in &r.ranges[..r.n] {
            self.layout
                .plan_append(row_start + a, (b - a) as u32, IoDir::Write, &mut self.plan);
        }
        let io = DeviceIo {
            offset_bytes: row_start,
            size_bytes: r.bytes.min(u32::MAX as u64) as u32,
            dir: IoDir::Write,
        };
        let slot = self.alloc_op(OpKind::Destage, 0, io);
        self.ops[slot as usize].destage_bytes = r.bytes;
        self.stats.destage_ops += 1;
        self.destage_in_flight += 1;
        if !self.issue_plan(slot, t) {
            self.finish_destage(slot, t);
        }
    }

    fn finish_destage(&mut self, slot: u32, t: Nanos) {
        let bytes = self.ops[slot as usize].destage_bytes;
        self.free_op(slot);
        self.destage_in_flight -= 1;
        self.dirty_bytes -= bytes;
        while let Some(&w) = self.stalled_writes.front() {
            let io = self.ops[w as usize].io;
            if !self.try_absorb(io, t) {
                break;
            }
            self.stalled_writes.pop_front();
            self.schedule(t, Event::HostDone, w);
        }
        self.kick_destage(t);
    }

    fn on_drive_done(&mut self, slot: u32, t: Nanos) {
        let op = &mut self.ops[slot as usize];
        op.outstanding -= 1;
        if op.outstanding > 0 {
            return;
        }
        if !op.writes.is_empty() {
            let writes = std::mem::take(&mut op.writes);
            op.outstanding = writes.len() as u32;
            for &d in &writes {
                self.submit_drive(t, d, slot);
            }
            let mut writes = writes;
            writes.clear();
            self.ops[slot as usize].writes = writes;
            return;
        }
        match op.kind {
            OpKind::HostRead => {
                let io = op.io;
                if let Some(c) = self.clone.as_deref_mut() {
                    c.fill(slot);
                    self.wake_clone_waiters(slot, t);
                    if self.ops[slot as usize].deps > 0 {
                        return;
                    }
                } else if self.cached_io {
                    self.cache.insert(io.offset_bytes, io.size_bytes, t);
                }
                self.finish_read(slot, t);
            }
            OpKind::HostWrite => self.schedule(t, Event::HostDone, slot),
            OpKind::Destage => self.finish_destage(slot, t),
            OpKind::Prefetch => {
                let io = op.io;
                self.cache.complete(io.offset_bytes, io.size_bytes, t);
                self.free_op(slot);
                let mut i = 0;
                while i < self.waiting_reads.len() {
                    let w = self.waiting_reads[i];
                    let wio = self.ops[w as usize].io;
                    match self.cache.lookup(wio.offset_bytes, wio.size_bytes, t) {
                        (true, false) => {
                            self.waiting_reads.swap_remove(i);
                            self.stats.read_cache_hits += 1;
                            self.finish_read(w, t);
                        }
                        (true, true) => i += 1,
                        _ => {
                            // Evicted by a conflicting line meanwhile: read it.
                            self.waiting_reads.swap_remove(i);
                            self.layout.plan(&wio, &mut self.plan);
                            if !self.issue_plan(w, t) {
                                self.finish_read(w, t);
                            }
                        }
                    }
                }
            }
        }
    }

    /// The drive reads of `slot` are done: reads waiting for its blocks may finish.
    fn wake_clone_waiters(&mut self, slot: u32, t: Nanos) {
        let mut waiters = std::mem::take(&mut self.ops[slot as usize].waiters);
        for &w in &waiters {
            let op = &mut self.ops[w as usize];
            op.deps -= 1;
            if op.deps == 0 && op.outstanding == 0 {
                self.finish_read(w, t);
            }
        }
        waiters.clear();
        self.ops[slot as usize].waiters = waiters;
    }

    fn next_drive_event(&self) -> Option<(Nanos, usize)> {
        (self.drive_min.0 != Nanos::MAX).then_some(self.drive_min)
    }

    /// Records drive `i`'s next event and keeps the earliest (lowest index on ties).
    fn refresh_drive_next(&mut self, i: usize) {
        let t = self.drives[i].next_event_ns().unwrap_or(Nanos::MAX);
        let old = std::mem::replace(&mut self.drive_next[i], t);
        let (min_t, min_i) = self.drive_min;
        if t < min_t || (t == min_t && i < min_i) {
            self.drive_min = (t, i);
        } else if i == min_i && t > old {
            let mut best = (Nanos::MAX, 0);
            for (j, &tj) in self.drive_next.iter().enumerate() {
                if tj < best.0 {
                    best = (tj, j);
                }
            }
            self.drive_min = best;
        }
    }
}

impl Array {
    fn host_submit(&mut self, now: Nanos, io: DeviceIo, token: u64, urgent: bool) {
        let kind = match io.dir {
            IoDir::Read => {
                self.stats.host_reads += 1;
                self.stats.host_read_bytes += io.size_bytes as u64;
                OpKind::HostRead
            }
            IoDir::Write => {
                self.stats.host_writes += 1;
                self.stats.host_write_bytes += io.size_bytes as u64;
                OpKind::HostWrite
            }
        };
        let cap = self.layout.capacity_bytes();
        // Thin clones are addressed beyond the capacity (translated when served).
        let thin = io.offset_bytes >= cap
            && self
                .clone
                .as_deref()
                .is_some_and(|c| c.is_thin_clone_address(io.offset_bytes));
        let io = DeviceIo {
            offset_bytes: if thin {
                io.offset_bytes
            } else {
                io.offset_bytes % cap
            },
            ..io
        };
        if self.clone.is_none() {
            // Looked up (reads) or filled (writes) at `CtrlReady`, a controller
            // service time later: start loading the tag store's set now.
            self.cache.prefetch(io.offset_bytes);
        }
        let slot = self.alloc_op(kind, token, io);
        self.ops[slot as usize].urgent = urgent;
        self.host_in_flight += 1;
        let start = now.max(self.cpu_free_ns);
        self.cpu_free_ns = start + self.cpu_ns;
        let mut ready = self.cpu_free_ns;
        if io.dir == IoDir::Write {
            let s = ready.max(self.bus_in_free_ns);
            ready = s + round_ns(io.size_bytes as f64 * self.ns_per_byte);
            self.bus_in_free_ns = ready;
        }
        self.schedule(ready, Event::CtrlReady, slot);
    }
}

impl Component for Array {
    fn submit(&mut self, now: Nanos, io: DeviceIo, token: u64) {
        self.host_submit(now, io, token, false);
    }

    /// An urgent host command's drive commands are urgent at the drives (phase-2
    /// parity writes and misses alike); the controller's own queues stay FIFO.
    fn submit_urgent(&mut self, now: Nanos, io: DeviceIo, token: u64) {
        self.host_submit(now, io, token, true);
    }
    fn next_event_ns(&self) -> Option<Nanos> {
        let e = self.events.peek().map(|r| r.0.0);
        let d = self.next_drive_event().map(|(t, _)| t);
        match (e, d) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn advance(&mut self, now: Nanos, done: &mut Vec<Completion>) {
        loop {
            let e = self.events.peek().map(|r| r.0.0);
            let d = self.next_drive_event();
            let drive_first = match (e, d) {
                (_, None) => false,
                (None, Some(_)) => true,
                (Some(te), Some((td, _))) => td < te,
            };
            if drive_first {
                let (t, i) = d.unwrap_or((Nanos::MAX, 0));
                if t > now {
                    break;
                }
                let mut scratch = std::mem::take(&mut self.drive_done);
                self.drives[i].as_component().advance(t, &mut scratch);
                self.refresh_drive_next(i);
                for c in scratch.drain(..) {
                    self.on_drive_done(c.token as u32, c.at_ns);
                }
                self.drive_done = scratch;
            } else {
                let Some(&Reverse((t, _, ev, slot))) = self.events.peek() else {
                    break;
                };
                if t > now {
                    break;
                }
                self.events.pop();
                match ev {
                    Event::CtrlReady => self.on_ctrl_ready(slot, t),
                    Event::HostDone => {
                        let token = self.ops[slot as usize].token;
                        done.push(Completion { token, at_ns: t });
                        self.host_in_flight -= 1;
                        self.free_op(slot);
                    }
                    Event::DestageTimer => {
                        if self.destage_timer_at == Some(t) {
                            self.destage_timer_at = None;
                        }
                        self.kick_destage(t);
                    }
                    Event::BackendFree(lane) => {
                        let b = self
                            .backend
                            .as_mut()
                            .expect("a backend event has a backend");
                        let d = b.pop(lane);
                        self.start_drive(t, d, slot);
                    }
                }
            }
        }
    }

    fn busy_ns(&self) -> Nanos {
        if self.drives.is_empty() {
            return 0;
        }
        let sum: Nanos = self.drives.iter().map(|d| d.stats().busy_ns).sum();
        sum / self.drives.len() as Nanos
    }
}
