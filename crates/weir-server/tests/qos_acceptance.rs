//! Issue 10's acceptance runs, live: a `weir serve` pool emulating
//! `15k-sas-raid5x24` with default pool settings (max_in_flight 64, adaptive
//! depth), 400 GiB volumes, closed-loop 4 KiB random readers from Weir's NBD client.
//! Long (about two minutes) and timing-sensitive, so ignored in the suite; run on a
//! quiet machine with `bench/run accept` (prints `ACCEPT` lines):
//!
//! `cargo test -p weir-server --release --test qos_acceptance -- --ignored --nocapture --test-threads=1`

mod common;

use std::time::Duration;

use common::emulated::{iops, pct, pool, run, volumes};

async fn serve(config: &str) -> (common::TempDir, weir_server::RunningServer) {
    common::start_with("accept", config).await
}

const SHARES: &str = r#"
[[policies]]
name = "high"
shares = "high"
[[policies]]
name = "normal"
"#;

/// Shares 2:1, both volumes at QD32: the split, and total throughput against the
/// same run with QoS off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "live acceptance run (bench/run accept)"]
async fn shares_two_to_one_at_qd32() {
    let measure = Duration::from_secs(10);
    let mut totals = Vec::new();
    for qos in [false, true] {
        let config = pool(qos) + SHARES + &volumes(&[("a", "high"), ("b", "normal")]);
        let (_d, server) = serve(&config).await;
        let r = run(server.nbd_addr(), &[("a", 32), ("b", 32)], measure).await;
        let (a, b) = (iops(&r[0], measure), iops(&r[1], measure));
        println!(
            "ACCEPT shares qos={qos}: a {a:.0} IOPS, b {b:.0} IOPS, ratio {:.3}, total {:.0}",
            a / b,
            a + b
        );
        totals.push((a, b));
        server.shutdown().await.unwrap();
    }
    let (off, on) = (totals[0], totals[1]);
    println!(
        "ACCEPT shares: ratio {:.2} (target 2.0 ± 0.1), total {:.2}x of QoS off (target ≥ 0.85)",
        on.0 / on.1,
        (on.0 + on.1) / (off.0 + off.1)
    );
}

/// 1,500 IOPS reserved beside three QD32 floods: the reserved volume in every 5 s
/// window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "live acceptance run (bench/run accept)"]
async fn reservation_beside_three_floods() {
    let measure = Duration::from_secs(20);
    let config = pool(true)
        + "[[policies]]\nname = \"res\"\nreservation_iops = 1500\n[[policies]]\nname = \"flood\"\n"
        + &volumes(&[
            ("r", "res"),
            ("f1", "flood"),
            ("f2", "flood"),
            ("f3", "flood"),
        ]);
    let (_d, server) = serve(&config).await;
    let r = run(
        server.nbd_addr(),
        &[("r", 32), ("f1", 32), ("f2", 32), ("f3", 32)],
        measure,
    )
    .await;
    let t0 = r[0].iter().map(|s| s.done_at).min().unwrap();
    let windows: Vec<f64> = (0..4)
        .map(|w| {
            let (a, b) = (
                t0 + Duration::from_secs(5 * w),
                t0 + Duration::from_secs(5 * (w + 1)),
            );
            r[0].iter()
                .filter(|s| s.done_at >= a && s.done_at < b)
                .count() as f64
                / 5.0
                / 1500.0
        })
        .collect();
    println!(
        "ACCEPT reservation: reserved {:.0} IOPS, per 5 s window {:?} of 1,500 (target ≥ 0.98 each); floods {:.0} {:.0} {:.0}",
        iops(&r[0], measure),
        windows
            .iter()
            .map(|w| format!("{w:.3}"))
            .collect::<Vec<_>>(),
        iops(&r[1], measure),
        iops(&r[2], measure),
        iops(&r[3], measure)
    );
    server.shutdown().await.unwrap();
}

/// A mission-critical 10 ms target at QD4 beside a QD64 non-critical flood; the
/// same without the target; and with QoS off (the flood's reference throughput).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "live acceptance run (bench/run accept)"]
async fn latency_target_beside_a_flood() {
    let measure = Duration::from_secs(10);
    let policies = r#"
[[policies]]
name = "mc"
service_level = "mission-critical"
latency_target_ms = 10
[[policies]]
name = "mc-no-target"
service_level = "mission-critical"
[[policies]]
name = "nc"
service_level = "non-critical"
"#;
    let mut flood_off = 0.0;
    let mut p99_no_target = 0.0;
    for (label, qos, policy) in [
        ("qos off", false, "mc"),
        ("no target", true, "mc-no-target"),
        ("target", true, "mc"),
    ] {
        let config = pool(qos) + policies + &volumes(&[("sql", policy), ("desktops", "nc")]);
        let (_d, server) = serve(&config).await;
        let r = run(server.nbd_addr(), &[("sql", 4), ("desktops", 64)], measure).await;
        let flood = iops(&r[1], measure);
        if !qos {
            flood_off = flood;
        }
        let (p50, p99) = (pct(&r[0], 0.5), pct(&r[0], 0.99));
        println!(
            "ACCEPT latency {label}: critical p50 {p50:.1} ms p99 {p99:.1} ms ({:.0} IOPS); flood {flood:.0} IOPS = {:.2}x of QoS off",
            iops(&r[0], measure),
            flood / flood_off
        );
        if label == "no target" {
            p99_no_target = p99;
        } else if label == "target" {
            println!(
                "ACCEPT latency: p50 {p50:.1} (≤ 10), p99 {p99:.1} (≤ 20), flood {:.2}x (≥ 0.6), no-target p99 {:.1}x higher (≥ 3)",
                flood / flood_off,
                p99_no_target / p99
            );
        }
        server.shutdown().await.unwrap();
    }
}
