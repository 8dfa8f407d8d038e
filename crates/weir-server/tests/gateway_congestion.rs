//! Several gateways on one shared datastore (issue 13 item 3, the live version of
//! `sioc-shares`' two-host case): three `weir serve` gateways with upstream pools in
//! front of one storage server whose emulated 24 × 15K SAS RAID 5 array is the
//! bottleneck they share (the same topology as gateways on one Ceph pool; the RBD
//! run is `bench/gateways.sh`). Gateway A floods a volume of High shares (2000),
//! gateway B one of Normal (1000), gateway C runs a light QD4 database with a 10 ms
//! latency target. No gateway sees another: each one's window follows the device
//! latency on the array, shared through a small volume on it (`sioc`, as SIOC shares
//! it through a file on the datastore: `weir_server::datastore_stats`). A third
//! gateway does not change A's and B's ratio: at a common latency each window is
//! `β·lat / (lat − L)`, its own shares only.
//!
//! - control off: each gateway keeps its fixed `max_in_flight` at the array, so the
//!   floods split it by queue depth, ≈ 1:1 whatever the shares;
//! - control on: the windows settle in proportion to the aggregate shares, so the
//!   split approaches 2:1, and the light tenant's latency drops with the queue.
//!
//! Both floods read one 16 GiB export of the array (`fleet`, through gateway
//! volumes `fleet-a` and `fleet-b`): on separate volumes, each at its own region of
//! the drives, the emulated disks' seek-ordered queues favour the denser region, so
//! the gateway with the larger window also sees the lower latency and gets more than
//! its window's part (measured: windows 25:13, I/Os 2.64:1). PARDA divides windows,
//! not I/Os; one region isolates the control from that device effect (Ceph spreads
//! every image over all OSDs: `bench/gateways.sh`, docs/QOS.md).
//!
//! Assertions are on ratios of counts, never on speed.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{HIGH_AND_NORMAL_SHARES, ReadLoad, Sample, volume_toml};
use weir_server::RunningServer;

const WARM_UP: Duration = Duration::from_secs(4);
const MEASURE: Duration = Duration::from_secs(8);
/// Each flood's queue depth: deep enough that, without control, the array's queue
/// (2 × 128 + the database's 4) is well beyond where the windows hold it (≈ 100), so
/// the light tenant's gain stands above a loaded machine's CPU noise.
const FLOOD_QD: usize = 128;

/// The storage both gateways share: its own gate off (it is the "array").
fn storage_config() -> String {
    let pool = r#"
[[pools]]
name = "array"
device = "15k-sas-raid5x24"
max_in_flight = 256
qos = false
"#;
    [
        pool,
        &volume_toml("fleet", "16GiB", "non-critical", "array"),
        &volume_toml("db", "16GiB", "non-critical", "array"),
        &volume_toml("sioc", "64KiB", "non-critical", "array"),
    ]
    .concat()
}

/// A gateway: one upstream pool on the storage server, its window on (or off), the
/// shared latency through the storage's `sioc` volume in slot `id`.
fn gateway_config(storage: SocketAddr, control: bool, id: u32, volumes: &[(&str, &str)]) -> String {
    let mut toml = format!(
        r#"
[[pools]]
name = "gw"
upstream = "nbd://{storage}"
upstream_connections = 8
max_in_flight = 128
gateway_congestion = {{ enabled = {control}, threshold_ms = 5, period_ms = 100, gamma = 0.5, beta_per_1000_shares = 2 }}
"#
    );
    if control {
        toml.push_str(&format!(
            "gateway_stats_volume = \"sioc\"\ngateway_id = {id}\n"
        ));
    }
    toml.push_str(
        r#"
[[policies]]
name = "db"
shares = 1000
latency_target_ms = 10
"#,
    );
    toml.push_str(HIGH_AND_NORMAL_SHARES);
    for (volume, policy) in volumes.iter().chain([&("sioc", "non-critical")]) {
        toml.push_str(&volume_toml(volume, "16GiB", policy, "gw"));
        if volume.starts_with("fleet") {
            toml.push_str("export = \"fleet\"\n");
        }
    }
    // Upstream volumes take their size from the export.
    toml.replace("size = \"16GiB\"\n", "")
}

struct Run {
    a: Vec<Sample>,
    b: Vec<Sample>,
    db: Vec<Sample>,
    windows: (Option<u32>, Option<u32>, Option<u32>),
}

fn load(volume: &str, queue_depth: usize, seed: u64) -> ReadLoad<'_> {
    ReadLoad {
        volume,
        from: None,
        queue_depth,
        size_bytes: 8192,
        span_bytes: 16 << 30,
        seed,
    }
}

async fn run(control: bool) -> Run {
    let (_sd, storage) = common::start_with("gwcc-storage", &storage_config()).await;
    let s = storage.nbd_addr();
    let (_ad, gw_a) = common::start_with(
        "gwcc-a",
        &gateway_config(s, control, 0, &[("fleet-a", "high")]),
    )
    .await;
    let (_bd, gw_b) = common::start_with(
        "gwcc-b",
        &gateway_config(s, control, 1, &[("fleet-b", "normal")]),
    )
    .await;
    let (_cd, gw_c) =
        common::start_with("gwcc-c", &gateway_config(s, control, 2, &[("db", "db")])).await;
    let (a, b, c) = (gw_a.nbd_addr(), gw_b.nbd_addr(), gw_c.nbd_addr());
    let start = Instant::now() + WARM_UP;
    let end = start + MEASURE;
    let fa = tokio::spawn(async move { load("fleet-a", FLOOD_QD, 3).run_until(a, end).await });
    let fb = tokio::spawn(async move { load("fleet-b", FLOOD_QD, 5).run_until(b, end).await });
    tokio::time::sleep_until(start.into()).await;
    let db = tokio::spawn(async move { load("db", 4, 7).run_until(c, end).await });
    // The windows mid-run (at the end they grow back as the loads stop).
    tokio::time::sleep(MEASURE / 2).await;
    let window = |gw: &RunningServer| gw.state().pool_reports()[0].gauges.gateway_window;
    let windows = (window(&gw_a), window(&gw_b), window(&gw_c));
    let db = db.await.unwrap();
    let keep = |v: Vec<Sample>| -> Vec<Sample> {
        v.into_iter()
            .filter(|s| s.done_at >= start && s.done_at <= end)
            .collect()
    };
    let run = Run {
        a: keep(fa.await.unwrap()),
        b: keep(fb.await.unwrap()),
        db: keep(db),
        windows,
    };
    for server in [gw_a, gw_b, gw_c, storage] {
        server.shutdown().await.unwrap();
    }
    run
}

fn mean_ms(samples: &[Sample]) -> f64 {
    let sum: Duration = samples.iter().map(|s| s.latency).sum();
    sum.as_secs_f64() * 1e3 / samples.len().max(1) as f64
}

fn p99_ms(samples: &[Sample]) -> f64 {
    let mut l: Vec<Duration> = samples.iter().map(|s| s.latency).collect();
    l.sort();
    let i = ((l.len() as f64 - 1.0) * 0.99).round() as usize;
    l.get(i).map_or(0.0, |d| d.as_secs_f64() * 1e3)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_split_a_shared_array_by_aggregate_shares_only_with_control() {
    let mut results = Vec::new();
    for control in [false, true] {
        let r = run(control).await;
        let split = r.a.len() as f64 / r.b.len().max(1) as f64;
        let secs = MEASURE.as_secs_f64();
        println!(
            "control {}: gateway A (high) {:.0} IOPS, B (normal) {:.0} IOPS, split {split:.2}; \
             db (QD4, C) mean {:.1} ms p99 {:.1} ms over {} I/Os; windows {:?}",
            if control { "on " } else { "off" },
            r.a.len() as f64 / secs,
            r.b.len() as f64 / secs,
            mean_ms(&r.db),
            p99_ms(&r.db),
            r.db.len(),
            r.windows,
        );
        assert!(r.a.len() > 500 && r.b.len() > 200, "both floods ran");
        results.push((split, mean_ms(&r.db), r.windows));
    }
    let (off, on) = (results[0], results[1]);
    assert_eq!(off.2, (None, None, None), "control off: no gateway window");
    let (wa, wb) = (on.2.0.unwrap(), on.2.1.unwrap());
    assert!(wa > wb, "control on: A's window {wa} over B's {wb}");
    assert!(
        (0.8..1.25).contains(&off.0),
        "control off: split {:.2}, expected about 1:1",
        off.0
    );
    assert!(
        (1.6..2.4).contains(&on.0),
        "control on: split {:.2}, expected about 2:1",
        on.0
    );
    assert!(
        on.1 < off.1,
        "the light tenant's latency: {:.1} ms with control, {:.1} ms without",
        on.1,
        off.1
    );
}
