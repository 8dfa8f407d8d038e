//! Helpers shared by the simulator's bench binaries.

/// CPU time of this process (user + system), s: the machine may be shared, so this
/// is the figure for "one core".
pub fn cpu_s() -> f64 {
    // SAFETY: getrusage fills the struct we pass; no other effect.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    u.ru_utime.tv_sec as f64
        + u.ru_utime.tv_usec as f64 / 1e6
        + u.ru_stime.tv_sec as f64
        + u.ru_stime.tv_usec as f64 / 1e6
}

/// FNV-1a of a report's JSON: two runs with equal digests produced the same report
/// (for checking that a speed change kept the results bit for bit).
pub fn digest(report: &weir_report::ScenarioReport) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in weir_report::render_json(report).bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
    }
    h
}
