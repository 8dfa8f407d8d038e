//! A flash-cached gateway never serves stale data (issue 12): gateway A caches
//! volume `x` of a storage server, holding `x`'s exclusive lease there, while
//! gateway B (also caching `x`, and writing `y`) and clients of the storage
//! server itself write: their writes to `x` are refused (EPERM) as long as A
//! holds the lease, their writes elsewhere go on. Through A, a writer stamps
//! blocks of `x` with (block, version); readers through A and through B check
//! every block they read is that block's and no older than the newest write
//! acknowledged before the read began (B, without the lease, reads through its
//! cache). A is killed with SIGKILL mid-run and restarted on its port (its cache
//! starts empty, the lease is taken again); then the storage server is killed
//! and restarted (A takes the lease anew and drops its cache); afterwards every block of `x`,
//! through A, through B and on the server, holds at least its last acknowledged
//! version. Then `fio --verify` through A, when fio has its nbd engine.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::WeirProcess;
use weir_nbd::ClientConfig;
use weir_server::nbd_client::NbdClient;

const BLOCKS: u64 = 1024;

const STORAGE: &str = r#"
[[volumes]]
name = "x"
size = "16MiB"
policy = "non-critical"
[[volumes]]
name = "y"
size = "4MiB"
policy = "non-critical"
[[volumes]]
name = "z"
size = "4MiB"
policy = "non-critical"
"#;

/// A gateway's configuration: its volumes, each with `cache = "flash"` or not.
fn gateway(storage: SocketAddr, dir: &std::path::Path, volumes: &[(&str, bool)]) -> String {
    let mut t = format!(
        "[[pools]]\nname = \"gw\"\nupstream = \"nbd://{storage}\"\nupstream_timeout_s = 5\n\
         upstream_connections = 1\nflash_cache = {{ dir = \"{}\", size = \"1MiB\" }}\n",
        dir.join("cache").display()
    );
    for (volume, cached) in volumes {
        let setting = if *cached { "cache = \"flash\"\n" } else { "" };
        t += &format!(
            "[[volumes]]\nname = \"{volume}\"\npolicy = \"non-critical\"\npool = \"gw\"\n{setting}"
        );
    }
    t
}

fn stamp(block: u64, version: u64) -> Vec<u8> {
    let mut d = vec![0u8; 4096];
    for chunk in d.chunks_mut(16) {
        chunk[..8].copy_from_slice(&block.to_le_bytes());
        chunk[8..].copy_from_slice(&version.to_le_bytes());
    }
    d
}

/// (block, version) of a block's data; panics on a torn block.
fn unstamp(d: &[u8]) -> (u64, u64) {
    assert!(d.chunks(16).all(|c| c == &d[..16]), "torn block");
    (
        u64::from_le_bytes(d[..8].try_into().unwrap()),
        u64::from_le_bytes(d[8..16].try_into().unwrap()),
    )
}

async fn connect(addr: SocketAddr, volume: &str) -> NbdClient {
    let start = Instant::now();
    loop {
        match NbdClient::connect(addr, ClientConfig::go(volume)).await {
            Ok((c, _)) => return c,
            Err(e) if start.elapsed() < Duration::from_secs(30) => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("cannot reach {volume} at {addr}: {e:#}"),
        }
    }
}

struct Shared {
    acked: Mutex<HashMap<u64, u64>>,
    version: AtomicU64,
    stop: AtomicBool,
    reads: AtomicU64,
    writes: AtomicU64,
}

/// Writes stamped blocks of `x` through `addr` until stopped, reconnecting
/// after the gateway's kill (a write that failed may or may not have landed).
async fn writer(addr: SocketAddr, s: Arc<Shared>) {
    let mut c = connect(addr, "x").await;
    let mut rng = common::Rng::new(7);
    while !s.stop.load(Ordering::Relaxed) {
        let block = if rng.below(4) == 0 {
            rng.below(BLOCKS)
        } else {
            rng.below(BLOCKS / 8)
        };
        let v = s.version.fetch_add(1, Ordering::SeqCst) + 1;
        match c.write(block * 4096, &stamp(block, v), false).await {
            Ok(Ok(())) => {
                *s.acked.lock().unwrap().entry(block).or_default() = v;
                s.writes.fetch_add(1, Ordering::Relaxed);
            }
            _ => c = connect(addr, "x").await,
        }
    }
}

/// Reads blocks of `x` through `addr` and checks them against the floor.
async fn reader(addr: SocketAddr, s: Arc<Shared>, seed: u64) {
    let mut c = connect(addr, "x").await;
    let mut rng = common::Rng::new(seed);
    while !s.stop.load(Ordering::Relaxed) {
        let block = if rng.below(4) == 0 {
            rng.below(BLOCKS)
        } else {
            rng.below(BLOCKS / 8)
        };
        let floor = s.acked.lock().unwrap().get(&block).copied().unwrap_or(0);
        match c.read(block * 4096, 4096).await {
            Ok(Ok(d)) => {
                let (b, v) = unstamp(&d);
                if v > 0 {
                    assert_eq!(b, block, "block {block}: another block's data");
                }
                assert!(
                    v >= floor,
                    "block {block}: read version {v}, {floor} was acknowledged"
                );
                s.reads.fetch_add(1, Ordering::Relaxed);
            }
            _ => c = connect(addr, "x").await,
        }
    }
}

/// Writes random blocks of `volume` (the noise beside the cached volume).
async fn noise(addr: SocketAddr, volume: &'static str, s: Arc<Shared>, seed: u64) {
    let mut c = connect(addr, volume).await;
    let mut rng = common::Rng::new(seed);
    while !s.stop.load(Ordering::Relaxed) {
        let block = rng.below(BLOCKS);
        let w = c
            .write(block * 4096, &stamp(block | 1 << 40, seed), false)
            .await;
        if w.is_err() {
            // The storage server restarted: reconnect.
            c = connect(addr, volume).await;
        }
    }
}

/// Tries to write `x` through `addr` until `stop`: every attempt must be
/// refused with EPERM (A holds the lease). Returns the refusals.
async fn refused_writer(addr: SocketAddr, stop: Arc<AtomicBool>, seed: u64) -> u64 {
    let mut c = connect(addr, "x").await;
    let mut rng = common::Rng::new(seed);
    let mut refused = 0;
    while !stop.load(Ordering::Relaxed) {
        let block = rng.below(BLOCKS);
        match c.write(block * 4096, &stamp(block, u64::MAX), false).await {
            Ok(Err(e)) if e.code == weir_nbd::ErrorCode::Perm => refused += 1,
            other => panic!("a write to x beside A's lease was not refused: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    refused
}

async fn check_all(addr: SocketAddr, s: &Shared, what: &str) {
    let mut c = connect(addr, "x").await;
    let acked = s.acked.lock().unwrap().clone();
    for block in 0..BLOCKS {
        let d = c.read(block * 4096, 4096).await.unwrap().unwrap();
        let (b, v) = unstamp(&d);
        let floor = acked.get(&block).copied().unwrap_or(0);
        assert!(
            v >= floor,
            "{what}: block {block} holds version {v}, {floor} was acknowledged"
        );
        if v > 0 {
            assert_eq!(b, block, "{what}: block {block} holds block {b}'s data");
        }
    }
}

#[test]
fn a_cached_gateway_killed_mid_run_never_serves_stale_data() {
    let storage_dir = common::TempDir::new("fgw-storage");
    let a_dir = common::TempDir::new("fgw-a");
    let b_dir = common::TempDir::new("fgw-b");
    let mut storage = WeirProcess::start(storage_dir.path(), STORAGE);
    let a_config = gateway(storage.nbd_addr, a_dir.path(), &[("x", true)]);
    let mut a = WeirProcess::start(a_dir.path(), &a_config);
    let a_addr = a.nbd_addr;
    // Started after A holds x's lease: B's x gets none (and reads through).
    let b = WeirProcess::start(
        b_dir.path(),
        &gateway(storage.nbd_addr, b_dir.path(), &[("x", true), ("y", false)]),
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let s = Arc::new(Shared {
        acked: Mutex::new(HashMap::new()),
        version: AtomicU64::new(0),
        stop: AtomicBool::new(false),
        reads: AtomicU64::new(0),
        writes: AtomicU64::new(0),
    });
    let tasks = vec![
        rt.spawn(writer(a_addr, s.clone())),
        rt.spawn(reader(a_addr, s.clone(), 11)),
        rt.spawn(reader(b.nbd_addr, s.clone(), 12)),
        rt.spawn(noise(b.nbd_addr, "y", s.clone(), 21)),
        rt.spawn(noise(storage.nbd_addr, "z", s.clone(), 22)),
    ];
    let hostile_stop = Arc::new(AtomicBool::new(false));
    let hostile = [
        rt.spawn(refused_writer(storage.nbd_addr, hostile_stop.clone(), 31)),
        rt.spawn(refused_writer(b.nbd_addr, hostile_stop.clone(), 32)),
    ];
    let wait_for = |n: u64| {
        let start = Instant::now();
        while s.reads.load(Ordering::Relaxed) < n {
            assert!(start.elapsed() < Duration::from_secs(60), "no progress");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    wait_for(3000);
    let hits = |p: &WeirProcess| {
        let text = rt.block_on(p.admin_client().metrics()).unwrap();
        text.lines()
            .find(|l| l.starts_with("weir_volume_flash_cache_hits_total{volume=\"x\""))
            .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    assert!(hits(&a) > 100, "the cache serves reads before the kill");
    assert_eq!(hits(&b), 0, "B has no lease: nothing cached there");
    let b_stats = b.cli(&["volume", "stats", "x"]);
    assert!(b_stats.contains("flash cache hit ratio"), "{b_stats}");
    let past = b_stats
        .lines()
        .find(|l| l.contains("reads past the cache, no lease"))
        .and_then(|l| l.split_whitespace().last()?.parse::<u64>().ok());
    assert!(past.is_some_and(|n| n > 0), "B reads through: {b_stats}");
    // The refused writers stop before A's lease ends (after it, their writes
    // would be allowed, once its grace has passed).
    hostile_stop.store(true, Ordering::Relaxed);
    let refused: Vec<u64> = hostile
        .into_iter()
        .map(|h| rt.block_on(h).unwrap())
        .collect();
    assert!(refused.iter().all(|&n| n > 10), "refused: {refused:?}");
    a.kill();
    std::thread::sleep(Duration::from_millis(200));
    let a = WeirProcess::start_listening(a_dir.path(), &a_config, a_addr);
    let at_restart = s.reads.load(Ordering::Relaxed);
    wait_for(at_restart + 3000);
    assert!(hits(&a) > 100, "the restarted cache serves reads too");
    // The storage server itself is killed (SIGKILL) with A's lease held and
    // restarts on its port: x starts in the lease's grace (recorded in its data
    // directory); A reconnects, takes the lease anew and drops what it had
    // cached (the lease may have been lost in between).
    let pool_counter = |p: &WeirProcess, name: &str| {
        let text = rt.block_on(p.admin_client().metrics()).unwrap();
        text.lines()
            .find(|l| l.starts_with(&format!("{name}{{pool=\"gw\"")))
            .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    assert_eq!(
        pool_counter(&a, "weir_pool_flash_cache_lease_drops_total"),
        0
    );
    let storage_addr = storage.nbd_addr;
    storage.kill();
    let storage = WeirProcess::start_listening(storage_dir.path(), STORAGE, storage_addr);
    let at_crash = s.reads.load(Ordering::Relaxed);
    wait_for(at_crash + 3000);
    assert!(
        pool_counter(&a, "weir_pool_flash_cache_lease_drops_total") >= 1,
        "A's cache was dropped when its lease was granted anew"
    );
    let hits_after_crash = hits(&a);
    wait_for(s.reads.load(Ordering::Relaxed) + 2000);
    assert!(hits(&a) > hits_after_crash, "and it caches again");
    s.stop.store(true, Ordering::Relaxed);
    for t in tasks {
        rt.block_on(t).unwrap();
    }
    println!(
        "{} reads checked, {} writes acknowledged through the cached gateway",
        s.reads.load(Ordering::Relaxed),
        s.writes.load(Ordering::Relaxed)
    );
    println!("writes to x refused beside A's lease (storage server, B): {refused:?}");
    rt.block_on(check_all(a_addr, &s, "through the gateway"));
    rt.block_on(check_all(b.nbd_addr, &s, "through gateway B"));
    rt.block_on(check_all(storage.nbd_addr, &s, "on the storage server"));
    common::fio_verify(a_addr, "x", a_dir.path());
    rt.block_on(break_the_lease_with_real_clients(&storage, a_addr));
}

/// With real clients: qemu-io's write to `x` on the storage server is refused
/// while A holds the lease; `weir volume break-lease` (the CLI) disconnects A;
/// qemu-io's write then lands, and A reads it (through its cache, not from it).
async fn break_the_lease_with_real_clients(storage: &WeirProcess, a_addr: SocketAddr) {
    if !weir_testkit::require_tool("qemu-io", &["qemu-utils"]) {
        return;
    }
    let uri = format!("nbd://{}/x", storage.nbd_addr);
    let qemu_write = || {
        let o = std::process::Command::new("qemu-io")
            .args(["-f", "raw", "-c", "write -P 0x5a 0 4k", &uri])
            .output()
            .expect("qemu-io runs");
        weir_testkit::output_text(&o)
    };
    let refused = qemu_write();
    assert!(
        refused.contains("Operation not permitted"),
        "qemu-io beside A's lease: {refused}"
    );
    let shown = storage.cli(&["volume", "show", "x"]);
    assert!(shown.contains("leased to 127.0.0.1 ("), "{shown}");
    let said = storage.cli(&["volume", "break-lease", "x", "--yes"]);
    assert!(said.contains("lease broken; 127.0.0.1"), "{said}");
    let wrote = qemu_write();
    assert!(
        wrote.contains("wrote 4096/4096 bytes"),
        "qemu-io after the break: {wrote}"
    );
    let mut c = connect(a_addr, "x").await;
    for _ in 0..3 {
        let d = c.read(0, 4096).await.unwrap().unwrap();
        assert!(
            d.iter().all(|&b| b == 0x5a),
            "A served block 0 from before the break"
        );
    }
}
