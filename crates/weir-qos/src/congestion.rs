//! Datastore-wide congestion control: a per-host window on the shared datastore that
//! adapts to observed latency against a congestion threshold, in proportion to the
//! host's total shares (PARDA, Gulati et al., FAST 2009 — the approach behind SIOC):
//!
//! `w(t+1) = (1 − γ)·w(t) + γ·(L / lat(t) · w(t) + β)`, with `β ∝` host shares,
//! clamped to `[min_window, max_window]`, updated once per `period_ns`.
//!
//! - `L` is the congestion threshold (`threshold_ms`, 5–100 ms, default 30 ms) and
//!   `lat(t)` the datastore-wide mean latency of the last period, the IO-weighted
//!   average over every host's completions ([`DatastoreLatency`]).
//! - `β = host_shares / 1000 × BETA_PER_1000_SHARES` (1.0): a host with 1000 shares
//!   (one "normal" VM disk) adds one outstanding I/O per period at the fixed point.
//!   At equilibrium `w = β·lat / (lat − L)`, so hosts that see the same latency hold
//!   windows in proportion to their shares — which is what makes shares hold across
//!   hosts.
//! - Below the threshold `L / lat > 1` and the window grows (geometrically) back
//!   towards `max_window`; above it, it shrinks. With `max_window` at least the
//!   host's outstanding demand, control therefore only bites once latency crosses
//!   the threshold.
//! - With `enabled == false` the window never changes: it stays at the initial value
//!   (the device queue depth), as a host without SIOC keeps its fixed queue depth.
//!
//! How fast the windows reach the share ratio: the difference between two hosts'
//! windows decays by a factor `1 − γ·β_total/W_total` per period (`W_total` the sum of
//! windows at equilibrium), i.e. a time constant of `W_total / (γ·β_total)` periods;
//! 500 periods for two hosts of 2000 and 1000 shares on a 10,000-IOPS device at the
//! 30 ms threshold (`W_total` ≈ 300). A larger `β` converges faster at the price of a
//! standing latency overshoot of `≈ β_total / W_total` above the threshold; drivers
//! that want that trade set `beta_per_1000_shares` in the config
//! (10 converges in ≈ 50 periods with ≈ 10 % overshoot).
//!
//! The driver calls [`HostWindow::update`] once per period (see [`HostWindow::due`])
//! with the mean from [`DatastoreLatency::take_mean_ms`], and skips the update when
//! that returned `None` (no I/O in the period).

use crate::{NANOS_PER_MS, Nanos};

/// `β` for a host with 1000 shares.
pub const BETA_PER_1000_SHARES: f64 = 1.0;
/// The largest `β` per 1000 shares accepted (a window step of 100 I/Os per period
/// for a normal volume is already far past any useful convergence speed).
pub const MAX_BETA_PER_1000_SHARES: f64 = 100.0;
/// Valid congestion thresholds, ms (003).
pub const MIN_THRESHOLD_MS: f64 = 5.0;
pub const MAX_THRESHOLD_MS: f64 = 100.0;
/// Valid periods, ms: from 1 ms (each period may cost the driver I/O of its own:
/// a gateway's exchange through the stats volume) to a minute.
pub const MIN_PERIOD_MS: f64 = 1.0;
pub const MAX_PERIOD_MS: f64 = 60_000.0;

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
    /// `β` for a host of 1000 shares (default [`BETA_PER_1000_SHARES`]): larger
    /// converges faster with a standing overshoot of `β_total / W_total` above the
    /// threshold (see the module docs).
    pub beta_per_1000_shares: f64,
    /// Gateway windows only: also pace each gateway to its weighted max-min share
    /// of the datastore's throughput while it is congested ([`crate::fair_rate`]) —
    /// for devices that serve their clients in turn (Ceph OSDs) rather than in
    /// proportion to what each has outstanding, where windows alone do not divide
    /// the I/Os. Default off.
    pub fair_rate: bool,
}

impl Default for CongestionConfig {
    fn default() -> Self {
        CongestionConfig {
            enabled: true,
            threshold_ms: 30.0,
            gamma: 0.2,
            min_window: 4,
            max_window: 256,
            period_ms: 1000.0,
            beta_per_1000_shares: BETA_PER_1000_SHARES,
            fair_rate: false,
        }
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CongestionError {
    #[error("congestion threshold must be 5-100 ms, got {0:?}")]
    ThresholdMs(f64),
    #[error("gamma must be in (0, 1], got {0:?}")]
    Gamma(f64),
    #[error("windows must satisfy 1 <= min_window <= max_window, got min {min}, max {max}")]
    Window { min: u32, max: u32 },
    #[error("period_ms must be {MIN_PERIOD_MS}-{MAX_PERIOD_MS} ms, got {0:?}")]
    PeriodMs(f64),
    #[error("beta_per_1000_shares must be in (0, {MAX_BETA_PER_1000_SHARES}], got {0:?}")]
    Beta(f64),
}

impl CongestionConfig {
    pub fn validate(&self) -> Result<(), CongestionError> {
        if !(MIN_THRESHOLD_MS..=MAX_THRESHOLD_MS).contains(&self.threshold_ms) {
            return Err(CongestionError::ThresholdMs(self.threshold_ms));
        }
        if !(self.gamma > 0.0 && self.gamma <= 1.0) {
            return Err(CongestionError::Gamma(self.gamma));
        }
        if self.min_window < 1 || self.min_window > self.max_window {
            return Err(CongestionError::Window {
                min: self.min_window,
                max: self.max_window,
            });
        }
        if !(MIN_PERIOD_MS..=MAX_PERIOD_MS).contains(&self.period_ms) {
            return Err(CongestionError::PeriodMs(self.period_ms));
        }
        if !(self.beta_per_1000_shares > 0.0
            && self.beta_per_1000_shares <= MAX_BETA_PER_1000_SHARES)
        {
            return Err(CongestionError::Beta(self.beta_per_1000_shares));
        }
        Ok(())
    }

    /// The period in nanoseconds (clamped to 1 ms - 1 min, as `validate` demands).
    pub fn period_ns(&self) -> Nanos {
        if self.period_ms.is_finite() && self.period_ms > 0.0 {
            let ms = self.period_ms.clamp(MIN_PERIOD_MS, MAX_PERIOD_MS);
            (ms * NANOS_PER_MS as f64) as Nanos
        } else {
            1000 * NANOS_PER_MS
        }
    }

    /// The same config with out-of-range values replaced by the nearest valid ones
    /// (threshold clamped to 5–100 ms, γ to (0, 1], windows to `1 <= min <= max`).
    pub fn sanitized(&self) -> CongestionConfig {
        let threshold_ms = if self.threshold_ms.is_nan() {
            30.0
        } else {
            self.threshold_ms.clamp(MIN_THRESHOLD_MS, MAX_THRESHOLD_MS)
        };
        let gamma = if self.gamma > 0.0 && self.gamma <= 1.0 {
            self.gamma
        } else if self.gamma > 1.0 {
            1.0
        } else {
            0.2
        };
        let min_window = self.min_window.max(1);
        let max_window = self.max_window.max(min_window);
        let period_ms = if self.period_ms.is_finite() && self.period_ms > 0.0 {
            self.period_ms
        } else {
            1000.0
        };
        let beta_per_1000_shares = if self.beta_per_1000_shares > 0.0 {
            self.beta_per_1000_shares.min(MAX_BETA_PER_1000_SHARES)
        } else {
            BETA_PER_1000_SHARES
        };
        CongestionConfig {
            enabled: self.enabled,
            threshold_ms,
            gamma,
            min_window,
            max_window,
            period_ms,
            beta_per_1000_shares,
            fair_rate: self.fair_rate,
        }
    }
}

/// Aggregates completion latencies from every host of a datastore over one period
/// (SIOC shares them through a file on the datastore; the simulator directly).
#[derive(Clone, Debug, Default)]
pub struct DatastoreLatency {
    latency_sum_ns: u128,
    ios: u64,
}

impl DatastoreLatency {
    pub fn new() -> Self {
        Self::default()
    }

    /// One completion, from any host.
    pub fn record(&mut self, latency_ns: Nanos) {
        self.latency_sum_ns += latency_ns as u128;
        self.ios += 1;
    }

    /// A host's aggregate for the period: `ios` completions whose latencies sum to
    /// `latency_sum_ns` (weighted by `ios`, as if recorded one by one).
    pub fn record_host(&mut self, latency_sum_ns: u128, ios: u64) {
        self.latency_sum_ns += latency_sum_ns;
        self.ios += ios;
    }

    /// Adds another host's (or gate's) period (SIOC's datastore-wide aggregate).
    pub fn merge(&mut self, other: &DatastoreLatency) {
        self.record_host(other.latency_sum_ns, other.ios);
    }

    /// The sum of the latencies recorded since the last `take_mean_ms`, ns.
    pub fn latency_sum_ns(&self) -> u128 {
        self.latency_sum_ns
    }

    /// Completions recorded since the last `take_mean_ms`.
    pub fn samples(&self) -> u64 {
        self.ios
    }

    /// The IO-weighted mean latency of the period in ms, and a reset; `None` if no
    /// completion was recorded.
    pub fn take_mean_ms(&mut self) -> Option<f64> {
        if self.ios == 0 {
            return None;
        }
        let mean_ms = self.latency_sum_ns as f64 / self.ios as f64 / NANOS_PER_MS as f64;
        *self = Self::default();
        Some(mean_ms)
    }
}

/// One host's window on one datastore.
#[derive(Clone, Debug)]
pub struct HostWindow {
    config: CongestionConfig,
    host_shares: u64,
    initial_window: u32,
    window: f64,
    last_update_ns: Option<Nanos>,
}

impl HostWindow {
    /// `initial_window` is the device queue depth (at least 1). An invalid config is
    /// used in its [`CongestionConfig::sanitized`] form; call `validate` first to
    /// report errors.
    pub fn new(config: CongestionConfig, host_shares: u64, initial_window: u32) -> Self {
        let config = config.sanitized();
        let initial_window = initial_window.max(1);
        let window = if config.enabled {
            initial_window.clamp(config.min_window, config.max_window) as f64
        } else {
            initial_window as f64
        };
        HostWindow {
            config,
            host_shares,
            initial_window,
            window,
            last_update_ns: None,
        }
    }

    /// Overrides `β` per 1000 shares (the config's `beta_per_1000_shares`); values
    /// that are not positive and finite are ignored, larger ones are capped.
    pub fn with_beta_per_1000_shares(mut self, beta: f64) -> Self {
        if beta.is_finite() && beta > 0.0 {
            self.config.beta_per_1000_shares = beta.min(MAX_BETA_PER_1000_SHARES);
        }
        self
    }

    pub fn window(&self) -> u32 {
        (self.window.round() as u32).max(1)
    }

    /// The window before rounding.
    pub fn window_exact(&self) -> f64 {
        self.window
    }

    pub fn config(&self) -> &CongestionConfig {
        &self.config
    }

    pub fn host_shares(&self) -> u64 {
        self.host_shares
    }

    pub fn set_host_shares(&mut self, host_shares: u64) {
        self.host_shares = host_shares;
    }

    /// `β = host_shares / 1000 × β per 1000 shares` (default 1.0).
    pub fn beta(&self) -> f64 {
        self.host_shares as f64 / 1000.0 * self.config.beta_per_1000_shares
    }

    /// True when a period has passed since the last update (or none happened yet).
    pub fn due(&self, now: Nanos) -> bool {
        self.last_update_ns
            .is_none_or(|last| now >= last.saturating_add(self.config.period_ns()))
    }

    /// Recomputes the window from the datastore-wide mean latency of the last period.
    /// A latency that is not positive and finite leaves the window unchanged, and so
    /// does `enabled == false`.
    pub fn update(&mut self, now: Nanos, datastore_latency_ms: f64) -> u32 {
        self.last_update_ns = Some(now);
        if !self.config.enabled {
            self.window = self.initial_window as f64;
            return self.window();
        }
        if !(datastore_latency_ms.is_finite() && datastore_latency_ms > 0.0) {
            return self.window();
        }
        let c = &self.config;
        let w = self.window;
        let target = c.threshold_ms / datastore_latency_ms * w + self.beta();
        let next = (1.0 - c.gamma) * w + c.gamma * target;
        self.window = next.clamp(c.min_window as f64, c.max_window as f64);
        self.window()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> CongestionConfig {
        CongestionConfig::default()
    }

    #[test]
    fn validate_accepts_defaults_and_rejects_out_of_range() {
        assert_eq!(config().validate(), Ok(()));
        for t in [4.9, 100.1, f64::NAN] {
            let c = CongestionConfig {
                threshold_ms: t,
                ..config()
            };
            assert!(
                matches!(c.validate(), Err(CongestionError::ThresholdMs(_))),
                "{t}"
            );
        }
        for t in [5.0, 100.0] {
            assert!(
                CongestionConfig {
                    threshold_ms: t,
                    ..config()
                }
                .validate()
                .is_ok()
            );
        }
        assert!(matches!(
            CongestionConfig {
                gamma: 0.0,
                ..config()
            }
            .validate(),
            Err(CongestionError::Gamma(_))
        ));
        for beta in [0.0, -1.0, 100.5, f64::NAN, f64::INFINITY] {
            assert!(matches!(
                CongestionConfig {
                    beta_per_1000_shares: beta,
                    ..config()
                }
                .validate(),
                Err(CongestionError::Beta(_))
            ));
        }
        assert!(matches!(
            CongestionConfig {
                min_window: 10,
                max_window: 5,
                ..config()
            }
            .validate(),
            Err(CongestionError::Window { .. })
        ));
        for period_ms in [-1.0, 0.0, 1e-300, 0.5, 60_001.0, f64::NAN, f64::INFINITY] {
            assert!(matches!(
                CongestionConfig {
                    period_ms,
                    ..config()
                }
                .validate(),
                Err(CongestionError::PeriodMs(_))
            ));
        }
        let msg = CongestionConfig {
            threshold_ms: 200.0,
            ..config()
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(msg.contains("5-100 ms"), "{msg}");
    }

    #[test]
    fn window_shrinks_above_threshold_and_grows_below() {
        let mut w = HostWindow::new(config(), 1000, 64);
        assert_eq!(w.window(), 64);
        // 60 ms against a 30 ms threshold: 0.8·64 + 0.2·(0.5·64 + 1) = 57.8.
        assert_eq!(w.update(1, 60.0), 58);
        assert!((w.window_exact() - 57.8).abs() < 1e-9);
        let before = w.window_exact();
        w.update(2, 10.0);
        assert!(w.window_exact() > before);
        // Far below the threshold it climbs to max_window and stays there.
        for t in 3..100 {
            w.update(t, 1.0);
        }
        assert_eq!(w.window(), 256);
        // Far above it drops to min_window and stays there.
        for t in 100..200 {
            w.update(t, 1000.0);
        }
        assert_eq!(w.window(), 4);
    }

    #[test]
    fn at_the_threshold_the_window_creeps_up_by_gamma_beta() {
        let mut w = HostWindow::new(config(), 2000, 32);
        w.update(1, 30.0);
        assert!((w.window_exact() - (32.0 + 0.2 * 2.0)).abs() < 1e-9);
    }

    #[test]
    fn disabled_control_keeps_the_initial_window() {
        let c = CongestionConfig {
            enabled: false,
            ..config()
        };
        let mut w = HostWindow::new(c, 1000, 32);
        for (t, lat) in [(1, 500.0), (2, 0.5), (3, 30.0)] {
            assert_eq!(w.update(t, lat), 32);
        }
        // Even an initial window outside [min, max] stays as is.
        let c = CongestionConfig {
            enabled: false,
            max_window: 16,
            ..config()
        };
        assert_eq!(HostWindow::new(c, 1000, 32).window(), 32);
    }

    #[test]
    fn bad_latency_samples_do_not_move_the_window() {
        let mut w = HostWindow::new(config(), 1000, 32);
        for lat in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert_eq!(w.update(1, lat), 32);
        }
    }

    #[test]
    fn due_once_per_period() {
        let mut w = HostWindow::new(config(), 1000, 32);
        assert!(w.due(0));
        w.update(5 * NANOS_PER_MS, 40.0);
        assert!(!w.due(500 * NANOS_PER_MS));
        assert!(w.due(1005 * NANOS_PER_MS));
    }

    #[test]
    fn invalid_config_is_sanitized_not_a_panic() {
        let c = CongestionConfig {
            threshold_ms: 1000.0,
            gamma: f64::NAN,
            min_window: 0,
            max_window: 0,
            period_ms: 0.0,
            enabled: true,
            beta_per_1000_shares: f64::NAN,
            fair_rate: false,
        };
        assert_eq!(c.validate(), Err(CongestionError::ThresholdMs(1000.0)));
        let mut w = HostWindow::new(c, 1000, 0);
        assert_eq!(w.config().threshold_ms, 100.0);
        assert_eq!(w.config().beta_per_1000_shares, BETA_PER_1000_SHARES);
        assert_eq!(w.window(), 1);
        w.update(1, 50.0);
        assert_eq!(w.window(), 1);
    }

    #[test]
    fn datastore_latency_is_io_weighted_and_resets() {
        let mut d = DatastoreLatency::new();
        assert_eq!(d.take_mean_ms(), None);
        // Host A: 3 I/Os at 10 ms; host B: 1 I/O at 50 ms → (30 + 50) / 4 = 20 ms.
        for _ in 0..3 {
            d.record(10 * NANOS_PER_MS);
        }
        d.record_host(50 * NANOS_PER_MS as u128, 1);
        assert_eq!(d.samples(), 4);
        assert_eq!(d.take_mean_ms(), Some(20.0));
        assert_eq!(d.take_mean_ms(), None);
    }

    /// Two hosts (2000 vs 1000 shares) with unbounded demand on a fluid closed-loop
    /// device: throughput is capped at `capacity_iops`, and by Little's law the
    /// latency is `outstanding / capacity` (never below the bare service time).
    /// Each host completes `window / latency` I/Os per second at that latency.
    fn run_two_hosts(enabled: bool, beta: f64, periods: usize) -> (HostWindow, HostWindow, f64) {
        let capacity_iops = 10_000.0;
        let service_ms = 2.0;
        let c = CongestionConfig {
            enabled,
            ..config()
        };
        let mut hosts = [
            HostWindow::new(c.clone(), 2000, 32).with_beta_per_1000_shares(beta),
            HostWindow::new(c, 1000, 32).with_beta_per_1000_shares(beta),
        ];
        let mut latency_ms = 0.0;
        for period in 0..periods {
            let outstanding: f64 = hosts.iter().map(|h| h.window() as f64).sum();
            latency_ms = (outstanding / capacity_iops * 1000.0).max(service_ms);
            let mut datastore = DatastoreLatency::new();
            for h in &hosts {
                let ios = (h.window() as f64 / latency_ms * 1000.0) as u64;
                datastore.record_host(ios as u128 * (latency_ms * 1e6) as u128, ios);
            }
            let mean = datastore.take_mean_ms().expect("both hosts completed I/O");
            let now = (period as u64 + 1) * 1000 * NANOS_PER_MS;
            for h in &mut hosts {
                h.update(now, mean);
            }
        }
        let [a, b] = hosts;
        (a, b, latency_ms)
    }

    #[test]
    fn two_hosts_converge_to_their_share_ratio_above_the_threshold() {
        // Default β: slow but exact (time constant ≈ 500 periods, see module docs).
        let (high, normal, latency_ms) = run_two_hosts(true, 1.0, 100);
        let early = high.window_exact() / normal.window_exact();
        assert!(
            early > 1.05 && early < 1.9,
            "still converging after 100 periods: {early}"
        );
        let (high, normal, latency_ms_late) = run_two_hosts(true, 1.0, 3000);
        let ratio = high.window_exact() / normal.window_exact();
        assert!(
            (ratio - 2.0).abs() < 0.02,
            "windows {} vs {}",
            high.window_exact(),
            normal.window_exact()
        );
        // The controller holds the datastore just above the 30 ms threshold.
        for lat in [latency_ms, latency_ms_late] {
            assert!(lat > 30.0 && lat < 31.0, "latency {lat}");
        }
        // A larger β converges in a few hundred periods, ~10 % above the threshold.
        let (high, normal, latency_ms) = run_two_hosts(true, 10.0, 300);
        let ratio = high.window_exact() / normal.window_exact();
        assert!(
            (ratio - 2.0).abs() < 0.05,
            "windows {} vs {}",
            high.window_exact(),
            normal.window_exact()
        );
        assert!(
            latency_ms > 30.0 && latency_ms < 34.0,
            "latency {latency_ms}"
        );
    }

    #[test]
    fn without_control_the_hosts_split_evenly() {
        let (high, normal, latency_ms) = run_two_hosts(false, 1.0, 50);
        assert_eq!((high.window(), normal.window()), (32, 32));
        assert!((latency_ms - 6.4).abs() < 1e-9);
    }
}
