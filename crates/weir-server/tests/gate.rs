//! The QoS gate in the live server (issue 10): every NBD command pays for what it
//! moves, large requests are paced in pieces next to small ones from another
//! host, a request performed in pieces reads and writes exactly its bytes, and a
//! volume that service-level protection holds back still completes requests.
//! Rates are read from the gate's own per-volume counters (cost units and bytes
//! released to the backend, sampled every 100 ms) and checked against the client's
//! completions; bounds are on counts over windows, never on wall-clock speed.

mod common;

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use common::ReadLoad;
use weir_nbd::ClientConfig;
use weir_qos::{VolumeId, VolumeStats};
use weir_server::RunningServer;
use weir_server::nbd_client::NbdClient;

/// The gate's counters of `volume` now.
fn stats(server: &RunningServer, volume: &str) -> VolumeStats {
    let state = server.state();
    let r = state.store().get(volume).unwrap();
    state
        .pool(&r.pool)
        .unwrap()
        .volume_stats(VolumeId(r.id))
        .unwrap()
}

/// `(when, gate counters)` of each volume every 100 ms for `duration`.
async fn sample(
    server: &RunningServer,
    volumes: &[&str],
    duration: Duration,
) -> Vec<Vec<(Instant, VolumeStats)>> {
    let end = Instant::now() + duration;
    let mut out = vec![Vec::new(); volumes.len()];
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    while Instant::now() < end {
        tick.tick().await;
        let now = Instant::now();
        for (i, v) in volumes.iter().enumerate() {
            out[i].push((now, stats(server, v)));
        }
    }
    out
}

/// The largest `field` increase over any window of 10 samples (≈ 1 s), as
/// `(increase, window seconds)`, and the increase over the whole run.
fn worst_second(
    samples: &[(Instant, VolumeStats)],
    field: fn(&VolumeStats) -> u64,
) -> ((u64, f64), u64) {
    let mut worst = (0u64, 1.0f64);
    for w in samples.windows(11) {
        let (a, b) = (&w[0], &w[10]);
        let d = field(&b.1) - field(&a.1);
        let secs = (b.0 - a.0).as_secs_f64();
        if d as f64 / secs > worst.0 as f64 / worst.1 {
            worst = (d, secs);
        }
    }
    let total = field(&samples.last().unwrap().1) - field(&samples[0].1);
    (worst, total)
}

#[derive(Clone, Copy, Debug)]
enum Op {
    WriteZeroes,
    Trim,
    Flush,
    Cache,
}

/// Keeps `depth` 1 MiB `op`s (FLUSH: flushes) in flight on `volume` until `end`;
/// returns when each completed. Requests still queued at `end` are left to the
/// server (the connection closes).
async fn flood(addr: SocketAddr, volume: &str, op: Op, depth: usize, end: Instant) -> Vec<Instant> {
    let (mut c, _) = NbdClient::connect(addr, ClientConfig::go(volume))
        .await
        .unwrap();
    let mut done = Vec::new();
    let mut in_flight = 0;
    let mut i = 0u64;
    while Instant::now() < end {
        while in_flight < depth {
            let offset = (i * 7 % 64) << 20;
            i += 1;
            let s = c.session();
            match op {
                Op::WriteZeroes => s.write_zeroes(offset, 1 << 20, false),
                Op::Trim => s.trim(offset, 1 << 20),
                Op::Flush => s.flush(),
                Op::Cache => s.cache(offset, 1 << 20),
            };
            in_flight += 1;
        }
        let next = tokio::time::timeout_at(end.into(), c.next_completion()).await;
        let Ok(completion) = next else { break };
        let completion = completion.unwrap();
        assert!(completion.result.is_ok(), "{op:?}: {:?}", completion.result);
        in_flight -= 1;
        done.push(Instant::now());
    }
    done
}

const CAPPED_1000: &str = r#"
[[policies]]
name = "capped"
limit_iops = 1000
"#;

const CAPPED_10_MBPS: &str = r#"
[[policies]]
name = "capped"
limit_mbps = 10
"#;

/// A volume limit as the gate's counters measure it.
#[derive(Clone, Copy)]
struct Limit {
    /// The `capped` policy.
    policy: &'static str,
    /// Units of the figure (for messages).
    unit: &'static str,
    /// The limit, per second.
    per_second: f64,
    /// The gate's counter of what it charged against the limit.
    charged: fn(&VolumeStats) -> u64,
    /// What one request of `op` costs against the limit (docs/QOS.md).
    cost: fn(Op) -> u64,
}

const IOPS_1000: Limit = Limit {
    policy: CAPPED_1000,
    unit: "units",
    per_second: 1000.0,
    charged: |s| s.dispatched_units,
    cost: |op| if matches!(op, Op::Flush) { 1 } else { 256 },
};

/// A MB/s limit charges FLUSH one cost unit's bytes (4 KiB), the others their
/// length (factors 1).
const MBPS_10: Limit = Limit {
    policy: CAPPED_10_MBPS,
    unit: "bytes",
    per_second: 10e6,
    charged: |s| s.dispatched_charged_bytes,
    cost: |op| {
        if matches!(op, Op::Flush) {
            4096
        } else {
            1 << 20
        }
    },
};

/// Floods one volume per command (TRIM, WRITE_ZEROES and CACHE of 1 MiB at QD4,
/// FLUSH at QD16) for 3 s under `limit` and checks the worst second the gate
/// released, that the flood reached the limit, and what the client completed.
async fn every_command_stays_under(limit: Limit, tag: &str) {
    let ops = [
        ("zeroes", Op::WriteZeroes),
        ("trim", Op::Trim),
        ("flush", Op::Flush),
        ("cache", Op::Cache),
    ];
    let mut config = limit.policy.to_string();
    for (name, _) in ops {
        config += &common::volume_toml(name, "64MiB", "capped", "default");
    }
    let (_dir, server) = common::start_with(tag, &config).await;
    let addr = server.nbd_addr();
    let run = Duration::from_secs(3);
    let start = Instant::now();
    let end = start + run;
    let depth = |op: Op| if matches!(op, Op::Flush) { 16 } else { 4 };
    let floods: Vec<_> = ops
        .iter()
        .map(|&(name, op)| tokio::spawn(async move { flood(addr, name, op, depth(op), end).await }))
        .collect();
    let names: Vec<&str> = ops.iter().map(|(n, _)| *n).collect();
    let samples = sample(&server, &names, run).await;
    let (l, unit) = (limit.per_second, limit.unit);
    for ((name, op), (flood, samples)) in ops.iter().zip(floods.into_iter().zip(&samples)) {
        let completions = flood.await.unwrap();
        let ((worst, secs), total) = worst_second(samples, limit.charged);
        let measured = (samples.last().unwrap().0 - samples[0].0).as_secs_f64();
        let cost = (limit.cost)(*op);
        let client = completions.len() as u64 * cost;
        println!(
            "{name}: worst window {worst} {unit} in {secs:.3} s ({:.3}x of the limit), \
             {:.3}x over {measured:.1} s; client completed {} requests = {client} {unit} in \
             {:.1} s ({:.3}x)",
            worst as f64 / secs / l,
            total as f64 / measured / l,
            completions.len(),
            run.as_secs_f64(),
            client as f64 / run.as_secs_f64() / l,
        );
        // The limit, 2 % for timer jitter, plus the 10 ms limit slack and one
        // piece (5 ms of the limit).
        let bound = l * (secs * 1.02 + 0.015);
        assert!(
            worst as f64 <= bound,
            "{name}: {worst} {unit} in {secs:.3} s over a limit of {l} (bound {bound:.0})"
        );
        // FLUSH floods reach the limit only as fast as the disk syncs: on a loaded
        // machine (CI beside other jobs) 2,441 fsyncs/s are not always there.
        let reach = if matches!(op, Op::Flush) { 0.6 } else { 0.8 };
        assert!(
            total as f64 >= reach * l * measured,
            "{name}: only {total} {unit} in {measured:.1} s: the flood did not reach the limit"
        );
        // The client's view: what completed cost at most the limit over the run,
        // plus the requests already paid for when it started.
        let client_bound =
            l * (run.as_secs_f64() * 1.02 + 0.015) + (depth(*op) as u64 * cost) as f64;
        assert!(
            client as f64 <= client_bound,
            "{name}: the client completed {client} {unit} in {run:?}"
        );
    }
    server.shutdown().await.unwrap();
}

/// TRIM, WRITE_ZEROES and CACHE of 1 MiB cost 256 units each and FLUSH one: a
/// flood of any of them stays under a 1,000 IOPS limit in every second, as
/// released by the gate and as completed at the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_stays_under_a_1000_iops_limit() {
    let _alone = common::timed_alone().await;
    every_command_stays_under(IOPS_1000, "gate-ops").await;
}

/// The same under a MB/s-only limit of 10 MB/s: TRIM, WRITE_ZEROES and CACHE pay
/// their 1 MiB, FLUSH (which moves no data) 4 KiB, so a flush flood passes at
/// most ≈ 2,441 flushes a second instead of any number (one of issue 10's
/// reported bypasses).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_stays_under_a_10_mbps_limit() {
    let _alone = common::timed_alone().await;
    every_command_stays_under(MBPS_10, "gate-ops-mbps").await;
}

/// A 32 MiB READ from one host beside a QD1 4 KiB reader from another, on one
/// volume limited to 1,000 IOPS: the large read leaves as 20 KiB pieces paced by
/// the limit, so the backend never reads more than the limit plus a piece in a
/// second, and the small reader keeps a fair part of the limit (it would wait
/// behind 32 MiB, 8 s of the limit, if the read left whole).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_32_mib_read_is_paced_and_a_small_reader_on_another_host_keeps_its_share() {
    let _alone = common::timed_alone().await;
    let config = [
        CAPPED_1000,
        &common::volume_toml("shared", "64MiB", "capped", "default"),
    ]
    .concat();
    let (_dir, server) = common::start_with("gate-pieces", &config).await;
    let addr = server.nbd_addr();
    let big = tokio::spawn(async move {
        let from: IpAddr = "127.0.0.1".parse().unwrap();
        let (mut c, _) = NbdClient::connect_from(Some(from), addr, ClientConfig::go("shared"))
            .await
            .unwrap();
        c.read(0, 32 << 20).await.unwrap().unwrap().len()
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let run = Duration::from_secs(3);
    let small = tokio::spawn(async move {
        ReadLoad {
            volume: "shared",
            from: Some("127.0.0.2".parse().unwrap()),
            queue_depth: 1,
            size_bytes: 4096,
            span_bytes: 64 << 20,
            seed: 9,
        }
        .run_for(addr, run)
        .await
    });
    let samples = sample(&server, &["shared"], run).await.remove(0);
    let small = small.await.unwrap();
    let ((worst_bytes, secs), total_bytes) = worst_second(&samples, |s| s.dispatched_bytes);
    let ((worst_units, usecs), total_units) = worst_second(&samples, |s| s.dispatched_units);
    let measured = (samples.last().unwrap().0 - samples[0].0).as_secs_f64();
    let small_iops = small.len() as f64 / run.as_secs_f64();
    println!(
        "32 MiB read beside a QD1 4 KiB reader under 1,000 IOPS: backend worst window \
         {worst_bytes} bytes in {secs:.3} s ({:.0} B/s; limit 4,096,000 B/s), {worst_units} \
         units in {usecs:.3} s; {:.0} units/s and {:.0} B/s over {measured:.1} s; small \
         reader {} reads = {small_iops:.0} IOPS, so the large read got {:.0} units/s",
        worst_bytes as f64 / secs,
        total_units as f64 / measured,
        total_bytes as f64 / measured,
        small.len(),
        (total_units as f64 - small.len() as f64) / measured,
    );
    assert!(!big.is_finished(), "the 32 MiB read was not paced");
    let piece = 20480.0;
    let bound = 4_096_000.0 * secs * 1.02 + piece;
    assert!(
        worst_bytes as f64 <= bound,
        "{worst_bytes} bytes read in {secs:.3} s under a 4,096,000 B/s limit (bound {bound:.0})"
    );
    assert!(
        total_units as f64 >= 800.0 * measured,
        "only {total_units} units in {measured:.1} s: the limit was not used"
    );
    assert!(
        small_iops >= 400.0,
        "the small reader got {small_iops:.0} IOPS, under 40 % of the 1,000 IOPS limit"
    );
    big.abort();
    server.shutdown().await.unwrap();
}

/// Deterministic bytes for `len` at `seed`.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A READ, WRITE (FUA) and WRITE_ZEROES paced in pieces move exactly their bytes:
/// data written whole reads back right in pieces, data written in pieces reads
/// back right whole, at an offset and length that are not piece-aligned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_in_pieces_read_and_write_exactly_their_bytes() {
    let _alone = common::timed_alone().await;
    let config = r#"
[[policies]]
name = "paced"
limit_iops = 5000
[[policies]]
name = "free"
[[volumes]]
name = "v"
size = "8MiB"
policy = "free"
"#;
    let (_dir, server) = common::start_with("gate-verify", config).await;
    let state = server.state().clone();
    let (mut c, _) = common::connect(&server, "v").await;
    let (offset, len) = (4096 + 512, (1 << 20) + 12 * 1024 + 512);
    let pieces = |before: &VolumeStats| stats(&server, "v").dispatched_ios - before.dispatched_ios;

    // Written whole, read in pieces (100 KiB pieces under 5,000 IOPS).
    let a = pattern(len, 1);
    c.write(offset, &a, false).await.unwrap().unwrap();
    state.set_volume_policy("v", "paced").unwrap();
    let before = stats(&server, "v");
    let read = c.read(offset, len as u32).await.unwrap().unwrap();
    let n = pieces(&before);
    assert!(n >= 10, "the read left in {n} pieces");
    assert!(read == a, "a read in {n} pieces returned other bytes");

    // Written in pieces (FUA), read whole.
    let b = pattern(len, 2);
    let before = stats(&server, "v");
    c.write(offset, &b, true).await.unwrap().unwrap();
    let n = pieces(&before);
    assert!(n >= 10, "the write left in {n} pieces");
    state.set_volume_policy("v", "free").unwrap();
    let before = stats(&server, "v");
    let read = c.read(offset, len as u32).await.unwrap().unwrap();
    assert_eq!(pieces(&before), 1, "an unlimited read left in pieces");
    assert!(read == b, "a write in {n} pieces wrote other bytes");

    // Zeroed in pieces; the bytes around the range stay.
    state.set_volume_policy("v", "paced").unwrap();
    let before = stats(&server, "v");
    let h = c
        .session()
        .write_zeroes(offset + 4096, (len - 8192) as u32, false);
    c.wait(h).await.unwrap().unwrap();
    let n = pieces(&before);
    assert!(n >= 10, "the write-zeroes left in {n} pieces");
    state.set_volume_policy("v", "free").unwrap();
    let read = c.read(offset, len as u32).await.unwrap().unwrap();
    assert!(read[..4096] == b[..4096] && read[len - 4096..] == b[len - 4096..]);
    assert!(
        read[4096..len - 4096].iter().all(|&x| x == 0),
        "WRITE_ZEROES in {n} pieces left data"
    );
    println!("read, FUA write and write-zeroes of {len} bytes verified in ≥ 10 pieces each");
    c.disconnect().await.unwrap();
    server.shutdown().await.unwrap();
}

/// Service-level protection holds a non-critical volume back while a mission-critical
/// one is at risk, but never starves it (1/16 of the cost released): on the emulated array a
/// mission-critical reader at QD128 (more than the pool's 64 slots: it keeps a queue
/// and stays at risk) beside a non-critical one at QD32. Before the floor the
/// non-critical reader completed nothing while the other ran (37 releases in 22 s
/// live; docs/QOS.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_back_volume_beside_an_at_risk_one_still_completes() {
    use common::emulated::{pool, run, volumes};
    let config = pool(true) + &volumes(&[("mc", "mission-critical"), ("nc", "non-critical")]);
    let (_d, server) = common::start_with("held-back", &config).await;
    let measure = Duration::from_secs(3);
    let r = run(server.nbd_addr(), &[("mc", 128), ("nc", 32)], measure).await;
    let (mc, nc) = (r[0].len(), r[1].len());
    let worst_ms = r[1]
        .iter()
        .map(|s| s.latency.as_millis())
        .max()
        .unwrap_or(0);
    eprintln!("held back: mc {mc} reads, nc {nc} reads (longest {worst_ms} ms) in 3 s");
    // ≈ 7,000 IOPS in all, 1/16 of the releases to nc: ≈ 1,300 in 3 s.
    assert!(
        nc >= 150,
        "the held-back volume completed {nc} reads in 3 s"
    );
    assert!(
        mc >= 5 * nc,
        "mc {mc} vs nc {nc}: protection held nothing back"
    );
    assert!(worst_ms < 2_000, "a held-back read took {worst_ms} ms");
    // The gate's counters say why: the non-critical volume's releases came by its
    // floor, the mission-critical one's were moved ahead by protection.
    let (mc, nc) = (stats(&server, "mc"), stats(&server, "nc"));
    assert!(
        nc.held_back_dispatches * 2 > nc.dispatched_ios,
        "nc: {} of {} releases by the floor",
        nc.held_back_dispatches,
        nc.dispatched_ios
    );
    assert!(mc.protected_dispatches > 0 && mc.held_back_dispatches == 0);
}

/// A client whose connection ends (no DISC) leaves nothing queued: four 64 MiB
/// TRIMs (65 s of a 1,000 IOPS limit) and two 32 MiB READs from 127.0.0.2, then
/// the connection closed;
/// the same host reconnects and its 4 KiB read is served at once, and the volume
/// stops spending its limit for nobody; the reads it failed count no bytes.
/// Before, the read waited behind the TRIMs (64.9 s live) and the gate kept
/// releasing their pieces.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gone_connection_s_queued_requests_do_not_hold_its_host() {
    let _alone = common::timed_alone().await;
    let config = [
        CAPPED_1000,
        &common::volume_toml("shared", "64MiB", "capped", "default"),
    ]
    .concat();
    let (_dir, server) = common::start_with("gate-gone", &config).await;
    let addr = server.nbd_addr();
    let from: IpAddr = "127.0.0.2".parse().unwrap();
    let (mut c, _) = NbdClient::connect_from(Some(from), addr, ClientConfig::go("shared"))
        .await
        .unwrap();
    for _ in 0..4 {
        c.session().trim(0, 64 << 20);
    }
    for i in 0..2 {
        c.session().read(i << 25, 32 << 20);
    }
    c.send().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(c);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (mut c, _) = NbdClient::connect_from(Some(from), addr, ClientConfig::go("shared"))
        .await
        .unwrap();
    let start = Instant::now();
    let read = tokio::time::timeout(Duration::from_secs(5), c.read(0, 4096)).await;
    let waited = start.elapsed();
    println!("the reconnected host's 4 KiB read: {waited:?}");
    assert!(
        read.is_ok(),
        "the read waited over 5 s behind a gone connection's TRIMs"
    );
    assert!(
        waited < Duration::from_secs(1),
        "the read waited {waited:?}"
    );
    let before = stats(&server, "shared");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = stats(&server, "shared");
    assert_eq!(after.queued, 0);
    let spent = after.dispatched_units - before.dispatched_units;
    assert!(
        spent <= 10,
        "{spent} units released in 1 s for a gone client"
    );
    // The cancelled reads are failed requests, not 64 MiB read.
    let read = common::sample(
        &server,
        r#"weir_volume_bytes_total{volume="shared",op="read"}"#,
    );
    assert!(read <= 1 << 20, "{read} bytes counted as read");
    server.shutdown().await.unwrap();
}
