//! Datastore-wide congestion control: a per-host window on the shared datastore that
//! adapts to observed latency against a congestion threshold, in proportion to the
//! host's total shares (PARDA, Gulati et al., FAST 2009 — the approach behind SIOC):
//!
//! `w(t+1) = (1 − γ)·w(t) + γ·(L / lat(t) · w(t) + β)`, with `β ∝` host shares,
//! clamped to `[min_window, max_window]`, updated once per `period_ns`.

use crate::Nanos;

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CongestionConfig {
    /// Datastore-wide control on or off (off: each host keeps a fixed window).
    pub enabled: bool,
    /// Congestion threshold L, ms (5–100, default 30).
    pub threshold_ms: f64,
    pub gamma: f64,
    pub min_window: u32,
    pub max_window: u32,
    /// How often windows are recomputed.
    pub period_ms: f64,
}

impl Default for CongestionConfig {
    fn default() -> Self {
        CongestionConfig { enabled: true, threshold_ms: 30.0, gamma: 0.2, min_window: 4, max_window: 256, period_ms: 1000.0 }
    }
}

/// Aggregates completion latencies from every host of a datastore over one period
/// (SIOC shares them through a file on the datastore; the simulator directly).
#[derive(Clone, Debug, Default)]
pub struct DatastoreLatency {
    _todo: (),
}

/// One host's window on one datastore.
#[derive(Clone, Debug)]
pub struct HostWindow {
    _todo: (),
}

impl HostWindow {
    pub fn new(config: CongestionConfig, host_shares: u64, initial_window: u32) -> Self {
        let _ = (config, host_shares, initial_window);
        todo!("weir-qos helper")
    }
    pub fn window(&self) -> u32 {
        todo!()
    }
    pub fn set_host_shares(&mut self, host_shares: u64) {
        let _ = host_shares;
        todo!()
    }
    /// Recomputes the window from the datastore-wide mean latency of the last period.
    pub fn update(&mut self, now: Nanos, datastore_latency_ms: f64) -> u32 {
        let _ = (now, datastore_latency_ms);
        todo!()
    }
}
