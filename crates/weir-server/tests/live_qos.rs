//! Live QoS acceptance over real NBD (issue 3): a server on loopback, loads from
//! Weir's own pipelined NBD client. Assertions are on counts over windows and on
//! ratios, never on wall-clock speed, so they hold on a loaded 2-core machine.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{HIGH_AND_NORMAL_SHARES, ReadLoad, Sample, volume_toml};

/// Keeps `queue_depth` random reads of `size_bytes` in flight on `volume` for
/// `duration`; returns every completion.
async fn drive(
    addr: SocketAddr,
    volume: &str,
    queue_depth: usize,
    size_bytes: u32,
    span_bytes: u64,
    duration: Duration,
    seed: u64,
) -> Vec<Sample> {
    ReadLoad {
        volume,
        from: None,
        queue_depth,
        size_bytes,
        span_bytes,
        seed,
    }
    .run_for(addr, duration)
    .await
}

/// Completions in each whole 1-second window from `start`.
fn per_second(samples: &[Sample], start: Instant, seconds: u32) -> Vec<usize> {
    let mut counts = vec![0usize; seconds as usize];
    for s in samples {
        let i = (s.done_at - start).as_secs() as usize;
        if i < counts.len() {
            counts[i] += 1;
        }
    }
    counts
}

fn mean(samples: &[Sample]) -> Duration {
    samples.iter().map(|s| s.latency).sum::<Duration>() / samples.len().max(1) as u32
}

fn percentile(samples: &[Sample], p: f64) -> Duration {
    let mut l: Vec<Duration> = samples.iter().map(|s| s.latency).collect();
    l.sort();
    l.get(((l.len() as f64 - 1.0) * p).round() as usize)
        .copied()
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_limited_to_1000_iops_stays_under_1020_in_every_second() {
    let _alone = common::timed_alone().await;
    let (_dir, server) = common::start_with(
        "liveqos",
        r#"
[[policies]]
name = "capped"
limit_iops = 1000
[[volumes]]
name = "capped"
size = "64MiB"
policy = "capped"
"#,
    )
    .await;
    let seconds = 3;
    let start = Instant::now();
    let samples = drive(
        server.nbd_addr(),
        "capped",
        32,
        4096,
        64 << 20,
        Duration::from_secs(seconds as u64) + Duration::from_millis(200),
        7,
    )
    .await;
    let counts = per_second(&samples, start, seconds);
    println!("limit 1000 IOPS, QD32 4 KiB reads: completions per second {counts:?}");
    for (i, &n) in counts.iter().enumerate() {
        assert!(n <= 1020, "second {i}: {n} IOPS over a 1000 IOPS limit");
        // The load saturates the limit (4 KiB page-cache reads cost microseconds).
        assert!(
            n >= 700,
            "second {i}: only {n} IOPS: the limit throttles too hard"
        );
    }
    server.shutdown().await.unwrap();
}

/// An emulated 24 × 15K SAS RAID 5 pool: the device, not the CPU, is the bottleneck.
const ARRAY_POOL: &str = r#"
[[pools]]
name = "array"
device = "15k-sas-raid5x24"
max_in_flight = 16
"#;

/// Runs a QD4 8 KiB random-read load on `sql` beside a QD64 flood on `desktops`
/// (both on the emulated array) and returns the critical load's mean latency.
async fn critical_beside_flood(
    sql_policy: &str,
    desktops_policy: &str,
    policies: &str,
) -> Duration {
    let config = [
        ARRAY_POOL,
        policies,
        &volume_toml("sql", "16GiB", sql_policy, "array"),
        &volume_toml("desktops", "16GiB", desktops_policy, "array"),
    ]
    .concat();
    let (_dir, server) = common::start_with("liveqos", &config).await;
    let addr = server.nbd_addr();
    let run = Duration::from_secs(3);
    // Alone first: what the mission-critical load costs on an idle array.
    let alone = drive(addr, "sql", 4, 8192, 16 << 30, Duration::from_secs(1), 3).await;
    let flood = tokio::spawn(async move {
        drive(
            addr,
            "desktops",
            64,
            8192,
            16 << 30,
            run + Duration::from_secs(1),
            5,
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let critical = drive(addr, "sql", 4, 8192, 16 << 30, run, 11).await;
    let flooded = flood.await.unwrap();
    let flood_mean = mean(&flooded);
    println!(
        "{sql_policy} QD4 8 KiB reads: alone mean {:?}; beside a QD64 {desktops_policy} flood \
         mean {:?}, p95 {:?} ({} I/Os); flood mean {flood_mean:?} ({} I/Os)",
        mean(&alone),
        mean(&critical),
        percentile(&critical, 0.95),
        critical.len(),
        flooded.len()
    );
    // The flood really loaded the array: its own requests queue far longer.
    assert!(
        flood_mean > mean(&critical) * 3 / 2,
        "flood mean {flood_mean:?} vs critical {:?}: the pool was not flooded",
        mean(&critical)
    );
    server.shutdown().await.unwrap();
    mean(&critical)
}

/// Service levels and latency targets as in the built-ins, without reservations
/// (a 24-disk array cannot honour the built-ins' 75,000 + 7,500 IOPS reservations).
const LAB_POLICIES: &str = r#"
[[policies]]
name = "mc-lab"
service_level = "mission-critical"
latency_target_ms = 10
[[policies]]
name = "nc-lab"
service_level = "non-critical"
latency_target_ms = 100
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mission_critical_keeps_its_latency_target_while_non_critical_floods() {
    let _alone = common::timed_alone().await;
    let critical = critical_beside_flood("mc-lab", "nc-lab", LAB_POLICIES).await;
    assert!(
        critical <= Duration::from_millis(10),
        "mission-critical mean latency {critical:?} over its 10 ms target"
    );
}

/// The same with the built-in policies, whose reservations exceed what the array
/// can do: the non-critical volume's unmet 7,500 IOPS reservation must not outrank
/// the mission-critical volume's latency target (weir-qos suspends a lower level's
/// reservation while a higher level is at risk).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn builtin_mission_critical_keeps_its_latency_target_while_non_critical_floods() {
    let _alone = common::timed_alone().await;
    let critical = critical_beside_flood("mission-critical", "non-critical", "").await;
    assert!(
        critical <= Duration::from_millis(10),
        "mission-critical mean latency {critical:?} over its 10 ms target"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shares_2_to_1_split_a_saturated_pool_2_to_1() {
    let _alone = common::timed_alone().await;
    let config = [
        ARRAY_POOL,
        HIGH_AND_NORMAL_SHARES,
        &volume_toml("a", "256MiB", "high", "array"),
        &volume_toml("b", "256MiB", "normal", "array"),
    ]
    .concat();
    let (_dir, server) = common::start_with("liveqos", &config).await;
    let addr = server.nbd_addr();
    let run = Duration::from_secs(3);
    let a = tokio::spawn(async move { drive(addr, "a", 32, 8192, 256 << 20, run, 1).await });
    let b = tokio::spawn(async move { drive(addr, "b", 32, 8192, 256 << 20, run, 2).await });
    let (a, b) = (a.await.unwrap(), b.await.unwrap());
    // Count over the middle of the run, when both volumes are saturating.
    let from = a[0].done_at.min(b[0].done_at) + Duration::from_millis(500);
    let to = from + Duration::from_secs(2);
    let count = |s: &[Sample]| {
        s.iter()
            .filter(|x| x.done_at >= from && x.done_at < to)
            .count()
    };
    let (na, nb) = (count(&a), count(&b));
    let ratio = na as f64 / nb.max(1) as f64;
    println!(
        "shares 2000:1000 on an emulated 15K RAID 5: {na} vs {nb} I/Os in 2 s, ratio {ratio:.2}"
    );
    assert!(nb > 100, "too few I/Os to judge ({na} vs {nb})");
    assert!(
        (1.8..=2.2).contains(&ratio),
        "split {na}:{nb} = {ratio:.2}, expected 2 ± 10%"
    );
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_with_qos_off_ignores_limits() {
    let _alone = common::timed_alone().await;
    let pools_and_policy = r#"
[[pools]]
name = "raw"
qos = false
[[pools]]
name = "governed"
[[policies]]
name = "capped"
limit_iops = 100
"#;
    let config = [
        pools_and_policy,
        &volume_toml("raw", "4MiB", "capped", "raw"),
        &volume_toml("governed", "4MiB", "capped", "governed"),
    ]
    .concat();
    let (_dir, server) = common::start_with("liveqos", &config).await;
    let run = Duration::from_millis(600);
    let raw = drive(server.nbd_addr(), "raw", 8, 4096, 4 << 20, run, 1).await;
    let governed = drive(server.nbd_addr(), "governed", 8, 4096, 4 << 20, run, 1).await;
    println!(
        "100 IOPS policy for 0.6 s: qos = false {} I/Os, qos on {} I/Os",
        raw.len(),
        governed.len()
    );
    assert!(governed.len() <= 100, "{}", governed.len());
    assert!(
        raw.len() > 300,
        "qos = false still throttled: {}",
        raw.len()
    );
    server.shutdown().await.unwrap();
}

/// A client that sends WRITEs faster than its volume may run them (a 16 IOPS
/// limit; a 32 MiB write costs hundreds of I/Os) without reading replies: the
/// server stops reading once 128 MiB of payload is buffered for the connection,
/// so the client's sends stall instead of the server's memory growing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_connection_buffers_at_most_128_mib_of_payload() {
    let _alone = common::timed_alone().await;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    let (_dir, server) = common::start_with(
        "liveqos",
        r#"
[[policies]]
name = "trickle"
limit_iops = 16
[[volumes]]
name = "trickle"
size = "64MiB"
policy = "trickle"
"#,
    )
    .await;
    let (mut c, _) = common::connect(&server, "trickle").await;
    let payload = vec![0x5au8; 32 << 20];
    let sent = Arc::new(AtomicU64::new(0));
    let counter = sent.clone();
    let writer = tokio::spawn(async move {
        loop {
            c.session().write(0, &payload, false);
            if c.send().await.is_err() {
                break;
            }
            counter.fetch_add(payload.len() as u64, Ordering::SeqCst);
        }
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stalled_at = sent.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let later = sent.load(Ordering::SeqCst);
    writer.abort();
    println!(
        "client sends stalled at {} MiB ({} MiB half a second later)",
        stalled_at >> 20,
        later >> 20
    );
    // 128 MiB buffered + the request being read + socket buffers on both sides.
    assert!(later <= (128 + 32 + 64) << 20, "sent {} MiB", later >> 20);
    assert!(
        stalled_at >= 96 << 20,
        "server stopped reading early: {} MiB",
        stalled_at >> 20
    );
    assert_eq!(stalled_at, later, "sends kept flowing");
    server.shutdown().await.unwrap();
}
