//! Fault injection hook.
//!
//! Every request passes [`FaultInjector::before_array`] when it reaches the array
//! (after the links, before array-side QoS). `Scenario::run` uses [`NoFaults`];
//! `Scenario::run_with_faults` takes a builder for seeded injectors (a slow device,
//! read/write errors, as in TigerBeetle's simulated storage), which derive their
//! randomness from the run's seed so that a failing seed replays exactly. Scenario
//! files do not describe faults yet.

pub use weir_model::DeviceIo;
use weir_qos::Nanos;

/// What happens to one request at the array's door.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum FaultAction {
    /// Serve it normally.
    Pass,
    /// Hold it this long before the array sees it (a slow path or device).
    Delay(Nanos),
    /// Fail it: it completes at once as an error (counted in `errors`).
    Fail,
}

pub trait FaultInjector {
    fn before_array(&mut self, now: Nanos, io: &DeviceIo) -> FaultAction;
}

/// The default: no faults.
#[derive(Copy, Clone, Debug, Default)]
pub struct NoFaults;

impl FaultInjector for NoFaults {
    fn before_array(&mut self, _now: Nanos, _io: &DeviceIo) -> FaultAction {
        FaultAction::Pass
    }
}
