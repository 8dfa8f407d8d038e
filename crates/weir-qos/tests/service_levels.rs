//! Service-level protection under overload: a mission-critical volume keeps its
//! latency target while a non-critical volume floods a saturated device, and would
//! not without the protection.

mod common;

use common::*;
use weir_qos::{NANOS_PER_SEC, Policy, ServiceLevel};

/// 8 slots × 1 ms: 8,000 IOPS.
fn device() -> Device {
    Device {
        slots: 8,
        service_ns: MS,
    }
}

fn level(name: &str, level: Option<ServiceLevel>, target_ms: Option<f64>) -> Policy {
    Policy {
        service_level: level,
        latency_target_ms: target_ms,
        ..Policy::best_effort(name)
    }
}

/// A critical volume with Poisson arrivals at 60 % of capacity (more than its 50 %
/// equal share) against a non-critical flooder with 64 outstanding.
fn critical_vs_flood(critical: Policy, flooder: Policy) -> Outcome {
    let d = device();
    let iops = 0.6 * d.capacity_iops();
    Bench::new(d, 3 * NANOS_PER_SEC)
        .volume(1, critical)
        .volume(2, flooder)
        .client(ClientSpec {
            volume: 1,
            client: 1,
            size_bytes: 4 * KIB,
            load: Load::Open { iops },
        })
        .client(ClientSpec::flood(2, 2, 4 * KIB, 64))
        .run()
}

#[test]
fn mission_critical_keeps_its_target_while_a_non_critical_volume_floods() {
    let out = critical_vs_flood(
        level("mc", Some(ServiceLevel::MissionCritical), Some(10.0)),
        level("nc", Some(ServiceLevel::NonCritical), Some(100.0)),
    );
    let mc = out.volume(1);
    eprintln!(
        "protected: mission-critical mean {:.2} ms, non-critical mean {:.2} ms",
        mc.mean_latency_ms(),
        out.volume(2).mean_latency_ms()
    );
    assert!(
        mc.mean_latency_ms() < 10.0,
        "mission-critical mean latency {:.2} ms",
        mc.mean_latency_ms()
    );
    // It got all it asked for, and the flooder got the rest: the device stays busy.
    let mc_iops = mc.ios_in(0, 3 * NANOS_PER_SEC) as f64 / 3.0;
    assert!(
        mc_iops > 0.57 * 8000.0,
        "mission-critical served {mc_iops:.0} IOPS"
    );
    let nc_iops = out.volume(2).ios_in(0, 3 * NANOS_PER_SEC) as f64 / 3.0;
    assert!(
        nc_iops > 0.35 * 8000.0,
        "non-critical served {nc_iops:.0} IOPS"
    );
    assert!(out.busy_fraction(0, 3 * NANOS_PER_SEC) > 0.99);
    let stats = out.scheduler.stats(weir_qos::VolumeId(1)).unwrap();
    assert!(stats.protected_dispatches > 0);
    assert_eq!(
        out.scheduler
            .stats(weir_qos::VolumeId(2))
            .unwrap()
            .protected_dispatches,
        0
    );
}

#[test]
fn without_protection_the_same_load_misses_the_target() {
    // Same shares, no service levels: the share rule gives each volume half the
    // device, less than the critical volume's arrivals, so its queue grows.
    let out = critical_vs_flood(level("a", None, Some(10.0)), level("b", None, None));
    let mean = out.volume(1).mean_latency_ms();
    eprintln!("unprotected: critical-load volume mean {mean:.2} ms");
    assert!(mean > 50.0, "best-effort mean latency {mean:.2} ms");
    // Same with a target but at the lowest level: protecting it would change nothing.
    let out = critical_vs_flood(
        level("a", Some(ServiceLevel::NonCritical), Some(10.0)),
        level("b", None, None),
    );
    assert!(out.volume(1).mean_latency_ms() > 50.0);
}

#[test]
fn levels_are_served_in_order_under_overload() {
    let d = device();
    let c = d.capacity_iops();
    let out = Bench::new(d, 3 * NANOS_PER_SEC)
        .volume(
            1,
            level("mc", Some(ServiceLevel::MissionCritical), Some(10.0)),
        )
        .volume(
            2,
            level("bc", Some(ServiceLevel::BusinessCritical), Some(20.0)),
        )
        .volume(3, level("nc", Some(ServiceLevel::NonCritical), Some(100.0)))
        .client(ClientSpec {
            volume: 1,
            client: 1,
            size_bytes: 4 * KIB,
            load: Load::Open { iops: 0.45 * c },
        })
        .client(ClientSpec {
            volume: 2,
            client: 2,
            size_bytes: 4 * KIB,
            load: Load::Open { iops: 0.45 * c },
        })
        .client(ClientSpec::flood(3, 3, 4 * KIB, 64))
        .run();
    let (mc, bc, nc) = (out.volume(1), out.volume(2), out.volume(3));
    eprintln!(
        "levels: mc {:.2} ms, bc {:.2} ms, nc {:.2} ms",
        mc.mean_latency_ms(),
        bc.mean_latency_ms(),
        nc.mean_latency_ms()
    );
    assert!(
        mc.mean_latency_ms() < 10.0,
        "mission-critical {:.2} ms",
        mc.mean_latency_ms()
    );
    assert!(
        bc.mean_latency_ms() < 20.0,
        "business-critical {:.2} ms",
        bc.mean_latency_ms()
    );
    assert!(mc.mean_latency_ms() <= bc.mean_latency_ms());
    // The flooder keeps the leftovers (about 10 %), and waits the longest.
    assert!(nc.ios_in(0, 3 * NANOS_PER_SEC) > 0);
    assert!(nc.mean_latency_ms() > bc.mean_latency_ms());
}

/// The built-in policies reserve more than this device can do (non-critical alone
/// asks for 7,500 of its 8,000 IOPS): the flooder's unmet reservation must not
/// outrank the mission-critical volume's latency target. Before lower-level
/// reservations waited for an at-risk higher level, the flooder won every
/// reservation-phase decision and the critical volume's latency ran away.
#[test]
fn an_infeasible_lower_level_reservation_does_not_outrank_a_higher_level_target() {
    let catalog = weir_qos::PolicyCatalog::new();
    let out = critical_vs_flood(
        catalog.get("mission-critical").unwrap().clone(),
        catalog.get("non-critical").unwrap().clone(),
    );
    let mc = out.volume(1);
    eprintln!(
        "built-ins: mission-critical mean {:.2} ms, non-critical mean {:.2} ms",
        mc.mean_latency_ms(),
        out.volume(2).mean_latency_ms()
    );
    assert!(
        mc.mean_latency_ms() < 10.0,
        "mission-critical mean latency {:.2} ms over its 10 ms target",
        mc.mean_latency_ms()
    );
    assert!(out.busy_fraction(0, 3 * NANOS_PER_SEC) > 0.99);
}
