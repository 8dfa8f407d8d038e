//! Cases run in parallel (`Scenario::run_jobs`) give the report a serial run
//! gives, byte for byte, with faults too; progress counts finished cases.

use weir_sim::Scenario;
use weir_sim::fault::{DeviceIo, FaultAction, FaultInjector};

fn shortened(name: &str) -> Scenario {
    let mut s = Scenario::builtin(name).expect("shipped").expect("loads");
    s.scale_duration(0.02);
    s
}

fn no_faults(_: &str, _: u64) -> Box<dyn FaultInjector> {
    Box::new(weir_sim::fault::NoFaults)
}

/// Fails every 7th I/O after a case-dependent offset, so each case's faults
/// differ and a case given another's injector would change the report.
struct Seeded(u64);

impl FaultInjector for Seeded {
    fn before_array(&mut self, _now: u64, _io: &DeviceIo) -> FaultAction {
        self.0 += 1;
        if self.0.is_multiple_of(7) {
            FaultAction::Fail
        } else {
            FaultAction::Pass
        }
    }
}

fn seeded(case: &str, seed: u64) -> Box<dyn FaultInjector> {
    Box::new(Seeded(seed ^ case.len() as u64))
}

#[test]
fn parallel_runs_are_byte_identical_to_serial() {
    for name in ["raid-characterization", "app-profiles", "hba-8g-vs-4g"] {
        let s = shortened(name);
        assert!(
            s.case_names().len() >= 4,
            "{name}: too few cases to interleave"
        );
        let serial =
            serde_json::to_string(&s.run_jobs(Some(5), 1, &no_faults, &mut |_| {})).unwrap();
        for jobs in [2, 3, 64] {
            let parallel =
                serde_json::to_string(&s.run_jobs(Some(5), jobs, &no_faults, &mut |_| {})).unwrap();
            assert!(serial == parallel, "{name}: {jobs} jobs changed the report");
        }
    }
}

#[test]
fn parallel_runs_keep_each_cases_own_faults() {
    let s = shortened("app-profiles");
    let serial = s.run_jobs(Some(9), 1, &seeded, &mut |_| {});
    let parallel = s.run_jobs(Some(9), 3, &seeded, &mut |_| {});
    let errors: u64 = serial
        .cases
        .iter()
        .filter_map(|c| c.total.as_ref())
        .map(|t| t.errors)
        .sum();
    assert!(errors > 0, "the injector failed nothing");
    assert_eq!(
        serde_json::to_string(&serial).unwrap(),
        serde_json::to_string(&parallel).unwrap()
    );
}

#[test]
fn progress_counts_finished_cases_in_order() {
    let s = shortened("raid-characterization");
    let total = s.case_names().len();
    let mut done_seen = Vec::new();
    let report = s.run_jobs(None, 3, &no_faults, &mut |p| {
        assert_eq!(p.cases_total, total);
        assert!(s.case_names().contains(&p.case), "unknown case {}", p.case);
        done_seen.push(p.cases_done);
    });
    assert_eq!(report.cases.len(), total);
    assert!(
        done_seen.windows(2).all(|w| w[0] <= w[1]),
        "cases_done went back"
    );
    assert_eq!(done_seen.last(), Some(&total));
    let names: Vec<_> = report.cases.iter().map(|c| c.name.clone()).collect();
    assert_eq!(names, s.case_names(), "report not in the file's order");
}
