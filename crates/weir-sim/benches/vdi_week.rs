//! Simulation speed of the issue-4 VDI scenarios (figures, not assertions).
//!
//! `cargo bench -p weir-sim --bench vdi_week [-- --monday-only]`
//!
//! Runs the shipped `vdi-week` scenario: the 2,500-desktop Monday login after the
//! reboot (≈ 29 M simulated I/Os), then every phase of the week, and prints simulated
//! I/Os, wall time and CPU time of this process (the machine may be shared: CPU time
//! is the figure for "one core").

use std::time::Instant;
use weir_sim::Scenario;

fn cpu_s() -> f64 {
    // SAFETY: getrusage fills the struct we pass; no other effect.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    u.ru_utime.tv_sec as f64
        + u.ru_utime.tv_usec as f64 / 1e6
        + u.ru_stime.tv_sec as f64
        + u.ru_stime.tv_usec as f64 / 1e6
}

fn run(label: &str, filter: &str) {
    let mut s = match Scenario::builtin("vdi-week") {
        Some(Ok(s)) => s,
        _ => {
            eprintln!("vdi-week does not load");
            std::process::exit(1);
        }
    };
    s.retain_cases(filter);
    let (wall0, cpu0) = (Instant::now(), cpu_s());
    let report = s.run(None, &mut |_| {});
    let (wall, cpu) = (wall0.elapsed().as_secs_f64(), cpu_s() - cpu0);
    let ios: u64 = report.cases.iter().map(|c| c.events).sum();
    println!(
        "{label:<28} {:>2} case(s) {ios:>11} simulated I/Os  {wall:>7.1} s wall  {cpu:>7.1} s CPU  {:>9.0} I/Os per CPU second",
        report.cases.len(),
        ios as f64 / cpu.max(1e-9)
    );
}

fn main() {
    run("monday login (2,500)", "mon-login-after-reboot");
    if std::env::args().any(|a| a == "--monday-only") {
        return;
    }
    // The week as 004's calendar runs it: one of each phase (8.1 power-on).
    for (label, filter) in [
        ("sunday creation", "sun-creation"),
        ("monday initial login", "mon-initial-login"),
        ("tuesday login", "tue-login"),
        ("power-on (8.1)", "mon-power-on/8.1"),
        ("steady state", "steady-state"),
    ] {
        run(label, filter);
    }
    println!(
        "(the week = the six lines above; the 8.0.1 / SATA / SSD power-on variants are extra cases)"
    );
}
