//! Gateways on a Ceph-like cluster (scenarios/ceph-gateways.toml): datastore-wide
//! congestion control splits a saturated cluster by the gateways' aggregate shares
//! and shortens a light tenant's waits; without it each gateway fills its queue.
//! Where the OSD's op queue holds the backlog, serving the gateways in turn, the
//! windows alone do not divide it and the fair rates do.

use weir_report::CaseReport;
use weir_sim::Scenario;

fn iops(case: &CaseReport, vm: &str) -> f64 {
    case.workloads
        .iter()
        .find(|w| w.name == vm)
        .unwrap_or_else(|| panic!("no {vm} in {}", case.name))
        .iops
}

#[test]
fn gateways_share_the_cluster_by_aggregate_shares_only_with_control() {
    let s = Scenario::builtin("ceph-gateways").unwrap().unwrap();
    let no_faults = |_: &str, _: u64| -> Box<dyn weir_sim::fault::FaultInjector> {
        Box::new(weir_sim::fault::NoFaults)
    };
    let r = s.run_jobs(None, 2, &no_faults, &mut |_| {});
    let case = |n: &str| r.cases.iter().find(|c| c.name == n).unwrap();
    let off = case("shares-2-1/control-off");
    let on = case("shares-2-1/control-on");
    let split_off = iops(off, "fleet-a") / iops(off, "fleet-b");
    let split_on = iops(on, "fleet-a") / iops(on, "fleet-b");
    assert!((split_off - 1.0).abs() < 0.1, "control off: {split_off:.2}");
    assert!((split_on - 2.0).abs() < 0.2, "control on: {split_on:.2}");
    let split = |c: &str| iops(case(c), "fleet-a") / iops(case(c), "fleet-b");
    let fair = split("shares-2-1/fair-rate");
    assert!((fair - 2.0).abs() < 0.2, "fair rates: {fair:.2}");
    // One CPU-bound OSD whose op queue holds the backlog and serves the gateways in
    // turn (the dev cluster's shape): windows alone leave it 1:1, fair rates 2:1.
    let windows = split("cpu-bound-osd/windows");
    assert!((windows - 1.0).abs() < 0.15, "windows alone: {windows:.2}");
    let fair = split("cpu-bound-osd/fair-rate");
    assert!((fair - 2.0).abs() < 0.2, "cpu-bound, fair rates: {fair:.2}");
    let total = |c: &str| iops(case(c), "fleet-a") + iops(case(c), "fleet-b");
    let kept = total("cpu-bound-osd/fair-rate") / total("cpu-bound-osd/control-off");
    assert!(kept > 0.9, "fair rates keep the OSD busy: {kept:.2}");
    let db = |c: &str| {
        case(c)
            .workloads
            .iter()
            .find(|w| w.name == "db")
            .unwrap()
            .latency_ms
            .mean
    };
    let (db_off, db_on) = (
        db("light-tenant/control-off"),
        db("light-tenant/control-on"),
    );
    assert!(
        db_on < 0.85 * db_off,
        "db mean {db_on:.1} ms on vs {db_off:.1} ms off"
    );
}
