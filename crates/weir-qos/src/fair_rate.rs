//! Fair rates between gateways, for a datastore that serves its clients fairly.
//!
//! PARDA's windows ([`crate::congestion`]) turn shares into throughput only on a
//! device that serves requests in proportion to what each host has outstanding (a
//! FIFO array: SIOC's VMFS LUNs). A Ceph OSD does not. Its op queue keeps one list
//! per client and serves the lists in turn (Pacific's `wpq`, `SubQueue::pop`;
//! `mclock_scheduler` is per client too), so a gateway holding half the window of
//! another is served as often as long as it has anything queued: on the dev cluster
//! windows of 2 : 1 gave I/Os of 1.35–1.8 : 1 (docs/QOS.md). On such a device a share
//! has to be enforced as a *rate*: a gateway that the device serves beyond its
//! weighted max-min part of the datastore's throughput paces what it sends to
//! that part, and the device gives what the paced ones leave to the others — the
//! "flow proportional share" of distributed rate limiting (Raghavan et al., *Cloud
//! control with distributed rate limiting*, SIGCOMM 2007), with the capacity read
//! off what the datastore delivered instead of configured.
//!
//! Every period each gateway publishes a [`GatewayShare`] (its aggregate shares,
//! the cost units it sent to the device per second, its own mean device latency,
//! and whether its pace held requests back), and each computes the same division
//! of what all of them sent ([`divide`]):
//! - **who wants its part**: a gateway that sent less than [`SATISFIED`] of its
//!   part, kept fewer requests at the datastore than its part would need at the
//!   threshold latency (by Little's law: its rate × its own latency under
//!   [`SATISFIED`] × part × threshold) and whose pace held nothing back has what it
//!   wants and keeps it. The requests it keeps there tell the two kinds of light
//!   gateway apart: a database at QD4 sends little because it asks for little (4
//!   requests, however long they wait); a flood beside another flood on a
//!   fair-queueing OSD sends "little" because its turn comes every other time, and
//!   its requests pile up there;
//! - the others split the rest by shares. One that was served more than
//!   [`OVER_SERVED`] times its part while another of them was not held back by a
//!   pace (so the device, not its own demand, limits that one) is paced to its
//!   part, and stays paced while its pace holds requests back; one served less is
//!   not paced — it takes what the paced leave, so the device stays busy, and
//!   nothing is divided that the datastore did not deliver. At least one gateway
//!   that wants its part stays unpaced: were all paced to their parts of what was
//!   measured, the total would shrink by whatever pacing loses, period after
//!   period. So when every other one is paced, the one with the most shares (all
//!   of them, on a tie) lets its pace go.
//!
//! The latency itself stays the windows' business (PARDA). [`RateCap`] engages
//! while the datastore is congested — the worst of the datastore-wide mean and the
//! own latency of a gateway that wants its part at or over the threshold: on a
//! fair-queueing device the mean is pulled down by the paced gateways, whose few
//! requests are served at once, while the one still queued there waits — and stays
//! engaged until that falls under half the threshold, so that it does not flap
//! around it. A paced gateway's rate moves by γ of the gap between what it sent
//! and its part each period (so a pace that loses a little is set a little
//! higher), within [`MIN_RATE_UNITS_PER_S`] and twice the part. No gateway needs to be told which others are busy.
//!
//! Pure: figures in, a rate out. The gate ([`crate::Gate`]) measures its own
//! [`GatewayShare`] and paces its releases to the rate; the server exchanges the
//! shares through the datastore (`weir_server::datastore_stats`), the simulator
//! directly.

use crate::CongestionConfig;

/// A gateway served more than this times its part is paced to it.
pub const OVER_SERVED: f64 = 1.05;
/// A gateway that sent less than this fraction of its part is satisfied.
pub const SATISFIED: f64 = 0.9;
/// The lowest pace, cost units per second (003's lowest IOPS limit).
pub const MIN_RATE_UNITS_PER_S: f64 = 16.0;

/// One gateway's last period, as the others see it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GatewayShare {
    /// The shares of the volumes that did I/O in the period (at least 1 counts).
    pub shares: u64,
    /// Cost units released to the device per second over the period.
    pub units_per_s: f64,
    /// Its own mean device latency over the period, ms (0 without completions).
    pub latency_ms: f64,
    /// Its pace held requests back in the period (they waited in its gate).
    pub paced: bool,
}

impl GatewayShare {
    fn weight(&self) -> f64 {
        self.shares.max(1) as f64
    }

    fn rate(&self) -> f64 {
        if self.units_per_s.is_finite() {
            self.units_per_s.max(0.0)
        } else {
            0.0
        }
    }

    /// Its demand is met (see [`divide`]) at `level` units per share: it sent
    /// under its part and kept fewer requests at the device (rate × latency)
    /// than its part would at the threshold latency.
    fn satisfied(&self, level: f64, threshold_ms: f64) -> bool {
        let part = level * self.weight();
        !self.paced
            && self.rate() < SATISFIED * part
            && self.rate() * self.latency_ms.max(0.0) < SATISFIED * part * threshold_ms
    }
}

/// Who of a set of gateways wants its part (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Division {
    /// The level (units per second per share) of what was sent, at which
    /// satisfaction was judged.
    pub judged: f64,
    /// What the satisfied gateways sent (they keep it).
    kept: f64,
    /// The shares of the gateways that want their part.
    weight: f64,
    /// The worst own latency of a gateway that wants its part, ms.
    pub worst_latency_ms: f64,
}

impl Division {
    /// Units per second per share for a gateway that wants its part, when `total`
    /// is divided: the parts and what the satisfied keep sum to `total` (when it
    /// covers what they keep).
    pub fn level(&self, total: f64) -> f64 {
        (total - self.kept).max(0.0) / self.weight.max(1.0)
    }

    /// `g` (one of the set) wants its part.
    pub fn wants(&self, g: &GatewayShare, threshold_ms: f64) -> bool {
        !g.satisfied(self.judged, threshold_ms)
    }
}

/// Judges, on what `all` sent, who wants its part (weighted max-min: taken out in
/// turn, the satisfied keep what they sent and the level of the rest rises, so a
/// pass that takes none out is final). `None` when every gateway is satisfied.
pub fn divide(all: &[GatewayShare], threshold_ms: f64) -> Option<Division> {
    let mut rest: f64 = all.iter().map(GatewayShare::rate).sum();
    let mut weight: f64 = all.iter().map(GatewayShare::weight).sum();
    let mut kept = 0.0;
    let mut left: Vec<&GatewayShare> = all.iter().collect();
    loop {
        let level = rest / weight.max(1.0);
        let before = left.len();
        left.retain(|g| {
            let met = g.satisfied(level, threshold_ms);
            if met {
                rest = (rest - g.rate()).max(0.0);
                kept += g.rate();
                weight -= g.weight();
            }
            !met
        });
        if left.is_empty() {
            return None;
        }
        if left.len() == before {
            let worst_latency_ms = left.iter().map(|g| g.latency_ms).fold(0.0, f64::max);
            return Some(Division {
                judged: level,
                kept,
                weight,
                worst_latency_ms,
            });
        }
    }
}

/// A gateway's pace (see the module docs).
#[derive(Clone, Debug, Default)]
pub struct RateCap {
    rate: Option<f64>,
    engaged: bool,
}

impl RateCap {
    pub fn new() -> RateCap {
        RateCap::default()
    }

    /// The rate to pace to, cost units per second (`None`: no pace).
    pub fn rate(&self) -> Option<f64> {
        self.rate
    }

    /// One period: `mean_ms` is the datastore-wide latency (`None`: nothing
    /// completed anywhere), `own` this gateway's period and `others` the other
    /// gateways' last ones.
    pub fn update(
        &mut self,
        config: &CongestionConfig,
        mean_ms: Option<f64>,
        own: &GatewayShare,
        others: &[GatewayShare],
    ) {
        let threshold = config.threshold_ms;
        let bar = if self.engaged {
            threshold / 2.0
        } else {
            threshold
        };
        let mut all = others.to_vec();
        all.push(*own);
        let division = divide(&all, threshold);
        let worst = division.map_or(0.0, |d| d.worst_latency_ms);
        if !mean_ms.is_some_and(|m| m.is_finite() && m.max(worst) >= bar) {
            *self = RateCap::default();
            return;
        }
        self.engaged = true;
        let Some(division) = division.filter(|d| d.wants(own, threshold)) else {
            self.rate = None; // satisfied: nothing of ours holds it back
            return;
        };
        let sent: f64 = all.iter().map(GatewayShare::rate).sum();
        let part = division.level(sent) * own.weight();
        let rivals = others.iter().filter(|o| division.wants(o, threshold));
        let (mut unpaced, mut heavier) = (false, false);
        for o in rivals {
            unpaced |= !o.paced;
            heavier |= o.weight() > own.weight();
        }
        let paced = match self.rate {
            None => unpaced && own.rate() > OVER_SERVED * part,
            Some(_) => own.paced && (unpaced || heavier),
        };
        if !paced {
            self.rate = None; // it takes what the paced ones leave
            return;
        }
        // Paced, it moves by γ of the gap between what it sent and its part: a
        // pace that loses some of its rate (releases bunched at completions) ends a
        // little above the part, so that what is sent is the part. Never over twice
        // the part: a pace that does not bind is lifted anyway.
        let gamma = config.gamma.clamp(f64::MIN_POSITIVE, 1.0);
        let rate = match self.rate {
            Some(r) => r + gamma * (part - own.rate()),
            None => part,
        };
        self.rate = Some(rate.clamp(MIN_RATE_UNITS_PER_S, (2.0 * part).max(MIN_RATE_UNITS_PER_S)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const L: f64 = 10.0;

    /// A gateway's period: shares, units/s, its own device latency (ms).
    fn g(shares: u64, units_per_s: f64, latency_ms: f64) -> GatewayShare {
        GatewayShare {
            shares,
            units_per_s,
            latency_ms,
            paced: false,
        }
    }

    fn config() -> CongestionConfig {
        CongestionConfig {
            threshold_ms: L,
            gamma: 0.5,
            ..CongestionConfig::default()
        }
    }

    #[test]
    fn busy_gateways_split_the_total_by_shares_and_light_ones_keep_theirs() {
        // Two floods on a fair-queueing device: each got half, both queued there.
        let floods = [g(2000, 3000.0, 30.0), g(1000, 3000.0, 30.0)];
        let level = divide(&floods, L).unwrap().level(6000.0);
        assert_eq!((level * 2000.0, level * 1000.0), (4000.0, 2000.0));
        // A light tenant answered at once keeps what it used; the rest is split.
        let all = [
            g(2000, 2500.0, 30.0),
            g(1000, 2500.0, 30.0),
            g(1000, 300.0, 4.0),
        ];
        let d = divide(&all, L).unwrap();
        assert_eq!(d.worst_latency_ms, 30.0);
        let level = d.level(5300.0);
        assert!((level * 1000.0 - 5000.0 / 3.0).abs() < 1e-9, "{level}");
        // The same rate with its requests piled up at the datastore (300/s at 60 ms:
        // 18 there, more than its part of 1,325/s needs at 10 ms) wants its part.
        let all = [
            g(2000, 2500.0, 30.0),
            g(1000, 2500.0, 30.0),
            g(1000, 300.0, 60.0),
        ];
        assert_eq!(divide(&all, L).unwrap().level(5300.0), 5300.0 / 4000.0);
        // One flood alone beside a light tenant: all but the tenant's.
        let d = divide(&[g(1000, 6000.0, 30.0), g(2000, 100.0, 2.0)], L);
        assert_eq!(d.unwrap().level(6100.0) * 1000.0, 6000.0);
        // Two light gateways answered at once, each using its part of what was
        // sent: a total of 100 is theirs to split (their paces bind nothing).
        let light = [g(1000, 10.0, 1.0), g(1000, 10.0, 1.0)];
        assert_eq!(divide(&light, L).unwrap().level(100.0) * 1000.0, 50.0);
        // One of them under its part: it keeps its 2, the other has the rest.
        let light = [g(1000, 2.0, 1.0), g(1000, 10.0, 1.0)];
        assert_eq!(divide(&light, L).unwrap().level(100.0) * 1000.0, 98.0);
        // Unless its pace held it back: then it wants its part.
        let paced = GatewayShare {
            paced: true,
            ..light[0]
        };
        assert_eq!(
            divide(&[paced, light[1]], L).unwrap().level(100.0) * 1000.0,
            50.0
        );
    }

    #[test]
    fn the_pace_engages_over_the_threshold_and_lifts_under_half_of_it() {
        let c = config();
        let (a, b) = (g(2000, 3000.0, 12.0), g(1000, 3000.0, 12.0));
        let mut cap = RateCap::new();
        cap.update(
            &c,
            Some(9.0),
            &g(1000, 3000.0, 9.0),
            &[g(2000, 3000.0, 9.0)],
        );
        assert_eq!(cap.rate(), None, "under the threshold");
        // The mean under it, but a busy gateway waits over it: that counts.
        cap.update(
            &c,
            Some(9.0),
            &g(1000, 3000.0, 6.0),
            &[g(2000, 3000.0, 12.0)],
        );
        assert_eq!(
            cap.rate(),
            Some(2000.0),
            "a busy gateway waits over the threshold"
        );
        cap = RateCap::new();
        // 12 ms, both floods served alike: B, served 3000 of a part of 2000, is
        // paced to it; A, served under its part, is not.
        cap.update(&c, Some(12.0), &b, &[a]);
        assert_eq!(cap.rate(), Some(2000.0));
        let mut for_a = RateCap::new();
        for_a.update(&c, Some(12.0), &a, &[b]);
        assert_eq!(for_a.rate(), None, "A takes what B leaves");
        // B's pace holds it back (it sends its part): it stays paced, moving by γ
        // towards its part of what was delivered.
        let b_paced = GatewayShare {
            paced: true,
            ..g(1000, 2000.0, 3.0)
        };
        cap.update(&c, Some(8.0), &b_paced, &[g(2000, 4300.0, 12.0)]);
        assert_eq!(cap.rate(), Some(2050.0));
        // No longer held back and under its part: the pace lifts.
        cap.update(
            &c,
            Some(8.0),
            &g(1000, 1500.0, 3.0),
            &[g(2000, 4300.0, 12.0)],
        );
        assert_eq!(cap.rate(), None);
        // Engaged, the bar is half the threshold; under it, all lifts.
        cap.update(&c, Some(12.0), &b, &[a]);
        let b_paced = GatewayShare {
            paced: true,
            ..g(1000, 2000.0, 3.0)
        };
        cap.update(&c, Some(6.0), &b_paced, &[g(2000, 4000.0, 12.0)]);
        assert_eq!(cap.rate(), Some(2000.0), "6 ms: still engaged");
        // Were A paced too, B would keep its pace (A has more shares: A lets go).
        let a_paced = GatewayShare {
            paced: true,
            ..g(2000, 4000.0, 12.0)
        };
        cap.update(&c, Some(12.0), &b_paced, &[a_paced]);
        assert_eq!(cap.rate(), Some(2000.0));
        let mut for_a = RateCap::new();
        for_a.update(
            &c,
            Some(12.0),
            &g(2000, 5000.0, 12.0),
            &[g(1000, 1000.0, 30.0)],
        );
        assert_eq!(for_a.rate(), Some(4000.0), "A served over its part");
        for_a.update(&c, Some(12.0), &a_paced, &[b_paced]);
        assert_eq!(
            for_a.rate(),
            None,
            "every other one paced: the heaviest lets go"
        );
        cap.update(
            &c,
            Some(4.0),
            &g(1000, 3000.0, 4.0),
            &[g(2000, 3000.0, 4.0)],
        );
        assert_eq!(cap.rate(), None, "under half the threshold");
    }

    #[test]
    fn a_satisfied_gateway_is_not_paced_nor_a_lone_flood() {
        let c = config();
        let mut cap = RateCap::new();
        let (tenant, flood) = (g(1000, 300.0, 3.0), g(2000, 5000.0, 20.0));
        // A light tenant under its part, answered at once, is not paced.
        cap.update(&c, Some(20.0), &tenant, &[flood]);
        assert_eq!(cap.rate(), None);
        // Nor the flood beside it: it has all but the tenant's (the windows keep
        // the latency).
        cap.update(&c, Some(20.0), &flood, &[tenant]);
        assert_eq!(cap.rate(), None);
    }

    /// A fair-queueing device (every client with a queue there gets an equal turn;
    /// a client paced under its turn gets its pace and waits for nothing, the rest
    /// goes to the others) whose latency rises with its load, driven period by
    /// period from an even split: the split converges to the shares and the device
    /// stays busy.
    #[test]
    fn paced_gateways_reach_their_shares_on_a_round_robin_device() {
        let c = config();
        let capacity = 6000.0;
        let shares = [2000u64, 1000];
        let mut caps = [RateCap::new(), RateCap::new()];
        let mut reports = [g(2000, 3000.0, 40.0), g(1000, 3000.0, 40.0)];
        let mut splits = Vec::new();
        for _ in 0..60 {
            let mean = (reports[0].units_per_s * reports[0].latency_ms
                + reports[1].units_per_s * reports[1].latency_ms)
                / (reports[0].units_per_s + reports[1].units_per_s);
            caps[0].update(&c, Some(mean), &reports[0], &reports[1..]);
            caps[1].update(&c, Some(mean), &reports[1], &reports[..1]);
            let (got, queued) = round_robin(capacity, [caps[0].rate(), caps[1].rate()]);
            // A queue at utilisation ρ (2 ms of service): the threshold at ρ = 0.8;
            // a client with requests queued at the device waits 40 ms.
            let rho = (got[0] + got[1]) / capacity;
            let latency = 2.0 / (1.0 - rho.min(0.95));
            for i in 0..2 {
                let own = if queued[i] { 40.0 } else { latency };
                reports[i] = GatewayShare {
                    paced: caps[i].rate().is_some_and(|r| got[i] >= r),
                    ..g(shares[i], got[i], own)
                };
            }
            splits.push(got[0] / got[1]);
        }
        let tail = &splits[40..];
        assert!(
            tail.iter().all(|s| (1.9..=2.1).contains(s)),
            "splits {splits:?} at {reports:?}"
        );
        let busy = reports[0].units_per_s + reports[1].units_per_s;
        assert_eq!(busy, capacity, "busy: {reports:?}");
    }

    /// Max-min on a round-robin device between clients with optional paces: what
    /// each got, and whether its requests queued at the device.
    fn round_robin(capacity: f64, caps: [Option<f64>; 2]) -> ([f64; 2], [bool; 2]) {
        let half = capacity / 2.0;
        match caps {
            [Some(a), Some(b)] if a + b < capacity => ([a, b], [false, false]),
            [Some(a), _] if a < half => ([a, capacity - a], [false, true]),
            [_, Some(b)] if b < half => ([capacity - b, b], [true, false]),
            _ => ([half, half], [true, true]),
        }
    }

    proptest! {
        /// The parts sum to the total, a satisfied gateway keeps what it sent, and
        /// the others are split exactly by shares.
        #[test]
        fn water_filling_is_weighted_max_min(
            gs in prop::collection::vec((1u64..5000, 0.0f64..10_000.0, 0.0f64..20.0, any::<bool>()), 1..8),
            scale in 0.5f64..1.5,
        ) {
            let all: Vec<GatewayShare> = gs
                .iter()
                .map(|&(s, r, l, paced)| GatewayShare { paced, ..g(s, r, l) })
                .collect();
            let sent: f64 = all.iter().map(|x| x.units_per_s).sum();
            let total = sent * scale;
            let Some(d) = divide(&all, L) else {
                // Nothing to divide: everyone is satisfied.
                prop_assert!(all.iter().all(|x| x.latency_ms < L && !x.paced));
                return Ok(());
            };
            let (level, judged) = (d.level(total), d.judged);
            let satisfied: Vec<bool> = all.iter().map(|x| x.satisfied(judged, L)).collect();
            let kept: f64 = all.iter().zip(&satisfied).filter(|(_, s)| **s).map(|(x, _)| x.units_per_s).sum();
            let parts: f64 = all.iter().zip(&satisfied)
                .map(|(x, s)| if *s { x.units_per_s } else { level * x.shares as f64 })
                .sum();
            if total >= kept {
                prop_assert!((parts - total).abs() <= 1e-6 * total.max(1.0), "{parts} vs {total}");
            }
            // Those who want their part get it in proportion to their shares.
            for (x, s) in all.iter().zip(&satisfied) {
                prop_assert!(*s || x.paced || x.latency_ms >= L || x.units_per_s >= SATISFIED * judged * x.shares as f64);
                prop_assert_eq!(!*s, d.wants(x, L));
                prop_assert!(*s || x.latency_ms <= d.worst_latency_ms);
            }
        }
    }
}
