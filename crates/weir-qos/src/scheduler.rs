//! The tag scheduler: reservation first, then shares, never past a limit
//! (mClock, Gulati et al., OSDI 2010), with size-normalised cost and service-level
//! protection under overload.
//!
//! API contract (drivers rely on it; see docs/ARCHITECTURE.md):
//! - `enqueue` queues a request on a volume, tagged with the client it came from.
//! - The driver calls `dispatch(now)` whenever it has room for one more outstanding
//!   request downstream. It gets `Dispatch::Io` (send it now), `Dispatch::WaitUntil(t)`
//!   (requests are queued but every one of them is held back by a limit until `t`;
//!   call again at `t` or when something else happens), or `Dispatch::Idle`.
//! - The driver calls `complete` when a dispatched request finishes, with its latency
//!   as the client saw it (queueing in the scheduler included).
//! - All state is per volume: the clients of one volume share its reservation and
//!   limit; two volumes with the same policy each get the policy's full targets.

use crate::{ClientId, Nanos, Policy, VolumeId};

/// What kind of request (only size and direction matter for cost).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum IoKind {
    Read,
    Write,
    /// Flush, trim, zero, cache…: costs one unit, moves no data.
    Other,
}

/// The cost-relevant shape of a request.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct IoCost {
    pub kind: IoKind,
    pub size_bytes: u32,
}

#[derive(Clone, Debug, PartialEq)]
pub struct SchedulerConfig {
    /// IOPS are counted in units of this many bytes: a request costs
    /// `max(1, ceil(size / cost_unit_bytes))` I/Os against reservations and limits
    /// in IOPS, so one 1 MiB I/O uses the budget of 256 × 4 KiB I/Os (default 4096).
    /// `u32::MAX` counts every request as one I/O whatever its size (what
    /// ESXi 5.0 did, see scenarios/sioc-shares.toml).
    pub cost_unit_bytes: u32,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig { cost_unit_bytes: 4096 }
    }
}

/// Which rule released a request.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Released to meet the volume's reservation.
    Reservation,
    /// Released from spare capacity by shares (and service-level priority).
    Share,
}

/// A request released by `dispatch`.
#[derive(Debug)]
pub struct Dispatched<T> {
    pub volume: VolumeId,
    pub client: ClientId,
    pub cost: IoCost,
    pub enqueued_at: Nanos,
    pub phase: Phase,
    pub payload: T,
}

#[derive(Debug)]
pub enum Dispatch<T> {
    Io(Dispatched<T>),
    WaitUntil(Nanos),
    Idle,
}

/// Counters for one volume since it was added.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct VolumeStats {
    pub queued: usize,
    pub dispatched_ios: u64,
    pub dispatched_bytes: u64,
    pub completed_ios: u64,
    pub completed_bytes: u64,
    pub latency_sum_ns: u128,
    pub reservation_dispatches: u64,
}

pub struct Scheduler<T> {
    _todo: std::marker::PhantomData<T>,
}

impl<T> Scheduler<T> {
    pub fn new(config: SchedulerConfig) -> Self {
        let _ = config;
        todo!("weir-qos helper")
    }
    /// Adds a volume (policy already validated by the caller via `Policy::validate`).
    pub fn add_volume(&mut self, now: Nanos, volume: VolumeId, policy: Policy) {
        let _ = (now, volume, policy);
        todo!()
    }
    /// Changes a volume's policy; applies to requests already queued.
    pub fn set_policy(&mut self, now: Nanos, volume: VolumeId, policy: Policy) {
        let _ = (now, volume, policy);
        todo!()
    }
    /// Removes a volume and returns its queued payloads (the driver fails them).
    pub fn remove_volume(&mut self, volume: VolumeId) -> Vec<T> {
        let _ = volume;
        todo!()
    }
    /// Queues a request. Unknown volumes are an error the driver reports.
    pub fn enqueue(&mut self, now: Nanos, volume: VolumeId, client: ClientId, cost: IoCost, payload: T) -> Result<(), crate::PolicyError> {
        let _ = (now, volume, client, cost, payload);
        todo!()
    }
    pub fn dispatch(&mut self, now: Nanos) -> Dispatch<T> {
        let _ = now;
        todo!()
    }
    pub fn complete(&mut self, now: Nanos, volume: VolumeId, client: ClientId, cost: IoCost, latency_ns: Nanos) {
        let _ = (now, volume, client, cost, latency_ns);
        todo!()
    }
    pub fn queued(&self) -> usize {
        todo!()
    }
    pub fn stats(&self, volume: VolumeId) -> Option<VolumeStats> {
        let _ = volume;
        todo!()
    }
}
