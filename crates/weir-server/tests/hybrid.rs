//! The hybrid tier in a running server (issue 12 item 3): its migrator completes
//! moves at the pool's gate, which may release clients' queued requests on the
//! migrator's own thread; every client request must still be answered and the
//! migrator must keep moving.

mod common;

use std::time::Duration;

use weir_server::RunningServer;

/// `name{…pool="hy"…}`.
fn pool_metric(server: &RunningServer, name: &str) -> u64 {
    let text = weir_server::admin::metrics_text(server.state());
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains("pool=\"hy\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moves_beside_a_queued_client_load_leave_no_request_unanswered() {
    let flash = common::TempDir::new("hy-flash");
    let toml = format!(
        "[[pools]]\nname = \"hy\"\nmax_in_flight = 4\n\
         tier = {{ flash_dir = \"{}\", flash_size = \"16MiB\", extent = \"1MiB\", \
         disk_device = \"15k-sas-raid5x24\", promote_heat = 1, half_life_s = 60, \
         migration_mbps = 10000 }}\n",
        flash.path().display()
    ) + &common::volume_toml("v", "64MiB", "non-critical", "hy");
    let (_dir, server) = common::start_with("hy-queued", &toml).await;
    // Twelve readers at QD1 over 32 extents against 4 slots of the gate: a queue
    // the gate releases from whichever thread completes, the migrator's included.
    let mut readers = Vec::new();
    for r in 0..12u64 {
        let (mut c, _) = common::connect(&server, "v").await;
        readers.push(tokio::spawn(async move {
            for i in 0..150u64 {
                let offset = ((r * 7 + i * 13) % 32) << 20 | (i % 16) << 12;
                let read = tokio::time::timeout(Duration::from_secs(20), c.read(offset, 4096));
                let got = read.await.expect("a read unanswered for 20 s");
                assert_eq!(got.unwrap().unwrap().len(), 4096);
            }
        }));
    }
    for r in readers {
        r.await.unwrap();
    }
    let promoted = pool_metric(&server, "weir_pool_tier_promotions_total");
    assert!(promoted >= 4, "{promoted} promotions");
    // The migrator is alive: a new extent beyond the first 32, read until it is
    // hot enough to displace a resident one (more than twice its heat), is
    // promoted.
    let (mut c, _) = common::connect(&server, "v").await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while pool_metric(&server, "weir_pool_tier_promotions_total") == promoted {
        assert!(std::time::Instant::now() < deadline, "the migrator stopped");
        for _ in 0..20 {
            c.read(40 << 20, 4096).await.unwrap().unwrap();
        }
    }
}
