//! Adaptive device queue depth: how many pieces the gate keeps outstanding at the
//! device. A deep device queue gives throughput (a 24-drive array reorders more
//! with more to choose from) but every request in it waits behind the others, and
//! reordering at the gate cannot help a request already queued at the device. So
//! while a protected volume (mission- or business-critical, with a latency target)
//! sees its target at risk *at the device*, the limit shrinks; when none does, it
//! grows back — in the spirit of PARDA, Linux io.latency and iocost's vrate.
//!
//! A target counts as held when at most [`DepthConfig::over_target_budget`] of the
//! protected requests take longer than the target and at most
//! [`DepthConfig::over_twice_budget`] take longer than twice the target (by default
//! 25 % and 1 %: the median well inside the target, the 99th percentile within
//! twice it). The controller keeps an exponentially weighted fraction of each per
//! period and steps the limit multiplicatively down (×`decrease`) when either is
//! over its budget, additively up (+1/16 of the limit) when both are under half of
//! it, and back up quickly (×1.25) in a period without protected requests.
//!
//! Only device time counts (release to completion of each piece): queueing in the
//! gate is the scheduler's business, and a protected volume that floods by itself
//! must not shrink the device for everyone.
//!
//! **Shares need a queue.** A scheduler can only share what waits in it: with two
//! volumes at QD32 each and 64 slots at the device, nothing ever waits and shares
//! 2:1 come out 1:1 (ESX has the same rule: `Disk.SchedNumReqOutstanding` caps a
//! LUN's depth while more than one VM uses it). So the gate also bounds the depth by
//! the largest value at which every active volume's demand (its requests in the gate
//! or at the device, averaged over the period) still covers its proportional part:
//! `min over v of demand_v · W / shares_v`, `W` the active volumes' shares. Volumes
//! whose bound falls under [`DepthConfig::share_floor`] of the maximum (a QD1 reader
//! beside a flood) are left out: they could never use their proportional part, and
//! the device is not given up for them. See docs/QOS.md for the trade-off curves.

use crate::Nanos;

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DepthConfig {
    /// Adapt the depth (false: always the pool's `max_in_flight`).
    pub adaptive: bool,
    /// The limit never goes below this.
    pub min_depth: u32,
    /// Length of one control period, ms.
    pub period_ms: f64,
    /// Fraction of protected requests allowed over their target.
    pub over_target_budget: f64,
    /// Fraction of protected requests allowed over twice their target.
    pub over_twice_budget: f64,
    /// Multiplicative decrease per period while a budget is exceeded.
    pub decrease: f64,
    /// Bound the depth so that shares can act (see the module docs).
    pub share_aware: bool,
    /// Volumes whose share bound is under this fraction of the maximum depth do not
    /// bound it.
    pub share_floor: f64,
    /// While the share bound is in force, a slot freed by a volume that is under its
    /// proportional part of the depth and has nothing queued is held this long for
    /// its next request (anticipation, as BFQ idles for a sync queue), µs; 0: off.
    pub anticipate_us: u32,
}

impl Default for DepthConfig {
    fn default() -> Self {
        DepthConfig {
            adaptive: true,
            min_depth: 4,
            period_ms: 100.0,
            over_target_budget: 0.25,
            over_twice_budget: 0.01,
            decrease: 0.85,
            share_aware: true,
            share_floor: 0.7,
            anticipate_us: 500,
        }
    }
}

/// Weight of the newest period in the over-target fractions.
const PERIOD_WEIGHT: f64 = 0.3;
/// Periods with fewer protected completions than this leave the fractions alone.
const MIN_SAMPLES: u32 = 8;

#[derive(Clone, Debug)]
pub struct DepthController {
    config: DepthConfig,
    max: u32,
    limit: f64,
    period_start: Nanos,
    samples: u32,
    over: u32,
    over_twice: u32,
    over_fraction: f64,
    over_twice_fraction: f64,
    /// The share bound of the last period (`None`: no bound).
    share_depth: Option<u32>,
    /// Changes of the limit since creation (observability).
    pub steps: u64,
}

impl DepthController {
    pub fn new(config: DepthConfig, max_depth: u32) -> DepthController {
        let max = max_depth.max(1);
        DepthController {
            config,
            max,
            limit: max as f64,
            period_start: 0,
            samples: 0,
            over: 0,
            over_twice: 0,
            over_fraction: 0.0,
            over_twice_fraction: 0.0,
            share_depth: None,
            steps: 0,
        }
    }

    /// The current limit (between `min_depth` and the maximum): the latency
    /// controller's, under the share bound.
    pub fn limit(&self) -> u32 {
        let l = self.limit as u32;
        self.share_depth.map_or(l, |s| s.min(l))
    }

    /// The latency controller's limit alone.
    pub fn latency_limit(&self) -> u32 {
        self.limit as u32
    }

    /// The share bound in force (`None`: none).
    pub fn share_depth(&self) -> Option<u32> {
        self.share_depth
    }

    /// How long a freed slot may be held for its volume (0 without a share bound).
    pub fn anticipate_ns(&self) -> Nanos {
        match self.share_depth {
            Some(_) => self.config.anticipate_us as Nanos * 1000,
            None => 0,
        }
    }

    /// Sets the share bound from each active volume's `(mean demand, shares)` of the
    /// period just ended (see the module docs).
    pub fn set_share_demand(&mut self, volumes: &[(f64, u32)]) {
        self.share_depth = None;
        if !(self.config.adaptive && self.config.share_aware) || volumes.len() < 2 {
            return;
        }
        let total: f64 = volumes.iter().map(|v| v.1.max(1) as f64).sum();
        let floor = self.config.share_floor.clamp(0.0, 1.0) * self.max as f64;
        let bound = volumes
            .iter()
            .map(|&(demand, shares)| demand * total / shares.max(1) as f64)
            .filter(|&b| b >= floor)
            .fold(f64::INFINITY, f64::min);
        if bound < self.max as f64 {
            self.share_depth = Some((bound as u32).max(self.min() as u32));
        }
    }

    pub fn max(&self) -> u32 {
        self.max
    }

    /// A new maximum (the pool's `max_in_flight` changed); the limit follows it down.
    pub fn set_max(&mut self, max_depth: u32) {
        self.max = max_depth.max(1);
        self.limit = self.limit.min(self.max as f64);
        if !self.config.adaptive {
            self.limit = self.max as f64;
        }
    }

    /// Smoothed fractions of protected requests over their target and over twice it.
    pub fn over_fractions(&self) -> (f64, f64) {
        (self.over_fraction, self.over_twice_fraction)
    }

    fn min(&self) -> f64 {
        self.config.min_depth.clamp(1, self.max) as f64
    }

    /// One piece completed after `device_ns` at the device; `target_ns` is its
    /// volume's latency target when the volume is protected. Runs the control step
    /// when a period has passed, and then returns true (the caller then sets the
    /// share bound for the next period with [`DepthController::set_share_demand`]).
    pub fn on_completion(
        &mut self,
        now: Nanos,
        device_ns: Nanos,
        target_ns: Option<Nanos>,
    ) -> bool {
        if !self.config.adaptive {
            return false;
        }
        if let Some(target) = target_ns {
            self.samples += 1;
            self.over += (device_ns > target) as u32;
            self.over_twice += (device_ns > target.saturating_mul(2)) as u32;
        }
        let period = (self.config.period_ms.max(1.0) * 1e6) as Nanos;
        if now >= self.period_start.saturating_add(period) {
            self.step();
            self.period_start = now;
            return true;
        }
        false
    }

    fn step(&mut self) {
        let before = self.limit;
        if self.samples == 0 {
            // Nothing protected ran: give the depth back quickly.
            self.over_fraction = 0.0;
            self.over_twice_fraction = 0.0;
            self.limit = (self.limit * 1.25 + 1.0).min(self.max as f64);
        } else if self.samples >= MIN_SAMPLES {
            let n = self.samples as f64;
            let w = PERIOD_WEIGHT;
            self.over_fraction += w * (self.over as f64 / n - self.over_fraction);
            self.over_twice_fraction += w * (self.over_twice as f64 / n - self.over_twice_fraction);
            let (b1, b2) = (
                self.config.over_target_budget,
                self.config.over_twice_budget,
            );
            if self.over_fraction > b1 || self.over_twice_fraction > b2 {
                let d = self.config.decrease.clamp(0.1, 0.99);
                self.limit = (self.limit * d).max(self.min());
            } else if self.over_fraction <= b1 / 2.0 && self.over_twice_fraction <= b2 / 2.0 {
                self.limit = (self.limit + (self.limit / 16.0).max(1.0)).min(self.max as f64);
            }
        }
        if self.limit as u32 != before as u32 {
            self.steps += 1;
        }
        self.samples = 0;
        self.over = 0;
        self.over_twice = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Nanos = 1_000_000;

    fn feed(c: &mut DepthController, from: Nanos, periods: u64, latency: Nanos, target: Nanos) {
        for p in 0..periods {
            for i in 0..20 {
                c.on_completion(from + p * 100 * MS + i * 5 * MS, latency, Some(target));
            }
        }
    }

    #[test]
    fn shrinks_while_targets_are_missed_and_grows_back_when_they_are_not() {
        let mut c = DepthController::new(DepthConfig::default(), 64);
        assert_eq!(c.limit(), 64);
        feed(&mut c, 0, 30, 25 * MS, 10 * MS);
        assert_eq!(
            c.limit(),
            4,
            "all requests over twice the target: down to min_depth"
        );
        feed(&mut c, 3000 * MS, 200, 2 * MS, 10 * MS);
        assert_eq!(
            c.limit(),
            64,
            "comfortably inside the target: back to the maximum"
        );
        // Between the budgets: the limit holds.
        let before = c.limit();
        for p in 0..20u64 {
            for i in 0..20u64 {
                let lat = if i < 4 { 12 * MS } else { 5 * MS }; // 20 % over target
                c.on_completion(30_000 * MS + p * 100 * MS + i * 5 * MS, lat, Some(10 * MS));
            }
        }
        assert_eq!(c.limit(), before);
    }

    #[test]
    fn the_share_bound_leaves_each_volume_its_proportional_part() {
        let mut c = DepthController::new(DepthConfig::default(), 64);
        // 2000 vs 1000 shares, both at QD32: 48 slots keep 32 : 16.
        c.set_share_demand(&[(32.0, 2000), (32.0, 1000)]);
        assert_eq!((c.share_depth(), c.limit()), (Some(48), 48));
        // Equal shares and equal demand: no bound.
        c.set_share_demand(&[(32.0, 1000), (32.0, 1000)]);
        assert_eq!(c.limit(), 64);
        // A QD1 reader beside a flood does not shrink the device.
        c.set_share_demand(&[(1.0, 2000), (64.0, 1000)]);
        assert_eq!(c.limit(), 64);
        // One volume alone: no bound.
        c.set_share_demand(&[(3.0, 2000)]);
        assert_eq!(c.share_depth(), None);
    }

    #[test]
    fn unprotected_traffic_restores_the_depth_and_a_fixed_depth_never_moves() {
        let mut c = DepthController::new(DepthConfig::default(), 64);
        feed(&mut c, 0, 30, 25 * MS, 10 * MS);
        for i in 0..200u64 {
            c.on_completion(10_000 * MS + i * 50 * MS, 30 * MS, None);
        }
        assert_eq!(c.limit(), 64);
        let mut fixed = DepthController::new(
            DepthConfig {
                adaptive: false,
                ..DepthConfig::default()
            },
            32,
        );
        feed(&mut fixed, 0, 30, 25 * MS, 10 * MS);
        assert_eq!(fixed.limit(), 32);
    }
}
