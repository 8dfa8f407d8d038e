//! Gateways on a Ceph-like cluster (scenarios/ceph-gateways.toml): datastore-wide
//! congestion control splits a saturated cluster by the gateways' aggregate shares
//! and shortens a light tenant's waits; without it each gateway fills its queue.

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
