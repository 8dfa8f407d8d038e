//! Datastore-wide congestion control in the server: a window per client host,
//! recomputed every period from the pool's mean latency.

mod common;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{HIGH_AND_NORMAL_SHARES, ReadLoad, volume_toml};
use weir_server::WeirConfig;

/// Two volumes with 2:1 shares on an emulated array with congestion control (5 ms).
fn config() -> String {
    let pool = r#"
[[pools]]
name = "array"
device = "15k-sas-raid5x24"
max_in_flight = 32
congestion = { enabled = true, threshold_ms = 5, period_ms = 100 }
"#;
    [
        pool,
        HIGH_AND_NORMAL_SHARES,
        &volume_toml("a", "16GiB", "high", "array"),
        &volume_toml("b", "16GiB", "normal", "array"),
    ]
    .concat()
}

/// QD `queue_depth` random 8 KiB reads from `from` until `end`; returns I/Os done.
async fn flood(
    addr: SocketAddr,
    from: IpAddr,
    volume: &str,
    queue_depth: usize,
    end: Instant,
) -> u64 {
    let load = ReadLoad {
        volume,
        from: Some(from),
        queue_depth,
        size_bytes: 8192,
        span_bytes: 16 << 30,
        seed: 0x1234_5678 ^ from.to_string().len() as u64,
    };
    load.run_until(addr, end).await.len() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_windows_shrink_under_congestion_and_follow_shares() {
    let _alone = common::timed_alone().await;
    let (_dir, server) = common::start_with("congestion", &config()).await;
    let server = Arc::new(server);
    let pool = server.state().pool("array").unwrap();
    let addr = server.nbd_addr();
    let end = Instant::now() + Duration::from_millis(1800);
    let host_a: IpAddr = "127.0.0.1".parse().unwrap();
    let host_b: IpAddr = "127.0.0.2".parse().unwrap();
    let a = tokio::spawn(flood(addr, host_a, "a", 64, end));
    let b = tokio::spawn(flood(addr, host_b, "b", 64, end));
    // While both flood: each host's requests in the pool stay near its window
    // (a window that just shrank drains as requests complete), and the rest wait.
    let mut peak_over = 0i64;
    let mut saw_waiting = false;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    while Instant::now() + Duration::from_millis(100) < end {
        for h in pool.host_windows() {
            peak_over = peak_over.max(h.in_gate as i64 - 32);
            saw_waiting |= h.waiting > 0;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let windows = pool.host_windows();
    let (ios_a, ios_b) = (a.await.unwrap(), b.await.unwrap());
    println!(
        "after 1.8 s of two QD64 floods (threshold 5 ms): {windows:?}; I/Os {ios_a} + {ios_b}"
    );
    assert_eq!(windows.len(), 2, "{windows:?}");
    // Window β follows the shares of the volumes each host has open.
    assert_eq!(
        windows[0].host_shares + windows[1].host_shares,
        3000,
        "{windows:?}"
    );
    assert!(windows.iter().any(|w| w.host_shares == 2000), "{windows:?}");
    for w in &windows {
        // The array at QD 32 is far above 5 ms: every window shrank from 32.
        assert!(w.window < 32, "{w:?}");
        assert!(w.window >= 4, "{w:?}");
    }
    assert!(
        peak_over <= 0,
        "a host had {peak_over} requests over the initial window"
    );
    assert!(saw_waiting, "no request ever waited behind a host window");
    let server = Arc::into_inner(server).unwrap();
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn congestion_off_means_no_host_windows_and_bad_thresholds_are_refused() {
    let _alone = common::timed_alone().await;
    let text = config().replace("enabled = true", "enabled = false");
    let (_dir, server) = common::start_with("congestion-off", &text).await;
    let (mut c, _) = common::connect(&server, "a").await;
    c.write(0, b"x", true).await.unwrap().unwrap();
    assert!(
        server
            .state()
            .pool("array")
            .unwrap()
            .host_windows()
            .is_empty()
    );
    c.disconnect().await.unwrap();
    server.shutdown().await.unwrap();

    let text = config().replace("threshold_ms = 5", "threshold_ms = 500");
    let e = WeirConfig::from_toml_str(&text, "weir.toml").unwrap_err();
    assert!(e.to_string().contains("pools[0].congestion"), "{e}");
    assert!(e.to_string().contains("5-100"), "{e}");
}
