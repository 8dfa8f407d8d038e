//! The flash read cache (issue 12): reads of a `cache = "flash"` volume hit a
//! cache file after their first miss, writes drop what they touch, and under
//! concurrent writers and readers no read returns data older than a write
//! acknowledged before it began. In front of an upstream, hits never reach it.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use weir_server::RunningServer;
use weir_server::flash_cache::VolumeCache;

fn pool(name: &str, extra: &str, cache_dir: &std::path::Path, size: &str) -> String {
    format!(
        "[[pools]]\nname = \"{name}\"\n{extra}\nflash_cache = {{ dir = \"{}\", size = \"{size}\" }}\n",
        cache_dir.display()
    )
}

fn cached_volume(name: &str, size: &str, pool: &str) -> String {
    common::volume_toml(name, size, "non-critical", pool) + "cache = \"flash\"\n"
}

/// `name{…volume="v"…}` summed over its series.
fn metric(server: &RunningServer, name: &str, volume: &str) -> u64 {
    let text = weir_server::admin::metrics_text(server.state());
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter(|l| l.contains(&format!("volume=\"{volume}\"")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| (i.wrapping_mul(37).wrapping_add(seed * 11) % 253) as u8)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_hit_after_a_miss_and_writes_trims_and_zeroes_are_seen() {
    let cache_dir = common::TempDir::new("fc-dir");
    let toml = pool("fast", "", cache_dir.path(), "1MiB")
        + &cached_volume("db", "8MiB", "fast")
        + &common::volume_toml("plain", "1MiB", "non-critical", "fast");
    let (_dir, server) = common::start_with("fc-basic", &toml).await;
    let (mut c, _) = common::connect(&server, "db").await;

    let a = pattern(1, 64 << 10);
    c.write(0, &a, false).await.unwrap().unwrap();
    assert_eq!(c.read(0, 64 << 10).await.unwrap().unwrap(), a, "miss");
    assert_eq!(
        metric(&server, "weir_volume_flash_cache_filled_blocks_total", "db"),
        16
    );
    for _ in 0..3 {
        assert_eq!(c.read(4096, 8192).await.unwrap().unwrap(), a[4096..12288]);
    }
    assert_eq!(
        metric(&server, "weir_volume_flash_cache_hits_total", "db"),
        3
    );
    // An unaligned read inside cached blocks hits too.
    assert_eq!(c.read(100, 5000).await.unwrap().unwrap(), a[100..5100]);
    assert_eq!(
        metric(&server, "weir_volume_flash_cache_hits_total", "db"),
        4
    );

    // A write replaces what the cache held, byte-exact, even mid-block.
    let b = pattern(2, 1000);
    c.write(5000, &b, false).await.unwrap().unwrap();
    let mut expect = a.clone();
    expect[5000..6000].copy_from_slice(&b);
    assert_eq!(c.read(0, 64 << 10).await.unwrap().unwrap(), expect);
    assert!(
        metric(
            &server,
            "weir_volume_flash_cache_invalidated_blocks_total",
            "db"
        ) >= 1
    );
    // WRITE_ZEROES and TRIM too (a trimmed range of this pool reads zeroes).
    for _ in 0..2 {
        c.read(16384, 16384).await.unwrap().unwrap();
    }
    let h = c.session().write_zeroes(16384, 8192, false);
    c.wait(h).await.unwrap().unwrap();
    let h = c.session().trim(24576, 8192);
    c.wait(h).await.unwrap().unwrap();
    assert_eq!(c.read(16384, 16384).await.unwrap().unwrap(), vec![0; 16384]);

    // More data than the cache holds (1 MiB): every read still correct.
    let big = pattern(3, 4 << 20);
    c.write(2 << 20, &big, false).await.unwrap().unwrap();
    for round in 0..2 {
        for i in (0..1024u64).rev().step_by(3) {
            let at = (i * 4096) as usize;
            let got = c.read((2 << 20) + i * 4096, 4096).await.unwrap().unwrap();
            assert_eq!(got, big[at..at + 4096], "round {round} block {i}");
        }
    }
    assert!(
        metric(
            &server,
            "weir_volume_flash_cache_evicted_blocks_total",
            "db"
        ) > 0
    );
    let text = weir_server::admin::metrics_text(server.state());
    assert!(
        text.contains("weir_pool_flash_cache_capacity_bytes{pool=\"fast\"} 1048576"),
        "{text}"
    );

    // A volume without `cache` reads its backend.
    let (mut p, _) = common::connect(&server, "plain").await;
    p.write(0, &a[..4096], false).await.unwrap().unwrap();
    p.read(0, 4096).await.unwrap().unwrap();
    p.read(0, 4096).await.unwrap().unwrap();
    assert_eq!(
        metric(&server, "weir_volume_flash_cache_hits_total", "plain"),
        0
    );

    // Caching switched off and on through the API: off counts nothing, on
    // starts empty (a write made while off can never be served stale).
    let hits = metric(&server, "weir_volume_flash_cache_hits_total", "db");
    let off = weir_server::VolumeUpdate {
        cache: Some(VolumeCache::None),
        ..Default::default()
    };
    server.state().store().update_volume("db", off).unwrap();
    let d = pattern(4, 4096);
    c.write(4096, &d, false).await.unwrap().unwrap();
    assert_eq!(c.read(4096, 4096).await.unwrap().unwrap(), d);
    assert_eq!(
        metric(&server, "weir_volume_flash_cache_hits_total", "db"),
        hits
    );
    let on = weir_server::VolumeUpdate {
        cache: Some(VolumeCache::Flash),
        ..Default::default()
    };
    let r = server.state().store().update_volume("db", on).unwrap();
    assert_eq!(r.cache, VolumeCache::Flash);
    assert_eq!(
        c.read(4096, 4096).await.unwrap().unwrap(),
        d,
        "empty after on"
    );
    assert_eq!(c.read(4096, 4096).await.unwrap().unwrap(), d);
    assert_eq!(
        metric(&server, "weir_volume_flash_cache_hits_total", "db"),
        hits + 1
    );
    server.shutdown().await.unwrap();
}

/// Writers stamp each 4 KiB block with (block, version); readers check that
/// what they read is that block's, and no older than the newest write
/// acknowledged when the read began — through hits, misses, fills racing
/// writes, and evictions (the cache holds a quarter of the blocks).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_and_readers_never_see_stale_data() {
    const BLOCKS: u64 = 256;
    let cache_dir = common::TempDir::new("fc-race-dir");
    let toml = pool("fast", "", cache_dir.path(), "256KiB") + &cached_volume("v", "1MiB", "fast");
    let (_dir, server) = common::start_with("fc-race", &toml).await;
    let acked: Arc<Mutex<HashMap<u64, u64>>> = Arc::default();
    let version = Arc::new(AtomicU64::new(0));
    let stamp = |block: u64, v: u64| {
        let mut d = vec![0u8; 4096];
        for chunk in d.chunks_mut(16) {
            chunk[..8].copy_from_slice(&block.to_le_bytes());
            chunk[8..].copy_from_slice(&v.to_le_bytes());
        }
        d
    };
    let mut tasks = Vec::new();
    for t in 0..4u64 {
        let server_addr = server.nbd_addr();
        let acked = acked.clone();
        let version = version.clone();
        tasks.push(tokio::spawn(async move {
            let (mut c, _) = weir_server::nbd_client::NbdClient::connect(
                server_addr,
                weir_nbd::ClientConfig::go("v"),
            )
            .await
            .unwrap();
            let mut x = 0x9E37_79B9_7F4A_7C15u64.wrapping_mul(t + 1);
            let mut reads = 0u64;
            for _ in 0..600 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Hot blocks (a quarter) get most of the traffic.
                let block = if x.is_multiple_of(4) {
                    x % BLOCKS
                } else {
                    x % (BLOCKS / 4)
                };
                // One writer per block (tasks 0 and 1, even and odd blocks):
                // two writers' versions could land out of order.
                if (x >> 20).is_multiple_of(4) && t < 2 && block % 2 == t {
                    let v = version.fetch_add(1, Ordering::SeqCst) + 1;
                    c.write(block * 4096, &stamp(block, v), false)
                        .await
                        .unwrap()
                        .unwrap();
                    let mut a = acked.lock().unwrap();
                    let e = a.entry(block).or_default();
                    *e = (*e).max(v);
                } else {
                    let floor = acked.lock().unwrap().get(&block).copied().unwrap_or(0);
                    let d = c.read(block * 4096, 4096).await.unwrap().unwrap();
                    let got_block = u64::from_le_bytes(d[..8].try_into().unwrap());
                    let got_v = u64::from_le_bytes(d[8..16].try_into().unwrap());
                    if got_v > 0 {
                        assert_eq!(got_block, block, "another block's data");
                    }
                    assert!(
                        got_v >= floor,
                        "block {block}: read version {got_v}, {floor} was acknowledged before"
                    );
                    assert!(d.chunks(16).all(|c| c == &d[..16]), "torn block {block}");
                    reads += 1;
                }
            }
            reads
        }));
    }
    let mut reads = 0;
    for t in tasks {
        reads += t.await.unwrap();
    }
    let hits = metric(&server, "weir_volume_flash_cache_hits_total", "v");
    let invalidated = metric(
        &server,
        "weir_volume_flash_cache_invalidated_blocks_total",
        "v",
    );
    assert!(reads > 1500, "{reads} reads");
    assert!(hits > 200, "{hits} hits of {reads} reads");
    assert!(invalidated > 20, "{invalidated} blocks dropped by writes");
    server.shutdown().await.unwrap();
}

/// A storage server with a 4 MiB volume `db`, and a gateway in front of it with
/// a 2 MiB flash cache and `db` cached (the directories are dropped last).
async fn cached_gateway(tag: &str) -> ([common::TempDir; 3], RunningServer, RunningServer) {
    let (up_dir, upstream) = common::start_with(
        &format!("{tag}-up"),
        &("[[pools]]\nname = \"default\"\n".to_string()
            + &common::volume_toml("db", "4MiB", "non-critical", "default")),
    )
    .await;
    let cache_dir = common::TempDir::new(&format!("{tag}-dir"));
    let gw_toml = pool(
        "gw",
        &format!("upstream = \"nbd://{}\"", upstream.nbd_addr()),
        cache_dir.path(),
        "2MiB",
    ) + "[[volumes]]\nname = \"db\"\npolicy = \"non-critical\"\npool = \"gw\"\ncache = \"flash\"\n";
    let (gw_dir, gateway) = common::start_with(&format!("{tag}-gw"), &gw_toml).await;
    ([up_dir, cache_dir, gw_dir], upstream, gateway)
}

/// In front of an upstream (gateway mode), a hit costs the upstream nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_hit_never_reaches_the_upstream() {
    let (_dirs, upstream, gateway) = cached_gateway("fc-gw").await;
    let (mut c, _) = common::connect(&gateway, "db").await;
    let a = pattern(5, 1 << 20);
    c.write(0, &a, false).await.unwrap().unwrap();
    let upstream_reads = || metric(&upstream, "weir_volume_ios_total", "db");
    let before = upstream_reads();
    for i in 0..256u64 {
        let at = (i * 4096) as usize;
        assert_eq!(
            c.read(i * 4096, 4096).await.unwrap().unwrap(),
            a[at..at + 4096]
        );
    }
    let after_misses = upstream_reads();
    assert_eq!(after_misses - before, 256, "each first read went upstream");
    let t = std::time::Instant::now();
    for i in 0..256u64 {
        let at = (i * 4096) as usize;
        assert_eq!(
            c.read(i * 4096, 4096).await.unwrap().unwrap(),
            a[at..at + 4096]
        );
    }
    // Hits stay on the gateway; only the lease's renewals (one 512-byte read
    // per half second at most) reach the upstream.
    let renewals = (t.elapsed().as_secs_f64() / 0.5).ceil() as u64 + 1;
    assert!(
        upstream_reads() - after_misses <= renewals,
        "{} upstream I/Os for 256 hits in {:?}",
        upstream_reads() - after_misses,
        t.elapsed()
    );
    assert_eq!(
        metric(&gateway, "weir_volume_flash_cache_hits_total", "db"),
        256
    );
    gateway.shutdown().await.unwrap();
    upstream.shutdown().await.unwrap();
}

#[tokio::test]
async fn bad_cache_settings_are_refused_with_the_key() {
    let dir = common::TempDir::new("fc-bad");
    // `cache = "flash"` on a pool without a flash cache.
    let toml = "[[pools]]\nname = \"p\"\n".to_string() + &cached_volume("v", "1MiB", "p");
    let e = RunningServer::start(common::config_from(&toml, dir.path()))
        .await
        .err()
        .expect("refused");
    assert!(
        format!("{e:#}").contains("needs a flash cache on pool \"p\""),
        "{e:#}"
    );
    for (setting, expect) in [
        ("size = \"1MiB\", block = \"3k\"", "power of two"),
        ("size = \"1k\"", "at least one block"),
        ("size = \"1MiB\", color = 1", "unknown field"),
    ] {
        let toml = format!(
            "[[pools]]\nname = \"p\"\nflash_cache = {{ dir = \"{}\", {setting} }}\n",
            dir.path().display()
        );
        let e = weir_server::config::WeirConfig::from_toml_str(&toml, "t.toml")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains(expect), "{setting}: {e}");
    }
    let toml = format!(
        "[[pools]]\nname = \"p\"\ndevice = \"15k-sas-raid5x24\"\nflash_cache = {{ dir = \"{}\", size = \"1MiB\" }}\n",
        dir.path().display()
    );
    let e = weir_server::config::WeirConfig::from_toml_str(&toml, "t.toml").unwrap_err();
    assert!(e.to_string().contains("not with an emulated device"), "{e}");
    // A second server on the same cache file is refused.
    let cache_dir = common::TempDir::new("fc-lock-dir");
    let toml = pool("fast", "", cache_dir.path(), "1MiB");
    let (_d1, first) = common::start_with("fc-lock1", &toml).await;
    let dir2 = common::TempDir::new("fc-lock2");
    let e = RunningServer::start(common::config_from(&toml, dir2.path()))
        .await
        .err()
        .expect("refused");
    assert!(
        format!("{e:#}").contains("in use by another process"),
        "{e:#}"
    );
    first.shutdown().await.unwrap();
}

/// A gateway stops at once after reads (regression: its final flush blocked a
/// runtime worker, and with its upstream in the same process the reply never
/// came: 30 s, then an error). Not cache-specific; here for its upstream setup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_stops_at_once_with_its_upstream_in_the_process() {
    let (_up_dir, upstream) = common::start_with(
        "fc-upstream2",
        &("[[pools]]\nname = \"default\"\n".to_string()
            + &common::volume_toml("db", "4MiB", "non-critical", "default")),
    )
    .await;
    let gw_toml = format!(
        "[[pools]]\nname = \"gw\"\nupstream = \"nbd://{}\"\n",
        upstream.nbd_addr()
    ) + "[[volumes]]\nname = \"db\"\npolicy = \"non-critical\"\npool = \"gw\"\n";
    let (_gw_dir, gateway) = common::start_with("fc-gw2", &gw_toml).await;
    let (mut c, _) = common::connect(&gateway, "db").await;
    c.write(0, &pattern(5, 1 << 20), false)
        .await
        .unwrap()
        .unwrap();
    for i in 0..16u64 {
        c.read(i * 4096, 4096).await.unwrap().unwrap();
    }
    let t = std::time::Instant::now();
    gateway.shutdown().await.unwrap();
    assert!(
        t.elapsed() < std::time::Duration::from_secs(10),
        "{:?}",
        t.elapsed()
    );
    upstream.shutdown().await.unwrap();
}

/// A gateway in front of `upstream` with a 2 MiB flash cache: `db` cached,
/// `other` not (the directories are dropped last).
async fn lease_gateway(
    upstream: &RunningServer,
    tag: &str,
) -> ([common::TempDir; 2], RunningServer) {
    let cache = common::TempDir::new(tag);
    let toml = pool(
        "gw",
        &format!("upstream = \"nbd://{}\"", upstream.nbd_addr()),
        cache.path(),
        "2MiB",
    ) + "[[volumes]]\nname = \"db\"\npolicy = \"non-critical\"\npool = \"gw\"\ncache = \"flash\"\n"
        + "[[volumes]]\nname = \"other\"\npolicy = \"non-critical\"\npool = \"gw\"\n";
    let (dir, gateway) = common::start_with(tag, &toml).await;
    ([cache, dir], gateway)
}

/// The upstream lease (`weir_server::lease`): a caching gateway's connections
/// hold the export exclusively, so the storage server refuses everybody else's
/// writes to it; a second caching gateway gets no lease and reads through (never
/// a stale hit); after the lease ends others' writes wait out its grace; and a
/// gateway that cannot take the lease (someone else wrote) reads what they wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leased_gateway_keeps_other_writers_out_and_a_second_reads_through() {
    use weir_nbd::ErrorCode;
    let (_up_dir, upstream) = common::start_with(
        "fc-lease-up",
        &("[[pools]]\nname = \"default\"\n".to_string()
            + &common::volume_toml("db", "4MiB", "non-critical", "default")
            + &common::volume_toml("other", "1MiB", "non-critical", "default")
            + &common::volume_toml("spare", "1MiB", "non-critical", "default")),
    )
    .await;
    let (_a_dirs, a) = lease_gateway(&upstream, "fc-lease-a").await;
    let (mut ca, _) = common::connect(&a, "db").await;
    let one = pattern(1, 8192);
    ca.write(0, &one, false).await.unwrap().unwrap();
    assert_eq!(ca.read(0, 8192).await.unwrap().unwrap(), one, "miss");
    assert_eq!(ca.read(0, 8192).await.unwrap().unwrap(), one, "hit");
    assert_eq!(metric(&a, "weir_volume_flash_cache_hits_total", "db"), 1);
    assert!(upstream.state().leases.held().contains("db"));
    // An uncached volume of the same pool takes no lease until its cache is
    // switched on.
    let (mut co, _) = common::connect(&a, "other").await;
    co.read(0, 4096).await.unwrap().unwrap();
    assert!(!upstream.state().leases.held().contains("other"));
    let on = weir_server::VolumeUpdate {
        cache: Some(VolumeCache::Flash),
        ..Default::default()
    };
    a.state().store().update_volume("other", on).unwrap();
    co.read(0, 4096).await.unwrap().unwrap();
    assert!(upstream.state().leases.held().contains("other"));
    drop(co);

    // A client of the storage server: its writes to db are refused, with why;
    // its reads and its writes elsewhere go on.
    let (mut direct, _) = common::connect(&upstream, "db").await;
    let e = direct
        .write(0, &[9; 4096], false)
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::Perm, "{e:?}");
    assert!(
        e.message
            .contains("held exclusively by the caching client at 127.0.0.1"),
        "{e:?}"
    );
    let text = weir_server::admin::metrics_text(upstream.state());
    assert!(
        text.contains(
            "weir_volume_exclusive_lease_connections{volume=\"db\",holder=\"127.0.0.1\"}"
        ),
        "{text}"
    );
    let h = direct.session().trim(0, 4096);
    assert_eq!(
        direct.wait(h).await.unwrap().unwrap_err().code,
        ErrorCode::Perm
    );
    assert_eq!(direct.read(0, 8192).await.unwrap().unwrap(), one);
    let (mut elsewhere, _) = common::connect(&upstream, "spare").await;
    elsewhere
        .write(0, &[7; 4096], false)
        .await
        .unwrap()
        .unwrap();

    // A second caching gateway: no lease, so nothing is cached there; its
    // writes come back refused as the upstream's EPERM.
    let (_b_dirs, b) = lease_gateway(&upstream, "fc-lease-b").await;
    let (mut cb, _) = common::connect(&b, "db").await;
    for _ in 0..3 {
        assert_eq!(cb.read(0, 8192).await.unwrap().unwrap(), one);
    }
    assert_eq!(metric(&b, "weir_volume_flash_cache_hits_total", "db"), 0);
    let text = weir_server::admin::metrics_text(b.state());
    assert!(
        text.contains("weir_pool_flash_cache_unowned_reads_total{pool=\"gw\"} 3"),
        "{text}"
    );
    let e = cb.write(0, &[8; 4096], false).await.unwrap().unwrap_err();
    assert_eq!(e.code, ErrorCode::Perm, "{e:?}");

    // Idle past the lease's freshness: A's next read waits for one renewal (a
    // 512-byte read upstream) and hits; it used to read through. The one after
    // hits with no round trip.
    let ios = || metric(&upstream, "weir_volume_ios_total", "db");
    let hits = || metric(&a, "weir_volume_flash_cache_hits_total", "db");
    let unowned = || common::sample(&a, "weir_pool_flash_cache_unowned_reads_total{pool=\"gw\"}");
    tokio::time::sleep(weir_server::lease::LEASE_FRESH + std::time::Duration::from_millis(200))
        .await;
    let (before, hits_before, unowned_before) = (ios(), hits(), unowned());
    assert_eq!(ca.read(0, 8192).await.unwrap().unwrap(), one);
    assert_eq!(ios(), before + 1, "one renewal confirms the idle lease");
    assert_eq!(hits(), hits_before + 1, "and the read is a hit");
    assert_eq!(unowned(), unowned_before, "nothing read past A's cache");
    assert_eq!(ca.read(0, 8192).await.unwrap().unwrap(), one);
    assert_eq!(ios(), before + 1, "confirmed: a hit with no round trip");
    assert_eq!(hits(), hits_before + 2);

    // A stops: the lease ends, and a direct write waits out the grace.
    drop(ca);
    a.shutdown().await.unwrap();
    // Its connections close; the storage server then releases the lease.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !upstream.state().leases.held().is_empty() {
        assert!(std::time::Instant::now() < until, "the lease outlived A");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let t = std::time::Instant::now();
    let two = pattern(2, 4096);
    direct.write(0, &two, false).await.unwrap().unwrap();
    let waited = t.elapsed();
    assert!(
        waited >= weir_server::lease::LEASE_GRACE - std::time::Duration::from_millis(300),
        "waited {waited:?}"
    );
    assert!(upstream.state().leases.held().is_empty());

    // A again (its cache starts empty): the direct writer is still connected, so
    // no lease: A reads through and sees that write.
    let (_a2_dirs, a2) = lease_gateway(&upstream, "fc-lease-a2").await;
    let (mut ca2, _) = common::connect(&a2, "db").await;
    for _ in 0..2 {
        assert_eq!(ca2.read(0, 4096).await.unwrap().unwrap(), two);
    }
    assert_eq!(metric(&a2, "weir_volume_flash_cache_hits_total", "db"), 0);
    assert!(upstream.state().leases.held().is_empty());
    assert_eq!(
        metric(&a2, "weir_volume_flash_cache_filled_blocks_total", "db"),
        0
    );
    drop((ca2, cb, direct, elsewhere));
    a2.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
    upstream.shutdown().await.unwrap();
}

/// `weir volume break-lease` (the admin API): the holder is disconnected and
/// may not take the lease again, a direct write lands after the grace, and the
/// gateway then reads that write (through its cache, never from it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_lease_disconnects_the_gateway_and_it_reads_through() {
    let (_dirs, upstream, gateway) = cached_gateway("fc-break").await;
    let (mut c, _) = common::connect(&gateway, "db").await;
    let old = pattern(1, 4096);
    c.write(0, &old, false).await.unwrap().unwrap();
    c.read(0, 4096).await.unwrap().unwrap();
    assert_eq!(c.read(0, 4096).await.unwrap().unwrap(), old);
    assert_eq!(
        metric(&gateway, "weir_volume_flash_cache_hits_total", "db"),
        1
    );

    // `weir volume stats` on the gateway: the hit, the cache's size.
    let cached = gateway.admin_client().volume_stats("db").await.unwrap();
    let cached = cached
        .flash_cache
        .expect("a cached volume's stats show its cache");
    assert_eq!((cached.read_hits, cached.read_misses), (1, 1), "{cached:?}");
    assert!(cached.pool_resident_bytes >= 4096 && cached.pool_capacity_bytes > 0);
    assert_eq!(cached.pool_unowned_reads, 0);
    let admin = upstream.admin_client();
    // `weir volume show` / list on the storage server name the holder.
    let shown = admin.show_volume("db").await.unwrap().exclusive_lease;
    let shown = shown.expect("the gateway's lease is shown");
    assert_eq!(shown.holder, "127.0.0.1");
    assert!(shown.connections >= 1, "{shown:?}");
    let listed = admin.list_volumes().await.unwrap();
    assert_eq!(
        listed
            .iter()
            .filter(|v| v.exclusive_lease.is_some())
            .count(),
        1
    );
    let broken = admin.break_lease("db").await.unwrap();
    assert_eq!(broken.holder.as_deref(), Some("127.0.0.1"), "{broken:?}");
    assert!(broken.connections >= 1);
    assert!(upstream.state().leases.held().is_empty());
    assert_eq!(admin.break_lease("db").await.unwrap().holder, None);
    assert_eq!(admin.show_volume("db").await.unwrap().exclusive_lease, None);
    assert!(admin.break_lease("nope").await.is_err(), "unknown volume");

    // Another client's write waits out the grace, then lands.
    let (mut direct, _) = common::connect(&upstream, "db").await;
    let new = pattern(2, 4096);
    let t = std::time::Instant::now();
    direct.write(0, &new, false).await.unwrap().unwrap();
    assert!(t.elapsed() >= weir_server::lease::LEASE_GRACE - std::time::Duration::from_millis(300));
    // The gateway reconnects without the lease and reads through: the new data.
    for _ in 0..3 {
        assert_eq!(c.read(0, 4096).await.unwrap().unwrap(), new);
    }
    assert_eq!(
        metric(&gateway, "weir_volume_flash_cache_hits_total", "db"),
        1
    );
    assert!(upstream.state().leases.held().is_empty(), "not taken again");
    let after = gateway.admin_client().volume_stats("db").await.unwrap();
    let after = after.flash_cache.unwrap();
    assert!(after.pool_unowned_reads >= 3, "{after:?}");
    assert!(
        upstream
            .admin_client()
            .volume_stats("db")
            .await
            .unwrap()
            .flash_cache
            .is_none()
    );
    drop((c, direct));
    gateway.shutdown().await.unwrap();
    upstream.shutdown().await.unwrap();
}
