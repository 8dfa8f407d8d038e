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

mod array;
mod controller;
mod error;
mod hdd;
mod link;
mod raid;
mod ssd;

pub use array::{
    ARRAY_PRESETS, Array, ArraySpec, ArrayStats, ControllerRef, DriveRef, DriveReport,
    DriveSpec, PolicyOverride,
};
pub use controller::{BatteryState, ControllerSpec, IoPolicy, ReadPolicy, WritePolicy};
pub use error::ModelError;
pub use hdd::{DriveStats, Hdd, HddSpec};
pub use link::{Link, LinkSpec};
pub use raid::{DataLocation, DriveIo, RaidLayout, RaidPlan, RaidSpec};
pub use ssd::{Ssd, SsdSpec};

/// Nanoseconds on the driver's clock.
pub type Nanos = u64;

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

/// A pure queueing state machine.
///
/// Contract: the driver calls `submit` at `now`; it calls `advance(t)` with
/// non-decreasing `t` no later than `next_event_ns()` whenever that is `Some` (it may
/// call it earlier too); `advance` appends every request finished at or before `t`,
/// in completion order, with its exact completion time.
pub trait Component {
    fn submit(&mut self, now: Nanos, io: DeviceIo, token: u64);
    fn next_event_ns(&self) -> Option<Nanos>;
    fn advance(&mut self, now: Nanos, done: &mut Vec<Completion>);
    /// Busy time so far (for utilisation = busy / elapsed), summed over parallel units
    /// and divided by their count.
    fn busy_ns(&self) -> Nanos;
}
