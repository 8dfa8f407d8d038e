//! The live-vs-simulator twin (issue 10): one contended pool — `weir serve`'s
//! emulated `15k-sas-raid5x24` with default settings, 400 GiB volumes, closed-loop
//! 4 KiB random readers — run live here and in `weir sim` (scenarios/qos-gate.toml,
//! the same gate code, the same array model, the same volume placement). Both must
//! reach the same outcomes, within stated tolerances:
//!
//! - shares 2:1, both at QD32: the two IOPS ratios within ±0.15 of each other
//!   (each within ±0.1 of 2);
//! - a 1,500 IOPS reservation beside three QD32 floods: both ≥ 0.98 × 1,500, and the
//!   reserved volume's IOPS within 15 % of each other;
//! - a 10 ms mission-critical target at QD4 beside a QD64 flood: both hold it
//!   (p50 ≤ 10 ms, p99 ≤ 20 ms), with the live p50 and p99 within 25 % of the
//!   simulator's and the flood's IOPS within 15 %.
//!
//! Live runs are short (3 s warm-up, 4 s measured per case; 22 s in all); three
//! runs in a row gave shares 1.999-2.001 live vs 2.000 simulated, reservation
//! 1,738-1,748 vs 1,747 IOPS, p50 6.52-6.57 vs 6.46 ms and p99 14.4-15.2 vs
//! 14.9 ms. The live half needs the machine's CPUs: with four CPU burners
//! beside it on a 2-core machine the client cannot keep its queue depth (the
//! shares ratio fell to 1.6, the flood to 0.3-0.45× of its IOPS). Each live run
//! therefore runs beside a [`NoiseProbe`]: a disagreement while other processes
//! took the CPUs is run again (three runs at most); two disagreements on a
//! quiet machine fail the test, and three runs with neither an agreement nor
//! two quiet disagreements are reported as a comparison not made.

mod common;

use std::time::Duration;

use common::NoiseProbe;
use common::emulated::{iops, pct, pool, run, volumes};
use weir_report::{CaseReport, WorkloadResult};
use weir_sim::Scenario;

const MEASURE: Duration = Duration::from_secs(4);

fn sim(cases: &str) -> Vec<CaseReport> {
    let mut s = Scenario::builtin("qos-gate")
        .expect("qos-gate is built in")
        .expect("qos-gate loads");
    s.retain_cases(cases);
    s.run(None, &mut |_| {}).cases
}

fn workload<'a>(cases: &'a [CaseReport], case: &str, name: &str) -> &'a WorkloadResult {
    cases
        .iter()
        .find(|c| c.name == case)
        .and_then(|c| c.workloads.iter().find(|w| w.name == name))
        .unwrap_or_else(|| panic!("simulated case {case} has no workload {name}"))
}

/// `assert!` for a check that returns its failure (see [`compare`]).
macro_rules! ensure {
    ($cond:expr, $($msg:tt)*) => {
        if !$cond {
            return Err(format!($($msg)*));
        }
    };
}

/// Runs a live comparison beside a [`NoiseProbe`], up to three times, until
/// one run agrees. A disagreement on a quiet machine twice fails the test. On a
/// machine whose CPUs something else took (a neighbour on a shared CI host;
/// four CPU burners beside it on 2 cores brought the live shares ratio to 1.6
/// and the flood to 0.3-0.45× of its IOPS) the live client cannot keep its
/// queue depth, which the simulated twin never lacks: such runs are run again,
/// and when three runs ended without an agreement or two quiet disagreements
/// the comparison is reported as not made, with the noise of each run.
async fn compare(what: &str, check: impl AsyncFn() -> Result<(), String>) {
    let mut quiet_failures = Vec::new();
    let mut noisy_failures = Vec::new();
    for run in 1..=3 {
        let probe = NoiseProbe::start();
        let outcome = check().await;
        let noise = probe.finish();
        println!("twin {what}: {noise}");
        match outcome {
            Ok(()) => return,
            Err(e) if noise.quiet() => quiet_failures.push(e),
            Err(e) => noisy_failures.push(format!("{e} ({noise})")),
        }
        if quiet_failures.len() == 2 {
            panic!(
                "twin {what}: apart twice on a quiet machine: {}",
                quiet_failures.join("; then ")
            );
        }
        if run < 3 {
            println!("twin {what}: apart, running it again");
        }
    }
    println!(
        "skipped: twin {what} not compared: the machine was too noisy for the live half \
         in {} of 3 runs: {}{}",
        noisy_failures.len(),
        noisy_failures.join("; "),
        quiet_failures
            .first()
            .map(|e| format!("; and once on a quiet machine: {e}"))
            .unwrap_or_default()
    );
}

fn within(live: f64, sim: f64, tolerance: f64) -> bool {
    (live / sim - 1.0).abs() <= tolerance
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_and_simulated_pools_reach_the_same_outcomes() {
    let sim_cases: Vec<CaseReport> = ["shares", "reservation", "latency-target"]
        .into_iter()
        .flat_map(sim)
        .collect();
    let policies = r#"
[[policies]]
name = "high"
shares = "high"
[[policies]]
name = "normal"
[[policies]]
name = "reserved"
reservation_iops = 1500
[[policies]]
name = "mc"
service_level = "mission-critical"
latency_target_ms = 10
[[policies]]
name = "nc"
service_level = "non-critical"
"#;

    // Shares 2:1.
    compare("shares 2:1", async || {
        let config = pool(true) + policies + &volumes(&[("v1", "high"), ("v2", "normal")]);
        let (_d, server) = common::start_with("twin", &config).await;
        let r = run(server.nbd_addr(), &[("v1", 32), ("v2", 32)], MEASURE).await;
        server.shutdown().await.unwrap();
        let live_ratio = iops(&r[0], MEASURE) / iops(&r[1], MEASURE);
        let sim_ratio = workload(&sim_cases, "shares", "high").iops
            / workload(&sim_cases, "shares", "normal").iops;
        println!("twin shares 2:1: live {live_ratio:.3}, simulated {sim_ratio:.3}");
        ensure!(
            (live_ratio - sim_ratio).abs() <= 0.15 && (live_ratio - 2.0).abs() <= 0.1,
            "shares: live {live_ratio:.3} vs simulated {sim_ratio:.3}"
        );
        Ok(())
    })
    .await;

    // A reservation beside three floods.
    compare("reservation", async || {
        let config = pool(true)
            + policies
            + &volumes(&[
                ("v1", "reserved"),
                ("v2", "normal"),
                ("v3", "normal"),
                ("v4", "normal"),
            ]);
        let (_d, server) = common::start_with("twin", &config).await;
        let loads = [("v1", 32), ("v2", 32), ("v3", 32), ("v4", 32)];
        let r = run(server.nbd_addr(), &loads, MEASURE).await;
        server.shutdown().await.unwrap();
        let live_reserved = iops(&r[0], MEASURE);
        let sim_reserved = workload(&sim_cases, "reservation", "reserved").iops;
        println!(
            "twin reservation 1,500: live {live_reserved:.0} IOPS, simulated {sim_reserved:.0}"
        );
        ensure!(
            live_reserved >= 0.98 * 1500.0
                && sim_reserved >= 0.98 * 1500.0
                && within(live_reserved, sim_reserved, 0.15),
            "reservation: live {live_reserved:.0} vs simulated {sim_reserved:.0} IOPS"
        );
        Ok(())
    })
    .await;

    // A latency target beside a flood.
    compare("latency target", async || {
        let config = pool(true) + policies + &volumes(&[("v1", "mc"), ("v2", "nc")]);
        let (_d, server) = common::start_with("twin", &config).await;
        let r = run(server.nbd_addr(), &[("v1", 4), ("v2", 64)], MEASURE).await;
        server.shutdown().await.unwrap();
        let (p50, p99) = (pct(&r[0], 0.5), pct(&r[0], 0.99));
        let flood = iops(&r[1], MEASURE);
        let held = &workload(&sim_cases, "latency-target", "critical").latency_ms;
        let sim_flood = workload(&sim_cases, "latency-target", "flood-64").iops;
        println!(
            "twin latency target: live p50 {p50:.2} p99 {p99:.2} ms, flood {flood:.0} IOPS; \
             simulated p50 {:.2} p99 {:.2} ms, flood {sim_flood:.0}",
            held.p50, held.p99
        );
        ensure!(
            p50 <= 10.0 && p99 <= 20.0 && held.p50 <= 10.0 && held.p99 <= 20.0,
            "target not held: live p50 {p50:.1} p99 {p99:.1}, simulated p50 {:.1} p99 {:.1}",
            held.p50,
            held.p99
        );
        ensure!(
            within(p50, held.p50, 0.25)
                && within(p99, held.p99, 0.25)
                && within(flood, sim_flood, 0.15),
            "latency outcomes apart: live p50 {p50:.2} p99 {p99:.2} flood {flood:.0}, simulated p50 {:.2} p99 {:.2} flood {sim_flood:.0}",
            held.p50,
            held.p99
        );
        Ok(())
    })
    .await;
}
