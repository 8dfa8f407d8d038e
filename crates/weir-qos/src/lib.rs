//! # weir-qos — the pure QoS engine
//!
//! Events in (`enqueue`, `dispatch`, `complete`, each with `now`), decisions out.
//! No I/O, no wall clock, no threads: the server drives it with real time, the
//! simulator with virtual time, and both get the same decisions.
//!
//! - [`Scheduler`]: per-volume reservation / shares / limit tags (mClock) with
//!   size-normalised cost and service-level protection; see the `scheduler` module
//!   docs for every rule.
//! - [`HostWindow`] and [`DatastoreLatency`]: PARDA-style datastore-wide congestion
//!   control (a host's outstanding-I/O window against a latency threshold).
//! - [`Policy`] / [`PolicyCatalog`]: policies, the five built-ins, validation.
//!
//! Time is `Nanos` (u64 nanoseconds since an arbitrary epoch chosen by the driver).
//! Sizes are bytes; MB means 10^6 bytes (as storage vendors and Iometer's decimal
//! column count them).

pub mod congestion;
pub mod depth;
mod fair;
pub mod fair_rate;
pub mod gate;
mod heap;
pub mod policy;
pub mod scheduler;

pub use congestion::{CongestionConfig, CongestionError, DatastoreLatency, HostWindow};
pub use depth::{DepthConfig, DepthController};
pub use fair::Piece;
pub use fair_rate::{GatewayShare, RateCap};
pub use gate::{
    Finished, Gate, GateConfig, GateRequest, GatewayWindowStats, HostWindowStats, Rejected,
    Release, Ticket,
};
pub use policy::{Policy, PolicyCatalog, PolicyError, ServiceLevel, Shares};
pub use scheduler::{
    ClientStats, Dispatch, Dispatched, HELD_BACK_EVERY, IoCost, IoKind, PACE_QUANTUM_NS, Phase,
    Scheduler, SchedulerConfig, VolumeStats,
};

/// Nanoseconds on the driver's clock (virtual or real).
pub type Nanos = u64;
pub const NANOS_PER_SEC: Nanos = 1_000_000_000;
pub const NANOS_PER_MS: Nanos = 1_000_000;
/// Bytes in one MB (decimal), the unit of every `*_mbps` field.
pub const BYTES_PER_MB: f64 = 1_000_000.0;

/// A volume (LUN, export, or one VM's virtual disk).
#[derive(
    Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct VolumeId(pub u32);

/// A client of a volume: a host (initiator) or a VM, as the driver decides.
#[derive(
    Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct ClientId(pub u32);
