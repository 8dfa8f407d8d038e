//! # weir-load — `weir load`: workload models against real NBD exports, in real time
//!
//! The same [`weir_workload::IoGenerator`] models the simulator runs on a virtual
//! clock are driven here on the wall clock against real NBD exports (Weir's own,
//! nbdkit's, qemu-nbd's…):
//!
//! - many simulated VMs multiplexed over a bounded number of NBD connections
//!   ([`LoadOptions::connections`]); every connection is pipelined (all the VMs'
//!   outstanding requests in flight at once, replies taken in any order); `nbds://`
//!   targets over TLS ([`LoadOptions::tls`]: the CA, optionally a client certificate);
//! - model time runs [`LoadOptions::time_scale`] times faster than the wall clock
//!   (a 30-minute storm in 3 minutes with `time_scale = 10`): think times and bursts
//!   shrink, and the generators see latencies on the model clock (real × scale);
//! - with [`LoadOptions::verify`], every write carries a pattern derived from
//!   (seed, target, sector, write generation), a shadow map remembers what each sector
//!   should hold, and every read is checked against it (see [`verify`]);
//! - the result is the same [`weir_report::ScenarioReport`] `weir sim` prints: a row
//!   per VM, `volume:<export>` rows when there are several targets, the total;
//!   per-interval timeline; the models' figures (`model_metrics`, per `[[vm]]` and
//!   named window), named windows, the 004 I/O size histogram; per-target and
//!   per-workload-class summaries as components. It comes inside a [`LoadOutcome`] that
//!   also says whether the run passed ([`LoadOutcome::passed`]).
//!
//! [`run`] is synchronous: it builds its own single-threaded tokio runtime, so the whole
//! driver runs on one core. Inside an existing runtime use [`run_async`] (it runs on a
//! `LocalSet`, so the future is not `Send`; await it directly or from `block_on`).
//!
//! What runs ([`ScenarioSource`], parsed by [`LoadScenario::load`]): a `weir sim`
//! scenario file (its workload part), a built-in profile, or a one-line access
//! specification; see [`scenario`].

mod conn;
mod engine;
pub mod scenario;
mod stats;
pub mod target;
pub mod verify;

pub use conn::TlsFiles;
pub use scenario::{LoadScenario, LoadVm, ScenarioSource, VmWorkload, Window, parse_bytes};
pub use target::{DEFAULT_NBD_PORT, Target};

use std::time::Duration;
use weir_report::ScenarioReport;

/// Everything a load run needs.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// NBD exports to drive; VMs are spread over them (a VM whose `volume` names an
    /// export goes there).
    pub targets: Vec<Target>,
    /// What runs, parsed ([`LoadScenario::load`]).
    pub scenario: LoadScenario,
    /// Measured wall-clock time. The scenario's warm-up (`warmup_s / time_scale`,
    /// not measured) runs first, so the run takes both (at most 30 days), as `weir
    /// sim` measures `duration_s` after `warmup_s`. `None`: the scenario's
    /// `duration_s / time_scale`, or 10 s.
    pub duration: Option<Duration>,
    /// Model seconds per wall-clock second (> 0; 1 = real time).
    pub time_scale: f64,
    /// Most NBD connections over all targets (≥ the number of targets in use).
    /// `None`: up to 4 per target (never more than its VMs).
    pub connections: Option<u32>,
    /// Write verifiable patterns and check every read.
    pub verify: bool,
    /// The targets start zeroed: never-written sectors must read as zeroes
    /// (only with `verify`).
    pub target_zeroed: bool,
    /// `None`: the scenario's seed.
    pub seed: Option<u64>,
    /// Timeline interval (wall clock). `None`: the scenario's `timeline_interval_s`
    /// divided by `time_scale`, or 1 s.
    pub timeline_interval: Option<Duration>,
    /// How long to wait for the replies still outstanding when the run ends (and
    /// again for the final read-back); those that do not come are counted as errors.
    pub drain_timeout: Duration,
    /// With `verify`: after the run, read back up to this many bytes per target of
    /// what was written and check them (0: no final read-back).
    pub final_check_bytes: u64,
    /// The CA (and client certificate) for the `nbds://` targets that do not name
    /// their own `?tls-certificates=DIR`; refused when no target uses it.
    pub tls: Option<TlsFiles>,
    /// Most bytes the VMs' requests may hold in flight at once, over all targets:
    /// a request that would pass it waits (its worker with it) until completions
    /// make room, oldest first; one larger than the cap goes alone. Default
    /// [`DEFAULT_MAX_BYTES_IN_FLIGHT`].
    pub max_bytes_in_flight: u64,
}

/// [`LoadOptions::max_bytes_in_flight`]'s default, 1 GiB. The driver holds the
/// bytes in flight (a write's payload until it is sent, a read's reply as it
/// arrives), so this bounds its memory; a target queues far less (1 GiB is 100 ms
/// at 10 GB/s). Held back, not refused: a scenario's bound is its worst case
/// (the shipped `mixed-workload` could reach 10 GB by its models' largest
/// requests, and reaches a few MB), so refusing by it would refuse scenarios that
/// run well. When the cap does hold requests back the report says so
/// ([`LoadOutcome::held_for_byte_cap`], a line of its description): the load ran
/// below the depth asked for, and `--max-in-flight` raises the cap.
pub const DEFAULT_MAX_BYTES_IN_FLIGHT: u64 = 1 << 30;

impl LoadOptions {
    pub fn new(targets: Vec<Target>, scenario: LoadScenario) -> LoadOptions {
        LoadOptions {
            targets,
            scenario,
            duration: None,
            time_scale: 1.0,
            connections: None,
            verify: false,
            target_zeroed: false,
            seed: None,
            timeline_interval: None,
            drain_timeout: Duration::from_secs(10),
            final_check_bytes: 256 << 20,
            tls: None,
            max_bytes_in_flight: DEFAULT_MAX_BYTES_IN_FLIGHT,
        }
    }
}

/// Reported once per timeline interval while the run goes.
#[derive(Clone, Debug, PartialEq)]
pub struct LoadProgress {
    pub elapsed_s: f64,
    pub duration_s: f64,
    /// I/Os completed successfully so far (failures are in `errors`).
    pub ios: u64,
    /// Over the last interval.
    pub iops: f64,
    pub errors: u64,
    pub mismatched_reads: u64,
}

/// What `--verify` found.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct VerifySummary {
    /// Reads with at least one sector checked.
    pub reads_checked: u64,
    pub sectors_checked: u64,
    pub mismatched_sectors: u64,
    pub mismatched_reads: u64,
    /// Sectors checked by the final read-back (included in `sectors_checked`).
    pub final_sectors_checked: u64,
    /// The first mismatches (at most 20), described.
    pub first_mismatches: Vec<String>,
}

/// A finished run.
#[derive(Clone, Debug)]
pub struct LoadOutcome {
    pub report: ScenarioReport,
    /// I/Os completed successfully (measured or not); the failed ones are
    /// `io_errors`, never completions.
    pub ios: u64,
    /// Requests that failed: error replies, no reply by the end of the drain, lost
    /// with a broken connection.
    pub io_errors: u64,
    /// The first error messages (at most 20).
    pub first_errors: Vec<String>,
    /// Connections that broke (reset, protocol error), with the reason.
    pub connection_errors: Vec<String>,
    pub verify: Option<VerifySummary>,
    /// The application models' figures over the measured run (orders per minute, RPC
    /// latency, login times…), combined over the VMs of one workload and keyed by
    /// `"<workload> <metric>"`; empty for plain access specifications.
    pub model_metrics: std::collections::BTreeMap<String, weir_workload::ModelMetric>,
    /// The most bytes the VMs' requests held in flight at once.
    pub peak_bytes_in_flight: u64,
    /// Requests that waited for [`LoadOptions::max_bytes_in_flight`] (0: the cap
    /// never held the load back).
    pub held_for_byte_cap: u64,
}

impl LoadOutcome {
    /// No I/O error, no broken connection, no verify mismatch.
    pub fn passed(&self) -> bool {
        self.failures().is_empty()
    }

    /// Why the run did not pass, one line per reason (empty when it passed).
    pub fn failures(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.io_errors > 0 {
            out.push(format!("{} I/O errors", self.io_errors));
        }
        for c in &self.connection_errors {
            out.push(format!("connection broken: {c}"));
        }
        if let Some(v) = &self.verify
            && v.mismatched_sectors > 0
        {
            out.push(format!(
                "verify: {} mismatched sectors in {} reads",
                v.mismatched_sectors, v.mismatched_reads
            ));
        }
        out
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{0}")]
    InvalidOption(String),
    #[error("target {target:?}: {message}")]
    InvalidTarget { target: String, message: String },
    #[error("{file}: {message}")]
    Scenario { file: String, message: String },
    /// Connecting or negotiating with a target failed.
    #[error("{target}: {message}")]
    Connect { target: String, message: String },
    /// The workload does not fit the targets (sizes, read-only export…).
    #[error("{0}")]
    Layout(String),
    #[error("runtime: {0}")]
    Runtime(String),
}

/// Runs a load on its own single-threaded runtime (one core). Must not be called
/// from inside a tokio runtime (use [`run_async`] there, or `spawn_blocking`).
pub fn run(
    opts: LoadOptions,
    progress: &mut dyn FnMut(&LoadProgress),
) -> Result<LoadOutcome, LoadError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| LoadError::Runtime(e.to_string()))?;
    rt.block_on(run_async(opts, progress))
}

/// [`run`] on the caller's runtime, on a `LocalSet` of the current thread.
pub async fn run_async(
    opts: LoadOptions,
    progress: &mut dyn FnMut(&LoadProgress),
) -> Result<LoadOutcome, LoadError> {
    let local = tokio::task::LocalSet::new();
    local.run_until(engine::run(opts, progress)).await
}
