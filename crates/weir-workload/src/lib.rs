//! # weir-workload — what the clients ask of storage
//!
//! Pure: no I/O, no clock, no threads. A workload is a generator of
//! `(offset_bytes, size_bytes, read/write)` requests, polled by a driver (the
//! simulator on a virtual clock, later the load generator on a real one):
//!
//! - [`AccessSpec`]: an Iometer access specification (transfer-size mix with % read and
//!   % random per line, alignment, burstiness, outstanding I/Os per worker, workers,
//!   ramp-up, run time, dataset share of the volume), serde/TOML with unknown fields
//!   rejected.
//! - [`AccessGenerator`]: a deterministic generator for an `AccessSpec`
//!   (ChaCha8 by seed), one sequential stream per worker.
//! - [`IoGenerator`]: the small trait every generator implements, shaped so that models
//!   with think time (VDI, OLTP, Exchange; issue 4) fit: the driver polls a worker and
//!   gets an I/O, a time to come back, or "blocked until a completion".
//! - [`profiles`]: the nine application profiles of 002 Table 15 as named built-ins.
//! - [`Sweep`]: a parameter swept over a list of values (block size, queue depth…).
//! - [`ModelSpec`]: the application models of issue 4, TOML-configurable and
//!   deterministic by seed, each an [`IoGenerator`] usable by any driver: virtual
//!   desktops ([`VdiSpec`]: creation, power-on, initial/Monday/Tuesday login,
//!   application launches, dripping water, a Login VSI-like loop with
//!   [`vsi_summary`]), OLTP ([`OltpSpec`], DVD Store-like, orders per minute) and
//!   Exchange ([`ExchangeSpec`], LoadGen-like, RPC latency). Each file states its
//!   calibration and sources. Models report [`ModelMetric`]s over a window of the
//!   driver's clock through [`IoGenerator::metrics`].
//! - [`drive_fixed_latency`]: several generators driven together against storage of
//!   a fixed latency, their requests handed out in issue order (block traces for
//!   trace-driven studies such as the flash cache's replacement policies).

mod access;
mod exchange;
mod generator;
mod model;
mod oltp;
mod profiles;
mod sweep;
mod trace;
mod vdi;

pub use access::{AccessSpec, DEFAULT_DATASET_FRACTION, MAX_TRANSFER_BYTES, TransferLine};
pub use generator::{AccessGenerator, IoGenerator, IoRequest, Issue, ScheduleLog, peak_concurrent};
pub use model::{
    ExchangeSpec, LoginKind, ModelMetric, ModelSpec, OltpSpec, SharedRegion, SizeDist, VdiSpec,
};
pub use profiles::{Profile, ProfileMetric, profile, profile_names, profiles};
pub use sweep::{SWEEP_PARAMS, Sweep, expand_sweeps};
pub use trace::{TracedIo, drive_fixed_latency};
pub use vdi::{Activity, VsiSummary, vsi_summary};

/// Nanoseconds on the driver's clock.
pub type Nanos = u64;

/// Most VMs one scenario may hold (every `[[vm]]`'s `count` together): the same limit
/// for the simulator and `weir load`.
pub const MAX_VMS: usize = 100_000;

/// Direction of a request.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    Read,
    Write,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WorkloadError {
    /// A field has a value outside its range.
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
    #[error("unknown sweep parameter {0:?} (known: {known})", known = SWEEP_PARAMS.join(", "))]
    UnknownParam(String),
    #[error("unknown application profile {0:?} (known: {known})", known = profile_names().join(", "))]
    UnknownProfile(String),
}

impl WorkloadError {
    pub(crate) fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        WorkloadError::Invalid {
            field: field.into(),
            message: message.into(),
        }
    }
}
