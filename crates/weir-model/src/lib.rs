//! # weir-model — storage hardware as pure state machines
//!
//! Service-time models from first principles, calibrated on datasheets: a disk is
//! seek + rotation + transfer with command-queue reordering, an SSD is per-channel
//! latency and bandwidth, RAID is its mapping and parity cost, a controller is a
//! bandwidth cap plus a cache, a link is its bandwidth and latency.
//!
//! Deviation from the first architecture sketch (which said this crate "must not
//! schedule anything"): a device's internal queue (NCQ/TCQ reordering, channel
//! parallelism, controller destaging) *is* part of its service-time model, so each
//! component here is a pure state machine with the shape
//! `submit(now, io, token)` / `next_event_ns()` / `advance(now, &mut done)`.
//! No clock, no threads, no I/O: the simulator drives them with virtual time and the
//! server's emulated-device mode with real time, and both get the same answers.
//!
//! ## What is here
//! * [`Hdd`] / [`HddSpec`]: seek curve (√ short, linear long, fitted to the datasheet
//!   average), rotation tracked from time, zoned media rate, SPTF reordering over the
//!   drive queue, sequential streaming with segment read-ahead, optional write cache.
//!   Presets: Savvio 15K.3, Savvio 10K.5, 7,200 rpm SATA.
//! * [`Ssd`] / [`SsdSpec`]: parallel flash channels + shared data path with IOPS caps.
//!   Presets: Intel SSD 710 (SATA), Fusion-io ioDrive2 (PCIe flash).
//! * [`RaidLayout`] / [`RaidSpec`]: RAID 0/1/5/6/10/50/60 placement and per-request
//!   drive I/O plans (read-modify-write, reconstruct-write, full-stripe writes).
//! * [`ControllerSpec`]: bandwidth cap (PCIe Gen2/Gen3 presets), per-I/O cost, cache
//!   size and policies (write-back/through, read-ahead, cached/direct, battery).
//! * [`Array`] / [`ArraySpec`]: controller + cache + RAID + drives as one component,
//!   deserializable from TOML, with named presets ([`ARRAY_PRESETS`]).
//! * [`Link`] / [`LinkSpec`]: full-duplex FIFO link (FC 4G/8G, 1/10 GbE presets).
//! * [`Processor`] / [`ProcessorSpec`]: CPUs doing per-request work (a controller,
//!   a software iSCSI target or initiator): cores, a fixed cost per read and per
//!   write, a per-byte rate; presets name the measurement they were fitted on.
//! * [`FlashCache`] / [`FlashCacheSpec`]: a host-side flash read cache's decisions
//!   (hit or miss, which misses fill, where each block lives, invalidation by
//!   writes, a sequential-scan cutoff), with no data, I/O or clock: the server's
//!   flash cache layer and the simulator's host caches both drive it.
//! * [`CloneCacheSpec`]: clone-aware (or unaware) array cache, an [`ArraySpec`] option
//!   (`clone_cache = { size_mib, aware }`) with images and linked clones registered by
//!   [`Array::add_image`] / [`Array::add_clone`] / [`Array::add_thin_clone`]
//!   (redirect-on-write map per clone).
//! * [`Placement`]: the extent placement decisions of a hybrid flash + disk tier
//!   (heat, promotion, demotion, landing writes, destage, records), driven by
//!   [`HybridArray`] and by `weir serve`'s tier layer
//! * [`HybridArray`] / [`HybridSpec`]: PCIe flash tier in front of a disk [`Array`]
//!   with dynamic data placement (extent heat with decay, promotion/demotion under a
//!   migration bandwidth budget, writes landing on flash and destaged); preset
//!   `iocontrol-n5-150` (seed 000).
//! * [`harness`]: a closed-loop driver for quick checks and benches.
//!
//! ```
//! use weir_model::{Array, Component, DeviceIo, IoDir};
//!
//! let mut array = Array::from_preset("15k-sas-raid5x24", 1)?;
//! array.submit(0, DeviceIo { offset_bytes: 1 << 20, size_bytes: 8192, dir: IoDir::Read }, 7);
//! let mut done = Vec::new();
//! while let Some(t) = array.next_event_ns() {
//!     array.advance(t, &mut done);
//! }
//! assert_eq!(done.len(), 1);
//! assert_eq!(done[0].token, 7);
//! // One random 8 KiB read on an idle 15K drive: a few milliseconds.
//! assert!((100_000..20_000_000).contains(&done[0].at_ns));
//! # Ok::<(), weir_model::ModelError>(())
//! ```
//!
//! A flash read cache's decisions (the driver does the I/O and keeps the data):
//!
//! ```
//! use weir_model::{CachePolicy, FlashCache, FlashCacheSpec, ReadPlan};
//!
//! let mut cache = FlashCache::new(FlashCacheSpec {
//!     capacity_blocks: 1 << 16,
//!     block_bytes: 4096,
//!     policy: CachePolicy::Slru,
//!     scan_bytes: 4 << 20,
//! });
//! let v = cache.add_volume(true);
//! let ReadPlan::Miss { fill: Some(fill) } = cache.read(v, 1 << 20, 8192) else { unreachable!() };
//! // ... the read goes to the backing store; its data is written to these slots:
//! assert_eq!(cache.fill_slots(fill).len(), 2);
//! cache.filled(fill, true);
//! assert!(matches!(cache.read(v, 1 << 20, 8192), ReadPlan::Hit { .. }));
//! // A write drops what it covers before it goes down.
//! let w = cache.write_begin(v, 1 << 20, 4096);
//! cache.write_end(w);
//! assert!(matches!(cache.read(v, 1 << 20, 8192), ReadPlan::Miss { .. }));
//! ```

mod array;
mod block_cache;
mod ceph;
mod clone_cache;
mod controller;
mod error;
mod flash_cache;
pub mod harness;
mod hdd;
mod huge_pages;
mod hybrid;
mod link;
pub mod placement;
pub mod policy_lab;
mod prefetch;
mod processor;
mod raid;
mod read_cache;
mod ssd;

pub use array::{
    ARRAY_PRESETS, Array, ArrayRef, ArraySpec, ArrayStats, ControllerRef, DriveRef, DriveReport,
    DriveSpec, PolicyOverride,
};
pub use block_cache::{BlockCache, CachePolicy};
pub use ceph::{CephCluster, CephSpec, LinkRef, OsdStats};
pub use processor::{PROCESSOR_PRESETS, Processor, ProcessorSpec};
pub use read_cache::{Lookup, ReadCache, ReadCacheStats};

/// Where volume `volume_id` starts on a device of `capacity_bytes` when volumes are
/// spread by id (1 MiB aligned; a volume that runs past the end wraps, as the array
/// maps offsets modulo its capacity): how `weir serve`'s emulated device places its
/// volumes, and what a scenario's `placement = "spread"` reproduces.
pub fn spread_base(volume_id: u32, capacity_bytes: u64) -> u64 {
    let capacity = capacity_bytes.max(1);
    ((volume_id as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) % capacity) & !((1 << 20) - 1)
}
pub use clone_cache::{CloneCacheSpec, CloneCacheStats, CloneId, ImageId};
pub use controller::{BatteryState, ControllerSpec, IoPolicy, ReadPolicy, WritePolicy};
pub use error::ModelError;
pub use flash_cache::{
    DEFAULT_FLASH_BLOCK_BYTES, DEFAULT_SCAN_CUTOFF_BYTES, FillId, FillSlot, FlashCache,
    FlashCacheSpec, FlashCacheStats, MAX_FLASH_CACHE_BLOCKS, MAX_FLASH_VOLUMES,
    MAX_INVALIDATE_BLOCKS, ReadPlan, SlotRef, WriteId,
};
pub use hdd::{DriveStats, Hdd, HddSpec};
pub use hybrid::{HYBRID_PRESETS, HybridArray, HybridSpec, HybridStats};
pub use link::{Link, LinkSpec};
pub use placement::{Move, Placement, PlacementSpec, PlacementStats, Record, Route};
pub use raid::{DataLocation, DriveIo, MIRROR_RUN_ROWS, RaidLayout, RaidPlan, RaidSpec};
pub use ssd::{Ssd, SsdSpec};

/// Nanoseconds on the driver's clock.
pub type Nanos = u64;

/// `x.round() as Nanos`, exactly (half away from zero; negative and NaN give 0, beyond
/// the range saturates), without the libm call `round` costs on baseline x86-64: the
/// device models round a duration on every request.
#[inline]
pub fn round_ns(x: f64) -> Nanos {
    let whole = x as Nanos;
    // Exact: below 2^53 `whole` and the fraction are representable; above, x is whole.
    let fraction = x - whole as f64;
    whole.saturating_add((fraction >= 0.5) as Nanos)
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IoDir {
    Read,
    Write,
}

/// One request as a device sees it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct DeviceIo {
    pub offset_bytes: u64,
    pub size_bytes: u32,
    pub dir: IoDir,
}

/// A finished request.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Completion {
    pub token: u64,
    pub at_ns: Nanos,
}

/// Moves the completions due by `now` from a `(time, sequence, token)` min-heap to
/// `done`, in time order (the `advance` of components that know each completion
/// time when the request is submitted).
pub(crate) fn drain_due(
    heap: &mut std::collections::BinaryHeap<std::cmp::Reverse<(Nanos, u64, u64)>>,
    now: Nanos,
    done: &mut Vec<Completion>,
) {
    while let Some(std::cmp::Reverse((at, _, token))) = heap.peek().copied() {
        if at > now {
            break;
        }
        heap.pop();
        done.push(Completion { token, at_ns: at });
    }
}

/// A pure queueing state machine.
///
/// Contract: the driver calls `submit` at `now`; it calls `advance(t)` with
/// non-decreasing `t` no later than `next_event_ns()` whenever that is `Some` (it may
/// call it earlier too); `advance` appends every request finished at or before `t`,
/// in completion order, with its exact completion time.
pub trait Component {
    fn submit(&mut self, now: Nanos, io: DeviceIo, token: u64);
    /// Submits a command the device should serve ahead of the ordinary ones queued
    /// with it (SCSI's HEAD OF QUEUE task attribute, SATA NCQ priority; Linux passes
    /// an I/O's real-time `ioprio` class down to them). A device without priority
    /// queueing serves it like any other command (this default).
    fn submit_urgent(&mut self, now: Nanos, io: DeviceIo, token: u64) {
        self.submit(now, io, token);
    }
    /// Submits a command on behalf of `client` (a host, a gateway), `urgent` or
    /// not: a device that serves its clients in turn (a Ceph OSD's op queue) tells
    /// them apart; any other serves it like [`Component::submit`] or
    /// [`Component::submit_urgent`] (this default).
    fn submit_from(&mut self, now: Nanos, io: DeviceIo, token: u64, client: u32, urgent: bool) {
        let _ = client;
        if urgent {
            self.submit_urgent(now, io, token);
        } else {
            self.submit(now, io, token);
        }
    }
    fn next_event_ns(&self) -> Option<Nanos>;
    fn advance(&mut self, now: Nanos, done: &mut Vec<Completion>);
    /// Busy time so far (for utilisation = busy / elapsed), summed over parallel units
    /// and divided by their count.
    fn busy_ns(&self) -> Nanos;
}

#[cfg(test)]
mod round_tests {
    use super::round_ns;

    #[test]
    fn round_ns_is_round_as_u64() {
        let mut edges = vec![
            0.0,
            -0.0,
            0.49999999999999994,
            0.5,
            1.5,
            2.5,
            -0.5,
            -3.7,
            4503599627370495.5,
            4503599627370496.0,
            9007199254740993.0,
            1.8446744073709552e19,
            1e30,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
        ];
        // Halves and near-halves over many magnitudes.
        let mut x: f64 = 1e-3;
        while x < 1e20 {
            edges.extend([x, x + 0.5, x.floor() + 0.5, x * 1.000_000_1]);
            x *= 1.37;
        }
        for x in edges {
            assert_eq!(round_ns(x), x.round() as u64, "x = {x:e}");
        }
    }
}
