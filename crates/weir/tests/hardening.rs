//! Hardening of the real binary (issue 15), each test failing without its fix:
//! - a SIGTERM as soon as the NBD listener accepts stops the server cleanly
//!   (exit 0), not by the signal's default action;
//! - a server stopped on a full file system starts again (its metadata is not
//!   rewritten when unchanged);
//! - a client host that went down without closing its connection gives back
//!   the exclusive lease it held (TCP keepalive), also when it went down with
//!   replies on their way to it or its receive window closed (the dead-peer
//!   watch), and a live one that reads no replies for a while is not taken for
//!   dead;
//! - a flood of idle connections, four times the server's descriptors, leaves
//!   another host served (or refused with the reason) within a second, the accept
//!   loop idle and the log small.
//!
//! The full-size runs are ignored here and run by `bench/hardening.sh`
//! (docs/HARDENING.md): `bench_unread_replies` (a client pipelining 1,000,000
//! READs of 60 KiB without reading replies: server RSS, other clients'
//! throughput) and `bench_idle_flood` (20,000 idle connections against a
//! 1,024-descriptor limit). `WEIR_BIN` runs them on another build.

mod common;

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use common::{TempDir, WeirProcess, rss_mib};
use tokio::net::{TcpSocket, TcpStream};
use weir_nbd::ClientConfig;
use weir_server::nbd_client::NbdClient;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A TCP connection to `addr` from the local address `from`.
async fn connect_from(from: IpAddr, addr: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(from, 0))?;
    socket.connect(addr).await
}

/// CPU seconds (user + system) process `pid` has used.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which is in parentheses): 14th and 15th overall.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// A well-behaved client from `from`: opens `volume` and reads 4 KiB. `Ok(true)`:
/// served; `Ok(false)`: refused with the connection-cap reason; and how long
/// either took.
async fn well_behaved(
    from: IpAddr,
    addr: SocketAddr,
    volume: &str,
) -> (Result<bool, String>, Duration) {
    let t = Instant::now();
    let attempt = async {
        match NbdClient::connect_from(Some(from), addr, ClientConfig::go(volume)).await {
            Ok((mut c, _)) => {
                c.read(0, 4096)
                    .await
                    .map_err(|e| format!("{e:#}"))?
                    .map_err(|e| e.to_string())?;
                let _ = c.disconnect().await;
                Ok(true)
            }
            Err(e) if format!("{e:#}").contains("max_connections") => Ok(false),
            Err(e) => Err(format!("{e:#}")),
        }
    };
    let r = tokio::time::timeout(Duration::from_secs(5), attempt)
        .await
        .unwrap_or_else(|_| Err("no answer within 5 s".into()));
    (r, t.elapsed())
}

/// Opens `count` connections to `addr` spread over `hosts`, and keeps them.
async fn idle_connections(addr: SocketAddr, hosts: &[IpAddr], count: usize) -> Vec<TcpStream> {
    let mut v = Vec::with_capacity(count);
    for i in 0..count {
        match connect_from(hosts[i % hosts.len()], addr).await {
            Ok(s) => v.push(s),
            Err(e) => panic!("connection {i} of the flood: {e}"),
        }
    }
    v
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `weir serve` with its NBD listener on a chosen port, admin on an ephemeral one.
fn spawn_on_port(dir: &std::path::Path, port: u16) -> std::process::Child {
    let config = dir.join("weir.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:{port}\"\nadmin_listen = \"127.0.0.1:0\"\n\
             [[volumes]]\nname = \"v\"\nsize = \"1MiB\"\npolicy = \"non-critical\"\n"
        ),
    )
    .unwrap();
    std::process::Command::new(common::weir_bin())
        .arg("serve")
        .arg("--config")
        .arg(&config)
        .arg("--data-dir")
        .arg(dir.join("data"))
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.join("weir.log")).unwrap())
        .spawn()
        .unwrap()
}

#[test]
fn sigterm_as_soon_as_the_listener_accepts_stops_cleanly() {
    use std::os::unix::process::ExitStatusExt;
    let mut round = 0;
    let mut port_races = 0;
    while round < 3 {
        let dir = TempDir::new("early-sigterm");
        let port = free_port();
        let mut child = spawn_on_port(dir.path(), port);
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let t = Instant::now();
        let mut exited = false;
        while std::net::TcpStream::connect(addr).is_err() {
            if child.try_wait().unwrap().is_some() {
                exited = true;
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(30), "never listened");
            std::thread::sleep(Duration::from_micros(200));
        }
        if exited {
            // Another test took the free port between our probe and the bind.
            let log = std::fs::read_to_string(dir.path().join("weir.log")).unwrap_or_default();
            assert!(
                log.contains("in use") && port_races < 5,
                "weir serve exited before listening: {log}"
            );
            port_races += 1;
            continue;
        }
        // The second round hangs up (a closed terminal): a clean stop too.
        let (signal, name) = match round {
            1 => (libc::SIGHUP, "SIGHUP"),
            _ => (libc::SIGTERM, "SIGTERM"),
        };
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(child.id() as libc::pid_t, signal) };
        let status = child.wait().unwrap();
        println!("round {round}: {name} right after the listener opened: {status}");
        assert_eq!(status.signal(), None, "killed by the signal: no clean stop");
        assert!(status.success(), "{status}");
        round += 1;
    }
}

/// Whether `unshare ARGS` succeeds here; prints "skipped: `reason`" when not.
fn unshare_works(args: &[&str], reason: &str) -> bool {
    let ok = std::process::Command::new("unshare")
        .args(args)
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        println!("skipped: {reason}");
    }
    ok
}

/// Whether a tmpfs can be mounted in a fresh mount namespace here (root and
/// `unshare`).
fn can_mount_tmpfs() -> bool {
    unshare_works(
        &["-m", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
        "cannot mount a tmpfs in a new mount namespace (needs root and unshare)",
    )
}

/// A server on `dir`'s data directory moved onto a tmpfs of `size` in a mount
/// namespace of its own. A first run creates the metadata, the (sparse) volume
/// files and the admin token the test reads; `then` (shell, `{d}` the data
/// directory) runs in the namespace before the server starts.
fn start_on_tmpfs(dir: &std::path::Path, config: &str, size: &str, then: &str) -> WeirProcess {
    let mut first = WeirProcess::start(dir, config);
    first.terminate();
    assert!(first.child.wait().unwrap().success());
    let d = dir.join("data").display().to_string();
    let then = then.replace("{d}", &d);
    let script = format!(
        "cp -a {d} {d}.orig && exec unshare -m sh -c 'mount -t tmpfs -o size={size} tmpfs {d} && \
         cp -a --sparse=always {d}.orig/. {d}/ && {then}exec \"$0\" \"$@\"' \"$0\" \"$@\""
    );
    WeirProcess::start_with(dir, config, &script)
}

#[test]
fn a_server_stopped_on_a_full_file_system_starts_again() {
    if !can_mount_tmpfs() {
        return;
    }
    let dir = TempDir::new("full-disk");
    let config = "[[volumes]]\nname = \"v\"\nsize = \"16MiB\"\npolicy = \"non-critical\"\n";
    // The data directory on a small tmpfs filled to the last block.
    let second = start_on_tmpfs(
        dir.path(),
        config,
        "2m",
        "(dd if=/dev/zero of={d}/filler bs=4k 2>/dev/null; true) && ",
    );
    let rt = runtime();
    rt.block_on(async {
        let (mut c, _) = NbdClient::connect(second.nbd_addr, ClientConfig::go("v"))
            .await
            .unwrap();
        assert_eq!(c.read(0, 4096).await.unwrap().unwrap(), vec![0; 4096]);
        // Writes need blocks the file system no longer has: ENOSPC for them alone.
        let e = c
            .write(8 << 20, &[1; 65536], false)
            .await
            .unwrap()
            .unwrap_err();
        assert_eq!(e.code, weir_nbd::ErrorCode::NoSpc, "{e}");
        c.read(0, 4096).await.unwrap().unwrap();
        c.disconnect().await.unwrap();
    });
    println!("started on a full file system; reads served, writes fail ENOSPC");
}

/// Snapshots hold open files (a written thin layer keeps two): past the
/// open-files limit a snapshot is refused with the reason (507) and nothing
/// changes, and the volume's writes keep working. Before, the snapshots went
/// through and the next write, the first to open the new top layer's files,
/// failed with EIO (`EMFILE`) and nothing was logged.
#[test]
fn snapshots_stop_at_the_open_files_limit_and_writes_go_on() {
    let dir = TempDir::new("fd-layers");
    let config = "max_connections = 16\nadmin_max_connections = 8\nadmin_max_connections_per_host = 8\n\
                  [[pools]]\nname = \"thin\"\nformat = \"thin\"\n\
                  [[volumes]]\nname = \"v\"\nsize = \"64MiB\"\npolicy = \"non-critical\"\npool = \"thin\"\n";
    let proc = WeirProcess::start_with(dir.path(), config, "ulimit -n 256 && exec \"$0\" \"$@\"");
    let admin = proc.admin_client();
    let rt = runtime();
    let (taken, refusal) = rt.block_on(async {
        let (mut c, _) = NbdClient::connect(proc.nbd_addr, ClientConfig::go("v"))
            .await
            .unwrap();
        for i in 0..256u64 {
            let block = [i as u8 + 1; 4096];
            let written = c.write(i << 16, &block, false).await.unwrap();
            assert!(written.is_ok(), "write {i} failed: {written:?}");
            if let Err(e) = admin.snapshot("v", &format!("s{i}")).await {
                // The refused snapshot changed nothing: the next write and
                // every earlier one read back.
                let last = [0xEE; 4096];
                c.write((i + 1) << 16, &last, false).await.unwrap().unwrap();
                for j in 0..=i {
                    let data = c.read(j << 16, 4096).await.unwrap().unwrap();
                    assert_eq!(data, vec![j as u8 + 1; 4096], "block {j}");
                }
                c.disconnect().await.unwrap();
                return (i, e.to_string());
            }
        }
        panic!("256 snapshots taken with 256 descriptors");
    });
    println!("{taken} snapshots taken with 256 descriptors; then: {refusal}");
    assert!(taken >= 10, "only {taken} snapshots before the refusal");
    assert!(
        refusal.contains("507") && refusal.contains("open-files limit"),
        "{refusal}"
    );
    let snapshots = rt.block_on(admin.snapshots(Some("v"))).unwrap();
    assert_eq!(
        snapshots.len() as u64,
        taken,
        "a refused snapshot was recorded"
    );
    // The operator sees it coming: what the volumes hold against their share.
    let metrics = rt.block_on(admin.metrics()).unwrap();
    let gauge = |name: &str| -> u64 {
        let line = metrics.lines().find_map(|l| l.strip_prefix(name));
        line.and_then(|v| v.trim().parse().ok()).unwrap()
    };
    let (needed, max) = (
        gauge("weir_volume_files_needed "),
        gauge("weir_volume_files_max "),
    );
    assert!(needed <= max && needed + 2 > max, "{needed} of {max}");
}

/// A backend that never answers held the clean stop for ever (found in
/// session 31 with a stopped Ceph OSD): a second SIGTERM now ends it at once,
/// as a crash would.
#[test]
fn a_second_signal_ends_a_stop_that_waits_on_a_backend() {
    let dir = TempDir::new("second-signal");
    let config = "[[pools]]\nname = \"default\"\n[[pools.faults]]\nkind = \"latency\"\n\
                  ops = [\"read\"]\nevery = 1\nlatency_ms = 60000\n\
                  [[volumes]]\nname = \"v\"\nsize = \"1MiB\"\npolicy = \"non-critical\"\n";
    let mut proc = WeirProcess::start(dir.path(), config);
    let rt = runtime();
    let _client = rt.block_on(async {
        let (mut c, _) = NbdClient::connect(proc.nbd_addr, ClientConfig::go("v"))
            .await
            .unwrap();
        c.session().read(0, 4096);
        c.send().await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        c
    });
    proc.terminate();
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        proc.child.try_wait().unwrap().is_none(),
        "the stop did not wait for the request in progress"
    );
    proc.terminate();
    let t = Instant::now();
    let status = proc.wait_exit(Duration::from_secs(5), "a second SIGTERM");
    let log = std::fs::read_to_string(dir.join("weir.log")).unwrap_or_default();
    println!("exited {status} {:?} after the second SIGTERM", t.elapsed());
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(log.contains("SIGTERM again: exiting now"), "{log}");
}

/// A thin pool filled to the last block recovers by TRIM (a guest's `fstrim`):
/// the commit that frees the trimmed slots needs blocks for the map itself, so
/// the slots are punched first. Before, every FLUSH failed with ENOSPC after the
/// TRIM, no space ever came back, and even a snapshot could not be taken.
#[test]
fn a_full_thin_pool_recovers_by_trim() {
    if !can_mount_tmpfs() {
        return;
    }
    let dir = TempDir::new("full-thin");
    let config = "[[pools]]\nname = \"thin\"\nformat = \"thin\"\n\
                  [[volumes]]\nname = \"v\"\nsize = \"64MiB\"\npolicy = \"non-critical\"\npool = \"thin\"\n";
    let server = start_on_tmpfs(dir.path(), config, "8m", "");
    let rt = runtime();
    rt.block_on(async {
        let (mut c, _) = NbdClient::connect(server.nbd_addr, ClientConfig::go("v"))
            .await
            .unwrap();
        // Fill it: 1 MiB writes until the file system is full.
        let block = vec![0x5a; 1 << 20];
        let mut written = 0u64;
        while written < 64 {
            match c.write(written << 20, &block, false).await.unwrap() {
                Ok(()) => written += 1,
                Err(e) => {
                    assert_eq!(e.code, weir_nbd::ErrorCode::NoSpc, "{e}");
                    break;
                }
            }
        }
        assert!(
            (1..64).contains(&written),
            "{written} MiB fitted on an 8 MiB file system"
        );
        let _ = c.flush().await.unwrap(); // may fail: the map has no room either
        // TRIM all of it, then FLUSH: the space comes back.
        c.session().trim(0, 64 << 20);
        c.send().await.unwrap();
        c.next_completion().await.unwrap().result.unwrap();
        c.flush()
            .await
            .unwrap()
            .expect("FLUSH after a TRIM of everything, on a full file system");
        c.write(0, &block, false).await.unwrap().unwrap();
        c.flush().await.unwrap().unwrap();
        assert_eq!(c.read(0, 1 << 20).await.unwrap().unwrap(), block);
        c.disconnect().await.unwrap();
    });
    println!("a full thin pool: TRIM and FLUSH gave the space back; writes fit again");
}

/// Whether two network namespaces joined by a veth pair can be made here (root,
/// `unshare`, `ip`, the veth driver).
fn can_make_two_hosts() -> bool {
    unshare_works(
        &[
            "-n", "ip", "link", "add", "v0", "type", "veth", "peer", "name", "v1",
        ],
        "cannot join two network namespaces by veth (needs root, unshare, ip)",
    )
}

/// Moves the calling thread into the network namespace of process `pid` (its
/// sockets from then on are that host's).
fn enter_netns(pid: u32) {
    use std::os::fd::AsRawFd;
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/net")).unwrap();
    // SAFETY: setns(2) on a descriptor we hold open; a network namespace may be
    // entered by one thread of a multithreaded process.
    let r = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(r, 0, "setns: {}", std::io::Error::last_os_error());
}

fn sh_in_netns(pid: u32, script: &str) {
    let o = std::process::Command::new("nsenter")
        .args(["-t", &pid.to_string(), "-n", "sh", "-c", script])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{script}: {}",
        weir_testkit::output_text(&o)
    );
}

/// A child process killed and reaped when dropped.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// How the lease holder's host is doing when it goes down.
#[derive(Clone, Copy, Debug, PartialEq)]
enum WhenDown {
    /// It has acknowledged everything it was sent (idle: keepalive's case).
    Idle,
    /// Its READs are being answered: the server's replies leave after it is
    /// gone and nothing acknowledges them (retransmission's case).
    RepliesInFlight,
    /// It read none of its replies and its receive window is closed: the
    /// server has replies waiting and probes the window (window probing's case).
    WindowClosed,
}

/// Host B takes a volume's exclusive lease from its own network namespace,
/// then goes down as `when` says, without closing anything; host A, on the
/// server's side, writes the volume every 200 ms until one write is served.
/// Returns how long after B went down that was; fails if still refused after
/// `within`. `tcp_keepalive_s` is 1 unless `DEAD_HOST_KEEPALIVE_S` says
/// otherwise (`default`: the key is left out), and `DEAD_HOST_LIMIT_S`
/// replaces `within` (to measure other settings, or a build without the fix
/// through `WEIR_BIN`). `None`: two hosts cannot be made here.
///
/// The server runs in a network namespace of its own; host B is another,
/// joined to it by a veth pair, and "goes down" by giving up its address: the
/// link stays up, as a switch port does when the host behind it dies, and
/// nothing answers the server's packets (B's process and socket live on,
/// silent; no RST, since B's kernel no longer owns the address). The volume's
/// reads take 400 ms (a latency fault), so that B's READs are answered after
/// it went down.
fn holder_host_goes_down(when: WhenDown, within: Duration) -> Option<Duration> {
    if !can_make_two_hosts() {
        return None;
    }
    let keepalive = std::env::var("DEAD_HOST_KEEPALIVE_S").unwrap_or_else(|_| "1".into());
    let limit = Duration::from_secs(env_or("DEAD_HOST_LIMIT_S", within.as_secs()));
    // Host B's network namespace lives as long as this process (killed
    // however the test ends).
    let host_b = KillOnDrop(
        std::process::Command::new("unshare")
            .args(["-n", "sleep", "3600"])
            .spawn()
            .unwrap(),
    );
    let pb = host_b.0.id();
    let dir = TempDir::new("dead-host");
    let keepalive_line = match keepalive.as_str() {
        "default" => String::new(),
        s => format!("tcp_keepalive_s = {s}\n"),
    };
    let config = format!(
        "{keepalive_line}[[pools]]\nname = \"default\"\n[[pools.faults]]\nkind = \"latency\"\n\
         ops = [\"read\"]\nevery = 1\nlatency_ms = 400\n\
         [[volumes]]\nname = \"v\"\nsize = \"256MiB\"\npolicy = \"non-critical\"\n"
    );
    // The server logs why it closes a connection (`closing connection: …`).
    let script = format!(
        "exec env RUST_LOG=warn,weir_server::session=info,weir_server::keepalive=info \
         unshare -n sh -c 'ip link set lo up && \
         ip link add v0 type veth peer name v1 netns {pb} && \
         ip addr add 10.77.0.1/24 dev v0 && ip link set v0 up && exec \"$0\" \"$@\"' \"$0\" \"$@\""
    );
    let server = WeirProcess::start_with_listening(
        dir.path(),
        &config,
        &script,
        "0.0.0.0:0".parse().unwrap(),
    );
    sh_in_netns(
        pb,
        "ip link set lo up && ip addr add 10.77.0.2/24 dev v1 && ip link set v1 up",
    );
    let port = server.nbd_addr.port();
    let pa = server.child.id();
    // The server's side of B's connection, as `ss -tnoi` shows it.
    let holder_socket = move || {
        let o = std::process::Command::new("nsenter")
            .args([
                "-t",
                &pa.to_string(),
                "-n",
                "ss",
                "-tnoi",
                "dst",
                "10.77.0.2",
            ])
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    };

    // Host B takes the lease and writes, then keeps its connection and, as
    // `when` says, sends READs it reads no reply of.
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (end_tx, end_rx) = std::sync::mpsc::channel::<()>();
    let b = std::thread::spawn(move || {
        enter_netns(pb);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut cfg = ClientConfig::go("v");
            cfg.meta_contexts.push("weir:exclusive=host-b".into());
            let addr = SocketAddr::new([10, 77, 0, 1].into(), port);
            let (mut c, _) = NbdClient::connect(addr, cfg).await.unwrap();
            c.write(0, &[7; 4096], false).await.unwrap().unwrap();
            let reads = match when {
                WhenDown::Idle => 0,
                WhenDown::RepliesInFlight => 8,
                WhenDown::WindowClosed => 64,
            };
            for i in 0..reads {
                c.session().read(i << 20, 1 << 20);
            }
            c.send().await.unwrap();
            ready_tx.send(()).unwrap();
            let _ = end_rx.recv();
            drop(c);
        });
    });
    ready_rx.recv_timeout(Duration::from_secs(30)).unwrap();
    match when {
        // Once B acknowledged its WRITE's reply (a delayed ACK, ~40 ms).
        WhenDown::Idle => std::thread::sleep(Duration::from_millis(500)),
        // B's READs reached the server (a veth hop) and wait for their 400 ms.
        WhenDown::RepliesInFlight => std::thread::sleep(Duration::from_millis(50)),
        // Until B's receive window is closed, with replies still waiting
        // (the server probes the window: its persist timer).
        WhenDown::WindowClosed => {
            let t = Instant::now();
            while !holder_socket().contains("timer:(persist") {
                assert!(t.elapsed() < Duration::from_secs(20), "{}", holder_socket());
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    // Host B goes down: nothing answers any more, nothing is closed.
    sh_in_netns(pb, "ip addr del 10.77.0.2/24 dev v1");
    let down = Instant::now();
    let at_down = holder_socket();

    // Host A, on the server's side of the link: refused while B holds the lease.
    let a = std::thread::spawn(move || {
        enter_netns(pa);
        runtime().block_on(async {
            let addr = SocketAddr::new([127, 0, 0, 1].into(), port);
            let (mut c, _) = NbdClient::connect(addr, ClientConfig::go("v"))
                .await
                .unwrap();
            let mut refused = 0;
            loop {
                match c.write(0, &[1; 4096], false).await.unwrap() {
                    Ok(()) => break,
                    Err(e) => assert_eq!(e.code, weir_nbd::ErrorCode::Perm, "{e}"),
                }
                refused += 1;
                assert!(
                    down.elapsed() < limit,
                    "writes still refused {} s after the lease holder's host went down",
                    limit.as_secs()
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            let served_after = down.elapsed();
            assert!(
                refused > 0,
                "host A's first write was served: B held no lease"
            );
            assert_eq!(c.read(0, 4096).await.unwrap().unwrap(), vec![1; 4096]);
            c.disconnect().await.unwrap();
            served_after
        })
    });
    let served = a.join();
    let _ = end_tx.send(());
    let _ = b.join();
    drop(host_b);
    println!("host B down ({when:?}); the server's side of its connection then:\n{at_down}");
    let log = std::fs::read_to_string(dir.path().join("weir.log")).unwrap_or_default();
    for line in log.lines().filter(|l| l.contains("closing connection")) {
        println!("server: {line}");
    }
    let served_after = served.unwrap();
    println!(
        "host B down ({when:?}): its lease given back and host A's write served after {:.1} s \
         (tcp_keepalive_s = {keepalive})",
        served_after.as_secs_f64()
    );
    // The lease's grace follows its release.
    assert!(served_after >= Duration::from_secs(2), "{served_after:?}");
    Some(served_after)
}

/// A client host that goes down without closing its connection (power lost,
/// network cut: no FIN, no RST) gives back the exclusive lease it held, so that
/// the volume's other writers are served again: TCP keepalive finds the peer
/// gone and the connection closes. Before, the dead host's connection stayed
/// open for ever and every other write to the volume was refused with EPERM
/// until an operator broke the lease. (1 s idle and 6 probes 1 s apart, then
/// the lease's 2 s grace.)
#[test]
fn a_client_host_that_went_down_gives_its_lease_back() {
    holder_host_goes_down(WhenDown::Idle, Duration::from_secs(30));
}

/// The same host going down while the server is sending it replies (a busy
/// VM's host): keepalive sends no probe while data is unacknowledged, and the
/// kernel's retransmissions held the connection, and so the lease, for about
/// 15 minutes (`tcp_retries2`; with this test's settings the writes were still
/// refused at its limit). The server's watch (`keepalive::PeerWatch`) aborts a
/// connection whose peer acknowledged nothing for as long as keepalive gives
/// an idle one (7 s here) and left its retransmissions unanswered.
#[test]
fn a_lease_holder_that_went_down_with_replies_in_flight_gives_its_lease_back() {
    holder_host_goes_down(WhenDown::RepliesInFlight, Duration::from_secs(15));
}

/// The same host going down after it stopped reading (its receive window
/// closed): the server probes the window, and no probe is answered (before:
/// about 15 minutes too). A live client in the same state answers the probes
/// and keeps its connection
/// (`a_live_client_that_reads_no_replies_for_a_while_keeps_its_connection`).
#[test]
fn a_lease_holder_that_went_down_with_its_window_closed_gives_its_lease_back() {
    holder_host_goes_down(WhenDown::WindowClosed, Duration::from_secs(15));
}

/// Keepalive and the dead-peer watch take only a silent peer for dead: a live
/// client that takes none of its replies (its receive window closed, 128 MiB
/// of replies waiting) keeps its connection and then gets every reply, even
/// after the server has heard no ACK from it for longer than a dead peer is
/// given (7 s with `tcp_keepalive_s = 1`): the server's window probes back
/// off exponentially, so a live client's ACKs come further and further apart,
/// but it answers each one. (`TCP_USER_TIMEOUT`, tried beside keepalive,
/// closed this connection: Linux counts a zero window against it; a watch on
/// the time since the last ACK alone closed it after about 20 s.)
#[test]
fn a_live_client_that_reads_no_replies_for_a_while_keeps_its_connection() {
    let dir = TempDir::new("slow-reader");
    let config = "tcp_keepalive_s = 1\n[[volumes]]\nname = \"v\"\nsize = \"64MiB\"\n\
                  policy = \"non-critical\"\n";
    let server = WeirProcess::start(dir.path(), config);
    let port = server.nbd_addr.port();
    // The longest time the server's side went without an ACK, from `ss`.
    let longest_without_ack = || {
        let o = std::process::Command::new("ss")
            .args([
                "-tnoi",
                "state",
                "established",
                "sport",
                "=",
                &format!(":{port}"),
            ])
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout)
            .split_whitespace()
            .filter_map(|w| w.strip_prefix("lastack:")?.parse::<u64>().ok())
            .max()
            .map(Duration::from_millis)
    };
    let silent = Duration::from_secs(25);
    let mut longest = Duration::ZERO;
    runtime().block_on(async {
        let (mut c, _) = NbdClient::connect(server.nbd_addr, ClientConfig::go("v"))
            .await
            .unwrap();
        for i in 0..128u64 {
            c.session().read((i % 64) << 20, 1 << 20);
        }
        c.send().await.unwrap();
        let t = Instant::now();
        while t.elapsed() < silent {
            tokio::time::sleep(Duration::from_millis(250)).await;
            longest = longest.max(longest_without_ack().unwrap_or_default());
        }
        for _ in 0..128 {
            let done = c.next_completion().await.unwrap();
            match done.result.unwrap() {
                weir_nbd::ReplyData::Read(data) => assert_eq!(data.len(), 1 << 20),
                other => panic!("{other:?}"),
            }
        }
        c.disconnect().await.unwrap();
    });
    println!(
        "a client silent for {} s with tcp_keepalive_s = 1: all 128 replies of 1 MiB; \
         the server went up to {:.1} s without an ACK from it",
        silent.as_secs(),
        longest.as_secs_f64()
    );
    // What this test is about: longer than a dead peer is given.
    let dead_after = weir_server::keepalive::give_up_after(Duration::from_secs(1));
    assert!(longest > dead_after, "{longest:?}");
}

/// 1,000 idle connections from one host against a server with 256 descriptors,
/// then enough from other hosts to fill `max_connections`.
#[test]
fn a_flood_of_idle_connections_leaves_room_for_others_and_the_log_small() {
    let dir = TempDir::new("idle-flood");
    let config = "max_connections_per_host = 32\n\
                  [[volumes]]\nname = \"v\"\nsize = \"1MiB\"\npolicy = \"non-critical\"\n";
    let proc = WeirProcess::start_with(dir.path(), config, "ulimit -n 256 && exec \"$0\" \"$@\"");
    let (addr, pid) = (proc.nbd_addr, proc.child.id());
    let rt = runtime();
    let me = IpAddr::from([127, 0, 0, 2]);
    rt.block_on(async {
        let flood = idle_connections(addr, &[IpAddr::from([127, 0, 0, 1])], 1000).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let cpu = cpu_seconds(pid);
        tokio::time::sleep(Duration::from_secs(1)).await;
        let cpu = cpu_seconds(pid) - cpu;
        let (served, took) = well_behaved(me, addr, "v").await;
        println!("1,000 idle connections from 127.0.0.1: server CPU {cpu:.2} s in 1 s; 127.0.0.2 {served:?} in {took:?}");
        assert!(cpu < 0.3, "the server spins: {cpu:.2} CPU s in 1 s");
        assert_eq!(served, Ok(true));
        assert!(took < Duration::from_secs(1), "{took:?}");
        let admin = proc.admin_client();
        let t = Instant::now();
        let metrics = admin.metrics().await.unwrap();
        assert!(t.elapsed() < Duration::from_secs(1), "admin API: {:?}", t.elapsed());
        let max: usize = metrics
            .lines()
            .find_map(|l| l.strip_prefix("weir_connections_max "))
            .and_then(|n| n.parse().ok())
            .unwrap();
        assert!(max < 256, "max_connections {max} does not fit 256 descriptors");
        // Fill max_connections from other hosts (32 each): 127.0.0.2 is refused
        // with the reason, at once.
        let hosts: Vec<IpAddr> = (1..=max.div_ceil(32) as u8 + 1)
            .map(|i| IpAddr::from([127, 0, 1, i]))
            .collect();
        let more = idle_connections(addr, &hosts, hosts.len() * 32).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (refused, took) = well_behaved(me, addr, "v").await;
        println!("max_connections {max} filled: 127.0.0.2 {refused:?} in {took:?}");
        assert_eq!(refused, Ok(false), "served past max_connections");
        assert!(took < Duration::from_secs(1), "{took:?}");
        drop((flood, more));
    });
    let log = std::fs::metadata(dir.join("weir.log")).unwrap().len();
    println!("log: {log} bytes");
    assert!(log < 64 << 10, "{log} bytes of log");
}

// --- Full-size runs (bench/hardening.sh) -------------------------------------

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// fio (nbd engine): 4 KiB random reads of `victim` at queue depth 8 on four
/// connections for `secs`: I/Os per second.
fn fio_iops(addr: SocketAddr, secs: f64) -> f64 {
    let out = std::process::Command::new("fio")
        .args([
            "--name=others",
            "--ioengine=nbd",
            &format!("--uri=nbd://{addr}/victim"),
            "--rw=randread",
            "--bs=4k",
            "--iodepth=8",
            "--numjobs=4",
            "--size=64m",
            "--time_based",
            &format!("--runtime={secs}"),
            "--group_reporting",
            "--output-format=json",
        ])
        .output()
        .expect("fio runs");
    // fio may print warnings before its JSON.
    let text = String::from_utf8_lossy(&out.stdout);
    let json = &text[text.find('{').unwrap_or(0)..];
    let v: serde_json::Value =
        serde_json::from_str(json).unwrap_or_else(|e| panic!("fio output: {e}: {text}"));
    v["jobs"][0]["read"]["iops"].as_f64().unwrap()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A client pipelines `HOSTILE_READS` (default 1,000,000) READs of 60 KiB and
/// never reads a reply, while fio reads 4 KiB at QD 8 on four other connections:
/// server RSS above idle, and fio's throughput with the client on vs off
/// (alternating phases of `PHASE_S` seconds, medians of `ROUNDS`).
#[test]
#[ignore = "full-size run: bench/hardening.sh"]
fn bench_unread_replies() {
    let reads: u64 = env_or("HOSTILE_READS", 1_000_000);
    let phase: f64 = env_or("PHASE_S", 4.0);
    let rounds: usize = env_or("ROUNDS", 5);
    let dir = TempDir::new("bench-unread");
    let config = "[[volumes]]\nname = \"deaf\"\nsize = \"1GiB\"\npolicy = \"non-critical\"\n\
                  [[volumes]]\nname = \"victim\"\nsize = \"64MiB\"\npolicy = \"non-critical\"\n";
    let proc = WeirProcess::start_with(dir.path(), config, "exec \"$0\" \"$@\"");
    let (addr, pid) = (proc.nbd_addr, proc.child.id());
    if !weir_testkit::require_tool("fio", &["fio"]) {
        return;
    }
    let rt = runtime();
    rt.block_on(async {
        // Warm up: the victim's data in the page cache, the server's buffers.
        let (mut c, _) = NbdClient::connect(addr, ClientConfig::go("victim"))
            .await
            .unwrap();
        for i in 0..64u64 {
            c.write(i << 20, &vec![i as u8 + 1; 1 << 20], false)
                .await
                .unwrap()
                .unwrap();
        }
        c.disconnect().await.unwrap();
        fio_iops(addr, 1.0);
        let idle = rss_mib(pid);
        let (mut alone, mut beside, mut peak, mut sent_max) = (vec![], vec![], idle, 0u64);
        // Server CPU per I/O (µs), alone and beside: robust to other load on the machine.
        let (mut cpu_alone, mut cpu_beside) = (vec![], vec![]);
        let measure = |iops: &mut Vec<f64>, cpu: &mut Vec<f64>| {
            let c = cpu_seconds(pid);
            let r = fio_iops(addr, phase);
            cpu.push((cpu_seconds(pid) - c) / (r * phase) * 1e6);
            iops.push(r);
        };
        for round in 0..rounds {
            measure(&mut alone, &mut cpu_alone);
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let sent = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
            let counter = sent.clone();
            let hostile = tokio::spawn(async move {
                let (mut c, _) = NbdClient::connect(addr, ClientConfig::go("deaf"))
                    .await
                    .unwrap();
                let batch = 10_000;
                let sending = async {
                    for b in 0..reads.div_ceil(batch) {
                        for i in b * batch..((b + 1) * batch).min(reads) {
                            c.session().read((i % 16000) * (60 << 10), 60 << 10);
                        }
                        c.send().await.unwrap();
                        counter.fetch_add(
                            batch.min(reads - b * batch),
                            std::sync::atomic::Ordering::Relaxed,
                        );
                    }
                    std::future::pending::<()>().await
                };
                tokio::select! { _ = sending => {}, _ = stopped => {} }
            });
            let top = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
            let seen = top.clone();
            let sampler = tokio::spawn(async move {
                loop {
                    let kib = (rss_mib(pid) * 1024.0) as u64;
                    seen.fetch_max(kib, std::sync::atomic::Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            });
            // Until the deaf client's sends stall (the server stopped reading it;
            // its own CPU, spent building requests, is not the server's doing).
            let mut last = u64::MAX;
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(60) {
                tokio::time::sleep(Duration::from_millis(500)).await;
                let now = sent.load(std::sync::atomic::Ordering::Relaxed);
                if now == last {
                    break;
                }
                last = now;
            }
            tokio::task::block_in_place(|| measure(&mut beside, &mut cpu_beside));
            let _ = stop.send(());
            hostile.await.unwrap();
            sampler.abort();
            let sampled = top.load(std::sync::atomic::Ordering::Relaxed) as f64 / 1024.0;
            peak = peak.max(sampled).max(rss_mib(pid));
            sent_max = sent_max.max(sent.load(std::sync::atomic::Ordering::Relaxed));
            println!(
                "round {round}: others alone {:.0} IOPS ({:.1} µs server CPU per I/O), beside \
                 the deaf client {:.0} IOPS ({:.1} µs); server RSS {:.1} MiB (idle {idle:.1}); \
                 deaf client got {} of {reads} requests into its socket",
                alone[round],
                cpu_alone[round],
                beside[round],
                cpu_beside[round],
                rss_mib(pid),
                sent.load(std::sync::atomic::Ordering::Relaxed)
            );
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        let after = rss_mib(pid);
        let ratios: Vec<f64> = beside.iter().zip(&alone).map(|(b, a)| b / a).collect();
        println!(
            "RESULT unread replies: {reads} READs of 60 KiB pipelined, unread: server RSS idle \
             {idle:.1} MiB, peak {peak:.1} MiB (+{:.1}), {after:.1} MiB 2 s after the client \
             left; other clients (fio 4 KiB QD8 x4, medians of {rounds}) {:.0} IOPS beside it vs \
             {:.0} alone: {:.3}x (median of the rounds' ratios {:.3}x); server CPU per I/O \
             {:.1} vs {:.1} µs",
            peak - idle,
            median(beside.clone()),
            median(alone.clone()),
            median(beside) / median(alone),
            median(ratios),
            median(cpu_beside),
            median(cpu_alone)
        );
    });
}

/// Opens `WEIR_FLOOD_COUNT` connections to `WEIR_FLOOD_ADDR` from the addresses
/// `WEIR_FLOOD_FROM` (comma-separated) and keeps them until stdin closes: a
/// helper process of `bench_idle_flood` (one process has too few descriptors).
#[test]
#[ignore = "helper of bench_idle_flood"]
fn flood_helper() {
    let Ok(addr) = std::env::var("WEIR_FLOOD_ADDR") else {
        return;
    };
    let addr: SocketAddr = addr.parse().unwrap();
    let hosts: Vec<IpAddr> = std::env::var("WEIR_FLOOD_FROM")
        .unwrap()
        .split(',')
        .map(|h| h.parse().unwrap())
        .collect();
    let count: usize = env_or("WEIR_FLOOD_COUNT", 1000);
    let rt = runtime();
    let conns = rt.block_on(idle_connections(addr, &hosts, count));
    eprintln!("FLOOD open {}", conns.len());
    let mut sink = String::new();
    while std::io::stdin().read_line(&mut sink).is_ok_and(|n| n > 0) {}
    drop(conns);
}

/// Probes from 127.0.0.2: one well-behaved client every 250 ms until `stop`.
#[derive(Debug, Default)]
struct Probes {
    served: u32,
    refused: u32,
    failed: u32,
    slowest: Duration,
    admin_slowest: Duration,
}

async fn probe_until(
    addr: SocketAddr,
    admin: weir_server::admin::Client,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Probes {
    let me = IpAddr::from([127, 0, 0, 2]);
    let mut p = Probes::default();
    while !*stop.borrow() {
        let (r, took) = well_behaved(me, addr, "v").await;
        match r {
            Ok(true) => p.served += 1,
            Ok(false) => p.refused += 1,
            Err(e) => {
                p.failed += 1;
                println!("well-behaved client failed after {took:?}: {e}");
            }
        }
        p.slowest = p.slowest.max(took);
        let t = Instant::now();
        let _ = tokio::time::timeout(Duration::from_secs(5), admin.metrics()).await;
        p.admin_slowest = p.admin_slowest.max(t.elapsed());
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    p
}

/// Starts flood helper processes: `total` connections to `addr` from `hosts`.
fn start_flood(addr: SocketAddr, hosts: &[String], total: usize) -> Vec<std::process::Child> {
    let per_process = 9_000;
    let mut helpers = Vec::new();
    let mut left = total;
    while left > 0 {
        let n = left.min(per_process);
        left -= n;
        let child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "flood_helper", "--ignored", "--nocapture"])
            .env("WEIR_FLOOD_ADDR", addr.to_string())
            .env("WEIR_FLOOD_FROM", hosts.join(","))
            .env("WEIR_FLOOD_COUNT", n.to_string())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        helpers.push(child);
    }
    helpers
}

/// Waits until every helper has its connections open.
fn await_flood(helpers: &mut [std::process::Child]) {
    use std::io::BufRead;
    for child in helpers {
        let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
        let opened = lines
            .by_ref()
            .map_while(Result::ok)
            .any(|l| l.contains("FLOOD open"));
        assert!(opened, "a flood helper failed");
        // Keep reading what it prints until it exits.
        std::thread::spawn(move || lines.for_each(drop));
    }
}

/// `FLOOD` (default 20,000) idle connections against a server limited to 1,024
/// descriptors, from 127.0.0.1 (`FLOOD_HOSTS=1`) or spread over that many
/// addresses; meanwhile a well-behaved client from 127.0.0.2 tries every 250 ms,
/// while the flood connects and for `STEADY_S` seconds after: served or refused
/// with the reason, how fast; the admin API; server CPU; log size.
#[test]
#[ignore = "full-size run: bench/hardening.sh"]
fn bench_idle_flood() {
    let total: usize = env_or("FLOOD", 20_000);
    let host_count: u32 = env_or("FLOOD_HOSTS", 1);
    let steady: f64 = env_or("STEADY_S", 5.0);
    let dir = TempDir::new("bench-flood");
    let config = "[[volumes]]\nname = \"v\"\nsize = \"1MiB\"\npolicy = \"non-critical\"\n";
    let proc = WeirProcess::start_with(dir.path(), config, "ulimit -n 1024 && exec \"$0\" \"$@\"");
    let (addr, pid) = (proc.nbd_addr, proc.child.id());
    let hosts: Vec<String> = (0..host_count)
        .map(|i| match host_count {
            1 => "127.0.0.1".to_string(),
            _ => format!("127.0.{}.{}", 2 + i / 250, 1 + i % 250),
        })
        .collect();
    let rt = runtime();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let during = rt.spawn(probe_until(addr, proc.admin_client(), stopped));
    let cpu0 = cpu_seconds(pid);
    let t0 = Instant::now();
    let mut helpers = start_flood(addr, &hosts, total);
    await_flood(&mut helpers);
    let connecting = t0.elapsed();
    let _ = stop.send(true);
    let during = rt.block_on(during).unwrap();
    let (cpu1, t1) = (cpu_seconds(pid), Instant::now());
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let after = rt.spawn(probe_until(addr, proc.admin_client(), stopped));
    std::thread::sleep(Duration::from_secs_f64(steady));
    let _ = stop.send(true);
    let after = rt.block_on(after).unwrap();
    let idle_cpu = (cpu_seconds(pid) - cpu1) / t1.elapsed().as_secs_f64();
    let log = std::fs::metadata(dir.join("weir.log")).unwrap().len();
    println!(
        "RESULT idle flood: {total} idle connections from {host_count} address(es) to a server \
         limited to 1,024 descriptors, opened in {connecting:.1?}. 127.0.0.2 every 250 ms while \
         they connected: {} served, {} refused with the reason, {} failed, slowest {:.1?}, admin \
         API slowest {:.1?}; with all open ({steady} s): {} served, {} refused, {} failed, \
         slowest {:.1?}, admin API slowest {:.1?}. Server CPU {:.2} s while the flood connected, \
         {:.1} % of a CPU while it idled; log {log} bytes",
        during.served,
        during.refused,
        during.failed,
        during.slowest,
        during.admin_slowest,
        after.served,
        after.refused,
        after.failed,
        after.slowest,
        after.admin_slowest,
        cpu1 - cpu0,
        idle_cpu * 100.0
    );
    for mut child in helpers {
        drop(child.stdin.take());
        let _ = child.wait();
    }
}
