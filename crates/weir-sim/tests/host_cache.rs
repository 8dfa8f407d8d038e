//! The hosts' flash read caches run `weir serve`'s cache decisions
//! (weir_model::FlashCache): writes invalidate (a read after a write misses),
//! sequential scans are not admitted, the scan cutoff is the server's, and a run
//! stays the same from one seed.

use weir_report::{CaseReport, ComponentResult, WorkloadResult};
use weir_sim::Scenario;

/// One host with a 1 GiB flash cache (the server's defaults: 4 KiB blocks, 4 MiB
/// scan cutoff) and VM `a` using it; `workload` is the VM's access, `disk_gib` its
/// disk, `cases` extra text.
fn scenario(workload: &str, disk_gib: &str, cases: &str) -> Scenario {
    let text = format!(
        r#"[scenario]
name = "host-cache"
duration_s = 20

[array]
ideal = {{ servers = 4, service_us = 1000 }}

[[host]]
name = "h1"
link = "none"
flash_cache = {{ size_gib = 1 }}

[[workload]]
name = "w"
{workload}

[[vm]]
name = "a"
host = "h1"
workload = "w"
disk_gib = {disk_gib}
host_cache = true
{cases}"#
    );
    Scenario::from_toml_str("host-cache.toml", &text).unwrap_or_else(|e| panic!("{e}"))
}

fn component<'a>(c: &'a CaseReport, name: &str) -> &'a ComponentResult {
    c.components
        .iter()
        .find(|x| x.name == name)
        .unwrap_or_else(|| panic!("no component {name} in {}", c.name))
}

fn workload<'a>(c: &'a CaseReport, name: &str) -> &'a WorkloadResult {
    c.workloads
        .iter()
        .find(|x| x.name == name)
        .unwrap_or_else(|| panic!("no workload {name}"))
}

/// Hits, misses (the hit ratio's row counts hits) of host h1's cache.
fn hits_misses(c: &CaseReport) -> (f64, f64) {
    let r = component(c, "host cache h1 hit ratio");
    let hits = r.ios as f64;
    let misses = if r.utilisation > 0.0 {
        hits / r.utilisation - hits
    } else {
        f64::INFINITY
    };
    (hits, misses)
}

/// Reads and writes, at random, of one 4 KiB block, one at a time with 1 ms
/// between them. The server's cache drops the block at every write, so a read
/// that follows a write misses (and fills it again): about half the reads miss.
/// A cache that updated its copy on writes (the simulator's before it ran the
/// server's model) hit every read but the first.
#[test]
fn a_read_after_a_write_misses_and_refills() {
    let s = scenario(
        "block_kib = 4\nread_pct = 50\nrandom_pct = 100\ndataset_fraction = 1\nburst_ios = 1\nburst_delay_ms = 1",
        // One 4 KiB block.
        "3.814697265625e-06",
        "",
    );
    let r = s.run(Some(1), &mut |_| {});
    let c = &r.cases[0];
    let w = workload(c, "a");
    let duration = c.duration_s;
    let (reads, writes) = (w.read_iops * duration, w.write_iops * duration);
    assert!(
        reads > 2_000.0 && writes > 2_000.0,
        "{reads} reads, {writes} writes"
    );
    let (hits, misses) = hits_misses(c);
    assert!(
        (hits + misses - reads).abs() < 2.0,
        "{hits} + {misses} vs {reads}"
    );
    // A read misses when a write came before it (probability ½).
    let ratio = hits / reads;
    assert!((0.4..0.6).contains(&ratio), "hit ratio {ratio}");
    // Every miss and every write reached the array; every hit and every fill (one
    // per miss: one at a time, no write overlaps a fill) was a flash I/O.
    let array = component(c, "array").ios as f64;
    assert!((array - (misses + writes)).abs() < 3.0, "array {array}");
    let flash = component(c, "host flash h1").ios as f64;
    assert!((flash - (hits + misses)).abs() < 3.0, "flash {flash}");
}

/// Sequential 1 MiB reads over a 64 MiB disk, pass after pass, in a 1 GiB cache:
/// past the 4 MiB cutoff a run is a scan and fills nothing, so each pass hits
/// only the three reads that began it (filled on the first pass, before the run
/// reached the cutoff). With `scan_cutoff_kib = 0` every miss fills and every
/// pass after the first hits.
#[test]
fn a_sequential_scan_is_not_admitted_unless_the_cutoff_is_off() {
    let s = scenario(
        "block_kib = 1024\nread_pct = 100\nrandom_pct = 0\ndataset_fraction = 1",
        "0.0625",
        "[[case]]\nname = \"cutoff\"\n[[case]]\nname = \"no-cutoff\"\nset = { \"host.h1.flash_cache.scan_cutoff_kib\" = 0 }\n",
    );
    let r = s.run(Some(1), &mut |_| {});
    let (cutoff, admit_all) = (&r.cases[0], &r.cases[1]);
    let reads = workload(cutoff, "a").read_iops * cutoff.duration_s;
    assert!(reads > 640.0, "{reads} reads: at least ten passes");
    let (hits, _) = hits_misses(cutoff);
    let ratio = hits / reads;
    assert!(
        (ratio - 3.0 / 64.0).abs() < 0.01,
        "hit ratio {ratio} with the scan cutoff"
    );
    let (hits, misses) = hits_misses(admit_all);
    assert!(
        hits / (hits + misses) > 0.99,
        "{hits} hits, {misses} misses without the cutoff"
    );
}

#[test]
fn same_seed_same_report() {
    let s = scenario(
        "block_kib = 8\nread_pct = 70\nrandom_pct = 80\noutstanding_ios = 8\nworkers = 2",
        "0.01",
        "",
    );
    let json = |s: &Scenario| serde_json::to_string(&s.run(Some(7), &mut |_| {})).unwrap();
    assert_eq!(json(&s), json(&s));
}

/// A host's `flash_cache` defaults to the server's block and scan cutoff.
#[test]
fn defaults_are_the_servers() {
    let spec: weir_sim::topology::HostCacheSpec = toml::from_str("size_gib = 1").unwrap();
    assert_eq!(
        spec.block_kib as u64 * 1024,
        weir_model::DEFAULT_FLASH_BLOCK_BYTES
    );
    assert_eq!(
        spec.scan_cutoff_kib * 1024,
        weir_model::DEFAULT_SCAN_CUTOFF_BYTES
    );
}
