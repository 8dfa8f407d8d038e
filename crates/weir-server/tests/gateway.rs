//! Gateway mode (issue 12): a pool whose volumes are exports of an upstream
//! NBD server (here another weir server in the same process). Data, errors and
//! the optional commands pass through; sizes come from the upstream; volume
//! management on an upstream pool gives clear errors. Killing and restarting
//! the upstream: crates/weir/tests/gateway.rs.

mod common;

use weir_nbd::consts::*;
use weir_nbd::{ClientConfig, ErrorCode, ReplyData};
use weir_server::RunningServer;
use weir_server::nbd_client::NbdClient;
use weir_server::store::VolumeCreate;

const UPSTREAM: &str = r#"
[[pools]]
name = "default"
[[pools]]
name = "bad"
[[pools.faults]]
kind = "eio"
ops = ["write"]
every = 1
[[pools]]
name = "full"
[[pools.faults]]
kind = "enospc"
ops = ["write"]
every = 1
[[volumes]]
name = "vol"
size = "16MiB"
policy = "mission-critical"
[[volumes]]
name = "other"
size = "2MiB"
policy = "non-critical"
[[volumes]]
name = "bad"
size = "1MiB"
policy = "non-critical"
pool = "bad"
[[volumes]]
name = "full"
size = "1MiB"
policy = "non-critical"
pool = "full"
"#;

fn gateway_toml(upstream: &RunningServer, volumes: &str) -> String {
    format!(
        r#"
[[pools]]
name = "gw"
upstream = "nbd://{}"
upstream_connections = 3
upstream_timeout_s = 5
{volumes}"#,
        upstream.nbd_addr()
    )
}

const GATEWAY_VOLUMES: &str = r#"
[[volumes]]
name = "vol"
policy = "mission-critical"
pool = "gw"
[[volumes]]
name = "alias"
export = "vol"
size = "16MiB"
policy = "business-critical"
pool = "gw"
[[volumes]]
name = "bad"
policy = "non-critical"
pool = "gw"
[[volumes]]
name = "full"
policy = "non-critical"
pool = "gw"
"#;

fn pattern(seed: u32, len: usize) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(31).wrapping_add(seed) % 251) as u8)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_flags_and_errors_pass_through_the_gateway() {
    let (_up_dir, upstream) = common::start_with("gw-upstream", UPSTREAM).await;
    let (_gw_dir, gateway) =
        common::start_with("gw-gateway", &gateway_toml(&upstream, GATEWAY_VOLUMES)).await;

    let (mut gw, export) = common::connect(&gateway, "vol").await;
    assert_eq!(export.size_bytes, 16 << 20, "the size comes from upstream");
    let (mut alias, _) = common::connect(&gateway, "alias").await;
    let (mut direct, _) = common::connect(&upstream, "vol").await;

    // Writes through the gateway are on the upstream, and the other way round.
    let a = pattern(1, 1 << 20);
    gw.write(1 << 20, &a, false).await.unwrap().unwrap();
    assert_eq!(direct.read(1 << 20, 1 << 20).await.unwrap().unwrap(), a);
    let b = pattern(2, 8192);
    direct.write(5 << 20, &b, false).await.unwrap().unwrap();
    assert_eq!(gw.read(5 << 20, 8192).await.unwrap().unwrap(), b);
    assert_eq!(
        alias.read(5 << 20, 8192).await.unwrap().unwrap(),
        b,
        "`export` maps another name to the same upstream export"
    );
    // FUA, FLUSH.
    let c = pattern(3, 4096);
    gw.write(7 << 20, &c, true).await.unwrap().unwrap();
    gw.flush().await.unwrap().unwrap();
    assert_eq!(direct.read(7 << 20, 4096).await.unwrap().unwrap(), c);

    // One request at a time keeps to one upstream connection (of 3): its
    // replies share one reader thread's wake-ups.
    let alive = || {
        common::sample(
            &gateway,
            "weir_volume_upstream_connections_alive{volume=\"vol\"}",
        )
    };
    assert_eq!(
        alive(),
        1,
        "sequential requests opened more than one connection"
    );
    // Pipelined: many requests in flight on one client connection, spread
    // over the gateway's upstream connections once 32 wait on the first,
    // each answered with its data.
    let mut handles = Vec::new();
    for i in 0..64u64 {
        handles.push((i, gw.session().read((1 << 20) + i * 4096, 4096)));
    }
    for (i, h) in handles {
        let Ok(ReplyData::Read(data)) = gw.wait(h).await.unwrap() else {
            panic!("read {i} failed");
        };
        let at = (i * 4096) as usize;
        assert_eq!(data, a[at..at + 4096], "read {i}");
    }
    let t = std::time::Instant::now();
    while alive() < 2 {
        assert!(
            t.elapsed().as_secs() < 10,
            "64 in flight never spilled over"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }

    // TRIM and WRITE_ZEROES reach the upstream (weir advertises both).
    let h = gw.session().write_zeroes(1 << 20, 65536, false);
    gw.wait(h).await.unwrap().unwrap();
    assert_eq!(
        direct.read(1 << 20, 65536).await.unwrap().unwrap(),
        vec![0u8; 65536]
    );
    let h = gw.session().trim(2 << 20, 1 << 20);
    gw.wait(h).await.unwrap().unwrap();
    assert_eq!(
        direct.read(2 << 20, 4096).await.unwrap().unwrap(),
        vec![0u8; 4096]
    );
    // BLOCK_STATUS: the upstream's allocation (written data is not a hole).
    let h = gw.session().block_status(5 << 20, 8192, false);
    match gw.wait(h).await.unwrap().unwrap() {
        ReplyData::BlockStatus(ctx) => {
            let (_, extents) = &ctx[0];
            assert_eq!(extents[0].flags & STATE_HOLE, 0, "{extents:?}");
        }
        other => panic!("block status answered {other:?}"),
    }
    // An upstream hole reads as one through the gateway.
    let h = gw.session().block_status(12 << 20, 65536, false);
    match gw.wait(h).await.unwrap().unwrap() {
        ReplyData::BlockStatus(ctx) => {
            assert_ne!(ctx[0].1[0].flags & STATE_HOLE, 0, "{ctx:?}")
        }
        other => panic!("block status answered {other:?}"),
    }

    // Upstream errors come back as the same NBD errors; reads still work.
    let (mut bad, _) = common::connect(&gateway, "bad").await;
    let e = bad.write(0, &[1; 4096], false).await.unwrap().unwrap_err();
    assert_eq!(e.code, ErrorCode::Io, "{e}");
    assert_eq!(bad.read(0, 4096).await.unwrap().unwrap(), vec![0; 4096]);
    let (mut full, _) = common::connect(&gateway, "full").await;
    let e = full.write(0, &[1; 4096], false).await.unwrap().unwrap_err();
    assert_eq!(e.code, ErrorCode::NoSpc, "{e}");
    // Bounds are checked by the gateway against the upstream's size.
    let e = gw
        .write((16 << 20) - 10, &[1; 20], false)
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::NoSpc);

    // Volume management on an upstream pool.
    {
        let mut store = gateway.state().store();
        let create = |name: &str, size: u64| VolumeCreate {
            name: name.into(),
            size_bytes: size,
            policy: "non-critical".into(),
            pool: Some("gw".into()),
            access_groups: vec![],
            read_only: false,
            description: String::new(),
            cache: Default::default(),
        };
        let r = store.create(create("other", 0)).unwrap();
        assert_eq!(r.size_bytes, 2 << 20, "size 0: the upstream's");
        store.delete("other").unwrap();
        let e = store.create(create("other", 1 << 20)).unwrap_err();
        assert!(
            e.to_string().contains("size comes from the upstream"),
            "{e}"
        );
        let e = store.create(create("nosuch", 0)).unwrap_err();
        assert!(e.to_string().contains("must exist upstream"), "{e}");
        let e = store.resize("vol", 32 << 20).unwrap_err();
        assert!(e.to_string().contains("resize the export there"), "{e}");
        // The pool holds no data: no local capacity to compare with, so never
        // "overcommitted" against the gateway's own file system.
        let gw = weir_server::capacity::pools(&store)
            .into_iter()
            .find(|p| p.name == "gw")
            .unwrap();
        assert_eq!(gw.format, "upstream");
        assert_eq!(
            (gw.capacity_bytes, gw.free_bytes, gw.allocated_bytes),
            (0, 0, 0)
        );
        assert!(!gw.overcommitted && gw.provisioned_bytes > 0, "{gw:?}");
        assert!(weir_server::capacity::overcommit_warning(&store, "gw").is_none());
        let text = weir_server::capacity::render_prometheus(&store);
        assert!(
            text.contains("weir_pool_provisioned_bytes{pool=\"gw\"}")
                && !text.contains("weir_pool_capacity_bytes{pool=\"gw\"}"),
            "{text}"
        );
    }
    // Deleting forgets the mapping only: the upstream keeps the data.
    assert_eq!(direct.read(7 << 20, 4096).await.unwrap().unwrap(), c);

    for c in [gw, alias, direct, bad, full] {
        c.disconnect().await.unwrap();
    }
    gateway.shutdown().await.unwrap();
    upstream.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_gateway_configurations_are_refused_clearly() {
    let (_up_dir, upstream) = common::start_with("gw-upstream-cfg", UPSTREAM).await;
    // A declared size must match the upstream's.
    let dir = common::TempDir::new("gw-size");
    let toml = gateway_toml(
        &upstream,
        "[[volumes]]\nname = \"vol\"\nsize = \"8MiB\"\npolicy = \"non-critical\"\npool = \"gw\"\n",
    );
    let e = RunningServer::start(common::config_from(&toml, dir.path()))
        .await
        .err()
        .unwrap();
    let msg = format!("{e:#}");
    assert!(msg.contains("size = 8388608 declared"), "{msg}");
    // An export the upstream does not have.
    let toml = gateway_toml(
        &upstream,
        "[[volumes]]\nname = \"nosuch\"\npolicy = \"non-critical\"\npool = \"gw\"\n",
    );
    let dir = common::TempDir::new("gw-nosuch");
    let e = RunningServer::start(common::config_from(&toml, dir.path()))
        .await
        .err()
        .unwrap();
    assert!(format!("{e:#}").contains("must exist upstream"), "{e:#}");
    // Keys checked when the file is read.
    for (toml, want) in [
        (
            "[[pools]]\nname = \"g\"\nupstream = \"nbd://h/vol\"\n",
            "no export in the pool's upstream",
        ),
        (
            "[[pools]]\nname = \"g\"\nupstream = \"nbds://h\"\n",
            "nbds:// needs upstream_tls_ca",
        ),
        (
            "[[pools]]\nname = \"g\"\nupstream = \"nbd+unix:///h\"\n",
            "only nbd:// and nbds://",
        ),
        (
            "[[pools]]\nname = \"g\"\nupstream = \"nbd://h\"\nformat = \"thin\"\n",
            "is for local pools",
        ),
        (
            "[[pools]]\nname = \"g\"\nupstream = \"nbd://h\"\nupstream_connections = 0\n",
            "upstream_connections: must be 1-64",
        ),
        (
            "[[pools]]\nname = \"g\"\n[[volumes]]\nname = \"v\"\npolicy = \"non-critical\"\npool = \"g\"\n",
            "size: must be more than 0 bytes",
        ),
        (
            "[[pools]]\nname = \"g\"\n[[volumes]]\nname = \"v\"\nsize = 4096\nexport = \"x\"\npolicy = \"non-critical\"\npool = \"g\"\n",
            "export: only for volumes in a pool with upstream",
        ),
    ] {
        let e = weir_server::WeirConfig::from_toml_str(toml, "w.toml").unwrap_err();
        assert!(e.to_string().contains(want), "{toml}: {e}");
    }
    // A client of a gateway volume sees the flags the gateway serves.
    let (_gw_dir, gateway) = common::start_with(
        "gw-flags",
        &gateway_toml(
            &upstream,
            "[[volumes]]\nname = \"vol\"\npolicy = \"non-critical\"\npool = \"gw\"\n",
        ),
    )
    .await;
    let (c, export) = NbdClient::connect(gateway.nbd_addr(), ClientConfig::go("vol"))
        .await
        .unwrap();
    assert_ne!(export.transmission_flags & FLAG_SEND_FUA, 0);
    c.disconnect().await.unwrap();
    gateway.shutdown().await.unwrap();
    upstream.shutdown().await.unwrap();
}

/// A TCP proxy to `upstream` that stops reading what the gateway sends while
/// `frozen` is set (an upstream whose disks hung: its window closes, then the
/// gateway's send buffer fills).
async fn freezable_proxy(
    upstream: std::net::SocketAddr,
    frozen: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::net::SocketAddr {
    use std::sync::atomic::Ordering;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((down, _)) = listener.accept().await {
            let Ok(up) = tokio::net::TcpStream::connect(upstream).await else {
                return;
            };
            let (mut down_rd, mut down_wr) = down.into_split();
            let (mut up_rd, mut up_wr) = up.into_split();
            let frozen = frozen.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 << 10];
                loop {
                    while frozen.load(Ordering::Acquire) {
                        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                    }
                    match down_rd.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) if up_wr.write_all(&buf[..n]).await.is_ok() => {}
                        Ok(_) => return,
                    }
                }
            });
            tokio::spawn(async move { tokio::io::copy(&mut up_rd, &mut down_wr).await });
        }
    });
    addr
}

/// One upstream that stops reading never holds up another pool's volumes: the
/// gateway's writes to it wait in its connection (a writer thread finishes
/// them), not on the runtime that serves every client. One runtime worker, as
/// `weir serve` runs on 2 CPUs: before, a volume on the healthy upstream got no
/// answer at all until the stalled connection timed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_stalled_upstream_does_not_hold_up_the_other_pools_volumes() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};
    let vol = "[[pools]]\nname = \"default\"\n[[volumes]]\nname = \"vol\"\nsize = \"64MiB\"\npolicy = \"mission-critical\"\n";
    let (_a_dir, up_a) = common::start_with("gw-stall-a", vol).await;
    let (_b_dir, up_b) = common::start_with("gw-stall-b", vol).await;
    let frozen = Arc::new(AtomicBool::new(false));
    let proxy = freezable_proxy(up_b.nbd_addr(), frozen.clone()).await;
    let gw_toml = format!(
        r#"
[[pools]]
name = "pa"
upstream = "nbd://{}"
upstream_timeout_s = 10
[[pools]]
name = "pb"
upstream = "nbd://{proxy}"
upstream_connections = 1
upstream_timeout_s = 10
[[volumes]]
name = "a"
export = "vol"
policy = "mission-critical"
pool = "pa"
[[volumes]]
name = "b"
export = "vol"
policy = "mission-critical"
pool = "pb"
"#,
        up_a.nbd_addr()
    );
    let (_gw_dir, gateway) = common::start_with("gw-stall-gw", &gw_toml).await;
    let (mut a, _) = common::connect(&gateway, "a").await;
    let (mut b, _) = common::connect(&gateway, "b").await;
    let block = pattern(7, 256 << 10);
    b.write(0, &block, false).await.unwrap().unwrap();
    a.read(0, 4096).await.unwrap().unwrap();

    // A reader on `a` throughout, timing every read.
    let reader = tokio::spawn(async move {
        let end = Instant::now() + Duration::from_secs(3);
        let (mut reads, mut longest) = (0u32, Duration::ZERO);
        while Instant::now() < end {
            let t = Instant::now();
            a.read((reads as u64 % 256) * 4096, 4096)
                .await
                .unwrap()
                .unwrap();
            longest = longest.max(t.elapsed());
            reads += 1;
        }
        (reads, longest)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    // `b`'s upstream stops reading; 32 MiB of writes go to it.
    frozen.store(true, Ordering::Release);
    let mut handles = Vec::new();
    for i in 0..128u64 {
        handles.push(b.session().write(i * (256 << 10), &block, false));
        b.send().await.unwrap();
    }
    let (reads, longest) = reader.await.unwrap();
    assert!(
        longest < Duration::from_secs(1) && reads >= 20,
        "volume a beside a stalled upstream: {reads} reads in 3 s, longest {longest:?}"
    );
    // Thawed, every write completes: nothing was lost while it waited.
    frozen.store(false, Ordering::Release);
    for h in handles {
        b.wait(h).await.unwrap().unwrap();
    }
    let (mut direct, _) = common::connect(&up_b, "vol").await;
    assert_eq!(
        direct
            .read(127 * (256 << 10), 256 << 10)
            .await
            .unwrap()
            .unwrap(),
        block
    );
    // While the proxy still runs: shutting down flushes every volume upstream.
    gateway.shutdown().await.unwrap();
}

/// A gateway volume promises its clients no more than its upstream gives: the
/// upstream's alignment and largest request (nbdkit with 512 B / 64 KiB
/// constraints; a larger request is split, an unaligned one refused at the
/// gateway), and a read-only upstream export is read-only here too (writes got
/// EINVAL from upstream, trims a silent success).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upstream_s_block_sizes_and_read_only_flag_pass_through() {
    const UP: &str = "[[pools]]\nname = \"default\"\n[[volumes]]\nname = \"ro\"\nsize = \"1MiB\"\npolicy = \"non-critical\"\nread_only = true\n";
    let (_up_dir, upstream) = common::start_with("gw-upstream-ro", UP).await;
    let gw = "[[volumes]]\nname = \"ro\"\npolicy = \"non-critical\"\npool = \"gw\"\n";
    let (_gw_dir, gateway) = common::start_with("gw-ro", &gateway_toml(&upstream, gw)).await;
    let (mut c, export) = common::connect(&gateway, "ro").await;
    assert!(
        export.transmission_flags & FLAG_READ_ONLY != 0,
        "{export:?}"
    );
    let e = c.write(0, &[1u8; 4096], false).await.unwrap().unwrap_err();
    assert_eq!(e.code, ErrorCode::Perm, "{e}");
    let h = c.session().trim(0, 4096);
    let e = c.wait(h).await.unwrap().unwrap_err();
    assert_eq!(e.code, ErrorCode::Perm, "{e}");
    c.disconnect().await.unwrap();
    gateway.shutdown().await.unwrap();
    upstream.shutdown().await.unwrap();

    if !weir_testkit::require_tool("nbdkit", &["nbdkit"]) {
        return;
    }
    let (_nbdkit, port) = weir_testkit::start_nbdkit(&[
        "memory",
        "4M",
        "--filter=blocksize-policy",
        "blocksize-minimum=512",
        "blocksize-preferred=4096",
        "blocksize-maximum=65536",
        "blocksize-error-policy=error",
    ]);
    let toml = format!(
        "[[pools]]\nname = \"gw\"\nupstream = \"nbd://127.0.0.1:{port}\"\n\
         [[volumes]]\nname = \"k\"\npolicy = \"non-critical\"\npool = \"gw\"\n"
    );
    let (_dir, gateway) = common::start_with("gw-blocksize", &toml).await;
    let (mut c, export) = common::connect(&gateway, "k").await;
    let b = export.block_size.expect("block sizes advertised");
    assert_eq!(
        (b.min_bytes, b.preferred_bytes, b.max_payload_bytes),
        (512, 4096, 65536)
    );
    // Up to the maximum through the gateway; unaligned refused here (the
    // upstream would drop the connection).
    let data = pattern(9, 1 << 20);
    c.write(0, &data[..65536], false).await.unwrap().unwrap();
    assert_eq!(c.read(0, 65536).await.unwrap().unwrap(), data[..65536]);
    let e = c.read(100, 512).await.unwrap().unwrap_err();
    assert_eq!(e.code, ErrorCode::Inval, "{e}");
    c.disconnect().await.unwrap();
    // The volume's own larger requests (a flash cache's, or a client's that
    // connected before the limits were known) are split for the upstream.
    let volume = gateway.state().store().open_volume("k").unwrap();
    let backend = volume.backend.clone();
    let (written, read) = tokio::task::spawn_blocking(move || {
        backend.write(0, &data).unwrap();
        let mut back = vec![0u8; 1 << 20];
        backend.read(0, &mut back).unwrap();
        (data, back)
    })
    .await
    .unwrap();
    assert!(written == read, "a 1 MiB read or write was not split right");
    gateway.shutdown().await.unwrap();
}

/// nbdkit's memory plugin without multi-conn on a free port (killed on drop).
fn nbdkit_without_multi_conn() -> (weir_testkit::Daemon, u16) {
    weir_testkit::start_nbdkit(&[
        "--filter=multi-conn",
        "memory",
        "4M",
        "multi-conn-mode=disable",
    ])
}

/// Waits until the gateway has no live connection to its upstream.
async fn until_no_upstream_connection(gateway: &RunningServer) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while gateway
        .state()
        .store()
        .upstream_snapshots()
        .iter()
        .any(|(_, s)| s.connections_alive > 0)
    {
        assert!(std::time::Instant::now() < deadline, "still connected");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// A FLUSH through a gateway to an upstream without multi-conn is answered
/// only once the upstream answered one: with the upstream gone it fails.
/// Before, it was flushed on each live connection, and with none live it
/// succeeded without reaching anything (the upstream killed after a write,
/// `qemu-io`'s flush said nothing, its next read got EIO).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_is_not_acknowledged_while_the_upstream_is_gone() {
    if !weir_testkit::require_tool("nbdkit", &["nbdkit"]) {
        return;
    }
    let (mut nbdkit, port) = nbdkit_without_multi_conn();
    let toml = format!(
        "[[pools]]\nname = \"gw\"\nupstream = \"nbd://127.0.0.1:{port}\"\n\
         upstream_connections = 2\nupstream_timeout_s = 1\n\
         [[volumes]]\nname = \"k\"\npolicy = \"non-critical\"\npool = \"gw\"\n"
    );
    let (_dir, gateway) = common::start_with("gw-flush-gone", &toml).await;
    let (mut c, _) = common::connect(&gateway, "k").await;
    c.write(0, &pattern(3, 4096), false).await.unwrap().unwrap();
    nbdkit.0.kill().unwrap();
    nbdkit.0.wait().unwrap();
    until_no_upstream_connection(&gateway).await;
    let e = c.flush().await.unwrap().unwrap_err();
    assert_eq!(e.code, ErrorCode::Io, "{e}");
    c.disconnect().await.unwrap();
    // Its shutdown flush fails too (the upstream is gone).
    let _ = gateway.shutdown().await;
}

/// Sends `signal` to `child` (SIGSTOP/SIGCONT to freeze and thaw an upstream).
fn signal(child: &std::process::Child, signal: libc::c_int) {
    // SAFETY: kill(2) on our own child's pid.
    let rc = unsafe { libc::kill(child.id() as libc::pid_t, signal) };
    assert_eq!(rc, 0, "kill({}, {signal})", child.id());
}

/// A request to a stopped upstream (SIGSTOP: its kernel still accepts TCP
/// connections, nothing answers) fails with EIO about `upstream_timeout_s`
/// after it started, both on the connection it was sent on and when the
/// connections are gone and it has to reconnect: its deadline bounds every step
/// (TCP connect, handshake, backoff). Before, a request first waited out the
/// timeout on its connection and was then sent again with a new one, whose
/// reconnect's handshake waited its own 5 s: 7.1 s, then 5.1 s for the ones
/// reconnecting, at `upstream_timeout_s = 2`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_upstream_fails_a_request_within_its_timeout() {
    use std::time::{Duration, Instant};
    if !weir_testkit::require_tool("nbdkit", &["nbdkit"]) {
        return;
    }
    let (nbdkit, port) = weir_testkit::start_nbdkit(&["memory", "4M"]);
    let toml = format!(
        "[[pools]]\nname = \"gw\"\nupstream = \"nbd://127.0.0.1:{port}\"\n\
         upstream_connections = 2\nupstream_timeout_s = 2\n\
         [[volumes]]\nname = \"k\"\npolicy = \"non-critical\"\npool = \"gw\"\n"
    );
    let (_dir, gateway) = common::start_with("gw-stopped", &toml).await;
    let (mut c, _) = common::connect(&gateway, "k").await;
    c.write(0, &pattern(5, 4096), false).await.unwrap().unwrap();
    signal(&nbdkit.0, libc::SIGSTOP);
    let mut took = Vec::new();
    // The first on a live connection, the next ones reconnecting.
    for _ in 0..3 {
        let t = Instant::now();
        let e = c.read(0, 4096).await.unwrap().unwrap_err();
        took.push(t.elapsed());
        assert_eq!(e.code, ErrorCode::Io, "{e}");
    }
    println!("a read against a stopped upstream (timeout 2 s) took {took:?}");
    signal(&nbdkit.0, libc::SIGCONT);
    for t in &took {
        assert!(
            *t >= Duration::from_millis(1500) && *t < Duration::from_millis(3200),
            "reads against a stopped upstream took {took:?} (upstream_timeout_s = 2)"
        );
    }
    // Thawed, the volume answers again.
    let back = c.read(0, 4096).await.unwrap().unwrap();
    assert_eq!(back, pattern(5, 4096));
    c.disconnect().await.unwrap();
    gateway.shutdown().await.unwrap();
}

/// An upstream that answers every request but one (nbdkit's eval plugin whose
/// read of one block never returns) fails that one with EIO about
/// `upstream_timeout_s` after it was sent, even while the others' replies keep
/// coming on its connection. Before, the connection's watchdog only looked at
/// its requests when a read of the socket timed out: another client's steady
/// reads on the same connection held the unanswered one for as long as they
/// went on, and then it was sent again with a new timeout (6.0 s with 4 s of
/// them, at `upstream_timeout_s = 1`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_unanswered_request_times_out_while_others_are_answered() {
    use std::time::{Duration, Instant};
    if !weir_testkit::require_tool("nbdkit", &["nbdkit"]) {
        return;
    }
    let (_nbdkit, port) = weir_testkit::start_nbdkit(&[
        "eval",
        "get_size=echo 4M",
        "thread_model=echo parallel",
        "pread=if [ $4 -eq 1048576 ]; then sleep 60; fi; \
         dd if=/dev/zero count=$3 iflag=count_bytes status=none",
    ]);
    let toml = format!(
        "[[pools]]\nname = \"gw\"\nupstream = \"nbd://127.0.0.1:{port}\"\n\
         upstream_connections = 1\nupstream_timeout_s = 1\n\
         [[volumes]]\nname = \"k\"\npolicy = \"non-critical\"\npool = \"gw\"\n"
    );
    let (_dir, gateway) = common::start_with("gw-one-unanswered", &toml).await;
    let (mut busy, _) = common::connect(&gateway, "k").await;
    let (mut stuck, _) = common::connect(&gateway, "k").await;
    busy.read(0, 4096).await.unwrap().unwrap();
    let steady = tokio::spawn(async move {
        let end = Instant::now() + Duration::from_secs(4);
        while Instant::now() < end {
            let _ = busy.read(0, 4096).await.unwrap();
        }
    });
    let t = Instant::now();
    let e = stuck.read(1 << 20, 4096).await.unwrap().unwrap_err();
    let took = t.elapsed();
    println!("the unanswered read failed after {took:?} (upstream_timeout_s = 1)");
    assert_eq!(e.code, ErrorCode::Io, "{e}");
    assert!(
        took < Duration::from_millis(2500),
        "an unanswered read took {took:?} (upstream_timeout_s = 1)"
    );
    steady.await.unwrap();
    gateway.shutdown().await.unwrap();
}

/// Serves one export `k` of 1 MiB and answers every request with a reply for
/// another handle (a protocol violation: the gateway closes the connection).
fn serve_wrong_handles(mut s: std::net::TcpStream) {
    use std::io::{Read, Write};
    use weir_nbd::{ExportDescription, HandshakeEvent, ServerHandshake};
    let exports = vec![ExportDescription::new("k", 1 << 20)];
    let mut hs = ServerHandshake::new();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        if s.write_all(&hs.take_output()).is_err() {
            return;
        }
        let n = match s.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        match hs.input(&buf[..n], &exports) {
            Ok(Some(HandshakeEvent::ExportChosen(_))) => break,
            Ok(_) => {}
            Err(_) => return,
        }
    }
    let _ = s.write_all(&hs.take_output());
    let mut pending = hs.take_leftover();
    loop {
        while pending.len() >= 28 {
            let kind = u16::from_be_bytes(pending[6..8].try_into().unwrap());
            let handle = u64::from_be_bytes(pending[8..16].try_into().unwrap());
            let length = u32::from_be_bytes(pending[24..28].try_into().unwrap()) as usize;
            let total = 28 + if kind == CMD_WRITE { length } else { 0 };
            if pending.len() < total {
                break;
            }
            pending.drain(..total);
            let mut reply = 0x6744_6698u32.to_be_bytes().to_vec();
            reply.extend_from_slice(&0u32.to_be_bytes());
            reply.extend_from_slice(&(handle ^ 0xdead).to_be_bytes());
            if s.write_all(&reply).is_err() {
                return;
            }
        }
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => pending.extend_from_slice(&buf[..n]),
        }
    }
}

/// An upstream that completes the handshake, then answers with protocol
/// violations: a request fails with EIO after `upstream_timeout_s`, and the
/// gateway backs off between the connections it opens meanwhile instead of
/// reconnecting in a loop. Before, each lost connection was replaced at once:
/// 371 connections (and as many unlimited "protocol error" warnings) in the
/// request's 1 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_breaking_the_protocol_is_not_reconnected_in_a_loop() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{Duration, Instant};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicU64::new(0));
    let counter = accepted.clone();
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(s) = s else { return };
            counter.fetch_add(1, Ordering::Relaxed);
            std::thread::spawn(move || serve_wrong_handles(s));
        }
    });
    let toml = format!(
        "[[pools]]\nname = \"gw\"\nupstream = \"nbd://{addr}\"\n\
         upstream_connections = 1\nupstream_timeout_s = 1\n\
         [[volumes]]\nname = \"k\"\npolicy = \"non-critical\"\npool = \"gw\"\n"
    );
    let (_dir, gateway) = common::start_with("gw-wrong-handles", &toml).await;
    let (mut c, _) = common::connect(&gateway, "k").await;
    let before = accepted.load(Ordering::Relaxed);
    let t = Instant::now();
    let e = c.read(0, 4096).await.unwrap().unwrap_err();
    let took = t.elapsed();
    let opened = accepted.load(Ordering::Relaxed) - before;
    println!("a read from a protocol-breaking upstream: EIO after {took:?}, {opened} connections");
    assert_eq!(e.code, ErrorCode::Io, "{e}");
    assert!(took < Duration::from_millis(1500), "{took:?}");
    assert!(opened <= 10, "{opened} connections opened in {took:?}");
    c.disconnect().await.unwrap();
    let _ = gateway.shutdown().await;
}
