//! The discrete-event loop of one case.
//!
//! Path of a request: workload → host scheduler (VM disk shares/limits/reservations)
//! → host window (device queue depth, and PARDA's window when datastore-wide control is
//! on) → host link (writes carry data out) → target link → array-side QoS (optional) →
//! array → target link → host link (reads carry data back) → completion, reported to
//! the host scheduler (latency as the VM saw it) and to the datastore-wide latency
//! average (device latency, from host dispatch to completion, as SIOC measures it).

use crate::Progress;
use crate::cache::BlockCache;
use crate::fault::{FaultAction, FaultInjector};
use crate::hw::{self, Hw, PartSnapshot};
use crate::queue::{QuadHeap, SortedQueue};
use crate::scenario::{CasePlan, VmPlan, VolumePlan, WindowPlan};
use hdrhistogram::Histogram;
use std::cmp::Ordering;
use weir_model::{
    CachePolicy, Component, DeviceIo, FillId, FlashCache, FlashCacheSpec, FlashCacheStats,
    ReadPlan, SlotRef, WriteId,
};
use weir_qos::{
    ClientId, DatastoreLatency, DepthConfig, Gate, GateConfig, GateRequest, GatewayShare, IoKind,
    Nanos, Piece, Release, SchedulerConfig, Ticket, VolumeId,
};
use weir_report::{
    CaseReport, Comparison, ComponentResult, IoCounts, IoSizeHistogram, LatencySummary,
    ModelMetricResult, TimelineSeries, WindowResult, WorkloadResult,
};
use weir_workload::{
    AccessGenerator, Direction, IoGenerator, IoRequest, Issue, ModelMetric, ScheduleLog,
    SharedRegion, peak_concurrent,
};

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Ev {
    WorkerWake { vm: u32, worker: u32 },
    HostWake(u32),
    ArrayQosWake,
    Component(u32),
    FaultRelease(u32),
    CongestionTick,
    Sample,
    MeasureStart,
    End,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
struct Event {
    at: Nanos,
    seq: u64,
    ev: Ev,
}

impl Ord for Event {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}
impl PartialOrd for Event {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// A worker wake-up as its heap keeps it (24 bytes instead of an `Event`'s 32).
/// Ordered by time, then sequence (unique), like `Event`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Wake {
    at: Nanos,
    seq: u64,
    vm: u32,
    worker: u32,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Stage {
    /// On the host's processor (its storage stack), before its link.
    HostCpu,
    HostLinkOut,
    /// On the storage server's processor, before the array.
    TargetCpu,
    TargetLinkOut,
    Array,
    TargetLinkBack,
    HostLinkBack,
    /// A read served by the host's flash cache.
    HostFlash,
    /// A fill: the host flash cache writes the blocks a missed read brought.
    HostFill,
    /// A read served by the array's flash cache.
    ArrayFlash,
    /// Released in pieces: waits for them (each piece is a request of its own).
    Split,
    Free,
}

/// Which request a request slot is part of.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum PartOf {
    /// A whole request (as the VM issued it, or a host piece as the array got it).
    Itself,
    /// A piece the host's gate released of the request in that slot.
    HostPiece(u32),
    /// A piece the array's gate released of the request in that slot.
    ArrayPiece(u32),
}

#[derive(Copy, Clone, Debug)]
struct Req {
    vm: u32,
    worker: u32,
    io: IoRequest,
    stage: Stage,
    issued_at: Nanos,
    host_dispatched_at: Nanos,
    /// Hand back to the host's / the array's gate when this piece completes there.
    host_ticket: Option<Ticket>,
    array_ticket: Option<Ticket>,
    /// The array tier that serves it (`Array` or `ArrayFlash`), chosen on arrival.
    tier: Stage,
    part_of: PartOf,
    /// One of its pieces failed (reported when the last one completes).
    error: bool,
    /// What the host's flash cache has to hear of when the request ends.
    host_cache: HostCacheOp,
}

/// A request's business with its host's flash cache ([`weir_model::FlashCache`]),
/// ended when the whole request ends (never carried by its pieces).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum HostCacheOp {
    None,
    /// A hit being read from flash (its slots: `Engine::host_hits`).
    Hit,
    /// A read the cache missed: its fill ticket, if it may fill.
    Miss(Option<FillId>),
    /// A write (invalidating): ended when the array acknowledged it.
    Write(WriteId),
    /// A fill's flash write (a request of its own, no VM's).
    Fill(FillId),
}

const FREE_REQ: Req = Req {
    vm: 0,
    worker: 0,
    io: IoRequest {
        offset_bytes: 0,
        size_bytes: 0,
        dir: Direction::Read,
    },
    stage: Stage::Free,
    issued_at: 0,
    host_dispatched_at: 0,
    host_ticket: None,
    array_ticket: None,
    tier: Stage::Array,
    part_of: PartOf::Itself,
    error: false,
    host_cache: HostCacheOp::None,
};

/// A cache's flash device as a new component: its index and its channels.
fn flash_component(
    comps: &mut Vec<Comp>,
    name: String,
    flash: &crate::topology::FlashSpec,
) -> Result<(u32, u32), String> {
    let (hw, channels) = hw::build_flash(flash)?;
    Ok((push_comp(comps, hw, name, "flash"), channels))
}

/// Adds a component; its index.
fn push_comp(comps: &mut Vec<Comp>, c: Hw, name: String, kind: &'static str) -> u32 {
    comps.push(Comp {
        c,
        pending: None,
        name,
        kind,
        busy_at_start: 0,
        busy_at: vec![0],
        ios: 0,
        bytes: 0,
    });
    comps.len() as u32 - 1
}

/// A host's flash read cache: `weir serve`'s decisions ([`FlashCache`]: whole-read
/// hits, fills when the backend read completes, admission with the scan cutoff,
/// write-through with invalidation, SLRU) on the host's flash component. Its
/// volumes are the VMs that use it.
struct HostCache {
    model: FlashCache,
    comp: u32,
    block_bytes: u64,
    /// The counters when the measured time began.
    at_start: FlashCacheStats,
}

impl HostCache {
    fn new(
        comps: &mut Vec<Comp>,
        name: String,
        spec: &crate::topology::HostCacheSpec,
    ) -> Result<HostCache, String> {
        let (comp, _) = flash_component(comps, name, &spec.flash)?;
        let block_bytes = spec.block_kib as u64 * 1024;
        let model = FlashCache::new(FlashCacheSpec {
            capacity_blocks: crate::scenario::host_cache_blocks(spec) as u32,
            block_bytes: block_bytes as u32,
            // The server's policy (it has no setting for it).
            policy: CachePolicy::Slru,
            scan_bytes: spec.scan_cutoff_kib * 1024,
        });
        Ok(HostCache {
            model,
            comp,
            block_bytes,
            at_start: FlashCacheStats::default(),
        })
    }
}

struct Comp {
    c: Hw,
    pending: Option<Nanos>,
    name: String,
    kind: &'static str,
    busy_at_start: Nanos,
    /// Busy time at each sampling interval's start (index k: k intervals in), for
    /// the utilisation inside a window.
    busy_at: Vec<Nanos>,
    ios: u64,
    bytes: u64,
}

/// A QoS tier: the gate (weir-qos's one QoS driver) and its pending timer.
struct Tier {
    gate: Gate<u32>,
    /// When the `HostWake` / `ArrayQosWake` armed for the gate fires.
    wake_at: Option<Nanos>,
}

impl Tier {
    fn new(cost_unit_bytes: u32, max_in_flight: u32, depth: DepthConfig) -> Tier {
        Tier {
            gate: Gate::new(GateConfig {
                scheduler: SchedulerConfig::with_cost_unit(cost_unit_bytes),
                max_in_flight,
                depth,
            }),
            wake_at: None,
        }
    }

    /// The time to arm a wake-up at, if the gate wants one that is not armed yet.
    fn timer(&mut self, now: Nanos) -> Option<Nanos> {
        let t = self.gate.next_wakeup()?.max(now + 1);
        (self.wake_at != Some(t)).then(|| {
            self.wake_at = Some(t);
            t
        })
    }
}

/// Host-side QoS (ESX's per-host scheduler): a gate whose clients are the VMs and
/// volumes their disks, bounded by the host's device queue depth (fixed: the depth
/// controller is off) and, with datastore-wide congestion control, by the host's
/// PARDA window (the gate's cap).
struct HostState {
    /// Host flash read cache.
    cache: Option<HostCache>,
    qos: Tier,
    queue_depth: u32,
    link: Option<u32>,
    cpu: Option<u32>,
    area: u128,
    last_change: Nanos,
    dispatched: u64,
    dispatched_bytes: u64,
    window_series: Vec<f64>,
}

/// Appliance-side QoS: a gate whose clients are the hosts and volumes the
/// datastore's volumes, bounded by `backend_concurrency` on the disks (class 0, with
/// the depth controller of `[array_qos] depth`) and by `flash_concurrency` on the
/// flash tier (class 1): a hybrid array's flash and disks are separate devices, so
/// flash hits do not wait for slots held by 10 ms disk misses, and the flash device's
/// own FIFO stays short — the scheduler, not a device queue, decides who goes first.
///
/// A request's tier is looked up when it arrives (flash tier lookup). A released
/// request whose tier is full is parked in the gate until that tier frees a slot,
/// and nothing else is released meanwhile, so the scheduler's order holds. The
/// cost: while the disks are saturated, a parked disk request holds back flash
/// releases for up to one disk service time. (A scheduler per tier avoids that but
/// splits each volume's reservation, risk tracking and shares across tiers; tried on
/// `mixed-workload.toml`, it let the business-critical Exchange volume's RPC latency
/// pass 50 ms during the storm.)
const FLASH_CLASS: u32 = 1;

/// The longest latency the histograms tell apart, µs (longer ones count as this).
const MAX_LATENCY_US: u64 = 3_600_000_000;

struct Stats {
    hist: Histogram<u64>,
    ios: u64,
    bytes: u64,
    reads: u64,
    writes: u64,
    errors: u64,
    latency_sum_ns: u128,
}

impl Stats {
    /// Latency from 1 µs to an hour (as `weir load`'s) at `sigfig` significant figures
    /// (3 for totals and volumes, 2 (1 %) per VM: 27 KB instead of 188 KB each, for
    /// thousands of VMs). The bound was 100 s (21 and 147 KB) until session 23, when
    /// a non-critical pool held back for 211 s through a boot storm reported a
    /// maximum of 100.1 s.
    fn new(sigfig: u8) -> Stats {
        Stats {
            hist: Histogram::new_with_bounds(1, MAX_LATENCY_US, sigfig)
                .expect("constant histogram bounds are valid"),
            ios: 0,
            bytes: 0,
            reads: 0,
            writes: 0,
            errors: 0,
            latency_sum_ns: 0,
        }
    }
    fn record(&mut self, io: &IoRequest, latency_ns: Nanos) {
        self.hist.saturating_record((latency_ns / 1000).max(1));
        self.ios += 1;
        self.bytes += io.size_bytes as u64;
        match io.dir {
            Direction::Read => self.reads += 1,
            Direction::Write => self.writes += 1,
        }
        self.latency_sum_ns += latency_ns as u128;
    }
    fn result(&self, name: String, duration_s: f64) -> WorkloadResult {
        let counts = IoCounts {
            ios: self.ios,
            reads: self.reads,
            writes: self.writes,
            bytes: self.bytes,
            errors: self.errors,
        };
        WorkloadResult::from_counts(name, duration_s, counts, || {
            let q = |p: f64| self.hist.value_at_quantile(p) as f64 / 1000.0;
            LatencySummary {
                mean: self.latency_sum_ns as f64 / self.ios as f64 / 1e6,
                p50: q(0.5),
                p95: q(0.95),
                p99: q(0.99),
                max: self.hist.max() as f64 / 1000.0,
            }
        })
    }
}

struct VmState {
    plan: VmPlan,
    /// Its volume in its host's flash cache (`host_cache = true`).
    flash_volume: Option<u32>,
    generator: Box<dyn IoGenerator + Send>,
    shared: Option<SharedRegion>,
    /// End offset of each worker's last request (sequential detection).
    last_end: Vec<u64>,
    outstanding: Vec<u32>,
    wake_at: Vec<Option<Nanos>>,
    stats: Stats,
    /// Per timeline interval: bytes, I/Os, latency sum (ns).
    buckets: Vec<(u64, u64, u128)>,
}

pub(crate) struct Engine<'p> {
    plan: &'p CasePlan,
    now: Nanos,
    seq: u64,
    /// Pending events but worker wake-ups: components, hosts, ticks (a few).
    events: SortedQueue<Event>,
    /// Worker wake-ups: one per idle worker (thousands with VDI desktops, mostly far
    /// ahead). Kept apart so the I/O path's events stay in a tiny queue; popping the
    /// earlier head of the two gives exactly the (time, sequence) order of one queue.
    wakes: QuadHeap<Wake>,
    reqs: Vec<Req>,
    free: Vec<u32>,
    vms: Vec<VmState>,
    hosts: Vec<HostState>,
    comps: Vec<Comp>,
    target_link: Option<u32>,
    target_cpu: Option<u32>,
    array_qos: Option<Tier>,
    /// `[array_qos] priority_queueing`: pass the gate's urgent pieces on as urgent.
    priority_queueing: bool,
    /// Reused buffers for what the gates release.
    release_bufs: Vec<Vec<Release<u32>>>,
    faults: Box<dyn FaultInjector>,
    done: Vec<weir_model::Completion>,
    measuring: bool,
    measure_start: Nanos,
    end: Nanos,
    volume_stats: Vec<Stats>,
    total: Stats,
    parts_at_start: Vec<PartSnapshot>,
    completed: u64,
    /// Per timeline interval: bytes, I/Os, device latency sum (ns).
    series_total: Vec<(u64, u64, u128)>,
    /// Per volume, per timeline interval: bytes, I/Os, latency sum as the VMs saw it.
    volume_buckets: Vec<Vec<(u64, u64, u128)>>,
    /// Array flash cache and its flash component.
    array_cache: Option<ArrayCache>,
    /// Per request slot in `HostCacheOp::Hit`: the flash slots its read saw.
    host_hits: Vec<Vec<SlotRef>>,
    sizes: IoSizeHistogram,
    keys: Vec<u64>,
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Array flash tier key of a block that is not part of a shared image.
fn array_cache_key(block: u64) -> u64 {
    splitmix(block) ^ 0x5EED
}

/// Stable seed for a named stream (FNV-1a of the name, mixed with the run's seed).
pub(crate) fn stream_seed(seed: u64, name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
    }
    splitmix(seed ^ splitmix(h))
}

/// Where each VM disk starts on the array (`[datastore] placement`).
fn vm_offsets(plan: &CasePlan, capacity_bytes: Option<u64>) -> Vec<u64> {
    match (plan.file.datastore.placement, capacity_bytes) {
        (crate::topology::Placement::Spread, Some(capacity)) => {
            let mut next: Vec<Option<u64>> = vec![None; plan.volumes.len()];
            plan.vms
                .iter()
                .map(|vm| {
                    let at = next[vm.volume]
                        .unwrap_or_else(|| weir_model::spread_base(vm.volume as u32 + 1, capacity));
                    next[vm.volume] = Some(at + vm.disk_bytes);
                    at
                })
                .collect()
        }
        _ => plan.vms.iter().map(|vm| vm.base_offset).collect(),
    }
}

/// Each VM's volume in its host's flash cache, for the VMs that use it (added in
/// VM order).
fn host_cache_volumes(plan: &CasePlan, hosts: &mut [HostState]) -> Vec<Option<u32>> {
    plan.vms
        .iter()
        .map(|vm| match &mut hosts[vm.host].cache {
            Some(c) if vm.host_cache => Some(c.model.add_volume(true)),
            _ => None,
        })
        .collect()
}

/// Loads the data regions of the VMs that ask for it (`prewarm_cache`) into the caches
/// on their path, in address order.
fn prewarm(
    plan: &CasePlan,
    offsets: &[u64],
    flash_volumes: &[Option<u32>],
    hosts: &mut [HostState],
    mut array_cache: Option<&mut BlockCache>,
) {
    let mut keys = Vec::new();
    for (vi, vm) in plan.vms.iter().enumerate() {
        if vm.prewarm_bytes == 0 {
            continue;
        }
        let (start, end) = (offsets[vi], offsets[vi] + vm.prewarm_bytes);
        if let (Some(volume), Some(cache)) = (flash_volumes[vi], &mut hosts[vm.host].cache) {
            cache.model.warm(volume, 0, vm.prewarm_bytes);
        }
        if let Some(cache) = array_cache.as_deref_mut() {
            let bb = cache.block_bytes;
            keys.clear();
            keys.extend((start / bb..end.div_ceil(bb)).map(array_cache_key));
            cache.insert(&keys);
        }
    }
}

/// A host: its gate (ESX's scheduler, with the PARDA window when congestion control
/// is on), its link, CPU and flash cache as new components.
fn build_host(plan: &CasePlan, hi: usize, comps: &mut Vec<Comp>) -> Result<HostState, String> {
    let h = &plan.hosts[hi];
    // ESX keeps a fixed device queue depth: no depth controller at the host.
    let fixed = DepthConfig {
        adaptive: false,
        ..DepthConfig::default()
    };
    let mut qos = Tier::new(h.cost_unit_bytes, h.queue_depth, fixed);
    for (vi, vm) in plan.vms.iter().enumerate() {
        if vm.host == hi {
            qos.gate
                .add_volume(0, VolumeId(vi as u32), vm.policy.clone());
        }
    }
    // The host's PARDA window is its gate's gateway window: the same code a
    // `weir serve` gateway on a shared cluster runs.
    if plan.congestion.enabled {
        qos.gate
            .enable_gateway_window(plan.congestion.clone(), h.queue_depth);
    }
    let link =
        hw::build_link(&h.link)?.map(|c| push_comp(comps, c, format!("link {}", h.name), "link"));
    let cpu = match &h.cpu {
        Some(spec) => Some(push_comp(
            comps,
            hw::build_processor(spec)?,
            format!("cpu {}", h.name),
            "cpu",
        )),
        None => None,
    };
    let cache = match plan.file.host[hi]
        .flash_cache
        .as_ref()
        .filter(|c| c.enabled)
    {
        Some(c) => Some(HostCache::new(comps, format!("host flash {}", h.name), c)?),
        None => None,
    };
    Ok(HostState {
        cache,
        qos,
        queue_depth: h.queue_depth,
        link,
        cpu,
        area: 0,
        last_change: 0,
        dispatched: 0,
        dispatched_bytes: 0,
        window_series: Vec::new(),
    })
}

/// The array's flash cache: its index, its flash component, clone-aware, write-back.
type ArrayCache = (BlockCache, u32, bool, bool);

/// The array's flash cache if the scenario has one, and the flash device's channels (1 without).
fn build_array_cache(
    plan: &CasePlan,
    comps: &mut Vec<Comp>,
) -> Result<(Option<ArrayCache>, u32), String> {
    let Some(c) = plan.file.array_cache.as_ref().filter(|c| c.enabled) else {
        return Ok((None, 1));
    };
    let (comp, channels) = flash_component(comps, "array flash".into(), &c.flash)?;
    let cache = BlockCache::new(
        (c.size_gib * (1u64 << 30) as f64) as u64,
        c.block_kib as u64 * 1024,
    );
    Ok((Some((cache, comp, c.clone_aware, c.write_back)), channels))
}

/// The array's gate, if `[array_qos]` is on: the datastore's volumes, and the flash
/// tier's class bound when there is a flash tier (without one nothing is ever sent
/// there, and the gate has one class).
fn build_array_qos(plan: &CasePlan, flash_tier: bool, flash_channels: u32) -> Option<Tier> {
    let q = plan.file.array_qos.as_ref().filter(|q| q.enabled)?;
    let mut qos = Tier::new(q.cost_unit_bytes, q.backend_concurrency, q.depth.clone());
    for (i, v) in plan.volumes.iter().enumerate() {
        qos.gate.add_volume(0, VolumeId(i as u32), v.policy.clone());
    }
    if flash_tier {
        let bound = q.flash_concurrency.unwrap_or(flash_channels.max(1));
        qos.gate
            .set_class_limit(0, FLASH_CLASS, bound, &mut Vec::new());
    }
    Some(qos)
}

/// Each VM's state: its generator (its model, or its access specification) on its
/// own random stream, at its offset on the array.
fn build_vms(
    plan: &CasePlan,
    seed: u64,
    offsets: &[u64],
    flash_volumes: &[Option<u32>],
    buckets: usize,
) -> Result<Vec<VmState>, String> {
    let mut vms = Vec::new();
    for ((vm, &base_offset), &flash_volume) in plan.vms.iter().zip(offsets).zip(flash_volumes) {
        let generator: Box<dyn IoGenerator + Send> = match &vm.model {
            Some(m) => m
                .build(
                    vm.disk_bytes,
                    stream_seed(seed, &vm.name),
                    vm.instance,
                    vm.instances,
                )
                .map_err(|e| format!("VM {}: {e}", vm.name))?,
            None => Box::new(
                AccessGenerator::new(&vm.spec, vm.disk_bytes, stream_seed(seed, &vm.name))
                    .map_err(|e| format!("VM {}: {e}", vm.name))?,
            ),
        };
        let workers = generator.workers() as usize;
        vms.push(VmState {
            plan: VmPlan {
                base_offset,
                ..vm.clone()
            },
            flash_volume,
            shared: generator.shared_region(),
            generator,
            last_end: vec![u64::MAX; workers],
            outstanding: vec![0; workers],
            wake_at: vec![None; workers],
            stats: Stats::new(2),
            buckets: vec![(0, 0, 0); buckets],
        });
    }
    Ok(vms)
}

impl<'p> Engine<'p> {
    pub(crate) fn new(
        plan: &'p CasePlan,
        seed: u64,
        faults: Box<dyn FaultInjector>,
    ) -> Result<Engine<'p>, String> {
        let mut comps = Vec::new();
        let disks_bytes: u64 = plan.vms.iter().map(|v| v.disk_bytes).sum();
        let array = hw::build_array(&plan.file.array, stream_seed(seed, "array"), disks_bytes)?;
        push_comp(&mut comps, array, "array".into(), "array");
        let mut target_link = None;
        if let Some(spec) = &plan.file.datastore.target_link
            && let Some(c) = hw::build_link(spec)?
        {
            let name = format!("target link {}", plan.file.datastore.name);
            target_link = Some(push_comp(&mut comps, c, name, "link"));
        }
        let target_cpu = match &plan.file.datastore.target_cpu {
            Some(spec) => Some(push_comp(
                &mut comps,
                hw::build_processor(spec)?,
                format!("target cpu {}", plan.file.datastore.name),
                "cpu",
            )),
            None => None,
        };
        let mut hosts = Vec::new();
        for hi in 0..plan.hosts.len() {
            hosts.push(build_host(plan, hi, &mut comps)?);
        }
        let (mut array_cache, flash_channels) = build_array_cache(plan, &mut comps)?;
        let array_qos = build_array_qos(plan, array_cache.is_some(), flash_channels);
        let offsets = vm_offsets(plan, comps[0].c.capacity_bytes());
        let flash_volumes = host_cache_volumes(plan, &mut hosts);
        prewarm(
            plan,
            &offsets,
            &flash_volumes,
            &mut hosts,
            array_cache.as_mut().map(|c| &mut c.0),
        );
        let buckets = ((plan.warmup_ns + plan.duration_ns) / plan.interval_ns + 1) as usize;
        let vms = build_vms(plan, seed, &offsets, &flash_volumes, buckets)?;
        let in_flight: usize = plan
            .vms
            .iter()
            .map(|v| match &v.model {
                Some(_) => 64,
                None => (v.spec.workers * v.spec.outstanding_ios) as usize,
            })
            .sum::<usize>()
            .min(1 << 20);
        Ok(Engine {
            plan,
            now: 0,
            seq: 0,
            events: SortedQueue::with_capacity(64),
            wakes: QuadHeap::with_capacity(plan.vms.len() + 64),
            reqs: Vec::with_capacity(in_flight),
            free: Vec::with_capacity(in_flight),
            vms,
            hosts,
            comps,
            target_link,
            target_cpu,
            array_qos,
            priority_queueing: plan
                .file
                .array_qos
                .as_ref()
                .is_none_or(|q| q.priority_queueing),
            release_bufs: Vec::new(),
            faults,
            done: Vec::with_capacity(64),
            measuring: plan.warmup_ns == 0,
            measure_start: 0,
            end: plan.warmup_ns + plan.duration_ns,
            // Reported only beside other volumes or array QoS (see `report`): else the
            // total says it all, and recording it twice per I/O is waste.
            volume_stats: if plan.volumes.len() > 1 || plan.file.array_qos.is_some() {
                // 3 significant figures (188 KB each) for a few volumes, 2 (27 KB, as
                // per VM) beyond 100.
                let sigfig = if plan.volumes.len() > 100 { 2 } else { 3 };
                plan.volumes.iter().map(|_| Stats::new(sigfig)).collect()
            } else {
                Vec::new()
            },
            total: Stats::new(3),
            parts_at_start: Vec::new(),
            completed: 0,
            series_total: vec![(0, 0, 0); buckets],
            volume_buckets: plan
                .volumes
                .iter()
                .map(|_| vec![(0, 0, 0); buckets])
                .collect(),
            array_cache,
            host_hits: Vec::new(),
            sizes: IoSizeHistogram::with_seed_buckets(),
            keys: Vec::with_capacity(64),
        })
    }

    #[inline]
    fn push(&mut self, at: Nanos, ev: Ev) {
        self.seq += 1;
        let seq = self.seq;
        match ev {
            Ev::WorkerWake { vm, worker } => self.wakes.push(Wake {
                at,
                seq,
                vm,
                worker,
            }),
            _ => self.events.push(Event { at, seq, ev }),
        }
    }

    /// The earliest pending event (by time, then by push order).
    fn pop(&mut self) -> Option<Event> {
        let wake_first = match (self.events.peek(), self.wakes.peek()) {
            (Some(other), Some(wake)) => (wake.at, wake.seq) < (other.at, other.seq),
            (None, Some(_)) => true,
            _ => false,
        };
        if wake_first {
            self.wakes.pop().map(|w| Event {
                at: w.at,
                seq: w.seq,
                ev: Ev::WorkerWake {
                    vm: w.vm,
                    worker: w.worker,
                },
            })
        } else {
            self.events.pop()
        }
    }

    pub(crate) fn run(
        mut self,
        progress: &mut dyn FnMut(Progress),
        cases_done: usize,
        cases_total: usize,
    ) -> CaseReport {
        let plan = self.plan;
        if plan.warmup_ns > 0 {
            self.push(plan.warmup_ns, Ev::MeasureStart);
        }
        self.push(self.end, Ev::End);
        self.push(plan.interval_ns, Ev::Sample);
        let period_ns = plan.congestion.period_ns();
        if plan.congestion.enabled {
            self.push(period_ns, Ev::CongestionTick);
        }
        for vm in 0..self.vms.len() {
            for w in 0..self.vms[vm].outstanding.len() {
                self.poll_worker(vm as u32, w as u32);
            }
        }
        while let Some(e) = self.pop() {
            self.now = e.at;
            match e.ev {
                Ev::WorkerWake { vm, worker } => {
                    if self.vms[vm as usize].wake_at[worker as usize] == Some(e.at) {
                        self.vms[vm as usize].wake_at[worker as usize] = None;
                        self.poll_worker(vm, worker);
                    }
                }
                Ev::HostWake(h) => {
                    let qos = &mut self.hosts[h as usize].qos;
                    if qos.wake_at == Some(e.at) {
                        qos.wake_at = None;
                        let out = self.host_gate(h as usize, |g, now, out| g.wake(now, out));
                        self.host_releases(h as usize, out.1);
                    }
                }
                Ev::ArrayQosWake => {
                    if let Some(qos) = &mut self.array_qos
                        && qos.wake_at == Some(e.at)
                    {
                        qos.wake_at = None;
                        let out = self.array_gate(|g, now, out| g.wake(now, out));
                        self.array_releases(out.1);
                    }
                }
                Ev::Component(i) => self.service_component(i),
                Ev::FaultRelease(slot) => self.enter_array(slot),
                Ev::CongestionTick => {
                    // The datastore-wide latency is averaged across hosts (as SIOC
                    // does through a file on the datastore); each host's gateway
                    // window steps with it and bounds its gate.
                    // With `fair_rate` each also paces to its share of what all did.
                    let mut datastore = DatastoreLatency::new();
                    let now = self.now;
                    let shares: Vec<Option<GatewayShare>> = (self.hosts.iter_mut())
                        .map(|h| {
                            let (latency, share) = h.qos.gate.take_gateway_period(now);
                            datastore.merge(&latency);
                            share
                        })
                        .collect();
                    let mean_ms = datastore.take_mean_ms();
                    self.push(self.now + period_ns.max(1), Ev::CongestionTick);
                    for h in 0..self.hosts.len() {
                        let others: Vec<GatewayShare> = (shares.iter().enumerate())
                            .filter(|(j, _)| *j != h)
                            .filter_map(|(_, s)| *s)
                            .collect();
                        let out = self.host_gate(h, |g, now, out| {
                            g.update_gateway_window(now, mean_ms, &others, out)
                        });
                        self.host_releases(h, out.1);
                    }
                }
                Ev::Sample => {
                    for c in &mut self.comps {
                        c.busy_at.push(c.c.busy_ns());
                    }
                    for h in &mut self.hosts {
                        if let Some(w) = h.qos.gate.gateway_window() {
                            h.window_series.push(w.window as f64);
                        }
                    }
                    progress(Progress {
                        cases_done,
                        cases_total,
                        case: plan.name.clone(),
                        simulated_s: self.now as f64 / 1e9,
                        case_simulated_s: self.end as f64 / 1e9,
                    });
                    self.push(self.now + plan.interval_ns, Ev::Sample);
                }
                Ev::MeasureStart => self.start_measuring(),
                Ev::End => break,
            }
        }
        self.report()
    }

    fn start_measuring(&mut self) {
        self.measuring = true;
        self.measure_start = self.now;
        for c in &mut self.comps {
            c.busy_at_start = c.c.busy_ns();
            c.ios = 0;
            c.bytes = 0;
        }
        self.parts_at_start = self.comps[0].c.parts();
        if let Some((c, _, _, _)) = &mut self.array_cache {
            c.hits = 0;
            c.misses = 0;
        }
        for h in &mut self.hosts {
            if let Some(c) = &mut h.cache {
                c.at_start = c.model.total_stats();
            }
        }
        for h in &mut self.hosts {
            h.area = 0;
            h.last_change = self.now;
            h.dispatched = 0;
            h.dispatched_bytes = 0;
        }
    }

    fn poll_worker(&mut self, vm: u32, worker: u32) {
        loop {
            let v = &mut self.vms[vm as usize];
            let out = v.outstanding[worker as usize];
            match v.generator.poll(self.now, worker, out) {
                Issue::Io(io) => {
                    v.outstanding[worker as usize] += 1;
                    self.issue(vm, worker, io);
                }
                Issue::At(t) => {
                    let t = t.max(self.now + 1);
                    if v.wake_at[worker as usize] != Some(t) {
                        v.wake_at[worker as usize] = Some(t);
                        self.push(t, Ev::WorkerWake { vm, worker });
                    }
                    break;
                }
                Issue::Blocked => break,
            }
        }
    }

    fn kind(io: &IoRequest) -> IoKind {
        if io.dir == Direction::Read {
            IoKind::Read
        } else {
            IoKind::Write
        }
    }

    fn alloc_req(&mut self, req: Req) -> u32 {
        match self.free.pop() {
            Some(s) => {
                self.reqs[s as usize] = req;
                s
            }
            None => {
                self.reqs.push(req);
                self.reqs.len() as u32 - 1
            }
        }
    }

    fn free_req(&mut self, slot: u32) {
        self.reqs[slot as usize] = FREE_REQ;
        self.free.push(slot);
    }

    fn issue(&mut self, vm: u32, worker: u32, io: IoRequest) {
        {
            let v = &mut self.vms[vm as usize];
            let w = worker as usize;
            let sequential = v.last_end[w] == io.offset_bytes;
            v.last_end[w] = io.offset_bytes + io.size_bytes as u64;
            if self.measuring {
                self.sizes
                    .record(io.size_bytes as u64, io.dir == Direction::Read, sequential);
            }
        }
        let slot = self.alloc_req(Req {
            vm,
            worker,
            io,
            issued_at: self.now,
            ..FREE_REQ
        });
        self.prefetch_array_cache(slot);
        if self.host_cache_issue(slot) {
            return;
        }
        self.submit_to_host(slot);
    }

    /// A new request of a VM that uses its host's flash cache, as `weir serve`'s
    /// flash cache layer takes it: a read asks the cache, and every block valid
    /// sends it to the flash (true: it went there); a miss goes down whole, its
    /// fill (if admitted) for when the data is back. A write drops the blocks it
    /// touches and cancels overlapping fills before it goes down (write-through
    /// with invalidation) and ends when the array acknowledged it.
    fn host_cache_issue(&mut self, slot: u32) -> bool {
        let r = self.reqs[slot as usize];
        let v = &self.vms[r.vm as usize];
        let Some(volume) = v.flash_volume else {
            return false;
        };
        // The OLTP model's log drive is not cached (000), as a volume without it.
        if !v.generator.host_cacheable(r.io.offset_bytes) {
            return false;
        }
        let Some(cache) = &mut self.hosts[v.plan.host].cache else {
            return false;
        };
        let (offset, length) = (r.io.offset_bytes, r.io.size_bytes as u64);
        let op = match r.io.dir {
            Direction::Write => HostCacheOp::Write(cache.model.write_begin(volume, offset, length)),
            Direction::Read => match cache.model.read(volume, offset, length) {
                ReadPlan::Hit { slots, .. } => {
                    let comp = cache.comp;
                    let s = slot as usize;
                    if self.host_hits.len() <= s {
                        self.host_hits.resize_with(s + 1, Vec::new);
                    }
                    self.host_hits[s] = slots;
                    let r = &mut self.reqs[s];
                    r.host_cache = HostCacheOp::Hit;
                    r.stage = Stage::HostFlash;
                    self.submit(comp, slot);
                    return true;
                }
                ReadPlan::Miss { fill } => HostCacheOp::Miss(fill),
                ReadPlan::Bypass => HostCacheOp::None,
            },
        };
        self.reqs[slot as usize].host_cache = op;
        false
    }

    /// Into the VM's host's gate (its QoS, then the array).
    fn submit_to_host(&mut self, slot: u32) {
        let r = self.reqs[slot as usize];
        let h = self.vms[r.vm as usize].plan.host;
        let request = GateRequest {
            volume: VolumeId(r.vm),
            client: ClientId(r.vm),
            kind: Self::kind(&r.io),
            offset: r.io.offset_bytes,
            length: r.io.size_bytes,
        };
        let (submitted, out) = self.host_gate(h, |g, now, out| g.submit(now, request, slot, out));
        if submitted.is_err() {
            self.release_bufs.push(out);
            self.fail(slot);
            return;
        }
        self.host_releases(h, out);
    }

    /// The whole request in `slot` ended (`ok`: without error): tells its host's
    /// flash cache. A miss's fill, when the read succeeded, writes the blocks the
    /// cache gave it to the flash device (a request of its own); the blocks become
    /// valid when that write completes.
    fn host_cache_end(&mut self, slot: u32, ok: bool) {
        let r = self.reqs[slot as usize];
        if r.host_cache == HostCacheOp::None {
            return;
        }
        self.reqs[slot as usize].host_cache = HostCacheOp::None;
        let h = self.vms[r.vm as usize].plan.host;
        let Some(cache) = &mut self.hosts[h].cache else {
            return;
        };
        match r.host_cache {
            HostCacheOp::Write(w) => cache.model.write_end(w),
            HostCacheOp::Miss(Some(fill)) if !ok => cache.model.filled(fill, false),
            HostCacheOp::Miss(Some(fill)) => {
                let slots = cache.model.fill_slots(fill);
                let Some(first) = slots.first() else {
                    cache.model.filled(fill, true);
                    return;
                };
                let comp = cache.comp;
                let io = IoRequest {
                    offset_bytes: first.block * cache.block_bytes,
                    size_bytes: (slots.len() as u64 * cache.block_bytes) as u32,
                    dir: Direction::Write,
                };
                let f = self.alloc_req(Req {
                    vm: r.vm,
                    io,
                    stage: Stage::HostFill,
                    issued_at: self.now,
                    host_cache: HostCacheOp::Fill(fill),
                    ..FREE_REQ
                });
                self.submit(comp, f);
            }
            HostCacheOp::Fill(fill) => cache.model.filled(fill, ok),
            HostCacheOp::Hit | HostCacheOp::Miss(None) | HostCacheOp::None => {}
        }
    }

    fn note_outstanding(h: &mut HostState, now: Nanos) {
        h.area += h.qos.gate.in_flight() as u128 * (now - h.last_change) as u128;
        h.last_change = now;
    }

    fn take_buf(&mut self) -> Vec<Release<u32>> {
        self.release_bufs.pop().unwrap_or_default()
    }

    /// Calls host `hi`'s gate; returns the call's result and what it released (to
    /// hand to `host_releases` once the caller is done with its own bookkeeping).
    fn host_gate<R>(
        &mut self,
        hi: usize,
        call: impl FnOnce(&mut Gate<u32>, Nanos, &mut Vec<Release<u32>>) -> R,
    ) -> (R, Vec<Release<u32>>) {
        let (now, mut out) = (self.now, self.take_buf());
        let h = &mut self.hosts[hi];
        Self::note_outstanding(h, now);
        let r = call(&mut h.qos.gate, now, &mut out);
        if let Some(t) = h.qos.timer(now) {
            self.push(t, Ev::HostWake(hi as u32));
        }
        (r, out)
    }

    /// The array's gate, like `host_gate` (the array QoS is on).
    fn array_gate<R: Default>(
        &mut self,
        call: impl FnOnce(&mut Gate<u32>, Nanos, &mut Vec<Release<u32>>) -> R,
    ) -> (R, Vec<Release<u32>>) {
        let (now, mut out) = (self.now, self.take_buf());
        let Some(qos) = &mut self.array_qos else {
            return (R::default(), out);
        };
        let r = call(&mut qos.gate, now, &mut out);
        if let Some(t) = qos.timer(now) {
            self.push(t, Ev::ArrayQosWake);
        }
        (r, out)
    }

    /// The slot that travels for a released piece: the request's own when the piece
    /// is all of it, else a new slot for the piece (`part_of` says whose).
    fn piece_slot(&mut self, slot: u32, piece: Piece, part_of: PartOf) -> u32 {
        let r = self.reqs[slot as usize];
        if piece.last && piece.offset == r.io.offset_bytes && piece.length == r.io.size_bytes {
            return slot;
        }
        self.reqs[slot as usize].stage = Stage::Split;
        self.alloc_req(Req {
            io: IoRequest {
                offset_bytes: piece.offset,
                size_bytes: piece.length,
                dir: r.io.dir,
            },
            stage: Stage::Free,
            host_ticket: None,
            array_ticket: None,
            part_of,
            error: false,
            host_cache: HostCacheOp::None,
            ..r
        })
    }

    /// Sends what host `hi`'s gate released towards the array.
    fn host_releases(&mut self, hi: usize, mut out: Vec<Release<u32>>) {
        for rel in out.drain(..) {
            let now = self.now;
            let slot = rel.payload;
            if self.reqs[slot as usize].stage != Stage::Split {
                // Its first piece (or all of it) leaves the host now.
                self.reqs[slot as usize].host_dispatched_at = now;
            }
            let p = self.piece_slot(slot, rel.piece, PartOf::HostPiece(slot));
            let h = &mut self.hosts[hi];
            h.dispatched += 1;
            h.dispatched_bytes += rel.piece.length as u64;
            let cpu = h.cpu;
            let r = &mut self.reqs[p as usize];
            r.host_ticket = Some(rel.ticket);
            r.host_dispatched_at = now;
            match cpu {
                Some(c) => {
                    r.stage = Stage::HostCpu;
                    self.submit(c, p);
                }
                None => self.leave_host(hi, p),
            }
        }
        self.release_bufs.push(out);
    }

    /// A request the host's storage stack has processed goes onto the host's link.
    fn leave_host(&mut self, hi: usize, slot: u32) {
        let r = &mut self.reqs[slot as usize];
        if r.io.dir == Direction::Write
            && let Some(l) = self.hosts[hi].link
        {
            r.stage = Stage::HostLinkOut;
            self.submit(l, slot);
        } else {
            self.after_host_link(slot);
        }
    }

    /// Sends what the array's gate released to the tier each request was given.
    fn array_releases(&mut self, mut out: Vec<Release<u32>>) {
        for rel in out.drain(..) {
            let slot = rel.payload;
            let q = self.piece_slot(slot, rel.piece, PartOf::ArrayPiece(slot));
            self.reqs[q as usize].array_ticket = Some(rel.ticket);
            let tier = self.reqs[q as usize].tier;
            self.send_to_tier(q, tier, rel.urgent && self.priority_queueing);
        }
        self.release_bufs.push(out);
    }

    fn device_io(&self, slot: u32) -> DeviceIo {
        let r = &self.reqs[slot as usize];
        DeviceIo {
            offset_bytes: self.vms[r.vm as usize].plan.base_offset + r.io.offset_bytes,
            size_bytes: r.io.size_bytes,
            dir: hw::dir_of(r.io.dir == Direction::Read),
        }
    }

    fn submit(&mut self, comp: u32, slot: u32) {
        self.submit_as(comp, slot, false);
    }

    /// Submits on behalf of the request's host (a device that serves its clients
    /// in turn, as a Ceph OSD, tells the hosts apart), `urgent` or not.
    fn submit_as(&mut self, comp: u32, slot: u32, urgent: bool) {
        let io = self.device_io(slot);
        let host = self.vms[self.reqs[slot as usize].vm as usize].plan.host as u32;
        let c = &mut self.comps[comp as usize];
        c.c.submit_from(self.now, io, slot as u64, host, urgent);
        self.arm(comp);
    }

    fn arm(&mut self, comp: u32) {
        let c = &mut self.comps[comp as usize];
        if let Some(t) = c.c.next_event_ns() {
            let t = t.max(self.now);
            if c.pending.is_none_or(|p| t < p) {
                c.pending = Some(t);
                self.push(t, Ev::Component(comp));
            }
        }
    }

    fn service_component(&mut self, comp: u32) {
        let now = self.now;
        let mut done = std::mem::take(&mut self.done);
        {
            let c = &mut self.comps[comp as usize];
            if c.pending == Some(now) {
                c.pending = None;
            }
            c.c.advance(now, &mut done);
        }
        for d in done.drain(..) {
            let slot = d.token as u32;
            if slot as usize >= self.reqs.len() || self.reqs[slot as usize].stage == Stage::Free {
                continue; // a model returned a token it was never given: ignore it
            }
            if self.measuring {
                let c = &mut self.comps[comp as usize];
                c.ios += 1;
                c.bytes += self.reqs[slot as usize].io.size_bytes as u64;
            }
            match self.reqs[slot as usize].stage {
                Stage::HostCpu => {
                    let vm = self.reqs[slot as usize].vm;
                    self.leave_host(self.vms[vm as usize].plan.host, slot);
                }
                Stage::HostLinkOut => self.after_host_link(slot),
                Stage::TargetCpu => self.reach_array(slot),
                Stage::TargetLinkOut => self.arrive_array(slot),
                Stage::Array | Stage::ArrayFlash => self.array_done(slot),
                Stage::HostFlash => self.cache_hit_complete(slot),
                Stage::HostFill => {
                    self.host_cache_end(slot, true);
                    self.free_req(slot);
                }
                Stage::TargetLinkBack => self.after_target_back(slot),
                Stage::HostLinkBack => self.host_complete(slot, false),
                Stage::Split | Stage::Free => {}
            }
        }
        self.done = done;
        self.arm(comp);
    }

    fn after_host_link(&mut self, slot: u32) {
        let r = &mut self.reqs[slot as usize];
        if r.io.dir == Direction::Write
            && let Some(t) = self.target_link
        {
            r.stage = Stage::TargetLinkOut;
            self.submit(t, slot);
        } else {
            self.arrive_array(slot);
        }
    }

    /// A request reaches the storage server: its processor first, if it has one.
    fn arrive_array(&mut self, slot: u32) {
        match self.target_cpu {
            Some(c) => {
                self.reqs[slot as usize].stage = Stage::TargetCpu;
                self.submit(c, slot);
            }
            None => self.reach_array(slot),
        }
    }

    fn reach_array(&mut self, slot: u32) {
        let io = self.device_io(slot);
        match self.faults.before_array(self.now, &io) {
            FaultAction::Pass => self.enter_array(slot),
            FaultAction::Delay(ns) => self.push(self.now + ns, Ev::FaultRelease(slot)),
            FaultAction::Fail => self.host_complete(slot, true),
        }
    }

    fn enter_array(&mut self, slot: u32) {
        if self.array_qos.is_some() {
            // The tier is looked up on arrival: the gate bounds each tier (class).
            let tier = self.backend_tier(slot);
            let r = &mut self.reqs[slot as usize];
            r.tier = tier;
            let vm = &self.vms[r.vm as usize].plan;
            let request = GateRequest {
                volume: VolumeId(vm.volume as u32),
                client: ClientId(vm.host as u32),
                kind: Self::kind(&r.io),
                offset: r.io.offset_bytes,
                length: r.io.size_bytes,
            };
            let class = if tier == Stage::ArrayFlash {
                FLASH_CLASS
            } else {
                0
            };
            let (submitted, out) = self.array_gate(|g, now, out| {
                g.submit_in_class(now, request, class, slot, out).is_ok()
            });
            self.array_releases(out);
            if !submitted {
                self.host_complete(slot, true);
            }
        } else {
            self.enter_backend(slot);
        }
    }

    /// Into the array: its flash cache when the read hits, else the array itself.
    fn enter_backend(&mut self, slot: u32) {
        let tier = self.backend_tier(slot);
        self.send_to_tier(slot, tier, false);
    }

    /// The tier that serves a request: `Stage::ArrayFlash` (a read whose blocks are
    /// all in the flash tier, or a write absorbed by it) or `Stage::Array` (disks).
    /// Looks the flash tier up and fills it (misses and writes), so call it once per
    /// request.
    /// The array flash tier's keys of the blocks request `r` covers, into `keys`.
    fn array_cache_keys(&self, r: &Req, keys: &mut Vec<u64>) {
        let Some((cache, _, clone_aware, _)) = &self.array_cache else {
            return;
        };
        let v = &self.vms[r.vm as usize];
        let bb = cache.block_bytes;
        let (start, end) = (
            r.io.offset_bytes,
            r.io.offset_bytes + r.io.size_bytes as u64,
        );
        match v.shared {
            Some(sh) if start >= sh.offset_bytes && end <= sh.offset_bytes + sh.len_bytes => {
                // A golden-image block: one copy for all clones when clone-aware,
                // one per clone otherwise.
                let owner = if *clone_aware {
                    splitmix(sh.image_id)
                } else {
                    splitmix(
                        ((r.vm as u64) << 32) ^ v.generator.clone_of(r.worker) as u64 ^ sh.image_id,
                    )
                };
                for b in (start - sh.offset_bytes) / bb..(end - sh.offset_bytes).div_ceil(bb) {
                    keys.push(splitmix(owner ^ b));
                }
            }
            _ => {
                let a = v.plan.base_offset + start;
                for b in a / bb..(a + r.io.size_bytes as u64).div_ceil(bb) {
                    keys.push(array_cache_key(b));
                }
            }
        }
    }

    /// Starts loading the array flash tier's index slots that request `slot` will
    /// look up when it reaches the array (a hint: the lookups are DRAM misses in an
    /// index of hundreds of MB; issued when the VM issues the request, they overlap
    /// the host's queueing and links). No effect on results.
    fn prefetch_array_cache(&mut self, slot: u32) {
        if self.array_cache.is_none() {
            return;
        }
        let mut keys = std::mem::take(&mut self.keys);
        keys.clear();
        self.array_cache_keys(&self.reqs[slot as usize], &mut keys);
        if let Some((cache, ..)) = &self.array_cache {
            for &k in keys.iter().take(4) {
                cache.prefetch(k);
            }
        }
        self.keys = keys;
    }

    fn backend_tier(&mut self, slot: u32) -> Stage {
        if self.array_cache.is_some() {
            let r = self.reqs[slot as usize];
            let mut keys = std::mem::take(&mut self.keys);
            keys.clear();
            self.array_cache_keys(&r, &mut keys);
            let Some((cache, _, _, write_back)) = &mut self.array_cache else {
                return Stage::Array;
            };
            let hit = match r.io.dir {
                Direction::Read => cache.lookup(&keys),
                Direction::Write => *write_back,
            };
            if !hit || r.io.dir == Direction::Write {
                cache.insert(&keys);
            }
            self.keys = keys;
            if hit {
                return Stage::ArrayFlash;
            }
        }
        Stage::Array
    }

    /// `urgent`: the array gate marked it (a protected volume): the device serves
    /// it ahead of ordinary commands where it has priority queueing.
    fn send_to_tier(&mut self, slot: u32, tier: Stage, urgent: bool) {
        self.reqs[slot as usize].stage = tier;
        let comp = match (tier, &self.array_cache) {
            (Stage::ArrayFlash, Some((_, flash, _, _))) => *flash,
            _ => 0,
        };
        self.submit_as(comp, slot, urgent);
    }

    fn array_done(&mut self, slot: u32) {
        let mut slot = slot;
        if let Some(ticket) = self.reqs[slot as usize].array_ticket.take() {
            let (finished, out) = self.array_gate(|g, now, out| g.complete(now, ticket, out));
            // What the freed slot lets go leaves first.
            self.array_releases(out);
            if let PartOf::ArrayPiece(whole) = self.reqs[slot as usize].part_of {
                self.free_req(slot);
                if finished.is_none() {
                    return;
                }
                slot = whole;
            }
        }
        let r = &mut self.reqs[slot as usize];
        if r.io.dir == Direction::Read {
            if let Some(t) = self.target_link {
                r.stage = Stage::TargetLinkBack;
                self.submit(t, slot);
            } else {
                self.after_target_back(slot);
            }
        } else {
            self.host_complete(slot, false);
        }
    }

    fn after_target_back(&mut self, slot: u32) {
        let vm = self.reqs[slot as usize].vm;
        let h = self.vms[vm as usize].plan.host;
        if let Some(l) = self.hosts[h].link {
            self.reqs[slot as usize].stage = Stage::HostLinkBack;
            self.submit(l, slot);
        } else {
            self.host_complete(slot, false);
        }
    }

    /// A request that never reached the host's device queue.
    fn fail(&mut self, slot: u32) {
        self.host_cache_end(slot, false);
        let r = self.reqs[slot as usize];
        let v = &mut self.vms[r.vm as usize];
        v.outstanding[r.worker as usize] -= 1;
        if self.measuring {
            v.stats.errors += 1;
        }
        self.reqs[slot as usize] = FREE_REQ;
        self.free.push(slot);
    }

    /// A request (or a piece of one) released by its host's gate completed.
    fn host_complete(&mut self, slot: u32, error: bool) {
        let now = self.now;
        let piece = self.reqs[slot as usize];
        let hi = self.vms[piece.vm as usize].plan.host;
        let ticket = piece.host_ticket;
        let (finished, out) = self.host_gate(hi, |g, now, out| {
            ticket.and_then(|t| g.complete(now, t, out))
        });
        let (slot, error) = match piece.part_of {
            PartOf::HostPiece(whole) => {
                self.reqs[whole as usize].error |= error;
                self.free_req(slot);
                if finished.is_none() {
                    self.host_releases(hi, out);
                    return;
                }
                (whole, self.reqs[whole as usize].error)
            }
            _ => (slot, error),
        };
        let r = self.reqs[slot as usize];
        let vi = r.vm as usize;
        let latency = now - r.issued_at;
        self.completed += 1;
        let bucket = (now / self.plan.interval_ns) as usize;
        {
            let v = &mut self.vms[vi];
            if let Some(b) = v.buckets.get_mut(bucket) {
                b.0 += r.io.size_bytes as u64;
                b.1 += 1;
                b.2 += latency as u128;
            }
            if let Some(b) = self.series_total.get_mut(bucket) {
                b.0 += r.io.size_bytes as u64;
                b.1 += 1;
                b.2 += (now - r.host_dispatched_at) as u128;
            }
            if let Some(b) = self.volume_buckets[v.plan.volume].get_mut(bucket) {
                b.0 += r.io.size_bytes as u64;
                b.1 += 1;
                b.2 += latency as u128;
            }
            if self.measuring {
                if error {
                    v.stats.errors += 1;
                    self.total.errors += 1;
                } else {
                    v.stats.record(&r.io, latency);
                    if let Some(s) = self.volume_stats.get_mut(v.plan.volume) {
                        s.record(&r.io, latency);
                    }
                    self.total.record(&r.io, latency);
                }
            }
            if error {
                v.generator.on_failure(now, r.worker, &r.io);
            } else {
                v.generator.on_complete(now, r.worker, &r.io, latency);
            }
            v.outstanding[r.worker as usize] -= 1;
        }
        self.host_cache_end(slot, !error);
        self.free_req(slot);
        self.host_releases(hi, out);
        self.poll_worker(r.vm, r.worker);
    }

    /// A read the host's flash cache served: never reached the host queue or array.
    /// If its slots were evicted or invalidated while it read them, it reads the
    /// array instead (without a fill), as the server's layer does.
    fn cache_hit_complete(&mut self, slot: u32) {
        let now = self.now;
        let r = self.reqs[slot as usize];
        let slots = std::mem::take(&mut self.host_hits[slot as usize]);
        let v = &self.vms[r.vm as usize];
        if let (Some(volume), Some(cache)) = (v.flash_volume, &mut self.hosts[v.plan.host].cache)
            && !cache.model.still_valid(volume, &slots)
        {
            let r = &mut self.reqs[slot as usize];
            r.host_cache = HostCacheOp::None;
            r.stage = Stage::Free;
            self.submit_to_host(slot);
            return;
        }
        let latency = now - r.issued_at;
        let bucket = (now / self.plan.interval_ns) as usize;
        let v = &mut self.vms[r.vm as usize];
        if let Some(b) = v.buckets.get_mut(bucket) {
            b.0 += r.io.size_bytes as u64;
            b.1 += 1;
            b.2 += latency as u128;
        }
        if self.measuring {
            v.stats.record(&r.io, latency);
            self.total.record(&r.io, latency);
        }
        self.completed += 1;
        v.generator.on_complete(now, r.worker, &r.io, latency);
        v.outstanding[r.worker as usize] -= 1;
        self.reqs[slot as usize] = FREE_REQ;
        self.free.push(slot);
        self.poll_worker(r.vm, r.worker);
    }

    /// Model metrics of every model VM over `[from, to)`, combined per `[[vm]]`.
    fn model_metrics(&self, window: &str, from: Nanos, to: Nanos) -> Vec<ModelMetricResult> {
        let mut out: Vec<ModelMetricResult> = Vec::new();
        let mut groups: Vec<(String, String, Vec<Vec<ModelMetric>>)> = Vec::new();
        for v in &self.vms {
            let Some(m) = &v.plan.model else { continue };
            let kind = match m {
                weir_workload::ModelSpec::Vdi(_) => "vdi",
                weir_workload::ModelSpec::Oltp(_) => "oltp",
                weir_workload::ModelSpec::Exchange(_) => "exchange",
            };
            let metrics = v.generator.metrics(from, to);
            match groups.iter_mut().find(|g| g.0 == v.plan.base) {
                Some(g) => g.2.push(metrics),
                None => groups.push((v.plan.base.clone(), kind.into(), vec![metrics])),
            }
        }
        for (source, kind, instances) in groups {
            let Some(first) = instances.first() else {
                continue;
            };
            for m in first {
                let parts: Vec<ModelMetric> = instances
                    .iter()
                    .filter_map(|ms| ms.iter().find(|x| x.name == m.name).cloned())
                    .collect();
                if let Some(c) = ModelMetric::combine(&parts) {
                    out.push(ModelMetricResult {
                        source: source.clone(),
                        kind: kind.clone(),
                        window: window.to_string(),
                        name: c.name,
                        value: c.value,
                        unit: c.unit,
                    });
                }
            }
        }
        out
    }

    /// Each model's schedule measured over all its instances (every `[[vm]]`
    /// running it, every copy) in `[from, to)`: the most clone creations and
    /// power-ons running at once, and the logins started with the time from the
    /// first start to the last. Source: the `[[model]]`'s name.
    fn schedule_metrics(&self, from: Nanos, to: Nanos) -> Vec<ModelMetricResult> {
        let mut logs: Vec<(&str, ScheduleLog)> = Vec::new();
        for v in &self.vms {
            let (Some(m), Some(log)) = (&v.plan.model, v.generator.schedule()) else {
                continue;
            };
            match logs.iter_mut().find(|l| l.0 == m.name()) {
                Some(l) => l.1.merge(&log),
                None => logs.push((m.name(), log)),
            }
        }
        let mut out = Vec::new();
        for (model, log) in logs {
            let mut push = |name: &str, value: f64, unit: &str| {
                out.push(ModelMetricResult {
                    source: model.to_string(),
                    kind: "vdi".into(),
                    window: String::new(),
                    name: name.into(),
                    value,
                    unit: unit.into(),
                })
            };
            for (name, spans) in [
                ("create_peak_concurrent", &log.creates),
                ("power_on_peak_concurrent", &log.power_ons),
            ] {
                let peak = peak_concurrent(spans, from, to);
                if peak > 0 {
                    push(name, peak as f64, "desktops");
                }
            }
            let starts = log.login_starts.iter().filter(|&&t| t >= from && t < to);
            let (n, first, last) = starts.fold((0u64, Nanos::MAX, 0), |(n, a, b), &t| {
                (n + 1, a.min(t), b.max(t))
            });
            if n > 0 {
                push("logins_started", n as f64, "count");
                push("login_window_s", (last - first) as f64 / 1e9, "s");
            }
        }
        out
    }

    /// The models' user-facing figures per timeline interval ("per phase and over
    /// time"): OLTP orders per minute and order latency, Exchange RPC latency, the
    /// Login VSI response time. Named `model:<vm> <metric>`; an
    /// interval without samples is NaN (a gap in charts, `null` in JSON).
    fn model_timeline(&self, intervals: usize) -> Vec<TimelineSeries> {
        const CHARTED: [&str; 4] = [
            "opm",
            "order_latency_mean_ms",
            "rpc_latency_mean_ms",
            "vsi_response_mean_ms",
        ];
        let step = self.plan.interval_ns;
        let mut series: Vec<TimelineSeries> = Vec::new();
        for i in 0..intervals {
            let (from, to) = (i as Nanos * step, (i as Nanos + 1) * step);
            for m in self.model_metrics("", from, to) {
                if !CHARTED.contains(&m.name.as_str()) {
                    continue;
                }
                let name = format!("model:{} {}", m.source, m.name);
                let s = match series.iter_mut().find(|s| s.name == name) {
                    Some(s) => s,
                    None => {
                        series.push(TimelineSeries {
                            name,
                            // Application latencies get their own chart, apart
                            // from the I/O latencies.
                            unit: if m.unit == "ms" {
                                "ms (application)".into()
                            } else {
                                m.unit.clone()
                            },
                            interval_s: step as f64 / 1e9,
                            values: vec![f64::NAN; i],
                        });
                        series.last_mut().expect("just pushed")
                    }
                };
                s.values.push(m.value);
            }
            for s in &mut series {
                s.values.resize(i + 1, f64::NAN);
            }
        }
        series
    }

    fn window_result(&self, w: &WindowPlan, now: Nanos) -> WindowResult {
        let i = self.plan.interval_ns;
        let (a, b) = ((w.start_ns / i) as usize, (w.end_ns.min(now) / i) as usize);
        let secs = (b.saturating_sub(a)).max(1) as f64 * i as f64 / 1e9;
        let sum = |buckets: &[&Vec<(u64, u64, u128)>]| {
            let mut t = (0u64, 0u64, 0u128);
            for bk in buckets {
                for x in bk.iter().take(b).skip(a) {
                    t.0 += x.0;
                    t.1 += x.1;
                    t.2 += x.2;
                }
            }
            t
        };
        let fig = |name: String, t: (u64, u64, u128)| WorkloadResult {
            name,
            iops: t.1 as f64 / secs,
            mbps: t.0 as f64 / 1e6 / secs,
            latency_ms: LatencySummary {
                mean: if t.1 == 0 {
                    0.0
                } else {
                    t.2 as f64 / t.1 as f64 / 1e6
                },
                ..Default::default()
            },
            ios: t.1,
            ..Default::default()
        };
        let mut figures = Vec::new();
        for (vi, vol) in self.plan.volumes.iter().enumerate() {
            figures.push(fig(
                format!("volume:{}", vol.name),
                sum(&[&self.volume_buckets[vi]]),
            ));
        }
        let mut levels: Vec<&str> = Vec::new();
        for vol in &self.plan.volumes {
            let l = vol.policy.service_level.map_or("best-effort", |l| l.name());
            if !levels.contains(&l) {
                levels.push(l);
            }
        }
        for l in levels {
            let bs: Vec<&Vec<(u64, u64, u128)>> = self
                .plan
                .volumes
                .iter()
                .enumerate()
                .filter(|(_, v)| v.policy.service_level.map_or("best-effort", |l| l.name()) == l)
                .map(|(i, _)| &self.volume_buckets[i])
                .collect();
            figures.push(fig(format!("level:{l}"), sum(&bs)));
        }
        let all: Vec<&Vec<(u64, u64, u128)>> = self.volume_buckets.iter().collect();
        figures.push(fig("total".into(), sum(&all)));
        let components = self
            .comps
            .iter()
            .map(|c| {
                let at = |k: usize| c.busy_at.get(k).copied().unwrap_or(c.c.busy_ns());
                ComponentResult {
                    name: c.name.clone(),
                    kind: c.kind.into(),
                    utilisation: at(b).saturating_sub(at(a)) as f64 / 1e9 / secs,
                    ..Default::default()
                }
            })
            .collect();
        WindowResult {
            name: w.name.clone(),
            start_s: w.start_ns as f64 / 1e9,
            end_s: w.end_ns as f64 / 1e9,
            figures,
            components,
        }
    }

    /// The case's report at the end of the run.
    fn report(mut self) -> CaseReport {
        let plan = self.plan;
        let now = self.now;
        let duration_s = (now - self.measure_start).max(1) as f64 / 1e9;
        self.close_hosts();
        let used = (now / plan.interval_ns) as usize;
        let mut timeline = self.io_timeline(used);
        timeline.extend(self.model_timeline(used));
        let mut model_metrics = self.model_metrics("", self.measure_start, now);
        model_metrics.extend(self.schedule_metrics(self.measure_start, now));
        let mut windows = Vec::new();
        // A window the run never reached (e.g. with --scale-duration) is not
        // measured at all: its figures would read as zeroes.
        for w in plan.windows.iter().filter(|w| w.start_ns < now) {
            model_metrics.extend(self.model_metrics(&w.name, w.start_ns, w.end_ns.min(now)));
            windows.push(self.window_result(w, now));
        }
        timeline.extend(self.volume_timeline(used));
        let io_sizes = (self.sizes.random_reads
            + self.sizes.sequential_reads
            + self.sizes.random_writes
            + self.sizes.sequential_writes
            > 0)
        .then(|| self.sizes.clone());
        let mut report = CaseReport {
            name: plan.name.clone(),
            description: plan.description.clone(),
            params: plan.params.clone(),
            duration_s,
            warmup_s: self.measure_start.min(now) as f64 / 1e9,
            workloads: self.workload_results(duration_s),
            total: Some(self.total.result("total".into(), duration_s)),
            comparisons: Vec::new(),
            components: self.component_results(duration_s),
            timeline,
            events: self.completed,
            model_metrics,
            windows,
            io_sizes,
        };
        report.comparisons = self.comparisons(&report);
        report
    }

    /// Ends the hosts' figures with the run: their outstanding-I/O area, and the
    /// PARDA window sampled in the last interval too.
    fn close_hosts(&mut self) {
        let now = self.now;
        let used_intervals = (now / self.plan.interval_ns) as usize;
        for h in &mut self.hosts {
            Self::note_outstanding(h, now);
            if let Some(w) = h.qos.gate.gateway_window()
                && h.window_series.len() < used_intervals
            {
                h.window_series.push(w.window as f64);
            }
        }
    }

    /// Per VM, then per volume (with several volumes or array QoS).
    fn workload_results(&self, duration_s: f64) -> Vec<WorkloadResult> {
        let plan = self.plan;
        let mut workloads = Vec::new();
        for v in &self.vms {
            let mut w = v.stats.result(v.plan.name.clone(), duration_s);
            w.volume = Some(plan.volumes[v.plan.volume].name.clone());
            w.host = Some(plan.hosts[v.plan.host].name.clone());
            workloads.push(w);
        }
        if plan.volumes.len() > 1 || plan.file.array_qos.is_some() {
            for (i, vol) in plan.volumes.iter().enumerate() {
                let mut w = self.volume_stats[i].result(format!("volume:{}", vol.name), duration_s);
                w.volume = Some(vol.name.clone());
                workloads.push(w);
            }
        }
        workloads
    }

    /// Hardware components, the array's parts, hosts, then the caches' hit ratios;
    /// busy time and transfers over the measured time.
    fn component_results(&self, duration_s: f64) -> Vec<ComponentResult> {
        let mut components = Vec::new();
        for c in &self.comps {
            components.push(ComponentResult {
                name: c.name.clone(),
                kind: c.kind.to_string(),
                utilisation: (c.c.busy_ns().saturating_sub(c.busy_at_start)) as f64
                    / 1e9
                    / duration_s,
                ios: c.ios,
                mbps: c.bytes as f64 / 1e6 / duration_s,
            });
        }
        for (i, p) in self.comps[0].c.parts().into_iter().enumerate() {
            let (busy0, ios0, bytes0) = self
                .parts_at_start
                .get(i)
                .map_or((0, 0, 0), |s| (s.busy_ns, s.ios, s.bytes));
            components.push(ComponentResult {
                name: p.name,
                kind: p.kind.to_string(),
                utilisation: p.busy_ns.saturating_sub(busy0) as f64 / 1e9 / duration_s,
                ios: p.ios.saturating_sub(ios0),
                mbps: p.bytes.saturating_sub(bytes0) as f64 / 1e6 / duration_s,
            });
        }
        for (i, h) in self.hosts.iter().enumerate() {
            components.push(ComponentResult {
                name: format!("host {}", self.plan.hosts[i].name),
                kind: "host".into(),
                utilisation: h.area as f64 / 1e9 / duration_s / h.queue_depth as f64,
                ios: h.dispatched,
                mbps: h.dispatched_bytes as f64 / 1e6 / duration_s,
            });
        }
        let hit_ratio = |name: String, hits: u64, misses: u64| ComponentResult {
            name,
            kind: "cache".into(),
            utilisation: hits as f64 / (hits + misses).max(1) as f64,
            ios: hits,
            mbps: 0.0,
        };
        if let Some((c, ..)) = &self.array_cache {
            components.push(hit_ratio(
                "array flash cache hit ratio".into(),
                c.hits,
                c.misses,
            ));
        }
        for (i, h) in self.hosts.iter().enumerate() {
            if let Some(c) = &h.cache {
                let s = c.model.total_stats().since(&c.at_start);
                let name = format!("host cache {} hit ratio", self.plan.hosts[i].name);
                components.push(hit_ratio(name, s.read_hits, s.read_misses));
            }
        }
        components
    }

    /// Per-interval I/O series over the first `used` intervals: each VM's, the
    /// datastore's, and each host's PARDA window.
    fn io_timeline(&self, used: usize) -> Vec<TimelineSeries> {
        let interval_s = self.plan.interval_ns as f64 / 1e9;
        let mut timeline = Vec::new();
        for v in &self.vms {
            let b = &v.buckets[..used.min(v.buckets.len())];
            let series =
                |suffix: &str, unit: &str, f: &dyn Fn(&(u64, u64, u128)) -> f64| TimelineSeries {
                    name: format!("{} {suffix}", v.plan.name),
                    unit: unit.into(),
                    interval_s,
                    values: b.iter().map(f).collect(),
                };
            timeline.push(series("MB/s", "MB/s", &|x| x.0 as f64 / 1e6 / interval_s));
            timeline.push(series("IOPS", "IOPS", &|x| x.1 as f64 / interval_s));
            timeline.push(series("latency", "ms", &mean_latency_ms));
        }
        let tb = &self.series_total[..used.min(self.series_total.len())];
        timeline.push(TimelineSeries {
            name: "total MB/s".into(),
            unit: "MB/s".into(),
            interval_s,
            values: tb.iter().map(|x| x.0 as f64 / 1e6 / interval_s).collect(),
        });
        timeline.push(TimelineSeries {
            name: "total IOPS".into(),
            unit: "IOPS".into(),
            interval_s,
            values: tb.iter().map(|x| x.1 as f64 / interval_s).collect(),
        });
        timeline.push(TimelineSeries {
            name: "datastore device latency".into(),
            unit: "ms".into(),
            interval_s,
            values: tb.iter().map(mean_latency_ms).collect(),
        });
        for (i, h) in self.hosts.iter().enumerate() {
            if !h.window_series.is_empty() {
                timeline.push(TimelineSeries {
                    name: format!("host {} window", self.plan.hosts[i].name),
                    unit: "I/Os".into(),
                    interval_s,
                    values: h.window_series.clone(),
                });
            }
        }
        timeline
    }

    /// Per-volume IOPS and latency over the first `used` intervals (with several volumes).
    fn volume_timeline(&self, used: usize) -> Vec<TimelineSeries> {
        let interval_s = self.plan.interval_ns as f64 / 1e9;
        let mut timeline = Vec::new();
        if self.plan.volumes.len() <= 1 {
            return timeline;
        }
        for (vi, vol) in self.plan.volumes.iter().enumerate() {
            let b = &self.volume_buckets[vi][..used.min(self.volume_buckets[vi].len())];
            timeline.push(TimelineSeries {
                name: format!("volume:{} IOPS", vol.name),
                unit: "IOPS".into(),
                interval_s,
                values: b.iter().map(|x| x.1 as f64 / interval_s).collect(),
            });
            timeline.push(TimelineSeries {
                name: format!("volume:{} latency", vol.name),
                unit: "ms".into(),
                interval_s,
                values: b.iter().map(mean_latency_ms).collect(),
            });
        }
        timeline
    }

    /// The case's `compare` figures, read from `report`; a figure of a window the run
    /// never reached says so.
    fn comparisons(&self, report: &CaseReport) -> Vec<Comparison> {
        let now = self.now;
        let unreached: Vec<&str> = self
            .plan
            .windows
            .iter()
            .filter(|w| w.start_ns >= now)
            .map(|w| w.name.as_str())
            .collect();
        self.plan
            .compare
            .iter()
            .map(|c| Comparison {
                metric: if c.label.is_empty() {
                    c.metric.clone()
                } else {
                    c.label.clone()
                },
                weir: metric_value(report, &c.metric).unwrap_or(f64::NAN),
                seed: c.seed,
                source: c.source.clone(),
                expr: c.metric.clone(),
                note: match unreached
                    .iter()
                    .find(|w| metric_windows(&c.metric).any(|m| m == **w))
                {
                    Some(w) => format!(
                        "window {w} starts after the run ends ({:.0} s): not measured",
                        now as f64 / 1e9
                    ),
                    None => c.note.clone(),
                },
                ..compare_fields(c)
            })
            .collect()
    }
}

/// A timeline bucket's (bytes, I/Os, latency sum in ns) mean latency, ms (0 without I/Os).
fn mean_latency_ms(x: &(u64, u64, u128)) -> f64 {
    if x.1 == 0 {
        0.0
    } else {
        x.2 as f64 / x.1 as f64 / 1e6
    }
}

/// The fields of a report's comparison that come from its row as they are: the
/// kind, a target's bounds, a calibration's fitted parameter.
fn compare_fields(c: &crate::topology::CompareSpec) -> Comparison {
    use crate::topology::CompareKind;
    use weir_report::ComparisonKind;
    Comparison {
        kind: match c.kind {
            CompareKind::Prediction => ComparisonKind::Prediction,
            CompareKind::Calibration => ComparisonKind::Calibration,
            CompareKind::Target => ComparisonKind::Target,
        },
        at_most: c.at_most,
        at_least: c.at_least,
        fitted: c.fitted.clone(),
        ..Comparison::default()
    }
}

/// The window names a compare metric uses (`…@name`, also in `a / b`, `a + b`).
fn metric_windows(metric: &str) -> impl Iterator<Item = &str> {
    metric.split('@').skip(1).map(|rest| {
        rest.split(|c: char| c.is_whitespace() || c == '/' || c == '+')
            .next()
            .unwrap_or_default()
    })
}

const FIELDS: &[&str] = &[
    "iops",
    "mbps",
    "read_iops",
    "write_iops",
    "latency_mean_ms",
    "latency_p50_ms",
    "latency_p95_ms",
    "latency_p99_ms",
    "latency_max_ms",
];

/// Validates a compare metric against a case's VMs and volumes.
pub(crate) fn check_metric(
    metric: &str,
    vms: &[VmPlan],
    volumes: &[VolumePlan],
    windows: &[WindowPlan],
) -> Result<(), String> {
    if let Some((a, b)) = metric
        .split_once(" / ")
        .or_else(|| metric.split_once(" + "))
    {
        if a.trim().parse::<f64>().is_err() {
            check_metric(a.trim(), vms, volumes, windows)?;
        }
        return match b.trim().parse::<f64>() {
            Ok(x) if x.is_finite() && x != 0.0 => Ok(()),
            Ok(_) => Err(format!(
                "metric {metric:?}: a number in it must be finite and non-zero"
            )),
            Err(_) => check_metric(b.trim(), vms, volumes, windows),
        };
    }
    let (metric, window) = match metric.split_once('@') {
        Some((m, w)) => {
            if !windows.iter().any(|x| x.name == w) {
                return Err(format!(
                    "metric {metric:?}: no [[scenario.window]] named {w:?}"
                ));
            }
            (m, Some(w))
        }
        None => (metric, None),
    };
    if let Some(rest) = metric.strip_prefix("model:") {
        let Some((vm, _field)) = rest.split_once('.') else {
            return Err(format!(
                "metric {metric:?} must look like `model:<vm>.<metric>`"
            ));
        };
        // A `[[vm]]` running a model, or a `[[model]]` some VM runs (its
        // model-wide schedule figures).
        return if vms.iter().any(|v| {
            v.model
                .as_ref()
                .is_some_and(|m| v.base == vm || m.name() == vm)
        }) {
            Ok(())
        } else {
            Err(format!(
                "metric {metric:?}: no [[vm]] named {vm:?} runs a model, and no VM runs a [[model]] of that name"
            ))
        };
    }
    if window.is_some() && metric.starts_with("component:") {
        return if metric.ends_with(".utilisation") {
            Ok(())
        } else {
            Err(format!(
                "metric {metric:?}: inside a window a component has only its utilisation"
            ))
        };
    }
    if window.is_some() {
        let ok = metric.starts_with("volume:")
            || metric.starts_with("level:")
            || metric.starts_with("total.");
        let field = metric.rsplit_once('.').map_or("", |x| x.1);
        if !ok || !matches!(field, "iops" | "mbps" | "latency_mean_ms") {
            return Err(format!(
                "metric {metric:?}: inside a window only volume:<v>, level:<service level> and total with iops, mbps, latency_mean_ms"
            ));
        }
        if metric.starts_with("level:") {
            return Ok(());
        }
    }
    let Some((name, field)) = metric.rsplit_once('.') else {
        return Err(format!(
            "metric {metric:?} must look like `<vm>.<field>`, `volume:<name>.<field>`, `total.<field>` or `component:<name>.utilisation`"
        ));
    };
    if let Some(_component) = name.strip_prefix("component:") {
        return if matches!(field, "utilisation" | "mbps" | "ios" | "iops") {
            Ok(())
        } else {
            Err(format!(
                "component metrics are utilisation, mbps, ios, iops; got {field:?}"
            ))
        };
    }
    if !FIELDS.contains(&field) {
        return Err(format!(
            "unknown field {field:?} in metric {metric:?} (fields: {})",
            FIELDS.join(", ")
        ));
    }
    let known = name == "total"
        || vms.iter().any(|v| v.name == name)
        || name
            .strip_prefix("volume:")
            .is_some_and(|n| volumes.iter().any(|v| v.name == n));
    if known {
        Ok(())
    } else {
        Err(format!(
            "metric {metric:?}: no VM, volume or total named {name:?}"
        ))
    }
}

/// The value of a compare metric in a finished case.
pub(crate) fn metric_value(report: &CaseReport, metric: &str) -> Option<f64> {
    let operand = |m: &str| {
        m.trim()
            .parse::<f64>()
            .ok()
            .or_else(|| metric_value(report, m.trim()))
    };
    if let Some((a, b)) = metric.split_once(" / ") {
        return Some(operand(a)? / operand(b)?);
    }
    if let Some((a, b)) = metric.split_once(" + ") {
        return Some(operand(a)? + operand(b)?);
    }
    let (metric, window) = match metric.split_once('@') {
        Some((m, w)) => (m, w),
        None => (metric, ""),
    };
    if let Some(rest) = metric.strip_prefix("model:") {
        let (vm, field) = rest.split_once('.')?;
        return report
            .model_metrics
            .iter()
            .find(|m| m.source == vm && m.name == field && m.window == window)
            .map(|m| m.value)
            .or(Some(f64::NAN));
    }
    if !window.is_empty() {
        let w = report.windows.iter().find(|w| w.name == window)?;
        let (name, field) = metric.rsplit_once('.')?;
        if let Some(c) = name.strip_prefix("component:") {
            let c = w.components.iter().find(|x| x.name == c)?;
            return (field == "utilisation").then_some(c.utilisation);
        }
        let f = w.figures.iter().find(|f| f.name == name)?;
        return match field {
            "iops" => Some(f.iops),
            "mbps" => Some(f.mbps),
            "latency_mean_ms" => Some(f.latency_ms.mean),
            _ => None,
        };
    }
    let (name, field) = metric.rsplit_once('.')?;
    if let Some(c) = name.strip_prefix("component:") {
        let c = report.components.iter().find(|x| x.name == c)?;
        return match field {
            "utilisation" => Some(c.utilisation),
            "mbps" => Some(c.mbps),
            "ios" => Some(c.ios as f64),
            "iops" => Some(c.ios as f64 / report.duration_s),
            _ => None,
        };
    }
    let w = if name == "total" {
        report.total.as_ref()?
    } else {
        report.workloads.iter().find(|w| w.name == name)?
    };
    Some(match field {
        "iops" => w.iops,
        "mbps" => w.mbps,
        "read_iops" => w.read_iops,
        "write_iops" => w.write_iops,
        "latency_mean_ms" => w.latency_ms.mean,
        "latency_p50_ms" => w.latency_ms.p50,
        "latency_p95_ms" => w.latency_ms.p95,
        "latency_p99_ms" => w.latency_ms.p99,
        "latency_max_ms" => w.latency_ms.max,
        _ => return None,
    })
}
