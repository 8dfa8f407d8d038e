//! Simulation speed of the issue-4 VDI scenarios (figures, not assertions).
//!
//! `cargo bench -p weir-sim --bench vdi_week [-- --monday-only]`
//!
//! Runs the shipped `vdi-week` scenario: the 2,500-desktop Monday login after the
//! reboot (≈ 29 M simulated I/Os), then every phase of the week, and prints simulated
//! I/Os, wall time and CPU time of this process (the machine may be shared: CPU time
//! is the figure for "one core").
//!
//! For A/B work (instruction counts under callgrind, bit-for-bit checks):
//! `-- --case NAME [--scale F] [--digest]` runs the cases whose name contains NAME,
//! with every case's duration scaled by F (0 < F ≤ 1), and `--digest` prints a hash of
//! the JSON report (equal digests: identical results).

use std::time::Instant;
use weir_sim::Scenario;

mod common;
use common::{cpu_s, digest};

fn run(label: &str, filter: &str, scale: f64, show_digest: bool) {
    let mut s = match Scenario::builtin("vdi-week") {
        Some(Ok(s)) => s,
        _ => {
            eprintln!("vdi-week does not load");
            std::process::exit(1);
        }
    };
    s.retain_cases(filter);
    if scale < 1.0 {
        s.scale_duration(scale);
    }
    let (wall0, cpu0) = (Instant::now(), cpu_s());
    let report = s.run(None, &mut |_| {});
    let (wall, cpu) = (wall0.elapsed().as_secs_f64(), cpu_s() - cpu0);
    let ios: u64 = report.cases.iter().map(|c| c.events).sum();
    println!(
        "{label:<28} {:>2} case(s) {ios:>11} simulated I/Os  {wall:>7.1} s wall  {cpu:>7.1} s CPU  {:>9.0} I/Os per CPU second",
        report.cases.len(),
        ios as f64 / cpu.max(1e-9)
    );
    if show_digest {
        println!("report digest {:016x}", digest(&report));
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let show_digest = args.iter().any(|a| a == "--digest");
    if let Some(case) = value("--case") {
        let scale = match value("--scale").map(|s| s.parse::<f64>()) {
            None => 1.0,
            Some(Ok(f)) if f > 0.0 && f <= 1.0 => f,
            Some(_) => {
                eprintln!("--scale takes a factor in (0, 1]");
                std::process::exit(2);
            }
        };
        run(&case, &case, scale, show_digest);
        return;
    }
    run(
        "monday login (2,500)",
        "mon-login-after-reboot",
        1.0,
        show_digest,
    );
    if args.iter().any(|a| a == "--monday-only") {
        return;
    }
    // The week as 004's calendar runs it: one of each phase (8.1 power-on).
    for (label, filter) in [
        ("sunday creation", "sun-creation"),
        ("monday initial login", "mon-initial-login/8.1"),
        ("tuesday login", "tue-login"),
        ("power-on (8.1)", "mon-power-on/8.1"),
        ("steady state", "steady-state"),
    ] {
        run(label, filter, 1.0, show_digest);
    }
    println!(
        "(the week = the six lines above; the 8.0.1 / SATA / SSD power-on variants are extra cases)"
    );
}
