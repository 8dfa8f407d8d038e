//! A gateway (`weir serve` with an upstream pool) in front of another `weir
//! serve`, under a pipelined write workload, while the upstream is killed with
//! SIGKILL and restarted on the same port: the gateway reconnects by itself,
//! requests in flight are retried or fail with an error, and no acknowledged
//! write is lost (read back through the gateway and from the upstream directly).
//! Then, when fio is installed, `fio --verify` through the gateway.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::WeirProcess;
use weir_nbd::{ClientConfig, ReplyData};
use weir_server::nbd_client::NbdClient;

const BLOCK: usize = 4096;
const BLOCKS: u64 = 2000;
const QUEUE_DEPTH: usize = 8;
const KILL_AFTER: u64 = 300;

const UPSTREAM: &str = r#"
[[volumes]]
name = "vol"
size = "16MiB"
policy = "non-critical"
"#;

fn gateway_config(upstream: &WeirProcess) -> String {
    format!(
        r#"
[[pools]]
name = "gw"
upstream = "nbd://{}"
upstream_connections = 4
upstream_timeout_s = 30
[[volumes]]
name = "vol"
policy = "non-critical"
pool = "gw"
"#,
        upstream.nbd_addr
    )
}

fn pattern(block: u64) -> Vec<u8> {
    let mut b = vec![0u8; BLOCK];
    let mut x = block.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for chunk in b.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes());
    }
    b
}

/// Writes every block once, `QUEUE_DEPTH` at a time; returns the blocks whose
/// write was acknowledged and those that failed.
async fn write_all(
    addr: std::net::SocketAddr,
    done: Arc<AtomicU64>,
) -> (HashSet<u64>, HashSet<u64>) {
    let (mut c, _) = NbdClient::connect(addr, ClientConfig::go("vol"))
        .await
        .expect("gateway connection");
    let mut in_flight: HashMap<u64, u64> = HashMap::new();
    let (mut acked, mut failed) = (HashSet::new(), HashSet::new());
    let mut next = 0u64;
    while next < BLOCKS || !in_flight.is_empty() {
        while next < BLOCKS && in_flight.len() < QUEUE_DEPTH {
            let h = c
                .session()
                .write(next * BLOCK as u64, &pattern(next), false);
            in_flight.insert(h, next);
            next += 1;
        }
        let comp = c.next_completion().await.expect("the gateway stays up");
        let block = in_flight.remove(&comp.handle).expect("known handle");
        match comp.result {
            Ok(_) => acked.insert(block),
            Err(_) => failed.insert(block),
        };
        done.fetch_add(1, Ordering::Relaxed);
    }
    c.flush().await.unwrap().expect("flush after the restart");
    c.disconnect().await.unwrap();
    (acked, failed)
}

async fn check(
    addr: std::net::SocketAddr,
    acked: &HashSet<u64>,
    failed: &HashSet<u64>,
    what: &str,
) {
    let (mut c, _) = NbdClient::connect(addr, ClientConfig::go("vol"))
        .await
        .unwrap();
    for block in 0..BLOCKS {
        let h = c.session().read(block * BLOCK as u64, BLOCK as u32);
        let Ok(ReplyData::Read(data)) = c.wait(h).await.unwrap() else {
            panic!("{what}: reading block {block} failed");
        };
        if acked.contains(&block) {
            assert!(
                data == pattern(block),
                "{what}: acknowledged write of block {block} lost"
            );
        } else {
            assert!(failed.contains(&block));
            assert!(
                data == pattern(block) || data.iter().all(|&b| b == 0),
                "{what}: block {block} holds neither its write nor zeroes"
            );
        }
    }
    c.disconnect().await.unwrap();
}

#[test]
fn gateway_survives_an_upstream_kill_without_losing_acknowledged_writes() {
    let up_dir = common::TempDir::new("gw-kill-upstream");
    let gw_dir = common::TempDir::new("gw-kill-gateway");
    let mut upstream = WeirProcess::start(up_dir.path(), UPSTREAM);
    let upstream_addr = upstream.nbd_addr;
    let gateway = WeirProcess::start(gw_dir.path(), &gateway_config(&upstream));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let done = Arc::new(AtomicU64::new(0));
    let writer = rt.spawn(write_all(gateway.nbd_addr, done.clone()));

    let start = Instant::now();
    while done.load(Ordering::Relaxed) < KILL_AFTER {
        assert!(start.elapsed() < Duration::from_secs(60), "no progress");
        std::thread::sleep(Duration::from_millis(2));
    }
    upstream.kill();
    let at_kill = done.load(Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(300));
    let upstream = WeirProcess::start_listening(up_dir.path(), UPSTREAM, upstream_addr);
    let (acked, failed) = rt.block_on(writer).unwrap();
    assert_eq!(acked.len() + failed.len(), BLOCKS as usize);
    assert!(at_kill < BLOCKS, "the kill came too late to test anything");
    assert!(
        acked.len() as u64 > at_kill,
        "no write acknowledged after the restart: the gateway did not reconnect \
         ({} acknowledged, {} failed)",
        acked.len(),
        failed.len()
    );
    println!(
        "{} writes acknowledged, {} failed; {at_kill} done at the kill",
        acked.len(),
        failed.len()
    );
    rt.block_on(check(
        gateway.nbd_addr,
        &acked,
        &failed,
        "through the gateway",
    ));
    rt.block_on(check(upstream.nbd_addr, &acked, &failed, "on the upstream"));
    // The operator sees the loss and the recovery in /metrics.
    let text = rt.block_on(gateway.admin_client().metrics()).unwrap();
    let sample = |name: &str| -> u64 {
        let prefix = format!("{name}{{volume=\"vol\"}} ");
        let line = text.lines().find(|l| l.starts_with(&prefix));
        let line = line.unwrap_or_else(|| panic!("no {prefix} in /metrics"));
        line[prefix.len()..].parse().unwrap()
    };
    let reconnects = sample("weir_volume_upstream_reconnects_total");
    let retries = sample("weir_volume_upstream_retries_total");
    let unreachable = sample("weir_volume_upstream_unreachable_total");
    let alive = sample("weir_volume_upstream_connections_alive");
    let configured = sample("weir_volume_upstream_connections");
    println!(
        "upstream metrics: {reconnects} reconnects, {retries} retries, {unreachable} \
         unreachable, {alive} of {configured} connections alive"
    );
    assert!(reconnects >= 1);
    assert!(alive >= 1 && alive <= configured, "{alive} of {configured}");

    common::fio_verify(gateway.nbd_addr, "vol", gw_dir.path());
}

/// The lines of `dir/weir.log` that contain every one of `words`.
fn log_lines(dir: &std::path::Path, words: &[&str]) -> Vec<String> {
    let log = std::fs::read_to_string(dir.join("weir.log")).unwrap_or_default();
    log.lines()
        .filter(|l| words.iter().all(|w| l.contains(w)))
        .map(String::from)
        .collect()
}

/// An upstream that cannot be reached is in the gateway's log, by default:
/// one warning naming it and why (connection refused), not one per failed
/// request or reconnect, then an info line once it is back. Before, nothing
/// was logged: the gateway's clients got EIO and the operator saw no reason.
#[test]
fn an_unreachable_upstream_is_logged_with_its_reason_and_its_return() {
    let up_dir = common::TempDir::new("gw-log-upstream");
    let gw_dir = common::TempDir::new("gw-log-gateway");
    let mut upstream = WeirProcess::start(up_dir.path(), UPSTREAM);
    let upstream_addr = upstream.nbd_addr;
    let config = format!(
        "[[pools]]\nname = \"gw\"\nupstream = \"nbd://{upstream_addr}\"\n\
         upstream_connections = 2\nupstream_timeout_s = 1\n\
         [[volumes]]\nname = \"vol\"\npolicy = \"non-critical\"\npool = \"gw\"\n"
    );
    let gateway = WeirProcess::start(gw_dir.path(), &config);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let read = |rt: &tokio::runtime::Runtime| {
        rt.block_on(async {
            let (mut c, _) = NbdClient::connect(gateway.nbd_addr, ClientConfig::go("vol"))
                .await
                .expect("gateway connection");
            let r = c.read(0, 4096).await.unwrap().map(drop);
            c.disconnect().await.unwrap();
            r
        })
    };
    read(&rt).expect("a read through the gateway");
    upstream.kill();
    for _ in 0..3 {
        let e = read(&rt).expect_err("a read with the upstream gone");
        assert_eq!(e.code, weir_nbd::ErrorCode::Io, "{e}");
    }
    let target = format!("nbd://{upstream_addr}");
    // The upstream's own log line (the failed requests' line, rate-limited
    // server-wide by weir_server::session, names the volume and quotes it).
    let warnings = log_lines(
        gw_dir.path(),
        &["WARN", "weir_upstream", &target, "unreachable"],
    );
    assert_eq!(
        warnings.len(),
        1,
        "one warning per 10 s, not one per failure: {warnings:#?}"
    );
    assert!(
        warnings[0].contains("Connection refused"),
        "the warning says why: {}",
        warnings[0]
    );
    let _upstream = WeirProcess::start_listening(up_dir.path(), UPSTREAM, upstream_addr);
    read(&rt).expect("a read once the upstream is back");
    let back = log_lines(gw_dir.path(), &["INFO", &target, "reachable again"]);
    assert_eq!(back.len(), 1, "{back:#?}");
    println!("{}\n{}", warnings[0], back[0]);
}
