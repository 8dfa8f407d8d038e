//! Prints the server's throughput through the whole path (TCP, decode, validate,
//! QoS scheduler, file backend, reply) on this machine:
//!
//! `cargo run --release -p weir-server --example nbd_throughput [seconds] [queue_depth] [block_bytes]`
//!
//! It starts a server in a temporary directory on a volume with an unlimited
//! policy, keeps `queue_depth` random reads (then writes) in flight on one
//! connection for `seconds` each, and prints IOPS, MB/s and mean latency.

use std::time::{Duration, Instant};

use weir_nbd::ClientConfig;
use weir_server::WeirConfig;
use weir_server::nbd_client::NbdClient;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let seconds: f64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(3.0);
    let depth: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(32);
    let block: u32 = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(4096);
    let dir = std::env::temp_dir().join(format!("weir-throughput-{}", std::process::id()));
    let text = r#"
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
[[policies]]
name = "unlimited"
[[volumes]]
name = "bench"
size = "256MiB"
policy = "unlimited"
"#;
    let mut config = WeirConfig::from_toml_str(text, "nbd_throughput")?;
    config.data_dir = dir.clone();
    let server = weir_server::RunningServer::start(config).await?;
    let (mut c, export) = NbdClient::connect(server.nbd_addr(), ClientConfig::go("bench")).await?;
    let blocks = export.size_bytes / block as u64;
    // Fill the volume so reads hit allocated data.
    let chunk = vec![0x5au8; 1 << 20];
    for i in 0..(export.size_bytes >> 20) {
        c.session().write(i << 20, &chunk, false);
    }
    while c.session().in_flight() > 0 {
        c.next_completion()
            .await?
            .result
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    let payload = vec![0xa5u8; block as usize];
    for write in [false, true] {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next_offset = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            (rng % blocks) * block as u64
        };
        let mut sent = std::collections::HashMap::new();
        let start = Instant::now();
        let deadline = start + Duration::from_secs_f64(seconds);
        let (mut done, mut latency_sum) = (0u64, Duration::ZERO);
        loop {
            while sent.len() < depth && Instant::now() < deadline {
                let off = next_offset();
                let h = if write {
                    c.session().write(off, &payload, false)
                } else {
                    c.session().read(off, block)
                };
                sent.insert(h, Instant::now());
            }
            if sent.is_empty() {
                break;
            }
            let comp = c.next_completion().await?;
            comp.result.map_err(|e| anyhow::anyhow!("{e}"))?;
            latency_sum += sent
                .remove(&comp.handle)
                .map(|t| t.elapsed())
                .unwrap_or_default();
            done += 1;
        }
        let secs = start.elapsed().as_secs_f64();
        println!(
            "random {:5} {block:>7} B  QD {depth:>3}: {:>9.0} IOPS {:>8.1} MB/s  mean latency {:>7.3} ms  ({done} I/Os in {secs:.2} s)",
            if write { "write" } else { "read" },
            done as f64 / secs,
            done as f64 * block as f64 / secs / 1e6,
            latency_sum.as_secs_f64() * 1e3 / done.max(1) as f64,
        );
    }
    c.disconnect().await?;
    server.shutdown().await?;
    let _ = std::fs::remove_dir_all(dir);
    Ok(())
}
