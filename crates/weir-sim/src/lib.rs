//! # weir-sim — a deterministic discrete-event simulator of a storage stack
//!
//! Runs the weir-qos engine on a virtual clock against weir-model hardware and
//! weir-workload generators. Same scenario + seed → byte-identical report.
//!
//! ```no_run
//! let scenario = weir_sim::Scenario::from_file("scenarios/sioc-shares.toml")?;
//! let report = scenario.run(None, &mut |_progress| {});
//! println!("{}", serde_json::to_string_pretty(&report).unwrap());
//! # Ok::<(), weir_sim::ScenarioError>(())
//! ```
//!
//! Scenario files are described in `scenarios/README.md`. Besides Iometer access
//! specifications, a `[[vm]]` may run an application model of weir-workload
//! (`[[model]]`: VDI pools, OLTP, Exchange); the simulator then reports the models'
//! metrics (`CaseReport::model_metrics`), named windows of the run
//! (`CaseReport::windows`, per volume, service level and total) and the I/O size
//! histogram (`CaseReport::io_sizes`). `[array_cache]` (a flash tier in front of the
//! array, optionally clone-aware and absorbing writes) and a host's `flash_cache`
//! (ioTurbine-like, opted into per VM) are simulated as weir-model block cache
//! indexes ([`weir_model::BlockCache`], LRU) in front of flash devices, optionally
//! pre-warmed with a model's database (`prewarm_cache`); `[array_qos] enabled =
//! false` runs without QoS, and with a flash tier the appliance's QoS bounds each
//! tier separately (`backend_concurrency`, `flash_concurrency`). The timeline carries
//! the models' figures per interval (`model:<vm> opm`, `… rpc_latency_mean_ms`).

mod cache;
mod engine;
pub mod fault;
mod hw;
mod queue;
mod scenario;
/// The scenario file's data model (crate weir-scenario, shared with `weir load`).
pub use weir_scenario as topology;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;

pub use hw::IdealArraySpec;
pub use scenario::{Scenario, ScenarioError};
pub use weir_report::ScenarioReport;

/// Where a run is, reported once per timeline interval of simulated time and at the
/// end of each case.
#[derive(Clone, Debug, PartialEq)]
pub struct Progress {
    /// Cases finished before this one.
    pub cases_done: usize,
    pub cases_total: usize,
    /// The case running (or just finished).
    pub case: String,
    /// Simulated time reached in this case, s.
    pub simulated_s: f64,
    /// Simulated time this case runs for (warm-up + duration), s.
    pub case_simulated_s: f64,
}

/// The shipped scenarios: (name, TOML text).
pub fn builtin_scenarios() -> &'static [(&'static str, &'static str)] {
    &[
        (
            "sioc-shares",
            include_str!("../../../scenarios/sioc-shares.toml"),
        ),
        (
            "raid-characterization",
            include_str!("../../../scenarios/raid-characterization.toml"),
        ),
        (
            "app-profiles",
            include_str!("../../../scenarios/app-profiles.toml"),
        ),
        (
            "hba-8g-vs-4g",
            include_str!("../../../scenarios/hba-8g-vs-4g.toml"),
        ),
        (
            "qos-invariants",
            include_str!("../../../scenarios/qos-invariants.toml"),
        ),
        (
            "mixed-workload",
            include_str!("../../../scenarios/mixed-workload.toml"),
        ),
        (
            "mixed-workload-cache",
            include_str!("../../../scenarios/mixed-workload-cache.toml"),
        ),
        (
            "oltp-host-cache",
            include_str!("../../../scenarios/oltp-host-cache.toml"),
        ),
        ("vdi-week", include_str!("../../../scenarios/vdi-week.toml")),
        ("vdi-pod", include_str!("../../../scenarios/vdi-pod.toml")),
        ("qos-gate", include_str!("../../../scenarios/qos-gate.toml")),
        (
            "ceph-gateways",
            include_str!("../../../scenarios/ceph-gateways.toml"),
        ),
    ]
}

impl Scenario {
    /// A shipped scenario by name.
    // Inline like `Scenario::from_toml_str` (see scenario.rs): parsing is compiled
    // in the caller.
    #[inline]
    pub fn builtin(name: &str) -> Option<Result<Scenario, ScenarioError>> {
        builtin_scenarios()
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(n, text)| Scenario::from_toml_str(&format!("scenarios/{n}.toml"), text))
    }

    /// Runs every case; `seed` overrides the file's.
    pub fn run(&self, seed: Option<u64>, progress: &mut dyn FnMut(Progress)) -> ScenarioReport {
        self.run_with_faults(seed, &|_, _| Box::new(fault::NoFaults), progress)
    }

    /// Like [`Scenario::run`], with a fault injector per case: `faults(case_name,
    /// seed)` builds it (derive its randomness from the seed so runs replay).
    pub fn run_with_faults(
        &self,
        seed: Option<u64>,
        faults: &FaultBuilder,
        progress: &mut dyn FnMut(Progress),
    ) -> ScenarioReport {
        self.run_jobs(seed, 1, faults, progress)
    }

    /// Like [`Scenario::run_with_faults`], running up to `jobs` cases at once, each
    /// on its own thread. Cases share nothing (each builds its own engine from its
    /// plan and the seed), and the report lists them in the file's order, so the
    /// report is byte-identical whatever `jobs` is; only progress interleaves.
    /// `Progress::cases_done` counts the cases finished so far.
    pub fn run_jobs(
        &self,
        seed: Option<u64>,
        jobs: usize,
        faults: &FaultBuilder,
        progress: &mut dyn FnMut(Progress),
    ) -> ScenarioReport {
        let seed = seed.unwrap_or(self.seed);
        let total = self.cases.len();
        let workers = jobs.clamp(1, total.max(1));
        let next = AtomicUsize::new(0);
        let mut reports: Vec<Option<weir_report::CaseReport>> = vec![None; total];
        // Bounded: a worker waits while the caller draws its progress.
        let (tx, rx) = mpsc::sync_channel::<Event>(64 * workers);
        std::thread::scope(|scope| {
            for _ in 0..workers {
                let tx = tx.clone();
                let next = &next;
                scope.spawn(move || {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(plan) = self.cases.get(i) else { break };
                        let mut send = |p: Progress| {
                            let _ = tx.send(Event::Progress(p));
                        };
                        let report = run_case(plan, seed, faults, &mut send, i, total);
                        if tx.send(Event::Done(i, Box::new(report))).is_err() {
                            break;
                        }
                    }
                });
            }
            drop(tx);
            let mut done = 0;
            for event in rx {
                match event {
                    Event::Progress(p) => progress(Progress {
                        cases_done: done,
                        ..p
                    }),
                    Event::Done(i, report) => {
                        done += 1;
                        let plan = &self.cases[i];
                        progress(Progress {
                            cases_done: done,
                            cases_total: total,
                            case: plan.name.clone(),
                            simulated_s: report.duration_s,
                            case_simulated_s: (plan.warmup_ns + plan.duration_ns) as f64 / 1e9,
                        });
                        debug_assert!(reports[i].is_none(), "case {i} ran twice");
                        reports[i] = Some(*report);
                    }
                }
            }
        });
        let cases: Vec<_> = reports
            .into_iter()
            .map(|r| r.expect("every case reports once"))
            .collect();
        assert_eq!(cases.len(), total);
        ScenarioReport {
            scenario: self.name.clone(),
            description: self.description.clone(),
            seed,
            cases,
        }
    }
}

/// Builds a case's fault injector from its name and the seed; shared by the
/// threads that run cases, hence `Sync`.
pub type FaultBuilder = dyn Fn(&str, u64) -> Box<dyn fault::FaultInjector> + Sync;

/// What a case's thread tells the caller.
enum Event {
    Progress(Progress),
    Done(usize, Box<weir_report::CaseReport>),
}

/// Runs one case: its engine, or a report saying why it could not be built.
fn run_case(
    plan: &scenario::CasePlan,
    seed: u64,
    faults: &FaultBuilder,
    progress: &mut dyn FnMut(Progress),
    index: usize,
    total: usize,
) -> weir_report::CaseReport {
    match engine::Engine::new(plan, seed, faults(&plan.name, seed)) {
        Ok(engine) => engine.run(progress, index, total),
        Err(e) => weir_report::CaseReport {
            name: plan.name.clone(),
            description: format!("could not build this case: {e}"),
            params: plan.params.clone(),
            ..Default::default()
        },
    }
}
