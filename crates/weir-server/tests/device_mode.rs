//! Emulated-device pools: replies wait for the weir-model array.

mod common;

use std::time::{Duration, Instant};

use weir_server::RunningServer;

const CONFIG: &str = r#"
[[pools]]
name = "fast"

[[pools]]
name = "array"
device = "15k-sas-raid5x24"
max_in_flight = 32

[[policies]]
name = "open"

[[volumes]]
name = "on-files"
size = "64MiB"
policy = "open"
pool = "fast"

[[volumes]]
name = "on-array"
size = "64MiB"
policy = "open"
pool = "array"
"#;

async fn mean_random_read_latency(server: &RunningServer, volume: &str) -> Duration {
    let (mut c, _) = common::connect(server, volume).await;
    let start = Instant::now();
    let n = 20u64;
    for i in 0..n {
        // Scattered 8 KiB reads, one at a time (QD 1).
        let offset = ((i * 2_654_435_761) % (63 << 20)) & !8191;
        c.read(offset, 8192).await.unwrap().unwrap();
    }
    c.disconnect().await.unwrap();
    start.elapsed() / n as u32
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_on_an_emulated_array_take_disk_time_and_data_stays_correct() {
    let _alone = common::timed_alone().await;
    let (_dir, server) = common::start_with("device", CONFIG).await;
    let on_array = mean_random_read_latency(&server, "on-array").await;
    // A random read on a 15K drive is milliseconds (seek + rotation); from page
    // cache it is microseconds. Only the lower bound is asserted.
    assert!(
        on_array >= Duration::from_micros(500),
        "emulated array read took only {on_array:?}"
    );
    let on_files = mean_random_read_latency(&server, "on-files").await;
    println!(
        "mean QD1 8 KiB random read: emulated 15k-sas-raid5x24 {on_array:?}, files {on_files:?}"
    );
    let (mut c, _) = common::connect(&server, "on-array").await;
    c.write(1 << 20, b"array data", true)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(c.read(1 << 20, 10).await.unwrap().unwrap(), b"array data");
    c.disconnect().await.unwrap();
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_unknown_device_is_refused_at_start() {
    let _alone = common::timed_alone().await;
    let dir = common::TempDir::new("baddevice");
    let text = CONFIG.replace("15k-sas-raid5x24", "floppy-raid");
    let config = common::config_from(&text, dir.path());
    let e = RunningServer::start(config).await.err().unwrap();
    let msg = format!("{e:#}");
    assert!(
        msg.contains("floppy-raid") && msg.contains("15k-sas-raid5x24"),
        "{msg}"
    );
}
