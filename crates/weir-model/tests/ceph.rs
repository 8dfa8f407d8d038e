//! The Ceph-like cluster model: CPU-bound small I/O, the cost of replication,
//! BlueStore's deferred writes on HDD OSDs, requests split at object boundaries.

use weir_model::harness::{SplitMix64, run_closed_loop};
use weir_model::{CephCluster, CephSpec, DeviceIo, IoDir};

fn cluster(extra: &str) -> CephCluster {
    let spec: CephSpec = toml::from_str(extra).expect("spec parses");
    CephCluster::new(&spec).expect("spec is valid")
}

fn random_4k(dir: IoDir, span: u64) -> impl FnMut(u64) -> DeviceIo {
    let mut rng = SplitMix64(7);
    move |_| DeviceIo {
        offset_bytes: rng.below(span / 4096) * 4096,
        size_bytes: 4096,
        dir,
    }
}

const SPAN: u64 = 64 << 30;

#[test]
fn small_reads_on_flash_are_bound_by_osd_cpu() {
    // 3 OSDs × 2 cores, each read 580 + 4 × 2.8 µs of one core on its primary.
    let mut c = cluster("osds = 3\nreplicas = 1\ndrive = \"pcie-flash\"");
    let r = run_closed_loop(&mut c, 64, 40_000, random_4k(IoDir::Read, SPAN));
    let expected = 3.0 * 2.0 / (591.2e-6);
    let iops = r.steady_iops(0.2);
    assert!(
        (iops / expected - 1.0).abs() < 0.1,
        "{iops:.0} IOPS, expected ≈ {expected:.0}"
    );
}

#[test]
fn each_copy_of_a_write_costs_cpu_on_its_osd() {
    let one = run_closed_loop(
        &mut cluster("osds = 3\nreplicas = 1\ndrive = \"pcie-flash\""),
        64,
        30_000,
        random_4k(IoDir::Write, SPAN),
    );
    let three = run_closed_loop(
        &mut cluster("osds = 3\nreplicas = 3\ndrive = \"pcie-flash\""),
        64,
        20_000,
        random_4k(IoDir::Write, SPAN),
    );
    let ratio = three.steady_iops(0.2) / one.steady_iops(0.2);
    assert!(
        (ratio - 1.0 / 3.0).abs() < 0.04,
        "size 3 ÷ size 1 = {ratio:.3}"
    );
}

#[test]
fn deferred_writes_are_logged_then_applied_in_batches_on_hdd_osds() {
    // 4 HDD OSDs, 2 copies: 4 KiB writes are deferred by default (64 KiB and less).
    let base = "osds = 4\nreplicas = 2\ndrive = \"sata-7200\"\ncpu_us_per_op = 50\n";
    let writes = 4000u64;
    let mut deferred = cluster(base);
    run_closed_loop(&mut deferred, 64, writes, random_4k(IoDir::Write, SPAN));
    let logged: u64 = deferred.osd_stats().iter().map(|s| s.drive_ios).sum();
    // Each copy is a log append plus an in-place write, except the batches not yet
    // full (fewer than 64 per OSD).
    let copies = 2 * writes;
    assert!(
        logged <= 2 * copies && logged > 2 * copies - 4 * 64,
        "{logged} drive writes for {copies} copies"
    );
    let mut in_place = cluster(&format!("{base}deferred_write_kib = 0"));
    run_closed_loop(&mut in_place, 64, writes, random_4k(IoDir::Write, SPAN));
    let direct: u64 = in_place.osd_stats().iter().map(|s| s.drive_ios).sum();
    assert_eq!(direct, copies);
}

#[test]
fn a_request_over_several_objects_completes_once_when_all_pieces_are_done() {
    let mut c = cluster("osds = 6\nreplicas = 2\ndrive = \"sata-ssd\"");
    // 8 MiB from 2 MiB: three 4 MiB objects (2 + 4 + 2 MiB).
    let big = run_closed_loop(&mut c, 4, 40, |i| DeviceIo {
        offset_bytes: (2 << 20) + i * (64 << 20),
        size_bytes: 8 << 20,
        dir: if i % 2 == 0 {
            IoDir::Write
        } else {
            IoDir::Read
        },
    });
    assert_eq!(big.completed, 40);
    let mut tokens: Vec<u64> = big.completions.iter().map(|c| c.token).collect();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), 40, "a request completed twice");
    // Served by several OSDs in parallel: faster than one object's worth at a time.
    let stats = c.osd_stats();
    assert!(
        stats.iter().filter(|s| s.drive_ios > 0).count() >= 4,
        "{stats:?}"
    );
}

#[test]
fn same_inputs_same_completions() {
    let run = || {
        run_closed_loop(
            &mut cluster("osds = 5\ndrive = \"sas-15k\""),
            16,
            3000,
            random_4k(IoDir::Write, SPAN),
        )
        .completions
    };
    assert_eq!(run(), run());
}
