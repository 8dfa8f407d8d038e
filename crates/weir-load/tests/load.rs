//! `weir load` against real NBD peers on loopback: nbdkit (memory, null, error
//! filter), weir-server, and an in-test server that corrupts data or hangs up.

mod common;

use common::{Misbehaviour, Nbdkit, TestServer};
use std::path::PathBuf;
use std::time::Duration;
use weir_load::{LoadError, LoadOptions, LoadOutcome, LoadScenario, ScenarioSource, Target};
use weir_testkit::TempDir;

fn options(targets: &str, scenario: &str, seconds: f64) -> LoadOptions {
    let mut o = LoadOptions::new(
        Target::parse_list(targets).unwrap(),
        LoadScenario::from_spec(scenario).unwrap(),
    );
    o.duration = Some(Duration::from_secs_f64(seconds));
    o.timeline_interval = Some(Duration::from_millis(250));
    o.drain_timeout = Duration::from_secs(5);
    o
}

/// [`options`] with data verification on; `zeroed`: the target starts all zeroes.
fn verifying(targets: &str, scenario: &str, seconds: f64, zeroed: bool) -> LoadOptions {
    let mut o = options(targets, scenario, seconds);
    o.verify = true;
    o.target_zeroed = zeroed;
    o
}

fn scenario_file(path: PathBuf) -> LoadScenario {
    LoadScenario::load(&ScenarioSource::File(path)).unwrap()
}

fn run(o: LoadOptions) -> LoadOutcome {
    let mut ticks = 0;
    let out = weir_load::run(o, &mut |_| ticks += 1).expect("load run");
    assert!(ticks >= 1, "progress was reported");
    out
}

/// A mix of sizes, some not sector multiples, reads and writes: overlapping
/// requests on a small disk exercise the shadow map's in-flight rules.
const MIXED_TOML: &str = r#"
[scenario]
name = "mixed-verify"
seed = 5

[[workload]]
name = "mix"
outstanding_ios = 8
workers = 2
alignment_bytes = 512
lines = [
  { size_bytes = 4096, access_pct = 50, read_pct = 50, random_pct = 100 },
  { size_bytes = 65536, access_pct = 20, read_pct = 50, random_pct = 30 },
  { size_bytes = 1536, access_pct = 20, read_pct = 50, random_pct = 100 },
  { size_bytes = 1000, access_pct = 10, read_pct = 50, random_pct = 100 },
]

[[vm]]
name = "desk"
workload = "mix"
count = 3
disk_gib = 0.00390625   # 4 MiB each

[array]
preset = "ignored by weir load"
"#;

/// `text` written to `name` in a fresh directory (removed when the first value drops).
fn write_temp(name: &str, text: &str) -> (TempDir, PathBuf) {
    let dir = TempDir::new("load");
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    (dir, p)
}

#[test]
fn verify_against_nbdkit_memory_finds_no_mismatch() {
    if !common::nbdkit_available() {
        return;
    }
    let k = Nbdkit::start(&["memory", "64M"]);
    let out = run(verifying(
        &k.uri(),
        "bs=4k,randrw,qd=16,vms=4,disk=1m",
        1.5,
        true,
    ));
    let v = out.verify.clone().unwrap();
    println!("nbdkit memory: {} I/Os, {v:?}", out.ios);
    assert!(out.passed(), "{:?}", out.failures());
    assert!(out.ios > 500, "{} I/Os", out.ios);
    assert!(v.reads_checked > 100, "{v:?}");
    assert_eq!(v.mismatched_sectors, 0);

    // Mixed, unaligned sizes from a scenario file (simulated hardware ignored), on a
    // fresh (zeroed) export: the first one now holds the first run's data.
    drop(k);
    let k = Nbdkit::start(&["memory", "64M"]);
    let (_tmp, path) = write_temp("mixed.toml", MIXED_TOML);
    let mut o = verifying(&k.uri(), "bs=4k", 1.5, true);
    o.scenario = scenario_file(path);
    o.connections = Some(2);
    let out = run(o);
    let v = out.verify.clone().unwrap();
    println!("nbdkit memory, mixed sizes: {} I/Os, {v:?}", out.ios);
    assert!(out.passed(), "{:?}", out.failures());
    assert!(v.sectors_checked > 1000, "{v:?}");
    let case = &out.report.cases[0];
    assert_eq!(case.workloads.len(), 3);
    assert!(
        case.description.contains("ignored by weir load"),
        "{}",
        case.description
    );
    assert!(
        case.description.contains("2 connections"),
        "{}",
        case.description
    );
}

#[test]
fn null_plugin_run_fills_the_report() {
    if !common::nbdkit_available() {
        return;
    }
    let k = Nbdkit::start(&["null", "1G"]);
    let out = run(options(&k.uri(), "bs=4k,randread,qd=32,vms=2", 1.0));
    assert!(out.passed(), "{:?}", out.failures());
    let case = &out.report.cases[0];
    let total = case.total.as_ref().unwrap();
    println!(
        "nbdkit null, 2 VMs QD32 4 KiB random read, debug build: {:.0} IOPS, mean {:.3} ms, p99 {:.3} ms",
        total.iops, total.latency_ms.mean, total.latency_ms.p99
    );
    assert!(total.iops > 100.0 && total.read_iops == total.iops);
    assert!((total.mbps - total.iops * 4096.0 / 1e6).abs() < 1e-6 * total.mbps.max(1.0));
    assert!(total.latency_ms.p50 <= total.latency_ms.p99);
    assert!(total.latency_ms.p99 <= total.latency_ms.max);
    assert_eq!(case.workloads.iter().map(|w| w.ios).sum::<u64>(), total.ios);
    let series = case
        .timeline
        .iter()
        .find(|s| s.name == "total IOPS")
        .unwrap();
    assert_eq!(series.values.len(), 4, "1 s in 250 ms intervals");
    let last = *series.values.last().unwrap();
    assert!(
        last > series.values[0] / 3.0,
        "the last interval is a full one: {:?}",
        series.values
    );
    assert!(
        series.values.iter().all(|&v| v > 0.0),
        "{:?}",
        series.values
    );
    assert!(case.timeline.iter().any(|s| s.name == "vm-2 IOPS"));
    let targets = case
        .components
        .iter()
        .filter(|c| c.name.starts_with("nbd://"))
        .count();
    assert_eq!(targets, 1);
    let class = case
        .components
        .iter()
        .find(|c| c.name == "workload spec (2 VMs)")
        .unwrap();
    assert_eq!(class.ios, total.ios);
    let active = case
        .timeline
        .iter()
        .find(|s| s.name == "VMs issuing I/O %")
        .unwrap();
    assert!(
        active.values.iter().all(|&v| v == 100.0),
        "{:?}",
        active.values
    );
    let sizes = case.io_sizes.as_ref().unwrap();
    assert_eq!(sizes.bucket_bytes[0], 4096);
    assert!(sizes.reads[0] >= total.ios && sizes.reads[1..].iter().all(|&n| n == 0));
    assert!(sizes.random_reads > sizes.sequential_reads);
    assert_eq!(sizes.writes.iter().sum::<u64>(), 0);
    // The document renders like any simulator report.
    let text = weir_report::render_text(&out.report, &Default::default());
    assert!(text.contains("vm-1"), "{text}");
    // vm-2's series in the legend of the I/O rate chart (the chart names the unit).
    let html = weir_report::render_html(&out.report);
    let iops_chart = html
        .split("I/O rate (IOPS) over time")
        .nth(1)
        .and_then(|c| c.split("</figure>").next())
        .expect("an IOPS chart");
    assert!(iops_chart.contains(">vm-2</text>"), "{iops_chart}");
    let json = weir_report::render_json(&out.report);
    assert_eq!(
        weir_report::parse_json(&json).unwrap().cases[0]
            .workloads
            .len(),
        2
    );
}

#[test]
fn nbdkit_error_filter_errors_are_reported() {
    if !common::nbdkit_available() {
        return;
    }
    let k = Nbdkit::start(&[
        "--filter=error",
        "memory",
        "16M",
        "error=EIO",
        "error-rate=5%",
    ]);
    let out = run(verifying(&k.uri(), "bs=4k,randrw,qd=8", 1.0, false));
    println!(
        "error filter: {} I/Os, {} errors: {:?}",
        out.ios,
        out.io_errors,
        out.first_errors.first()
    );
    assert!(!out.passed());
    assert!(out.io_errors > 10, "{}", out.io_errors);
    assert!(
        out.first_errors[0].contains("EIO") || out.first_errors[0].contains("Input/output"),
        "{:?}",
        out.first_errors
    );
    let total = out.report.cases[0].total.as_ref().unwrap();
    assert!(total.errors > 0);
    assert_eq!(
        out.verify.unwrap().mismatched_sectors,
        0,
        "failed writes are not judged"
    );
}

/// Failed and never-answered requests are errors, not completions: no IOPS, MB/s or
/// latency from them (session 30: 100 % errors showed as 16,381 IOPS, and 4 requests
/// unanswered at the drain as 2 IOPS of 12 s).
#[test]
fn failed_and_unanswered_requests_are_not_completions() {
    if !common::nbdkit_available() {
        return;
    }
    let failing = Nbdkit::start(&["--filter=error", "memory", "16M", "error-rate=100%"]);
    let out = run(options(&failing.uri(), "bs=64k,randrw,qd=8", 0.5));
    let total = out.report.cases[0].total.clone().unwrap();
    println!(
        "all failing: {} I/Os, {} errors, {total:?}",
        out.ios, out.io_errors
    );
    assert!(out.io_errors > 10, "{}", out.io_errors);
    assert_eq!(
        (out.ios, total.ios, total.iops, total.mbps),
        (0, 0, 0.0, 0.0)
    );
    assert!(total.latency_ms.mean.is_nan() && total.errors >= out.io_errors);
    let silent = Nbdkit::start(&["--filter=delay", "memory", "16M", "rdelay=30", "wdelay=30"]);
    let mut o = options(&silent.uri(), "bs=4k,randrw,qd=4", 0.5);
    o.drain_timeout = Duration::from_millis(500);
    let out = run(o);
    let total = out.report.cases[0].total.clone().unwrap();
    println!("never answered: {} errors, {total:?}", out.io_errors);
    assert_eq!(
        (out.io_errors, out.ios, total.ios, total.iops),
        (4, 0, 0, 0.0)
    );
    assert!(total.latency_ms.max.is_nan() && total.errors == 4);
}

#[test]
fn a_corrupting_target_fails_verification() {
    let server = TestServer::start(
        8 << 20,
        Misbehaviour {
            flip_every_nth_read: 25,
            ..Default::default()
        },
    );
    let out = run(verifying(
        &server.uri(),
        "bs=8k,randrw,qd=8,vms=2,disk=2m",
        1.0,
        true,
    ));
    let v = out.verify.clone().unwrap();
    let flipped = server.flipped.load(std::sync::atomic::Ordering::Relaxed);
    println!("bit flipper: {flipped} reads corrupted, {v:?}");
    assert!(flipped > 0);
    assert!(!out.passed());
    assert!(
        v.mismatched_reads > 0 && v.mismatched_reads <= flipped,
        "{v:?}"
    );
    assert!(
        v.first_mismatches[0].contains("1 of 512 bytes corrupted"),
        "{:?}",
        v.first_mismatches
    );
    assert!(
        out.failures()
            .iter()
            .any(|f| f.contains("mismatched sectors"))
    );
    assert!(out.report.cases[0].total.as_ref().unwrap().errors >= v.mismatched_reads);

    // The same server without the flips passes, even answering out of order.
    let honest = TestServer::start(
        8 << 20,
        Misbehaviour {
            reverse_replies: true,
            ..Default::default()
        },
    );
    let out = run(verifying(
        &honest.uri(),
        "bs=8k,randrw,qd=8,vms=2,disk=2m",
        0.5,
        true,
    ));
    assert!(out.passed(), "{:?}", out.failures());
    assert!(honest.reordered.load(std::sync::atomic::Ordering::Relaxed) > 10);
    assert!(out.verify.unwrap().reads_checked > 50);
}

#[test]
fn a_target_that_hangs_up_is_a_failure_not_a_hang() {
    let server = TestServer::start(
        4 << 20,
        Misbehaviour {
            hang_up_after: 200,
            ..Default::default()
        },
    );
    let out = run(options(&server.uri(), "bs=4k,randread,qd=4", 1.0));
    assert!(!out.passed());
    assert_eq!(
        out.connection_errors.len(),
        1,
        "{:?}",
        out.connection_errors
    );
    assert!(
        out.connection_errors[0].contains("closed"),
        "{:?}",
        out.connection_errors
    );
    assert!(out.ios >= 200);
}

#[test]
fn several_targets_bounded_connections_and_time_scale() {
    let a = TestServer::start(4 << 20, Misbehaviour::default());
    let b = TestServer::start(4 << 20, Misbehaviour::default());
    // Bursts of 4 I/Os every 400 ms of model time; at time scale 4 that is every
    // 100 ms of wall time: ~10 bursts per VM per second.
    let toml = r#"
[scenario]
name = "bursty"
duration_s = 4
timeline_interval_s = 1

[[workload]]
name = "bursty"
block_kib = 4
read_pct = 0
random_pct = 100
outstanding_ios = 4
burst_ios = 4
burst_delay_ms = 400

[[vm]]
name = "v"
workload = "bursty"
count = 6
"#;
    let (_tmp, path) = write_temp("bursty.toml", toml);
    let mut o = LoadOptions::new(
        Target::parse_list(&format!("{},{}", a.uri(), b.uri())).unwrap(),
        scenario_file(path),
    );
    o.time_scale = 4.0;
    o.connections = Some(3);
    o.verify = true;
    let out = run(o);
    assert!(out.passed(), "{:?}", out.failures());
    let case = &out.report.cases[0];
    assert!(
        (case.duration_s - 1.0).abs() < 0.2,
        "4 model s at ×4: {}",
        case.duration_s
    );
    assert!(
        case.description.contains("3 connections"),
        "{}",
        case.description
    );
    let targets = case
        .components
        .iter()
        .filter(|c| c.name.starts_with("nbd://"))
        .count();
    assert_eq!(targets, 2, "both targets used");
    for w in case
        .workloads
        .iter()
        .filter(|w| !w.name.starts_with("volume:"))
    {
        // ~10 bursts of 4 writes in the second; allow for scheduling slack.
        assert!((20..=48).contains(&w.ios), "{}: {} I/Os", w.name, w.ios);
        assert_eq!(w.read_iops, 0.0);
    }
    let volumes: u64 = case
        .workloads
        .iter()
        .filter(|w| w.name.starts_with("volume:mem"))
        .map(|w| w.ios)
        .sum();
    assert_eq!(
        volumes,
        case.total.as_ref().unwrap().ios,
        "one row per target"
    );
    let timeline = case
        .timeline
        .iter()
        .find(|s| s.name == "total IOPS")
        .unwrap();
    assert_eq!(timeline.interval_s, 0.25, "scenario interval / time scale");
}

/// `weir serve` with the configuration `toml`, its data in `dir`, on a runtime of
/// its own (one worker).
fn start_weir(dir: &TempDir, toml: &str) -> (tokio::runtime::Runtime, weir_server::RunningServer) {
    let mut config = weir_server::WeirConfig::from_toml_str(toml, "load test").unwrap();
    config.data_dir = dir.path().to_path_buf();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let server = rt
        .block_on(weir_server::RunningServer::start(config))
        .unwrap();
    (rt, server)
}

#[test]
fn weir_server_verify_run_passes() {
    let dir = TempDir::new("load-server");
    let config = r#"
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[[pools]]
name = "default"
max_in_flight = 16

[[volumes]]
name = "vol-a"
size = "16MiB"
policy = "mission-critical"

[[volumes]]
name = "vol-b"
size = "16MiB"
policy = "non-critical"
"#;
    let (rt, server) = start_weir(&dir, config);
    let addr = server.nbd_addr();
    let out = run(verifying(
        &format!("nbd://{addr}/vol-a,nbd://{addr}/vol-b"),
        "bs=4k,randrw,qd=8,vms=4,disk=2m",
        1.5,
        true,
    ));
    rt.block_on(server.shutdown()).unwrap();
    let v = out.verify.clone().unwrap();
    println!("weir-server: {} I/Os, {v:?}", out.ios);
    assert!(out.passed(), "{:?}", out.failures());
    assert!(v.reads_checked > 100, "{v:?}");
    let vols: Vec<_> = out.report.cases[0]
        .workloads
        .iter()
        .map(|w| (w.name.as_str(), w.volume.clone().unwrap()))
        .collect();
    let names = [
        "vm-1",
        "vm-2",
        "vm-3",
        "vm-4",
        "volume:vol-a",
        "volume:vol-b",
    ];
    let expect = ["vol-a", "vol-b", "vol-a", "vol-b", "vol-a", "vol-b"];
    assert_eq!(
        vols,
        names
            .into_iter()
            .zip(expect.map(String::from))
            .collect::<Vec<_>>()
    );
}

#[test]
fn setup_errors_are_clear() {
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let e = weir_load::run(
        options(&format!("nbd://127.0.0.1:{closed}/x"), "bs=4k", 0.2),
        &mut |_| {},
    )
    .unwrap_err();
    assert!(matches!(e, LoadError::Connect { .. }), "{e}");
    assert!(e.to_string().contains("connecting to 127.0.0.1"), "{e}");

    let small = TestServer::start(1 << 20, Misbehaviour::default());
    let e = weir_load::run(options(&small.uri(), "bs=4k,vms=300", 0.2), &mut |_| {}).unwrap_err();
    assert!(e.to_string().contains("do not fit"), "{e}");
    let e = weir_load::run(options(&small.uri(), "bs=4k,disk=4m", 0.2), &mut |_| {});
    // Too-large explicit disks are scaled down to fit, not refused.
    let out = e.unwrap();
    assert!(out.report.cases[0].description.contains("scaled by"));
    let mut o = options(&small.uri(), "bs=4k", 0.2);
    o.time_scale = 0.0;
    assert!(
        weir_load::run(o, &mut |_| {})
            .unwrap_err()
            .to_string()
            .contains("time scale")
    );
    let o = options(
        &format!("{},{}", small.uri(), small.uri()),
        "bs=4k,vms=2",
        0.2,
    );
    let e = weir_load::run(o, &mut |_| {}).unwrap_err().to_string();
    assert!(e.contains("listed twice"), "{e}");
    let other = TestServer::start(1 << 20, Misbehaviour::default());
    let mut o = options(
        &format!("{},{}", small.uri(), other.uri()),
        "bs=4k,vms=2",
        0.2,
    );
    o.connections = Some(1);
    assert!(
        weir_load::run(o, &mut |_| {})
            .unwrap_err()
            .to_string()
            .contains("cannot reach")
    );
}

#[test]
fn an_oltp_model_runs_in_compressed_time_and_reports_orders_per_minute() {
    let server = TestServer::start(64 << 20, Misbehaviour::default());
    let toml = r#"
[scenario]
name = "oltp-small"
window = [{ name = "early", start_s = 0, end_s = 1.5 }, { name = "never", start_s = 100, end_s = 200 }]

[[model]]
kind = "oltp"
name = "sql"
threads = 4
database_gib = 0.01
log_gib = 0.01

[[vm]]
name = "sql"
model = "sql"
count = 2
"#;
    let (_tmp, path) = write_temp("oltp.toml", toml);
    let mut o = verifying(&server.uri(), "bs=4k", 1.5, true);
    o.scenario = scenario_file(path);
    o.time_scale = 2.0;
    let out = run(o);
    assert!(out.passed(), "{:?}", out.failures());
    let opm = out.model_metrics.get("sql.opm").expect("opm metric").value;
    let orders = out.model_metrics.get("sql.orders").unwrap().value;
    println!("OLTP model, 2 VMs × 4 threads, ×2 time: {orders} orders, {opm:.0} OPM (model clock)");
    assert!(orders >= 20.0, "{orders} orders");
    // 1.5 s of wall time at ×2 is 3 model seconds: OPM = orders / 0.05 min.
    assert!(
        (opm / (orders / 0.05) - 1.0).abs() < 0.1,
        "{opm} vs {orders}"
    );
    let case = &out.report.cases[0];
    assert!(case.timeline.iter().any(|s| s.name == "sql.opm"));
    assert!(
        case.description.contains("model figures in model_metrics"),
        "{}",
        case.description
    );
    // The simulator's report fields: model metrics per [[vm]] and window, windows.
    let m = case
        .model_metrics
        .iter()
        .find(|m| m.source == "sql" && m.name == "opm" && m.window.is_empty())
        .unwrap();
    assert_eq!((m.kind.as_str(), m.value), ("oltp", opm));
    assert!(
        case.model_metrics
            .iter()
            .any(|m| m.window == "early" && m.name == "orders" && m.value > 0.0)
    );
    assert_eq!(case.windows.len(), 1, "a window after the run is left out");
    let early = &case.windows[0];
    assert_eq!(
        (early.name.as_str(), early.start_s, early.end_s),
        ("early", 0.0, 1.5)
    );
    assert_eq!(early.figures[0].name, "total");
    assert!(early.figures[0].ios > 0 && early.figures[0].ios < out.ios);
    let sizes = case.io_sizes.as_ref().unwrap();
    assert!(sizes.reads[1] > 0, "8 KiB database reads: {sizes:?}");
    assert!(
        sizes.writes.iter().sum::<u64>() > 0,
        "data and log writes: {sizes:?}"
    );
}

#[test]
fn the_zeroed_claim_is_checked_and_unknown_blocks_are_left_alone() {
    let server = TestServer::start(4 << 20, Misbehaviour::default());
    let spec = "bs=4k,randrw,qd=8,disk=1m";
    let o = verifying(&server.uri(), spec, 0.5, true);
    assert!(run(o).passed(), "first run on a fresh export");
    // The export now holds the first run's data: claiming it is zeroed is wrong, and
    // reads of blocks this run has not written yet say so.
    let mut o = verifying(
        &server.uri(),
        "bs=4k,read=90,random=100,qd=8,disk=1m",
        0.5,
        true,
    );
    o.seed = Some(2);
    let out = run(o);
    let v = out.verify.clone().unwrap();
    assert!(!out.passed());
    assert!(
        v.first_mismatches[0].contains("expected zeroes, found data"),
        "{:?}",
        v.first_mismatches
    );
    // Without the claim, never-written blocks are not judged: the run passes and still
    // checks the blocks it wrote itself.
    let mut o = verifying(
        &server.uri(),
        "bs=4k,read=90,random=100,qd=8,disk=1m",
        0.5,
        false,
    );
    o.seed = Some(3);
    let out = run(o);
    assert!(out.passed(), "{:?}", out.failures());
    assert!(out.verify.unwrap().reads_checked > 0);
}

#[test]
fn lost_writes_are_caught_by_the_final_read_back() {
    // Writes only: no read of the run can notice what the target dropped. A lost write
    // that a later write to the same block overwrites is undetectable by design, so
    // the target drops often enough that a short run on a loaded machine (a few
    // hundred writes over 256 blocks) always leaves some loss visible.
    let lossy = Misbehaviour {
        lose_every_nth_write: 7,
        ..Default::default()
    };
    let server = TestServer::start(4 << 20, lossy);
    let mut o = verifying(&server.uri(), "bs=4k,randwrite,qd=8,disk=1m", 0.5, true);
    o.final_check_bytes = 0;
    let out = run(o);
    assert!(
        out.passed(),
        "without the read-back nothing is read: {:?}",
        out.failures()
    );

    let server = TestServer::start(4 << 20, lossy);
    let out = run(verifying(
        &server.uri(),
        "bs=4k,randwrite,qd=8,disk=1m",
        0.5,
        true,
    ));
    let v = out.verify.clone().unwrap();
    println!("lost writes: {v:?}");
    assert!(!out.passed());
    assert!(
        v.final_sectors_checked > 0 && v.mismatched_sectors > 0,
        "{v:?}"
    );
    assert!(
        v.first_mismatches[0].starts_with("final read-back:"),
        "{:?}",
        v.first_mismatches
    );

    // An honest target passes the read-back, and it covers what was written.
    let server = TestServer::start(4 << 20, Misbehaviour::default());
    let out = run(verifying(
        &server.uri(),
        "bs=4k,randwrite,qd=8,disk=1m",
        0.5,
        false,
    ));
    let v = out.verify.clone().unwrap();
    assert!(out.passed(), "{:?}", out.failures());
    // 1 MiB disk, 70 % dataset: at most 1434 written sectors, most of them by now.
    assert!((500..=1434).contains(&v.final_sectors_checked), "{v:?}");
}

/// `weir serve` with `tls = "require"` for the TLS tests: `open` (any client) and
/// `only1` (only the TLS identity `client1`), 16 MiB each.
fn tls_server(
    pki: &weir_testkit::Pki,
) -> (TempDir, tokio::runtime::Runtime, weir_server::RunningServer) {
    let dir = TempDir::new("load-tls");
    let config = format!(
        r#"listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
{}
[[access_groups]]
name = "client1-only"
hosts = ["*"]
identities = ["client1"]

[[volumes]]
name = "open"
size = "16MiB"
policy = "mission-critical"

[[volumes]]
name = "only1"
size = "16MiB"
policy = "non-critical"
access_groups = ["client1-only"]
"#,
        pki.weir_config("require")
    );
    let (rt, server) = start_weir(&dir, &config);
    (dir, rt, server)
}

fn tls_files(pki: &weir_testkit::Pki, creds: &str, cert: bool) -> weir_load::TlsFiles {
    let file = |f: &str| PathBuf::from(pki.path(&format!("{creds}/{f}")));
    weir_load::TlsFiles {
        ca: file("ca-cert.pem"),
        cert_key: cert.then(|| (file("client-cert.pem"), file("client-key.pem"))),
    }
}

#[test]
fn nbds_targets_run_verified_over_tls_with_the_clients_identity() {
    let Some(pki) = weir_testkit::Pki::new() else {
        return;
    };
    let (_dir, rt, server) = tls_server(&pki);
    let addr = server.nbd_addr();
    // Data checked end to end over TLS, on two exports, the second one open only to
    // the identity in client1's certificate.
    let mut o = verifying(
        &format!("nbds://{addr}/open,nbds://{addr}/only1"),
        "bs=4k,randrw,qd=16,vms=2,disk=4m",
        1.0,
        true,
    );
    o.tls = Some(tls_files(&pki, "client1", true));
    let out = run(o);
    let v = out.verify.clone().unwrap();
    println!("over TLS: {} I/Os, {v:?}", out.ios);
    assert!(out.passed(), "{:?}", out.failures());
    assert!(v.reads_checked > 100 && v.mismatched_reads == 0, "{v:?}");

    // 1 MiB READs go out through the server's buffered copy (no sendfile over TLS),
    // four 256 KiB pieces each from a recycled buffer: checked too.
    let mut o = verifying(
        &format!("nbds://{addr}/open"),
        "bs=1m,randrw,qd=4,disk=8m",
        1.0,
        false,
    );
    o.tls = Some(tls_files(&pki, "anon", false));
    let out = run(o);
    let v = out.verify.clone().unwrap();
    assert!(out.passed(), "{:?}", out.failures());
    // A few 1 MiB reads are enough to show they are checked (a loaded CI machine
    // once managed only 10 in half a second).
    assert!(v.reads_checked >= 4 && v.mismatched_reads == 0, "{v:?}");
    // The same with libnbd's URI form: the directory's client certificate is used.
    let dir = pki.path("client1");
    let out = run(options(
        &format!("nbds://{addr}/only1?tls-certificates={dir}"),
        "bs=4k,randread,qd=8",
        0.3,
    ));
    assert!(out.passed() && out.ios > 10, "{:?}", out.failures());
    // Without a certificate the identity-only export is not there.
    let mut o = options(&format!("nbds://{addr}/only1"), "bs=4k", 0.3);
    o.tls = Some(tls_files(&pki, "anon", false));
    let e = weir_load::run(o, &mut |_| {}).unwrap_err().to_string();
    assert!(e.contains("refused NBD_OPT_GO"), "{e}");
    // Plain text to a TLS-only server: refused, saying why.
    let e = weir_load::run(
        options(&format!("nbd://{addr}/open"), "bs=4k", 0.3),
        &mut |_| {},
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("requires TLS"), "{e}");
    // A CA that did not sign the server's certificate: the handshake fails.
    let other = weir_testkit::Pki::new().unwrap();
    let mut o = options(&format!("nbds://{addr}/open"), "bs=4k", 0.3);
    o.tls = Some(tls_files(&other, "anon", false));
    let e = weir_load::run(o, &mut |_| {}).unwrap_err().to_string();
    assert!(
        e.contains("TLS handshake") && e.contains("certificate"),
        "{e}"
    );
    // nbds:// without a CA, and a CA without an nbds:// target: refused before
    // anything connects.
    let e = weir_load::run(
        options(&format!("nbds://{addr}/open"), "bs=4k", 0.3),
        &mut |_| {},
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("needs --tls-ca"), "{e}");
    let mut o = options(&format!("nbd://{addr}/open"), "bs=4k", 0.3);
    o.tls = Some(tls_files(&pki, "anon", false));
    let e = weir_load::run(o, &mut |_| {}).unwrap_err().to_string();
    assert!(e.contains("every target is nbd://"), "{e}");
    rt.block_on(server.shutdown()).unwrap();
}

/// The three application models on one target, small enough to act within a second.
const MODELS_TOML: &str = r#"
[scenario]
name = "models"

[[model]]
kind = "oltp"
name = "sql"
threads = 4
database_gib = 0.01
log_gib = 0.01

[[model]]
kind = "exchange"
name = "mail"
mailboxes = 20
mailbox_mb = 1
actions_per_hour = 36000

[[model]]
kind = "vdi"
name = "desk"
desktops = 4
image_gib = 0.05
boot_footprint_mib = 16
login = "tuesday"
login_at_s = 0
login_interval_s = 0.1
apps_per_login = 1

[[vm]]
name = "sql"
model = "sql"

[[vm]]
name = "mail"
model = "mail"

[[vm]]
name = "desk"
model = "desk"
"#;

/// The models' operations (orders, RPCs, logins) on `uri` for 1.5 s at ×2.
fn run_models(uri: &str) -> LoadOutcome {
    let (_tmp, path) = write_temp("models.toml", MODELS_TOML);
    let mut o = options(uri, "bs=4k", 1.5);
    o.scenario = scenario_file(path);
    o.time_scale = 2.0;
    run(o)
}

fn model_figure(out: &LoadOutcome, name: &str) -> f64 {
    match out.model_metrics.get(name) {
        Some(m) => m.value,
        None => panic!("no {name} in {:?}", out.model_metrics.keys()),
    }
}

/// A failed I/O fails the model operation it belongs to (session 31: with every
/// I/O failing, OLTP still counted its orders, Exchange its RPCs and VDI its
/// logins as done, from the failures' "completions").
#[test]
fn model_operations_whose_io_fails_count_as_failed_not_done() {
    if !common::nbdkit_available() {
        return;
    }
    let figures = |out: &LoadOutcome| {
        [
            "sql.orders",
            "sql.failed_orders",
            "mail.rpcs_per_s",
            "mail.failed_rpcs",
            "desk.logins",
            "desk.login_failed",
        ]
        .map(|name| model_figure(out, name))
    };
    let healthy = Nbdkit::start(&["memory", "4G"]);
    let out = run_models(&healthy.uri());
    let f = figures(&out);
    println!("healthy: {f:?}");
    assert!(out.passed(), "{:?}", out.failures());
    assert!(f[0] > 0.0 && f[2] > 0.0 && f[4] > 0.0, "{f:?}");
    assert_eq!((f[1], f[3], f[5]), (0.0, 0.0, 0.0));
    let failing = Nbdkit::start(&["--filter=error", "memory", "4G", "error-rate=100%"]);
    let out = run_models(&failing.uri());
    let f = figures(&out);
    println!("every I/O failing: {} errors, {f:?}", out.io_errors);
    assert!(out.io_errors > 0 && out.ios == 0);
    assert_eq!((f[0], f[2], f[4]), (0.0, 0.0, 0.0), "nothing done");
    assert!(
        f[1] > 0.0 && f[3] > 0.0 && f[5] > 0.0,
        "failures counted: {f:?}"
    );
    assert_eq!(model_figure(&out, "sql.opm"), 0.0);
    assert_eq!(model_figure(&out, "mail.rpc_pass"), 0.0);
    assert!(model_figure(&out, "desk.failed_ios") > 0.0);
}

/// The driver's bytes in flight stay under `max_bytes_in_flight`: past it requests
/// wait for room and the report says so (session 31: nothing bounded them, and
/// `bs=64m,randwrite,qd=256` took `weir load` to several GB of write payloads).
#[test]
fn bytes_in_flight_stay_under_their_cap() {
    if !common::nbdkit_available() {
        return;
    }
    let k = Nbdkit::start(&["memory", "1G"]);
    let mut o = options(&k.uri(), "bs=4m,randwrite,qd=64", 1.0);
    o.max_bytes_in_flight = 32 << 20;
    let out = run(o);
    println!(
        "cap 32 MiB: {} I/Os, peak {} bytes, {} held",
        out.ios, out.peak_bytes_in_flight, out.held_for_byte_cap
    );
    assert!(out.passed(), "{:?}", out.failures());
    assert!(out.ios > 8 && out.held_for_byte_cap > 0);
    assert_eq!(
        out.peak_bytes_in_flight,
        32 << 20,
        "filled to the cap, no more"
    );
    let description = &out.report.cases[0].description;
    assert!(
        description.contains("waited for the cap of 33554432 bytes"),
        "{description}"
    );
    // A request larger than the cap goes alone.
    let mut o = options(&k.uri(), "bs=4m,randwrite,qd=4", 0.5);
    o.max_bytes_in_flight = 1 << 20;
    let out = run(o);
    assert!(out.passed() && out.ios > 0, "{:?}", out.failures());
    assert_eq!(out.peak_bytes_in_flight, 4 << 20);
    // Under the cap nothing waits.
    let out = run(options(&k.uri(), "bs=4m,randwrite,qd=4", 0.5));
    assert_eq!(
        (out.peak_bytes_in_flight, out.held_for_byte_cap),
        (16 << 20, 0)
    );
    assert!(
        !out.report.cases[0]
            .description
            .contains("waited for the cap")
    );
}
