//! Hardening (issue 15): hostile and broken clients, and the defects listed
//! there — each test here fails without its fix.
//! - Bogus declared lengths (an option of 4 GiB, a WRITE of 4 GiB - 1) are
//!   refused at once, not read and discarded until a timeout.
//! - Connection caps: a client over `max_connections_per_host` or
//!   `max_connections` is refused with the reason, and served once there is room.
//! - `idle_timeout_s` closes idle connections, not busy ones.
//! - Fault injection reaches only the requests it hits.
//! - Files 0600, directories 0700; `weir-meta.json` is not rewritten at start.
//! - Descriptions with control characters and unenforceable policy figures are
//!   refused with a clear error.
//!
//! Bounded memory under a client that reads no replies: `tests/unread_replies.rs`
//! (alone in its process, as it measures the process's memory).

mod common;

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use weir_nbd::consts::*;
use weir_nbd::{ClientConfig, ErrorCode};
use weir_server::nbd_client::NbdClient;

/// Connects (from `from`, if given) and sends the client flags after the greeting.
async fn raw_start(addr: SocketAddr, from: Option<IpAddr>) -> TcpStream {
    let mut s = match from {
        None => TcpStream::connect(addr).await.unwrap(),
        Some(ip) => {
            let socket = TcpSocket::new_v4().unwrap();
            socket.bind(SocketAddr::new(ip, 0)).unwrap();
            socket.connect(addr).await.unwrap()
        }
    };
    let mut greeting = [0u8; 18];
    s.read_exact(&mut greeting).await.unwrap();
    assert_eq!(&greeting[..8], b"NBDMAGIC");
    let flags = FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES;
    s.write_all(&flags.to_be_bytes()).await.unwrap();
    s
}

fn option(option: u32, declared_len: u32, data: &[u8]) -> Vec<u8> {
    let mut v = IHAVEOPT.to_be_bytes().to_vec();
    v.extend_from_slice(&option.to_be_bytes());
    v.extend_from_slice(&declared_len.to_be_bytes());
    v.extend_from_slice(data);
    v
}

/// Reads option replies until an ACK or an error: (type, data) of the last one.
async fn option_reply(s: &mut TcpStream) -> (u32, Vec<u8>) {
    loop {
        let mut h = [0u8; 20];
        s.read_exact(&mut h).await.unwrap();
        let kind = u32::from_be_bytes(h[12..16].try_into().unwrap());
        let mut data = vec![0u8; u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize];
        s.read_exact(&mut data).await.unwrap();
        if kind == REP_ACK || kind & REP_ERR_BIT != 0 {
            return (kind, data);
        }
    }
}

/// A connection in transmission on `volume` (simple replies).
async fn raw_go(addr: SocketAddr, volume: &str) -> TcpStream {
    raw_go_from(addr, None, volume).await
}

/// [`raw_go`] from the client address `from`, if given.
async fn raw_go_from(addr: SocketAddr, from: Option<IpAddr>, volume: &str) -> TcpStream {
    let mut s = raw_start(addr, from).await;
    let mut go = (volume.len() as u32).to_be_bytes().to_vec();
    go.extend_from_slice(volume.as_bytes());
    go.extend_from_slice(&0u16.to_be_bytes());
    s.write_all(&option(OPT_GO, go.len() as u32, &go))
        .await
        .unwrap();
    assert_eq!(option_reply(&mut s).await.0, REP_ACK);
    s
}

fn request(command: u16, handle: u64, offset: u64, length: u32) -> [u8; REQUEST_HEADER_LEN] {
    weir_nbd::RequestHeader {
        flags: 0,
        command,
        handle,
        offset,
        length,
    }
    .encode()
}

/// Everything the server sends until it closes (or resets) the connection, and
/// how long that took (panics after `limit`: the server did not close).
async fn until_closed(s: &mut TcpStream, limit: Duration) -> (Vec<u8>, Duration) {
    let t = Instant::now();
    let mut rest = Vec::new();
    let read = tokio::time::timeout(limit, s.read_to_end(&mut rest)).await;
    assert!(
        read.is_ok(),
        "the server kept the connection open for {limit:?}"
    );
    (rest, t.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bogus_lengths_are_refused_at_once() {
    let (_dir, server) = common::start_with(
        "bogus",
        "[[volumes]]\nname = \"v\"\nsize = \"64MiB\"\npolicy = \"non-critical\"\n",
    )
    .await;
    let addr = server.nbd_addr();
    // An option declaring 4 GiB - 1 bytes, none of which follow.
    let mut s = raw_start(addr, None).await;
    s.write_all(&option(OPT_INFO, u32::MAX, &[])).await.unwrap();
    let (rest, took) = until_closed(&mut s, Duration::from_secs(5)).await;
    println!("option of 4 GiB - 1: refused and closed after {took:?}");
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert!(rest.len() >= 20, "no reply before the close");
    assert_eq!(
        u32::from_be_bytes(rest[12..16].try_into().unwrap()),
        REP_ERR_TOO_BIG
    );
    // A WRITE declaring 4 GiB - 1 bytes, 4 KiB of which are sent, then a stall.
    let mut s = raw_go(addr, "v").await;
    s.write_all(&request(CMD_WRITE, 77, 0, u32::MAX))
        .await
        .unwrap();
    s.write_all(&[0xee; 4096]).await.unwrap();
    let (rest, took) = until_closed(&mut s, Duration::from_secs(5)).await;
    println!("WRITE of 4 GiB - 1: refused and closed after {took:?}");
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert_eq!(
        rest.len(),
        SIMPLE_REPLY_LEN,
        "one simple reply, then the close"
    );
    assert_eq!(
        u32::from_be_bytes(rest[..4].try_into().unwrap()),
        SIMPLE_REPLY_MAGIC
    );
    assert_eq!(
        u32::from_be_bytes(rest[4..8].try_into().unwrap()),
        22,
        "EINVAL"
    );
    assert_eq!(u64::from_be_bytes(rest[8..16].try_into().unwrap()), 77);
    // Up to the advertised maximum (now 64 MiB, as nbdkit) a WRITE is served.
    let (mut c, export) = common::connect(&server, "v").await;
    let max = export.block_size.unwrap().max_payload_bytes;
    assert_eq!(max, 64 << 20);
    let data: Vec<u8> = (0..48u32 << 20).map(|i| (i % 253) as u8).collect();
    c.write(0, &data, false).await.unwrap().unwrap();
    assert!(c.read(0, 48 << 20).await.unwrap().unwrap() == data);
    c.disconnect().await.unwrap();
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_over_a_connection_cap_are_refused_with_the_reason() {
    let (_dir, server) = common::start_with(
        "caps",
        "max_connections = 3\nmax_connections_per_host = 2\n\
         [[volumes]]\nname = \"v\"\nsize = \"1MiB\"\npolicy = \"non-critical\"\n",
    )
    .await;
    let addr = server.nbd_addr();
    let host = |last: u8| Some(IpAddr::from([127, 0, 0, last]));
    let connect = |from: Option<IpAddr>| NbdClient::connect_from(from, addr, ClientConfig::go("v"));
    let (a1, _) = connect(host(1)).await.unwrap();
    let (_a2, _) = connect(host(1)).await.unwrap();
    let e = connect(host(1))
        .await
        .err()
        .expect("a third connection of 127.0.0.1");
    assert!(
        format!("{e:#}")
            .contains("too many connections from 127.0.0.1 (max_connections_per_host = 2)"),
        "{e:#}"
    );
    let (_b1, _) = connect(host(2)).await.unwrap();
    let e = connect(host(3)).await.err().expect("a fourth connection");
    assert!(
        format!("{e:#}").contains("connection limit (max_connections = 3)"),
        "{e:#}"
    );
    // Room again once a connection closes.
    a1.disconnect().await.unwrap();
    let t = Instant::now();
    let mut c = loop {
        match connect(host(3)).await {
            Ok((c, _)) => break c,
            Err(_) if t.elapsed() < Duration::from_secs(2) => {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            Err(e) => panic!("not served after a slot was freed: {e:#}"),
        }
    };
    c.write(0, b"served", false).await.unwrap().unwrap();
    let metrics = server.admin_client().metrics().await.unwrap();
    assert!(metrics.contains("weir_connections 3\n"), "{metrics}");
    assert!(metrics.contains("weir_connections_max 3\n"), "{metrics}");
    let refused: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("weir_connections_refused_total "))
        .and_then(|n| n.parse().ok())
        .expect("refusals counted");
    assert!(refused >= 2, "{metrics}");
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_timeout_closes_idle_connections_not_busy_ones() {
    let (_dir, server) = common::start_with(
        "idle",
        r#"idle_timeout_s = 1
[[pools]]
name = "default"
[[pools]]
name = "slow"
[[pools.faults]]
kind = "latency"
ops = ["read"]
every = 1
latency_ms = 1800
[[volumes]]
name = "v"
size = "1MiB"
policy = "non-critical"
[[volumes]]
name = "slow"
size = "1MiB"
policy = "non-critical"
pool = "slow"
"#,
    )
    .await;
    let addr = server.nbd_addr();
    // Idle: closed after about a second.
    let mut idle = raw_go(addr, "v").await;
    let (rest, took) = until_closed(&mut idle, Duration::from_secs(5)).await;
    println!("idle connection closed after {took:?}");
    assert!(rest.is_empty());
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(3),
        "{took:?}"
    );
    // A client waiting 1.8 s on its read is not idle; one that sends a request
    // every half second is not either.
    let (mut slow, _) = common::connect(&server, "slow").await;
    let (mut steady, _) = common::connect(&server, "v").await;
    let reading = tokio::spawn(async move {
        let r = slow.read(0, 4096).await;
        (r, slow)
    });
    for _ in 0..5 {
        steady.read(0, 4096).await.unwrap().unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (r, slow) = reading.await.unwrap();
    assert_eq!(r.unwrap().unwrap(), vec![0u8; 4096]);
    slow.disconnect().await.unwrap();
    steady.disconnect().await.unwrap();
    // A client that reads none of its replies is closed too (its writer stalls).
    let mut deaf = raw_go(addr, "v").await;
    for h in 0..400u64 {
        deaf.write_all(&request(CMD_READ, h, 0, 1 << 20))
            .await
            .unwrap();
    }
    // Without reading: the server's writer stalls, and gives up after a second.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (_, took) = until_closed(&mut deaf, Duration::from_secs(3)).await;
    assert!(
        took < Duration::from_secs(1),
        "deaf client kept: {took:?} more"
    );
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_faults_reach_only_the_requests_they_hit() {
    let (_dir, server) = common::start_with(
        "faults",
        r#"[[pools]]
name = "default"
[[pools]]
name = "faulty"
[[pools.faults]]
kind = "eio"
ops = ["write"]
every = 7
[[pools.faults]]
kind = "enospc"
ops = ["flush"]
every = 2
[[volumes]]
name = "healthy"
size = "4MiB"
policy = "non-critical"
[[volumes]]
name = "faulty"
size = "4MiB"
policy = "non-critical"
pool = "faulty"
"#,
    )
    .await;
    let (mut f, _) = common::connect(&server, "faulty").await;
    let (mut h, _) = common::connect(&server, "healthy").await;
    let block = |i: u64| vec![(i % 250) as u8 + 1; 4096];
    // 140 pipelined writes on each volume at once.
    let mut handles = Vec::new();
    for i in 0..140u64 {
        handles.push(f.session().write(i * 4096, &block(i), false));
        h.session().write(i * 4096, &block(i), false);
    }
    let healthy = tokio::spawn(async move {
        let mut errors = 0;
        for _ in 0..140 {
            errors += h.next_completion().await.unwrap().result.is_err() as u32;
        }
        (errors, h)
    });
    let mut failed = Vec::new();
    for _ in 0..140 {
        let c = f.next_completion().await.unwrap();
        if let Err(e) = c.result {
            assert_eq!(e.code, ErrorCode::Io, "{e}");
            failed.push(c.handle);
        }
    }
    let (healthy_errors, mut h) = healthy.await.unwrap();
    assert_eq!(failed.len(), 20, "every 7th write of 140 fails");
    assert_eq!(healthy_errors, 0, "the other pool's volume is untouched");
    // Every write that succeeded is there; the failed ones left their blocks empty.
    for (i, handle) in handles.iter().enumerate() {
        let data = f.read(i as u64 * 4096, 4096).await.unwrap().unwrap();
        let expect = if failed.contains(handle) {
            vec![0; 4096]
        } else {
            block(i as u64)
        };
        assert!(data == expect, "block {i}");
    }
    // Every second FLUSH fails with ENOSPC; the connection goes on.
    let codes: Vec<_> = [(); 4]
        .iter()
        .map(|_| f.session().flush())
        .collect::<Vec<_>>();
    let mut flush_errors = 0;
    for _ in &codes {
        if let Err(e) = f.next_completion().await.unwrap().result {
            assert_eq!(e.code, ErrorCode::NoSpc);
            flush_errors += 1;
        }
    }
    assert_eq!(flush_errors, 2);
    h.flush().await.unwrap().unwrap();
    f.write(0, b"still serving", false).await.unwrap().unwrap();
    server.shutdown().await.unwrap();
}

fn mode(path: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

fn inode(path: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).unwrap().ino()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_are_private_and_metadata_is_not_rewritten_at_start() {
    let dir = common::TempDir::new("modes");
    let data = dir.join("data");
    let config = || common::config_from(common::TEST_CONFIG, &data);
    let server = weir_server::RunningServer::start(config()).await.unwrap();
    let admin = server.admin_client();
    admin
        .create_volume(&weir_server::VolumeCreate {
            name: "later".into(),
            size_bytes: 1 << 20,
            policy: "non-critical".into(),
            pool: None,
            access_groups: vec![],
            read_only: false,
            description: String::new(),
            cache: Default::default(),
        })
        .await
        .unwrap();
    server.shutdown().await.unwrap();
    let pool = data.join("pools/default");
    for d in [&data, &data.join("pools"), &pool] {
        assert_eq!(mode(d), 0o700, "{}", d.display());
    }
    let meta = data.join("weir-meta.json");
    for f in [&meta, &pool.join("open.img"), &pool.join("later.img")] {
        assert_eq!(mode(f), 0o600, "{}", f.display());
    }
    // Files an older version left readable by others are made private.
    use std::os::unix::fs::PermissionsExt;
    for f in [&meta, &pool.join("open.img")] {
        std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let server = weir_server::RunningServer::start(config()).await.unwrap();
    server.shutdown().await.unwrap();
    for f in [&meta, &pool.join("open.img")] {
        assert_eq!(mode(f), 0o600, "{} not made private", f.display());
    }
    // A restart with the same configuration leaves the metadata file alone (a
    // server stopped on a full file system must start again) …
    let before = (inode(&meta), std::fs::read(&meta).unwrap());
    let server = weir_server::RunningServer::start(config()).await.unwrap();
    server.shutdown().await.unwrap();
    assert_eq!(
        before,
        (inode(&meta), std::fs::read(&meta).unwrap()),
        "rewritten"
    );
    // … and rewrites it when the configuration adds something.
    let mut more = config();
    more.volumes.push(weir_server::config::VolumeConfig {
        name: "new".into(),
        size: weir_server::config::ByteSize(1 << 20),
        policy: "non-critical".into(),
        pool: "default".into(),
        access_groups: vec![],
        read_only: false,
        description: String::new(),
        export: None,
        cache: Default::default(),
    });
    let server = weir_server::RunningServer::start(more).await.unwrap();
    server.shutdown().await.unwrap();
    assert_ne!(before.0, inode(&meta));
    assert!(
        String::from_utf8(std::fs::read(&meta).unwrap())
            .unwrap()
            .contains("\"new\"")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_characters_and_unenforceable_policies_are_refused() {
    let text = "[[volumes]]\nname = \"v\"\nsize = 4096\npolicy = \"non-critical\"\n\
                description = \"evil\\u001b[2J\"\n";
    let e = weir_server::WeirConfig::from_toml_str(text, "w.toml").unwrap_err();
    assert_eq!(e.line, Some(2), "{e}");
    assert!(
        e.message
            .contains("description: must not contain control characters"),
        "{e}"
    );
    let text = "[[policies]]\nname = \"p\"\nlimit_mbps = 1e-300\n";
    let e = weir_server::WeirConfig::from_toml_str(text, "w.toml").unwrap_err();
    assert!(
        e.message
            .contains("limit_mbps must be 0.01-1000000 (MB/s), got 1e-300"),
        "{e}"
    );
    let (_dir, server) = common::start_with("refuse", common::TEST_CONFIG).await;
    let admin = server.admin_client();
    let change = weir_server::VolumeUpdate {
        description: Some("bell\u{7}".into()),
        cache: None,
        ..Default::default()
    };
    let e = admin.update_volume("open", &change).await.unwrap_err();
    assert!(e.to_string().contains("control characters"), "{e}");
    let policy = weir_qos::Policy {
        limit_mbps: Some(1e-300),
        ..weir_qos::Policy::best_effort("tiny")
    };
    let e = admin.create_policy(&policy).await.unwrap_err();
    assert!(e.to_string().contains("limit_mbps must be"), "{e}");
    server.shutdown().await.unwrap();
}

/// Two connections of one host that read no replies share the host's data
/// budget (`max_buffered_mib_per_host`); another host is served meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hosts_connections_share_its_data_budget() {
    let (_dir, server) = common::start_with(
        "host-budget",
        "max_buffered_mib_per_host = 64\n\
         [[volumes]]\nname = \"v\"\nsize = \"64MiB\"\npolicy = \"non-critical\"\n",
    )
    .await;
    let addr = server.nbd_addr();
    let mut deaf = Vec::new();
    for _ in 0..2 {
        let mut s = raw_go(addr, "v").await;
        for h in 0..128u64 {
            s.write_all(&request(CMD_READ, h, (h % 64) << 20, 1 << 20))
                .await
                .unwrap();
        }
        deaf.push(s);
    }
    let counters = server.state().metrics.volume("v");
    let mut last = u64::MAX;
    loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = counters.snapshot().read_ios;
        if now == last {
            break;
        }
        last = now;
    }
    println!("two deaf connections of one host: {last} of 256 1 MiB READs answered");
    // 64 MiB of the host's budget, plus what the socket buffers took; each
    // connection alone could have held 128.
    assert!(last <= 100, "{last} replies made for one host");
    let (mut other, _) = NbdClient::connect_from(
        Some(IpAddr::from([127, 0, 0, 2])),
        addr,
        ClientConfig::go("v"),
    )
    .await
    .unwrap();
    let t = Instant::now();
    other.read(0, 1 << 20).await.unwrap().unwrap();
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    drop(deaf);
    server.shutdown().await.unwrap();
}

/// A 128 MiB server data budget, 64 MiB per client address, one 64 MiB volume.
const SMALL_BUDGETS: &str = "max_buffered_mib = 128\n\
     max_buffered_mib_per_host = 64\n\
     [[volumes]]\nname = \"v\"\nsize = \"64MiB\"\npolicy = \"non-critical\"\n";

/// Clients that declare large WRITEs and never send their data hold their own
/// and their hosts' data budgets, not the server's: with three such hosts over a
/// 128 MiB server budget (each host's 64 MiB), another host still reads at once.
/// (Before, each declared WRITE took its whole length from the server's budget
/// before its data arrived: 100 bytes of it from enough addresses stalled every
/// client of the server.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_that_never_send_their_data_do_not_stall_the_server() {
    let (_dir, server) = common::start_with("trickle-budget", SMALL_BUDGETS).await;
    let addr = server.nbd_addr();
    let mut tricklers = Vec::new();
    for host in 2..5u8 {
        let mut s = raw_go_from(addr, Some(IpAddr::from([127, 0, 0, host])), "v").await;
        s.write_all(&request(CMD_WRITE, 1, 0, 64 << 20))
            .await
            .unwrap();
        s.write_all(&[0x5a; 100]).await.unwrap();
        tricklers.push(s);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (mut other, _) = NbdClient::connect_from(
        Some(IpAddr::from([127, 0, 0, 1])),
        addr,
        ClientConfig::go("v"),
    )
    .await
    .unwrap();
    let t = Instant::now();
    let read = tokio::time::timeout(Duration::from_secs(5), other.read(0, 1 << 20)).await;
    let data = read
        .expect("a READ waited behind the tricklers")
        .unwrap()
        .unwrap();
    assert_eq!(data.len(), 1 << 20);
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    // A whole 64 MiB WRITE from that host lands meanwhile too.
    let big = vec![7u8; 64 << 20];
    let wrote = tokio::time::timeout(Duration::from_secs(20), other.write(0, &big, false)).await;
    wrote
        .expect("a WRITE waited behind the tricklers")
        .unwrap()
        .unwrap();
    drop(tricklers);
    server.shutdown().await.unwrap();
}

/// Clients that read no replies, from enough addresses to fill the server's data
/// budget (five hosts of 32 MiB — half of each one's 64 MiB is all its requests
/// to one pool may hold — over 128 MiB), are disconnected once it has given
/// nothing back for `REPLY_STALL` while others wait; another host is then
/// served. (Before, it waited for as long as they stayed connected.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deaf_clients_that_fill_the_server_budget_are_shed() {
    let (_dir, server) = common::start_with("deaf-budget", SMALL_BUDGETS).await;
    let addr = server.nbd_addr();
    let mut deaf = Vec::new();
    for host in 2..7u8 {
        let mut s = raw_go_from(addr, Some(IpAddr::from([127, 0, 0, host])), "v").await;
        for h in 0..96u64 {
            s.write_all(&request(CMD_READ, h, (h % 64) << 20, 1 << 20))
                .await
                .unwrap();
        }
        deaf.push(s);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (mut other, _) = NbdClient::connect_from(
        Some(IpAddr::from([127, 0, 0, 1])),
        addr,
        ClientConfig::go("v"),
    )
    .await
    .unwrap();
    let t = Instant::now();
    let stall = weir_server::session::REPLY_STALL;
    let read = tokio::time::timeout(stall * 3, other.read(0, 1 << 20)).await;
    read.expect("never served beside the deaf clients")
        .unwrap()
        .unwrap();
    println!("served after {:?} beside five deaf hosts", t.elapsed());
    // Deaf connections were closed (enough of them: one whose requests merely
    // waited for the budget may be served once the others are gone): reading
    // them ends, after what the socket buffers held.
    let mut closed = 0;
    for mut s in deaf {
        let mut sink = vec![0u8; 1 << 20];
        let ended = tokio::time::timeout(Duration::from_secs(2), async {
            while s.read(&mut sink).await.is_ok_and(|n| n > 0) {}
        })
        .await;
        closed += ended.is_ok() as u32;
    }
    assert!(closed >= 1, "no deaf connection was closed");
    server.shutdown().await.unwrap();
}

/// A healthy pool (volume `healthy`) and a pool `stalled` whose `op`s take 2 s
/// (volume `stalled` of `size`): `server` lines first, `pool` lines in its table.
fn stalled_pool_toml(server: &str, pool: &str, op: &str, size: &str) -> String {
    format!(
        "{server}\n[[pools]]\nname = \"default\"\n[[pools]]\nname = \"stalled\"\n{pool}\n\
         [[pools.faults]]\nkind = \"latency\"\nlatency_ms = 2000\nops = [\"{op}\"]\nevery = 1\n\
         {}{}",
        common::volume_toml("healthy", "4MiB", "non-critical", "default"),
        common::volume_toml("stalled", size, "non-critical", "stalled"),
    )
}

/// A pool whose device stopped answering (2 s per read) with `qos = false`
/// holds at most its `max_in_flight` of the runtime's blocking threads; the other
/// pool's requests that need one (a FLUSH: an fsync) are served at once. Before,
/// 600 pipelined reads took all 512 of them and a FLUSH on the healthy pool
/// waited for the stalled reads (2 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_pool_does_not_take_the_other_pools_threads() {
    let (_dir, server) = common::start_with(
        "stalled-pool",
        &stalled_pool_toml("", "qos = false\nmax_in_flight = 256", "read", "4MiB"),
    )
    .await;
    let (mut h, _) = common::connect(&server, "healthy").await;
    h.write(0, &[7u8; 4096], false).await.unwrap().unwrap();
    let mut stalled = Vec::new();
    for _ in 0..3 {
        let (mut s, _) = common::connect(&server, "stalled").await;
        let handles: Vec<u64> = (0..200u64)
            .map(|i| s.session().read(i * 4096, 4096))
            .collect();
        s.send().await.unwrap();
        stalled.push((s, handles));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t = Instant::now();
    h.write(4096, &[8u8; 4096], false).await.unwrap().unwrap();
    h.flush().await.unwrap().unwrap();
    let took = t.elapsed();
    assert!(
        took < Duration::from_millis(1000),
        "a write and a FLUSH on the healthy pool took {took:?} beside 600 stalled reads"
    );
    // The stalled pool's reads all complete, in turns of 256.
    for (mut s, handles) in stalled {
        for h in handles {
            s.wait(h).await.unwrap().unwrap();
        }
    }
    server.shutdown().await.unwrap();
}

/// A pool whose device stopped answering (2 s per write) holds at most half of a
/// host's data budget with the writes its clients queue; the same host's writes to
/// another pool are served at once. Before, the stalled pool's writes took the
/// whole host budget and a write on the healthy pool waited for them (≈ 2 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_pool_holds_only_its_share_of_a_hosts_data_budget() {
    let (_dir, server) = common::start_with(
        "stalled-pool-data",
        &stalled_pool_toml("max_buffered_mib_per_host = 64", "", "write", "64MiB"),
    )
    .await;
    let (mut h, _) = common::connect(&server, "healthy").await;
    h.write(0, &[7u8; 4096], false).await.unwrap().unwrap();
    // 80 MiB of writes to the stalled pool from this host (its budget: 64 MiB).
    let block = vec![9u8; 1 << 20];
    let mut stalled = Vec::new();
    for c in 0..2u64 {
        let (mut s, _) = common::connect(&server, "stalled").await;
        let handles: Vec<u64> = (0..40u64)
            .map(|i| {
                s.session()
                    .write((c * 40 + i) % 64 * (1 << 20), &block, false)
            })
            .collect();
        let sender = tokio::spawn(async move {
            s.send().await.unwrap();
            s
        });
        stalled.push((sender, handles));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t = Instant::now();
    h.write(4096, &vec![8u8; 256 << 10], false)
        .await
        .unwrap()
        .unwrap();
    let took = t.elapsed();
    assert!(
        took < Duration::from_millis(1000),
        "a write on the healthy pool took {took:?} beside 80 MiB of stalled writes"
    );
    for (sender, handles) in stalled {
        let mut s = sender.await.unwrap();
        for h in handles {
            s.wait(h).await.unwrap().unwrap();
        }
    }
    server.shutdown().await.unwrap();
}
